"""The real-log corpus (tests/corpus/real/): every excerpt through the real replay path, both splits
when present, against the issue-13 floors. Plus the harness's own behaviour on small corpora."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recovery_logs.analysis import corpus_eval
from recovery_logs.analysis.corpus_eval import (
    CorpusOptions,
    Excerpt,
    ExcerptResult,
    action_class,
    discover_splits,
    evaluate_corpus,
    load_corpus,
    per_family,
)
from recovery_logs.cli import app
from recovery_logs.errors import InputError

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "real"


# The held-out split (collected blind by someone who wrote no rules, from threads the rule writers never
# read) is the number that predicts unseen logs. It does not yet meet the 0.90: first measured at
# 0.583 (2026-12-01, 48 excerpts), 0.574 on 88 excerpts before the format-string rules of issue 13 and
# 0.691 after them (same day, `recovery-logs eval --corpus tests/corpus/real`), 0.797 (94/118) after the
# vocabulary rules and the fallback layer (rules/fallback.toml) and 0.788 (93/118) with the last of them
# (same day, this test). A fourth blind pass (`h4-*`, 57 excerpts, 42 non-benign) scored 0.476 (20/42) on the rules
# as they were at the start of that work and 0.595 (25/42) after it, measured once each; with it the whole held-out
# split is 0.738 (118/160), and 0.769 (123/160) after the GPU-side and network/host/straggler passes of the next
# session (d5g-*, e13-* dev excerpts; measured once), 0.7875 (126/160) after the d6g-*/e14-* passes, unchanged after the d7-*/e15-* and d8-*/e17-* passes. A fifth blind pass (`h5-*`,
# 61 excerpts, 48 non-benign) scored 0.729 (35/48) before and after the d8-*/e17-* passes (measured once each); with it the held-out
# split is 0.774 (161/208). A sixth blind pass (`h6-*`, 48 excerpts, 36 non-benign) scored 0.667 (24/36) on the rules
# as they stood when it was merged (measured once); with it the held-out split is 0.758 (185/244), and 0.766 (187/244)
# after the d9-*..d12-* passes and the container-log reader change of 2026-12-03 (measured once); 2026-12-04: 0.766 after the
# d13c Slurm PMIx/daemon-fatal rules, 0.775 (189/244, unambiguous 0.895) after the thermal and straggler fallbacks;
# 2026-12-06: 0.783 (191/244, unambiguous 0.895) after the d14-*..d16-* dev passes and the d17 emitter-source sweep,
# unchanged after the d18/d19 sweeps (measured once each, aggregate); 2026-12-07: 0.787 (192/244) after the f1-*
# hunting pass (see the corpus README for what that pass learned from the split's aggregate), 0.791 (193/244,
# unambiguous 0.905) after the f2-* pass; a seventh blind pass (`h7*-`, 55 excerpts, 39 non-benign) scored 0.641
# (25/39) on the rules of the day's start and its end alike, and with it the split is 0.770 (218/283); 0.774 (219/283)
# after the attribution change; an eighth blind pass (`h8r-*`, 16 excerpts, 10 non-benign) scored 0.70 (7/10) before and
# after the g1-* hunting pass, and with it the split is 0.771 (226/293, unambiguous 0.904); a ninth blind pass (`h9-*`,
# 15 excerpts, 12 non-benign) scored 0.75 (9/12) before and after the g3-* pass, and with it the split is 0.770
# (235/305, unambiguous 0.907); 0.780 (238/305) after the ncclSystemError / NCCL CUDA-failure boundaries; a tenth blind
# pass (`h10-*`, 7 excerpts, 5 non-benign) scored 0.20 (1/5) before and after the g4-* pass, and with it the split is
# 0.771 (239/310) before that pass's rules and 0.777 (241/310, unambiguous 0.907) after them. Its floor here is a
# regression guard just below that measurement; the dev split carries the floors. Crashes and benign actions
# have the same zero floors everywhere.
HOLDOUT_MIN_CATEGORY = 0.75


@pytest.fixture(scope="module")
def report():
    return evaluate_corpus(CORPUS, CorpusOptions(holdout_min_category=HOLDOUT_MIN_CATEGORY))


def test_every_split_meets_the_floors(report) -> None:
    names = {s.name for s in report.splits}
    assert "dev" in names
    for split in report.splits:
        t = split.totals
        assert t["crashes"] == 0, [r.to_dict() for r in split.results if r.error][:3]
        assert t["benign_with_actions"] == 0, "a benign excerpt got drain/reset/requeue/cancel"
        floor = HOLDOUT_MIN_CATEGORY if split.hidden else 0.90
        assert t["category_accuracy"] >= floor, f"{split.name}: {t['category_accuracy']:.3f}"
    assert report.ok, report.missed


def test_dev_corpus_shape() -> None:
    dev = load_corpus(CORPUS / "dev")
    assert len(dev) >= 190
    fams = {e.family for e in dev}
    assert {"xid", "gsp", "ucx_ibverbs", "host_mce_edac", "nvml_error", "segfault", "truncated"} <= fams
    assert sum(e.benign for e in dev) >= 30
    assert all(e.source.strip() for e in dev)


def _write(d: Path, id_: str, text: str, **kw) -> None:
    d.mkdir(parents=True, exist_ok=True)
    meta = {"source": "test", "url": "https://example.invalid", "family": "xid", "category": "xid", "benign": False,
            "action": "drain_node", "culprit": "", "ambiguous": False, "note": "", **kw}
    body = [f'id = "{id_}"'] + [f"{k} = {json.dumps(v)}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}"
                                for k, v in meta.items()]
    (d / f"{id_}.toml").write_text("\n".join(body) + f"\ntext = '''\n{text}\n'''\n")


def test_loader_names_the_bad_file(tmp_path: Path) -> None:
    _write(tmp_path, "ok-one", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    _write(tmp_path, "bad-family", "x", family="nope")
    with pytest.raises(InputError) as e:
        load_corpus(tmp_path)
    assert "bad-family.toml" in str(e.value.context) and "family" in str(e.value)
    (tmp_path / "bad-family.toml").unlink()
    (tmp_path / "broken.toml").write_text("id = 'broken'\ntext = '''\n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_corpus(tmp_path)
    (tmp_path / "broken.toml").unlink()
    _write(tmp_path, "benign-but-xid", "x", benign=True)
    with pytest.raises(InputError, match="benign"):
        load_corpus(tmp_path)


def test_splits_and_hidden_holdout_misses(tmp_path: Path) -> None:
    fell = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    _write(tmp_path / "dev", "dev-hit", fell)
    _write(tmp_path / "dev", "dev-miss", "nothing interesting here", category="pcie", family="pcie")
    _write(tmp_path / "holdout", "ho-miss", "nothing interesting either", category="pcie", family="pcie")
    _write(tmp_path / "holdout", "ho-action", fell, action="reset_gpu")   # category right, action class not
    assert [n for n, _ in discover_splits(tmp_path)] == ["dev", "holdout"]
    assert [n for n, _ in discover_splits(tmp_path / "dev")] == ["dev"]
    res = CliRunner().invoke(app, ["eval", "--corpus", str(tmp_path), "--width", "200"])
    assert res.exit_code != 0                         # 50 % < 90 % floor
    assert "dev-miss" in res.output and "ho-miss" not in res.output and "hidden" in res.output
    assert "ho-action" not in res.output
    rep = evaluate_corpus(tmp_path, CorpusOptions(min_category=0.0))
    assert rep.ok
    shown, hidden = rep.to_dict(show_misses=True), rep.to_dict()
    assert shown["splits"]["holdout"]["misses"][0]["id"] == "ho-miss"
    assert isinstance(hidden["splits"]["holdout"]["misses"], str)
    assert [r["id"] for r in shown["splits"]["holdout"]["action_disagreements"]] == ["ho-action"]
    assert isinstance(hidden["splits"]["holdout"]["action_disagreements"], str)
    assert hidden["splits"]["dev"]["misses"][0]["id"] == "dev-miss"   # dev misses are always listed
    assert shown["splits"]["dev"]["totals"]["category_accuracy"] == 0.5
    json.dumps(shown)


def test_one_pool_for_every_split_returns_each_splits_results_in_order(tmp_path: Path, monkeypatch) -> None:
    fell = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    oom = "[ 812.331] Out of memory: Killed process 4321 (python) total-vm:81234567kB"
    texts = [fell, "nothing interesting here", oom, fell.replace("79", "48"), "all quiet"]
    for i, t in enumerate(texts):
        _write(tmp_path / ("dev" if i < 3 else "holdout"), f"x-{i}", t)
    here = evaluate_corpus(tmp_path, CorpusOptions(min_category=0.0, workers=1))
    monkeypatch.setattr(corpus_eval, "MIN_EXCERPTS_FOR_POOL", 0)   # a pool even for five excerpts
    pooled = evaluate_corpus(tmp_path, CorpusOptions(min_category=0.0, workers=2))
    assert [[r.excerpt.id for r in s.results] for s in pooled.splits] == [["x-0", "x-1", "x-2"], ["x-3", "x-4"]]
    assert [[r.to_dict() for r in s.results] for s in pooled.splits] == \
        [[r.to_dict() for r in s.results] for s in here.splits]
    assert pooled.splits[0].results[0].category == "xid" and pooled.splits[0].results[1].incidents == 0


def test_scoring_rules() -> None:
    assert action_class(["requeue_job", "drain_node"]) == "drain_node"
    assert action_class(["drain_node", "reset_gpu", "requeue_job"]) == "reset_gpu"
    assert action_class([]) == "none"

    def ex(i: str, fam: str, cat: str, benign: bool = False) -> Excerpt:
        return Excerpt(id=i, source="s", url="u", family=fam, category=cat, benign=benign,
                       action="none", culprit="", ambiguous=False, note="", text="x")
    rs = [ExcerptResult(ex("a", "xid", "xid"), category="xid"),
          ExcerptResult(ex("b", "xid", "xid"), category="pcie"),
          ExcerptResult(ex("c", "pcie", "pcie"), category="xid"),
          ExcerptResult(ex("d", "benign", "none", True), category="none"),
          ExcerptResult(ex("e", "benign", "none", True), category="xid", disruptive=("drain_node",))]
    fam = per_family(rs)
    assert fam["xid"]["recall"] == 0.5 and fam["xid"]["precision"] == pytest.approx(1 / 3)   # c and e land in xid
    assert fam["benign"]["recall"] == 0.5
    assert CorpusOptions().min_category == 0.90


def test_holdout_is_at_least_a_quarter_of_the_corpus() -> None:
    dev, holdout = load_corpus(CORPUS / "dev"), load_corpus(CORPUS / "holdout")
    assert len(dev) + len(holdout) >= 250
    assert len(holdout) / (len(dev) + len(holdout)) >= 0.25
    assert sum(e.benign for e in dev) + sum(e.benign for e in holdout) >= 40
    assert {e.url for e in holdout}.isdisjoint({e.url for e in dev}), "a held-out thread is also in dev"


def _thread_refs(url: str) -> tuple[str, ...]:
    """How a rule or a test names a thread: its URL, and ``owner/repo#N`` for a GitHub issue or PR."""
    m = re.match(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)$", url.rstrip("/"))
    return (url.rstrip("/"),) + ((f"{m.group(1)}#{m.group(2)}",) if m else ())


def test_no_rule_engine_module_or_test_cites_a_held_out_thread() -> None:
    # A held-out thread a rule writer has read no longer predicts unseen logs: its wording may be in a rule.
    root = CORPUS.parents[2]
    refs = {r for e in load_corpus(CORPUS / "holdout") if e.url for r in _thread_refs(e.url)}
    cited = re.compile("(?:" + "|".join(re.escape(r) for r in sorted(refs)) + r")(?![\w/])")
    files = [*sorted((root / "rules").glob("*.toml")), *sorted((root / "recovery_logs").rglob("*.py")),
             *sorted((root / "tests").rglob("*.py")), *sorted((CORPUS / "dev").glob("*.toml"))]
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files for m in cited.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
