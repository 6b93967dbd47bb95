"""Prometheus metrics of the watch loop (prometheus-client, injected registry).

Every source feeds the same counters: lines read, duplicates dropped, late lines (and those
found late by VictoriaLogs reconciliation), source health (up / ever reached), events,
incidents reported (``kind`` = new|updated), errors by stage (tail, catchup, rebuild, files,
attribution, remediation, export), and the lag behind the server (seconds between now and the
point up to which the server was read losslessly). The endpoint binds 127.0.0.1 unless told otherwise.

For the operator's dashboard (``deploy/grafana/recovery-logs.json``) also: incidents by category
and severity, remediation decisions by action kind and decision, the breaker state, whether each
source answered on its last poll, and ``build_info`` (version, as a constant 1).
``METRIC_NAMES`` lists every exported sample name; a test checks the dashboard uses only these.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, start_http_server

from recovery_logs import __version__
from recovery_logs.errors import ConfigError

__all__ = ["METRIC_NAMES", "WatchMetrics", "parse_bind"]


def parse_bind(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` -> (host, port); ``[::1]:9310`` for IPv6."""
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep:
        host, port = "", t
    host = host.strip("[]") or default_host
    try:
        n = int(port)
    except ValueError as exc:
        raise ConfigError("bind address must be HOST:PORT", value=text) from exc
    if not 0 <= n <= 65535:
        raise ConfigError("bind port out of range", value=text)
    return host, n


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
        self.source_up = Gauge("recovery_logs_source_up",
                               "1 while the last read of the source succeeded, 0 while it fails", ["source"], registry=r)
        self.source_reached = Gauge("recovery_logs_watch_source_reached",
                                    "1 once the source answered at all since start", ["source"], registry=r)
        self.late_found = Counter("recovery_logs_watch_late_lines_found",
                                  "Lines found by bucket-count reconciliation after the live read passed their time",
                                  registry=r)
        self.reconcile_rereads = Counter("recovery_logs_watch_reconcile_rereads",
                                         "Time buckets read again because the server's count changed", registry=r)
        self.incidents_by = Counter("recovery_logs_incidents_reported", "Incidents reported by category and severity",
                                    ["category", "severity", "kind"], registry=r)
        self.actions = Counter("recovery_logs_remediation_actions", "Remediation decisions by action kind and decision",
                               ["kind", "decision"], registry=r)
        self.breaker = Gauge("recovery_logs_breaker_tripped", "1 while the node-drain circuit breaker is tripped",
                             registry=r)
        self.build = Info("recovery_logs_build", "recovery-logs build information", registry=r)
        self.build.info({"version": __version__})
        self._server: Any = None

    def incident_reported(self, kind: str, inc: Any) -> None:
        self.incidents_by.labels(category=inc.category, severity=inc.severity, kind=kind).inc()

    def remediation(self, decisions: Any, breaker: dict[str, Any]) -> None:
        for d in decisions:
            self.actions.labels(kind=d.kind, decision=d.decision).inc()
        self.breaker.set(1 if breaker.get("tripped") else 0)

    def sources(self, watcher: Any) -> None:
        """Source health after one watch step."""
        if getattr(watcher, "vl", None) is not None:
            self.source_up.labels(source="victorialogs").set(0 if watcher.vl.last_error else 1)
        if getattr(watcher, "files", None) is not None:
            n = watcher.stats.get("errors_files", 0)
            self.source_up.labels(source="files").set(0 if n > getattr(self, "_file_errors", 0) else 1)
            self._file_errors = n

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


METRIC_NAMES = frozenset({
    "recovery_logs_watch_lines_read_total", "recovery_logs_watch_duplicates_dropped_total",
    "recovery_logs_watch_late_lines_total", "recovery_logs_watch_events_total", "recovery_logs_watch_incidents_total",
    "recovery_logs_watch_errors_total", "recovery_logs_watch_lag_seconds", "recovery_logs_incidents_reported_total",
    "recovery_logs_remediation_actions_total", "recovery_logs_breaker_tripped", "recovery_logs_source_up",
    "recovery_logs_build_info",
})
"""Sample names the endpoint exports (counters carry prometheus-client's ``_total`` suffix)."""
