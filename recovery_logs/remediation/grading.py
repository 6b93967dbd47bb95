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
``frames.root_rule``); ``precision = right / (right + wrong)``. The promotion gate built on it
is :mod:`recovery_logs.remediation.gate`; ``remediation.grade_state.grades_from_state`` grades a state
dir's proposals (it reads the audit trail; this module is pure over frames).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.frames import root_rule, rows_frame
from recovery_logs.records import ActionProposal
from recovery_logs.schema import HARDWARE_CATEGORIES, TIME, SchemaDict
from recovery_logs.timeutil import NS

__all__ = ["FAILED_JOB_STATES", "GRADE_SCHEMA", "OUTCOME_SCHEMA", "PRECISION_SCHEMA", "PROPOSAL_SCHEMA",
           "grade_proposals", "outcomes_from_audit", "outcomes_from_incidents",
           "outcomes_from_jobs", "proposals_from_audit", "rule_precision"]

FAILED_JOB_STATES = frozenset({"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "CANCELLED"})
NODE_KINDS = frozenset({"drain_node", "reset_gpu"})
JOB_KINDS = frozenset({"requeue_job", "cancel_job"})
OUTCOME_KINDS = frozenset({"approved", "rejected", "node_failed", "node_healthy", "job_failed", "job_completed"})

PROPOSAL_SCHEMA: SchemaDict = {
    "incident_id": pl.String, "action_id": pl.String, "time": TIME, "root_rule": pl.String,
    "category": pl.String, "node": pl.String, "job_id": pl.String, "kind": pl.String, "target": pl.String,
}
"""What grading needs of a proposal (``api.actions_frame`` has these columns but ``action_id``)."""

OUTCOME_SCHEMA: SchemaDict = {
    "time": TIME, "kind": pl.String, "target": pl.String, "incident_id": pl.String, "detail": pl.String,
}
"""One thing that happened later; ``target`` is an action id, node or job id (see the table above)."""

GRADE_SCHEMA: SchemaDict = {**PROPOSAL_SCHEMA, "grade": pl.String, "basis": pl.String}

PRECISION_SCHEMA: SchemaDict = {
    "root_rule": pl.String, "proposals": pl.Int64, "right": pl.Int64, "wrong": pl.Int64, "unknown": pl.Int64,
    "graded_incidents": pl.Int64, "precision": pl.Float64,
}


def _empty(schema: SchemaDict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def _ns(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("ns")


def _proposals(df: pl.DataFrame) -> pl.DataFrame:
    if "action_id" not in df.columns:
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

    inc: dict[str, dict[str, Any]] = {}
    for iid, payload in audit.filter(pl.col("kind") == "detection").select("incident_id", "payload").iter_rows():
        inc[iid] = json.loads(payload)
    rows = []
    for iid, aid, t, kind, target in (audit.filter(pl.col("kind") == "proposal")
                                      .select("incident_id", "action_id", _ns("time"), "action_kind", "target")
                                      .iter_rows()):
        d = inc.get(iid, {})
        rows.append({"incident_id": iid, "action_id": aid, "time": t, "root_rule": root_rule(d) if d else "unknown",
                     "category": d.get("category"), "node": d.get("node"), "job_id": d.get("job_id"), "kind": kind,
                     "target": target})
    return rows_frame(rows, PROPOSAL_SCHEMA)


def outcomes_from_audit(audit: pl.DataFrame) -> pl.DataFrame:
    """``approved`` / ``rejected`` outcomes from the audit trail's approval and rejection records."""
    df = audit.filter(pl.col("kind").is_in(["approval", "rejection"]))
    return df.select(pl.col("time"), pl.when(pl.col("kind") == "approval").then(pl.lit("approved"))
                     .otherwise(pl.lit("rejected")).alias("kind"), pl.col("action_id").alias("target"),
                     "incident_id", pl.col("by").alias("detail")).cast(OUTCOME_SCHEMA)  # type: ignore[arg-type]  # polars types cast()'s keys as str | selector | dtype


def outcomes_from_incidents(incidents: pl.DataFrame, categories: frozenset[str] | None = None) -> pl.DataFrame:
    """``node_failed`` at ``first_seen`` for every incident (``api.incidents_frame``) of a hardware
    category with a culprit node."""
    cats = sorted(categories if categories is not None else {str(c) for c in HARDWARE_CATEGORIES})
    df = incidents.filter(pl.col("node").is_not_null() & pl.col("category").is_in(cats))
    return df.select(pl.col("first_seen").alias("time"), pl.lit("node_failed").alias("kind"),
                     pl.col("node").alias("target"), "incident_id",
                     pl.col("category").alias("detail")).cast(OUTCOME_SCHEMA)  # type: ignore[arg-type]  # polars types cast()'s keys as str | selector | dtype


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
    return pl.concat([job_rows.cast(OUTCOME_SCHEMA), node_rows.cast(OUTCOME_SCHEMA)])  # type: ignore[arg-type]  # polars types cast()'s keys as str | selector | dtype


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
