"""Plain progress findings held narrow (``detectors.progress``, ``pipeline.progress_store``) decide
exactly what full rows decide: the same incidents (ids, evidence, order), the same detector
findings, and the same findings frame but for the text (message, detail) of the lines nobody reads again.

The reference is ``Engine(narrow_progress=False)`` (every finding a full row, the detectors reading
progress from the frame as before). Inputs: every simulator scenario (small), the bundled
incidents, and a mixed multi-job day (three scenarios' jobs on disjoint nodes in one directory).
The fleet-scale input (256 nodes x 1 h) is compared against the previous commit by
``benchmarks/fleet_scale.py``'s result digest (README, issue 16).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from recovery_logs.analysis.truth import scenario_dirs
from recovery_logs.detectors.progress import PROGRESS_SCHEMA, is_plain, narrow, observations, widen
from recovery_logs.pipeline.engine import TEXT_RULES, Engine
from recovery_logs.pipeline.replay import replay
from recovery_logs.simulate import SimOptions, simulate
from recovery_logs.simulate.scenarios import SCENARIOS
from recovery_logs.sources.files import read_paths

BUNDLED = Path(__file__).resolve().parents[2] / "recovery_logs" / "data" / "incidents"


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    root = tmp_path_factory.mktemp("sims")
    simulate(SimOptions(out=root, scenario=",".join(SCENARIOS), seed=5, nodes=3, duration_s=1200.0))
    return root


@pytest.fixture(scope="module")
def mixed_day(sims, tmp_path_factory):
    """Three jobs on disjoint nodes in one directory (node names changed in paths and text)."""
    day = tmp_path_factory.mktemp("day")
    for name, prefix in (("xid79_cascade", "gpu-a"), ("straggler_node", "gpu-b"), ("silent_hang", "gpu-c")):
        src = sims / name
        for f in sorted(src.rglob("*")):
            if f.is_file() and f.name != "truth.json":
                out = day / str(f.relative_to(src)).replace("gpu-n", prefix)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(f.read_bytes().replace(b"gpu-n", prefix.encode()))
    return day


def _both(path: Path) -> tuple[Engine, Engine, dict, dict]:
    full, slim = Engine(narrow_progress=False), Engine()
    a = replay([path], engine=full).to_dict()
    b = replay([path], engine=slim).to_dict()
    return full, slim, a, b


def _assert_same(path: Path) -> Engine:
    full, slim, a, b = _both(path)
    assert b == a                                                   # summary, incidents, ids, evidence, order
    assert slim.detector_findings().equals(full.detector_findings())
    assert slim.progress_rows == full.progress_rows
    f_full, f_slim = full.findings, slim.findings
    assert f_slim.drop("message", "detail").equals(f_full.drop("message", "detail"))   # every other column, every row, in order
    kept = f_slim.filter(pl.col("message").is_not_null())
    assert kept.join(f_full, on=["seq", "message"], how="anti").height == 0   # a text kept is the line's
    plain = f_full.filter(is_plain(TEXT_RULES)).height
    assert slim.progress.height == plain and full.progress.height == 0
    return slim


def test_simulator_scenarios_decide_the_same(sims):
    narrowed = 0
    for d in scenario_dirs(sims):
        narrowed += _assert_same(d).progress.height
    assert narrowed > 10_000          # the scenarios' progress lines did go narrow


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLED.iterdir() if p.is_dir()))
def test_bundled_incidents_decide_the_same(name):
    _assert_same(BUNDLED / name)


def test_a_mixed_multi_job_day_decides_the_same(mixed_day):
    slim = _assert_same(mixed_day)
    assert slim.progress.select(pl.col("job_id").n_unique()).item() == 3


def test_any_split_of_the_batches_gives_the_same_narrow_rows_and_verdicts(sims):
    ev = read_paths([sims / "straggler_node"]).events
    whole = Engine()
    whole.feed(ev)
    split = Engine()
    for k in range(0, ev.height, 3_001):
        split.feed(ev.slice(k, 3_001))
    assert split.progress.equals(whole.progress)
    assert split.detector_findings().equals(whole.detector_findings())
    assert [i.to_dict() for i in split.incidents()] == [i.to_dict() for i in whole.incidents()]


def test_narrow_rows_round_trip_and_observations_match_the_full_rows(sims):
    eng = Engine(narrow_progress=False)
    eng.feed(read_paths([sims / "workload_imbalance"]).events)
    f = eng.findings
    plain = f.filter(is_plain(TEXT_RULES))
    rows = narrow(plain)
    assert dict(rows.schema) == PROGRESS_SCHEMA and rows.height == plain.height > 1000
    assert widen(rows).drop("message", "detail").equals(plain.drop("message", "detail"))
    # the detectors' view: the frame's own progress rows and the narrow ones, merged = all from the frame
    rest = f.filter(~is_plain(TEXT_RULES))
    assert observations(rest, rows).equals(observations(f))
    per_rank = observations(f).filter(pl.col("rule_id") == "progress.rank_phase_timing")
    assert per_rank.height > 1000 and per_rank["rank_line"].null_count() == 0   # ranks read from the lines' text


def test_compaction_drops_narrow_rows_by_time_as_it_drops_full_rows(sims):
    ev = read_paths([sims / "silent_hang"]).events
    full, slim = Engine(narrow_progress=False), Engine()
    full.feed(ev)
    slim.feed(ev)
    horizon = int(ev["time"].dt.epoch("ns").quantile(0.5))     # type: ignore[arg-type]
    assert slim.compact(horizon) == full.compact(horizon) > 0
    assert slim.findings.drop("message", "detail").equals(full.findings.drop("message", "detail"))
    assert slim.progress["time"].dt.epoch("ns").min() >= horizon   # type: ignore[operator]
    assert [i.to_dict() for i in slim.incidents()] == [i.to_dict() for i in full.incidents()]
    before = int(ev["time"].dt.epoch("ns").quantile(0.8))       # type: ignore[arg-type]
    assert slim.compact_floods(before, before) == full.compact_floods(before, before) > 0
    assert slim.findings.drop("message", "detail").equals(full.findings.drop("message", "detail"))


def test_spilled_narrow_rows_come_back_the_same(sims, tmp_path):
    eng = Engine()
    eng.feed(read_paths([sims / "straggler_node"]).events)
    before, prog = eng.findings, eng.progress
    eng.spill_findings(tmp_path / "f.arrow")
    assert eng.findings_rows == 0
    eng.load_findings(tmp_path / "f.arrow")
    assert eng.progress.equals(prog) and eng.findings.equals(before)
    assert not (tmp_path / "f.arrow.progress").exists()


def test_a_resumed_job_keeps_the_text_of_its_first_line_after_the_silence(sims):
    eng = Engine()
    eng.feed(read_paths([sims / "silent_hang"]).events)
    kept = eng.findings.filter((pl.col("category") == "progress") & pl.col("message").is_not_null()
                               & pl.col("rule_id").is_in(list(TEXT_RULES)).not_())
    # the first line of each job (nothing before it) keeps its text; the others are at file + line
    assert kept.height >= 1 and kept.height < eng.progress.height / 100
    assert kept["message"].str.len_chars().min() > 0   # type: ignore[operator]
