"""Sharded replay on Ray equals one process: the simulator's scenarios, a mixed multi-job day, and
layouts built to cut across the bins of the replay by allocation (a job's files far apart in reading
order, a node shared by two consecutive jobs, a node outside any job, NCCL peers whose address
another bin's log binds, accounting).

Skipped (with the reason) where Ray is not installed: it is the optional ``[scale]`` extra. One
local Ray serves the whole module (its start is the slow part)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
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


def _renamed(src: Path, dst: Path, old: str, new: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
    """A copy of a scenario with every node name changed (paths and text): another job's nodes.
    ``extra``: more (old, new) replacements in the text (another job's IP addresses)."""
    for f in sorted(src.rglob("*")):
        if f.is_file() and f.name != "truth.json":
            out = dst / str(f.relative_to(src)).replace(old, new)
            out.parent.mkdir(parents=True, exist_ok=True)
            data = f.read_bytes().replace(old.encode(), new.encode())
            for a, b in extra:
                data = data.replace(a.encode(), b.encode())
            out.write_bytes(data)


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


# -- replay by allocation -------------------------------------------------------------------------------
def _same(paths: list[Path], ray_local, opts: ReplayOptions | None = None, mode: str = "allocation"):
    """The sharded result equals one process's (summary, incidents, ids, evidence, order; quarantine)."""
    from recovery_logs.pipeline.scale import replay_sharded

    one = replay(paths, opts)
    many = replay_sharded(paths, opts, workers=2, mode=mode)
    assert many.to_dict() == one.to_dict()
    assert many.quarantine.equals(one.quarantine)
    return one, many


def _ctl_merged(day: Path, sources: list[Path]) -> None:
    """One controller log for the day: the jobs' slurmctld lines merged in time order."""
    lines = [ln for s in sources for ln in (s / "nodes" / "slurmctl01" / "slurmctld.log").read_text().splitlines()]
    (day / "nodes" / "slurmctl01").mkdir(parents=True, exist_ok=True)
    (day / "nodes" / "slurmctl01" / "slurmctld.log").write_text("\n".join(sorted(lines, key=lambda x: x[:25])) + "\n")


@pytest.fixture(scope="module")
def cluster_day(sims, tmp_path_factory):
    """Three jobs on disjoint nodes with their own addresses (as on a real fabric), one controller log."""
    day = tmp_path_factory.mktemp("cluster_day")
    for k, (name, letter) in enumerate((("xid79_cascade", "a"), ("ib_link_down", "b"), ("straggler_node", "c"))):
        _renamed(sims / name, day, "gpu-n", f"gpu-{letter}", (("10.128.", f"10.{130 + k}."),))
    _ctl_merged(day, [sims / n for n in SCENARIOS.split(",")])
    return day


def test_by_allocation_a_multi_job_day_is_judged_apart_and_identical(cluster_day, ray_local):
    one, many = _same([cluster_day], ray_local, mode="auto")
    assert many.engine.stats["shard_bins"] == 2 and many.engine.stats["shard_merges"] == 0
    assert len({i.job_id for i in one.incidents}) == 3
    # the result's engine: merged windows and spans, the detectors' findings, no progress rows
    assert set(many.engine.windows["host"].unique()) == set(one.engine.windows["host"].unique())
    det = lambda e: e.detector_findings().sort(["time", "rule_id", "host"]).select("rule_id", "host", "job_id", "time")  # noqa: E731
    assert det(many.engine).equals(det(one.engine))


def test_by_allocation_a_peer_address_bound_in_another_bin_s_log_merges_the_bins(mixed_day, ray_local):
    # the three simulated jobs reuse the same addresses: job b's NCCL errors name a peer IP that job c's
    # node bound first, so one process names gpu-c01 as a candidate of job b's incident
    one, many = _same([mixed_day], ray_local)
    ib = next(i for i in one.incidents if i.category == "infiniband_link")
    assert any(c.node == "gpu-c01" for c in ib.candidates) or "gpu-c01" in ib.nodes
    assert many.engine.stats["shard_merges"] >= 1


@pytest.fixture(scope="module")
def awkward_day(sims, tmp_path_factory):
    """Layouts that cut across bins: job a's output sorts first and its kernel logs last; job b's
    node 1 is job a's node 4 (two jobs, one node) and that kernel log sits at a path that names no
    host; an idle node with an XID 79 outside any job; one controller log."""
    day = tmp_path_factory.mktemp("awkward")
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    _renamed(sims / "xid79_cascade", a, "gpu-n", "gpu-a", (("10.128.", "10.130."),))
    _renamed(sims / "ib_link_down", b, "gpu-n01", "gpu-a04", (("10.128.", "10.131."),))
    for f in sorted(a.rglob("*")):
        if f.is_file() and "slurmctl" not in str(f):
            rel = f.relative_to(a)
            out = day / ("a-out" if rel.parts[0].startswith("job") else "z-kern") / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(f.read_bytes())
    for f in sorted(b.rglob("*")):
        if f.is_file() and "slurmctl" not in str(f):
            rel = str(f.relative_to(b)).replace("gpu-n", "gpu-b")
            if rel == "nodes/gpu-a04/kern.log":
                rel = "m-misc/kernel-messages"      # no host in the path: only its lines name gpu-a04
            out = day / "m-b" / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(f.read_bytes().replace(b"gpu-n", b"gpu-b"))
    culprit = next(f for f in (sims / "xid79_cascade" / "nodes").glob("*/kern.log") if b"Xid" in f.read_bytes())
    idle = day / "m-idle" / "gpu-z01" / "kern.log"
    idle.parent.mkdir(parents=True)
    idle.write_bytes(culprit.read_bytes().replace(culprit.parent.name.encode(), b"gpu-z01"))
    _ctl_merged(day, [a, b])
    return day


def test_by_allocation_awkward_layouts_are_identical(awkward_day, ray_local):
    one, many = _same([awkward_day], ray_local)
    assert any(i.node == "gpu-z01" and i.job_id is None and i.category == "xid" for i in one.incidents)
    assert {i.job_id for i in one.incidents} >= {None, _job(awkward_day, "a-out")}
    assert "shard_bins" in many.engine.stats          # judged by allocation, not read-parallel


def _job(day: Path, top: str) -> str:
    return next((day / top).glob("job-*")).name.removeprefix("job-")


def test_by_allocation_with_accounting_is_identical(cluster_day, ray_local):
    from datetime import UTC, datetime

    from recovery_logs.sources.accounting import ALLOCATION_SCHEMA

    rows = []
    one = replay([cluster_day])
    for job in sorted({i.job_id for i in one.incidents if i.job_id}):
        hosts = one.engine.spans.filter(pl.col("job_id") == job)
        t0 = hosts["first"].min()
        for h in sorted(hosts["host"].unique()):
            rows.append({"cluster": "c", "job_id": job, "node": h, "gpus": 8, "step": None, "state": "RUNNING",
                         "start": t0, "attempt": f"c|{job}|1", "chain": f"c|{job}", "restart_count": 0,
                         "submit": datetime(2026, 11, 29, 13, tzinfo=UTC)})
    acc = pl.DataFrame(rows, schema=ALLOCATION_SCHEMA)
    _, many = _same([cluster_day], ray_local, ReplayOptions(accounting=acc))
    assert many.summary["accounting_rows"] == acc.height
    assert any(e.rule_id == "accounting.agree" for i in many.incidents for e in i.evidence)


# -- more bins than hosts: a fleet's day in bounded memory ------------------------------------------------
def test_spilled_findings_come_back_the_same(sims, tmp_path):
    from recovery_logs.sources.files import read_paths

    eng = Engine()
    eng.feed(read_paths([sims / "straggler_node"]).events)
    before = eng.findings
    eng.spill_findings(tmp_path / "f.arrow")
    assert eng.findings.height == 0                  # let go of: nothing held until it is loaded
    eng.load_findings(tmp_path / "f.arrow")
    assert before.height > 1000 and eng.findings.equals(before)


def test_by_allocation_in_one_process_one_bin_at_a_time_is_identical(cluster_day, awkward_day):
    """``replay --by-allocation``: no Ray; each job its own bin (bin_bytes=1), read one after another,
    their findings spilled between reading and judging; the awkward layouts make bins meet and merge."""
    from recovery_logs.pipeline.scale import replay_by_allocation

    for day, bins in ((cluster_day, 3), (awkward_day, None)):
        one = replay([day])
        alone = replay_by_allocation([day], bin_bytes=1)
        assert alone.to_dict() == one.to_dict()
        assert alone.quarantine.equals(one.quarantine)
        if bins is not None:
            assert alone.engine.stats["shard_bins"] == bins and alone.engine.stats["shard_merges"] == 0
        else:
            assert alone.engine.stats["shard_merges"] >= 1


def test_by_allocation_more_bins_than_workers_is_identical(cluster_day, ray_local):
    from recovery_logs.pipeline.scale import replay_sharded

    one = replay([cluster_day])
    many = replay_sharded([cluster_day], workers=2, bin_bytes=1)
    assert many.to_dict() == one.to_dict()
    assert many.engine.stats["shard_bins"] == 3


def test_by_allocation_refuses_report_files(cluster_day, tmp_path):
    from recovery_logs.errors import ConfigError
    from recovery_logs.pipeline.scale import replay_by_allocation

    with pytest.raises(ConfigError, match="no report files"):
        replay_by_allocation([cluster_day], ReplayOptions(out_dir=tmp_path / "o"))


def test_local_workers_share_the_cores_in_polars_threads():
    from recovery_logs.pipeline.scale import worker_threads

    assert worker_threads(2, 2, None) == 1            # this machine: 2 workers on 2 cores
    assert worker_threads(4, 64, None) == 16
    assert worker_threads(8, 4, None) == 1            # never 0
    assert worker_threads(2, 64, "4") == 4             # POLARS_MAX_THREADS asks for fewer
    assert worker_threads(2, 4, "16") == 2             # ... or more: the share wins
    assert worker_threads(2, 8, "lots") == 4


def test_by_allocation_a_host_spills_all_but_the_bin_it_read_last(cluster_day, ray_local):
    """A host of k bins writes k - 1 of them to disk (the one read last is judged first, from memory);
    the result is the same as one process's."""
    from recovery_logs.pipeline.scale import replay_by_allocation, replay_sharded

    one = replay([cluster_day])
    alone = replay_by_allocation([cluster_day], bin_bytes=1)            # 3 bins, one host
    many = replay_sharded([cluster_day], workers=2, bin_bytes=1)        # 3 bins, two hosts
    assert alone.to_dict() == one.to_dict() and many.to_dict() == one.to_dict()
    assert alone.engine.stats["shard_bins"] == 3 and alone.engine.stats["shard_spills"] == 2
    assert many.engine.stats["shard_spills"] == 1
    hosts = {many.engine.stats[f"shard_bin{b}_host"] for b in range(3)}
    assert hosts == {0, 1}


def test_by_allocation_the_merged_windows_and_spans_equal_one_process_s(cluster_day, awkward_day, ray_local):
    """The driver concatenates the bins' windows (their hosts are disjoint) and merges only the
    host-less ones: the same frame, row for row, as one engine's windows (and spans)."""
    from recovery_logs.pipeline.scale import replay_by_allocation, replay_sharded

    hostless = cluster_day.parent / (cluster_day.name + "-hostless")
    if not hostless.exists():      # two files that name no host and no job, each its own bin: their
        shutil.copytree(cluster_day, hostless)      # windows share keys (no host, no job, a window)
        for name in ("misc-a/notes.log", "misc-b/notes.log"):
            (hostless / name).parent.mkdir(parents=True)
            (hostless / name).write_text("".join(f"2026-11-29T14:0{m}:{s:02d}Z note {name[5]} {m} {s}\n"
                                                 for m in range(3) for s in range(0, 60, 7)))
    for day in (cluster_day, awkward_day, hostless):
        one = replay([day])
        if day is hostless:
            nulls = one.engine.windows.filter(pl.col("host").is_null() & pl.col("job_id").is_null())
            assert nulls.height >= 3 and nulls.get_column("lines").sum() == 2 * 27
        for res in (replay_by_allocation([day], bin_bytes=1), replay_sharded([day], workers=2, bin_bytes=1)):
            assert res.engine.windows.height > 100
            if day is hostless:      # the two host-less files were judged apart
                assert res.engine.stats["shard_bins"] == 5 and res.engine.stats["shard_merges"] == 0
            assert res.engine.windows.equals(one.engine.windows) and res.engine.spans.equals(one.engine.spans)


def test_by_allocation_a_plan_that_fails_lets_go_of_the_hosts(cluster_day, ray_local, tmp_path):
    """The hosts start while the plan is made: a plan that fails (no such input) must not leave them
    holding the local Ray's CPUs (the next replay would wait for them for ever)."""
    from recovery_logs.errors import InputError
    from recovery_logs.pipeline.scale import replay_sharded

    with pytest.raises(InputError):
        replay_sharded([tmp_path / "no-such-dir"], workers=2, mode="allocation")
    assert replay_sharded([cluster_day], workers=2, bin_bytes=1).to_dict() == replay([cluster_day]).to_dict()
