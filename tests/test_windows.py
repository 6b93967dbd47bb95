"""windows.py: line counts per (host, job, window) and (host, job) spans, folded run by run, equal
grouping every line (the previous implementation below is the oracle): any order, nulls, gaps."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.schema import empty_findings
from recovery_logs.testing import make_events
from recovery_logs.windows import KEYS, SPAN_SCHEMA, job_spans, window_counts, window_us

T0 = 1_796_000_000 * 10**9
ROW = st.fixed_dictionaries({
    "time": st.one_of(st.none(), st.integers(0, 900 * 10**9).map(lambda x: T0 + x)),
    "host": st.sampled_from([None, "gpu-n01", "gpu-n02"]), "job_id": st.sampled_from([None, "1", "2"])})


@settings(max_examples=80, deadline=None)
@given(st.lists(ROW, max_size=60), st.sampled_from([60.0, 7.5]))
def test_window_counts_and_spans_equal_grouping_every_line(rows: list[dict], window_s: float) -> None:
    ev = make_events([{**r, "message": "m"} for r in rows])
    timed = ev.filter(pl.col("time").is_not_null())
    want = (timed.with_columns(pl.col("time").dt.truncate(f"{window_us(window_s)}us").alias("window_start"))
            .group_by(KEYS).agg(pl.len().cast(pl.Int64).alias("lines"), pl.col("time").min().alias("first_time"),
                                pl.col("time").max().alias("last_time")).sort(KEYS, nulls_last=True))
    got = window_counts(ev, empty_findings(), window_s).select(*KEYS, "lines", "first_time", "last_time")
    assert_frame_equal(got.sort(KEYS, nulls_last=True), want)
    both = timed.filter(pl.col("host").is_not_null() & pl.col("job_id").is_not_null())
    spans = (both.group_by(["host", "job_id"]).agg(pl.col("time").min().alias("first"),
                                                   pl.col("time").max().alias("last"),
                                                   pl.len().cast(pl.Int64).alias("lines"))
             .select(list(SPAN_SCHEMA)).sort(["host", "job_id"]))
    assert_frame_equal(job_spans(ev).sort(["host", "job_id"]), spans)


COUNT = st.fixed_dictionaries({
    "host": st.sampled_from([None, "gpu-n01", "gpu-n02"]), "job_id": st.sampled_from([None, "1", "2"]),
    "step": st.integers(0, 5), "bucket": st.integers(0, 40), "lines": st.integers(1, 4),
    "first": st.integers(0, 1999), "span": st.integers(0, 1999)})


@settings(max_examples=80, deadline=None)
@given(st.lists(COUNT, max_size=30), st.sampled_from([60.0, 2.0]))
def test_progress_windows_equal_the_windows_of_the_summarised_lines(rows: list[dict], window_s: float) -> None:
    """Summarised progress counts (2 s buckets, as the VictoriaLogs readers make them): their windows
    straight from the counts equal ``window_counts`` of the one-finding-per-line expansion."""
    from recovery_logs.detectors.rulepack import load_packs
    from recovery_logs.pipeline.vl_replay import progress_findings
    from recovery_logs.windows import progress_windows

    ms = 1_000_000
    counts = pl.DataFrame(
        [{"host": r["host"], "job_id": r["job_id"], "step": r["step"], "bucket": T0 + r["bucket"] * 2000 * ms,
          "lines": r["lines"], "first": T0 + r["bucket"] * 2000 * ms + min(r["first"], r["span"]) * ms,
          "last": T0 + r["bucket"] * 2000 * ms + max(r["first"], r["span"]) * ms} for r in rows],
        schema={"host": pl.String, "job_id": pl.String, "step": pl.Int64, "bucket": pl.Int64, "lines": pl.Int64,
                "first": pl.Int64, "last": pl.Int64})
    rule = next(r for r in load_packs().rules if r.id == "progress.step_loss")
    got = progress_windows(counts, rule.category, window_s)
    assert got is not None
    want = window_counts(make_events([]), progress_findings(counts, rule, 0), window_s)
    assert_frame_equal(got.sort(KEYS, nulls_last=True), want.sort(KEYS, nulls_last=True))


def test_progress_windows_decline_a_count_across_two_windows() -> None:
    from recovery_logs.windows import progress_windows

    edge = T0 - T0 % (60 * 10**9) + 60 * 10**9       # a window boundary
    counts = pl.DataFrame({"host": ["gpu-n01"], "job_id": ["1"], "lines": [3], "first": [edge - 10**9],
                           "last": [edge + 10**9]})
    assert progress_windows(counts, "progress", 60.0) is None
    assert progress_windows(counts.with_columns(pl.lit(0, pl.Int64).alias("lines")), "progress", 2.0) is None
