"""TextParser: one text stream (a file, or a tailed file) -> event batches.

Bytes come in with ``feed`` in any chunking; ``flush`` ends the stream. The events are the same
for any split of the same bytes, because every decision is a function of the lines:

* lines are split on ``\\n`` (a trailing ``\\r`` is dropped); the incomplete last line is held;
* a line over 1 MiB is quarantined (first 4 KiB, ``oversized``) and never held whole;
* invalid UTF-8 is decoded with replacement, kept, and quarantined once (``invalid_utf8``);
* multi-line records (see ``group_records``) may span chunks, so the last record of each stream
  (rank / host) active in the last ``CONT_WINDOW`` lines, and every line after the earliest of
  them, is carried and parsed again with the next chunk. A continuation must lie within
  ``CONT_WINDOW`` lines of the line it continues, which makes this exact. For live tailing,
  ``drain()`` emits the held records after an idle pause;
* lines without a time of their own take the previous timed line's time; lines before the first
  timed line take the first timed line's time if it is within the first ``HEAD_HOLD`` lines,
  else (and for a file with no time at all) the file's mtime. All of these are ``time_inferred``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import time as _time
from pathlib import Path
from typing import cast

import polars as pl

from recovery_logs.errors import InputError
from recovery_logs.schema import EVENT_SCHEMA, QuarantineReason
from recovery_logs.sources.formats import (
    TEXT_FORMATS,
    ParseContext,
    WrapWidth,
    detect_format,
    grep_lead,
    join_wraps,
    may_be_indented_paste,
    parse_lines,
    paste_indent,
    strip_grep_lead,
    strip_paste_indent,
    wrap_widths,
)
from recovery_logs.sources.lineformat import LINE_FORMAT, parse_line_format, select_line_format
from recovery_logs.sources.read_common import (
    MAX_LINE_BYTES,
    QUARANTINE_RAW_BYTES,
    Batch,
    Deduper,
    Finisher,
    ReadOptions,
    cut_raw,
    empty_quarantine,
    quarantine_frame,
    strip_nul_prefix,
)

CONT_WINDOW = 1000
HEAD_HOLD = 10_000
DETECT_BYTES = 64 * 1024

_T = r"^Traceback \(most recent call last\):\s*$"
_C = (r"^(?:During handling of the above exception, another exception occurred:"
      r"|The above exception was the direct cause of the following exception:)\s*$")
# a line that starts with "Traceback" or is a chained-exception line (_C): one regex pass
_T_OR_C = r"^(?:Traceback|" + _C[1:] + ")"


def path_field(path: str, regex: str) -> str | None:
    """Last match's first non-empty group of ``regex`` in the posix form of ``path``."""
    hit = None
    for m in re.finditer(regex, Path(path).as_posix()):
        g = next((x for x in m.groups() if x), None) if m.groups() else m.group(0)
        if g:
            hit = g
    return hit


def _oversized_raw(b: bytes) -> str:
    return b[: 2 * QUARANTINE_RAW_BYTES].decode("utf-8", errors="replace").encode()[:QUARANTINE_RAW_BYTES] \
        .decode("utf-8", errors="ignore")


