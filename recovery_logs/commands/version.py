"""`recovery-logs version`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version() -> None:
        """Print the recovery-logs version."""
        from recovery_logs import __version__

        typer.echo(__version__)
