"""The one place the stages are wired. Replay and watch both drive an :class:`Engine`.

``Engine.feed(events)`` runs the rule matcher on a batch and folds the result into associative
state (findings, windows, (host, job) spans, NCCL address → host map). ``Engine.incidents()`` is
a pure function of that state and the event-time watermark: behavioural detectors, attribution
and planning run over everything accumulated. So for in-order data, feeding all events at once
or in any split gives the same incidents (tested as a property).
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.attribution import Attributor
from recovery_logs.config import EngineConfig
from recovery_logs.errors import InputError
from recovery_logs.model import Incident
from recovery_logs.remediation.plan import RECORD_ONLY, plan
from recovery_logs.schema import check_events, empty_findings, empty_quarantine, own_strings
from recovery_logs.windows import (
    empty_spans,
    empty_windows,
    job_spans,
    merge_spans,
    merge_windows,
    window_counts,
)

_ADDR_RE = (r"(?:^|\s)(?:(?P<h>[A-Za-z0-9_.-]+):\d+:\d+ \[\d+\] )?NCCL INFO "
            r"(?:Bootstrap : Using|NET/Socket : Using|NET/IB : Using .*?OOB) \[?\S*?:(?P<ip>\d+\.\d+\.\d+\.\d+)<")


_NCCL_GPU_RE = r"^[A-Za-z0-9_.-]+:\d+:\d+ \[(\d+)\] NCCL "


def _fill_gpu(found: pl.DataFrame) -> pl.DataFrame:
    """NCCL prefixes name the local GPU (`host:pid:tid [6] NCCL WARN ...`): use it where a rule did not."""
    return found.with_columns(
        pl.coalesce(pl.col("gpu"), pl.col("message").str.extract(_NCCL_GPU_RE, 1).cast(pl.Int32, strict=False))
        .alias("gpu"))


def _subject_host(found: pl.DataFrame) -> pl.DataFrame:
    """A controller line about another node (`Nodes gpu-n02 not responding`) is evidence about that node.

    Rules capture the subject as a `node` group (kept in `detail`); the finding moves to that host, and a
    captured `slurm_job` fills a missing job id. The reporting host stays in the event itself.
    """
    if "detail" not in found.columns or found.filter(pl.col("detail").is_not_null()).height == 0:
        return found
    node = pl.col("detail").str.json_path_match("$.node")
    job = pl.col("detail").str.json_path_match("$.slurm_job").str.extract(r"^(\d+)", 1)
    simple = node.str.contains(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    return found.with_columns(
        pl.when(node.is_not_null() & simple).then(node.str.split(".").list.first()).otherwise(pl.col("host"))
        .alias("host"),
        pl.coalesce(pl.col("job_id"), job).alias("job_id"),
    )


@functools.lru_cache(maxsize=4)
def _anomaly_detector(models_dir: str | None) -> Any:
    """Load (and checksum) the shipped model once per process; the detector itself is stateless."""
    from recovery_logs.detectors.iforest import AnomalyDetector

    return AnomalyDetector.default(Path(models_dir) if models_dir else None)


def default_detectors(config: EngineConfig) -> list[Any]:
    """Behavioural detectors named in ``config.detectors`` (see recovery_logs.detectors)."""
    out: list[Any] = []
    for name in config.detectors:
        if name == "hangs":
            from recovery_logs.detectors.hangs import HangDetector
            out.append(HangDetector())
        elif name == "stragglers":
            from recovery_logs.detectors.stragglers import StragglerDetector
            out.append(StragglerDetector())
        elif name == "anomaly":
            out.append(_anomaly_detector(str(config.models_dir) if config.models_dir else None))
        else:
            from recovery_logs.errors import ConfigError
            raise ConfigError("unknown detector in engine config", detector=name,
                              known=["hangs", "stragglers", "anomaly"])
    return out


class Engine:
    """Accumulates evidence from event batches and ranks incidents on demand."""

    def __init__(self, config: EngineConfig | None = None, pack: Any = None,
                 detectors: Sequence[Any] | None = None, job_states: dict[str, str] | None = None) -> None:
        from recovery_logs.rulepack import load_packs

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
        self.watermark_ns: int | None = None
        self.stats: Counter[str] = Counter()
        self._sticky = empty_findings()
        self._det_cache: tuple[tuple[Any, ...], pl.DataFrame] | None = None
        self._progress_rows = 0
        descriptions = {r.id: (r.description or r.id) for r in self.pack.rules}
        xid_names = {code: e.description or e.mnemonic for code, e in self.pack.xid_catalog.items()}
        self.attributor = Attributor(self.config, descriptions, xid_names)

    # -- input -------------------------------------------------------------------------------
    def feed(self, events: pl.DataFrame) -> pl.DataFrame:
        """Match rules on one batch and fold it into the state. Returns the batch's findings."""
        from recovery_logs.detectors.rules import match

        check_events(events, "engine.feed")
        if events.height == 0:
            return empty_findings()
        found = match(events, self.pack)
        if found.height:
            found = own_strings(_subject_host(_fill_gpu(found)))
            self._chunks.append(found)
            self._findings_cache = None
            self._progress_rows += found.filter(pl.col("category") == "progress").height
        self.windows = merge_windows(self.windows, window_counts(events, found, self.config.window_s))
        self.spans = merge_spans(self.spans, job_spans(events))
        self._learn_addresses(events)
        tmax = events.select(pl.col("time").max().dt.epoch("ns")).item()
        if tmax is not None:
            self.max_time_ns = tmax if self.max_time_ns is None else max(self.max_time_ns, tmax)
        self.stats["events"] += events.height
        self.stats["findings"] += found.height
        cfg = self.config
        if self._progress_rows > cfg.progress_compact_rows and self.max_time_ns is not None:
            self.compact(self.max_time_ns - int(cfg.progress_retention_s * 1e9))
        return found

    def advance(self, watermark_ns: int) -> None:
        """Move the event-time clock (never backwards)."""
        self.watermark_ns = watermark_ns if self.watermark_ns is None else max(self.watermark_ns, watermark_ns)

    def _learn_addresses(self, events: pl.DataFrame) -> None:
        cand = events.filter(pl.col("message").str.contains("NCCL INFO", literal=True))
        if cand.height == 0:
            return
        got = (cand.with_columns(pl.col("message").str.extract_groups(_ADDR_RE).alias("_m"))
               .select(pl.coalesce(pl.col("_m").struct.field("h"), pl.col("host")).alias("h"),
                       pl.col("_m").struct.field("ip").alias("ip"), pl.col("time").dt.epoch("ns").alias("t"))
               .drop_nulls())
        for h, ip, t in got.iter_rows():
            prev = self._addr_first.get(ip)
            if prev is None or t < prev or (t == prev and h < self.addr_hosts[ip]):
                self._addr_first[ip] = t
                self.addr_hosts[ip] = h

    # -- state -------------------------------------------------------------------------------
    @property
    def findings(self) -> pl.DataFrame:
        """All rule findings so far, in (time, seq) order."""
        if self._findings_cache is None:
            if not self._chunks:
                self._findings_cache = empty_findings()
            else:
                self._findings_cache = pl.concat(self._chunks).sort(["time", "seq"], nulls_last=True)
                self._chunks = [self._findings_cache]
        return self._findings_cache

    def detector_findings(self, watermark_ns: int | None = None) -> pl.DataFrame:
        """Behavioural findings at the watermark, plus those materialised before a compaction."""
        from recovery_logs.detectors.base import DetectContext

        wm = watermark_ns if watermark_ns is not None else (
            self.watermark_ns if self.watermark_ns is not None else self.max_time_ns)
        if wm is None or not self.detectors:
            return self._sticky
        key = (wm, self.stats["findings"], self.stats["compacted"], self._sticky.height,
               tuple(sorted((self.job_states or {}).items())))
        if self._det_cache is not None and self._det_cache[0] == key:   # incidents() and reports share it
            return self._det_cache[1]
        ctx = DetectContext(watermark_ns=wm, job_states=self.job_states, config=self.config)
        base = self.findings
        outs = [d.detect(base, self.windows, ctx) for d in self.detectors]
        outs = [o for o in (self._sticky, *outs) if o.height]
        det = empty_findings() if not outs else pl.concat(outs).unique(
            ["rule_id", "time", "host", "job_id", "message"], keep="first", maintain_order=True)
        self._det_cache = (key, det)
        return det

    def compact(self, horizon_ns: int) -> int:
        """Bound memory: drop progress findings and windows older than ``horizon_ns``.

        Detectors are monotone in the watermark (a finding, once emitted, never changes), so their
        findings are materialised first at the largest event time seen and kept; rule findings other
        than progress lines are kept whole (they are what incidents are made of). Returns the number
        of rows dropped.
        """
        if self.max_time_ns is not None:
            self._sticky = self.detector_findings(max(self.max_time_ns, self.watermark_ns or 0))
        f = self.findings
        horizon = pl.lit(horizon_ns).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")
        keep = f.filter((pl.col("category") != "progress") | (pl.col("time") >= horizon))
        dropped = f.height - keep.height
        self._chunks = [keep]
        self._findings_cache = keep
        self._progress_rows = keep.filter(pl.col("category") == "progress").height
        self.windows = self.windows.filter(pl.col("window_start") >= horizon)
        self.stats["compacted"] += dropped
        return dropped

    def all_findings(self) -> pl.DataFrame:
        det = self.detector_findings()
        f = self.findings
        if det.height == 0:
            return f
        return pl.concat([f, det]).sort(["time", "seq"], nulls_last=True)

    def incidents(self, decision: str = RECORD_ONLY) -> list[Incident]:
        """Ranked incidents (most important first) with their proposed actions."""
        incs = self.attributor.incidents(self.all_findings(), self.spans, self.addr_hosts)
        from dataclasses import replace

        return [replace(i, actions=plan(i, self.config, decision)) for i in incs]


