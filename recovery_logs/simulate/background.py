"""Vectorised background: training progress on every rank and benign chatter on every node.

Generated per time chunk ``[c0, c1)`` with a generator seeded by (seed, chunk index), so a chunk's
content never depends on what was generated before it and scale runs stream in constant memory.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from recovery_logs.simulate import formats as fmt
from recovery_logs.simulate.cluster import HCA_PCI, Cluster
from recovery_logs.simulate.dialect import Dialect
from recovery_logs.simulate.script import Timeline
from recovery_logs.timeutil import NS

ROW_SCHEMA = {"t": pl.Int64, "host": pl.String, "stream": pl.String, "rank": pl.Int32, "msg": pl.String}

# Benign kernel chatter: (prefix, lo, hi, suffix) with one random integer in the middle.
KERNEL_CHATTER = (
    ("perf: interrupt took too long (", 2501, 3900, " > 2500), lowering kernel.perf_event_max_sample_rate to 79750"),
    ("TCP: request_sock_TCP: Possible SYN flooding on port ", 29500, 29501, ". Sending cookies.  Check SNMP counters."),
    ("dhclient[1311]: DHCPREQUEST for 192.168.10.11 on eno1 to 192.168.10.1 port 67 (xid=0x", 268435456, 4294967295, ")"),
    (f"mlx5_core {HCA_PCI}: mlx5_pcie_event:299:(pid ", 200, 40000, "): PCIe slot advertised sufficient power (27W)."),
    ("NVRM: nvCheckOkFailedNoLog: Check failed: Call not supported [NV_ERR_NOT_SUPPORTED] (0x00000056) returned from "
     "pRmApi->Control(pRmApi, RES_GET_CLIENT_HANDLE(pKernelChannel), RES_GET_HANDLE(pKernelChannel), "
     "NVA06F_CTRL_CMD_STOP_CHANNEL, &stopChannelParams, sizeof(stopChannelParams)) @ kernel_channel.c:", 3590, 3600, ""),
    ("hrtimer: interrupt took ", 40000, 990000, " ns"),
    ("audit: type=1400 audit(1795960000.123:", 100, 99999, "): apparmor=\"STATUS\" operation=\"profile_replace\" "
     "profile=\"unconfined\" name=\"nvidia_modprobe\" pid=1234 comm=\"apparmor_parser\""),
)
CTLD_CHATTER = (
    ("_slurm_rpc_submit_batch_job: JobId=", 200000, 299999, " InitPrio=4294901759 usec=1184"),
    ("sched: Allocate JobId=", 200000, 299999, " NodeList=cpu-n[001-002] #CPUs=64 Partition=cpu"),
    ("_job_complete: JobId=", 200000, 299999, " done"),
)


def _chatter(rng: np.random.Generator, hosts: np.ndarray, t_lo: np.ndarray, c0: int, c1: int, rate: float,
             table: tuple, stream: str) -> pl.DataFrame:
    """Poisson chatter at ``rate`` lines/s per host within [max(c0, t_lo[h]), c1)."""
    span = (c1 - c0) / NS
    counts = rng.poisson(rate * span, size=len(hosts))
    n = int(counts.sum())
    if n == 0:
        return pl.DataFrame(schema=ROW_SCHEMA)
    h = np.repeat(np.arange(len(hosts)), counts)
    t = rng.integers(c0, c1, size=n)
    keep = t >= t_lo[h]
    h, t = h[keep], t[keep]
    k = rng.integers(0, len(table), size=len(t))
    prefix = np.array([x[0] for x in table], dtype=object)[k]
    suffix = np.array([x[3] for x in table], dtype=object)[k]
    lo = np.array([x[1] for x in table])[k]
    hi = np.array([x[2] for x in table])[k]
    num = lo + (rng.random(len(t)) * (hi - lo)).astype(np.int64)
    hexed = np.array(["xid=0x" in x[0] for x in table])[k]
    numstr = np.where(hexed, np.char.mod("%08x", num), num.astype(str))
    df = pl.DataFrame({"t": t, "host": hosts[h], "p": prefix.astype(str), "n": numstr, "s": suffix.astype(str)})
    return df.select(pl.col("t"), pl.col("host"), pl.lit(stream).alias("stream"), pl.lit(None, pl.Int32).alias("rank"),
                     pl.concat_str([pl.col("p"), pl.col("n"), pl.col("s")]).alias("msg"))


TIMER_FMT = "    {}: ({:.2f}, {:.2f})"     # megatron/core/timers.py, the name ljust(48, '.')


def _rank_times(c: Cluster, tl: Timeline, rng: np.random.Generator, k: int, t: int, compute_frac: np.ndarray,
                slow: list) -> np.ndarray:
    """Each rank's own compute time (s) in iteration ``k`` (what a per-rank timer measures)."""
    rr = np.arange(c.world)
    factor = np.ones(c.world)
    for ranks, t_from, t_to, f in slow:
        factor[np.isin(rr, ranks) & (t >= t_from) & (t < t_to)] = f
    return compute_frac[k] * tl.base_dur_s[k] * factor * (1 + 0.015 * rng.standard_normal(c.world))


