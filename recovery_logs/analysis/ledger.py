"""Accounting figures per incident and per job: GPU-hours lost, ETTR, MTTD, time to action.

Definitions (pure functions over Incident, JobRecord runs from sacct, and audit times):

* **MTTD** (per incident): ``detected_at - first_seen`` — how long the fault was visible in the
  logs before we had enough evidence to name it.
* **time to action**: from ``detected_at`` to the first action that Slurm confirmed (a
  ``result`` record with outcome done/noop in the audit trail). None when nothing ran.
* **GPU-hours lost** (per incident and job): the job's allocated GPUs x (fault -> recovery
  action), plus the requeue wait: GPUs x (recovery action -> the job's next run starts). While
  the job has not restarted the wait runs to ``now``; a job that was not requeued loses GPUs x
  (fault -> end of the failed run).
* **ETTR** (per job, Meta's effective training time ratio): productive run time / wall time
  since the first run started. Productive = the sum of run times minus, for every run that an
  incident hit, the time from the fault to the end of that run (work after the fault is lost;
  without checkpoint information, the time back to the last checkpoint is not counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recovery_logs.audit import AuditLog
from recovery_logs.records import Incident
from recovery_logs.sources.slurm import JobRecord
from recovery_logs.timeutil import NS, iso_to_ns


@dataclass(frozen=True)
class IncidentFigures:
    incident_id: str
    job_id: str | None
    gpus: int
    mttd_s: float
    time_to_action_s: float | None
    lost_to_action_gpu_h: float
    requeue_wait_gpu_h: float

    @property
    def gpu_hours_lost(self) -> float:
        return self.lost_to_action_gpu_h + self.requeue_wait_gpu_h

    def to_dict(self) -> dict[str, Any]:
        return {"incident_id": self.incident_id, "job_id": self.job_id, "gpus": self.gpus,
                "mttd_s": round(self.mttd_s, 3),
                "time_to_action_s": None if self.time_to_action_s is None else round(self.time_to_action_s, 3),
                "gpu_hours_lost": round(self.gpu_hours_lost, 4),
                "lost_to_action_gpu_h": round(self.lost_to_action_gpu_h, 4),
                "requeue_wait_gpu_h": round(self.requeue_wait_gpu_h, 4)}


def action_times(audit: AuditLog) -> dict[str, int]:
    """incident id -> ts_ns of the first action Slurm confirmed (result/reconcile done or noop)."""
    out: dict[str, int] = {}
    for rec in audit.records():
        if rec.kind in ("result", "reconcile") and rec.payload.get("outcome") in ("done", "noop") \
                and rec.incident_id and rec.incident_id not in out:
            out[rec.incident_id] = rec.ts_ns
    return out


def incidents_from_audit(audit: AuditLog) -> list[Incident]:
    """The latest detection record of every incident, as Incident records (without evidence)."""
    latest: dict[str, dict[str, Any]] = {}
    for rec in audit.records("detection"):
        latest[rec.incident_id or ""] = rec.payload
    out = []
    for p in latest.values():
        out.append(Incident(
            id=p["id"], category=p.get("category", ""), cause=p.get("cause", ""), severity=p.get("severity", "info"),
            node=p.get("node"), gpu=p.get("gpu"), job_id=p.get("job_id"), xid=p.get("xid"),
            confidence=float(p.get("confidence", 0.0)), first_seen=iso_to_ns(p["first_seen"]),
            last_seen=iso_to_ns(p["last_seen"]), detected_at=iso_to_ns(p["detected_at"]), count=int(p.get("count", 1)),
            nodes=tuple(p.get("nodes", ())), evidence=(), candidates=(), status=p.get("status", "open")))
    return out


def _run_hit(runs: Sequence[JobRecord], t_ns: int) -> tuple[int | None, JobRecord | None]:
    for i, r in enumerate(runs):
        if r.start_ns is not None and r.start_ns <= t_ns and (r.end_ns is None or t_ns <= r.end_ns):
            return i, r
    return None, None


def incident_figures(inc: Incident, runs: Sequence[JobRecord], action_ns: int | None, now_ns: int) -> IncidentFigures:
    """Figures for one incident; ``runs`` are the job's runs (sacct -D, oldest first)."""
    runs = sorted(runs, key=lambda r: r.start_ns or 0)
    mttd = max(0, inc.detected_at - inc.first_seen) / NS
    tta = None if action_ns is None else max(0, action_ns - inc.detected_at) / NS
    idx, hit = _run_hit(runs, inc.first_seen)
    gpus = hit.gpus if hit else (runs[-1].gpus if runs else 0)
    if not gpus:
        return IncidentFigures(inc.id, inc.job_id, 0, mttd, tta, 0.0, 0.0)
    nxt = runs[idx + 1] if idx is not None and idx + 1 < len(runs) else None
    if action_ns is None:
        end = hit.end_ns if hit and hit.end_ns else now_ns
        return IncidentFigures(inc.id, inc.job_id, gpus, mttd, tta, gpus * max(0, end - inc.first_seen) / NS / 3600, 0.0)
    to_action = gpus * max(0, action_ns - inc.first_seen) / NS / 3600
    restart = nxt.start_ns if nxt and nxt.start_ns else now_ns
    wait = gpus * max(0, restart - action_ns) / NS / 3600
    return IncidentFigures(inc.id, inc.job_id, gpus, mttd, tta, to_action, wait)


