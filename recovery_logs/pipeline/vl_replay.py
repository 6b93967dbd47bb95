"""``replay --source victorialogs://`` with the work pushed down to the server.

The engine needs most lines only as a count: windows (lines, first and last time per host, job
and window) and job spans are associative sums/minima/maxima (``windows.merge_windows``), so
the server counts them (``stats by (host fields, job fields, _time:WINDOW) count(), min(_time),
max(_time)``, :func:`recovery_logs.sources.vl_history.line_counts`) without sending a row. Rows
are fetched only where the engine needs the text: lines a rule can match (the pack's
:func:`~recovery_logs.detectors.literals.needed_literals`, the same derivation as the local
file prefilter) and the NCCL/NVML lines enrichment reads (:data:`ENRICH_LITERALS`). Those are
read as sliced concurrent exports parsed by Polars (``history_batches_fast``) and fed with
``Engine.count_lines = False``; the counts come in as one :class:`EnginePart`. The incidents
equal those of a replay of every row (tested on the real server), because

* a line without any needed literal produces no finding, no address and no GPU record;
* counted windows merged with the fetched lines' finding windows equal the windows of all lines.

Rows the readers drop as duplicates are left out of the counts too (``count_uniq`` over a row's
identity; their number is ``summary["duplicates"]``). What differs, and is said in
``summary["pushdown"]``: ``events.parquet`` (``--out``) and the quarantine hold only the fetched lines.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from recovery_logs.detectors.literals import logsql_any, needed_literals
from recovery_logs.detectors.rulepack import RulePack
from recovery_logs.pipeline.engine import Engine, EnginePart
from recovery_logs.pipeline.replay import ReplayOptions, ReplayResult, replay
from recovery_logs.schema import EVENT_SCHEMA, empty_findings, empty_quarantine
from recovery_logs.sources.read_common import Batch, ReadOptions
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.sources.vl_history import history_batches_fast, line_counts
from recovery_logs.windows import counted_spans, counted_windows

__all__ = ["ENRICH_LITERALS", "PushdownPlan", "plan_pushdown", "replay_source"]

NS = 1_000_000_000

# Substrings every line the engine reads beyond the rules contains: NCCL address lines
# (pipeline.enrich._ADDR_RE: "NCCL INFO Bootstrap : Using ...", "NET/Socket : Using", "NET/IB : Using"),
# NCCL init lines with a bus id (inventory._NCCL_BUS_RE: "busId") and NVML inventory lines
# (inventory.inventory_records: messages starting "NVML gpu="). tests/pipeline/test_vl_replay.py
# checks each reader finds nothing in lines without them.
ENRICH_LITERALS = ("Bootstrap : Using", "NET/Socket : Using", "NET/IB : Using", "busId", "NVML gpu=")


@dataclass(frozen=True)
class PushdownPlan:
    """The LogsQL a push-down replay sends: ``count`` (every line of the scope, counted per
    window) and ``fetch`` (the lines whose text is needed; None: every line is)."""

    count: str
    fetch: str | None

    def explain(self) -> list[str]:
        return [f"count: {self.count} | stats by (<host fields>, <job fields>, _time:WINDOW) count(), min(_time), "
                "max(_time)", f"fetch: {self.fetch if self.fetch is not None else self.count}"]


def _scoped(query: str, flt: str) -> str:
    q = query.strip()
    return flt if q in ("", "*") else f"({q}) AND {flt}"


def plan_pushdown(pack: RulePack, query: str = "*", phrase: bool = True) -> PushdownPlan:
    lits = needed_literals(pack, ENRICH_LITERALS)
    count = query.strip() or "*"
    return PushdownPlan(count=count, fetch=None if lits is None else _scoped(count, logsql_any(lits, phrase=phrase)))


def replay_source(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                  options: ReplayOptions | None = None, pushdown: bool = True, slice_rows: int = 250_000,
                  workers: int = 2, phrase: bool = True) -> ReplayResult:
    """Replay ``[start, end]`` of ``query`` from a VictoriaLogs server (``pushdown=False``: read
    every row, as ``history_batches_fast`` does)."""
    opts = options or ReplayOptions()
    read = opts.read or ReadOptions()
    eng = Engine(opts.config)
    plan = plan_pushdown(eng.pack, query, phrase=phrase)
    if not pushdown or plan.fetch is None:
        return replay([], opts, batches=history_batches_fast(client, query, start_ns, end_ns, read,
                                                             slice_rows=slice_rows, workers=workers), engine=eng)
    eng.count_lines = False
    bucket_ns = int(round(eng.config.window_s * 1e6)) * 1000      # windows truncate to whole µs
    box: dict[str, Any] = {}

    def count() -> None:
        try:
            box["counts"] = line_counts(client, plan.count, start_ns, end_ns, bucket_ns, read)
        except BaseException as exc:    # re-raised in the reading thread
            box["error"] = exc

    th = threading.Thread(target=count, name="vl-line-counts", daemon=True)
    th.start()
    fetched = [0]

    def batches() -> Iterator[Batch]:
        for b in history_batches_fast(client, plan.fetch or "*", start_ns, end_ns, read, slice_rows=slice_rows,
                                      workers=workers, plan_query=plan.count):
            st = collections.Counter(b.stats)
            n = st.pop("lines", 0)
            st.pop("duplicates", None)      # the server's count of them covers every line (below)
            fetched[0] += n
            st["pushdown_fetched"] += n
            yield Batch(b.events, b.quarantine, st)
        th.join()
        if "error" in box:
            raise box["error"]
        counts: pl.DataFrame = box["counts"]
        total = int(counts["lines"].sum()) if counts.height else 0
        tmax = int(counts["last"].max()) if counts.height else None   # type: ignore[arg-type]  # polars aggregate
        eng.absorb(EnginePart(empty_findings(), counted_windows(counts), counted_spans(counts), {}, tmax, total))
        dups = int(counts["duplicates"].sum()) if counts.height else 0
        yield Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(),
                    collections.Counter(lines=total + dups, duplicates=dups))

    res = replay([], opts, batches=batches(), engine=eng)
    res.summary["pushdown"] = {"lines_counted": int(res.summary["events"]), "lines_fetched": fetched[0],
                               "count_query": plan.count, "fetch_query": plan.fetch}
    return res