class TextParser:
    """Stateful parser for one text stream. ``feed`` any chunk; ``flush`` at the end."""

    def __init__(self, file: str, opts: ReadOptions, fmt: str | None = None, seq_start: int = 0,
                 *, dedup: Deduper | None = None, mtime_ns: int | None = None, first_line: int = 1) -> None:
        self.file = file
        self.opts = opts
        self.fmt = fmt if fmt not in (None, "auto") else None
        # a site line format whose path glob fits this file reads it, whatever the content looks like
        self.line_format = select_line_format(opts.line_formats, file)
        if self.line_format is not None:
            self.fmt = LINE_FORMAT
        elif self.fmt == LINE_FORMAT:
            raise InputError("TextParser: format line-format needs a line format (--line-format)", path=file)
        if self.fmt is not None and self.fmt not in TEXT_FORMATS and self.fmt != LINE_FORMAT:
            raise InputError(f"TextParser: unknown text format {self.fmt!r}", path=file)
        if mtime_ns is None:
            try:
                mtime_ns = os.stat(file).st_mtime_ns
            except OSError:
                mtime_ns = _time.time_ns()
        self.mtime_ns = mtime_ns
        year = opts.year or _time.gmtime(mtime_ns // 1_000_000_000).tm_year
        rollover = None if opts.year else mtime_ns + 2 * 86_400 * 1_000_000_000
        self.ctx = ParseContext(file=file, year=year, tz=opts.tz, boot_time_ns=opts.boot_time_ns,
                                host_fields=opts.host_fields, rollover_after_ns=rollover)
        self.path_host = path_field(file, opts.path_host_regex) if opts.path_host_regex else None
        self.path_job = path_field(file, opts.path_job_regex) if opts.path_job_regex else None
        # job lines' own host is used only when neither the caller nor the path names one (only
        # parse_job reads this flag: in the other formats the line's host wins over the path's)
        self.ctx = dataclasses.replace(self.ctx, line_host=opts.host is None and self.path_host is None)
        self.finisher = Finisher(file, seq_start, dedup if dedup is not None else Deduper(enabled=opts.dedupe))
        self._head = b""            # bytes held until the format is known
        self._pending = b""         # incomplete last line
        self._over = False          # the pending line is already over MAX_LINE_BYTES
        self._next_line = first_line    # a live tail resumed mid-file numbers its lines from there
        self._carry = pl.DataFrame(schema={"lineno": pl.Int64, "text": pl.String})
        self._last_ts: int | None = None   # time carried into the carried lines
        self._head_fill: int | None = None  # time for lines before the first timed line, once known
        # job output pasted as an indented block: the indent every line carries (``paste_indent``),
        # decided once from the stream's head; other formats have none
        self._indent: str | None = None
        self._indent_known = self.fmt not in (None, "job")
        # `grep` output of log files (a file name before each line's time header, ``formats.grep_lead``): decided
        # once, from the first bytes processed (the detection head, or the first chunk when the format is given)
        self._grep = False
        self._grep_known = self.fmt == "vl-jsonl" or self.line_format is not None
        # a hard-wrapped paste's terminal width (``formats.wrap_widths``), decided once from the first
        # lines split (a whole file, or at least DETECT_BYTES of it; a shorter first chunk of a live
        # tail: never); a piece at a chunk's end is held for the next chunk (``_split``)
        self._wrap: WrapWidth | None = None
        self._wrap_known = False

    @property
    def next_seq(self) -> int:
        return self.finisher.next_seq

    def held_from_line(self) -> int:
        """The first line not yet emitted in an event (held as the format head, a carried
        multi-line record or an incomplete line): where a restarted reader must begin."""
        held = [self._next_line]
        if self._carry.height:
            held.append(int(self._carry["lineno"].min()))  # type: ignore[arg-type]
        return min(held)

    def set_boot_time(self, boot_ns: int, inferred: bool) -> None:
        """Absolute time of uptime 0 for relative dmesg lines (call before the first feed)."""
        self.ctx = dataclasses.replace(self.ctx, boot_time_ns=boot_ns, boot_inferred=inferred)

    # --- public -------------------------------------------------------------------------------
    def feed(self, data: bytes, final: bool = False) -> Batch:
        """Parse a chunk. ``final=True`` means no more data follows: the same as ``feed`` then
        ``flush``, in one pass (what whole-file reads use; most log files are one chunk)."""
        stats: collections.Counter = collections.Counter()
        stats["bytes"] += len(data)
        if self.fmt is None:
            self._head += data
            if len(self._head) < DETECT_BYTES and not final:
                return self._empty(stats)
            data, self._head = self._head, b""
            self._detect(data)
        elif not self._indent_known:
            # held only while the head could still be an indented paste (it starts with a blank)
            self._head += data
            if len(self._head) < DETECT_BYTES and not final and may_be_indented_paste(self._head) is not False:
                return self._empty(stats)
            data, self._head = self._head, b""
            self._decide_indent(data)
        return self._process(data, final=final, stats=stats)

    def flush(self) -> Batch:
        stats: collections.Counter = collections.Counter()
        data = b""
        if self.fmt is None:
            data, self._head = self._head, b""
            self._detect(data)
        elif not self._indent_known:
            data, self._head = self._head, b""
            self._decide_indent(data)
        return self._process(data, final=True, stats=stats)

    def drain(self) -> Batch:
        """Emit every complete record held back so far, keeping only an incomplete last line.

        For live tailing after an idle pause: a record held because its next line might continue
        it is emitted now; a continuation that arrives later starts a record of its own. (Unlike
        ``feed``, the result then depends on when ``drain`` was called.)"""
        stats: collections.Counter = collections.Counter()
        if self.fmt is None:
            if not self._head:
                return self._empty(stats)
            data, self._head = self._head, b""
            self._detect(data)
            return self._process(data, final=False, stats=stats, drain=True)
        if not self._indent_known:
            data, self._head = self._head, b""
            self._decide_indent(data)
            return self._process(data, final=False, stats=stats, drain=True)
        return self._process(b"", final=False, stats=stats, drain=True)

    # --- internals ------------------------------------------------------------------------------
    def _detect(self, head: bytes) -> None:
        fmt = detect_format(self.file, head[:DETECT_BYTES])
        if fmt not in TEXT_FORMATS:
            raise InputError(f"TextParser: {fmt} content is not a text stream; read it with iter_batches",
                             path=self.file)
        self.fmt = fmt
        self._decide_indent(head)

    def _decide_indent(self, head: bytes) -> None:
        self._indent = paste_indent(head[:DETECT_BYTES]) if self.fmt == "job" else None
        self._indent_known = True

    def _empty(self, stats: collections.Counter) -> Batch:
        return Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(), stats)

    def _split(self, data: bytes, final: bool, stats: collections.Counter, quar: list) -> pl.DataFrame:
        """New complete lines as (lineno, text); oversized and invalid-UTF-8 lines quarantined."""
        buf = self._pending + data
        cut = buf.rfind(b"\n")
        if final:
            complete, rest = buf, b""
            if complete.endswith(b"\n"):
                complete = complete[:-1]
            elif not complete and not self._over:
                self._pending = b""
                return pl.DataFrame(schema={"lineno": pl.Int64, "text": pl.String})
        elif cut < 0:
            complete, rest = None, buf
        else:
            complete, rest = buf[:cut], buf[cut + 1:]
        if complete is None:      # no newline yet: hold, but never more than a cut-off prefix
            if len(rest) > MAX_LINE_BYTES:
                self._over = True
                rest = rest[: 2 * QUARANTINE_RAW_BYTES]
            self._pending = rest
            return pl.DataFrame(schema={"lineno": pl.Int64, "text": pl.String})
        self._pending = rest
        start = self._next_line
        if self._over:            # finish the oversized line that was being held
            nl = complete.find(b"\n")
            first, complete = (complete, b"") if nl < 0 else (complete[:nl], complete[nl + 1:])
            stats["oversized"] += 1
            stats["lines"] += 1
            quar.append(quarantine_frame(self.file, [start], QuarantineReason.OVERSIZED.value,
                                         [_oversized_raw(first)]))
            self._over = False
            start += 1
            if nl < 0:
                self._next_line = start
                return pl.DataFrame(schema={"lineno": pl.Int64, "text": pl.String})
        if len(rest) > MAX_LINE_BYTES:
            self._over = True
            self._pending = rest[: 2 * QUARANTINE_RAW_BYTES]
        bad: list[tuple[int, str]] = []
        try:    # valid UTF-8 (the usual case): Arrow validates it without a Python str
            whole = pl.Series("text", [complete], dtype=pl.Binary).cast(pl.String).to_frame()
        except pl.exceptions.PolarsError:
            text, bad = _decode(complete)
            whole = pl.DataFrame({"text": [text]})
        df = (whole.select(pl.col("text").str.split("\n")).explode("text")
              .with_row_index("lineno", offset=start)
              .with_columns(pl.col("lineno").cast(pl.Int64), pl.col("text").str.strip_suffix("\r")))
        if b"\x00" in complete:
            df = strip_nul_prefix(df, stats)
        if self._indent:
            df = df.with_columns(text=strip_paste_indent(pl.col("text"), self._indent))
        if self._grep:
            df = df.with_columns(text=strip_grep_lead(pl.col("text")))
        n = df.height
        if not self._wrap_known and self.fmt != "vl-jsonl":
            self._wrap_known = True
            if final or len(complete) + len(self._pending) >= DETECT_BYTES:
                self._wrap = wrap_widths(df, head_bytes=DETECT_BYTES).get(0)
        if self._wrap is not None:
            if not final and df.height and not bad and not self._over:
                # a last line of the wrap width may go on in the next chunk: held back with the
                # incomplete line (read again from its bytes), so the join does not depend on the chunking
                if len(df["text"][-1]) == self._wrap.width:
                    self._pending = complete[complete.rfind(b"\n") + 1:] + b"\n" + self._pending
                    df = df.head(df.height - 1)
                    n -= 1
            df = join_wraps(df, {0: self._wrap})
        self._next_line = start + n
        stats["lines"] += n
        if bad:
            stats["invalid_utf8"] += len(bad)
            quar.append(quarantine_frame(self.file, [start + i for i, _ in bad], QuarantineReason.INVALID_UTF8.value,
                                         [r[:QUARANTINE_RAW_BYTES] for _, r in bad]))
        over = df.filter(pl.col("text").str.len_bytes() > MAX_LINE_BYTES)
        if over.height:
            stats["oversized"] += over.height
            quar.append(quarantine_frame(self.file, over["lineno"].to_list(), QuarantineReason.OVERSIZED.value,
                                         [_oversized_raw(t.encode()) for t in over["text"].to_list()]))
            df = df.filter(pl.col("text").str.len_bytes() <= MAX_LINE_BYTES)
        return df

    def _process(self, data: bytes, final: bool, stats: collections.Counter, drain: bool = False) -> Batch:
        quar: list[pl.DataFrame] = []
        if not self._grep_known and (data or final):
            self._grep_known = True
            self._grep = self.fmt != "vl-jsonl" and grep_lead(self._pending[:DETECT_BYTES] + data[:DETECT_BYTES])
        new = self._split(data, final, stats, quar)
        if new.height == 0 and not final and not (drain and self._carry.height):   # nothing new to decide
            q = pl.concat(quar) if quar else empty_quarantine()
            return Batch(pl.DataFrame(schema=EVENT_SCHEMA), q, stats)
        lines = pl.concat([self._carry, new]) if self._carry.height else new
        if lines.height == 0:
            q = pl.concat(quar) if quar else empty_quarantine()
            return Batch(pl.DataFrame(schema=EVENT_SCHEMA), q, stats)
        if self.line_format is not None:
            parsed = parse_line_format(lines, self.ctx, self.line_format)
        else:
            parsed = parse_lines(lines, cast(str, self.fmt), self.ctx)   # detected above
        if self.fmt == "vl-jsonl":
            rec = self._json_records(parsed, stats, quar)
            self._carry = self._carry.clear()
        else:
            end = int(lines["lineno"].max())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal
            rec = self._text_records(parsed, final, end, stats, drain, quar)
        events, q = self.finisher.finish(rec, stats)
        if q.height:
            quar.append(q)
        qq = pl.concat(quar) if quar else empty_quarantine()
        return Batch(events, qq, stats)

    def _fill_ids(self, df: pl.DataFrame, line_host_first: bool) -> pl.DataFrame:
        o = self.opts
        host = pl.col("host")
        if o.host is not None:
            host = pl.lit(o.host)
        elif line_host_first:
            host = pl.coalesce(host, pl.lit(self.path_host, pl.String))
        else:
            host = pl.coalesce(pl.lit(self.path_host, pl.String), host)
        job = pl.lit(o.job) if o.job is not None else pl.coalesce(pl.col("job_id"), pl.lit(self.path_job, pl.String))
        return df.with_columns(host=host.cast(pl.String), job_id=job.cast(pl.String))

    def _quarantine_json(self, parsed: pl.DataFrame, stats: collections.Counter, quar: list) -> None:
        bad = parsed.filter(pl.col("malformed"))
        if bad.height:
            stats["malformed"] += bad.height
            quar.append(bad.select(pl.lit(self.file).alias("file"), pl.col("lineno").alias("line"),
                                   pl.lit(QuarantineReason.MALFORMED.value).alias("reason"),
                                   cut_raw(pl.col("text")).alias("raw")))

    def _quarantine_utf8(self, ok: pl.DataFrame, stats: collections.Counter, quar: list) -> None:
        bu = ok.filter(pl.col("bad_utf8"))     # journald MESSAGE byte lists that are not UTF-8
        if bu.height:
            stats["invalid_utf8"] += bu.height
            quar.append(bu.select(pl.lit(self.file).alias("file"), pl.col("lineno").alias("line"),
                                  pl.lit(QuarantineReason.INVALID_UTF8.value).alias("reason"),
                                  cut_raw(pl.col("text")).alias("raw")))

    def _json_records(self, parsed: pl.DataFrame, stats: collections.Counter, quar: list) -> pl.DataFrame:
        parsed = parsed.filter(pl.col("text").str.strip_chars() != "")
        self._quarantine_json(parsed, stats, quar)
        ok = parsed.filter(~pl.col("malformed"))
        ok = self._fill_ids(ok, line_host_first=True)
        return ok.select(
            pl.col("ts"), (~pl.col("ts_inferred")).alias("own_time"), pl.lit(False).alias("bad_ts"),
            pl.col("text").alias("raw_first"),
            pl.coalesce(pl.col("stream_id"), pl.lit(self.file)).alias("ooo_key"),
            "host", "job_id", "source", pl.lit(self.file).alias("file"), pl.col("lineno").alias("line"),
            "stream_id", "rank", "message", "level")

    def _text_records(self, parsed: pl.DataFrame, final: bool, end: int, stats: collections.Counter,
                      drain: bool, quar: list) -> pl.DataFrame:
        whole = parsed
        if "malformed" in parsed.columns:         # journald lines that are not JSON objects
            parsed = parsed.filter(~pl.col("malformed"))
        g = group_records(parsed, cast(str, self.fmt))
        # --- carry: everything from the first line of a record that may still grow ------------
        if final or drain:
            cut = end + 1
        else:
            # the last record of each stream active in the last CONT_WINDOW lines may still grow:
            # hold from the earliest first line of those (and of any record reaching past that)
            last = g.group_by("key").agg(pl.col("lineno").max().alias("l"), pl.col("gfirst").last().alias("f"))
            first_open = last.filter(pl.col("l") > end - CONT_WINDOW)["f"].min()
            cut = end + 1 if first_open is None else int(first_open)  # type: ignore[arg-type]  # polars literal
            tail = g.filter(pl.col("lineno") >= cut)
            while tail.height:
                lo = cast(int | None, tail["gfirst"].min())
                if lo is None or lo >= cut:
                    break
                cut = int(lo)
                tail = g.filter(pl.col("lineno") >= cut)
        # --- time inference -------------------------------------------------------------------
        g = g.with_columns(ff=pl.col("ts").forward_fill())
        if self._last_ts is not None:
            g = g.with_columns(ff=pl.col("ff").fill_null(self._last_ts))
        if self._head_fill is None:
            idx = g["ts"].is_not_null().arg_true()
            if idx.len() and int(g["lineno"][idx[0]]) <= HEAD_HOLD:
                self._head_fill = int(g["ts"][idx[0]])
            elif idx.len() or end >= HEAD_HOLD or final or drain:
                self._head_fill = self.mtime_ns
            elif g.height:
                cut = int(g["lineno"].min())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal; hold everything until we know
        if self._head_fill is not None:
            g = g.with_columns(ff=pl.col("ff").fill_null(self._head_fill))
        emit = g.filter(pl.col("lineno") < cut)
        self._carry = whole.filter(pl.col("lineno") >= cut).select("lineno", "text")
        if whole.height != parsed.height:
            self._quarantine_json(whole.filter(pl.col("lineno") < cut), stats, quar)
        if "bad_utf8" in g.columns:
            self._quarantine_utf8(emit, stats, quar)
        if emit.height:
            last_ff = emit["ff"][-1]
            if last_ff is not None:
                self._last_ts = int(last_ff)
        emit = emit.filter(~pl.col("drop"))
        # --- records ---------------------------------------------------------------------------
        firsts = emit.filter(~pl.col("cont"))
        multi = emit.filter(pl.col("cont"))
        stats["multiline_joined"] += multi.height
        if multi.height:
            joined = (emit.filter(pl.col("gfirst").is_in(multi["gfirst"].unique().implode()))
                      .group_by("gfirst").agg(pl.col("message").str.join("\n").alias("_joined")))
            firsts = firsts.join(joined, on="gfirst", how="left").with_columns(
                message=pl.coalesce("_joined", "message")).drop("_joined").sort("lineno")
        firsts = self._fill_ids(firsts, line_host_first=self.fmt != "job")
        own = pl.col("ts").is_not_null() & ~pl.col("ts_inferred")
        return firsts.select(
            pl.coalesce("ts", "ff").alias("ts"), own.alias("own_time"),
            (pl.col("has_ts") & pl.col("ts").is_null()).alias("bad_ts"),
            pl.col("text").alias("raw_first"), pl.lit(self.file).alias("ooo_key"),
            "host", "job_id", "source", pl.lit(self.file).alias("file"), pl.col("lineno").alias("line"),
            "stream_id", "rank", "message", "level", *(["mismatch"] if "mismatch" in firsts.columns else []))


