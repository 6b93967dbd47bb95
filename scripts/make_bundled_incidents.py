"""Writes the bundled incidents shipped in recovery_logs/data/incidents (package data).

Usage: python scripts/make_bundled_incidents.py recovery_logs/data/incidents

Each incident is a 4-node, 32-rank Megatron job (job 184470) with per-node kernel logs
(`nodes/<host>/kern.log`, RFC3164) and per-node job output (`job-184470/<host>.out`,
torchrun/glog prefixes), plus `truth.json` in the simulator's format. Deterministic.
"""
import json
import os
import random
import sys
import zlib
from datetime import UTC, datetime, timedelta

OUT = sys.argv[1]
NODES = ["gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04"]
IPS = {n: f"10.0.0.{11+i}" for i, n in enumerate(NODES)}
PCIS = ["18:00", "2a:00", "3a:00", "5d:00", "9a:00", "ab:00", "ba:00", "db:00"]
JOB = "184470"
T0 = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)
UP0 = 86123.0  # kernel uptime at T0


def iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def syslog(t, host, msg):
    return f"{t.strftime('%b %d %H:%M:%S')} {host} kernel: [{UP0 + (t - T0).total_seconds():12.6f}] {msg}"


def glog(t, lvl="I"):
    return f"{lvl}{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d}"


def torchglog(rank, t, lvl, src, msg):
    return f"[rank{rank}]:[{lvl}{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d}{random.randint(0,999):03d} {src}] {msg}"


class Inc:
    def __init__(self, name):
        self.name = name
        self.kern = {n: [] for n in NODES}
        self.job = {n: [] for n in NODES}

    def k(self, t, host, msg):
        self.kern[host].append((t, syslog(t, host, msg)))

    def j(self, t, host, line):
        self.job[host].append((t, line))

    def lines(self, t, host, lines):
        """Consecutive job-output lines (a traceback), one microsecond apart."""
        for i, line in enumerate(lines):
            self.j(t + timedelta(microseconds=i), host, line)

    def write(self, truth):
        base = os.path.join(OUT, self.name)
        os.makedirs(base, exist_ok=True)
        truth = {"scenario": self.name, "seed": 0, "job_id": JOB, "nodes": NODES, "year": T0.year, **truth}
        with open(os.path.join(base, "truth.json"), "w") as f:
            json.dump(truth, f, indent=2, sort_keys=True)
            f.write("\n")
        for n in NODES:
            os.makedirs(os.path.join(base, "nodes", n), exist_ok=True)
            os.makedirs(os.path.join(base, f"job-{JOB}"), exist_ok=True)
            with open(os.path.join(base, "nodes", n, "kern.log"), "w") as f:
                for _, line in sorted(self.kern[n], key=lambda x: x[0]):
                    f.write(line + "\n")
            with open(os.path.join(base, f"job-{JOB}", f"{n}.out"), "w") as f:
                for _, line in sorted(self.job[n], key=lambda x: x[0]):
                    f.write(line + "\n")


def truth(fault_kind, category, host, gpu, ft, acceptable, *, xid=None, decisive=None, node_fault=True):
    """truth.json fields of one incident; a node fault must never drain the other nodes, an
    application fault none. ``xid`` only where the fault is an XID."""
    d = {"fault_kind": fault_kind, "category": category, "culprit_node": host, "culprit_gpu": gpu,
         "fault_time": iso(ft), "decisive_time": iso(decisive or ft), "expect_incident": True,
         "acceptable_actions": list(acceptable),
         "never_drain": [n for n in NODES if n != host] if node_fault else NODES}
    if xid is not None:
        d["xid"] = xid
    return d


def watchdog_abort(inc, t, host, rank, error):
    """PyTorch's ProcessGroupNCCL watchdog giving up on a rank with ``error``."""
    inc.j(t, host, torchglog(rank, t, "E", "ProcessGroupNCCL.cpp:1595",
                             f"[PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: {error}"))