# -- replay ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayOptions:
    read: Any = None                     # sources.files.ReadOptions (None: defaults)
    config: EngineConfig = field(default_factory=EngineConfig)
    out_dir: Path | None = None


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    incidents: list[Incident]
    quarantine: pl.DataFrame
    engine: Engine
    outputs: dict[str, Path] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "incidents": [i.to_dict() for i in self.incidents]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, ensure_ascii=False)


COALESCE_ROWS = 200_000
QUARANTINE_KEYS = ("malformed", "invalid_utf8", "oversized", "bad_timestamp", "out_of_order", "duplicates")


def replay(paths: Sequence[str | Path], options: ReplayOptions | None = None,
           batches: Iterable[Any] | None = None, engine: Engine | None = None) -> ReplayResult:
    """Read ``paths`` (or the given ``batches``), detect, attribute and plan; record, never act."""
    from recovery_logs.sources.files import ReadOptions, iter_batches

    opts = options or ReplayOptions()
    read_opts = opts.read or ReadOptions()
    eng = engine or Engine(opts.config)
    t0 = time.perf_counter()
    stats: Counter[str] = Counter()
    quarantine: list[pl.DataFrame] = []
    writer = None
    outputs: dict[str, Path] = {}
    out_dir = Path(opts.out_dir) if opts.out_dir else None
    if out_dir is not None:
        _prepare_out(out_dir)
    source = batches if batches is not None else iter_batches(list(paths), read_opts)
    pending: list[pl.DataFrame] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal writer, pending_rows
        if not pending:
            return
        ev = pl.concat(pending) if len(pending) > 1 else pending[0]
        pending.clear()
        pending_rows = 0
        eng.feed(ev)
        if out_dir is not None:
            writer = _write_events(out_dir, ev, writer)

    try:
        for b in source:
            stats.update(b.stats)
            if b.quarantine.height:
                quarantine.append(own_strings(b.quarantine))
            if b.events.height:   # many small files: coalesce into fewer, larger batches
                pending.append(b.events)
                pending_rows += b.events.height
                if pending_rows >= COALESCE_ROWS:
                    flush()
        flush()
    finally:
        if writer is not None:
            writer.close()
    if eng.stats["events"] == 0:
        raise InputError("no events in the input: nothing to replay",
                         path=", ".join(str(p) for p in paths) or None,
                         lines=stats.get("lines", 0), quarantined=sum(q.height for q in quarantine))
    if eng.max_time_ns is not None:
        eng.advance(eng.max_time_ns)
    incidents = eng.incidents(RECORD_ONLY)
    q = pl.concat(quarantine) if quarantine else empty_quarantine()
    summary = _summary(stats, eng, incidents, q)
    res = ReplayResult(summary=summary, incidents=incidents, quarantine=q, engine=eng,
                       elapsed_s=time.perf_counter() - t0)
    if out_dir is not None:
        outputs = write_outputs(res, out_dir)
        outputs["events"] = out_dir / "events.parquet"
        res.outputs = outputs
    return res


