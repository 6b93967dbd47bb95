"""Following VictoriaLogs live without loss: tail + catch-up + deduplication (:class:`VLFollower`).

Contract (see also ``recovery_logs.pipeline.watch``): ``poll()`` blocks at most for one
catch-up query (never, with ``background_catchup``, where a thread runs them); it returns the
rows that are new since the last call (deduplicated by ``(_stream_id, _time ns, hash(_msg))``,
see :mod:`recovery_logs.sources.rowkeys`), sorted by ``_time``. The live tail runs in a daemon
thread and reconnects forever with backoff (a reconnect replays ``start_offset``; the
duplicates are dropped here). Because the server's tail is lossy (5 s re-scan window,
same/older timestamps per stream dropped, rows lost around restarts), every ``catchup_s`` a
``/query`` over ``[complete - lateness, now - offset]`` reads what the tail missed.
``complete_ns`` only moves after a catch-up query finished (a cut stream is a failed read): it
is the resume point persisted in the watch cursor.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from recovery_logs.errors import VictoriaLogsError
from recovery_logs.sources.rowkeys import SeenKeys, record_key
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.timeutil import NS, parse_duration_s

__all__ = ["VLFollower"]

log = logging.getLogger("recovery_logs.watch")






class VLFollower:
    """Live tail + catch-up queries + deduplication over one VictoriaLogs query."""

    def __init__(self, client: VictoriaLogsClient, query: str, *, fields: Sequence[str] | None = None,
                 lateness_s: float = 30.0, catchup_s: float = 5.0, tail_offset: str = "1s",
                 tail_start_offset: str = "5s", refresh: str = "1s", resume_from_ns: int | None = None,
                 clock: Callable[[], int] = time.time_ns, max_keys: int = 2_000_000,
                 reconnect_backoff_s: float = 0.5, reconnect_max_s: float = 10.0, use_tail: bool = True,
                 tail_client: VictoriaLogsClient | None = None, background_catchup: bool = False,
                 max_window_s: float = 300.0) -> None:
        self.client = client
        self.tail_client = tail_client or client.clone(retries=0, tail_idle_timeout=None)
        self.query = query
        self.fields = list(fields) if fields else None
        self.lateness_ns = int(lateness_s * NS)
        self.catchup_ns = int(catchup_s * NS)
        self.tail_offset, self.tail_start_offset, self.refresh = tail_offset, tail_start_offset, refresh
        self.offset_ns = int(parse_duration_s(tail_offset) * NS)
        self.replay_ns = int(parse_duration_s(tail_start_offset) * NS)
        self.clock = clock
        self.dedupe = SeenKeys(max_keys)
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






