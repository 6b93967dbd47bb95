"""Self-grading of monitor-mode proposals, per-rule precision, and the promotion gate.

In monitor mode nothing is executed, so what happened next tells whether a proposal was right.
Each proposal is graded ``right``, ``wrong`` or ``unknown`` from *outcomes* (``OUTCOME_SCHEMA``):

==============  ===========================  =================================================
outcome kind    target                       source
==============  ===========================  =================================================
approved        action id                    audit ``approval`` record (operator said yes)
rejected        action id                    audit ``rejection`` record (operator said no)
node_failed     node                         a later hardware incident on the node
node_healthy    node                         the node ran a job to completion (Slurm)
job_failed      job id                       the job ended FAILED / NODE_FAIL / ... (Slurm)
job_completed   job id                       the job ended COMPLETED (Slurm)
==============  ===========================  =================================================

Grading rules, first match wins (``horizon_s`` bounds how long after a proposal we look):

1. An operator's approval makes it ``right``, a rejection ``wrong`` (at any time).
2. ``drain_node`` / ``reset_gpu`` (target node): the node failed again (another incident, after
   the proposal, within the horizon) → ``right``; the node ran a job to completion within the
   horizon → ``wrong``; the incident's job completed anyway → ``wrong``.
3. ``requeue_job`` / ``cancel_job`` (target job): the job failed anyway → ``right``; it
   completed → ``wrong``.
4. Anything else (``investigate``, ``none``, or no outcome yet) → ``unknown`` and not counted.

``rule_precision`` folds grades into a per-rule table (rule = the incident's root rule, see
``api.root_rule``); ``precision = right / (right + wrong)``. ``PromotionGate`` lets a rule act
alone (without an operator) only once its precision is at least ``min_precision`` over at least
``min_incidents`` graded incidents; ``gate_verdict`` is the hook for the policy: it turns an
``approved`` verdict of a not-yet-promoted rule into ``proposed`` (wait for an operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.remediation.policy import DEFAULT_PROMOTION_INCIDENTS, DEFAULT_PROMOTION_PRECISION
from recovery_logs.schema import HARDWARE_CATEGORIES, TIME

__all__ = ["FAILED_JOB_STATES", "GRADE_SCHEMA", "OUTCOME_SCHEMA", "PRECISION_SCHEMA", "PROPOSAL_SCHEMA",
           "PromotionGate", "gate_verdict", "grade_proposals", "outcomes_from_audit", "outcomes_from_incidents",
           "outcomes_from_jobs", "precision_renderable", "proposals_from_audit", "grading_from_state",
           "rule_precision"]

NS = 1_000_000_000
FAILED_JOB_STATES = frozenset({"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "CANCELLED"})
NODE_KINDS = frozenset({"drain_node", "reset_gpu"})
JOB_KINDS = frozenset({"requeue_job", "cancel_job"})
OUTCOME_KINDS = frozenset({"approved", "rejected", "node_failed", "node_healthy", "job_failed", "job_completed"})

PROPOSAL_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String, "action_id": pl.String, "time": TIME, "root_rule": pl.String,
    "category": pl.String, "node": pl.String, "job_id": pl.String, "kind": pl.String, "target": pl.String,
}
"""What grading needs of a proposal (``api.actions_frame`` has these columns but ``action_id``)."""

OUTCOME_SCHEMA: dict[str, pl.DataType] = {
    "time": TIME, "kind": pl.String, "target": pl.String, "incident_id": pl.String, "detail": pl.String,
}
"""One thing that happened later; ``target`` is an action id, node or job id (see the table above)."""

GRADE_SCHEMA: dict[str, pl.DataType] = {**PROPOSAL_SCHEMA, "grade": pl.String, "basis": pl.String}

PRECISION_SCHEMA: dict[str, pl.DataType] = {
    "root_rule": pl.String, "proposals": pl.Int64, "right": pl.Int64, "wrong": pl.Int64, "unknown": pl.Int64,
    "graded_incidents": pl.Int64, "precision": pl.Float64,
}


def _empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def _ns(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("ns")


def _to_time(values: list[int | None]) -> pl.Series:
    return pl.Series(values, dtype=pl.Int64).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME)


def _proposals(df: pl.DataFrame) -> pl.DataFrame:
    if "action_id" not in df.columns:
        from recovery_logs.model import ActionProposal

        ids = [ActionProposal(k, t, "", "", i).idempotency_key for k, t, i in
               df.select("kind", "target", "incident_id").iter_rows()]
        df = df.with_columns(pl.Series("action_id", ids, dtype=pl.String))
    missing = [c for c in PROPOSAL_SCHEMA if c not in df.columns]
    if missing:
        raise ConfigError("grading: proposals frame lacks columns", missing=missing)
    return df.select([pl.col(c).cast(t) for c, t in PROPOSAL_SCHEMA.items()])


# ---------------------------------------------------------------------------- outcome sources
def proposals_from_audit(audit: pl.DataFrame) -> pl.DataFrame:
    """Proposals (``PROPOSAL_SCHEMA``) from ``api.load_audit``: ``proposal`` records joined to their
    incident's ``detection`` record (for the root rule, category, culprit node and job)."""
    import json

    from recovery_logs.api import root_rule

    inc: dict[str, dict[str, Any]] = {}
    for iid, payload in audit.filter(pl.col("kind") == "detection").select("incident_id", "payload").iter_rows():
        inc[iid] = json.loads(payload)
    rows = []
    for iid, aid, t, kind, target in (audit.filter(pl.col("kind") == "proposal")
                                      .select("incident_id", "action_id", _ns("time"), "action_kind", "target")
                                      .iter_rows()):
        d = inc.get(iid, {})
        rows.append((iid, aid, t, root_rule(d) if d else "unknown", d.get("category"), d.get("node"),
                     d.get("job_id"), kind, target))
    if not rows:
        return _empty(PROPOSAL_SCHEMA)
    cols = list(zip(*rows, strict=True))
    return pl.DataFrame({c: (_to_time(list(v)) if c == "time" else list(v)) for c, v in zip(PROPOSAL_SCHEMA, cols,
                                                                                           strict=True)},
                        schema=PROPOSAL_SCHEMA)


