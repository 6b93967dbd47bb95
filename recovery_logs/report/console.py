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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from recovery_logs.audit import DB_NAME, AuditLog, AuditRecord
from recovery_logs.errors import AuditError, RecoveryLogsError
from recovery_logs.remediation.actions import ActionStore
from recovery_logs.remediation.lemon import STATE_FILE, LemonTracker
from recovery_logs.schema import SEVERITY_RANK
from recovery_logs.textsafe import SafeConsole, clean, out_console
from recovery_logs.timeutil import ns_to_iso

FOOTER = "approve ID | reject ID [REASON] | quit"
MITIGATING = ("drain_node", "requeue_job", "cancel_job")


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
    closed_by: str = ""          # "drain_node gpu-n03 done": the mitigating action Slurm confirmed

    @property
    def rank_key(self) -> tuple:
        return (self.status == "closed", -SEVERITY_RANK.get(self.severity, 0), -self.confidence,
                self.detected_at or "", self.id)


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
    policy: dict[str, Any] | None = None                     # the policy the watcher last recorded

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
            store = ActionStore.existing(audit)
            closed: dict[str, str] = {}
            if store is not None:   # an incident is closed once Slurm confirmed its mitigating action
                for r in sorted(store.rows(), key=lambda r: r["updated_ts"]):
                    if r["status"] in ("done", "noop") and r["kind"] in MITIGATING:
                        closed.setdefault(r["incident_id"] or "", f"{r['kind']} {r['target']} {r['status']}")
            incs = sorted((IncidentRow(p["id"], p.get("severity", "info"), p.get("category", ""), p.get("cause", ""),
                                       p.get("node"), p.get("job_id"), float(p.get("confidence", 0.0)),
                                       p.get("detected_at"),
                                       "closed" if p["id"] in closed else p.get("status", "open"),
                                       closed.get(p["id"], ""))
                           for p in latest.values()), key=lambda v: v.rank_key)
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
                       lemons=_lemons(Path(state_dir)), policy=pol)
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

    def compact(self, height: int) -> RenderableType:
        """The same content in ``height`` rows (a 22-row terminal shows every part): one line per
        row, no boxes, the worst incidents and oldest proposals first, then as many audit records
        as fit. Two rows stay free for the prompt."""
        br = ("TRIPPED: " + str(self.breaker.get("reason", ""))) if self.breaker.get("tripped") else "closed"
        head = [Text(f"recovery-logs console {(ns_to_iso(int(self.now * 1e9)) or '')[:19]}Z  mode {self.mode}  budget "
                     f"{self.budget_used}/{self.budget_per_hour}/h  dry-runs {self.dry_runs}", style="bold"),
                Text(clean(f"breaker {br}  {len(self.drained)}/{self.cluster_nodes or '?'} drained in window"
                           + (f"  lemons: {', '.join(n for n, *_ in self.lemons)}" if self.lemons else "")),
                     no_wrap=True, overflow="ellipsis")]
        free = max(3, height - 2 - len(head) - 3 * 2)       # prompt, head, 3 x (title + header)
        n_inc = min(len(self.incidents), max(1, free // 2))
        n_pen = min(len(self.pending), max(1, (free - n_inc) // 2))
        n_rec = max(1, free - max(1, n_inc) - max(1, n_pen))

        def table(title: str, cols: tuple[str, ...], rows: Sequence[tuple[str, ...]], total: int) -> Table:
            more = f" (top {len(rows)} of {total})" if total > len(rows) else ""
            t = Table(title=title + more, title_justify="left", box=None, expand=True, pad_edge=False,
                      header_style="bold", title_style="bold")
            for c in cols:
                t.add_column(c, no_wrap=True, overflow="ellipsis", ratio=3 if c in ("cause", "record") else None)
            for r in rows or [("none",) + ("",) * (len(cols) - 1)]:
                t.add_row(*(Text(clean(v)) for v in r))
            return t

        inc = [(str(n), v.severity, v.id, v.node or "-", v.job_id or "-", v.status, v.cause)
               for n, v in enumerate(self.incidents[:n_inc], 1)]
        pen = [(p.action_id, p.kind, (p.target or "-") + (f" excl {','.join(p.exclude)}" if p.exclude else ""),
                p.incident_id or "-", p.cause) for p in self.pending[:n_pen]]
        rec = [(str(r.__rich__()),) for r in self.recent[:n_rec]]
        return Group(*head, table("Incidents", ("#", "sev", "incident", "node", "job", "status", "cause"), inc,
                                  len(self.incidents)),
                     table(f"Awaiting approval: {FOOTER}", ("action", "kind", "target", "incident", "cause"), pen,
                           len(self.pending)),
                     table("Recent audit", ("record",), rec, len(self.recent)))


def _lemons(state_dir: Path) -> tuple[tuple[str, str, float, str], ...]:
    """Nodes whose lemon state is not healthy, worst first (from the state dir's lemon.json)."""

    if not (state_dir / STATE_FILE).exists():
        return ()
    states = LemonTracker(state_dir).states().values()
    bad = sorted((s for s in states if s.state != "healthy"), key=lambda s: (-s.score, s.node))
    return tuple((s.node, s.state, s.score, "; ".join(s.reasons)) for s in bad)


def render(snapshot: Snapshot, width: int = 120, height: int | None = None) -> str:
    """Plain-text render at a fixed width (no colour): what ``console --once`` prints; with
    ``height`` the compact layout that fits that many rows."""
    con = SafeConsole(width=width, record=True, color_system=None, force_terminal=False, file=_Null(),
                      soft_wrap=False)
    con.print(snapshot if height is None else snapshot.compact(height))
    return con.export_text()


class _Null:
    def write(self, _s: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def run_console(state_dir: Path, width: int | None, interval_s: float,
                act: Callable[..., str], out: Console | None = None) -> None:
    """Live console: redraw every ``interval_s``; read ``approve ID`` / ``reject ID [REASON]`` /
    ``quit`` lines (or ``a ID`` / ``r ID`` / ``q``) from stdin. In a terminal shorter than 40 rows
    the compact layout is drawn so every part stays visible."""
    con = out or out_console(width)
    note = ""
    while True:
        snap = Snapshot.load(state_dir)
        con.clear()
        rows = con.size.height if out is None else None
        con.print(snap.compact(rows) if rows is not None and rows < 40 else snap)
        con.print(Text(clean(note)), Text(f"{FOOTER} > "), sep="\n", end="")
        ready, _, _ = select.select([sys.stdin], [], [], interval_s)
        if not ready:
            continue
        line = sys.stdin.readline()
        words = line.strip().split(maxsplit=2)
        if not line or (words and words[0] in ("q", "quit", "exit")):
            return
        cmd = {"a": "approve", "approve": "approve", "r": "reject", "reject": "reject"}.get(words[0] if words else "")
        if cmd and len(words) >= 2:
            try:
                note = act(cmd, words[1]) if len(words) == 2 else act(cmd, words[1], words[2])
            except RecoveryLogsError as exc:  # shown to the operator, console keeps running
                note = f"error: {exc}"
        else:
            note = f"unknown command {line.strip()!r} (use: {FOOTER})"


__all__ = ["IncidentRow", "PendingView", "Snapshot", "render", "run_console"]
