"""`recovery-logs watch`: follow VictoriaLogs or local files and report incidents as they form."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer


def _seconds(name: str, text: str) -> float:
    from recovery_logs.errors import ConfigError
    from recovery_logs.timeutil import parse_duration_s

    try:
        val = parse_duration_s(text)
    except ValueError as exc:
        raise ConfigError(f"{name} is not a duration (like 1s, 500ms, 2m)", value=text) from exc
    if val < 0:
        raise ConfigError(f"{name} must not be negative", value=text)
    return val


def _remediator(slurm: bool, mode: str | None, state_dir: Path | None, policy: Path | None = None) -> Any:
    """The Slurm remediator for ``--slurm``. Mode: ``--mode``, else the policy file's, else monitor."""
    from recovery_logs.errors import ConfigError

    if not slurm:
        if mode is not None:
            raise ConfigError("--mode needs --slurm", value=mode)
        if policy is not None:
            raise ConfigError("--policy needs --slurm", value=str(policy))
        return None
    if state_dir is None:
        raise ConfigError("--slurm needs a state dir (audit trail and policy state live there)")
    try:
        from recovery_logs.remediation.remediator import Remediator
    except ImportError as exc:
        raise ConfigError(f"--slurm needs recovery_logs.remediation.remediator, which is not available: {exc}") from exc
    return Remediator.from_options(state_dir, mode=mode, policy_file=policy)  # type: ignore[arg-type]


def _live_table(watcher: Any) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    s = watcher.summary()
    t = Table(title="recovery-logs watch", expand=True)
    for col in ("id", "sev", "category", "node", "job", "count", "last seen", "cause"):
        t.add_column(col, overflow="fold")
    for inc in watcher.incidents[:20]:
        from recovery_logs.timeutil import ns_to_iso

        t.add_row(inc.id, inc.severity, inc.category, inc.node or "-", inc.job_id or "-", str(inc.count),
                  (ns_to_iso(inc.last_seen) or "")[11:19], inc.cause)
    lag = watcher.vl.lag_s() if watcher.vl is not None else None
    status = (f"events {s.get('events', 0)}  duplicates {s.get('vl_duplicates', 0)}  late {s.get('late', 0)}  "
              f"incidents {s.get('incidents', 0)}" + (f"  lag {lag:.1f}s" if lag is not None else ""))
    parts: list[Any] = [t, Text(status, style="dim")]
    if watcher.last_error:
        parts.append(Text(f"last error: {watcher.last_error}", style="yellow"))
    return Group(*parts)


