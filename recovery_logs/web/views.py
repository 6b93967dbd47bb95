"""The web console's read model: the same domain objects the terminal console renders
(``console.Snapshot``, ``IncidentRow``, ``PendingView``, ``AuditRecord``), plus the incident
detail, approvals with their approvers, policy and promotion state, ledger and audit pages.

Every function reads the state dir's ``audit.db``; none writes to it. Pure data: escaping is
the templates' job (Jinja2 autoescape) on top of ``textsafe.clean``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from recovery_logs.analysis.ledger import action_times, incidents_from_audit, ledger
from recovery_logs.analysis.resume import resume_records
from recovery_logs.analysis.selfgrade import grading_from_state
from recovery_logs.anchors import ENV_KEY, anchor_path, load_key
from recovery_logs.audit import DB_NAME, AuditLog, AuditRecord, verify_db
from recovery_logs.errors import AuditChainBroken, AuditError, RecoveryLogsError, SlurmError
from recovery_logs.frames import logsql_for_line
from recovery_logs.remediation.gate import PromotionGate
from recovery_logs.report.console import Snapshot
from recovery_logs.sources.accounting import sacct_jobs
from recovery_logs.timeutil import iso_to_ns, ns_to_iso

__all__ = ["ApprovalView", "approvals", "audit_page", "incident_detail", "ledger_view", "open_audit",
           "policy_view", "timeline_svg", "verify_chain"]


def open_audit(state_dir: Path) -> AuditLog:
    path = Path(state_dir) / DB_NAME
    if not path.exists():
        raise AuditError("web: no audit database in the state dir", path=str(path))
    return AuditLog(path)


def _has_actions(log: AuditLog) -> bool:
    return bool(log.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'actions'").fetchone())


_ACOLS = ("id", "kind", "target", "incident_id", "exclude", "cause", "status", "decision", "reason", "created_ts",
          "updated_ts", "result")


def _actions(log: AuditLog, where: str = "1", args: tuple = ()) -> list[dict[str, Any]]:
    if not _has_actions(log):
        return []
    rows = log.conn.execute(f"SELECT {', '.join(_ACOLS)} FROM actions WHERE {where} ORDER BY created_ts, rowid", args)
    out = []
    for r in rows:
        d = dict(zip(_ACOLS, r, strict=True))
        d["exclude"] = json.loads(d["exclude"] or "[]")
        d["result"] = json.loads(d["result"]) if d["result"] else {}
        d["created"] = ns_to_iso(int(d["created_ts"] * 1e9))
        out.append(d)
    return out


def _approvers(log: AuditLog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in log.records("approval"):
        out.setdefault(r.action_id or "", []).append(str(r.payload.get("by", "")))
    return out


@dataclass(frozen=True)
class ApprovalView:
    action_id: str
    kind: str
    target: str | None
    exclude: tuple[str, ...]
    incident_id: str | None
    cause: str
    approved_by: tuple[str, ...]
    needed: int
    created: str | None
    expires_in_s: float | None      # None: no TTL
    reason: str


def approvals(state_dir: Path, now: float | None = None) -> list[ApprovalView]:
    """Proposals awaiting approval, oldest first, with who approved so far and how many are needed."""
    now = time.time() if now is None else now
    log = open_audit(state_dir)
    try:
        conf = log.records("config", newest_first=True, limit=1)
        pol = conf[0].payload.get("policy", {}) if conf else {}
        need_drain = int(pol.get("approvals_required", 1) or 1)
        ttl = float(pol.get("proposal_ttl_s", 0) or 0)
        by = _approvers(log)
        out = []
        for a in _actions(log, "status = 'awaiting_approval'"):
            out.append(ApprovalView(a["id"], a["kind"], a["target"], tuple(a["exclude"]), a["incident_id"], a["cause"],
                                    tuple(by.get(a["id"], ())), need_drain if a["kind"] == "drain_node" else 1,
                                    a["created"], (a["created_ts"] + ttl - now) if ttl else None, a["reason"]))
        return out
    finally:
        log.close()


def incident_detail(state_dir: Path, incident_id: str, victorialogs: str | None = None) -> dict[str, Any] | None:
    """The latest detection of one incident (evidence with file:line and its LogsQL query,
    candidates), its actions with their approvers, and its audit history (oldest first)."""
    log = open_audit(state_dir)
    try:
        recs = log.records(incident_id=incident_id)
        det = [r for r in recs if r.kind == "detection"]
        if not det:
            return None
        inc = dict(det[-1].payload)
        ev = []
        for e in inc.get("evidence") or []:
            t = iso_to_ns(e["time"]) if e.get("time") else None
            q = logsql_for_line(t, e.get("node"), e.get("message"))
            ev.append({**e, "where": f"{e.get('file')}:{e.get('line')}" if e.get("file") else "-", "logsql": q,
                       "vl_link": _vl_link(victorialogs, q, t)})
        inc["evidence_rows"] = ev
        by = _approvers(log)
        acts = _actions(log, "incident_id = ?", (incident_id,))
        for a in acts:
            a["approved_by"] = by.get(a["id"], [])
        snap = Snapshot.load(Path(state_dir))
        view = next((v for v in snap.incidents if v.id == incident_id), None)
        return {"incident": inc, "view": view, "actions": acts, "history": recs,
                "timeline": timeline_svg(inc.get("evidence") or [], inc.get("node"))}
    finally:
        log.close()


def _vl_link(base: str | None, query: str, t_ns: int | None) -> str | None:
    """A VMUI link that runs ``query`` on the VictoriaLogs server the logs came from."""
    if not base:
        return None
    return f"{base.rstrip('/')}/select/vmui/#/?query={quote(query, safe='')}"


def timeline_svg(evidence: list[dict[str, Any]], culprit: str | None, width: int = 900) -> dict[str, Any]:
    """Per-node timeline of an incident's evidence as SVG geometry (the template draws it):
    culprit first, then nodes by first evidence; one mark per line; the axis labelled top and
    bottom."""
    pts = [(iso_to_ns(e["time"]), e.get("node") or "-", e.get("rule_id") or "") for e in evidence if e.get("time")]
    if not pts:
        return {"rows": [], "marks": [], "height": 0, "width": width, "t0": None, "t1": None}
    first: dict[str, int] = {}
    for t, n, _ in pts:
        first[n] = min(first.get(n, t), t)
    nodes = sorted(first, key=lambda n: (n != culprit, first[n], n))
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    span = max(1, t1 - t0)
    left, right, row_h, top = 120, 20, 22, 24
    rows = [{"node": n, "y": top + i * row_h, "culprit": n == culprit} for i, n in enumerate(nodes)]
    ys = {r["node"]: r["y"] for r in rows}
    marks = [{"x": left + (t - t0) * (width - left - right) / span, "y": ys[n], "rule": r,
              "cause": n == culprit and (r.startswith("xid") or "cause" in r)} for t, n, r in pts]
    return {"rows": rows, "marks": marks, "height": top + len(nodes) * row_h + 10, "width": width,
            "left": left, "right": width - right, "t0": ns_to_iso(t0), "t1": ns_to_iso(t1)}


def policy_view(state_dir: Path) -> dict[str, Any]:
    """Mode, budget, breaker and the promotion gate per rule (graded from the audit trail)."""
    snap = Snapshot.load(Path(state_dir))
    promo: list[dict[str, Any]] = []
    promo_error = None
    pol = snap.policy or {}
    try:
        pr = pol.get("promotion") or {}
        gate = PromotionGate(pr.get("min_precision") or 0.9, pr.get("min_incidents") or 20)
        _, table = grading_from_state(Path(state_dir), gate=gate)
        promo = table.to_dicts()
    except (RecoveryLogsError, KeyError, ValueError) as exc:   # shown on the page, the page still renders
        promo_error = str(exc)
    return {"snap": snap, "policy": pol, "promotion": promo, "promotion_error": promo_error,
            "gate_on": bool((pol.get("promotion") or {}).get("min_precision"))}


def ledger_view(state_dir: Path, client: Any = None, now_ns: int | None = None) -> dict[str, Any]:
    """Time to detect / act, GPU-hours lost per incident; job runs from sacct when reachable."""
    now = now_ns or time.time_ns()
    log = open_audit(state_dir)
    try:
        incs = incidents_from_audit(log)
        acts = action_times(log)
        runs: dict[str, list] = {}
        note = None
        jobs = sorted({i.job_id for i in incs if i.job_id and i.job_id.replace("_", "").isdigit()}
                      | {str(j) for r in log.records("detection") for j in r.payload.get("jobs") or ()
                         if str(j).replace("_", "").isdigit()})
        allocs = None
        if jobs and client is not None:
            try:
                for r in client.jobs(jobs):
                    runs.setdefault(r.job_id, []).append(r)
                allocs = sacct_jobs(jobs, runner=client.runner)
            except SlurmError as exc:   # accounting blind: resumed_at unknown, never "not resumed"
                note = (f"job runs unavailable from sacct ({exc.message}); GPU-hours count no requeue wait, "
                        "resumed_at unknown")
        # time to resume per (incident, job): fault -> detected -> proposed -> executed -> verified ->
        # running again -> first new progress line (analysis.resume, as `slurm ledger --json`)
        resume = [r.to_dict() for r in resume_records(log, allocs, now)]
    finally:
        log.close()
    out = ledger(incs, runs, acts, now)
    out["note"] = note
    out["resume"] = resume
    return out


def audit_page(state_dir: Path, kind: str | None = None, incident: str | None = None,
               limit: int = 200) -> tuple[list[AuditRecord], int]:
    log = open_audit(state_dir)
    try:
        return log.records(kind or None, incident_id=incident or None, newest_first=True, limit=limit), log.count()
    finally:
        log.close()


def verify_chain(state_dir: Path) -> tuple[bool, str]:
    """``audit verify`` through its public function (read-only: triggers, chain, the anchors outside
    the DB, the actions/kv digest; the HMAC key from $RECOVERY_LOGS_AUDIT_KEY_FILE): (ok, message)."""
    try:
        rep = verify_db(Path(state_dir) / DB_NAME, key=load_key(os.environ.get(ENV_KEY)),
                        anchor_file=anchor_path(Path(state_dir)))
    except AuditChainBroken as exc:
        return False, f"audit chain BROKEN: {exc}"
    signed = "signed, key checked" if rep.signed else "signatures not checked"
    return True, f"audit chain OK: {rep.records} records, {rep.anchors} anchors ({signed})"
