"""Remediation policy: modes, one action budget, a node-drain circuit breaker, cooldown, dry-run.

Pure: ``decide(config, state, request, now)`` looks at an immutable ``PolicyState`` and says
whether one action may run; ``PolicyState.after(...)`` returns the state once it has run. The
remediator persists the state (the ``actions`` table and the breaker in the audit database)
and rebuilds it with ``PolicyState`` on every decision, so a restart changes nothing.

Rules, in the order they are checked:

1. ``mode``: ``monitor`` records only; ``approve`` queues for a human; ``autonomous`` executes.
2. ``resume_node`` of a node *we* drained is always allowed by the breaker (a tripped breaker
   never blocks undoing our own drains) but still takes budget.
3. Circuit breaker (drains only): when it is tripped, no drain runs until ``slurm breaker-reset``.
   A drain that would make more than ``breaker.max_drain_fraction`` of the cluster's nodes
   drained by us within ``breaker.window_s`` is denied and trips the breaker.
4. Budget: at most ``budget.per_hour`` actions of any kind per cluster in any sliding hour,
   and at most ``budget.per_incident`` per incident.
5. Cooldown: no action on a target that had an action less than ``cooldown_s`` ago.
6. ``dry_run``: an allowed action is recorded as ``dry_run`` and not executed; it never consumes
   budget, never starts a cooldown and never feeds the breaker.

What counts: only *verified effects* (an action Slurm was seen to apply, status ``done``) and
actions in flight (``queued``/``running``: a reservation, released when they end otherwise) count
against the budget, the cooldown and the breaker. A denied, failed, skipped or not-owner action
counts nothing. A denial whose reason can clear (breaker, hourly budget, cooldown, unknown
cluster size; ``Verdict.retry``) is re-evaluated by the remediator until ``retry_s`` after it was
first proposed, then expires visibly (an ``expired`` audit record).

Idempotency (re-detection never acts twice) is the remediator's job: an action is keyed by
``ActionProposal.idempotency_key`` and a key that exists is never planned again.

Policy file (TOML)::

    mode = "monitor"            # monitor | approve | autonomous
    dry_run = false
    cooldown_s = 900
    cluster = "default"
    retry_s = 1800              # a denial that may clear (breaker, budget, cooldown) is retried this long
    [budget]
    per_hour = 10
    per_incident = 3
    [breaker]
    max_drain_fraction = 0.25
    window_s = 3600
    cluster_nodes = 0           # 0 = ask Slurm (sinfo) for the node count
    [jobs]
    max_requeues_per_job = 3    # restart ceiling: requeues of one job (across its attempts) we may run
    stop_same_error_attempts = 3  # this many attempts failing the same way on different nodes: cancel
    no_requeue_exit_codes = [93]  # an attempt that exited with one of these declared "do not requeue"

7. Jobs: a requeue beyond ``max_requeues_per_job`` for one job (its chain of attempts, see
   ``sources.accounting``) is denied. Cooldown and idempotency of job actions are keyed on the
   attempt, so a requeued job's next failure is judged on its own and a reused job id never
   inherits the cooldown of the job that had it before.

Approvals (approve mode): ``approvals_required = 2`` makes a drain wait for two different
operators (four eyes; the same name never counts twice); ``proposal_ttl_s`` (0 = never, the
default; the sample policy sets 3600) expires a proposal nobody decided in time. Every approval re-checks the policy at approve
time (breaker, budget, cooldown) and Slurm (the node is still up, the job still running).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recovery_logs.errors import PolicyError

MODES = ("monitor", "approve", "autonomous")
HOUR_S = 3600.0
EXECUTABLE_KINDS = frozenset({"drain_node", "requeue_job", "cancel_job", "resume_node"})
# promotion gate defaults (a `[promotion]` table without a key takes these; see recovery_logs.remediation.grading)
DEFAULT_PROMOTION_PRECISION = 0.9
DEFAULT_PROMOTION_INCIDENTS = 20


@dataclass(frozen=True)
class PolicyConfig:
    mode: str = "monitor"
    dry_run: bool = False
    cooldown_s: float = 900.0
    cluster: str = "default"
    budget_per_hour: int = 10
    budget_per_incident: int = 3
    breaker_max_drain_fraction: float = 0.25
    breaker_window_s: float = 3600.0
    cluster_nodes: int = 0
    retry_s: float = 1800.0
    # promotion gate: in autonomous mode a rule acts alone only once its graded precision is at least
    # promotion_min_precision over at least promotion_min_incidents proposals (None: no gate)
    promotion_min_precision: float | None = None
    promotion_min_incidents: int = DEFAULT_PROMOTION_INCIDENTS
    approvals_required: int = 1          # distinct operators a drain needs in approve mode
    proposal_ttl_s: float = 0.0          # a proposal nobody decided expires after this (0 = never)
    max_requeues_per_job: int = 3
    stop_same_error_attempts: int = 3
    no_requeue_exit_codes: tuple[int, ...] = (93,)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PolicyError(f"policy: unknown mode {self.mode!r} (use one of {', '.join(MODES)})", key="mode")
        checks = (("cooldown_s", self.cooldown_s >= 0), ("budget.per_hour", self.budget_per_hour >= 0),
                  ("budget.per_incident", self.budget_per_incident >= 0),
                  ("breaker.max_drain_fraction", 0 < self.breaker_max_drain_fraction <= 1),
                  ("breaker.window_s", self.breaker_window_s > 0), ("breaker.cluster_nodes", self.cluster_nodes >= 0),
                  ("retry_s", self.retry_s >= 0),
                  ("promotion.min_precision", self.promotion_min_precision is None
                   or 0 <= self.promotion_min_precision <= 1),
                  ("promotion.min_incidents", self.promotion_min_incidents >= 1),
                  ("approvals_required", 1 <= self.approvals_required <= 5),
                  ("proposal_ttl_s", self.proposal_ttl_s >= 0),
                  ("jobs.max_requeues_per_job", self.max_requeues_per_job >= 0),
                  ("jobs.stop_same_error_attempts", self.stop_same_error_attempts >= 2),
                  ("jobs.no_requeue_exit_codes", all(0 <= c <= 255 for c in self.no_requeue_exit_codes)))
        for key, ok in checks:
            if not ok:
                raise PolicyError(f"policy: {key} is out of range", key=key)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "dry_run": self.dry_run, "cooldown_s": self.cooldown_s, "cluster": self.cluster,
                "retry_s": self.retry_s,
                "budget": {"per_hour": self.budget_per_hour, "per_incident": self.budget_per_incident},
                "breaker": {"max_drain_fraction": self.breaker_max_drain_fraction,
                            "window_s": self.breaker_window_s, "cluster_nodes": self.cluster_nodes},
                "promotion": {"min_precision": self.promotion_min_precision,
                              "min_incidents": self.promotion_min_incidents},
                "approvals_required": self.approvals_required, "proposal_ttl_s": self.proposal_ttl_s,
                "jobs": {"max_requeues_per_job": self.max_requeues_per_job,
                         "stop_same_error_attempts": self.stop_same_error_attempts,
                         "no_requeue_exit_codes": list(self.no_requeue_exit_codes)}}


def policy_from_dict(d: dict[str, Any], **overrides: Any) -> PolicyConfig:
    """Inverse of ``PolicyConfig.to_dict`` (used to reopen a state dir with the policy it recorded)."""
    b, br, pr, jb = d.get("budget", {}), d.get("breaker", {}), d.get("promotion", {}), d.get("jobs", {})
    kw = {"mode": d.get("mode", "monitor"), "dry_run": d.get("dry_run", False), "cooldown_s": d.get("cooldown_s", 900.0),
          "cluster": d.get("cluster", "default"), "retry_s": d.get("retry_s", 1800.0),
          "budget_per_hour": b.get("per_hour", 10),
          "budget_per_incident": b.get("per_incident", 3),
          "breaker_max_drain_fraction": br.get("max_drain_fraction", 0.25),
          "breaker_window_s": br.get("window_s", 3600.0), "cluster_nodes": br.get("cluster_nodes", 0),
          "promotion_min_precision": pr.get("min_precision"),
          "promotion_min_incidents": pr.get("min_incidents", DEFAULT_PROMOTION_INCIDENTS),
          "approvals_required": d.get("approvals_required", 1), "proposal_ttl_s": d.get("proposal_ttl_s", 0.0),
          "max_requeues_per_job": jb.get("max_requeues_per_job", 3),
          "stop_same_error_attempts": jb.get("stop_same_error_attempts", 3),
          "no_requeue_exit_codes": tuple(jb.get("no_requeue_exit_codes", (93,)))}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return PolicyConfig(**kw)


_TOP: dict[str, type | tuple[type, ...]] = {"mode": str, "dry_run": bool, "cooldown_s": (int, float), "cluster": str,
                                            "retry_s": (int, float), "approvals_required": int,
                                            "proposal_ttl_s": (int, float)}
_SECTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {"budget": {"per_hour": int, "per_incident": int},
             "breaker": {"max_drain_fraction": (int, float), "window_s": (int, float), "cluster_nodes": int},
             "promotion": {"min_precision": (int, float), "min_incidents": int},
             "jobs": {"max_requeues_per_job": int, "stop_same_error_attempts": int, "no_requeue_exit_codes": list}}


def load_policy(path: Path | None, **overrides: Any) -> PolicyConfig:
    """Read and validate a TOML policy file (``None``: defaults). ``overrides`` (e.g. mode) win."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError as exc:
            raise PolicyError("policy: file not found", path=str(path)) from exc
        except IsADirectoryError as exc:
            raise PolicyError("policy: is a directory, not a TOML file", path=str(path)) from exc
        except OSError as exc:
            raise PolicyError(f"policy: cannot read the file: {exc.strerror or exc}", path=str(path)) from exc
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(raw) > 1 and b"\x00" in raw[:64]):
            raise PolicyError("policy: the file is UTF-16 (or binary); save it as UTF-8 TOML", path=str(path))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(f"policy: not UTF-8 text (invalid byte at offset {exc.start})", path=str(path)) from exc
        try:
            data = tomllib.loads(text.removeprefix("\ufeff"))
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy: not valid TOML: {exc}", path=str(path)) from exc
    kw: dict[str, Any] = {}
    for key, val in data.items():
        if key in _TOP:
            if not isinstance(val, _TOP[key]) or (isinstance(val, bool) and _TOP[key] is not bool):
                raise PolicyError(f"policy: {key} has the wrong type ({type(val).__name__})", key=key, path=str(path))
            kw[key] = val
        elif key in _SECTIONS:
            if not isinstance(val, dict):
                raise PolicyError(f"policy: [{key}] must be a table", key=key, path=str(path))
            for sub, sval in val.items():
                want = _SECTIONS[key].get(sub)
                if want is None:
                    raise PolicyError(f"policy: unknown key {key}.{sub}", key=f"{key}.{sub}", path=str(path))
                if not isinstance(sval, want) or isinstance(sval, bool) or (
                        isinstance(sval, list) and not all(isinstance(x, int) and not isinstance(x, bool)
                                                           for x in sval)):
                    raise PolicyError(f"policy: {key}.{sub} has the wrong type ({type(sval).__name__})",
                                      key=f"{key}.{sub}", path=str(path))
                if key == "jobs":
                    kw[sub] = tuple(sval) if isinstance(sval, list) else sval
                    continue
                kw[f"{key}_{sub}" if key in ("budget", "promotion") else
                   ("cluster_nodes" if sub == "cluster_nodes" else f"breaker_{sub}")] = sval
        else:
            raise PolicyError(f"policy: unknown key {key}", key=key, path=str(path))
    if "promotion" in data:   # the table turns the gate on; a missing precision takes the default
        kw.setdefault("promotion_min_precision", DEFAULT_PROMOTION_PRECISION)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return PolicyConfig(**kw)
    except PolicyError as exc:
        if path is not None:
            exc.context["path"] = str(path)
        raise


