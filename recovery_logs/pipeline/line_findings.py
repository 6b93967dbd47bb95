"""``findings.parquet``: one row per flagged log line, for measuring line-level detection.

An analyst with labelled logs (public HPC system logs, a site's own triage) wants to know, line
by line, what the engine flagged and how sure it was. ``replay --out DIR`` writes this table:

=============  =================================================================================
``file``       the input file (``detector`` for behavioural findings that are not one line)
``line``       1-based line number of the record's first line (0 for ``detector`` rows)
``time``       event time (UTC, ns)
``host``       node; ``job_id`` the Slurm job when known
``rule_id``    the rule that won the line, ``detector.line_rarity`` for a line flagged by template
               rarity (``detectors.linescore``, when line scores are on), ``detector.anomaly`` for
               a line flagged only by the anomaly model, ``detector.hang`` /
               ``detector.straggler`` (``file = detector``)
``category`` ``role`` ``severity``   as in the findings frame
``level``      the line's declared level (normalised), where its format has one
``score``      ``detector.line_rarity`` rows: the line's template rarity (in [0, 1], 1 = a template
               seen once); other rows: the isolation forest's anomaly score (higher = more
               anomalous, in (0, 1]) of the line's (host, job, window), where the model scored
               that window; null otherwise
``message``    the event message
=============  =================================================================================

A line has one row: a rule's, else line rarity's, else the window model's. Which lines a
model-flagged window flags: every line of that (host, job, window) that no rule or line score
won — the model scores windows, not lines, so this is the line-level reading of its verdict.
Progress lines (step timings) are not flags and are left out. Rows are in (time, file, line) order,
at most one per (file, line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.detectors.features import window_ns
from recovery_logs.detectors.linescore import RULE_ID as LINE_RULE_ID
from recovery_logs.schema import TIME, SchemaDict, conform

LINE_FINDINGS_SCHEMA: SchemaDict = {
    "file": pl.String, "line": pl.Int64, "time": TIME, "host": pl.String, "job_id": pl.String,
    "rule_id": pl.String, "category": pl.String, "role": pl.String, "severity": pl.String,
    "level": pl.String, "score": pl.Float64, "message": pl.String,
}
_KEY = ["host", "job_id", "_w"]


def _scorers(engine: Any) -> list[Any]:
    return [d for d in engine.detectors if hasattr(d, "score_windows")]


def window_scores(engine: Any) -> pl.DataFrame:
    """(host, job_id, _w ns, score, flagged, role) of every window the anomaly model scored."""
    out = []
    wm = engine.watermark_ns if engine.watermark_ns is not None else engine.max_time_ns
    for d in _scorers(engine) if wm is not None else []:
        sc = d.score_windows(engine.findings, engine.windows, wm)
        if sc.is_empty():
            continue
        out.append(sc.select(
            "host", "job_id", pl.col("window_start").dt.epoch("ns").alias("_w"), pl.lit(window_ns(d.window)).alias("_wn"),
            pl.col("score").cast(pl.Float64), pl.col("flagged"),
            pl.when(pl.col("n_findings") > 0).then(pl.lit("info")).otherwise(pl.lit("cause")).alias("_role")))
    if not out:
        return pl.DataFrame(schema={"host": pl.String, "job_id": pl.String, "_w": pl.Int64, "_wn": pl.Int64,
                                    "score": pl.Float64, "flagged": pl.Boolean, "_role": pl.String})
    # several anomaly models: the highest score per window
    return pl.concat(out).sort("score", descending=True).unique(_KEY, keep="first", maintain_order=True)


def _with_window(df: pl.DataFrame | pl.LazyFrame, wn: int) -> Any:
    return df.with_columns(((pl.col("time").dt.epoch("ns") // wn) * wn).alias("_w"))


def line_findings(engine: Any, events: pl.DataFrame | pl.LazyFrame | None = None) -> pl.DataFrame:
    """The findings table (``LINE_FINDINGS_SCHEMA``) of an engine that has seen a replay.

    ``events``: the replay's events (``events.parquet`` scanned lazily is fine); needed only to
    turn model-flagged windows into lines."""
    scores = window_scores(engine)
    wn = int(scores["_wn"][0]) if scores.height else window_ns(engine.config.window_s)
    f = engine.findings.filter(pl.col("role") != "progress")
    rules = _with_window(f, wn).join(scores.select(*_KEY, "score"), on=_KEY, how="left", nulls_equal=True)
    parts = [rules.select(list(LINE_FINDINGS_SCHEMA))]
    det = engine.detector_findings()
    other = det.filter(~pl.col("rule_id").eq("detector.anomaly"))
    if other.height:
        line_score = pl.col("detail").str.json_path_match("$.score").cast(pl.Float64, strict=False)
        parts.append(other.with_columns(score=pl.when(pl.col("rule_id") == LINE_RULE_ID).then(line_score))
                     .select(list(LINE_FINDINGS_SCHEMA)))
    won = pl.concat([f.select("file", "line"), det.filter(pl.col("rule_id") == LINE_RULE_ID).select("file", "line")])
    flagged = scores.filter(pl.col("flagged"))
    anomaly_windows = det.filter(pl.col("rule_id").eq("detector.anomaly")).select(
        "host", "job_id", pl.col("detail").str.json_path_match("$.window_start").alias("_ws"))
    if flagged.height and anomaly_windows.height and events is not None:
        # the windows the detector reported (it may leave out windows that rules already explain)
        aw = anomaly_windows.with_columns(
            pl.col("_ws").str.to_datetime(time_zone="UTC", time_unit="ns").dt.epoch("ns").alias("_w")).drop("_ws")
        flagged = flagged.join(aw, on=_KEY, how="semi", nulls_equal=True)
        ev = events.lazy() if isinstance(events, pl.DataFrame) else events
        cols = ["file", "line", "time", "host", "job_id", "message",
                *(["level"] if "level" in ev.collect_schema().names() else [])]   # (events.parquet before levels)
        lines = (_with_window(ev.select(cols), wn)
                 .join(flagged.lazy().select(*_KEY, "score", "_role"), on=_KEY, how="inner", nulls_equal=True)
                 .join(won.lazy(), on=["file", "line"], how="anti")
                 .with_columns(rule_id=pl.lit("detector.anomaly"), category=pl.lit("anomaly"),
                               role=pl.col("_role"), severity=pl.lit("low"))
                 .select(list(LINE_FINDINGS_SCHEMA)).collect())
        parts.append(lines)
    out = pl.concat([conform(p, LINE_FINDINGS_SCHEMA) for p in parts])
    return out.sort(["time", "file", "line"], nulls_last=True)


def write_line_findings(engine: Any, out_dir: Path) -> Path:
    """``out_dir/findings.parquet`` (uses ``out_dir/events.parquet`` for model-flagged lines)."""
    ev_path = out_dir / "events.parquet"
    events = pl.scan_parquet(ev_path) if ev_path.is_file() else None
    path = out_dir / "findings.parquet"
    line_findings(engine, events).write_parquet(path, compression="zstd")
    return path


__all__ = ["LINE_FINDINGS_SCHEMA", "line_findings", "window_scores", "write_line_findings"]