def _timing_report(c: Cluster, tl: Timeline, rng: np.random.Generator, k: int, t: int, compute_frac: np.ndarray,
                   slow: list, hot: list, kind: str) -> list[tuple]:
    """Rows of one timing report comparing ranks, printed after the iteration line of iteration ``k``:
    Megatron's ``(min, max) time across ranks`` block (last rank) or its StragglerDetector line (rank 0)."""
    st = _rank_times(c, tl, rng, k, t, compute_frac, slow) * 1000.0
    last = c.world - 1
    if kind == "megatron_timers":
        it_ms = float(tl.it_dur_s[k]) * 1000.0
        timers = [("forward-backward", it_ms * 0.965, it_ms * 0.97), ("forward-compute", st.min() * 0.33, st.max() * 0.33),
                  ("backward-compute", st.min() * 0.62, st.max() * 0.62),
                  ("batch-generator", float(rng.uniform(0.4, 0.6)), float(rng.uniform(0.7, 3.0))),
                  ("all-grads-sync", float(rng.uniform(9, 12)), 12.0 + float(st.max() - st.min())),
                  ("optimizer", float(rng.uniform(20.0, 20.5)), float(rng.uniform(20.6, 21.5)))]
        node = c.nodes[c.node_of_rank(last)]
        out = [(t + 1_000_000, node, "job", last, "(min, max) time across ranks (ms):")]
        out += [(t + 1_000_000 + 1000 * (i + 1), node, "job", last, TIMER_FMT.format((n + " ").ljust(48, "."), a, b))
                for i, (n, a, b) in enumerate(timers)]
        return out
    rr = np.arange(c.world)
    hotm = np.zeros(c.world, dtype=bool)
    for ranks, t_from, t_to in hot:
        hotm |= np.isin(rr, ranks) & (t >= t_from) & (t < t_to)
    clk = np.where(hotm, rng.uniform(1290, 1420, c.world), rng.uniform(1950, 1980, c.world))
    tmp = np.where(hotm, rng.uniform(88, 93, c.world), rng.uniform(50, 68, c.world))
    pwr = np.where(hotm, rng.uniform(420, 480, c.world), rng.uniform(600, 690, c.world))
    utl = rng.uniform(96, 100, c.world)
    drt = rng.uniform(10, 40, c.world)
    tf = 296.0 * st.min() / st

    def mm(v: np.ndarray, unit: str, name: str) -> str:
        lo, hi = int(np.argmin(v)), int(np.argmax(v))
        return f"Mn{name}/Rnk: {v[lo]:.2f}{unit}/{lo} | Mx{name}/Rnk: {v[hi]:.2f}{unit}/{hi}"
    line = (f"INFO:megatron.core.utils:{fmt.bracket_time(t)} | {mm(st, 'ms', 'Rtt')} | {mm(pwr, 'W', 'Pwr')} | "
            f"{mm(tmp, 'C', 'Tmp')} | {mm(utl, '%', 'Utl')} | {mm(clk, 'MHz', 'Clk')} | {mm(drt, 'us', 'DRtt')} | "
            f"{mm(tf, 'TF', 'Etpt')}")
    return [(t + 2_000_000, c.nodes[0], "job", 0, line)]


