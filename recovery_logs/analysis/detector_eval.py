"""Training data and evaluation for the behavioural detectors, on simulator output.

* ``analysis.truth.scenario_dirs(root)`` — directories holding a ``truth.json`` (root itself or its children).
* ``replay_rules(path)`` — rule findings and the windows frame of one scenario (engine with no
  behavioural detectors, so each detector can be run and scored on its own).
* ``training_frame(paths, window)`` — ``features.pipeline_features`` rows from scenario dirs,
  log dirs, or Parquet files (feature frames or findings frames).
* ``evaluate_detectors(root, ...)`` — per scenario and in total, for the hang, straggler and anomaly
  detectors: precision / recall, culprit accuracy, detection latency and, for hangs, lead time
  over the NCCL watchdog (the first watchdog line the scenario logs).
* ``inject_novel_fault(src, dst, ...)`` — copies a scenario and adds a burst of log lines that no
  rule covers (a MegaRAID controller's event storm over a failing disk) on one node, for the isolation
  forest's novel-fault evaluation (``evaluate_novel``). (It injected a Lustre/LNet timeout storm until the d19
  sweep gave those lines a rule, ``host_hardware.netfs_server_unreachable``.)

Numbers are event-time seconds. Nothing here prints; the CLI (``train``) and benchmarks do.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recovery_logs.analysis.truth import TRUTH_FILE, load_truth, scenario_dirs
from recovery_logs.config import EngineConfig
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.features import KEYS, PIPELINE_FEATURES, pipeline_features, window_ns
from recovery_logs.detectors.hangs import HangDetector
from recovery_logs.detectors.stragglers import StragglerDetector
from recovery_logs.errors import TrainingDataError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import replay
from recovery_logs.schema import FINDING_SCHEMA
from recovery_logs.timeutil import NS, iso_to_ns, ns_to_iso


@dataclass
class Replayed:
    path: Path
    findings: pl.DataFrame
    windows: pl.DataFrame
    truth: dict[str, Any] | None
    watermark_ns: int


def replay_rules(path: str | Path) -> Replayed:
    """Rule findings + windows of one log directory (no behavioural detectors run)."""

    p = Path(path)
    # full rows (no narrow progress rows): a notebook or training script reads the findings frame itself
    eng = Engine(EngineConfig(), detectors=[], narrow_progress=False)
    res = replay([p], engine=eng)
    truth = load_truth(p)
    return Replayed(p, res.engine.findings, res.engine.windows, truth, int(res.engine.max_time_ns or 0))


def _before_fault(feats: pl.DataFrame, truth: dict[str, Any] | None, window: str) -> pl.DataFrame:
    """Windows that end before the scenario's first fault (all of them for a healthy run)."""
    ft = _t((truth or {}).get("fault_time"))
    if ft is None:
        return feats
    return feats.filter(pl.col("window_start").dt.epoch("ns") + window_ns(window) <= ft)


def training_frame(paths: list[str | Path], window: str = "60s", normal_only: bool = False) -> pl.DataFrame:
    """Feature rows (``KEYS + PIPELINE_FEATURES`` plus ``source``) from every path given.

    ``normal_only``: keep only windows that end before each scenario's fault time (truth.json),
    i.e. train a novelty detector on normal operation."""
    frames = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TrainingDataError("train: data path does not exist", path=str(p))
        if p.is_file() and p.suffix == ".parquet":
            df = pl.read_parquet(p)
            if set(FINDING_SCHEMA) <= set(df.columns):
                df = pipeline_features(df.select(list(FINDING_SCHEMA)), pl.DataFrame(), window)
            frames.append(df.with_columns(pl.lit(str(p)).alias("source")))
            continue
        dirs = scenario_dirs(p) or [p]
        for d in dirs:
            r = replay_rules(d)
            feats = pipeline_features(r.findings, r.windows, window)
            if normal_only:
                feats = _before_fault(feats, r.truth, window)
            frames.append(feats.with_columns(pl.lit(str(d)).alias("source")))
    if not frames:
        raise TrainingDataError("train: no training data found", paths=[str(p) for p in paths])
    return pl.concat(frames, how="diagonal_relaxed")


