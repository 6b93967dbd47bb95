"""Many small files, one pass: the per-file state of ``TextParser`` carried as columns.

A fleet directory holds thousands of small files (a kernel log, a slurmd log and a job output per
node). Parsing each with its own ``TextParser`` costs ~80 small Polars operations per file, and
the per-file fixed cost dominates. ``parse_many`` reads a group of whole files as one frame with a
``_fid`` column (the file's index in reading order) and the per-file values as columns (year,
rollover bound and mtime, source kind from the name, dmesg boot time, host and job from the path),
so the group is parsed by a few large operations: one per format present.

The result is the same as reading each file alone with ``TextParser.feed(data, final=True)``
(which is the same as any chunking of it): multi-line joining never crosses files (the stream key
starts with ``_fid``), time inference (forward fill, the head fill) is per file, out-of-order is
per file (as before), duplicates are found across files in reading order (as before) and ``seq``
is consecutive in reading order. Quarantine rows come file by file, in line order.
"""

from __future__ import annotations

import collections
import re
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from recovery_logs.schema import QuarantineReason
from recovery_logs.sources.formats import (
    ParseContext,
    file_source_kind,
    grep_lead,
    join_wraps,
    may_be_indented_paste,
    parse_lines,
    paste_indent,
    strip_grep_lead,
    strip_paste_indent,
    wrap_widths,
)
from recovery_logs.sources.read_common import (
    MAX_LINE_BYTES,
    QUARANTINE_RAW_BYTES,
    Batch,
    Deduper,
    Finisher,
    ReadOptions,
    cut_raw,
    empty_quarantine,
    strip_nul_prefix,
)
from recovery_logs.sources.read_text import (
    DETECT_BYTES,
    HEAD_HOLD,
    _decode,
    _oversized_raw,
    group_records,
    path_field,
)

__all__ = ["GROUP_BYTES", "GROUP_FILES", "SMALL_FILE_BYTES", "Prepared", "WholeFile", "finish_many", "parse_many",
           "prepare_many"]

SMALL_FILE_BYTES = 8 << 20     # a file up to this size (inflated; and up to the chunk size) is read whole
GROUP_FILES = 20_000           # files per group at most
GROUP_BYTES = 12 << 20         # bytes per group at most (and at most one chunk): bounds the parse's memory

_UPTIME = re.compile(rb"^\[\s*(\d+)\.(\d+)\]", re.M)


@dataclass
class WholeFile:
    """One file read whole: its path, its (inflated) bytes, its mtime and detected format."""

    path: str
    data: bytes
    mtime_ns: int
    fmt: str


def _boot_estimate(data: bytes, mtime_ns: int) -> int:
    """As ``files._dmesg_boot_estimate``: mtime minus the last uptime in the last 64 KiB."""
    hits = _UPTIME.findall(data[-65536:])
    if not hits:
        return mtime_ns
    sec, frac = hits[-1]
    return mtime_ns - (int(sec) * 1_000_000_000 + int(frac.ljust(9, b"0")[:9]))