def chunk_background(c: Cluster, tl: Timeline, rng: np.random.Generator, c0: int, c1: int, *,
                     rank_every: int, log_every: int, compute_frac: np.ndarray, slow: list,
                     progress_stop: int, job_end: int, node_dead: dict[int, int], dialect: Dialect | None = None,
                     hot: list | None = None) -> pl.DataFrame:
    """``slow``: (ranks, t_from, t_to, factor) slowdowns; ``hot``: (ranks, t_from, t_to) whose GPUs run
    hot with cut clocks (the Megatron straggler report shows it); ``dialect``: the run's wording."""
    dialect = dialect or Dialect()
    hot = hot or []
    G = c.gpus_per_node
    nodes = np.array(c.nodes)
    frames = []
    # ---- per-rank step timing lines -----------------------------------------------------------
    stop = min(progress_stop, job_end)
    k_all = np.nonzero((tl.it_end >= c0) & (tl.it_end < min(c1, stop)))[0]
    k_rank = k_all[(k_all + 1) % rank_every == 0]
    if len(k_rank):
        world = c.world
        kk = np.repeat(k_rank, world)
        rr = np.tile(np.arange(world), len(k_rank))
        node = rr // G
        t = tl.it_end[kk] + np.asarray(c.skew_ns)[node] + rng.integers(0, 6_000_000, size=len(kk))
        factor = np.ones(len(kk))
        for ranks, t_from, t_to, f in slow:
            hit = np.isin(rr, ranks) & (t >= t_from) & (t < t_to)
            factor[hit] = f
        st = compute_frac[kk] * tl.base_dur_s[kk] * factor * (1 + 0.015 * rng.standard_normal(len(kk)))
        ms = np.round(st * 1000).astype(np.int64)
        pid = np.asarray(c.pid_base)[node] + rr % G
        dead = np.array([node_dead.get(int(n), 1 << 62) for n in range(len(c.nodes))])[node]
        keep = t < dead
        t, node, rr, kk, ms, pid = t[keep], node[keep], rr[keep], kk[keep] + 1, ms[keep], pid[keep]
        ts = pl.Series(t)
        head = [pl.lit("I"), pl.lit(fmt.strftime_ns(ts, "%m%d %H:%M:%S", 6)), pl.lit(" "), pl.lit(pid).cast(pl.String),
                pl.lit(" train.py:318] [rank"), pl.lit(rr).cast(pl.String), pl.lit("] step "), pl.lit(kk).cast(pl.String)]
        if dialect.rank_timing == "phase":   # Megatron/NeMo per-rank phase timings; their sum is the step time
            fwd = np.round(ms * 0.33, 2)
            bwd = np.round(ms * 0.62, 2)
            opt = np.round(ms - fwd - bwd, 2)
            body = [pl.lit(" timing: forward-compute "), pl.lit(fwd).cast(pl.String), pl.lit(" ms | backward-compute "),
                    pl.lit(bwd).cast(pl.String), pl.lit(" ms | optimizer "), pl.lit(opt).cast(pl.String), pl.lit(" ms")]
        elif dialect.step_line == "tf" and slow:
            # only in runs with slow ranks, where these lines are the evidence: the other runs (the fleet
            # benchmarks' inputs among them) keep their bytes
            body = _tf_step_body(ms, kk)
        else:
            body = [pl.lit(" step_time="), pl.lit(ms // 1000).cast(pl.String), pl.lit("."),
                    pl.lit(ms % 1000).cast(pl.String).str.zfill(3), pl.lit("s")]
        msg = pl.select(pl.concat_str(head + body)).to_series()
        frames.append(pl.DataFrame({"t": ts, "host": pl.Series(c.nodes).gather(node), "stream": "job",
                                    "rank": pl.Series(rr, dtype=pl.Int32), "msg": msg}))
    # ---- Megatron iteration lines (printed by the last rank) ------------------------------------
    k_meg = k_all[(k_all + 1) % log_every == 0]
    last = c.world - 1
    ln = c.node_of_rank(last)
    rows = []
    for k in k_meg:
        t = int(tl.it_end[k]) + c.skew_ns[ln]
        if t >= node_dead.get(ln, 1 << 62):
            continue
        lo = max(0, k - log_every + 1)
        avg = float(tl.it_dur_s[lo:k + 1].mean()) * 1000
        it = k + 1
        loss = 7.5 * np.exp(-it / 4000) + 1.6 + 0.02 * float(rng.standard_normal())
        line = (f"{' ' if dialect.iteration_indent else ''}{fmt.bracket_time(t)} iteration {it:>8d}/  500000 | "
                f"consumed samples: {it * 512:>12d} | "
                f"elapsed time per iteration (ms): {avg:.1f} | learning rate: {3e-4 * min(1, it / 2000):.6E} | "
                f"global batch size:   512 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: "
                f"{1.1 + 0.1 * float(rng.random()):.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")
        rows.append((t, c.nodes[ln], "job", last, line))
        if dialect.timing_report != "none":
            rows += _timing_report(c, tl, rng, k, t, compute_frac, slow, hot, dialect.timing_report)
        if it % 2000 == 0:
            rows.append((t + 2_000_000, c.nodes[0], "job", 0, f"[rank0]: saving checkpoint at iteration {it:>7d} to "
                         "/checkpoints/gpt-175b in torch_dist format"))
            rows.append((t + 38 * NS, c.nodes[0], "job", 0, f"[rank0]:   successfully saved checkpoint from iteration "
                         f"{it:>7d} to /checkpoints/gpt-175b [ t 1/8, p 1/1 ]"))
    if rows:
        frames.append(pl.DataFrame(rows, schema=ROW_SCHEMA, orient="row"))
    # ---- kernel and controller chatter ---------------------------------------------------------
    lo = np.zeros(len(c.nodes), dtype=np.int64)
    kern = _chatter(rng, nodes, lo, c0, c1, 1 / 45.0, KERNEL_CHATTER, "kern")
    if node_dead and kern.height:
        dead_map = {c.nodes[n]: t for n, t in node_dead.items()}
        kern = kern.filter(pl.col("t") < pl.col("host").replace_strict(dead_map, default=1 << 62, return_dtype=pl.Int64))
    frames.append(kern)
    frames.append(_chatter(rng, np.array([c.ctl_host]), np.zeros(1, dtype=np.int64), c0, c1, 1 / 30.0, CTLD_CHATTER,
                           "slurmctld"))
    frames = [f.cast(ROW_SCHEMA) for f in frames if f.height]  # type: ignore[arg-type]  # polars types cast()'s keys as str | selector | dtype
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=ROW_SCHEMA)


def _tf_step_body(ms: np.ndarray, step: np.ndarray, batch: int = 64) -> list[pl.Expr]:
    """The rest of a per-rank step line in the TensorFlow tutorials' words (tensorflow/models cifar10_train.py
    ``'%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)'``), after ``… step N``: the loss falls
    with the step, examples/sec is the batch over the step time."""
    sec = np.maximum(ms, 1) / 1000.0
    loss = np.round(4.6 * np.exp(-step / 4000.0) + 0.3, 2)
    eps = np.round(batch / sec, 1)
    return [pl.lit(", loss = "), pl.lit(loss).cast(pl.String), pl.lit(" ("), pl.lit(eps).cast(pl.String),
            pl.lit(" examples/sec; "), pl.lit(np.char.mod("%.3f", sec)).cast(pl.String), pl.lit(" sec/batch)")]
