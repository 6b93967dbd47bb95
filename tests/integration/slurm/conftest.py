"""A real Slurm 22.05 cluster for the remediation tests (one per session).

``scripts/slurm/start-test-cluster.sh --fresh /tmp/rl-slurm-XXXX`` starts munged, mariadbd,
slurmdbd, slurmctld and 4 slurmd (gpu-n01..04, 8 fake h100 each) on a free port base; the
session stops it and deletes the state dir at the end. Tests marked ``slurm`` get it through
the ``cluster`` fixture; every such test leaves the cluster clean (jobs cancelled, every
drained node resumed) for the next one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from recovery_logs.sources.slurm import SubprocessRunner, expand_hostlist, parse_scontrol

ROOT = Path(__file__).resolve().parents[3]
START = ROOT / "scripts" / "slurm" / "start-test-cluster.sh"
STOP = ROOT / "scripts" / "slurm" / "stop-test-cluster.sh"
NODES = ("gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04")


def _ports_free(base: int) -> bool:
    for off in (6, 17, 19, 101, 102, 103, 104):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", base + off)) == 0:
                return False
    return True


@dataclass
class Cluster:
    state: Path
    conf: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def runner(self) -> SubprocessRunner:
        return SubprocessRunner(self.conf)

    def submit(self, *args: str, wrap: str = "srun sleep 300") -> str:
        return self.run("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", wrap).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        return parse_scontrol(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def node(self, name: str) -> dict[str, str]:
        return parse_scontrol(self.run("scontrol", "show", "node", "-o", name).stdout)

    def wait(self, what: str, pred: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.2)

    def wait_running(self, job_id: str) -> list[str]:
        self.wait(f"job {job_id} RUNNING", lambda: self.job(job_id).get("JobState") == "RUNNING")
        return expand_hostlist(self.job(job_id)["NodeList"])

    def ctld_pid(self) -> int:
        return int((self.state / "run" / "slurmctld.pid").read_text().strip())

    def stop_ctld(self) -> None:
        pid = self.ctld_pid()
        os.kill(pid, 15)
        self.wait("slurmctld to exit", lambda: not Path(f"/proc/{pid}").exists()
                  or Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"), timeout=20)

    def start(self) -> None:
        subprocess.run([str(START), str(self.state)], env=self.env, capture_output=True, text=True, timeout=120,
                       check=True)

    def clean(self) -> None:
        """Restart any daemon a test stopped, cancel every job and resume every drained/down node."""
        if "is UP" not in self.run("scontrol", "ping", check=False).stdout:
            self.start()
        jobs = self.run("squeue", "-h", "-o", "%A").stdout.split()
        if jobs:
            self.run("scancel", *jobs, check=False)
            self.wait("jobs to end", lambda: not self.run(
                "squeue", "-h", "-t", "pending,running,completing,configuring,suspended", "-o", "%A").stdout.split(),
                timeout=30)
        for n in NODES:
            kv = self.node(n)
            if "DRAIN" in kv.get("State", "") or kv.get("State", "").startswith("DOWN"):
                self.run("scontrol", "update", f"NodeName={n}", "State=RESUME", check=False)
        self.wait("nodes idle", lambda: all(
            not any(f in self.node(n).get("State", "") for f in ("DRAIN", "DOWN", "COMPLETING")) for n in NODES))


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("the test Slurm cluster needs root")
    state = Path(tempfile.mkdtemp(prefix="rl-slurm-", dir="/tmp"))
    base = next((b for b in range(18000, 30000, 200) if _ports_free(b)), None)
    if base is None:
        pytest.skip("no free port range for the test cluster")
    env = {**os.environ, "SLURM_TEST_PORT_BASE": str(base)}
    t0 = time.monotonic()
    p = subprocess.run([str(START), "--fresh", str(state)], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        shutil.rmtree(state, ignore_errors=True)
        raise RuntimeError(f"start-test-cluster.sh failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    cluster = Cluster(state, p.stdout.strip().splitlines()[-1])
    print(f"\n[slurm] cluster up in {time.monotonic() - t0:.1f} s at {state} (port base {base})")
    yield cluster
    subprocess.run([str(STOP), "--purge", str(state)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def cluster(slurm_cluster: Cluster):
    slurm_cluster.clean()
    yield slurm_cluster
    slurm_cluster.clean()
