"""Scripted (non-background) lines: the job's start-up and teardown, and the helpers fault
scenarios use to emit lines on the right host, in the right file, with the right clock.

A ``Script`` collects ``(t_ns, host, stream, rank, text)`` tuples. ``text`` is the message as the
VictoriaLogs ``_msg`` would hold it: for ``kern``/``slurmd``/``slurmctld`` without the syslog or
slurm prefix (the writer adds it), for ``job`` the whole line as the job printed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from recovery_logs.simulate import formats as fmt
from recovery_logs.simulate.cluster import Cluster
from recovery_logs.simulate.dialect import Dialect
from recovery_logs.timeutil import NS

NCCL_VERSION = "2.21.5"
WATCHDOG_MS = 600_000
COLLECTIVES_PER_ITER = 3


@dataclass
class Timeline:
    """Global iteration end times (ns) of the simulated training job."""

    it_end: np.ndarray           # int64, ascending
    it_dur_s: np.ndarray         # float64 wall seconds per iteration (what the job measures)
    base_dur_s: np.ndarray       # float64 seconds per iteration before any slowdown

    def iteration_at(self, t_ns: int) -> int:
        return int(np.searchsorted(self.it_end, t_ns, side="right"))

    def seq_at(self, t_ns: int) -> int:
        return 1000 + self.iteration_at(t_ns) * COLLECTIVES_PER_ITER

    def last_end_before(self, t_ns: int) -> int:
        k = self.iteration_at(t_ns)
        return int(self.it_end[k - 1]) if k > 0 else int(t_ns)


@dataclass
class Script:
    cluster: Cluster
    rng: np.random.Generator
    timeline: Timeline
    rows: list[tuple[int, str, str, int | None, str]] = field(default_factory=list)
    dialect: Dialect = field(default_factory=Dialect)

    # -- raw emitters (t is true time; the node's clock skew is applied here) --------------------
    def _t(self, t: int, node: int | None) -> int:
        return int(t) + (self.cluster.skew_ns[node] if node is not None else 0)

    def kern(self, t: int, node: int, msg: str) -> int:
        """A kernel message; a multi-line one becomes one syslog record per line, as printk emits it."""
        tt = self._t(t, node)
        for i, part in enumerate(msg.split("\n")):
            self.rows.append((tt + i * 1000, self.cluster.nodes[node], "kern", None, part))
        return tt

    def slurmd(self, t: int, node: int, msg: str) -> int:
        tt = self._t(t, node)
        self.rows.append((tt, self.cluster.nodes[node], "slurmd", None, msg))
        return tt

    def ctld(self, t: int, msg: str) -> int:
        self.rows.append((int(t), self.cluster.ctl_host, "slurmctld", None, msg))
        return int(t)

    def job(self, t: int, node: int, line: str, rank: int | None = None) -> int:
        tt = self._t(t, node)
        self.rows.append((tt, self.cluster.nodes[node], "job", rank, line))
        return tt

    # -- formatted job lines --------------------------------------------------------------------
    def cpp(self, t: int, rank: int, level: str, src: str, msg: str) -> int:
        node = self.cluster.node_of_rank(rank)
        tt = self._t(t, node)
        return self.job(t, node, fmt.glog_cpp(tt, rank, level, src, msg), rank)

    def agent(self, t: int, node: int, level: str, src: str, msg: str) -> int:
        tt = self._t(t, node)
        return self.job(t, node, fmt.glog_py(tt, level, self.cluster.agent_pid[node], src, msg))

    def nccl(self, t: int, rank: int, msg: str, tid_off: int = 360, src: str | None = None) -> int:
        """An NCCL debug line; ``src`` (``transport/net_ib.cc:1295``) is printed before ``NCCL`` when the
        run's dialect does, as NCCL does for WARN lines."""
        c = self.cluster
        node = c.node_of_rank(rank)
        pid = c.pid(rank)
        line = fmt.nccl(c.nodes[node], pid, pid + tid_off, rank % c.gpus_per_node, msg)
        if src is not None and self.dialect.nccl_warn_src:
            line = line.replace(" NCCL ", f" {src} NCCL ", 1)
        return self.job(t, node, line, rank)

    def deepspeed(self, t: int, rank: int, level: str, src: str, msg: str) -> int:
        """A DeepSpeed log line of ``rank`` (its own timestamp, torchrun's ``[rankN]:`` prefix)."""
        node = self.cluster.node_of_rank(rank)
        tt = self._t(t, node)
        return self.ranked(t, rank, fmt.deepspeed_log(tt, level, src, msg))

    def ranked(self, t: int, rank: int, text: str) -> int:
        """A line the worker printed to stderr, prefixed ``[rankN]:`` by torchrun."""
        return self.job(t, self.cluster.node_of_rank(rank), f"[rank{rank}]:{text}", rank)

    def traceback(self, t: int, rank: int, frames: list[tuple[str, int, str, str]], last: str) -> int:
        self.ranked(t, rank, " Traceback (most recent call last):")
        for path, line, func, code in frames:
            self.ranked(t, rank, f'   File "{path}", line {line}, in {func}')
            self.ranked(t, rank, f"     {code}")
        return self.ranked(t, rank, f" {last}")

    def jitter(self, lo_s: float, hi_s: float) -> int:
        return int(self.rng.uniform(lo_s, hi_s) * NS)

    def gpu_uuid(self, node: int, gpu: int) -> str:
        r = np.random.default_rng([self.cluster.seed, node, gpu, 77])
        h = "".join(f"{int(x):02x}" for x in r.integers(0, 256, 16))
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# ---- job life cycle ------------------------------------------------------------------------------

