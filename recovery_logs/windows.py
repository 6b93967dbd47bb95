"""Events and findings → per (host, job, window) features. Pure functions of frames.

Windows are tumbling event-time windows of ``window_s`` seconds, keyed by
``(host, job_id, window_start)``. Every column is an associative aggregate (sum, min, max), so
windows computed per batch and merged with :func:`merge_windows` equal the windows of all events
at once — the property that lets replay and watch share one code path.
"""

from __future__ import annotations

import polars as pl

from recovery_logs.schema import PROGRESS_CATEGORY, TIME, Category, SchemaDict

CATEGORY_COLUMNS = [f"n_{c.value}" for c in Category]
KEYS = ["host", "job_id", "window_start"]

WINDOW_SCHEMA: SchemaDict = {
    "host": pl.String,
    "job_id": pl.String,
    "window_start": TIME,
    "lines": pl.Int64,
    "first_time": TIME,
    "last_time": TIME,
    "findings": pl.Int64,
    "progress": pl.Int64,
    "last_progress": TIME,
    **{c: pl.Int64 for c in CATEGORY_COLUMNS},
}

_SUM = ["lines", "findings", "progress", *CATEGORY_COLUMNS]
_MIN = ["first_time"]
_MAX = ["last_time", "last_progress"]

SPAN_SCHEMA: SchemaDict = {"host": pl.String, "job_id": pl.String, "first": TIME, "last": TIME,
                                        "lines": pl.Int64}


def empty_windows() -> pl.DataFrame:
    return pl.DataFrame(schema=WINDOW_SCHEMA)


def empty_spans() -> pl.DataFrame:
    return pl.DataFrame(schema=SPAN_SCHEMA)


def window_us(window_s: float) -> int:
    """The window length in whole µs, as every window frame truncates it (``window_counts``; line
    counts made elsewhere must bucket by ``window_us(...) * 1000`` ns to land in the same windows)."""
    return int(window_s * 1_000_000)


def window_counts(events: pl.DataFrame, findings: pl.DataFrame, window_s: float) -> pl.DataFrame:
    """Per-window line counts (from events) joined with per-category finding counts."""
    every = f"{window_us(window_s)}us"
    ev = events.filter(pl.col("time").is_not_null()).select(
        "host", "job_id", "time", pl.col("time").dt.truncate(every).alias("window_start"))
    lines = _run_counts(ev, KEYS).rename({"first": "first_time", "last": "last_time"})
    fi = findings.filter(pl.col("time").is_not_null()).with_columns(
        pl.col("time").dt.truncate(every).alias("window_start"))
    is_prog = pl.col("category") == PROGRESS_CATEGORY
    cat_aggs = [(pl.col("category") == c.value).sum().cast(pl.Int64).alias(f"n_{c.value}") for c in Category]
    fagg = fi.group_by(KEYS).agg(
        (~is_prog).sum().cast(pl.Int64).alias("findings"),
        is_prog.sum().cast(pl.Int64).alias("progress"),
        pl.col("time").filter(is_prog).max().alias("last_progress"),
        *cat_aggs,
    )
    out = lines.join(fagg, on=KEYS, how="full", coalesce=True, nulls_equal=True)
    out = out.with_columns(
        [pl.col(c).fill_null(0) for c in _SUM],
    )
    return _conform(out)


