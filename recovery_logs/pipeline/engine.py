"""The engine: the one place the stages are wired. Replay and watch both drive an :class:`Engine`.

``Engine.feed(events)`` runs the rule matcher on a batch and folds the result into associative
state (findings, windows, (host, job) spans, NCCL address → host map). ``Engine.incidents()`` is
a pure function of that state and the event-time watermark: behavioural detectors, attribution
and planning run over everything accumulated. So for in-order data, feeding all events at once
or in any split gives the same incidents (tested as a property).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.attribution import Attributor, rank_key
from recovery_logs.config import EngineConfig
from recovery_logs.detectors import textclass
from recovery_logs.detectors.anomaly import AnomalyDetector
from recovery_logs.detectors.base import DetectContext, Detector
from recovery_logs.detectors.hangs import HangDetector
from recovery_logs.detectors.linescore import LineScoreParams, LineStats, score_lines
from recovery_logs.detectors.progress import is_plain, observations
from recovery_logs.detectors.rank_outliers import LIST_RULES
from recovery_logs.detectors.rulepack import RulePack, load_packs
from recovery_logs.detectors.rules import match
from recovery_logs.detectors.stragglers import REPORT_RULES, StragglerDetector
from recovery_logs.errors import ConfigError
from recovery_logs.inventory import GpuInventory, fill_gpus, inventory_records, nccl_gpu_records
from recovery_logs.jobjoin import annotate, fill_jobs, tag_attempts
from recovery_logs.pipeline.enrich import fill_gpu, nccl_addresses, subject_host
from recovery_logs.pipeline.progress_store import ProgressStore, sorted_chunks
from recovery_logs.records import Incident
from recovery_logs.remediation.plan import RECORD_ONLY, plan
from recovery_logs.schema import PROGRESS_CATEGORY, check_events, empty_findings, own_strings
from recovery_logs.windows import (
    counted_spans,
    counted_windows,
    empty_spans,
    empty_windows,
    job_spans,
    merge_spans,
    merge_windows,
    window_counts,
)


@functools.lru_cache(maxsize=4)
def _anomaly_detector(models_dir: str | None) -> AnomalyDetector:
    """The shipped model's detector, once per process; the model is loaded (and checksummed) on
    the first window that needs scoring, from its compiled form (no scikit-learn import)."""
    return AnomalyDetector.default(Path(models_dir) if models_dir else None, lazy=True)


def default_detectors(config: EngineConfig) -> list[Detector]:
    """Behavioural detectors named in ``config.detectors`` (see recovery_logs.detectors)."""
    out: list[Detector] = []
    for name in config.detectors:
        if name == "hangs":
            out.append(HangDetector())
        elif name == "stragglers":
            out.append(StragglerDetector())
        elif name == "anomaly":
            out.append(_anomaly_detector(str(config.models_dir) if config.models_dir else None))
        else:
            raise ConfigError("unknown detector in engine config", detector=name,
                              known=["hangs", "stragglers", "anomaly"])
    return out


@dataclass
class EnginePart:
    """What one batch (or several, merged) adds to an Engine's state: built by ``Engine.partial``
    anywhere (a Ray worker), folded in by ``Engine.absorb``. ``feed`` = ``absorb(partial(...))``."""

    findings: pl.DataFrame
    windows: pl.DataFrame
    spans: pl.DataFrame
    addresses: dict[str, tuple[int, str]]      # NCCL ip -> (first time ns, host), the earliest
    max_time_ns: int | None
    events: int
    gpus: list[Any] = field(default_factory=list)   # GPU inventory records (NVML inventory, NCCL init lines), in order
    lines: LineStats | None = None     # template counts and candidate lines, when line scores are on

    def merge(self, other: EnginePart) -> EnginePart:
        """Both parts as one (associative; ``self`` read before ``other``)."""
        addr = dict(self.addresses)
        for ip, th in other.addresses.items():
            if ip not in addr or th < addr[ip]:
                addr[ip] = th
        mx = [t for t in (self.max_time_ns, other.max_time_ns) if t is not None]
        return EnginePart(pl.concat([self.findings, other.findings]), merge_windows(self.windows, other.windows),
                          merge_spans(self.spans, other.spans), addr, max(mx) if mx else None,
                          self.events + other.events, self.gpus + other.gpus,
                          _merge_lines(self.lines, other.lines))

    def shift_seq(self, offset: int) -> EnginePart:
        """The part as if its events had been read after ``offset`` others (global ``seq``)."""
        if not offset:
            return self
        return replace(self, findings=self.findings.with_columns(pl.col("seq") + offset),
                       lines=self.lines.shift_seq(offset) if self.lines is not None else None)


LINE_SCORE_PARAMS = LineScoreParams()
# progress rules whose text a detector parses (the straggler timing reports): kept as full rows
TEXT_RULES = frozenset((*REPORT_RULES, *LIST_RULES))


def _merge_lines(a: LineStats | None, b: LineStats | None) -> LineStats | None:
    if a is None or b is None:
        return a if b is None else b
    return a.merge(b, LINE_SCORE_PARAMS)


class Engine:
    """Accumulates evidence from event batches and ranks incidents on demand."""

    def __init__(self, config: EngineConfig | None = None, pack: RulePack | None = None,
                 detectors: Sequence[Detector] | None = None, job_states: dict[str, str] | None = None,
                 narrow_progress: bool = True) -> None:
        """``narrow_progress=False``: every finding kept as a full row (the reference the narrow
        progress rows are tested against: the same incidents and detector findings)."""
        self.config = config or EngineConfig()
        self.pack = pack if pack is not None else load_packs(self.config.rules_dir)
        self.detectors = list(detectors) if detectors is not None else default_detectors(self.config)
        self.job_states = job_states
        self._chunks: list[pl.DataFrame] = []
        self._findings_cache: pl.DataFrame | None = None
        self.windows = empty_windows()
        self.spans = empty_spans()
        self.addr_hosts: dict[str, str] = {}
        self._addr_first: dict[str, int] = {}
        self.max_time_ns: int | None = None
        self.min_time_ns: int | None = None   # earliest event time fed (kept through compaction)
        self.watermark_ns: int | None = None
        self.closed_ns: int | None = None     # every source delivered up to here (None: the watermark)
        self.final = False                    # the input is complete (``advance(..., final=True)``)
        self.floods: dict[tuple[Any, ...], list[int]] = {}   # compacted flood rows: key -> [n, first, last]
        self.stats: Counter[str] = Counter()
        self._sticky = empty_findings()
        self._det_cache: tuple[tuple[Any, ...], pl.DataFrame] | None = None
        # plain progress findings (nearly all of a fleet's) are held narrow (detectors.progress); the
        # rest, progress reports included, as full rows in _chunks
        self.progress_store = ProgressStore()
        self.narrow_progress = narrow_progress
        self._main_progress_rows = 0                  # progress-category rows among the full rows
        self._main_oldest_ns: int | None = None       # earliest of those (None: none)
        # False: the lines of every batch were counted elsewhere (a VictoriaLogs server's stats,
        # absorbed as an EnginePart of windows and spans); feed() then adds only what the batch's
        # findings, addresses and GPU records add, and its events are not counted again
        self.count_lines = True
        descriptions = {r.id: (r.description or r.id) for r in self.pack.rules}
        xid_names = {code: e.description or e.mnemonic for code, e in self.pack.xid_catalog.items()}
        self.attributor = Attributor(self.config, descriptions, xid_names)
        self.inventory = GpuInventory()                 # (host, PCI) -> GPU index/UUID (NVML agent, NCCL lines)
        self.allocations: pl.DataFrame | None = None    # Slurm accounting (sources.accounting); None: not given
        self.line_stats = LineStats.empty()             # line scores (config.line_scores): templates, candidates

    def set_accounting(self, allocations: pl.DataFrame | None) -> None:
        """The allocations frame (``sources.accounting.ALLOCATION_SCHEMA``) findings are joined
        against (``recovery_logs.jobjoin``); None means "no accounting input" (incidents say so)."""
        self.allocations = allocations

    # -- input -------------------------------------------------------------------------------
    def feed(self, events: pl.DataFrame, count_lines: bool | None = None) -> pl.DataFrame:
        """Match rules on one batch and fold it into the state. Returns the batch's findings.
        ``count_lines``: as in ``partial`` (None: ``self.count_lines``)."""
        check_events(events, "engine.feed")
        if events.height == 0:
            return empty_findings()
        # the findings' strings are copied by absorb for the rows it keeps full (a plain progress row's
        # strings become categoricals and its text goes): copying all of them first cost ~0.15 s per
        # 700 k fleet lines. The frame returned may share the batch's string buffers
        part = self._partial(events, self.count_lines if count_lines is None else count_lines, own=False)
        self.absorb(part)
        return part.findings

    def partial(self, events: pl.DataFrame, count_lines: bool = True) -> EnginePart:
        """What ``events`` add to the state, without touching it (pure: rules, windows, spans).
        ``count_lines=False``: the events' line counts (windows' lines/first/last, spans, the event
        count) are left out — they were counted elsewhere (see ``count_lines``). The findings' strings
        are in buffers of their own (``schema.own_strings``): a part may be held across batches."""
        return self._partial(events, count_lines, own=True)

    def _partial(self, events: pl.DataFrame, count_lines: bool, own: bool) -> EnginePart:
        found = match(events, self.pack)
        if self.config.textclass:   # lines no rule won, where the learned classifier is confident
            mdir = str(self.config.models_dir) if self.config.models_dir else None
            extra = textclass.classify_unclaimed(events, found, lambda: textclass.default_model(mdir))
            if extra.height:
                found = extra if found.height == 0 else pl.concat([found, extra]).sort("seq", maintain_order=True)
        if found.height:
            found = subject_host(fill_gpu(found))
            if own:
                found = own_strings(found)
        addr: dict[str, tuple[int, str]] = {}
        for h, ip, t in nccl_addresses(events):
            if ip not in addr or (t, h) < addr[ip]:
                addr[ip] = (t, h)
        tmax = events.select(pl.col("time").max().dt.epoch("ns")).item()
        stats = LineStats.of(events, LINE_SCORE_PARAMS) if self.config.line_scores else None
        if not count_lines:
            return EnginePart(found, window_counts(events.clear(), found, self.config.window_s), empty_spans(), addr,
                              tmax, 0, inventory_records(events) + nccl_gpu_records(events), stats)
        return EnginePart(found, window_counts(events, found, self.config.window_s), job_spans(events), addr,
                          tmax, events.height, inventory_records(events) + nccl_gpu_records(events), stats)

    def absorb_counts(self, counts: pl.DataFrame) -> int:
        """Fold line counts made elsewhere (``sources.vl_history.line_counts``: host, job_id, bucket,
        lines, first, last) into the windows and spans; the lines' findings come in through
        ``feed``/``partial(count_lines=False)``. Returns the lines counted."""
        if counts.height == 0:
            return 0
        total = int(counts["lines"].sum())
        tmax = int(counts["last"].max())  # type: ignore[arg-type]  # polars aggregate
        self.absorb(EnginePart(empty_findings(), counted_windows(counts), counted_spans(counts), {}, tmax, total))
        return total

    def absorb(self, part: EnginePart) -> None:
        """Fold a part (from ``partial``, here or in a worker) into the state."""
        self.final = False
        found = part.findings
        if found.height:
            plain = found.select(is_plain(TEXT_RULES)).to_series() if self.narrow_progress else None
            rest = found
            if plain is not None and plain.any():
                self.progress_store.add(found.filter(plain))
                rest = found.filter(~plain)
            if rest.height:
                self._chunks.append(own_strings(rest))     # (a part from feed: not yet copied)
                self._findings_cache = None
            prog = rest.filter(pl.col("category") == PROGRESS_CATEGORY)
            if prog.height:
                self._main_progress_rows += prog.height
                t0 = prog.select(pl.col("time").min().dt.epoch("ns")).item()
                if t0 is not None and (self._main_oldest_ns is None or t0 < self._main_oldest_ns):
                    self._main_oldest_ns = int(t0)
        self.windows = merge_windows(self.windows, part.windows)
        self.spans = merge_spans(self.spans, part.spans)
        for ip, (t, h) in part.addresses.items():
            prev = self._addr_first.get(ip)
            if prev is None or t < prev or (t == prev and h < self.addr_hosts[ip]):
                self._addr_first[ip] = t
                self.addr_hosts[ip] = h
        if part.gpus:
            self.inventory.update(part.gpus)
        if part.lines is not None:
            self.line_stats = self.line_stats.merge(part.lines, LINE_SCORE_PARAMS)
        if part.windows.height:
            tmin = part.windows.select(pl.col("first_time").min().dt.epoch("ns")).item()
            if tmin is not None:
                self.min_time_ns = tmin if self.min_time_ns is None else min(self.min_time_ns, tmin)
        tmax = part.max_time_ns
        if tmax is not None:
            self.max_time_ns = tmax if self.max_time_ns is None else max(self.max_time_ns, tmax)
        self.stats["events"] += part.events
        self.stats["findings"] += found.height
        cfg = self.config
        if self.progress_rows > cfg.progress_compact_rows and self.max_time_ns is not None:
            horizon = self.max_time_ns - int(cfg.progress_retention_s * 1e9)
            if self._compactable(horizon):   # else nothing would be dropped: no detector run for nothing
                self.compact(horizon)

    def advance(self, watermark_ns: int, closed_ns: int | None = None, final: bool = False) -> None:
        """Move the event-time clock (never backwards). ``closed_ns``: while a live reader is still
        behind in a source, the event time up to which every source has delivered; detectors then
        see the clock there (no window is scored, no silence measured, past what was read), so a
        live run catching up decides as a replay does. None: nothing is behind. ``final``: the
        input is complete (a replay's end): the detectors decide what they would otherwise wait
        on (``DetectContext.final``); any later feed or ``advance`` clears it."""
        self.watermark_ns = watermark_ns if self.watermark_ns is None else max(self.watermark_ns, watermark_ns)
        self.closed_ns = closed_ns
        self.final = final and closed_ns is None

    # -- state -------------------------------------------------------------------------------
    @property
    def findings(self) -> pl.DataFrame:
        """All rule findings so far, in (time, seq) order: :attr:`rule_findings` and the plain progress
        findings held narrow (:attr:`progress`) as full rows again — every column as the rule gave it
        but the text (``message``, null unless the line resumes a job's progress: ``pipeline.
        progress_store``) and ``detail`` (null). Built on each call: the engine's own stages read
        :attr:`rule_findings` and :attr:`progress`."""
        main = self.rule_findings
        if self.progress_store.height == 0:
            return main
        wide = self.progress_store.widened()
        if main.height == 0:
            return wide
        return pl.concat([main, wide]).sort(["time", "seq"], nulls_last=True, maintain_order=True)

    @property
    def progress(self) -> pl.DataFrame:
        """The plain progress findings held, narrow (``detectors.progress.PROGRESS_SCHEMA``), in (time, seq) order."""
        return self.progress_store.frame

    def observed(self) -> pl.DataFrame:
        """The progress observations the detectors read (``detectors.progress.observations`` of the
        full rows and the narrow ones, keys as strings): made once per detector pass and shared by
        the detectors, not kept (a live watcher would hold the progress rows twice)."""
        return observations(self.rule_findings, self.progress if self.progress_store.height else None)

    @property
    def findings_rows(self) -> int:
        """Rule findings held (full and narrow rows): ``findings.height`` without building it."""
        return sum(c.height for c in self._chunks) + self.progress_store.height

    @property
    def rule_findings(self) -> pl.DataFrame:
        """The rule findings held as full rows (all but the plain progress ones), in (time, seq) order."""
        if self._findings_cache is None:
            if not self._chunks:
                self._findings_cache = empty_findings()
            else:
                chunks, self._chunks = self._chunks, []
                self._findings_cache = sorted_chunks(chunks)
                self._chunks = [self._findings_cache]
        return self._findings_cache

    def detector_findings(self, watermark_ns: int | None = None) -> pl.DataFrame:
        """Behavioural findings at the watermark, plus those materialised before a compaction."""

        wm = watermark_ns if watermark_ns is not None else (
            self.watermark_ns if self.watermark_ns is not None else self.max_time_ns)
        if wm is None or not (self.detectors or self.config.line_scores):
            return self._sticky
        closed = None if self.closed_ns is None or watermark_ns is not None else min(wm, self.closed_ns)
        if closed is not None:
            wm = closed
        final = self.final and watermark_ns is None
        key = (wm, closed, final, self.stats["findings"], self.stats["compacted"], self._sticky.height, self.line_stats.total,
               tuple(sorted((self.job_states or {}).items())))
        if self._det_cache is not None and self._det_cache[0] == key:   # incidents() and reports share it
            return self._det_cache[1]
        base = self.rule_findings
        ctx = DetectContext(watermark_ns=wm, job_states=self.job_states, config=self.config, closed_ns=closed,
                            progress=self.progress if self.progress_store.height else None,
                            observed=self.observed(), final=final)
        outs = [d.detect(base, self.windows, ctx) for d in self.detectors]
        if self.config.line_scores:
            outs.append(self.line_scores(wm))
        outs = [o for o in (self._sticky, *outs) if o.height]
        det = empty_findings() if not outs else pl.concat(outs).unique(
            ["rule_id", "time", "host", "job_id", "message"], keep="first", maintain_order=True)
        self._det_cache = (key, det)
        return det

    def line_scores(self, watermark_ns: int | None = None) -> pl.DataFrame:
        """``detectors.linescore`` findings over every line seen (at or before the watermark): rare
        error-level lines and new templates that no rule won."""
        f = score_lines(self.line_stats, LINE_SCORE_PARAMS, self.rule_findings.filter(pl.col("role") != "progress"))
        if watermark_ns is not None and f.height:
            f = f.filter(pl.col("time").is_null() | (pl.col("time").dt.epoch("ns") <= watermark_ns))
        return f

    def _compactable(self, horizon_ns: int) -> bool:
        """Whether ``compact(horizon_ns)`` would drop anything (a progress finding or a window older
        than the horizon). When it would not, compacting only re-runs the detectors: a replay of an
        hour of a large fleet (more progress lines than ``progress_compact_rows``, none older than
        the retention) otherwise ran every detector once per batch."""
        oldest = self._oldest_progress_ns
        if oldest is not None and oldest < horizon_ns:
            return True
        if self.windows.height:
            w0 = self.windows.select(pl.col("window_start").min().dt.epoch("ns")).item()
            return w0 is not None and w0 < horizon_ns
        return False

    def compact(self, horizon_ns: int) -> int:
        """Bound memory: drop progress findings and windows older than ``horizon_ns``.

        Detectors are monotone in the watermark (a finding, once emitted, never changes), so their
        findings are materialised first at the largest event time seen and kept; rule findings other
        than progress lines are kept whole (they are what incidents are made of). Returns the number
        of rows dropped.
        """
        if self.max_time_ns is not None:
            self._sticky = self.detector_findings(max(self.max_time_ns, self.watermark_ns or 0))
        f = self.rule_findings
        horizon = pl.lit(horizon_ns).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")
        keep = f.filter((pl.col("category") != "progress") | (pl.col("time") >= horizon))
        dropped = f.height - keep.height + self.progress_store.keep(pl.col("time") >= horizon)
        self._set_main(keep)
        self.windows = self.windows.filter(pl.col("window_start") >= horizon)
        self.stats["compacted"] += dropped
        return dropped

    def spill_findings(self, path: Path) -> None:
        """Write the rule findings held to ``path`` (Arrow IPC, lz4; the narrow progress rows beside
        it, ``<path>.progress``) and let go of them, until :meth:`load_findings`: a replay by
        allocation holds every bin's state between reading and judging but only one bin's findings
        in memory at a time (``pipeline.scale``). Nothing else may be fed in between."""
        self.rule_findings.write_ipc(path, compression="lz4")
        self.progress_store.spill(_progress_path(path))
        self._chunks = []
        self._findings_cache = None

    def load_findings(self, path: Path) -> None:
        """The findings :meth:`spill_findings` wrote, held again (same rows, same order; the narrow
        rows' file is removed, ``path`` is the caller's)."""
        self._chunks = [pl.read_ipc(path)]
        self._findings_cache = None
        self.progress_store.load(_progress_path(path))

    @property
    def progress_rows(self) -> int:
        """Progress findings held (narrow and full rows)."""
        return self.progress_store.height + self._main_progress_rows

    @property
    def _oldest_progress_ns(self) -> int | None:
        ts = [t for t in (self.progress_store.oldest_ns, self._main_oldest_ns) if t is not None]
        return min(ts) if ts else None

    def _set_main(self, keep: pl.DataFrame) -> None:
        """Hold ``keep`` as the full rows (in order)."""
        self._chunks = [keep]
        self._findings_cache = keep
        self._main_progress_rows = keep.filter(pl.col("category") == PROGRESS_CATEGORY).height
        self._main_oldest_ns = self._oldest_progress(keep)

    def compact_progress(self, horizon_ns: int, above_rows: int, slack_ns: int = 0) -> int:
        """:meth:`compact` at ``horizon_ns`` when more than ``above_rows`` progress findings are
        held and some are older than ``horizon - slack`` (a live reader's bound, at most once per
        ``slack`` of event time; replay compacts by the config's)."""
        oldest = self._oldest_progress_ns
        if self.progress_rows <= above_rows or oldest is None or oldest >= horizon_ns - slack_ns:
            return 0
        return self.compact(horizon_ns)

    @staticmethod
    def _oldest_progress(f: pl.DataFrame) -> int | None:
        t0 = f.filter(pl.col("category") == "progress").select(pl.col("time").min().dt.epoch("ns")).item()
        return None if t0 is None else int(t0)

    def compact_floods(self, before_ns: int, drop_before_ns: int | None = None) -> int:
        """Bound memory under a flood of findings: of the fault findings older than ``before_ns``,
        keep per (host, job, rule, half incident-gap bucket) the first and the last, and count the
        rest in ``floods`` (incidents add them back to their counts). Grouping, ids, first/last
        seen, evidence and ``detected_at`` are unchanged: no two kept rows of a flood are further
        apart than the incident gap. ``drop_before_ns``: also drop findings older than that whole
        (an incident that old is reported and closed). Returns the rows dropped."""
        if self.max_time_ns is not None:   # (while a source is behind, only what it delivered is decided)
            self._sticky = self.detector_findings(
                None if self.closed_ns is not None else max(self.max_time_ns, self.watermark_ns or 0))
        f = self.rule_findings
        if f.height == 0 and self.progress_store.height == 0:
            return 0
        t = pl.col("time").dt.epoch("ns")
        # (a null time goes, as it does from the full rows below: their drop expression is null there)
        gone_progress = 0 if drop_before_ns is None else self.progress_store.keep(t >= drop_before_ns)
        bucket = max(1, int(self.config.incident_gap_s * 1e9 / 2))
        old = (t < before_ns) & (pl.col("category") != "progress")
        keys = ["host", "job_id", "rule_id", "_b"]
        g = f.with_columns((t // bucket).alias("_b"), old.alias("_old"))
        g = g.with_columns(pl.int_range(pl.len()).over([*keys, "_old"]).alias("_r"),
                           pl.len().over([*keys, "_old"]).alias("_n"))
        drop = pl.col("_old") & (pl.col("_r") > 0) & (pl.col("_r") < pl.col("_n") - 1)
        if drop_before_ns is not None:
            drop = drop | (t < drop_before_ns)
        gone = g.filter(drop & (t >= (drop_before_ns if drop_before_ns is not None else -(2**62))))
        if gone.height:
            for host, job, rule, b, n, t0, t1 in gone.group_by(keys).agg(
                    pl.len(), t.min().alias("t0"), t.max().alias("t1")).iter_rows():
                cur = self.floods.get((host, job, rule, b))
                self.floods[(host, job, rule, b)] = [n, t0, t1] if cur is None else [cur[0] + n, min(cur[1], t0),
                                                                                    max(cur[2], t1)]
        if drop_before_ns is not None:
            self.floods = {k: v for k, v in self.floods.items() if v[2] >= drop_before_ns}
            self.windows = self.windows.filter(pl.col("window_start").dt.epoch("ns") >= drop_before_ns)
        keep = g.filter(~drop).drop("_b", "_old", "_r", "_n")
        dropped = f.height - keep.height
        if dropped:
            self._set_main(keep)
        dropped += gone_progress
        if dropped:
            self.stats["compacted"] += dropped
            self.stats["flood_compacted"] += dropped
        return dropped

    def _add_floods(self, inc: Incident) -> Incident:
        """Counts of compacted flood rows back into the incident they belong to."""
        extra: dict[str, int] = {}
        for (host, job, rule, _b), (n, t0, t1) in self.floods.items():
            if rule in inc.counts_by_rule and (host is None or host in inc.nodes) \
                    and (job is None or job == inc.job_id) and inc.first_seen <= t0 and t1 <= inc.last_seen:
                extra[rule] = extra.get(rule, 0) + n
        if not extra:
            return inc
        counts = {k: v + extra.get(k, 0) for k, v in inc.counts_by_rule.items()}
        return replace(inc, count=inc.count + sum(extra.values()), counts_by_rule=counts)

    def all_findings(self, progress: bool = True) -> pl.DataFrame:
        """Rule and detector findings in (time, seq) order. ``progress=False``: without the
        ``progress`` category (what attribution reads): on a fleet those are nearly all the rows, and
        concatenating and sorting them with the detector findings copied the whole frame."""
        det = self.detector_findings()
        if not progress:
            f = self.rule_findings.filter(pl.col("category") != PROGRESS_CATEGORY)
            det = det.filter(pl.col("category") != PROGRESS_CATEGORY)
        else:
            f = self.findings
        if det.height == 0:
            return f
        return pl.concat([f, det]).sort(["time", "seq"], nulls_last=True)

    def incidents(self, decision: str = RECORD_ONLY) -> list[Incident]:
        """Ranked incidents (most important first) with their proposed actions."""
        return [i for _, i in self.ranked_incidents(decision)]

    def ranked_incidents(self, decision: str = RECORD_ONLY) -> list[tuple[tuple[Any, ...], Incident]]:
        """``incidents()`` with each one's ranking key (``attribution.rank_key``, taken before the
        accounting annotation): results judged apart (``pipeline.scale``) merge into this order."""
        # attribution leaves progress findings out (Attributor.incidents): they never reach an incident
        f = fill_gpus(self.all_findings(progress=False), self.inventory)
        if self.allocations is not None and self.allocations.height:
            f = tag_attempts(fill_jobs(f, self.allocations, self.inventory), self.allocations)
        incs = self.attributor.incidents(f, self.spans, self.addr_hosts)
        keys = [rank_key(i) for i in incs]
        incs = annotate(incs, self.allocations, self.inventory, self.spans, self.config.job_span_grace_s)
        if self.floods:
            incs = [self._add_floods(i) for i in incs]

        return [(k, replace(i, actions=plan(i, self.config, decision))) for k, i in zip(keys, incs, strict=True)]


def _progress_path(path: Path) -> Path:
    return path.with_name(path.name + ".progress")


__all__ = ["TEXT_RULES", "Engine", "EnginePart", "default_detectors"]