def _summary(stats: Counter[str], eng: Engine, incidents: list[Incident], q: pl.DataFrame) -> dict[str, Any]:
    from recovery_logs.timeutil import ns_to_iso

    f = eng.findings
    first = eng.windows.select(pl.col("first_time").min().dt.epoch("ns")).item() if eng.windows.height else None
    return {
        "files": int(stats.get("files", 0)),
        "lines": int(stats.get("lines", 0)),
        "events": int(eng.stats["events"]),
        "malformed": int(stats.get("malformed", 0)),
        **{k: int(stats.get(k, 0)) for k in QUARANTINE_KEYS if k != "malformed"},
        "quarantined": int(q.height),
        "multiline_joined": int(stats.get("multiline_joined", 0)),
        "time_inferred": int(stats.get("time_inferred", 0)),
        "findings": int(f.height),
        "incidents": len(incidents),
        "drain_proposals": sum(1 for i in incidents for a in i.actions if a.kind == "drain_node"),
        "first_event": ns_to_iso(first),
        "last_event": ns_to_iso(eng.max_time_ns),
        "rules": len(eng.pack.rules),
    }


def _prepare_out(out_dir: Path) -> None:
    from recovery_logs.errors import ConfigError

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output directory is not writable: {exc}", path=str(out_dir)) from exc
    (out_dir / "events.parquet").unlink(missing_ok=True)


def _write_events(out_dir: Path, events: pl.DataFrame, writer: Any) -> Any:
    import pyarrow.parquet as pq

    table = events.to_arrow()
    if writer is None:
        writer = pq.ParquetWriter(str(out_dir / "events.parquet"), table.schema, compression="zstd")
    writer.write_table(table)
    return writer


def write_outputs(res: ReplayResult, out_dir: Path) -> dict[str, Path]:
    """incidents.json, report.md and quarantine.jsonl under out_dir."""
    from recovery_logs.render import markdown_report

    paths = {"json": out_dir / "incidents.json", "markdown": out_dir / "report.md",
             "quarantine": out_dir / "quarantine.jsonl"}
    paths["json"].write_text(res.to_json() + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_report(res), encoding="utf-8")
    with paths["quarantine"].open("w", encoding="utf-8") as fh:
        for row in res.quarantine.iter_rows(named=True):
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    from recovery_logs.report_html import write_html_report

    paths["html"] = write_html_report(res, out_dir)
    return paths
