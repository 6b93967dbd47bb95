"""`recovery-logs replay` and `recovery-logs demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DEMO = "xid79_nccl_cascade"


def _read_options(fmt: str, host: str | None, job: str | None, year: int | None, boot_time: str | None,
                  line_formats: tuple = (), since: str | None = None, until: str | None = None,
                  nodes: str | None = None):
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
    rng: list[int | None] = []
    for flag, v in (("--since", since), ("--until", until)):
        try:
            rng.append(iso_to_ns(v) if v else None)
        except ValueError as exc:
            raise ConfigError(f"{flag} must be RFC3339", value=v) from exc
    node_set = frozenset(n.strip() for n in nodes.split(",") if n.strip()) if nodes else None
    return ReadOptions(fmt=fmt, host=host, job=job, year=year, boot_time_ns=boot_ns, line_formats=line_formats,
                       nodes=node_set, since_ns=rng[0], until_ns=rng[1])


def _emit(res, as_json: bool, width: int | None) -> None:
    if as_json:
        sys.stdout.write(res.to_json() + "\n")
        sys.stdout.flush()
        return
    from recovery_logs.report.terminal import terminal_report
    from recovery_logs.textsafe import out_console

    out_console(width).print(terminal_report(res))
    if res.outputs:
        out_console(width, stderr=True).print(
            "wrote " + ", ".join(f"{k}: {v}" for k, v in sorted(res.outputs.items())), style="dim")


def _partial_input_exit(res) -> None:
    """Some input could not be read (or only in part): the report stands, the exit code says so."""
    s = res.summary
    if s.get("unreadable") or s.get("truncated"):
        from rich.console import Console

        from recovery_logs.errors import InputError

        bad = res.quarantine.filter(res.quarantine["reason"].is_in(["unreadable", "truncated"]))
        names = ", ".join(sorted(set(bad["file"].to_list()))[:5])
        Console(stderr=True, highlight=False).print(
            f"warning: {s.get('unreadable', 0)} unreadable and {s.get('truncated', 0)} truncated input file(s), "
            f"reported in the quarantine: {names}", markup=False, soft_wrap=True)
        raise typer.Exit(code=InputError.exit_code)


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
        from recovery_logs.config import load_config
        from recovery_logs.errors import ConfigError
        from recovery_logs.pipeline.replay import ReplayOptions, replay
        from recovery_logs.sources.lineformat import line_formats_from_cli

        cfg = load_config(config)
        if rules_dir is not None:
            if not rules_dir.is_dir():
                raise ConfigError("--rules-dir is not a directory", path=str(rules_dir))
            cfg = cfg.with_(rules_dir=rules_dir)
        if line_scores is not None:
            cfg = cfg.with_(line_scores=line_scores)
        line_formats = line_formats_from_cli(line_format, time_format, config, fmt)
        opts = _read_options(fmt, host, job, year, boot_time, line_formats, since, until, nodes)
        from_source = False
        if source:
            if paths:
                raise ConfigError("give either PATHs or --source, not both")
            if not (start and end):
                raise ConfigError("--source needs --start and --end")
            from recovery_logs.commands.watch import vl_connection
            from recovery_logs.pipeline.vl_replay import replay_source
            from recovery_logs.sources.victorialogs import VictoriaLogsClient
            from recovery_logs.timeutil import iso_to_ns

            conn = vl_connection(source, vl_user, vl_password_file, vl_password_env, vl_token_file, vl_token_env,
                                 vl_ca, vl_insecure, vl_account, vl_project, extra_filter)
            if explain:
                from recovery_logs.detectors.rulepack import load_packs
                from recovery_logs.pipeline.vl_replay import plan_pushdown

                plan = plan_pushdown(load_packs(cfg.rules_dir), query, progress=pushdown_progress)
                lines = plan.explain() if pushdown and not cfg.line_scores else [f"fetch: {query}"]
                if pushdown and not cfg.line_scores and select == "local":
                    lines = [f"export (time slices): {plan.count} | fields <row fields>",
                             "selected, counted per (host, job, window) and progress lines summarised here "
                             "(the literals of: " + (plan.fetch or "*")[:200] + " ...)"]
                typer.echo("\n".join([f"# {conn.url}  {start} .. {end}", *lines]))
                return
            client = VictoriaLogsClient(conn, read_timeout=120.0)
            t0_ns, t1_ns = iso_to_ns(start), iso_to_ns(end)
            from_source = True
        elif not paths:
            raise ConfigError("nothing to replay: give log PATHs or --source victorialogs://HOST:PORT")
        if accounting is not None and accounting != "sacct" and not Path(accounting).is_file():
            raise ConfigError("--accounting is neither a file nor `sacct`", path=accounting)
        from recovery_logs.commands._progress import ProgressBar, input_size, wanted

        names = [str(p) for p in paths or []]
        on = wanted(progress)
        with ProgressBar(on, "replay", total=input_size(names) if on and names else None) as bar:
            ropts = ReplayOptions(read=opts, config=cfg, out_dir=out, progress=bar.stats, accounting=accounting)
            if by_allocation:
                if from_source or workers is not None or ray_address is not None:
                    raise ConfigError("--by-allocation reads files in this process: not with --source, --workers "
                                      "or --ray-address")
                from recovery_logs.pipeline.scale import replay_by_allocation

                res = replay_by_allocation(names, ropts)
            elif workers is not None or ray_address is not None:
                if from_source:
                    raise ConfigError("--workers/--ray-address read files; --source is read in one process")
                from recovery_logs.pipeline.scale import replay_sharded

                res = replay_sharded(names, ropts, workers=workers, address=ray_address)
            elif source:
                res = replay_source(client, query, t0_ns, t1_ns, ropts, pushdown=pushdown,
                                    progress=True if pushdown_progress else None, select=select)
            else:
                res = replay(names, ropts)
        _emit(res, as_json, width)
        _partial_input_exit(res)

    @app.command("demo")
    def demo_cmd(
        name: Annotated[str, typer.Argument(help="bundled incident to replay")] = DEFAULT_DEMO,
        as_json: Annotated[bool, typer.Option("--json", help="print the JSON output contract on stdout")] = False,
        list_: Annotated[bool, typer.Option("--list", help="list the bundled incidents")] = False,
        out: Annotated[Path | None, typer.Option("--out", help="write JSON, Markdown, HTML, Parquet reports here")] = None,
        width: Annotated[int | None, typer.Option("--width", help="report width (default: terminal; 200 when piped)")] = None,
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
