"""Reports: the rich terminal report and the Markdown report of a replay.

Domain objects render themselves (``IncidentPanel.__rich__``); tests render at a fixed width and
compare exact text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from recovery_logs.records import Incident
from recovery_logs.textsafe import clean, md_code_block, md_text
from recovery_logs.textsafe import text as T
from recovery_logs.timeutil import iso_to_ns, ns_to_iso

if TYPE_CHECKING:
    from recovery_logs.pipeline.replay import ReplayResult
    from recovery_logs.remediation.gate import PromotionGate

SEV_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}
ROLE_MARK = {"cause": ("X", 4), "symptom": ("s", 3), "breadcrumb": ("b", 2), "info": ("i", 1), "clear": ("c", 1),
             "progress": ("·", 0)}


def _t(ns: int | None) -> str:
    s = ns_to_iso(ns)
    return "-" if s is None else s.replace("T", " ")[:23]


def headline(message: str | None) -> str:
    """One line for a possibly multi-line message: a traceback's exception line, else the first line."""
    if not message:
        return ""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback"):
        return lines[-1]
    return lines[0]


def _where(i: Incident) -> str:
    if not i.node:
        return "-"
    return i.node + (f" gpu{i.gpu}" if i.gpu is not None else "")


def _actions(i: Incident) -> str:
    parts = []
    for a in i.actions:
        tgt = f"({a.target})" if a.target else ""
        excl = f" excl {','.join(a.exclude)}" if a.exclude else ""
        parts.append(f"{a.kind}{tgt}{excl}")
    return "; ".join(parts) or "-"


class IncidentPanel:
    def __init__(self, inc: Incident, rank: int) -> None:
        self.inc, self.rank = inc, rank

    def __rich__(self) -> Panel:
        i = self.inc
        head = Text.assemble((f"#{self.rank} ", "bold"), T(i.severity.upper(), SEV_STYLE.get(i.severity, "")),
                             T(f"  {i.category}  "), T(i.cause, "bold"))
        meta = Table.grid(padding=(0, 2))
        meta.add_column(style="dim")
        meta.add_column()
        meta.add_row("culprit", T(_where(i) + (f"  pci {i.pci}" if i.pci else "")))
        meta.add_row("job", T(i.job_id or "-"))
        meta.add_row("confidence", T(f"{i.confidence:.2f}   status {i.status}"))
        meta.add_row("first seen", _t(i.first_seen))
        meta.add_row("detected at", f"{_t(i.detected_at)}  (+{(i.detected_at - i.first_seen) / 1e9:.3f} s)")
        meta.add_row("lines", f"{i.count} across {len(i.nodes)} node(s)")
        meta.add_row("actions", T(_actions(i) + "  (record only)" if i.actions and
                                  all(a.decision == "record_only" for a in i.actions) else _actions(i)))
        cand = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        cand.add_column("candidate")
        cand.add_column("score", justify="right")
        cand.add_column("why")
        for c in i.candidates[:4]:
            cand.add_row(T(c.node or "(job)"), f"{c.score:.2f}", T(c.cause))
        ev = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        ev.add_column("time", no_wrap=True)
        ev.add_column("node", no_wrap=True)
        ev.add_column("evidence", overflow="fold")
        for e in i.evidence:
            ev.add_row(_t(e.time)[11:], T(e.node or "-"), T(headline(e.message)[:200]))
        return Panel(Group(meta, Text(""), cand, Text(""), ev), title=head, title_align="left")