def _run_counts(ev: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per ``keys``: lines (Int64), first and last ``time``. Reading order keeps a file's lines
    together (one host, one job, consecutive windows), so the rows are first folded into runs of
    equal keys (compared with the previous row, no hashing) and only the runs are grouped: the
    same counts, ~2x cheaper than grouping every line."""
    runs = (ev.with_columns(pl.struct(keys).rle_id().set_sorted().alias("_r"))
            .group_by("_r").agg(*[pl.col(k).first() for k in keys], pl.len().alias("_n"),
                                pl.col("time").min().alias("first"), pl.col("time").max().alias("last")))
    return runs.group_by(keys).agg(pl.col("_n").sum().cast(pl.Int64).alias("lines"), pl.col("first").min(),
                                   pl.col("last").max())


def merge_windows(acc: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """Merge two window frames (associative, commutative)."""
    if acc.height == 0:
        return _sort(new)
    if new.height == 0:
        return acc
    both = pl.concat([acc, new], how="vertical")
    merged = both.group_by(KEYS).agg(
        *[pl.col(c).sum() for c in _SUM],
        *[pl.col(c).min() for c in _MIN],
        *[pl.col(c).max() for c in _MAX],
    )
    return _sort(_conform(merged))


def job_spans(events: pl.DataFrame) -> pl.DataFrame:
    """(host, job_id) → first/last event time and line count, for lines that name both."""
    ev = events.filter(pl.col("host").is_not_null() & pl.col("job_id").is_not_null()
                       & pl.col("time").is_not_null())
    out = _run_counts(ev.select("host", "job_id", "time"), ["host", "job_id"])
    return out.select(list(SPAN_SCHEMA)).cast(SPAN_SCHEMA)  # type: ignore[arg-type]  # polars types cast()'s keys as str | selector | dtype


def merge_spans(acc: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    if acc.height == 0:
        return new.sort(["host", "job_id"])
    if new.height == 0:
        return acc
    return (pl.concat([acc, new]).group_by(["host", "job_id"])
            .agg(pl.col("first").min(), pl.col("last").max(), pl.col("lines").sum())
            .select(list(SPAN_SCHEMA)).sort(["host", "job_id"]))


def _utc_ns(col: str) -> pl.Expr:
    """An integer ns column as the windows' UTC datetime."""
    return pl.col(col).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")


def counted_windows(counts: pl.DataFrame) -> pl.DataFrame:
    """Windows (no findings yet) from line counts made elsewhere — e.g. by a VictoriaLogs server
    (``sources.vl_history.line_counts``): columns host, job_id, bucket (window start, ns),
    lines, first, last (ns). Merged with the windows of the findings of the same lines
    (``window_counts`` of no events), this equals ``window_counts`` of all the lines."""
    out = counts.select("host", "job_id", _utc_ns("bucket").alias("window_start"), pl.col("lines").cast(pl.Int64),
                        _utc_ns("first").alias("first_time"), _utc_ns("last").alias("last_time"))
    out = out.with_columns([pl.lit(0, pl.Int64).alias(c) for c in _SUM if c != "lines"])
    return _sort(_conform(out))


def progress_windows(counts: pl.DataFrame, category: str, window_s: float) -> pl.DataFrame | None:
    """The windows of summarised progress lines straight from their counts (host, job_id, lines,
    first, last in ns: ``lines`` lines of ``category``, the first at ``first``, the others at
    ``last``), equal to :func:`window_counts` of no events and their findings one row per line
    (``pipeline.vl_replay.progress_findings``), without making those rows. None where a count's
    ``first`` and ``last`` fall in different windows (its lines' windows are not known here), or a
    count is not of one line or more at a known time."""
    w = window_us(window_s) * 1000
    if counts.height == 0:
        return empty_windows()
    first, last = counts["first"], counts["last"]
    if (counts["lines"] < 1).any() or first.null_count() or (first // w != last // w).any():
        return None
    n = pl.col("lines").sum().cast(pl.Int64)
    g = counts.group_by(["host", "job_id", (pl.col("first") // w * w).alias("window_start")]).agg(
        n.alias("progress"),
        pl.when(pl.col("lines") > 1).then(pl.col("last")).otherwise(pl.col("first")).max().alias("last_progress"),
        *[(n if cat.value == category else pl.lit(0, pl.Int64)).alias(f"n_{cat.value}") for cat in Category])
    out = g.with_columns(_utc_ns("window_start"), _utc_ns("last_progress"), pl.lit(0, pl.Int64).alias("lines"),
                         pl.lit(0, pl.Int64).alias("findings"))
    if category != PROGRESS_CATEGORY:     # a category window_counts counts as findings
        out = out.with_columns(pl.col("progress").alias("findings"), pl.lit(0, pl.Int64).alias("progress"),
                               pl.lit(None, TIME).alias("last_progress"))
    return _conform(out)


def counted_spans(counts: pl.DataFrame) -> pl.DataFrame:
    """(host, job_id) spans from the same line counts (= ``job_spans`` of the lines)."""
    c = counts.filter(pl.col("host").is_not_null() & pl.col("job_id").is_not_null())
    out = c.group_by(["host", "job_id"]).agg(pl.col("first").min(), pl.col("last").max(), pl.col("lines").sum())
    out = out.with_columns([_utc_ns(k) for k in ("first", "last")])
    return out.select(list(SPAN_SCHEMA)).cast(SPAN_SCHEMA).sort(["host", "job_id"])  # type: ignore[arg-type]  # as in job_spans


def silence(windows: pl.DataFrame, watermark_ns: int) -> pl.DataFrame:
    """Per (host, job_id): seconds since the last progress line at the watermark (null if none)."""
    wm = pl.lit(watermark_ns).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")
    return (windows.group_by(["host", "job_id"])
            .agg(pl.col("last_progress").max(), pl.col("progress").sum())
            .with_columns(((wm - pl.col("last_progress")).dt.total_nanoseconds() / 1e9)
                          .alias("silence_s"))
            .sort(["host", "job_id"], nulls_last=True))


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    exprs = [pl.col(k).cast(v) if k in df.columns else pl.lit(None, v).alias(k) for k, v in WINDOW_SCHEMA.items()]
    return df.select(exprs)


def _sort(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(KEYS, nulls_last=True)