@dataclass(frozen=True)
class Executed:
    """One action that ran (or is running): what the budget, cooldown and breaker count."""

    ts: float
    kind: str
    target: str
    incident_id: str | None


@dataclass(frozen=True)
class PolicyState:
    executed: tuple[Executed, ...] = ()
    breaker_tripped: bool = False
    breaker_reason: str = ""
    cluster_nodes: int = 0
    dry_runs: int = 0

    def after(self, req: ActionRequest, now: float) -> PolicyState:
        return replace(self, executed=(*self.executed, Executed(now, req.kind, req.target, req.incident_id)))

    def used_last_hour(self, now: float) -> int:
        return sum(1 for e in self.executed if now - HOUR_S < e.ts <= now)

    def used_by_incident(self, incident_id: str | None) -> int:
        return sum(1 for e in self.executed if incident_id is not None and e.incident_id == incident_id)

    def drained_in_window(self, now: float, window_s: float) -> set[str]:
        return {e.target for e in self.executed if e.kind == "drain_node" and now - window_s < e.ts <= now}

    def snapshot(self, config: PolicyConfig, now: float) -> dict[str, Any]:
        """The policy state that produced a decision (written into the decision record)."""
        drained = sorted(self.drained_in_window(now, config.breaker_window_s))
        return {"budget_used_hour": self.used_last_hour(now), "budget_per_hour": config.budget_per_hour,
                "breaker_tripped": self.breaker_tripped, "breaker_reason": self.breaker_reason,
                "drained_in_window": drained, "cluster_nodes": self.cluster_nodes or config.cluster_nodes,
                "mode": config.mode, "dry_run": config.dry_run}


