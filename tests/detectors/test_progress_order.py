"""detectors.progress.time_seq_order: the (key, seq) order of a two-column sort, from single-column sorts;
pipeline.progress_store.sorted_chunks: the same order of several chunks, without a gather where they are in order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.detectors.progress import time_seq_order
from recovery_logs.pipeline.progress_store import sorted_chunks

_cell = st.one_of(st.none(), st.integers(0, 5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_cell, _cell), max_size=40), st.booleans())
def test_the_order_is_the_two_column_sort(rows: list[tuple[int | None, int | None]], by_seq: bool) -> None:
    if by_seq:   # rows as read: seq ascending, no null (the one-sort path)
        rows = [(t, k) for k, (t, _) in enumerate(rows)]
    df = pl.DataFrame({"t": [a for a, _ in rows], "seq": [b for _, b in rows], "i": list(range(len(rows)))},
                      schema={"t": pl.Int64, "seq": pl.Int64, "i": pl.Int64})
    want = df.sort(["t", "seq"], nulls_last=True, maintain_order=True)["i"].to_list()
    assert df["i"].gather(time_seq_order(df, "t")).to_list() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_cell, _cell), max_size=12), min_size=1, max_size=4), st.booleans())
def test_sorted_chunks_is_the_sort_of_the_concatenation(chunks: list[list[tuple[int | None, int | None]]],
                                                        presorted: bool) -> None:
    # chunks already in (time, seq) order take the no-gather path; either way the rows and their order
    # are those of the two-column sort of the concatenated chunks
    if presorted:
        flat = sorted(r for c in chunks for r in c if r[0] is not None and r[1] is not None)
        chunks = [flat[i:i + 5] for i in range(0, max(1, len(flat)), 5)]
    frames, i = [], 0
    for c in chunks:
        frames.append(pl.DataFrame(
            {"time": [None if a is None else datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=a) for a, _ in c],
             "seq": [b for _, b in c], "i": list(range(i, i + len(c)))},
            schema={"time": pl.Datetime("ns", "UTC"), "seq": pl.Int64, "i": pl.Int64}))
        i += len(c)
    want = pl.concat(frames).sort(["time", "seq"], nulls_last=True, maintain_order=True)["i"].to_list()
    assert sorted_chunks(frames)["i"].to_list() == want
    assert frames == []
