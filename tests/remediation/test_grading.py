"""Self-grading: exact grades and precision on a literal proposal/outcome set; the promotion gate."""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.audit import AuditLog
from recovery_logs.errors import ConfigError
from recovery_logs.remediation.gate import PromotionGate, gate_verdict
from recovery_logs.remediation.grading import (
    GRADE_SCHEMA,
    OUTCOME_SCHEMA,
    PRECISION_SCHEMA,
    grade_proposals,
    outcomes_from_audit,
    outcomes_from_jobs,
    proposals_from_audit,
    rule_precision,
)
from recovery_logs.remediation.policy import Verdict
from recovery_logs.schema import TIME

T0 = 1_795_960_800 * 10**9   # 2026-11-29T14:00:00Z
S = 10**9


def _t(col: list[int]) -> pl.Series:
    return pl.Series(col, dtype=pl.Int64).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME)


def proposals() -> pl.DataFrame:
    rows = [  # incident, action, t(s), rule, node, job, kind, target
        ("i1", "a1", 0, "xid.79", "n1", "j1", "drain_node", "n1"),
        ("i2", "a2", 0, "xid.79", "n2", "j2", "drain_node", "n2"),
        ("i3", "a3", 0, "xid.79", "n3", "j3", "drain_node", "n3"),
        ("i4", "a4", 100, "xid.79", "n3", "j4", "drain_node", "n3"),
        ("i5", "a5", 0, "nccl.x", None, "j5", "requeue_job", "j5"),
        ("i6", "a6", 0, "nccl.x", None, "j6", "requeue_job", "j6"),
        ("i7", "a7", 0, "xid.48", "n7", "j7", "drain_node", "n7"),
        ("i8", "a8", 0, "xid.48", "n8", "j8", "investigate", "n8"),
        ("i9", "a9", 0, "xid.48", "n9", "j9", "reset_gpu", "n9:3"),
    ]
    cols = list(zip(*rows, strict=True))
    return pl.DataFrame({"incident_id": cols[0], "action_id": cols[1], "time": _t([T0 + s * S for s in cols[2]]),
                         "root_rule": cols[3], "category": ["xid"] * 9, "node": cols[4], "job_id": cols[5],
                         "kind": cols[6], "target": cols[7]})


def outcomes(horizon_s: int) -> pl.DataFrame:
    rows = [  # t(s), kind, target, incident
        (5, "approved", "a1", "i1"),
        (5, "rejected", "a2", "i2"),
        (100, "node_failed", "n3", "i4"),              # grades a3 right; a4's own incident: ignored
        (200 + horizon_s, "node_failed", "n3", "i99"),  # after a4's horizon: ignored
        (50, "job_failed", "j5", None),
        (50, "job_completed", "j6", None),
        (10, "node_healthy", "n7", None),
        (60, "job_completed", "j9", None),
        (-10, "node_failed", "n9", "i0"),              # before the proposal: ignored
    ]
    cols = list(zip(*rows, strict=True))
    return pl.DataFrame({"time": _t([T0 + s * S for s in cols[0]]), "kind": cols[1], "target": cols[2],
                         "incident_id": cols[3], "detail": [None] * len(rows)}, schema=OUTCOME_SCHEMA)


def test_grades_are_exact_on_a_literal_set():
    g = grade_proposals(proposals(), outcomes(3600), horizon_s=3600)
    assert dict(g.schema) == GRADE_SCHEMA
    assert dict(zip(g["action_id"], g["grade"], strict=True)) == {
        "a1": "right", "a2": "wrong", "a3": "right", "a4": "unknown", "a5": "right", "a6": "wrong",
        "a7": "wrong", "a8": "unknown", "a9": "wrong"}
    basis = dict(zip(g["action_id"], g["basis"], strict=True))
    assert basis["a1"] == "operator approved" and basis["a2"] == "operator rejected"
    assert basis["a3"].startswith("node failed again") and "i4" in basis["a3"]
    assert basis["a9"] == "job j9 completed anyway"
    assert basis["a8"] == "investigate is not graded"


def test_rule_precision_is_exact():
    p = rule_precision(grade_proposals(proposals(), outcomes(3600), horizon_s=3600))
    assert dict(p.schema) == PRECISION_SCHEMA
    want = pl.DataFrame({"root_rule": ["nccl.x", "xid.48", "xid.79"], "proposals": [2, 3, 4], "right": [1, 0, 2],
                         "wrong": [1, 2, 1], "unknown": [0, 1, 1], "graded_incidents": [2, 2, 3],
                         "precision": [0.5, 0.0, 2 / 3]}, schema=PRECISION_SCHEMA)
    from polars.testing import assert_frame_equal

    assert_frame_equal(p, want)


def test_a_longer_horizon_grades_the_late_failure():
    g = grade_proposals(proposals(), outcomes(3600), horizon_s=3600 + 500)
    assert g.filter(pl.col("action_id") == "a4")["grade"].item() == "right"


def test_promotion_gate_boundaries():
    grades = grade_proposals(proposals(), outcomes(3600), horizon_s=3600)
    assert PromotionGate(0.6, 3).allows("xid.79", grades)           # 2/3 over 3 incidents
    assert PromotionGate(2 / 3, 3).allows("xid.79", grades)         # precision exactly at the bar
    assert not PromotionGate(0.7, 3).allows("xid.79", grades)
    assert not PromotionGate(0.6, 4).allows("xid.79", grades)
    assert not PromotionGate(0.0, 1).allows("never.seen", grades)
    assert PromotionGate(0.5, 2).allows("nccl.x", rule_precision(grades))   # a precision table works too
    table = PromotionGate(0.5, 2).table(grades)
    assert dict(zip(table["root_rule"], table["promoted"], strict=True)) == {
        "nccl.x": True, "xid.48": False, "xid.79": True}
    assert "held" in PromotionGate(0.7, 3).explain("xid.79", grades)
    with pytest.raises(ConfigError):
        PromotionGate(1.5, 3)
    with pytest.raises(ConfigError):
        PromotionGate.from_mapping({"min_precision": 0.9, "typo": 1})


