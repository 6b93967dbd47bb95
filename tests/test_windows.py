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
