"""Small synthetic frames for the behavioural detectors: tests, model development, benchmarks.

These are not the simulator (``recovery_logs.simulate``); they build findings/events directly,
so detector tests do not depend on rule packs or log formats.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from recovery_logs.schema import EVENT_SCHEMA, FINDING_SCHEMA, records_frame
from recovery_logs.timeutil import NS

T0 = 1_795_000_000 * 1_000_000_000  # 2026-11-19T..Z, a fixed origin in ns


def findings(rows: list[dict]) -> pl.DataFrame:
    """Rows with ``t`` (seconds after T0) and any FINDING_SCHEMA columns -> a findings frame."""
    recs = []
    for i, r in enumerate(rows):
        d = dict(r)
        t = d.pop("t")
        d["time"] = T0 + int(round(t * NS))
        d.setdefault("seq", i)
        d.setdefault("file", "job.log")
        d.setdefault("source", "job")
        recs.append(d)
    return records_frame(recs, FINDING_SCHEMA)


def progress(job: str, host: str, step: int, t: float, step_time_s: float | None = None,
             rank: int | None = None) -> dict:
    return {"t": t, "job_id": job, "host": host, "rank": rank, "step": step, "step_time_s": step_time_s,
            "rule_id": "progress.megatron", "category": "progress", "role": "progress", "severity": "info",
            "action": "none", "message": f"iteration {step} | elapsed time per iteration (ms): "
                                         f"{(step_time_s or 0) * 1000:.1f}"}


def training_job(job: str, hosts: list[str], ranks_per_host: int, steps: int, step_s: float = 1.0,
                 t0: float = 0.0, slow: dict[str, float] | None = None, slow_ranks: dict[int, float] | None = None,
                 seed: int = 0, per_rank: bool = True) -> list[dict]:
    """Per-rank progress rows of a synchronous job. ``slow``: host -> step-time factor from ``t0``;
    ``slow_ranks``: rank -> factor. Step time of the job is that of its slowest rank (synchronous),
    the per-rank timing reports each rank's own compute time."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    slow_ranks = slow_ranks or {}
    rows: list[dict] = []
    t = t0
    nranks = len(hosts) * ranks_per_host
    for s in range(1, steps + 1):
        own = []
        for r in range(nranks):
            h = hosts[r // ranks_per_host]
            f = slow.get(h, 1.0) * slow_ranks.get(r, 1.0)
            own.append(step_s * f * float(rng.normal(1.0, 0.02)))
        t += max(own)
        for r in range(nranks if per_rank else 1):
            h = hosts[r // ranks_per_host]
            rows.append(progress(job, h, s, t + 0.001 * r, round(own[r], 4), r if per_rank else None))
    return rows


def events(rows: list[dict]) -> pl.DataFrame:
    """Rows with ``t`` (seconds after T0) and EVENT_SCHEMA columns -> an events frame."""
    recs = []
    for i, r in enumerate(rows):
        d = dict(r)
        d["time"] = T0 + int(round(d.pop("t") * NS))
        d.setdefault("seq", i)
        d.setdefault("source", "job")
        d.setdefault("file", "job.log")
        d.setdefault("line", i + 1)
        recs.append(d)
    return records_frame(recs, EVENT_SCHEMA)


__all__ = ["T0", "events", "findings", "progress", "training_job"]
