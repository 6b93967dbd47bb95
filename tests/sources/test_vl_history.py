"""sources.vl_history: a row's identity from the stream fields names the same duplicates as
``vl_local.row_identity`` over the stream id, and a stream the map lacks is refused."""

from __future__ import annotations

import polars as pl

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
