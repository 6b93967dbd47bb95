"""Operator console (rich): live incidents ranked, proposals awaiting approval, recent audit
records, budget and breaker state; approve/reject from the prompt.

``Snapshot.load(state_dir)`` reads the state dir's audit database without writing to it;
every part renders itself (``__rich__``), so ``render(snapshot, width)`` is a pure function of
the database content and the clock (tested as a golden render at a fixed width).
"""

from __future__ import annotations

import json
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from recovery_logs.audit import DB_NAME, AuditLog, AuditRecord
from recovery_logs.errors import AuditError, RecoveryLogsError
from recovery_logs.remediation.actions import ActionStore
from recovery_logs.remediation.lemon import STATE_FILE, LemonTracker
from recovery_logs.schema import SEVERITY_RANK
from recovery_logs.timeutil import ns_to_iso


@dataclass(frozen=True)
class IncidentRow:
    id: str
    severity: str
    category: str
    cause: str
    node: str | None
    job_id: str | None
    confidence: float
    detected_at: str | None
    status: str

    @property
    def rank_key(self) -> tuple:
        return (-SEVERITY_RANK.get(self.severity, 0), -self.confidence, self.detected_at or "", self.id)


@dataclass(frozen=True)
class PendingView:
    action_id: str
    kind: str
    target: str | None
    incident_id: str | None
    exclude: tuple[str, ...]
    cause: str


@dataclass(frozen=True)
class Snapshot:
    now: float
    mode: str
    incidents: tuple[IncidentRow, ...]
    pending: tuple[PendingView, ...]
    recent: tuple[AuditRecord, ...]
    budget_used: int
    budget_per_hour: int
    breaker: dict[str, Any]
    drained: tuple[str, ...]
    cluster_nodes: int
    max_drain_fraction: float
    dry_runs: int
    lemons: tuple[tuple[str, str, float, str], ...] = ()   # (node, state, score, reasons) not healthy

    @classmethod
    def load(cls, state_dir: Path, now: float | None = None, recent: int = 10) -> Snapshot:
        path = Path(state_dir) / DB_NAME
        if not path.exists():
            raise AuditError("console: no audit database in the state dir", path=str(path))
        audit = AuditLog(path)
        try:
            now = time.time() if now is None else now
            conf = audit.records("config", newest_first=True, limit=1)
            pol = conf[0].payload.get("policy", {}) if conf else {}
            latest: dict[str, dict[str, Any]] = {}
            for rec in audit.records("detection"):
                latest[rec.incident_id or ""] = rec.payload
            incs = sorted((IncidentRow(p["id"], p.get("severity", "info"), p.get("category", ""), p.get("cause", ""),
                                        p.get("node"), p.get("job_id"), float(p.get("confidence", 0.0)),
                                        p.get("detected_at"), p.get("status", "open"))
                           for p in latest.values()), key=lambda v: v.rank_key)
            store = ActionStore.existing(audit)
            pending: list[PendingView] = []
            used = 0
            drained: set[str] = set()
            window = float(pol.get("breaker", {}).get("window_s", 3600))
            if store is not None:
                for r in store.rows("awaiting_approval"):
                    pending.append(PendingView(r["id"], r["kind"], r["target"], r["incident_id"],
                                               tuple(json.loads(r["exclude"])), r["cause"]))
                for r in store.executed():
                    kind, target, ts = r["kind"], r["target"], r["executed_ts"]
                    used += now - 3600 < ts <= now
                    if kind == "drain_node" and now - window < ts <= now:
                        drained.add(target)
            return cls(now=now, mode=pol.get("mode", "monitor"), incidents=tuple(incs), pending=tuple(pending),
                       recent=tuple(audit.records(newest_first=True, limit=recent)), budget_used=used,
                       budget_per_hour=int(pol.get("budget", {}).get("per_hour", 0)),
                       breaker=audit.get_state("breaker", {"tripped": False, "reason": ""}),
                       drained=tuple(sorted(drained)),
                       cluster_nodes=int(audit.get_state("cluster_nodes", 0) or pol.get("breaker", {}).get(
                           "cluster_nodes", 0)),
                       max_drain_fraction=float(pol.get("breaker", {}).get("max_drain_fraction", 0.25)),
                       dry_runs=int(audit.get_state("counter:dry_run", 0)),
                       lemons=_lemons(Path(state_dir)))
        finally:
            audit.close()

    # ------------------------------------------------------------------ rendering
    def _incidents(self) -> Table:
        t = Table(title="Incidents (ranked)", title_justify="left", expand=True)
        for col in ("#", "severity", "incident", "cause", "node", "job", "conf", "status"):
            t.add_column(col, no_wrap=col in ("#", "incident", "conf"))
        for i, v in enumerate(self.incidents, 1):
            t.add_row(str(i), v.severity, v.id, v.cause, v.node or "-", v.job_id or "-", f"{v.confidence:.2f}",
                      v.status)
        if not self.incidents:
            t.add_row("", "", "none", "", "", "", "", "")
        return t

    def _pending(self) -> Table:
        t = Table(title="Awaiting approval  (recovery-logs approve ID | reject ID)", title_justify="left", expand=True)
        for col in ("action", "kind", "target", "incident", "cause"):
            t.add_column(col, no_wrap=col in ("action",))
        for p in self.pending:
            tgt = (p.target or "-") + (f" (exclude {','.join(p.exclude)})" if p.exclude else "")
            t.add_row(p.action_id, p.kind, tgt, p.incident_id or "-", p.cause)
        if not self.pending:
            t.add_row("none", "", "", "", "")
        return t

    def _state(self) -> Panel:
        br = "TRIPPED — " + str(self.breaker.get("reason", "")) if self.breaker.get("tripped") else "closed"
        share = f"{len(self.drained)}/{self.cluster_nodes or '?'} nodes drained in window" \
                f" (trips above {self.max_drain_fraction:.0%})"
        text = (f"mode {self.mode} | budget {self.budget_used}/{self.budget_per_hour} this hour | "
                f"dry-runs {self.dry_runs}\nbreaker {br} | {share}")
        return Panel(text, title=f"recovery-logs console — {(ns_to_iso(int(self.now * 1e9)) or '')[:19]}Z",
                     title_align="left")

    def _lemons(self) -> Table:
        t = Table(title="Lemon nodes (time-decayed, across jobs)", title_justify="left", expand=True)
        for col in ("node", "state", "score", "why"):
            t.add_column(col, no_wrap=col != "why")
        for node, state, score, why in self.lemons:
            t.add_row(node, state, f"{score:.2f}", why)
        if not self.lemons:
            t.add_row("none", "", "", "")
        return t

    def _recent(self) -> Panel:
        lines = [r.__rich__() for r in self.recent] or ["no records"]
        return Panel("\n".join(lines), title="Recent audit records", title_align="left")

    def __rich__(self) -> RenderableType:
        return Group(self._state(), self._incidents(), self._pending(), self._lemons(), self._recent())


