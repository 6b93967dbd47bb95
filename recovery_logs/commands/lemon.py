"""``recovery-logs lemon``: lemon-node states from incidents, persisted in a state dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from recovery_logs.errors import InputError


def incidents_from_json(path: Path) -> list[Any]:
    """Incidents from a ``replay --json`` / ``watch --json`` output file (the output contract)."""
    from recovery_logs.records import Incident
    from recovery_logs.timeutil import iso_to_ns

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError("lemon: cannot read incidents JSON", path=str(path), reason=str(exc)) from exc
    items = data.get("incidents") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise InputError("lemon: no 'incidents' list in the file", path=str(path))
    out = []
    for i, d in enumerate(items):
        try:
            t = iso_to_ns(d.get("last_seen") or d["first_seen"])
            out.append(Incident(id=d["id"], category=d["category"], cause=d.get("cause", ""), severity=d.get("severity", ""),
                                node=d.get("node"), gpu=d.get("gpu"), job_id=d.get("job_id"), xid=d.get("xid"),
                                confidence=float(d.get("confidence", 0.0)), first_seen=iso_to_ns(d["first_seen"]),
                                last_seen=t, detected_at=t, count=int(d.get("count", 1)),
                                nodes=tuple(d.get("nodes") or ([d["node"]] if d.get("node") else [])),
                                evidence=(), candidates=()))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError("lemon: incident record lacks a field", path=str(path), index=i, reason=repr(exc)) from exc
    return out


def register(app: typer.Typer) -> None:
    lemon = typer.Typer(help="Lemon nodes: time-decayed failure memory per node across jobs.", no_args_is_help=True)
    app.add_typer(lemon, name="lemon")

    @lemon.command("update")
    def update(
        incidents: Annotated[list[Path], typer.Argument(help="replay/watch --json output files")],
        state_dir: Annotated[Path, typer.Option("--state-dir", help="where lemon.json lives")],
        as_json: Annotated[bool, typer.Option("--json", help="print the lemon states as JSON")] = False,
    ) -> None:
        """Fold incidents into the lemon state and print every node's state."""
        from recovery_logs.remediation.lemon import LemonTracker

        incs = [i for p in incidents for i in incidents_from_json(p)]
        _show(LemonTracker(state_dir).update(incs), as_json)

    @lemon.command("show")
    def show(
        state_dir: Annotated[Path, typer.Option("--state-dir", help="where lemon.json lives")],
        as_json: Annotated[bool, typer.Option("--json", help="print the lemon states as JSON")] = False,
    ) -> None:
        """Print the persisted lemon states."""
        from recovery_logs.remediation.lemon import LemonTracker

        _show(LemonTracker(state_dir).states(), as_json)


def _show(states: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({n: s.to_dict() for n, s in states.items()}, indent=2))
        return
    from rich.table import Table

    from recovery_logs.textsafe import out_console

    t = Table("node", "state", "score", "incidents", "jobs", "same GPU+XID", "reasons")
    order = {"drain": 0, "probation": 1, "watch": 2, "healthy": 3}
    for n, s in sorted(states.items(), key=lambda kv: (order.get(kv[1].state, 9), -kv[1].score, kv[0])):
        t.add_row(n, s.state, f"{s.score:.2f}", str(s.incidents), str(s.distinct_jobs), ", ".join(s.repeat_gpu_xids),
                  "; ".join(s.reasons))
    out_console(None).print(t)
