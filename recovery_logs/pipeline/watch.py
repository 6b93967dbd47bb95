"""The watch loop: live sources -> Engine -> new/updated incidents -> output, remediation, state.

One :meth:`Watcher.step` is: poll the sources (VictoriaLogs tail + catch-up, files ``tail -F``),
turn rows into events with the same readers replay uses, feed the same :class:`Engine`,
advance the event-time watermark to ``now - lateness``, rank incidents, report the ones that are
new or changed, then persist the cursor. Commit order (write-ahead): remediation first (the audit
trail is idempotent: a re-detected incident never acts twice), then the cursor — file offsets of
everything fed, the VictoriaLogs resume point and the versions about to be printed — written
ahead with fsync and an atomic rename, then the output. A crash before the cursor is written
re-reads and re-reports that step once, as nothing of it was printed; a crash after it never
prints anything twice (a print cut short by the crash is in the audit trail's detection
records). File offsets point at the first line the parser still holds (a multi-line record in
progress, the format-detection head), with that line's number, so a restart resumes exactly
there, numbering lines as an uninterrupted run would.

Inputs that cannot be read (a missing path, a glob matching nothing, an unreadable file, a
directory, a truncated ``.gz``) are reported once each (``watch:`` on stderr, ``problems`` in
the summary) while every other source keeps being read; a FIFO is read without blocking.
With ``--state-dir`` the watcher holds ``watch.lock`` there (``recovery_logs.statelock``): a
second watcher on the same state dir stops at once, naming the holder.

Scoring like replay: each step the engine learns how far every file source has delivered
(``closed_ns``: the newest event time, held back to that of any file still being read in
bounded steps), so the anomaly model scores only windows that are complete, as replay does.

Restart: the cursor in ``--state-dir`` holds the VictoriaLogs resume point (``complete_ns``:
everything up to it was read by a finished catch-up query), file offsets (only of fully parsed
data) and the incidents already reported with the version last printed. On start the engine is
rebuilt from ``[complete - context, complete - lateness)`` — reaching back to the first_seen of
any reported incident that may still grow, so it keeps its id — then the
live read resumes at ``complete - lateness``, and an incident is printed again only if it
gained evidence or changed status.

Long runs: the engine keeps every finding. With a VictoriaLogs source and the local selection
(the default, ``local_select``: each poll exports the scope and ``sources.vl_local`` splits it)
memory is bounded in place: progress findings older than ``context_s`` are compacted away
(``Engine.compact_progress``, detector findings kept) and floods of fault findings compacted as
with file sources. With the server-side prefilter (``local_select=False``, ``--live tail``) the
engine is instead rebuilt every ``rotate_s`` from the server's history of the context window (the
server is the store); reported incidents keep their ids either way (see restart). With
file sources, once more than ``max_findings`` are held the engine compacts floods in place
(``Engine.compact_floods``: behind the watermark, per host/job/rule and half incident gap only
the first and last finding are kept and the rest counted) and drops what is older than
``max_context_s``: memory is bounded by the number of distinct (host, job, rule) keys, not by
the number of lines, and incidents keep their ids and counts.

Late events: an event older than the watermark when it arrives is counted (``late``) and still
fed; attribution is a function of all accumulated findings, so it is still attributed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from recovery_logs.config import EngineConfig
from recovery_logs.errors import ConfigError, RecoveryLogsError, SourceError, VictoriaLogsError
from recovery_logs.pipeline.cursor import WatchCursor, cursor_name
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.vl_replay import absorb_progress, local_split
from recovery_logs.records import Incident
from recovery_logs.source_health import SourceHealth, health_incidents
from recovery_logs.sources.files import events_from_vl_records
from recovery_logs.sources.follow import FileFollower
from recovery_logs.sources.formats import vl_columns
from recovery_logs.sources.history import history_rows
from recovery_logs.sources.read_common import Batch, ReadOptions
from recovery_logs.sources.read_text import TextParser
from recovery_logs.sources.rowkeys import record_key, vl_time_ns
from recovery_logs.sources.tail import VLFollower
from recovery_logs.sources.victorialogs import VictoriaLogsClient, VLConnection, parse_url
from recovery_logs.sources.vl_history import history_batches_fast
from recovery_logs.sources.vl_live import DEFAULT_TIERS, LATE_FIELD, Tier, VLPoller
from recovery_logs.sources.vl_local import LocalSplit, ProgressSpec, split_frame
from recovery_logs.statelock import StateLock
from recovery_logs.timeutil import NS, ns_to_iso
from recovery_logs.windows import window_us

if TYPE_CHECKING:
    from recovery_logs.pipeline.metrics import WatchMetrics

__all__ = ["WatchOptions", "Watcher", "compose_query", "incident_rows", "parse_sources"]


class _Track:
    """Where the lines handed to one file's parser lie in the file (recent chunks only), so the
    line a parser still holds maps back to a byte offset."""

    def __init__(self, first_line: int, start: int) -> None:
        self.chunks: list[tuple[int, int, bytes]] = []     # (first line, byte offset, data)
        self.end_line, self.end = first_line, start

    def add(self, data: bytes) -> None:
        self.chunks.append((self.end_line, self.end, data))
        self.end_line += data.count(b"\n")
        self.end += len(data)

    def offset_of(self, line: int) -> int:
        """Byte offset where ``line`` starts; forgets chunks wholly before it."""
        while self.chunks:
            first, off, data = self.chunks[0]
            n = data.count(b"\n")
            if line < first + n:
                pos = 0
                for _ in range(max(0, line - first)):
                    pos = data.index(b"\n", pos) + 1
                return off + pos
            self.chunks.pop(0)
        return self.end

log = logging.getLogger("recovery_logs.watch")
EXPORT_UNIT = "recovery-logs"
REBUILD_MAX_BYTES = 256 << 20     # restart: at most this much of a file before its offset is read again
INVENTORY_LITERAL = " inventory "          # recovery_logs.inventory: NVML agent inventory events
INVENTORY_FILTER = '_msg:~" inventory "'


@dataclass(frozen=True)
class WatchOptions:
    """``sources``: ``victorialogs://HOST:PORT`` and/or ``file:PATH`` (globs). Durations in seconds
    except the tail parameters, which are VictoriaLogs durations (``1s``, ``500ms``)."""

    sources: tuple[str, ...]
    query: str | None = None             # extra LogsQL filter (stream filters), AND-ed with the prefilter
    state_dir: Path | None = None
    refresh_s: float = 1.0
    lateness_s: float = 30.0
    catchup_s: float = 5.0
    catchup_max_s: float = 300.0         # new ground per catch-up query (long outages are read back in steps)
    context_s: float = 600.0
    max_context_s: float = 86400.0       # never re-read more than this on restart
    rotate_s: float | None = 1800.0      # VictoriaLogs: rebuild the engine from `context` history this often
    since_s: float | None = None         # first start (no cursor): read back this far (default: lateness)
    duration_s: float | None = None
    rules_dir: Path | None = None
    export_incidents: bool = False
    prefilter: bool = True
    tail_offset: str = "1s"
    tail_start_offset: str = "5s"
    read: ReadOptions | None = None
    config: EngineConfig | None = None
    max_keys: int = 2_000_000
    reconnect_backoff_s: float = 0.5
    use_tail: bool = True                # live="tail" only. False: catch-up queries only (latency ~ catchup_s)
    background_catchup: bool = True      # live="tail": catch-up queries in a thread
    live: str = "poll"                   # "poll": /query with a time cursor (default; never blocks a server
                                         # shutdown) | "tail": /select/logsql/tail + catch-up
    poll_offset_s: float = 2.0           # poll: read up to now - offset (rows are searchable ~1-1.3 s after insert)
    horizon_s: float = 6 * 3600.0        # poll: late lines up to this far behind their _time are found
    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    reconcile: bool = True
    connection: VLConnection | None = None   # auth, TLS, tenant, extra_filters for the VictoriaLogs source
    unreachable_exit_s: float | None = 300.0  # never reached the server this long after start: stop with an error
    decision: str = "record_only"
    max_findings: int = 200_000          # file sources: compact floods above this many held findings
    local_select: bool = True            # poll + prefilter: select/count/summarise here (sources.vl_local);
                                         # memory is then bounded by compaction, not by rotate_s rebuilds
    max_progress_rows: int = 200_000     # local select: progress findings older than context_s compacted above this
    lock: bool = True                    # hold <state-dir>/watch.lock while running
    extra: dict[str, Any] = field(default_factory=dict)


def parse_sources(specs: Sequence[str]) -> tuple[str | None, list[str]]:
    """``victorialogs://H:P`` and ``file:PATH[,file:PATH...]`` -> (VL base URL or None, file patterns)."""
    vl: str | None = None
    files: list[str] = []
    for spec in specs:
        for part in [p.strip() for p in spec.split(",") if p.strip()] if spec.startswith("file:") else [spec.strip()]:
            if part.startswith("file:"):
                path = part[len("file:"):]
                if not path:
                    raise ConfigError("empty file: source", value=spec)
                files.append(path)
            elif "://" in part:
                if vl is not None:
                    raise ConfigError("only one VictoriaLogs source per watch", value=spec)
                vl = parse_url(part)
            else:
                raise ConfigError("unknown --source; use victorialogs://HOST:PORT or file:PATH", value=part)
    if vl is None and not files:
        raise ConfigError("watch needs at least one --source")
    return vl, files


