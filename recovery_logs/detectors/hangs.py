"""Silent-hang detector: a running job that has stopped making progress.

Each job's progress cadence is learnt from its ``progress`` findings (one *tick* per training
step: the earliest line that reports that step; lines without a step count each as a tick). At
every tick the threshold is ``max(min_silence_s, factor × median interval)`` over the last
``cadence_window`` intervals — only past data, so the threshold a live run uses is the one
replay uses. When no further tick arrives within the threshold, a hang finding is emitted at
``last tick + threshold`` (the event time at which a live run fires), provided

* that time is at or before ``ctx.watermark_ns``;
* the job did not visibly end or fail in between: no ``cause``/``symptom`` finding and no
  ``slurm_job_failure`` finding of the job — or without a job id on one of its hosts (kernel
  XIDs) — in ``(last tick, fire time]`` (those are covered by their own rules; findings whose
  time was inferred from a neighbour line do not count), unless ``ctx.job_states[job] ==
  "RUNNING"``;
* the job is not known to have ``COMPLETED`` (for its final silence only).

When the healthy ranks' NCCL watchdogs later fire, a second finding names the one job host whose
ranks did not report a timeout within ``watchdog_grace_s`` of the first — where the stall began
(``detail.kind = "silent_host"``), emitted at first watchdog + grace.

Output is monotone in the watermark: a finding, once emitted, never changes or disappears, and
it does not depend on how findings were split into batches. Jobs without enough progress lines
are skipped and the reason is logged at DEBUG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl

from recovery_logs.detectors.base import DetectContext, synthetic_findings, upto
from recovery_logs.detectors.progress import progress_of
from recovery_logs.schema import empty_findings
from recovery_logs.timeutil import NS, ns_to_iso

log = logging.getLogger(__name__)

NCCL_WATCHDOG_S = 600.0


def _own_input(findings: pl.DataFrame) -> pl.DataFrame:
    """Rule findings only: never feed a detector its own (or another detector's) output."""
    return findings.filter(~pl.col("rule_id").fill_null("").str.starts_with("detector."))


# the columns the detector reads of the other findings: a filter copies every column it keeps
_COLS = ("time", "seq", "rule_id", "job_id", "host", "step", "role", "category", "time_inferred")


def _narrow(findings: pl.DataFrame, watermark_ns: int) -> pl.DataFrame:
    """The detector's own input (rule findings up to the watermark), only the columns it reads."""
    return _own_input(upto(findings.select(_COLS), watermark_ns))


def _progress(findings: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
    """The job progress observations up to the watermark (``detectors.progress.observations``)."""
    return _own_input(upto(progress_of(findings, ctx), ctx.watermark_ns)).filter(
        pl.col("job_id").is_not_null())


def progress_ticks(progress: pl.DataFrame) -> pl.DataFrame:
    """Progress findings -> one row per job tick: job_id, t (ns), step, host (of the first line)."""
    p = progress.with_columns(pl.col("time").dt.epoch("ns").alias("t"))
    # each (job, step)'s first line in (t, seq) order: its rows at the step's earliest time (a few of
    # the hundreds of thousands a fleet replay holds) are the only candidates, and only they are sorted
    # (sorting every row first was ~4x the cost, in the replay's serial tail)
    ws = p.filter(pl.col("step").is_not_null())
    first_t = pl.col("t").min().over(["job_id", "step"])
    with_step = (ws.filter((pl.col("t") == first_t) | first_t.is_null())
                 .sort(["t", "seq"], nulls_last=True)
                 .group_by(["job_id", "step"], maintain_order=True)
                 .agg(pl.col("t").first(), pl.col("host").first()))
    no_step = p.filter(pl.col("step").is_null()).select("job_id", "step", "t", "host")
    ticks = pl.concat([with_step.select("job_id", "step", "t", "host"), no_step])
    return ticks.unique(["job_id", "t"], keep="first").sort(["job_id", "t", "step"], nulls_last=True)


@dataclass(frozen=True)
class HangDetector:
    """Flags ``nccl_timeout_hang`` when a running job's progress lines stop.

    ``min_silence_s``: floor of the threshold (60 s); ``factor``: multiple of the median
    progress interval (5); ``cadence_window``: intervals the median looks back over;
    ``min_ticks``: progress ticks needed before a job's cadence is trusted (3).
    """

    min_silence_s: float = 60.0
    factor: float = 5.0
    cadence_window: int = 64
    min_ticks: int = 3
    watchdog_s: float = NCCL_WATCHDOG_S
    watchdog_grace_s: float = 30.0
    name: str = "hang"

    def gaps(self, findings: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        """Every silence that qualifies as a hang up to the watermark (one row per gap)."""
        return self._gaps(_narrow(findings, ctx.watermark_ns), _progress(findings, ctx), ctx)

    def _gaps(self, own: pl.DataFrame, prog: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        """:meth:`gaps` of the detector's input as ``_narrow`` and ``_progress`` give it."""
        ticks = progress_ticks(prog)
        self._log_quiet_jobs(own, prog, ticks)
        w = ctx.watermark_ns
        g = (ticks.with_columns(
                (pl.col("t").diff().over("job_id") / NS).alias("interval_s"),
                pl.col("t").shift(-1).over("job_id").alias("next_t"),
                pl.int_range(1, pl.len() + 1).over("job_id").alias("n_ticks"))
             .with_columns(pl.col("interval_s").rolling_median(self.cadence_window, min_samples=1)
                           .over("job_id").alias("median_s"))
             .with_columns(pl.max_horizontal(pl.lit(self.min_silence_s), self.factor * pl.col("median_s"))
                           .alias("threshold_s"))
             .with_columns((pl.col("t") + (pl.col("threshold_s") * NS).round().cast(pl.Int64)).alias("fire_t"))
             .filter((pl.col("n_ticks") >= self.min_ticks) & (pl.col("fire_t") <= w)
                     & (pl.col("next_t").is_null() | (pl.col("next_t") > pl.col("fire_t")))))
        if g.is_empty():
            return g
        ends = self._ends(own, prog)
        g = g.sort("t").join_asof(ends, left_on="t", right_on="end_t", by="job_id", strategy="forward",
                                  allow_exact_matches=False, check_sortedness=False)
        states = ctx.job_states or {}
        running = [j for j, s in states.items() if str(s).upper() == "RUNNING"]
        completed = [j for j, s in states.items() if str(s).upper() == "COMPLETED"]
        ended = pl.col("end_t").is_not_null() & (pl.col("end_t") <= pl.col("fire_t"))
        g = g.filter(~(ended & ~pl.col("job_id").is_in(running)))
        g = g.filter(~(pl.col("job_id").is_in(completed) & pl.col("next_t").is_null()))
        return g.sort(["job_id", "t"])

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        own = _narrow(findings, ctx.watermark_ns)
        prog = _progress(findings, ctx)
        g = self._gaps(own, prog, ctx)
        if g.is_empty():
            return empty_findings()
        rows = []
        for r in g.iter_rows(named=True):
            suspect = self._suspect_host(prog, r["job_id"], r["fire_t"])
            lead = self.watchdog_s - r["threshold_s"]
            step = "?" if r["step"] is None else r["step"]
            where = f"; last progress on every host stopped at step {step}" if suspect is None else (
                f"; {suspect} stopped reporting steps before the other hosts")
            msg = (f"no progress for {r['threshold_s']:.0f} s (threshold {r['threshold_s']:.0f} s = "
                   f"max({self.min_silence_s:.0f} s, {self.factor:g} x median interval {r['median_s']:.2f} s)); "
                   f"last step {step} at {ns_to_iso(r['t'])} on {r['host']}{where}; flagged {lead:.0f} s "
                   f"before the {self.watchdog_s:.0f} s NCCL watchdog would fire")
            rows.append({
                "time_ns": r["fire_t"], "host": suspect, "job_id": r["job_id"], "step": r["step"],
                "category": "nccl_timeout_hang", "severity": "high", "role": "cause", "action": "requeue_only",
                "source": "job", "message": msg,
                "detail": {"last_progress": ns_to_iso(r["t"]), "last_progress_host": r["host"],
                           "threshold_s": round(r["threshold_s"], 3), "median_interval_s": round(r["median_s"], 3),
                           "lead_over_watchdog_s": round(lead, 3), "suspect_host": suspect},
            })
            rows += self._silent_host(own, prog, r, ctx)
        return synthetic_findings(self.name, rows)

    def _silent_host(self, own: pl.DataFrame, prog: pl.DataFrame, gap: dict, ctx: DetectContext) -> list[dict]:
        """After a flagged stall, the NCCL watchdogs of the healthy ranks fire; the one job host
        whose ranks stay silent is where the stall began. Decided ``watchdog_grace_s`` after the
        first watchdog line (so the answer never changes once given). ``own``: the detector's input
        up to the watermark (``_narrow``)."""
        job, t_last = gap["job_id"], gap["t"]
        wd = (own
              .filter((pl.col("job_id") == job) & (pl.col("category") == "nccl_timeout_hang")
                      & (pl.col("role") == "symptom") & (pl.col("time").dt.epoch("ns") > t_last))
              .with_columns(pl.col("time").dt.epoch("ns").alias("t")))
        if gap["next_t"] is not None:
            wd = wd.filter(pl.col("t") < gap["next_t"])
        if wd.is_empty():
            return []
        first = int(wd["t"].min())  # type: ignore[arg-type]  # polars types an aggregate as any Python literal
        decide = first + int(self.watchdog_grace_s * NS)
        if decide > ctx.watermark_ns:
            return []
        reporters = set(wd.filter(pl.col("t") <= decide)["host"].drop_nulls().to_list())
        hosts = set(prog.filter((pl.col("job_id") == job) & (pl.col("time").dt.epoch("ns") <= t_last))["host"]
                    .drop_nulls().to_list())
        silent = sorted(hosts - reporters)
        if len(silent) != 1 or len(reporters & hosts) < 2:
            return []
        node = silent[0]
        msg = (f"after progress stopped at step {gap['step']} ({ns_to_iso(t_last)}), ranks on "
               f"{', '.join(sorted(reporters & hosts))} reported NCCL watchdog timeouts within "
               f"{self.watchdog_grace_s:.0f} s of the first one; {node} stayed silent — its ranks are the ones "
               f"the others were waiting for")
        return [{"time_ns": decide, "host": node, "job_id": job, "step": gap["step"], "category": "nccl_timeout_hang",
                 "severity": "high", "role": "cause", "action": "requeue_only", "source": "job", "message": msg,
                 "detail": {"kind": "silent_host", "first_watchdog": ns_to_iso(first),
                            "reporting_hosts": sorted(reporters & hosts), "silent_host": node}}]

    @staticmethod
    def _ends(f: pl.DataFrame, prog: pl.DataFrame) -> pl.DataFrame:
        """Times at which a job visibly failed or ended: its own cause/symptom/slurm_job_failure
        findings, plus host-level ones (no job id, e.g. kernel XIDs) on hosts the job ran on.
        Findings whose time was inferred from a neighbour line are not trusted for this."""
        loud = f.filter((pl.col("role").is_in(["cause", "symptom"]) | (pl.col("category") == "slurm_job_failure"))
                        & ~pl.col("time_inferred").fill_null(False))
        own = loud.filter(pl.col("job_id").is_not_null()).select("job_id", pl.col("time").dt.epoch("ns").alias("end_t"))
        hosts = prog.select("job_id", "host").drop_nulls().unique()
        by_host = (loud.filter(pl.col("job_id").is_null()).select("host", pl.col("time").dt.epoch("ns").alias("end_t"))
                   .join(hosts, on="host", how="inner").select("job_id", "end_t"))
        return pl.concat([own, by_host]).sort("end_t")

    @staticmethod
    def _suspect_host(prog: pl.DataFrame, job_id: str, fire_t: int) -> str | None:
        """The one host whose last reported step is lower than every other host's, if any."""
        last = (prog.filter((pl.col("job_id") == job_id) & pl.col("host").is_not_null()
                            & pl.col("step").is_not_null() & (pl.col("time").dt.epoch("ns") <= fire_t))
                .group_by("host").agg(pl.col("step").max().alias("last_step")).sort("last_step", "host"))
        if last.height < 2:
            return None
        steps = last["last_step"].to_list()
        if steps[0] < steps[1]:
            return last["host"][0]
        return None

    def _log_quiet_jobs(self, own: pl.DataFrame, prog: pl.DataFrame, ticks: pl.DataFrame) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        counts = dict(ticks.group_by("job_id").len().iter_rows())
        for job in sorted(set(own["job_id"].drop_nulls().to_list()) | set(prog["job_id"].to_list())):
            n = counts.get(job, 0)
            if n == 0:
                log.debug("hang detector: job %s has no progress lines; hang detection is off for it", job)
            elif n < self.min_ticks:
                log.debug("hang detector: job %s has %d progress ticks (< %d needed to learn its cadence)",
                          job, n, self.min_ticks)


def lead_times(hang_findings: pl.DataFrame) -> pl.DataFrame:
    """Per hang finding: job_id, host, time, lead over the NCCL watchdog (s) from its detail."""
    h = hang_findings.filter(pl.col("rule_id") == "detector.hang")
    return h.select("job_id", "host", "time",
                    pl.col("detail").str.json_path_match("$.lead_over_watchdog_s").cast(pl.Float64)
                    .alias("lead_over_watchdog_s"))


__all__ = ["NCCL_WATCHDOG_S", "HangDetector", "lead_times", "progress_ticks"]
