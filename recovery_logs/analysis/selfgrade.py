"""Self-grading from a state dir, with later history replayed: ``recovery-logs backtest --grade``.

``grading_from_state(state_dir, later)`` grades the proposals recorded in the state dir's audit
trail (``remediation.grade_state.grades_from_state``); log paths in ``later`` are replayed (record
only) and their incidents count as later outcomes. Returns the grades and the promotion gate's
table of them.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.remediation.gate import PromotionGate
from recovery_logs.remediation.grade_state import grades_from_state
from recovery_logs.remediation.grading import rule_precision

__all__ = ["grading_from_state"]




def grading_from_state(state_dir: Any, later: Any = (), gate: PromotionGate | None = None,
                       horizon_s: float = 7 * 86400.0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Grades and the gate table for the proposals in a state dir's audit trail.

    Outcomes: approvals/rejections and later hardware incidents recorded there (``detection``
    records), plus the incidents of a replay of ``later`` log paths when given.
    Returns ``(grade_proposals frame, PromotionGate.table frame)``.
    """
    later_res = replay(list(later), ReplayOptions()) if later else None
    grades = grades_from_state(state_dir, later_res, horizon_s=horizon_s)
    return grades, (gate or PromotionGate()).table(rule_precision(grades))
