"""Issue 12 against the real cluster: names Slurm treats specially and nodes it does not have are
refused before they touch budget or breaker; only verified effects count; a denied culprit drains
once the breaker is reset; a job's output cannot drain a node outside its allocation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recovery_logs.remediation.remediator import Remediator
from recovery_logs.sources.slurm import CommandResult

pytestmark = pytest.mark.slurm


def _policy(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(text)
    return p


def test_hostile_and_unknown_nodes_never_fill_the_breaker(cluster, tmp_path: Path, recording, incident, clock):
    policy = _policy(tmp_path, "cooldown_s = 0\n[budget]\nper_hour = 20\nper_incident = 3\n"
                               "[breaker]\nmax_drain_fraction = 0.25\nwindow_s = 3600\n")
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path / "s", mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    bad = ["ALL", "all", "gpu-n[01-04]", "gpu-n01,gpu-n03", "NONE", "gpu-n98", "gpu-n99", "gpu-n100"]
    incs = [incident(f"inc-bad{i:05d}", n, None, kinds=("drain",)) for i, n in enumerate(bad)]
    ds = rem.handle([*incs, incident("inc-culprit1", "gpu-n02", None, kinds=("drain",))])
    assert [d.status for d in ds] == ["denied"] * len(bad) + ["done"]
    assert all("unsafe target rejected" in d.reason for d in ds[:-1])
    assert "not a node of this cluster: gpu-n98" in ds[5].reason
    assert rem.breaker()["tripped"] is False
    b = rem.budget()
    assert b["used_hour"] == 1 and b["drained_in_window"] == ["gpu-n02"]
    assert [c[2] for c in runner.mutating()] == ["NodeName=gpu-n02"]     # nothing else reached Slurm
    assert "DRAIN" in cluster.node("gpu-n02")["State"]
    assert len(rem.audit.records("unsafe_target")) == len(bad)
    rem.close()


class FailingDrain:
    """A real runner, except that Slurm refuses to drain one node (as it refused `ALL`)."""

    def __init__(self, inner, node: str) -> None:
        self.inner, self.node, self.calls = inner, node, 0

    def run(self, argv, timeout_s):
        if list(argv[:3]) == ["scontrol", "update", f"NodeName={self.node}"]:
            self.calls += 1
            return CommandResult(tuple(argv), 1, "", f"slurm_update error: Invalid node name specified {self.node}")
        return self.inner.run(argv, timeout_s)


def test_failed_actions_count_nothing(cluster, tmp_path: Path, incident, clock):
    policy = _policy(tmp_path, "cooldown_s = 0\n[budget]\nper_hour = 2\n"
                               "[breaker]\nmax_drain_fraction = 0.25\nwindow_s = 3600\n")
    runner = FailingDrain(cluster.runner(), "gpu-n01")
    rem = Remediator.from_options(tmp_path / "s", mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    ds = rem.handle([incident("inc-fail0001", "gpu-n01", None, kinds=("drain",)),
                     incident("inc-fail0002", "gpu-n01", None, kinds=("drain",))])
    assert [d.status for d in ds] == ["failed", "failed"] and runner.calls == 2
    b = rem.budget()
    assert (b["used_hour"], b["drained_in_window"]) == (0, [])
    assert rem.action(ds[0].action_id)["executed_ts"] is None
    # the real culprit is neither over budget nor over the breaker's share
    d = rem.handle([incident("inc-fail0003", "gpu-n03", None, kinds=("drain",))])[0]
    assert d.status == "done" and rem.budget()["used_hour"] == 1
    rem.close()


def test_denied_culprit_drains_after_breaker_reset(cluster, tmp_path: Path, recording, incident, clock, run_cli):
    policy = _policy(tmp_path, "cooldown_s = 0\nretry_s = 1800\n[budget]\nper_hour = 10\n"
                               "[breaker]\nmax_drain_fraction = 0.25\nwindow_s = 600\n")
    runner = recording(cluster.runner())
    state = tmp_path / "s"
    rem = Remediator.from_options(state, mode="autonomous", policy_file=policy, runner=runner, clock=clock)
    assert rem.handle([incident("inc-first001", "gpu-n01", None, kinds=("drain",))])[0].status == "done"
    clock.advance(10)
    d = rem.handle([incident("inc-culprit2", "gpu-n02", None, kinds=("drain",))])[0]
    assert d.status == "denied" and "circuit breaker tripped" in d.reason and rem.breaker()["tripped"]
    assert rem.action(d.action_id)["retry_until"] == pytest.approx(clock() + 1800)
    clock.advance(700)                       # the first drain left the window; the breaker stays tripped
    assert rem.process_queue() == [] and rem.action(d.action_id)["status"] == "denied"
    rc, out, err = run_cli("slurm", "breaker-reset", "--state-dir", str(state))
    assert rc == 0 and "was tripped" in out, err
    rem.process_queue()                      # the watcher's next step
    row = rem.action(d.action_id)
    assert row["status"] == "done", row
    assert "DRAIN" in cluster.node("gpu-n02")["State"]
    assert "retried, the denial cleared" in row["reason"]
    # a denial that never clears expires visibly
    clock.advance(5)
    e = rem.handle([incident("inc-late0001", "gpu-n03", None, kinds=("drain",))])[0]
    assert e.status == "denied"
    clock.advance(1900)
    rem.process_queue()
    assert rem.action(e.action_id)["status"] == "expired"
    [exp] = rem.audit.records("expired")
    assert exp.action_id == e.action_id and "denied until it expired" in exp.payload["message"]
    rem.close()


def test_job_output_drains_only_inside_its_allocation(cluster, tmp_path: Path, recording, incident, clock):
    job = cluster.submit("--gpus=1", wrap="sleep 300")
    [node] = cluster.wait_running(job)
    other = next(n for n in ("gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04") if n != node)
    runner = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path / "s", mode="autonomous", runner=runner, clock=clock, cluster_nodes=4,
                                  cooldown_s=0, breaker_max_drain_fraction=0.5)
    outside = replace(incident("inc-jobout01", other, job, kinds=("drain",)), authority="job")
    line_only = replace(incident("inc-jobout02", other, "999999", kinds=("drain",)), authority="job-line")
    claim = replace(incident("inc-jobout03", other, None, kinds=("drain",)), authority="claim")
    inside = replace(incident("inc-jobout04", node, job, kinds=("drain",)), authority="job")
    ds = rem.handle([outside, line_only, claim, inside])
    assert [d.status for d in ds] == ["denied", "denied", "denied", "done"]
    assert f"{other} is not in its allocation ({node})" in ds[0].reason
    assert "named only by the job's output" in ds[1].reason and "claim" in ds[2].reason
    assert [r.payload["target"] for r in rem.audit.records("untrusted")] == [other] * 3
    assert "DRAIN" not in cluster.node(other)["State"] and "DRAIN" in cluster.node(node)["State"]
    assert rem.budget()["used_hour"] == 1
    rem.close()