def startup(s: Script) -> None:
    """sbatch/srun/torchrun start-up, NCCL initialisation on every rank, slurmd launch lines."""
    c = s.cluster
    t0 = c.start_ns
    ncpu = 112 * len(c.nodes)
    s.ctld(t0 - 2 * NS, f"sched: Allocate JobId={c.job_id} NodeList={c.nodelist()} #CPUs={ncpu} Partition=gpu")
    comm = f"0x{int(s.rng.integers(1 << 60, 1 << 62)):x}"
    for i, _host in enumerate(c.nodes):
        tn = t0 + s.jitter(0, 0.4)
        if i == 0:
            s.slurmd(tn - NS, i, f"Launching batch job {c.job_id} for UID 1000")
        s.slurmd(tn, i, f"launch task StepId={c.job_id}.0 request from UID:1000 GID:1000 HOST:10.128.0.254 PORT:{40000 + i}")
        s.slurmd(tn + 2_000_000, i, f"task/affinity: lllp_distribution: JobId={c.job_id} manual binding: none,one_thread")
        s.slurmd(tn + 3_000_000, i, f"[{c.job_id}.0] task/cgroup: _memcg_initialize: job: alloc=1843200MB mem.limit=1843200MB memsw.limit=unlimited")
        ta = tn + NS
        s.agent(ta, i, "W", "torch/distributed/run.py:793", "")
        s.agent(ta, i, "W", "torch/distributed/run.py:793", "*****************************************")
        s.agent(ta, i, "W", "torch/distributed/run.py:793", "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ")
        s.agent(ta, i, "W", "torch/distributed/run.py:793", "*****************************************")
        s.job(ta, i, f"NCCL_DEBUG=INFO NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME={'ibp12s0'} NCCL_ASYNC_ERROR_HANDLING=1")
        for rank in c.ranks_of(i):
            g = rank % c.gpus_per_node
            tr = ta + 8 * NS + s.jitter(0, 1.5)
            if rank == 0:
                s.nccl(tr, rank, f"INFO NCCL version {NCCL_VERSION}+cuda12.4", 0)
            s.nccl(tr, rank, "INFO cudaDriverVersion 12040", 0)
            s.nccl(tr + 1_000_000, rank, f"INFO Bootstrap : Using ibp12s0:{c.ips[i]}<0>", 0)
            s.nccl(tr + 90_000_000, rank, "INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
                   f"[3]mlx5_3:1/IB [RO]; OOB ibp12s0:{c.ips[i]}<0>", 0)
            s.nccl(tr + 91_000_000, rank, "INFO Using network IB", 0)
            bus = c.pci(g).split(":")[1]
            ring = " ".join(f"{(rank + j) % c.world:>3}" for j in range(min(8, c.world)))
            s.nccl(tr + 1_500_000_000, rank, f"INFO Channel 00/24 : {ring}", 0)
            s.nccl(tr + 1_900_000_000, rank, "INFO Connected all rings", 0)
            s.nccl(tr + 1_950_000_000, rank, "INFO Connected all trees", 0)
            s.nccl(tr + 2 * NS, rank, f"INFO comm 0x{0x55e0c0000000 + rank * 0x1000:x} rank {rank} nranks {c.world} "
                   f"cudaDev {g} nvmlDev {g} busId {bus}000 commId {comm} - Init COMPLETE", 0)
            # benign warnings every rank prints: they say "Warning" and must not become incidents
            s.ranked(tr + 3 * NS, rank, "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:1399: "
                     "FutureWarning: `torch.cpu.amp.autocast(args...)` is deprecated. Please use "
                     "`torch.amp.autocast('cpu', args...)` instead.")
            if rank == 0:
                s.ranked(tr + 4 * NS, rank, " > number of parameters on (tensor, pipeline) model parallel rank "
                         "(0, 0): 1753284608")


