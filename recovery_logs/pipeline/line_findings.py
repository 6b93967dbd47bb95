"""``findings.parquet``: one row per flagged log line, for measuring line-level detection.

An analyst with labelled logs (public HPC system logs, a site's own triage) wants to know, line
by line, what the engine flagged and how sure it was. ``replay --out DIR`` writes this table:

=================  =============================================================================
``file``           the input file (``detector`` for rows that are not one line: a model-flagged
                   window, a hang, a straggler)
``line``           1-based line number of the record's first line (0 for ``detector`` rows)
``time``           event time (UTC, ns); a window row: the end of the window
``host``           node; ``job_id`` the Slurm job when known
``rule_id``        the rule that won the line, ``detector.line_rarity`` for a line flagged by
                   template rarity (``detectors.linescore``, when line scores are on),
                   ``detector.anomaly`` for a line the window model singled out (below) or a
                   flagged window (``file = detector``), ``detector.hang`` / ``detector.straggler``
``category`` ``role`` ``severity``   as in the findings frame
``level``          the line's declared level (normalised), where its format has one
``score``          ``detector.line_rarity`` rows: the line's template rarity (in [0, 1], 1 = a
                   template seen once); other rows: the isolation forest's anomaly score (higher =
                   more anomalous, in (0, 1]) of the line's (host, job, window), where the model
                   scored that window; null otherwise
``window_score``   every row: the model's score of the row's (host, job, window), null where the
                   model did not score it (the window's verdict, carried on the line — not a flag)
``window_flagged`` whether that window is one the model flagged (null where unscored)
``message``        the event message (a window row: the detector's explanation)
=================  =============================================================================

A line has one row: a rule's, else line rarity's, else the window model's. **A model-flagged
window does not flag its lines.** The model scores (host, job, minute) windows, not lines: "this
minute of this node is unusual" (a reboot's burst of boot messages is, and is no alert). The
window gets one ``file = detector`` row; of its lines no rule or line score won, only its most
unusual ones get ``detector.anomaly`` rows, the exemplars an operator would read first:

* a line whose level is info/notice/debug is never one (as for line scores);
* per template (``templates.mask_expr``) only its first line in the window;
* the template must be over-represented in the window: its share of the window's lines at least
  ``MIN_LIFT`` times its share of the host's lines over the whole replay (chatter that fills
  every minute is not what made this minute unusual);
* ranked by that ratio, then level (worse first), then time; at most ``MAX_LINES_PER_WINDOW``.

So a flagged window adds at most ``MAX_LINES_PER_WINDOW`` line alerts, whatever its size.
Progress lines (step timings) are not flags and are left out. Rows are in (time, file, line)
order, at most one per (file, line) for ``file != detector``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.detectors.features import window_ns
from recovery_logs.detectors.linescore import QUIET_LEVELS
from recovery_logs.detectors.linescore import RULE_ID as LINE_RULE_ID
from recovery_logs.detectors.templates import mask_expr, template_id_expr
from recovery_logs.schema import LEVEL_RANK, TIME, SchemaDict, conform

LINE_FINDINGS_SCHEMA: SchemaDict = {
    "file": pl.String, "line": pl.Int64, "time": TIME, "host": pl.String, "job_id": pl.String,
    "rule_id": pl.String, "category": pl.String, "role": pl.String, "severity": pl.String,
    "level": pl.String, "score": pl.Float64, "window_score": pl.Float64, "window_flagged": pl.Boolean,
    "message": pl.String,
}
MAX_LINES_PER_WINDOW = 3     # line alerts one model-flagged window may add
MIN_LIFT = 2.0               # a template's share of the window / its share of the host's lines
ANOMALY_ID = "detector.anomaly"
_KEY = ["host", "job_id", "_w"]


def _scorers(engine: Any) -> list[Any]:
    return [d for d in engine.detectors if hasattr(d, "score_windows")]


def window_scores(engine: Any) -> pl.DataFrame:
    """(host, job_id, _w ns, score, flagged, role) of every window the anomaly model scored."""
    out = []
    wm = engine.watermark_ns if engine.watermark_ns is not None else engine.max_time_ns
    for d in _scorers(engine) if wm is not None else []:
        sc = d.score_windows(engine.rule_findings, engine.windows, wm, observed=engine.observed())
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


def _with_window(df: Any, wn: int) -> Any:
    return df.with_columns(((pl.col("time").dt.epoch("ns") // wn) * wn).alias("_w"))


def _window_cols(df: Any, scores: pl.DataFrame, wn: int) -> Any:
    """``window_score``/``window_flagged`` of each row's (host, job, window)."""
    ws = scores.select(*_KEY, pl.col("score").alias("window_score"), pl.col("flagged").alias("window_flagged"))
    lazy = isinstance(df, pl.LazyFrame)
    return _with_window(df, wn).join(ws.lazy() if lazy else ws, on=_KEY, how="left", nulls_equal=True)


