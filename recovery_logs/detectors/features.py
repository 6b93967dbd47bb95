"""Window features for the anomaly model: one row per (host, job_id, window_start).

Pure functions of frames. Two groups of columns:

* **finding features** (need only the findings frame, so the pipeline's ``AnomalyDetector`` can
  always compute them): counts per rule category, findings / distinct rules / causes / symptoms,
  progress lines and their ratio to the (host, job)'s baseline, step-time median, p90, p90/median,
  coefficient of variation and the ratio of the median to
  the (host, job)'s own baseline and to the job's median over hosts in the same window.
* **event features** (need the events frame): events, log rate (events/s), its deviation from
  the (host, job)'s own baseline (``log1p(rate) - log1p(baseline)``, and in units of Poisson noise
  ``(n - baseline) / sqrt(baseline)``), distinct templates, new
  templates (first seen in this window within the frame given) and their share, and NVML
  aggregates (max temperature, mean power, samples) from ``source == "nvml"`` events (the NVML
  agent's ``temperature celsius=83`` / ``power watts=650`` bodies, or ``temp=83`` / ``power=650``).

Baselines are *causal*: the rolling median of the same (host, job)'s previous
``baseline_windows`` windows, so a window's features never change when later data arrives.
Every feature column is a non-null Float64 (absent = 0.0), ready for the estimator.
"""

from __future__ import annotations

import polars as pl

from recovery_logs.detectors.templates import add_template_columns
from recovery_logs.errors import ConfigError
from recovery_logs.schema import TIME, Category
from recovery_logs.timeutil import NS, parse_duration_s

KEYS = ["host", "job_id", "window_start"]
CATEGORY_FEATURES = [f"cat_{c.value}" for c in Category if c not in (Category.ANOMALY,)]
FINDING_FEATURES = CATEGORY_FEATURES + [
    "n_findings", "n_rules", "n_cause", "n_symptom", "n_progress", "progress_ratio",
    "step_time_med", "step_time_p90", "step_time_tail", "step_time_cv", "step_time_ratio", "step_time_rel_job",
]
# Categories the shipped model was trained without: host_hardware (MCE/EDAC, issue 13) came after it,
# and the simulator writes no such lines, so its column would be constant (as cat_thermal_power and
# cat_straggler are in models/default). Empty this set when the model is retrained on data that has them.
_UNTRAINED_CATEGORIES = {f"cat_{Category.HOST_HARDWARE.value}"}
# Scale-free finding features (comparable across jobs of different size and speed): the default model's.
MODEL_FEATURES = [c for c in CATEGORY_FEATURES if c not in _UNTRAINED_CATEGORIES] + [
    "n_findings", "n_rules", "n_cause", "n_symptom", "progress_ratio",
    "step_time_tail", "step_time_cv", "step_time_ratio", "step_time_rel_job", "log_rate_dev", "log_rate_z",
]
# What the pipeline's AnomalyDetector can compute: findings plus the windows frame's line counts.
PIPELINE_FEATURES = FINDING_FEATURES + ["n_events", "log_rate", "log_rate_dev", "log_rate_z"]
EVENT_FEATURES = [
    "n_events", "log_rate", "log_rate_dev", "log_rate_z", "n_templates", "new_templates", "new_template_frac",
    "nvml_temp_max", "nvml_power_mean", "nvml_samples",
]
ALL_FEATURES = FINDING_FEATURES + EVENT_FEATURES



def window_ns(window: str | float) -> int:
    s = parse_duration_s(window) if isinstance(window, str) else float(window)
    if not s > 0:
        raise ConfigError("features: window must be a positive duration", window=window)
    return int(round(s * NS))


