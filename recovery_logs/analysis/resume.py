"""Time to resume: the whole path from a fault to resumed training, per (incident, job).

:func:`resume_records` is a pure function of the audit trail (what the engine saw and did,
with wall-clock times), the allocations frame (``sources.accounting``: when the job ran again)
and ``now``. One :class:`ResumeRecord` per (incident, affected job)::

    fault_at             first evidence of the fault (event time)
    detected_at          the engine reported the incident (audit ``detection``)
    proposed_at          the requeue (or cancel) of this job was proposed (``proposal``)
    executed_at          it was sent to Slurm (``intent``)
    verified_at          Slurm was observed to have done it (``result``/``reconcile`` done|noop)
    resumed_at           the job's next attempt started (accounting)
    progress_resumed_at  the first training-progress line of the job after that start (``progress``,
                         written by the watcher when the job's logs are in its input)

plus the durations between consecutive known stages (``*_s``), ``fault_to_resumed_s`` and
``fault_to_progress_s``, and ``gpu_hours_lost`` = the attempt's allocated GPUs x the time from
the fault to resumed progress — or, when that is not known, to the job running again, or, when
the job never ran again, to the end of the failed attempt (``now`` while it still runs);
``lost_until`` names which of these it was. ``recovery-logs slurm ledger --json`` prints these
records; the web console renders them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import polars as pl

from recovery_logs.audit import AuditLog
from recovery_logs.timeutil import iso_to_ns, ns_to_iso

NS = 1_000_000_000
JOB_KINDS = ("requeue_job", "cancel_job")
STAGES = ("fault_at", "detected_at", "proposed_at", "executed_at", "verified_at", "resumed_at",
          "progress_resumed_at")


@dataclass(frozen=True)
class ResumeRecord:
    incident_id: str
    job_id: str
    attempt: str | None
    action: str | None           # requeue_job | cancel_job | none
    action_status: str | None
    gpus: int
    fault_at: int | None
    detected_at: int | None
    proposed_at: int | None
    executed_at: int | None
    verified_at: int | None
    resumed_at: int | None
    progress_resumed_at: int | None
    gpu_hours_lost: float
    lost_until: str

    def durations(self) -> dict[str, float | None]:
        def d(a: int | None, b: int | None) -> float | None:
            return None if a is None or b is None else round((b - a) / NS, 3)

        return {"detect_s": d(self.fault_at, self.detected_at), "propose_s": d(self.detected_at, self.proposed_at),
                "execute_s": d(self.proposed_at, self.executed_at), "verify_s": d(self.executed_at, self.verified_at),
                "resume_s": d(self.verified_at or self.executed_at, self.resumed_at),
                "progress_s": d(self.resumed_at, self.progress_resumed_at),
                "fault_to_resumed_s": d(self.fault_at, self.resumed_at),
                "fault_to_progress_s": d(self.fault_at, self.progress_resumed_at)}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        for k in STAGES:
            out[k] = ns_to_iso(out[k]) if out[k] is not None else None
        out["gpu_hours_lost"] = round(self.gpu_hours_lost, 6)
        out.update(self.durations())
        return out


def _first(recs: list[Any], pred: Any) -> Any:
    return next((r for r in recs if pred(r)), None)


def _next_start(allocs: pl.DataFrame | None, job: str, attempt: dict[str, Any] | None, after_ns: int) -> int | None:
    """Start of the job's next attempt (same chain, higher restart count) that began after the fault."""
    if allocs is None or allocs.height == 0:
        return None
    rows = allocs.filter((pl.col("job_id") == job) & pl.col("start").is_not_null())
    if attempt and attempt.get("chain"):
        later = rows.filter(pl.col("restart_count") > int(attempt.get("restart_count") or 0))
        same = later.filter(pl.col("chain") == attempt["chain"])
        rows = same if same.height else later      # a sacct window without the first run: another chain key
    t = rows.filter(pl.col("start").dt.epoch("ns") > after_ns).select(pl.col("start").min().dt.epoch("ns")).item()
    return int(t) if t is not None else None


