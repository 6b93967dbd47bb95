"""Against the real Slurm 22.05 test cluster: the loop closed through accounting.

``watch`` on the nodes' kernel logs and the job's own output (files), ``--slurm`` with the
accounting poller (squeue/sacct --json), the remediator acting through the real
scontrol. Kernel logs never name the job; accounting does. Each test drives the watcher's
steps itself (the audit DB is used from one thread) and prints the timings it measured.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from recovery_logs.analysis.resume import resume_records
from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.watch import Watcher, WatchOptions
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.sources.accounting import AccountingPoller
from recovery_logs.sources.slurm import SubprocessRunner, expand_hostlist

pytestmark = pytest.mark.slurm
PCI = {0: "0000:1b:00", 1: "0000:43:00", 2: "0000:52:00", 3: "0000:61:00"}
# the job writes a progress line every second, the same shape torchtitan/HF loops print
JOB = ('i=0; while true; do echo "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) step $i | loss 2.$((RANDOM % 90 + 10)) '
       '(1.00 s/step)"; i=$((i+1)); sleep 1; done')


def _stamp(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def xid_line(node: str, pci: str = "0000:cb:00", code: int = 79) -> str:
    # the driver's own format (open-gpu-kernel-modules nvrm; shared/reference XID facts)
    return (f"{_stamp()} {node} kernel: NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3, "
            "GPU has fallen off the bus.\n")


class Loop:
    """One watcher + remediator + accounting poller over files in ``tmp``."""

    def __init__(self, tmp: Path, runner, mode: str = "autonomous", policy: Path | None = None,
                 squeue_s: float = 2.0, sacct_s: float = 10.0, timeout_s: float = 5.0) -> None:
        self.logs = tmp / "logs"
        for d in ("nodes", "jobs"):
            (self.logs / d).mkdir(parents=True, exist_ok=True)
        self.state = tmp / "state"
        self.rem = Remediator.from_options(self.state, mode=mode, runner=runner, policy_file=policy)
        self.poller = AccountingPoller(runner, squeue_interval_s=squeue_s, sacct_interval_s=sacct_s,
                                       timeout_s=timeout_s)
        opts = WatchOptions(sources=(f"file:{self.logs}/nodes/*/*.log", f"file:{self.logs}/nodes/*/*.jsonl",
                                     f"file:{self.logs}/jobs/*.out"),
                            state_dir=tmp / "watch", refresh_s=0.3, lateness_s=0.0,
                            config=EngineConfig(lateness_s=0.0, detectors=("hangs", "stragglers")))
        self.reported: list = []
        self.watcher = Watcher(opts, on_incidents=self._handle, accounting=self.poller,
                               observers=[self.rem.observe_progress])
        self.watcher.open()

    def _handle(self, incs) -> None:
        self.reported.extend(incs)
        self.rem.handle(incs)

    def out(self, job_dir_name: str = "slurm-%j.out") -> str:
        return str(self.logs / "jobs" / job_dir_name)

    def kern(self, node: str, text: str) -> None:
        p = self.logs / "nodes" / node / "kern.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as fh:
            fh.write(text)

    def until(self, what: str, pred, timeout: float = 60.0, show=None) -> float:
        """Step the watcher until ``pred()``; on timeout the error carries ``show()`` (what was seen)."""
        t0 = time.monotonic()
        while True:
            self.watcher.step()
            if pred():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                seen = f"; seen: {show()}" if show is not None else ""
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
            time.sleep(0.3)

    def action_summary(self) -> list[tuple]:
        return [(a["incident_id"], a["kind"], a["target"], a["status"], a["reason"]) for a in self.actions()]

    def actions(self, kind: str | None = None) -> list[dict]:
        return [a for a in self.rem.actions() if kind is None or a["kind"] == kind]

    def close(self) -> None:
        self.watcher.close()
        self.rem.close()


def _submit(cluster, loop: Loop, *args: str, wrap: str = JOB) -> str:
    return cluster.run("sbatch", "--parsable", "-o", loop.out(), *args, "--wrap", wrap).stdout.strip().split(";")[0]


def test_kernel_log_only_autonomous_requeue_and_time_to_resume(cluster, tmp_path: Path, recording, run_cli,
                                                               monkeypatch):
    runner = recording(cluster.runner())
    loop = Loop(tmp_path, runner)
    job = _submit(cluster, loop, "-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    bad = nodes[1]
    loop.until("first progress lines and the allocation", lambda: loop.poller.frame.filter(
        loop.poller.frame["job_id"] == job).height == 2 and (Path(loop.out().replace("%j", job))).stat().st_size > 0)
    t_fault = time.time()
    loop.kern(bad, xid_line(bad))                 # the kernel line names no job
    t_detect = loop.until("the incident with its job", lambda: any(i.job_id == job for i in loop.reported), 30)
    inc = next(i for i in loop.reported if i.job_id == job)
    assert inc.node == bad and inc.category == "xid" and inc.jobs == (job,)
    assert any(e.rule_id == "accounting.job" and f"job {job}" in e.message for e in inc.evidence)
    assert inc.attempts[0]["restart_count"] == 0 and inc.attempts[0]["gpus"] == 4
    # this incident's own actions: the requeue's "DUE TO JOB REQUEUE" line can re-form the incident under a
    # new id whose actions are denied (see the ledger check below), which must not hide these two
    loop.until("drain and requeue done", lambda: [(a["kind"], a["status"]) for a in loop.actions()
                                                  if a["incident_id"] == inc.id]
               == [("drain_node", "done"), ("requeue_job", "done")], 60, show=loop.action_summary)
    node = cluster.node(bad)
    assert "DRAIN" in node["State"] and node["Reason"].startswith(f"recovery-logs:{inc.id}")
    assert bad in expand_hostlist(cluster.job(job)["ExcNodeList"])
    t_running = loop.until("job running again off the bad node", lambda: cluster.job(job).get("JobState") == "RUNNING"
                           and cluster.job(job).get("Restarts") == "1", 60)
    assert bad not in expand_hostlist(cluster.job(job)["NodeList"])
    t_progress = loop.until("progress after the restart recorded",
                            lambda: loop.rem.audit.count("progress") >= 1, 60)
    assert [c[1] for c in runner.mutating()] == ["update", "requeuehold", "update", "release"]
    loop.close()
    # the ledger through the CLI (sacct for resumed_at), every stage present and in order
    rc, out, err = run_cli("slurm", "ledger", "--json", "--state-dir", str(loop.state), slurm_conf=cluster.conf)
    assert rc == 0, err
    recs = [r for r in json.loads(out)["records"] if r["job_id"] == job]
    # Slurm writes "*** JOB N ... CANCELLED ... DUE TO JOB REQUEUE ***" into the job output; without a
    # timestamp of its own it borrows the previous line's, which can be before the XID, so the incident
    # may be re-formed under a new id: its actions are then denied (cooldown per node / job attempt)
    done = [r for r in recs if r["action_status"] == "done"]
    assert len(done) == 1 and all(r["action_status"] in ("denied", None) for r in recs if r not in done), recs
    r = done[0]
    stages = ["fault_at", "detected_at", "proposed_at", "executed_at", "verified_at", "resumed_at",
              "progress_resumed_at"]
    assert all(r[s] for s in stages), r
    ns = [datetime.fromisoformat(r[s].replace("Z", "+00:00")).timestamp() for s in stages]
    assert ns == sorted(ns), r
    assert r["action"] == "requeue_job" and r["action_status"] == "done" and r["lost_until"] == "progress_resumed"
    assert r["gpus"] == 4 and r["gpu_hours_lost"] == pytest.approx(4 * r["fault_to_progress_s"] / 3600, rel=1e-3)
    print(f"\n[timing] fault->detected {r['detect_s']} s, detected->proposed {r['propose_s']} s, proposed->executed "
          f"{r['execute_s']} s, executed->verified {r['verify_s']} s, verified->running {r['resume_s']} s, "
          f"running->progress {r['progress_s']} s, fault->progress {r['fault_to_progress_s']} s; "
          f"GPU-h lost {r['gpu_hours_lost']}; wall: detect {t_detect:.1f} s, running {t_running:.1f} s, "
          f"progress {t_progress:.1f} s after the requeue (fault written at {_stamp(t_fault)})")
    # replay of the same logs: with the sacct --json dump captured here the incident names the job,
    # without it it does not, and says so
    dump = tmp_path / "sacct.json"
    dump.write_text(cluster.run("sacct", "--json", "-D", "-j", job).stdout)
    if os.environ.get("RECOVERY_LOGS_CAPTURE_DIR"):
        cap = Path(os.environ["RECOVERY_LOGS_CAPTURE_DIR"])
        cap.mkdir(parents=True, exist_ok=True)
        shutil.copy(dump, cap / "sacct_requeue.json")
        shutil.copytree(loop.logs / "nodes", cap / "nodes", dirs_exist_ok=True)
    kern = [str(loop.logs / "nodes")]
    cfg = EngineConfig(detectors=())
    with_acc = replay(kern, ReplayOptions(config=cfg, accounting=str(dump))).incidents
    without = replay(kern, ReplayOptions(config=cfg)).incidents
    x = next(i for i in with_acc if i.category == "xid")
    assert x.job_id == job and x.node == bad and any(a.kind == "requeue_job" and a.target == job for a in x.actions)
    y = next(i for i in without if i.category == "xid")
    assert y.job_id is None and not any(a.kind == "requeue_job" for a in y.actions)
    assert any(e.rule_id == "accounting.none" for e in y.evidence)


def test_shared_node_two_jobs_gpu_aware_requeue(cluster, tmp_path: Path, recording):
    runner = recording(cluster.runner())
    loop = Loop(tmp_path, runner)
    a = _submit(cluster, loop, "-w", "gpu-n03", "--gpus=2", "--requeue")
    b = _submit(cluster, loop, "-w", "gpu-n03", "--gpus=2", "--requeue")
    cluster.wait_running(a)
    cluster.wait_running(b)
    idx = {}
    def mine():
        f = loop.poller.frame
        return f.filter((f["node"] == "gpu-n03") & f["job_id"].is_in([a, b]))

    loop.until("both allocations with GPU indices", lambda: mine().get_column("gpu_index").drop_nulls().len() == 2)
    for row in mine().iter_rows(named=True):
        idx[row["job_id"]] = row["gpu_index"]
    assert sorted(len(v) for v in idx.values()) == [2, 2] and not set(idx[a]) & set(idx[b])
    # the NVML agent's inventory of gpu-n03 (what `nvml-agent --to stdout` prints), then an XID that
    # names only the PCI bus id of one of job b's GPUs
    inv = loop.logs / "nodes" / "gpu-n03" / "nvml.jsonl"
    inv.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"_time": _stamp(), "_msg": f"NVML gpu={g} uuid=GPU-test-000{g} pci={p}.0 inventory name=\"NVIDIA H100 "
             f"80GB HBM3\" serial=\"165000000{g}\" link_count=18 form_factor=sxm driver=570.86.15 cuda=12.8 mig=disabled",
             "host": "gpu-n03", "unit": "nvml", "gpu": str(g), "uuid": f"GPU-test-000{g}", "pci": f"{p}.0"}
            for g, p in PCI.items()]
    inv.write_text("".join(json.dumps(r) + "\n" for r in rows))
    failed_gpu = idx[b][0]
    loop.until("inventory known", lambda: len(loop.watcher.engine.inventory.agent) == 4)
    loop.kern("gpu-n03", xid_line("gpu-n03", PCI[failed_gpu]))
    loop.until("the incident", lambda: any(i.category == "xid" for i in loop.reported), 30)
    inc = next(i for i in loop.reported if i.category == "xid")
    assert (inc.gpu, inc.gpu_uuid, inc.job_id, inc.jobs) == (failed_gpu, f"GPU-test-000{failed_gpu}", b, (b,)), \
        inc.evidence[-1].message
    loop.until("requeue done", lambda: any(x["kind"] == "requeue_job" and x["status"] == "done"
                                           for x in loop.actions()), 60)
    assert [(x["kind"], x["target"]) for x in loop.actions() if x["kind"] == "requeue_job"] == [("requeue_job", b)]
    assert cluster.job(a)["Restarts"] == "0" and cluster.job(a)["JobState"] == "RUNNING"
    assert cluster.job(b)["Restarts"] == "1"
    loop.close()


def test_monitor_mode_proposes_the_requeue_and_changes_nothing(cluster, tmp_path: Path, recording):
    runner = recording(cluster.runner())
    loop = Loop(tmp_path, runner, mode="monitor")
    job = _submit(cluster, loop, "-N", "2", "--gpus-per-node=2", "--requeue")
    nodes = cluster.wait_running(job)
    loop.until("allocation", lambda: loop.poller.frame.filter(loop.poller.frame["job_id"] == job).height == 2)
    before = (cluster.job(job)["Restarts"], cluster.node(nodes[0])["State"])
    loop.kern(nodes[0], xid_line(nodes[0]))
    loop.until("proposals recorded", lambda: len(loop.actions()) >= 2, 30)
    assert sorted((x["kind"], x["target"], x["status"]) for x in loop.actions()) == [
        ("drain_node", nodes[0], "record_only"), ("requeue_job", job, "record_only")]
    props = [r.payload for r in loop.rem.audit.records("proposal")]
    assert {"kind": "requeue_job", "target": job, "exclude": [nodes[0]]}.items() <= \
        next(p for p in props if p["kind"] == "requeue_job").items()
    assert runner.mutating() == []
    assert (cluster.job(job)["Restarts"], cluster.node(nodes[0])["State"]) == before
    assert loop.rem.audit.verify() > 0
    loop.close()


def _hanging_bin(tmp: Path, real: str) -> tuple[Path, Path]:
    """sacct and squeue wrappers that sleep past any timeout while ``hang`` exists."""
    d, flag = tmp / "bin", tmp / "hang"
    d.mkdir()
    for name in ("sacct", "squeue"):
        p = d / name
        p.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then sleep 30; fi\nexec {shutil.which(name, path=real)} \"$@\"\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    flag.write_text("")
    return d, flag


def test_hanging_sacct_is_a_source_health_incident_never_an_action(cluster, tmp_path: Path, recording):
    path = os.environ.get("PATH", "/usr/bin:/bin")
    bindir, flag = _hanging_bin(tmp_path, path)
    runner = recording(SubprocessRunner(cluster.conf, env={**os.environ, "PATH": f"{bindir}:{path}"}))
    loop = Loop(tmp_path, runner, squeue_s=1.0, sacct_s=3.0, timeout_s=1.0)
    job = _submit(cluster, loop, "--gpus=2", "--requeue")
    node = cluster.wait_running(job)[0]
    loop.until("both sources blind", lambda: len(loop.poller.blind()) == 2, 30)
    loop.until("a few failed polls", lambda: loop.poller.health["squeue"].failures >= 3, 30)
    health = [i for i in loop.reported if i.category == "source_health"]
    assert {i.root_rule for i in health} == {"source.sacct", "source.squeue"}
    assert all([a.kind for a in i.actions] == ["none"] and i.status == "open" for i in health)
    assert runner.mutating() == [] and loop.actions("requeue_job") == [] and loop.actions("cancel_job") == []
    assert cluster.job(job)["JobState"] == "RUNNING" and cluster.job(job)["Restarts"] == "0"
    flag.unlink()                                 # Slurm answers again: the next poll catches up
    loop.until("caught up", lambda: not loop.poller.blind() and loop.poller.frame.filter(
        loop.poller.frame["job_id"] == job).height == 1, 30)
    cleared = {i.root_rule: i.status for i in loop.watcher.incidents if i.category == "source_health"}
    assert cleared == {"source.sacct": "cleared", "source.squeue": "cleared"}
    loop.kern(node, xid_line(node))               # a real fault after the outage is acted on normally
    loop.until("requeue done", lambda: any(x["kind"] == "requeue_job" and x["status"] == "done"
                                           for x in loop.actions()), 60)
    decisions = [r.payload for r in loop.rem.audit.records("proposal")]
    assert not [d for d in decisions if d["kind"] != "none" and d.get("target") is None]
    loop.close()


def _ports_free(base: int) -> bool:
    import socket

    for off in (6, 17, 19, 101, 102, 103, 104):
        with socket.socket() as sk:
            if sk.connect_ex(("127.0.0.1", base + off)) == 0:
                return False
    return True


SCRIPTS = Path(__file__).resolve().parents[3] / "scripts" / "slurm"


def _start_cluster(state: Path, base: int) -> str:
    env = {**os.environ, "SLURM_TEST_PORT_BASE": str(base)}
    p = subprocess.run([str(SCRIPTS / "start-test-cluster.sh"), "--fresh", str(state)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip().splitlines()[-1]


def test_job_id_reuse_after_wiping_accounting_never_skips_or_repeats(slurm_cluster, tmp_path: Path, recording):
    """A second cluster on its own state dir, wiped (slurmctld state and the accounting DB) between
    two jobs, so both get the same job id: the second job's fault is acted on (no cooldown or
    idempotency key inherited from the first) and the first incident, seen again, acts on nothing."""
    import tempfile

    state = Path(tempfile.mkdtemp(prefix="rl-reuse-", dir="/tmp"))
    base = next(b for b in range(24000, 30000, 200) if _ports_free(b) and _ports_free(b + 100))
    policy = tmp_path / "policy.toml"
    policy.write_text("cooldown_s = 900\n[breaker]\ncluster_nodes = 4\nmax_drain_fraction = 0.5\n")
    try:
        conf = _start_cluster(state, base)
        env = {**os.environ, "SLURM_CONF": conf}

        def sbatch(node: str, loop: Loop) -> str:
            return subprocess.run(["sbatch", "--parsable", "-o", loop.out(), "-w", node, "--gpus=2", "--requeue",
                                   "--wrap", JOB], env=env, capture_output=True, text=True, check=True,
                                  timeout=60).stdout.strip()

        def restarts(job: str) -> str:
            out = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True,
                                 timeout=60).stdout
            return next((kv.split("=", 1)[1] for kv in out.split() if kv.startswith("Restarts=")), "?")

        runner = recording(SubprocessRunner(conf))
        loop = Loop(tmp_path, runner, policy=policy)
        first = sbatch("gpu-n01", loop)
        loop.until("first allocation", lambda: loop.poller.frame.filter(loop.poller.frame["job_id"] == first).height)
        loop.kern("gpu-n01", xid_line("gpu-n01"))
        loop.until("first requeue done", lambda: any(x["kind"] == "requeue_job" and x["status"] == "done"
                                                     for x in loop.actions()), 60)
        old = next(i for i in loop.reported if i.category == "xid" and i.job_id == first)
        loop.close()
        subprocess.run([str(SCRIPTS / "stop-test-cluster.sh"), str(state)], capture_output=True, timeout=120)
        conf = _start_cluster(state, base)       # --fresh: slurmctld state and the accounting DB wiped
        env["SLURM_CONF"] = conf
        runner = recording(SubprocessRunner(conf))
        loop = Loop(tmp_path, runner, policy=policy)       # same audit DB, same watch cursor
        second = sbatch("gpu-n02", loop)
        assert second == first                      # the id repeats
        loop.until("second allocation", lambda: loop.poller.frame.filter(
            loop.poller.frame["job_id"] == second).height)
        loop.kern("gpu-n02", xid_line("gpu-n02"))
        loop.until("second incident", lambda: any(i.category == "xid" and i.job_id == second for i in loop.reported))
        new = next(i for i in loop.reported if i.category == "xid" and i.job_id == second)
        assert new.id != old.id and new.attempts[0]["attempt"] != old.attempts[0]["attempt"]
        loop.until("second requeue done", lambda: sum(x["kind"] == "requeue_job" and x["status"] == "done"
                                                      for x in loop.actions()) == 2, 60)
        assert restarts(second) == "1"
        n = len(runner.mutating())
        assert loop.rem.handle([old]) == [] and len(runner.mutating()) == n     # the old incident: nothing again
        rq = [x for x in loop.actions("requeue_job")]
        assert [x["job_attempt"] for x in rq] == [old.attempts[0]["attempt"], new.attempts[0]["attempt"]]
        assert len(resume_records(loop.rem.audit, None, time.time_ns())) >= 2
        loop.close()
    finally:
        subprocess.run([str(SCRIPTS / "stop-test-cluster.sh"), "--purge", str(state)], capture_output=True,
                       timeout=120)
