"""`recovery-logs replay` and `recovery-logs demo`: their parameters and help, for typer.

What they do is in ``commands._replay_run`` (``run_replay``, ``run_demo``), which the CLI also
calls without typer for a plain command line: a new option also goes into the function's signature
and its option table there (``REPLAY_OPTIONS``, ``DEMO_OPTIONS``); tests/test_cli_direct.py fails
until it does."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands import _replay_run as _run
from recovery_logs.commands._replay_run import DEFAULT_DEMO


def _done(code: int) -> None:
    if code:
        raise typer.Exit(code=code)


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay_cmd(
        paths: Annotated[list[Path] | None, typer.Argument(help="log files, directories or globs")] = None,
        fmt: Annotated[str, typer.Option("--format", help="auto|vl-jsonl|journald|syslog|dmesg|job|parquet")] = "auto",
        as_json: Annotated[bool, typer.Option("--json", help="print the JSON output contract on stdout")] = False,
        out: Annotated[Path | None, typer.Option("--out", help="write JSON, Markdown, events Parquet, quarantine")] = None,
        host: Annotated[str | None, typer.Option("--host", help="node name for lines that carry none")] = None,
        job: Annotated[str | None, typer.Option("--job", help="Slurm job id for lines that carry none")] = None,
        year: Annotated[int | None, typer.Option("--year", help="year for timestamps without one")] = None,
        boot_time: Annotated[str | None, typer.Option("--boot-time", help="RFC3339 boot time for dmesg")] = None,
        rules_dir: Annotated[Path | None, typer.Option("--rules-dir", help="site rule packs")] = None,
        config: Annotated[Path | None, typer.Option(
            "--config", help="engine config TOML (engine and line_formats tables)")] = None,
        line_format: Annotated[str | None, typer.Option(
            "--line-format", help="site line format for every file, e.g. '<Date> <Time> <Node> <Level> <Content>'")] = None,
        time_format: Annotated[str | None, typer.Option(
            "--time-format", help="strptime format of the line format's time fields, or epoch|epoch_ms|iso")] = None,
        source: Annotated[str | None, typer.Option("--source", help="victorialogs://HOST:PORT")] = None,
        query: Annotated[str, typer.Option("--query", help="LogsQL filter for --source")] = "*",
        pushdown: Annotated[bool, typer.Option(
            "--pushdown/--no-pushdown", help="--source: the server counts lines per window and sends only the "
            "lines a rule can match (default); --no-pushdown reads every row")] = True,
        pushdown_progress: Annotated[bool, typer.Option(
            "--pushdown-progress", help="--source --select server: the server also summarises training-progress "
            "lines without a step time (less for us to read, more for the server to scan); --select local always does")] = False,
        select: Annotated[str, typer.Option(
            "--select", help="--source: local (default: the server exports the scope, lines are selected, counted "
            "and summarised here) or server (LogsQL literal filters and stats: fewer bytes over a slow network)")] = "local",
        explain: Annotated[bool, typer.Option("--explain", help="--source: print the LogsQL sent and exit")] = False,
        start: Annotated[str | None, typer.Option("--start", help="RFC3339 start (with --source)")] = None,
        end: Annotated[str | None, typer.Option("--end", help="RFC3339 end (with --source)")] = None,
        width: Annotated[int | None, typer.Option("--width", help="terminal width for the report")] = None,
        since: Annotated[str | None, typer.Option("--since", help="archive input: RFC3339 start (inclusive)")] = None,
        until: Annotated[str | None, typer.Option("--until", help="archive input: RFC3339 end (exclusive)")] = None,
        nodes: Annotated[str | None, typer.Option("--nodes", help="archive input: only these nodes (a,b,c)")] = None,
        progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                      help="progress bar on stderr (default: only on a terminal)")] = None,
        workers: Annotated[int | None, typer.Option("--workers", help="judge on N local Ray workers, sharded by "
                                                    "Slurm allocation (pip install 'recovery-logs[scale]'); same result")] = None,
        ray_address: Annotated[str | None, typer.Option("--ray-address", help="use an existing Ray cluster")] = None,
        by_allocation: Annotated[bool, typer.Option(
            "--by-allocation", help="one process, no Ray: one Slurm allocation's files after another, in memory "
            "bounded by the largest allocation instead of by the input (a fleet's day); same result")] = False,
        vl_user: Annotated[str | None, typer.Option("--vl-user", help="VictoriaLogs basic-auth user")] = None,
        vl_password_file: Annotated[str | None, typer.Option("--vl-password-file", help="file holding the password")] = None,
        vl_password_env: Annotated[str | None, typer.Option("--vl-password-env", help="env var holding the password")] = None,
        vl_token_file: Annotated[str | None, typer.Option("--vl-token-file", help="file holding a bearer token")] = None,
        vl_token_env: Annotated[str | None, typer.Option("--vl-token-env", help="env var holding a bearer token")] = None,
        vl_ca: Annotated[str | None, typer.Option("--vl-ca", help="CA bundle for https")] = None,
        vl_insecure: Annotated[bool, typer.Option("--vl-insecure", help="do not verify TLS")] = False,
        vl_account: Annotated[str | None, typer.Option("--vl-account", help="tenant AccountID")] = None,
        vl_project: Annotated[str | None, typer.Option("--vl-project", help="tenant ProjectID")] = None,
        extra_filter: Annotated[list[str] | None, typer.Option("--extra-filter", help="server-side extra_filters (repeatable)")] = None,
        line_scores: Annotated[bool | None, typer.Option(
            "--line-scores/--no-line-scores", help="flag rare error-level lines and new templates (low severity, "
            "investigate only); default: on with a site line format, off for the built-in formats")] = None,
        accounting: Annotated[str | None, typer.Option(
            "--accounting", help="Slurm accounting to join node faults to jobs: a saved `sacct --json` or "
            "`sacct -P` dump, or `sacct` to ask the live sacct for the replayed range")] = None,
    ) -> None:
        """Replay historical logs: ranked incidents with evidence and recorded (never executed) actions."""
        _done(_run.run_replay(**locals()))     # every parameter, by name

    @app.command("demo")
    def demo_cmd(
        name: Annotated[str, typer.Argument(help="bundled incident to replay")] = DEFAULT_DEMO,
        as_json: Annotated[bool, typer.Option("--json", help="print the JSON output contract on stdout")] = False,
        list_: Annotated[bool, typer.Option("--list", help="list the bundled incidents")] = False,
        out: Annotated[Path | None, typer.Option("--out", help="write JSON, Markdown, HTML, Parquet reports here")] = None,
        width: Annotated[int | None, typer.Option("--width", help="report width (default: terminal; 200 when piped)")] = None,
    ) -> None:
        """Replay a bundled incident (default: an XID 79 that cascades into NCCL timeouts) and print the report."""
        _done(_run.run_demo(**locals()))
