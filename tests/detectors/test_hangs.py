"""Silent-hang detector: literal frames, edge cases, batch-independence invariants."""

from __future__ import annotations

import json
import logging

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.detectors import synth
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.hangs import HangDetector, lead_times
from recovery_logs.schema import FINDING_SCHEMA
from recovery_logs.timeutil import NS

DET = HangDetector()
NONE = pl.DataFrame()


def ctx(t_s: float, **kw) -> DetectContext:
    return DetectContext(watermark_ns=synth.T0 + int(t_s * NS), **kw)


def steady(job="j1", n=20, dt=2.0, hosts=("a", "b"), t0=0.0):
    return [synth.progress(job, h, s, t0 + s * dt + 0.01 * i, dt, i) for s in range(1, n + 1)
            for i, h in enumerate(hosts)]


def test_fires_exactly_at_last_progress_plus_threshold():
    f = synth.findings(steady())          # last step 20 at t=40.0 (host a), cadence 2 s -> threshold 60 s
    assert DET.detect(f, NONE, ctx(99.99)).is_empty()
    out = DET.detect(f, NONE, ctx(100.0))
    assert dict(out.schema) == FINDING_SCHEMA
    got = out.select("time", "host", "job_id", "rule_id", "category", "severity", "role", "action", "step", "file", "line")
    want = pl.DataFrame({
        "time": [synth.T0 + 100 * NS], "host": [None], "job_id": ["j1"], "rule_id": ["detector.hang"],
        "category": ["nccl_timeout_hang"], "severity": ["high"], "role": ["cause"], "action": ["requeue_only"],
        "step": [20], "file": ["detector"], "line": [0]},
        schema={k: FINDING_SCHEMA[k] for k in got.columns})
    assert_frame_equal(got, want)
    msg = out["message"][0]
    assert "no progress for 60 s" in msg and "last step 20" in msg and "540 s before the 600 s NCCL watchdog" in msg
    assert lead_times(out)["lead_over_watchdog_s"].to_list() == [540.0]


def test_threshold_scales_with_slow_cadence():
    f = synth.findings(steady(dt=20.0, n=10))    # 5 x 20 s = 100 s > 60 s floor; last at 200 s
    assert DET.detect(f, NONE, ctx(299.0)).is_empty()
    out = DET.detect(f, NONE, ctx(300.0))
    assert json.loads(out["detail"][0])["threshold_s"] == 100.0


def test_host_that_stopped_first_is_the_suspect():
    rows = steady(n=20) + [synth.progress("j1", "b", 21, 42.0, 2.0, 1)]   # a never reported step 21
    out = DET.detect(synth.findings(rows), NONE, ctx(200.0))
    assert out["host"].to_list() == ["a"]
    assert "a stopped reporting steps before the other hosts" in out["message"][0]


def test_quiet_when_job_failed_loudly_in_between():
    crash = {"t": 50.0, "job_id": "j1", "host": "b", "rule_id": "xid.79", "category": "xid", "role": "cause",
             "severity": "critical", "action": "drain_node_and_requeue", "message": "Xid 79"}
    f = synth.findings(steady() + [crash])
    assert DET.detect(f, NONE, ctx(1000.0)).is_empty()
    # ... unless Slurm says the job is still running
    assert DET.detect(f, NONE, ctx(1000.0, job_states={"j1": "RUNNING"})).height == 1


def test_completed_job_is_not_a_hang():
    f = synth.findings(steady())
    assert DET.detect(f, NONE, ctx(1000.0, job_states={"j1": "COMPLETED"})).is_empty()


def test_resumed_gap_is_reported_once_and_later_steps_fine():
    rows = steady(n=20) + [
        synth.progress("j1", "a", 21 + k, 300.0 + 2 * k, 2.0, 0) for k in range(20)]
    out = DET.detect(synth.findings(rows), NONE, ctx(320.0))
    assert out["time"].dt.epoch("ns").to_list() == [synth.T0 + 100 * NS]


def test_jobs_without_progress_are_quiet_and_say_why(caplog):
    other = {"t": 5.0, "job_id": "j9", "host": "a", "rule_id": "nccl.info", "category": "nccl_other",
             "role": "info", "severity": "info", "action": "none", "message": "NCCL INFO"}
    two = steady(job="j2", n=1)
    with caplog.at_level(logging.DEBUG, logger="recovery_logs.detectors.hangs"):
        out = DET.detect(synth.findings([other] + two), NONE, ctx(10_000.0))
    assert out.is_empty()
    assert "job j9 has no progress lines" in caplog.text
    assert "job j2 has 1 progress ticks" in caplog.text


def test_own_output_is_ignored_on_the_next_call():
    f = synth.findings(steady())
    first = DET.detect(f, NONE, ctx(500.0))
    again = DET.detect(pl.concat([f, first]), NONE, ctx(500.0))
    assert_frame_equal(first, again)


def _two_jobs():
    rows = steady("j1", n=30, dt=1.5) + steady("j2", n=15, dt=3.0, hosts=("c",), t0=10.0)
    rows += [synth.progress("j1", "a", 31 + k, 200.0 + k, 1.5, 0) for k in range(10)]
    return synth.findings(rows)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.floats(0, 400), max_size=6), perm_seed=st.integers(0, 2**16))
