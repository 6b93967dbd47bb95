"""Time parsing that keeps nanoseconds (Python's datetime and Polars' RFC3339 parser cut to µs)."""

from __future__ import annotations

import time as _time

import polars as pl

from recovery_logs.schema import TIME

NS = 1_000_000_000
"""Nanoseconds per second (every time in the engine is integer ns since the epoch, UTC)."""

_RFC3339_OK = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?\s*(?:Z|z|[+-]\d{2}:?\d{2})?$"


def frac_ns(frac: pl.Expr) -> pl.Expr:
    """Fraction digits after the seconds ("5", "123456789") -> nanoseconds; null -> 0."""
    return pl.when(frac.is_null()).then(pl.lit(0, pl.Int64)).otherwise(
        frac.str.pad_end(9, "0").cast(pl.Int64, strict=False))


def rfc3339_to_ns_expr(col: pl.Expr) -> pl.Expr:
    """Vectorised RFC3339 -> Int64 nanoseconds since the epoch (UTC). Null where unparseable.

    No zone means UTC. Fraction digits beyond 9 are not accepted (null). One capture-free regex
    check, a fixed-width ``strptime`` and short slices, with the stripped value and its tail
    materialised once per batch (several times faster than a capturing regex over the value).
    """
    return col.map_batches(_rfc3339_series, return_dtype=pl.Int64)


def _rfc3339_series(values: pl.Series) -> pl.Series:
    df = pl.DataFrame({"s": values.cast(pl.String)}).with_columns(pl.col("s").str.strip_chars())
    df = df.with_columns(rest=pl.col("s").str.slice(19))
    s, rest = pl.col("s"), pl.col("rest")
    df = df.with_columns(tz=rest.str.extract(r"(Z|z|[+-]\d{2}:?\d{2})$", 1).str.replace(":", ""))
    tz = pl.col("tz")
    base = pl.concat_str([s.str.slice(0, 10), s.str.slice(11, 8)], separator=" ").str.strptime(
        pl.Datetime("us"), "%Y-%m-%d %H:%M:%S", strict=False)
    frac = rest.str.extract(r"^[.,](\d{1,9})", 1)
    sign = pl.when(tz.str.starts_with("-")).then(-1).otherwise(1)
    off_min = pl.when(tz.is_null() | tz.str.to_uppercase().eq("Z")).then(0).otherwise(
        sign * (tz.str.slice(1, 2).cast(pl.Int64, strict=False) * 60 + tz.str.slice(3, 2).cast(pl.Int64, strict=False)))
    ns = base.dt.epoch("ns") + frac_ns(frac) - off_min * 60_000_000_000
    out = df.select(pl.when(s.str.contains(_RFC3339_OK)).then(ns).otherwise(pl.lit(None, pl.Int64)).alias("ns"))
    return out["ns"].alias(values.name)


def rfc3339_to_time_expr(col: pl.Expr) -> pl.Expr:
    return rfc3339_to_ns_expr(col).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME)


def iso_to_ns(s: str) -> int:
    v = pl.select(rfc3339_to_ns_expr(pl.lit(s))).item()
    if v is None:
        raise ValueError(f"not an RFC3339 time: {s!r}")
    return int(v)


def ns_to_iso(ns: int | None) -> str | None:
    """Integer nanoseconds since the epoch -> RFC3339 UTC with 9 fraction digits."""
    if ns is None:
        return None
    sec, frac = divmod(int(ns), 1_000_000_000)
    t = _time.gmtime(sec)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:"
            f"{t.tm_sec:02d}.{frac:09d}Z")


def time_to_ns(v) -> int | None:
    """A Polars/py datetime value (tz-aware UTC) -> ns int."""
    if v is None:
        return None
    return int(pl.Series([v], dtype=TIME).dt.epoch("ns")[0])


def parse_duration_s(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d', '500ms' -> seconds."""
    t = text.strip().lower()
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0))
    for suffix, mult in units:
        if t.endswith(suffix) and t[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(t[: -len(suffix)]) * mult
    return float(t)
