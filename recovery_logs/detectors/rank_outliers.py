"""One slow rank among its peers, from what a short log shows (issue 13 §3).

The windowed straggler verdicts (``stragglers.py``) need minutes of per-rank lines; an excerpt, or
the first minutes of a job, has a handful. What an operator still reads from a few lines:

* **per-rank progress lines** (any ``progress`` rule that gives a step time, with the rank from the
  rule or the line's prefix — torchrun ``[rankN]:``/``[defaultN]:``, Lightning ``[rank: N]``, Open MPI
  ``[1,N]<stdout>:``, srun ``--label`` ``N:``): per step, 3+ ranks compared (a line without a step
  number is its rank's n-th report); a rank that is an outlier in two of the job's first steps (or
  once by a wide margin). Lines that name no rank but come from 3+ hosts of the job (per-node output
  read from syslog, journald or VictoriaLogs) compare host against host: the slow *node* is named;
* **reports that list per-rank values** in one line: Megatron's ``^^^^ Bottom N Ranks with lowest
  Etpt(TF): v/r, …`` (``--straggler-minmax-count``; read with its ``Top`` line when present) and the
  nvidia-resiliency-ext example's ``Rank R GPUs relative perf: {rank: score, …}`` dicts, DLRover's
  network-check ``The node elapsed time are {node_rank: seconds, …}`` and gpu-burn's per-GPU
  ``N (G Gflop/s)`` status line.

Both are ``investigate`` naming the rank(s), never a drain: a few lines cannot show that the
slowness persists, nor separate a slow GPU from imbalance. Pure functions over the findings frame.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from recovery_logs.detectors.base import DetectContext, upto
from recovery_logs.detectors.progress import progress_of

MEGATRON_ETPT = "progress.megatron_etpt_extremes"
NVRX_PERF_DICT = "progress.nvrx_perf_dict"
DLROVER_TIMES = "progress.dlrover_node_times"
GPU_BURN = "progress.gpu_burn_status"
LIST_RULES = (MEGATRON_ETPT, NVRX_PERF_DICT, DLROVER_TIMES, GPU_BURN)

# megatron/core/utils.py StragglerDetector.report(): " {value}/{rank}," per rank (value "%.2f" or "%.2fTF")
_ETPT_PAIR = re.compile(r"(\d+(?:\.\d+)?)(?:TF)?/(\d+)")
_ETPT_LINE = re.compile(r"(Bottom|Top)\s+\d+ Ranks with (?:lowest|highest)\s+Etpt\(TF\):([^\n]*)")
# nvidia-resiliency-ext examples/straggler/example.py: f"Rank {local_rank} GPUs relative perf: {dict}"
_DICT_PAIR = re.compile(r"(\d+): (\d+(?:\.\d+)?)")
# gpu-burn gpu_burn-drv.cpp status line: "proc'd: " then "%d (%.0f Gflop/s) " per GPU, "- " between GPUs
_BURN_GFLOPS = re.compile(r"\d+ \((\d+(?:\.\d+)?) Gflop/s\)")


@dataclass(frozen=True)
class Outlier:
    """The slow rank(s) of one comparison: ``ranks`` slowest first, ``ratio`` of the slowest to the
    others' median (in step-time terms: a throughput or score is inverted first)."""

    ranks: tuple[Hashable, ...]
    ratio: float
    z: float
    slow: float
    ref: float


