"""Following live sources without loss: VictoriaLogs tail + catch-up, ``tail -F`` of files,
deduplication with bounded memory, and the persisted watch cursor.

Contracts (see also ``recovery_logs.watch``):

* :class:`VLFollower` — ``poll()`` blocks at most for one catch-up query (never, with
  ``background_catchup``, where a thread runs them); it returns the
  rows that are new since the last call (deduplicated by ``(_stream_id, _time ns, hash(_msg))``),
  sorted by ``_time``. The live tail runs in a daemon thread and reconnects forever with
  backoff (a reconnect replays ``start_offset``; the duplicates are dropped here). Because the
  server's tail is lossy (5 s re-scan window, same/older timestamps per stream dropped, rows
  lost around restarts), every ``catchup_s`` a ``/query`` over
  ``[complete - lateness, now - offset]`` reads what the tail missed. ``complete_ns`` only
  moves after a catch-up query finished (a cut stream is a failed read): it is the resume
  point persisted in the cursor.
* :class:`FileFollower` — ``poll()`` returns the bytes appended to each followed file since
  the last call, only whole lines. New files matching a glob are picked up; a rotated file
  (new inode at the path) is read to its end, then the new file from 0; a truncated file is
  read again from 0. Offsets are persisted so a restart resumes where it stopped.
* :class:`WatchCursor` — JSON in ``--state-dir``, written atomically (tmp + rename).
* :func:`history_batches` — lossless paging of ``/query`` by time for replay.
"""

from __future__ import annotations

import calendar
import glob as _glob
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery_logs.errors import ConfigError, InputError, VictoriaLogsError
from recovery_logs.sources.victorialogs import VictoriaLogsClient

__all__ = ["Deduper", "FileFollower", "VLFollower", "WatchCursor", "history_batches", "record_key",
           "vl_time_ns"]

log = logging.getLogger("recovery_logs.watch")
NS = 1_000_000_000


# --------------------------------------------------------------------------- time and keys
_SEC_CACHE: dict[str, int] = {}


def vl_time_ns(text: str) -> int:
    """``2026-11-29T14:06:00.123456789Z`` (0-9 fraction digits, Z) -> integer ns. ValueError if not."""
    head = text[:19]
    sec = _SEC_CACHE.get(head)
    if sec is None:
        if len(text) < 20 or text[-1] not in "Zz" or text[4] != "-" or text[10] not in "Tt ":
            raise ValueError(f"not a VictoriaLogs _time: {text!r}")
        try:
            sec = calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                                   int(text[14:16]), int(text[17:19]), 0, 0, 0))
        except ValueError as exc:
            raise ValueError(f"not a VictoriaLogs _time: {text!r}") from exc
        if len(_SEC_CACHE) > 4096:
            _SEC_CACHE.clear()
        _SEC_CACHE[head] = sec
    frac = text[20:-1] if len(text) > 20 and text[19] == "." else ""
    if len(text) > 20 and text[19] != ".":
        raise ValueError(f"not a VictoriaLogs _time: {text!r}")
    if frac and (len(frac) > 9 or not frac.isdigit()):
        raise ValueError(f"not a VictoriaLogs _time: {text!r}")
    return sec * NS + (int(frac.ljust(9, "0")) if frac else 0)


def record_key(row: dict[str, str]) -> tuple[str, int, bytes]:
    """Identity of a row: (stream id, _time ns, 8-byte hash of _msg). Time -1 when unparseable."""
    sid = row.get("_stream_id") or row.get("_stream") or ""
    try:
        t = vl_time_ns(row.get("_time", ""))
    except ValueError:
        t = -1
    h = hashlib.blake2b(row.get("_msg", "").encode("utf-8", "replace"), digest_size=8).digest()
    return (sid, t, h)


