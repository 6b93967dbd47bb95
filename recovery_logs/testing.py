"""Test helpers that ship with the library: event/finding factories, a fake clock, a list source.

Used by our own tests and by sites writing tests for their rule packs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import polars as pl

from recovery_logs.schema import EVENT_SCHEMA, FINDING_SCHEMA, conform
from recovery_logs.timeutil import iso_to_ns


def _times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        r = dict(r)
        t = r.get("time")
        if isinstance(t, str):
            r["time"] = iso_to_ns(t)
        out.append(r)
    return out


def _frame(rows: Sequence[dict[str, Any]], schema: dict[str, pl.DataType], seq_start: int) -> pl.DataFrame:
    rows = _times(list(rows))
    for n, r in enumerate(rows):
        r.setdefault("seq", seq_start + n)
        r.setdefault("time_inferred", False)
        r.setdefault("line", n + 1)
        r.setdefault("file", "test")
        r.setdefault("source", "other")
    overrides = {k: v for k, v in schema.items() if k != "time"}
    overrides["time"] = pl.Int64
    df = pl.DataFrame(rows, schema_overrides={k: v for k, v in overrides.items() if any(k in r for r in rows)},
                      infer_schema_length=None)
    if "time" in df.columns:
        df = df.with_columns(pl.col("time").cast(pl.Int64).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"))
    return conform(df, schema)


def make_events(rows: Sequence[dict[str, Any]], seq_start: int = 0) -> pl.DataFrame:
    """Events from dicts: ``time`` as RFC3339 string or ns int; missing columns become nulls/defaults."""
    return _frame(rows, EVENT_SCHEMA, seq_start)


def make_findings(rows: Sequence[dict[str, Any]], seq_start: int = 0) -> pl.DataFrame:
    return _frame(rows, FINDING_SCHEMA, seq_start)


class FakeClock:
    """A manual clock in seconds (float) for sources, policy and executor tests."""

    def __init__(self, start: float = 1_795_960_800.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ListSource:
    """Yields prepared event frames in order (the test twin of a tailing source)."""

    def __init__(self, batches: Iterable[pl.DataFrame]) -> None:
        self._batches = list(batches)

    def __iter__(self) -> Iterator[pl.DataFrame]:
        return iter(self._batches)


def split_frame(df: pl.DataFrame, cuts: Sequence[int]) -> list[pl.DataFrame]:
    """Split a frame at row offsets (sorted, de-duplicated, clipped)."""
    points = sorted({c for c in cuts if 0 < c < df.height})
    out, prev = [], 0
    for c in [*points, df.height]:
        out.append(df.slice(prev, c - prev))
        prev = c
    return out
