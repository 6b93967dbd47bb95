"""File readers: paths (files, directories, globs) -> event batches + quarantine.

Formats (``ReadOptions.fmt``; ``auto`` sniffs the first 64 KiB and the name, see
``formats.detect_format``): VictoriaLogs JSON lines, ``journalctl -o json``, syslog (RFC3164,
RFC5424, rsyslog ISO), dmesg (relative and ``-T``), job output (torchrun/glog/Python logging/ISO
or no timestamps), Parquet in EVENT_SCHEMA. Any of them may be gzip-compressed (magic bytes).

Semantics, shared by every format (details in ``read_text`` and ``read_common``):

* every event gets a ``seq``, consecutive in reading order from ``seq_start`` across batches and
  files; ``read_paths`` returns the events sorted by (time, seq);
* bad input never crashes the read and never vanishes: malformed JSON lines, VL rows without a
  usable ``_time``, invalid UTF-8, lines over 1 MiB, unparseable timestamps, out-of-order and
  duplicate records are counted in ``stats`` and get a quarantine row (file, line, reason, raw);
* fatal, as ``InputError`` naming the path (and line): a path that does not exist or cannot be
  read, a corrupt gzip stream, a Parquet file that is not in the event schema, no events at all.

Directories are walked recursively in sorted order; hidden files, ``truth.json`` and files that
are clearly not logs (binary content, images, archives, code, docs) are skipped and counted as
``skipped``. A stretch of NUL bytes (a log after a hard reset) or a few garbage bytes is not binary
content: such a file is read, and the NULs a line starts with are dropped (``nul_prefixed``). A path named explicitly is always read.
"""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import InputError
from recovery_logs.schema import EVENT_SCHEMA, TIME, QuarantineReason, conform
from recovery_logs.sources.archive import archive_batches, is_archive
from recovery_logs.sources.formats import (
    FORMATS,
    TEXT_FORMATS,
    detect_format,
    detect_format_scan,
    vl_columns,
    vl_frame_to_parsed,
)
from recovery_logs.sources.lineformat import LINE_FORMAT, select_line_format
from recovery_logs.sources.read_common import (
    DEFAULT_HOST_FIELDS,
    Batch,
    Deduper,
    Finisher,
    ReadOptions,
    empty_quarantine,
    quarantine_frame,
)
from recovery_logs.sources.read_many import (
    GROUP_BYTES,
    GROUP_FILES,
    SMALL_FILE_BYTES,
    Prepared,
    WholeFile,
    finish_many,
    prepare_many,
)
from recovery_logs.sources.read_text import DETECT_BYTES, TextParser
from recovery_logs.timeutil import rfc3339_to_time_expr

__all__ = ["DEFAULT_HOST_FIELDS", "Batch", "ReadOptions", "ReadResult", "TextParser", "detect_format",
           "events_from_vl_records", "expand_paths", "iter_batches", "read_paths"]

_SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".zip", ".tar", ".tgz", ".xz", ".bz2",
                  ".zst", ".7z", ".pyc", ".so", ".o", ".a", ".sqlite", ".db", ".npy", ".npz", ".pt", ".pkl",
                  ".skops", ".md", ".rst", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".py", ".sh", ".ipynb",
                  ".html", ".css", ".js"}
_SKIP_NAMES = {"truth.json"}
_GZIP_MAGIC = b"\x1f\x8b"
_UPTIME = re.compile(rb"^\[\s*(\d+)\.(\d+)\]", re.M)
DEFAULT_OPTIONS = ReadOptions()


@dataclass
class ReadResult:
    events: pl.DataFrame            # EVENT_SCHEMA, sorted by (time, seq)
    quarantine: pl.DataFrame        # QUARANTINE_SCHEMA
    stats: collections.Counter


# magic numbers of files that are never logs (ELF, images, PDF, archives, SQLite, compressed other than gzip)
_BINARY_MAGIC = (b"\x7fELF", b"\x89PNG", b"GIF8", b"\xff\xd8\xff", b"%PDF", b"PK\x03\x04", b"SQLite format 3\x00",
                 b"\xfd7zXZ\x00", b"BZh", b"\x28\xb5\x2f\xfd", b"\xca\xfe\xba\xbe", b"\xcf\xfa\xed\xfe")
