"""Remediator: incidents with proposals -> policy decisions -> (write-ahead) execution -> audit.

State lives in the state dir's ``audit.db``: the append-only ``audit`` table, the ``actions``
table (one row per idempotency key: the queue and its outcome) and ``kv`` (breaker, counters).

Commit order for one action (each step its own transaction):

1. ``proposal`` + ``decision`` records and the ``actions`` row (status ``queued`` when the
   policy approved it; the budget is consumed here, once, whatever the retries).
2. claim (``queued`` -> ``running``, attempts + 1) together with the ``intent`` record.
3. run the executor (it observes first, so a repeated attempt never doubles the effect).
4. ``result`` record together with the new status (``done``/``noop``/``not_owner``/``skipped``/
   ``failed``), or back to ``queued`` with a backoff when Slurm is unreachable.

A crash between 2 and 4 leaves an intent without a result; ``reconcile()`` (run at start-up)
observes Slurm and closes it (``reconcile`` record), or puts the action back in the queue.

What counts against budget, cooldown and breaker: an action in flight (``queued``/``running``,
``executed_ts`` is its reservation) and a verified effect (``done``, ``executed_ts`` = when it was
seen applied). Any other end (``failed``, ``noop``, ``skipped``, ``not_owner``) clears
``executed_ts``: it counts nothing. A ``failed`` action whose effect was simply not visible yet is
tried again (``MAX_ATTEMPTS``); a denial whose reason can clear is re-evaluated on every
``process_queue`` until ``retry_until`` and then ``expired`` (audited).

Before an action is queued, its nodes must be nodes of this cluster (``sinfo``; ``ALL`` and
hostlist expressions are refused earlier by the executor's validation), and a drain whose culprit
rests only on a job's own output must name a node in that job's allocation
(``recovery_logs.trust``). Both are refused before anything runs and leave no trace in the
budget or breaker.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.audit import AuditLog
from recovery_logs.errors import AuditError, PolicyError, SlurmError, SlurmUnavailable, UnsafeTargetError
from recovery_logs.records import ActionProposal, Incident
from recovery_logs.remediation.actions import TERMINAL, ActionStore
from recovery_logs.remediation.executor import SlurmExecutor, validate_job_id
from recovery_logs.remediation.gate import PromotionGate, gate_verdict
from recovery_logs.remediation.grade_state import grades_from_state
from recovery_logs.remediation.lemon import LemonTracker
from recovery_logs.remediation.policy import (
    EXECUTABLE_KINDS,
    ActionRequest,
    Executed,
    PolicyConfig,
    PolicyState,
    Verdict,
    decide,
    load_policy,
    policy_from_dict,
)
from recovery_logs.schema import PROGRESS_CATEGORY
from recovery_logs.sources.slurm import CommandRunner, SlurmClient, expand_hostlist
from recovery_logs.timeutil import ns_to_iso
from recovery_logs.trust import allocation_check


def action_id(idem_key: str) -> str:
    return "act-" + hashlib.sha256(idem_key.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Decision:
    """What happened to one proposal (returned by handle/approve/reject)."""

    action_id: str
    incident_id: str | None
    kind: str
    target: str | None
    decision: str                # record_only | proposed | approved | rejected | denied | dry_run
    status: str                  # the action row's status after this call
    reason: str
    exclude: tuple[str, ...] = ()
    result: dict[str, Any] = field(default_factory=dict)

    def proposal(self) -> ActionProposal:
        return ActionProposal(self.kind, self.target, self.decision, self.reason, self.incident_id, self.exclude)

    def __rich__(self) -> str:
        ex = f" (exclude {','.join(self.exclude)})" if self.exclude else ""
        return f"{self.action_id} {self.kind} {self.target or '-'}{ex}: {self.decision}/{self.status} — {self.reason}"


GRADES_REFRESH_S = 300.0
MAX_ATTEMPTS = 3                 # a failed action whose effect was not visible is tried this often in all
MEMBERS_TTL_S = 300.0            # how long the cluster's node list (sinfo) is trusted
NODE_KINDS = ("drain_node", "resume_node")


class Remediator:
    def __init__(self, audit: AuditLog, config: PolicyConfig, executor: SlurmExecutor,
                 clock: Callable[[], float] = time.time,
                 allocation: Callable[[str], Iterable[str] | None] | None = None) -> None:
        self.audit = audit
        self.config = config
        self.executor = executor
        self.clock = clock
        # job id -> the nodes Slurm allocated to it (None: unknown); issue 14's accounting frame may feed it
        self.allocation = allocation or self._slurm_allocation
        self.store = ActionStore(audit)
        self._members: set[str] | None = None
        self._members_at = -1e18
        self.duplicates = 0
        self._nodes_retry_at = 0.0
        self._grades: pl.DataFrame | None = None
        self._grades_at = -1e18
        self._rule_of: dict[str, str] = {}

    @classmethod
    def from_options(cls, state_dir: Path, mode: str = "monitor", policy_file: Path | None = None,
                     runner: CommandRunner | None = None, clock: Callable[[], float] | None = None,
                     reconcile: bool = True, **policy_overrides: Any) -> Remediator:
        """Open (or create) the state dir's audit database, load the policy (``mode`` and
        ``policy_overrides`` such as ``cluster_nodes=4`` win over the file), record a ``config``
        record, and reconcile intents left without a result by an earlier crash."""
        clock = clock or time.time
        config = load_policy(policy_file, mode=mode, **policy_overrides)
        audit = AuditLog.open(Path(state_dir), clock=clock)
        rem = cls(audit, config, SlurmExecutor(runner), clock)
        audit.append("config", {"policy": config.to_dict(), "policy_file": str(policy_file) if policy_file else None})
        if reconcile and rem.store.rows("running"):
            rem.reconcile()
        return rem

    @classmethod
    def open_existing(cls, state_dir: Path, mode: str = "approve", runner: CommandRunner | None = None,
                      clock: Callable[[], float] | None = None, policy_file: Path | None = None) -> Remediator:
        """Reopen a state dir with the policy it last recorded (budget, breaker, cooldown as the
        watcher runs them), switching only the mode (``approve``/``reject`` from the CLI or console).
        ``policy_file`` replaces the recorded policy."""
        if policy_file is not None:
            return cls.from_options(state_dir, mode=mode, policy_file=policy_file, runner=runner, clock=clock)
        clock = clock or time.time
        audit = AuditLog.open(Path(state_dir), clock=clock)
        last = audit.records("config", newest_first=True, limit=1)
        config = policy_from_dict(last[0].payload.get("policy", {}) if last else {}, mode=mode)
        rem = cls(audit, config, SlurmExecutor(runner), clock)
        # a "session" record, not "config": the console keeps showing the watcher's policy
        audit.append("session", {"mode": mode, "policy_from_record": last[0].id if last else None})
        return rem   # no reconcile here: a running watcher may own the 'running' rows

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Record what the engine loaded (``kind`` "config" or "model": name, version, sha256...)."""
        self.audit.append(kind, payload)

    def close(self) -> None:
        self.audit.close()

    # ------------------------------------------------------------------ state
    def action(self, act_id: str) -> dict[str, Any] | None:
        return self.store.get(act_id)

    def actions(self, status: str | None = None) -> list[dict[str, Any]]:
        return self.store.rows(status)

    def _update(self, act_id: str, **cols: Any) -> None:
        self.store.update(act_id, **cols, updated_ts=self.clock())

    def breaker(self) -> dict[str, Any]:
        return self.audit.get_state("breaker", {"tripped": False, "reason": "", "since": None})

    def _cluster_nodes(self) -> int:
        if self.config.cluster_nodes:
            return self.config.cluster_nodes
        n = self.audit.get_state("cluster_nodes", 0)
        if not n:
            if self.clock() < self._nodes_retry_at:
                return 0
            try:
                n = len(SlurmClient(self.executor.runner, timeout_s=self.executor.timeout_s).nodes())
            except SlurmError:
                self._nodes_retry_at = self.clock() + 60.0   # unknown size: drains are denied meanwhile
                return 0
            self.audit.set_state("cluster_nodes", n)
        return int(n)

    def cluster_size(self) -> int:
        """Node count the drain breaker divides by: the policy's ``cluster_nodes``, else sinfo's
        (0 when neither is known: every drain is then denied)."""
        return self._cluster_nodes()

    def policy_state(self, incident_id: str | None = None) -> PolicyState:
        """Rebuilt from the actions table: what ran within the longest policy horizon, plus
        everything that ran for ``incident_id`` (the per-incident budget has no horizon)."""
        br = self.breaker()
        horizon = self.clock() - max(3600.0, self.config.breaker_window_s, self.config.cooldown_s)
        executed = tuple(Executed(r["executed_ts"], r["kind"], _policy_target(r["target"], r["job_attempt"]),
                                  r["incident_id"])
                         for r in self.store.executed(horizon, incident_id))
        nodes = self._cluster_nodes() if self.config.mode != "monitor" else self.config.cluster_nodes
        return PolicyState(executed, bool(br.get("tripped")), br.get("reason", ""), nodes,
                           int(self.audit.get_state("counter:dry_run", 0)))

    def budget(self) -> dict[str, Any]:
        now = self.clock()
        st = self.policy_state()
        return {"used_hour": st.used_last_hour(now), "per_hour": self.config.budget_per_hour,
                "per_incident": self.config.budget_per_incident, "dry_runs": st.dry_runs,
                "drained_in_window": sorted(st.drained_in_window(now, self.config.breaker_window_s)),
                "cluster_nodes": st.cluster_nodes, "max_drain_fraction": self.config.breaker_max_drain_fraction}

    # ------------------------------------------------------------------ intake
    def handle(self, incidents: Sequence[Incident]) -> list[Decision]:
        """Record, decide and (within policy) execute every new proposal; then run the queue."""
        out: list[Decision] = []
        if self.config.mode != "monitor" and any(p.kind == "drain_node" for i in incidents for p in i.actions):
            self._cluster_nodes()          # ask sinfo once, outside the write transactions below
        for inc in incidents:
            if self.audit.last_detection_status(inc.id) != inc.status:   # first sight, or e.g. open -> cleared
                self.audit.append("detection", inc.to_dict(), incident_id=inc.id)
            if inc.root_rule:
                self._rule_of[inc.id] = inc.root_rule
            for p in self._job_rules(inc):
                if p.kind in ("requeue_job", "cancel_job") and p.attempt and self.store.attempt_acted(p.kind, p.attempt):
                    self.duplicates += 1      # one requeue/cancel per job attempt, whatever incident asks again
                    continue
                d = self._consider(p, p.incident_id or inc.id, inc.cause, inc=inc)
                if d is not None:
                    out.append(d)
        self.process_queue()
        self._update_lemons(incidents)
        return [self._refresh(d) for d in out]

    def _update_lemons(self, incidents: Sequence[Incident]) -> None:
        """Remember failures per node across jobs (lemon-node scores live beside the audit DB)."""

        named = [i for i in incidents if i.node]
        if named:
            LemonTracker(Path(self.audit.path).parent).update(named)

    def _refresh(self, d: Decision) -> Decision:
        row = self.action(d.action_id)
        if row is None:
            return d
        res = json.loads(row["result"]) if row["result"] else {}
        return Decision(d.action_id, d.incident_id, d.kind, d.target, d.decision, row["status"], d.reason,
                        d.exclude, res)

    def resume(self, node: str, incident_id: str | None = None, by: str = "operator") -> Decision:
        """Undo one of our drains (a tripped breaker never blocks this; budget and mode still apply).
        A node drained by someone else comes back ``not_owner`` and is left alone."""
        p = ActionProposal("resume_node", node, "record_only", f"resume requested by {by}", incident_id)
        d = self._consider(p, incident_id or "manual", f"resume by {by}",
                           key=f"resume_node:{node}:{incident_id or 'manual'}:{self.clock():.3f}")
        self.process_queue()
        assert d is not None   # the key carries the clock: never a duplicate
        return self._refresh(d)

    def _consider(self, p: ActionProposal, incident_id: str, cause: str, key: str | None = None,
                  inc: Incident | None = None) -> Decision | None:
        key = key or f"{p.kind}:{p.target}:{incident_id}"
        act = action_id(key)
        existing = self.action(act)
        if existing is not None and not (existing["status"] == "record_only" and self.config.mode != "monitor"
                                         and p.kind in EXECUTABLE_KINDS):
            self.duplicates += 1
            return None
        now = self.clock()
        base = {"action_id": act, "kind": p.kind, "target": p.target, "exclude": list(p.exclude),
                "reason": p.reason, "idempotency_key": key}
        with self.audit.transaction():
            self.audit.append("proposal", base, incident_id=incident_id, action_id=act)
            try:
                if p.kind in EXECUTABLE_KINDS:
                    if p.target is None:
                        raise UnsafeTargetError(f"executor: {p.kind} without a target")
                    self.executor.validate(p.kind, p.target, p.exclude, incident_id, cause)
            except UnsafeTargetError as exc:
                self.audit.append("unsafe_target", {**base, "message": str(exc)}, incident_id=incident_id,
                                  action_id=act)
                return self._decide(existing, act, key, p, incident_id, cause, "denied", "denied",
                                    f"unsafe target rejected: {exc.message}", {}, now)
            state = self.policy_state(incident_id)
            v = decide(self.config, state, ActionRequest(p.kind, _policy_target(p.target, p.attempt), incident_id,
                                                         own_drain=p.kind == "resume_node",
                                                         job_requeues=self._requeues_of(p)), now)
            v = self._gate(v, incident_id, now)
            if v.decision == "approved":
                v = self._refuse(v, p.kind, p.target or "", p.exclude, inc, act, incident_id)
            if v.trip_breaker:
                self._trip(v.reason)
            status = {"record_only": "record_only", "proposed": "awaiting_approval", "dry_run": "dry_run",
                      "denied": "denied", "approved": "queued"}[v.decision]
            if v.decision == "dry_run":
                self.audit.set_state("counter:dry_run", int(self.audit.get_state("counter:dry_run", 0)) + 1)
            return self._decide(existing, act, key, p, incident_id, cause, v.decision, status, v.reason,
                                v.state, now, retry=v.retry, trust=self._trust_of(inc))

    # ------------------------------------------------------------------ refusals before anything runs
    @staticmethod
    def _trust_of(inc: Incident | None) -> dict[str, Any] | None:
        if inc is None or inc.authority == "node":
            return None
        return {"authority": inc.authority, "job_id": inc.job_id}

    def _cluster_members(self, want: Iterable[str]) -> set[str] | None:
        """The cluster's node names (sinfo), refreshed every MEMBERS_TTL_S and at most every 30 s
        when a name is missing; None when Slurm cannot say."""
        now = self.clock()
        stale = now - self._members_at > MEMBERS_TTL_S
        missing = self._members is not None and not set(want) <= self._members and now - self._members_at > 30.0
        if self._members is None or stale or missing:
            try:
                self._members = {n.name for n in SlurmClient(self.executor.runner,
                                                             timeout_s=self.executor.timeout_s).nodes()}
                self._members_at = now
            except (SlurmError, ValueError, KeyError, TypeError):
                return self._members if not stale else None
        return self._members

    def _slurm_allocation(self, job_id: str) -> list[str] | None:
        """The nodes Slurm allocated to ``job_id`` (scontrol show job, else accounting); None if unknown."""
        try:
            job_id = validate_job_id(job_id)
        except UnsafeTargetError:
            return None
        client = self.executor.client
        try:
            info = client.show_job(job_id)
        except SlurmError:
            info = None
        nodes = expand_hostlist(info.get("NodeList")) if info else []
        if nodes:
            return nodes
        try:
            recs = client.jobs([job_id])
        except SlurmError:
            return None
        found = sorted({n for r in recs for n in r.nodes})
        return found or None

    def _refuse(self, v: Verdict, kind: str, target: str, exclude: Sequence[str], inc: Incident | None,
                act: str, incident_id: str | None, trust: dict[str, Any] | None = None) -> Verdict:
        """An approved action whose nodes are not this cluster's, or a drain that rests only on a
        job's output about a node outside the job's allocation, becomes a denial before it is queued."""
        nodes = ([target] if kind in NODE_KINDS else []) + list(exclude)
        if nodes:
            members = self._cluster_members(nodes)
            if members is None:
                return Verdict("denied", "cannot check the target against the cluster's nodes (sinfo failed)",
                               state=v.state, retry=True)
            unknown = sorted(set(nodes) - members)
            if unknown:
                msg = f"not a node of this cluster: {', '.join(unknown)}"
                self.audit.append("unsafe_target", {"action_id": act, "kind": kind, "target": target,
                                                    "message": msg}, incident_id=incident_id, action_id=act)
                return Verdict("denied", f"unsafe target rejected: {msg}", state=v.state)
        trust = trust if trust is not None else self._trust_of(inc)
        if kind == "drain_node" and trust:
            auth = trust.get("authority")
            if auth not in ("job", "job-line"):
                why = f"the evidence against {target} is a claim from another source; corroborate before draining"
                ok: bool | None = False
            else:
                ok, why = allocation_check(target, trust.get("job_id"), self.allocation)
                if ok is None and auth == "job-line":   # the host came only from the line: Slurm must confirm
                    ok, why = False, f"{why}, and the node was named only by the job's output"
            if ok is False:
                self.audit.append("untrusted", {"action_id": act, "kind": kind, "target": target, "message": why,
                                                **trust}, incident_id=incident_id, action_id=act)
                return Verdict("denied", f"untrusted evidence: {why}", state=v.state)
        return v

    # ------------------------------------------------------------------ jobs: restart ceiling, stop rules
    def _requeues_of(self, p: ActionProposal) -> int:
        """Requeues of this job that already ran (or are running): its chain of attempts when known."""
        if p.kind != "requeue_job" or not p.target:
            return 0
        return self.store.requeues(p.target, p.chain)

    def _job_rules(self, inc: Incident) -> list[ActionProposal]:
        """The job's own say and its history, before the policy: an attempt that exited with a
        do-not-requeue code is not requeued; a job whose attempts keep failing the same way on
        different nodes is cancelled instead of requeued again (and its node is not drained: the
        fault followed the job, not the node)."""
        attempts = {a.get("job_id"): a for a in inc.attempts}
        out: list[ActionProposal] = []
        stop = self._same_error_history(inc)
        for p in inc.actions:
            att = attempts.get(p.target or "") if p.kind in ("requeue_job", "cancel_job") else None
            code = att.get("exit_code") if att else None
            if p.kind == "requeue_job" and code is not None and code in self.config.no_requeue_exit_codes:
                out.append(ActionProposal("none", p.target, "record_only",
                                          f"job {p.target} exited {code}: it declared do-not-requeue "
                                          f"(jobs.no_requeue_exit_codes); not requeued", p.incident_id,
                                          attempt=p.attempt, chain=p.chain))
            elif p.kind == "requeue_job" and p.chain and p.chain in stop:
                out.append(ActionProposal("cancel_job", p.target, p.decision, stop[p.chain], p.incident_id,
                                          attempt=p.attempt, chain=p.chain))
            elif p.kind == "drain_node" and stop:
                out.append(ActionProposal("investigate", p.target, "record_only",
                                          f"drain withheld: {next(iter(stop.values()))}", p.incident_id))
            else:
                out.append(p)
        return out

    def _same_error_history(self, inc: Incident) -> dict[str, str]:
        """chain -> reason, for the chains of ``inc`` whose last ``stop_same_error_attempts``
        attempts (this one included) failed with the same root rule on pairwise different nodes."""
        need = self.config.stop_same_error_attempts
        chains: dict[str, str | None] = {str(a["chain"]): a.get("attempt") for a in inc.attempts if a.get("chain")}
        node = inc.node
        if not chains or not inc.root_rule or node is None:
            return {}
        seen: dict[str, dict[str, tuple[str | None, str | None]]] = {c: {} for c in chains}
        for rec in self.audit.records("detection"):
            d = rec.payload
            for a in d.get("attempts") or ():
                c = a.get("chain")
                if c in seen and a.get("attempt") != chains[c]:
                    seen[c][a.get("attempt")] = (d.get("root_rule"), d.get("node"))
        out = {}
        for c, by_attempt in seen.items():
            prior = [v for _, v in sorted(by_attempt.items(), key=lambda kv: int(str(kv[0]).rsplit(":", 1)[-1])
                                          if str(kv[0]).rsplit(":", 1)[-1].isdigit() else -1)]
            last = prior[-(need - 1):] if need > 1 else []
            nodes = [str(n) for _, n in last] + [node]
            if len(last) == need - 1 and all(r == inc.root_rule for r, _ in last) and len(set(nodes)) == len(nodes):
                out[c] = (f"stop, not restart: {need} attempts of job {c.split(':')[1]} failed with the same error "
                          f"({inc.root_rule}) on different nodes ({', '.join(nodes)}): the fault follows the job")
        return out

    # ------------------------------------------------------------------ time to resume
    def observe_progress(self, watcher: Any) -> int:
        """Watcher observer: for each requeue Slurm confirmed, record (``progress``) the first
        training-progress line of that job after its next attempt started (accounting), or after
        the requeue when accounting has not seen the start yet. Returns the records written."""
        rows = self.store.verified_requeues()
        if not rows:
            return 0
        noted = {r.action_id for r in self.audit.records("progress")}
        todo = [r for r in rows if r["id"] not in noted]
        if not todo:
            return 0
        eng = watcher.engine
        prog = eng.findings.filter(pl.col("category") == PROGRESS_CATEGORY)
        wrote = 0
        for r in todo:
            after = int((r["executed_ts"] or 0) * 1e9)
            resumed = None
            allocs = eng.allocations
            if allocs is not None:
                nxt = allocs.filter((pl.col("job_id") == r["target"]) & pl.col("start").is_not_null()
                                    & (pl.col("start").dt.epoch("ns") > after - 120 * 10**9))
                # not filtered by chain: a chain computed from a sacct window that misses earlier runs
                # differs, and the start after the requeue already bounds it (a reused id starts later)
                if r["job_attempt"]:
                    rc = int(str(r["job_attempt"]).rsplit(":", 1)[-1] or 0)
                    nxt = nxt.filter(pl.col("restart_count") > rc)
                resumed = nxt.select(pl.col("start").min().dt.epoch("ns")).item()
                if resumed is None:
                    continue          # the new attempt has not started (as far as accounting knows)
            else:                     # no accounting: after Slurm confirmed the requeue
                res = [x for x in self.audit.records("result", incident_id=r["incident_id"])
                       if x.action_id == r["id"] and x.payload.get("outcome") in ("done", "noop")]
                after = res[0].ts_ns if res else after
            bound = int(resumed) if resumed is not None else after
            hit = prog.filter((pl.col("job_id") == r["target"]) & (pl.col("time").dt.epoch("ns") > bound)) \
                .sort(["time", "seq"]).head(1)
            if hit.height == 0:
                continue
            row = hit.row(0, named=True)
            t = int(hit.select(pl.col("time").dt.epoch("ns")).item())
            self.audit.append("progress", {"action_id": r["id"], "job_id": r["target"], "time": ns_to_iso(t),
                                           "step": row.get("step"), "message": (row.get("message") or "")[:300],
                                           "after": ns_to_iso(bound), "after_is": "resumed_at" if resumed is not None
                                           else "executed_at"}, incident_id=r["incident_id"], action_id=r["id"])
            wrote += 1
        return wrote

    def _gate(self, v: Verdict, incident_id: str, now: float) -> Verdict:
        """Promotion gate: an autonomous action of a rule whose graded precision has not earned trust
        waits for an operator instead (see recovery_logs.remediation.gate)."""
        if self.config.promotion_min_precision is None or v.decision != "approved":
            return v
        if now - self._grades_at > GRADES_REFRESH_S:
            self._grades = grades_from_state(Path(self.audit.path).parent)
            self._grades_at = now
        gate = PromotionGate.from_policy(self.config)
        rule = self._rule_of.get(incident_id, f"incident:{incident_id}")
        return gate_verdict(v, rule, gate, self._grades)

    def _decide(self, existing: dict[str, Any] | None, act: str, key: str, p: ActionProposal, incident_id: str,
                cause: str, decision: str, status: str, reason: str, state: dict[str, Any], now: float,
                retry: bool = False, trust: dict[str, Any] | None = None) -> Decision:
        executed_ts = now if status == "queued" else None       # a reservation until the effect is verified
        retry_until = now + self.config.retry_s if status == "denied" and retry else None
        if existing is None:
            self.store.insert(act, key, p.kind, p.target, incident_id, p.exclude, cause, status, decision, reason,
                              now, executed_ts, retry_until, trust, p.attempt, p.chain)
        else:
            self._update(act, status=status, decision=decision, reason=reason, executed_ts=executed_ts,
                         retry_until=retry_until)
        self.audit.append("decision", {"action_id": act, "kind": p.kind, "target": p.target, "decision": decision,
                                       "status": status, "reason": reason, "policy_state": state},
                          incident_id=incident_id, action_id=act)
        return Decision(act, incident_id, p.kind, p.target, decision, status, reason, tuple(p.exclude))

    def _trip(self, reason: str) -> None:
        self.audit.set_state("breaker", {"tripped": True, "reason": reason, "since": self.clock()})
        self.audit.append("breaker", {"event": "tripped", "reason": reason})

    def breaker_reset(self, by: str = "operator") -> None:
        """Close the breaker. A corrupt breaker state (not JSON, wrong type) is reset too, and the
        ``reset`` record keeps what was there (the documented, audited way out of it)."""
        with self.audit.transaction():
            try:
                was = self.breaker()
            except AuditError as exc:
                was = {"corrupt": self.audit.raw_state("breaker"), "error": exc.message}
            self.audit.set_state("breaker", {"tripped": False, "reason": "", "since": None})
            self.audit.append("breaker", {"event": "reset", "by": by, "was": was})

    # ------------------------------------------------------------------ approval
    def approvals(self, act_id: str) -> list[str]:
        """Names that approved ``act_id`` so far (audit ``approval`` records, in order)."""
        return [r.payload.get("by", "") for r in self.audit.records("approval")
                if r.action_id == act_id and r.payload.get("counts", True)]

    def approvals_needed(self, kind: str) -> int:
        return self.config.approvals_required if kind == "drain_node" else 1

    def expire_stale(self) -> list[str]:
        """Mark proposals older than the policy's ``proposal_ttl_s`` as ``expired`` (audited)."""
        ttl = self.config.proposal_ttl_s
        if not ttl:
            return []
        now = self.clock()
        out = []
        for row in [r for r in self.store.rows("awaiting_approval") if r["created_ts"] < now - ttl]:
            with self.audit.transaction():
                reason = f"proposal expired: nobody decided within {ttl:g} s"
                self._update(row["id"], status="expired", decision="expired", reason=reason)
                self.audit.append("decision", {"action_id": row["id"], "kind": row["kind"], "target": row["target"],
                                               "decision": "expired", "status": "expired", "reason": reason,
                                               "policy_state": {}}, incident_id=row["incident_id"],
                                  action_id=row["id"])
            out.append(row["id"])
        return out

    def _still_needed(self, row: dict[str, Any]) -> str | None:
        """Slurm at approve time: why the action no longer makes sense (node already down or
        drained, job no longer running), or None. Slurm unreachable raises SlurmUnavailable."""
        client = self.executor.client
        if row["kind"] == "drain_node":
            n = client.show_node(row["target"])
            if n.drained or n.state.startswith("down"):
                flags = "+".join((n.state.upper(), *n.flags))
                return f"node {row['target']} is no longer up ({flags}{': ' + n.reason if n.reason else ''})"
        elif row["kind"] in ("requeue_job", "cancel_job"):
            info = client.show_job(row["target"])
            state = (info or {}).get("JobState", "")
            if info is None or state not in ("RUNNING", "PENDING", "CONFIGURING", "SUSPENDED"):
                return f"job {row['target']} is no longer running ({state or 'unknown to slurmctld'})"
        return None

    def approve(self, act_id: str, by: str = "operator") -> Decision:
        """One operator's approval. Refused (PolicyError) when nothing awaits approval or ``by``
        already approved it. A drain under ``approvals_required = 2`` waits for a second, different
        operator. The approval that completes the quorum re-checks the proposal's age (TTL), Slurm
        (node still up, job still running) and the policy (breaker, budget, cooldown); the
        decision says why when it refuses."""
        self.expire_stale()
        row = self.action(act_id)
        if row is None or row["status"] != "awaiting_approval":
            st = row["status"] if row else "unknown"
            why = f" ({row['reason']})" if row and row["status"] == "expired" else ""
            raise PolicyError(f"approve: no action {act_id!r} is awaiting approval{why}", status=st)
        before = self.approvals(act_id)
        if by in before:
            raise PolicyError(f"approve: {by} already approved {act_id}; the next approval must come from "
                              "another operator", by=by, approvals=len(before),
                              required=self.approvals_needed(row["kind"]))
        if row["kind"] == "drain_node" and self.config.mode != "monitor" and not self._cluster_nodes():
            raise PolicyError("approve: the cluster size is unknown, so the drain breaker cannot be checked: set "
                              "breaker.cluster_nodes in the policy or make `sinfo` reachable; the proposal stays "
                              "queued", action_id=act_id)
        need = self.approvals_needed(row["kind"])
        exclude = tuple(json.loads(row["exclude"]))
        if len(before) + 1 < need:
            reason = (f"approval {len(before) + 1} of {need} ({', '.join([*before, by])}); waiting for another "
                      "operator")
            with self.audit.transaction():
                self.audit.append("approval", {"action_id": act_id, "by": by, "of": need},
                                  incident_id=row["incident_id"], action_id=act_id)
                self._update(act_id, reason=reason)
            return Decision(act_id, row["incident_id"], row["kind"], row["target"], "proposed", "awaiting_approval",
                            reason, exclude)
        now = self.clock()
        v = decide(self.config, self.policy_state(row["incident_id"]),
                     ActionRequest(row["kind"], row["target"] or "", row["incident_id"],
                                   own_drain=row["kind"] == "resume_node"), now, approved_by_human=True)
        if v.decision == "denied":
            v = replace(v, reason=f"{v.reason} (re-checked at approval)")
        elif v.decision == "approved":   # the policy allows it: a node of this cluster? Slurm still needs it?
            v = self._refuse(v, row["kind"], row["target"] or "", json.loads(row["exclude"]), None, act_id,
                             row["incident_id"], trust=json.loads(row["trust"]) if row["trust"] else None)
            if v.decision == "approved":
                gone = self._still_needed(row)
                if gone is not None:
                    v = Verdict("denied", f"{gone} (re-checked at approval)", state=v.state)
        with self.audit.transaction():
            self.audit.append("approval", {"action_id": act_id, "by": by, "of": need},
                              incident_id=row["incident_id"], action_id=act_id)
            if v.trip_breaker:
                self._trip(v.reason)
            status = {"dry_run": "dry_run", "denied": "denied", "approved": "queued",
                      "record_only": "record_only", "proposed": "awaiting_approval"}[v.decision]
            self._update(act_id, status=status, decision=v.decision, reason=v.reason,
                         executed_ts=now if status == "queued" else None,
                         retry_until=now + self.config.retry_s if status == "denied" and v.retry else None)
            self.audit.append("decision", {"action_id": act_id, "kind": row["kind"], "target": row["target"],
                                           "decision": v.decision, "status": status, "reason": v.reason,
                                           "approved_by": [*before, by], "policy_state": v.state},
                              incident_id=row["incident_id"], action_id=act_id)
        self.process_queue()
        return self._refresh(Decision(act_id, row["incident_id"], row["kind"], row["target"], v.decision, status,
                                      v.reason, exclude))

    def reject(self, act_id: str, by: str = "operator", reason: str = "") -> Decision:
        row = self.action(act_id)
        if row is None or row["status"] != "awaiting_approval":
            raise PolicyError(f"reject: no action {act_id!r} is awaiting approval",
                              status=row["status"] if row else "unknown")
        with self.audit.transaction():
            self.audit.append("rejection", {"action_id": act_id, "by": by, "reason": reason},
                              incident_id=row["incident_id"], action_id=act_id)
            self._update(act_id, status="rejected", decision="rejected", reason=reason or f"rejected by {by}")
        return Decision(act_id, row["incident_id"], row["kind"], row["target"], "rejected", "rejected",
                        reason or f"rejected by {by}", tuple(json.loads(row["exclude"])))

    # ------------------------------------------------------------------ execution
    def process_queue(self, *, ignore_backoff: bool = False) -> list[dict[str, Any]]:
        """Run every queued action whose backoff has passed (never in monitor mode, which changes
        nothing on the cluster: queued actions wait for a mode that may act). Returns the rows it ran."""
        if self.config.mode == "monitor":
            return []
        self.revisit_denied()
        now = self.clock()
        ran = []
        for row in self.store.rows("queued"):
            if not ignore_backoff and row["next_attempt_ts"] > now:
                continue
            if self._run(row) and (done := self.action(row["id"])) is not None:
                ran.append(done)
        return ran

    def revisit_denied(self) -> list[dict[str, Any] | None]:
        """Re-evaluate denials whose reason may have cleared (breaker reset, budget or cooldown
        passed): queue them now, or expire them (``expired`` record) once ``retry_until`` passed.
        Nothing is recorded while the reason still holds. Returns the rows that changed."""
        if self.config.mode == "monitor":
            return []
        changed = []
        for row in self.store.retryable():
            now = self.clock()
            act = row["id"]
            if now >= row["retry_until"]:
                with self.audit.transaction():
                    self._update(act, status="expired", retry_until=None)
                    self.audit.append("expired", {"action_id": act, "kind": row["kind"], "target": row["target"],
                                                  "message": f"denied until it expired: {row['reason']}",
                                                  "retry_s": self.config.retry_s},
                                      incident_id=row["incident_id"], action_id=act)
                changed.append(self.action(act))
                continue
            human = self.config.mode == "approve" and bool(self.audit.records("approval", action_id=act, limit=1))
            if self.config.mode == "approve" and not human:
                continue
            with self.audit.transaction():
                v = decide(self.config, self.policy_state(row["incident_id"]),
                             ActionRequest(row["kind"], row["target"] or "", row["incident_id"],
                                           own_drain=row["kind"] == "resume_node"), now, approved_by_human=human)
                if not human:
                    v = self._gate(v, row["incident_id"] or "", now)
                if v.decision == "approved":
                    v = self._refuse(v, row["kind"], row["target"] or "", json.loads(row["exclude"]), None, act,
                                     row["incident_id"], trust=json.loads(row["trust"]) if row["trust"] else None)
                if v.trip_breaker and not self.breaker().get("tripped"):
                    self._trip(v.reason)
                if v.decision != "approved":
                    if not v.retry:      # the reason can no longer clear
                        self._update(act, retry_until=None, reason=v.reason)
                        self.audit.append("decision", {"action_id": act, "kind": row["kind"], "target": row["target"],
                                                       "decision": "denied", "status": "denied", "reason": v.reason,
                                                       "policy_state": v.state},
                                          incident_id=row["incident_id"], action_id=act)
                        changed.append(self.action(act))
                    continue
                why = f"retried, the denial cleared ({v.reason}); was: {row['reason']}"
                self._update(act, status="queued", decision="approved", reason=why, executed_ts=now,
                             retry_until=None, next_attempt_ts=0)
                self.audit.append("decision", {"action_id": act, "kind": row["kind"], "target": row["target"],
                                               "decision": "approved", "status": "queued", "reason": why,
                                               "policy_state": v.state}, incident_id=row["incident_id"],
                                  action_id=act)
            changed.append(self.action(act))
        return changed

    def _run(self, row: dict[str, Any]) -> bool:
        act = row["id"]
        exclude = tuple(json.loads(row["exclude"]))
        baseline = row["baseline"]
        try:
            if row["kind"] == "requeue_job" and baseline is None:
                baseline = self.executor.job_baseline(row["target"])
        except SlurmUnavailable as exc:
            self._backoff(row, exc, attempt=row["attempts"])
            return False
        except SlurmError as exc:
            with self.audit.transaction():
                self._finish(row, row["attempts"], "failed", str(exc), {})
            return True
        attempt = row["attempts"] + 1
        with self.audit.transaction():
            if not self.store.claim(act, attempt, baseline, self.clock()):
                return False          # another process took it
            self.audit.append("intent", {"action_id": act, "attempt": attempt, "kind": row["kind"],
                                         "target": row["target"], "exclude": list(exclude), "baseline": baseline},
                              incident_id=row["incident_id"], action_id=act)
        try:
            out = self.executor.execute(row["kind"], row["target"], incident_id=row["incident_id"] or "manual",
                                        cause=row["cause"], exclude=exclude, baseline=baseline)
        except SlurmUnavailable as exc:
            self._backoff(row, exc, attempt=attempt, running=True)
            return False
        except (SlurmError, UnsafeTargetError) as exc:
            with self.audit.transaction():
                self._finish(row, attempt, "failed", str(exc), {})
            return True
        if out.status == "failed" and out.retry and attempt < MAX_ATTEMPTS \
                and self.clock() < row["created_ts"] + self.config.retry_s:
            delay = min(300.0, 5.0 * 2 ** attempt)
            with self.audit.transaction():   # not visible yet: try again (the reservation stays)
                self._update(act, status="queued", next_attempt_ts=self.clock() + delay)
                self.audit.append("result", {"action_id": act, "attempt": attempt, "kind": row["kind"],
                                             "target": row["target"], "outcome": "retry", "message": out.message,
                                             "observed": out.observed, "retry_in_s": delay},
                                  incident_id=row["incident_id"], action_id=act)
            return True
        with self.audit.transaction():
            self._finish(row, attempt, out.status, out.message, out.observed)
        return True

    def _finish(self, row: dict[str, Any], attempt: int, status: str, message: str, observed: dict[str, Any],
                kind: str = "result") -> None:
        res = {"outcome": status, "message": message, "observed": observed}
        # only a verified effect keeps counting against budget, cooldown and breaker
        self._update(row["id"], status=status, result=json.dumps(res),
                     executed_ts=self.clock() if status == "done" else None)
        self.audit.append(kind, {"action_id": row["id"], "attempt": attempt, "kind": row["kind"],
                                 "target": row["target"], "outcome": status, "message": message,
                                 "observed": observed}, incident_id=row["incident_id"], action_id=row["id"])

    def _backoff(self, row: dict[str, Any], exc: SlurmUnavailable, attempt: int, running: bool = False) -> None:
        delay = min(300.0, 2.0 ** min(attempt, 8))
        with self.audit.transaction():
            self._update(row["id"], status="queued", next_attempt_ts=self.clock() + delay)
            if running:   # close this attempt's intent: nothing was confirmed, it will run again
                self.audit.append("result", {"action_id": row["id"], "attempt": attempt, "kind": row["kind"],
                                             "target": row["target"], "outcome": "retry", "message": str(exc),
                                             "retry_in_s": delay}, incident_id=row["incident_id"], action_id=row["id"])

    def reconcile(self) -> list[dict[str, Any]]:
        """Close intents that have no result (a crash mid-action) by observing Slurm."""
        out = []
        for rec in self.audit.open_intents():
            row = self.action(rec.action_id or "")
            if row is None or row["status"] != "running":
                continue
            attempt = int(rec.payload.get("attempt") or 0)
            try:
                seen = self._observe(row)
            except SlurmError as exc:
                seen = None
                note = f"could not observe: {exc}"
            else:
                note = "effect observed in Slurm" if seen else "effect not visible in Slurm; queued again"
            with self.audit.transaction():
                if seen:
                    self._finish(row, attempt, "done", note, seen, kind="reconcile")
                else:
                    self._update(row["id"], status="queued", next_attempt_ts=0)
                    self.audit.append("reconcile", {"action_id": row["id"], "attempt": attempt, "outcome": "requeued",
                                                    "message": note}, incident_id=row["incident_id"],
                                      action_id=row["id"])
            if (after := self.action(row["id"])) is not None:
                out.append(after)
        return out

    def _observe(self, row: dict[str, Any]) -> dict[str, Any] | None:
        ex, client = self.executor, self.executor.client
        client.ping()
        if row["kind"] == "drain_node":
            n = client.show_node(row["target"])
            ok = n.drained and n.reason.startswith(f"recovery-logs:{row['incident_id']}")
            return {"state": n.state, "flags": list(n.flags), "reason": n.reason} if ok else None
        if row["kind"] == "resume_node":
            n = client.show_node(row["target"])
            return {"state": n.state, "flags": list(n.flags)} if not n.drained else None
        info = client.show_job(row["target"])
        if info is None:
            return None
        seen = ex._job_seen(info)
        if row["kind"] == "cancel_job":
            return seen if seen["state"] == "CANCELLED" else None
        held = info.get("Reason") == "job_requeued_in_held_state"
        excl = set(json.loads(row["exclude"])) <= set(seen["exc_nodes"])
        restarted = row["baseline"] is not None and seen["restarts"] > row["baseline"]
        return seen if restarted and excl and not held else None


def _policy_target(target: str | None, attempt: str | None) -> str:
    """What cooldown counts per: a node, or a job *attempt* (``12@testcluster:12:1796122875:0``)."""
    return f"{target or ''}@{attempt}" if attempt else (target or "")


__all__ = ["Decision", "Remediator", "TERMINAL", "action_id"]
