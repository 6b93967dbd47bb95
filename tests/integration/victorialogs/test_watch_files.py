"""`watch --source file:...`: the embedded default (no backend), through the CLI."""

from __future__ import annotations

import json
import os
import time

from recovery_logs.cli import main
from recovery_logs.pipeline.watch import Watcher, WatchOptions


def _syslog(host: str, msg: str, t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%b %d %H:%M:%S", time.gmtime(t)) + f" {host} kernel: {msg}\n"


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:86:00): 48, pid=999, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."


def test_watch_files_rotation_and_incidents(tmp_path):
    log = tmp_path / "gpu-n3.kern.log"
    log.write_text(_syslog("gpu-n3", "eth0: link up") + _syslog("gpu-n3", XID79))
    w = Watcher(WatchOptions(sources=(f"file:{tmp_path}/*.log",), refresh_s=0.05, state_dir=tmp_path / "st")).open()
    try:
        seen = []
        for _ in range(300):
            seen += [(k, i.node, i.xid) for k, i in w.step()]
            if seen:
                break
            time.sleep(0.05)
        assert ("new", "gpu-n3", 79) in seen
        # rotate (rename + new file), then a new fault on another host appears in the new file
        os.rename(log, tmp_path / "gpu-n3.kern.log.1")
        log.write_text(_syslog("gpu-n7", XID48))
        for _ in range(300):
            seen += [(k, i.node, i.xid) for k, i in w.step()]
            if any(n == "gpu-n7" for _, n, _ in seen):
                break
            time.sleep(0.05)
    finally:
        w.close()
    assert ("new", "gpu-n7", 48) in seen
    assert w.files.stats["rotations"] == 1


def test_cli_watch_json_and_restart_without_rereport(tmp_path, capsys):
    log = tmp_path / "kern.log"
    log.write_text(_syslog("gpu-n3", XID79))
    args = ["watch", "--source", f"file:{log}", "--json", "--for", "1.0", "--refresh", "100ms",
            "--state-dir", str(tmp_path / "state")]
    assert main(args) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [(o["node"], o["xid"], o["category"]) for o in out] == [("gpu-n3", 79, "xid")]
    assert {"id", "evidence", "candidates", "actions", "detected_at"} <= set(out[0])
    # restart: the old fault is not reported again; one that arrived while down is
    with log.open("a") as fh:
        fh.write(_syslog("gpu-n7", XID48))
    assert main(args) == 0
    out2 = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [(o["node"], o["xid"]) for o in out2] == [("gpu-n7", 48)]


def test_cli_watch_errors(tmp_path, capsys):
    assert main(["watch", "--source", "nope"]) == 2
    assert main(["watch", "--source", f"file:{tmp_path}/x", "--mode", "autonomous", "--for", "0"]) == 2
    assert main(["watch", "--source", f"file:{tmp_path}/x", "--export-incidents"]) == 2
    err = capsys.readouterr().err
    assert "--mode needs --slurm" in err and "victorialogs:// source" in err


def test_cli_watch_slurm_monitor_records_proposals(tmp_path, capsys):
    """--slurm --mode monitor: incidents reach the remediator, which records (never runs)."""
    import sqlite3

    log = tmp_path / "kern.log"
    log.write_text(_syslog("gpu-n3", XID79))
    state = tmp_path / "state"
    assert main(["watch", "--source", f"file:{log}", "--json", "--for", "1.0", "--refresh", "100ms",
                 "--state-dir", str(state), "--slurm", "--mode", "monitor"]) == 0
    # (without a Slurm controller here the accounting poller is blind: source_health incidents, never actions)
    inc = next(d for d in map(json.loads, capsys.readouterr().out.splitlines()) if d["category"] != "source_health")
    con = sqlite3.connect(state / "audit.db")
    rows = con.execute("SELECT kind, target, incident_id, decision FROM actions").fetchall()
    con.close()
    assert ("drain_node", "gpu-n3", inc["id"], "record_only") in rows
