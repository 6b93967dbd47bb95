"""Straggler detector: a slow node versus workload imbalance, from per-rank step times.

Input: ``progress`` findings with ``rank``, ``host``, ``job_id`` and ``step_time_s``. Time is cut
into epoch-aligned windows of ``window_s``; only *complete* windows (``end <= watermark``) count,
so a window's verdict never changes once made. Per (job, window) each rank's median step time is
scored robustly:

* rank score: ``ratio = t_rank / median(all ranks)`` and ``z = (t_rank - median) / max(1.4826·MAD,
  rel_floor·median)``; slow when ``ratio >= min_ratio`` and ``z >= min_z``.
* host score (leave one host out, so a slow host cannot drag the reference; with 8+ hosts the
  all-rank median is used, which one host cannot move far): the host is slow in the window when
  it has ``>= min_ranks_per_host`` ranks, *every* one of them is at least ``min_rank_ratio`` ×
  the other hosts' median, and the host median is slow by the rank rule measured against the
  other hosts' median and MAD. All of this is vectorised in Polars.

Verdicts:

* **slow node** — a host slow in ``persist`` consecutive complete windows: category
  ``straggler``, severity medium, role cause, action ``drain_node_and_requeue``, host = the node.
  One finding per (job, host), at the end of the window that completes the persistence.
* **workload imbalance** — slow ranks not explained by a slow node (specific ranks across
  nodes, or a slow set that shifts) in ``persist`` windows of a job: category ``straggler``,
  severity low, role info, action ``investigate``, host null — for the job owner, never a drain.
  One finding per job.

Timing *reports* that already compare ranks are evidence without minutes of per-rank lines
(``rules/progress.toml``; the rows of a multi-line report are parsed here from its one record):

* **Megatron StragglerDetector** (``MnRtt/Rnk … MxRtt/Rnk``, rank 0 once per log interval): a report
  is *spread* when max/min round-trip time ``>= report_ratio`` and the gap ``>= report_min_gap_ms``
  (the first of 3+ reports is warm-up and skipped). The same slowest rank in ``report_persist``
  consecutive spread reports, with the hardware pointing at it too (lowest clock or highest
  temperature on that rank) and a host known for the rank (per-rank lines of two or more hosts,
  or nvidia-resiliency-ext ``Node=`` rows), is a slow node (``drain_node_and_requeue``); otherwise
  — spread reports, or one report at ``report_single_ratio`` — ``investigate`` naming the rank.
* **Megatron ``(min, max) time across ranks``** blocks: only the compute timers
  (``forward-compute``, ``backward-compute``: the all-reduce/sync timers measure waiting, and
  ``batch-generator`` spreads are normal). Spread (``>= timer_ratio``, gap ``>= timer_min_gap_ms``)
  in two blocks, or one at ``timer_single_ratio``: ``investigate`` — the block names no rank.
* **nvidia-resiliency-ext** warnings are ``investigate`` by rule; the same node named in
  ``nvrx_persist`` reports (or all worst-scored ranks ``<= nvrx_score`` on one node in that many
  score blocks) is a slow node (``drain_node_and_requeue``).
* **Megatron ``Bottom N Ranks with lowest Etpt``** lines (``--straggler-minmax-count``), the
  nvidia-resiliency-ext example's ``Rank R GPUs relative/individual perf: {rank: score}`` dicts and a
  single ``GPU relative performance`` score block: one report whose slowest rank is an outlier
  (below) is ``investigate`` naming the rank — a report, not yet a persistent slow node.
* **per-rank outlier** on short evidence (an excerpt, or the first steps of a job): per step of
  one progress rule, 3+ ranks' step times; a rank at ``>= outlier_ratio`` × the step median with a
  robust z ``>= min_z`` (scale floored at ``outlier_rel_floor`` of the median) in two of the job's
  first ``outlier_steps`` steps, or once at ``outlier_single_ratio``: ``investigate`` naming the
  rank; never a drain (a few steps cannot show persistence; the windowed verdicts do).
* **job slowdown**: a job's step time (one progress stream) at ``slowdown_ratio`` × the median of
  the ``slowdown_window`` reports before for ``slowdown_persist`` reports in a row: ``investigate`` (no peer to compare with, so
  never a drain; single spikes — checkpoint saves, evaluation — do not persist). A job with a single stream (one
  process's log: an MXNet Speedometer, a Keras or NiftyNet loop) has nothing else to judge by, and there a lasting rise
  of ``slowdown_ratio_alone`` (1.4x) counts; with peers, a rank's smaller rise is the windowed verdicts' to judge.
* **nccl-tests rows** (``progress.nccl_tests_row``): a run's busbw that collapses at large messages and stays down, or
  is under any GPU interconnect's rate at 128 MiB and up: ``investigate`` the fabric (see :func:`_nccl_tests`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from recovery_logs.detectors.base import DetectContext, synthetic_findings, upto
from recovery_logs.detectors.progress import progress_of
from recovery_logs.detectors.rank_outliers import LIST_RULES, list_report_verdicts, progress_outliers
from recovery_logs.schema import empty_findings
from recovery_logs.timeutil import NS, ns_to_iso

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StragglerDetector:
    window_s: float = 60.0
    persist: int = 3
    min_ratio: float = 1.15
    min_rank_ratio: float = 1.08
    min_z: float = 3.5
    rel_floor: float = 0.02
    min_ranks_per_host: int = 2
    report_ratio: float = 1.2
    report_single_ratio: float = 1.5
    report_min_gap_ms: float = 50.0
    report_persist: int = 3
    report_clock_ratio: float = 0.9
    report_hot_c: float = 85.0
    timer_ratio: float = 1.5
    timer_single_ratio: float = 2.0
    timer_min_gap_ms: float = 100.0
    nvrx_persist: int = 2
    nvrx_score: float = 0.75
    slowdown_ratio: float = 2.0
    slowdown_ratio_alone: float = 1.4
    slowdown_persist: int = 3
    slowdown_baseline: int = 3
    slowdown_window: int = 20
    outlier_ratio: float = 1.3
    outlier_rel_floor: float = 0.05
    outlier_min_ranks: int = 3
    outlier_single_ratio: float = 1.5
    outlier_steps: int = 5
    outlier_pair_ratio: float = 1.5
    busbw_collapse_ratio: float = 0.5
    busbw_collapse_min_bytes: int = 1 << 20
    busbw_low_gbs: float = 5.0
    busbw_low_min_bytes: int = 128 << 20
    name: str = "straggler"

    def window_scores(self, findings: pl.DataFrame, ctx: DetectContext) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(rank scores, host scores) per job and complete window up to the watermark."""
        wn = int(self.window_s * NS)
        # the progress observations (detectors.progress): the rank of each line read once, not per pass
        p = (_observed(findings, ctx).filter(pl.col("step_time_s").is_not_null() & pl.col("step_time_s").is_finite())
             .drop("rank").rename({"rank_line": "rank"}))
        if log.isEnabledFor(logging.DEBUG):
            for job in sorted(set(p.filter(pl.col("rank").is_null())["job_id"].to_list())):
                log.debug("straggler detector: job %s has step times without a rank; those lines are ignored", job)
        p = p.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
        p = p.with_columns(((pl.col("time").dt.epoch("ns") // wn) * wn).alias("w"))
        p = p.filter(pl.col("w") + wn <= ctx.watermark_ns)
        per_rank = (p.group_by(["job_id", "w", "rank"])
                    .agg(pl.col("step_time_s").median().alias("t"), pl.col("host").min().alias("host")))
        keys = ["job_id", "w"]
        g = per_rank.group_by(keys).agg(pl.col("t").median().alias("med"), pl.len().alias("n"),
                                        pl.col("host").n_unique().alias("n_hosts"))
        pr = per_rank.join(g.filter(pl.col("n") >= 3), on=keys, how="inner")
        mad = pr.group_by(keys).agg((pl.col("t") - pl.col("med")).abs().median().alias("mad"))
        pr = pr.join(mad, on=keys, how="left")
        rs = pr.with_columns(
            pl.when(pl.col("med") > 0).then(pl.col("t") / pl.col("med")).otherwise(1.0).alias("ratio"),
            ((pl.col("t") - pl.col("med")) / self._scale("mad", "med")).alias("z"))
        rs = rs.with_columns(((pl.col("ratio") >= self.min_ratio) & (pl.col("z") >= self.min_z)).alias("slow"))
        rs = rs.select("job_id", "w", pl.col("rank").cast(pl.Int32), "host", "t", "ratio", "z", "slow").sort(
            ["job_id", "w", "rank"])
        hosts = pr.group_by([*keys, "host"]).agg(pl.col("t").median().alias("hmed"), pl.col("t").min().alias("hmin"),
                                                  pl.len().alias("n_ranks"), pl.col("n_hosts").first())
        ref = self._reference(pr, hosts, keys)
        hs = hosts.join(ref, on=[*keys, "host"], how="inner").filter(pl.col("n_others") >= 2)
        hs = hs.with_columns(
            pl.when(pl.col("omed") > 0).then(pl.col("hmed") / pl.col("omed")).otherwise(1.0).alias("ratio"),
            ((pl.col("hmed") - pl.col("omed")) / self._scale("omad", "omed")).alias("z"),
            ((pl.col("omed") > 0) & (pl.col("hmin") / pl.col("omed") >= self.min_rank_ratio)).alias("all_slow"))
        hs = hs.with_columns(((pl.col("n_ranks") >= self.min_ranks_per_host) & pl.col("all_slow")
                              & (pl.col("ratio") >= self.min_ratio) & (pl.col("z") >= self.min_z)).alias("slow"))
        hs = hs.select("job_id", "w", "host", pl.col("n_ranks").cast(pl.Int64), pl.col("hmed").alias("t"),
                       pl.col("omed").alias("ref_t"), "ratio", "z", "slow").sort(["job_id", "w", "host"])
        return rs, hs

    def _scale(self, mad: str, med: str) -> pl.Expr:
        return pl.max_horizontal(1.4826 * pl.col(mad), self.rel_floor * pl.col(med).abs(), pl.lit(1e-9))

    @staticmethod
    def _reference(pr: pl.DataFrame, hosts: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        """Median and MAD of the *other* hosts' ranks, per (job, window, host). Exact (leave one
        host out) for jobs with fewer than 8 hosts; with 8 or more, one host moves the median by
        at most an eighth of the ranks, so the all-rank median/MAD are used (linear cost)."""
        small = hosts.filter(pl.col("n_hosts") < 8).select(*keys, "host")
        pairs = (small.join(pr.select(*keys, pl.col("host").alias("other"), "t"), on=keys, how="inner")
                 .filter(pl.col("host") != pl.col("other")))
        omed = pairs.group_by([*keys, "host"]).agg(pl.col("t").median().alias("omed"), pl.len().alias("n_others"))
        omad = (pairs.join(omed, on=[*keys, "host"]).group_by([*keys, "host"])
                .agg((pl.col("t") - pl.col("omed")).abs().median().alias("omad")))
        exact = omed.join(omad, on=[*keys, "host"])
        large = (hosts.filter(pl.col("n_hosts") >= 8).select(*keys, "host", "n_ranks")
                 .join(pr.group_by(keys).agg(pl.col("med").first().alias("omed"), pl.col("mad").first().alias("omad"),
                                             pl.len().alias("n_all")), on=keys)
                 .select(*keys, "host", "omed", (pl.col("n_all") - pl.col("n_ranks")).cast(pl.UInt32).alias("n_others"),
                         "omad"))
        return pl.concat([exact.select(*keys, "host", "omed", pl.col("n_others").cast(pl.UInt32), "omad"),
                          large.select(*keys, "host", "omed", "n_others", "omad")])

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        if progress_of(findings, ctx).is_empty() and not findings.get_column("rule_id").is_in(
                list(REPORT_RULES + LIST_RULES)).any():
            # no progress observation and no timing report: every verdict below reads one or the other
            # (most windows of a log that is not a training job's; ~15 ms of Polars calls saved per pass).
            # The unfiltered observations: on a training log this test costs nothing beyond a height.
            return empty_findings()
        rs, hs = self.window_scores(findings, ctx)
        rows: list[dict] = []
        if not rs.is_empty():
            wn = int(self.window_s * NS)
            rows = self._slow_nodes(hs, wn) + self._imbalance(rs, hs, wn)
        rows += report_verdicts(self, findings, ctx)
        rows += rank_outliers(self, findings, ctx)
        if rows:
            thermal_hosts(rows, findings, ctx)
        return synthetic_findings(self.name, rows) if rows else empty_findings()

    def _slow_nodes(self, hs: pl.DataFrame, wn: int) -> list[dict]:
        rows = []
        slow = hs.filter(pl.col("slow")).sort(["job_id", "host", "w"])
        for (job, host), grp in slow.group_by(["job_id", "host"], maintain_order=True):
            run: list[dict] = []
            prev_w = None
            for r in grp.iter_rows(named=True):
                if r["slow"] and (prev_w is None or r["w"] == prev_w + wn) and run:
                    run.append(r)
                elif r["slow"]:
                    run = [r]
                else:
                    run = []
                prev_w = r["w"]
                if len(run) >= self.persist:
                    ratio = float(np.median([x["ratio"] for x in run]))
                    msg = (f"all {r['n_ranks']} ranks on {host} slow for {len(run)} consecutive "
                           f"{self.window_s:.0f} s windows: median step {r['t']:.3f} s vs {r['ref_t']:.3f} s on the "
                           f"other hosts ({ratio:.2f}x, robust z {r['z']:.1f}); slow since {ns_to_iso(run[0]['w'])}"
                           f" — a slow node, not workload imbalance")
                    rows.append({"time_ns": r["w"] + wn, "host": host, "job_id": job, "category": "straggler",
                                 "severity": "medium", "role": "cause", "action": "drain_node_and_requeue",
                                 "message": msg,
                                 "detail": {"kind": "slow_node", "ratio": round(ratio, 4), "windows": len(run),
                                            "since": ns_to_iso(run[0]["w"]), "n_ranks": r["n_ranks"]}})
                    break
        return rows

    def _imbalance(self, rs: pl.DataFrame, hs: pl.DataFrame, wn: int) -> list[dict]:
        slow_hosts = hs.filter(pl.col("slow")).select("job_id", "w", "host", pl.lit(True).alias("node_slow"))
        r = (rs.filter(pl.col("slow")).join(slow_hosts, on=["job_id", "w", "host"], how="left")
             .filter(pl.col("node_slow").is_null()).sort(["job_id", "w", "rank"]))
        rows = []
        for (job,), grp in r.group_by(["job_id"], maintain_order=True):
            ws = sorted(set(grp["w"].to_list()))
            if len(ws) < self.persist:
                continue
            upto_w = ws[self.persist - 1]
            g = grp.filter(pl.col("w") <= upto_w)
            sets = [frozenset(g.filter(pl.col("w") == w)["rank"].to_list()) for w in ws[: self.persist]]
            shifting = len(set(sets)) > 1
            ranks = sorted(set(g["rank"].to_list()))
            hosts = sorted(set(g["host"].to_list()))
            ratio = float(g["ratio"].median())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal
            shown = ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")
            how = "the slow set shifts between windows" if shifting else f"the same ranks across {len(hosts)} host(s)"
            msg = (f"ranks {shown} slow ({ratio:.2f}x the job median) in {self.persist} {self.window_s:.0f} s windows;"
                   f" {how}, no node has all its ranks slow — workload imbalance for the job owner, not a bad node")
            rows.append({"time_ns": upto_w + wn, "host": None, "job_id": job, "category": "straggler",
                         "severity": "low", "role": "cause", "action": "investigate", "message": msg,
                         "detail": {"kind": "imbalance", "ranks": ranks, "hosts": hosts, "shifting": shifting,
                                    "ratio": round(ratio, 4)}})
        return rows


# ---- timing reports ------------------------------------------------------------------------------

MEGATRON_REPORT = "progress.megatron_straggler_report"
MEGATRON_TIMERS = "progress.megatron_minmax_timers"
NVRX_WARNING = "progress.nvrx_straggler_warning"
NVRX_SCORES = "progress.nvrx_gpu_scores"
MEGATRON_ALL = "progress.megatron_all_ranks_timers"
NCCL_TESTS = "progress.nccl_tests_row"
REPORT_RULES = (MEGATRON_REPORT, MEGATRON_TIMERS, NVRX_WARNING, NVRX_SCORES, MEGATRON_ALL, NCCL_TESTS)
COMPUTE_TIMERS = ("forward-compute", "backward-compute")
_TIMER_ROW = re.compile(r"^\s+([A-Za-z][\w\-]*(?:[ \-][\w\-]+)*) \.*: \((\d+(?:\.\d+)?), (\d+(?:\.\d+)?)\)\s*$", re.M)
_ALL_TIMER = re.compile(r"^  ([A-Za-z][\w\-]*(?:[ \-][\w\-]+)*):\s*$((?:\n     rank\s*\d+: \d+(?:\.\d+)?[ \t]*$)+)", re.M)
_ALL_ROW = re.compile(r"rank\s*(\d+): (\d+(?:\.\d+)?)")
_SCORE_ROW = re.compile(r"^\s*Rank=(\d+) Node=([A-Za-z0-9][\w.\-]*) Score=(\d+(?:\.\d+)?)\s*$", re.M)
_STRAGGLER_ID = re.compile(r"StragglerId\(rank=(\d+), node='?([A-Za-z0-9][\w.\-]*)'?\)")


def _detail(row: dict) -> dict:
    try:
        d = json.loads(row.get("detail") or "{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _num(d: dict, key: str) -> float | None:
    try:
        return float(str(d[key]).replace(",", ""))
    except (KeyError, ValueError):
        return None


def _observed(findings: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
    """The job progress observations up to the watermark (``detectors.progress.observations``)."""
    return upto(progress_of(findings, ctx), ctx.watermark_ns).filter(
        pl.col("job_id").is_not_null() & ~pl.col("rule_id").fill_null("").str.starts_with("detector."))


def _rank_hosts(obs: pl.DataFrame) -> dict[tuple[str, int], str]:
    """(job, rank) -> host, from (per-rank progress) lines that carry both, for jobs whose ranks are
    seen on 2+ hosts (one file holding every rank's output names no host per rank: no map).
    ``obs``: progress observations (the line's rank: ``rank_line``)."""
    r = obs.select("job_id", "host", pl.col("rank_line").alias("rank")).filter(
        pl.col("rank").is_not_null() & pl.col("host").is_not_null())
    r = r.group_by(["job_id", "rank"]).agg(pl.col("host").mode().first())
    multi = r.group_by("job_id").agg(pl.col("host").n_unique().alias("nh")).filter(pl.col("nh") >= 2)["job_id"]
    r = r.filter(pl.col("job_id").is_in(multi.implode()))
    return {(j, int(k)): h for j, k, h in r.select("job_id", "rank", "host").iter_rows()}


def report_verdicts(det: StragglerDetector, findings: pl.DataFrame, ctx: DetectContext) -> list[dict]:
    """Verdicts from timing reports and job slowdowns (see the module docstring)."""
    keep = pl.col("job_id").is_not_null() & ~pl.col("rule_id").fill_null("").str.starts_with("detector.")
    obs = _observed(findings, ctx)
    rep = (upto(findings.filter(pl.col("rule_id").is_in(REPORT_RULES)), ctx.watermark_ns).filter(keep)
           .sort(["time", "seq"], nulls_last=True))
    rows: list[dict] = []
    megatron = rep.filter(pl.col("rule_id").is_in([MEGATRON_REPORT, MEGATRON_ALL])).height > 0   # bare ranks
    hosts = _rank_hosts(obs) if megatron else {}
    for (job,), g in rep.group_by(["job_id"], maintain_order=True):
        recs = g.select("time", "rule_id", "message", "detail").iter_rows(named=True)
        by_rule: dict[str, list[dict]] = {}
        for r in recs:
            by_rule.setdefault(r["rule_id"], []).append(r)
        for r in by_rule.get(NVRX_SCORES, []):   # Node= rows name each rank's host
            for rk, node, _ in _SCORE_ROW.findall(r["message"]):
                hosts.setdefault((job, int(rk)), node)
        rows += _megatron_reports(det, job, by_rule.get(MEGATRON_REPORT, []), hosts)
        rows += _megatron_all_ranks(det, job, by_rule.get(MEGATRON_ALL, []), hosts)
        rows += _megatron_timers(det, job, by_rule.get(MEGATRON_TIMERS, []))
        rows += _nvrx(det, job, by_rule.get(NVRX_WARNING, []), by_rule.get(NVRX_SCORES, []))
        rows += _nccl_tests(det, job, by_rule.get(NCCL_TESTS, []))
    rows += _slowdowns(det, obs)
    return rows


def thermal_hosts(rows: list[dict], findings: pl.DataFrame, ctx: DetectContext) -> None:
    """A slow node that also reports thermal throttling (a ``thermal_power`` cause finding on the host):
    the slowness is the throttling's symptom — the verdict becomes a symptom of that incident (the
    thermal finding is the root cause and decides the action: investigate the cooling first)."""
    # the thermal causes first, then the watermark: filtering the whole findings frame first copied every
    # column of every row (on a fleet, hundreds of thousands of progress findings, each detector pass)
    hot = set(upto(findings.filter(
        (pl.col("category") == "thermal_power") & (pl.col("role") == "cause") & pl.col("host").is_not_null()
    ), ctx.watermark_ns)["host"].unique().to_list())
    for r in rows:
        if r["action"] == "drain_node_and_requeue" and r.get("host") in hot:
            r.update(role="symptom", severity="low", action="investigate")
            r["message"] += "; the node also reports thermal throttling — its symptom, check the cooling first"


def _t(r: dict) -> int:
    return int(r["time"].timestamp() * NS) if hasattr(r["time"], "timestamp") else int(r["time"])


@dataclass(frozen=True)
class _Rtt:
    """One Megatron straggler report: the fastest/slowest rank's round-trip time and the hardware hints."""

    t: int
    lo: float
    hi: float
    rank: int
    key: str                  # the slowest rank's host when known, else "rank N"
    hw: bool                  # a cut GPU clock or a hot GPU on the same host (or rank)
    clk: float | None
    clk_max: float | None

    @property
    def ratio(self) -> float:
        return self.hi / self.lo


def _megatron_reports(det: StragglerDetector, job: str, reps: list[dict], hosts: dict) -> list[dict]:
    pts: list[_Rtt] = []

    def where(rank: int) -> str:      # the rank's host when known, else the rank itself
        return hosts.get((job, rank)) or f"rank {rank}"

    for r in reps:
        d = _detail(r)
        lo, hi, rmax = _num(d, "rtt_min_ms"), _num(d, "rtt_max_ms"), _num(d, "rtt_max_rank")
        if lo is None or hi is None or rmax is None or lo <= 0:
            continue
        key = where(int(rmax))
        clk_r, tmp_r = _num(d, "clk_min_rank"), _num(d, "tmp_max_rank")
        clk, clk_max, tmp = _num(d, "clk_min_mhz"), _num(d, "clk_max_mhz"), _num(d, "tmp_max_c")
        # throttling shows: the lowest clock well below the highest, or a hot GPU, on the slow rank's host
        slow_clock = (clk_r is not None and where(int(clk_r)) == key and clk is not None and clk_max is not None
                      and clk <= det.report_clock_ratio * clk_max)
        hot = tmp_r is not None and where(int(tmp_r)) == key and tmp is not None and tmp >= det.report_hot_c
        pts.append(_Rtt(_t(r), lo, hi, int(rmax), key, slow_clock or hot, clk, clk_max))
    return _rtt_verdict(det, job, pts, hosts, "Megatron straggler reports")


def _megatron_all_ranks(det: StragglerDetector, job: str, blocks: list[dict], hosts: dict) -> list[dict]:
    """``times across ranks (ms):`` blocks: per block the compute timer with the widest spread, its
    slowest rank named (no hardware readings in this report)."""
    pts: list[_Rtt] = []
    for b in blocks:
        best: _Rtt | None = None
        for name, body in _ALL_TIMER.findall(b["message"]):
            if name.strip() not in COMPUTE_TIMERS:
                continue
            vals = {int(rk): float(v) for rk, v in _ALL_ROW.findall(body)}
            if len(vals) < 2 or min(vals.values()) <= 0:
                continue
            rk = max(vals, key=lambda k: vals[k])
            cand = _Rtt(_t(b), min(vals.values()), vals[rk], rk, hosts.get((job, rk)) or f"rank {rk}", False, None, None)
            if best is None or cand.ratio > best.ratio:
                best = cand
        if best is not None:
            pts.append(best)
    return _rtt_verdict(det, job, pts, hosts, "Megatron per-rank timer reports")


def _rtt_verdict(det: StragglerDetector, job: str, pts: list[_Rtt], hosts: dict, label: str) -> list[dict]:
    """Slow-node / investigate verdict from a series of reports that name the slowest rank."""
    if len(pts) >= 3:
        pts = pts[1:]      # the first report of a run covers warm-up (compilation, NCCL set-up)
    spread = [p.ratio >= det.report_ratio and p.hi - p.lo >= det.report_min_gap_ms for p in pts]
    run: list[_Rtt] = []
    best: list[_Rtt] = []
    for p, sp in zip(pts, spread, strict=True):
        run = (run + [p]) if sp and run and run[-1].key == p.key else ([p] if sp else [])
        if len(run) > len(best):
            best = list(run)
    if len(best) >= det.report_persist:
        last = best[-1]
        rk = last.rank
        ranks = sorted({p.rank for p in best})
        ratio = float(np.median([p.ratio for p in best]))
        hw = sum(p.hw for p in best) * 2 > len(best)
        host = hosts.get((job, rk))
        who = f"rank {rk}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks[:8]))} (all on {host})"
        why = (f"{who} the slowest in {len(best)} consecutive {label}: "
               f"{last.hi:.0f} ms vs {last.lo:.0f} ms on the fastest rank ({ratio:.2f}x)")
        if hw:
            why += (f"; the lowest GPU clock is there too ({last.clk:.0f} vs {last.clk_max:.0f} MHz)"
                    if last.clk is not None and last.clk_max is not None and last.clk < last.clk_max * 0.95
                    else "; the hottest GPU is there too")
        detail = {"kind": "report_rank", "rank": rk, "ranks": ranks, "ratio": round(ratio, 4), "reports": len(best),
                  "hardware": hw}
        if hw and host is not None:
            return [{"time_ns": last.t, "host": host, "job_id": job, "rank": rk, "category": "straggler",
                     "severity": "medium", "role": "cause", "action": "drain_node_and_requeue",
                     "message": f"{why}; {'rank ' + str(rk) + ' runs on ' + host if len(ranks) == 1 else host}"
                                " — a slow node", "detail": detail}]
        return [{"time_ns": last.t, "host": None, "job_id": job, "rank": rk, "category": "straggler",
                 "severity": "low", "role": "cause", "action": "investigate",
                 "message": why + ("" if hw else "; no GPU clock or temperature points at it (imbalance or a slow GPU)")
                 + ("" if host is not None else "; its host is not known from this log"), "detail": detail}]
    n_spread = sum(spread)
    top = max(pts, key=lambda p: p.ratio, default=None)
    if top is not None and (n_spread >= 2 or (top.ratio >= det.report_single_ratio
                                               and top.hi - top.lo >= det.report_min_gap_ms)):
        return [{"time_ns": top.t, "host": None, "job_id": job, "rank": top.rank, "category": "straggler",
                 "severity": "low", "role": "cause", "action": "investigate",
                 "message": (f"{label}: slowest rank {top.rank} at {top.hi:.0f} ms vs "
                             f"{top.lo:.0f} ms ({top.ratio:.2f}x) in {max(n_spread, 1)} of {len(pts)} report(s);"
                             " not the same rank persistently — investigate"),
                 "detail": {"kind": "report_spread", "rank": top.rank, "ratio": round(top.ratio, 4),
                            "spread_reports": n_spread}}]
    return []


def _megatron_timers(det: StragglerDetector, job: str, blocks: list[dict]) -> list[dict]:
    parsed = []
    for b in blocks:
        rows = {name.strip(): (float(lo), float(hi)) for name, lo, hi in _TIMER_ROW.findall(b["message"])}
        best = None
        for name in COMPUTE_TIMERS:
            if name in rows and rows[name][0] > 0:
                lo, hi = rows[name]
                if best is None or hi / lo > best[3]:
                    best = (name, lo, hi, hi / lo)
        if best is not None:
            parsed.append((_t(b), *best))
    if len(parsed) >= 3:
        parsed = parsed[1:]      # warm-up block
    spread = [p for p in parsed if p[4] >= det.timer_ratio and p[3] - p[2] >= det.timer_min_gap_ms]
    top = max(spread, key=lambda p: p[4], default=None)
    if top is None or (len(spread) < 2 and top[4] < det.timer_single_ratio):
        return []
    t, name, lo, hi, ratio = top
    return [{"time_ns": t, "host": None, "job_id": job, "category": "straggler", "severity": "low", "role": "cause",
             "action": "investigate",
             "message": (f"Megatron timers: {name} {lo:.0f} ms on the fastest rank vs {hi:.0f} ms on the slowest "
                         f"({ratio:.2f}x) in {len(spread)} of {len(parsed)} report(s); the block names no rank — "
                         "a straggler or a pipeline-stage imbalance, investigate"),
             "detail": {"kind": "timer_spread", "timer": name, "ratio": round(ratio, 4), "blocks": len(spread)}}]


def _nvrx(det: StragglerDetector, job: str, warns: list[dict], scores: list[dict]) -> list[dict]:
    """Nodes named by ``nvrx_persist`` warnings, or by that many score blocks whose worst rows (score
    ``<= nvrx_score``) all lie on the node. Counted per report line (excerpts often carry no clock)."""
    by_warn: dict[str, list[tuple[int, set[int]]]] = {}
    by_score: dict[str, list[tuple[int, set[int]]]] = {}
    for w in warns:
        per: dict[str, set[int]] = {}
        for rk, node in _STRAGGLER_ID.findall(w["message"]):
            per.setdefault(node, set()).add(int(rk))
        for node, rks in per.items():
            by_warn.setdefault(node, []).append((_t(w), rks))
    for s in scores:
        low = [(int(rk), node) for rk, node, sc in _SCORE_ROW.findall(s["message"]) if float(sc) <= det.nvrx_score]
        nodes = {node for _, node in low}
        if len(nodes) == 1:
            by_score.setdefault(nodes.pop(), []).append((_t(s), {rk for rk, _ in low}))
    out = []
    for node in sorted(set(by_warn) | set(by_score)):
        n = max(len(by_warn.get(node, [])), len(by_score.get(node, [])))
        if n < det.nvrx_persist:
            continue
        hits = by_warn.get(node, []) + by_score.get(node, [])
        slow = sorted({rk for _, r in hits for rk in r})
        out.append({"time_ns": max(t for t, _ in hits), "host": node, "job_id": job, "category": "straggler",
                    "severity": "medium", "role": "cause", "action": "drain_node_and_requeue",
                    "message": (f"nvidia-resiliency-ext named {node} (ranks {', '.join(map(str, slow[:8]))}) as a "
                                f"straggler in {n} reports — a slow node"),
                    "detail": {"kind": "nvrx_node", "reports": n, "ranks": slow}})
    if out or warns:          # a warning is already an investigate finding of its own (rules/progress.toml)
        return out
    # one score block (or blocks naming different nodes): its worst rank at or below the threshold
    worst = [(float(sc), int(rk), node, _t(s)) for s in scores for rk, node, sc in _SCORE_ROW.findall(s["message"])
             if float(sc) <= det.nvrx_score]
    if not worst:
        return out
    sc, rk, node, t = min(worst)
    return [{"time_ns": t, "host": None, "job_id": job, "rank": rk, "category": "straggler", "severity": "low",
             "role": "cause", "action": "investigate",
             "message": (f"nvidia-resiliency-ext scored rank {rk} on {node} at {sc:.2f} (1.0 = the best rank; "
                         f"threshold {det.nvrx_score:.2f}) — a straggler to investigate (not repeated on one node)"),
             "detail": {"kind": "nvrx_score", "rank": rk, "node": node, "score": sc}}]


_TAG = re.compile(r"\[\d+\]")
_NUM = re.compile(r"^-?\d+(?:\.\d+)?(?:e[+-]?\d+)?$|^N/A$")


def nccl_tests_row(message: str) -> tuple[int, float] | None:
    """(message bytes, busbw in GB/s: the better of the out-of-place and in-place runs) of one
    nccl-tests result row (``rules/progress.toml`` ``progress.nccl_tests_row``), None when the row
    does not read as one. After the type: an optional op name, an optional root, then (time, algbw,
    busbw, #wrong) per run. A row whose busbw is 0 with a non-zero algbw is a one-rank run (busbw =
    algbw x 2(n-1)/n): no bus to measure, None."""
    tok = _TAG.sub(" ", message).split()
    if len(tok) < 7 or not (tok[0].isdigit() and tok[1].isdigit()):
        return None
    rest = tok[3:]
    if rest and rest[0].isalpha():
        rest = rest[1:]
    if len(rest) % 4 == 1:
        rest = rest[1:]                      # the root column
    if len(rest) not in (4, 8) or not all(_NUM.match(x) for x in rest):
        return None
    try:
        runs = [(float(rest[i + 1]), float(rest[i + 2])) for i in range(0, len(rest), 4)]
    except ValueError:
        return None
    busbw = max(b for _, b in runs)
    if busbw <= 0 and max(a for a, _ in runs) > 0:
        return None
    return int(tok[0]), busbw


def _nccl_tests(det: StragglerDetector, job: str, recs: list[dict]) -> list[dict]:
    """nccl-tests rows of a job in order, cut into runs (a run's sizes grow; a smaller size starts the
    next test). Per run, ``investigate`` (the rows name no rank or node) when
    * **collapse**: two sizes in a row of ``busbw_collapse_min_bytes`` and up both carry under
      ``busbw_collapse_ratio`` x the best busbw of the smaller sizes (a dip at one size that recovers
      is a tuning artefact, not a slow path);
    * **low**: the first row of ``busbw_low_min_bytes`` and up carries under ``busbw_low_gbs`` GB/s —
      below any current GPU interconnect (PCIe Gen3 x16 or one 100 Gb/s link carry ~12 GB/s).
    Each verdict is made at the row that decides it, whatever rows come after (a watch that reads the
    rows across several passes makes the same finding as one replay)."""
    runs: list[list[tuple[int, int, float]]] = []
    for r in recs:
        for line in (r["message"] or "").splitlines():    # a record may hold the header and several rows
            got = nccl_tests_row(line)
            if got is None:
                continue
            if not runs or got[0] <= runs[-1][-1][1]:
                runs.append([])
            runs[-1].append((_t(r), *got))
    for run in runs:
        for i, (t, size, bw) in enumerate(run):
            if i and size >= det.busbw_collapse_min_bytes and run[i - 1][1] >= det.busbw_collapse_min_bytes:
                ref = max((b for _, _, b in run[: i - 1]), default=0.0)
                if ref > 0 and max(run[i - 1][2], bw) < det.busbw_collapse_ratio * ref:
                    return [_busbw_row(t, job, "collapse",
                                       f"nccl-tests: busbw falls from {ref:.2f} GB/s to {run[i - 1][2]:.2f} GB/s at "
                                       f"{_size(run[i - 1][1])} and {bw:.2f} GB/s at {_size(size)} — the collective path "
                                       "is far below its own smaller-message rate; investigate the fabric (a slow NIC, "
                                       "link or node)", {"from_gbs": ref, "to_gbs": bw, "at_bytes": run[i - 1][1]})]
            # the first row of busbw_low_min_bytes and up decides (the rows after it: the same path, larger)
            if size >= det.busbw_low_min_bytes and all(s < det.busbw_low_min_bytes for _, s, _ in run[:i]):
                if bw < det.busbw_low_gbs:
                    return [_busbw_row(t, job, "low",
                                       f"nccl-tests: busbw {bw:.2f} GB/s at {_size(size)} — below {det.busbw_low_gbs:g} "
                                       "GB/s, under any current GPU interconnect (PCIe Gen3 x16 or one 100 Gb/s link "
                                       "carries ~12 GB/s); investigate the fabric and the path NCCL chose",
                                       {"gbs": bw, "at_bytes": size})]
    return []


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def _busbw_row(t: int, job: str, kind: str, message: str, detail: dict) -> dict:
    return {"time_ns": t, "host": None, "job_id": job, "category": "straggler", "severity": "low", "role": "cause",
            "action": "investigate", "message": message, "detail": {"kind": f"busbw_{kind}", **detail}}


def rank_outliers(det: StragglerDetector, findings: pl.DataFrame, ctx: DetectContext) -> list[dict]:
    """Short-evidence verdicts (``rank_outliers.py``): a report listing per-rank values, and per-rank
    progress lines with an outlier rank in the job's first steps. Both are made once, at the report
    or step that decides them, so any watermark split gives the same findings."""
    rows = list_report_verdicts(findings, ctx, det.outlier_ratio, det.min_z, det.outlier_rel_floor,
                                det.outlier_min_ranks)
    return rows + progress_outliers(findings, ctx, det.outlier_ratio, det.outlier_single_ratio, det.min_z,
                                    det.outlier_rel_floor, det.outlier_min_ranks, det.outlier_steps,
                                    REPORT_RULES + LIST_RULES, det.outlier_pair_ratio)


def _slowdowns(det: StragglerDetector, f: pl.DataFrame) -> list[dict]:
    """Per progress stream (job, host, rank, rule): the last ``slowdown_persist`` step times all at
    ``slowdown_ratio`` × the median of up to ``slowdown_window`` before them (at least
    ``slowdown_baseline``). Vectorised (rolling windows over each stream); one finding per job.
    ``f``: progress observations (the rule's rank: a stream is what the rule tells apart)."""
    key = ["job_id", "host", "rank", "rule_id"]
    st = pl.col("step_time_s")
    p = f.filter(st.is_not_null() & st.is_finite() & (st > 0))
    if p.height < det.slowdown_baseline + det.slowdown_persist:
        return []
    k = det.slowdown_persist
    # a job with one progress stream has no peer to compare with: its own past is the only reference, and a
    # smaller lasting rise counts (slowdown_ratio_alone); with peers, a rank's rise is judged against them by
    # the windowed verdicts, and only a large one here
    p = p.with_columns(pl.when(pl.struct(key[1:]).n_unique().over("job_id") > 1).then(pl.lit(det.slowdown_ratio))
                       .otherwise(pl.lit(det.slowdown_ratio_alone)).alias("_ratio"))
    lowest = min(det.slowdown_ratio, det.slowdown_ratio_alone)
    if lowest > 0:
        # a cheap necessary condition first (the rolling windows over a fleet's streams were most of
        # this detector's time): a hit's low is at most the stream's largest step time and its baseline
        # median at least the smallest, so only a stream whose max reaches ratio x its min (and long
        # enough for a baseline) can qualify; the others are left out whole (each stream's rolling
        # windows are its own: the same values for the rest)
        span = p.group_by(key).agg(st.max().alias("_hi"), st.min().alias("_lo"), pl.len().alias("_n"),
                                   pl.col("_ratio").first())
        cand = span.filter((pl.col("_hi") >= pl.col("_ratio") * pl.col("_lo"))
                           & (pl.col("_n") >= k + det.slowdown_baseline)).select(key)
        if cand.is_empty():
            return []
        p = p.join(cand, on=key, how="semi", nulls_equal=True, maintain_order="left")
    p = p.sort(["time", "seq"], nulls_last=True)
    p = p.with_columns(
        st.shift(k).rolling_median(window_size=det.slowdown_window, min_samples=det.slowdown_baseline).over(key)
        .alias("_before"),
        st.rolling_min(window_size=k, min_samples=k).over(key).alias("_low"),
        st.rolling_median(window_size=k, min_samples=k).over(key).alias("_now"))
    hit = (p.filter(pl.col("_before").is_not_null() & (pl.col("_low") >= pl.col("_ratio") * pl.col("_before")))
           .unique("job_id", keep="first", maintain_order=True))
    out = []
    for r in hit.select("time", "job_id", "rank", "rule_id", "_before", "_now").iter_rows(named=True):
        ratio = r["_now"] / r["_before"]
        who = f" (rank {r['rank']})" if r["rank"] is not None else ""
        out.append({"time_ns": _t(r), "host": None, "job_id": r["job_id"], "category": "straggler", "severity": "low",
                    "role": "cause", "action": "investigate",
                    "message": (f"the job's step time rose from {r['_before']:.3f} s to {r['_now']:.3f} s ({ratio:.2f}x)"
                                f" and stayed there for {k} reports"
                                f"{who} — a slowdown to investigate"
                                " (a slow or shared GPU/node, throttling, contention)"),
                    "detail": {"kind": "slowdown", "ratio": round(ratio, 4), "from_s": round(r["_before"], 6),
                               "rule": r["rule_id"]}})
    return out


__all__ = ["REPORT_RULES", "StragglerDetector", "rank_outliers", "report_verdicts"]
