"""`recovery-logs nvml-agent`: GPU health events from NVML, to VictoriaLogs or stdout."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from recovery_logs.errors import ConfigError

if TYPE_CHECKING:      # polars only in annotations here: importing every command module (the CLI's help) stays light
    import polars as pl


def _victorialogs_sink(to: str) -> Callable[[pl.DataFrame], None]:
    """Sink that inserts VictoriaLogs rows through the VictoriaLogs client (imported lazily)."""
    try:
        from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url
    except ImportError as exc:
        raise ConfigError("nvml-agent: --to victorialogs:// needs recovery_logs.sources.victorialogs, "
                          "which is not available in this build", to=to) from exc
    from recovery_logs.sources.nvml import NvmlAgent

    client = VictoriaLogsClient(parse_url(to))

    def sink(events: pl.DataFrame) -> None:
        client.insert_jsonline(NvmlAgent.vl_rows(events))

    return sink


def _stdout_sink(events: pl.DataFrame) -> None:
    from recovery_logs.sources.nvml import NvmlAgent

    for row in NvmlAgent.vl_rows(events):
        typer.echo(json.dumps(row, sort_keys=True))


def register(app: typer.Typer) -> None:
    @app.command("nvml-agent")
    def nvml_agent(
        to: Annotated[str, typer.Option("--to", help="victorialogs://HOST:PORT or stdout")] = "stdout",
        interval: Annotated[str, typer.Option("--interval", help="poll interval, e.g. 10s, 1m")] = "10s",
        once: Annotated[bool, typer.Option("--once", help="poll once, drain queued XID events, exit")] = False,
        host: Annotated[str | None, typer.Option("--host", help="node name (default: short hostname)")] = None,
        for_s: Annotated[float | None, typer.Option("--for", help="stop after about SECONDS (whole poll cycles)")] = None,
        record: Annotated[str | None, typer.Option("--record", help="also write every NVML call and answer to "
                                                   "FILE (JSON lines; ReplayNvml replays it in tests)")] = None,
    ) -> None:
        """Read GPU health from NVML (XID events, ECC, row remap, throttling, NVLink, ...) and emit
        change-only events. Exit 9 when this host has no NVML (no driver or no GPU)."""
        from recovery_logs.sources.nvml import NvmlAgent, load_nvml
        from recovery_logs.timeutil import parse_duration_s

        try:
            interval_s = parse_duration_s(interval)
        except ValueError as exc:
            raise ConfigError("nvml-agent: --interval is not a duration", interval=interval) from exc
        if interval_s <= 0:
            raise ConfigError("nvml-agent: --interval must be positive", interval=interval)
        sink: Callable[[pl.DataFrame], None]
        if to == "stdout":
            sink = _stdout_sink
        elif to.startswith("victorialogs://"):
            sink = _victorialogs_sink(to)
        else:
            raise ConfigError("nvml-agent: --to must be stdout or victorialogs://HOST:PORT", to=to)
        node = host or socket.gethostname().split(".")[0]
        if for_s is not None and for_s <= 0:
            raise ConfigError("nvml-agent: --for must be positive", for_s=for_s)
        cycles = 1 if once else (max(1, round(for_s / interval_s)) if for_s is not None else None)
        nvml = load_nvml()
        fh = None
        if record:
            from recovery_logs.sources.nvml_record import RecordingNvml

            try:
                fh = open(record, "w", encoding="utf-8")  # noqa: SIM115 - closed below, after the agent
            except OSError as exc:
                raise ConfigError(f"nvml-agent: cannot write --record: {exc}", path=record) from exc
            nvml = RecordingNvml(nvml, fh, host=node, note="recovery-logs nvml-agent --record")
        try:
            with NvmlAgent(nvml, host=node) as agent:
                agent.run(sink, interval_s, stop_after=cycles)
        finally:
            if fh is not None:
                fh.close()
