"""Reader throughput: lines/s of ``read_paths`` on generated inputs.

    python benchmarks/readers_speed.py [--lines 1000000] [--dir /tmp/readers_speed]

Generates (once, reused when present) a plain-text mix (half kern.log in RFC3164 with NVRM
lines split over several lines, half torchrun job output with rank prefixes, glog headers and
tracebacks) and a VictoriaLogs JSON-lines export, then reads each with ``read_paths`` and prints
lines/s by wall clock and per CPU-second (the CPU figure is steadier on a shared machine; run
with POLARS_MAX_THREADS=1 for a single-core number), events and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_logs.sources.files import ReadOptions, read_paths  # noqa: E402

KERN = [
    "NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid={p}, GPU has fallen off the bus.",
    "mlx5_core 0000:{b:02x}:00.0: mlx5_port_module_event:1131: Port module event: module 0, Cable plugged",
    "pcieport 0000:{b:02x}:02.0: AER: Corrected error received: 0000:{b:02x}:00.0",
    "systemd[1]: Started Session {p} of user root.",
    "NVRM: GPU at PCI:0000:{b:02x}:00: GPU-1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b",
]
JOB = [
    "[rank{r}]:[E1129 14:{m:02d}:{s:02d}.{u:06d}000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum={p}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)",
    "[rank{r}]: step {p} | loss 1.9403 | lr 3.0e-04 | tokens/s 100365",
    "gpu-n01:12345:12401 [{r}] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "I1129 14:{m:02d}:{s:02d}.{u:06d} 140211 torch/distributed/elastic/agent/server/api.py:869] heartbeat",
]
TB = ["[rank{r}]: Traceback (most recent call last):", '[rank{r}]:   File "train.py", line 88, in <module>',
      "[rank{r}]:     main()", "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered"]
MONTHS = "Nov"


def gen_text(path_kern: Path, path_job: Path, n: int, rnd: random.Random) -> None:
    with open(path_kern, "w") as fk:
        i = 0
        while i < n // 2:
            s = i // 50
            hdr = f"{MONTHS} 29 {14 + s // 3600 % 10:02d}:{s // 60 % 60:02d}:{s % 60:02d} gpu-n01 kernel: "
            if rnd.random() < 0.01:
                for part in ("NVRM: The NVIDIA GPU 0000:cb:00.0", "NVRM: (PCI ID: 10de:2330) installed in this system has",
                             "NVRM: fallen off the bus and is not responding to commands."):
                    fk.write(hdr + f"[{1000 + i / 100:.6f}] " + part + "\n")
                    i += 1
                continue
            msg = rnd.choice(KERN).format(b=rnd.randrange(256), p=rnd.randrange(99999))
            fk.write(hdr + f"[{1000 + i / 100:.6f}] " + msg + "\n")
            i += 1
    with open(path_job, "w") as fj:
        i = 0
        while i < n - n // 2:
            s = i // 50
            kw = dict(r=rnd.randrange(16), m=s // 60 % 60, s=s % 60, u=rnd.randrange(999999), p=i)
            if rnd.random() < 0.002:
                for t in TB:
                    fj.write(t.format(**kw) + "\n")
                    i += 1
                continue
            fj.write(rnd.choice(JOB).format(**kw) + "\n")
            i += 1


def gen_vl(path: Path, n: int, rnd: random.Random) -> None:
    with open(path, "w") as f:
        for i in range(n):
            ns = 1795960800_000_000_000 + i * 1_000_003
            sec, frac = divmod(ns, 1_000_000_000)
            t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"
            h = f"gpu-n{rnd.randrange(64):02d}"
            row = {"_time": t, "_stream_id": f"{zlib.crc32(h.encode()):032x}",
                   "_stream": f'{{host="{h}",unit="train"}}', "_msg": rnd.choice(JOB).format(
                       r=rnd.randrange(16), m=1, s=2, u=3, p=i), "host": h, "unit": "train", "job_id": "184470"}
            f.write(json.dumps(row) + "\n")


def measure(label: str, paths: list[Path], lines: int) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    r = read_paths(paths, ReadOptions(year=2026))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{label:24s} {lines:>9d} lines  wall {dt:6.2f} s = {lines / dt:>9,.0f} lines/s   "
          f"cpu {cpu:6.2f} s = {lines / cpu:>9,.0f} lines/cpu-s   events={r.events.height:,}  "
          f"peak RSS={rss:,.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/readers_speed")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(7)
    kern, job, vl = d / f"gpu-n01.kern.{a.lines}.log", d / f"job-1234.{a.lines}.out", d / f"vl.{a.lines}.jsonl"
    if not (kern.exists() and job.exists()):
        gen_text(kern, job, a.lines, rnd)
    if not vl.exists():
        gen_vl(vl, a.lines, rnd)
    measure("plain text (kern+job)", [kern, job], a.lines)
    measure("VictoriaLogs JSONL", [vl], a.lines)


if __name__ == "__main__":
    main()