def _file_table(files: Sequence[WholeFile], opts: ReadOptions) -> pl.DataFrame:
    rows = []
    for fid, f in enumerate(files):
        year = opts.year or _time.gmtime(f.mtime_ns // 1_000_000_000).tm_year
        roll = None if opts.year else f.mtime_ns + 2 * 86_400 * 1_000_000_000
        boot: int | None = opts.boot_time_ns
        binf = False
        if f.fmt == "dmesg" and boot is None:
            boot, binf = _boot_estimate(f.data, f.mtime_ns), True
        rows.append((fid, str(year), roll, file_source_kind(f.path), boot, binf, f.path,
                     path_field(f.path, opts.path_host_regex) if opts.path_host_regex else None,
                     path_field(f.path, opts.path_job_regex) if opts.path_job_regex else None, f.mtime_ns))
    return pl.DataFrame(rows, orient="row", schema={
        "_fid": pl.Int64, "_year": pl.String, "_roll": pl.Int64, "_fkind": pl.String, "_boot": pl.Int64,
        "_binf": pl.Boolean, "_path": pl.String, "_phost": pl.String, "_pjob": pl.String, "_mtime": pl.Int64})


def _lines(files: Sequence[WholeFile], stats: collections.Counter, quar: list[pl.DataFrame]) -> pl.DataFrame:
    """(_fid, lineno, text) of every line of every file, as ``TextParser._split`` makes them."""
    blobs: list[bytes | None] = []
    ends_nl: list[bool] = []   # the file's last line ends in "\n": the empty piece split leaves after it is dropped
    for f in files:             # (not cut off the bytes here: that would copy every file once more)
        d = f.data
        blobs.append(d if d else None)
        ends_nl.append(d.endswith(b"\n"))
        stats["bytes"] += len(d)
    try:     # valid UTF-8 (the usual case): Arrow validates it without Python strings
        text = pl.Series("text", blobs, dtype=pl.Binary).cast(pl.String)
    except pl.exceptions.PolarsError:
        vals: list[str | None] = []
        for fid, b in enumerate(blobs):
            if b is None:
                vals.append(None)
                continue
            s, bad = _decode(b)
            vals.append(s)
            if bad:
                stats["invalid_utf8"] += len(bad)
                quar.append(pl.DataFrame({"_fid": [fid] * len(bad), "line": [1 + i for i, _ in bad],
                                          "reason": QuarantineReason.INVALID_UTF8.value,
                                          "raw": [r[:QUARANTINE_RAW_BYTES] for _, r in bad]}))
        text = pl.Series("text", vals, dtype=pl.String)
    # line numbers from each file's number of lines (files are contiguous, in order): no per-file
    # window, and no second pass over the bytes to count newlines
    pieces = pl.col("text").str.split("\n")
    df = (pl.DataFrame({"_fid": pl.int_range(0, len(blobs), eager=True, dtype=pl.Int64), "text": text,
                        "_nl": pl.Series(ends_nl, dtype=pl.UInt32)})
          .filter(pl.col("text").is_not_null())
          .select("_fid", text=pieces.list.head(pieces.list.len() - pl.col("_nl"))))
    lineno = df.select(pl.int_ranges(1, pl.col("text").list.len().cast(pl.Int64) + 1, dtype=pl.Int64)).to_series()
    df = df.explode("text").with_columns(lineno.explode().alias("lineno"))
    if any(b"\r" in b for b in blobs if b is not None):
        df = df.with_columns(pl.col("text").str.strip_suffix("\r"))
    if any(b"\x00" in b for b in blobs if b is not None):
        df = strip_nul_prefix(df, stats)
    # job output pasted as an indented block: its indent stripped, as TextParser does (``paste_indent``)
    indents = {fid: pre for fid, f in enumerate(files)
               if f.fmt == "job" and may_be_indented_paste(f.data) and (pre := paste_indent(f.data[:DETECT_BYTES]))}
    if indents:
        fcol = pl.col("_fid")
        ind = fcol.replace_strict(list(indents), list(indents.values()), default="", return_dtype=pl.String)
        df = df.with_columns(text=pl.when(fcol.is_in(list(indents))).then(strip_paste_indent(pl.col("text"), ind))
                             .otherwise(pl.col("text")))
    text_files = [fid for fid, f in enumerate(files) if f.fmt != "vl-jsonl"]
    # `grep` output of log files: the file name before each line's time header stripped, as TextParser does
    grepped = [fid for fid in text_files if grep_lead(files[fid].data[:DETECT_BYTES])]
    if grepped:
        df = df.with_columns(text=pl.when(pl.col("_fid").is_in(grepped)).then(strip_grep_lead(pl.col("text")))
                             .otherwise(pl.col("text")))
    stats["lines"] += df.height
    # hard-wrapped pastes: their pieces joined back, as TextParser does (``formats.wrap_widths``)
    wraps = wrap_widths(df if len(text_files) == len(files) else df.filter(pl.col("_fid").is_in(text_files)),
                        fid="_fid", head_bytes=DETECT_BYTES) if text_files else {}
    if wraps:
        df = join_wraps(df, wraps, fid="_fid")
    over = df.filter(pl.col("text").str.len_bytes() > MAX_LINE_BYTES)
    if over.height:
        stats["oversized"] += over.height
        quar.append(pl.DataFrame({"_fid": over["_fid"], "line": over["lineno"],
                                  "reason": QuarantineReason.OVERSIZED.value,
                                  "raw": [_oversized_raw(t.encode()) for t in over["text"].to_list()]}))
        df = df.filter(pl.col("text").str.len_bytes() <= MAX_LINE_BYTES)
    return df.select("_fid", "lineno", "text")


def _fill_ids(df: pl.DataFrame, opts: ReadOptions, line_host_first: bool) -> pl.DataFrame:
    host = pl.col("host")
    if opts.host is not None:
        host = pl.lit(opts.host)
    elif line_host_first:
        host = pl.coalesce(host, pl.col("_phost"))
    else:
        host = pl.coalesce(pl.col("_phost"), host)
    job = pl.lit(opts.job) if opts.job is not None else pl.coalesce(pl.col("job_id"), pl.col("_pjob"))
    return df.with_columns(host=host.cast(pl.String), job_id=job.cast(pl.String))


def _quarantine_rows(df: pl.DataFrame, reason: str) -> pl.DataFrame:
    return df.select("_fid", pl.col("lineno").alias("line"), pl.lit(reason).alias("reason"),
                     cut_raw(pl.col("text")).alias("raw"))


def _json_records(parsed: pl.DataFrame, opts: ReadOptions, stats: collections.Counter,
                  quar: list[pl.DataFrame]) -> pl.DataFrame:
    parsed = parsed.filter(pl.col("text").str.strip_chars() != "")
    bad = parsed.filter(pl.col("malformed"))
    if bad.height:
        stats["malformed"] += bad.height
        quar.append(_quarantine_rows(bad, QuarantineReason.MALFORMED.value))
    ok = _fill_ids(parsed.filter(~pl.col("malformed")), opts, line_host_first=True)
    return ok.select(
        "_fid", pl.col("ts"), (~pl.col("ts_inferred")).alias("own_time"), pl.lit(False).alias("bad_ts"),
        pl.col("text").alias("raw_first"), pl.coalesce(pl.col("stream_id"), pl.col("_path")).alias("ooo_key"),
        "host", "job_id", "source", pl.col("_path").alias("file"), pl.col("lineno").alias("line"),
        "stream_id", "rank", "message", "level")


def _text_records(whole: pl.DataFrame, fmt: str, opts: ReadOptions, stats: collections.Counter,
                  quar: list[pl.DataFrame]) -> pl.DataFrame:
    """``TextParser._text_records`` for whole files (``final=True``), per file through ``_fid``."""
    parsed = whole.filter(~pl.col("malformed"))
    if whole.height != parsed.height:
        bad = whole.filter(pl.col("malformed"))
        stats["malformed"] += bad.height
        quar.append(_quarantine_rows(bad, QuarantineReason.MALFORMED.value))
    g = group_records(parsed, fmt, streams=False)
    # time inference, per file: forward fill, then the head fill (the first timed line's time when it is
    # within the first HEAD_HOLD lines, else the file's mtime)
    ts_line = pl.when(pl.col("ts").is_not_null()).then(pl.col("lineno"))
    g = g.join(whole.select("_fid", "_mtime", "_path", "_phost", "_pjob").unique("_fid"), on="_fid", how="left", maintain_order="left")
    g = g.with_columns(
        ff=pl.col("ts").forward_fill().over("_fid"),
        _hl=ts_line.min().over("_fid"),
        _hts=pl.col("ts").drop_nulls().first().over("_fid"),
    ).with_columns(ff=pl.col("ff").fill_null(
        pl.when(pl.col("_hl") <= HEAD_HOLD).then(pl.col("_hts")).otherwise(pl.col("_mtime"))))
    if "bad_utf8" in g.columns:
        bu = g.filter(pl.col("bad_utf8"))
        if bu.height:
            stats["invalid_utf8"] += bu.height
            quar.append(_quarantine_rows(bu, QuarantineReason.INVALID_UTF8.value))
    emit = g.filter(~pl.col("drop"))
    firsts = emit.filter(~pl.col("cont"))
    multi = emit.filter(pl.col("cont"))
    stats["multiline_joined"] += multi.height
    if multi.height:
        keys = multi.select("_fid", "gfirst").unique()
        joined = (emit.join(keys, on=["_fid", "gfirst"], how="semi")
                  .group_by(["_fid", "gfirst"]).agg(pl.col("message").str.join("\n").alias("_joined")))
        firsts = firsts.join(joined, on=["_fid", "gfirst"], how="left", maintain_order="left").with_columns(
            message=pl.coalesce("_joined", "message")).drop("_joined").sort(["_fid", "lineno"])
    firsts = _fill_ids(firsts, opts, line_host_first=fmt != "job")
    own = pl.col("ts").is_not_null() & ~pl.col("ts_inferred")
    return firsts.select(
        "_fid", pl.coalesce("ts", "ff").alias("ts"), own.alias("own_time"),
        (pl.col("has_ts") & pl.col("ts").is_null()).alias("bad_ts"),
        pl.col("text").alias("raw_first"), pl.col("_path").alias("ooo_key"),
        "host", "job_id", "source", pl.col("_path").alias("file"), pl.col("lineno").alias("line"),
        "stream_id", "rank", "message", "level")


@dataclass
class Prepared:
    """A group parsed up to its records (``prepare_many``): what ``finish_many`` completes in order."""

    table: pl.DataFrame
    records: pl.DataFrame | None
    stats: collections.Counter
    quarantine: list[pl.DataFrame]


def prepare_many(files: Sequence[WholeFile], opts: ReadOptions) -> Prepared:
    """The part of ``parse_many`` that depends on the group alone (split, per-format parse,
    multi-line records): pure, so it may run in another thread while the previous group is
    finished (``files.iter_batches`` does)."""
    stats: collections.Counter = collections.Counter(files=len(files))
    quar: list[pl.DataFrame] = []
    table = _file_table(files, opts)
    lines = _lines(files, stats, quar)
    fmts = [f.fmt for f in files]
    recs = []
    for fmt in dict.fromkeys(fmts):
        fids = [i for i, x in enumerate(fmts) if x == fmt]
        sub = lines if len(fids) == len(files) else lines.filter(pl.col("_fid").is_in(fids))
        if sub.height == 0:
            continue
        sub = sub.join(table.select("_fid", "_year", "_roll", "_fkind", "_boot", "_binf", "_phost"), on="_fid", how="left",
                       maintain_order="left")
        ctx = ParseContext(file="", year=0, tz=opts.tz, host_fields=opts.host_fields, columns=True,
                           line_host=opts.host is None)
        parsed = parse_lines(sub, fmt, ctx)
        parsed = parsed.join(table.select("_fid", "_path", "_phost", "_pjob", "_mtime"), on="_fid", how="left", maintain_order="left")
        if fmt == "vl-jsonl":
            recs.append(_json_records(parsed, opts, stats, quar))
        else:
            recs.append(_text_records(parsed, fmt, opts, stats, quar))
    rec = pl.concat(recs, how="vertical_relaxed") if recs else None
    if rec is not None and len(recs) > 1:
        rec = rec.sort(["_fid", "line"])
    return Prepared(table, rec, stats, quar)


def finish_many(prep: Prepared, seq_start: int, dedup: Deduper) -> tuple[Batch, int]:
    """Out-of-order, dedupe and ``seq`` of a prepared group (state carried across groups: call in
    reading order) -> (one Batch, the next seq)."""
    table, rec, stats, quar = prep.table, prep.records, prep.stats, list(prep.quarantine)
    fin = Finisher("", seq_start, dedup)
    if rec is not None and rec.height:
        paths = table["_path"]
        events, q = fin.finish(rec.drop("_fid"), stats)
        if q.height:
            fid_of = {p: i for i, p in enumerate(paths.to_list())}
            quar.append(q.with_columns(_fid=pl.col("file").replace_strict(fid_of, return_dtype=pl.Int64))
                        .select("_fid", "line", "reason", "raw"))
    else:
        events = fin.finish(pl.DataFrame(), stats)[0]
    if quar:
        q = (pl.concat([x.select(pl.col("_fid").cast(pl.Int64), pl.col("line").cast(pl.Int64), "reason", "raw")
                        for x in quar])
             .with_row_index("_o").sort(["_fid", "line", "_o"])
             .join(table.select("_fid", "_path"), on="_fid", how="left", maintain_order="left")
             .select(pl.col("_path").alias("file"), "line", "reason", "raw"))
    else:
        q = empty_quarantine()
    return Batch(events, q, stats), fin.next_seq


def parse_many(files: Sequence[WholeFile], opts: ReadOptions, seq_start: int,
               dedup: Deduper) -> tuple[Batch, int]:
    """Whole text files (in reading order) -> (one Batch, the next seq), as if each file had been
    read alone, in order: ``finish_many(prepare_many(files, opts), seq_start, dedup)``."""
    return finish_many(prepare_many(files, opts), seq_start, dedup)
