"""The straggler detector on real training-log formats (not the simulator's): per-rank progress lines
in the formats DeepSpeed and nanoGPT print, one node slower than the others -> a straggler incident
naming that node. Line formats copied from public issues (sources next to each template)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from recovery_logs.pipeline.replay import ReplayOptions, replay

HOSTS = ("gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4")
SLOW = "gpu-a3"
RANKS_PER_HOST = 2


def deepspeed_line(t: int, step: int, samples_per_s: float) -> str:
    # deepspeedai/DeepSpeed#5779: "[2024-07-17 19:53:24,981] [INFO] [timer.py:258:stop]
    # epoch=0/micro_step=4500/global_step=4500, RunningAvgSamplesPerSec=16.12..., CurrSamplesPerSec=16.80..., ..."
    mm, ss = divmod(t, 60)
    return (f"[2024-07-17 19:{mm:02d}:{ss:02d},981] [INFO] [timer.py:258:stop] epoch=0/micro_step={step}/"
            f"global_step={step}, RunningAvgSamplesPerSec={samples_per_s:.6f}, CurrSamplesPerSec={samples_per_s:.6f}, "
            "MemAllocated=0.02GB, MaxMemAllocated=0.97GB")


def nanogpt_line(t: int, step: int, samples_per_s: float) -> str:
    # karpathy/nanoGPT#110: "iter 1631: loss 4.0863, time 561.94ms" (here behind a glog prefix that
    # carries the time, as torchrun workers' loggers print it)
    mm, ss = divmod(t, 60)
    return f"I0717 19:{mm:02d}:{ss:02d}.000000 4242 train.py:300] iter {step}: loss 3.9848, time {1000.0 / samples_per_s * 9.4:.2f}ms"


def write_job(root: Path, fmt) -> None:
    job = root / "job-4711"
    job.mkdir(parents=True)
    for h, host in enumerate(HOSTS):
        lines = []
        for step in range(60):                     # 10 minutes, one line per rank every 10 s
            t = step * 10
            for r in range(RANKS_PER_HOST):
                rank = h * RANKS_PER_HOST + r
                rate = 11.0 if host == SLOW else 16.8 + 0.05 * ((rank + step) % 3)
                lines.append(f"[rank{rank}]: " + fmt(t, 4500 + step, rate))
        (job / f"{host}.out").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fmt", [deepspeed_line, nanogpt_line], ids=["deepspeed", "nanogpt"])
def test_straggler_found_from_real_format_progress_lines(tmp_path: Path, fmt) -> None:
    write_job(tmp_path, fmt)
    res = replay(sorted((tmp_path / "job-4711").glob("*.out")), ReplayOptions())
    f = res.engine.findings
    prog = f.filter(f["role"] == "progress")
    assert prog.height == 60 * len(HOSTS) * RANKS_PER_HOST
    assert prog["step_time_s"].null_count() == 0 and prog["rank"].null_count() == 0
    strag = [i for i in res.incidents if i.category == "straggler"]
    assert strag, [(i.category, i.node) for i in res.incidents]
    assert strag[0].node == SLOW
    assert all(i.node in (SLOW, None) for i in strag)


def test_no_straggler_when_all_ranks_are_equal(tmp_path: Path) -> None:
    job = tmp_path / "job-4712"
    job.mkdir()
    for h, host in enumerate(HOSTS):
        lines = [f"[rank{h * 2 + r}]: " + deepspeed_line(s * 10, 100 + s, 16.8) for s in range(60) for r in range(2)]
        (job / f"{host}.out").write_text("\n".join(lines) + "\n")
    res = replay(sorted(job.glob("*.out")), ReplayOptions())
    assert not [i for i in res.incidents if i.category == "straggler"]


@pytest.mark.parametrize("slow", [True, False], ids=["one-slow-node", "balanced"])
def test_pdsh_gathered_rankless_step_lines_compare_node_against_node(tmp_path: Path, slow: bool) -> None:
    """One file of pdsh output ("host: line", pdsh src/pdsh/dsh.c out("%S: %s", host, buf)) holding each node's
    nanoGPT-style step lines (karpathy/nanoGPT#110) without a rank: the labels name the hosts, so the nodes are
    compared with each other and the slow one is named; with the labels unread the lines had no host and no time."""
    job = tmp_path / "job-4713"
    job.mkdir()
    lines = [f"{host}: " + nanogpt_line(step * 10, 100 + step, 9.0 if slow and host == SLOW else 16.8 + 0.05 * (step % 3))
             for step in range(30) for host in HOSTS]
    (job / "pdsh.out").write_text("\n".join(lines) + "\n")
    res = replay([job / "pdsh.out"], ReplayOptions())
    prog = res.engine.findings.filter(pl.col("role") == "progress")
    assert sorted(prog["host"].unique().to_list()) == sorted(HOSTS) and prog["time_inferred"].sum() == 0
    strag = [i for i in res.incidents if i.category == "straggler"]
    if slow:
        assert strag and f"node {SLOW} slower than the other nodes" in strag[0].cause
    else:
        assert not strag
