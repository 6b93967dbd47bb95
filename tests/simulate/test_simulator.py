"""The simulator: deterministic per seed, complete truth, lines the readers parse, clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest

from recovery_logs.cli import main
from recovery_logs.errors import ConfigError
from recovery_logs.schema import Category
from recovery_logs.simulate import SimOptions, scenario_names, simulate, simulate_one
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.timeutil import iso_to_ns

SMALL = {"nodes": 3, "gpus_per_node": 4, "duration_s": 1200.0}
TRUTH_KEYS = {"scenario", "seed", "fault_kind", "category", "culprit_node", "culprit_gpu", "fault_time",
              "decisive_time", "acceptable_actions", "never_drain", "job_id", "nodes", "expect_incident"}
CATEGORIES = {c.value for c in Category}     # the engine's incident categories
ACTIONS = {"drain_node", "requeue_job", "cancel_job", "reset_gpu", "resume_node", "investigate", "none"}


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def _text_inputs(d: Path) -> list[Path]:
    return sorted(list(d.glob("nodes/*/*.log")) + list(d.glob("job-*/*.out")))


@pytest.fixture(scope="module")
def sim_all(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    simulate(SimOptions(out=out, scenario="all", seed=3, format="both", **SMALL))
    return out


def test_every_scenario_is_written_with_complete_truth(sim_all: Path) -> None:
    assert sorted(p.name for p in sim_all.iterdir()) == sorted(scenario_names())
    for name in scenario_names():
        d = sim_all / name
        truth = json.loads((d / "truth.json").read_text())
        assert TRUTH_KEYS <= set(truth), name
        assert truth["scenario"] == name and truth["seed"] == 3
        assert truth["category"] is None or truth["category"] in CATEGORIES, name
        assert set(truth["acceptable_actions"]) <= ACTIONS and truth["acceptable_actions"], name
        assert truth["nodes"] == ["gpu-n01", "gpu-n02", "gpu-n03"]
        if truth["culprit_node"] is not None:
            assert truth["culprit_node"] in truth["nodes"], name
        if truth.get("node_fault"):
            assert truth["culprit_node"] not in truth["never_drain"], name
            assert set(truth["never_drain"]) >= set(truth["nodes"]) - {truth["culprit_node"]}
        else:
            assert set(truth["never_drain"]) >= set(truth["nodes"]), name
        start, end = iso_to_ns(truth["start_time"]), iso_to_ns(truth["end_time"])
        if truth["fault_time"] is not None:
            assert start < iso_to_ns(truth["fault_time"]) < end, name
        if truth["decisive_time"] is not None:
            assert iso_to_ns(truth["decisive_time"]) >= iso_to_ns(truth["fault_time"]) - 10**9, name
        assert (truth["category"] is None) == (name == "healthy")
        assert (d / f"job-{truth['job_id']}").is_dir()
        for host in truth["nodes"]:
            assert (d / "nodes" / host / "kern.log").is_file(), (name, host)


def test_files_parse_with_the_readers_and_carry_the_decisive_line(sim_all: Path) -> None:
    for name in scenario_names():
        d = sim_all / name
        truth = json.loads((d / "truth.json").read_text())
        res = read_paths(_text_inputs(d), ReadOptions(year=2026))
        ev = res.events
        assert set(ev["host"].unique()) == set(truth["nodes"]) | {"slurmctl01"}, name
        assert set(ev.filter(pl.col("file").str.contains("/job-"))["job_id"].unique()) == {truth["job_id"]}, name
        assert ev["time"].null_count() == 0, name
        if truth["decisive_time"] is not None:
            # NCCL lines, Python tracebacks and GPU health-check output carry no timestamp: the reader
            # gives them their neighbour's time, at most one per-rank step interval (~4 s) earlier
            slack = 6 if name in ("nccl_net_error", "gpu_oom", "user_exception", "gpu_thermal") else 1
            t = iso_to_ns(truth["decisive_time"])
            near = ev.filter((pl.col("host") == truth["decisive_node"])
                             & ((pl.col("time").dt.epoch("ns") - t).abs() <= slack * 1_000_000_000))
            assert near.height >= 1, f"{name}: no event on {truth['decisive_node']} near the decisive time"


def test_vl_jsonl_rows_are_victorialogs_shaped(sim_all: Path) -> None:
    d = sim_all / "xid79_cascade"
    rows = [json.loads(x) for x in (d / "vl.jsonl").read_text().splitlines()]
    assert len(rows) > 1000
    for r in rows:
        assert {"_time", "_msg", "host", "unit", "_stream", "_stream_id"} <= set(r)
        assert all(isinstance(v, str) for v in r.values())
        assert len(r["_time"]) == 30 and r["_time"].endswith("Z")
        assert r["_stream"] == f'{{host="{r["host"]}",unit="{r["unit"]}"}}'
    times = [r["_time"] for r in rows]    # fixed-width RFC3339 UTC: string order is time order
    assert times != sorted(times), "arrival order should differ from event order across hosts"
    xid = [r for r in rows if "NVRM: Xid" in r["_msg"] and ": 79," in r["_msg"]]
    truth = json.loads((d / "truth.json").read_text())
    assert [r["host"] for r in xid] == [truth["culprit_node"]]
    res = read_paths([d / "vl.jsonl"], ReadOptions(fmt="vl-jsonl"))
    assert set(res.events["host"].unique()) == set(truth["nodes"]) | {"slurmctl01"}


def test_same_seed_same_bytes_other_seed_other_run(tmp_path: Path) -> None:
    a = simulate_one("xid48_row_remap", SimOptions(out=tmp_path / "a", seed=11, **SMALL))
    b = simulate_one("xid48_row_remap", SimOptions(out=tmp_path / "b", seed=11, **SMALL))
    c = simulate_one("xid48_row_remap", SimOptions(out=tmp_path / "c", seed=12, **SMALL))
    assert _digest(a.path) == _digest(b.path)
    assert _digest(a.path) != _digest(c.path)
    assert a.truth == b.truth


def test_chunking_does_not_lose_or_repeat_scripted_lines(tmp_path: Path) -> None:
    opts = dict(seed=5, dup_rate=0.0, garbage_rate=0.0, **SMALL)
    big = simulate_one("xid79_cascade", SimOptions(out=tmp_path / "big", **opts))
    small = simulate_one("xid79_cascade", SimOptions(out=tmp_path / "small", chunk_s=37.0, **opts))

    def scripted(d: Path) -> list[str]:
        lines = []
        for p in _text_inputs(d):
            lines += [x for x in p.read_text(errors="replace").splitlines()
                      if "NVRM: Xid" in x or "Watchdog caught" in x or "srun: error" in x]
        return sorted(lines)
    assert scripted(big.path) == scripted(small.path)
    assert len([x for x in scripted(big.path) if "Watchdog caught" in x]) == 3 * 4 - 1


def test_noise_reaches_the_readers_as_duplicates_and_garbage(tmp_path: Path) -> None:
    r = simulate_one("healthy", SimOptions(out=tmp_path, seed=2, dup_rate=0.01, garbage_rate=0.01, **SMALL))
    res = read_paths(_text_inputs(r.path), ReadOptions(year=2026))
    assert res.stats["duplicates"] > 0
    raw = b"".join(p.read_bytes() for p in r.path.glob("job-*/*.out"))
    assert b"\xff\xfe" in raw and b"\x00\x00\x00\x00" in raw
    assert res.stats["invalid_utf8"] > 0


def test_combined_faults_have_distinct_culprits(tmp_path: Path) -> None:
    r = simulate_one("xid95_uncontained+straggler_node", SimOptions(out=tmp_path, seed=4, nodes=4, gpus_per_node=2,
                                                                   duration_s=1800.0))
    t = r.truth
    assert [f["fault_kind"] for f in t["faults"]] == ["xid95_uncontained", "straggler_node"]
    culprits = [f["culprit_node"] for f in t["faults"]]
    assert len(set(culprits)) == 2
    assert r.path.name == "xid95_uncontained__straggler_node"
    # the Xid 95 ended the job before the straggler began: its evidence never appears, so it is masked
    assert [f["masked"] for f in t["faults"]] == [False, True]
    assert culprits[1] in t["never_drain"] and culprits[0] not in t["never_drain"]
    r2 = simulate_one("ib_flap+gpu_oom", SimOptions(out=tmp_path, seed=4, nodes=4, gpus_per_node=2, duration_s=1800.0))
    assert [f["masked"] for f in r2.truth["faults"]] == [False, False]
    assert r2.truth["culprit_node"] not in r2.truth["never_drain"]


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"scenario": "nope"}, "unknown scenario"),
    ({"scenario": "healthy+nope"}, "unknown scenario"),
    ({"scenario": "healthy", "nodes": 1}, "at least 2 nodes"),
    ({"scenario": "healthy", "format": "xml"}, "unknown format"),
    ({"scenario": "silent_hang", "duration_s": 600.0}, "duration too short"),
    ({"scenario": "healthy", "gpus_per_node": 0}, "gpus-per-node"),
    ({"scenario": "healthy", "log_profile": "chatty"}, "unknown log profile"),
])
def test_bad_options_are_config_errors(tmp_path: Path, kwargs: dict, needle: str) -> None:
    base = {"nodes": 2, "gpus_per_node": 2, "duration_s": 1200.0}
    with pytest.raises(ConfigError, match=needle):
        simulate(SimOptions(out=tmp_path, **{**base, **kwargs}))


def test_unwritable_or_foreign_output_dirs_are_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write") as e:
        simulate(SimOptions(out=blocker, scenario="healthy", nodes=2, gpus_per_node=1, duration_s=600.0))
    assert str(blocker) in str(e.value)
    foreign = tmp_path / "out" / "healthy"
    foreign.mkdir(parents=True)
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        simulate(SimOptions(out=tmp_path / "out", scenario="healthy", nodes=2, gpus_per_node=1, duration_s=600.0))
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_cli_simulate_and_its_exit_codes(tmp_path: Path, capsys) -> None:
    rc = main(["simulate", "--scenario", "gpu_oom", "--out", str(tmp_path), "--nodes", "2", "--gpus-per-node", "2",
               "--duration", "20m", "--format", "both"])
    assert rc == 0
    assert "lines/s" in capsys.readouterr().out
    assert (tmp_path / "gpu_oom" / "vl.jsonl").is_file() and (tmp_path / "gpu_oom" / "truth.json").is_file()
    assert main(["simulate", "--scenario", "bogus", "--out", str(tmp_path)]) == 2
    assert main(["simulate", "--scenario", "healthy", "--out", str(tmp_path), "--duration", "soon"]) == 2
    assert main(["simulate", "--out", str(tmp_path)]) == 2


def _vlserver():
    import importlib.util
    import sys

    name = "recovery_logs_tests_vlserver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "integration" / "victorialogs" / "vlserver.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def test_push_to_victorialogs_stores_every_row(tmp_path: Path) -> None:
    vls = _vlserver()
    with vls.VLServer(static=False) as srv:
        r = simulate_one("xid120_gsp", SimOptions(out=tmp_path, seed=1, nodes=2, gpus_per_node=2, duration_s=600.0,
                                                  format="vl-jsonl", to=srv.url))
        stored = srv.visible_rows()
    sent = (r.path / "vl.jsonl").read_text().splitlines()
    assert len(stored) == len(sent) == r.lines
    with pytest.raises(ConfigError, match="VictoriaLogs URL"):
        simulate(SimOptions(out=tmp_path / "x", scenario="healthy", nodes=2, gpus_per_node=1, duration_s=600.0,
                            to="localhost:9428"))


def test_fleet_log_profile_writes_a_production_run_s_volume_and_the_straggler_still_shows(tmp_path: Path) -> None:
    """``--log-profile fleet``: each rank's timing line ~every 30 s instead of ~4 s, the iteration
    line and timing report from one rank as before: ~7x fewer per-rank lines, and the
    slow node is still the replay's straggler culprit (per-rank medians per 60 s window)."""
    from recovery_logs.pipeline.replay import replay

    opts = {"seed": 2, "nodes": 8, "gpus_per_node": 4, "duration_s": 2400.0}
    dense = simulate_one("straggler_node", SimOptions(out=tmp_path / "dense", **opts))
    fleet = simulate_one("straggler_node", SimOptions(out=tmp_path / "fleet", log_profile="fleet", **opts))
    assert fleet.truth["generated"]["log_profile"] == "fleet" and "log_profile" not in dense.truth["generated"]
    every_s = fleet.truth["generated"]["rank_log_every"] * fleet.truth["generated"]["seconds_per_iteration"]
    assert 27 <= every_s <= 33
    def steps(r) -> int:     # rank 0's own timing lines
        text = (r.path / f"job-{r.truth['job_id']}" / "gpu-n01.out").read_text(errors="replace")
        return sum("] [rank0] step " in ln for ln in text.splitlines())

    assert 55 <= steps(fleet) <= 82               # ~2400 s / 30 s, the job slowed by its straggler
    assert steps(dense) / steps(fleet) == pytest.approx(fleet.truth["generated"]["rank_log_every"]
                                                        / dense.truth["generated"]["rank_log_every"], rel=0.05)
    assert dense.lines / fleet.lines > 3          # start-up lines are the same; here 32 ranks
    res = replay([fleet.path], None)
    slow = [i for i in res.incidents if i.category == "straggler"]
    assert slow and slow[0].node == fleet.truth["culprit_node"]