# -- evaluation ---------------------------------------------------------------------------------

def _t(iso: str | None) -> int | None:
    return None if not iso else iso_to_ns(iso)


def _first_watchdog(findings: pl.DataFrame) -> int | None:
    w = findings.filter(pl.col("message").str.contains("Watchdog caught collective operation timeout", literal=True))
    return None if w.is_empty() else int(w["time"].dt.epoch("ns").min())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal


def _score(tp: int, fp: int, fn: int) -> dict[str, Any]:
    prec = tp / (tp + fp) if tp + fp else None
    rec = tp / (tp + fn) if tp + fn else None
    return {"tp": tp, "fp": fp, "fn": fn, "precision": prec, "recall": rec}


def evaluate_detectors(root: str | Path, anomaly: Any = None, window: str = "60s") -> dict[str, Any]:
    """Score HangDetector, StragglerDetector and (if given) an AnomalyDetector on every scenario."""

    hang, strag = HangDetector(), StragglerDetector()
    rows = []
    c = {k: [0, 0, 0] for k in ("hang", "straggler", "anomaly")}
    culprit_ok = {"hang": [0, 0], "straggler": [0, 0], "anomaly": [0, 0]}
    latency: dict[str, list[float]] = {"hang": [], "straggler": [], "anomaly": []}
    leads: list[float] = []
    for d in scenario_dirs(root):
        r = replay_rules(d)
        truth = r.truth or {}
        ctx = DetectContext(r.watermark_ns, final=True)   # the whole replay: nothing more comes
        kind, culprit = truth.get("fault_kind"), truth.get("culprit_node")
        fault_t = _t(truth.get("fault_time"))
        row: dict[str, Any] = {"scenario": d.name, "fault_kind": kind, "culprit": culprit}
        # hangs
        h = hang.detect(r.findings, r.windows, ctx)
        want = kind == "silent_hang"
        got = h.height > 0
        if got or want:
            c["hang"][0 if (want and got) else 1 if got else 2] += 1
        if want and got:
            culprit_ok["hang"][1] += 1
            culprit_ok["hang"][0] += int(culprit in h["host"].to_list())
            t_det = int(h["time"].dt.epoch("ns").min())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal
            wd = _first_watchdog(r.findings)
            if fault_t is not None:
                latency["hang"].append((t_det - fault_t) / NS)
            if wd is not None:
                leads.append((wd - t_det) / NS)
                row["hang_lead_over_watchdog_s"] = round((wd - t_det) / NS, 1)
        row["hang_findings"] = h.height
        # stragglers
        s = strag.detect(r.findings, r.windows, ctx)
        drains = s.filter(pl.col("action") == "drain_node_and_requeue")
        want = kind == "straggler_node"
        got = drains.height > 0
        if want and got:
            c["straggler"][0] += 1
            culprit_ok["straggler"][1] += 1
            culprit_ok["straggler"][0] += int(culprit in drains["host"].to_list())
            if fault_t is not None:
                latency["straggler"].append((int(drains["time"].dt.epoch("ns").min()) - fault_t) / NS)  # type: ignore[arg-type]  # polars types an aggregate as any Python literal
        elif got:
            c["straggler"][1] += 1
        elif want:
            c["straggler"][2] += 1
        row["straggler_drains"] = drains["host"].to_list()
        row["straggler_imbalance"] = s.height - drains.height
        # anomaly
        if anomaly is not None:
            a = anomaly.detect(r.findings, r.windows, ctx)
            novel = a.filter(pl.col("role") == "cause")
            want = bool(truth.get("expect_incident")) and culprit is not None
            got = novel.height > 0
            if want and got:
                c["anomaly"][0] += 1
                culprit_ok["anomaly"][1] += 1
                after = novel.filter(pl.col("time").dt.epoch("ns") >= (fault_t or 0))
                culprit_ok["anomaly"][0] += int(culprit in after["host"].to_list())
                if fault_t is not None and after.height:
                    latency["anomaly"].append((int(after["time"].dt.epoch("ns").min()) - fault_t) / NS)
            elif got:
                c["anomaly"][1] += 1
            elif want:
                c["anomaly"][2] += 1
            row["anomaly_windows"] = a.height
            row["anomaly_novel_windows"] = novel.height
        rows.append(row)
    summary: dict[str, Any] = {}
    for k, (tp, fp, fn) in c.items():
        if k == "anomaly" and anomaly is None:
            continue
        summary[k] = _score(tp, fp, fn)
        if k in culprit_ok:
            ok, n = culprit_ok[k]
            summary[k]["culprit_accuracy"] = ok / n if n else None
        summary[k]["mean_latency_s"] = float(np.mean(latency[k])) if latency[k] else None
    summary["hang"]["mean_lead_over_watchdog_s"] = float(np.mean(leads)) if leads else None
    return {"scenarios": rows, "summary": summary}