def group_records(p: pl.DataFrame, fmt: str, streams: bool = True) -> pl.DataFrame:
    """Add ``cont`` (joins the previous line of its stream), ``gfirst`` (record id: the line number of
    the record's first line) and ``drop`` (stand-alone blank line) to parsed lines.

    Continuations join the previous line of the same stream (same rank; for syslog also the same
    host) within ``CONT_WINDOW`` lines:

    * indented lines (not after a blank line), and lines that fail the syslog/dmesg header but
      are indented;
    * Python tracebacks (job files): from ``Traceback (most recent call last):`` through the first
      non-indented line (the ``SomeError: message`` line), with chained blocks ("During handling
      of the above exception…", "The above exception was the direct cause…") and the blank lines
      around them;
    * NVRM messages split over lines (syslog/dmesg): an ``NVRM: `` line whose text starts lower
      case or with ``(``, after an ``NVRM: `` line that does not end a sentence, within 1 s.

    ``streams=False`` (whole files, nothing carried to a next chunk): where no line can continue
    another, ``key`` is left null and ``gfirst`` is the line number (only a carried chunk needs the
    stream of a blank line; the records are the same).
    """
    body = pl.col("body")
    # indented and not blank (``^\s+\S``: \s and strip_chars' whitespace are both Unicode White_Space)
    ind = body.str.contains(r"^\s+\S") & ~pl.col("header").fill_null(False)
    if fmt == "job":     # a continuation needs a traceback head, a chained-exception line or an indent
        may = ind | body.str.contains(_T_OR_C)
    else:                # ... an indent or an NVRM line that can continue the one before it
        may = ind | (pl.col("nvrm") & pl.col("message").str.contains(r"^NVRM: [a-z(]"))
    many = "_fid" in p.columns
    flags = p.select(may.fill_null(False).alias("may"), *([pl.col("_fid")] if many else []))
    if not flags["may"].any():
        return _group_simple(p, fmt, streams)
    if many:
        busy = flags.filter(pl.col("may"))["_fid"].unique()
        if busy.len() < flags["_fid"].n_unique():   # only the files that can hold a continuation in full
            p = p.with_row_index("_ri")
            in_busy = pl.col("_fid").is_in(busy.implode())
            both = pl.concat([_group_full(p.filter(in_busy).drop("_ri"), fmt).with_columns(
                p.filter(in_busy)["_ri"]), _group_simple(p.filter(~in_busy).drop("_ri"), fmt, streams).with_columns(
                p.filter(~in_busy)["_ri"])])
            return both.sort("_ri").drop("_ri")
    return _group_full(p, fmt)


