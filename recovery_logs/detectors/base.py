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

import json
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import polars as pl

from recovery_logs.schema import FINDING_SCHEMA, empty_findings, records_frame


@dataclass(frozen=True)
class DetectContext:
    """What a detector may know besides the frames.

    ``watermark_ns``: event-time clock (ns since epoch, UTC); nothing later may influence output.
    ``job_states``: Slurm job id -> state (``"RUNNING"``, ``"COMPLETED"`` …) when known.
    ``config``: the engine config (``EngineConfig``) or None.
    ``closed_ns``: event time up to which every source has delivered (a live reader behind in one
    file); a window ending after it may still get events and must not be scored. None: the
    watermark (replay, where everything was read before detection).
    ``progress``: plain training-progress findings held beside the findings frame as narrow rows
    (``detectors.progress.PROGRESS_SCHEMA``; the engine's); detectors read them with the frame's own
    progress rows through ``detectors.progress.observations``. None: all are in the frame.
    ``observed``: that merge made once for all detectors (``observations(findings, progress)``); None:
    each detector makes it.
    ``final``: the input is complete — nothing will arrive after these rows (the end of a replay's
    input). A group whose members arrive one line each (a training step's per-rank lines) is then
    decided as it stands; before, a detector waits until the group cannot grow.
    """

    watermark_ns: int
    job_states: dict[str, str] | None = None
    config: object | None = None
    closed_ns: int | None = None
    progress: pl.DataFrame | None = field(default=None, compare=False, repr=False)
    observed: pl.DataFrame | None = field(default=None, compare=False, repr=False)
    final: bool = False

    @property
    def scored_until(self) -> int:
        """Windows ending at or before this are complete."""
        return self.watermark_ns if self.closed_ns is None else min(self.watermark_ns, self.closed_ns)


@runtime_checkable
class Detector(Protocol):
    @property
    def name(self) -> str:
        """``detector.<name>`` is the rule id of the findings it adds."""
        ...

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        """Pure. Return NEW findings (FINDING_SCHEMA) derived from accumulated state up to
        ctx.watermark_ns (event time). Must be deterministic and must not depend on batch boundaries."""
        ...




def synthetic_findings(name: str, rows: list[dict]) -> pl.DataFrame:
    """Build detector findings (FINDING_SCHEMA) from row dicts.

    Each row needs ``time_ns`` (int, event time at which a live run would emit it), ``message``,
    ``category``, ``severity``, ``role``, ``action``; optional ``host``, ``job_id``, ``step``,
    ``rank``, ``detail`` (dict, stored as sorted JSON), ``source``. Rows are returned sorted by
    (time, job_id, host, message) so the output never depends on dict/group iteration order.
    """

    if not rows:
        return empty_findings()
    recs = []
    for r in rows:
        detail = r.get("detail")
        recs.append({
            "time": int(r["time_ns"]), "time_inferred": False, "host": r.get("host"), "job_id": r.get("job_id"),
            "source": r.get("source", "other"), "file": "detector", "line": 0, "seq": None,
            "stream_id": None, "rank": r.get("rank"), "message": r["message"],
            "rule_id": f"detector.{name}", "rule_version": 1, "category": r["category"],
            "severity": r["severity"], "role": r["role"], "action": r["action"], "step": r.get("step"),
            "gpu": r.get("gpu"),
            "detail": None if detail is None else json.dumps(detail, sort_keys=True, default=str),
        })
    return records_frame(recs, FINDING_SCHEMA).sort(["time", "job_id", "host", "message"], nulls_last=True)


def upto(findings: pl.DataFrame, watermark_ns: int) -> pl.DataFrame:
    """Rows with a known event time at or before the watermark."""
    return findings.filter(pl.col("time").is_not_null() & (pl.col("time").dt.epoch("ns") <= watermark_ns))



# [rank3] / rank=3 / rank 3 / Lightning "[rank: 3]"; torchrun --tee "[default3]:" (local rank: one node's
# file) and Open MPI --tag-output "[1,3]<stdout>:" (jobid,rank)
_RANK_RE = r"(?i)\[rank(\d+)\]|\brank(?:[ =]|: ?)?(\d+)\b|^\s*\[default(\d+)\]:|\[\d+,(\d+)\]<std(?:out|err)>"


def with_rank(findings: pl.DataFrame) -> pl.DataFrame:
    """Fill a null ``rank`` from the message (``[rank3]``, ``rank=3``, ``rank 3``, ``[rank: 3]``,
    ``[default3]:``, ``[1,3]<stdout>``) when a rule did not."""
    m = pl.col("message").str.extract_groups(_RANK_RE)
    from_msg = pl.coalesce(*(m.struct.field(str(k)) for k in range(1, 5))).cast(pl.Int32, strict=False)
    return findings.with_columns(pl.coalesce(pl.col("rank"), from_msg).alias("rank"))


__all__ = ["DetectContext", "Detector", "synthetic_findings", "upto", "with_rank"]
