"""Reading VictoriaLogs live without a tail and without losing late lines.

:class:`VLPoller` is the default live path of ``watch`` (``--live poll``). It never holds a
``/select/logsql/tail`` open — with one open, a real v1.26.0 server cannot shut down gracefully
and drops the rows it accepted in its last seconds — and it finds lines that arrive late behind
their ``_time`` (a shipper that buffered, a node that came back) up to ``horizon_s`` (default
6 h) without re-reading history:

* **Live**: every ``refresh`` one ``/select/logsql/query`` over ``(frontier, now - offset]``;
  ``frontier`` (the persisted ``complete_ns``) then moves to ``now - offset``. Windows never
  overlap, so each row is read once (re-read ratio 1.0 in steady state).
* **Reconciliation**: the time behind the frontier is cut into buckets (``tiers``: the last
  30 s in 2 s buckets checked every second, the last 10 min in 10 s buckets every 5 s, the last
  hour in 1 min buckets every 30 s, the rest of the horizon in 10 min buckets every 5 min). One cheap ``... | stats by (_time:STEP)
  count()`` query per tier gives the server's row count per bucket; a bucket whose count differs
  from the rows we read there is read again (only that bucket) and its rows we have not seen are
  handed out, marked late (``LATE_FIELD``). With a ``count_query`` (watch passes the scope
  without the rule prefilter) the counts are of every line of the scope: counting them needs no
  scan of the messages, so reconciling the whole horizon costs the server little; the count of a
  window is always taken *before* its rows are read, so a row the count saw was read. The count we keep is what the server had at our last
  read of the bucket, so a bucket whose rows the server lost (SIGKILL) and later gained is still
  noticed.
* **Delta re-reads** (local selection): for the fine buckets of the last ``ids_s`` (90 s) the
  poller keeps the identity hash of every row it read and its rows per 250 ms slot. A changed
  bucket there is not read again whole (at 50 k lines/s a 2 s bucket is 100 k rows): the
  server's counts per slot name the slots that changed, only those are exported again, and only
  their rows whose identity is unknown are split, counted and handed out late. Older buckets
  are read again whole and their late lines found by the difference of the stored counts.
* **No duplicates**: every row handed out leaves a 64-bit digest of ``(_stream_id, _time ns,
  _msg)`` in its bucket; recent buckets keep Python sets, older ones sorted ``uint64`` arrays
  (8 bytes a row). Above ``max_keys`` the oldest buckets' digests are dropped and the horizon
  that can be reconciled shrinks (``stats["horizon_shrunk"]``, logged) — memory stays bounded
  whatever the rate.

``poll()`` returns rows sorted by ``_time``. ``reached`` says whether the server ever answered;
``fatal`` holds an error that retrying cannot clear (400 on our own query, 401/403).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from recovery_logs.errors import VictoriaLogsError
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.rowkeys import vl_time_ns
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.sources.vl_history import line_counts, present_fields
from recovery_logs.sources.vl_local import (
    LocalSplit,
    ProgressSpec,
    read_export,
    row_identity,
    split_frame,
    with_ts,
)

__all__ = ["DEFAULT_TIERS", "LATE_FIELD", "KeyLedger", "Tier", "VLPoller", "row_digest"]

log = logging.getLogger("recovery_logs.watch")
NS = 1_000_000_000
LATE_FIELD = "__recovery_logs_late"


@dataclass(frozen=True)
class Tier:
    """Reconcile ``(frontier - span_s, frontier - prev span]`` in ``step_s`` buckets every ``every_s``."""

    span_s: float
    step_s: int
    every_s: float


# the first tier catches rows that became searchable only after the live read passed them (the
# server makes rows visible ~1-1.3 s after the insert, later under load): 2 s buckets every 1 s
DEFAULT_TIERS = (Tier(30, 2, 1.0), Tier(600, 10, 5.0), Tier(3600, 60, 30.0), Tier(6 * 3600, 600, 300.0))


def row_digest(row: dict[str, str], t_ns: int) -> int:
    sid = row.get("_stream_id") or row.get("_stream") or ""
    h = hashlib.blake2b(digest_size=8)
    h.update(sid.encode())
    h.update(t_ns.to_bytes(8, "little", signed=True))
    h.update(row.get("_msg", "").encode("utf-8", "replace"))
    return int.from_bytes(h.digest(), "little")


class KeyLedger:
    """Per time bucket: rows the server had there at our last read, and digests of rows handed out."""

    def __init__(self, bucket_ns: int, max_keys: int = 20_000_000, hot_ns: int = 120 * NS) -> None:
        self.bucket_ns = bucket_ns
        self.max_keys = max_keys
        self.hot_ns = hot_ns
        self.count: dict[int, int] = {}
        self.hot: dict[int, set[int]] = {}
        self.cold: dict[int, np.ndarray] = {}
        self.size = 0
        self.floor: int | None = None       # buckets below this have no digests any more (not reconcilable)

    def __len__(self) -> int:
        return self.size

    def bucket(self, t_ns: int) -> int:
        return t_ns // self.bucket_ns

    def has(self, b: int, d: int) -> bool:
        s = self.hot.get(b)
        if s is not None:
            return d in s
        arr = self.cold.get(b)
        if arr is None:
            return False
        i = int(np.searchsorted(arr, np.uint64(d)))
        return i < arr.size and int(arr[i]) == d

    def add(self, b: int, d: int) -> bool:
        """True if new (and remembered)."""
        if self.has(b, d):
            return False
        if b in self.cold:             # a late row in an old bucket: back to a set until compacted again
            self.hot[b] = set(int(x) for x in self.cold.pop(b))
        self.hot.setdefault(b, set()).add(d)
        self.size += 1
        return True

    def compact(self, now_bucket: int) -> None:
        """Buckets older than ``hot_ns`` become sorted uint64 arrays; enforce ``max_keys``."""
        limit = now_bucket - self.hot_ns // self.bucket_ns
        for b in [b for b in self.hot if b < limit]:
            self.cold[b] = np.fromiter(self.hot.pop(b), dtype=np.uint64)
            self.cold[b].sort()
        while self.size > self.max_keys and (self.cold or self.hot):
            oldest = min([*self.cold, *self.hot])
            gone = self.cold.pop(oldest, None)
            n = gone.size if gone is not None else len(self.hot.pop(oldest))
            self.size -= n
            self.count.pop(oldest, None)
            self.floor = oldest + 1 if self.floor is None else max(self.floor, oldest + 1)

    def evict_before(self, b0: int) -> None:
        for b in [b for b in self.count if b < b0]:
            del self.count[b]
        for store in (self.hot, self.cold):
            for b in [b for b in store if b < b0]:
                x = store.pop(b)
                self.size -= x.size if isinstance(x, np.ndarray) else len(x)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.cold.values()) + 72 * sum(len(s) for s in self.hot.values())


_STORE_SCHEMA = {"fb": pl.Int64, "kind": pl.String, "host": pl.String, "job_id": pl.String, "step": pl.Int64,
                 "lines": pl.Int64, "first": pl.Int64, "last": pl.Int64}
# the same as held (the poller's largest structure at fleet rates, ~a row per host/job/step and
# fine bucket of the last store_s): the few distinct kinds, hosts and jobs as categoricals (4
# bytes a row instead of a 16-byte string view each), a fine bucket's count as Int32 — 48 bytes a
# row against 88
_HELD_SCHEMA = pl.Schema(_STORE_SCHEMA)
for _c in ("kind", "host", "job_id"):
    _HELD_SCHEMA[_c] = pl.Categorical()
_HELD_SCHEMA["lines"] = pl.Int32()


def _held(store: pl.DataFrame) -> pl.DataFrame:
    return store.select(list(_STORE_SCHEMA)).cast(_HELD_SCHEMA)


def _plain(store: pl.DataFrame) -> pl.DataFrame:
    return store.cast(pl.Schema(_STORE_SCHEMA))


class VLPoller:
    """Poll ``/query`` with a time cursor + bucket-count reconciliation (see the module doc)."""

    def __init__(self, client: VictoriaLogsClient, query: str, *, fields: Sequence[str] | None = None,
                 refresh_s: float = 1.0, offset_s: float = 2.0, resume_from_ns: int | None = None,
                 horizon_s: float = 6 * 3600, tiers: Sequence[Tier] = DEFAULT_TIERS,
                 clock: Callable[[], int] = time.time_ns, max_keys: int = 20_000_000,
                 max_window_s: float = 60.0, reconcile: bool = True, count_query: str | None = None,
                 line_window_ns: int | None = None, read: ReadOptions | None = None,
                 split: LocalSplit | None = None, store_s: float = 660.0, ids_s: float = 90.0,
                 sub_ms: int = 250) -> None:
        self.client = client
        self.query = query
        self.count_query = count_query if count_query and count_query != query else None
        # With a prefilter (count_query set) and line_window_ns: every poll also asks the server for
        # the scope's lines per (host, job, window) (sources.vl_history.line_counts), so the engine's
        # window line counts (log rate, the anomaly model's features) cover every line, not only the
        # prefiltered rows it is sent; taken by the watcher with take_counts().
        self.line_window_ns = line_window_ns if self.count_query is not None else None
        self.read = read or ReadOptions()
        # split (local selection, the default of watch): each poll exports every row of the scope
        # (count_query) and selects, counts and summarises them here (sources.vl_local), instead of
        # the server testing the prefilter's literals on every message; progress lines come out as
        # counts (take_progress), the lines per (host, job, window) as counts (take_counts)
        self.split = split if split is not None and self.count_query is not None else None
        if self.split is not None:
            self.line_window_ns = None
        self._progress: list[tuple[ProgressSpec, pl.DataFrame]] = []
        # per fine bucket of the last store_s: lines (and progress lines) counted per host/job(/step),
        # so a re-read bucket's late lines are counted once (the difference), never twice
        self.store_ns = int(store_s * NS)
        self._store = pl.DataFrame(schema=_HELD_SCHEMA)
        self._store_parts: list[pl.DataFrame] = []
        self.max_rows = 250_000          # local split: rows one live read aims at (window sized by the last rate)
        self._row_rate = 0.0
        self._counts: list[pl.DataFrame] = []
        self.fields = list(fields) if fields else None
        self.refresh_ns = int(refresh_s * NS)
        self.offset_ns = int(offset_s * NS)
        self.horizon_ns = int(horizon_s * NS)
        self.tiers = [t for t in tiers if t.span_s <= horizon_s] or list(tiers[:1])
        if self.tiers[-1].span_s < horizon_s:
            self.tiers[-1] = Tier(horizon_s, self.tiers[-1].step_s, self.tiers[-1].every_s)
        fine = min(t.step_s for t in self.tiers)
        for t in self.tiers:
            if t.step_s % fine:
                raise ValueError(f"tier steps must be multiples of {fine}s: {t}")
        self.ledger = KeyLedger(fine * NS, max_keys=max_keys)
        self.reconcile_on = reconcile
        self.clock = clock
        self.complete_ns = resume_from_ns      # the frontier: rows up to here were read
        self.max_window_ns = int(max_window_s * NS)
        self._next_live = 0
        self._next_tier = [0] * len(self.tiers)
        self.stats: Counter[str] = Counter()
        self.newest_ns: int | None = None
        self.last_error: str | None = None
        self.fatal: VictoriaLogsError | None = None
        self.data_ready = threading.Event()
        self.late_rows: list[dict[str, str]] = []
        self._dirty: dict[int, int] = {}       # bucket start -> re-reads that came back short
        self._field_names = True               # ask /field_names which fields a read window has
        # local split: per fine bucket of the last ids_s, the identity hash of every row read there
        # and its rows per sub_ms slot, so a bucket that gained rows is read again only in the slots
        # whose server count changed, and only the rows not read before are split and counted
        self.ids_ns = int(ids_s * NS)
        self.sub_ns = int(sub_ms) * 1_000_000
        if self.ids_ns and self.ledger.bucket_ns % self.sub_ns:
            raise ValueError(f"sub_ms must divide the fine bucket ({self.ledger.bucket_ns // NS}s)")
        self._ids: dict[int, list[np.ndarray]] = {}
        self._sub: dict[int, np.ndarray] = {}
        self._ids_from: int | None = None      # first fine bucket read whole by this poller (the ones before: no ids)

    # follower protocol ---------------------------------------------------------------------
    def start(self) -> VLPoller:
        return self

    def close(self) -> None:
        self.client.close()

    @property
    def reached(self) -> bool:
        return self.client.reached

    @property
    def behind(self) -> bool:
        """True while the frontier is more than one window behind now (reading an outage back)."""
        return self.complete_ns is not None and self.clock() - self.offset_ns - self.complete_ns > self.max_window_ns

    def lag_s(self, now_ns: int | None = None) -> float | None:
        now = self.clock() if now_ns is None else now_ns
        return None if self.complete_ns is None else max(0.0, (now - self.complete_ns) / NS)

    def mark_seen(self, rows: Sequence[dict[str, str]]) -> None:
        """Rows read elsewhere (an engine rebuild): remember them so they are never handed out."""
        for r in rows:
            try:
                t = vl_time_ns(r.get("_time", ""))
            except ValueError:
                continue
            self.ledger.add(self.ledger.bucket(t), row_digest(r, t))

    # reading ------------------------------------------------------------------------------
    def _fail(self, what: str, exc: VictoriaLogsError) -> None:
        self.stats[f"errors_{what}"] += 1
        text = str(exc)
        if getattr(exc, "fatal", False):
            self.fatal = exc
        if text != self.last_error:     # the same failure again is counted, not printed again
            log.warning("VictoriaLogs %s: %s; retrying every %.1fs", what, exc.message, self.refresh_ns / NS)
        else:
            log.info("VictoriaLogs %s: %s", what, exc.message)
        self.last_error = text

    def _accept(self, rows: list[dict[str, str]], out: list[tuple[int, dict[str, str]]], late: bool,
                count: bool) -> None:
        led = self.ledger
        for row in rows:
            try:
                t = vl_time_ns(row.get("_time", ""))
            except ValueError:
                t = -1
            b = led.bucket(t)
            if count:
                led.count[b] = led.count.get(b, 0) + 1
            if not led.add(b, row_digest(row, t)):
                # a re-read bucket gives back the rows already handed out: expected, not a duplicate
                self.stats["reread_known" if late else "duplicates"] += 1
                continue
            self.stats["lines_read"] += 1
            if late:
                row = dict(row)
                row[LATE_FIELD] = "1"
                self.stats["late_found"] += 1
            out.append((t, row))
            if t >= 0 and (self.newest_ns is None or t > self.newest_ns):
                self.newest_ns = t

    def _live(self, now: int, out: list[tuple[int, dict[str, str]]]) -> None:
        hi = now - self.offset_ns
        lo = self.complete_ns if self.complete_ns is not None else hi - self.refresh_ns
        hi = min(hi, lo + self.max_window_ns)
        if hi <= lo:
            return
        if self.split is not None:
            if self._row_rate:      # every row comes: bound the rows of one read (a catch-up after an outage)
                hi = min(hi, lo + max(self.refresh_ns, int(self.max_rows / self._row_rate)))
            rows, store = self._read_local(lo + 1, hi)
            self.stats["polls"] += 1
            self.stats["catchups"] += 1
            self._accept(rows, out, late=False, count=False)
            self._store_parts.append(_held(store))
            self._hand_out(store)
            self.complete_ns = hi
            return
        counts = self._fine_counts(lo + 1, hi)    # first: a row seen here is then surely read below
        lines = self.scope_counts(lo + 1, hi)
        rows = list(self.client.query(self.query, start=lo + 1, end=hi, fields=self.fields))
        self.stats["polls"] += 1
        self.stats["catchups"] += 1     # each poll is a lossless read of its window (the tail mode's name)
        self.stats["rows_fetched"] += len(rows)
        self._accept(rows, out, late=False, count=counts is None)
        if lines is not None:
            self._counts.append(lines)
        if counts is not None:
            for b, n in counts.items():
                self.ledger.count[b] = self.ledger.count.get(b, 0) + n
        self.complete_ns = hi

    # local selection ------------------------------------------------------------------------
    def _read_local(self, lo: int, hi: int, delta: bool = False) -> tuple[list[dict[str, str]], pl.DataFrame]:
        """Every row of the scope in ``[lo, hi]``, split here: (rows the engine needs, as dicts;
        counts per fine bucket — lines per host/job, progress lines per host/job/step — in
        ``_STORE_SCHEMA``). The bucket totals (every row, as the server counts them) go into the
        ledger. ``delta`` (a re-read of slots whose rows are all known by identity, see
        :meth:`_track`): only the rows not read before are split, so the counts returned are
        the late lines alone; the ledger is left to the caller."""
        assert self.split is not None and self.count_query is not None
        keys = list(dict.fromkeys(self.fields or ["_time", "_stream_id", "_msg"]))
        if self.fields and self._field_names:   # only the fields the window's rows have (a cheaper parse)
            got = present_fields(self.client, self.count_query, lo, hi, keys)
            if got is None:       # not answered: every field asked for; after 3 such answers no longer asked
                self.stats["field_names_unanswered"] += 1
                self._field_names = self.stats["field_names_unanswered"] < 3
            else:
                keys = list(got)
        q = f"{self.count_query} | fields {', '.join(keys)}"
        body = self.client.query_bytes(q, lo, hi)
        df = read_export(body, keys, self.fields or ())
        del body
        if df.height:
            self._row_rate = df.height / max(1, hi - lo + 1)
        self.stats["rows_fetched"] += df.height
        self.stats["rows_counted"] += df.height
        df = with_ts(df).with_columns(row_identity().alias("__id"))
        if self.ids_ns:
            df = self._track(df, lo, hi, delta)
        fine = self.ledger.bucket_ns
        need, fc, prog = split_frame(df, replace(self.split, bucket_ns=fine), self.read)
        led = self.ledger
        tot = fc.group_by("bucket").agg((pl.col("lines") + pl.col("duplicates")).sum().alias("n"))
        untimed = df.height - int(tot["n"].sum() or 0) if tot.height else df.height
        for b, n in ([] if delta else tot.iter_rows()):
            led.count[b // fine] = led.count.get(b // fine, 0) + int(n)
        if untimed and not delta:
            led.count[-1] = led.count.get(-1, 0) + untimed
        parts = [fc.select((pl.col("bucket") // fine).alias("fb"), pl.lit("").alias("kind"), "host", "job_id",
                           pl.lit(None, pl.Int64).alias("step"), "lines", "first", "last")]
        for spec, pc in prog:
            if pc.height:
                parts.append(pc.select((pl.col("bucket") // fine).alias("fb"), pl.lit(spec.rule_id).alias("kind"),
                                       "host", "job_id", "step", "lines", "first", "last"))
                self.stats["progress_summarised"] += int(pc["lines"].sum())
        rows = [{k: v for k, v in r.items() if v is not None} for r in need.drop("_ts", "__id").to_dicts()]
        return rows, pl.concat(parts)

    def _tracked(self, fb0: int, fb1: int) -> bool:
        """Fine buckets ``fb0..fb1`` all have the identity of every row read there (see :meth:`_track`)."""
        floor = self._ids_from
        if floor is None or not self.ids_ns or fb0 < floor or self.complete_ns is None:
            return False
        return fb0 >= self.ledger.bucket(self.complete_ns - self.ids_ns) + 1

    def _track(self, df: pl.DataFrame, lo: int, hi: int, delta: bool) -> pl.DataFrame:
        """Remember the identity (``__id``) and ``sub_ns`` slot of every timed row of a read.
        ``delta``: ``[lo, hi]`` is slot-aligned and read again; its slots' counts become what
        this read saw and the rows returned are those not read before (their identity unknown)."""
        fine, sub = self.ledger.bucket_ns, self.sub_ns
        per = fine // sub
        if self._ids_from is None:
            self._ids_from = -(-lo // fine)             # the first bucket read whole
        ts = df["_ts"].fill_null(-1).to_numpy()
        ids = df["__id"].to_numpy()
        ok = ts >= 0
        keep: np.ndarray | None = None
        if delta:
            known = [a for b in range(lo // fine, hi // fine + 1) for a in self._ids.get(b, ())]
            keep = ok & ~np.isin(ids, np.concatenate(known)) if known else ok.copy()
            for g in range(lo // sub, hi // sub + 1):
                arr = self._sub.get(g // per)
                if arr is not None:
                    arr[g % per] = 0
        slots, n = np.unique(ts[ok] // sub, return_counts=True)
        for g, c in zip(slots.tolist(), n.tolist(), strict=True):
            b = g // per
            if b >= self._ids_from:
                arr = self._sub.get(b)
                if arr is None:
                    arr = self._sub[b] = np.zeros(per, dtype=np.int64)
                arr[g % per] += c
        sel = ok if keep is None else keep
        fb, idv = ts[sel] // fine, ids[sel]
        for b in np.unique(fb).tolist():
            if b >= self._ids_from:
                self._ids.setdefault(b, []).append(idv[fb == b])
        if keep is None:
            return df
        self.stats["reread_rows_known"] += int((ok & ~keep).sum())
        return df.filter(pl.Series(keep | ~ok))

    def _evict_ids(self) -> None:
        if self.complete_ns is None:
            return
        floor = self.ledger.bucket(self.complete_ns - self.ids_ns)
        for store in (self._ids, self._sub):
            for b in [b for b in store if b <= floor]:
                del store[b]

    def ids_nbytes(self) -> int:
        return sum(a.nbytes for parts in self._ids.values() for a in parts) + sum(a.nbytes for a in self._sub.values())

    def _reread_delta(self, lo: int, hi: int, out: list[tuple[int, dict[str, str]]]) -> None:
        """Tracked fine buckets ``[lo, hi]`` whose count changed: the server's rows per ``sub_ns``
        slot there (a timestamps-only query) name the slots that changed; only those are read
        again, and of their rows only the ones not read before are split, handed out late and
        counted (the late lines counted once, without re-reading a whole bucket)."""
        fine, sub = self.ledger.bucket_ns, self.sub_ns
        per = fine // sub
        rows = self.client.stats(f"{self.count_query} | stats by (_time:{sub // 1_000_000}ms) count() as n",
                                 start=lo, end=hi)
        self.stats["count_queries"] += 1
        server: dict[int, int] = {}
        for r in rows:
            try:
                server[vl_time_ns(r["_time"]) // sub] = int(r["n"])
            except (KeyError, ValueError):
                continue
        changed = []
        for g in range(lo // sub, hi // sub + 1):
            arr = self._sub.get(g // per)
            if server.get(g, 0) != (int(arr[g % per]) if arr is not None else 0):
                changed.append(g)
        runs: list[list[int]] = []
        for g in changed:
            if runs and runs[-1][1] == g - 1:
                runs[-1][1] = g
            else:
                runs.append([g, g])
        for g0, g1 in runs:
            got, store = self._read_local(max(lo, g0 * sub), min(hi, (g1 + 1) * sub - 1), delta=True)
            self.stats["slots_reread"] += g1 - g0 + 1
            self._accept(got, out, late=True, count=False)
            if store.height:
                self._store_parts.append(_held(store))
                self.stats["late_lines_counted"] += int(store.filter(pl.col("kind") == "")["lines"].sum())
                self._hand_out(store)
        for b in range(lo // fine, hi // fine + 1):
            arr = self._sub.get(b)
            self.ledger.count[b] = int(arr.sum()) if arr is not None else 0
        self.stats["buckets_reread"] += 1

    def _hand_out(self, store: pl.DataFrame) -> None:
        """Counts (``_STORE_SCHEMA``) -> line counts per engine window (take_counts) and progress
        counts per spec (take_progress)."""
        if store.height == 0:
            return
        assert self.split is not None
        fine, w = self.ledger.bucket_ns, self.split.bucket_ns
        win = (pl.col("fb") * fine // w * w).alias("bucket")
        lines = store.filter(pl.col("kind") == "")
        if lines.height:
            self._counts.append(lines.group_by(["host", "job_id", win]).agg(
                pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max()).with_columns(
                duplicates=pl.lit(0, pl.Int64)))
        specs = {p.rule_id: p for p in self.split.progress}
        prog = store.filter(pl.col("kind") != "")
        for (kind,), part in prog.group_by(["kind"]):
            spec = specs.get(str(kind))
            if spec is not None:
                self._progress.append((spec, part.select("host", "job_id", "step", win, "lines", "first", "last")))

    def take_progress(self) -> list[tuple[ProgressSpec, pl.DataFrame]]:
        """Progress counts of the polls since the last call (per host, job, step, fine bucket)."""
        out, self._progress = self._progress, []
        return out

    def _consolidate(self) -> None:
        """The parts since the last call summed into the store, and buckets past ``store_s``
        dropped. Only the store's buckets from the parts' first one on are summed again with them
        (the parts are mostly the newest buckets: at 50 k lines/s regrouping the whole 11-min
        store every 10 polls was a step of its own), and the old buckets are cut only once they
        are half a minute's worth (each cut copies the store)."""
        key = ["fb", "kind", "host", "job_id", "step"]
        parts = pl.concat(self._store_parts) if self._store_parts else None
        self._store_parts = []
        if parts is not None and parts.height:
            fb0: int = parts.select(pl.col("fb").min()).item()
            store = self._store
            if store.height and store.select(pl.col("fb").max()).item() >= fb0:
                parts = pl.concat([store.filter(pl.col("fb") >= fb0), parts])
                store = store.filter(pl.col("fb") < fb0)
            summed = parts.group_by(key).agg(pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max())
            self._store = pl.concat([store, _held(summed)])
        if self.complete_ns is not None and self._store.height:
            fine = self.ledger.bucket_ns
            cut = (self.complete_ns - self.store_ns) // fine
            low: int = self._store.select(pl.col("fb").min()).item()
            if low < cut - max(1, 30 * NS // fine):
                self._store = self._store.filter(pl.col("fb") >= cut)

    def _reread_changed(self, lo: int, hi: int, out: list[tuple[int, dict[str, str]]]) -> None:
        """A coarse bucket whose count changed: the server's counts per fine bucket there (a
        timestamps-only query) name the fine buckets that changed, and only those are read again
        (every row of a 60 s bucket at 50 k lines/s would be 3 M rows)."""
        fine = self.ledger.bucket_ns
        if hi - lo + 1 <= fine:
            self._reread_local(lo, hi, out)
            return
        server = self._fine_counts(lo, hi) or {}
        led = self.ledger
        changed = [b for b in range(lo // fine, hi // fine + 1) if server.get(b, 0) != led.count.get(b, 0)]
        for b in changed:
            if server.get(b, 0) == 0:       # the server lost these rows (a crash): nothing to find there
                led.count.pop(b, None)
                self.stats["buckets_lost_on_server"] += 1
                continue
            self._reread_local(b * fine, (b + 1) * fine - 1, out)

    def _reread_local(self, lo: int, hi: int, out: list[tuple[int, dict[str, str]]]) -> None:
        """A bucket whose count changed, read again whole: its needed rows not handed out yet go
        out marked late; its lines and progress lines beyond what was counted there are counted
        (within ``store_s``; older late lines add findings only)."""
        fine = self.ledger.bucket_ns
        fb0, fb1 = lo // fine, hi // fine
        if self._tracked(fb0, fb1):
            self._reread_delta(lo, hi, out)
            return
        for k in range(fb0, fb1 + 1):      # the bucket's count becomes what this read saw (_read_local adds it)
            self.ledger.count.pop(k, None)
        rows, new = self._read_local(lo, hi)
        self._accept(rows, out, late=True, count=False)
        self.stats["buckets_reread"] += 1
        self._consolidate()
        if self.complete_ns is None or lo < self.complete_ns - self.store_ns:
            return
        key = ["fb", "kind", "host", "job_id", "step"]
        old = _plain(self._store.filter(pl.col("fb").is_between(fb0, fb1)))
        delta = (new.join(old.select(*key, pl.col("lines").alias("_old")), on=key, how="left", nulls_equal=True)
                 .with_columns((pl.col("lines") - pl.col("_old").fill_null(0)).alias("lines")).drop("_old")
                 .filter(pl.col("lines") > 0))
        self._store = pl.concat([self._store.filter(~pl.col("fb").is_between(fb0, fb1)),
                                 _held(new)])
        if delta.height:
            self.stats["late_lines_counted"] += int(delta.filter(pl.col("kind") == "")["lines"].sum())
            self._hand_out(delta.select(list(_STORE_SCHEMA)))

    def replace_counts(self, lo: int, hi: int, store: pl.DataFrame) -> None:
        """An engine rebuilt from ``[lo, hi]`` counted ``store``: later re-reads count from there."""
        fine = self.ledger.bucket_ns
        self._consolidate()
        self._store = pl.concat([self._store.filter(~pl.col("fb").is_between(lo // fine, hi // fine)),
                                 _held(store.filter(pl.col("fb").is_between(lo // fine, hi // fine)))])

    def _candidates_complete(self, lo: int, hi: int, fb: int, per: int) -> bool:
        """After re-reading a changed bucket: does the server's count of *candidate* rows there match
        the rows we hold? (The scope-wide count can see a row a moment before the row query does;
        then the bucket stays dirty and is read again, up to 5 times.)"""
        rows = self.client.stats(f"{self.query} | stats count() as n", start=lo, end=hi)
        self.stats["count_queries"] += 1
        want = int(rows[0].get("n", 0)) if rows else 0
        led = self.ledger
        have = 0
        for k in range(per):
            b = fb + k
            have += len(led.hot[b]) if b in led.hot else int(led.cold[b].size) if b in led.cold else 0
        if want <= have:
            self._dirty.pop(lo, None)
            return True
        tries = self._dirty.get(lo, 0) + 1
        self._dirty[lo] = tries
        self.stats["buckets_dirty"] += 1
        return tries > 5

    def scope_counts(self, lo: int, hi: int) -> pl.DataFrame | None:
        """The scope's lines in ``[lo, hi]`` per (host, job, window) as the server counts them
        (``line_counts``), or None when the poller reads every line itself (no prefilter)."""
        if self.line_window_ns is None or self.count_query is None:
            return None
        self.stats["line_count_queries"] += 1
        try:
            return line_counts(self.client, self.count_query, lo, hi, self.line_window_ns, self.read, workers=1)
        except VictoriaLogsError as exc:
            if exc.status not in (400, 422):
                raise                        # transient: the whole poll window is read again
            # a server (or proxy) that refuses the stats query: count the rows we are sent, as before
            self.line_window_ns = None
            self.stats["line_counts_refused"] += 1
            log.warning("VictoriaLogs refused the per-window line-count query (%s); window line counts now "
                        "cover only the prefiltered rows read", exc.server_message or exc)
            return None

    def take_counts(self) -> list[pl.DataFrame]:
        """The line counts of the polls since the last call (see ``line_window_ns``)."""
        out, self._counts = self._counts, []
        return out

    def _fine_counts(self, lo: int, hi: int) -> dict[int, int] | None:
        """With a ``count_query``: the server's rows per fine bucket in ``[lo, hi]`` (all lines of
        the scope, not only rule candidates: counting them needs no message scan)."""
        if self.count_query is None:
            return None
        fine = self.ledger.bucket_ns
        rows = self.client.stats(f"{self.count_query} | stats by (_time:{fine // NS}s) count() as n", start=lo, end=hi)
        self.stats["count_queries"] += 1
        out: dict[int, int] = {}
        for r in rows:
            try:
                out[self.ledger.bucket(vl_time_ns(r["_time"]))] = int(r["n"])
            except (KeyError, ValueError):
                continue
        return out

    def _tier_range(self, i: int) -> tuple[int, int] | None:
        """Closed, step-aligned ``[lo, hi)`` of tier ``i``: tier 0 ends at the last bucket fully
        behind the frontier; each next tier ends where the previous one starts (rounded up to
        its own step, so the tiers leave no gap)."""
        assert self.complete_ns is not None
        hi = self.complete_ns + 1
        lo = hi
        for k in range(i + 1):
            step = self.tiers[k].step_s * NS
            hi = hi // step * step if k == 0 else -(-lo // step) * step
            lo = (self.complete_ns - int(self.tiers[k].span_s * NS)) // step * step
        floor = self.ledger.floor
        if floor is not None:
            step = self.tiers[i].step_s * NS
            lo = max(lo, -(-floor * self.ledger.bucket_ns // step) * step)
        return (lo, hi) if hi > lo else None

    # persisted counts (digests are not persisted: after a restart a changed old bucket is read
    # whole into the fresh engine, which had not seen it)
    def counts_doc(self) -> dict[str, object]:
        return {"bucket_ns": self.ledger.bucket_ns, "counts": {str(b): n for b, n in self.ledger.count.items() if n}}

    def load_counts(self, doc: dict[str, object] | None) -> None:
        if not doc or doc.get("bucket_ns") != self.ledger.bucket_ns:
            return
        counts = doc.get("counts")
        if isinstance(counts, dict):
            for b, n in counts.items():
                try:
                    self.ledger.count[int(b)] = int(n)
                except (TypeError, ValueError):
                    continue

    def reconcile_tier(self, i: int, out: list[tuple[int, dict[str, str]]]) -> None:
        rng = self._tier_range(i)
        if rng is None:
            return
        lo, hi = rng
        step = self.tiers[i].step_s
        rows = self.client.stats(f"{self.count_query or self.query} | stats by (_time:{step}s) count() as n",
                                 start=lo, end=hi - 1)
        self.stats["reconcile_queries"] += 1
        server: dict[int, int] = {}
        for r in rows:
            try:
                server[vl_time_ns(r["_time"])] = int(r["n"])
            except (KeyError, ValueError):
                continue
        led = self.ledger
        fine = led.bucket_ns
        per = step * NS // fine
        for b0 in range(lo, hi, step * NS):
            fb = b0 // fine
            have = sum(led.count.get(fb + k, 0) for k in range(per))
            want = server.get(b0, 0)
            if want == have:
                continue
            if want == 0:        # the server lost the bucket's rows (a crash): nothing to find there
                for k in range(per):
                    led.count.pop(fb + k, None)
                self.stats["buckets_lost_on_server"] += 1
                continue
            if self.split is not None:
                self._reread_changed(b0, b0 + step * NS - 1, out)
                continue
            counts = self._fine_counts(b0, b0 + step * NS - 1)   # before the rows (see _live)
            got = list(self.client.query(self.query, start=b0, end=b0 + step * NS - 1, fields=self.fields))
            self.stats["buckets_reread"] += 1
            self.stats["rows_fetched"] += len(got)
            self._accept(got, out, late=True, count=counts is None)
            if counts is not None and not self._candidates_complete(b0, b0 + step * NS - 1, fb, per):
                counts = {}      # the server counted a row its row query did not give yet: read it again
            for k in range(per):
                led.count[fb + k] = 0 if counts is None else counts.get(fb + k, 0)

    def poll(self, now_ns: int | None = None, force_catchup: bool = False) -> list[dict[str, str]]:
        """New rows since the last poll (live window + late rows found by reconciliation)."""
        now = self.clock() if now_ns is None else now_ns
        self.data_ready.clear()
        got: list[tuple[int, dict[str, str]]] = []
        if self.fatal is not None:
            return []
        if force_catchup or now >= self._next_live or self.behind:
            self._next_live = now + self.refresh_ns
            try:
                self._live(now, got)
                self.last_error = None
            except VictoriaLogsError as exc:
                self._fail("poll", exc)
        if self.reconcile_on and self.complete_ns is not None and not self.behind and self.last_error is None:
            for i, t in enumerate(self.tiers):
                if now < self._next_tier[i]:
                    continue
                self._next_tier[i] = now + int(t.every_s * NS)
                try:
                    self.reconcile_tier(i, got)
                except VictoriaLogsError as exc:
                    self._fail("reconcile", exc)
                    break
        if self.split is not None and len(self._store_parts) >= 10:
            self._consolidate()
        if self.split is not None:
            self._evict_ids()
        if self.complete_ns is not None:
            led = self.ledger
            led.evict_before(led.bucket(self.complete_ns - self.horizon_ns))
            # buckets that stayed short past their retries are given up on, not remembered for ever
            for b0 in [b0 for b0 in self._dirty if b0 < self.complete_ns - self.horizon_ns]:
                del self._dirty[b0]
            before = led.floor
            led.compact(led.bucket(self.complete_ns))
            if led.floor != before:
                self.stats["horizon_shrunk"] += 1
                log.warning("VictoriaLogs: more than %d row digests within the late-data horizon; lines arriving "
                            "later than %.0fs behind their time are no longer found", led.max_keys,
                            (self.complete_ns - (led.floor or 0) * led.bucket_ns) / NS)
        if self.behind:
            self.data_ready.set()
        got.sort(key=lambda tr: tr[0])
        return [r for _, r in got]
