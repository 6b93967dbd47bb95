"""replay --source push-down, without a server: which progress patterns the server may
summarise, how server counts become findings, the plan and ``--explain``. (Against the real
server: tests/integration/victorialogs/test_real_history.py and test_real_pushdown.py.)"""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.cli import main
from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.inventory import inventory_records, nccl_gpu_records
from recovery_logs.pipeline.enrich import ENRICH_LITERALS, nccl_addresses
from recovery_logs.pipeline.vl_replay import _anchored, _prefix_safe, plan_pushdown, progress_findings
from recovery_logs.testing import make_events
from recovery_logs.windows import window_counts

NS = 1_000_000_000


@pytest.mark.parametrize(("pattern", "safe"), [
    (r"\bstep\b[\s:=]+(?P<step>\d+)\b[^\n]*?\bloss\b", True),
    (r"^step (?P<step>\d+)", False), (r"step (?P<step>\d+)", False), (r"\brank(?P<step>\d+)", False),
    (r"\bstep (?P<step>\d+)$", False), (r"\bstep(?=x)", False), (r"\b1step", False), (r"\bstep[$^]", True),
])
def test_prefix_safe_patterns(pattern, safe):
    assert _prefix_safe(pattern) is safe


def test_anchors_inside_character_classes_do_not_count():
    assert not _anchored(r"[^\n]*x[$]") and _anchored(r"a|^b") and _anchored(r"x\z") and _anchored(r"(a)\1")


def test_plan_summarises_step_loss_lines_and_leaves_them_out_of_the_fetch():
    plan = plan_pushdown(load_packs(), '{unit="train"}', progress=True)
    assert [p.rule.id for p in plan.progress] == ["progress.step_loss"]
    assert plan.fetch and plan.fetch.startswith('({unit="train"}) AND ') and "AND NOT (" in plan.fetch
    assert plan.progress[0].where in plan.fetch
    assert len(plan.explain()) == 3
    assert plan_pushdown(load_packs()).progress == ()


def test_progress_findings_carry_counts_first_and_last_times():
    rule = load_packs().rule("progress.step_loss")
    t0 = 1_764_000_000 * NS
    counts = pl.DataFrame({"host": ["a", "a", "b"], "job_id": ["7", "7", "7"], "step": [1, 2, 1],
                           "lines": [3, 1, 2], "first": [t0 + 1, t0 + 5, t0 + 2], "last": [t0 + 4, t0 + 5, t0 + 3]})
    f = progress_findings(counts, rule, 1 << 40)
    assert f.height == 6 and set(f["rule_id"]) == {"progress.step_loss"} and f["step_time_s"].null_count() == 6
    w = window_counts(make_events([]), f, 60.0)
    assert w["progress"].sum() == 6
    per = f.group_by("host", "step").agg(pl.col("time").min().dt.epoch("ns").alias("t0"),
                                         pl.col("time").max().dt.epoch("ns").alias("t1"), pl.len().alias("n"))
    got = {(h, s): (a - t0, b - t0, n) for h, s, a, b, n in per.iter_rows()}
    assert got == {("a", 1): (1, 4, 3), ("a", 2): (5, 5, 1), ("b", 1): (2, 3, 2)}


def test_enrichment_reads_nothing_from_lines_without_its_literals():
    lines = ["gpu-n1:1:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>",
             "gpu-n1:1:2 [0] NCCL INFO comm 0x5 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 1b000 - Init COMPLETE",
             "NVML gpu=0 uuid=GPU-1 pci=00000000:1B:00.0 inventory"]
    ev = make_events([{"time": 1_764_000_000 * NS + i, "host": "gpu-n1", "job_id": "7", "message": m}
                      for i, m in enumerate(lines)])
    assert nccl_addresses(ev) and nccl_gpu_records(ev)
    assert all(any(x in m for x in ENRICH_LITERALS) for m in lines)
    scrubbed = ev.with_columns(pl.col("message").str.replace_all("Using|busId|NVML gpu=", "x"))
    assert not nccl_addresses(scrubbed) and not nccl_gpu_records(scrubbed) and not inventory_records(scrubbed)


def test_replay_source_explain_prints_the_logsql_and_contacts_nothing(capsys):
    code = main(["replay", "--source", "victorialogs://127.0.0.1:9", "--start", "2026-12-01T00:00:00Z",
                 "--end", "2026-12-01T01:00:00Z", "--pushdown-progress", "--select", "server", "--explain"])
    out = capsys.readouterr().out
    assert code == 0
    assert "count: *" in out and 'fetch: (' in out and "progress progress.step_loss:" in out
    code = main(["replay", "--source", "victorialogs://127.0.0.1:9", "--start", "2026-12-01T00:00:00Z",
                 "--end", "2026-12-01T01:00:00Z", "--explain"])      # the default: the scope exported, selected here
    out = capsys.readouterr().out
    assert code == 0 and "export (time slices): * | fields" in out and "selected, counted" in out