class Deduper:
    """Remembers row keys in one-second buckets. ``evict_before(t)`` forgets keys older than
    ``t``; above ``max_keys`` the oldest buckets are dropped (counted in ``forced``), so memory
    is bounded whatever the input."""

    def __init__(self, max_keys: int = 2_000_000, bucket_ns: int = NS) -> None:
        self.max_keys = max_keys
        self.bucket_ns = bucket_ns
        self._buckets: dict[int, set[tuple[str, int, bytes]]] = {}
        self._size = 0
        self.forced = 0

    def __len__(self) -> int:
        return self._size

    def add(self, key: tuple[str, int, bytes]) -> bool:
        """True if the key is new (and remembers it), False for a duplicate."""
        b = key[1] // self.bucket_ns
        bucket = self._buckets.get(b)
        if bucket is None:
            bucket = self._buckets[b] = set()
        elif key in bucket:
            return False
        bucket.add(key)
        self._size += 1
        if self._size > self.max_keys:
            oldest = min(self._buckets)
            self._size -= len(self._buckets.pop(oldest))
            self.forced += 1
        return True

    def evict_before(self, t_ns: int) -> int:
        limit = t_ns // self.bucket_ns
        old = [b for b in self._buckets if b < limit]
        n = 0
        for b in old:
            n += len(self._buckets.pop(b))
        self._size -= n
        return n


# --------------------------------------------------------------------------- cursor
@dataclass
class WatchCursor:
    """Persisted watch state: the VictoriaLogs resume point, file offsets, and the incidents
    already reported (id -> last printed version) so a restart never re-reports them."""

    path: Path | None
    complete_ns: int | None = None
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_reported: int = 20_000

    @classmethod
    def load(cls, state_dir: Path | None, name: str) -> WatchCursor:
        if state_dir is None:
            return cls(None)
        try:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"state directory cannot be created: {exc}", path=str(state_dir)) from exc
        path = Path(state_dir) / f"watch-{name}.json"
        if not path.exists():
            return cls(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"watch cursor is unreadable: {exc}", path=str(path)) from exc
        return cls(path, doc.get("complete_ns"), doc.get("files", {}), doc.get("reported", {}))

    def save(self) -> None:
        if self.path is None:
            return
        if len(self.reported) > self.max_reported:   # bounded: keep the most recently seen
            keep = sorted(self.reported.items(), key=lambda kv: kv[1].get("last_seen", 0))[-self.max_reported:]
            self.reported = dict(keep)
        doc = {"version": 1, "complete_ns": self.complete_ns, "files": self.files, "reported": self.reported}
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ConfigError(f"watch cursor cannot be written: {exc}", path=str(self.path)) from exc


