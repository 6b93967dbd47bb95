"""`recovery-logs approve ID` / `reject ID`: decide a proposal queued in approve mode."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands.audit import STATE_DIR_HELP, _state_dir
from recovery_logs.textsafe import clean


def _remediator(state_dir: Path | None, policy: Path | None):
    from recovery_logs.remediation.remediator import Remediator

    return Remediator.open_existing(_state_dir(state_dir), mode="approve", policy_file=policy)


def register(app: typer.Typer) -> None:
    @app.command("approve")
    def approve(action_id: Annotated[str, typer.Argument(help="action id (act-...) from the console or audit")],
                state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None,
                policy: Annotated[Path | None, typer.Option("--policy", help="policy file (TOML)")] = None) -> None:
        """Approve a queued action; it runs now if budget and breaker allow (SLURM_CONF names the cluster)."""
        rem = _remediator(state_dir, policy)
        try:
            d = rem.approve(action_id, by=getpass.getuser())
        finally:
            rem.close()
        typer.echo(clean(f"{d.action_id}: {d.decision}/{d.status} — {d.result.get('message') or d.reason}"))

    @app.command("reject")
    def reject(action_id: Annotated[str, typer.Argument(help="action id (act-...)")],
               reason: Annotated[str, typer.Option("--reason", help="why (recorded in the audit trail)")] = "",
               state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Reject a queued action; it will never run."""
        rem = _remediator(state_dir, None)
        try:
            d = rem.reject(action_id, by=getpass.getuser(), reason=reason)
        finally:
            rem.close()
        typer.echo(clean(f"{d.action_id}: rejected — {d.reason}"))
