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
from rich.text import Text

import recovery_logs.commands as pkg
from recovery_logs import __version__
from recovery_logs.cli_help import apply_examples
from recovery_logs.errors import RecoveryLogsError
from recovery_logs.textsafe import clean, out_console

_SETTINGS: dict = dict(
    name="recovery-logs",
    help="Find GPU-cluster faults in logs, name the root cause with evidence, drive recovery through Slurm.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app = typer.Typer(**_SETTINGS)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"recovery-logs {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                       help="print the version and exit (e.g. recovery-logs --version)")) -> None:
    """recovery-logs: replay, watch, simulate, evaluate, remediate."""


def _register_commands() -> None:
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"recovery_logs.commands.{mod.name}")
        module.register(app)


_register_commands()
apply_examples(app)


def _app_for(argv: list[str]) -> typer.Typer:
    """The app to run ``argv`` with: for ``recovery-logs NAME ...`` one with only the command or group
    NAME (typer turns every registered command's signature into click parameters on each start,
    ~0.2 s for all of them; one command's is a few ms). Anything else (no command, an option
    first, an unknown name) gets the whole app, so root help, completion and errors are unchanged."""
    if not argv or argv[0].startswith("-"):
        return app
    name = argv[0]
    cmds = [c for c in app.registered_commands
            if (c.name or (typer.main.get_command_name(c.callback.__name__) if c.callback else None)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if len(cmds) + len(groups) != 1:
        return app
    one = typer.Typer(**_SETTINGS)
    one.registered_callback = app.registered_callback
    one.registered_commands = cmds
    one.registered_groups = groups
    return one


def main(argv: list[str] | None = None) -> int:
    err = out_console(stderr=True)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = _app_for(args)(args=args, standalone_mode=False)
    except RecoveryLogsError as exc:   # the message carries paths, node names, log text: literal
        err.print(Text.assemble(("error:", "bold red"), " ", clean(f"{type(exc).__name__}: {exc}")), soft_wrap=True)
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
