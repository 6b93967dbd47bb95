"""`recovery-logs slurm status|breaker-reset`: remediation state and the circuit breaker."""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands.audit import STATE_DIR_HELP, _state_dir


def register(app: typer.Typer) -> None:
    slurm_app = typer.Typer(help="Slurm remediation state.", no_args_is_help=True)
    app.add_typer(slurm_app, name="slurm")

    @slurm_app.command("breaker-reset")
    def breaker_reset(state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Close a tripped circuit breaker (recorded in the audit trail)."""
        from recovery_logs.remediation.remediator import Remediator

        rem = Remediator.open_existing(_state_dir(state_dir), mode="monitor")
        try:
            was = rem.breaker()
            rem.breaker_reset(by=getpass.getuser())
        finally:
            rem.close()
        typer.echo("breaker reset" + (f" (was tripped: {was.get('reason')})" if was.get("tripped") else
                                      " (it was not tripped)"))

    @slurm_app.command("status")
    def status(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
               state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Breaker, budget, dry-run count and actions by status (reads the state dir only)."""
        from recovery_logs.console import Snapshot

        snap = Snapshot.load(_state_dir(state_dir))
        from recovery_logs.audit import AuditLog

        log = AuditLog.open(_state_dir(state_dir))
        try:
            counts = dict(log.conn.execute("SELECT status, COUNT(*) FROM actions GROUP BY status").fetchall()) \
                if log.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'actions'").fetchone() else {}
        finally:
            log.close()
        data = {"mode": snap.mode, "breaker": snap.breaker, "budget_used_hour": snap.budget_used,
                "budget_per_hour": snap.budget_per_hour, "drained_in_window": list(snap.drained),
                "cluster_nodes": snap.cluster_nodes, "dry_runs": snap.dry_runs, "actions": counts,
                "awaiting_approval": [p.action_id for p in snap.pending]}
        if as_json:
            typer.echo(json.dumps(data, sort_keys=True))
            return
        for k, v in data.items():
            typer.echo(f"{k}: {v}")
