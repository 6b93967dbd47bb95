"""Backtest a remediation policy over history: what it would have done, and whether it was right.

Dry by construction: history is replayed with the engine (record only), each proposal is run
through the pure policy (``remediation.policy.replay_policy``) and nothing ever reaches a
cluster. The question a backtest answers is "had this policy been allowed to act, what would its
limits have let through?", so it evaluates the policy with ``mode = "autonomous"`` and
``dry_run = false`` unless ``BacktestOptions.mode`` says otherwise (monitor mode would only record).

History is a list of *cases*: a directory with ``truth.json`` (a bundled incident or one simulator
scenario) is one case, a directory whose sub-directories hold ``truth.json`` (simulator output)
gives one case each, and any other path is one case without truth. ``spacing_s`` lays cases end
to end (case k starts ``k * spacing_s`` after the first, its times shifted as a block); ``None``
keeps the logs' own times.

Each proposal's *grade*: against ``truth.json`` where the case has one (right when the action
kind is acceptable and a node action names the true culprit and no never-drain node; a requeue
names the truth's job), else from later outcomes (``grading.grade_proposals``: the node failed
again in a later incident of the history; more outcomes can be passed in). An optional
``PromotionGate`` holds the proposals of rules whose precision (from the grades of *earlier*
proposals only) does not yet pass the gate; held proposals never run and cost no budget.

Nodes drained concurrently: an executed drain keeps its node drained for ``drain_hold_s``
(default: the breaker window, the span the breaker itself counts); the peak over the history is
``max_concurrent_drains``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Group
from rich.table import Table
from rich.text import Text

from recovery_logs.analysis.truth import load_truth, scenario_dirs
from recovery_logs.config import EngineConfig
from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.errors import ConfigError, InputError
from recovery_logs.frames import incident_dicts, root_rule, rows_frame
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.scale import replay_sharded
from recovery_logs.remediation.gate import PromotionGate
from recovery_logs.remediation.grading import grade_proposals, outcomes_from_incidents
from recovery_logs.remediation.policy import (
    EXECUTABLE_KINDS,
    ActionRequest,
    PolicyConfig,
    PolicyState,
    load_policy,
    replay_policy,
)
from recovery_logs.schema import TIME, SchemaDict
from recovery_logs.timeutil import NS, iso_to_ns, ns_to_iso

__all__ = ["DECISION_SCHEMA", "BacktestOptions", "BacktestResult", "Case", "backtest", "count_cases", "grade_against_truth",
           "load_cases", "max_concurrent", "rows_with_iso_times", "run_backtest"]


DECISION_SCHEMA: SchemaDict = {
    "case": pl.String, "incident_id": pl.String, "time": TIME, "root_rule": pl.String, "category": pl.String,
    "node": pl.String, "job_id": pl.String, "kind": pl.String, "target": pl.String, "decision": pl.String,
    "outcome": pl.String, "reason": pl.String, "breaker_trip": pl.Boolean, "grade": pl.String, "basis": pl.String,
}
"""One row per proposal. ``decision``: the policy's verdict (``approved`` = would have run,
``denied``, ``record_only``, ``proposed``) or ``held`` by the promotion gate. ``outcome`` buckets it:
executed | budget | breaker | cooldown | gate | not_executable | other."""


@dataclass(frozen=True)
class Case:
    name: str
    paths: tuple[Path, ...]
    truth: dict[str, Any] | None
    incidents: tuple[dict[str, Any], ...]
    first_ns: int | None
    hosts: frozenset[str]


@dataclass(frozen=True)
class BacktestOptions:
    spacing_s: float | None = None
    mode: str = "autonomous"
    gate: PromotionGate | None = None
    horizon_s: float = 7 * 86400.0
    drain_hold_s: float | None = None
    cluster_nodes: int = 0
    config: EngineConfig = field(default_factory=EngineConfig)
    read: Any = None          # sources.files.ReadOptions for every case (e.g. an archive's since/until/nodes)
    workers: int | None = None        # replay each case on Ray (pipeline.scale): same result
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.spacing_s is not None and self.spacing_s <= 0:
            raise ConfigError("backtest: spacing must be > 0", value=self.spacing_s)
        if self.mode not in ("monitor", "approve", "autonomous"):
            raise ConfigError("backtest: unknown mode", value=self.mode)


# ---------------------------------------------------------------------------- cases
def _case_dirs(p: Path) -> list[tuple[str, list[Path], Path | None]]:
    dirs = scenario_dirs(p)
    return [(d.name, [d], d) for d in dirs] if dirs else [(p.name, [p], None)]


def count_cases(data: Sequence[str | Path]) -> int:
    """How many cases ``load_cases`` will replay (for a progress bar)."""
    return sum(len(_case_dirs(Path(p))) for p in data)


def load_cases(data: Sequence[str | Path], config: EngineConfig | None = None,
               on_case: Any = None, read: Any = None, scale: tuple[int | None, str | None] = (None, None)) -> list[Case]:
    """Replay every case under ``data`` (record only) and keep what a backtest needs."""

    if not data:
        raise ConfigError("backtest: no DATA paths given")
    cfg = config or EngineConfig()
    pack = load_packs(cfg.rules_dir)      # compiled once, shared by every case's engine
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for raw in data:
        p = Path(raw)
        if not p.exists() and not any(ch in str(raw) for ch in "*?["):
            raise InputError("backtest: data path does not exist", path=str(p))
        for name, paths, tdir in _case_dirs(p):
            n = seen.get(name, 0)
            seen[name] = n + 1
            if scale != (None, None):
                res = replay_sharded(paths, ReplayOptions(config=cfg, read=read), workers=scale[0], address=scale[1])
            else:
                res = replay(paths, ReplayOptions(config=cfg, read=read), engine=Engine(cfg, pack=pack))
            first = res.summary.get("first_event")
            truth = load_truth(tdir) if tdir else None
            # the job's nodes when the truth names them (logs also carry controller hosts)
            hosts = frozenset((truth or {}).get("nodes") or res.engine.windows["host"].drop_nulls().unique().to_list())
            cases.append(Case(name if n == 0 else f"{name}#{n}", tuple(paths), truth,
                              tuple(incident_dicts(res)), iso_to_ns(first) if first else None, hosts))
            if on_case is not None:    # progress: one case replayed
                on_case(cases[-1])
    return cases


# ---------------------------------------------------------------------------- grading
def grade_against_truth(kind: str, target: str | None, truth: dict[str, Any]) -> tuple[str, str]:
    """(grade, basis) of one proposal against a ``truth.json``."""
    ok = set(truth.get("acceptable_actions") or [])
    if kind not in ok:
        return "wrong", f"{kind} is not an acceptable action for {truth.get('fault_kind')}"
    if kind in ("drain_node", "reset_gpu"):
        node = (target or "").split(":", 1)[0]
        if node in set(truth.get("never_drain") or []):
            return "wrong", f"{node} must never be drained ({truth.get('fault_kind')})"
        if node != truth.get("culprit_node"):
            return "wrong", f"{node} is not the culprit ({truth.get('culprit_node')})"
    if kind == "requeue_job" and truth.get("job_id") and target != str(truth["job_id"]):
        return "wrong", f"requeues {target}, the faulted job is {truth['job_id']}"
    return "right", f"acceptable for {truth.get('fault_kind')}"


# ---------------------------------------------------------------------------- backtest
def _rows(cases: Sequence[Case], spacing_s: float | None) -> list[dict[str, Any]]:
    starts = [c.first_ns for c in cases if c.first_ns is not None]
    base = min(starts) if starts else 0
    rows = []
    for k, c in enumerate(cases):
        shift = 0 if spacing_s is None or c.first_ns is None else base + int(k * spacing_s * NS) - c.first_ns
        for d in c.incidents:
            rr = root_rule(d)
            t = iso_to_ns(d["detected_at"]) + shift
            for n, a in enumerate(d.get("actions") or []):
                rows.append({"case": c.name, "incident_id": d["id"], "time": t, "first_seen":
                             iso_to_ns(d["first_seen"]) + shift, "root_rule": rr, "category": d.get("category"),
                             "node": d.get("node"), "job_id": d.get("job_id"), "kind": a["kind"],
                             "target": a.get("target"), "_order": (t, k, d["id"], n), "_k": k})
    rows.sort(key=lambda r: r["_order"])
    return rows


def _outcome(decision: str, reason: str, kind: str) -> str:
    if decision == "held":
        return "gate"
    if decision in ("approved", "dry_run"):
        return "executed"
    if kind not in EXECUTABLE_KINDS:
        return "not_executable"
    r = reason.lower()
    for key, bucket in (("circuit breaker", "breaker"), ("budget", "budget"), ("cooldown", "cooldown")):
        if key in r:
            return bucket
    return "other"


def backtest(cases: Sequence[Case], policy: PolicyConfig, options: BacktestOptions | None = None,
             outcomes: pl.DataFrame | None = None) -> BacktestResult:
    """Run ``policy`` over the proposals of ``cases``; pure apart from the cases already loaded."""
    opts = options or BacktestOptions()
    hosts = frozenset().union(*(c.hosts for c in cases)) if cases else frozenset()
    nodes = opts.cluster_nodes or policy.cluster_nodes or len(hosts)
    pol = replace(policy, mode=opts.mode, dry_run=False, cluster_nodes=nodes)
    rows = _rows(cases, opts.spacing_s)
    truth = {c.name: c.truth for c in cases}
    # grades: truth where known, else later outcomes (other incidents on the same node, given outcomes)
    inc_rows = [{"incident_id": f"{r['case']}:{r['incident_id']}", "category": r["category"], "node": r["node"],
                 "first_seen": r["first_seen"]} for r in rows]
    inc = rows_frame(inc_rows, {"incident_id": pl.String, "category": pl.String, "node": pl.String, "first_seen": TIME})
    outs = outcomes_from_incidents(inc.unique("incident_id"))
    if outcomes is not None:
        outs = pl.concat([outs, outcomes.select(outs.columns).cast(outs.schema)])
    prop = rows_frame([{"incident_id": f"{r['case']}:{r['incident_id']}", "action_id": f"{r['case']}:{n}",
                    "time": r["time"], "root_rule": r["root_rule"], "category": r["category"], "node": r["node"],
                    "job_id": r["job_id"], "kind": r["kind"], "target": r["target"]} for n, r in enumerate(rows)],
                  {"incident_id": pl.String, "action_id": pl.String, "time": TIME, "root_rule": pl.String,
                   "category": pl.String, "node": pl.String, "job_id": pl.String, "kind": pl.String,
                   "target": pl.String})
    later = grade_proposals(prop, outs, horizon_s=opts.horizon_s)
    for r, (g, b) in zip(rows, later.select("grade", "basis").iter_rows(), strict=True):
        t = truth.get(r["case"])
        r["grade"], r["basis"] = grade_against_truth(r["kind"], r["target"], t) if t else (g, b)
    # promotion gate: only grades of strictly earlier proposals count
    held: set[int] = set()
    if opts.gate is not None:
        for n, r in enumerate(rows):
            if r["kind"] not in EXECUTABLE_KINDS:
                continue
            past = rows_frame([{"incident_id": f"{q['case']}:{q['incident_id']}", "root_rule": q["root_rule"],
                            "grade": q["grade"]} for q in rows if q["time"] < r["time"]],
                          {"incident_id": pl.String, "root_rule": pl.String, "grade": pl.String})
            if not opts.gate.allows(r["root_rule"], past):
                held.add(n)
                r["gate_reason"] = opts.gate.explain(r["root_rule"], past)
    reqs = [(r["time"] / NS, ActionRequest(r["kind"], r["target"] or "", f"{r['case']}:{r['incident_id']}"))
            for n, r in enumerate(rows) if n not in held]
    _state, verdicts = replay_policy(pol, PolicyState(cluster_nodes=nodes), reqs)
    it = iter(verdicts)
    out = []
    for n, r in enumerate(rows):
        if n in held:
            dec, reason, trip = "held", r["gate_reason"], False
        else:
            v = next(it)
            dec, reason, trip = v.decision, v.reason, v.trip_breaker
        out.append({**{k: r[k] for k in ("case", "incident_id", "time", "root_rule", "category", "node", "job_id",
                                         "kind", "target", "grade", "basis")},
                    "decision": dec, "outcome": _outcome(dec, reason, r["kind"]), "reason": reason,
                    "breaker_trip": trip})
    decisions = rows_frame(out, DECISION_SCHEMA)
    hold = opts.drain_hold_s if opts.drain_hold_s is not None else pol.breaker_window_s
    return BacktestResult(decisions=decisions, policy=pol, options=opts, cluster_nodes=nodes,
                          cases=len(cases), incidents=sum(len(c.incidents) for c in cases), drain_hold_s=hold)


def rows_with_iso_times(df: pl.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts with times as RFC3339 text keeping nanoseconds."""

    tcols = [c for c, t in df.schema.items() if t == TIME]
    flat = df.with_columns([pl.col(c).dt.epoch("ns") for c in tcols])
    return [{**r, **{c: ns_to_iso(r[c]) for c in tcols}} for r in flat.to_dicts()]