def _stream_key(p: pl.DataFrame, fmt: str) -> pl.Expr:
    many = "_fid" in p.columns     # several files in one frame (read_many): streams never cross files
    host_ff = pl.col("host").forward_fill().over("_fid") if many else pl.col("host").forward_fill()
    key = pl.concat_str([host_ff.fill_null(""), pl.col("rank").cast(pl.String).fill_null("")],
                        separator="|") if fmt != "job" else pl.col("rank").cast(pl.String).fill_null("")
    if many:
        key = pl.concat_str([pl.col("_fid").cast(pl.String), key], separator="#")
    return key


def _group_select(p: pl.DataFrame, start: pl.Expr | None) -> pl.DataFrame:
    gfirst = pl.col("lineno") if start is None else pl.coalesce(
        pl.when(start).then(pl.col("lineno")).forward_fill().over("key"), pl.col("lineno"))
    return p.select(
        "lineno", "text", "ts", "ts_inferred", "has_ts", "host", "job_id", "source", "rank", "stream_id", "message",
        "level", "cont", "drop", "key", *(["bad_utf8"] if "bad_utf8" in p.columns else []),
        *(["mismatch"] if "mismatch" in p.columns else []), *(["_fid"] if "_fid" in p.columns else []),
        gfirst=gfirst)


