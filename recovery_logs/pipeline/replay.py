"""Replay: read paths (or given batches) into one :class:`Engine`, rank incidents, write outputs.

``replay(paths, options) -> ReplayResult``: record only, never acts. Many small files are
coalesced into larger batches before they are fed; output files go through
:mod:`recovery_logs.pipeline.outputs`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.config import EngineConfig
from recovery_logs.errors import InputError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.outputs import prepare_out_dir, write_events, write_outputs
from recovery_logs.records import Incident
from recovery_logs.remediation.plan import RECORD_ONLY
from recovery_logs.schema import empty_quarantine, own_strings
from recovery_logs.sources.accounting import load_accounting, sacct_range
from recovery_logs.sources.files import iter_batches
from recovery_logs.sources.prefetch import prefetch
from recovery_logs.sources.read_common import Batch, ReadOptions
from recovery_logs.textsafe import json_dumps
from recovery_logs.timeutil import ns_to_iso

__all__ = ["COALESCE_ROWS", "QUARANTINE_KEYS", "QuarantineKeeper", "ReplayOptions", "ReplayResult", "finish_replay",
           "replay", "replay_summary", "resolve_line_scores"]


@dataclass(frozen=True)
class ReplayOptions:
    read: ReadOptions | None = None      # None: defaults
    config: EngineConfig = field(default_factory=EngineConfig)
    out_dir: Path | None = None
    quarantine_cap: int = 10_000         # quarantine rows kept per reason; the rest are only counted
    progress: Any = None                 # a callable(stats: Counter) called after every batch, or None
    # Slurm accounting to join findings against: a saved sacct --json / sacct -P dump (path), the
    # string "sacct" (ask the live sacct for the replayed range), or an allocations frame
    accounting: Any = None
    # batches read ahead in a background thread while the engine works on the previous one
    # (sources.prefetch; 0: read in this thread). Only for paths read here, not given ``batches``.
    read_ahead: int = 1


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    incidents: list[Incident]
    quarantine: pl.DataFrame
    engine: Engine
    outputs: dict[str, Path] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "incidents": [i.to_dict() for i in self.incidents]}

    def to_json(self) -> str:
        return json_dumps(self.to_dict(), indent=2, sort_keys=False)   # C1/bidi escaped too


COALESCE_ROWS = 200_000


QUARANTINE_KEYS = ("malformed", "invalid_utf8", "oversized", "bad_timestamp", "out_of_order", "duplicates",
                   "format_mismatch")


class QuarantineKeeper:
    """Quarantine rows kept per reason up to a cap; beyond it rows are only counted. A flood of one
    bad line (a 2 GiB gzip of duplicates) then costs neither memory nor a huge quarantine.jsonl."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.parts: list[pl.DataFrame] = []

    def add(self, q: pl.DataFrame) -> None:
        if q.height == 0:
            return
        room: dict[str, int] = {}
        cut = False
        for r, n in q.group_by("reason").len().iter_rows():
            take = min(n, max(0, self.cap - self.kept[r]))
            room[r] = take
            self.kept[r] += take
            self.dropped[r] += n - take
            cut = cut or take < n
        if cut:     # the first rows of each reason in this batch, up to what the cap leaves
            q = q.filter(pl.int_range(pl.len()).over("reason") < pl.col("reason").replace_strict(
                room, default=0, return_dtype=pl.Int64))
        if q.height:
            self.parts.append(own_strings(q))

    def frame(self) -> pl.DataFrame:
        return pl.concat(self.parts) if self.parts else empty_quarantine()


def resolve_line_scores(opts: ReplayOptions) -> ReplayOptions:
    """``config.line_scores`` None (auto): on when a site line format reads the input, else off.

    Line scores need every line's template: a reader-side prefilter that skips lines no rule can
    match must be off whenever the resolved ``config.line_scores`` is True (``watch`` drops its
    LogsQL rule prefilter then)."""
    if opts.config.line_scores is not None:
        return opts
    site = bool(opts.read is not None and opts.read.line_formats)
    return replace(opts, config=opts.config.with_(line_scores=site))