def _attempt_end(allocs: pl.DataFrame | None, attempt: dict[str, Any] | None) -> int | None:
    if allocs is None or not attempt or not attempt.get("attempt"):
        return iso_to_ns(attempt["end"]) if attempt and attempt.get("end") else None
    t = allocs.filter(pl.col("attempt") == attempt["attempt"]).select(pl.col("end").max().dt.epoch("ns")).item()
    return int(t) if t is not None else None


def resume_records(audit: AuditLog, allocations: pl.DataFrame | None, now_ns: int) -> list[ResumeRecord]:
    """Every (incident, job) the audit trail knows, oldest incident first (see module doc)."""
    recs = audit.records()
    detections: dict[str, list[Any]] = {}
    for r in recs:
        if r.kind == "detection" and r.incident_id:
            detections.setdefault(r.incident_id, []).append(r)
    by_action: dict[str, list[Any]] = {}
    for r in recs:
        if r.action_id:
            by_action.setdefault(r.action_id, []).append(r)
    progress = {r.payload.get("action_id"): r for r in recs if r.kind == "progress"}
    out = []
    for inc_id, dets in detections.items():
        latest = dets[-1].payload
        jobs = list(latest.get("jobs") or ([latest["job_id"]] if latest.get("job_id") else []))
        if not jobs or latest.get("category") == "source_health":
            continue
        attempts = {a.get("job_id"): a for a in latest.get("attempts") or ()}
        fault = iso_to_ns(latest["first_seen"]) if latest.get("first_seen") else None
        proposals = [r for r in recs if r.kind == "proposal" and r.incident_id == inc_id]
        for job in jobs:
            prop = _first(proposals, lambda r, j=job: r.payload.get("kind") in JOB_KINDS and r.payload.get("target") == j)
            if prop is None:
                prop = _first(proposals, lambda r, j=job: r.payload.get("target") == j)
            act = prop.action_id if prop is not None else None
            trail = by_action.get(act or "", [])
            intent = _first(trail, lambda r: r.kind == "intent")
            ok = _first(trail, lambda r: r.kind in ("result", "reconcile")
                        and r.payload.get("outcome") in ("done", "noop"))
            last = _first(list(reversed(trail)), lambda r: r.kind in ("result", "reconcile", "decision"))
            status = (last.payload.get("outcome") or last.payload.get("status")) if last is not None else None
            att = attempts.get(job)
            executed = intent.ts_ns if intent is not None else None
            resumed = _next_start(allocations, job, att, fault or 0) if act and prop.payload.get("kind") == \
                "requeue_job" else None
            pr = progress.get(act) if act else None
            prog = iso_to_ns(pr.payload["time"]) if pr is not None else None
            gpus = int(att.get("gpus") or 0) if att else 0
            if prog is not None:
                until, why = prog, "progress_resumed"
            elif resumed is not None:
                until, why = resumed, "resumed"
            else:
                end = _attempt_end(allocations, att)
                until, why = (end, "job_end") if end is not None else (now_ns, "now")
            lost = gpus * max(0, until - fault) / NS / 3600 if fault is not None else 0.0
            out.append(ResumeRecord(
                incident_id=inc_id, job_id=job, attempt=att.get("attempt") if att else None,
                action=prop.payload.get("kind") if prop is not None else None, action_status=status, gpus=gpus,
                fault_at=fault, detected_at=dets[0].ts_ns, proposed_at=prop.ts_ns if prop is not None else None,
                executed_at=executed, verified_at=ok.ts_ns if ok is not None else None, resumed_at=resumed,
                progress_resumed_at=prog, gpu_hours_lost=lost, lost_until=why))
    return out


__all__ = ["ResumeRecord", "STAGES", "resume_records"]