def window_exemplars(events: pl.LazyFrame, windows: pl.DataFrame, wn: int,
                     won: pl.DataFrame | None = None) -> pl.DataFrame:
    """The lines that stand out in each of ``windows`` (host, job_id, _w, score, _role): see the
    module docstring. Columns: the events' file, line, time, host, job_id, message, level, _w,
    score, _role, _lift."""
    names = events.collect_schema().names()
    cols = ["file", "line", "time", "host", "job_id", "message"]
    ev = events.select(*cols, (pl.col("level") if "level" in names   # (events.parquet before levels)
                               else pl.lit(None, pl.String).alias("level")))
    hosts = windows["host"].unique()
    # the hosts of flagged windows only: their lines' templates, over the whole replay
    ev = _with_window(ev.filter(pl.col("host").is_in(hosts.drop_nulls().implode()) | (
        pl.col("host").is_null() if hosts.null_count() else pl.lit(False))), wn)
    ev = ev.with_columns(_t=template_id_expr(mask_expr(pl.col("message").fill_null(""))))
    host_share = ev.group_by("host", "_t").agg(pl.len().alias("_nt")).join(
        ev.group_by("host").agg(pl.len().alias("_nh")), on="host", nulls_equal=True)
    inside = ev.join(windows.lazy().select(*_KEY, "score", "_role"), on=_KEY, how="inner", nulls_equal=True)
    if won is not None and won.height:
        in_w = inside.with_columns(_nw=pl.len().over(_KEY))     # the window's lines, before rule-won are dropped
        inside = in_w.join(won.lazy(), on=["file", "line"], how="anti")
    else:
        inside = inside.with_columns(_nw=pl.len().over(_KEY))
    per = (inside.with_columns(_nwt=pl.len().over(*_KEY, "_t"))
           .filter(~pl.col("level").is_in(list(QUIET_LEVELS)).fill_null(False))
           .sort(["time", "file", "line"], nulls_last=True)
           .unique([*_KEY, "_t"], keep="first", maintain_order=True)
           .join(host_share, on=["host", "_t"], how="left", nulls_equal=True)
           .with_columns(_lift=(pl.col("_nwt") / pl.col("_nw")) / (pl.col("_nt") / pl.col("_nh")),
                         _rank=pl.col("level").replace_strict(LEVEL_RANK, default=-1, return_dtype=pl.Int64))
           .filter(pl.col("_lift") >= MIN_LIFT)
           .sort(["_lift", "_rank", "time", "file", "line"], descending=[True, True, False, False, False],
                 nulls_last=True)
           .filter(pl.int_range(pl.len()).over(_KEY) < MAX_LINES_PER_WINDOW))
    return per.select(*cols, "level", "_w", "score", "_role", "_lift").collect()


def line_findings(engine: Any, events: pl.DataFrame | pl.LazyFrame | None = None) -> pl.DataFrame:
    """The findings table (``LINE_FINDINGS_SCHEMA``) of an engine that has seen a replay.

    ``events``: the replay's events (``events.parquet`` scanned lazily is fine); needed only to
    pick the lines of model-flagged windows."""
    scores = window_scores(engine)
    wn = int(scores["_wn"][0]) if scores.height else window_ns(engine.config.window_s)
    f = engine.rule_findings.filter(pl.col("role") != "progress")
    rules = _window_cols(f, scores, wn).with_columns(score=pl.col("window_score"))
    parts = [rules.select(list(LINE_FINDINGS_SCHEMA))]
    det = engine.detector_findings()
    other = det.filter(~pl.col("rule_id").eq(ANOMALY_ID))
    if other.height:
        line_score = pl.col("detail").str.json_path_match("$.score").cast(pl.Float64, strict=False)
        o = other.with_columns(score=pl.when(pl.col("rule_id") == LINE_RULE_ID).then(line_score))
        # a detector row's time is when it fired (a window's end for hang/straggler): no window score
        o = _window_cols(o, scores, wn).with_columns(
            [pl.when(pl.col("file") != "detector").then(pl.col(c)).alias(c) for c in ("window_score", "window_flagged")])
        parts.append(o.select(list(LINE_FINDINGS_SCHEMA)))
    won = pl.concat([f.select("file", "line"), det.filter(pl.col("rule_id") == LINE_RULE_ID).select("file", "line")])
    anomaly = det.filter(pl.col("rule_id").eq(ANOMALY_ID))
    if anomaly.height:
        # the windows the detector reported (it may leave out windows that rules already explain): one row each
        aw = anomaly.with_columns(_w=pl.col("detail").str.json_path_match("$.window_start").str.to_datetime(
            time_zone="UTC", time_unit="ns").dt.epoch("ns"))
        aw = aw.join(scores.select(*_KEY, "score", "flagged"), on=_KEY, how="left", nulls_equal=True)
        parts.append(aw.with_columns(window_score=pl.col("score"), window_flagged=pl.col("flagged").fill_null(True),
                                     level=pl.lit(None, pl.String)).select(list(LINE_FINDINGS_SCHEMA)))
        flagged = scores.filter(pl.col("flagged")).join(aw.select(_KEY), on=_KEY, how="semi", nulls_equal=True)
        if flagged.height and events is not None:
            ev = events.lazy() if isinstance(events, pl.DataFrame) else events
            lines = window_exemplars(ev, flagged, wn, won).with_columns(
                rule_id=pl.lit(ANOMALY_ID), category=pl.lit("anomaly"), role=pl.col("_role"),
                severity=pl.lit("low"), window_score=pl.col("score"), window_flagged=pl.lit(True))
            parts.append(lines.select(list(LINE_FINDINGS_SCHEMA)))
    out = pl.concat([conform(p, LINE_FINDINGS_SCHEMA) for p in parts])
    return out.sort(["time", "file", "line"], nulls_last=True)


def write_line_findings(engine: Any, out_dir: Path) -> Path:
    """``out_dir/findings.parquet`` (uses ``out_dir/events.parquet`` for model-flagged windows' lines)."""
    ev_path = out_dir / "events.parquet"
    events = pl.scan_parquet(ev_path) if ev_path.is_file() else None
    path = out_dir / "findings.parquet"
    line_findings(engine, events).write_parquet(path, compression="zstd")
    return path


__all__ = ["ANOMALY_ID", "LINE_FINDINGS_SCHEMA", "MAX_LINES_PER_WINDOW", "MIN_LIFT", "line_findings", "window_exemplars",
           "window_scores", "write_line_findings"]
