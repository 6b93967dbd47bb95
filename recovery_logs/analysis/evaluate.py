"""Evaluation harness: replay every simulated scenario and score the engine against its truth.

``evaluate_engine(root, EvalOptions())`` finds scenario directories (each with a ``truth.json`` written by
``recovery_logs.simulate``), replays each with ``recovery_logs.pipeline.replay`` and scores:

* ``top1`` / ``top3``   the culprit node is the top incident's node / among the first three
                        candidates of the top incident or the nodes of the top three incidents
* ``category_ok``       the top incident's category is the truth's (runs expecting no incident:
                        no incident, or one of the truth's category)
* ``actions_ok``        every action the top incident proposes is acceptable for this fault
* ``innocent_drains``   drain proposals (any incident) whose target is not a node at fault
* ``disruptive``        drain/requeue/cancel/reset proposals on runs that expect no incident
* ``latency_s``         matching incident's ``detected_at`` minus the fault time (event time);
                        ``decisive_latency_s`` the same from the first line that identifies it

A missing or corrupt ``truth.json`` is reported for that directory and the rest still run.
``EvalReport.missed`` lists the floors (``EvalOptions.min_*``/``max_*``) that were not met.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery_logs.analysis.truth import load_truth, scenario_dirs
from recovery_logs.detectors.rulepack import RulePack, load_packs
from recovery_logs.errors import ConfigError, EvalFloorMissed, InputError, RecoveryLogsError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.schema import HARDWARE_CATEGORIES
from recovery_logs.sources.files import ReadOptions
from recovery_logs.timeutil import iso_to_ns

DISRUPTIVE = frozenset({"drain_node", "requeue_job", "cancel_job", "reset_gpu"})
INPUTS = ("auto", "text", "vl")
TEXT_GLOBS = ("nodes/*/*.log", "nodes/*/*.log.gz", "job-*/*.out", "job-*/*.err")

# replay adapter: (paths, truth) -> (incidents ranked most important first, summary dict)


ReplayFn = Callable[[list[Path], dict[str, Any]], tuple[list[Any], dict[str, Any]]]


@dataclass(frozen=True)
class EvalOptions:
    input: str = "auto"                    # auto (text files if present, else vl.jsonl) | text | vl
    min_top1: float = 0.0                  # fraction of node-level scenarios with the right top-1 culprit
    min_top3: float = 0.0
    min_category: float = 0.0
    max_innocent_drains: int = 0
    max_latency_s: float | None = None     # hardware faults: detected_at minus the decisive line
    require_healthy_clean: bool = True     # runs expecting no incident propose nothing disruptive
    max_errors: int = 0                    # scenarios that could not be scored (bad truth, replay error)
    replay: ReplayFn | None = None

    def check(self) -> None:
        if self.input not in INPUTS:
            raise ConfigError(f"eval: unknown input kind {self.input!r}", option="--input", known=", ".join(INPUTS))
        for name in ("min_top1", "min_top3", "min_category"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"eval: {name} must be a fraction in [0, 1]", option="--" + name.replace("_", "-"),
                                  value=v)
        if self.max_innocent_drains < 0 or self.max_errors < 0:
            raise ConfigError("eval: maximum counts must be >= 0")
        if self.max_latency_s is not None and self.max_latency_s < 0:
            raise ConfigError("eval: --max-latency must be >= 0", value=self.max_latency_s)


@dataclass
class ScenarioScore:
    name: str
    path: str
    error: str | None = None
    truth: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"scenario": self.name, "path": self.path, "error": self.error}
        if self.truth:
            d["truth"] = {k: self.truth.get(k) for k in ("fault_kind", "category", "culprit_node", "culprit_gpu",
                                                         "node_fault", "fault_time", "decisive_time", "xid")}
        d.update(self.metrics)
        return d


@dataclass
class EvalReport:
    scores: list[ScenarioScore]
    totals: dict[str, Any]
    missed: list[str]

    @property
    def ok(self) -> bool:
        return not self.missed

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "missed": self.missed, "totals": self.totals,
                "scenarios": [s.to_dict() for s in self.scores]}


def scenario_inputs(d: Path, kind: str) -> list[Path]:
    text = sorted({p for g in TEXT_GLOBS for p in d.glob(g) if p.is_file()})
    vl = d / "vl.jsonl"
    if kind == "text" or (kind == "auto" and text):
        if not text:
            raise InputError("eval: no text logs in scenario directory", path=str(d))
        return text
    if not vl.exists():
        raise InputError("eval: no vl.jsonl in scenario directory", path=str(d))
    return [vl]


class PipelineReplay:
    """The default replay adapter: ``recovery_logs.pipeline.replay`` with a fresh Engine per
    scenario that shares one loaded rule pack (loading and compiling the packs is the slow part)."""

    def __init__(self) -> None:
        self._pack: RulePack | None = None

    def __call__(self, paths: list[Path], truth: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        opts = ReplayOptions(read=ReadOptions(year=int(str(truth.get("start_time") or truth.get("fault_time")
                                                           or "2026")[:4])))
        if self._pack is None:
            self._pack = load_packs(opts.config.rules_dir)
        res = replay(paths, opts, engine=Engine(opts.config, self._pack))
        return list(res.incidents), dict(res.summary)


# ---- scoring ------------------------------------------------------------------------------------

def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _ns(v: Any) -> int | None:
    if v is None:
        return None
    return int(v) if isinstance(v, int) else iso_to_ns(str(v))


def score(truth: dict[str, Any], incidents: list[Any]) -> dict[str, Any]:
    """Pure: the metrics of one scenario from its truth and the ranked incidents."""
    culprit = truth.get("culprit_node")
    never = set(truth.get("never_drain") or [])
    # truth files without node_fault (older bundles): the culprit is at fault unless it must never be drained
    node_fault = bool(truth.get("node_fault", culprit is not None and culprit not in never))
    guilty = {culprit} if (node_fault and culprit) else set()
    live = [f for f in truth.get("faults") or [] if not f.get("masked")]   # combinations
    for f in live:
        if f.get("node_fault") and f.get("culprit_node"):
            guilty.add(f["culprit_node"])
    culprits = ({culprit} | {f.get("culprit_node") for f in live}) - {None}
    expect = bool(truth.get("expect_incident"))
    cat = truth.get("category")
    acceptable = set(truth.get("acceptable_actions") or [])
    top = incidents[0] if incidents else None
    actions = [(_get(a, "kind"), _get(a, "target")) for i in incidents for a in (_get(i, "actions") or ())]
    drains = [t for k, t in actions if k == "drain_node"]
    m: dict[str, Any] = {"incidents": len(incidents), "node_level": bool(guilty),
                         "top": None if top is None else {
                             "category": _get(top, "category"), "node": _get(top, "node"), "gpu": _get(top, "gpu"),
                             "xid": _get(top, "xid"), "cause": _get(top, "cause"),
                             "actions": [f"{_get(a, 'kind')}:{_get(a, 'target')}" for a in _get(top, "actions") or ()]}}
    if culprits:
        m["top1"] = top is not None and _get(top, "node") in culprits
        near = {_get(c, "node") for c in list(_get(top, "candidates") or ())[:3]} if top is not None else set()
        near |= {_get(i, "node") for i in incidents[:3]}
        m["top3"] = bool(culprits & near)
    else:
        m["top1"] = m["top3"] = None
    if truth.get("culprit_gpu") is not None and top is not None:
        m["gpu_ok"] = _get(top, "gpu") == truth["culprit_gpu"]
    if expect:
        m["category_ok"] = top is not None and _get(top, "category") == cat
        kinds = [_get(a, "kind") for a in (_get(top, "actions") or ())] if top is not None else []
        m["actions_ok"] = top is not None and (all(k in acceptable for k in kinds) if kinds else "none" in acceptable)
    else:
        m["category_ok"] = None if cat is None else (top is None or _get(top, "category") == cat)
        m["actions_ok"] = all(k not in DISRUPTIVE or k in acceptable for k, _ in actions)
    m["innocent_drains"] = sum(1 for t in drains if t not in guilty)
    m["disruptive"] = 0 if expect else sum(1 for k, _ in actions if k in DISRUPTIVE)
    # latency: the first incident that names the fault (category and, if known, the node)
    fault_t, decisive_t = _ns(truth.get("fault_time")), _ns(truth.get("decisive_time"))
    same_cat = [i for i in incidents if _get(i, "category") == cat] if expect else []
    match = next((i for i in same_cat if not culprits or _get(i, "node") in culprits), same_cat[0] if same_cat else None)
    det = _ns(_get(match, "detected_at")) if match is not None else None
    m["latency_s"] = (det - fault_t) / 1e9 if det is not None and fault_t is not None else None
    m["decisive_latency_s"] = (det - decisive_t) / 1e9 if det is not None and decisive_t is not None else None
    m["hardware"] = bool(cat in HARDWARE_CATEGORIES and node_fault)
    if cat == "nccl_timeout_hang" and det is not None and decisive_t is not None:
        m["watchdog_lead_s"] = (decisive_t - det) / 1e9   # how long before the 600 s NCCL watchdog fired
    return m


def _rate(scores: list[dict[str, Any]], key: str) -> float | None:
    vals = [s[key] for s in scores if s.get(key) is not None]
    return sum(1 for v in vals if v) / len(vals) if vals else None


def per_category(scores: list[ScenarioScore]) -> dict[str, dict[str, Any]]:
    """Precision/recall of the top incident's category against the truth, per category: for the
    behavioural detectors (straggler, nccl_timeout_hang, anomaly) this is their detection quality."""
    pairs = [(s.truth.get("category") if s.truth.get("expect_incident") else None,
              (s.metrics.get("top") or {}).get("category")) for s in scores if s.error is None]
    out: dict[str, dict[str, Any]] = {}
    for cat in sorted({c for p in pairs for c in p if c}):
        tp = sum(1 for t, g in pairs if t == cat and g == cat)
        n_pred = sum(1 for _, g in pairs if g == cat)
        n_true = sum(1 for t, _ in pairs if t == cat)
        out[cat] = {"true": n_true, "predicted": n_pred, "precision": tp / n_pred if n_pred else None,
                    "recall": tp / n_true if n_true else None}
    return out


def totals(scores: list[ScenarioScore], wall_s: float) -> dict[str, Any]:
    ok = [s.metrics for s in scores if s.error is None]
    node_level = [m for m in ok if m.get("node_level")]
    lat = [m["decisive_latency_s"] for m in ok if m.get("hardware") and m.get("decisive_latency_s") is not None]
    lines = sum(int(m.get("lines") or 0) for m in ok)
    replay_s = sum(float(m.get("replay_s") or 0) for m in ok)
    return {
        "scenarios": len(scores), "errors": sum(1 for s in scores if s.error), "node_level": len(node_level),
        "top1": _rate(node_level, "top1"), "top3": _rate(node_level, "top3"),
        "category": _rate(ok, "category_ok"), "actions": _rate(ok, "actions_ok"),
        "innocent_drains": sum(m["innocent_drains"] for m in ok),
        "unclean_quiet_runs": sum(1 for m in ok if m["disruptive"]),
        "missed_detections": sum(1 for s in scores if s.error is None and s.truth.get("expect_incident")
                                 and not s.metrics["incidents"]),
        "hardware_latency_mean_s": statistics.fmean(lat) if lat else None,
        "hardware_latency_max_s": max(lat) if lat else None,
        "hang_watchdog_lead_min_s": min(leads) if (leads := [m["watchdog_lead_s"] for m in ok
                                                              if m.get("watchdog_lead_s") is not None]) else None,
        "lines": lines, "replay_s": round(replay_s, 3), "replay_lines_per_s": lines / replay_s if replay_s else None,
        "wall_s": round(wall_s, 3),
        "per_category": per_category(scores),
    }


def floors(t: dict[str, Any], o: EvalOptions) -> list[str]:
    missed = []
    for key, floor in (("top1", o.min_top1), ("top3", o.min_top3), ("category", o.min_category)):
        if t[key] is not None and t[key] < floor:
            missed.append(f"{key} {t[key]:.3f} < {floor:.3f}")
    if t["innocent_drains"] > o.max_innocent_drains:
        missed.append(f"innocent drains {t['innocent_drains']} > {o.max_innocent_drains}")
    if o.require_healthy_clean and t["unclean_quiet_runs"]:
        missed.append(f"{t['unclean_quiet_runs']} run(s) expecting no incident got drain/requeue/cancel/reset proposals")
    if o.max_latency_s is not None and t["hardware_latency_max_s"] is not None and \
            t["hardware_latency_max_s"] > o.max_latency_s:
        missed.append(f"hardware latency {t['hardware_latency_max_s']:.1f}s > {o.max_latency_s:.1f}s")
    if t["errors"] > o.max_errors:
        missed.append(f"{t['errors']} scenario(s) could not be scored > {o.max_errors}")
    return missed


def evaluate_engine(root: str | Path, options: EvalOptions | None = None,
             on_score: Callable[[ScenarioScore], None] | None = None) -> EvalReport:
    o = options or EvalOptions()
    o.check()
    t0 = time.perf_counter()
    run = o.replay or PipelineReplay()
    scores: list[ScenarioScore] = []
    for d in scenario_dirs(root, strict=True):
        sc = ScenarioScore(name=d.name, path=str(d))
        try:
            truth = load_truth(d, strict=True)
            assert truth is not None   # strict: a missing truth.json raised
            sc.truth = truth
            sc.name = str(sc.truth.get("scenario") or d.name)
            paths = scenario_inputs(d, o.input)
            t1 = time.perf_counter()
            incidents, summary = run(paths, sc.truth)
            sc.metrics = score(sc.truth, incidents)
            sc.metrics["replay_s"] = round(time.perf_counter() - t1, 4)
            sc.metrics["lines"] = summary.get("lines", summary.get("events"))
            sc.metrics["events"] = summary.get("events")
        except RecoveryLogsError as exc:
            sc.error = f"{type(exc).__name__}: {exc}"
        scores.append(sc)
        if on_score is not None:
            on_score(sc)
    t = totals(scores, time.perf_counter() - t0)
    return EvalReport(scores=scores, totals=t, missed=floors(t, o))


__all__ = ["EvalFloorMissed", "EvalOptions", "EvalReport", "PipelineReplay", "ScenarioScore", "evaluate_engine", "floors", "per_category", "score",
           "scenario_inputs", "totals"]