def _group_simple(p: pl.DataFrame, fmt: str, streams: bool = True) -> pl.DataFrame:
    """``group_records`` of lines none of which can continue another (no indent, no traceback, no
    NVRM continuation): every non-blank line is a record; the same result as the full rules give."""
    blank = pl.col("body").str.strip_chars() == ""
    if not streams:
        p = p.with_columns(key=pl.lit(None, pl.String), cont=pl.lit(False), drop=blank)
        return _group_select(p, None)
    p = p.with_columns(key=_stream_key(p, fmt), cont=pl.lit(False), drop=blank)
    return _group_select(p, ~pl.col("drop"))


def _group_full(p: pl.DataFrame, fmt: str) -> pl.DataFrame:
    body = pl.col("body")
    blank = body.str.strip_chars() == ""
    key = _stream_key(p, fmt)
    p = p.with_columns(
        key=key,
        blank=blank,
        ind=body.str.contains(r"^\s") & ~blank & ~pl.col("header").fill_null(False),
    ).with_columns(
        gap=(pl.col("lineno") - pl.col("lineno").shift(1)).over("key"),
        prev_blank=pl.col("blank").shift(1).over("key"),
    ).with_columns(near=pl.col("gap").le(CONT_WINDOW).fill_null(False))
    near = pl.col("near")
    ind_cont = pl.col("ind") & near & ~pl.col("prev_blank").fill_null(True)
    if fmt == "job":
        T = body.str.contains(_T)
        C = body.str.contains(_C)
        p = p.with_columns(T=T, C=C).with_columns(
            other=~pl.col("T") & ~pl.col("C") & ~pl.col("blank") & ~body.str.contains(r"^\s"),
            sub=pl.col("T").cum_sum().over("key"),
        ).with_columns(
            n_other=(pl.col("other").cast(pl.Int32).cum_sum() - pl.col("other").cast(pl.Int32)).over(["key", "sub"]),
        ).with_columns(in_tb=(pl.col("sub") > 0) & (pl.col("n_other") == 0) & ~pl.col("T"))
        code = (pl.when(pl.col("blank")).then(None).when(pl.col("C")).then(2).when(pl.col("T")).then(1)
                .when(pl.col("in_tb")).then(3).otherwise(0))
        nb_line = pl.when(pl.col("blank")).then(None).otherwise(pl.col("lineno"))
        p = p.with_columns(code=code, nbl=nb_line).with_columns(
            prev_nb=pl.col("code").shift(1).forward_fill().over("key"),
            next_nb=pl.col("code").shift(-1).backward_fill().over("key"),
            next_nbl=pl.col("nbl").shift(-1).backward_fill().over("key"),
        )
        pn, nn = pl.col("prev_nb"), pl.col("next_nb")
        next_near = (pl.col("next_nbl") - pl.col("lineno")).le(CONT_WINDOW).fill_null(False)
        chain = ((pl.col("C") & pn.eq(3)) | (pl.col("T") & pn.eq(2))
                 | (pl.col("blank") & next_near & ((pn.eq(3) & nn.eq(2)) | (pn.eq(2) & nn.eq(1)))))
        cont = near & ((pl.col("in_tb") & (~pl.col("blank") | (nn.eq(3) & next_near)))
                       | chain.fill_null(False)) | ind_cont
    else:
        m = pl.col("message")
        prev_m = m.shift(1).over("key")
        dt = (pl.col("ts") - pl.col("ts").shift(1).over("key")).abs()
        nv = (pl.col("nvrm") & pl.col("nvrm").shift(1).over("key").fill_null(False)
              & ~prev_m.str.contains(r"[.:!]\s*$").fill_null(True)
              & m.str.contains(r"^NVRM: [a-z(]") & dt.le(1_000_000_000).fill_null(True) & near)
        cont = nv | ind_cont
    p = p.with_columns(cont=cont.fill_null(False))
    p = p.with_columns(drop=pl.col("blank") & ~pl.col("cont"))
    return _group_select(p, ~pl.col("cont") & ~pl.col("drop"))


def _decode(b: bytes) -> tuple[str, list[tuple[int, str]]]:
    """UTF-8 with replacement; also (line index, raw with \\x escapes) of each line with bad bytes."""
    try:
        return b.decode("utf-8"), []
    except UnicodeDecodeError:
        pass
    parts: list[str] = []
    bad: list[tuple[int, str]] = []
    pos, line_idx = 0, 0
    while pos <= len(b):
        try:
            parts.append(b[pos:].decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            err = pos + e.start
            ls = b.rfind(b"\n", pos, err) + 1 if b.rfind(b"\n", pos, err) >= 0 else pos
            le = b.find(b"\n", err)
            le = len(b) if le < 0 else le
            good = b[pos:ls].decode("utf-8")
            line_idx += good.count("\n")
            parts.append(good)
            raw = b[ls:le]
            parts.append(raw.decode("utf-8", errors="replace"))
            bad.append((line_idx, raw.decode("utf-8", errors="backslashreplace")))
            if le < len(b):
                parts.append("\n")
                line_idx += 1
            pos = le + 1
    return "".join(parts), bad