def _bucket(wn: int) -> pl.Expr:
    return ((pl.col("time").dt.epoch("ns") // wn) * wn).alias("_w")


def _poisson_z(df: pl.DataFrame, col: str, out: str, k: int) -> pl.DataFrame:
    """(count - causal baseline median) / sqrt(max(baseline, 1)): a burst in units of Poisson noise."""
    base = pl.col(col).shift(1).rolling_median(k, min_samples=1).over(["host", "job_id"], order_by="_w")
    expr = (pl.col(col) - base) / pl.max_horizontal(base, pl.lit(1.0)).sqrt()
    return df.with_columns(expr.fill_null(0.0).fill_nan(0.0).alias(out))


def _baseline_ratio(df: pl.DataFrame, col: str, out: str, k: int, log_diff: bool) -> pl.DataFrame:
    base = pl.col(col).shift(1).rolling_median(k, min_samples=1).over(["host", "job_id"], order_by="_w")
    if log_diff:
        expr = pl.col(col).log1p() - base.log1p()
    else:
        expr = pl.when(base > 0).then(pl.col(col) / base).otherwise(1.0)
    return df.with_columns(expr.fill_null(0.0 if log_diff else 1.0).fill_nan(0.0 if log_diff else 1.0).alias(out))


# the findings columns finding_features reads (a caller filtering the findings first selects these:
# a filter copies every column it keeps)
FINDING_INPUT_COLS = ("time", "rule_id", "host", "job_id", "role", "category", "step_time_s")
_PROG_COLS = ("time", "rule_id", "host", "job_id", "step_time_s")


def finding_features(findings: pl.DataFrame, window: str | float = "60s", baseline_windows: int = 30,
                     observed: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (host, job_id, window_start): the FINDING_FEATURES columns. Detector findings are ignored.
    ``observed``: the progress observations (``detectors.progress.observations`` of the findings and
    the narrow rows held beside them): read instead of the frame's own progress rows. None: those."""
    wn = window_ns(window)
    usable = pl.col("time").is_not_null() & ~pl.col("rule_id").fill_null("").str.starts_with("detector.")
    f = findings.select(FINDING_INPUT_COLS).filter(usable).with_columns(_bucket(wn))
    rules = f.filter(pl.col("role") != "progress")
    cats = [c.removeprefix("cat_") for c in CATEGORY_FEATURES]
    agg_rules = rules.group_by(["host", "job_id", "_w"]).agg(
        *[(pl.col("category") == c).sum().cast(pl.Float64).alias(f"cat_{c}") for c in cats],
        pl.len().cast(pl.Float64).alias("n_findings"),
        pl.col("rule_id").n_unique().cast(pl.Float64).alias("n_rules"),
        (pl.col("role") == "cause").sum().cast(pl.Float64).alias("n_cause"),
        (pl.col("role") == "symptom").sum().cast(pl.Float64).alias("n_symptom"))
    prog = (f.filter(pl.col("role") == "progress") if observed is None
            else observed.select(_PROG_COLS).filter(usable).with_columns(_bucket(wn)))
    st = pl.col("step_time_s").filter(pl.col("step_time_s").is_finite())
    agg_prog = prog.group_by(["host", "job_id", "_w"]).agg(
        pl.len().cast(pl.Float64).alias("n_progress"),
        st.median().alias("step_time_med"),
        st.quantile(0.9, "nearest").alias("step_time_p90"),
        (st.std() / st.mean()).alias("step_time_cv"))
    keys = pl.concat([agg_rules.select("host", "job_id", "_w"), agg_prog.select("host", "job_id", "_w")]).unique()
    df = keys.join(agg_rules, on=["host", "job_id", "_w"], how="left", nulls_equal=True).join(
        agg_prog, on=["host", "job_id", "_w"], how="left", nulls_equal=True)
    df = _baseline_ratio(df.sort(["host", "job_id", "_w"], nulls_last=True), "step_time_med", "step_time_ratio",
                         baseline_windows, log_diff=False)
    df = _baseline_ratio(df, "n_progress", "progress_ratio", baseline_windows, log_diff=False)
    job_med = pl.col("step_time_med").median().over(["job_id", "_w"])
    df = df.with_columns(
        pl.when(pl.col("step_time_med").is_null()).then(1.0).otherwise(pl.col("step_time_ratio")).alias("step_time_ratio"),
        pl.when(pl.col("step_time_med") > 0).then(pl.col("step_time_p90") / pl.col("step_time_med")).otherwise(1.0)
        .fill_null(1.0).alias("step_time_tail"),
        pl.when(pl.col("n_progress").is_null()).then(1.0).otherwise(pl.col("progress_ratio")).alias("progress_ratio"),
        pl.when(job_med > 0).then(pl.col("step_time_med") / job_med).otherwise(1.0).fill_null(1.0)
        .alias("step_time_rel_job"))
    return _finish(df, FINDING_FEATURES)


def event_features(events: pl.DataFrame, window: str | float = "60s", baseline_windows: int = 30) -> pl.DataFrame:
    """Per (host, job_id, window_start): the EVENT_FEATURES columns."""
    wn = window_ns(window)
    ev = add_template_columns(events.filter(pl.col("time").is_not_null())).with_columns(_bucket(wn))
    first = ev.group_by("template_id").agg(pl.col("_w").min().alias("_first_w"))
    ev = ev.join(first, on="template_id", how="left")
    nv = ev.filter(pl.col("source") == "nvml").with_columns(
        pl.col("message").str.extract(r"(?i)temp(?:erature)?(?: celsius)?[=: ]+([0-9.]+)")
        .cast(pl.Float64, strict=False).alias("_temp"),
        pl.col("message").str.extract(r"(?i)power(?:_draw)?(?: watts)?[=: ]+([0-9.]+)")
        .cast(pl.Float64, strict=False).alias("_pow"))
    agg = ev.group_by(["host", "job_id", "_w"]).agg(
        pl.len().cast(pl.Float64).alias("n_events"),
        pl.col("template_id").n_unique().cast(pl.Float64).alias("n_templates"),
        pl.col("template_id").filter(pl.col("_first_w") == pl.col("_w")).n_unique().cast(pl.Float64).alias("new_templates"))
    nva = nv.group_by(["host", "job_id", "_w"]).agg(
        pl.col("_temp").max().alias("nvml_temp_max"), pl.col("_pow").mean().alias("nvml_power_mean"),
        pl.len().cast(pl.Float64).alias("nvml_samples"))
    df = agg.join(nva, on=["host", "job_id", "_w"], how="left", nulls_equal=True).with_columns(
        (pl.col("n_events") / (wn / NS)).alias("log_rate"),
        (pl.col("new_templates") / pl.col("n_templates")).alias("new_template_frac"))
    df = _baseline_ratio(df.sort(["host", "job_id", "_w"], nulls_last=True), "log_rate", "log_rate_dev",
                         baseline_windows, log_diff=True)
    df = _poisson_z(df, "n_events", "log_rate_z", baseline_windows)
    return _finish(df, EVENT_FEATURES)


def line_features(windows: pl.DataFrame, window: str | float = "60s", baseline_windows: int = 30) -> pl.DataFrame:
    """From the pipeline's windows frame (``host, job_id, window_start, lines``): n_events, log_rate,
    log_rate_dev per (host, job_id, window_start) of ``window`` (its windows must divide ``window``)."""
    wn = window_ns(window)
    if windows.is_empty() or "lines" not in windows.columns:
        return pl.DataFrame(schema={"host": pl.String, "job_id": pl.String, "window_start": TIME,
                                    "n_events": pl.Float64, "log_rate": pl.Float64, "log_rate_dev": pl.Float64,
                                    "log_rate_z": pl.Float64})
    w = windows.select("host", "job_id", pl.col("window_start").alias("time"), "lines").with_columns(_bucket(wn))
    df = w.group_by(["host", "job_id", "_w"]).agg(pl.col("lines").sum().cast(pl.Float64).alias("n_events"))
    df = df.with_columns((pl.col("n_events") / (wn / NS)).alias("log_rate"))
    df = _baseline_ratio(df.sort(["host", "job_id", "_w"], nulls_last=True), "log_rate", "log_rate_dev",
                         baseline_windows, log_diff=True)
    df = _poisson_z(df, "n_events", "log_rate_z", baseline_windows)
    return _finish(df, ["n_events", "log_rate", "log_rate_dev", "log_rate_z"])


def pipeline_features(findings: pl.DataFrame, windows: pl.DataFrame, window: str | float = "60s",
                      baseline_windows: int = 30, observed: pl.DataFrame | None = None) -> pl.DataFrame:
    """PIPELINE_FEATURES per (host, job_id, window_start): what the AnomalyDetector scores and what
    the default model is trained on (one function for both, so training and detection agree).
    ``observed``: as in :func:`finding_features`."""
    ff = finding_features(findings, window, baseline_windows, observed)
    lf = line_features(windows, window, baseline_windows)
    keys = pl.concat([ff.select(KEYS), lf.select(KEYS)]).unique()
    df = keys.join(ff, on=KEYS, how="left", nulls_equal=True).join(lf, on=KEYS, how="left", nulls_equal=True)
    df = df.with_columns(pl.col(PIPELINE_FEATURES).fill_null(0.0)).with_columns(
        [pl.when(pl.col("n_progress") == 0).then(1.0).otherwise(pl.col(c)).alias(c)
         for c in ("step_time_ratio", "step_time_rel_job", "step_time_tail", "progress_ratio")])
    return df.select(KEYS + PIPELINE_FEATURES).sort(KEYS, nulls_last=True)


def window_features(events: pl.DataFrame | None, findings: pl.DataFrame, window: str | float = "60s",
                    baseline_windows: int = 30) -> pl.DataFrame:
    """Per (host, job_id, window_start) features: FINDING_FEATURES, plus EVENT_FEATURES when
    ``events`` is given. Rows are the union of windows with events or findings, sorted by key."""
    ff = finding_features(findings, window, baseline_windows)
    if events is None:
        return ff
    ef = event_features(events, window, baseline_windows)
    keys = pl.concat([ff.select(KEYS), ef.select(KEYS)]).unique()
    df = keys.join(ff, on=KEYS, how="left", nulls_equal=True).join(ef, on=KEYS, how="left", nulls_equal=True)
    df = df.with_columns(pl.col(ALL_FEATURES).fill_null(0.0))
    df = df.with_columns([pl.when(pl.col("n_progress") == 0).then(1.0).otherwise(pl.col(c)).alias(c)
                          for c in ("step_time_ratio", "step_time_rel_job", "step_time_tail", "progress_ratio")])
    return df.select(KEYS + ALL_FEATURES).sort(KEYS, nulls_last=True)


def _finish(df: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    df = df.with_columns(pl.col("_w").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME).alias("window_start"))
    df = df.with_columns([pl.col(c).cast(pl.Float64).fill_nan(0.0).fill_null(0.0).alias(c) for c in cols])
    return df.select(KEYS + cols).sort(KEYS, nulls_last=True)


__all__ = ["ALL_FEATURES", "CATEGORY_FEATURES", "EVENT_FEATURES", "FINDING_FEATURES", "FINDING_INPUT_COLS", "KEYS", "MODEL_FEATURES", "PIPELINE_FEATURES", "event_features",
           "line_features", "pipeline_features",
           "finding_features", "window_features", "window_ns"]
