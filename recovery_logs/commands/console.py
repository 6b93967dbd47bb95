"""`recovery-logs console`: incidents, approvals, audit, budget and breaker at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands.audit import STATE_DIR_HELP, _state_dir


def register(app: typer.Typer) -> None:
    @app.command("console")
    def console(once: Annotated[bool, typer.Option("--once", help="print one snapshot and exit")] = False,
                width: Annotated[int | None, typer.Option("--width", help="render width (default: terminal)")] = None,
                height: Annotated[int | None, typer.Option("--height", help="with --once: the compact layout for N rows")] = None,
                interval: Annotated[float, typer.Option("--interval", help="seconds between redraws")] = 2.0,
                state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Live console; type `approve ID`, `reject ID [REASON]` or `quit` (a / r / q for short)."""
        from recovery_logs.report.console import Snapshot, render, run_console

        sd = _state_dir(state_dir)
        if once:
            typer.echo(render(Snapshot.load(sd), width or 120, height), nl=False)
            return

        def act(what: str, action_id: str, reason: str = "") -> str:
            import getpass

            from recovery_logs.remediation.remediator import Remediator

            rem = Remediator.open_existing(sd, mode="approve")
            who = getpass.getuser()
            try:
                d = (rem.approve(action_id, by=who) if what == "approve"
                     else rem.reject(action_id, by=who, reason=reason))
            finally:
                rem.close()
            return f"{d.action_id}: {d.decision}/{d.status} — {d.reason}"

        run_console(sd, width, interval, act)
