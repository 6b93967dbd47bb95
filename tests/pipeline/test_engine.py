"""Engine: replay of all events equals feeding any split of the same in-order events."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.files import read_paths
from recovery_logs.testing import split_frame

INCIDENTS = Path(__file__).resolve().parents[2] / "recovery_logs" / "data" / "incidents"


@pytest.fixture(scope="module")
def cascade_events() -> pl.DataFrame:
    return read_paths([str(INCIDENTS / "xid79_nccl_cascade")]).events.sort(["time", "seq"])


@pytest.fixture(scope="module")
def engine_once(cascade_events):
    eng = Engine()
    eng.feed(cascade_events)
    eng.advance(eng.max_time_ns)
    return eng


def _dicts(eng: Engine):
    return [i.to_dict() for i in eng.incidents()]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6))
def test_any_split_gives_the_same_incidents(cascade_events, engine_once, cuts):
    eng = Engine(pack=engine_once.pack)
    for part in split_frame(cascade_events, cuts):
        eng.feed(part)
    eng.advance(eng.max_time_ns)
    assert _dicts(eng) == _dicts(engine_once)
    assert eng.windows.equals(engine_once.windows)


def test_replay_equals_engine_over_the_same_events(cascade_events, engine_once):
    res = replay([str(INCIDENTS / "xid79_nccl_cascade")])
    assert [i.to_dict() for i in res.incidents] == _dicts(engine_once)
    assert res.summary["events"] == cascade_events.height


def test_detected_at_does_not_move_when_later_events_arrive(cascade_events, engine_once):
    """A live engine that had only read up to the XID line names the same culprit at the same time."""
    final = engine_once.incidents()[0]
    eng = Engine(pack=engine_once.pack)
    eng.feed(cascade_events.filter(pl.col("time").dt.epoch("ns") <= final.detected_at))
    eng.advance(final.detected_at)
    live = eng.incidents()[0]
    assert (live.node, live.category, live.detected_at) == (final.node, final.category, final.detected_at)


def test_out_dir_outputs(tmp_path):
    res = replay([str(INCIDENTS / "xid79_nccl_cascade")], ReplayOptions(out_dir=tmp_path / "out"))
    for name in ("incidents.json", "report.md", "events.parquet", "quarantine.jsonl"):
        assert (tmp_path / "out" / name).is_file(), name
    ev = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert ev.height == res.summary["events"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "XID 79" in md and "gpu-n02" in md


def test_compaction_keeps_incidents_and_bounds_progress(cascade_events, engine_once):
    eng = Engine(pack=engine_once.pack)
    eng.feed(cascade_events)
    eng.advance(eng.max_time_ns)
    before = _dicts(eng)
    progress = eng.findings.filter(pl.col("category") == "progress").height
    assert progress > 0
    dropped = eng.compact(eng.max_time_ns + 1)   # everything is older than the horizon
    assert dropped == progress
    assert eng.findings.filter(pl.col("category") == "progress").height == 0
    assert _dicts(eng) == before   # detector findings were materialised before the drop