def compose_query(user: str | None, prefilter: str | None) -> str:
    """User stream filter AND rule-pack prefilter, never our own exported lines."""
    parts = [f"({p})" for p in (user, prefilter) if p and p.strip() and p.strip() != "*"]
    parts.append(f'NOT unit:="{EXPORT_UNIT}"')
    return " ".join(parts)


def incident_rows(incidents: Sequence[Incident]) -> list[dict[str, str]]:
    """Incidents as VictoriaLogs log lines (``unit=recovery-logs``) for ``insert_jsonline``."""

    rows = []
    for inc in incidents:
        rows.append({"_time": ns_to_iso(inc.detected_at) or "", "host": inc.node or "", "unit": EXPORT_UNIT,
                     "job_id": inc.job_id or "", "incident_id": inc.id, "category": inc.category,
                     "severity": inc.severity, "status": inc.status,
                     "_msg": f"recovery-logs incident {inc.id} {inc.severity} {inc.category} on "
                             f"{inc.node or '-'}: {inc.cause}",
                     "incident": json.dumps(inc.to_dict(), ensure_ascii=False)})
    return rows


def _version(inc: Incident) -> dict[str, Any]:
    return {"first_seen": inc.first_seen, "last_seen": inc.last_seen, "count": inc.count, "status": inc.status,
            "severity": inc.severity, "category": inc.category, "node": inc.node, "job_id": inc.job_id, "jobs": list(inc.jobs)}


def _changed(old: dict[str, Any] | None, inc: Incident) -> bool:
    if old is None:
        return True
    return (inc.count > old.get("count", 0) or inc.last_seen > old.get("last_seen", 0)
            or inc.status != old.get("status") or inc.severity != old.get("severity")
            or inc.job_id != old.get("job_id", inc.job_id) or list(inc.jobs) != old.get("jobs", list(inc.jobs)))


