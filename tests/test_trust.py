"""The trust model (docs/TRUST.md): which source may speak for which node, and ranking across
incidents. Pure: replay over files, no Slurm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from recovery_logs.api import bundled_incident
from recovery_logs.pipeline.replay import replay
from recovery_logs.schema import FINDING_SCHEMA, conform
from recovery_logs.trust import CLAIM, JOB, JOB_LINE, NODE, allocation_check, authority, file_owner

# NVIDIA driver's own XID 79 line as the kernel logs it (bundled incident xid79_nccl_cascade)
XID79 = "kernel: [86483.123457] NVRM: Xid (PCI:0000:ba:00): 79, pid=52737, name=python3, GPU has fallen off the bus."


def _findings(rows: list[dict]) -> pl.DataFrame:
    base = {"time": None, "seq": 0, "line": 1, "message": "x", "rule_id": "xid.79", "category": "xid"}
    return conform(pl.DataFrame([{**base, **r} for r in rows]), FINDING_SCHEMA)


def test_authority_per_source():
    f = _findings([
        {"host": "gpu-n01", "source": "kernel", "file": "logs/nodes/gpu-n01/kern.log"},          # node itself
        {"host": "gpu-n14", "source": "kernel", "file": "logs/job-12/gpu-n01.out"},             # forged header
        {"host": "gpu-n01", "source": "job", "file": "logs/job-12/gpu-n01.out"},                # job output
        {"host": "gpu-n01", "source": "kernel", "file": "logs/job-12/gpu-n01.out"},             # job prints NVRM
        {"host": "gpu-n02", "source": "slurm", "file": "logs/slurmctld.log",
         "detail": json.dumps({"node": "gpu-n02"})},                                            # about another node
        {"host": "gpu-n07", "source": "kernel", "file": "/var/log/cluster/messages"},           # central syslog
        {"host": "gpu-n03", "source": "kernel", "file": "victorialogs:http://vl:9428"},         # shipped stream
        {"host": "gpu-n09", "source": "nvml", "file": "nvml"},
        {"host": "gpu-n11", "source": "job", "file": "logs/slurm-77.out"},                     # NCCL prefix host
    ])
    assert authority(f).to_list() == [NODE, CLAIM, JOB, JOB, CLAIM, NODE, NODE, NODE, JOB_LINE]
    assert file_owner("a/job-77/gpu-n05.out") == ("gpu-n05", "77")
    assert file_owner("nodes/gpu-n01/kern.log") == ("gpu-n01", None)


def test_allocation_check():
    alloc = {"12": ["gpu-n01", "gpu-n02"]}.get
    assert allocation_check("gpu-n01", "12", alloc)[0] is True
    ok, why = allocation_check("gpu-n14", "12", alloc)
    assert ok is False and "gpu-n14 is not in its allocation (gpu-n01,gpu-n02)" in why
    assert allocation_check("gpu-n14", "99", alloc)[0] is None
    assert allocation_check("gpu-n14", None, alloc)[0] is None


def test_job_printing_kernel_lines_about_another_node_never_drains_it(tmp_path: Path):
    """The probe's case: a user job prints kernel-style XID lines naming gpu-n14, which is not
    where it runs: the incident names gpu-n14 but only proposes to investigate."""
    job = tmp_path / "job-4242"
    job.mkdir()
    (job / "gpu-n01.out").write_text("".join(
        f"Nov 29 14:0{i}:00 gpu-n14 {XID79}\n" for i in range(5)))
    res = replay([tmp_path])
    [inc] = [i for i in res.incidents if i.xid == 79]
    assert inc.node == "gpu-n14" and inc.authority == "claim" and not inc.confirmed
    assert inc.suggested_action == "investigate"
    assert not [a for a in inc.actions if a.kind == "drain_node"]


def test_node_kernel_log_still_drains(tmp_path: Path):
    node = tmp_path / "nodes" / "gpu-n14"
    node.mkdir(parents=True)
    (node / "kern.log").write_text(f"Nov 29 14:06:00 gpu-n14 {XID79}\n")
    [inc] = replay([tmp_path]).incidents
    assert inc.authority == "node" and inc.confirmed
    assert [a.kind for a in inc.actions][:1] == ["drain_node"] and inc.actions[0].target == "gpu-n14"


def test_job_output_about_its_own_node_keeps_the_drain_for_the_allocation_check(tmp_path: Path):
    job = tmp_path / "job-4243"
    job.mkdir()
    (job / "gpu-n05.out").write_text(f"Nov 29 14:06:00 gpu-n05 {XID79}\n")
    [inc] = replay([tmp_path]).incidents
    assert inc.node == "gpu-n05" and inc.authority == "job" and inc.job_id == "4243"
    assert "drain_node" in [a.kind for a in inc.actions]      # the remediator checks the allocation


def test_confirmed_cascade_ranks_first_of_23(tmp_path: Path):
    """The probe's 23-incident run: 22 critical single-line incidents that rest on claims (jobs
    printing XID lines about other hosts) ranked above the real XID 79 + NCCL cascade."""
    shutil.copytree(bundled_incident("xid79_nccl_cascade"), tmp_path / "cascade",
                    ignore=shutil.ignore_patterns("truth.json"))
    for i in range(22):
        out = tmp_path / f"slurm-{900100 + i}.out"
        out.write_text(f"Nov 29 14:{10 + i:02d}:00 gpu-n{20 + i:02d} {XID79}\n")
    res = replay([tmp_path])
    assert len(res.incidents) == 23
    top = res.incidents[0]
    assert (top.node, top.xid, top.job_id, top.confirmed) == ("gpu-n02", 79, "184470", True)
    assert len(top.nodes) > 1                                  # the cascade
    # the host of each came only from the job's output: the remediator drains none of them unless
    # Slurm confirms the node ran the job (tests/integration/slurm/test_hardening.py)
    assert all(not i.confirmed and i.authority == "job-line" for i in res.incidents[1:])
