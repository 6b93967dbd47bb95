"""Pure parsing (22.05 fixtures captured from the real test cluster) and accounting figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery_logs.analysis.ledger import ettr, incident_figures, ledger
from recovery_logs.errors import SlurmError, UnsafeTargetError
from recovery_logs.remediation.executor import drain_reason, validate_job_id, validate_node, validate_reason
from recovery_logs.sources.slurm import (
    JobRecord,
    expand_hostlist,
    node_from_scontrol,
    parse_sacct_json,
    parse_sacct_parsable,
    parse_scontrol,
)
from recovery_logs.timeutil import NS

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_sacct_json_fixture():
    data = json.loads((DATA / "sacct_22.05.8.json").read_text())
    assert data["meta"]["plugin"]["type"] == "openapi/dbv0.0.38"
    recs = parse_sacct_json(data)
    by = {(r.job_id, r.state, r.start_ns) for r in recs}
    assert len(by) == len(recs) == 6
    runs1 = sorted((r for r in recs if r.job_id == "1"), key=lambda r: r.start_ns)
    assert [r.state for r in runs1] == ["REQUEUED", "REQUEUED", "RUNNING"]
    assert runs1[-1].nodes == ("gpu-n03", "gpu-n04") and runs1[-1].gpus == 4 and runs1[-1].end_ns is None
    failed = next(r for r in recs if r.job_id == "2")
    # the 22.05 JSON bug this project works around: `exit 3` is reported as SUCCESS/0
    assert failed.state == "FAILED" and failed.exit_code == 0 and failed.gpus == 0
    with pytest.raises(SlurmError, match="unknown data parser"):
        parse_sacct_json({"meta": {"plugin": {"type": "openapi/v9.9"}}, "jobs": []})


def test_sacct_parsable_fixture_matches_json():
    recs = parse_sacct_parsable((DATA / "sacct_22.05.8.parsable2.txt").read_text())
    js = parse_sacct_json(json.loads((DATA / "sacct_22.05.8.json").read_text()))
    key = lambda r: (r.job_id, r.start_ns)  # noqa: E731
    assert sorted((r.job_id, r.state, r.nodes, r.gpus, r.start_ns, r.end_ns) for r in recs) == \
        sorted((r.job_id, r.state, r.nodes, r.gpus, r.start_ns, r.end_ns) for r in js)
    assert {key(r): r.exit_code for r in recs}[("2", next(r.start_ns for r in recs if r.job_id == "2"))] == 3


def test_hostlist_and_scontrol():
    assert expand_hostlist("gpu-n[01-03,07],cpu1,a[8-10]b") == \
        ["gpu-n01", "gpu-n02", "gpu-n03", "gpu-n07", "cpu1", "a8b", "a9b", "a10b"]
    assert expand_hostlist("(null)") == [] and expand_hostlist("") == []
    kv = parse_scontrol("NodeName=gpu-n02 Arch=x86_64 OS=Linux 6.1 #1 SMP State=MIXED+DRAIN Weight=1 "
                        "CfgTRES=cpu=8,mem=16000M,gres/gpu=8 Reason=recovery-logs:inc-1 xid 79 [root@2026-11-29T18:05:23]")
    n = node_from_scontrol(kv)
    assert (n.name, n.state, n.flags, n.reason, n.reason_user, n.gpus) == \
        ("gpu-n02", "mixed", ("DRAIN",), "recovery-logs:inc-1 xid 79", "root", 8)
    assert kv["OS"] == "Linux 6.1 #1 SMP"


@pytest.mark.parametrize("bad", ["gpu-n01; rm -rf /", "gpu-n01,gpu-n02", "-n01", "a b", "", "gpu/n01",
                                 "x" * 70, "gpu-n01\n", "gpu..n01", None, 7])
def test_unsafe_node_names(bad):
    with pytest.raises(UnsafeTargetError):
        validate_node(bad)


@pytest.mark.parametrize("bad", ["12; scancel 1", "-1", "abc", "1,2", "12_", ""])
def test_unsafe_job_ids(bad):
    with pytest.raises(UnsafeTargetError):
        validate_job_id(bad)


def test_reasons():
    assert validate_node("gpu-n01") == "gpu-n01" and validate_job_id("12_3") == "12_3"
    r = drain_reason("inc-abc", 'XID 79 "fell" off; the bus=`x`\n')
    assert r == "recovery-logs:inc-abc XID 79 fell off the bus x"
    for bad in ("a=b", "x\ny", "\x07", "z" * 201):
        with pytest.raises(UnsafeTargetError):
            validate_reason(bad)
    with pytest.raises(UnsafeTargetError):
        drain_reason("inc; rm", "x")


def _run(start, end, gpus=8, state="REQUEUED"):
    return JobRecord("7", "train", state, ("gpu-n01", "gpu-n02"), gpus, start * NS, None if end is None else end * NS)


def test_incident_figures_and_ettr():
    from recovery_logs.records import Incident

    inc = Incident(id="inc-1", category="xid", cause="xid 79", severity="critical", node="gpu-n01", gpu=1,
                   job_id="7", xid=79, confidence=0.9, first_seen=1000 * NS, last_seen=1010 * NS,
                   detected_at=1030 * NS, count=1, nodes=("gpu-n01",), evidence=(), candidates=())
    runs = [_run(0, 1200), _run(1500, None, state="RUNNING")]
    f = incident_figures(inc, runs, action_ns=1090 * NS, now_ns=2000 * NS)
    assert f.mttd_s == 30 and f.time_to_action_s == 60
    assert f.lost_to_action_gpu_h == pytest.approx(8 * 90 / 3600)       # fault -> requeue
    assert f.requeue_wait_gpu_h == pytest.approx(8 * 410 / 3600)        # requeue -> next run
    assert f.gpu_hours_lost == pytest.approx(8 * 500 / 3600)
    # nothing done yet: the whole run after the fault is lost
    g = incident_figures(inc, runs[:1], action_ns=None, now_ns=2000 * NS)
    assert g.gpu_hours_lost == pytest.approx(8 * 200 / 3600) and g.time_to_action_s is None
    # ETTR: runs 0-1200 and 1500-2000 (now); 200 s after the fault lost; wall 2000 s
    assert ettr(runs, [1000 * NS], now_ns=2000 * NS) == pytest.approx((1200 + 500 - 200) / 2000)
    assert ettr([], [], 0) is None
    out = ledger([inc], {"7": runs}, {"inc-1": 1090 * NS}, 2000 * NS)
    assert out["gpu_hours_lost"] == pytest.approx(round(8 * 500 / 3600, 4))
    assert out["mttd_mean_s"] == 30 and out["time_to_action_mean_s"] == 60 and out["jobs"]["7"] == 0.75