def max_concurrent(decisions: pl.DataFrame, hold_s: float) -> int:
    """Peak number of distinct nodes whose executed drain is less than ``hold_s`` old."""
    ex = (decisions.filter((pl.col("kind") == "drain_node") & (pl.col("outcome") == "executed"))
          .select(pl.col("time").dt.epoch("ns"), "target").rows())
    hold = int(hold_s * NS)
    best = 0
    for t, _ in ex:
        best = max(best, len({tgt for u, tgt in ex if t - hold < u <= t}))
    return best


@dataclass
class BacktestResult:
    decisions: pl.DataFrame
    policy: PolicyConfig
    options: BacktestOptions
    cluster_nodes: int
    cases: int
    incidents: int
    drain_hold_s: float

    def _table(self, by: str) -> pl.DataFrame:
        d = self.decisions
        if d.height == 0:
            return pl.DataFrame(schema={by: pl.String, "proposals": pl.UInt32})

        def n(expr: pl.Expr, name: str) -> pl.Expr:
            return expr.sum().cast(pl.Int64).alias(name)

        oc = pl.col("outcome")
        t = d.group_by(by).agg(
            pl.len().cast(pl.Int64).alias("proposals"), n(oc == "executed", "executed"), n(oc == "budget", "budget"),
            n(oc == "breaker", "breaker"), n(oc == "cooldown", "cooldown"), n(oc == "gate", "gate_held"),
            n(oc == "not_executable", "record_only"), n(pl.col("breaker_trip"), "breaker_trips"),
            n(pl.col("grade") == "right", "right"), n(pl.col("grade") == "wrong", "wrong"),
            n(pl.col("grade") == "unknown", "unknown"),
            n((oc == "executed") & (pl.col("grade") == "wrong"), "executed_wrong"))
        drains = {k: max_concurrent(d.filter(pl.col(by) == k), self.drain_hold_s) for k in t[by].to_list()}
        return t.with_columns(pl.col(by).replace_strict(drains, return_dtype=pl.Int64)
                              .alias("max_concurrent_drains")).sort(by)

    def per_rule(self) -> pl.DataFrame:
        """Counts per root rule (see ``summary`` for the column meanings)."""
        return self._table("root_rule")

    def per_action(self) -> pl.DataFrame:
        """Counts per action kind."""
        return self._table("kind")

    def summary(self) -> dict[str, Any]:
        d = self.decisions
        oc = d["outcome"]
        cnt = {k: int((oc == k).sum()) for k in ("executed", "budget", "breaker", "cooldown", "gate",
                                                 "not_executable")}
        g = d["grade"]
        ex_drain = d.filter((pl.col("kind") == "drain_node") & (pl.col("outcome") == "executed"))
        return {"cases": self.cases, "incidents": self.incidents, "proposals": d.height,
                "executable": int(d["kind"].is_in(sorted(EXECUTABLE_KINDS)).sum()),
                "executed": cnt["executed"], "denied_budget": cnt["budget"], "denied_breaker": cnt["breaker"],
                "denied_cooldown": cnt["cooldown"], "gate_held": cnt["gate"], "record_only": cnt["not_executable"],
                "breaker_trips": int(d["breaker_trip"].sum()), "drains_executed": ex_drain.height,
                "max_concurrent_drains": max_concurrent(d, self.drain_hold_s),
                "right": int((g == "right").sum()), "wrong": int((g == "wrong").sum()),
                "unknown": int((g == "unknown").sum()),
                "executed_wrong": int(((oc == "executed") & (g == "wrong")).sum()),
                "cluster_nodes": self.cluster_nodes, "drain_hold_s": self.drain_hold_s}

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.to_dict(), "mode_evaluated": self.options.mode,
                "spacing_s": self.options.spacing_s,
                "gate": None if self.options.gate is None else {"min_precision": self.options.gate.min_precision,
                                                                "min_incidents": self.options.gate.min_incidents},
                "summary": self.summary(), "per_rule": self.per_rule().to_dicts(),
                "per_action": self.per_action().to_dicts(),
                "decisions": rows_with_iso_times(self.decisions)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=str)

    def __rich__(self) -> Any:
        s = self.summary()
        head = Text(f"backtest: {s['cases']} case(s), {s['incidents']} incident(s), {s['proposals']} proposal(s); "
                    f"policy evaluated as {self.options.mode}, budget {self.policy.budget_per_hour}/h, breaker "
                    f"{self.policy.breaker_max_drain_fraction:.0%} of {self.cluster_nodes} nodes. Dry: nothing "
                    "touched a cluster.", style="bold")
        parts: list[Any] = [head]
        for title, t in (("per rule", self.per_rule()), ("per action", self.per_action())):
            tab = Table(title=title, header_style="bold")
            for c in t.columns:
                tab.add_column(c, justify="left" if t.schema[c] == pl.String else "right")
            for row in t.iter_rows():
                tab.add_row(*[str(v) for v in row])
            parts.append(tab)
        tot = Table.grid(padding=(0, 2))
        for k, v in s.items():
            tot.add_row(k, str(v))
        parts.append(tot)
        return Group(*parts)


def run_backtest(policy_file: str | Path | None, data: Sequence[str | Path], options: BacktestOptions | None = None,
                 outcomes: pl.DataFrame | None = None, on_case: Any = None) -> BacktestResult:
    """Load the policy (its ``[promotion]`` table becomes the gate unless ``options.gate`` is set),
    replay ``data`` and backtest."""

    opts = options or BacktestOptions()
    if policy_file is not None and not Path(policy_file).is_file():
        raise ConfigError("backtest: policy file not found", path=str(policy_file))
    policy = load_policy(Path(policy_file) if policy_file is not None else None)
    if opts.gate is None:
        opts = replace(opts, gate=PromotionGate.from_policy(policy))
    return backtest(load_cases(data, opts.config, on_case, opts.read, (opts.workers, opts.ray_address)),
                    policy, opts, outcomes)


