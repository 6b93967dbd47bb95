"""Isolation-forest anomaly model over window features, and the ``AnomalyDetector``.

``WindowIsolationForest`` is a scikit-learn style estimator (``__init__`` stores params, ``fit``
returns self and sets ``name_`` attributes). **Score direction**: ``score_samples`` returns the
anomaly score of Liu et al. (2008), ``s = 2^(-E[h(x)]/c(n))`` in (0, 1] — *higher means more
anomalous*; it is the negation of scikit-learn's ``IsolationForest.score_samples``. A window is
anomalous when ``s >= threshold_``, the ``1 - contamination`` quantile of the training scores.

``AnomalyDetector`` (the Detector protocol) scores complete windows of
``recovery_logs.detectors.features.pipeline_features`` (findings + the windows frame's line counts) up to
the watermark and emits category
``anomaly`` findings, action ``investigate`` — anomalies never drain a node on their own. By
default only windows in which no rule fired are reported (role ``cause``: they can raise an
``anomaly`` incident); with ``supporting=True`` windows that rules already explain are reported
too, as role ``info`` evidence.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from sklearn.base import BaseEstimator
from sklearn.ensemble import IsolationForest

from recovery_logs.detectors.base import DetectContext, synthetic_findings, upto
from recovery_logs.detectors.features import PIPELINE_FEATURES, pipeline_features, window_ns
from recovery_logs.detectors.modelio import load_artifact, save_artifact
from recovery_logs.errors import ModelError, TrainingDataError
from recovery_logs.schema import empty_findings
from recovery_logs.timeutil import ns_to_iso

log = logging.getLogger(__name__)

CADENCE_FEATURES = frozenset({"progress_ratio"})
DEFAULT_MODEL_NAME = "default"


class WindowIsolationForest(BaseEstimator):
    """IsolationForest over named feature columns of a Polars frame.

    Parameters: ``features`` (column names; None = every numeric column), ``n_estimators``,
    ``max_samples``, ``contamination`` (share of training windows above the threshold),
    ``random_state``, ``min_samples`` (fewer training rows is a TrainingDataError).
    Fitted: ``features_``, ``forest_``, ``threshold_``, ``n_train_``, ``constant_features_``,
    ``feature_median_``, ``feature_scale_`` (robust spread, used to explain a score),
    ``feature_lo_`` / ``feature_hi_`` (training range widened by ``range_margin`` × max(spread / 4,
    3 × robust spread); constant features get no range and are never out of range).
    """

    def __init__(self, features: list[str] | None = None, n_estimators: int = 200, max_samples: int | str = "auto",
                 contamination: float = 0.01, random_state: int = 0, min_samples: int = 64,
                 range_margin: float = 1.0) -> None:
        self.features = features
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.contamination = contamination
        self.random_state = random_state
        self.min_samples = min_samples
        self.range_margin = range_margin

    def _matrix(self, X: pl.DataFrame, features: list[str], err: type[ModelError]) -> np.ndarray:
        missing = [c for c in features if c not in X.columns]
        if missing:
            raise err("anomaly model: feature columns missing from the input", missing=missing)
        m = X.select([pl.col(c).cast(pl.Float64, strict=False) for c in features]).to_numpy()
        bad = ~np.isfinite(m)
        if bad.any():
            cols = {features[j]: int(n) for j, n in enumerate(bad.sum(axis=0)) if n}
            raise err("anomaly model: features contain NaN, null or infinite values", columns=cols,
                      rows=int(bad.any(axis=1).sum()))
        return m

    def fit(self, X: pl.DataFrame, y: Any = None) -> WindowIsolationForest:
        if not 0.0 < float(self.contamination) < 0.5:
            raise TrainingDataError("anomaly model: contamination must be in (0, 0.5)", contamination=self.contamination)
        feats = list(self.features) if self.features else [c for c, t in X.schema.items() if t.is_numeric()]
        if not feats:
            raise TrainingDataError("anomaly model: no feature columns to train on", columns=X.columns)
        if X.height < self.min_samples:
            raise TrainingDataError(f"anomaly model: too little data to train: {X.height} windows, need at least "
                                    f"{self.min_samples}", got=X.height, needed=self.min_samples)
        m = self._matrix(X, feats, TrainingDataError)
        spread = m.max(axis=0) - m.min(axis=0)
        const = [f for f, s in zip(feats, spread, strict=True) if s == 0]
        if len(const) == len(feats):
            raise TrainingDataError("anomaly model: every feature is constant in the training data; nothing to learn",
                                    features=feats)
        if const:
            log.warning("anomaly model: %d constant feature(s) carry no information: %s", len(const), ", ".join(const))
        forest = IsolationForest(n_estimators=self.n_estimators, max_samples=self.max_samples,
                                 contamination="auto", random_state=self.random_state)
        forest.fit(m)
        scores = -forest.score_samples(m)
        self.features_ = feats
        self.forest_ = forest
        self.n_train_ = int(m.shape[0])
        self.constant_features_ = const
        self.threshold_ = float(np.quantile(scores, 1.0 - float(self.contamination)))
        med = np.median(m, axis=0)
        self.feature_median_ = med.tolist()
        mad = np.median(np.abs(m - med), axis=0) * 1.4826
        scale = np.maximum(mad, np.maximum(np.abs(med) * 0.05, 1e-3))
        self.feature_scale_ = scale.tolist()
        lo, hi = m.min(axis=0), m.max(axis=0)
        pad = self.range_margin * np.maximum((hi - lo) / 4, 3 * scale)
        varied = spread > 0
        self.feature_lo_ = np.where(varied, lo - pad, -np.inf).tolist()
        self.feature_hi_ = np.where(varied, hi + pad, np.inf).tolist()
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "forest_"):
            raise ModelError("anomaly model: not fitted")

    def score_samples(self, X: pl.DataFrame) -> np.ndarray:
        """Anomaly score per row, in (0, 1]; higher = more anomalous (see module docstring)."""
        self._check_fitted()
        if X.height == 0:
            return np.zeros(0)
        return -self.forest_.score_samples(self._matrix(X, self.features_, ModelError))

    def out_of_range(self, X: pl.DataFrame, only: Sequence[str] | None = None) -> np.ndarray:
        """Boolean per row: some feature that varied in training is outside its widened range.

        ``only`` restricts the check to those features (e.g. leave out step-time and progress
        features, whose range depends on each job's logging cadence, not on node health)."""
        self._check_fitted()
        if X.height == 0:
            return np.zeros(0, dtype=bool)
        m = self._matrix(X, self.features_, ModelError)
        out = (m < np.asarray(self.feature_lo_)) | (m > np.asarray(self.feature_hi_))
        if only is not None:
            keep = np.asarray([f in set(only) for f in self.features_], dtype=bool)
            out = out[:, keep]
        return out.any(axis=1)  # type: ignore[return-value]  # numpy: an array for 2-d input

    def predict(self, X: pl.DataFrame) -> np.ndarray:
        """Boolean per row: score >= threshold_, or out_of_range."""
        return (self.score_samples(X) >= self.threshold_) | self.out_of_range(X)

    def explain(self, row: dict[str, float], top: int = 3) -> list[tuple[str, float, float]]:
        """The features farthest from their training median: (name, value, training median);
        features outside the training range come first."""
        self._check_fitted()
        outside = [(f, float(row[f]), m) for f, m, lo, hi in
                   zip(self.features_, self.feature_median_, self.feature_lo_, self.feature_hi_, strict=True)
                   if not lo <= float(row[f]) <= hi]
        if outside:
            return outside[:top]
        dev = [(abs(float(row[f]) - m) / s, f, float(row[f]), m)
               for f, m, s in zip(self.features_, self.feature_median_, self.feature_scale_, strict=True)]
        dev.sort(key=lambda d: (-d[0], d[1]))
        return [(f, v, m) for z, f, v, m in dev[:top] if z > 0]

    # -- persistence ----------------------------------------------------------------------------
    def save(self, directory: str | Path, training: dict[str, Any] | None = None,
             metrics: dict[str, Any] | None = None) -> Path:
        self._check_fitted()
        sidecar = {"kind": "window_isolation_forest", "params": self.get_params(), "features": self.features_,
                   "threshold": self.threshold_, "n_train": self.n_train_,
                   "constant_features": self.constant_features_, "feature_median": self.feature_median_,
                   "feature_scale": self.feature_scale_, "feature_lo": _json_bounds(self.feature_lo_),
                   "feature_hi": _json_bounds(self.feature_hi_), "training": training or {}, "metrics": metrics or {},
                   "score_direction": "higher = more anomalous (Liu et al. anomaly score in (0, 1])"}
        return save_artifact(self.forest_, directory, sidecar)

    @classmethod
    def load(cls, directory: str | Path) -> WindowIsolationForest:
        forest, meta = load_artifact(directory)
        if meta.get("kind") != "window_isolation_forest" or not isinstance(forest, IsolationForest):
            raise ModelError("anomaly model: the file is not a window isolation forest", path=str(directory),
                             kind=meta.get("kind"))
        params = {k: v for k, v in meta.get("params", {}).items() if k in cls().get_params()}
        est = cls(**params)
        try:
            est.forest_ = forest
            est.features_ = list(meta["features"])
            est.threshold_ = float(meta["threshold"])
            est.n_train_ = int(meta["n_train"])
            est.constant_features_ = list(meta.get("constant_features", []))
            est.feature_median_ = [float(x) for x in meta["feature_median"]]
            est.feature_scale_ = [float(x) for x in meta["feature_scale"]]
            est.feature_lo_ = [float(x) if x is not None else -np.inf for x in meta["feature_lo"]]
            est.feature_hi_ = [float(x) if x is not None else np.inf for x in meta["feature_hi"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError("anomaly model: sidecar lacks a field the model needs", path=str(directory),
                             reason=repr(exc)) from exc
        if forest.n_features_in_ != len(est.features_):
            raise ModelError("anomaly model: sidecar features do not match the forest", path=str(directory),
                             sidecar=len(est.features_), forest=forest.n_features_in_)
        est.sidecar_ = meta
        return est


def _json_bounds(values: list[float]) -> list[float | None]:
    """JSON has no infinity: an unbounded side is stored as null."""
    return [None if not np.isfinite(v) else float(v) for v in values]


def default_models_dir() -> Path:
    """``recovery_logs/_models`` in an installed wheel, else the repository's ``models/``."""
    pkg = Path(__file__).resolve().parent.parent
    for cand in (pkg / "_models", pkg.parent / "models"):
        if cand.is_dir():
            return cand
    return pkg.parent / "models"


@dataclass
class AnomalyDetector:
    """Detector protocol over a fitted ``WindowIsolationForest`` (see module docstring)."""

    model: WindowIsolationForest
    window: str = "60s"
    model_name: str = DEFAULT_MODEL_NAME
    supporting: bool = False
    name: str = "anomaly"

    def __post_init__(self) -> None:
        self.model._check_fitted()
        missing = [f for f in self.model.features_ if f not in PIPELINE_FEATURES]
        if missing:
            raise ModelError("anomaly detector: the model needs features the pipeline cannot compute "
                             "(train it with --features from features.PIPELINE_FEATURES)", model=self.model_name,
                             missing=missing)

    @classmethod
    def default(cls, models_dir: str | Path | None = None, name: str = DEFAULT_MODEL_NAME) -> AnomalyDetector:
        d = Path(models_dir) if models_dir is not None else default_models_dir()
        return cls(model=WindowIsolationForest.load(d / name), model_name=name)

    def score_windows(self, findings: pl.DataFrame, windows: pl.DataFrame, watermark_ns: int) -> pl.DataFrame:
        """Every complete window up to the watermark with its features, ``score`` (higher = more
        anomalous), ``outside`` (a feature out of its training range) and ``flagged``."""
        wn = window_ns(self.window)
        f = upto(findings, watermark_ns)
        w = windows
        if not w.is_empty() and "window_start" in w.columns:
            w = w.filter(pl.col("window_start").dt.epoch("ns") <= watermark_ns)
        feats = pipeline_features(f, w, self.window)
        feats = feats.filter(pl.col("window_start").dt.epoch("ns") + wn <= watermark_ns)
        if feats.is_empty():
            return feats.with_columns(score=pl.lit(None, pl.Float64), outside=pl.lit(None, pl.Boolean),
                                      flagged=pl.lit(None, pl.Boolean))
        scores = self.model.score_samples(feats)
        # How often a job logs progress differs between frameworks and runs: that ratio out of its
        # training range is not evidence of a sick node (volume, fault counts and step times relative
        # to the job are).
        outside = self.model.out_of_range(
            feats, only=[f for f in self.model.features_ if f not in CADENCE_FEATURES])
        return feats.with_columns(pl.Series("score", scores), pl.Series("outside", outside)).with_columns(
            flagged=(pl.col("score") >= self.model.threshold_) | pl.col("outside"))

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        wn = window_ns(self.window)
        scored = self.score_windows(findings, windows, ctx.scored_until)   # closed windows only
        if scored.is_empty():
            return empty_findings()
        hit = scored.filter(pl.col("flagged"))
        if not self.supporting:
            hit = hit.filter(pl.col("n_findings") == 0)
        rows = []
        for r in hit.iter_rows(named=True):
            w0 = int(pl.Series([r["window_start"]]).dt.epoch("ns")[0])
            why = ", ".join(f"{n}={v:g} (usual {m:g})" for n, v, m in self.model.explain(r))
            has_cause = r["n_findings"] > 0
            msg = (f"window {ns_to_iso(w0)} +{wn // 1_000_000_000}s on {r['host']} (job {r['job_id']}) is anomalous: "
                   + (f"outside the training range (score {r['score']:.3f}, model {self.model_name}); "
                      if r["outside"] else
                      f"score {r['score']:.3f} >= threshold {self.model.threshold_:.3f} (model {self.model_name}); ")
                   + f"most unusual: {why or 'combination of features'}"
                   + ("; rules already flagged this window" if has_cause else "; no rule covers it"))
            rows.append({"time_ns": w0 + wn, "host": r["host"], "job_id": r["job_id"], "category": "anomaly",
                         "severity": "low", "role": "info" if has_cause else "cause", "action": "investigate",
                         "message": msg,
                         "detail": {"score": round(float(r["score"]), 4), "threshold": round(self.model.threshold_, 4),
                                    "outside_training_range": bool(r["outside"]),
                                    "model": self.model_name, "window_start": ns_to_iso(w0)}})
        return synthetic_findings(self.name, rows)


__all__ = ["DEFAULT_MODEL_NAME", "AnomalyDetector", "WindowIsolationForest", "default_models_dir"]
