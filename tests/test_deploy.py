"""The deploy kit works with this version: the sample policy validates, the systemd units' command
lines parse with the real CLI, the dashboard queries only metrics the engine exports."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import typer

from recovery_logs.cli import app
from recovery_logs.pipeline.metrics import METRIC_NAMES, WatchMetrics
from recovery_logs.remediation.policy import load_policy
from recovery_logs.web.auth import Users

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_sample_policy_validates_and_sets_every_key():
    cfg = load_policy(DEPLOY / "policy.sample.toml")
    assert (cfg.mode, cfg.approvals_required, cfg.proposal_ttl_s, cfg.cluster_nodes) == ("approve", 2, 3600, 256)
    assert cfg.promotion_min_precision == 0.9 and cfg.breaker_max_drain_fraction == 0.1
    raw = tomllib.loads((DEPLOY / "policy.sample.toml").read_text())
    flat = {k for k, v in raw.items() if not isinstance(v, dict)} | {
        f"{k}.{s}" for k, v in raw.items() if isinstance(v, dict) for s in v}
    d = cfg.to_dict()
    known = {k for k, v in d.items() if not isinstance(v, dict)} | {
        f"{k}.{s}" for k, v in d.items() if isinstance(v, dict) for s in v}
    assert known <= flat, f"the sample does not show {sorted(known - flat)}"


def test_sample_users_file_loads():
    assert len(Users.load(DEPLOY / "users.sample.toml")) == 1


def _exec_start(unit: Path) -> list[str]:
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line.split("=", 1)[1])
    assert argv[0].endswith("/recovery-logs")
    return argv[1:]


def test_systemd_units_parse_with_the_cli_and_are_hardened():
    root = typer.main.get_command(app)
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert [u.name for u in units] == ["recovery-logs-nvml-agent.service", "recovery-logs-serve.service",
                                       "recovery-logs-watch.service"]
    for unit in units:
        args = _exec_start(unit)
        cmd = root.commands[args[0]]
        ctx = cmd.make_context(args[0], args[1:])      # unknown options or bad values raise here
        assert ctx.params, unit.name
        text = unit.read_text()
        for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "CapabilityBoundingSet=",
                    "RestrictAddressFamilies=", "SystemCallFilter=@system-service"):
            assert key in text, f"{unit.name} lacks {key}"


def test_dashboard_queries_name_only_exported_metrics():
    m = WatchMetrics()
    m.incidents.labels(kind="new").inc()
    m.errors.labels(stage="tail").inc()
    m.incidents_by.labels(category="xid", severity="critical", kind="new").inc()
    m.actions.labels(kind="drain_node", decision="approved").inc()
    m.source_up.labels(source="files").set(1)
    m.breaker.set(0)
    exported = {s.name for fam in m.registry.collect() for s in fam.samples}
    assert METRIC_NAMES <= exported
    dash = json.loads((DEPLOY / "grafana" / "recovery-logs.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\brecovery_logs_[a-z_]+\b", e)}
    assert used and used <= exported, f"dashboard names metrics the engine does not export: {used - exported}"
    for need in ("recovery_logs_remediation_actions_total", "recovery_logs_breaker_tripped",
                 "recovery_logs_incidents_reported_total", "recovery_logs_source_up", "recovery_logs_build_info"):
        assert need in used, need
    by_labels = " ".join(exprs)
    assert "by (kind, decision)" in by_labels and "by (category)" in by_labels and "by (severity)" in by_labels
