"""detectors.progress.time_seq_order: the (key, seq) order of a two-column sort, from single-column sorts."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.detectors.progress import time_seq_order

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