@dataclass(frozen=True)
class ActionRequest:
    kind: str
    target: str
    incident_id: str | None
    own_drain: bool = False     # resume_node of a node whose drain reason is ours
    job_requeues: int = 0       # requeue_job: requeues of this job (its attempts) that already ran


@dataclass(frozen=True)
class Verdict:
    decision: str               # record_only | proposed | approved | denied | dry_run
    reason: str
    trip_breaker: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    retry: bool = False         # a denial whose reason can clear (breaker reset, budget/cooldown passing)

    @property
    def runs(self) -> bool:
        return self.decision == "approved"


def decide(config: PolicyConfig, state: PolicyState, req: ActionRequest, now: float,
             *, approved_by_human: bool = False) -> Verdict:
    """Decide one action. ``approved_by_human``: an operator approved it (approve mode)."""
    snap = state.snapshot(config, now)
    if req.kind not in EXECUTABLE_KINDS:
        return Verdict("record_only", f"{req.kind} is not executed through Slurm", state=snap)
    if config.mode == "monitor":
        return Verdict("record_only", "monitor mode: proposals are recorded, never executed", state=snap)
    if config.mode == "approve" and not approved_by_human:
        return Verdict("proposed", "approve mode: waiting for an operator (recovery-logs approve ID)", state=snap)
    if req.kind == "drain_node":
        if state.breaker_tripped:
            return Verdict("denied", f"circuit breaker is tripped ({state.breaker_reason}); "
                           "run `recovery-logs slurm breaker-reset`", state=snap, retry=True)
        nodes = state.cluster_nodes or config.cluster_nodes
        drained = state.drained_in_window(now, config.breaker_window_s) | {req.target}
        if nodes <= 0:
            return Verdict("denied", "circuit breaker: cluster size unknown (set breaker.cluster_nodes)", state=snap,
                           retry=True)
        share = len(drained) / nodes
        if share > config.breaker_max_drain_fraction:
            return Verdict("denied", f"circuit breaker tripped: draining {req.target} would make {len(drained)} of "
                           f"{nodes} nodes drained within {config.breaker_window_s:g} s "
                           f"(> {config.breaker_max_drain_fraction:.0%})", trip_breaker=True, state=snap,
                           retry=True)
    if req.kind == "requeue_job" and req.job_requeues >= config.max_requeues_per_job:
        return Verdict("denied", f"restart ceiling: job {req.target.split('@')[0]} was already requeued "
                       f"{req.job_requeues} time(s) (jobs.max_requeues_per_job = {config.max_requeues_per_job})",
                       state=snap)
    used = state.used_last_hour(now)
    if used >= config.budget_per_hour:
        return Verdict("denied", f"action budget spent: {used}/{config.budget_per_hour} in the last hour "
                       f"(cluster {config.cluster})", state=snap, retry=True)
    per_inc = state.used_by_incident(req.incident_id)
    if req.incident_id is not None and per_inc >= config.budget_per_incident:
        return Verdict("denied", f"incident budget spent: {per_inc}/{config.budget_per_incident} actions "
                       f"for {req.incident_id}", state=snap)
    last = max((e.ts for e in state.executed if e.target == req.target), default=None)
    if last is not None and now - last < config.cooldown_s and not req.own_drain:
        return Verdict("denied", f"cooldown: {req.target} had an action {now - last:.0f} s ago "
                       f"(cooldown {config.cooldown_s:g} s)", state=snap, retry=True)
    if config.dry_run:
        return Verdict("dry_run", "dry-run: allowed by policy, not executed", state=snap)
    why = "approved by an operator" if approved_by_human else "autonomous mode: within budget"
    return Verdict("approved", why, state=snap)


def replay_policy(config: PolicyConfig, state: PolicyState, requests: Iterable[tuple[float, ActionRequest]]
                  ) -> tuple[PolicyState, list[Verdict]]:
    """Evaluate a sequence of requests, applying each approved one (used by tests and simulations)."""
    verdicts = []
    for now, req in requests:
        v = decide(config, state, req, now, approved_by_human=config.mode == "approve")
        if v.runs:
            state = state.after(req, now)
        elif v.trip_breaker:
            state = replace(state, breaker_tripped=True, breaker_reason=v.reason)
        elif v.decision == "dry_run":
            state = replace(state, dry_runs=state.dry_runs + 1)
        verdicts.append(v)
    return state, verdicts


__all__ = ["EXECUTABLE_KINDS", "MODES", "ActionRequest", "Executed", "PolicyConfig", "PolicyState", "Verdict",
           "decide", "load_policy", "policy_from_dict", "replay_policy"]
