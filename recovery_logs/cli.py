"""Command-line entry point. The only place that prints errors and chooses exit codes.

Each command group lives in ``recovery_logs/commands/<name>.py`` and exposes
``register(app: typer.Typer) -> None``; this module discovers them, so parallel work on
different commands never edits the same file.

Start-up (issue 16): the typer app (``app``) is built on first use, not on import. A plain command
line of ``replay`` or ``demo`` (options and paths, no help, nothing typer would reject) runs the
command's function directly (``_direct``): typer, Pydantic (a validator per parameter) and the
other command modules are not imported. Every other command line goes to typer as before.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import recovery_logs.commands as pkg
from recovery_logs import __version__
from recovery_logs.cli_help import apply_examples
from recovery_logs.commands import _replay_run as run
from recovery_logs.commands._direct import parse
from recovery_logs.errors import RecoveryLogsError
from recovery_logs.textsafe import clean, out_console

if TYPE_CHECKING:
    import typer

    app: typer.Typer

_SETTINGS: dict = dict(
    name="recovery-logs",
    help="Find GPU-cluster faults in logs, name the root cause with evidence, drive recovery through Slurm.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    import typer

    if value:
        typer.echo(f"recovery-logs {__version__}")
        raise typer.Exit(0)


def _build_app() -> typer.Typer:
    import importlib
    import pkgutil

    import typer

    the_app = typer.Typer(**_SETTINGS)

    @the_app.callback()
    def _root(version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                           help="print the version and exit (e.g. recovery-logs --version)")) -> None:
        """recovery-logs: replay, watch, simulate, evaluate, remediate."""

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"recovery_logs.commands.{mod.name}")
        module.register(the_app)
    apply_examples(the_app)
    return the_app


def _the_app() -> typer.Typer:
    built = globals().get("app")
    if built is None:
        built = globals()["app"] = _build_app()
    return built


def __getattr__(name: str) -> Any:
    if name == "app":        # built on first use (``from recovery_logs.cli import app`` too), then a plain global
        return _the_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(argv: list[str]) -> typer.Typer:
    """The app to run ``argv`` with: for ``recovery-logs NAME ...`` one with only the command or group
    NAME (typer turns every registered command's signature into click parameters on each start,
    ~0.2 s for all of them; one command's is a few ms). Anything else (no command, an option
    first, an unknown name) gets the whole app, so root help, completion and errors are unchanged."""
    import typer

    full = _the_app()
    if not argv or argv[0].startswith("-"):
        return full
    name = argv[0]
    cmds = [c for c in full.registered_commands
            if (c.name or (typer.main.get_command_name(c.callback.__name__) if c.callback else None)) == name]
    groups = [g for g in full.registered_groups if g.name == name]
    if len(cmds) + len(groups) != 1:
        return full
    one = typer.Typer(**_SETTINGS)
    one.registered_callback = full.registered_callback
    one.registered_commands = cmds
    one.registered_groups = groups
    return one


def _direct(argv: list[str]) -> Callable[[], int] | None:
    """``replay``/``demo`` with a plain command line: their function with the parameters typer would
    pass (``commands._direct``); None for anything else, and for a shell-completion request."""
    if not argv or argv[0] not in ("replay", "demo"):
        return None
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    if argv[0] == "replay":
        kw = parse(argv[1:], run.REPLAY_OPTIONS, ("paths", "paths"))
        return None if kw is None else partial(run.run_replay, **kw)
    kw = parse(argv[1:], run.DEMO_OPTIONS, ("name", "str"))
    return None if kw is None else partial(run.run_demo, **kw)


class _QuietFlush:
    """A stream whose flush ignores a closed pipe (the interpreter flushes stdout at exit), as click
    wraps stdout and stderr when a command's output pipe was closed."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.wrapped, attr)


def _run_direct(call: Callable[[], int]) -> int:
    """``call()`` as typer's ``main(standalone_mode=False)`` runs a command: an EOF on input is an
    abort, Ctrl-C exit code 130, a closed stdout pipe exit code 1 (quietly)."""
    try:
        return call()
    except EOFError:
        sys.stderr.write("\n")
        sys.stderr.flush()
        out_console(stderr=True).print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = _QuietFlush(sys.stdout)
        sys.stderr = _QuietFlush(sys.stderr)
        sys.exit(1)


def _run_typer(args: list[str]) -> int:
    import typer

    try:
        rc = _app_for(args)(args=args, standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        out_console(stderr=True).print("aborted")
        return 130
    return rc if isinstance(rc, int) else 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        call = _direct(args)
        return _run_direct(call) if call is not None else _run_typer(args)
    except RecoveryLogsError as exc:   # the message carries paths, node names, log text: literal
        from rich.text import Text

        out_console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", clean(f"{type(exc).__name__}: {exc}")),
                             soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # usage errors arrive as (typer-vendored) click exceptions
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return int(exc.exit_code)
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
