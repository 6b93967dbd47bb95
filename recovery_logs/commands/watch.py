"""`recovery-logs watch`: follow VictoriaLogs or local files and report incidents as they form."""

from __future__ import annotations

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
    rem = Remediator.from_options(state_dir, mode=mode, policy_file=policy)  # type: ignore[arg-type]
    if rem.config.mode != "monitor" and not rem.cluster_size():   # said now, not found after approving
        sys.stderr.write(f"watch: warning: {rem.config.mode} mode without a cluster size: set breaker.cluster_nodes "
                         "in the policy file or make `sinfo` reachable (SLURM_CONF); until then drains cannot be "
                         "approved or run\n")
        sys.stderr.flush()
    return rem




def vl_connection(source: list[str] | str | None, user: str | None, password_file: str | None,
                  password_env: str | None, token_file: str | None, token_env: str | None, ca: str | None,
                  insecure: bool, account: str | None, project: str | None, extra_filters: list[str] | None) -> Any:
    """The VictoriaLogs connection named by --source and the --vl-* options (None without one)."""
    from recovery_logs.errors import ConfigError
    from recovery_logs.sources.victorialogs import VLConnection

    specs = [source] if isinstance(source, str) else list(source or [])
    urls = [s.strip() for s in specs if "://" in s and not s.strip().startswith("file:")]
    given = any(v for v in (user, password_file, password_env, token_file, token_env, ca, insecure, account, project,
                            extra_filters))
    if not urls:
        if given:
            raise ConfigError("--vl-* options and --extra-filter need a victorialogs:// source")
        return None
    return VLConnection.from_options(urls[0], user=user, password_file=password_file, password_env=password_env,
                                     token_file=token_file, token_env=token_env, ca_file=ca, insecure=insecure,
                                     account_id=account, project_id=project, extra_filters=extra_filters or ())


