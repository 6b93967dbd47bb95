"""Incident → proposed recovery actions. Pure.

The root-cause finding's engine action (from the rule pack / XID catalog) decides the shape:

=========================  ==================================================================
engine action              proposals
=========================  ==================================================================
drain_node_and_requeue     drain_node(culprit), requeue_job(job, excluding the culprit)
reset_gpu                  drain_node(culprit, "GPU reset required"), reset_gpu(node:gpu),
                           requeue_job(job, excluding the culprit)
requeue_only               requeue_job(job)
cancel_job                 cancel_job(job)
investigate                investigate(node or job)
none_user_bug / none       none — the application is at fault; no node action
=========================  ==================================================================

Safety: a drain needs a named culprit with its own fault line and confidence of at least
``drain_min_confidence``; otherwise it is downgraded to ``investigate``. A cleared incident
proposes nothing but ``none``. Replay marks every proposal ``record_only``.

Jobs: an incident affects ``inc.jobs`` (accounting's join: several on a shared node, see
``recovery_logs.jobjoin``), else its ``job_id``; a requeue (or cancel) is proposed for each,
excluding the culprit, and carries the job's attempt identity when accounting gave one.
"""

from __future__ import annotations

from recovery_logs.config import EngineConfig
from recovery_logs.records import ActionProposal, Incident
from recovery_logs.schema import ActionKind

RECORD_ONLY = "record_only"


def _reason(inc: Incident) -> str:
    where = f" on {inc.node}" + (f" GPU {inc.gpu}" if inc.gpu is not None else "") if inc.node else ""
    return f"{inc.cause}{where} (confidence {inc.confidence:.2f})"


def affected_jobs(inc: Incident) -> list[tuple[str, str | None, str | None]]:
    """(job id, attempt, chain) of every job the incident affects, job_id first."""
    jobs = list(inc.jobs) or ([inc.job_id] if inc.job_id else [])
    by_job = {a.get("job_id"): a for a in inc.attempts}
    return [(j, by_job.get(j, {}).get("attempt"), by_job.get(j, {}).get("chain")) for j in jobs]


def plan(inc: Incident, config: EngineConfig, decision: str = RECORD_ONLY) -> tuple[ActionProposal, ...]:
    reason = _reason(inc)
    a = inc.suggested_action

    def p(kind: ActionKind, target: str | None, why: str = reason, exclude: tuple[str, ...] = ()) -> ActionProposal:
        return ActionProposal(kind=kind.value, target=target, decision=decision, reason=why,
                              incident_id=inc.id, exclude=exclude)

    def per_job(kind: ActionKind, exclude: tuple[str, ...] = ()) -> list[ActionProposal]:
        return [ActionProposal(kind=kind.value, target=j, decision=decision, reason=reason, incident_id=inc.id,
                               exclude=exclude, attempt=att, chain=ch) for j, att, ch in affected_jobs(inc)]

    if inc.status == "cleared":
        return (p(ActionKind.NONE, None, f"cleared by a later event: {reason}"),)
    if a in ("none_user_bug", "none"):
        who = "application error" if a == "none_user_bug" else "no action needed"
        return (p(ActionKind.NONE, inc.job_id, f"{who}, no node action: {reason}"),)
    node_ok = inc.node is not None and inc.confidence >= config.drain_min_confidence
    culprit = (inc.node,) if inc.node else ()
    out: list[ActionProposal] = []
    if a in ("drain_node_and_requeue", "reset_gpu"):   # the node goes out of service (and its GPU is reset)
        reset = a == "reset_gpu"
        if node_ok:
            out.append(p(ActionKind.DRAIN_NODE, inc.node, f"GPU reset required: {reason}" if reset else reason))
            if reset:
                out.append(p(ActionKind.RESET_GPU, f"{inc.node}:{inc.gpu}" if inc.gpu is not None else inc.node))
        else:
            out.append(p(ActionKind.INVESTIGATE, inc.node or inc.job_id,
                         f"{'GPU reset' if reset else 'drain'} withheld (no confident culprit): {reason}"))
        out.extend(per_job(ActionKind.REQUEUE_JOB, culprit if node_ok else ()))
    elif a == "requeue_only":
        if inc.job_id or inc.jobs:
            out.extend(per_job(ActionKind.REQUEUE_JOB))
        else:
            out.append(p(ActionKind.INVESTIGATE, inc.node, reason))
    elif a == "cancel_job":
        out.extend(per_job(ActionKind.CANCEL_JOB) if inc.job_id or inc.jobs else [p(ActionKind.INVESTIGATE, inc.node)])
    else:
        out.append(p(ActionKind.INVESTIGATE, inc.node or inc.job_id))
    return tuple(out)
