"""Helpers for the reader tests: fixture paths and exact expected event frames."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from recovery_logs.schema import EVENT_SCHEMA
from recovery_logs.timeutil import iso_to_ns

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "inputs"


def events_frame(rows: list[dict], file: str | Path) -> pl.DataFrame:
    """Expected events: each row gives time (ISO, ns kept), inferred, host, job, source, line, rank,
    message (+ optional stream_id, file, level); seq is the row's position."""
    out = []
    for i, r in enumerate(rows):
        out.append({
            "time": iso_to_ns(r["time"]) if r.get("time") else None,
            "time_inferred": r.get("inferred", False),
            "host": r.get("host"), "job_id": r.get("job"), "source": r["source"],
            "file": str(r.get("file", file)), "line": r["line"], "seq": r.get("seq", i),
            "stream_id": r.get("stream_id"), "rank": r.get("rank"), "message": r["message"],
            "level": r.get("level"),
        })
    df = pl.DataFrame(out, schema={**EVENT_SCHEMA, "time": pl.Int64}, orient="row")
    return df.with_columns(time=pl.col("time").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"))


@pytest.fixture
def fix() -> Path:
    return FIX
