"""What `recovery-logs replay` and `recovery-logs demo` do, as plain functions without typer.

``commands/replay.py`` declares the two commands for typer (options, help) and calls these; the CLI
also calls them directly for a plain command line (``cli._direct``, issue 16: typer turns every
parameter into a Pydantic validator on each start, ~0.1 s before a replay of the demo begins).
Each function takes the commands' parameters as typer passes them (same names, same defaults) and
returns the exit code.

``REPLAY_OPTIONS`` / ``DEMO_OPTIONS`` name each option of the two commands, its parameter and how
its value is read, for the direct dispatch (``commands._direct``); a test checks them against the
typer commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_DEMO = "xid79_nccl_cascade"

# option -> (parameter, kind); kinds as read by commands._direct: "str", "int", "path", "strs"
# (repeatable), "on"/"off" (a flag that sets True/False)
REPLAY_OPTIONS: dict[str, tuple[str, str]] = {
    "--format": ("fmt", "str"), "--json": ("as_json", "on"), "--out": ("out", "path"), "--host": ("host", "str"),
    "--job": ("job", "str"), "--year": ("year", "int"), "--boot-time": ("boot_time", "str"),
    "--rules-dir": ("rules_dir", "path"), "--config": ("config", "path"), "--line-format": ("line_format", "str"),
    "--time-format": ("time_format", "str"), "--source": ("source", "str"), "--query": ("query", "str"),
    "--pushdown": ("pushdown", "on"), "--no-pushdown": ("pushdown", "off"),
    "--pushdown-progress": ("pushdown_progress", "on"), "--select": ("select", "str"),
    "--explain": ("explain", "on"), "--start": ("start", "str"), "--end": ("end", "str"),
    "--width": ("width", "int"), "--since": ("since", "str"), "--until": ("until", "str"),
    "--nodes": ("nodes", "str"), "--progress": ("progress", "on"), "--no-progress": ("progress", "off"),
    "--workers": ("workers", "int"), "--ray-address": ("ray_address", "str"),
    "--by-allocation": ("by_allocation", "on"), "--vl-user": ("vl_user", "str"),
    "--vl-password-file": ("vl_password_file", "str"), "--vl-password-env": ("vl_password_env", "str"),
    "--vl-token-file": ("vl_token_file", "str"), "--vl-token-env": ("vl_token_env", "str"),
    "--vl-ca": ("vl_ca", "str"), "--vl-insecure": ("vl_insecure", "on"), "--vl-account": ("vl_account", "str"),
    "--vl-project": ("vl_project", "str"), "--extra-filter": ("extra_filter", "strs"),
    "--line-scores": ("line_scores", "on"), "--no-line-scores": ("line_scores", "off"),
    "--accounting": ("accounting", "str"),
}
DEMO_OPTIONS: dict[str, tuple[str, str]] = {
    "--json": ("as_json", "on"), "--list": ("list_", "on"), "--out": ("out", "path"), "--width": ("width", "int"),
}


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


def _partial_input_code(res) -> int:
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
        return InputError.exit_code
    return 0


def run_replay(paths: list[Path] | None = None, fmt: str = "auto", as_json: bool = False, out: Path | None = None,
               host: str | None = None, job: str | None = None, year: int | None = None,
               boot_time: str | None = None, rules_dir: Path | None = None, config: Path | None = None,
               line_format: str | None = None, time_format: str | None = None, source: str | None = None,
               query: str = "*", pushdown: bool = True, pushdown_progress: bool = False, select: str = "local",
               explain: bool = False, start: str | None = None, end: str | None = None, width: int | None = None,
               since: str | None = None, until: str | None = None, nodes: str | None = None,
               progress: bool | None = None, workers: int | None = None, ray_address: str | None = None,
               by_allocation: bool = False, vl_user: str | None = None, vl_password_file: str | None = None,
               vl_password_env: str | None = None, vl_token_file: str | None = None,
               vl_token_env: str | None = None, vl_ca: str | None = None, vl_insecure: bool = False,
               vl_account: str | None = None, vl_project: str | None = None, extra_filter: list[str] | None = None,
               line_scores: bool | None = None, accounting: str | None = None) -> int:
    """``recovery-logs replay``: the exit code (0, or ``InputError``'s when some input was unreadable)."""
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
            from typer import echo

            from recovery_logs.detectors.rulepack import load_packs
            from recovery_logs.pipeline.vl_replay import plan_pushdown

            plan = plan_pushdown(load_packs(cfg.rules_dir), query, progress=pushdown_progress)
            lines = plan.explain() if pushdown and not cfg.line_scores else [f"fetch: {query}"]
            if pushdown and not cfg.line_scores and select == "local":
                lines = [f"export (time slices): {plan.count} | fields <row fields>",
                         "selected, counted per (host, job, window) and progress lines summarised here "
                         "(the literals of: " + (plan.fetch or "*")[:200] + " ...)"]
            echo("\n".join([f"# {conn.url}  {start} .. {end}", *lines]))
            return 0
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
    return _partial_input_code(res)


def run_demo(name: str = DEFAULT_DEMO, as_json: bool = False, list_: bool = False, out: Path | None = None,
             width: int | None = None) -> int:
    """``recovery-logs demo``: the exit code."""
    from recovery_logs.analysis.truth import load_truth
    from recovery_logs.api import bundled_incident, bundled_incident_names, bundled_read_options
    from recovery_logs.errors import ConfigError
    from recovery_logs.pipeline.replay import ReplayOptions, replay

    names = bundled_incident_names()
    if list_:
        from typer import echo

        for n in names:
            truth = load_truth(bundled_incident(n)) or {}
            echo(f"{n:24s} {truth.get('fault_kind')}  culprit={truth.get('culprit_node')}")
        return 0
    if name not in names:
        raise ConfigError("unknown bundled incident", name=name, known=names)
    res = replay([str(bundled_incident(name))],
                 ReplayOptions(read=bundled_read_options(name), out_dir=out))
    _emit(res, as_json, width)
    return 0
