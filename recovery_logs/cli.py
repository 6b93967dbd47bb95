"""Command-line entry point. The only place that prints errors and chooses exit codes.

Each command group lives in ``recovery_logs/commands/<name>.py`` and exposes
``register(app: typer.Typer) -> None``; this module discovers them, so parallel work on
different commands never edits the same file.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer
from rich.console import Console

import recovery_logs.commands as pkg
from recovery_logs.errors import RecoveryLogsError

app = typer.Typer(
    name="recovery-logs",
    help="Find GPU-cluster faults in logs, name the root cause with evidence, drive recovery through Slurm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """recovery-logs: replay, watch, simulate, evaluate, remediate."""


def _register_commands() -> None:
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"recovery_logs.commands.{mod.name}")
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    err = Console(stderr=True, highlight=False)
    try:
        rc = app(args=argv, standalone_mode=False)
    except RecoveryLogsError as exc:
        err.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}", markup=True, soft_wrap=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # usage errors arrive as (typer-vendored) click exceptions
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return int(exc.exit_code)
        raise
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