def job_end_lines(s: Script, t: int, reason: str, failed_node: int | None = None) -> None:
    """Slurm's view of the end: per-node step cancel (on failure) and the controller's completion."""
    c = s.cluster
    clock = fmt.slurm_clock(t)
    for i in range(len(c.nodes)):
        if failed_node is not None and i == failed_node:
            continue
        ti = t + s.jitter(0, 0.5)
        if reason != "done":
            suffix = " DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS" if reason == "node_fail" else ""
            banner = f"*** STEP {c.job_id}.0 ON {c.nodes[i]} CANCELLED AT {clock}{suffix} ***"
            s.job(ti, i, f"slurmstepd: error: {banner}")
            s.slurmd(ti, i, f"[{c.job_id}.0] error: {banner}")
        s.slurmd(ti + 200_000_000, i, f"[{c.job_id}.0] done with step")
        if i == 0:
            s.slurmd(ti + 300_000_000, i, f"[{c.job_id}.batch] done with job")
    if reason == "done":
        s.ctld(t + NS, f"_job_complete: JobId={c.job_id} WEXITSTATUS 0")
    elif reason == "node_fail":
        s.ctld(t + NS, f"_job_complete: JobId={c.job_id} WTERMSIG 9")
    else:
        s.ctld(t + NS, f"_job_complete: JobId={c.job_id} WEXITSTATUS 1")
    s.ctld(t + NS + 1_000_000, f"_job_complete: JobId={c.job_id} done")


def child_failed(s: Script, t: int, rank: int, exitcode: int) -> int:
    """The culprit node's torchrun agent reports its failed worker and tears the others down."""
    c = s.cluster
    node = c.node_of_rank(rank)
    lr = rank % c.gpus_per_node
    for other in c.ranks_of(node):
        if other != rank:
            s.agent(t, node, "W", "torch/distributed/elastic/multiprocessing/api.py:897",
                    f"Sending process {c.pid(other)} closing signal SIGTERM")
    t2 = t + s.jitter(1.0, 3.0)
    s.agent(t2, node, "E", "torch/distributed/elastic/multiprocessing/api.py:869",
            f"failed (exitcode: {exitcode}) local_rank: {lr} (pid: {c.pid(rank)}) of binary: /usr/bin/python3")
    when = fmt.slurm_clock(t2).replace("T", "_")
    block = [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {when}",
        f"  host      : {c.nodes[node]}",
        f"  rank      : {rank} (local_rank: {lr})",
        f"  exitcode  : {exitcode} (pid: {c.pid(rank)})",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]
    for line in block:
        s.job(t2 + 1_000_000, node, line)
    s.job(t2 + 2 * NS, 0, f"srun: error: {c.nodes[node]}: task {node}: Exited with exit code 1")
    return t2


