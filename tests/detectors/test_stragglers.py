"""Straggler detector: slow node vs workload imbalance; batch independence."""

from __future__ import annotations

import json

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.detectors import synth
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.stragglers import StragglerDetector, _slowdowns
from recovery_logs.schema import FINDING_SCHEMA
from recovery_logs.timeutil import NS

DET = StragglerDetector()
HOSTS = ["n0", "n1", "n2", "n3"]
NONE = pl.DataFrame()


def end_ctx(f: pl.DataFrame, **kw) -> DetectContext:
    return DetectContext(watermark_ns=int(f["time"].dt.epoch("ns").max()), **kw)


def early(out: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the short-evidence rank-outlier verdicts of the first steps, the windowed/report verdicts)."""
    k = pl.col("detail").str.contains('"kind": "rank_outlier"')
    return out.filter(k), out.filter(~k)


def test_slow_node_proposes_drain_of_that_node():
    f = synth.findings(synth.training_job("j1", HOSTS, 4, 300, 1.0, slow={"n2": 1.3}))
    out = DET.detect(f, NONE, end_ctx(f))
    assert dict(out.schema) == FINDING_SCHEMA
    got = out.select("host", "job_id", "rule_id", "category", "severity", "role", "action")
    want = pl.DataFrame({"host": ["n2"], "job_id": ["j1"], "rule_id": ["detector.straggler"], "category": ["straggler"],
                         "severity": ["medium"], "role": ["cause"], "action": ["drain_node_and_requeue"]})
    assert_frame_equal(got, want)
    # fires at the end of the third consecutive complete 60 s window
    first_w = (synth.T0 + 1 * NS) // (60 * NS) * 60 * NS
    assert out["time"].dt.epoch("ns").to_list()[0] <= first_w + 5 * 60 * NS
    assert "all 4 ranks on n2 slow for 3 consecutive" in out["message"][0]
    assert json.loads(out["detail"][0])["kind"] == "slow_node"


def test_specific_ranks_across_nodes_is_imbalance_never_a_drain():
    f = synth.findings(synth.training_job("j2", HOSTS, 4, 300, 1.0, slow_ranks={1: 1.3, 6: 1.3, 11: 1.3}))
    out = DET.detect(f, NONE, end_ctx(f))
    got = out.select("host", "category", "severity", "action")
    want = pl.DataFrame({"host": [None], "category": ["straggler"], "severity": ["low"], "action": ["investigate"]},
                        schema={"host": pl.String, "category": pl.String, "severity": pl.String, "action": pl.String})
    assert_frame_equal(got, want)
    d = json.loads(out["detail"][0])
    assert d["ranks"] == [1, 6, 11] and d["hosts"] == ["n0", "n1", "n2"] and d["shifting"] is False


def test_shifting_slow_ranks_is_imbalance():
    rows = []
    for k, rank in enumerate([2, 9, 14, 5]):     # a different rank is slow in each 75 s stretch
        part = synth.training_job("j3", HOSTS, 4, 75, 1.0, t0=75.0 * k, slow_ranks={rank: 1.4}, seed=k)
        rows += [dict(r, step=r["step"] + 75 * k) for r in part]
    f = synth.findings(rows)
    first, out = early(DET.detect(f, NONE, end_ctx(f)))
    assert out["action"].to_list() == ["investigate"]
    assert json.loads(out["detail"][0])["shifting"] is True
    # rank 2, alone slow in the first steps, is named early (investigate, never a drain)
    assert first["action"].to_list() == ["investigate"] and json.loads(first["detail"][0])["rank"] == 2


def test_single_rank_per_host_never_drains():
    f = synth.findings(synth.training_job("j4", HOSTS, 1, 300, 1.0, slow={"n1": 1.4}))
    first, out = early(DET.detect(f, NONE, end_ctx(f)))
    assert out["action"].to_list() == ["investigate"]
    assert first["action"].to_list() == ["investigate"] and json.loads(first["detail"][0])["rank"] == 1


def test_healthy_job_and_rankless_progress_are_quiet():
    f = synth.findings(synth.training_job("j5", HOSTS, 4, 300, 1.0) +
                       synth.training_job("j6", HOSTS, 4, 300, 1.0, slow={"n0": 1.5}, per_rank=False))
    assert DET.detect(f, NONE, end_ctx(f)).is_empty()


def test_short_slowdown_does_not_persist():
    base = synth.training_job("j7", HOSTS, 4, 300, 1.0)
    blip = [dict(r, step_time_s=r["step_time_s"] * 1.5) if r["host"] == "n3" and 130 <= r["t"] < 170 else r for r in base]
    f = synth.findings(blip)
    assert DET.detect(f, NONE, end_ctx(f)).is_empty()


@settings(max_examples=25, deadline=None)
@example(cuts=[4.0], seed=0)   # a cut through step 3's per-rank lines: rank 0 of job b was named on 12 of 16 ranks
@given(cuts=st.lists(st.floats(0, 330), max_size=5), seed=st.integers(0, 2**16))
def test_incremental_watermarks_equal_one_final_call(cuts, seed):
    rows = (synth.training_job("a", HOSTS, 4, 300, 1.0, slow={"n1": 1.3}) +
            synth.training_job("b", HOSTS, 4, 300, 1.0, slow_ranks={0: 1.3, 7: 1.3}, seed=3))
    f = synth.findings(rows)
    end = int(f["time"].dt.epoch("ns").max())
    final = DET.detect(f, NONE, DetectContext(end, final=True))
    assert sorted(early(final)[1]["action"].to_list()) == ["drain_node_and_requeue", "investigate"]
    assert set(early(final)[0]["action"].to_list()) <= {"investigate"}   # early rank verdicts never drain
    seen = []
    for c in sorted(cuts):
        w = synth.T0 + int(c * NS)
        held = f.filter(pl.col("time").dt.epoch("ns") <= w).sample(fraction=1.0, shuffle=True, seed=seed)
        out = DET.detect(held, NONE, DetectContext(w))
        assert out.join(final, on=list(final.columns), how="anti", nulls_equal=True).is_empty()
        seen.append(out)
    seen.append(DET.detect(f.sample(fraction=1.0, shuffle=True, seed=seed), NONE, DetectContext(end, final=True)))
    assert_frame_equal(pl.concat(seen).unique(maintain_order=True).sort("time", "job_id"), final.sort("time", "job_id"))


def test_rank_outlier_waits_for_the_whole_step():
    """A step's per-rank lines cut by the watermark are not judged: the verdict on 5 of 8 ranks (rank 3
    at 2x) could differ from the one on all 8. The step is whole once every rank seen has reported it
    and a later step has begun, or at the end of the input (``final``)."""
    rows = synth.training_job("j", ["n0", "n1"], 4, 3, 1.0, slow_ranks={3: 2.0})

    def upto(n: int, final: bool = False, order: list[dict] = rows) -> pl.DataFrame:   # verdicts on the first n lines
        f = synth.findings(order[:n])
        return early(DET.detect(f, NONE, end_ctx(f, final=final)))[0]

    assert upto(5).is_empty() and upto(8).is_empty()      # step 1 cut, or whole but not known to be
    named = upto(8, final=True)                           # ...unless nothing more comes
    d = json.loads(named["detail"][0])
    assert (d["rank"], d["step"], d["steps"]) == (3, 1, 1)
    assert upto(12).is_empty() and upto(15).is_empty()   # step 2 begun, not yet as whole as step 1
    assert_frame_equal(upto(16), named)                   # step 2 whole: step 1 decides the same finding
    # rank 7 prints its step-1 line after rank 0's step-2 line: step 1 waits for step 2 to be as whole
    late = rows[:7] + [rows[8], rows[7]] + rows[9:]
    assert upto(8, order=late).is_empty()
    assert_frame_equal(upto(24, order=late).drop("seq"), named.drop("seq"))
    assert_frame_equal(upto(24), named)



def _slowdowns_unfiltered(det, p: pl.DataFrame) -> pl.DataFrame:
    """The job-slowdown hits computed over every stream (the detector leaves out streams that cannot qualify)."""
    key = ["job_id", "host", "rank", "rule_id"]
    t = pl.col("step_time_s")
    k = det.slowdown_persist
    p = p.filter(t.is_not_null() & t.is_finite() & (t > 0)).sort(["time", "seq"], nulls_last=True)
    # the job's own ratio: slowdown_ratio_alone when the job has one stream, slowdown_ratio with peers
    streams = p.group_by("job_id").agg(pl.struct(key[1:]).n_unique().alias("_n"))
    alone = set(streams.filter(pl.col("_n") == 1)["job_id"].to_list())
    p = p.with_columns(pl.when(pl.col("job_id").is_in(list(alone))).then(pl.lit(det.slowdown_ratio_alone))
                       .otherwise(pl.lit(det.slowdown_ratio)).alias("_ratio"))
    p = p.with_columns(
        t.shift(k).rolling_median(window_size=det.slowdown_window, min_samples=det.slowdown_baseline).over(key)
        .alias("_before"),
        t.rolling_min(window_size=k, min_samples=k).over(key).alias("_low"))
    return (p.filter(pl.col("_before").is_not_null() & (pl.col("_low") >= pl.col("_ratio") * pl.col("_before")))
            .unique("job_id", keep="first", maintain_order=True))


@settings(max_examples=40, deadline=None)
@example(rows=[(0, 0, 0.5)] * 10 + [(0, 0, 1.5)] * 5 + [(1, 1, 0.6)] * 12, seed=0)   # one slowdown, one steady job
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.floats(0.4, 3.0)),
                    min_size=5, max_size=120), st.integers(0, 10**6))
def test_slowdown_prefilter_keeps_every_hit(rows, seed):
    """The streams ``_slowdowns`` leaves out unread (max < ratio x min, or too short) hold no hit: the
    verdicts equal those of the rolling windows over every stream."""
    det = StragglerDetector()
    t0 = 1_700_000_000 * 10**9
    obs = pl.DataFrame({
        "time": [t0 + i * 10**9 for i in range(len(rows))], "seq": list(range(len(rows))),
        "job_id": [f"j{j}" for j, _, _ in rows], "host": [f"h{h % 2}" for _, h, _ in rows],
        "rule_id": "progress.rank_step_time", "rank": [None if h == 3 else h for _, h, _ in rows],
        "rank_line": [h for _, h, _ in rows], "step": list(range(len(rows))),
        "step_time_s": [v * (1 + (seed % 7) / 10) for _, _, v in rows],
    }).with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")), pl.col("rank").cast(pl.Int32))
    got = sorted((r["job_id"], r["time_ns"]) for r in _slowdowns(det, obs))
    ref = _slowdowns_unfiltered(det, obs)
    want = sorted((j, int(t.timestamp() * 10**9)) for j, t in ref.select("job_id", "time").iter_rows())
    assert got == want
    if rows[:15] == [(0, 0, 0.5)] * 10 + [(0, 0, 1.5)] * 5:
        assert [j for j, _ in got] == ["j0"]