def cursor_name(sources: Sequence[str], query: str | None) -> str:
    return hashlib.sha256(json.dumps([sorted(sources), query or ""]).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- VictoriaLogs
class VLFollower:
    """Live tail + catch-up queries + deduplication over one VictoriaLogs query."""

    def __init__(self, client: VictoriaLogsClient, query: str, *, fields: Sequence[str] | None = None,
                 lateness_s: float = 30.0, catchup_s: float = 5.0, tail_offset: str = "1s",
                 tail_start_offset: str = "5s", refresh: str = "1s", resume_from_ns: int | None = None,
                 clock: Callable[[], int] = time.time_ns, max_keys: int = 2_000_000,
                 reconnect_backoff_s: float = 0.5, reconnect_max_s: float = 10.0, use_tail: bool = True,
                 tail_client: VictoriaLogsClient | None = None, background_catchup: bool = False,
                 max_window_s: float = 300.0) -> None:
        from recovery_logs.timeutil import parse_duration_s

        self.client = client
        self.tail_client = tail_client or VictoriaLogsClient(client.base_url, connect_timeout=client.connect_timeout,
                                                             retries=0, tail_idle_timeout=None)
        self.query = query
        self.fields = list(fields) if fields else None
        self.lateness_ns = int(lateness_s * NS)
        self.catchup_ns = int(catchup_s * NS)
        self.tail_offset, self.tail_start_offset, self.refresh = tail_offset, tail_start_offset, refresh
        self.offset_ns = int(parse_duration_s(tail_offset) * NS)
        self.replay_ns = int(parse_duration_s(tail_start_offset) * NS)
        self.clock = clock
        self.dedupe = Deduper(max_keys)
        self.complete_ns = resume_from_ns          # rows up to here were handed out by poll()
        self._query_frontier: int | None = None    # rows up to here were read by a finished query
        self.background_catchup = background_catchup
        self.max_window_ns = int(max_window_s * NS)   # new ground one catch-up query may cover
        self._caught: list[tuple[list[dict[str, str]], int]] = []
        self._lock = threading.Lock()
        self._catch_thread: threading.Thread | None = None
        self._next_catchup = 0
        self.stats: Counter[str] = Counter()
        self.newest_ns: int | None = None
        self.last_error: str | None = None
        self.backoff_s, self.backoff_max_s = reconnect_backoff_s, reconnect_max_s
        self.use_tail = use_tail
        self._q: queue.Queue[dict[str, str]] = queue.Queue(maxsize=200_000)
        self.data_ready = threading.Event()   # set by the tail thread when rows are waiting
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # tail thread ------------------------------------------------------------------------
    def start(self) -> VLFollower:
        if self.use_tail and self._thread is None:
            self._thread = threading.Thread(target=self._tail_loop, daemon=True, name="vl-tail")
            self._thread.start()
        if self.background_catchup and self._catch_thread is None:
            self._catch_thread = threading.Thread(target=self._catchup_loop, daemon=True, name="vl-catchup")
            self._catch_thread.start()
        return self

    def _tail_loop(self) -> None:
        q = self.query if not self.fields else f"{self.query} | fields {', '.join(self.fields)}"
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                for row in self.tail_client.tail(q, start_offset=self.tail_start_offset, offset=self.tail_offset,
                                                 refresh_interval=self.refresh):
                    delay = self.backoff_s
                    try:
                        self._q.put(row, timeout=1.0)
                        self.data_ready.set()
                    except queue.Full:
                        self.stats["tail_overflow"] += 1   # the catch-up query reads it again
                    if self._stop.is_set():
                        return
            except VictoriaLogsError as exc:
                if self._stop.is_set():
                    return
                self.stats["errors_tail"] += 1
                self.last_error = str(exc)
                log.warning("VictoriaLogs tail: %s; reconnecting in %.1fs", exc, delay)
            self.stats["tail_reconnects"] += 1
            if self._stop.wait(delay):
                return
            delay = min(self.backoff_max_s, delay * 2)

    def close(self) -> None:
        self._stop.set()
        self.tail_client.close()
        for th in (self._thread, self._catch_thread):
            if th is not None:
                th.join(timeout=2.0)

    # poll -------------------------------------------------------------------------------
    def _accept(self, rows: list[dict[str, str]], out: list[tuple[int, dict[str, str]]]) -> None:
        for row in rows:
            key = record_key(row)
            if not self.dedupe.add(key):
                self.stats["duplicates"] += 1
                continue
            self.stats["lines_read"] += 1
            out.append((key[1], row))
            if key[1] >= 0 and (self.newest_ns is None or key[1] > self.newest_ns):
                self.newest_ns = key[1]

    def _window(self, now_ns: int) -> tuple[int, int]:
        hi = now_ns - self.offset_ns
        done = self._query_frontier if self._query_frontier is not None else self.complete_ns
        lo = (done - self.lateness_ns) if done is not None else hi - self.lateness_ns
        # after a long outage, catch up in bounded windows (each one query) rather than one huge read
        return lo, min(hi, lo + self.lateness_ns + self.max_window_ns)

    @property
    def behind(self) -> bool:
        """True while catch-up windows are still being capped (reading an outage back)."""
        done = self._query_frontier if self._query_frontier is not None else self.complete_ns
        return done is not None and self.clock() - self.offset_ns - done > self.max_window_ns

    def catch_up(self, now_ns: int) -> tuple[list[dict[str, str]], int]:
        """One ``/query`` over ``[complete - lateness, now - offset]``; returns (rows, hi).
        Raises VictoriaLogsError (a cut stream too): the frontier does not move then."""
        lo, hi = self._window(now_ns)
        rows = list(self.client.query(self.query, start=lo, end=hi, fields=self.fields))
        self._query_frontier = hi if self._query_frontier is None else max(self._query_frontier, hi)
        self.stats["catchups"] += 1
        return rows, hi

    def _catchup_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                rows, hi = self.catch_up(self.clock())
                with self._lock:
                    self._caught.append((rows, hi))
                self.data_ready.set()
            except VictoriaLogsError as exc:
                if self._stop.is_set():
                    return
                self.stats["errors_catchup"] += 1
                self.last_error = str(exc)
                log.warning("VictoriaLogs catch-up: %s; retrying in %.1fs", exc, self.catchup_ns / NS)
            pause = 0.05 if self.behind else max(0.05, self.catchup_ns / NS - (time.monotonic() - started))
            if self._stop.wait(pause):
                return

    def poll(self, now_ns: int | None = None, force_catchup: bool = False) -> list[dict[str, str]]:
        """New rows since the last poll, deduplicated, sorted by ``_time`` (then arrival).
        ``complete_ns`` moves only here, once a finished catch-up's rows are handed out."""
        now = self.clock() if now_ns is None else now_ns
        got: list[tuple[int, dict[str, str]]] = []
        drained: list[dict[str, str]] = []
        self.data_ready.clear()
        while True:
            try:
                drained.append(self._q.get_nowait())
            except queue.Empty:
                break
        self._accept(drained, got)
        caught: list[tuple[list[dict[str, str]], int]] = []
        if self.background_catchup and self._catch_thread is not None:
            with self._lock:
                caught, self._caught = self._caught, []
        elif force_catchup or now >= self._next_catchup:
            self._next_catchup = now if self.behind else now + self.catchup_ns
            try:
                caught.append(self.catch_up(now))
                self.last_error = None
            except VictoriaLogsError as exc:
                self.stats["errors_catchup"] += 1
                self.last_error = str(exc)
                log.warning("VictoriaLogs catch-up: %s; retrying in %.1fs", exc, self.catchup_ns / NS)
        for rows, hi in caught:
            self._accept(rows, got)
            self.complete_ns = hi if self.complete_ns is None else max(self.complete_ns, hi)
            self.last_error = None
        horizon = min((self.complete_ns or now) - self.lateness_ns, now - self.offset_ns - self.replay_ns) - NS
        self.dedupe.evict_before(horizon)
        got.sort(key=lambda tr: tr[0])
        return [r for _, r in got]

    def lag_s(self, now_ns: int | None = None) -> float | None:
        """How far the lossless read is behind now: ``now - complete_ns`` (None before the first
        finished catch-up). Includes the tail ``offset`` and up to one catch-up interval."""
        now = self.clock() if now_ns is None else now_ns
        return None if self.complete_ns is None else max(0.0, (now - self.complete_ns) / NS)


# --------------------------------------------------------------------------- history paging
def history_rows(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                 page_size: int = 50_000, fields: Sequence[str] | None = None) -> Iterator[list[dict[str, str]]]:
    """Pages of rows over ``[start_ns, end_ns]`` in ``_time`` order, each row exactly once.

    Each page is ``{query} | sort by (_time) | limit N`` from the last page's last timestamp
    (inclusive); rows at that timestamp already returned are skipped by key. A page made only
    of one timestamp is completed by reading that single timestamp without a limit.
    """
    if page_size < 1:
        raise ConfigError("page_size must be >= 1", value=page_size)
    proj = f" | fields {', '.join(fields)}" if fields else ""
    cur = start_ns
    seen_at_cur: set[tuple[str, int, bytes]] = set()
    while cur <= end_ns:
        rows = list(client.query(f"{query}{proj} | sort by (_time) | limit {page_size}", start=cur, end=end_ns))
        keyed = [(record_key(r), r) for r in rows]
        fresh = [(k, r) for k, r in keyed if k not in seen_at_cur]
        if len(rows) < page_size:
            if fresh:
                yield [r for _, r in fresh]
            return
        last_t = keyed[-1][0][1]
        if keyed[0][0][1] == last_t:   # the whole page is one timestamp: read it whole, move past it
            whole = list(client.query(f"{query}{proj}", start=last_t, end=last_t))
            extra = [r for r in whole if record_key(r) not in seen_at_cur]
            if extra:
                yield extra
            cur, seen_at_cur = last_t + 1, set()
            continue
        if fresh:
            yield [r for _, r in fresh]
        seen_at_cur = {k for k, _ in keyed if k[1] == last_t}   # last_t > cur here: a page spans >1 time
        cur = last_t


def history_batches(base_url: str, query: str, start_ns: int, end_ns: int, opts: Any = None,
                    page_size: int = 50_000, client: VictoriaLogsClient | None = None) -> Iterator[Any]:
    """``replay --source victorialogs://...``: Batches (sources.files.Batch) over a time range,
    read losslessly by paging ``/query`` in ``_time`` order."""
    from recovery_logs.sources.files import ReadOptions, events_from_vl_records
    from recovery_logs.sources.formats import vl_columns

    opts = opts or ReadOptions()
    c = client or VictoriaLogsClient(base_url)
    fields = list(vl_columns(tuple(getattr(opts, "host_fields", ("host", "hostname", "host.name", "_HOSTNAME")))))
    seq = 0
    for rows in history_rows(c, query, start_ns, end_ns, page_size, fields):
        batch = events_from_vl_records(rows, opts, seq_start=seq, file=f"victorialogs:{c.base_url}")
        if seq:   # `line` is the row's position in the whole read, as in one big export
            batch.events = batch.events.with_columns(line=batch.events["line"] + seq)
            if batch.quarantine.height:
                batch.quarantine = batch.quarantine.with_columns(line=batch.quarantine["line"] + seq)
        seq += len(rows)
        yield batch


# --------------------------------------------------------------------------- files
@dataclass
class _Followed:
    path: str
    fh: Any
    dev: int
    ino: int
    offset: int
    partial: bytes = b""


class FileFollower:
    """``tail -F`` over paths and globs; only whole lines are returned."""

    def __init__(self, patterns: Sequence[str], offsets: dict[str, dict[str, int]] | None = None,
                 from_start: bool = True, read_max: int = 8 << 20) -> None:
        self.patterns = list(patterns)
        self.offsets = offsets if offsets is not None else {}
        self.from_start = from_start
        self.read_max = read_max
        self.files: dict[str, _Followed] = {}
        self.stats: Counter[str] = Counter()

    def _expand(self) -> list[str]:
        out: list[str] = []
        for pat in self.patterns:
            hits = sorted(_glob.glob(pat)) if _glob.has_magic(pat) else [pat]
            out.extend(h for h in hits if h not in out)
        return out

    def _open(self, path: str, resume: bool) -> _Followed | None:
        try:
            fh = open(path, "rb")  # noqa: SIM115 - kept open while followed
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"cannot open followed file: {exc}", path=path) from exc
        st = os.fstat(fh.fileno())
        off = 0
        saved = self.offsets.get(path)
        if resume and saved and saved.get("dev") == st.st_dev and saved.get("ino") == st.st_ino \
                and saved.get("offset", 0) <= st.st_size:
            off = int(saved["offset"])
        elif resume and not self.from_start:
            off = st.st_size
        fh.seek(off)
        return _Followed(path, fh, st.st_dev, st.st_ino, off)

    def _read(self, f: _Followed) -> bytes:
        data = f.fh.read(self.read_max)
        if not data:
            return b""
        f.offset += len(data)
        buf = f.partial + data
        cut = buf.rfind(b"\n") + 1
        f.partial = buf[cut:]
        self.offsets[f.path] = {"dev": f.dev, "ino": f.ino, "offset": f.offset - len(f.partial)}
        self.stats["bytes"] += cut
        return buf[:cut]

    def poll(self) -> list[tuple[str, bytes, bool]]:
        """``(path, whole lines, restarted)`` per file with new data; ``restarted`` is True when
        the file was rotated or truncated (a new parser should start)."""
        out: list[tuple[str, bytes, bool]] = []
        for path in self._expand():
            f = self.files.get(path)
            if f is None:
                f = self._open(path, resume=True)
                if f is None:
                    continue
                self.files[path] = f
                restarted = True
            else:
                restarted = False
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_ino != f.ino or st.st_dev != f.dev):
                tail = self._read(f) + f.partial       # rotated: finish the old file first
                if tail:
                    out.append((path, tail if tail.endswith(b"\n") else tail + b"\n", restarted))
                f.fh.close()
                self.stats["rotations"] += 1
                nf = self._open(path, resume=False)
                if nf is None:
                    del self.files[path]
                    continue
                f = self.files[path] = nf
                restarted = True
            elif st is not None and st.st_size < f.offset:
                self.stats["truncations"] += 1
                f.fh.seek(0)
                f.offset, f.partial = 0, b""
                restarted = True
            data = self._read(f)
            if data or restarted:
                out.append((path, data, restarted))
        return out

    def close(self) -> None:
        for f in self.files.values():
            f.fh.close()
        self.files.clear()
