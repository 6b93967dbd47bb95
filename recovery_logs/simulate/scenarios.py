"""The fault library: each scenario scripts the lines a real incident leaves behind and states
its ground truth. Scenarios are plain functions ``(script, spec) -> Fault`` in ``SCENARIOS``.

Categories follow the replay output contract (``schema.Category``): the failure domain. Xids
whose domain is GPU memory (48, 94, 95) are ``ecc_memory``, NVLink ones (74, 144-150) ``nvlink``,
the rest (79, 119, 120, 13, 31) ``xid``; the Xid code itself is in ``xid``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from recovery_logs.simulate import script as sc
from recovery_logs.simulate.cluster import HCA_PCI, IB_NETDEV
from recovery_logs.simulate.script import Script
from recovery_logs.timeutil import NS

HW_ACTIONS = ("drain_node", "requeue_job", "reset_gpu")
USER_ACTIONS = ("none", "investigate", "cancel_job")


@dataclass(frozen=True)
class Spec:
    node: int          # culprit node index
    gpu: int           # culprit GPU index on that node
    t: int             # fault time (ns, true clock)
    other: int         # another node (for peer relationships)


@dataclass
class Fault:
    kind: str
    category: str | None
    culprit_node: int | None
    culprit_gpu: int | None
    node_fault: bool                       # the culprit node is at fault (may be drained)
    fault_t: int | None
    decisive_t: int | None
    actions: tuple[str, ...]
    expect_incident: bool = True
    xid: int | None = None
    job_end: int | None = None             # job output and progress stop after this time
    progress_stop: int | None = None       # progress lines stop (job may linger, e.g. a hang)
    node_dead: tuple[int, int] | None = None
    decisive_host: str | None = None       # host of the decisive line when it is not the culprit
    masked: bool = False                   # in a combination: an earlier fault ended the job first
    slow: list[tuple[np.ndarray, int, int, float]] = field(default_factory=list)
    hot: bool = False                      # the slowdown is thermal: GPU clocks cut, temperatures high


def _rank(s: Script, node: int, gpu: int) -> int:
    return node * s.cluster.gpus_per_node + gpu


def _xid(s: Script, t: int, node: int, gpu: int, code: int, text: str, header: bool = True) -> int:
    c = s.cluster
    if header:
        s.kern(t - 40_000, node, f"NVRM: GPU at PCI:{c.pci(gpu)}: {s.gpu_uuid(node, gpu)}")
        s.kern(t - 30_000, node, f"NVRM: GPU Board Serial Number: 1654{node:05d}{gpu:04d}")
    return s.kern(t, node, f"NVRM: Xid (PCI:{c.pci(gpu)}): {code}, {text}")


def _crash(s: Script, t: int, rank: int, frames: list[tuple[str, int, str, str]], last: str,
           exitcode: int = 1, extra: Sequence[str] = ()) -> int:
    """One rank dies with an exception: its traceback, torchrun teardown, peers abort, Slurm ends."""
    s.traceback(t, rank, frames, last)
    for line in extra:
        s.ranked(t + 1_000, rank, line)
    node = s.cluster.node_of_rank(rank)
    t2 = sc.child_failed(s, t + s.jitter(0.5, 2.0), rank, exitcode)
    end = sc.remote_failure(s, t2, {node})
    sc.job_end_lines(s, end + s.jitter(1, 4), "failed")
    return end + 6 * NS


TRAIN_FRAMES = [("/workspace/megatron/training.py", 1192, "train_step", "losses_reduced = forward_backward_func("),
                ("/workspace/megatron/core/pipeline_parallel/schedules.py", 455, "forward_backward_no_pipelining",
                 "output_tensor = forward_step(")]
CUDA_FRAMES = TRAIN_FRAMES + [("/usr/local/lib/python3.10/dist-packages/torch/cuda/streams.py", 225, "synchronize",
                               "super().synchronize()")]


def _cuda_crash(s: Script, t: int, rank: int, err: str) -> int:
    last = s.dialect.cuda_error(err, 250 + int(s.rng.integers(0, 60)))
    if last.startswith("RuntimeError: cuda runtime error"):   # older PyTorch: no hints after it
        return _crash(s, t, rank, CUDA_FRAMES, last)
    return _crash(s, t, rank, CUDA_FRAMES, last,
                  extra=["CUDA kernel errors might be asynchronously reported at some other API call, so the "
                         "stacktrace below might be incorrect.",
                         "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                         "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."])


def _breadcrumb_45(s: Script, t: int, node: int, gpus: list[int], cause: int | None) -> None:
    c = s.cluster
    for g in gpus:
        tail = f"Ch 0000000{(g % 7) + 1}" if cause is None else s.dialect.xid45_tail((g % 7) + 1, cause)
        s.kern(t + s.jitter(0, 0.5), node, f"NVRM: Xid (PCI:{c.pci(g)}): 45, "
               f"{s.dialect.xid_who_text(c.pid(_rank(s, node, g)))}{tail}")


def _recovery(s: Script, t: int, node: int, gpu: int) -> None:
    """The GPU's recovery verdict in the run's wording (Xid 154, DCGM's health text or nvidia-smi -q)."""
    c = s.cluster
    where, lines = s.dialect.recovery_lines(gpu, c.pci(gpu), c.pci(gpu).split(":")[1])
    for i, line in enumerate(lines):
        if where == "kern":
            s.kern(t + i * 1000, node, line)
        else:
            s.job(t + i * 1000, node, line)


def _hw_truth(kind: str, f: Spec, t: int, xid: int | None, actions=HW_ACTIONS, category: str = "xid", **kw) -> Fault:
    return Fault(kind=kind, category=category, culprit_node=f.node, culprit_gpu=f.gpu, node_fault=True, fault_t=t,
                 decisive_t=t, actions=actions, xid=xid, **kw)


# ---- hardware: GPU ------------------------------------------------------------------------------

def xid79_cascade(s: Script, f: Spec) -> Fault:
    """Xid 79 (GPU fell off the bus, after corrected PCIe AER); every other rank times out 600 s later."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    rp = f"{int(c.pci(g).split(':')[1], 16) - 1:02x}"
    t_aer = f.t - s.jitter(5, 40)
    s.kern(t_aer, k, f"pcieport 0000:{rp}:01.0: AER: Corrected error received: 0000:{rp}:01.0")
    s.kern(t_aer + 20_000, k, f"pcieport 0000:{rp}:01.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)")
    s.kern(t_aer + 30_000, k, f"pcieport 0000:{rp}:01.0:   device [8086:352a] error status/mask=00000001/00002000")
    s.kern(t_aer + 40_000, k, f"pcieport 0000:{rp}:01.0:    [ 0] RxErr                  (First)")
    t = _xid(s, f.t, k, g, 79, f"{s.dialect.xid_who_text(c.pid(rank))}GPU has fallen off the bus.")
    s.kern(f.t + 45_000, k, f"NVRM: GPU {c.pci(g)}.0: GPU has fallen off the bus.")
    s.kern(f.t + 80_000, k, "NVRM: A GPU crash dump has been created. If possible, please run\n"
           "NVRM: nvidia-bug-report.sh as root to collect this data before\nNVRM: the NVIDIA kernel module is unloaded.")
    tr = f.t + s.jitter(0.2, 1.0)
    s.cpp(tr, rank, "E", "ProcessGroupNCCL.cpp:1595", f"[PG 0 (default_pg) Rank {rank}] Process group watchdog thread "
          "terminated with exception: CUDA error: unspecified launch failure")
    s.nccl(tr + 1000, rank, "WARN Cuda failure 'unspecified launch failure'")
    end = sc.watchdog_cascade(s, f.t, {rank})
    sc.job_end_lines(s, end, "failed")
    return _hw_truth("xid79_cascade", f, t, 79, job_end=end + 5 * NS, progress_stop=f.t)


def xid48_row_remap(s: Script, f: Spec) -> Fault:
    """Xid 48 double-bit ECC error then Xid 63 row remap; the rank dies with a CUDA ECC error."""
    c, k, g = s.cluster, f.node, f.gpu
    t = _xid(s, f.t, k, g, 48, "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
             f"detected on GPU in the framebuffer at partition {g % 4}, subpartition 0.")
    s.kern(f.t + 3_000_000, k, f"NVRM: Xid (PCI:{c.pci(g)}): 63, pid='<unknown>', name=<unknown>, Row Remapper: "
           "New row marked for remapping, reset gpu to activate.")
    rank = _rank(s, k, g)
    end = _cuda_crash(s, f.t + s.jitter(0.05, 0.4), rank, "uncorrectable ECC error encountered")
    _breadcrumb_45(s, f.t + 2 * NS, k, [g], 48)
    return _hw_truth("xid48_row_remap", f, t, 48, category="ecc_memory", job_end=end, progress_stop=f.t)


def xid94_contained(s: Script, f: Spec) -> Fault:
    """Xid 94 contained ECC error: only the process on that GPU dies; requeue, no drain."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    t = _xid(s, f.t, k, g, 94, f"{s.dialect.xid_who_text(c.pid(rank))}Contained: SM (0x1). RST: No, D-RST: No")
    end = _cuda_crash(s, f.t + s.jitter(0.05, 0.3), rank, "uncorrectable ECC error encountered")
    return _hw_truth("xid94_contained", f, t, 94, actions=("requeue_job", "reset_gpu", "investigate"), category="ecc_memory",
                     job_end=end, progress_stop=f.t)


def xid95_uncontained(s: Script, f: Spec) -> Fault:
    """Xid 95 uncontained ECC error, Xid 154 GPU Reset Required, Xid 45 teardown on other GPUs."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    t = _xid(s, f.t, k, g, 95, f"{s.dialect.xid_who_text(c.pid(rank))}Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No")
    _recovery(s, f.t + 400_000_000, k, g)
    end = _cuda_crash(s, f.t + s.jitter(0.05, 0.3), rank, "uncorrectable ECC error encountered")
    _breadcrumb_45(s, f.t + NS, k, [x for x in range(c.gpus_per_node) if x != g][:3], 95)
    return _hw_truth("xid95_uncontained", f, t, 95, category="ecc_memory", job_end=end, progress_stop=f.t)


def xid74_nvlink(s: Script, f: Spec) -> Fault:
    """Xid 74 fatal NVLink error; Xid 45 breadcrumbs on the other GPUs and nodes as the job is torn down."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    link = int(s.rng.integers(0, 18))
    t = _xid(s, f.t, k, g, 74, f"{s.dialect.xid_who_text(c.pid(rank))}NVLink: fatal error detected on link {link}"
             "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    end = _crash(s, f.t + s.jitter(0.2, 1.0), rank, TRAIN_FRAMES, s.dialect.nvlink_job_error_line(sc.NCCL_VERSION))
    _breadcrumb_45(s, f.t + NS, k, [x for x in range(c.gpus_per_node) if x != g], 74)
    for other in range(len(c.nodes)):   # teardown on other nodes kills their channels: solo Xid 45
        if other != k:
            _breadcrumb_45(s, end - 2 * NS, other, list(range(min(2, c.gpus_per_node))), None)
    return _hw_truth("xid74_nvlink", f, t, 74, category="nvlink", job_end=end, progress_stop=f.t)


def xid149_nvlink5(s: Script, f: Spec) -> Fault:
    """Xid 149 fatal NVLink5 link event, Xid 145 on peer GPUs, Xid 45 teardown, Xid 154 reset required."""
    c, k, g = s.cluster, f.node, f.gpu
    link = int(s.rng.integers(0, 18))
    t = _xid(s, f.t, k, g, 149, f"NETIR_LINK_EVT  Fatal   XC0 i0 Link {link:02d} (0x025525c6 0x00000000 0x00000000 "
             "0x00000000 0x00000000 0x00000000)")
    for peer in [x for x in range(c.gpus_per_node) if x != g][:2]:
        s.kern(f.t + 2_000_000, k, f"NVRM: Xid (PCI:{c.pci(peer)}): 145, RLW_SRC_TRACK  NonFatal XC0 i1 Link "
               f"{(link + 3 * peer) % 18:02d} (0x00000040 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    _breadcrumb_45(s, f.t + 283_000_000, k, list(range(c.gpus_per_node)), 149)
    _recovery(s, f.t + 404_000_000, k, g)
    end = _cuda_crash(s, f.t + s.jitter(0.3, 1.0), _rank(s, k, g), "unspecified launch failure")
    return _hw_truth("xid149_nvlink5", f, t, 149, category="nvlink", job_end=end, progress_stop=f.t)


def xid119_gsp(s: Script, f: Spec) -> Fault:
    """Xid 119 GSP RPC timeouts (x3) and Xid 154; the rank hangs until the NCCL watchdog fires."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    t = None
    for i in range(3):
        ti = _xid(s, f.t + i * 6 * NS, k, g, 119, f"{s.dialect.xid_who_text(c.pid(rank))}Timeout after 6s of waiting for RPC "
                  f"response from GPU{g} GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).", header=i == 0)
        t = ti if t is None else t
    _recovery(s, f.t + 13 * NS, k, g)
    end = sc.watchdog_cascade(s, f.t, {rank})
    sc.job_end_lines(s, end, "failed")
    assert t is not None   # at least one GPU line was written
    return _hw_truth("xid119_gsp", f, t, 119, job_end=end + 5 * NS, progress_stop=f.t)


def xid120_gsp(s: Script, f: Spec) -> Fault:
    """Xid 120 GSP task exception; the rank dies with an unspecified launch failure."""
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    t = _xid(s, f.t, k, g, 120, f"{s.dialect.xid_who_text(c.pid(rank))}GSP task exception: supervisor timer interrupt "
             "(cause:0x8000000000000005)")
    end = _cuda_crash(s, f.t + s.jitter(0.1, 0.5), rank, "unspecified launch failure")
    return _hw_truth("xid120_gsp", f, t, 120, job_end=end, progress_stop=f.t)


# ---- application faults that show up as Xids --------------------------------------------------

def _app_xid(s: Script, f: Spec, code: int, text: str, kind: str) -> Fault:
    c, k, g = s.cluster, f.node, f.gpu
    rank = _rank(s, k, g)
    t = _xid(s, f.t, k, g, code, f"{s.dialect.xid_who_text(c.pid(rank))}{text}")
    s.kern(f.t + 2_000_000, k, f"NVRM: Xid (PCI:{c.pci(g)}): 43, {s.dialect.xid_who_text(c.pid(rank))}Ch 00000008")
    end = _cuda_crash(s, f.t + s.jitter(0.01, 0.2), rank, "an illegal memory access was encountered")
    return Fault(kind=kind, category="xid", culprit_node=k, culprit_gpu=g, node_fault=False, fault_t=t, decisive_t=t,
                 actions=USER_ACTIONS, xid=code, job_end=end, progress_stop=f.t)


def xid13_app(s: Script, f: Spec) -> Fault:
    """Xid 13 SM warp exception from the application (+ Xid 43): a user bug, no node action."""
    return _app_xid(s, f, 13, "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address", "xid13_app")


def xid31_app(s: Script, f: Spec) -> Fault:
    """Xid 31 MMU fault from the application (+ Xid 43): illegal memory access, a user bug."""
    return _app_xid(s, f, 31, "channel 0x00000009, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_3 "
                    "faulted @ 0x7f2a_4c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", "xid31_app")


# ---- network ---------------------------------------------------------------------------------

def _ib_completion(s: Script, t: int, rank: int, peer_ip: str, status: int = 12) -> None:
    port = 40000 + int(s.rng.integers(0, 20000))
    opcode = int(s.rng.integers(0, 32768))
    if s.dialect.nccl_transport == "socket":   # NET/Socket: the peer reset the connection
        s.nccl(t, rank, f"WARN socketProgressOpt: Call to recv from {peer_ip}<{port}> failed : Connection reset by peer",
               src="misc/socket.cc:46")
        s.nccl(t + 20_000, rank, "INFO misc/socket.cc:64 -> 6")
        s.nccl(t + 30_000, rank, "INFO misc/socket.cc:80 -> 6")
        s.nccl(t + 40_000, rank, "INFO transport/net_socket.cc:474 -> 6")
        return
    s.nccl(t, rank, s.dialect.ib_completion(peer_ip, port, status, opcode), src="transport/net_ib.cc:1295")
    s.nccl(t + 20_000, rank, "INFO transport/net.cc:1302 -> 6")
    s.nccl(t + 30_000, rank, "INFO proxy.cc:698 -> 6")
    s.nccl(t + 40_000, rank, "INFO proxy.cc:878 -> 6 [Progress Thread]")


def _net_failure(s: Script, f: Spec, t_err: int, culprit: int) -> int:
    """NCCL on the culprit's ranks and its ring neighbours reports IB completion errors; job dies."""
    c = s.cluster
    n = len(c.nodes)
    neigh = sorted({(culprit - 1) % n, (culprit + 1) % n} - {culprit})
    for r in c.ranks_of(culprit):
        _ib_completion(s, t_err + s.jitter(0, 1.5), r, c.ips[neigh[0]] if neigh else c.ips[culprit])
    for m in neigh:
        for r in c.ranks_of(m):
            _ib_completion(s, t_err + s.jitter(0, 1.5), r, c.ips[culprit])
    end = sc.remote_failure(s, t_err + 2 * NS, set())
    sc.job_end_lines(s, end + s.jitter(1, 3), "failed")
    return end + 5 * NS


def ib_link_down(s: Script, f: Spec) -> Fault:
    """mlx5 cable error and IB link down; NCCL NET/IB completion errors on the node and its ring peers."""
    k = f.node
    t = s.kern(f.t, k, f"mlx5_core {HCA_PCI}: mlx5_port_module_event:1175:(pid 0): Port module event[error]: "
               "module 0, Cable error, Bad or shorted cable/module")
    s.kern(f.t + s.jitter(0.5, 3), k, f"mlx5_core {HCA_PCI} {IB_NETDEV}: Link down")
    if s.dialect.ib_async_event:   # NCCL's IB transport sees the port go: one line per rank on the node
        for r in s.cluster.ranks_of(k):
            s.nccl(f.t + s.jitter(1, 4), r, "WARN NET/IB : Got async event : port error", src="transport/net_ib.cc:93")
    end = _net_failure(s, f, f.t + s.jitter(8, 25), k)
    return Fault(kind="ib_link_down", category="infiniband_link", culprit_node=k, culprit_gpu=None, node_fault=True,
                 fault_t=t, decisive_t=t, actions=("drain_node", "requeue_job", "investigate"), job_end=end,
                 progress_stop=f.t + 8 * NS)


def ib_flap(s: Script, f: Spec) -> Fault:
    """The node's IB link goes down and up 4-6 times; NCCL retries ride it out, the job survives."""
    k = f.node
    t = f.t
    first = None
    for _ in range(int(s.rng.integers(4, 7))):
        td = s.kern(t, k, f"mlx5_core {HCA_PCI} {IB_NETDEV}: Link down")
        first = td if first is None else first
        t += s.jitter(2, 12)
        s.kern(t, k, f"mlx5_core {HCA_PCI} {IB_NETDEV}: Link up")
        t += s.jitter(20, 90)
    return Fault(kind="ib_flap", category="infiniband_link", culprit_node=k, culprit_gpu=None, node_fault=True,
                 fault_t=first, decisive_t=first, actions=("drain_node", "investigate", "requeue_job"))


def nccl_net_error(s: Script, f: Spec) -> Fault:
    """NCCL NET/IB completion errors that all point at one node's address, with no kernel evidence."""
    end = _net_failure(s, f, f.t, f.node)
    first, host = min((r[0], r[1]) for r in s.rows if "Got completion from peer" in r[4] or "socketProgressOpt" in r[4])
    return Fault(kind="nccl_net_error", category="nccl_network_error", culprit_node=f.node, culprit_gpu=None,
                 node_fault=True, fault_t=f.t, decisive_t=first, actions=("drain_node", "requeue_job", "investigate"),
                 job_end=end, progress_stop=f.t, decisive_host=host)


# ---- behaviour: hangs and slowness -------------------------------------------------------------

def silent_hang(s: Script, f: Spec) -> Fault:
    """Every process on one node stops (stuck in a D-state call); nothing is logged until the 600 s watchdog.

    The other ranks' NCCL watchdog fires; the hung node's ranks never report a timeout."""
    c = s.cluster
    t_stop = s.timeline.last_end_before(f.t)
    end = sc.watchdog_cascade(s, t_stop, set(c.ranks_of(f.node)))
    first, host = min((r[0], r[1]) for r in s.rows if "Watchdog caught collective operation timeout" in r[4])
    sc.job_end_lines(s, end, "failed")
    return Fault(kind="silent_hang", category="nccl_timeout_hang", culprit_node=f.node, culprit_gpu=None,
                 node_fault=True, fault_t=t_stop, decisive_t=first, actions=("requeue_job", "drain_node", "investigate"),
                 job_end=end + 5 * NS, progress_stop=t_stop, decisive_host=host)


def straggler_node(s: Script, f: Spec) -> Fault:
    """One node's ranks compute 1.2-1.5x slower from the fault on (e.g. thermal throttling); the job slows."""
    c = s.cluster
    factor = float(s.rng.uniform(1.2, 1.5))
    ranks = np.array(list(c.ranks_of(f.node)))
    return Fault(kind="straggler_node", category="straggler", culprit_node=f.node, culprit_gpu=None, node_fault=True,
                 fault_t=f.t, decisive_t=None, actions=("drain_node", "investigate", "requeue_job"),
                 slow=[(ranks, f.t, c.end_ns, factor)], hot=True)


def gpu_thermal(s: Script, f: Spec) -> Fault:
    """One GPU overheats: the driver cuts its clocks (HW/SW thermal slowdown), the node's GPU health
    check reports it (DCGM or ``nvidia-smi -q``, in the run's wording) every few minutes, and that
    GPU's rank computes 1.25-1.4x slower, holding the job back. Thermal, to investigate (cooling,
    fans); the node may be drained once confirmed."""
    c = s.cluster
    rank = _rank(s, f.node, f.gpu)
    factor = float(s.rng.uniform(1.25, 1.4))
    bus = c.pci(f.gpu).split(":")[1]
    smi_old = bool(s.rng.random() < 0.5)
    first = None
    t = f.t + s.jitter(20, 40)
    k = 0
    while t < c.end_ns - 30 * NS:
        for i, line in enumerate(_thermal_lines(s, f, bus, smi_old, k)):
            tt = s.job(t + i * 1000, f.node, line)
            first = tt if first is None else first
        t += s.jitter(170, 240)
        k += 1
    return Fault(kind="gpu_thermal", category="thermal_power", culprit_node=f.node, culprit_gpu=f.gpu, node_fault=True,
                 fault_t=f.t, decisive_t=first, actions=("investigate", "drain_node", "requeue_job"),
                 slow=[(np.array([rank]), f.t, c.end_ns, factor)], hot=True)


def _thermal_lines(s: Script, f: Spec, bus: str, smi_old: bool, k: int) -> list[str]:
    """The ``k``-th health report of a hot GPU: dcgm-exporter's scrape when the run draws it
    (``Dialect.thermal_exporter``), else the DCGM / nvidia-smi wording of ``thermal_form``."""
    if s.dialect.thermal_exporter != "none":
        return s.dialect.exporter_thermal_report(f.gpu, s.cluster.nodes[f.node], k)
    return s.dialect.thermal_report(f.gpu, bus, smi_old)


def workload_imbalance(s: Script, f: Spec) -> Fault:
    """Specific ranks on different nodes are slow, and the set shifts: the data, not a node."""
    c = s.cluster
    slow = []
    t = f.t
    span = 8 * 60 * NS
    while t < c.end_ns:
        nodes = s.rng.choice(len(c.nodes), size=min(2, len(c.nodes)), replace=False)
        ranks = np.array([int(n) * c.gpus_per_node + int(s.rng.integers(0, c.gpus_per_node)) for n in nodes])
        slow.append((ranks, t, min(t + span, c.end_ns), float(s.rng.uniform(1.2, 1.4))))
        t += span
    return Fault(kind="workload_imbalance", category="straggler", culprit_node=None, culprit_gpu=None,
                 node_fault=False, fault_t=f.t, decisive_t=None, actions=("none", "investigate"),
                 expect_incident=False, slow=slow)


# ---- user / job faults ------------------------------------------------------------------------

def user_exception(s: Script, f: Spec) -> Fault:
    """A Python exception (KeyError) in one rank's data code; torchrun tears the job down. A user bug."""
    rank = _rank(s, f.node, f.gpu)
    frames = [("/workspace/train.py", 212, "<module>", "main()"), ("/workspace/train.py", 188, "main",
              "batch = collate(samples)"), ("/workspace/data.py", 57, "collate", 'ids = [s["input_ids"] for s in samples]')]
    t = s.cluster.skew_ns[f.node] + f.t
    end = _crash(s, f.t, rank, frames, "KeyError: 'input_ids'")
    return Fault(kind="user_exception", category="software_exception", culprit_node=f.node, culprit_gpu=None,
                 node_fault=False, fault_t=t, decisive_t=t, actions=USER_ACTIONS, job_end=end, progress_stop=f.t)


def gpu_oom(s: Script, f: Spec) -> Fault:
    """A GPU out-of-memory on one rank (in the wording of the run's stack): a user problem, no node action."""
    rank = _rank(s, f.node, f.gpu)
    t = s.cluster.skew_ns[f.node] + f.t
    if s.dialect.oom_pressure:   # ZeRO-3 flushes the allocator cache in the steps before the OOM
        for i, back in enumerate((170, 110, 50)):
            s.deepspeed(f.t - back * NS + s.jitter(0, 8), rank, "WARNING", "stage3.py:2069:step",
                        s.dialect.oom_pressure_warning(2 + i * 3))
    end = _crash(s, f.t, rank, TRAIN_FRAMES, s.dialect.gpu_oom(f.gpu))
    return Fault(kind="gpu_oom", category="oom_gpu", culprit_node=f.node, culprit_gpu=f.gpu, node_fault=False,
                 fault_t=t, decisive_t=t, actions=("none", "investigate"), job_end=end, progress_stop=f.t)


def host_oom(s: Script, f: Spec) -> Fault:
    """The memory cgroup OOM killer kills one rank (slurmstepd reports oom_kill): the job's fault."""
    c, k = s.cluster, f.node
    rank = _rank(s, k, f.gpu)
    pid = c.pid(rank)
    job = c.job_id
    t = f.t
    if s.dialect.host_oom_seen == "kernel":   # else only the job's side (slurmstepd, srun) is in the logs
        s.kern(f.t - 2_000_000, k, "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
               "order=0, oom_score_adj=0")
        s.kern(f.t - 1_000_000, k, f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
               f"oom_memcg=/slurm/uid_1000/job_{job},task_memcg=/slurm/uid_1000/job_{job}/step_0/task_{rank % c.gpus_per_node},"
               f"task=python3,pid={pid},uid=1000")
        t = s.kern(f.t, k, f"Memory cgroup out of memory: Killed process {pid} (python3) total-vm:412345678kB, "
                   "anon-rss:229145312kB, file-rss:1048576kB, shmem-rss:8388608kB, UID:1000 pgtables:461824kB oom_score_adj:0")
    t2 = _oom_victim_report(s, f.t + s.jitter(0.5, 2), rank)
    if _oom_launcher_only(s):   # the launcher's report is the only evidence (see _oom_launcher_only)
        end = sc.remote_failure(s, t2, {k})
        sc.job_end_lines(s, end + s.jitter(1, 3), "failed")
        return Fault(kind="host_oom", category="oom_host", culprit_node=k, culprit_gpu=None, node_fault=False,
                     fault_t=t2, decisive_t=t2, actions=("none", "investigate", "requeue_job", "cancel_job"),
                     job_end=end + 5 * NS, progress_stop=f.t)
    msg = (f"Detected 1 oom-kill event(s) in step {job}.0 cgroup. Some of your processes may have been killed by "
           "the cgroup out-of-memory handler." if s.dialect.oomkill_old else
           f"Detected 1 oom_kill event in StepId={job}.0. Some of the step tasks have been OOM Killed.")
    s.job(t2, k, f"slurmstepd: error: {msg}")
    s.slurmd(t2, k, f"[{job}.0] error: {msg}")
    if s.dialect.host_oom_seen == "job":      # SchedMD/slurm src/srun: "%s: task %s: Out Of Memory"
        s.job(t2 + 1_000_000, k, f"srun: error: {c.nodes[k]}: task {rank}: Out Of Memory")
        t = t2
    end = sc.remote_failure(s, t2, {k})
    sc.job_end_lines(s, end + s.jitter(1, 3), "failed")
    return Fault(kind="host_oom", category="oom_host", culprit_node=k, culprit_gpu=None, node_fault=False, fault_t=t,
                 decisive_t=t, actions=("none", "investigate", "requeue_job", "cancel_job"), job_end=end + 5 * NS,
                 progress_stop=f.t)


def _oom_victim_report(s: Script, t: int, rank: int) -> int:
    """How the launcher reports the rank the OOM killer took (Dialect.oom_victim_report); returns its time."""
    if s.dialect.oom_victim_report == "elastic":
        return sc.child_failed(s, t, rank, -9)
    c = s.cluster
    node = c.node_of_rank(rank)
    # written in the victim node's job output, as child_failed writes torchrun's report
    if s.dialect.oom_victim_report == "hydra":
        for i, line in enumerate(s.dialect.hydra_banner(rank, c.pid(rank), c.nodes[node], old=bool(s.rng.random() < 0.5))):
            s.job(t + i * 1000, node, line)
        return t
    s.job(t, node, s.dialect.shell_killed(c.job_id, 20 + int(s.rng.integers(0, 30)), c.pid(rank)))
    return t


def _oom_launcher_only(s: Script) -> bool:
    """Only the launcher saw the kill: the kernel log is not collected (host_oom_seen "job") and the rank was
    started by mpiexec or the batch shell, whose step Slurm's cgroup plugin does not account, so neither
    slurmstepd's oom_kill count nor srun's Out Of Memory line appears."""
    return s.dialect.host_oom_seen == "job" and s.dialect.oom_victim_report != "elastic"


def _node_return(s: Script, t: int, k: int) -> None:
    """The dead node reboots and slurmctld re-registers it under its job (Dialect.node_fail_return)."""
    c = s.cluster
    s.ctld(t, f"Node {c.nodes[k]} now responding")
    boot = t // NS - int(s.rng.integers(60, 120))
    s.ctld(t + 1_000_000, f"validate_node_specs: Node {c.nodes[k]} unexpectedly rebooted boot_time={boot} "
           f"last response={boot - int(s.rng.integers(200, 400))}")
    if k == 0:   # the batch host: its batch script is gone
        s.ctld(t + 2_000_000, f"Batch JobId={c.job_id} missing from batch node {c.nodes[k]} "
               "(not found BatchStartTime after startup)")


def node_fail(s: Script, f: Spec) -> Fault:
    """The node dies outright (power/board): its logs just stop; peers and slurmctld notice."""
    c, k = s.cluster, f.node
    end = _net_failure(s, f, f.t + s.jitter(15, 40), k)
    t_nr = s.ctld(f.t + s.jitter(60, 120), f"error: Nodes {c.nodes[k]} not responding")
    t_down = f.t + s.jitter(300, 330)
    s.ctld(t_down, f"error: Nodes {c.nodes[k]} not responding, setting DOWN")
    s.ctld(t_down + 1_000_000, f"Killing JobId={c.job_id} on failed node {c.nodes[k]}")
    if s.dialect.node_fail_return:
        _node_return(s, t_down + s.jitter(240, 420), k)
    return Fault(kind="node_fail", category="slurm_job_failure", culprit_node=k, culprit_gpu=None, node_fault=True,
                 fault_t=f.t, decisive_t=t_nr, actions=("drain_node", "requeue_job", "investigate"), job_end=end,
                 progress_stop=f.t, node_dead=(k, f.t), decisive_host=c.ctl_host)


def nvme_storm(s: Script, f: Spec) -> Fault:
    """A failing local NVMe floods the kernel log (linux drivers/nvme/host/pci.c nvme_timeout()'s "I/O %d QID %d
    timeout, aborting" and "controller is down; will reset", block/blk-core.c's I/O error, fs/ext4/page-io.c's
    ext4_end_bio warning). It was the anomaly model's target while no rule read these lines; since
    ``host_hardware.block_io_error`` does, it is a host-hardware fault to investigate (``novel_sas_storm`` is
    the model's target now)."""
    k = f.node
    t, end = f.t, f.t + 10 * 60 * NS
    first = None
    while t < end:
        qid = int(s.rng.integers(1, 64))
        tag = int(s.rng.integers(0, 1024))
        t1 = s.kern(t, k, f"nvme nvme0: I/O {tag} QID {qid} timeout, aborting")
        first = t1 if first is None else first
        s.kern(t + 2_000_000, k, f"nvme nvme0: Abort status: 0x{int(s.rng.integers(0, 0x400)):x}")
        sector = int(s.rng.integers(1 << 20, 1 << 31))
        s.kern(t + 30_000_000, k, f"blk_update_request: I/O error, dev nvme0n1, sector {sector} op 0x0:(READ) "
               "flags 0x80700 phys_seg 1 prio class 0")
        if s.rng.random() < 0.1:
            s.kern(t + 60_000_000, k, "nvme nvme0: controller is down; will reset: CSTS=0x3, PCI_STATUS=0x10")
        if s.rng.random() < 0.2:
            s.kern(t + 90_000_000, k, f"EXT4-fs warning (device nvme0n1p1): ext4_end_bio:343: I/O error 10 writing "
                   f"to inode {int(s.rng.integers(1000, 99999))} starting block {sector // 8})")
        t += s.jitter(0.5, 4.0)
    return Fault(kind="nvme_storm", category="host_hardware", culprit_node=k, culprit_gpu=None, node_fault=True,
                 fault_t=first, decisive_t=first, actions=("investigate", "drain_node"))


def novel_sas_storm(s: Script, f: Spec) -> Fault:
    """A failing SAS disk behind the node's HBA floods the kernel log with lines no rule knows: a target for
    the anomaly model. The texts are the kernel's: linux drivers/scsi/mpt3sas/mpt3sas_base.c
    _base_sas_log_info() ("log_info(0x%08x): originator(%s), code(0x%02x), sub_code(0x%04x)"), the SCSI
    midlayer's completion report (drivers/scsi/scsi_logging.c: "<msg><mlret> Result: hostbyte=%s
    driverbyte=%s") and its sense decoding ("Sense Key : %s [%s]", "Add. Sense: %s")."""
    k = f.node
    t, end = f.t, f.t + 10 * 60 * NS
    first = None
    codes = ((0x31120303, "PL", 0x12, 0x0303), (0x31110e05, "PL", 0x11, 0x0e05), (0x3112011a, "PL", 0x12, 0x011a))
    while t < end:
        info, orig, code, sub = codes[int(s.rng.integers(0, len(codes)))]
        t1 = s.kern(t, k, f"mpt3sas_cm0: log_info(0x{info:08x}): originator({orig}), code(0x{code:02x}), "
                          f"sub_code(0x{sub:04x})")
        first = t1 if first is None else first
        tag = int(s.rng.integers(0, 4096))
        s.kern(t + 3_000_000, k, f"sd 0:0:4:0: [sde] tag#{tag} FAILED Result: hostbyte=DID_SOFT_ERROR "
                                 f"driverbyte=DRIVER_OK cmd_age={int(s.rng.integers(0, 31))}s")
        if s.rng.random() < 0.3:
            s.kern(t + 4_000_000, k, f"sd 0:0:4:0: [sde] tag#{tag} Sense Key : Medium Error [current]")
            s.kern(t + 4_500_000, k, f"sd 0:0:4:0: [sde] tag#{tag} Add. Sense: Unrecovered read error")
        t += s.jitter(0.5, 4.0)
    return Fault(kind="novel_sas_storm", category="anomaly", culprit_node=k, culprit_gpu=None, node_fault=True,
                 fault_t=first, decisive_t=first, actions=("investigate", "none", "drain_node"))


def healthy(s: Script, f: Spec) -> Fault:
    """A healthy run: progress, benign chatter and noise, no fault."""
    return Fault(kind="healthy", category=None, culprit_node=None, culprit_gpu=None, node_fault=False, fault_t=None,
                 decisive_t=None, actions=("none",), expect_incident=False)


# scenarios whose evidence is only in the job's own output: masked when an earlier fault ended the job
JOB_SIDE = frozenset({"straggler_node", "workload_imbalance", "gpu_thermal", "silent_hang", "user_exception", "gpu_oom",
                      "nccl_net_error"})

# scenarios that slow ranks down (the timeline is computed from their slowdowns first)
SLOW_SCENARIOS = frozenset({"straggler_node", "workload_imbalance", "gpu_thermal"})

# name -> (function, seconds needed after the fault for its lines to play out)
SCENARIOS: dict[str, tuple[Callable[[Script, Spec], Fault], int]] = {
    "healthy": (healthy, 0),
    "xid79_cascade": (xid79_cascade, 660),
    "xid48_row_remap": (xid48_row_remap, 60),
    "xid94_contained": (xid94_contained, 60),
    "xid95_uncontained": (xid95_uncontained, 60),
    "xid74_nvlink": (xid74_nvlink, 60),
    "xid149_nvlink5": (xid149_nvlink5, 60),
    "xid119_gsp": (xid119_gsp, 660),
    "xid120_gsp": (xid120_gsp, 60),
    "xid13_app": (xid13_app, 60),
    "xid31_app": (xid31_app, 60),
    "ib_link_down": (ib_link_down, 90),
    "ib_flap": (ib_flap, 600),
    "nccl_net_error": (nccl_net_error, 60),
    "silent_hang": (silent_hang, 660),
    "straggler_node": (straggler_node, 600),
    "workload_imbalance": (workload_imbalance, 600),
    "gpu_thermal": (gpu_thermal, 600),
    "user_exception": (user_exception, 60),
    "gpu_oom": (gpu_oom, 60),
    "host_oom": (host_oom, 60),
    "node_fail": (node_fail, 400),
    "nvme_storm": (nvme_storm, 660),
    "novel_sas_storm": (novel_sas_storm, 660),
}
