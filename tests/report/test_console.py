"""Console: golden render at a fixed width from a state dir built with a fake clock."""

from __future__ import annotations

import json
import os
from pathlib import Path

from recovery_logs.remediation.remediator import Remediator
from recovery_logs.report.console import Snapshot, render

GOLDEN = Path(__file__).parent / "golden" / "console_once_w100.txt"


class NoSlurm:
    """Approve mode never touches Slurm before an approval: any command is a test failure."""

    def run(self, argv, timeout_s):
        raise AssertionError(f"unexpected Slurm command {argv}")


def _state(tmp_path: Path, incident, clock) -> Path:
    rem = Remediator.from_options(tmp_path, mode="approve", runner=NoSlurm(), clock=clock, cluster_nodes=4)
    incs = [incident("inc-7f3a9c0d11e2", "gpu-n03", "4117"),
            incident("inc-19b2c4d5e6f7", "gpu-n01", "4120", kinds=("investigate",), severity="medium",
                     cause="NCCL watchdog timeout on rank 5", confidence=0.55),
            incident("inc-aa00bb11cc22", "gpu-n02", "4121", kinds=("drain",), cause="XID 48 double-bit ECC error",
                     confidence=0.8)]
    for inc in incs:
        rem.handle([inc])
        clock.advance(7)
    pending = rem.actions("awaiting_approval")
    rem.reject(pending[-1]["id"], by="alice", reason="node already in RMA")
    clock.advance(3)
    rem.close()
    return tmp_path


def test_console_golden_render(tmp_path: Path, incident, clock):
    sd = _state(tmp_path, incident, clock)
    text = render(Snapshot.load(sd, now=clock()), width=100)
    if os.environ.get("RL_UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
    assert all(len(line) <= 100 for line in text.splitlines())


def test_console_once_cli(tmp_path: Path, incident, clock, run_cli):
    sd = _state(tmp_path, incident, clock)
    rc, out, err = run_cli("console", "--once", "--width", "100", "--state-dir", str(sd))
    assert rc == 0, err
    snap = Snapshot.load(sd)
    assert [v.id for v in snap.incidents] == ["inc-7f3a9c0d11e2", "inc-aa00bb11cc22", "inc-19b2c4d5e6f7"]
    assert len(snap.pending) == 2
    for pv in snap.pending:
        assert pv.action_id in out
    assert "mode approve | budget 0/10 this hour" in out and max(len(x) for x in out.splitlines()) == 100
    rc, _, err = run_cli("console", "--once", "--state-dir", str(tmp_path / "none"))
    assert rc == 12 and "no audit database" in err


def test_approve_cli_applies_the_recorded_policy(tmp_path: Path, incident, clock, run_cli):
    """`approve` reopens the state dir with the watcher's policy: a spent budget still denies."""
    rem = Remediator.from_options(tmp_path, mode="approve", runner=NoSlurm(), clock=clock, cluster_nodes=4,
                                  budget_per_hour=0)
    d = rem.handle([incident("inc-budget0001", "gpu-n02", None, kinds=("drain",))])[0]
    rem.close()
    rc, out, err = run_cli("approve", d.action_id, "--state-dir", str(tmp_path))
    assert rc == 0, err
    assert f"{d.action_id}: denied/denied — action budget spent: 0/0" in out
    rc, out, err = run_cli("slurm", "status", "--json", "--state-dir", str(tmp_path))
    data = json.loads(out)
    assert data["actions"] == {"denied": 1} and data["mode"] == "approve" and data["budget_per_hour"] == 0
    reopened = Remediator.open_existing(tmp_path, runner=NoSlurm(), clock=clock)
    assert (reopened.config.budget_per_hour, reopened.config.cluster_nodes) == (0, 4)
    assert [r.kind for r in reopened.audit.records()][-1] == "session"


def test_interactive_console_rejects_from_the_prompt(tmp_path: Path, incident, clock, monkeypatch):
    import io

    from rich.console import Console

    from recovery_logs.report.console import run_console

    sd = _state(tmp_path, incident, clock)
    target = Snapshot.load(sd).pending[0].action_id
    r, w = os.pipe()
    os.write(w, f"x nonsense\nr {target}\nq\n".encode())
    os.close(w)
    monkeypatch.setattr("sys.stdin", os.fdopen(r))
    seen: list[tuple[str, str]] = []

    def act(what: str, action_id: str) -> str:
        rem = Remediator.open_existing(sd, mode="approve", runner=NoSlurm(), clock=clock)
        try:
            d = rem.reject(action_id, by="console") if what == "reject" else rem.approve(action_id, by="console")
        finally:
            rem.close()
        seen.append((what, action_id))
        return f"{d.action_id}: {d.decision}/{d.status}"

    buf = io.StringIO()
    run_console(sd, 100, 0.05, act, out=Console(file=buf, width=100, color_system=None))
    assert seen == [("reject", target)]
    assert "unknown command 'x nonsense'" in buf.getvalue() and f"{target}: rejected/rejected" in buf.getvalue()
    assert target not in [p.action_id for p in Snapshot.load(sd).pending]
