"""The terminal console: every part visible in a 22-row terminal, `approve ID` / `reject ID`
typed at the prompt work, an incident whose drain Slurm confirmed shows as closed."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from recovery_logs.records import ActionProposal, Evidence, Incident
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.report.console import FOOTER, Snapshot, render, run_console
from recovery_logs.textsafe import out_console

T0 = 1_795_000_000


class NoSlurm:
    def run(self, argv, timeout_s):
        raise AssertionError(f"unexpected Slurm command {argv}")


def _inc(n: int, node: str, cause: str = "XID 79 GPU has fallen off the bus") -> Incident:
    iid = f"inc-{n:012x}"
    return Incident(id=iid, category="xid", cause=cause, severity="critical" if n % 2 else "high", node=node, gpu=1,
                    job_id=str(4100 + n), xid=79, confidence=0.9, first_seen=(T0 + n) * 10**9,
                    last_seen=(T0 + n + 5) * 10**9, detected_at=(T0 + n + 2) * 10**9, count=2, nodes=(node,),
                    evidence=(Evidence((T0 + n) * 10**9, node, cause, "xid.79"),), candidates=(),
                    actions=(ActionProposal("drain_node", node, "record_only", cause, iid),
                             ActionProposal("requeue_job", str(4100 + n), "record_only", cause, iid, (node,))))


def _state(tmp_path: Path, n: int = 12) -> Path:
    t = [float(T0)]
    rem = Remediator.from_options(tmp_path, mode="approve", runner=NoSlurm(), clock=lambda: t[0], cluster_nodes=64)
    for k in range(1, n + 1):
        rem.handle([_inc(k, f"gpu-n{k:02d}", cause=f"XID 79 GPU has fallen off the bus [/dev/nvidia{k % 8}]")])
        t[0] += 5
    rem.close()
    return tmp_path


def test_compact_layout_fits_22_rows_and_shows_every_part(tmp_path: Path):
    snap = Snapshot.load(_state(tmp_path), now=T0 + 100)
    text = render(snap, width=100, height=22)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 20, text                      # two rows stay free for the prompt
    assert all(len(ln) <= 100 for ln in lines)
    assert "mode approve" in lines[0] and "breaker closed" in lines[1]
    joined = "\n".join(lines)
    for part in ("Incidents (top", "Awaiting approval", "Recent audit", FOOTER):
        assert part in joined, part
    assert "[/dev/nvidia" in render(snap, width=180, height=22)    # literal, not eaten as markup
    full = render(snap, width=100)
    assert len(full.splitlines()) > 40                 # the full layout would not fit


def test_prompt_takes_approve_and_reject_words(tmp_path: Path, monkeypatch):
    sd = _state(tmp_path, n=2)
    pending = [p.action_id for p in Snapshot.load(sd).pending]
    r, w = os.pipe()
    os.write(w, f"reject {pending[0]} node in maintenance\napprove nonsense-id\nbogus\nquit\n".encode())
    os.close(w)
    monkeypatch.setattr("sys.stdin", os.fdopen(r))
    seen = []

    def act(what, action_id, reason=""):
        rem = Remediator.open_existing(sd, runner=NoSlurm())
        try:
            d = rem.reject(action_id, by="carol", reason=reason) if what == "reject" else rem.approve(action_id, by="carol")
        finally:
            rem.close()
        seen.append((what, action_id, reason))
        return f"{d.action_id}: {d.decision}"

    buf = io.StringIO()
    run_console(sd, 100, 0.05, act, out=out_console(100, file=buf))
    out = buf.getvalue()
    assert seen == [("reject", pending[0], "node in maintenance")]
    assert "error: approve: no action 'nonsense-id' is awaiting approval" in out
    assert "unknown command 'bogus'" in out and FOOTER in out


def test_incident_is_closed_once_its_drain_is_done(tmp_path: Path):
    sd = _state(tmp_path, n=1)
    rem = Remediator.open_existing(sd, runner=NoSlurm())
    act = next(a for a in rem.actions() if a["kind"] == "drain_node")
    with rem.audit.transaction():   # what the executor records once Slurm confirmed the drain
        rem._finish(act, 1, "done", "drained", {"state": "idle", "flags": ["DRAIN"]})
    rem.close()
    snap = Snapshot.load(sd)
    v = snap.incidents[0]
    assert (v.status, v.closed_by) == ("closed", "drain_node gpu-n01 done")
    assert json.loads(json.dumps(v.__dict__))["status"] == "closed"