_NUL_RUN = re.compile(rb"\x00+")
_TEXT_CONTROL = frozenset(b"\t\n\r\f\v\x08\x1b")


def _looks_binary(head: bytes) -> bool:
    """Binary content, not a log with damage in it. A log can hold a stretch of NUL bytes (a crash
    before the file system wrote the data it had promised: syslog after a hard reset, which is when
    its lines matter most) or a few garbage bytes; binary formats have a known magic number, NULs
    scattered through their structure, or control bytes throughout."""
    head = head[:8192]
    if head.startswith(_BINARY_MAGIC):
        return True
    runs = len(_NUL_RUN.findall(head))
    if runs > 4:
        return True
    rest = _NUL_RUN.sub(b"", head)
    if not rest:
        return runs > 0 and len(head) < 8192     # only NULs: a file with no text (a longer one may have it later)
    control = sum(1 for b in rest if b < 0x20 and b not in _TEXT_CONTROL)
    return control * 20 > len(rest)              # over 5 % control bytes: random or structured binary


def expand_paths(paths: Sequence[str | Path]) -> tuple[list[Path], int]:
    """Files to read, in order, and how many directory entries were skipped as not logs.

    Raises InputError for a path (or glob) that matches nothing."""
    out: list[Path] = []
    skipped = 0
    for p in paths:
        s = str(p)
        if any(ch in s for ch in "*?[") and not os.path.exists(s):
            hits = sorted(glob.glob(s, recursive=True))
            if not hits:
                raise InputError("input: the glob matches no file", path=s)
            cands = [Path(h) for h in hits]
        else:
            cands = [Path(s)]
        for c in cands:
            if c.is_dir():
                for root, dirs, files in os.walk(c):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for f in sorted(files):
                        fp = Path(root) / f
                        if _skip(fp):
                            skipped += 1
                        else:
                            out.append(fp)
            elif c.exists():
                out.append(c)
            else:
                raise InputError("input: no such file or directory", path=s)
    return out, skipped


def _is_fifo(fp: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(fp).st_mode)
    except OSError:
        return False


