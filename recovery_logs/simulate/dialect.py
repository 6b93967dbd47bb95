"""Wording variants: the same fault written the ways real software versions write it.

Real logs disagree with one another: NCCL prints ``file:line`` before ``NCCL WARN``, older NCCL
writes IB completion errors as ``with error 12, opcode …``, older PyTorch says ``cuda runtime
error (77) : …`` and ``CUDA out of memory. Tried to allocate … (GPU 3; … total capacity; …)``,
drivers write ``pid='<unknown>', name=<unknown>,`` or only ``pid=N,`` before an Xid's payload,
Xid 45 says ``caused by previous Xid 149`` as well as ``Preemptive Cleanup, due to previous Xid``,
Slurm's older cgroup plugin says ``Detected 1 oom-kill event(s) in step 1234.0 cgroup``. The
forms follow the real-log corpus (``tests/corpus/real/dev``: e.g. NVIDIA/nccl#928, #1405, #1920,
pytorch/pytorch#16417, #59778, pytorch-ofa#271, open-gpu-kernel-modules#1150, pybnf#118); the
values in them (addresses, ports, codes, sizes, PCI ids) come from the simulated cluster.

Training-output timing (issue 13 §5) varies too: per-rank lines as ``step N step_time=Xs`` or as
Megatron/NeMo's ``[rankN] step N timing: forward-compute … ms | backward-compute … ms | optimizer … ms``;
and rank 0 / the last rank may add reports that compare ranks — Megatron-LM's ``(min, max) time across
ranks (ms):`` timer block (megatron/core/timers.py) or its StragglerDetector line ``MnRtt/Rnk: … |
MxRtt/Rnk: …`` with GPU power/temperature/clock extremes (megatron/core/utils.py). A hot GPU's health
report follows DCGM 4 (``Detected clocks event due to thermal violation``), DCGM 3 (``Detected clock
throttling due to thermal violation``) or an ``nvidia-smi -q`` clocks-event block (``HW Thermal Slowdown
: Active``; older drivers title it ``Clocks Throttle Reasons``), as NVIDIA/DCGM#270 and the nvidia-smi
pastes in the corpus show. ``dcgmi diag`` prints its thermal-violation warning inside its result table,
which wraps the text mid-word (stas00/ml-engineering's faulty-node paste).

A GPU out-of-memory is written in the words of the stack that hit it (``oom_stack``): PyTorch's CUDA
caching allocator, the same allocator on ROCm (``HIP out of memory``), XLA/JAX (``RESOURCE_EXHAUSTED:
Out of memory while trying to allocate N bytes.``), cuBLAS failing to create its handle
(``CUBLAS_STATUS_ALLOC_FAILED``) or vLLM finding no memory for its KV cache — the families of the
corpus's ``d5g-*`` OOM excerpts (ROCm/TheRock#2118-style HIP pastes, jax-ml/jax#13428,
QwenLM/Qwen3#873, vllm-project/vllm#10439), values from the simulated cluster.

Before a GPU runs out of memory a ZeRO-3 job often warns for a while that DeepSpeed flushes the PyTorch
caching allocator every step (``N pytorch allocator cache flushes since last step. this happens when there is
high memory pressure ...``, deepspeed/runtime/zero/stage3.py; ``oom_pressure``), as the corpus's
``d6g-dsex186-*`` and ``d6g-easycontext11-*`` excerpts show.

A host OOM kill is often seen from the job's side only — slurmstepd's oom_kill count and srun's
``task N: Out Of Memory`` line without the kernel's OOM-killer report (NOAA-EMC/global-workflow#1301,
pepkit/geofetch#13 in the corpus).

After a collective timeout, PyTorch 2.3+ ranks report the watchdog's dump signal, naming the rank whose
watchdog fired first (``Received a dump signal due to a collective timeout from  rank N``; the corpus's
lsdefine/simple_GRPO#46, vllm-project/vllm-omni#2928, PrimeIntellect-ai/prime-rl#3186 pastes).

Megatron-LM prints its iteration line with a space before the bracketed time (``" [2024-05-01 10:00:00]
iteration  100/ 500000 | …"``, megatron/training/training.py ``training_log``), as the corpus's
epfLLM/Megatron-LLM#11 paste shows; a reader that takes every indented job line for a continuation joins
a whole run of them into one record (``iteration_indent``).

The job side of an NVLink fault is either NCCL's ``unhandled cuda error`` or the CUDA runtime's contained
error (``CUDA error: Invalid access of peer GPU memory over nvlink or a hardware error``, CUDA 12's
``CUDA_ERROR_CONTAINED``; the corpus's ``d7-marin8934-*``), and a GPU fault's recovery verdict is written as
the driver's Xid 154, as DCGM's health text (``GPU N requires a reset to recover from a fault. Recovery
action: 1 (GPU_RESET).``, dcgm_errors.h) or as ``nvidia-smi -q``'s ``GPU Reset Status`` block
(``Reset Required : Yes``) — the ``d7-*`` excerpts' families (``recovery_report``).

A host OOM's victim is reported by whatever launched it (``oom_victim_report``): torchrun's ChildFailedError
table (``exitcode  : -9``), MPICH/Intel MPI hydra's end-of-job banner (``KILLED BY SIGNAL: 9 (Killed)``, older
releases ``EXIT CODE: 9``; pmodels/mpich src/pm/hydra) or the batch shell's own job report (``line N: PID Killed``,
bash's ``Killed`` for a SIGKILLed foreground job) — the corpus's ``e17-jukebox155-*``, ``e17-mplbm92-*`` and
``arjuna-52-*`` families. A node that dies and comes back under its job is re-registered by slurmctld
(``node_fail_return``): ``Node N now responding``, ``validate_node_specs: Node N unexpectedly rebooted
boot_time=… last response=…`` and, for the batch host, ``Batch JobId=J missing from batch node N (not found
BatchStartTime after startup)`` (SchedMD/slurm src/slurmctld/node_mgr.c, job_mgr.c).

A ``Dialect`` is drawn once per scenario run from its own random stream (so the other lines of a
run keep their bytes); ``Dialect()`` is the wording the simulator wrote before variants existed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

# CUDA runtime error numbers of the old (pre CUDA 10.1 / THC) messages, by message
OLD_CUDA_CODES = {"an illegal memory access was encountered": 77, "unspecified launch failure": 4,
                  "uncorrectable ECC error encountered": 39, "device-side assert triggered": 59}
# who words a GPU out-of-memory (Dialect.oom_stack)
OOM_STACKS = ("torch", "hip", "xla", "cublas", "vllm")
DIAG_CELL = 46      # width of the result column of `dcgmi diag`'s table
# who reports a host-OOM victim (Dialect.oom_victim_report)
OOM_VICTIM_REPORTS = ("elastic", "hydra", "shell")


@dataclass(frozen=True)
class Dialect:
    nccl_warn_src: bool = False        # `host:pid:tid [g] transport/net_ib.cc:1295 NCCL WARN …`
    ib_completion_old: bool = False    # `Got completion from peer IP<port> with error 12, opcode N, len N, vendor err 129`
    nccl_transport: str = "ib"         # "socket": NET/Socket `socketProgressOpt: Call to recv from … failed`
    ib_async_event: bool = False       # `NET/IB : Got async event : port error` before a link-down job failure
    xid_who: str = "named"             # named: `pid=N, name=python3,` | unknown: `pid='<unknown>', name=<unknown>,` | pid
    xid45_form: str = "preemptive"     # preemptive: `Preemptive Cleanup, due to previous Xid N` | caused_by
    watchdog_numel: bool = True        # WorkNCCL(… NumelIn=…, NumelOut=… …) (False: older PyTorch)
    cuda_old: bool = False             # `RuntimeError: cuda runtime error (77) : … at …THC….cpp:N`
    oom_old: bool = False              # `RuntimeError: CUDA out of memory. Tried to allocate … (GPU 3; … free; …)`
    oomkill_old: bool = False          # `Detected 1 oom-kill event(s) in step J.0 cgroup. …`
    rank_timing: str = "step_time"     # per-rank lines: step_time | phase (`timing: forward-compute … ms | …`)
    timing_report: str = "none"        # none | megatron_timers (`(min, max) time across ranks`) | megatron_straggler
    thermal_form: str = "dcgm4"        # dcgm4 `clocks event due to thermal violation` | dcgm3 `clock throttling …` | smi
    oom_stack: str = "torch"           # torch | hip | xla | cublas | vllm (who words a GPU OOM)
    thermal_table: bool = False        # DCGM forms: a `dcgmi diag` result table, text wrapped mid-word
    host_oom_seen: str = "kernel"      # kernel: the OOM killer's lines are in the log too | job: only the job's own lines
    oom_pressure: bool = False         # DeepSpeed ZeRO-3 allocator-cache-flush warnings in the steps before a GPU OOM
    watchdog_dump: bool = False        # PyTorch >= 2.3 ranks after a collective timeout: `Received a dump signal due to a
                                       # collective timeout from this local rank` / `… from  rank N` (the first to time out)
    iteration_indent: bool = False     # Megatron's iteration line as Megatron prints it: f" [{time}]" + " iteration …",
                                       # one space before the time (epfLLM/Megatron-LLM#11 in the corpus)
    nvlink_job_error: str = "nccl"     # nccl: `NCCL error … unhandled cuda error` | contained: CUDA's contained error
    recovery_report: str = "xid154"    # xid154: `Xid 154, GPU recovery action changed …` | dcgm: DCGM's `Recovery
                                       # action: 1 (GPU_RESET).` | smi: nvidia-smi -q `GPU Reset Status` block
    thermal_exporter: str = "none"     # none: thermal_form decides | bitmask: dcgm-exporter's clock-event reasons gauge
                                       # (`DCGM_FI_DEV_CLOCKS_EVENT_REASONS{…} 96`) | count: its per-reason event count
                                       # (`DCGM_EXP_CLOCK_EVENTS_COUNT{…,clock_event="hw_thermal",…} N`), instead
    step_line: str = "kv"              # per-rank step lines (rank_timing step_time): kv `step N step_time=X.XXXs` |
                                       # tf: the TensorFlow tutorials' `step N, loss = L (E examples/sec; X sec/batch)`
                                       # (written in runs with slow ranks only)
    oom_victim_report: str = "elastic"  # elastic: torchrun's ChildFailedError (exitcode -9) | hydra: MPICH's
                                       # BAD TERMINATION banner | shell: the batch script's `line N: PID Killed`
    node_fail_return: bool = False     # a dead node reboots and re-registers with slurmctld under its job

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Dialect:
        """Every variant with probability 1/2 (the three-way forms 1/3 each); later fields are drawn after
        the earlier ones, so adding a field leaves the earlier draws of a seed unchanged."""
        coin = lambda: bool(rng.random() < 0.5)  # noqa: E731
        return cls(nccl_warn_src=coin(), ib_completion_old=coin(), nccl_transport="socket" if coin() else "ib",
                   ib_async_event=coin(), xid_who=str(rng.choice(["named", "unknown", "pid"])),
                   xid45_form="caused_by" if coin() else "preemptive", watchdog_numel=coin(), cuda_old=coin(),
                   oom_old=coin(), oomkill_old=coin(),
                   rank_timing="phase" if coin() else "step_time",
                   timing_report=str(rng.choice(["none", "megatron_timers", "megatron_straggler"])),
                   thermal_form=str(rng.choice(["dcgm4", "dcgm3", "smi"])),
                   oom_stack=str(rng.choice(list(OOM_STACKS))), thermal_table=coin(),
                   host_oom_seen="job" if coin() else "kernel", oom_pressure=coin(), watchdog_dump=coin(),
                   iteration_indent=coin(),
                   nvlink_job_error="contained" if coin() else "nccl",
                   recovery_report=str(rng.choice(["xid154", "dcgm", "smi"])),
                   thermal_exporter=str(rng.choice(["none", "bitmask", "count"])),
                   step_line="tf" if coin() else "kv",
                   # host/scheduler side (issue 13, E7), drawn after every earlier field
                   oom_victim_report=str(rng.choice(list(OOM_VICTIM_REPORTS))), node_fail_return=coin())

    def names(self) -> dict[str, object]:
        """The variants drawn for the run (for truth.json): those that differ from the default wording. A
        variant shows only where the scenario writes that kind of line (an OOM wording in an OOM run)."""
        base = Dialect()
        return {k: v for k, v in self.__dict__.items() if getattr(base, k) != v}

    # -- wording helpers -------------------------------------------------------------------------
    def xid_who_text(self, pid: int) -> str:
        """What the driver writes between the Xid code and its payload."""
        if self.xid_who == "unknown":
            return "pid='<unknown>', name=<unknown>, "
        if self.xid_who == "pid":
            return f"pid={pid}, "
        return f"pid={pid}, name=python3, "

    def xid45_tail(self, channel: int, cause: int) -> str:
        if self.xid45_form == "caused_by":
            return f"Ch {channel:08x} caused by previous Xid {cause}"
        return f"Preemptive Cleanup, due to previous Xid {cause}"

    def cuda_error(self, err: str, line: int) -> str:
        """The exception line of a CUDA runtime error."""
        code = OLD_CUDA_CODES.get(err)
        if self.cuda_old and code is not None:
            return (f"RuntimeError: cuda runtime error ({code}) : {err} at "
                    f"/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:{line}")
        return f"RuntimeError: CUDA error: {err}"

    def ib_completion(self, peer_ip: str, port: int, status: int, opcode: int) -> str:
        if self.ib_completion_old:
            return (f"WARN NET/IB : Got completion from peer {peer_ip}<{port}> with error {status}, opcode {opcode}, "
                    f"len {opcode}, vendor err 129 (Recv)")
        return (f"WARN NET/IB : Got completion from peer {peer_ip}<{port}> with status={status} opcode={opcode} "
                f"len=0 vendor err 129 (Recv) localGid ::ffff:0.0.0.0 remoteGids::ffff:{peer_ip}")

    def thermal_report(self, gpu: int, bus: str, smi_old: bool) -> list[str]:
        """The lines a GPU health check prints for a GPU whose clocks the driver cut for temperature."""
        if self.thermal_form == "smi":
            title = "Clocks Throttle Reasons" if smi_old else "Clocks Event Reasons"
            return [f"GPU 00000000:{bus}:00.0", "    Performance State                     : P0", f"    {title}",
                    "        Idle                              : Not Active",
                    "        Applications Clocks Setting       : Not Active",
                    "        SW Power Cap                      : Not Active",
                    "        HW Slowdown                       : Active",
                    "            HW Thermal Slowdown           : Active",
                    "            HW Power Brake Slowdown       : Not Active",
                    "        Sync Boost                        : Not Active",
                    "        SW Thermal Slowdown               : Active",
                    "        Display Clock Setting             : Not Active"]
        if self.thermal_table:   # dcgmi diag: DCGM_FR_THERMAL_VIOLATIONS_TS in the result table
            msg = (f"GPU {gpu} Thermal violations totaling {12.0 + gpu % 5:.1f} seconds started at {9.7 + gpu:.1f} "
                   f"seconds into the test for GPU {gpu} Verify that the cooling on this machine is functional, "
                   "including external, thermal material interface, fans, and any other components.")
            cells = [msg[i:i + DIAG_CELL] for i in range(0, len(msg), DIAG_CELL)]
            rows = [f"| {'Warning' if i == 0 else '':<25} | {c:<{DIAG_CELL}} |" for i, c in enumerate(cells)]
            return ["| Diagnostic                | Result                                         |",
                    "+===========================+================================================+", *rows]
        what = "clocks event" if self.thermal_form == "dcgm4" else "clock throttling"
        return [f"ERROR [{4000 + gpu}:{4002 + gpu}] [[Health]] Detected a WARNING in health system Thermal: 'Detected "
                f"{what} due to thermal violation in GPU {gpu}. Verify that the cooling on this machine is functional, "
                "including external, thermal material interface, fans, and any other components."]

    def exporter_thermal_report(self, gpu: int, host: str, k: int) -> list[str]:
        """A hot GPU as dcgm-exporter's scrape shows it (``thermal_exporter``), the ``k``-th scrape: the clock-event
        reasons bitmask (NVIDIA/DCGM dcgm_fields.h: 0x20 SW thermal, 0x40 HW thermal, 0x8 HW slowdown) or the
        per-reason count over its 5-minute window (NVIDIA/dcgm-exporter#254/#261), the other GPUs at idle/none."""
        def lab(g: int) -> str:
            return (f'gpu="{g}",UUID="GPU-{stable_uuid(host, g)}",device="nvidia{g}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"')
        labels = lab(gpu)
        if self.thermal_exporter == "bitmask":
            bits = (0x20 | 0x40, 0x20, 0x40 | 0x08)[k % 3]
            other = lab((gpu + 1) % 8)
            return ["# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge",
                    f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}} {bits}",
                    f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{other}}} 0"]
        window = 'window_size_in_ms="300000"'
        return ["# TYPE DCGM_EXP_CLOCK_EVENTS_COUNT gauge",
                f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="sw_thermal",{window}}} {2 + k % 4}',
                f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="hw_thermal",{window}}} {1 + k % 2}',
                f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="power_cap",{window}}} 0']

    def nvlink_job_error_line(self, nccl_version: str) -> str:
        """The exception line of the rank whose GPU lost its NVLink."""
        if self.nvlink_job_error == "contained":
            return "RuntimeError: CUDA error: Invalid access of peer GPU memory over nvlink or a hardware error"
        return ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
                f"unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version {nccl_version}")

    def recovery_lines(self, gpu: int, pci: str, bus: str) -> tuple[str, list[str]]:
        """The GPU's recovery verdict (a GPU reset) after a fault: (``kern`` | ``job``, lines)."""
        if self.recovery_report == "dcgm":   # DCGM health watch (dcgm_errors.h DCGM_FR_GPU_RECOVERY_RESET_MSG)
            return "job", [f"ERROR [{4000 + gpu}:{4002 + gpu}] [[Health]] GPU {gpu} requires a reset to recover from a "
                           "fault. Recovery action: 1 (GPU_RESET)."]
        if self.recovery_report == "smi":    # nvidia-smi -q, GPU Reset Status section
            return "job", [f"GPU 00000000:{bus}:00.0", "    GPU Reset Status",
                           "        Reset Required                    : Yes",
                           "        Drain and Reset Recommended       : No"]
        return "kern", [f"NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
                        "Required)"]

    @staticmethod
    def oom_pressure_warning(flushes: int) -> str:
        """DeepSpeed ZeRO-3's warning when the caching allocator had to be flushed ``flushes`` times in a step."""
        return (f"{flushes} pytorch allocator cache flushes since last step. this happens when there is high memory "
                "pressure and is detrimental to performance. if this is happening frequently consider adjusting "
                "settings to reduce memory consumption. If you are unable to make the cache flushes go away consider "
                "adding get_accelerator().empty_cache() calls in your training loop to ensure that all ranks flush "
                "their caches at the same time")

    def gpu_oom(self, gpu: int) -> str:
        """The exception line of a GPU out-of-memory on GPU ``gpu`` (2 GiB asked for, as the torch form)."""
        if self.oom_stack == "hip":
            return ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU "
                    f"{gpu} has a total capacity of 191.98 GiB of which 1.23 GiB is free. Of the allocated memory "
                    "185.20 GiB is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated. If "
                    "reserved but unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:"
                    "True to avoid fragmentation.  See documentation for Memory Management  "
                    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
        if self.oom_stack == "xla":
            return "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes."
        if self.oom_stack == "cublas":
            return "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
        if self.oom_stack == "vllm":
            return ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                    "when initializing the engine.")
        if self.oom_old:   # PyTorch < 2.1 wording
            return (f"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU {gpu}; 79.10 GiB total "
                    "capacity; 75.20 GiB already allocated; 1.23 GiB free; 76.32 GiB reserved in total by PyTorch)")
        return ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                f"GPU {gpu} has a total capacity of 79.10 GiB of which 1.23 GiB is free. Including non-PyTorch "
                "memory, this process has 77.85 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by "
                "PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
                "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


    # -- host/scheduler-side wording (issue 13, E7) ------------------------------------------------
    @staticmethod
    def hydra_banner(rank: int, pid: int, host: str, old: bool) -> list[str]:
        """MPICH/Intel MPI hydra's end-of-job banner for a rank killed by SIGKILL (pmodels/mpich src/pm/hydra
        ui/mpich/utils.c); ``old``: the releases that print the signal as ``EXIT CODE: 9`` and add MPICH2's exit
        string."""
        rule = "=" * 83
        if old:
            return [rule, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", f"=   PID {pid} RUNNING AT {host}",
                    "=   EXIT CODE: 9", "=   CLEANING UP REMAINING PROCESSES", "=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES",
                    rule, "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)"]
        return [rule, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", f"=   RANK {rank} PID {pid} RUNNING AT {host}",
                "=   KILLED BY SIGNAL: 9 (Killed)", rule]

    @staticmethod
    def shell_killed(job: str, line: int, pid: int) -> str:
        """bash's report of a SIGKILLed foreground command in the batch script (``Killed`` is strsignal(9))."""
        return f"/var/spool/slurmd/job{job}/slurm_script: line {line}: {pid:>6} Killed                  python3 -u train.py"


__all__ = ["DIAG_CELL", "OLD_CUDA_CODES", "OOM_STACKS", "OOM_VICTIM_REPORTS", "Dialect"]


def stable_uuid(host: str, gpu: int) -> str:
    """A GPU UUID-shaped id that depends only on (host, gpu): the same GPU keeps its id across lines."""
    h = hashlib.sha1(f"{host}/{gpu}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