def test_gate_verdict_holds_unpromoted_rules_only():
    grades = grade_proposals(proposals(), outcomes(3600), horizon_s=3600)
    gate = PromotionGate(0.6, 3)
    ok = Verdict("approved", "autonomous mode: within budget")
    assert gate_verdict(ok, "xid.79", gate, grades) is ok
    held = gate_verdict(ok, "xid.48", gate, grades)
    assert held.decision == "proposed" and held.reason.startswith("promotion gate: xid.48")
    assert gate_verdict(ok, "xid.48", gate, grades, approved_by_human=True) is ok
    denied = Verdict("denied", "budget")
    assert gate_verdict(denied, "xid.48", gate, grades) is denied
    assert gate_verdict(ok, "xid.48", None, grades) is ok


def test_outcomes_from_jobs():
    from recovery_logs.frames import jobs_frame
    from recovery_logs.sources.slurm import JobRecord

    jobs = jobs_frame([JobRecord("1", "a", "COMPLETED", ("n1", "n2"), 16, T0, T0 + 3600 * S),
                       JobRecord("2", "b", "NODE_FAIL", ("n3",), 8, T0, T0 + 60 * S),
                       JobRecord("3", "c", "RUNNING", ("n4",), 8, T0, None)])
    o = outcomes_from_jobs(jobs)
    assert dict(o.schema) == OUTCOME_SCHEMA
    assert sorted(zip(o["kind"], o["target"], strict=True)) == [
        ("job_completed", "1"), ("job_failed", "2"), ("node_healthy", "n1"), ("node_healthy", "n2")]


def test_grading_from_a_real_audit_trail(tmp_path):
    clock = iter([1000.0 + i for i in range(100)])
    log = AuditLog.open(tmp_path, clock=lambda: next(clock))
    inc = {"id": "inc-1", "category": "xid", "node": "n1", "job_id": "7", "xid": 79, "rule_ids": ["xid.79"],
           "evidence": [], "first_seen": "2026-11-29T14:00:00Z"}
    log.append("detection", inc, incident_id="inc-1")
    log.append("proposal", {"action_id": "act-1", "kind": "drain_node", "target": "n1"}, incident_id="inc-1",
               action_id="act-1")
    log.append("proposal", {"action_id": "act-2", "kind": "requeue_job", "target": "7"}, incident_id="inc-1",
               action_id="act-2")
    log.append("approval", {"action_id": "act-1", "by": "alice"}, incident_id="inc-1", action_id="act-1")
    log.append("rejection", {"action_id": "act-2", "by": "bob", "reason": "job is fine"}, incident_id="inc-1",
               action_id="act-2")
    log.close()
    from recovery_logs.audit import load_audit

    audit = load_audit(tmp_path)
    props = proposals_from_audit(audit)
    assert props.select("action_id", "root_rule", "kind", "target", "node", "job_id").rows() == [
        ("act-1", "xid.79", "drain_node", "n1", "n1", "7"), ("act-2", "xid.79", "requeue_job", "7", "n1", "7")]
    outs = outcomes_from_audit(audit)
    assert outs.select("kind", "target", "detail").rows() == [("approved", "act-1", "alice"),
                                                              ("rejected", "act-2", "bob")]
    p = rule_precision(grade_proposals(props, outs))
    assert p.select("root_rule", "right", "wrong", "graded_incidents", "precision").rows() == [
        ("xid.79", 1, 1, 1, 0.5)]
    from recovery_logs.analysis.selfgrade import grading_from_state

    grades, table = grading_from_state(tmp_path, gate=PromotionGate(0.5, 1))
    assert table.select("root_rule", "promoted").rows() == [("xid.79", True)]
    assert grades.height == 2


def test_grade_command_reads_the_state_dir(tmp_path):
    from typer.testing import CliRunner

    from recovery_logs.cli import app

    log = AuditLog.open(tmp_path, clock=lambda: 1000.0)
    inc = {"id": "inc-1", "category": "xid", "node": "n1", "job_id": "7", "xid": 79, "rule_ids": ["xid.79"],
           "evidence": [], "first_seen": "2026-11-29T14:00:00Z"}
    log.append("detection", inc, incident_id="inc-1")
    log.append("proposal", {"action_id": "act-1", "kind": "drain_node", "target": "n1"}, incident_id="inc-1",
               action_id="act-1")
    log.append("approval", {"action_id": "act-1", "by": "alice"}, incident_id="inc-1", action_id="act-1")
    log.close()
    out = CliRunner().invoke(app, ["grade", "--state-dir", str(tmp_path), "--min-precision", "0.5",
                                   "--min-incidents", "1", "--json"])
    assert out.exit_code == 0, out.output
    import json

    doc = json.loads(out.stdout)
    assert doc["rules"] == [{"root_rule": "xid.79", "proposals": 1, "right": 1, "wrong": 0, "unknown": 0,
                             "graded_incidents": 1, "precision": 1.0, "promoted": True}]
    assert doc["grades"][0]["basis"] == "operator approved"
    text = CliRunner().invoke(app, ["grade", "--state-dir", str(tmp_path), "--width", "120"])
    assert text.exit_code == 0 and "xid.79" in text.stdout and "held" in text.stdout   # default gate 0.9 over 20
