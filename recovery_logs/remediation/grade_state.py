"""Grades of the proposals recorded in a state dir: the audit trail read, then graded.

``remediation.grading`` is pure over frames (proposals, outcomes -> grades -> per-rule precision);
this module is its edge that reads a state dir's audit trail (``audit.load_audit``). Kept apart so
that what renders grades (``report.html``, ``remediation.gate``) does not import the audit store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.audit import AuditLog, load_audit
from recovery_logs.frames import incidents_frame
from recovery_logs.remediation.grading import (
    grade_proposals,
    outcomes_from_audit,
    outcomes_from_incidents,
    proposals_from_audit,
)

__all__ = ["grades_from_state"]


def grades_from_state(state_dir: str | Path | AuditLog, later_incidents: Any = None, horizon_s: float = 7 * 86400.0) -> pl.DataFrame:
    """Grades (``GRADE_SCHEMA``) of the proposals in a state dir's audit trail.

    Outcomes: approvals/rejections and later hardware incidents recorded there (``detection``
    records), plus ``later_incidents`` (anything ``frames.incident_dicts`` reads: a ReplayResult,
    Incident objects or their dicts) when given.
    """
    audit = load_audit(state_dir)
    props = proposals_from_audit(audit)
    detected = [json.loads(p) for p in audit.filter(pl.col("kind") == "detection")["payload"].to_list()]
    outs = [outcomes_from_audit(audit), outcomes_from_incidents(incidents_frame(detected))]
    if later_incidents is not None:
        outs.append(outcomes_from_incidents(incidents_frame(later_incidents)))
    return grade_proposals(props, pl.concat(outs), horizon_s=horizon_s)