def common(inc, end_iter, fail_t=None):
    random.seed(zlib.crc32(inc.name.encode()))
    for n in NODES:
        t = T0 - timedelta(seconds=40)
        inc.k(t, n, "Linux version 6.5.0-1024-nvidia (buildd@lcy02-amd64-044) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0) #25-Ubuntu SMP")
        inc.k(t + timedelta(seconds=1), n, "nvidia-nvlink: Nvlink Core is being initialized, major device number 506")
        inc.k(t + timedelta(seconds=2), n, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024")
        inc.k(t + timedelta(seconds=3), n, "mlx5_core 0000:0c:00.0: firmware version: 28.39.1002")
        inc.k(t + timedelta(seconds=4), n, "mlx5_core 0000:0c:00.0 ibp12s0: Link up")
        inc.k(t + timedelta(seconds=5), n, "IPv6: ADDRCONF(NETDEV_CHANGE): ibp12s0: link becomes ready")
        inc.k(t + timedelta(seconds=6), n, "nvidia-peermem nv_mem_init:100 kernel module loaded")
        inc.k(t + timedelta(seconds=9), n, f"dhclient[1311]: DHCPREQUEST for {IPS[n].replace('10.0.0', '192.168.10')} on eno1 to 192.168.10.1 port 67 (xid=0x5e3f2a1b)")
        # job start
        lr = NODES.index(n) * 8
        inc.j(T0, n, f"{glog(T0, 'W')} 140211 torch/distributed/run.py:793] ")
        inc.j(T0, n, f"{glog(T0, 'W')} 140211 torch/distributed/run.py:793] *****************************************")
        inc.j(T0, n, f"{glog(T0, 'W')} 140211 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ")
        inc.j(T0 + timedelta(seconds=1), n, "NCCL_DEBUG=WARN NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=ibp12s0 NCCL_ASYNC_ERROR_HANDLING=1")
        for g in range(8):
            ts = T0 + timedelta(seconds=8, milliseconds=g * 13)
            pid = 52731 + g
            inc.j(ts, n, f"{n}:{pid}:{pid} [{g}] NCCL INFO Bootstrap : Using ibp12s0:{IPS[n]}<0>")
            inc.j(ts, n, f"{n}:{pid}:{pid} [{g}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ibp12s0:{IPS[n]}<0>")
            inc.j(ts, n, f"{n}:{pid}:{pid} [{g}] NCCL INFO comm 0x5581c2a0 rank {lr + g} nranks 32 cudaDev {g} nvmlDev {g} busId {PCIS[g].replace(':', '')}0 commId 0x8a1f3c2b9d4e5f60 - Init COMPLETE")
    last = NODES[-1]
    step_ms = 812.0
    t = T0 + timedelta(seconds=30)
    for it in range(10, end_iter + 1, 10):
        t = t + timedelta(milliseconds=step_ms * 10 + random.uniform(-40, 40))
        if fail_t is not None and t >= fail_t:
            break
        ms = step_ms + random.uniform(-15, 15)
        loss = 7.5 - it * 0.004 + random.uniform(-0.02, 0.02)
        inc.j(t, last, f"[{t.strftime('%Y-%m-%d %H:%M:%S')}] iteration {it:8d}/  500000 | consumed samples: {it * 512:12d} | elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.500000E-04 | global batch size:   512 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {1.2 + random.uniform(-0.1, 0.1):.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")
    return t


def teardown(inc, t, failing=True):
    for n in NODES:
        if failing:
            inc.j(t, n, f"{glog(t, 'E')} 140211 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 0 (pid: 52731) of binary: /usr/bin/python3")
            inc.j(t + timedelta(seconds=5), n, f"srun: error: {n}: task {NODES.index(n)}: Exited with exit code 1")
        else:
            inc.j(t, n, f"{glog(t)} 140211 torch/distributed/elastic/agent/server/api.py:879] [default] worker group successfully finished. Waiting 300 seconds for other agents to finish.")


def watchdog_timeouts(inc, t, nodes, seq=48213):
    for n in nodes:
        for g in range(8):
            r = NODES.index(n) * 8 + g
            ts = t + timedelta(milliseconds=37 * g + 11 * r)
            inc.j(ts, n, torchglog(r, ts, "E", "ProcessGroupNCCL.cpp:616", f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000) ran for 600047 milliseconds before timing out."))
        ts = t + timedelta(seconds=1)
        r = NODES.index(n) * 8
        watchdog_abort(inc, ts, n, r, f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000) ran for 600047 milliseconds before timing out.")


def xid79():
    inc = Inc("xid79_nccl_cascade")
    ft = T0 + timedelta(minutes=6, microseconds=123457)
    common(inc, 2000, ft)
    host, g = "gpu-n02", 6
    inc.k(ft, host, f"NVRM: Xid (PCI:0000:{PCIS[g]}): 79, pid=52737, name=python3, GPU has fallen off the bus.")
    inc.k(ft + timedelta(microseconds=45), host, f"NVRM: GPU 0000:{PCIS[g]}.0: GPU has fallen off the bus.")
    inc.k(ft + timedelta(microseconds=80), host, "NVRM: A GPU crash dump has been created. If possible, please run")
    inc.k(ft + timedelta(microseconds=80), host, "NVRM: nvidia-bug-report.sh as root to collect this data before")
    inc.k(ft + timedelta(microseconds=80), host, "NVRM: the NVIDIA kernel module is unloaded.")
    inc.k(ft + timedelta(seconds=1), host, f"NVRM: Xid (PCI:0000:{PCIS[g]}): 45, pid=52737, name=python3, Ch 00000010")
    r = 8 + g
    t1 = ft + timedelta(milliseconds=333)
    watchdog_abort(inc, t1, host, r, "CUDA error: unspecified launch failure")
    inc.j(t1, host, f"{host}:52737:53101 [{g}] NCCL WARN Cuda failure 'unspecified launch failure'")
    watchdog_timeouts(inc, ft + timedelta(seconds=600, milliseconds=41), ["gpu-n01", "gpu-n03", "gpu-n04"])
    teardown(inc, ft + timedelta(seconds=606))
    inc.write(truth("xid79_cascade", "xid", host, g, ft, ["drain_node", "requeue_job", "reset_gpu"], xid=79))


def xid48():
    inc = Inc("xid48_row_remap")
    ft = T0 + timedelta(minutes=4, seconds=12, microseconds=500000)
    common(inc, 2000, ft)
    host, g = "gpu-n03", 2
    inc.k(ft, host, f"NVRM: Xid (PCI:0000:{PCIS[g]}): 48, pid=52733, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")
    inc.k(ft + timedelta(milliseconds=2), host, f"NVRM: Xid (PCI:0000:{PCIS[g]}): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.")
    inc.k(ft + timedelta(seconds=2), host, f"NVRM: Xid (PCI:0000:{PCIS[g]}): 45, pid=52733, name=python3, Ch 00000008")
    r = 16 + g
    t1 = ft + timedelta(milliseconds=180)
    tb = [
        f"[rank{r}]: Traceback (most recent call last):",
        f'[rank{r}]:   File "/workspace/megatron/pretrain_gpt.py", line 243, in <module>',
        f"[rank{r}]:     pretrain(train_valid_test_datasets_provider,",
        f'[rank{r}]:   File "/workspace/megatron/megatron/training/training.py", line 355, in pretrain',
        f"[rank{r}]:     iteration, num_floating_point_operations_so_far = train(",
        f'[rank{r}]:   File "/workspace/megatron/megatron/training/training.py", line 1246, in train',
        f"[rank{r}]:     torch.cuda.synchronize()",
        f"[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        f"[rank{r}]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    ]
    inc.lines(t1, host, tb)
    for n in ["gpu-n01", "gpu-n02", "gpu-n04"]:
        r0 = NODES.index(n) * 8
        t2 = ft + timedelta(seconds=2, milliseconds=10 * r0)
        inc.j(t2, n, f"{n}:{52731}:{53120} [0] NCCL INFO [Service thread] Connection closed by localRank 0")
        watchdog_abort(inc, t2, n, r0, "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
    teardown(inc, ft + timedelta(seconds=8))
    inc.write(truth("xid48_row_remap", "ecc_memory", host, g, ft, ["drain_node", "requeue_job", "reset_gpu"], xid=48))


def ib_down():
    inc = Inc("ib_link_down")
    ft = T0 + timedelta(minutes=3, seconds=41, microseconds=250000)
    common(inc, 2000, ft)
    host = "gpu-n04"
    inc.k(ft - timedelta(seconds=2), host, "mlx5_core 0000:0c:00.0: mlx5_port_module_event:1175:(pid 0): Port module event[error]: module 0, Cable error, Bad or shorted cable/module")
    inc.k(ft, host, "mlx5_core 0000:0c:00.0 ibp12s0: Link down")
    for n in ["gpu-n01", "gpu-n02", "gpu-n03"]:
        for g in (0, 3):
            t1 = ft + timedelta(seconds=19, milliseconds=NODES.index(n) * 40 + g)
            pid = 52731 + g
            inc.j(t1, n, f"{n}:{pid}:{pid + 281} [{g}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer {IPS[host]}<{43211 + g}> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:{IPS[n]} remoteGids::ffff:{IPS[host]} hca mlx5_{g % 4}")
            inc.j(t1, n, f"{n}:{pid}:{pid + 281} [{g}] NCCL INFO transport/net.cc:1298 -> 6")
        r0 = NODES.index(n) * 8
        t2 = ft + timedelta(seconds=20)
        watchdog_abort(inc, t2, n, r0, f"NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\nLast error:\nNET/IB : Got completion from peer {IPS[host]}<43211> with status=12 opcode=0 len=0 vendor err 129 (Recv)")
    teardown(inc, ft + timedelta(seconds=25))
    inc.write(truth("ib_link_down", "infiniband_link", host, None, ft - timedelta(seconds=2),
                    ["drain_node", "requeue_job", "investigate"]))


def user_exc():
    inc = Inc("user_exception")
    ft = T0 + timedelta(minutes=2, seconds=3, microseconds=1000)
    common(inc, 2000, ft)
    host, r = "gpu-n01", 0
    tb = [
        f"[rank{r}]: Traceback (most recent call last):",
        f'[rank{r}]:   File "/workspace/train.py", line 212, in <module>',
        f"[rank{r}]:     main()",
        f'[rank{r}]:   File "/workspace/train.py", line 188, in main',
        f"[rank{r}]:     batch = collate(samples)",
        f'[rank{r}]:   File "/workspace/data.py", line 57, in collate',
        f'[rank{r}]:     ids = [s["input_ids"] for s in samples]',
        f'[rank{r}]:   File "/workspace/data.py", line 57, in <listcomp>',
        f'[rank{r}]:     ids = [s["input_ids"] for s in samples]',
        f"[rank{r}]: KeyError: 'input_ids'",
    ]
    inc.lines(ft, host, tb)
    t2 = ft + timedelta(seconds=3)
    inc.j(t2, host, f"{glog(t2, 'E')} 140211 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 52731) of binary: /usr/bin/python3")
    inc.j(t2, host, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    for n in NODES[1:]:
        t3 = t2 + timedelta(seconds=1)
        inc.j(t3, n, f"{glog(t3, 'W')} 140211 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 52731 closing signal SIGTERM")
    inc.write(truth("user_exception", "software_exception", host, None, ft, ["none", "investigate"], node_fault=False))


def gpu_oom():
    inc = Inc("gpu_oom")
    ft = T0 + timedelta(minutes=1, seconds=12, microseconds=300000)
    common(inc, 2000, ft)
    host, g = "gpu-n02", 5
    r = 8 + g
    tb = [
        f"[rank{r}]: Traceback (most recent call last):",
        f'[rank{r}]:   File "/workspace/train.py", line 201, in <module>',
        f"[rank{r}]:     loss.backward()",
        f'[rank{r}]:   File "/usr/local/lib/python3.10/dist-packages/torch/autograd/__init__.py", line 289, in backward',
        f"[rank{r}]:     _engine_run_backward(",
        f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {g} has a total capacity of 79.15 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.91 GiB memory in use. Of the allocated memory 74.02 GiB is allocated by PyTorch, and 2.11 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]
    inc.lines(ft, host, tb)
    teardown(inc, ft + timedelta(seconds=4))
    inc.write(truth("gpu_oom", "oom_gpu", host, g, ft, ["none", "investigate"], node_fault=False))


def healthy():
    inc = Inc("healthy")
    t = common(inc, 600)
    teardown(inc, t + timedelta(seconds=2), failing=False)
    inc.write({"fault_kind": "healthy", "category": None, "culprit_node": None, "culprit_gpu": None,
               "fault_time": None, "decisive_time": None, "expect_incident": False,
               "acceptable_actions": ["none"], "never_drain": NODES})


for f in (xid79, xid48, ib_down, user_exc, gpu_oom, healthy):
    f()