def outcomes_from_audit(audit: pl.DataFrame) -> pl.DataFrame:
    """``approved`` / ``rejected`` outcomes from the audit trail's approval and rejection records."""
    df = audit.filter(pl.col("kind").is_in(["approval", "rejection"]))
    return df.select(pl.col("time"), pl.when(pl.col("kind") == "approval").then(pl.lit("approved"))
                     .otherwise(pl.lit("rejected")).alias("kind"), pl.col("action_id").alias("target"),
                     "incident_id", pl.col("by").alias("detail")).cast(OUTCOME_SCHEMA)


def outcomes_from_incidents(incidents: pl.DataFrame, categories: frozenset[str] | None = None) -> pl.DataFrame:
    """``node_failed`` at ``first_seen`` for every incident (``api.incidents_frame``) of a hardware
    category with a culprit node."""
    cats = sorted(categories if categories is not None else {str(c) for c in HARDWARE_CATEGORIES})
    df = incidents.filter(pl.col("node").is_not_null() & pl.col("category").is_in(cats))
    return df.select(pl.col("first_seen").alias("time"), pl.lit("node_failed").alias("kind"),
                     pl.col("node").alias("target"), "incident_id",
                     pl.col("category").alias("detail")).cast(OUTCOME_SCHEMA)


def outcomes_from_jobs(jobs: pl.DataFrame) -> pl.DataFrame:
    """From ``api.jobs_frame``: ``job_failed`` / ``job_completed`` at the job's end, and
    ``node_healthy`` for each node of a COMPLETED job."""
    done = jobs.filter(pl.col("end").is_not_null())
    job_rows = done.filter(pl.col("state").is_in(sorted(FAILED_JOB_STATES | {"COMPLETED"}))).select(
        pl.col("end").alias("time"),
        pl.when(pl.col("state") == "COMPLETED").then(pl.lit("job_completed")).otherwise(pl.lit("job_failed"))
        .alias("kind"), pl.col("job_id").alias("target"), pl.lit(None, pl.String).alias("incident_id"),
        pl.col("state").alias("detail"))
    node_rows = done.filter(pl.col("state") == "COMPLETED").explode("nodes").select(
        pl.col("end").alias("time"), pl.lit("node_healthy").alias("kind"), pl.col("nodes").alias("target"),
        pl.lit(None, pl.String).alias("incident_id"), ("job " + pl.col("job_id")).alias("detail"))
    return pl.concat([job_rows.cast(OUTCOME_SCHEMA), node_rows.cast(OUTCOME_SCHEMA)])


