"""Template mining throughput: recovery_logs' vectorised masker vs Drain3, on the same lines.

    python benchmarks/templates_vs_drain3.py [--lines 400000] [--drain3-lines 40000] [--seed 0]

Drain3 runs twice: with the same masks as ours (its MaskingInstruction list — the like-for-like
comparison, since masking is what both do per line) and with its default config (no masks).
Drain3 sees the first ``--drain3-lines`` lines; rates are lines per second of wall time. Prints
one JSON object at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time

import polars as pl

from recovery_logs.detectors.templates import MASKS, mine

TEMPLATES = [
    "NVRM: Xid (PCI:0000:{a:02x}:00): 79, pid={p}, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{a:02x}:00): 48, pid={p}, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition {r}, subpartition 0.",
    "[rank{r}]:[E1120 03:20:{s:02d}.{p:06d} {p} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={p}, OpType=ALLREDUCE, NumelIn={p}, NumelOut={p}, Timeout(ms)=600000) ran for {p} milliseconds before timing out.",
    "gpu-node{r:03d}:{p}:{p} [{g}] NCCL INFO Channel {g:02d}/0 : {r}[{g}] -> {p}[{g}] via P2P/IPC/read",
    "gpu-node{r:03d}:{p}:{p} [{g}] NCCL INFO NET/IB : Using [0]mlx5_{g}:1/IB [1]mlx5_{r}:1/IB ; OOB ib0:10.{g}.{r}.{s}<0>",
    "gpu-node{r:03d}:{p}:{p} [{g}] NCCL WARN NET/IB : Got completion from peer 10.{g}.{r}.{s}<{p}> with status=12 opcode=0 len={p} vendor err 129 (Send) localGid ::ffff:10.{g}.{r}.{s} remoteGids::ffff:10.{r}.{g}.{s}",
    " iteration {p}/  500000 | consumed samples: {p} | elapsed time per iteration (ms): {f:.1f} | learning rate: {e:.3E} | global batch size:  1024 | lm loss: {e:.6E} | loss scale: 1.0 | grad norm: {f:.3f} |",
    "{{'loss': {f:.4f}, 'grad_norm': {f:.4f}, 'learning_rate': {e:.2e}, 'epoch': {f:.2f}}}",
    "mlx5_core 0000:{a:02x}:00.{g}: mlx5_port_module_event:1135:(pid {p}): Port module event: module {g}, Cable unplugged",
    "pcieport 0000:{a:02x}:01.0: AER: Corrected error received: 0000:{a:02x}:00.0",
    "slurmstepd: error: *** STEP {p}.0 ON gpu-node{r:03d} CANCELLED AT 2026-11-20T03:{s:02d}:12 DUE TO TIME LIMIT ***",
    "Saving checkpoint to /lustre/fsw/runs/run_{r}/checkpoints/iter_{p:07d}/mp_rank_{g:02d}/model_optim_rng.pt",
    "GPU-{u} GPU {g} temperature {s}C power {f:.1f} W clocks {p} MHz",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:{p}, remote process exited or there was a network error, NCCL version 2.{g}.{s}",
    "kernel: Out of memory: Killed process {p} (python) total-vm:{p}kB, anon-rss:{p}kB, file-rss:0kB, shmem-rss:{p}kB, UID:{p} pgtables:{p}kB oom_score_adj:0",
]


def make_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choice(TEMPLATES)
        u = f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}"
        out.append(t.format(a=rng.randrange(256), p=rng.randrange(10**6), r=rng.randrange(512), s=rng.randrange(60),
                            g=rng.randrange(8), f=rng.random() * 1000, e=rng.random() * 10, u=u))
    return out


def run_ours(lines: list[str], repeats: int = 3) -> tuple[float, int]:
    s = pl.Series("message", lines, dtype=pl.String)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = mine(s)
        best = min(best, time.perf_counter() - t)
    return len(lines) / best, out["template_id"].n_unique()


def run_drain3(lines: list[str], masked: bool) -> tuple[float, int]:
    from drain3 import TemplateMiner
    from drain3.masking import MaskingInstruction
    from drain3.template_miner_config import TemplateMinerConfig

    logging.getLogger("drain3").setLevel(logging.WARNING)
    cfg = TemplateMinerConfig()
    if masked:
        cfg.masking_instructions = [MaskingInstruction(p, name) for name, p in MASKS]
    tm = TemplateMiner(config=cfg)
    t = time.perf_counter()
    for line in lines:
        tm.add_log_message(line)
    return len(lines) / (time.perf_counter() - t), len(tm.drain.clusters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--drain3-lines", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    lines = make_lines(a.lines, a.seed)
    ours, our_templates = run_ours(lines)
    d_masked, d_masked_t = run_drain3(lines[: a.drain3_lines], masked=True)
    d_plain, d_plain_t = run_drain3(lines[: a.drain3_lines], masked=False)
    result = {
        "lines": a.lines, "drain3_lines": a.drain3_lines, "generator_templates": len(TEMPLATES),
        "ours_lines_per_s": round(ours), "ours_templates": our_templates,
        "drain3_masked_lines_per_s": round(d_masked), "drain3_masked_templates": d_masked_t,
        "drain3_plain_lines_per_s": round(d_plain), "drain3_plain_templates": d_plain_t,
        "speedup_vs_drain3_masked": round(ours / d_masked, 1), "speedup_vs_drain3_plain": round(ours / d_plain, 1),
    }
    print(f"ours            {ours:12,.0f} lines/s  templates={our_templates}")
    print(f"drain3 (masks)  {d_masked:12,.0f} lines/s  templates={d_masked_t}  -> {ours / d_masked:.1f}x")
    print(f"drain3 (plain)  {d_plain:12,.0f} lines/s  templates={d_plain_t}  -> {ours / d_plain:.1f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
