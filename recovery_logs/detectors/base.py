"""The behavioural-detector contract shared by the pipeline and every detector.

A detector is a pure function of accumulated frames::

    detector.detect(findings, windows, ctx) -> new findings (schema.FINDING_SCHEMA)

* ``findings`` — every finding accumulated so far (rule findings, incl. ``progress`` lines).
* ``windows``  — the pipeline's per (host, job_id, window_start) frame; detectors rely only on
  ``host``, ``job_id``, ``window_start`` and per-category counts.
* ``ctx``      — :class:`DetectContext`: the event-time watermark, known Slurm job states and
  the engine config.

Contract: deterministic; independent of how the input was split into batches; uses only state
with event time ``<= ctx.watermark_ns``; returns a frame with exactly ``FINDING_SCHEMA``.
Synthetic findings carry ``rule_id="detector.<name>"``, ``file="detector"``, ``line=0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import polars as pl


@dataclass(frozen=True)
class DetectContext:
    """What a detector may know besides the frames.

    ``watermark_ns``: event-time clock (ns since epoch, UTC); nothing later may influence output.
    ``job_states``: Slurm job id -> state (``"RUNNING"``, ``"COMPLETED"`` …) when known.
    ``config``: the engine config (``EngineConfig``) or None.
    """

    watermark_ns: int
    job_states: dict[str, str] | None = None
    config: object | None = None


@runtime_checkable
class Detector(Protocol):
    name: str

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        """Pure. Return NEW findings (FINDING_SCHEMA) derived from accumulated state up to
        ctx.watermark_ns (event time). Must be deterministic and must not depend on batch boundaries."""
        ...


__all__ = ["DetectContext", "Detector"]