# ---------------------------------------------------------------------------- grading
def _node_of(target: str | None) -> str | None:
    return target.split(":", 1)[0] if target else None


def grade_proposals(proposals: pl.DataFrame, outcomes: pl.DataFrame, *, horizon_s: float = 7 * 86400.0
                    ) -> pl.DataFrame:
    """Grade each proposal from the outcomes (``GRADE_SCHEMA``); rules in the module docstring."""
    props = _proposals(proposals)
    bad = set(outcomes["kind"].unique().to_list()) - OUTCOME_KINDS
    if bad:
        raise ConfigError("grading: unknown outcome kinds", kinds=sorted(bad), known=sorted(OUTCOME_KINDS))
    by: dict[tuple[str, str], list[tuple[int, str | None, str | None]]] = {}
    for t, kind, target, iid, detail in outcomes.select(_ns("time"), "kind", "target", "incident_id",
                                                        "detail").iter_rows():
        by.setdefault((kind, target), []).append((t, iid, detail))
    horizon = int(horizon_s * NS)

    def later(kind: str, target: str | None, t: int, own: str | None) -> tuple[int, str | None, str | None] | None:
        hits = [o for o in by.get((kind, target or ""), []) if t < o[0] <= t + horizon and o[1] != own]
        return min(hits, key=lambda o: o[0]) if hits else None

    grades, bases = [], []
    for iid, aid, t, kind, target, job in props.select("incident_id", "action_id", _ns("time"), "kind", "target",
                                                        "job_id").iter_rows():
        g, b = "unknown", "no outcome yet"
        if by.get(("approved", aid)):
            g, b = "right", "operator approved"
        elif by.get(("rejected", aid)):
            g, b = "wrong", "operator rejected"
        elif kind in NODE_KINDS:
            node = _node_of(target)
            if (o := later("node_failed", node, t, iid)) is not None:
                g, b = "right", f"node failed again ({o[2] or 'incident'} {o[1] or ''})".replace(" )", ")")
            elif (o := later("node_healthy", node, t, iid)) is not None:
                g, b = "wrong", f"node ran a job to completion ({o[2]})"
            elif job and later("job_completed", job, t, iid) is not None:
                g, b = "wrong", f"job {job} completed anyway"
        elif kind in JOB_KINDS:
            if later("job_failed", target, t, iid) is not None:
                g, b = "right", f"job {target} failed anyway"
            elif later("job_completed", target, t, iid) is not None:
                g, b = "wrong", f"job {target} completed"
        else:
            b = f"{kind} is not graded"
        grades.append(g)
        bases.append(b)
    return props.with_columns(pl.Series("grade", grades, dtype=pl.String), pl.Series("basis", bases, dtype=pl.String))