def ettr(runs: Sequence[JobRecord], fault_times_ns: Iterable[int] = (), now_ns: int | None = None) -> float | None:
    """Effective training time ratio of one job (None before it first ran)."""
    runs = [r for r in sorted(runs, key=lambda r: r.start_ns or 0) if r.start_ns is not None]
    if not runs:
        return None
    starts = [int(r.start_ns or 0) for r in runs]   # all set (filtered above)
    last_end = max((r.end_ns or now_ns or s) for r, s in zip(runs, starts, strict=True))
    wall = last_end - starts[0]
    if wall <= 0:
        return None
    run_time = sum(max(0, (r.end_ns or last_end) - s) for r, s in zip(runs, starts, strict=True))
    lost = 0
    for t in fault_times_ns:
        _, hit = _run_hit(runs, t)
        if hit is not None:
            lost += max(0, (hit.end_ns or last_end) - t)
    return max(0.0, min(1.0, (run_time - lost) / wall))


def ledger(incidents: Sequence[Incident], runs_by_job: Mapping[str, Sequence[JobRecord]],
           actions_ns: Mapping[str, int], now_ns: int) -> dict[str, Any]:
    """Per-incident figures, per-job ETTR and the means (the shape ``slurm status --json`` prints)."""
    figs = [incident_figures(i, runs_by_job.get(i.job_id or "", ()), actions_ns.get(i.id), now_ns) for i in incidents]
    faults: dict[str, list[int]] = {}
    for i in incidents:
        if i.job_id:
            faults.setdefault(i.job_id, []).append(i.first_seen)
    jobs = {j: ettr(runs, faults.get(j, ()), now_ns) for j, runs in sorted(runs_by_job.items())}
    ttas = [f.time_to_action_s for f in figs if f.time_to_action_s is not None]
    return {
        "incidents": [f.to_dict() for f in figs],
        "jobs": {j: (None if v is None else round(v, 4)) for j, v in jobs.items()},
        "gpu_hours_lost": round(sum(f.gpu_hours_lost for f in figs), 4),
        "mttd_mean_s": round(sum(f.mttd_s for f in figs) / len(figs), 3) if figs else None,
        "time_to_action_mean_s": round(sum(ttas) / len(ttas), 3) if ttas else None,
    }


__all__ = ["IncidentFigures", "action_times", "ettr", "incident_figures", "incidents_from_audit", "ledger"]
