"""`recovery-logs replay` and `recovery-logs demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DEMO = "xid79_nccl_cascade"


def _read_options(fmt: str, host: str | None, job: str | None, year: int | None, boot_time: str | None,
                  line_formats: tuple = ()):
    from recovery_logs.errors import ConfigError
    from recovery_logs.sources.files import ReadOptions
    from recovery_logs.timeutil import iso_to_ns

    formats = {"auto", "vl-jsonl", "journald", "syslog", "dmesg", "job", "parquet"}
    if fmt not in formats:
        raise ConfigError("unknown --format", value=fmt, known=sorted(formats))
    boot_ns = None
    if boot_time:
        try:
            boot_ns = iso_to_ns(boot_time)
        except ValueError as exc:
            raise ConfigError("--boot-time must be RFC3339", value=boot_time) from exc
    return ReadOptions(fmt=fmt, host=host, job=job, year=year, boot_time_ns=boot_ns, line_formats=line_formats)


def _emit(res, as_json: bool, width: int | None) -> None:
    if as_json:
        sys.stdout.write(res.to_json() + "\n")
        return
    from rich.console import Console

    from recovery_logs.report.terminal import terminal_report

    Console(width=width, soft_wrap=False).print(terminal_report(res))
    if res.outputs:
        Console(stderr=True, width=width).print(
            "wrote " + ", ".join(f"{k}: {v}" for k, v in sorted(res.outputs.items())), style="dim")


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
        start: Annotated[str | None, typer.Option("--start", help="RFC3339 start (with --source)")] = None,
        end: Annotated[str | None, typer.Option("--end", help="RFC3339 end (with --source)")] = None,
        width: Annotated[int | None, typer.Option("--width", help="terminal width for the report")] = None,
        accounting: Annotated[str | None, typer.Option(
            "--accounting", help="Slurm accounting to join node faults to jobs: a saved `sacct --json` or "
            "`sacct -P` dump, or `sacct` to ask the live sacct for the replayed range")] = None,
    ) -> None:
        """Replay historical logs: ranked incidents with evidence and recorded (never executed) actions."""
        from recovery_logs.config import load_config
        from recovery_logs.errors import ConfigError
        from recovery_logs.pipeline.replay import ReplayOptions, replay
        from recovery_logs.sources.lineformat import line_formats_from_cli

        cfg = load_config(config)
        if rules_dir is not None:
            if not rules_dir.is_dir():
                raise ConfigError("--rules-dir is not a directory", path=str(rules_dir))
            cfg = cfg.with_(rules_dir=rules_dir)
        line_formats = line_formats_from_cli(line_format, time_format, config, fmt)
        opts = _read_options(fmt, host, job, year, boot_time, line_formats)
        batches = None
        if source:
            if paths:
                raise ConfigError("give either PATHs or --source, not both")
            if not (start and end):
                raise ConfigError("--source needs --start and --end")
            from recovery_logs.sources.history import history_batches
            from recovery_logs.sources.victorialogs import parse_url
            from recovery_logs.timeutil import iso_to_ns

            batches = history_batches(parse_url(source), query, iso_to_ns(start), iso_to_ns(end), opts)
        elif not paths:
            raise ConfigError("nothing to replay: give log PATHs or --source victorialogs://HOST:PORT")
        if accounting is not None and accounting != "sacct" and not Path(accounting).is_file():
            raise ConfigError("--accounting is neither a file nor `sacct`", path=accounting)
        res = replay([str(p) for p in paths or []],
                     ReplayOptions(read=opts, config=cfg, out_dir=out, accounting=accounting), batches=batches)
        _emit(res, as_json, width)

    @app.command("demo")
    def demo_cmd(
        name: Annotated[str, typer.Argument(help="bundled incident to replay")] = DEFAULT_DEMO,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        list_: Annotated[bool, typer.Option("--list", help="list the bundled incidents")] = False,
        out: Annotated[Path | None, typer.Option("--out")] = None,
        width: Annotated[int | None, typer.Option("--width")] = None,
    ) -> None:
        """Replay a bundled incident (default: an XID 79 that cascades into NCCL timeouts) and print the report."""
        from recovery_logs.analysis.truth import load_truth
        from recovery_logs.api import bundled_incident, bundled_incident_names, bundled_read_options
        from recovery_logs.errors import ConfigError
        from recovery_logs.pipeline.replay import ReplayOptions, replay

        names = bundled_incident_names()
        if list_:
            for n in names:
                truth = load_truth(bundled_incident(n)) or {}
                typer.echo(f"{n:24s} {truth.get('fault_kind')}  culprit={truth.get('culprit_node')}")
            return
        if name not in names:
            raise ConfigError("unknown bundled incident", name=name, known=names)
        res = replay([str(bundled_incident(name))],
                     ReplayOptions(read=bundled_read_options(name), out_dir=out))
        _emit(res, as_json, width)
