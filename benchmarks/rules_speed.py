"""Benchmark: rule matching (``recovery_logs.detectors.rules.match``) lines/s.

Generates ~1.5 M mixed log lines (by default 3 % that some rule wins, the rest ordinary chatter:
kernel, systemd, dataloader, NCCL INFO, HTTP, checkpoint lines) and times ``match()`` on the
whole batch, on one core by default (POLARS_MAX_THREADS=1 is set before Polars is imported).

    python benchmarks/rules_speed.py [--lines 1500000] [--match-frac 0.03] [--threads 1] [--repeat 3]

Prints one JSON object: lines, findings, best/median wall seconds, lines/s, best CPU seconds and
lines per CPU-second (steadier on a shared machine), and the prefilter's candidate fraction.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_500_000)
    p.add_argument("--match-frac", type=float, default=0.03)
    p.add_argument("--threads", type=int, default=1, help="POLARS_MAX_THREADS (default 1 = one core)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--baseline-lines", type=int, default=200_000,
                   help="lines for the plain Python `re` loop baseline (same rules, same order); 0 = skip")
    return p.parse_args()


def python_re_loop(msgs: list[str], pack) -> tuple[int, float]:
    """The naive alternative: per line, try each rule (literal check, then `re.search`) in order."""
    import re

    compiled = [(r, [re.compile(p) for p in r.patterns]) for r in pack.rules]
    t0 = time.perf_counter()
    found = 0
    for m in msgs:
        for r, pats in compiled:
            if r.literals and not any(lit in m for lit in r.literals):
                continue
            if any(p.search(m) for p in pats):
                found += 0 if r.suppress else 1
                break
    return found, time.perf_counter() - t0


NOISE = [
    "audit: type=1400 audit({t}.123:{n}): apparmor=\"ALLOWED\" operation=\"open\" profile=\"snap.lxd\" pid={n}",
    "systemd[1]: Started Session {n} of user root.",
    "[rank{r}]: dataloader worker {w} prefetched batch {n} in 0.0{w}s",
    "[rank{r}]: checkpoint saved to /ckpt/run-184/step_{n}.pt in 38.2s",
    "gpu-n{w}:33{w}5:3400 [{r}] NCCL INFO Channel {w:02d}/32 :    0   1   2   3   4   5   6   7",
    "10.0.{w}.{r} - - [29/Nov/2026:14:0{w}:00 +0000] \"GET /metrics HTTP/1.1\" 200 {n} \"-\" \"Prometheus/2.45\"",
    "slurmd: debug:  _rpc_terminate_job: uid = 450 JobId={n}",
    "kernel: EXT4-fs (nvme0n1p{w}): mounted filesystem with ordered data mode. Quota mode: none.",
    "sshd[{n}]: Accepted publickey for ops from 10.0.0.{r} port {n} ssh2: ED25519 SHA256:abcdef",
    "[rank{r}]: grad norm 1.2{w}3, tokens this step {n}",
    "launch task StepId={n}.0 request from UID:1001 GID:1001 HOST:10.0.0.{r} PORT:{n}",
    "containerd[812]: time=\"2026-11-29T14:00:00Z\" level=info msg=\"shim disconnected\" id={n}",
]
MATCHES = [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid={n}, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)",
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600412 milliseconds before timing out.",
    "gpu-n{w}:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.0.0.{r}<{n}> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    "[rank{r}]: step {n} | loss 1.9403 | lr 3.0e-04 | tokens/s 100365 | mfu 41.2%",
    "[rank{r}] step {n} step_time=0.45{w}s",
    " iteration {n}/  500000 | consumed samples: 12800 | elapsed time per iteration (ms): 812.{w} | lm loss: 6.5E+00 |",
    "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "pcieport 0000:5e:02.0: AER: Corrected error received: 0000:5e:00.0",
    "mlx5_core 0000:5c:00.0: Port module event[error]: module 0, Cable error, High Temperature",
    "Out of memory: Killed process {n} (python) total-vm:98765432kB, anon-rss:87654321kB",
]


def generate(n: int, frac: float, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        tpl = rnd.choice(MATCHES) if rnd.random() < frac else rnd.choice(NOISE)
        out.append(tpl.format(n=rnd.randrange(1, 10**6), r=rnd.randrange(16), w=rnd.randrange(10),
                              t=1_764_400_000 + rnd.randrange(10**5)))
    return out


def main() -> int:
    a = _args()
    os.environ["POLARS_MAX_THREADS"] = str(a.threads)
    import polars as pl

    from recovery_logs.detectors.rulepack import load_packs
    from recovery_logs.detectors.rules import match
    from recovery_logs.schema import EVENT_SCHEMA, conform

    pack = load_packs()
    msgs = generate(a.lines, a.match_frac, a.seed)
    events = conform(pl.DataFrame({"message": msgs, "seq": range(len(msgs))}), EVENT_SCHEMA)
    cand = events.select(pl.col("message").str.contains_any(list(pack.literals())).mean()).item()
    times, cpu, found = [], [], 0
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        found = match(events, pack).height
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best = min(times)
    base = {}
    if a.baseline_lines:
        sub = msgs[: a.baseline_lines]
        bfound, bsec = python_re_loop(sub, pack)
        base = {"re_loop_lines": len(sub), "re_loop_findings": bfound, "re_loop_lines_per_s": int(len(sub) / bsec),
                "speedup_vs_re_loop": round((a.lines / best) / (len(sub) / bsec), 1)}
    print(json.dumps({
        "lines": a.lines, "match_frac": a.match_frac, "threads": pl.thread_pool_size(),
        "rules": len(pack.rules), "findings": found, "candidate_frac": round(cand, 4),
        "best_s": round(best, 3), "median_s": round(statistics.median(times), 3),
        "lines_per_s": int(a.lines / best), "best_cpu_s": round(min(cpu), 3),
        "lines_per_cpu_s": int(a.lines / min(cpu)), **base,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
