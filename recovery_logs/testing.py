"""Test helpers that ship with the library: event/finding/incident factories, a fake clock, a list
source and a recording command runner.

Used by our own tests and by sites writing tests for their rule packs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import polars as pl

from recovery_logs.records import ActionProposal, Evidence, Incident
from recovery_logs.schema import EVENT_SCHEMA, FINDING_SCHEMA, SchemaDict, records_frame
from recovery_logs.sources.slurm import CommandResult, CommandRunner
from recovery_logs.timeutil import iso_to_ns


def _times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        r = dict(r)
        t = r.get("time")
        if isinstance(t, str):
            r["time"] = iso_to_ns(t)
        out.append(r)
    return out


def _frame(rows: Sequence[dict[str, Any]], schema: SchemaDict, seq_start: int) -> pl.DataFrame:
    rows = _times(list(rows))
    for n, r in enumerate(rows):
        r.setdefault("seq", seq_start + n)
        r.setdefault("time_inferred", False)
        r.setdefault("line", n + 1)
        r.setdefault("file", "test")
        r.setdefault("source", "other")
    return records_frame(rows, schema)


def make_events(rows: Sequence[dict[str, Any]], seq_start: int = 0) -> pl.DataFrame:
    """Events from dicts: ``time`` as RFC3339 string or ns int; missing columns become nulls/defaults."""
    return _frame(rows, EVENT_SCHEMA, seq_start)


def make_findings(rows: Sequence[dict[str, Any]], seq_start: int = 0) -> pl.DataFrame:
    return _frame(rows, FINDING_SCHEMA, seq_start)


class FakeClock:
    """A manual clock in seconds (float) for sources, policy and executor tests."""

    def __init__(self, start: float = 1_795_960_800.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ListSource:
    """Yields prepared event frames in order (the test twin of a tailing source)."""

    def __init__(self, batches: Iterable[pl.DataFrame]) -> None:
        self._batches = list(batches)

    def __iter__(self) -> Iterator[pl.DataFrame]:
        return iter(self._batches)


def split_frame(df: pl.DataFrame, cuts: Sequence[int]) -> list[pl.DataFrame]:
    """Split a frame at row offsets (sorted, de-duplicated, clipped)."""
    points = sorted({c for c in cuts if 0 < c < df.height})
    out, prev = [], 0
    for c in [*points, df.height]:
        out.append(df.slice(prev, c - prev))
        prev = c
    return out


def make_incident(inc_id: str, node: str | None, job_id: str | None, *, kinds: Sequence[str] = ("drain", "requeue"),
                  cause: str = "XID 79 GPU has fallen off the bus", severity: str = "critical",
                  confidence: float = 0.9, t_ns: int = 1_795_000_000_000_000_000) -> Incident:
    """An XID 79 ``Incident`` on ``node`` proposing ``kinds`` (drain, requeue, cancel, investigate):
    what the remediator, console and policy tests feed."""
    acts = []
    for k in kinds:
        if k == "drain":
            acts.append(ActionProposal("drain_node", node, "record_only", cause, inc_id))
        elif k == "requeue":
            acts.append(ActionProposal("requeue_job", job_id, "record_only", cause, inc_id,
                                       (node,) if node else ()))
        elif k == "cancel":
            acts.append(ActionProposal("cancel_job", job_id, "record_only", cause, inc_id))
        elif k == "investigate":
            acts.append(ActionProposal("investigate", node, "record_only", cause, inc_id))
    return Incident(id=inc_id, category="xid", cause=cause, severity=severity, node=node, gpu=3, job_id=job_id,
                    xid=79, confidence=confidence, first_seen=t_ns, last_seen=t_ns + 5 * 10**9,
                    detected_at=t_ns + 2 * 10**9, count=3, nodes=(node,) if node else (),
                    evidence=(Evidence(t_ns, node, f"NVRM: Xid (PCI:0000:cb:00): 79, {cause}", "xid.79"),),
                    candidates=(), actions=tuple(acts))


class RecordingRunner:
    """A command runner that remembers every command it passes to ``inner`` (a real runner) and
    can call a hook after each one."""

    MUTATING = ("update", "requeue", "requeuehold", "release", "hold")

    def __init__(self, inner: CommandRunner, after: Callable[[CommandResult], None] | None = None) -> None:
        self.inner = inner
        self.after = after
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        res = self.inner.run(argv, timeout_s)
        self.calls.append(tuple(argv))
        if self.after is not None:
            self.after(res)
        return res

    def mutating(self) -> list[tuple[str, ...]]:
        """The commands that change cluster state (scancel, scontrol update/requeue/hold/...)."""
        return [c for c in self.calls if c[0] == "scancel"
                or (c[0] == "scontrol" and len(c) > 1 and c[1] in self.MUTATING)]