def rule_precision(grades: pl.DataFrame) -> pl.DataFrame:
    """Per root rule: proposals, right, wrong, unknown, graded incidents and precision
    (right / (right + wrong); null when nothing was graded). Sorted by rule."""
    if grades.height == 0:
        return _empty(PRECISION_SCHEMA)
    graded = pl.col("grade").is_in(["right", "wrong"])
    out = grades.group_by("root_rule").agg(
        pl.len().cast(pl.Int64).alias("proposals"),
        (pl.col("grade") == "right").sum().cast(pl.Int64).alias("right"),
        (pl.col("grade") == "wrong").sum().cast(pl.Int64).alias("wrong"),
        (pl.col("grade") == "unknown").sum().cast(pl.Int64).alias("unknown"),
        pl.col("incident_id").filter(graded).n_unique().cast(pl.Int64).alias("graded_incidents"),
    ).with_columns(pl.when(pl.col("right") + pl.col("wrong") > 0)
                   .then(pl.col("right") / (pl.col("right") + pl.col("wrong"))).otherwise(None)
                   .cast(pl.Float64).alias("precision"))
    return out.select(list(PRECISION_SCHEMA)).sort("root_rule")


# ---------------------------------------------------------------------------- promotion gate
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
    def from_policy(cls, policy: Any) -> PromotionGate | None:
        """The gate a validated ``PolicyConfig`` asks for (its ``[promotion]`` table), or None."""
        if getattr(policy, "promotion_min_precision", None) is None:
            return None
        return cls(float(policy.promotion_min_precision), int(policy.promotion_min_incidents))

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


def gate_verdict(verdict: Any, rule_id: str, gate: PromotionGate | None, grades: pl.DataFrame | None,
                 *, approved_by_human: bool = False) -> Any:
    """Policy hook: an ``approved`` ``Verdict`` of a rule the gate does not promote becomes
    ``proposed`` (waits for an operator). Human approvals and other decisions pass unchanged."""
    if gate is None or approved_by_human or verdict.decision != "approved":
        return verdict
    g = grades if grades is not None else _empty(GRADE_SCHEMA)
    if gate.allows(rule_id, g):
        return verdict
    return replace(verdict, decision="proposed", reason=f"promotion gate: {gate.explain(rule_id, g)}")


# ---------------------------------------------------------------------------- from a state dir
def grading_from_state(state_dir: Any, later: Any = (), gate: PromotionGate | None = None,
                       horizon_s: float = 7 * 86400.0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Grades and the gate table for the proposals in a state dir's audit trail.

    Outcomes: approvals/rejections and later hardware incidents recorded there (``detection``
    records), plus the incidents of a replay of ``later`` log paths when given.
    Returns ``(grade_proposals frame, PromotionGate.table frame)``.
    """
    import json as _json

    from recovery_logs import api

    audit = api.load_audit(state_dir)
    props = proposals_from_audit(audit)
    detected = [_json.loads(p) for p in audit.filter(pl.col("kind") == "detection")["payload"].to_list()]
    outs = [outcomes_from_audit(audit), outcomes_from_incidents(api.incidents_frame(detected))]
    if later:
        outs.append(outcomes_from_incidents(api.incidents_frame(api.replay_incident(list(later)))))
    grades = grade_proposals(props, pl.concat(outs), horizon_s=horizon_s)
    return grades, (gate or PromotionGate()).table(rule_precision(grades))


def precision_renderable(table: pl.DataFrame, gate: PromotionGate) -> Any:
    """A rich table of ``PromotionGate.table`` output (for ``grade`` and the console)."""
    from rich.table import Table

    t = Table(title=f"self-grading: rules act alone at precision >= {gate.min_precision:.2f} over "
                    f">= {gate.min_incidents} incidents", header_style="bold")
    for c in ("rule", "proposals", "right", "wrong", "unknown", "incidents", "precision", "gate"):
        t.add_column(c, justify="left" if c in ("rule", "gate") else "right")
    for r in table.iter_rows(named=True):
        p = "-" if r["precision"] is None else f"{r['precision']:.2f}"
        t.add_row(r["root_rule"], str(r["proposals"]), str(r["right"]), str(r["wrong"]), str(r["unknown"]),
                  str(r["graded_incidents"]), p, "promoted" if r.get("promoted") else "held")
    return t