def register(app: typer.Typer) -> None:
    @app.command("watch")
    def watch_cmd(
        source: Annotated[list[str], typer.Option("--source", help="victorialogs://HOST:PORT or file:PATH[,file:PATH...] (globs)")],
        query: Annotated[str | None, typer.Option("--query", help="LogsQL filter AND-ed with the rule prefilter (e.g. a stream filter)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="one JSON line per new or updated incident")] = False,
        for_s: Annotated[float | None, typer.Option("--for", help="stop after SECONDS")] = None,
        state_dir: Annotated[Path | None, typer.Option("--state-dir", help="cursor, reported incidents, audit")] = None,
        refresh: Annotated[str, typer.Option("--refresh", help="poll / tail refresh interval")] = "1s",
        lateness: Annotated[str, typer.Option("--lateness", help="allowed event lateness (catch-up window)")] = "30s",
        catchup: Annotated[str, typer.Option("--catchup", help="interval of the catch-up /query")] = "5s",
        context: Annotated[str, typer.Option("--context", help="history re-read on restart for attribution")] = "10m",
        since: Annotated[str | None, typer.Option("--since", help="first start: read back this far (default: --lateness)")] = None,
        metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="serve Prometheus metrics on 127.0.0.1:N")] = None,
        rules_dir: Annotated[Path | None, typer.Option("--rules-dir", help="rule packs (default: bundled)")] = None,
        export_incidents: Annotated[bool, typer.Option("--export-incidents", help="insert incidents into VictoriaLogs as log lines")] = False,
        no_prefilter: Annotated[bool, typer.Option("--no-prefilter", help="read every line, not only rule candidates")] = False,
        slurm: Annotated[bool, typer.Option("--slurm", help="hand incidents to the Slurm remediator")] = False,
        mode: Annotated[str | None, typer.Option("--mode", help="monitor|approve|autonomous (with --slurm)")] = None,
        policy: Annotated[Path | None, typer.Option("--policy", help="policy TOML: budget, breaker, cooldown, promotion")] = None,
        accounting: Annotated[bool, typer.Option("--accounting/--no-accounting", help="with --slurm: poll squeue/sacct and join node faults to the jobs running there")] = True,
        squeue_interval: Annotated[str, typer.Option("--squeue-interval", help="at most one squeue --json per interval")] = "10s",
        sacct_interval: Annotated[str, typer.Option("--sacct-interval", help="at most one sacct --json per interval")] = "60s",
        tail_offset: Annotated[str, typer.Option("--tail-offset", hidden=True)] = "1s",
        max_findings: Annotated[int, typer.Option("--max-findings", hidden=True,
                                                  help="file sources: compact floods above this many findings")] = 200_000,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log source errors and retries to stderr")] = False,
        line_format: Annotated[str | None, typer.Option(
            "--line-format", help="site line format for file: sources, e.g. '<Date> <Time> <Node> <Content>'")] = None,
        time_format: Annotated[str | None, typer.Option(
            "--time-format", help="strptime format of the line format's time fields, or epoch|epoch_ms|iso")] = None,
        formats_file: Annotated[Path | None, typer.Option(
            "--line-formats", help="TOML file with line_formats tables (e.g. the engine config)")] = None,
    ) -> None:
        """Follow live logs and report incidents within seconds (tail + catch-up, no loss)."""
        from recovery_logs.config import EngineConfig
        from recovery_logs.errors import ConfigError
        from recovery_logs.pipeline.watch import Watcher, WatchOptions

        if slurm and state_dir is None:   # the audit trail must live somewhere durable
            from recovery_logs.audit import default_state_dir

            state_dir = default_state_dir()
        if export_incidents and not any("://" in s for s in source):
            raise ConfigError("--export-incidents needs a victorialogs:// source")
        refresh_s = _seconds("--refresh", refresh)
        if refresh_s <= 0:
            raise ConfigError("--refresh must be > 0", value=refresh)
        lateness_s = _seconds("--lateness", lateness)
        from recovery_logs.sources.lineformat import line_formats_from_cli
        from recovery_logs.sources.read_common import ReadOptions

        line_formats = line_formats_from_cli(line_format, time_format, formats_file)
        opts = WatchOptions(
            sources=tuple(source), query=query, state_dir=state_dir, refresh_s=refresh_s, lateness_s=lateness_s,
            catchup_s=_seconds("--catchup", catchup), context_s=_seconds("--context", context), duration_s=for_s,
            since_s=_seconds("--since", since) if since else None,
            rules_dir=rules_dir, export_incidents=export_incidents, prefilter=not no_prefilter,
            tail_offset=tail_offset, config=EngineConfig(lateness_s=lateness_s, rules_dir=rules_dir),
            read=ReadOptions(line_formats=line_formats) if line_formats else None, lock=False,
            max_findings=max_findings)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("watch: %(message)s"))
        wlog = logging.getLogger("recovery_logs.watch")
        wlog.addHandler(handler)
        wlog.setLevel(logging.INFO if verbose else logging.WARNING)
        metrics = None
        from recovery_logs.statelock import StateLock

        # one watcher per state dir, before anything (the remediator's audit records) is written
        lock = StateLock(state_dir, "watch").acquire() if state_dir is not None else None
        try:
            rem = _remediator(slurm, mode, state_dir, policy)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        try:
            if metrics_port is not None:
                from recovery_logs.pipeline.metrics import WatchMetrics

                metrics = WatchMetrics()
                metrics.serve(metrics_port)

            def emit_json(kind: str, inc: Any) -> None:
                sys.stdout.write(json.dumps(inc.to_dict(), ensure_ascii=False) + "\n")
                sys.stdout.flush()

            poller = None
            if rem is not None and accounting:
                from recovery_logs.sources.accounting import AccountingPoller

                poller = AccountingPoller(rem.executor.runner, squeue_interval_s=_seconds("--squeue-interval",
                                                                                         squeue_interval),
                                          sacct_interval_s=_seconds("--sacct-interval", sacct_interval))
            watcher = Watcher(opts, emit=emit_json if as_json else None,
                              on_incidents=rem.handle if rem is not None else None,
                              on_tick=rem.process_queue if rem is not None else None, metrics=metrics,
                              accounting=poller, observers=[rem.observe_progress] if rem is not None else [])
            watcher.open()
            if as_json:
                watcher.run()
            else:
                from rich.live import Live

                with Live(_live_table(watcher), refresh_per_second=2, transient=False) as live:
                    watcher.run(after_step=lambda w: live.update(_live_table(w)))
        finally:
            wlog.removeHandler(handler)
            if metrics is not None:
                metrics.close()
            if rem is not None and hasattr(rem, "close"):
                rem.close()
            if lock is not None:
                lock.release()