def _scope(options: WatchOptions) -> str | None:
    """What the cursor is of: the query, plus the connection's extra_filters and tenant when set
    (so watchers sharded by partition or tenant keep separate cursors in one state dir)."""
    conn = options.connection
    if conn is None or not (conn.extra_filters or conn.account_id or conn.project_id):
        return options.query
    return json.dumps([options.query or "", conn.extra_filters or "", conn.account_id or "0", conn.project_id or "0"])


def lock_scope(options: WatchOptions, remediation: bool = False) -> str:
    """The state-dir lock a watch holds: ``watch`` (the whole dir) with file sources or Slurm
    remediation (file offsets, budgets and the breaker are per dir); a VictoriaLogs-only watch
    locks only its scope, ``watch-<cursor name>``, so watchers sharded by partition or tenant
    share one state dir and a second watcher of the same scope is refused."""
    vl, files = parse_sources(options.sources)
    if files or vl is None or remediation:
        return "watch"
    return "watch-" + cursor_name(options.sources, _scope(options))


def _read_json(path: Path | None) -> Any:
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("ignoring an unreadable watch side file %s: %s", path, exc)
        return None


def side_counts(path: Path | None) -> Any:
    doc = _read_json(path)
    return doc.get("counts") if isinstance(doc, dict) else None


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"watch state cannot be written: {exc}", path=str(path)) from exc


MAX_LATE_MARKS = 200_000


def _shift_lines(batch: Batch, counter: list[int], n: int) -> Batch:
    """Make ``line`` the row's position in the whole read, not in its batch (replay == watch)."""
    off = counter[0]
    counter[0] += n
    if off:
        batch.events = batch.events.with_columns(pl.col("line") + off)
        if batch.quarantine.height:
            batch.quarantine = batch.quarantine.with_columns(pl.col("line") + off)
    return batch