def explain_text(watcher: Any) -> str:
    """The LogsQL the watch sends (``--explain``), one request per block; no credentials."""
    o = watcher.options
    conn = watcher.client.conn if watcher.client is not None else None
    out = [f"source: {watcher.vl_url}  live: {o.live}"]
    if conn is not None:
        auth = "bearer token" if conn.token else ("basic auth as " + conn.user) if conn.user else "none"
        tenant = f"AccountID={conn.account_id or 0} ProjectID={conn.project_id or 0}"
        out.append(f"auth: {auth}   tenant: {tenant}   TLS verify: {conn.verify}")
        if conn.extra_filters:
            out.append(f"extra_filters (server-side argument): {conn.extra_filters}")
    fields = ", ".join(watcher.fields or [])
    split = getattr(watcher, "split", None)
    if o.live == "poll" and split is not None:
        from recovery_logs.pipeline.watch import compose_query  # commands/ imports lazily

        scope = compose_query(o.query, None)
        out.append(f"\n# live: POST /select/logsql/query every {o.refresh_s:g}s, start=<frontier>+1ns "
                   f"end=now-{o.poll_offset_s:g}s: the scope's rows, selected here (Aho-Corasick over "
                   f"{len(split.needed or ())} rule/enrichment literals), counted per (host, job, window), "
                   f"progress lines summarised ({', '.join(p.rule_id for p in split.progress) or 'none'})")
        out.append(f"{scope} | fields {fields}")
        for t in o.tiers:
            out.append(f"\n# reconcile late lines: every {t.every_s:g}s over the last {t.span_s:g}s, "
                       f"{t.step_s}s buckets")
            out.append(f"{scope} | stats by (_time:{t.step_s}s) count() as n")
        out.append("# ... a bucket whose count changed: its 2 s buckets counted, the changed ones read again")
        out.append("\n# restart context: the same export in time slices of ~100 k rows (/hits sizes them); memory is bounded "
                   "by compaction in place (no rotation re-read)")
        out.append(f"{scope} | fields {fields}")
        out.append(f"\n# the LogsQL prefilter (--live tail, or local selection off): {len(watcher.query)} characters")
        out.append(watcher.query)
        return "\n".join(out)
    if o.live == "poll":
        out.append(f"\n# live: POST /select/logsql/query every {o.refresh_s:g}s, start=<frontier>+1ns "
                   f"end=now-{o.poll_offset_s:g}s")
        out.append(f"{watcher.query} | fields {fields}")
        for t in o.tiers:
            out.append(f"\n# reconcile late lines: every {t.every_s:g}s over the last {t.span_s:g}s, "
                       f"{t.step_s}s buckets")
            out.append(f"{watcher.query} | stats by (_time:{t.step_s}s) count() as n")
        out.append("# ... and a bucket whose count changed is read again with the live query")
    else:
        out.append(f"\n# live: POST /select/logsql/tail (refresh {o.refresh_s:g}s) and catch-up /query "
                   f"every {o.catchup_s:g}s over [complete-{o.lateness_s:g}s, now-offset]")
        out.append(f"{watcher.query} | fields {fields}")
    out.append("\n# restart / engine rebuild: pages in _time order")
    out.append(f"{watcher.query} | fields {fields} | sort by (_time) | limit 50000")
    out.append(f"\n# {len(watcher.query)} characters, sent as form bodies (no URL length limit)")
    return "\n".join(out)


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
        metrics_bind: Annotated[str | None, typer.Option("--metrics-bind", help="serve Prometheus metrics on HOST:PORT (e.g. 127.0.0.1:9310)")] = None,
        rules_dir: Annotated[Path | None, typer.Option("--rules-dir", help="rule packs (default: bundled)")] = None,
        export_incidents: Annotated[bool, typer.Option("--export-incidents", help="insert incidents into VictoriaLogs as log lines")] = False,
        no_prefilter: Annotated[bool, typer.Option("--no-prefilter", help="read every line, not only rule candidates")] = False,
        slurm: Annotated[bool, typer.Option("--slurm", help="hand incidents to the Slurm remediator")] = False,
        mode: Annotated[str | None, typer.Option("--mode", help="monitor|approve|autonomous (with --slurm)")] = None,
        policy: Annotated[Path | None, typer.Option("--policy", help="policy TOML: budget, breaker, cooldown, promotion")] = None,
        tail_offset: Annotated[str, typer.Option("--tail-offset", hidden=True, help="VictoriaLogs tail offset (testing)")] = "1s",
        accounting: Annotated[bool, typer.Option("--accounting/--no-accounting", help="with --slurm: poll squeue/sacct and join node faults to the jobs running there")] = True,
        squeue_interval: Annotated[str, typer.Option("--squeue-interval", help="at most one squeue --json per interval")] = "10s",
        sacct_interval: Annotated[str, typer.Option("--sacct-interval", help="at most one sacct --json per interval")] = "60s",
        max_findings: Annotated[int, typer.Option("--max-findings", hidden=True,
                                                  help="file sources: compact floods above this many findings")] = 200_000,
        live_mode: Annotated[str, typer.Option("--live", help="poll (default: /query with a time cursor; never blocks a server's graceful shutdown) | tail")] = "poll",
        horizon: Annotated[str, typer.Option("--horizon", help="poll: find lines this late behind their _time (bucket-count reconciliation)")] = "6h",
        explain: Annotated[bool, typer.Option("--explain", help="print the LogsQL sent to VictoriaLogs and exit")] = False,
        vl_user: Annotated[str | None, typer.Option("--vl-user", help="VictoriaLogs basic-auth user")] = None,
        vl_password_file: Annotated[str | None, typer.Option("--vl-password-file", help="file holding the basic-auth password")] = None,
        vl_password_env: Annotated[str | None, typer.Option("--vl-password-env", help="environment variable holding the password")] = None,
        vl_token_file: Annotated[str | None, typer.Option("--vl-token-file", help="file holding a bearer token")] = None,
        vl_token_env: Annotated[str | None, typer.Option("--vl-token-env", help="environment variable holding a bearer token")] = None,
        vl_ca: Annotated[str | None, typer.Option("--vl-ca", help="CA bundle for https")] = None,
        vl_insecure: Annotated[bool, typer.Option("--vl-insecure", help="do not verify the server's TLS certificate")] = False,
        vl_account: Annotated[str | None, typer.Option("--vl-account", help="tenant AccountID")] = None,
        vl_project: Annotated[str | None, typer.Option("--vl-project", help="tenant ProjectID")] = None,
        extra_filter: Annotated[list[str] | None, typer.Option("--extra-filter", help="LogsQL filter sent as the server's extra_filters (scope this watcher to a partition); repeatable")] = None,
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
        from recovery_logs.pipeline.watch import Watcher, WatchOptions, lock_scope

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
        if live_mode not in ("poll", "tail"):
            raise ConfigError("--live must be poll or tail", value=live_mode)
        conn = vl_connection(source, vl_user, vl_password_file, vl_password_env, vl_token_file, vl_token_env, vl_ca,
                             vl_insecure, vl_account, vl_project, extra_filter)
        opts = WatchOptions(
            live=live_mode, horizon_s=_seconds("--horizon", horizon), connection=conn,
            unreachable_exit_s=None if for_s is not None else 300.0,
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

        # one watcher per state dir (per scope for VictoriaLogs-only watchers without --slurm), before
        # anything (the remediator's audit records) is written
        lock = StateLock(state_dir, lock_scope(opts, remediation=slurm)).acquire() if state_dir is not None else None
        try:
            rem = _remediator(slurm, mode, state_dir, policy)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        try:
            if metrics_port is not None and metrics_bind is not None:
                raise ConfigError("give --metrics-port or --metrics-bind, not both")
            if metrics_port is not None or metrics_bind is not None:
                from recovery_logs.pipeline.metrics import WatchMetrics, parse_bind

                m_host, m_port = parse_bind(metrics_bind) if metrics_bind else ("127.0.0.1", metrics_port or 0)
                metrics = WatchMetrics()
                metrics.serve(m_port, addr=m_host)

            from recovery_logs.report.terminal import incident_line
            from recovery_logs.textsafe import json_dumps

            def emit(kind: str, inc: Any) -> None:
                # one line per new/updated incident, written and flushed as it happens (journald, pipes)
                if metrics is not None:
                    metrics.incident_reported(kind, inc)
                sys.stdout.write((json_dumps(inc.to_dict()) if as_json else incident_line(kind, inc)) + "\n")
                sys.stdout.flush()

            handle = None
            if rem is not None:
                def handle(incs: Any) -> Any:
                    out = rem.handle(incs)
                    if metrics is not None:
                        metrics.remediation(out, rem.breaker())
                    return out
            poller = None
            if rem is not None and accounting:
                from recovery_logs.sources.accounting import AccountingPoller

                poller = AccountingPoller(rem.executor.runner, squeue_interval_s=_seconds("--squeue-interval",
                                                                                         squeue_interval),
                                          sacct_interval_s=_seconds("--sacct-interval", sacct_interval))

            watcher = Watcher(opts, emit=emit, on_incidents=handle,
                              on_tick=rem.process_queue if rem is not None else None, metrics=metrics,
                              accounting=poller, observers=[rem.observe_progress] if rem is not None else [])
            if explain:
                if watcher.vl_url is None:
                    raise ConfigError("--explain needs a victorialogs:// source")
                watcher.prepare()
                typer.echo(explain_text(watcher))
                return
            watcher.open()
            watcher.run(after_step=metrics.sources if metrics is not None else None)
        finally:
            wlog.removeHandler(handler)
            if metrics is not None:
                metrics.close()
            if rem is not None and hasattr(rem, "close"):
                rem.close()
            if lock is not None:
                lock.release()
