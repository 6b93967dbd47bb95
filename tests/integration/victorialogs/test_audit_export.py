"""Audit records exported as log lines land in VictoriaLogs beside the logs (fixture-faithful server)."""

from __future__ import annotations

from recovery_logs.audit import AuditLog
from recovery_logs.cli import main
from recovery_logs.sources.victorialogs import VictoriaLogsClient


def test_audit_export_to_victorialogs(empty_vls, tmp_path, capsys):
    state = tmp_path / "state"
    log = AuditLog.open(state)
    log.append("proposal", {"kind": "drain_node", "target": "gpu-n02", "reason": "XID 79"}, incident_id="inc-1",
               action_id="act-1")
    log.append("decision", {"kind": "drain_node", "target": "gpu-n02", "decision": "record_only"},
               incident_id="inc-1", action_id="act-1")
    log.close()
    url = "victorialogs://" + empty_vls.base.split("://", 1)[1]
    assert main(["audit", "export", "--to", url, "--state-dir", str(state)]) == 0
    assert "inserted 2 audit records" in capsys.readouterr().out
    rows = list(VictoriaLogsClient(empty_vls.base).query('unit:="recovery-logs-audit"'))
    assert sorted(r["audit_kind"] for r in rows) == ["decision", "proposal"]
    assert {r["host"] for r in rows} == {"gpu-n02"}
    assert all(r["incident_id"] == "inc-1" and r["_msg"].startswith("recovery-logs audit #") for r in rows)
    # only newer records with --after
    assert main(["audit", "export", "--to", url, "--state-dir", str(state), "--after", "1"]) == 0
    assert "inserted 1 audit records" in capsys.readouterr().out


def test_audit_export_options_conflict(tmp_path, capsys):
    AuditLog.open(tmp_path).close()
    code = main(["audit", "export", "--to", "victorialogs://127.0.0.1:9", "--out", str(tmp_path / "x"),
                 "--state-dir", str(tmp_path)])
    assert code == 2
    assert "not both" in capsys.readouterr().err
