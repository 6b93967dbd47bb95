"""Straggler detector: a slow node versus workload imbalance, from per-rank step times.

Input: ``progress`` findings with ``rank``, ``host``, ``job_id`` and ``step_time_s``. Time is cut
into epoch-aligned windows of ``window_s``; only *complete* windows (``end <= watermark``) count,
so a window's verdict never changes once made. Per (job, window) each rank's median step time is
scored robustly:

* rank score: ``ratio = t_rank / median(all ranks)`` and ``z = (t_rank - median) / max(1.4826·MAD,
  rel_floor·median)``; slow when ``ratio >= min_ratio`` and ``z >= min_z``.
* host score (leave one host out, so a slow host cannot drag the reference): the host is slow in
  the window when it has ``>= min_ranks_per_host`` ranks, *every* one of them is at least
  ``min_rank_ratio`` × the other hosts' median, and the host median is slow by the rank rule
  measured against the other hosts' median and MAD.

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
from recovery_logs.timeutil import ns_to_iso

log = logging.getLogger(__name__)
_NS = 1_000_000_000


def _robust(x: np.ndarray, rel_floor: float) -> tuple[float, float]:
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return med, max(1.4826 * mad, rel_floor * abs(med), 1e-9)


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
        wn = int(self.window_s * _NS)
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
                    .agg(pl.col("step_time_s").median().alias("t"), pl.col("host").min().alias("host"))
                    .sort(["job_id", "w", "rank"]))
        rank_rows: list[dict] = []
        host_rows: list[dict] = []
        for (job, w), grp in per_rank.group_by(["job_id", "w"], maintain_order=True):
            t = grp["t"].to_numpy()
            hosts = np.array(grp["host"].to_list(), dtype=object)
            ranks = grp["rank"].to_list()
            if len(t) < 3:
                continue
            med, scale = _robust(t, self.rel_floor)
            for r, h, x in zip(ranks, hosts, t, strict=True):
                ratio, z = x / med if med > 0 else 1.0, (x - med) / scale
                rank_rows.append({"job_id": job, "w": w, "rank": r, "host": h, "t": float(x), "ratio": ratio,
                                  "z": z, "slow": bool(ratio >= self.min_ratio and z >= self.min_z)})
            for h in sorted(set(hosts.tolist())):
                mine, others = t[hosts == h], t[hosts != h]
                if len(others) < 2:
                    continue
                omed, oscale = _robust(others, self.rel_floor)
                hmed = float(np.median(mine))
                ratio = hmed / omed if omed > 0 else 1.0
                z = (hmed - omed) / oscale
                all_slow = bool(omed > 0 and np.all(mine / omed >= self.min_rank_ratio))
                slow = (len(mine) >= self.min_ranks_per_host and all_slow and ratio >= self.min_ratio
                        and z >= self.min_z)
                host_rows.append({"job_id": job, "w": w, "host": h, "n_ranks": len(mine), "t": hmed,
                                  "ref_t": omed, "ratio": ratio, "z": z, "slow": bool(slow)})
        rs = pl.DataFrame(rank_rows, schema={"job_id": pl.String, "w": pl.Int64, "rank": pl.Int32, "host": pl.String,
                                             "t": pl.Float64, "ratio": pl.Float64, "z": pl.Float64, "slow": pl.Boolean})
        hs = pl.DataFrame(host_rows, schema={"job_id": pl.String, "w": pl.Int64, "host": pl.String,
                                             "n_ranks": pl.Int64, "t": pl.Float64, "ref_t": pl.Float64,
                                             "ratio": pl.Float64, "z": pl.Float64, "slow": pl.Boolean})
        return rs, hs

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        rs, hs = self.window_scores(findings, ctx)
        if rs.is_empty():
            return empty_findings()
        wn = int(self.window_s * _NS)
        rows = self._slow_nodes(hs, wn) + self._imbalance(rs, hs, wn)
        return synthetic_findings(self.name, rows) if rows else empty_findings()

    def _slow_nodes(self, hs: pl.DataFrame, wn: int) -> list[dict]:
        rows = []
        for (job, host), grp in hs.sort(["job_id", "host", "w"]).group_by(["job_id", "host"], maintain_order=True):
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
            ratio = float(g["ratio"].median())
            shown = ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")
            how = "the slow set shifts between windows" if shifting else f"the same ranks across {len(hosts)} host(s)"
            msg = (f"ranks {shown} slow ({ratio:.2f}x the job median) in {self.persist} {self.window_s:.0f} s windows;"
                   f" {how}, no node has all its ranks slow — workload imbalance for the job owner, not a bad node")
            rows.append({"time_ns": upto_w + wn, "host": None, "job_id": job, "category": "straggler",
                         "severity": "low", "role": "info", "action": "investigate", "message": msg,
                         "detail": {"kind": "imbalance", "ranks": ranks, "hosts": hosts, "shifting": shifting,
                                    "ratio": round(ratio, 4)}})
        return rows


__all__ = ["StragglerDetector"]