def _skip(fp: Path) -> bool:
    name = fp.name
    if _is_fifo(fp):
        return True    # a pipe inside a directory is never opened (it would block); name it to read it
    if name.startswith(".") or name in _SKIP_NAMES:
        return True
    suffixes = [x.lower() for x in fp.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in _SKIP_SUFFIXES:
        return True
    try:
        with open(fp, "rb") as fh:
            head = fh.read(8192)
    except OSError:
        return False   # let the reader raise a clear error
    if head[:2] == _GZIP_MAGIC or head[:4] == b"PAR1":
        return False
    return _looks_binary(head)


class _Inflate:
    """A gzip file read chunk by chunk with ``zlib`` (several members are fine).

    Unlike ``gzip.GzipFile``, a stream that is cut short or corrupt keeps everything inflated
    before the damage: ``read`` returns it, then b"" with ``error`` set. Memory is bounded by the
    size asked for (``max_length``), whatever the compression ratio."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.error: str | None = None
        self._d = zlib.decompressobj(wbits=31)
        self._in = b""          # compressed bytes not yet given to the decompressor
        self._started = False   # the current member has consumed input
        self._done = False

    def read(self, n: int) -> bytes:
        out: list[bytes] = []
        have = 0
        while have < n and not self._done:
            if not self._in:
                self._in = self.fh.read(1 << 16)
                if not self._in:
                    if self._started:
                        self.error = "truncated gzip stream (it ends before the end-of-stream marker)"
                    self._done = True
                    break
            if not self._started and self._in[:2] != _GZIP_MAGIC[: len(self._in)]:
                if self._in.strip(b"\0"):   # zero padding after a member is fine, anything else is not
                    self.error = "corrupt gzip stream (not gzip data after the end of a member)"
                    self._done = True
                self._in = b""
                continue
            try:
                chunk = self._d.decompress(self._in, n - have)
            except zlib.error as exc:
                self.error = f"corrupt gzip stream ({exc})"
                self._done = True
                break
            self._started = True
            self._in = self._d.unconsumed_tail
            if self._d.eof:
                self._in = self._d.unused_data + self._in
                self._d = zlib.decompressobj(wbits=31)
                self._started = False
            if chunk:
                out.append(chunk)
                have += len(chunk)
        return b"".join(out)

    def close(self) -> None:
        self.fh.close()


def _open(fp: Path) -> tuple[Any, bool]:
    if _is_fifo(fp):   # read what the writer sends until it closes; no writer: empty, never a hang
        try:
            fd = os.open(fp, os.O_RDONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            fifo = io.BufferedReader(io.FileIO(fd, "rb"))
        except OSError as exc:
            raise InputError(f"input: cannot read the FIFO ({exc.strerror or exc})", path=str(fp)) from exc
        if fifo.peek(2)[:2] == _GZIP_MAGIC:
            return _Inflate(fifo), True
        return fifo, False
    try:
        fh = open(fp, "rb")
        magic = fh.read(2)
        fh.seek(0)
    except OSError as exc:
        raise InputError(f"input: cannot read the file ({exc.strerror or exc})", path=str(fp)) from exc
    if magic == _GZIP_MAGIC:
        return _Inflate(fh), True
    return fh, False


def _read(fh: Any, n: int, fp: Path, line: int | None) -> bytes:
    try:
        return fh.read(n)
    except OSError as exc:
        raise InputError(f"input: cannot read the file ({exc.strerror or exc})", path=str(fp), line=line) from exc


def _chunk_bytes(opts: ReadOptions) -> int:
    return max(64 * 1024, opts.batch_lines * 160)


def _dmesg_boot_estimate(fp: Path, gz: bool, mtime_ns: int) -> int | None:
    """Boot time ~ mtime minus the last uptime in the file (its last 64 KiB; a gzip file is
    streamed through once to find it)."""
    try:
        if gz:
            tail = b""
            with open(fp, "rb") as raw:
                inf = _Inflate(raw)
                while chunk := inf.read(1 << 20):
                    tail = (tail + chunk)[-65536:]
        else:
            with open(fp, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 65536))
                tail = fh.read()
    except OSError:
        return None   # the reader itself reports an unreadable file
    hits = _UPTIME.findall(tail)
    if not hits:
        return None
    sec, frac = hits[-1]
    up_ns = int(sec) * 1_000_000_000 + int(frac.ljust(9, b"0")[:9])
    return mtime_ns - up_ns


def _unreadable(fp: Path, exc: InputError, stats: collections.Counter) -> Batch:
    """A file that could not be read at all: counted, one quarantine row naming why, the run goes on."""
    stats["unreadable"] += 1
    q = quarantine_frame(str(fp), [exc.line or 0], QuarantineReason.UNREADABLE.value, [str(exc)[:4096]])
    return Batch(pl.DataFrame(schema=EVENT_SCHEMA), q, stats)


def _truncated(fp: Path, line: int, partial: bytes, why: str, stats: collections.Counter) -> pl.DataFrame:
    """A gzip stream cut short: what was readable is kept; the first line not read whole is named."""
    stats["truncated"] += 1
    raw = f"{why}; readable part kept, cut at line {line}: " + partial[:2048].decode("utf-8", errors="replace")
    return quarantine_frame(str(fp), [line], QuarantineReason.TRUNCATED.value, [raw[:4096]])


def iter_batches(paths: Sequence[str | Path], opts: ReadOptions = DEFAULT_OPTIONS, seq_start: int = 0,
                 *, all_unreadable_raises: bool = True) -> Iterator[Batch]:
    """Read ``paths`` batch by batch (about ``opts.batch_lines`` lines each); memory stays bounded.

    Small files (up to ``read_many.SMALL_FILE_BYTES``) are read whole and parsed in groups, many
    files per Polars operation; larger ones are streamed chunk by chunk. A file that cannot be read
    is counted (``unreadable``) with a quarantine row and the others are still read; a gzip stream
    cut short keeps its readable part (``truncated``). When every file is unreadable the first
    file's error is raised. Each batch's ``stats`` counts only that batch; sum them for a total."""
    if opts.fmt not in ("auto", *FORMATS):
        raise InputError(f"input: unknown format {opts.fmt!r}; use auto or one of {', '.join(FORMATS)}")
    archives = [p for p in paths if is_archive(p)]
    if archives:
        if len(paths) > 1:
            raise InputError("input: an archive is read on its own (not with other inputs)",
                             path=", ".join(str(p) for p in paths))
        yield from archive_batches(Path(archives[0]), opts)
        return
    files, skipped = expand_paths(paths)
    dedup = Deduper(enabled=opts.dedupe)
    seq = seq_start
    group: list[WholeFile] = []
    group_bytes = 0
    extra: collections.Counter = collections.Counter()
    if skipped:
        extra["skipped"] += skipped
    group_quar: list[pl.DataFrame] = []
    errors: list[InputError] = []
    readable = 0
    # groups handed to the parse thread (``prepare_many``), finished in reading order (``finish_many``:
    # out-of-order, dedupe and seq carry state from group to group)
    pending: collections.deque[tuple[Future[Prepared] | Prepared | None, list[pl.DataFrame], collections.Counter]]
    pending = collections.deque()
    pool: ThreadPoolExecutor | None = None

    def submit() -> None:
        nonlocal group_bytes, extra, pool
        if not group and not group_quar and not extra:
            return
        job: Future[Prepared] | Prepared | None = None
        if group:
            if opts.parse_ahead:
                if pool is None:
                    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recovery-logs-parse")
                job = pool.submit(prepare_many, list(group), opts)
            else:
                job = prepare_many(group, opts)
        pending.append((job, list(group_quar), extra))
        extra = collections.Counter()
        group.clear()
        group_quar.clear()
        group_bytes = 0

    def finish(keep: int) -> Iterator[Batch]:
        nonlocal seq
        while len(pending) > keep:
            job, gq, ex = pending.popleft()
            if job is not None:
                b, seq = finish_many(job.result() if isinstance(job, Future) else job, seq, dedup)
            else:
                b = Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(), collections.Counter())
            if gq:
                b.quarantine = pl.concat([b.quarantine, *gq])
            b.stats.update(ex)
            yield b

    def flush_group() -> Iterator[Batch]:
        """Everything read so far, as batches in reading order (before anything else is yielded)."""
        submit()
        yield from finish(0)

    try:
        for fp in files:
            try:
                fh, gz = _open(fp)
            except InputError as exc:
                errors.append(exc)
                yield from flush_group()
                yield _unreadable(fp, exc, collections.Counter(files=1))
                continue
            try:
                small = min(SMALL_FILE_BYTES, _chunk_bytes(opts))
                try:
                    st = os.stat(fp)
                    mtime_ns = st.st_mtime_ns
                    # a small plain file is read in one call (the head, then the rest, would copy it
                    # once more when joined); the rest is still read if it grew since the stat
                    whole = (not gz and stat.S_ISREG(st.st_mode) and DETECT_BYTES < st.st_size < small
                             and not fp.name.lower().endswith(".parquet"))
                    first = st.st_size + 1 if whole else DETECT_BYTES
                    head = _read(fh, first, fp, 1)
                except OSError as exc:
                    raise InputError(f"input: cannot read the file ({exc.strerror or exc})", path=str(fp)) from exc
                # Parquet is known from its head; a text format is detected below, over the data read
                fmt = opts.fmt if opts.fmt != "auto" else (
                    "parquet" if head[:4] == b"PAR1" or fp.name.lower().endswith(".parquet") else "job")
                if select_line_format(opts.line_formats, str(fp)) is not None:
                    fmt = LINE_FORMAT    # a site line format fits this path: it reads the file (TextParser)
                if fmt == "parquet":
                    fh.close()
                    yield from flush_group()
                    stats = collections.Counter(files=1, input_bytes=st.st_size)
                    for b in _parquet_batches(fp, opts, seq, dedup, stats):
                        seq = b.stats.pop("_next_seq")
                        yield b
                        stats = collections.Counter()
                    readable += 1
                    continue
                if fmt == "auto" or (fmt not in TEXT_FORMATS and fmt != LINE_FORMAT):
                    raise InputError(f"input: unknown format {fmt!r}", path=str(fp))
                # whole and small: parsed with the other small files
                data = head
                if len(head) == first:
                    data = head + _read(fh, small + 1 - len(head), fp, None)
                if gz and fh.error and not data:
                    raise InputError(f"input: {fh.error}", path=str(fp), line=1)
                if opts.fmt == "auto" and fmt != LINE_FORMAT:   # the head may be junk: the first region that shows a format decides
                    fmt = detect_format_scan(str(fp), data)
                if len(data) <= small and fmt != LINE_FORMAT:     # site line formats: TextParser, file by file
                    if gz and fh.error:
                        cut = data.rfind(b"\n") + 1
                        group_quar.append(_truncated(fp, data.count(b"\n") + 1, data[cut:], fh.error, extra))
                        data = data[:cut]
                    group.append(WholeFile(str(fp), data, mtime_ns, fmt))
                    extra["input_bytes"] += st.st_size
                    readable += 1
                    group_bytes += len(data)
                    if group_bytes >= min(_chunk_bytes(opts), GROUP_BYTES) or len(group) >= GROUP_FILES:
                        submit()               # parsed in the parse thread while the next group is read
                        yield from finish(1)   # the group before it: finished and handed out
                    continue
                yield from flush_group()
                box = [seq]
                yield from _stream_file(fp, fh, gz, fmt, data, mtime_ns, opts, box, dedup)
                extra["input_bytes"] += st.st_size
                seq = box[0]
                readable += 1
            except InputError as exc:
                if exc.path is None:
                    raise
                errors.append(exc)
                yield from flush_group()
                yield _unreadable(fp, exc, collections.Counter(files=1))
            finally:
                fh.close()
        yield from flush_group()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if errors and not readable and all_unreadable_raises:
        raise errors[0]


def _stream_file(fp: Path, fh: Any, gz: bool, fmt: str, data: bytes, mtime_ns: int, opts: ReadOptions,
                 seq: list[int], dedup: Deduper) -> Iterator[Batch]:
    """One large file, chunk by chunk (``TextParser``); ``seq[0]``: the first seq in, the next out."""
    stats: collections.Counter = collections.Counter(files=1)
    parser = TextParser(str(fp), opts, fmt, seq[0], dedup=dedup, mtime_ns=mtime_ns)
    if fmt == "dmesg" and opts.boot_time_ns is None:
        est = None if _is_fifo(fp) else _dmesg_boot_estimate(fp, gz, mtime_ns)   # a FIFO cannot be read twice
        parser.set_boot_time(est if est is not None else mtime_ns, inferred=True)
    size = _chunk_bytes(opts)
    while True:
        # read ahead: the last chunk is parsed with final=True (no separate flush pass)
        nxt = _read(fh, size, fp, parser._next_line) if data else b""
        err = fh.error if gz else None
        if err:      # cut short: parse what was read, name the first line not read whole
            b = parser.feed(data + nxt, final=False)
            line, partial = parser._next_line, parser._pending
            parser._pending = b""
            parser._over = False
            tail = parser.feed(b"", final=True)
            b = Batch(pl.concat([b.events, tail.events]), pl.concat([b.quarantine, tail.quarantine]),
                      b.stats + tail.stats)
            b.quarantine = pl.concat([b.quarantine, _truncated(fp, line, partial, err, b.stats)])
            b.stats.update(stats)
            yield b
            break
        final = not nxt
        b = parser.feed(data, final=final)
        b.stats.update(stats)
        stats = collections.Counter()
        if final or b.events.height or b.quarantine.height or b.stats:
            yield b
        if final:
            break
        data = nxt
    seq[0] = parser.next_seq


def read_paths(paths: Sequence[str | Path], opts: ReadOptions = DEFAULT_OPTIONS) -> ReadResult:
    """Read everything; events sorted by (time, seq). InputError when no events came out at all."""
    evs, qs = [], []
    stats: collections.Counter = collections.Counter()
    for b in iter_batches(paths, opts):
        if b.events.height:
            evs.append(b.events)
        if b.quarantine.height:
            qs.append(b.quarantine)
        stats.update(b.stats)
    events = pl.concat(evs) if evs else pl.DataFrame(schema=EVENT_SCHEMA)
    if events.height == 0:
        names = ", ".join(str(p) for p in paths)
        raise InputError("input: no events in the inputs", path=names, lines=stats.get("lines", 0),
                         quarantined=sum(q.height for q in qs))
    events = events.sort(["time", "seq"], nulls_last=True)
    quarantine = pl.concat(qs) if qs else empty_quarantine()
    for k in ("files", "bytes", "lines", "events", "malformed", "invalid_utf8", "oversized", "bad_timestamp",
              "out_of_order", "duplicates", "multiline_joined", "time_inferred", "format_mismatch"):
        stats.setdefault(k, 0)
    return ReadResult(events, quarantine, stats)


# --- VictoriaLogs records ----------------------------------------------------------------------
def events_from_vl_records(records: Iterable[dict[str, str]], opts: ReadOptions = DEFAULT_OPTIONS, seq_start: int = 0,
                           file: str = "victorialogs", *, dedup: Deduper | None = None) -> Batch:
    """VictoriaLogs rows (query / tail / export output, already JSON-decoded) -> events.

    ``file`` is ``victorialogs:<_stream_id>`` for rows that carry a stream id when ``file`` is the
    default; ``line`` is the row's 1-based position in ``records``. A row without a parseable
    ``_time`` is malformed (quarantined, not an event). Pass one ``dedup`` across calls to drop
    rows a tail reconnect sends twice."""
    keys = vl_columns(opts.host_fields)
    schema = {k: pl.String for k in keys}
    rows = records if isinstance(records, list) else list(records)
    n = len(rows)
    df = None
    if all(isinstance(r, dict) for r in rows):
        try:   # fast path: Polars builds the columns natively; raw text only as JSON of the known fields
            df = pl.from_dicts(rows, schema=schema, strict=False) if n else pl.DataFrame(schema=schema)
            raw = pl.struct(list(keys)).struct.json_encode().str.replace_all(r'"[^"]*":null,?', "").str.replace(
                r",\}$", "}")
            df = df.with_columns(text=raw.str.slice(0, 4096),
                                 valid=pl.lit(True), lineno=pl.int_range(1, n + 1, dtype=pl.Int64))
        except pl.exceptions.PolarsError:
            df = None
    if df is None:    # a row that is not a dict, or values Polars will not turn into strings
        cols: dict[str, list] = {k: [] for k in keys}
        raws, valid = [], []
        for r in rows:
            is_dict = isinstance(r, dict)
            valid.append(is_dict)
            raws.append(_raw_json(r))
            for k in keys:
                v = r.get(k) if is_dict else None
                cols[k].append(None if v is None else v if isinstance(v, str) else json.dumps(v))
        df = pl.DataFrame({**cols, "text": raws, "valid": valid, "lineno": list(range(1, n + 1))},
                          schema={**schema, "text": pl.String, "valid": pl.Boolean, "lineno": pl.Int64})
    return events_from_vl_frame(df, opts, seq_start, file, dedup=dedup)


def events_from_vl_frame(df: pl.DataFrame, opts: ReadOptions = DEFAULT_OPTIONS, seq_start: int = 0,
                         file: str = "victorialogs", *, dedup: Deduper | None = None) -> Batch:
    """A frame of VictoriaLogs fields (String columns, plus ``text``, ``valid``, ``lineno``) ->
    events; see :func:`events_from_vl_records` (which builds the frame from decoded rows)."""
    n = df.height
    parsed = vl_frame_to_parsed(df, opts.host_fields)
    stats: collections.Counter = collections.Counter(lines=n)
    file_col = (pl.when(pl.col("stream_id").is_not_null()).then(pl.lit("victorialogs:") + pl.col("stream_id"))
                .otherwise(pl.lit(file)) if file == "victorialogs" else pl.lit(file))
    quar = []
    bad = parsed.filter(pl.col("malformed"))
    if bad.height:
        stats["malformed"] += bad.height
        quar.append(bad.select(file_col.alias("file"), pl.col("lineno").alias("line"),
                               pl.lit("malformed").alias("reason"), pl.col("text").str.slice(0, 4096).alias("raw")))
    ok = parsed.filter(~pl.col("malformed"))
    if opts.host is not None:
        ok = ok.with_columns(host=pl.lit(opts.host))
    if opts.job is not None:
        ok = ok.with_columns(job_id=pl.lit(opts.job))
    rec = ok.select(pl.col("ts"), pl.lit(True).alias("own_time"), pl.lit(False).alias("bad_ts"),
                    pl.col("text").alias("raw_first"), pl.coalesce("stream_id", pl.lit(file)).alias("ooo_key"),
                    "host", "job_id", "source", file_col.alias("file"), pl.col("lineno").alias("line"),
                    "stream_id", "rank", "message", "level")
    events, q = Finisher(file, seq_start, dedup if dedup is not None else Deduper(enabled=opts.dedupe)).finish(
        rec, stats)
    if q.height:
        quar.append(q)
    return Batch(events, pl.concat(quar) if quar else empty_quarantine(), stats)


def _raw_json(r: object) -> str:
    try:
        return json.dumps(r, ensure_ascii=False)[:4096]
    except (TypeError, ValueError):
        return repr(r)[:4096]


# --- Parquet -----------------------------------------------------------------------------------
def _parquet_batches(fp: Path, opts: ReadOptions, seq: int, dedup: Deduper,
                     stats: collections.Counter) -> Iterator[Batch]:
    import pyarrow.parquet as pq  # heavy (~0.2 s to import): only when a Parquet file is read

    try:
        pf = pq.ParquetFile(fp)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise InputError(f"input: not a readable Parquet file ({exc})", path=str(fp)) from exc
    names = pf.schema_arrow.names
    missing = [c for c in ("time", "message") if c not in names]
    if missing:
        raise InputError("input: Parquet file is not in the event schema", path=str(fp), missing=missing)
    fin = Finisher(str(fp), seq, dedup)
    row = 0
    for rb in pf.iter_batches(batch_size=max(1024, opts.batch_lines)):
        df = pl.from_arrow(rb)
        assert isinstance(df, pl.DataFrame)
        st = stats.copy() if row == 0 else collections.Counter()
        st["lines"] += df.height
        traw = df["time"].cast(pl.String, strict=False)
        df = _conform_parquet(df, fp).with_columns(
            line=pl.coalesce("line", pl.int_range(row + 1, row + 1 + df.height, dtype=pl.Int64)))
        bad_t = df["time"].is_null()
        quar = []
        if bad_t.any():     # no usable time: counted and kept aside, never an event with a null time
            bad = df.with_columns(_traw=traw).filter(bad_t)
            st["bad_timestamp"] += bad.height
            quar.append(bad.select(
                pl.coalesce("file", pl.lit(str(fp))).alias("file"), "line",
                pl.lit(QuarantineReason.BAD_TIMESTAMP.value).alias("reason"),
                pl.concat_str([pl.lit("time="), pl.col("_traw").fill_null("null"), pl.lit(" message="),
                               pl.col("message").fill_null("")]).str.slice(0, 4096).alias("raw")))
            df = df.filter(~bad_t)
        if opts.host is not None:
            df = df.with_columns(host=pl.lit(opts.host))
        if opts.job is not None:
            df = df.with_columns(job_id=pl.lit(opts.job))
        inferred = pl.col("time_inferred").fill_null(False)
        rec = df.with_columns(
            ts=pl.col("time").dt.epoch("ns"), own_time=~inferred & pl.col("time").is_not_null(),
            bad_ts=pl.lit(False), raw_first=pl.col("message").str.slice(0, 4096),
            ooo_key=pl.coalesce("stream_id", pl.lit(str(fp))),
            file=pl.coalesce("file", pl.lit(str(fp))),
        )
        row += traw.len()
        events, q = fin.finish(rec, st)
        st["_next_seq"] = fin.next_seq
        yield Batch(events, pl.concat([*quar, q]) if quar else q, st)
    if row == 0:
        st = stats.copy()
        st["_next_seq"] = fin.next_seq
        yield Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(), st)


def _conform_parquet(df: pl.DataFrame, fp: Path) -> pl.DataFrame:
    t = df.schema["time"]
    if not isinstance(t, pl.Datetime):
        if t == pl.String:
            df = df.with_columns(time=rfc3339_to_time_expr(pl.col("time")))
        else:
            raise InputError("input: Parquet column 'time' is not a datetime", path=str(fp), dtype=str(t))
    elif t.time_zone is None:
        df = df.with_columns(time=pl.col("time").dt.cast_time_unit("ns").dt.replace_time_zone("UTC"))
    else:
        df = df.with_columns(time=pl.col("time").dt.cast_time_unit("ns").dt.convert_time_zone("UTC"))
    bad = []
    for name, dtype in EVENT_SCHEMA.items():
        if name in df.columns and name != "time":
            try:
                df.select(pl.col(name).cast(dtype, strict=True))
            except Exception:  # noqa: BLE001 - any cast failure means the column is incompatible
                bad.append(f"{name}:{df.schema[name]}")
    if bad:
        raise InputError("input: Parquet columns do not fit the event schema", path=str(fp), columns=bad)
    out = conform(df, EVENT_SCHEMA)
    return out.with_columns(time=pl.col("time").cast(TIME))