def slow_outliers(slowness: dict[Hashable, float], ratio: float, min_z: float, rel_floor: float,
                  min_ranks: int) -> Outlier | None:
    """The ranks slower than their peers: each at ``>= ratio`` × the median of the ranks that are not
    slow and a robust z (``1.4826·MAD`` of those, floored at ``rel_floor`` × median) ``>= min_z``.
    ``slowness`` is a step time per rank (larger = slower). Fewer than ``min_ranks`` ranks, or more
    than a third of them slow (then it is the job, not a rank): None."""
    vals = {r: v for r, v in slowness.items() if np.isfinite(v) and v > 0}
    if len(vals) < min_ranks:
        return None
    order = sorted(vals, key=lambda r: (-vals[r], str(r)))
    slow: list[Hashable] = []
    for r in order[: max(1, len(vals) // 3)]:
        rest = np.array([vals[k] for k in order if k not in slow and k != r])
        med = float(np.median(rest))
        scale = max(1.4826 * float(np.median(np.abs(rest - med))), rel_floor * med, 1e-12)
        if med > 0 and vals[r] >= ratio * med and (vals[r] - med) / scale >= min_z:
            slow.append(r)
        else:
            break
    if not slow:
        return None
    rest = np.array([vals[k] for k in order if k not in slow])
    med = float(np.median(rest))
    scale = max(1.4826 * float(np.median(np.abs(rest - med))), rel_floor * med, 1e-12)
    if sum(v >= ratio * med for v in vals.values()) > len(slow):   # more slow-looking ranks than the cap
        return None
    top = vals[slow[0]]
    return Outlier(tuple(slow), top / med, (top - med) / scale, top, med)


def _name(k: Hashable) -> str:
    return f"{k[1]} on {k[0]}" if isinstance(k, tuple) else str(k)


def _who(o: Outlier) -> str:
    shown = ", ".join(map(_name, o.ranks[:8])) + (" …" if len(o.ranks) > 8 else "")
    return f"rank {shown}" if len(o.ranks) == 1 else f"ranks {shown}"


def etpt_values(message: str) -> dict[int, float]:
    """Rank -> estimated TFLOPs from Megatron's Bottom/Top Etpt lines (one record or two)."""
    out: dict[int, float] = {}
    for _, body in _ETPT_LINE.findall(message):
        for v, r in _ETPT_PAIR.findall(body):
            out.setdefault(int(r), float(v))
    return out


def dict_values(message: str) -> dict[int, float]:
    """Rank -> score from an nvidia-resiliency-ext ``{rank: score}`` dict (1.0 = best)."""
    body = message[message.find("{"):] if "{" in message else ""
    return {int(r): float(v) for r, v in _DICT_PAIR.findall(body)}


def burn_values(message: str) -> dict[int, float]:
    """GPU index -> Gflop/s from the last gpu-burn status line of a record (a ``\\r``-joined bar keeps
    every refresh; the last one is the newest); a GPU still at 0 Gflop/s is left out (not started)."""
    last = message.replace("\r", "\n").strip().split("\n")[-1]
    body = last[last.find("proc'd:"):last.find("errors:")] if "errors:" in last else last[last.find("proc'd:"):]
    return {i: float(v) for i, v in enumerate(_BURN_GFLOPS.findall(body)) if float(v) > 0}


# (how the rows are named, the value -> step-time-like slowness, the label) per list report; the
# values of DLRover's network check are elapsed times already (larger = slower), the others throughputs
_LIST_KINDS: dict[str, tuple[str, bool, str]] = {
    MEGATRON_ETPT: ("rank", True, "Megatron lowest/highest Etpt report"),
    NVRX_PERF_DICT: ("rank", True, "nvidia-resiliency-ext per-rank GPU performance scores"),
    DLROVER_TIMES: ("node rank", False, "DLRover network-check elapsed time per node"),
    GPU_BURN: ("GPU", True, "gpu-burn throughput per GPU"),
}


def _rank(k: Hashable) -> int:
    v = k[1] if isinstance(k, tuple) else k        # ranks are ints, or (host, int)
    return int(v) if isinstance(v, (int, float, str)) else -1


def _row(job: str, t: int, o: Outlier, message: str, kind: str) -> dict:
    return {"time_ns": t, "host": None, "job_id": job, "rank": _rank(o.ranks[0]), "category": "straggler",
            "severity": "low", "role": "cause", "action": "investigate", "message": message,
            "detail": {"kind": kind, "ranks": [_name(k) for k in o.ranks], "ratio": round(o.ratio, 4),
                       "z": round(min(o.z, 1e6), 2)}}


def _t(v: datetime | int) -> int:
    return int(v.timestamp() * 1e9) if isinstance(v, datetime) else int(v)


def list_report_verdicts(findings: pl.DataFrame, ctx: DetectContext, ratio: float, min_z: float,
                         rel_floor: float, min_ranks: int) -> list[dict]:
    """Per job, the first report line listing per-rank values whose slowest rank is an outlier."""
    rep = upto(findings.filter(pl.col("rule_id").is_in(LIST_RULES) & pl.col("job_id").is_not_null()),
               ctx.watermark_ns).sort(["time", "seq"], nulls_last=True)
    rows: list[dict] = []
    for (job,), g in rep.group_by(["job_id"], maintain_order=True):
        recs = list(g.select("time", "rule_id", "message").iter_rows(named=True))
        for i, r in enumerate(recs):
            rule = r["rule_id"]
            noun, invert, label = _LIST_KINDS[rule]
            if rule == MEGATRON_ETPT:
                msg = r["message"]
                # a Bottom line and the Top line after it are one report
                if i + 1 < len(recs) and recs[i + 1]["rule_id"] == MEGATRON_ETPT and "Top" in recs[i + 1]["message"]:
                    msg += "\n" + recs[i + 1]["message"]
                vals = etpt_values(msg)
            elif rule == GPU_BURN:
                vals = burn_values(r["message"])
            else:
                vals = dict_values(r["message"])
            slowness: dict[Hashable, float] = {k: (1.0 / v if invert else v) for k, v in vals.items() if v > 0}
            o = slow_outliers(slowness, ratio, min_z, rel_floor, min_ranks)
            if o is None:
                continue
            shown = _who(o).replace("rank", noun, 1)
            slow, ref = (1 / o.slow, 1 / o.ref) if invert else (o.slow, o.ref)
            rows.append(_row(job, _t(r["time"]), o,
                             f"{label}: {shown} at {slow:.2f} vs {ref:.2f} on the others "
                             f"({o.ratio:.2f}x slower) in one report — a straggler to investigate (one report cannot "
                             "show that it persists)", "list_report"))
            break
    return rows


HOST_RANK = -1     # the stand-in rank of a host's rank-less progress lines (compared host against host)


def _hosts_as_ranks(p: pl.DataFrame, min_ranks: int) -> pl.DataFrame:
    """Progress lines that name no rank but come from ``min_ranks``+ hosts of one job and rule (per-node
    output gathered by syslog/journald or a parallel shell, each line naming its host): each host is one
    "rank" (``HOST_RANK`` on that host), so a node slower than its peers is compared like a rank. Lines with a
    rank keep it; a job whose rank-less lines come from fewer hosts is left as it was."""
    bare = pl.col("rank_line").is_null() & pl.col("host").is_not_null()
    rankless = p.filter(bare)
    if rankless.is_empty():
        return p
    many = (rankless.group_by(["job_id", "rule_id"]).agg(pl.col("host").n_unique().alias("_nh"))
            .filter(pl.col("_nh") >= min_ranks).drop("_nh").with_columns(pl.lit(True).alias("_many")))
    if many.is_empty():
        return p
    p = p.join(many, on=["job_id", "rule_id"], how="left", nulls_equal=True, maintain_order="left")
    return p.with_columns(pl.when(bare & pl.col("_many").fill_null(False)).then(pl.lit(HOST_RANK))
                          .otherwise(pl.col("rank_line")).cast(p.schema["rank_line"]).alias("rank_line")).drop("_many")


def _settled(p: pl.DataFrame, near: pl.DataFrame) -> pl.DataFrame:
    """The (job, progress rule, step) keys whose per-rank lines are all in: every rank seen has
    reported the step (its last step is at or past it) and the next step has been reported by at
    least as many ranks — a rank not seen yet, printing its line of this step after another rank's
    line of the next, is then the only way one is missing. Before that the watermark may have cut
    through the step's lines, and a verdict on part of them would differ from the one on all.
    ``near``: the keys to decide and the step after each; ranks are counted on those steps only."""
    r = p.filter(pl.col("rank_line").is_not_null())
    low = (r.group_by("job_id", "rule_id", "host", "rank_line").agg(pl.col("step").max().alias("_last"))
           .group_by("job_id", "rule_id").agg(pl.col("_last").min().alias("_low")))
    n = (r.join(near, on=["job_id", "rule_id", "step"], how="semi")
         .group_by("job_id", "rule_id", "step").agg(pl.struct("host", "rank_line").n_unique().alias("_n"))
         .sort("step").with_columns(pl.col("_n").shift(-1).over(["job_id", "rule_id"]).alias("_next")))
    return (n.join(low, on=["job_id", "rule_id"]).filter((pl.col("step") <= pl.col("_low")) & (pl.col("_next") >= pl.col("_n")))
            .select("job_id", "rule_id", "step"))


def progress_outliers(findings: pl.DataFrame, ctx: DetectContext, ratio: float, single_ratio: float, min_z: float,
                      rel_floor: float, min_ranks: int, first_steps: int, exclude: tuple[str, ...],
                      pair_ratio: float = 0.0) -> list[dict]:
    """Per (job, progress rule) and step, the ranks' step times compared: a rank is an outlier in a
    step at ``>= ratio`` × the step's median with robust z ``>= min_z``, the only such rank of the step
    (3+ ranks; several slow ranks are a slow node or imbalance — the windowed verdicts). A rank that is an outlier in two of the job's first ``first_steps`` steps, or in
    one at ``>= single_ratio``, is named (one finding per job, at the step that decides it).

    Two ranks (``pair_ratio`` > 0): a median and MAD of two values cannot single one out, so the
    slower is compared with the other directly — at ``>= pair_ratio`` × its time in two of the first
    steps (never on one step: a pair has no majority to call the other one normal).

    Stable under any watermark: a step's comparison uses only its own rows, and only once the step
    is whole (``_settled``: every rank seen has reported it and the next step as many ranks; at the
    end of the input, ``ctx.final``, every step is), and the finding is the first step (in event time) that
    decides it — a later watermark finds the same step, an earlier one nothing. A rank is (host, rank) so torchrun's per-node ``[defaultN]`` local ranks stay apart."""
    st = pl.col("step_time_s")
    p = (upto(progress_of(findings, ctx), ctx.watermark_ns)
         .filter(pl.col("job_id").is_not_null()
                 & st.is_not_null() & st.is_finite() & (st > 0)
                 & ~pl.col("rule_id").fill_null("").str.starts_with("detector.") & ~pl.col("rule_id").is_in(list(exclude))))
    if p.is_empty():
        return []
    p = _hosts_as_ranks(p, min_ranks)
    # a line that names no step (each rank printing "rank 3 ... 1.9 s/it"): the n-th line of a rank is
    # its n-th report, compared with the other ranks' n-th (1-based, in event order)
    nostep = p.filter(pl.col("step").is_null())
    if not nostep.is_empty():
        nostep = (nostep.filter(pl.col("rank_line").is_not_null()).sort(["time", "seq"], nulls_last=True)
                  .with_columns((pl.int_range(pl.len()).over(["job_id", "rule_id", "host", "rank_line"]) + 1)
                                .cast(p.schema["step"]).alias("step")))
        p = pl.concat([p.filter(pl.col("step").is_not_null()), nostep.select(p.columns)])
    key = ["job_id", "rule_id", "step"]
    # the job's first steps only (a fleet has 100k+ progress rows); the line's rank (read once: rank_line)
    steps = (p.select("job_id", "rule_id", "step").unique()
             .with_columns(pl.col("step").rank("dense").over(["job_id", "rule_id"]).alias("k")))
    first = steps.filter(pl.col("k") <= first_steps).drop("k")
    if not ctx.final:
        first = first.join(_settled(p, steps.filter(pl.col("k") <= first_steps + 1).drop("k")), on=key, how="semi")
    p = (p.join(first, on=key, how="inner").drop("rank").rename({"rank_line": "rank"})
         .filter(pl.col("rank").is_not_null()))
    r = p.group_by([*key, "host", "rank"]).agg(st.median().alias("t"), pl.col("time").max().alias("tm"))
    r = r.with_columns(pl.col("t").median().over(key).alias("med"), pl.len().over(key).alias("n"),
                       pl.col("tm").max().over(key).alias("gt"))
    pair = (pl.col("n") == 2) & (pl.lit(pair_ratio) > 0)
    r = r.filter(((pl.col("n") >= min_ranks) | pair) & (pl.col("med") > 0))
    if r.is_empty():
        return []
    r = r.with_columns((pl.col("t") - pl.col("med")).abs().median().over(key).alias("mad"),
                       pl.col("t").min().over(key).alias("lo"))
    scale = pl.max_horizontal(1.4826 * pl.col("mad"), rel_floor * pl.col("med"), pl.lit(1e-12))
    # a pair: the slower against the faster (its "median" for the message and the ratio)
    r = r.with_columns(pl.when(pair).then(pl.col("lo")).otherwise(pl.col("med")).alias("med"))
    r = r.with_columns((pl.col("t") / pl.col("med")).alias("ratio"), ((pl.col("t") - pl.col("med")) / scale).alias("z"))
    r = r.with_columns(pl.when(pair).then(pl.col("ratio") >= pair_ratio)
                       .otherwise((pl.col("ratio") >= ratio) & (pl.col("z") >= min_z)).alias("flag"))
    r = r.with_columns(pl.col("flag").sum().over(key).alias("nflag"))
    # one rank alone: several slow ranks in a step are a slow node or imbalance, for the windowed verdicts
    hit = (r.filter(pl.col("flag") & (pl.col("nflag") == 1))
           .sort(["gt", "step"])
           .with_columns(pl.int_range(pl.len()).over(["job_id", "rule_id", "host", "rank"]).alias("i")))
    hit = hit.filter((pl.col("i") >= 1) | ((pl.col("ratio") >= single_ratio) & (pl.col("n") > 2)))
    if hit.is_empty():
        return []
    rows = []
    for (job,), g in hit.sort(["gt", "ratio"], descending=[False, True]).group_by(["job_id"], maintain_order=True):
        top = g.row(0, named=True)
        one_host = p.filter(pl.col("job_id") == job)["host"].n_unique() == 1
        by_host = top["rank"] == HOST_RANK
        who = f"node {top['host']}" if by_host else f"rank {top['rank']}" + ("" if one_host else f" on {top['host']}")
        peers = "node" if by_host else "rank"
        seen = "one step" if top["i"] == 0 else f"{top['i'] + 1} steps"
        rows.append({"time_ns": _t(top["gt"]), "host": None, "job_id": job,
                     "rank": None if by_host else int(top["rank"]),
                     "category": "straggler", "severity": "low", "role": "cause", "action": "investigate",
                     "message": ((f"{who} slower than the other {peers}: {top['t']:.3f} s vs {top['med']:.3f} s "
                                  f"at step {top['step']} ({top['ratio']:.2f}x; slower in {seen} of {top['rule_id']})"
                                  if top["n"] == 2 else
                                  f"{who} slower than the other {peers}s: {top['t']:.3f} s vs the median {top['med']:.3f} s "
                                  f"at step {top['step']} ({top['ratio']:.2f}x, robust z {min(top['z'], 999):.1f}; "
                                  f"an outlier in {seen} of {top['rule_id']})")
                                 + " — a straggler to investigate (a slow GPU or node, or imbalance; too few steps to "
                                 "show it persists)"),
                     "detail": {"kind": "node_outlier" if by_host else "rank_outlier",
                                "rank": None if by_host else int(top["rank"]), "host": top["host"],
                                "step": int(top["step"]), "ratio": round(float(top["ratio"]), 4),
                                "steps": int(top["i"]) + 1}})
    return rows


__all__ = ["LIST_RULES", "MEGATRON_ETPT", "NVRX_PERF_DICT", "Outlier", "dict_values", "etpt_values",
           "list_report_verdicts", "progress_outliers", "slow_outliers"]
