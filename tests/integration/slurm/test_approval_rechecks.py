"""Approval re-checks Slurm at approve time, against the real test cluster: a node someone else
drained meanwhile, a job that already ended — the approval is refused and says why; nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery_logs.remediation.remediator import Remediator

pytestmark = pytest.mark.slurm


def test_approval_refuses_when_the_node_is_no_longer_up_or_the_job_ended(tmp_path: Path, cluster, incident,
                                                                         recording):
    job = cluster.submit("-N", "1", "-w", "gpu-n02")
    cluster.wait_running(job)
    rec = recording(cluster.runner())
    rem = Remediator.from_options(tmp_path, mode="approve", runner=rec, cluster_nodes=4)
    try:
        decided = rem.handle([incident("inc-recheck00001", "gpu-n04", job, kinds=("drain", "requeue"))])
        drain = next(d for d in decided if d.kind == "drain_node")
        requeue = next(d for d in decided if d.kind == "requeue_job")
        assert drain.status == requeue.status == "awaiting_approval"

        cluster.run("scontrol", "update", "NodeName=gpu-n04", "State=DRAIN", "Reason=hw-maintenance")
        cluster.run("scancel", job)
        cluster.wait("the job to end", lambda: cluster.job(job).get("JobState") not in ("RUNNING", "COMPLETING"))

        d = rem.approve(drain.action_id, by="alice")
        assert (d.decision, d.status) == ("denied", "denied")
        assert "node gpu-n04 is no longer up" in d.reason and "hw-maintenance" in d.reason
        assert "re-checked at approval" in d.reason
        d = rem.approve(requeue.action_id, by="alice")
        assert (d.decision, d.status) == ("denied", "denied") and f"job {job} is no longer running" in d.reason
        assert rec.mutating() == []                                   # nothing was changed on the cluster
        assert cluster.node("gpu-n04")["Reason"].startswith("hw-maintenance")   # someone else's drain untouched
        approvals = [r.payload["by"] for r in rem.audit.records("approval")]
        assert approvals == ["alice", "alice"]                        # both decisions audited with the name
    finally:
        rem.close()