def test_incremental_watermarks_equal_one_final_call(cuts, perm_seed):
    f = _two_jobs()
    final_w = 400.0
    final = DET.detect(f, NONE, ctx(final_w))
    assert final.height == 3   # j1 stalls twice (t=60 gap, end), j2 once
    seen = []
    for c in sorted(cuts) + [final_w]:
        # the pipeline holds only what arrived up to the watermark, in arbitrary row order
        held = f.filter(pl.col("time").dt.epoch("ns") <= synth.T0 + int(c * NS)).sample(
            fraction=1.0, shuffle=True, seed=perm_seed)
        out = DET.detect(held, NONE, ctx(c))
        # monotone: everything emitted earlier is still part of the final answer, unchanged
        assert out.join(final, on=list(final.columns), how="anti", nulls_equal=True).is_empty()
        seen.append(out)
    assert_frame_equal(pl.concat(seen).unique(maintain_order=True).sort("time", "job_id"), final.sort("time", "job_id"))


def test_kernel_fault_on_a_job_host_counts_as_the_job_failing_loudly():
    xid = {"t": 50.0, "job_id": None, "host": "b", "rule_id": "xid.119", "category": "xid", "role": "cause",
           "severity": "critical", "action": "drain_node_and_requeue", "message": "Xid 119"}
    elsewhere = dict(xid, host="zz")
    assert DET.detect(synth.findings(steady() + [xid]), NONE, ctx(1000.0)).is_empty()
    assert DET.detect(synth.findings(steady() + [elsewhere]), NONE, ctx(1000.0)).height == 1


def test_a_teardown_line_with_an_inferred_time_does_not_silence_the_detector():
    cancel = {"t": 41.0, "job_id": "j1", "host": "b", "rule_id": "slurm.cancelled", "category": "slurm_job_failure",
              "role": "info", "severity": "info", "action": "none", "time_inferred": True,
              "message": "slurmstepd: error: *** STEP 1.0 ON b CANCELLED AT 2026-11-29T14:54:13 ***"}
    assert DET.detect(synth.findings(steady() + [cancel]), NONE, ctx(1000.0)).height == 1
    assert DET.detect(synth.findings(steady() + [dict(cancel, time_inferred=False)]), NONE, ctx(1000.0)).is_empty()


def _watchdog(t, host, rank):
    return {"t": t, "job_id": "j1", "host": host, "rank": rank, "rule_id": "nccl.watchdog_timeout",
            "category": "nccl_timeout_hang", "role": "symptom", "severity": "high", "action": "requeue_only",
            "message": f"[Rank {rank}] Watchdog caught collective operation timeout"}


def test_the_host_whose_ranks_never_time_out_is_named_after_the_watchdogs():
    hosts = ("a", "b", "c")
    rows = steady(hosts=hosts) + [_watchdog(640.0, "a", 0), _watchdog(641.0, "b", 1)]
    f = synth.findings(rows)
    assert DET.detect(f, NONE, ctx(669.0)).height == 1            # decided only at first watchdog + 30 s
    out = DET.detect(f, NONE, ctx(670.0))
    named = out.filter(pl.col("host").is_not_null())
    assert named["host"].to_list() == ["c"] and named["time"].dt.epoch("ns").to_list() == [synth.T0 + 670 * NS]
    assert json.loads(named["detail"][0])["reporting_hosts"] == ["a", "b"]
    assert "c stayed silent" in named["message"][0]
    # a watchdog from the third host inside the grace period: nobody is singled out
    late = synth.findings(rows + [_watchdog(660.0, "c", 2)])
    assert DET.detect(late, NONE, ctx(2000.0))["host"].to_list() == [None]


def _ticks_by_sorting_every_row(progress: pl.DataFrame) -> pl.DataFrame:
    """progress_ticks as first written: every row sorted by (t, seq), then the first per (job, step)."""
    p = progress.with_columns(pl.col("time").dt.epoch("ns").alias("t"))
    with_step = (p.filter(pl.col("step").is_not_null()).sort(["t", "seq"], nulls_last=True)
                 .group_by(["job_id", "step"], maintain_order=True).agg(pl.col("t").first(), pl.col("host").first()))
    no_step = p.filter(pl.col("step").is_null()).select("job_id", "step", "t", "host")
    ticks = pl.concat([with_step.select("job_id", "step", "t", "host"), no_step])
    return ticks.unique(["job_id", "t"], keep="first").sort(["job_id", "t", "step"], nulls_last=True)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["j1", "j2", None]), st.one_of(st.none(), st.integers(0, 6)),
                               st.integers(0, 8), st.sampled_from(["a", "b", "c"]), st.integers(0, 400)),
                     max_size=60, unique_by=lambda r: r[4]))    # seqs are unique, as the engine gives them
def test_progress_ticks_equal_sorting_every_row(rows):
    # only each (job, step)'s rows at its earliest time are sorted: ties in time (several hosts' lines of one
    # step in one second), the seq order among them, steps without a number and rows without a job included
    from recovery_logs.detectors.hangs import progress_ticks
    df = pl.DataFrame([{"job_id": j, "step": s, "time": synth.T0 + t * NS, "host": h, "seq": q}
                       for j, s, t, h, q in rows],
                      schema={"job_id": pl.String, "step": pl.Int64, "time": pl.Int64, "host": pl.String, "seq": pl.Int64})
    df = df.with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")))
    assert_frame_equal(progress_ticks(df), _ticks_by_sorting_every_row(df))