def timeline(findings: pl.DataFrame, first_ns: int | None, last_ns: int | None, width: int = 60) -> Table:
    """Per-node timeline: one character per time bucket, the strongest role seen there."""
    t = Table(title="per-node timeline (X cause, s symptom, b breadcrumb, i info, · progress)", box=None,
              show_header=False, pad_edge=False)
    t.add_column("node", no_wrap=True, style="bold")
    t.add_column("timeline", no_wrap=True)
    if first_ns is None or last_ns is None or findings.height == 0:
        return t
    span = max(1, last_ns - first_ns)
    f = (findings.filter(pl.col("host").is_not_null() & pl.col("time").is_not_null())
         .with_columns(((pl.col("time").dt.epoch("ns") - first_ns) * (width - 1) // span)
                       .clip(0, width - 1).alias("b"))
         .group_by(["host", "b", "role"]).agg(pl.len()))
    cells: dict[str, list[tuple[str, int]]] = {}
    for host, b, role, _n in f.sort(["host", "b"]).iter_rows():
        row = cells.setdefault(host, [(" ", -1)] * width)
        mark = ROLE_MARK.get(role, ("?", 0))
        if mark[1] > row[b][1]:
            row[b] = mark
    for host in sorted(cells):
        txt = Text()
        for ch, prio in cells[host]:
            txt.append(ch, style={4: "bold red", 3: "yellow", 2: "magenta"}.get(prio, "dim"))
        t.add_row(T(host), txt)
    t.add_row("", Text(f"{_t(first_ns)[11:19]}{' ' * max(1, width - 16)}{_t(last_ns)[11:19]}", style="dim"))
    return t


def summary_table(summary: dict[str, Any]) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    keys = ["files", "lines", "events", "findings", "incidents", "malformed", "quarantined", "duplicates",
            "out_of_order", "first_event", "last_event"]
    for k in keys:
        if k in summary:
            t.add_row(k, T(summary[k]))
    return t


def terminal_report(result: ReplayResult, max_incidents: int = 10) -> Group:
    """The rich renderable of a ReplayResult."""
    parts: list[Any] = [Text("recovery-logs replay", style="bold"), summary_table(result.summary), Text("")]
    incs = result.incidents
    if not incs:
        parts.append(Text("No incidents: nothing needs recovery.", style="green"))
    else:
        ranked = Table(title="incidents, most important first", header_style="bold")
        for col in ("#", "severity", "category", "culprit", "job", "conf", "detected", "proposed actions"):
            ranked.add_column(col, overflow="fold")
        for n, i in enumerate(incs, 1):
            ranked.add_row(str(n), T(i.severity, SEV_STYLE.get(i.severity, "")), T(i.category), T(_where(i)),
                           T(i.job_id or "-"), f"{i.confidence:.2f}", _t(i.detected_at)[11:], T(_actions(i)))
        parts.append(ranked)
        parts.extend(IncidentPanel(i, n) for n, i in enumerate(incs[:max_incidents], 1))
    eng = result.engine
    first = _parse(result.summary.get("first_event"))
    parts.append(timeline(eng.all_findings(), first, eng.max_time_ns))
    return Group(*parts)


def _parse(s: str | None) -> int | None:
    if not s:
        return None

    return iso_to_ns(s)


def markdown_report(result: ReplayResult) -> str:
    s = result.summary
    lines = ["# recovery-logs replay report", "",
             f"{s.get('events')} events from {s.get('files')} file(s), {s.get('quarantined')} quarantined, "
             f"{s.get('incidents')} incident(s). Replay records proposals; it never acts on a cluster.", ""]
    if not result.incidents:
        lines += ["No incidents: nothing needs recovery.", ""]
    else:
        lines += ["| # | severity | category | culprit | job | confidence | detected at | proposed actions |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, i in enumerate(result.incidents, 1):
            lines.append(f"| {n} | {md_text(i.severity)} | {md_text(i.category)} | {md_text(_where(i))} | "
                         f"{md_text(i.job_id or '-')} | {i.confidence:.2f} | {_t(i.detected_at)} | "
                         f"{md_text(_actions(i))} |")
        lines.append("")
        for n, i in enumerate(result.incidents, 1):
            lines += [f"## {n}. {md_text(i.cause)}", "",
                      f"- category: `{clean(i.category).replace('`', '')}`, severity: {md_text(i.severity)}, "
                      f"status: {md_text(i.status)}",
                      f"- culprit: {md_text(_where(i))}" + (f" (PCI {md_text(i.pci)})" if i.pci else ""),
                      f"- job: {md_text(i.job_id or '-')}, confidence {i.confidence:.2f}",
                      f"- first seen {_t(i.first_seen)}, detected at {_t(i.detected_at)}, "
                      f"last seen {_t(i.last_seen)}; {i.count} line(s) on {md_text(', '.join(i.nodes) or '-')}",
                      "", "| candidate | score | cause |", "|---|---|---|"]
            lines += [f"| {md_text(c.node or '(job)')} | {c.score:.2f} | {md_text(c.cause)} |" for c in i.candidates]
            lines += ["", "| kind | target | decision | reason |", "|---|---|---|---|"]
            lines += [f"| {md_text(a.kind)} | {md_text(a.target or '-')} | {md_text(a.decision)} | "
                      f"{md_text(a.reason)} |" for a in i.actions]
            lines += ["", "Evidence:", ""]
            lines += md_code_block([f"{_t(e.time)} {e.node or '-'} {headline(e.message)}" for e in i.evidence])
            lines += [""]
    return "\n".join(lines) + "\n"


def precision_renderable(table: pl.DataFrame, gate: PromotionGate) -> Table:
    """A rich table of ``PromotionGate.table`` output (for ``grade`` and the console)."""

    t = Table(title=f"self-grading: rules act alone at precision >= {gate.min_precision:.2f} over "
                    f">= {gate.min_incidents} incidents", header_style="bold")
    for c in ("rule", "proposals", "right", "wrong", "unknown", "incidents", "precision", "gate"):
        t.add_column(c, justify="left" if c in ("rule", "gate") else "right")
    for r in table.iter_rows(named=True):
        p = "-" if r["precision"] is None else f"{r['precision']:.2f}"
        t.add_row(r["root_rule"], str(r["proposals"]), str(r["right"]), str(r["wrong"]), str(r["unknown"]),
                  str(r["graded_incidents"]), p, "promoted" if r.get("promoted") else "held")
    return t
def incident_line(kind: str, i: Incident) -> str:
    """One human line per new/updated incident (``watch`` without ``--json``; journald reads it)."""
    where = _where(i)
    job = f" job {i.job_id}" if i.job_id else ""
    acts = _actions(i)
    line = (f"{_t(i.detected_at)} {kind.upper():7s} {i.severity:8s} {i.category} {where}{job} "
            f"[{i.id}] conf {i.confidence:.2f} status {i.status}: {headline(i.cause)}"
            + (f" | actions: {acts}" if i.actions else ""))
    return clean(line)
