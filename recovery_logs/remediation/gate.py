"""The promotion gate: a rule acts alone (without an operator) only once its graded precision has
earned trust.

``PromotionGate`` lets a rule act alone once its precision (``remediation.grading.rule_precision``)
is at least ``min_precision`` over at least ``min_incidents`` graded incidents; ``gate_verdict``
is the hook for the policy: it turns an ``approved`` verdict of a not-yet-promoted rule into
``proposed`` (wait for an operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.remediation.grading import GRADE_SCHEMA, rule_precision
from recovery_logs.remediation.policy import (
    DEFAULT_PROMOTION_INCIDENTS,
    DEFAULT_PROMOTION_PRECISION,
    PolicyConfig,
    Verdict,
)

__all__ = ["PromotionGate", "gate_verdict"]


@dataclass(frozen=True)
class PromotionGate:
    """A rule may act alone once its precision >= ``min_precision`` over >= ``min_incidents``
    graded incidents. Policy file form (read by ``PromotionGate.from_mapping``)::

        [promotion]
        min_precision = 0.9
        min_incidents = 20
    """

    min_precision: float = DEFAULT_PROMOTION_PRECISION
    min_incidents: int = DEFAULT_PROMOTION_INCIDENTS

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_precision <= 1.0:
            raise ConfigError("promotion gate: min_precision must be within [0, 1]", value=self.min_precision)
        if self.min_incidents < 1:
            raise ConfigError("promotion gate: min_incidents must be >= 1", value=self.min_incidents)

    @classmethod
    def from_policy(cls, policy: PolicyConfig) -> PromotionGate | None:
        """The gate a validated ``PolicyConfig`` asks for (its ``[promotion]`` table), or None."""
        precision = policy.promotion_min_precision
        if precision is None:
            return None
        return cls(float(precision), int(policy.promotion_min_incidents))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PromotionGate:
        unknown = sorted(set(data) - {"min_precision", "min_incidents"})
        if unknown:
            raise ConfigError("promotion gate: unknown keys in [promotion]", keys=unknown)
        return cls(float(data.get("min_precision", cls.min_precision)),
                   int(data.get("min_incidents", cls.min_incidents)))

    def _row(self, rule_id: str, grades: pl.DataFrame) -> dict[str, Any] | None:
        table = grades if "precision" in grades.columns else rule_precision(grades)
        rows = table.filter(pl.col("root_rule") == rule_id).to_dicts()
        return rows[0] if rows else None

    def allows(self, rule_id: str, grades: pl.DataFrame) -> bool:
        """``grades``: a ``grade_proposals`` frame or a ``rule_precision`` table."""
        r = self._row(rule_id, grades)
        return (r is not None and r["precision"] is not None and r["graded_incidents"] >= self.min_incidents
                and r["precision"] >= self.min_precision)

    def explain(self, rule_id: str, grades: pl.DataFrame) -> str:
        r = self._row(rule_id, grades)
        if r is None or r["precision"] is None:
            return f"{rule_id}: no graded proposals yet (needs {self.min_incidents} incidents)"
        verdict = "promoted" if self.allows(rule_id, grades) else "held"
        return (f"{rule_id}: {verdict}: precision {r['precision']:.2f} over {r['graded_incidents']} incident(s) "
                f"(gate {self.min_precision:.2f} over {self.min_incidents})")

    def table(self, grades: pl.DataFrame) -> pl.DataFrame:
        """``rule_precision`` plus a boolean ``promoted`` column."""
        t = grades if "precision" in grades.columns else rule_precision(grades)
        return t.with_columns((pl.col("precision").fill_null(-1.0) >= self.min_precision)
                              .and_(pl.col("graded_incidents") >= self.min_incidents).alias("promoted"))


def gate_verdict(verdict: Verdict, rule_id: str, gate: PromotionGate | None, grades: pl.DataFrame | None,
                 *, approved_by_human: bool = False) -> Verdict:
    """Policy hook: an ``approved`` ``Verdict`` of a rule the gate does not promote becomes
    ``proposed`` (waits for an operator). Human approvals and other decisions pass unchanged."""
    if gate is None or approved_by_human or verdict.decision != "approved":
        return verdict
    g = grades if grades is not None else pl.DataFrame(schema=GRADE_SCHEMA)
    if gate.allows(rule_id, g):
        return verdict
    return replace(verdict, decision="proposed", reason=f"promotion gate: {gate.explain(rule_id, g)}")