def replay(paths: Sequence[str | Path], options: ReplayOptions | None = None,
           batches: Iterable[Batch] | None = None, engine: Engine | None = None) -> ReplayResult:
    """Read ``paths`` (or the given ``batches``), detect, attribute and plan; record, never act."""

    opts = resolve_line_scores(options or ReplayOptions())
    read_opts = opts.read or ReadOptions()
    eng = engine or Engine(opts.config)
    t0 = time.perf_counter()
    stats: Counter[str] = Counter()
    keeper = QuarantineKeeper(opts.quarantine_cap)
    writer = None
    out_dir = Path(opts.out_dir) if opts.out_dir else None
    if out_dir is not None:
        prepare_out_dir(out_dir)
    source = batches if batches is not None else prefetch(iter_batches(list(paths), read_opts), opts.read_ahead)
    pending: list[pl.DataFrame] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal writer, pending_rows
        if not pending:
            return
        ev = pl.concat(pending) if len(pending) > 1 else pending[0]
        pending.clear()
        pending_rows = 0
        eng.feed(ev)
        if out_dir is not None:
            writer = write_events(out_dir, ev, writer)

    try:
        for b in source:
            stats.update(b.stats)
            keeper.add(b.quarantine)
            if opts.progress is not None:
                opts.progress(stats)
            if b.events.height:   # many small files: coalesce into fewer, larger batches
                pending.append(b.events)
                pending_rows += b.events.height
                if pending_rows >= COALESCE_ROWS:
                    flush()
        flush()
    finally:
        if batches is None:
            source.close()     # type: ignore[attr-defined]  # a generator: stops the read-ahead thread
        if writer is not None:
            writer.close()
    return finish_replay(eng, stats, keeper, paths, out_dir, t0, accounting=opts.accounting)


def finish_replay(eng: Engine, stats: Counter[str], keeper: QuarantineKeeper, paths: Sequence[str | Path],
                  out_dir: Path | None, t0: float, accounting: Any = None) -> ReplayResult:
    """Everything read is in ``eng``: rank incidents, summarise, write the outputs (shared with the
    sharded replay of ``pipeline.scale``)."""
    if eng.stats["events"] == 0:
        raise InputError("no events in the input: nothing to replay",
                         path=", ".join(str(p) for p in paths) or None,
                         lines=stats.get("lines", 0), quarantined=sum(keeper.kept.values()),
                         unreadable=stats.get("unreadable", 0))
    if eng.max_time_ns is not None:
        eng.advance(eng.max_time_ns, final=True)
    if accounting is not None:
        eng.set_accounting(_accounting_frame(accounting, eng))
        stats["accounting_rows"] = eng.allocations.height if eng.allocations is not None else 0
    incidents = eng.incidents(RECORD_ONLY)
    q = keeper.frame()
    summary = replay_summary(stats, eng, incidents, q)
    summary["quarantine_not_kept"] = int(sum(keeper.dropped.values()))
    res = ReplayResult(summary=summary, incidents=incidents, quarantine=q, engine=eng,
                       elapsed_s=time.perf_counter() - t0)
    if out_dir is not None:
        outputs = write_outputs(res, out_dir)
        if (out_dir / "events.parquet").exists():
            outputs["events"] = out_dir / "events.parquet"
        res.outputs = outputs
    return res


def _accounting_frame(acc: Any, eng: Engine) -> pl.DataFrame:
    if isinstance(acc, pl.DataFrame):
        return acc
    if str(acc) == "sacct":
        lo = eng.windows.select(pl.col("first_time").min().dt.epoch("ns")).item() if eng.windows.height else None
        hi = eng.max_time_ns
        if lo is None or hi is None:
            return sacct_range(0, 0)
        return sacct_range(int(lo), int(hi))
    return load_accounting(acc)


def replay_summary(stats: Counter[str], eng: Engine, incidents: list[Incident], q: pl.DataFrame) -> dict[str, Any]:
    """The ``summary`` of a replay: read counters, the engine's totals, the incidents'."""
    # counts and first time that do not depend on when progress rows were compacted (batch sizes,
    # or shards in pipeline.scale): every rule finding matched, the earliest event fed
    first = eng.min_time_ns
    return {
        "files": int(stats.get("files", 0)),
        "lines": int(stats.get("lines", 0)),
        "events": int(eng.stats["events"]),
        "malformed": int(stats.get("malformed", 0)),
        **{k: int(stats.get(k, 0)) for k in QUARANTINE_KEYS if k != "malformed"},
        "quarantined": int(q.height),
        "unreadable": int(stats.get("unreadable", 0)),
        "truncated": int(stats.get("truncated", 0)),
        "multiline_joined": int(stats.get("multiline_joined", 0)),
        "time_inferred": int(stats.get("time_inferred", 0)),
        "findings": int(eng.stats["findings"]),
        "incidents": len(incidents),
        "drain_proposals": sum(1 for i in incidents for a in i.actions if a.kind == "drain_node"),
        "first_event": ns_to_iso(first),
        "last_event": ns_to_iso(eng.max_time_ns),
        "rules": len(eng.pack.rules),
        **({"accounting_rows": int(stats["accounting_rows"])} if "accounting_rows" in stats else {}),
    }
