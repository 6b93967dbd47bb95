"""Sharded replay on Ray equals one process: the simulator's scenarios and a mixed multi-job day.

Skipped (with the reason) where Ray is not installed: it is the optional ``[scale]`` extra."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.scale import plan_shards
from recovery_logs.simulate import SimOptions, simulate

SCENARIOS = "xid79_cascade,ib_link_down,straggler_node"   # all 22: benchmarks/scale_replay.py --identity


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    root = tmp_path_factory.mktemp("sims")
    simulate(SimOptions(out=root, scenario=SCENARIOS, seed=3, nodes=4, duration_s=1200.0))
    return root


def _renamed(src: Path, dst: Path, old: str, new: str) -> None:
    """A copy of a scenario with every node name changed (paths and text): another job's nodes."""
    for f in sorted(src.rglob("*")):
        if f.is_file() and f.name != "truth.json":
            out = dst / str(f.relative_to(src)).replace(old, new)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(f.read_bytes().replace(old.encode(), new.encode()))


@pytest.fixture(scope="module")
def mixed_day(sims, tmp_path_factory):
    """Three jobs on disjoint nodes in one directory, plus the controller logs: a day of a cluster."""
    day = tmp_path_factory.mktemp("day")
    _renamed(sims / "xid79_cascade", day, "gpu-n", "gpu-a")
    _renamed(sims / "ib_link_down", day, "gpu-n", "gpu-b")
    _renamed(sims / "straggler_node", day, "gpu-n", "gpu-c")
    return day


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is the optional [scale] extra: pip install 'recovery-logs[scale]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_shards_are_contiguous_runs_of_the_files_in_order(mixed_day):
    from recovery_logs.sources.files import expand_paths

    files = [str(f) for f in expand_paths([mixed_day])[0]]
    for n in (1, 2, 3, 7, 100):
        shards, _ = plan_shards([mixed_day], n)
        assert [f for s in shards for f in s] == files and 1 <= len(shards) <= min(n, len(files))


def test_partial_and_absorb_equal_feed(sims):
    from recovery_logs.sources.files import read_paths

    ev = read_paths([sims / "xid79_cascade"]).events.sort("seq")
    a, b = Engine(), Engine()
    a.feed(ev)
    cut = ev.height // 3
    b.absorb(b.partial(ev.slice(0, cut)).merge(b.partial(ev.slice(cut))))
    a.advance(a.max_time_ns)
    b.advance(b.max_time_ns)
    assert [i.to_dict() for i in a.incidents()] == [i.to_dict() for i in b.incidents()]


@pytest.mark.parametrize("name", SCENARIOS.split(","))
def test_sharded_replay_of_each_scenario_is_identical(sims, ray_local, name):
    from recovery_logs.pipeline.scale import replay_sharded

    one = replay([sims / name])
    many = replay_sharded([sims / name], workers=2)
    assert many.to_dict() == one.to_dict()


def test_sharded_replay_of_a_mixed_multi_job_day_is_identical(mixed_day, ray_local, tmp_path):
    from recovery_logs.pipeline.scale import replay_sharded

    one = replay([mixed_day], ReplayOptions(out_dir=tmp_path / "one"))
    many = replay_sharded([mixed_day], ReplayOptions(out_dir=tmp_path / "many"), workers=2)
    assert len({i["job_id"] for i in one.to_dict()["incidents"]}) >= 2
    assert many.to_dict() == one.to_dict()
    assert (tmp_path / "many" / "incidents.json").read_text() == (tmp_path / "one" / "incidents.json").read_text()
    assert many.quarantine.equals(one.quarantine)
    shutil.rmtree(tmp_path / "many")
