"""Shared pieces of the readers: options, the Batch record, and the record finisher.

The finisher turns "records" (one row per future event, with integer-ns ``ts``) into an
EVENT_SCHEMA frame and does what every format shares, in this order:

1. ``bad_timestamp``: a record whose first line carries a timestamp field that does not parse
   keeps its inferred time and is also quarantined.
2. ``out_of_order``: a record with its own time earlier than the previous record with its own
   time in the same stream (``stream_id`` when known, else the file) is kept and quarantined.
3. ``duplicate``: a record with its own time whose (host, time, message) was already seen in
   this read is dropped and quarantined. The seen-set is bounded: hashes (64-bit) older than
   ``DEDUP_WINDOW_NS`` before the newest time seen are forgotten.
4. ``seq``: consecutive integers in reading order.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from recovery_logs.schema import EVENT_SCHEMA, QUARANTINE_SCHEMA, QuarantineReason, conform

DEFAULT_HOST_FIELDS = ("host", "hostname", "host.name", "_HOSTNAME")

# host from a path: `host=gpu-n01/` anywhere, else a host-like name (letters, digits, dashes, with a
# digit; not job-/slurm-/rank-… ids) as the file name's stem or its parent directory:
# `nodes/gpu-n01/kern.log`, `gpu-n01/…`, `gpu-n01.kern.log`, `job-1234/gpu-n01.out`.
DEFAULT_PATH_HOST_REGEX = (
    r"(?:^|/)host=([^/]+)"
    r"|(?:^|/)(?!(?:job|jobs|slurm|rank|step|run|pytest|test|tmp|batch|array)[-_]?\d)"
    r"([A-Za-z][A-Za-z0-9-]*\d[A-Za-z0-9-]*)(?=(?:\.[^/]*)?$|/[^/]+$)"
)
# job from a path: `slurm-1234.out`, `job-1234/`, `job_1234`, `jobs/1234/`, `job=1234`.
DEFAULT_PATH_JOB_REGEX = r"(?:slurm-|job[-_=]?|jobs/)(\d+)(?![0-9])"

MAX_LINE_BYTES = 1 << 20
QUARANTINE_RAW_BYTES = 4096
DEDUP_WINDOW_NS = 3600 * 1_000_000_000

STAT_KEYS = ("files", "bytes", "lines", "events", "malformed", "invalid_utf8", "oversized", "bad_timestamp",
             "out_of_order", "duplicates", "multiline_joined", "time_inferred", "format_mismatch")


@dataclass
class Batch:
    """One batch of a read: events (EVENT_SCHEMA), quarantine (QUARANTINE_SCHEMA), counts."""

    events: pl.DataFrame
    quarantine: pl.DataFrame
    stats: collections.Counter = field(default_factory=collections.Counter)


@dataclass(frozen=True)
class ReadOptions:
    """How to read inputs.

    ``fmt``: auto|vl-jsonl|journald|syslog|dmesg|job|parquet. ``host``/``job`` override what lines
    and paths say. ``year`` for RFC3164/glog times (default: the file's mtime year). ``tz``: zone of
    times written without one. ``boot_time_ns`` turns relative dmesg uptimes into absolute times
    (default: estimated from the file's mtime and last uptime, flagged ``time_inferred``).
    ``batch_lines``: about how many lines one batch holds. ``path_host_regex`` /
    ``path_job_regex``: Python regexes searched in the path (posix form); the last match's first
    non-empty group is used (defaults: ``DEFAULT_PATH_HOST_REGEX``, ``DEFAULT_PATH_JOB_REGEX``).
    ``dedupe``: with one-second syslog times, identical lines repeated within a second (an XID
    storm) are "exact duplicates" too; set False to keep every line.
    """

    fmt: str = "auto"
    host: str | None = None
    job: str | None = None
    host_fields: tuple[str, ...] = DEFAULT_HOST_FIELDS
    year: int | None = None
    tz: str = "UTC"
    boot_time_ns: int | None = None
    batch_lines: int = 200_000
    path_host_regex: str = DEFAULT_PATH_HOST_REGEX
    path_job_regex: str = DEFAULT_PATH_JOB_REGEX
    dedupe: bool = True          # drop exact duplicates (same host, own time, message)
    # site line formats (sources.lineformat.LineFormat): the first whose path glob fits a file reads it
    line_formats: tuple[Any, ...] = ()
    # archives (``sources.archive``): read only events in [since_ns, until_ns) and on these nodes;
    # partitions (day, node) outside are never opened
    since_ns: int | None = None
    until_ns: int | None = None
    nodes: frozenset[str] | None = None
    # groups of small files are parsed in a background thread while the next group is read and the
    # previous one finished (``files.iter_batches``); the same batches either way
    parse_ahead: bool = True


def empty_quarantine() -> pl.DataFrame:
    return pl.DataFrame(schema=QUARANTINE_SCHEMA)


def quarantine_frame(file: str, lines: list[int], reason: str, raws: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"file": [file] * len(lines), "line": lines, "reason": [reason] * len(lines),
                         "raw": raws}, schema=QUARANTINE_SCHEMA)


def strip_nul_prefix(lines: pl.DataFrame, stats: collections.Counter) -> pl.DataFrame:
    """Drop the NUL bytes a line starts with (``text`` column): a crash leaves a stretch of NULs where
    the file system had promised data, and the first line written after the reboot follows them on the
    same line. The line itself is kept and parsed; ``nul_prefixed`` counts the lines that had them."""
    nul = lines["text"].str.starts_with("\x00")
    n = int(nul.sum())
    if not n:
        return lines
    stats["nul_prefixed"] += n
    return lines.with_columns(pl.col("text").str.strip_chars_start("\x00"))


def cut_raw(expr: pl.Expr) -> pl.Expr:
    """Quarantine ``raw``: at most ~4 KiB of the text."""
    return expr.str.slice(0, QUARANTINE_RAW_BYTES)


class Deduper:
    """Bounded memory of (host, time, message, raw line) hashes of records with their own time."""

    def __init__(self, window_ns: int = DEDUP_WINDOW_NS, enabled: bool = True) -> None:
        self.window_ns = window_ns
        self.enabled = enabled
        self._seen = pl.DataFrame(schema={"h": pl.UInt64, "ts": pl.Int64})
        self._max_ts: int | None = None

    def mark(self, df: pl.DataFrame) -> pl.Series:
        """Boolean Series: True where the row (columns host, ts, message, own_time) is a duplicate."""
        if not self.enabled:
            return pl.Series("dup", [False] * df.height, dtype=pl.Boolean)
        # The raw first line is part of the key: syslog has whole seconds, so an XID storm repeats the
        # same (host, second, message) many times, but each line keeps its own dmesg uptime.
        key = [pl.col("host"), pl.col("ts"), pl.col("message")]
        if "raw_first" in df.columns:
            key.append(pl.col("raw_first"))
        # only records with their own time can be duplicates: hash those alone
        own = df["own_time"].fill_null(False)
        n_own = int(own.sum())
        out = pl.Series("dup", [], dtype=pl.Boolean).extend_constant(False, df.height)
        if n_own == 0:
            return out
        sub = df.filter(own) if n_own < df.height else df
        cand = sub.select(pl.struct(key).hash(seed=7).alias("h"), pl.col("ts"))
        # a duplicate has the same timestamp (it is part of the key): only compare within this
        # batch's time range, not against everything seen in the window
        lo, hi = cand.select(pl.col("ts").min().alias("lo"), pl.col("ts").max().alias("hi")).row(0)
        seen = self._seen if lo is None else self._seen.filter(pl.col("ts").is_between(lo, hi))
        first = cand.select((pl.col("h").is_in(seen["h"].implode()) | ~pl.col("h").is_first_distinct())
                            .fill_null(False).alias("dup"))["dup"]
        new = cand.filter(~first).select("h", "ts")
        if new.height:
            self._seen = pl.concat([self._seen, new])
            mx = new["ts"].max()
            self._max_ts = mx if self._max_ts is None else max(self._max_ts, mx)  # type: ignore[type-var,assignment]  # polars literal
            if self._seen.height > 4 * max(new.height, 1024):
                self._seen = self._seen.filter(pl.col("ts") >= self._max_ts - self.window_ns)  # type: ignore[operator]  # set above
        return first if n_own == df.height else out.scatter(own.arg_true(), first)


class Finisher:
    """Per-stream state that turns records into events + quarantine (see the module docstring)."""

    def __init__(self, file: str, seq_start: int, dedup: Deduper | None = None) -> None:
        self.file = file
        self.next_seq = seq_start
        self.dedup = dedup if dedup is not None else Deduper()
        self._last_ts: dict[str, int] = {}

    def finish(self, rec: pl.DataFrame, stats: collections.Counter) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``rec`` columns: ts (Int64), own_time (Bool), bad_ts (Bool), raw_first (Str), ooo_key (Str),
        plus EVENT_SCHEMA columns except time/seq/time_inferred. Rows in reading order."""
        if rec.height == 0:
            return pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine()
        quar = []
        if "mismatch" in rec.columns:   # site line formats: a line that does not fit is kept AND quarantined
            mm = rec.filter(pl.col("mismatch"))
            if mm.height:
                stats["format_mismatch"] += mm.height
                quar.append(mm.select(pl.col("file"), pl.col("line"), pl.lit(QuarantineReason.FORMAT_MISMATCH.value)
                                      .alias("reason"), cut_raw(pl.col("raw_first")).alias("raw")))
        bad = rec.filter(pl.col("bad_ts"))
        if bad.height:
            stats["bad_timestamp"] += bad.height
            quar.append(bad.select(pl.col("file"), pl.col("line"), pl.lit(QuarantineReason.BAD_TIMESTAMP.value)
                                   .alias("reason"), cut_raw(pl.col("raw_first")).alias("raw")))
        rec = self._out_of_order(rec)
        ooo = rec.filter(pl.col("ooo"))
        if ooo.height:
            stats["out_of_order"] += ooo.height
            quar.append(ooo.select(pl.col("file"), pl.col("line"), pl.lit(QuarantineReason.OUT_OF_ORDER.value)
                                   .alias("reason"), cut_raw(pl.col("raw_first")).alias("raw")))
        dup = self.dedup.mark(rec)
        if dup.any():
            d = rec.filter(dup)
            stats["duplicates"] += d.height
            quar.append(d.select(pl.col("file"), pl.col("line"), pl.lit(QuarantineReason.DUPLICATE.value)
                                 .alias("reason"), cut_raw(pl.col("raw_first")).alias("raw")))
            rec = rec.filter(~dup)
        n = rec.height
        ev = rec.with_columns(
            time=pl.col("ts").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"),
            time_inferred=~pl.col("own_time"),
            seq=pl.int_range(self.next_seq, self.next_seq + n, dtype=pl.Int64),
        )
        self.next_seq += n
        stats["events"] += n
        stats["time_inferred"] += int(n - rec["own_time"].sum())
        q = pl.concat([conform(x, QUARANTINE_SCHEMA) for x in quar]) if quar else empty_quarantine()
        return conform(ev, EVENT_SCHEMA), q

    def _out_of_order(self, rec: pl.DataFrame) -> pl.DataFrame:
        rec = rec.with_row_index("_i")
        own = rec.filter(pl.col("own_time") & pl.col("ts").is_not_null()).select("_i", "ooo_key", "ts")
        if own.height == 0:
            return rec.with_columns(ooo=pl.lit(False)).drop("_i")
        state = pl.DataFrame({"ooo_key": list(self._last_ts), "_prev0": list(self._last_ts.values())},
                             schema={"ooo_key": pl.String, "_prev0": pl.Int64})
        own = own.join(state, on="ooo_key", how="left").sort("_i").with_columns(
            _prev=pl.col("ts").shift(1).over("ooo_key"))
        own = own.with_columns(ooo=pl.coalesce("_prev", "_prev0").gt(pl.col("ts")).fill_null(False))
        last = own.group_by("ooo_key").agg(pl.col("ts").last())
        self._last_ts.update(dict(zip(last["ooo_key"].to_list(), last["ts"].to_list(), strict=True)))
        return rec.join(own.select("_i", "ooo"), on="_i", how="left").with_columns(
            pl.col("ooo").fill_null(False)).sort("_i").drop("_i")
