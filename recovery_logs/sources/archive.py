"""An archive of events for months of history: Parquet partitioned by day and node (zstd).

Layout (``recovery-logs archive INPUT... --out DIR``)::

    DIR/_recovery_logs_archive.json          marker: format, schema version, what was archived
    DIR/day=2026-11-29/node=gpu-n01/part-000003.parquet
    DIR/day=2026-11-29/node=_none_/…         events without a host

Files hold whole EVENT_SCHEMA rows, sorted by (time, seq). Node names are data: the directory
name is the percent-encoded node (``urllib.parse.quote``, nothing but ``[A-Za-z0-9._~-]`` and
``%XX``; ``.``/``..`` encoded too), so no node name can leave its day directory.

Reading an archive (a directory with the marker, given to ``replay``/``backtest`` like any path)
prunes partitions by ``ReadOptions.since_ns``/``until_ns`` (day directories) and ``nodes`` (node
directories) before opening a file, filters rows to the exact range, and yields the events day by
day in (time, seq) order with their archived ``seq`` — so a backtest of one week reads one week,
and its result equals a replay of the original logs (same events; tested). An archive is read on
its own (``seq`` must stay unique in a run): mixing it with other inputs is an InputError.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import polars as pl

from recovery_logs.errors import InputError
from recovery_logs.schema import EVENT_SCHEMA, SCHEMA_VERSION, conform
from recovery_logs.sources.read_common import Batch, ReadOptions, empty_quarantine

__all__ = ["ARCHIVE_FORMAT", "MARKER", "archive_batches", "archive_partitions", "is_archive", "node_dir",
           "write_archive"]

MARKER = "_recovery_logs_archive.json"
ARCHIVE_FORMAT = "recovery-logs-archive/1"
NONE_NODE = "_none_"
DAY_NS = 86_400 * 1_000_000_000


def node_dir(host: str | None) -> str:
    """The directory name of a node's partition (path-safe whatever the name)."""
    if host is None or host == "":
        return "node=" + NONE_NODE
    q = quote(host, safe="")
    if q in (".", ".."):
        q = q.replace(".", "%2E")
    if q == NONE_NODE:
        q = "%5Fnone%5F"
    return "node=" + q


def _day(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).strftime("%Y-%m-%d")


def is_archive(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


class ArchiveWriter:
    """Appends event batches to an archive directory (one file per batch and partition)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        if out.exists() and any(out.iterdir()) and not is_archive(out):
            raise InputError("archive: the output directory exists and is not an archive", path=str(out))
        out.mkdir(parents=True, exist_ok=True)
        meta = json.loads((out / MARKER).read_text()) if is_archive(out) else {}
        self._part = int(meta.get("next_part", 0))
        self.events = int(meta.get("events", 0))
        self.first_ns = meta.get("first_ns")
        self.last_ns = meta.get("last_ns")

    def write(self, events: pl.DataFrame) -> None:
        ev = events.filter(pl.col("time").is_not_null())
        if ev.height == 0:
            return
        ev = ev.with_columns(_day=pl.col("time").dt.strftime("%Y-%m-%d"))
        for (day, host), part in ev.group_by(["_day", "host"], maintain_order=True):
            d = self.out / f"day={day}" / node_dir(host)
            d.mkdir(parents=True, exist_ok=True)
            part.drop("_day").sort(["time", "seq"]).write_parquet(
                d / f"part-{self._part:06d}.parquet", compression="zstd", statistics=True)
            self._part += 1
        t = ev.select(pl.col("time").min().dt.epoch("ns").alias("a"), pl.col("time").max().dt.epoch("ns").alias("b"))
        a, b = t.row(0)
        self.first_ns = a if self.first_ns is None else min(self.first_ns, a)
        self.last_ns = b if self.last_ns is None else max(self.last_ns, b)
        self.events += ev.height

    def close(self) -> dict:
        meta = {"format": ARCHIVE_FORMAT, "schema_version": SCHEMA_VERSION, "events": self.events,
                "first_ns": self.first_ns, "last_ns": self.last_ns, "next_part": self._part,
                "partitioning": ["day", "node"], "compression": "zstd"}
        tmp = self.out / (MARKER + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, self.out / MARKER)
        return meta


def write_archive(batches: Iterable[Batch], out: str | Path) -> dict:
    """Append the events of ``batches`` (``files.iter_batches`` of any input) to the archive ``out``.
    Returns the marker's content plus the read counters."""
    w = ArchiveWriter(Path(out))
    stats: collections.Counter = collections.Counter()
    for b in batches:
        stats.update(b.stats)
        w.write(b.events)
    meta = w.close()
    return {**meta, "read": dict(stats)}


def archive_partitions(root: Path, opts: ReadOptions) -> list[tuple[str, list[Path]]]:
    """(day, files) in day order, pruned by the time range and node set of ``opts``."""
    lo = _day(opts.since_ns) if opts.since_ns is not None else None
    hi = _day(opts.until_ns - 1) if opts.until_ns is not None else None
    want = {node_dir(n) for n in opts.nodes} if opts.nodes is not None else None
    out = []
    for dd in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("day=")):
        day = dd.name[4:]
        if (lo is not None and day < lo) or (hi is not None and day > hi):
            continue
        files = [f for nd in sorted(dd.iterdir()) if nd.is_dir() and (want is None or nd.name in want)
                 for f in sorted(nd.glob("*.parquet"))]
        if files:
            out.append((day, files))
    return out


def archive_batches(root: Path, opts: ReadOptions) -> Iterator[Batch]:
    """The events of an archive, day by day in (time, seq) order, exactly as they were archived
    (their ``seq`` too: the reader already numbered, deduplicated and quarantined them)."""
    parts = archive_partitions(root, opts)
    if not parts:
        yield Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(), collections.Counter(files=0))
    for _day_name, files in parts:
        # parts written before a column was added to the schema (the event ``level``) read as null there
        lf = pl.scan_parquet(files, schema=EVENT_SCHEMA, missing_columns="insert", extra_columns="ignore")
        if opts.since_ns is not None:
            lf = lf.filter(pl.col("time").dt.epoch("ns") >= opts.since_ns)
        if opts.until_ns is not None:
            lf = lf.filter(pl.col("time").dt.epoch("ns") < opts.until_ns)
        if opts.nodes is not None:
            lf = lf.filter(pl.col("host").is_in(sorted(opts.nodes)))
        day = conform(lf.sort(["time", "seq"]).collect(), EVENT_SCHEMA)
        st: collections.Counter = collections.Counter(files=len(files), lines=day.height, events=day.height,
                                                      input_bytes=sum(f.stat().st_size for f in files))
        step = max(1, opts.batch_lines)
        for lo in range(0, max(day.height, 1), step):
            yield Batch(day.slice(lo, step), empty_quarantine(), st)
            st = collections.Counter()
