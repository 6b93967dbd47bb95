"""The allocations frame, its loaders and the live poller (no cluster: dumps captured from the real
22.05.8 test cluster, and a command runner that answers from them), the join of node findings to
jobs, and the job rules of the policy."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

import recovery_logs as rl
from recovery_logs.config import EngineConfig
from recovery_logs.errors import InputError, SlurmUnavailable
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.records import ActionProposal
from recovery_logs.remediation.policy import ActionRequest, PolicyConfig, PolicyState, decide, load_policy
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.source_health import health_incidents
from recovery_logs.sources.accounting import AccountingPoller, load_accounting, merge_allocations
from recovery_logs.sources.slurm import CommandResult

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "accounting"
REQUEUE = FIX / "requeue_22.05.8"
SQUEUE = FIX / "squeue_shared_22.05.8.json"
DATA = ROOT / "tests" / "fixtures" / "slurm"
CFG = EngineConfig(detectors=())


def test_sacct_json_dump_gives_attempts_of_one_chain():
    df = load_accounting(REQUEUE / "sacct_requeue.json")
    got = df.select("job_id", "node", "state", "restart_count", "gpus").rows()
    assert got == [("1", "gpu-n01", "REQUEUED", 0, 2), ("1", "gpu-n02", "REQUEUED", 0, 2),
                   ("1", "gpu-n03", "RUNNING", 1, 2), ("1", "gpu-n04", "RUNNING", 1, 2)]
    assert df.get_column("chain").n_unique() == 1 and df.get_column("attempt").n_unique() == 2
    first, second = df.row(0, named=True), df.row(2, named=True)
    assert second["submit"] == first["end"] and second["end"] is None      # requeue time = new submit
    assert first["attempt"] == f"testcluster:1:{int(first['submit'].timestamp())}:0"
    assert rl.load_accounting(REQUEUE / "sacct_requeue.json").equals(df)        # the notebook loader


def test_parsable_and_json_dumps_of_one_cluster_agree():
    js = load_accounting(DATA / "sacct_22.05.8.json")
    tx = load_accounting(DATA / "sacct_22.05.8.parsable2.txt")
    cols = ["job_id", "node", "state", "restart_count", "start", "end", "submit", "gpus"]
    assert js.select(cols).sort(cols).equals(tx.select(cols).sort(cols))
    assert js.filter(pl.col("job_id") == "1").get_column("restart_count").unique().sort().to_list() == [0, 1, 2]
    assert tx.filter(pl.col("job_id") == "2").get_column("exit_code").to_list() == [3]   # -P is right on 22.05


def test_squeue_gives_gpu_indices_per_node_and_the_real_exit_code():
    df = load_accounting(SQUEUE)
    by = {(r["job_id"], r["node"]): r for r in df.iter_rows(named=True)}
    assert by[("5", "gpu-n03")]["gpu_index"] == [0, 1] and by[("6", "gpu-n03")]["gpu_index"] == [2, 3, 4]
    assert by[("7", "gpu-n01")]["gpus"] == 4 and by[("7", "gpu-n02")]["gpu_index"] == [0, 1, 2, 3]
    assert (by[("8", "gpu-n04")]["state"], by[("8", "gpu-n04")]["exit_code"]) == ("FAILED", 93)
    assert by[("5", "gpu-n03")]["end"] is None          # squeue's end_time of a running job is its limit


def test_bad_dumps_name_the_file_and_the_record(tmp_path: Path, caplog):
    good = (REQUEUE / "sacct_requeue.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(good[: len(good) // 2])
    with pytest.raises(InputError, match="not valid JSON") as e:
        load_accounting(cut)
    assert e.value.context["path"] == str(cut) and e.value.context["line"] > 1
    data = json.loads(good)
    data["jobs"][1]["job_id"] = "abc"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InputError, match="record 1 of") as e:
        load_accounting(bad)
    assert e.value.context["record"] == 1
    lines = (DATA / "sacct_22.05.8.parsable2.txt").read_text().splitlines()
    trunc = tmp_path / "trunc.txt"
    trunc.write_text("\n".join(lines[:3] + [lines[3][:20]]) + "\n")
    with pytest.raises(InputError, match="line 4 of .* has 5 fields, the header 9") as e:
        load_accounting(trunc)
    assert e.value.context["line"] == 4
    with pytest.raises(InputError, match="file not found"):
        load_accounting(tmp_path / "nope.json")
    # an unknown JSON data parser: read best-effort with a warning; a record it cannot read says -P
    data = json.loads(good)
    data["meta"]["plugin"]["type"] = "data_parser/v9.9.9"
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="recovery_logs.accounting"):
        assert load_accounting(newer).height == 4
    assert "unknown sacct JSON data parser 'data_parser/v9.9.9'" in caplog.text
    data["jobs"][0]["job_id"] = {"weird": 1}
    newer.write_text(json.dumps(data))
    with pytest.raises(InputError, match="dump with sacct -P"):
        load_accounting(newer)


class DumpRunner:
    """A CommandRunner answering squeue/sacct from captured dumps (or raising as told)."""

    def __init__(self, squeue: str, sacct_json: str, sacct_p: str = "") -> None:
        self.out = {"squeue": squeue, "sacct-json": sacct_json, "sacct-p": sacct_p}
        self.calls: list[tuple[str, ...]] = []
        self.down = False

    def run(self, argv, timeout_s):
        argv = tuple(argv)
        self.calls.append(argv)
        if self.down:
            raise SlurmUnavailable(f"slurm: {argv[0]} did not answer within {timeout_s:g} s", argv=list(argv))
        key = "squeue" if argv[0] == "squeue" else ("sacct-json" if "--json" in argv else "sacct-p")
        return CommandResult(argv, 0, self.out[key], "")


def test_poller_is_bounded_incremental_and_survives_a_blind_slurm():
    runner = DumpRunner(SQUEUE.read_text(), (REQUEUE / "sacct_requeue.json").read_text())
    poller = AccountingPoller(runner)                        # defaults: squeue 10 s, sacct 60 s
    t0 = 1_796_200_000.0
    for s in range(0, 180):                                  # a caller that polls every second for 3 minutes
        poller.poll(t0 + s)
    assert poller.calls == {"squeue": 18, "sacct": 3}
    starts = [c[c.index("-S") + 1] for c in runner.calls if c[0] == "sacct"]
    assert len(set(starts)) == 3                             # from the cursor, not the same window again
    assert set(poller.frame.get_column("job_id").unique().to_list()) == {"1", "5", "6", "7", "8"}
    kept = poller.frame
    runner.down = True                                       # sacct/squeue time out: nothing is concluded
    for s in range(180, 300):
        poller.poll(t0 + s)
    assert poller.frame.equals(kept) and {h.name for h in poller.blind()} == {"squeue", "sacct"}
    incs = health_incidents(poller.health.values())
    assert [(i.category, i.status, [a.kind for a in i.actions]) for i in incs] == \
        [("source_health", "open", ["none"])] * 2
    assert all(a.decision == "record_only" for i in incs for a in i.actions)
    runner.down = False
    for s in range(300, 400):
        poller.poll(t0 + s)
    assert not poller.blind()
    assert [i.status for i in health_incidents(poller.health.values())] == ["cleared", "cleared"]
    last = [c for c in runner.calls if c[0] == "sacct"][-1]
    since = last[last.index("-S") + 1]
    assert since == starts[-1] or since > starts[-1]         # catches up from the last good cursor


def test_unknown_live_json_falls_back_to_parsable2(caplog):
    data = json.loads((REQUEUE / "sacct_requeue.json").read_text())
    data["meta"]["plugin"]["type"] = "data_parser/v9.9.9"
    runner = DumpRunner(json.dumps({"jobs": [], "errors": []}), json.dumps(data),
                        (DATA / "sacct_22.05.8.parsable2.txt").read_text())
    poller = AccountingPoller(runner)
    with caplog.at_level(logging.WARNING, logger="recovery_logs.accounting"):
        poller.poll(1_796_200_000.0)
        poller.poll(1_796_200_061.0)
    sacct = [c for c in runner.calls if c[0] == "sacct"]
    assert [("--json" in c, "-P" in c) for c in sacct] == [(True, False), (False, True), (False, True)]
    assert "falling back to sacct --parsable2" in caplog.text
    assert poller.frame.get_column("job_id").unique().sort().to_list() == ["1", "2", "3"]


def _kern(tmp: Path, node: str, t: str, pci: str) -> Path:
    p = tmp / "nodes" / node / "kern.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{t} {node} kernel: NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python3, GPU has fallen off the bus.\n")
    return p


def test_replay_with_the_captured_dump_names_the_job_without_it_says_so(run_cli):
    with_acc = replay([str(REQUEUE / "nodes")], ReplayOptions(config=CFG, accounting=REQUEUE / "sacct_requeue.json"))
    inc = with_acc.incidents[0]
    assert (inc.node, inc.job_id, inc.jobs) == ("gpu-n02", "1", ("1",))
    assert inc.attempts[0]["restart_count"] == 0 and inc.attempts[0]["gpus"] == 4
    assert [(a.kind, a.target, a.exclude) for a in inc.actions] == [("drain_node", "gpu-n02", ()),
                                                                  ("requeue_job", "1", ("gpu-n02",))]
    assert inc.actions[1].attempt == inc.attempts[0]["attempt"]
    assert with_acc.summary["accounting_rows"] == 4
    bare = replay([str(REQUEUE / "nodes")], ReplayOptions(config=CFG)).incidents[0]
    assert bare.job_id is None and [a.kind for a in bare.actions] == ["drain_node"]
    assert bare.evidence[-1].rule_id == "accounting.none" and "not known" in bare.evidence[-1].message
    rc, out, _ = run_cli("replay", "--json", "--accounting", str(REQUEUE / "sacct_requeue.json"), str(REQUEUE / "nodes"))
    assert rc == 0 and json.loads(out)["incidents"][0]["jobs"] == ["1"]
    rc, _, err = run_cli("replay", "--accounting", "/nonexistent.json", str(REQUEUE / "nodes"))
    assert rc == 2 and "--accounting" in err


def _inventory(tmp: Path, host: str, t: str, pcis: dict[int, str]) -> None:
    rows = [{"_time": t, "_msg": f'NVML gpu={g} uuid=GPU-{g:04d} pci={p}.0 inventory name="NVIDIA H100 80GB HBM3" '
             'serial="1650000" link_count=18', "host": host, "unit": "nvml"} for g, p in pcis.items()]
    p = tmp / "nodes" / host / "nvml.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_shared_node_join_picks_the_job_holding_the_gpu(tmp_path: Path):
    acc = load_accounting(SQUEUE)
    start = acc.filter(pl.col("job_id") == "6").get_column("start").item()
    t = (start + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.000000+00:00")
    _kern(tmp_path, "gpu-n03", t, "0000:61:00")
    bare = replay([str(tmp_path)], ReplayOptions(config=CFG, accounting=acc)).incidents[0]
    assert bare.jobs == ("5", "6") and bare.gpu is None                  # no GPU known: both jobs on the node
    assert sorted(a.target for a in bare.actions if a.kind == "requeue_job") == ["5", "6"]
    assert "shared node: 2 jobs" in bare.evidence[-1].message
    _inventory(tmp_path, "gpu-n03", t, {0: "0000:1b:00", 1: "0000:43:00", 2: "0000:52:00", 3: "0000:61:00"})
    inc = replay([str(tmp_path)], ReplayOptions(config=CFG, accounting=acc)).incidents[0]
    assert (inc.gpu, inc.gpu_uuid, inc.job_id, inc.jobs) == (3, "GPU-0003", "6", ("6",))
    assert [a.target for a in inc.actions if a.kind == "requeue_job"] == ["6"]
    # without accounting, the inventory still names the GPU (issue 18: nothing else changes)
    alone = replay([str(tmp_path)], ReplayOptions(config=CFG)).incidents[0]
    assert (alone.gpu, alone.gpu_uuid, alone.job_id) == (3, "GPU-0003", None)


def test_nccl_bus_id_lines_tie_a_gpu_to_its_job(tmp_path: Path):
    acc = load_accounting(SQUEUE).with_columns(pl.lit(None, pl.List(pl.Int32)).alias("gpu_index"))  # sacct-like
    start = acc.filter(pl.col("job_id") == "5").get_column("start").item()
    t = start.strftime("%Y-%m-%dT%H:%M:%S")
    job = tmp_path / "jobs" / "slurm-5.out"
    job.parent.mkdir(parents=True)
    # NCCL's init line (NVIDIA/nccl#1814 shape): cudaDev counts visible devices, nvmlDev is the host's index
    job.write_text(f"{t}.100Z gpu-n03:9001:9050 [0] NCCL INFO comm 0x557fe785f7a0 rank 0 nranks 2 cudaDev 0 nvmlDev 1 "
                   "busId 43000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE\n")
    _kern(tmp_path, "gpu-n03", f"{t}.500000+00:00", "0000:43:00")
    inc = next(i for i in replay([str(tmp_path)], ReplayOptions(config=CFG, accounting=acc)).incidents
               if i.category == "xid")
    assert (inc.gpu, inc.job_id, inc.jobs) == (1, "5", ("5",))


def test_job_output_and_accounting_agree_or_disagree(tmp_path: Path):
    acc = load_accounting(SQUEUE)
    start = acc.filter(pl.col("job_id") == "7").get_column("start")[0]
    t = start.strftime("%Y-%m-%dT%H:%M:%S")
    out = tmp_path / "job-7" / "gpu-n01.out"
    out.parent.mkdir(parents=True)
    out.write_text(f"{t}.200Z [rank0]: step 1 | loss 2.31 (0.50 s/step)\n")
    _kern(tmp_path, "gpu-n01", f"{t}.500000+00:00", "0000:cb:00")
    inc = next(i for i in replay([str(tmp_path)], ReplayOptions(config=CFG, accounting=acc)).incidents
               if i.category == "xid")
    base = next(i for i in replay([str(tmp_path)], ReplayOptions(config=CFG)).incidents if i.category == "xid")
    assert inc.job_id == "7" and inc.evidence[-1].rule_id == "accounting.agree"
    assert inc.confidence == min(1.0, base.confidence + 0.05)
    wrong = acc.with_columns(pl.when(pl.col("job_id") == "7").then(pl.lit("77")).otherwise(pl.col("job_id"))
                             .alias("job_id"))
    dis = next(i for i in replay([str(tmp_path)], ReplayOptions(config=CFG, accounting=wrong)).incidents
               if i.category == "xid")
    assert dis.job_id == "77" and dis.evidence[-1].rule_id == "accounting.disagree"
    assert "the job output puts job 7 on gpu-n01" in dis.evidence[-1].message
    assert "but Slurm accounting shows job 77" in dis.evidence[-1].message
    assert dis.confidence < base.confidence


def test_merge_keeps_what_the_newer_observation_lacks():
    sq = load_accounting(SQUEUE)
    later = sq.with_columns(pl.lit(None, pl.List(pl.Int32)).alias("gpu_index"), pl.lit("COMPLETED").alias("state"))
    m = merge_allocations(sq, later)
    assert m.height == sq.height and set(m.get_column("state").to_list()) == {"COMPLETED"}
    assert m.filter(pl.col("job_id") == "6").get_column("gpu_index").to_list() == [[2, 3, 4]]
    # an ended attempt stays ended when a lagging observation still says RUNNING
    ended = sq.with_columns(pl.lit("CANCELLED").alias("state"), pl.col("start").alias("end"))
    lagging = sq.with_columns(pl.lit("RUNNING").alias("state"), pl.lit(None, sq.schema["end"]).alias("end"))
    m = merge_allocations(ended, lagging)
    assert set(m.get_column("state").to_list()) == {"CANCELLED"} and m.get_column("end").null_count() == 0


def test_policy_restart_ceiling(tmp_path: Path):
    pol = tmp_path / "p.toml"
    pol.write_text("mode = 'autonomous'\n[jobs]\nmax_requeues_per_job = 2\nno_requeue_exit_codes = [93, 94]\n")
    cfg = load_policy(pol)
    assert (cfg.max_requeues_per_job, cfg.no_requeue_exit_codes) == (2, (93, 94))
    st = PolicyState(cluster_nodes=4)
    ok = decide(cfg, st, ActionRequest("requeue_job", "12@c:12:1:1", "inc-a", job_requeues=1), 1e9)
    no = decide(cfg, st, ActionRequest("requeue_job", "12@c:12:1:2", "inc-b", job_requeues=2), 1e9)
    assert ok.decision == "approved" and no.decision == "denied" and "restart ceiling" in no.reason
    pol.write_text("[jobs]\nno_requeue_exit_codes = ['x']\n")
    with pytest.raises(Exception, match="jobs.no_requeue_exit_codes"):
        load_policy(pol)
    assert PolicyConfig().to_dict()["jobs"]["no_requeue_exit_codes"] == [93]


def _attempt_incident(incident, n: int, node: str, exit_code: int | None = None):
    from dataclasses import replace

    att = {"job_id": "12", "cluster": "c", "attempt": f"c:12:{100 + n}:{n}", "chain": "c:12:100", "restart_count": n,
           "gpus": 8, "nodes": [node], "exit_code": exit_code}
    inc = incident(f"inc-att{n:05d}", node, "12")
    acts = tuple(replace(p, attempt=att["attempt"], chain=att["chain"]) if p.kind == "requeue_job" else p
                 for p in inc.actions)
    return replace(inc, attempts=(att,), jobs=("12",), actions=acts, root_rule="nccl.remote_process_exited")


def test_stop_rule_and_do_not_requeue_exit_code(tmp_path: Path, incident):
    rem = Remediator.from_options(tmp_path, mode="monitor")
    kinds = []
    for n, node in enumerate(("gpu-n01", "gpu-n02", "gpu-n03")):
        ds = rem.handle([_attempt_incident(incident, n, node)])
        kinds.append([(d.kind, d.target) for d in ds])
    assert kinds[:2] == [[("drain_node", "gpu-n01"), ("requeue_job", "12")],
                         [("drain_node", "gpu-n02"), ("requeue_job", "12")]]
    assert kinds[2] == [("investigate", "gpu-n03"), ("cancel_job", "12")]
    cancel = rem.audit.records("proposal")[-1].payload
    assert cancel["kind"] == "cancel_job" and "same error" in cancel["reason"] and "gpu-n01, gpu-n02, gpu-n03" in \
        cancel["reason"]
    # the same error twice on one node is the node, not the job: no stop
    ds = rem.handle([_attempt_incident(incident, 3, "gpu-n03")])
    assert [d.kind for d in ds] == ["drain_node", "requeue_job"]
    # an attempt that exited 93 declared do-not-requeue
    ds = rem.handle([_attempt_incident(incident, 4, "gpu-n04", exit_code=93)])
    assert [(d.kind, d.decision) for d in ds] == [("drain_node", "record_only"), ("none", "record_only")]
    assert "declared do-not-requeue" in rem.audit.records("proposal")[-1].payload["reason"]
    assert [a["job_chain"] for a in rem.actions("record_only") if a["kind"] == "requeue_job"][0] == "c:12:100"
    assert ActionProposal("requeue_job", "1", "record_only", "", attempt="a").to_dict()["attempt"] == "a"
