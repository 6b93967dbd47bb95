"""Prometheus metrics of the watch loop (prometheus-client, injected registry).

Every source feeds the same counters: lines read, duplicates dropped, late lines (and those
found late by VictoriaLogs reconciliation), source health (up / ever reached), events,
incidents reported (``kind`` = new|updated), errors by stage (tail, catchup, rebuild, files,
attribution, remediation, export), and the lag behind the server (seconds between now and the
point up to which the server was read losslessly). The endpoint binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from recovery_logs.errors import ConfigError

__all__ = ["WatchMetrics"]


class WatchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.lines_read = Counter("recovery_logs_watch_lines_read", "Log lines read from the sources", registry=r)
        self.duplicates = Counter("recovery_logs_watch_duplicates_dropped",
                                  "Rows dropped as duplicates (tail replay, catch-up overlap)", registry=r)
        self.late = Counter("recovery_logs_watch_late_lines",
                            "Events older than the watermark when they arrived (still attributed)", registry=r)
        self.events = Counter("recovery_logs_watch_events", "Events fed to the engine", registry=r)
        self.incidents = Counter("recovery_logs_watch_incidents", "Incidents reported", ["kind"], registry=r)
        self.errors = Counter("recovery_logs_watch_errors", "Errors by stage", ["stage"], registry=r)
        self.lag = Gauge("recovery_logs_watch_lag_seconds",
                         "Now minus the point up to which VictoriaLogs was read losslessly", registry=r)
        self.source_up = Gauge("recovery_logs_watch_source_up",
                               "1 while the last read of the source succeeded, 0 while it fails", ["source"], registry=r)
        self.source_reached = Gauge("recovery_logs_watch_source_reached",
                                    "1 once the source answered at all since start", ["source"], registry=r)
        self.late_found = Counter("recovery_logs_watch_late_lines_found",
                                  "Lines found by bucket-count reconciliation after the live read passed their time",
                                  registry=r)
        self.reconcile_rereads = Counter("recovery_logs_watch_reconcile_rereads",
                                         "Time buckets read again because the server's count changed", registry=r)
        self._server: Any = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint in a daemon thread; returns the bound port."""
        try:
            got = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics: {exc}", port=port, addr=addr) from exc
        if isinstance(got, tuple):   # prometheus-client >= 0.18 returns (server, thread)
            self._server = got[0]
            return int(got[0].server_address[1])
        return port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