# -- novel faults -------------------------------------------------------------------------------

# linux drivers/scsi/megaraid/megaraid_sas_base.c megasas_decode_evt(): "%d (%s/0x%04x/%s) - %s" (sequence number,
# the controller's time, locale, class, the firmware's event text), and the SCSI midlayer's sense decoding
# (drivers/scsi/scsi_logging.c: "Sense Key : %s [%s]", "Add. Sense: %s") for the disk behind it
NOVEL_TEMPLATES = (
    "megaraid_sas 0000:{a:02x}:00.0: {p} ({h}s/0x0004/WARN) - Command timeout on PD {o:02d}(e0x20/s{b})",
    "megaraid_sas 0000:{a:02x}:00.0: {p} ({h}s/0x0002/WARN) - Unexpected sense: PD {o:02d}(e0x20/s{b}) Path "
    "5000c500a1b2c3{b:02x}, CDB: 28 00 01 a2 b3 c4 00 00 08 00, Sense: 3/11/00",
    "sd 0:2:{o}:0: [sd{c}] tag#{p} Sense Key : Medium Error [current]",
    "sd 0:2:{o}:0: [sd{c}] tag#{p} Add. Sense: Unrecovered read error",
)


def inject_novel_fault(src: str | Path, dst: str | Path, node: str | None = None, at_s: float = 3000.0,
                       lines: int = 400, span_s: float = 90.0, seed: int = 0) -> dict[str, Any]:
    """Copy scenario ``src`` to ``dst`` and append a disk-controller event storm (:data:`NOVEL_TEMPLATES`) to
    ``node``'s kern.log, ``at_s`` seconds after the scenario start. Rewrites truth.json for the injected fault."""

    s, d = Path(src), Path(dst)
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(s, d)
    truth = load_truth(d, strict=True)
    assert truth is not None   # strict: a missing truth.json raised
    node = node or sorted(truth["nodes"])[-1]
    kern = d / "nodes" / node / "kern.log"
    start = iso_to_ns(truth["start_time"])
    rng = np.random.default_rng(seed)
    ts = np.sort(start + int(at_s * NS) + rng.integers(0, int(span_s * NS), lines))
    out = []
    for t in ts:
        tm = dt.datetime.fromtimestamp(int(t) // NS, tz=dt.UTC)
        tmpl = NOVEL_TEMPLATES[int(rng.integers(0, len(NOVEL_TEMPLATES)))]
        msg = tmpl.format(o=int(rng.integers(0, 16)), h=int(rng.integers(700_000_000, 2**30)),
                          a=int(rng.integers(1, 255)), b=int(rng.integers(0, 24)), p=int(rng.integers(1000, 99999)),
                          c="abcdefgh"[int(rng.integers(0, 8))])
        out.append(f"{tm:%b} {tm.day:2d} {tm:%H:%M:%S} {node} kernel: [{(t - start) / NS + 3270000:.6f}] {msg}")
    existing = kern.read_text().splitlines() if kern.exists() else []
    merged = sorted(existing + out, key=lambda line: line[:15])   # syslog lines sort by their timestamp
    kern.write_text("\n".join(merged) + "\n")
    fault_t = int(ts[0])
    truth.update({"scenario": d.name, "fault_kind": "novel_raid_storm", "category": "anomaly", "culprit_node": node,
                  "culprit_gpu": None, "node_fault": True, "xid": None, "fault_time": ns_to_iso(fault_t),
                  "decisive_time": ns_to_iso(fault_t), "expect_incident": True,
                  "acceptable_actions": ["investigate"]})
    (d / TRUTH_FILE).write_text(json.dumps(truth, indent=2) + "\n")
    return truth


def evaluate_novel(roots: list[str | Path], anomaly: Any) -> dict[str, Any]:
    """Window-level and scenario-level detection of injected novel faults by the anomaly detector.

    A scenario is detected when a role-``cause`` anomaly finding names the culprit node within
    10 minutes after the fault; healthy scenarios (no culprit) count false alarms per window."""
    per = []
    for root in roots:
        for d in scenario_dirs(root):
            r = replay_rules(d)
            truth = r.truth or {}
            ctx = DetectContext(r.watermark_ns, final=True)   # the whole replay: nothing more comes
            a = anomaly.detect(r.findings, r.windows, ctx)
            novel = a.filter(pl.col("role") == "cause")
            fault_t = _t(truth.get("fault_time"))
            culprit = truth.get("culprit_node")
            hit = None
            if culprit and fault_t is not None:
                m = novel.filter((pl.col("host") == culprit) & (pl.col("time").dt.epoch("ns") >= fault_t)
                                 & (pl.col("time").dt.epoch("ns") <= fault_t + 600 * NS))
                hit = None if m.is_empty() else (int(m["time"].dt.epoch("ns").min()) - fault_t) / NS
            feats = pipeline_features(r.findings, r.windows)
            per.append({"scenario": d.name, "kind": truth.get("fault_kind"), "culprit": culprit,
                        "windows": feats.height, "flagged": novel.height,
                        "flagged_other_hosts": novel.filter(pl.col("host") != (culprit or "")).height,
                        "detected": hit is not None, "latency_s": hit})
    faults = [p for p in per if p["culprit"]]
    clean = [p for p in per if not p["culprit"]]
    return {
        "scenarios": per,
        "recall": (sum(p["detected"] for p in faults) / len(faults)) if faults else None,
        "false_alarm_windows_per_healthy_scenario": (float(np.mean([p["flagged"] for p in clean])) if clean else None),
        "false_alarm_rate_healthy_windows": (sum(p["flagged"] for p in clean) / max(1, sum(p["windows"] for p in clean))
                                             if clean else None),
    }


def window_labels(features: pl.DataFrame, truth: dict[str, Any], after_s: float = 600.0,
                  window: str = "60s") -> pl.Series:
    """True for windows of the culprit node from the fault time to ``after_s`` later."""
    culprit, ft = truth.get("culprit_node"), _t(truth.get("fault_time"))
    if not culprit or ft is None:
        return pl.Series("label", [False] * features.height)
    wn = window_ns(window)
    w = features["window_start"].dt.epoch("ns")
    return ((features["host"] == culprit) & (w + wn >= ft) & (w <= ft + int(after_s * NS))).fill_null(False).rename("label")


__all__ = ["KEYS", "PIPELINE_FEATURES", "Replayed", "evaluate_detectors", "evaluate_novel", "inject_novel_fault",
           "replay_rules", "training_frame", "window_labels"]