def remote_failure(s: Script, t: int, exclude_nodes: set[int], why: str = "remote process exited or there was a network error") -> int:
    """Healthy ranks elsewhere notice the dead peer: NCCL async error -> process group aborts."""
    c = s.cluster
    last = t
    for rank in range(c.world):
        if c.node_of_rank(rank) in exclude_nodes:
            continue
        tr = t + s.jitter(0.5, 8.0)
        s.cpp(tr, rank, "E", "ProcessGroupNCCL.cpp:1595",
              f"[PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: "
              f"NCCL error: {why}, NCCL version {NCCL_VERSION}")
        s.ranked(tr + 1_000_000, rank, "ncclRemoteError: A call failed possibly due to a network error or a remote "
                 "process exiting prematurely.")
        last = max(last, tr)
    for i in range(len(c.nodes)):
        if i in exclude_nodes:
            continue
        s.agent(last + s.jitter(1, 3), i, "E", "torch/distributed/elastic/multiprocessing/api.py:869",
                f"failed (exitcode: -6) local_rank: 0 (pid: {c.pid(i * c.gpus_per_node)}) of binary: /usr/bin/python3")
    return last + 4 * NS


def watchdog_cascade(s: Script, t_block: int, silent_ranks: set[int], op: str = "ALLREDUCE") -> int:
    """Every rank blocked in a collective since ``t_block`` reports the 600 s watchdog timeout."""
    c = s.cluster
    seq = s.timeline.seq_at(t_block) + 1
    numel = 16777216
    last = t_block
    # the same draws in the same order as one per rank in the loop; drawn first so the rank whose watchdog fires
    # first is known (the dump-signal dialect names it)
    ran = {rank: WATCHDOG_MS + int(s.rng.integers(5, 900)) for rank in range(c.world) if rank not in silent_ranks}
    first = min(ran, key=lambda r: (ran[r], r)) if ran else None
    for rank in range(c.world):
        if rank in silent_ranks:
            continue
        ran_ms = ran[rank]
        tr = t_block + ran_ms * 1_000_000
        if s.dialect.watchdog_dump:   # pytorch/pytorch v2.5 ProcessGroupNCCL.cpp getNCCLWatchdogTimeoutErrorMsg()
            who = "this local rank" if rank == first else f" rank {first}"
            s.cpp(tr + 500_000, rank, "E", "ProcessGroupNCCL.cpp:1743",
                  f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Received a dump signal due to a collective timeout from "
                  f"{who} and we will try our best to dump the debug info. Last enqueued NCCL work: {seq}, last completed "
                  f"NCCL work: {seq - 1}.")
        numels = f"NumelIn={numel}, NumelOut={numel}, " if s.dialect.watchdog_numel else ""
        work = (f"WorkNCCL(SeqNum={seq}, OpType={op}, {numels}"
                f"Timeout(ms)={WATCHDOG_MS}) ran for {ran_ms} milliseconds before timing out.")
        s.cpp(tr, rank, "E", "ProcessGroupNCCL.cpp:616", f"[Rank {rank}] Watchdog caught collective operation timeout: {work}")
        s.cpp(tr + 200_000, rank, "E", "ProcessGroupNCCL.cpp:1664",
              f"[PG 0 (default_pg) Rank {rank}] Exception (either an error or timeout) detected by watchdog at work: "
              f"{seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.")
        s.cpp(tr + 300_000, rank, "E", "ProcessGroupNCCL.cpp:630",
              f"[Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
              "kernels, subsequent GPU operations might run on corrupted/incomplete data.")
        s.cpp(tr + 400_000, rank, "E", "ProcessGroupNCCL.cpp:636",
              f"[Rank {rank}] To avoid data inconsistency, we are taking the entire process down.")
        s.ranked(tr + 900_000, rank, "terminate called after throwing an instance of 'c10::DistBackendError'")
        last = max(last, tr)
    for i in range(len(c.nodes)):
        if all(r in silent_ranks for r in c.ranks_of(i)):
            continue
        s.agent(last + s.jitter(2, 6), i, "E", "torch/distributed/elastic/multiprocessing/api.py:869",
                f"failed (exitcode: -6) local_rank: 0 (pid: {c.pid(i * c.gpus_per_node)}) of binary: /usr/bin/python3")
        if i > 0:
            s.job(last + 8 * NS, 0, f"srun: error: {c.nodes[i]}: task {i}: Exited with exit code 1")
    return last + 10 * NS