def _lemons(state_dir: Path) -> tuple[tuple[str, str, float, str], ...]:
    """Nodes whose lemon state is not healthy, worst first (from the state dir's lemon.json)."""

    if not (state_dir / STATE_FILE).exists():
        return ()
    states = LemonTracker(state_dir).states().values()
    bad = sorted((s for s in states if s.state != "healthy"), key=lambda s: (-s.score, s.node))
    return tuple((s.node, s.state, s.score, "; ".join(s.reasons)) for s in bad)


def render(snapshot: Snapshot, width: int = 120) -> str:
    """Plain-text render at a fixed width (no colour): what ``console --once`` prints."""
    con = Console(width=width, record=True, color_system=None, force_terminal=False, file=_Null(),  # type: ignore[arg-type]  # write/flush is all it needs
                  highlight=False, soft_wrap=False)
    con.print(snapshot)
    return con.export_text()


class _Null:
    def write(self, _s: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def run_console(state_dir: Path, width: int | None, interval_s: float,
                act: Callable[[str, str], str], out: Console | None = None) -> None:
    """Live console: redraw every ``interval_s``; read ``a ID`` / ``r ID`` / ``q`` lines from stdin."""
    con = out or Console(width=width)
    note = ""
    while True:
        snap = Snapshot.load(state_dir)
        con.clear()
        con.print(snap)
        con.print(f"{note}\n[a ID] approve  [r ID] reject  [q] quit > ", end="")
        ready, _, _ = select.select([sys.stdin], [], [], interval_s)
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line or line.strip() == "q":
            return
        cmd, _, arg = line.strip().partition(" ")
        if cmd in ("a", "r") and arg:
            try:
                note = act("approve" if cmd == "a" else "reject", arg.strip())
            except RecoveryLogsError as exc:  # shown to the operator, console keeps running
                note = f"error: {exc}"
        else:
            note = f"unknown command {line.strip()!r}"


__all__ = ["IncidentRow", "PendingView", "Snapshot", "render", "run_console"]
