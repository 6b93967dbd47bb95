"""The allocation plan of the Ray replay (pure, no Ray): whole allocations per bin, the controller
log shared, nodes outside jobs on their own, and the check that merges bins whose data met."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from recovery_logs.pipeline.shard_plan import BinKeys, conflicts, owners_map, plan_allocations, scope_key
from recovery_logs.sources.accounting import ALLOCATION_SCHEMA


def _touch(root: Path, rel: str, size: int = 100) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x" * (size - 1) + "\n")


def _bin_of(plan, name: str) -> int:
    idx = next(i for i, f in enumerate(plan.files) if f.endswith(name))
    return next(b for b, files in enumerate(plan.bins) if idx in files)


def allocations(rows: list[tuple[str, str]]) -> pl.DataFrame:
    t = datetime(2026, 11, 29, 14, tzinfo=UTC)
    return pl.DataFrame([{"job_id": j, "node": n, "start": t, "attempt": j, "cluster": "c", "step": None}
                         for j, n in rows], schema=ALLOCATION_SCHEMA)


def test_a_job_s_files_far_apart_in_reading_order_are_one_bin(tmp_path: Path):
    # job 11's output sorts first, its nodes' kernel logs last, job 22 and an idle node in between
    for n in (1, 2):
        _touch(tmp_path, f"a-out/job-11/gpu-a0{n}.out", 5000)
        _touch(tmp_path, f"m-out/job-22/gpu-b0{n}.out", 5000)
        _touch(tmp_path, f"z-nodes/gpu-a0{n}/kern.log")
        _touch(tmp_path, f"m-nodes/gpu-b0{n}/kern.log")
    _touch(tmp_path, "m-nodes/gpu-z01/kern.log", 3000)
    _touch(tmp_path, "z-nodes/slurmctl01/slurmctld.log")
    plan = plan_allocations([tmp_path], 2)
    assert [plan.files[i] for i in plan.shared] == [str(tmp_path / "z-nodes/slurmctl01/slurmctld.log")]
    a = {_bin_of(plan, f) for f in ("gpu-a01.out", "gpu-a02.out", "gpu-a01/kern.log", "gpu-a02/kern.log")}
    b = {_bin_of(plan, f) for f in ("gpu-b01.out", "gpu-b02.out", "gpu-b01/kern.log", "gpu-b02/kern.log")}
    assert len(a) == 1 and len(b) == 1 and a != b
    assert plan.components == 3                        # job 11, job 22, the idle node gpu-z01
    assert sorted(i for b in plan.bins for i in b) == sorted(set(range(len(plan.files))) - set(plan.shared))
    assert all(b == sorted(b) for b in plan.bins)       # each bin reads in the global reading order


def test_accounting_ties_a_node_without_job_output_to_its_job_and_chains_consecutive_jobs(tmp_path: Path):
    _touch(tmp_path, "job-11/gpu-a01.out", 5000)
    _touch(tmp_path, "job-22/gpu-b01.out", 5000)
    _touch(tmp_path, "nodes/gpu-c01/kern.log", 5000)
    _touch(tmp_path, "nodes/gpu-d01/kern.log", 5000)
    plain = plan_allocations([tmp_path], 4)
    assert plain.components == 4
    # job 11 ran on gpu-a01 and gpu-c01; gpu-c01 then ran job 22: one component of three jobs' worth
    acc = allocations([("11", "gpu-a01"), ("11", "gpu-c01"), ("22", "gpu-c01"), ("22", "gpu-b01")])
    plan = plan_allocations([tmp_path], 4, allocations=acc)
    assert plan.components == 2
    assert len({_bin_of(plan, f) for f in ("gpu-a01.out", "gpu-b01.out", "gpu-c01/kern.log")}) == 1
    assert _bin_of(plan, "gpu-d01/kern.log") != _bin_of(plan, "gpu-a01.out")


def test_bins_whose_data_met_are_merged():
    a = BinKeys({"gpu-a01"}, {"11"})
    b = BinKeys({"gpu-b01"}, {"22"})
    c = BinKeys({"gpu-c01"}, set())
    assert conflicts([a, b, c]) == []
    # a job id only a line names (job 11 on a node of bin b)
    assert conflicts([a, BinKeys({"gpu-b01"}, {"22", "11"}), c]) == [{0, 1}]
    # accounting puts job 22 on bin c's node
    assert conflicts([a, b, c], allocations([("22", "gpu-c01")])) == [{1, 2}]
    # job-less host-less findings in two bins group together in one process
    assert conflicts([BinKeys(global_scope=True), b, BinKeys(global_scope=True)]) == [{0, 2}]
    # a bin's own data on the controller's host: everything is judged together
    assert conflicts([a, BinKeys({"slurmctl01"}), c], shared_hosts={"slurmctl01"}) == [{0, 1, 2}]


def test_incident_scopes_map_to_their_owner():
    owners = owners_map([BinKeys({"gpu-a01"}, {"11"}), BinKeys({"gpu-b01"}, set())], allocations([("22", "gpu-b01")]))
    assert owners[scope_key("11@c|11|2026")] == 0 and owners[scope_key("host:gpu-b01")] == 1
    assert owners[scope_key("22")] == 1 and scope_key("global") == "g" and "g" not in owners


def test_a_host_only_the_lines_name_makes_the_bins_meet(tmp_path: Path):
    """The plan cannot see that ``m-misc/kernel-messages`` is gpu-a04's kernel log (no host in the
    path); what the bins' data touched shows it. Lines: the syslog shape of the simulator's kern.log."""
    from recovery_logs.config import EngineConfig
    from recovery_logs.pipeline.scale import BinWorker
    from recovery_logs.sources.read_common import ReadOptions

    line = "Nov 29 14:03:{s:02d} {h} kernel: [1760216.39{s:02d}] hrtimer: interrupt took 778180 ns\n"
    for rel, host in (("nodes/gpu-a04/kern.log", "gpu-a04"), ("m-misc/kernel-messages", "gpu-a04"),
                      ("nodes/gpu-b01/kern.log", "gpu-b01")):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(line.format(s=s, h=host) for s in range(3)))
    plan = plan_allocations([tmp_path], 3)
    assert plan.components == 3 and len(plan.bins) == 3
    ranks = {f: i for i, f in enumerate(plan.files)}
    ro = ReadOptions(year=2026)
    keys = [BinWorker([plan.files[i] for i in b], [], ranks, ro, EngineConfig(detectors=()), 100).read()["keys"]
            for b in plan.bins]
    a04 = {b for b, k in enumerate(keys) if "gpu-a04" in k.hosts}
    assert len(a04) == 2 and conflicts(keys) == [a04]


def test_lines_are_estimated_from_the_head_of_a_file(tmp_path: Path):
    from recovery_logs.pipeline.shard_plan import SAMPLE_BYTES, SAMPLES, estimate_lines

    small = tmp_path / "small.log"
    small.write_bytes(b"a\nbb\nccc")                    # counted: the last line has no newline
    assert estimate_lines(small, small.stat().st_size) == 3
    big = tmp_path / "big.log"
    n = 4 * SAMPLES * SAMPLE_BYTES // 16
    big.write_bytes(b"0123456789abcde\n" * (n // 2) + b"x" * 63 + b"\n" + b"0123456789abcde\n" * (n // 2))
    assert abs(estimate_lines(big, big.stat().st_size) - (n + 1)) <= n // 50   # 16 bytes a line but one
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(b"\x1f\x8b" + b"\x00" * 998)
    assert estimate_lines(gz, 1000) == 40 and estimate_lines(tmp_path / "gone.log", 10) == 0


def test_bins_are_balanced_by_lines_not_only_bytes(tmp_path: Path):
    # the same bytes in each job; job 11's lines are 8x shorter, so it is as much work as the other two
    _touch(tmp_path, "job-11/gpu-a01.out", 40_000)
    (tmp_path / "job-11" / "gpu-a01.out").write_bytes(b"step 1 loss 2\n" * (40_000 // 14))
    for j, h in (("22", "b"), ("33", "c")):
        (tmp_path / f"job-{j}").mkdir()
        (tmp_path / f"job-{j}" / f"gpu-{h}01.out").write_bytes((b"x" * 111 + b"\n") * (40_000 // 112))
    plan = plan_allocations([tmp_path], 2)
    assert _bin_of(plan, "gpu-b01.out") == _bin_of(plan, "gpu-c01.out") != _bin_of(plan, "gpu-a01.out")
    a01 = next(i for i, f in enumerate(plan.files) if f.endswith("gpu-a01.out"))
    assert abs(plan.lines[a01] - 40_000 // 14) <= 40_000 // 14 // 50
    assert plan_allocations([tmp_path], 1).lines == []     # one host: nothing to balance, no estimate


def test_hosts_are_assigned_to_even_out_the_estimated_cost():
    from recovery_logs.pipeline.shard_plan import assign_hosts

    # the fleet day's 8 bins (AllocationPlan.cost of the estimated lines): largest first alone gives
    # 0, 6, 2, 7 / 5, 4, 3, 1 (82.0 / 76.7); the best split is 0, 1, 6, 7 / 2, 3, 4, 5 (80.0 / 78.7)
    costs = [38.4, 12.8, 14.8, 15.0, 18.8, 30.1, 16.7, 12.1]
    where = assign_hosts(costs, 2)
    assert {b for b in range(8) if where[b] == where[0]} == {0, 1, 6, 7}
    # what the hosts already hold counts; one host and no bins are fine
    assert assign_hosts([1.0, 1.0], 2, [5.0, 0.0]) == [1, 1]
    assert assign_hosts([2.0, 1.0], 1) == [0, 0] and assign_hosts([], 3) == []
