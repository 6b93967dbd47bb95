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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import polars as pl

from recovery_logs.detectors.base import DetectContext, synthetic_findings, upto, with_rank
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
    name: str = "straggler"

    def window_scores(self, findings: pl.DataFrame, ctx: DetectContext) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(rank scores, host scores) per job and complete window up to the watermark."""
        wn = int(self.window_s * NS)
        p = (upto(findings, ctx.watermark_ns)
             .filter((pl.col("role") == "progress") & pl.col("job_id").is_not_null()
                     & ~pl.col("rule_id").fill_null("").str.starts_with("detector."))
             .filter(pl.col("step_time_s").is_not_null() & pl.col("step_time_s").is_finite()))
        p = with_rank(p)
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
        rs, hs = self.window_scores(findings, ctx)
        if rs.is_empty():
            return empty_findings()
        wn = int(self.window_s * NS)
        rows = self._slow_nodes(hs, wn) + self._imbalance(rs, hs, wn)
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


__all__ = ["StragglerDetector"]
