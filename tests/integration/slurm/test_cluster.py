"""Against the real Slurm 22.05 test cluster: the reader, monitor/autonomous/approve modes,
unsafe targets and dry-run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from recovery_logs.remediation.remediator import Remediator
from recovery_logs.sources.slurm import CommandResult, SlurmClient, expand_hostlist

pytestmark = pytest.mark.slurm
NODES = ("gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04")


def observe(cluster, job: str | None = None) -> dict:
    """What a remediation could change: node state + reason, job state, restarts, exclusions."""
    out = {n: (cluster.node(n).get("State"), cluster.node(n).get("Reason")) for n in NODES}
    if job:
        j = cluster.job(job)
        out["job"] = (j.get("JobState"), j.get("Restarts"), j.get("ExcNodeList"), j.get("NodeList"))
    return out


def test_reader_sacct_json_parsable_and_live_views(cluster):
    fail = cluster.submit(wrap="exit 3")
    multi = cluster.submit("-N", "2", "--gpus-per-node=2")
    nodes = cluster.wait_running(multi)
    for j, want in ((fail, "FAILED"), (multi, "RUNNING")):    # accounting lags slurmctld a little
        cluster.wait(f"job {j} {want} in sacct", lambda j=j, want=want: cluster.run(
            "sacct", "-n", "-X", "-P", "-j", j, "-o", "State").stdout.strip() == want)
    client = SlurmClient(cluster.runner())
    by_json = {r.job_id: r for r in client.jobs([fail, multi])}
    assert client.json_ok is True
    assert by_json[fail].state == "FAILED" and by_json[fail].exit_code == 3     # fixed from text sacct
    assert by_json[multi].state == "RUNNING" and by_json[multi].gpus == 4 and list(by_json[multi].nodes) == nodes
    by_text = {r.job_id: r for r in SlurmClient(cluster.runner()).jobs([fail, multi], use_json=False)}
    for j in (fail, multi):
        a, b = by_json[j], by_text[j]
        assert (a.state, a.nodes, a.gpus, a.exit_code, a.start_ns, a.end_ns) == \
            (b.state, b.nodes, b.gpus, b.exit_code, b.start_ns, b.end_ns)
    on = client.jobs_on(nodes[1], time.time_ns())
    assert multi in [r.job_id for r in on] and fail not in [r.job_id for r in on]
    # a sacct --json shape this parser does not know (a newer data_parser) falls back to --parsable2
    class NewerSlurm:
        def __init__(self, inner):
            self.inner, self.argvs = inner, []

        def run(self, argv, timeout_s):
            self.argvs.append(tuple(argv))
            res = self.inner.run(argv, timeout_s)
            if "--json" in argv:
                return CommandResult(res.argv, 0, json.dumps({"meta": {"plugin": {"type": "data_parser/v9.9.9"}},
                                                              "jobs": [{"job_id": {"number": 1}}]}), "")
            return res

    newer = NewerSlurm(cluster.runner())
    fallback = {r.job_id: r for r in SlurmClient(newer).jobs([fail, multi])}
    assert [a[1] for a in newer.argvs] == ["--json", "-P"]
    assert {j: (r.state, r.exit_code, r.gpus) for j, r in fallback.items()} == \
        {j: (r.state, r.exit_code, r.gpus) for j, r in by_json.items()}
    infos = {n.name: n for n in client.nodes()}
    assert sorted(infos) == list(NODES) and all(n.gpus == 8 for n in infos.values())
    assert int(multi) in [j["job_id"] for j in client.queue()]


def test_monitor_mode_changes_nothing(cluster, tmp_path: Path, recording, incident):
    job = cluster.submit("-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    before = observe(cluster, job)
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, runner=runner)          # the default mode
    inc = incident("inc-monitor01", nodes[0], job, kinds=("drain", "requeue", "investigate"))
    ds = rem.handle([inc])
    assert [(d.kind, d.decision, d.status) for d in ds] == [
        ("drain_node", "record_only", "record_only"), ("requeue_job", "record_only", "record_only"),
        ("investigate", "record_only", "record_only")]
    assert rem.handle([inc]) == []
    assert runner.mutating() == []
    assert observe(cluster, job) == before
    assert [r.kind for r in rem.audit.records()] == ["config", "detection"] + ["proposal", "decision"] * 3
    assert rem.audit.verify() == 8


def test_autonomous_drains_culprit_and_requeues_job_off_it(cluster, tmp_path: Path, recording, incident,
                                                           monkeypatch, capsys):
    job = cluster.submit("-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    bad = nodes[0]
    start_ns = int(time.mktime(time.strptime(cluster.job(job)["StartTime"], "%Y-%m-%dT%H:%M:%S"))) * 10**9
    t_fault = start_ns + 10**9                      # the fault 1 s into the run, detected 2 s later
    cluster.wait("the fault to have been detected", lambda: time.time_ns() > t_fault + 2 * 10**9)
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner)   # cluster size from sinfo
    inc = incident("inc-auto0001", bad, job, t_ns=t_fault)
    ds = rem.handle([inc])
    assert [(d.kind, d.decision, d.status) for d in ds] == [("drain_node", "approved", "done"),
                                                             ("requeue_job", "approved", "done")], ds
    node = cluster.node(bad)
    assert "DRAIN" in node["State"]
    assert node["Reason"].startswith(f"recovery-logs:inc-auto0001 {inc.cause} [root@")
    j = cluster.job(job)
    assert j["Restarts"] == "1" and bad in expand_hostlist(j["ExcNodeList"])
    drains = [c for c in runner.mutating() if "State=DRAIN" in c]
    assert drains == [("scontrol", "update", f"NodeName={bad}", "State=DRAIN",
                       f"Reason=recovery-logs:inc-auto0001 {inc.cause}")]
    assert [c[1] for c in runner.mutating()] == ["update", "requeuehold", "update", "release"]
    # re-detection of the same incident never acts twice
    n = len(runner.calls)
    assert rem.handle([inc]) == [] and [c for c in runner.calls[n:] if c[0] != "scontrol" or c[1] != "ping"] == []
    # the job runs again, off the culprit
    cluster.wait("requeued job running again", lambda: cluster.job(job).get("JobState") == "RUNNING", timeout=45)
    assert bad not in expand_hostlist(cluster.job(job)["NodeList"])
    assert rem.audit.verify() > 0
    rem.close()
    # accounting from sacct: both runs; GPU-hours lost = 4 GPUs x (fault -> restart), through the CLI
    runs = [r for r in SlurmClient(cluster.runner()).jobs([job]) if r.job_id == job]
    assert [r.state for r in sorted(runs, key=lambda r: r.start_ns)] == ["REQUEUED", "RUNNING"]
    restart = max(r.start_ns for r in runs)
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    from recovery_logs.cli import main

    assert main(["slurm", "ledger", "--json", "--state-dir", str(tmp_path)]) == 0
    figs = json.loads(capsys.readouterr().out)
    f = figs["incidents"][0]
    assert f["gpus"] == 4 and f["mttd_s"] == 2.0 and 0 <= f["time_to_action_s"] < 30
    assert f["gpu_hours_lost"] == pytest.approx(4 * (restart - t_fault) / 1e9 / 3600, abs=2e-4)
    assert 0 < figs["jobs"][job] < 1


def test_approve_mode_waits_for_an_operator(cluster, tmp_path: Path, recording, incident, run_cli):
    job = cluster.submit("-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    before = observe(cluster, job)
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="approve", runner=runner)
    ds = rem.handle([incident("inc-appr0001", nodes[1], job)])
    assert [d.status for d in ds] == ["awaiting_approval", "awaiting_approval"]
    assert runner.mutating() == [] and observe(cluster, job) == before
    rem.close()
    drain_id, requeue_id = ds[0].action_id, ds[1].action_id
    conf = cluster.conf
    rc, shown, _ = run_cli("console", "--once", "--width", "140", "--state-dir", str(tmp_path))
    assert rc == 0 and drain_id in shown and requeue_id in shown
    rc, out, err = run_cli("approve", drain_id, "--state-dir", str(tmp_path), slurm_conf=conf)
    assert rc == 0 and f"{drain_id}: approved/done" in out, err
    assert cluster.node(nodes[1])["Reason"].startswith("recovery-logs:inc-appr0001")
    rc, out, err = run_cli("reject", requeue_id, "--reason", "job is checkpointing", "--state-dir", str(tmp_path))
    assert rc == 0, err
    assert cluster.job(job)["Restarts"] == "0" and cluster.job(job)["JobState"] == "RUNNING"
    rc, out, err = run_cli("approve", requeue_id, "--state-dir", str(tmp_path), slurm_conf=conf)
    assert rc == 11 and "awaiting approval" in err
    rem = Remediator.from_options(tmp_path, mode="approve", runner=runner)
    kinds = [(r.kind, r.action_id) for r in rem.audit.records() if r.kind in ("approval", "rejection", "result")]
    assert kinds == [("approval", drain_id), ("result", drain_id), ("rejection", requeue_id)]


def test_unsafe_targets_are_audited_never_run(cluster, tmp_path: Path, recording, incident):
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner, cluster_nodes=4)
    ds = rem.handle([incident("inc-unsafe01", "gpu-n01; rm -rf /", "12; scancel 1")])
    assert [(d.decision, d.status) for d in ds] == [("denied", "denied")] * 2
    assert all("unsafe target" in d.reason for d in ds)
    unsafe = rem.audit.records("unsafe_target")
    assert [r.payload["target"] for r in unsafe] == ["gpu-n01; rm -rf /", "12; scancel 1"]
    assert runner.calls == []
    assert all("DRAIN" not in cluster.node(n)["State"] for n in NODES)


def test_dry_run_is_audited_and_counted_never_consumes(cluster, tmp_path: Path, recording, incident):
    job = cluster.submit("--gpus=1", "--requeue", wrap="sleep 300")
    node = cluster.wait_running(job)[0]
    before = observe(cluster, job)
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner, dry_run=True, budget_per_hour=1,
                                  breaker_max_drain_fraction=0.25)
    ds = rem.handle([incident(f"inc-dry{i:05d}", NODES[i % 4], job) for i in range(4)])
    assert [d.decision for d in ds] == ["dry_run"] * 8
    assert runner.mutating() == [] and observe(cluster, job) == before
    b = rem.budget()
    assert (b["used_hour"], b["dry_runs"], b["drained_in_window"]) == (0, 8, [])
    assert rem.breaker()["tripped"] is False
    assert rem.audit.count("decision") == 8 and node in NODES


def test_slurm_refusals_become_clear_failed_results(cluster, tmp_path: Path, recording, incident):
    norq = cluster.submit("--no-requeue", "--gpus=1", wrap="sleep 300")
    node = cluster.wait_running(norq)[0]
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner, cluster_nodes=4, cooldown_s=0)
    ds = rem.handle([incident("inc-refuse01", "gpu-n99", None, kinds=("drain",)),
                     incident("inc-refuse02", node, norq, kinds=("requeue",)),
                     incident("inc-refuse03", None, "999999", kinds=("cancel",))])
    # a node the cluster does not have is refused before it is queued (issue 12): it never reaches Slurm
    assert [d.status for d in ds] == ["denied", "failed", "failed"]
    assert "not a node of this cluster: gpu-n99" in ds[0].reason
    msgs = [d.result.get("message", "") for d in ds]
    assert f"job {norq} was submitted with --no-requeue" in msgs[1]
    assert "job 999999 is not known to slurmctld" in msgs[2]
    assert runner.mutating() == []                    # refused before anything was changed
    assert cluster.job(norq)["JobState"] == "RUNNING"
    assert [r.payload["outcome"] for r in rem.audit.records("result")] == ["failed"] * 2
    assert rem.budget()["used_hour"] == 0             # failures count nothing
