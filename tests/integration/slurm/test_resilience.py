"""Against the real cluster: a flood of incidents against budget, breaker, cooldown and
ownership; slurmctld stopped mid-action; a crash between intent and result."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery_logs.remediation.remediator import Remediator
from recovery_logs.sources.slurm import expand_hostlist

pytestmark = pytest.mark.slurm
ADMIN_REASON = "admin: fan replacement"


def test_flood_budget_breaker_cooldown_and_ownership(cluster, tmp_path: Path, recording, incident, clock,
                                                    run_cli):
    cluster.run("scontrol", "update", "NodeName=gpu-n04", "State=DRAIN", f"Reason={ADMIN_REASON}")
    jobs = [cluster.submit("--gpus=1", wrap="sleep 300") for _ in range(3)]
    for j in jobs:
        cluster.wait_running(j)
    policy = tmp_path / "policy.toml"
    policy.write_text("cooldown_s = 900\n[budget]\nper_hour = 4\nper_incident = 3\n"
                      "[breaker]\nmax_drain_fraction = 0.5\nwindow_s = 3600\n")
    runner = recording(cluster.runner())
    state = tmp_path / "state"
    rem = Remediator.from_options(state, mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    flood = [
        incident("inc-flood-00", "gpu-n01", None, kinds=("drain",)),   # runs (1/4 drained)
        incident("inc-flood-01", "gpu-n01", None, kinds=("drain",)),   # same node again: cooldown
        incident("inc-flood-02", "gpu-n04", None, kinds=("drain",)),   # someone else's drain: not_owner
        incident("inc-flood-03", "gpu-n02", None, kinds=("drain",)),   # 3/4 > 50 %: denied, trips the breaker
        incident("inc-flood-04", "gpu-n03", None, kinds=("drain",)),   # breaker tripped
        *[incident(f"inc-flood-{5 + i:02d}", None, j, kinds=("cancel",)) for i, j in enumerate(jobs)],
    ]
    ds = rem.handle(flood + flood)                                   # every incident detected twice
    got = [(d.incident_id, d.status) for d in ds]
    assert got == [("inc-flood-00", "done"), ("inc-flood-01", "denied"), ("inc-flood-02", "not_owner"),
                   ("inc-flood-03", "denied"), ("inc-flood-04", "denied"), ("inc-flood-05", "done"),
                   ("inc-flood-06", "done"), ("inc-flood-07", "denied")]
    reasons = [d.reason for d in ds]
    assert "cooldown" in reasons[1] and "circuit breaker tripped" in reasons[3]
    assert "circuit breaker is tripped" in reasons[4] and "action budget spent: 4/4" in reasons[7]
    # only verified effects count (issue 12): the not_owner drain held a reservation while queued
    # (so the third cancel was denied), then released it
    assert rem.budget()["used_hour"] == 3 and rem.breaker()["tripped"] is True
    assert [cluster.job(j)["JobState"] for j in jobs] == ["CANCELLED", "CANCELLED", "RUNNING"]
    # never touched the admin's node; one command per node
    assert cluster.node("gpu-n04")["Reason"].startswith(ADMIN_REASON + " [root@")
    assert not [c for c in runner.mutating() if "NodeName=gpu-n04" in c]
    assert [c[2] for c in runner.mutating() if c[:2] == ("scontrol", "update")] == ["NodeName=gpu-n01"]
    assert all("DRAIN" not in cluster.node(n)["State"] for n in ("gpu-n02", "gpu-n03"))

    # an hour later the budget is back, the breaker is not (persisted across a restart)
    clock.advance(3700)
    rem.close()
    rem = Remediator.from_options(state, mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    assert rem.breaker()["tripped"] is True
    d = rem.handle([incident("inc-flood-20", "gpu-n02", None, kinds=("drain",))])[0]
    assert d.status == "denied" and "circuit breaker is tripped" in d.reason
    # the tripped breaker never blocks undoing our own drain; someone else's is left alone
    assert rem.resume("gpu-n01", "inc-flood-00").status == "done"
    cluster.wait("gpu-n01 back", lambda: "DRAIN" not in cluster.node("gpu-n01")["State"])
    other = rem.resume("gpu-n04")
    assert other.status == "not_owner" and "not resuming" in other.result["message"]
    assert cluster.node("gpu-n04")["Reason"].startswith(ADMIN_REASON)
    rem.close()
    # manual reset through the CLI, then drains run again
    rc, out, err = run_cli("slurm", "breaker-reset", "--state-dir", str(state))
    assert rc == 0 and "was tripped" in out, err
    rem = Remediator.from_options(state, mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    assert rem.handle([incident("inc-flood-21", "gpu-n02", None, kinds=("drain",))])[0].status == "done"
    assert [r.payload["event"] for r in rem.audit.records("breaker")] == ["tripped", "reset"]
    assert rem.audit.verify() > 0


def test_slurmctld_down_mid_action_loses_and_doubles_nothing(cluster, tmp_path: Path, recording, incident, clock):
    job = cluster.submit("-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    bad = nodes[1]
    killed: list[bool] = []

    def stop_after_drain(res):   # slurmctld dies right after it applied the drain, before we could verify it
        if not killed and any(a == "State=DRAIN" for a in res.argv):
            killed.append(True)
            cluster.stop_ctld()

    runner = recording(cluster.runner(), after=stop_after_drain)
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner, clock=clock, cluster_nodes=4)
    rem.executor.timeout_s = rem.executor.client.timeout_s = 5
    inc = incident("inc-ctld0001", bad, job)
    ds = rem.handle([inc])
    assert killed and [d.status for d in ds] == ["queued", "queued"]
    retry = [r.payload["outcome"] for r in rem.audit.records("result")]
    assert retry == ["retry"]
    clock.advance(30)
    assert rem.process_queue() == [] and [d["status"] for d in rem.actions()] == ["queued", "queued"]
    cluster.start()                                              # slurmctld back, state kept
    clock.advance(600)
    done = rem.process_queue()
    assert [(r["kind"], r["status"]) for r in done] == [("drain_node", "noop"), ("requeue_job", "done")]
    assert "already drained by recovery-logs" in rem.action(ds[0].action_id)["result"]
    assert len([c for c in runner.mutating() if "State=DRAIN" in c]) == 1
    assert len([c for c in runner.mutating() if c[:2] == ("scontrol", "requeuehold")]) == 1
    j = cluster.job(job)
    assert j["Restarts"] == "1" and bad in expand_hostlist(j["ExcNodeList"])
    assert cluster.node(bad)["Reason"].startswith("recovery-logs:inc-ctld0001")
    assert rem.handle([inc]) == [] and rem.process_queue() == []
    assert rem.audit.open_intents() == [] and rem.audit.verify() > 0


class Crash(BaseException):
    """The process dies (kill -9 / power loss) between a command and its result record."""


def test_crash_between_intent_and_result_is_reconciled(cluster, tmp_path: Path, recording, incident, clock):
    job = cluster.submit("-N", "2", "--gpus-per-node=2", "--requeue")
    bad = cluster.wait_running(job)[0]

    def crash(res):
        if res.argv[:2] == ("scontrol", "requeuehold"):
            raise Crash

    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=recording(cluster.runner(), after=crash),
                                  clock=clock, cluster_nodes=4)
    with pytest.raises(Crash):
        rem.handle([incident("inc-crash001", bad, job)])
    rem.close()
    open_intents = Remediator.from_options(tmp_path, runner=recording(cluster.runner()), clock=clock,
                                           reconcile=False).audit.open_intents()
    assert [r.payload["kind"] for r in open_intents] == ["requeue_job"]
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="autonomous", runner=runner, clock=clock, cluster_nodes=4)
    rec = rem.audit.records("reconcile")
    assert [r.payload["outcome"] for r in rec] == ["requeued"]     # held, not yet excluded: not finished
    assert rem.audit.open_intents() == []
    done = rem.process_queue()
    assert [(r["kind"], r["status"]) for r in done] == [("requeue_job", "done")]
    assert [c[1] for c in runner.mutating()] == ["update", "release"]       # no second requeue
    j = cluster.job(job)
    assert j["Restarts"] == "1" and bad in expand_hostlist(j["ExcNodeList"])
    assert rem.audit.verify() > 0
