"""sources.vl_history: a row's identity from the stream fields names the same duplicates as
``vl_local.row_identity`` over the stream id, and a stream the map lacks is refused."""

from __future__ import annotations

import polars as pl

from recovery_logs.sources.victorialogs import format_time_param
from recovery_logs.sources.vl_history import _stream_identity
from recovery_logs.sources.vl_local import row_identity

# the stream map as stream_map() gives it: the values of the stream fields -> the stream id
SMAP = (("host", "unit"), pl.DataFrame({"host": ["n1", "n1", "n2"], "unit": ["train", "", "train"],
                                        "_stream_id": ["s-a", "s-b", "s-c"]}))


def _rows() -> pl.DataFrame:
    t = "2026-12-01T10:00:00.000000001Z"
    return pl.DataFrame({
        "_time": [t, t, t, t, t, t, "2026-12-01T10:00:00.000000002Z"],
        "host": ["n1", "n1", "n1", None, "n2", "n1", "n1"],
        "unit": ["train", "train", None, None, "train", "", "train"],
        "rank": ["0", "0", "0", None, "0", "0", None],
        "_msg": ["step 1", "step 1", "step 1", "x", "step 1", "step 1", "step 1"],
    }).filter(pl.col("host").is_not_null())


def test_identity_from_stream_fields_names_the_same_duplicates():
    df = _rows()
    by_fields = _stream_identity(df, SMAP)
    assert by_fields is not None
    # a missing field is the empty value (VictoriaLogs stores no empty field)
    ids = df.with_columns(pl.col("unit").fill_null("").alias("_u")).join(
        SMAP[1].rename({"unit": "_u"}), on=["host", "_u"], how="left", maintain_order="left")
    assert ids["_stream_id"].to_list() == ["s-a", "s-a", "s-b", "s-c", "s-b", "s-a"]
    want = ids.select(row_identity().is_first_distinct())
    got = by_fields.select(pl.col("__id").is_first_distinct())
    assert got.to_series().to_list() == want.to_series().to_list() == [True, False, True, True, False, True]


def test_a_stream_the_map_lacks_is_refused():
    df = pl.concat([_rows(), pl.DataFrame({"_time": ["2026-12-01T10:00:01Z"], "host": ["n3"], "unit": ["train"],
                                           "rank": ["0"], "_msg": ["new stream"]})])
    assert _stream_identity(df, SMAP) is None
    assert _stream_identity(df, SMAP, with_id=False) is None
    assert _stream_identity(_rows(), SMAP, with_id=False) is not None


class _Hits:
    """A client whose ``/hits`` answer is given (the only call ``plan_slices`` makes)."""

    def __init__(self, counts: dict[int, int]) -> None:
        self.counts = counts

    def hits(self, query, start, end, step):
        ts = sorted(self.counts)
        return {"hits": [{"timestamps": [format_time_param(t) for t in ts], "values": [self.counts[t] for t in ts]}]}


def test_plan_slices_cuts_equal_slices_and_covers_the_range():
    from recovery_logs.sources.vl_history import plan_slices

    ns = 10**9
    start, end = 1_000 * ns, 1_600 * ns - 1
    # 60 probe buckets of 16 666 rows (~1 M rows) in slices of at most ~250 k: four of ~250 k, not
    # four of 250 k and a last one of 4 k
    counts = {start + i * 10 * ns: 16_666 for i in range(60)}
    got = plan_slices(_Hits(counts), "*", start, end, 250_000)
    assert got[0][0] == start and got[-1][1] == end
    assert all(a[1] + 1 == b[0] for a, b in zip(got, got[1:], strict=False))
    rows = [sum(v for t, v in counts.items() if lo <= t <= hi) for lo, hi in got]
    assert len(got) == 4 and max(rows) - min(rows) <= 16_667
    # uneven buckets: still the fewest slices, none over slice_rows by more than a bucket
    counts = {start + i * 10 * ns: (1_000 if i % 3 else 40_000) for i in range(60)}
    got = plan_slices(_Hits(counts), "*", start, end, 100_000)
    rows = [sum(v for t, v in counts.items() if lo <= t <= hi) for lo, hi in got]
    assert sum(rows) == sum(counts.values()) and len(got) == -(-sum(rows) // 100_000)
    assert max(rows) <= 100_000 + 40_000
    # fewer rows than one slice: one slice
    assert plan_slices(_Hits({start: 10}), "*", start, end, 250_000) == [(start, end)]