class Watcher:
    """Drives one watch. ``emit(kind, incident)`` gets each new/updated incident (kind is
    ``"new"`` or ``"updated"``); ``on_incidents(list)`` gets them per step (remediation hook)."""

    def __init__(self, options: WatchOptions, *, engine: Engine | None = None,
                 emit: Callable[[str, Incident], None] | None = None,
                 on_incidents: Callable[[list[Incident]], None] | None = None,
                 metrics: WatchMetrics | None = None, clock: Callable[[], int] = time.time_ns,
                 client: VictoriaLogsClient | None = None,
                 on_tick: Callable[[], Any] | None = None, accounting: Any = None,
                 observers: Sequence[Callable[[Watcher], None]] = ()) -> None:
        """``accounting``: a ``sources.accounting.AccountingPoller`` (Slurm allocations joined to
        findings; polled at its own bounded rate); ``observers`` are called after every step."""
        self.options = options
        self.on_tick = on_tick          # called every step (the remediator retries cleared denials)
        self.lock = (StateLock(options.state_dir, lock_scope(options)) if options.state_dir is not None and options.lock
                     else None)
        cfg = options.config or EngineConfig(lateness_s=options.lateness_s, rules_dir=options.rules_dir)
        self.engine = engine if engine is not None else Engine(cfg)
        self.read = options.read or ReadOptions()
        self.emit = emit
        self.on_incidents = on_incidents
        self.metrics = metrics
        self.clock = clock
        self.vl_url, self.file_patterns = parse_sources(options.sources)
        # the loop retries every catch-up interval, so one quick retry per call is enough
        conn = options.connection
        if conn is not None and self.vl_url is not None and conn.url != self.vl_url:
            raise ConfigError("the VictoriaLogs connection and --source name different URLs", source=self.vl_url,
                              connection=conn.url)
        self.client = client if client is not None else (
            VictoriaLogsClient(conn or self.vl_url, retries=1, backoff=0.2) if self.vl_url else None)
        self.cursor_name = cursor_name(options.sources, _scope(options))
        self.cursor = WatchCursor.load(options.state_dir, self.cursor_name)
        self.stats: Counter[str] = Counter()
        self.seq = 0
        self.lateness_ns = int(options.lateness_s * NS)
        self.vl: VLFollower | VLPoller | None = None
        self.files: FileFollower | None = None
        self._parsers: dict[str, Any] = {}
        self._vl_lines = [0]   # rows read so far: `line` of a VictoriaLogs event is its position in the whole read
        self._idle: dict[str, int] = {}
        self._track: dict[str, _Track] = {}          # per file: where the lines handed to its parser lie
        self._rebuilt: set[str] = set()              # files whose context was re-read at start
        self._file_max: dict[str, int] = {}          # per file: newest event time fed
        self.problems: dict[str, str] = {}           # inputs reported as unreadable (path -> why)
        self._last_counts: Counter[str] = Counter()
        self.incidents: list[Incident] = []
        self.last_error: str | None = None
        self.query: str | None = None
        self.split: LocalSplit | None = None
        self.fields: list[str] | None = None
        self._born = clock()
        self._started = clock()
        self._late_marks: dict[tuple[int, str], None] = {}
        self._side_saved = 0.0
        side = _read_json(self._side_path()) or {}
        self._aliases: dict[str, str] = dict(side.get("aliases") or {})   # changed id -> first reported id
        self.accounting = accounting
        self.observers = list(observers)
        self.vl_health = SourceHealth("victorialogs")

    # -- setup -------------------------------------------------------------------------------
    def prepare(self) -> Watcher:
        """The queries and fields the watch will send (no network): ``--explain`` prints them."""
        if self.vl_url is not None and self.query is None:
            # line scores need every line's template: the rule prefilter would hide the lines they score
            pre = (self.engine.pack.logsql_prefilter()
                   if self.options.prefilter and not self.engine.config.line_scores else None)
            if pre and pre != "*":   # the NVML agent's inventory lines feed the GPU inventory, not a rule
                pre = f'({pre} OR {INVENTORY_FILTER})'
            self.query = compose_query(self.options.query, pre)
            if pre and pre != "*" and self.options.live == "poll" and self.options.local_select:
                # the same literals, selected here (sources.vl_local): the server only exports the scope
                self.split = local_split(self.engine.pack, window_us(self.engine.config.window_s) * 1000,
                                         extra=(INVENTORY_LITERAL,))
            self.fields = list(dict.fromkeys(["_time", "_stream_id", "_stream", "_msg",
                                              *vl_columns(tuple(self.read.host_fields))]))
        return self

    def open(self) -> Watcher:
        self.prepare()
        if self.lock is not None and not self.lock.held:
            self.lock.acquire()
        if self.vl_url is not None:
            resume = self.cursor.complete_ns
            poll = self.options.live == "poll"
            if self.options.live not in ("poll", "tail"):
                raise ConfigError("unknown live mode; use poll or tail", value=self.options.live)
            first = resume
            if resume is None:   # first start: read back --since (default: --lateness)
                back = self.options.since_s if self.options.since_s is not None else self.lateness_ns / NS
                first = self.clock() - int(back * NS) + (0 if poll else self.lateness_ns)
                if not poll and self.options.since_s is None:
                    first = None
            assert self.client is not None and self.query is not None
            vl: VLFollower | VLPoller
            if poll:
                vl = VLPoller(self.client, self.query, fields=self.fields, refresh_s=self.options.refresh_s,
                              offset_s=self.options.poll_offset_s, resume_from_ns=first,
                              horizon_s=self.options.horizon_s, tiers=self.options.tiers, clock=self.clock,
                              max_keys=self.options.max_keys, max_window_s=self.options.catchup_max_s,
                              reconcile=self.options.reconcile,
                              count_query=compose_query(self.options.query, None),
                              line_window_ns=window_us(self.engine.config.window_s) * 1000, read=self.read,
                              split=self.split)
                if resume is not None:
                    vl.load_counts(side_counts(self._side_path()))
            else:
                vl = VLFollower(self.client, self.query, fields=self.fields, lateness_s=self.options.lateness_s,
                                catchup_s=self.options.catchup_s, tail_offset=self.options.tail_offset,
                                tail_start_offset=self.options.tail_start_offset,
                                refresh=f"{int(self.options.refresh_s * 1000)}ms", resume_from_ns=first,
                                clock=self.clock, max_keys=self.options.max_keys,
                                reconnect_backoff_s=self.options.reconnect_backoff_s,
                                background_catchup=self.options.background_catchup,
                                use_tail=self.options.use_tail, max_window_s=self.options.catchup_max_s)
            self.vl = vl
            if resume is not None:
                self._rebuild(resume, poll)
            vl.start()
        if self.file_patterns:
            self.files = FileFollower(self.file_patterns, offsets=dict(self.cursor.files))
            self._rebuild_files()
        return self

    def _rebuild_files(self) -> None:
        """Context after a restart, as the VictoriaLogs path has it: the part of each file before
        its resume offset (at most ``REBUILD_MAX_BYTES``) is fed again, silently, into the parser
        that then continues live, so incidents keep their ids and counts and nothing is reprinted
        (the cursor knows the versions already reported)."""
        assert self.files is not None
        for path in self.files._expand():
            saved = self.cursor.files.get(path) or {}
            off = int(saved.get("offset", 0))
            if off <= 0 or saved.get("gz"):
                continue
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) != (saved.get("dev"), saved.get("ino")) or off > st.st_size:
                    continue
                lo = max(0, off - REBUILD_MAX_BYTES)
                with open(path, "rb") as fh:
                    fh.seek(lo)
                    data = fh.read(off - lo)
            except OSError:
                continue              # the follower reports it
            if lo:
                cut = data.find(b"\n") + 1
                data, lo = data[cut:], lo + cut
            first = max(1, int(saved.get("line", 1)) - data.count(b"\n"))
            parser = self._parsers[path] = TextParser(path, self.read, seq_start=self.seq, first_line=first)
            self._track[path] = _Track(first, lo)
            self._track[path].add(data)
            self._rebuilt.add(path)
            try:
                batch = parser.feed(data)
            except RecoveryLogsError as exc:
                self._error("rebuild", exc)
                continue
            self.stats["rebuilt"] += int(batch.stats.get("lines", 0))
            self._feed(batch, count_late=False, tally=False)

    def _context_start(self, resume_ns: int) -> int:
        """``resume - context``, reaching back to the start of every reported incident that
        may still grow (so it keeps its id), never further than ``max_context_s``."""
        lo = resume_ns - int(self.options.context_s * NS)
        gap = int(self.engine.config.incident_gap_s * NS)
        starts = [v["first_seen"] for v in self.cursor.reported.values()
                  if v.get("first_seen") is not None and v.get("last_seen", 0) >= resume_ns - gap - self.lateness_ns]
        if starts:
            lo = max(min(lo, min(starts)), resume_ns - int(self.options.max_context_s * NS))
        return lo

    def _rebuild(self, resume_ns: int, poll: bool = False) -> None:
        """Context for attribution after a restart: history before the resume point (poll: up
        to it — everything there was read; tail: up to ``resume - lateness``, re-read live)."""
        assert self.client is not None and self.query is not None and self.vl is not None
        lo = self._context_start(resume_ns)
        hi = resume_ns if poll else resume_ns - self.lateness_ns - 1
        if hi < lo:
            return
        if isinstance(self.vl, VLPoller) and self.vl.split is not None:
            try:
                self.stats["rebuilt"] += self._read_back(lo, hi, tally=True)
            except SourceError as exc:
                self._error("rebuild", exc)
            return
        try:
            counts = self.vl.scope_counts(lo, hi) if isinstance(self.vl, VLPoller) else None
            for rows in history_rows(self.client, self.query, lo, hi, fields=self.fields):
                if isinstance(self.vl, VLPoller):
                    self.vl.mark_seen(rows)
                self._feed(self._vl_events(rows), count_late=False, counted=counts is not None)
                self.stats["rebuilt"] += len(rows)
            self._absorb_counts(counts)
        except SourceError as exc:
            self._error("rebuild", exc)

    def _rotate(self, now: int) -> None:
        """Bound memory on a long run: a fresh Engine rebuilt from the server's history of the
        context window (the server is the store), swapped in only if the read finished. Every
        row read is marked seen, so the live read never feeds it twice."""

        assert self.vl is not None and self.client is not None and self.query is not None
        hi = now - self.vl.offset_ns
        lo = self._context_start(self.vl.complete_ns or hi)
        fresh = Engine(self.engine.config, pack=self.engine.pack)
        fresh.set_accounting(self.engine.allocations)
        fresh.inventory = self.engine.inventory
        old, self.engine = self.engine, fresh
        read = 0
        try:
            if isinstance(self.vl, VLPoller) and self.vl.split is not None:
                # up to the frontier: what lies beyond it the next poll reads (and counts) once
                read = self._read_back(lo, self.vl.complete_ns or hi, tally=False)
            else:
                counts = self.vl.scope_counts(lo, hi) if isinstance(self.vl, VLPoller) else None
                for rows in history_rows(self.client, self.query, lo, hi, fields=self.fields):
                    if isinstance(self.vl, VLPoller):
                        self.vl.mark_seen(rows)
                    else:
                        for r in rows:
                            self.vl.dedupe.add(record_key(r))
                    self._feed(self._vl_events(rows), count_late=False, tally=False, counted=counts is not None)
                    read += len(rows)
                self._absorb_counts(counts)
        except SourceError as exc:
            self.engine = old                # keep the full state; try again next period
            self._error("rotate", exc)
            return
        if old.watermark_ns is not None:
            fresh.advance(old.watermark_ns)
        self._born = now
        self.stats["rotations"] += 1
        self.stats["rotated_rows"] += read

    def _read_back(self, lo: int, hi: int, tally: bool) -> int:
        """``[lo, hi]`` of the scope read into ``self.engine`` with the poller's local split
        (restart context, rotation): time slices of at most ~100 k rows, one query each (none
        near the server's query time limit), the needed rows fed (and marked seen), every line
        counted, progress lines summarised. Returns the rows the engine was fed."""
        vl = self.vl
        assert isinstance(vl, VLPoller) and vl.split is not None and vl.count_query is not None
        assert self.client is not None
        fine = vl.ledger.bucket_ns
        split = replace(vl.split, bucket_ns=fine)
        stores: list[pl.DataFrame] = []
        counts: list[pl.DataFrame] = []
        prog: list[tuple[ProgressSpec, pl.DataFrame]] = []

        def keep(df: pl.DataFrame) -> pl.DataFrame:
            rows, fc, pc = split_frame(df, split, self.read)
            vl.mark_seen([{k: v for k, v in r.items() if v is not None}
                          for r in rows.select("_time", "_stream_id", "_msg").to_dicts()])
            stores.append(fc.select((pl.col("bucket") // fine).alias("fb"), pl.lit("").alias("kind"), "host", "job_id",
                                    pl.lit(None, pl.Int64).alias("step"), "lines", "first", "last"))
            stores.extend(p.select((pl.col("bucket") // fine).alias("fb"), pl.lit(s.rule_id).alias("kind"), "host",
                                   "job_id", "step", "lines", "first", "last") for s, p in pc if p.height)
            counts.append(fc)
            prog.extend(pc)
            return rows

        fed = 0
        for b in history_batches_fast(self.client, vl.count_query, lo, hi, self.read, slice_rows=100_000, workers=1,
                                      split=keep):
            b.stats.pop("duplicates", None)
            b.stats.pop("lines", None)
            fed += self._feed(_shift_lines(b, self._vl_lines, b.events.height), count_late=False, tally=tally,
                              counted=True)
        w = vl.split.bucket_ns
        if counts:
            merged = pl.concat(counts).with_columns(pl.col("bucket") // w * w).group_by(["host", "job_id", "bucket"]).agg(
                pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max(), pl.col("duplicates").sum())
            self._absorb_counts(merged)
        self._absorb_progress(prog)
        if stores:
            vl.replace_counts(lo, hi, pl.concat(stores))
        return fed

    def _side_path(self) -> Path | None:
        """Beside the cursor: reconciliation counts and incident-id aliases (VictoriaLogs poll)."""
        p = self.cursor.path
        return None if p is None else p.with_name(p.stem + ".vl.json")

    def _save(self, force: bool = False) -> None:
        self.cursor.save()
        side = self._side_path()
        now = time.monotonic()
        if not force and now - self._side_saved < 10.0:   # the counts are a hint (see VLPoller): every 10 s
            return
        self._side_saved = now
        if side is not None and (isinstance(self.vl, VLPoller) or self._aliases):
            _write_json(side, {"version": 1, "counts": self.vl.counts_doc() if isinstance(self.vl, VLPoller) else None,
                               "aliases": self._aliases})

    def _mark_late(self, rows: list[dict[str, str]]) -> None:
        for r in rows:
            if r.get(LATE_FIELD):
                try:
                    self._late_marks[(vl_time_ns(r.get("_time", "")), r.get("_msg", ""))] = None
                except ValueError:
                    continue
        while len(self._late_marks) > MAX_LATE_MARKS:
            self._late_marks.pop(next(iter(self._late_marks)))

    def _with_late(self, inc: Incident) -> Incident:
        if not self._late_marks:
            return inc
        ev = tuple(replace(e, late=True) if (e.time, e.message) in self._late_marks else e for e in inc.evidence)
        return replace(inc, evidence=ev) if ev != inc.evidence else inc

    # -- conversion --------------------------------------------------------------------------
    def _vl_events(self, rows: list[dict[str, str]]) -> Any:
        batch = events_from_vl_records(rows, self.read, seq_start=self.seq, file=f"victorialogs:{self.vl_url}")
        return _shift_lines(batch, self._vl_lines, len(rows))

    def _file_batches(self, now: int, final: bool = False) -> list[tuple[str, Batch]]:
        assert self.files is not None
        out = []
        for path, data, restarted, start in self.files.poll_at():
            parser = self._parsers.get(path)
            if path in self._rebuilt:       # the live read continues where the rebuilt context ends
                self._rebuilt.discard(path)
                if restarted and parser is not None and start == self._track[path].end:
                    restarted = False
            if restarted and parser is not None:
                out.append((path, parser.flush()))
                parser = None
            if parser is None:
                saved = self.cursor.files.get(path) or {}
                first = int(saved.get("line", 1)) if start and saved.get("offset") == start else 1
                parser = self._parsers[path] = TextParser(path, self.read, seq_start=self.seq, first_line=first)
                self._track[path] = _Track(first, start)
            if data:
                self._track[path].add(data)
                out.append((path, parser.feed(data)))
                self._idle[path] = now
        for path, parser in self._parsers.items():   # idle files: emit held (multi-line) records
            since = self._idle.get(path)
            if since is not None and (final or now - since >= int(self.options.refresh_s * NS)):
                out.append((path, parser.flush()))
                del self._idle[path]
        for path, why in self.files.take_problems():
            self.problems[path] = why
            self.stats["input_problems"] += 1
            self.last_error = f"{path}: {why}"
            log.warning("%s: %s", path, why)
        return out

    def _file_offsets(self) -> None:
        """The cursor's file offsets: the first line each parser still holds, and its number."""
        assert self.files is not None
        for path, tr in list(self._track.items()):
            f = self.files.files.get(path)
            parser = self._parsers.get(path)
            if f is None or parser is None:
                continue
            if f.kind == "fifo":
                continue                   # a pipe cannot be re-read: nothing to resume
            if f.kind == "gz":
                if f.done and path in self.files.offsets and parser.held_from_line() == tr.end_line:
                    self.cursor.files[path] = dict(self.files.offsets[path])
                continue
            line = parser.held_from_line()
            self.cursor.files[path] = {"dev": f.dev, "ino": f.ino, "offset": tr.offset_of(line), "line": line}

    def _closed_ns(self) -> int | None:
        """While a file is still being read in bounded steps: the newest event time fed from the
        files that are behind (None when every file is read to its end, or with VictoriaLogs)."""
        if self.files is None or self.vl is not None:
            return None
        behind = [self._file_max[p] for p in self.files.more if p in self._file_max]
        behind += [self._file_max.get(p, 0) for p in self.files.more if p not in self._file_max]
        return min(behind) if behind else None

    # -- one step ----------------------------------------------------------------------------
    def _server_counts(self) -> bool:
        """VictoriaLogs rows come prefiltered and every line of the scope is counted (by the
        server, or here with a local split): the rows then add findings only, the counts add the
        windows' lines (``_absorb_counts``)."""
        return isinstance(self.vl, VLPoller) and (self.vl.line_window_ns is not None or self.vl.split is not None)

    def _absorb_progress(self, prog: list[tuple[ProgressSpec, pl.DataFrame]]) -> None:
        if prog:
            self.seq, n = absorb_progress(self.engine, prog, self.seq)
            self.stats["progress_summarised"] += n

    def _absorb_counts(self, counts: pl.DataFrame | None) -> None:
        if counts is not None:
            self.stats["lines_counted"] += self.engine.absorb_counts(counts)

    def _feed(self, batch: Batch, count_late: bool = True, tally: bool = True, counted: bool = False) -> int:
        """``counted``: the batch's lines are counted by the server (``_absorb_counts``)."""
        if tally:
            self.stats.update({k: v for k, v in batch.stats.items() if isinstance(v, int) and k != "events"})
        ev: pl.DataFrame = batch.events
        if ev.height == 0:
            return 0
        ev = ev.with_columns(pl.int_range(self.seq, self.seq + ev.height, dtype=pl.Int64).alias("seq"))
        self.seq += ev.height
        wm = self.engine.watermark_ns
        if count_late and wm is not None:
            late = ev.select((pl.col("time").dt.epoch("ns") < wm).sum()).item()
            self.stats["late"] += int(late or 0)
        self.engine.feed(ev, count_lines=not counted)
        if tally:
            self.stats["events"] += ev.height
        return ev.height

    def _error(self, stage: str, exc: BaseException) -> None:
        self.stats[f"errors_{stage}"] += 1
        self.last_error = f"{stage}: {exc}"
        if self.metrics is not None:
            self.metrics.errors.labels(stage=stage).inc()
        log.warning("%s: %s", stage, exc)

    def step(self, final: bool = False) -> list[tuple[str, Incident]]:
        """One poll -> feed -> report -> persist. ``final``: also emit records the file parsers
        still hold (the last step of a ``--for`` run)."""
        now = self.clock()
        fed = 0
        if self.vl is not None:
            rows = self.vl.poll(now)
            if rows:
                self._mark_late(rows)
                fed += self._feed(self._vl_events(rows), counted=self._server_counts())
            if isinstance(self.vl, VLPoller):
                for counts in self.vl.take_counts():
                    self._absorb_counts(counts)
                self._absorb_progress(self.vl.take_progress())
            self.cursor.complete_ns = self.vl.complete_ns
            self.last_error = self.vl.last_error
            if self.vl.last_error:
                self.vl_health.fail(now / NS, self.vl.last_error)
            elif rows or self.vl.complete_ns is not None:
                self.vl_health.ok(now / NS)
            fatal = getattr(self.vl, "fatal", None)
            if fatal is not None:
                self._sync_metrics(now)
                raise fatal
            if (self.client is not None and not self.client.reached and self.options.unreachable_exit_s is not None
                    and now - self._started >= int(self.options.unreachable_exit_s * NS)):
                raise self._never_reached()
        if self.files is not None:
            try:
                for path, b in self._file_batches(now, final):
                    self.stats["file_lines"] += int(b.stats.get("lines", 0))
                    fed += self._feed(b)
                    if b.events.height:
                        tmax = b.events.select(pl.col("time").max().dt.epoch("ns")).item()
                        if tmax is not None:
                            self._file_max[path] = max(self._file_max.get(path, tmax), tmax)
            except RecoveryLogsError as exc:
                self._error("files", exc)
            self._file_offsets()
        local = isinstance(self.vl, VLPoller) and self.vl.split is not None
        if (self.vl is not None and self.options.rotate_s and self.vl.complete_ns is not None and not local
                and now - self._born >= int(self.options.rotate_s * NS)):
            self._rotate(now)
        if self.accounting is not None and self.accounting.poll(now / NS):
            self.engine.set_accounting(self.accounting.frame)
        closed = self._closed_ns()
        wm: int | None = now - self.lateness_ns
        if self.vl is not None and wm is not None:   # event time only as far as the server was read: a catch-up over
            done = self.vl.complete_ns   # history (--since) is replay, not silence
            wm = min(wm, done) if done is not None and self.vl.stats["catchups"] else None
        if wm is not None:
            self.engine.advance(wm, closed)
        if local and self.engine.watermark_ns is not None:
            # memory bounded in place, not by re-reading the context (a rotation at 20 k lines/s re-read
            # 2.4 M rows per 120 s): progress lines older than the context dropped (detector findings
            # kept), floods of fault lines compacted as with file sources
            wm_now = self.engine.watermark_ns
            ctx = int(self.options.context_s * NS)
            if self.engine.compact_progress(wm_now - ctx, self.options.max_progress_rows, slack_ns=ctx // 8):
                self.stats["compactions"] += 1
            if self.engine.findings_rows - self.engine.progress_rows > self.options.max_findings:
                self.engine.compact_floods(wm_now, wm_now - int(self.options.max_context_s * NS))
                self.stats["compactions"] += 1
        if self.files is not None and self.vl is None and self.engine.findings_rows > self.options.max_findings:
            upto = min(now - self.lateness_ns, closed if closed is not None else now)
            self.engine.compact_floods(upto, upto - int(self.options.max_context_s * NS))
            self.stats["compactions"] += 1
        changed = self._report()
        if self.on_tick is not None:
            try:
                self.on_tick()
            except RecoveryLogsError as exc:
                self._error("remediation", exc)
        self._sync_metrics(now)
        for obs in self.observers:
            try:
                obs(self)
            except RecoveryLogsError as exc:
                self._error("observer", exc)
        return changed

    def _never_reached(self) -> SourceError:
        return VictoriaLogsError(f"never reached VictoriaLogs at {self.vl_url}", last_error=self.last_error)
    def health_incidents(self) -> list[Incident]:
        """Source-health incidents: accounting commands and, when a remediator listens (``--slurm``),
        the log backend (never actionable)."""
        sources = [self.vl_health] if self.vl is not None and self.on_incidents is not None else []
        if self.accounting is not None:
            sources.extend(self.accounting.health.values())
        return health_incidents(sources)

    def _report(self) -> list[tuple[str, Incident]]:
        """Remediation, then the cursor (write-ahead), then the output (see the module docstring)."""
        try:
            self.incidents = self.engine.incidents(self.options.decision) + self.health_incidents()
        except RecoveryLogsError as exc:
            self._error("attribution", exc)
            return []
        changed = []
        current = [self._alias(inc) for inc in self.incidents]
        self.incidents = [self._with_late(i) for i in current]
        for inc in self.incidents:
            old = self.cursor.reported.get(inc.id)
            if _changed(old, inc):
                changed.append(("new" if old is None else "updated", inc))
        incs = [i for _, i in changed]
        if incs and self.on_incidents is not None:
            try:
                self.on_incidents(incs)
            except RecoveryLogsError as exc:
                self._error("remediation", exc)
        for inc in incs:
            self.cursor.reported[inc.id] = _version(inc)
        try:
            self._save()
        except ConfigError as exc:      # nothing is printed that the cursor does not know about
            self._error("cursor", exc)
            for inc in incs:
                self.cursor.reported.pop(inc.id, None)
            return []
        for kind, inc in changed:
            if self.emit is not None:
                self.emit(kind, inc)
            self.stats[f"incidents_{kind}"] += 1
        if incs and self.options.export_incidents and self.client is not None:
            try:
                self.client.insert_jsonline(incident_rows(incs), stream_fields=("host", "unit"))
            except SourceError as exc:
                self._error("export", exc)
        return changed

    def _alias(self, inc: Incident) -> Incident:
        """A late line can move an incident's first_seen and so its id: keep the id first
        reported (an update, never a second incident; remediation stays idempotent)."""
        if inc.id in self.cursor.reported:
            return inc
        old_id = self._aliases.get(inc.id)
        if old_id is None:
            live = {i.id for i in self.incidents}
            for rid, v in self.cursor.reported.items():
                if (rid not in live and v.get("category") == inc.category and v.get("node") == inc.node
                        and v.get("job_id") == inc.job_id and v.get("first_seen") is not None
                        and inc.first_seen <= v["first_seen"] <= inc.last_seen and rid not in self._aliases.values()):
                    old_id = rid
                    break
            if old_id is None:
                return inc
            self._aliases[inc.id] = old_id
            self._side_saved = 0.0           # persist the alias with the next save
            self.stats["incidents_realiased"] += 1
        return replace(inc, id=old_id)

    def _sync_metrics(self, now: int) -> None:
        if self.metrics is None:
            return
        cur: Counter[str] = Counter(self.stats)
        if self.vl is not None:
            cur.update({f"vl_{k}": v for k, v in self.vl.stats.items()})
        for name, metric in (("vl_lines_read", self.metrics.lines_read), ("vl_duplicates", self.metrics.duplicates),
                             ("file_lines", self.metrics.lines_read), ("late", self.metrics.late),
                             ("events", self.metrics.events)):
            delta = cur[name] - self._last_counts[name]
            if delta > 0:
                metric.inc(delta)
        for kind in ("new", "updated"):
            delta = cur[f"incidents_{kind}"] - self._last_counts[f"incidents_{kind}"]
            if delta > 0:
                self.metrics.incidents.labels(kind=kind).inc(delta)
        for name, metric in (("vl_late_found", self.metrics.late_found),
                             ("vl_buckets_reread", self.metrics.reconcile_rereads)):
            delta = cur[name] - self._last_counts[name]
            if delta > 0:
                metric.inc(delta)
        if self.vl is not None and self.client is not None:
            self.metrics.source_up.labels(source="victorialogs").set(0 if self.vl.last_error else 1)
            self.metrics.source_reached.labels(source="victorialogs").set(1 if self.client.reached else 0)
        for stage in ("tail", "catchup", "poll", "reconcile"):
            delta = cur[f"vl_errors_{stage}"] - self._last_counts[f"vl_errors_{stage}"]
            if delta > 0:
                self.metrics.errors.labels(stage=stage).inc(delta)
        self._last_counts = cur
        if self.vl is not None:
            lag = self.vl.lag_s(now)
            if lag is not None:
                self.metrics.lag.set(lag)

    # -- loop --------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None,
            after_step: Callable[[Watcher], None] | None = None) -> dict[str, Any]:
        """Step until ``duration_s`` passes or ``stop`` is set: every ``refresh_s``, and sooner
        (at most every ``refresh_s / 10``) when the live tail has rows waiting."""
        stop = stop or threading.Event()
        t_end = None if self.options.duration_s is None else time.monotonic() + self.options.duration_s
        if self.vl is None and self.files is None:
            self.open()
        min_gap = self.options.refresh_s / 10
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                self.step()
                if after_step is not None:
                    after_step(self)
                if t_end is not None and time.monotonic() >= t_end:
                    if self.files is not None:
                        self.step(final=True)   # nothing read is left unreported
                        if after_step is not None:
                            after_step(self)
                    break
                deadline = t0 + self.options.refresh_s
                if t_end is not None:
                    deadline = min(deadline, t_end)
                if not self._wait(stop, t0 + min_gap, deadline):
                    break
        finally:
            self.close()
        if self.vl is not None and self.client is not None and not self.client.reached:
            raise self._never_reached()   # a watch that never read anything must not look like a quiet one
        return self.summary()

    def _wait(self, stop: threading.Event, earliest: float, deadline: float) -> bool:
        """Sleep until ``deadline`` or until tail rows arrive (not before ``earliest``).
        False when ``stop`` was set."""
        if stop.wait(max(0.0, earliest - time.monotonic())):
            return False
        ready = self.vl.data_ready if self.vl is not None else None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (ready is not None and ready.is_set()):
                return not stop.is_set()
            if stop.wait(min(left, 0.02 if ready is not None else left)):
                return False

    def summary(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self.stats)
        if self.vl is not None:
            s.update({f"vl_{k}": v for k, v in self.vl.stats.items()})
            s["complete_ns"] = self.vl.complete_ns
        if self.files is not None:
            s.update({f"files_{k}": v for k, v in self.files.stats.items()})
        s["incidents"] = len(self.incidents)
        if self.problems:
            s["problems"] = dict(self.problems)
        return s

    def close(self) -> None:
        if self.vl is not None:
            self.vl.close()
        if self.files is not None:
            self.files.close()
        try:
            self._save(force=True)
        except ConfigError as exc:
            log.warning("%s", exc)
        finally:
            if self.lock is not None:
                self.lock.release()
