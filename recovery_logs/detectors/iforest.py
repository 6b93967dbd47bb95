"""Isolation-forest anomaly model over window features (training, skops persistence).

``WindowIsolationForest`` is a scikit-learn style estimator (``__init__`` stores params, ``fit``
returns self and sets ``name_`` attributes). **Score direction**: ``score_samples`` returns the
anomaly score of Liu et al. (2008), ``s = 2^(-E[h(x)]/c(n))`` in (0, 1] — *higher means more
anomalous*; it is the negation of scikit-learn's ``IsolationForest.score_samples``. A window is
anomalous when ``s >= threshold_``, the ``1 - contamination`` quantile of the training scores.

``AnomalyDetector`` (in ``detectors.anomaly``, re-exported here) scores complete windows of
``recovery_logs.detectors.features.pipeline_features`` (findings + the windows frame's line counts) up to
the watermark and emits category
``anomaly`` findings, action ``investigate`` — anomalies never drain a node on their own. By
default only windows in which no rule fired are reported (role ``cause``: they can raise an
``anomaly`` incident); with ``supporting=True`` windows that rules already explain are reported
too, as role ``info`` evidence.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from sklearn.base import BaseEstimator
from sklearn.ensemble import IsolationForest

from recovery_logs.detectors.anomaly import (
    CADENCE_FEATURES,
    COMPILED_FILE,
    COMPILED_KEY,
    DEFAULT_MODEL_NAME,
    AnomalyDetector,
    WindowScoring,
    default_models_dir,
    fill_from_sidecar,
)
from recovery_logs.detectors.forest_np import compile_forest
from recovery_logs.detectors.modelio import attach_file, load_artifact, save_artifact
from recovery_logs.errors import ModelError, TrainingDataError

log = logging.getLogger(__name__)


class WindowIsolationForest(WindowScoring, BaseEstimator):
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
        d = save_artifact(self.forest_, directory, sidecar)
        attach_file(d, COMPILED_KEY, COMPILED_FILE, compile_forest(self.forest_))   # what replays load
        return d

    @classmethod
    def load(cls, directory: str | Path) -> WindowIsolationForest:
        forest, meta = load_artifact(directory)
        if meta.get("kind") != "window_isolation_forest" or not isinstance(forest, IsolationForest):
            raise ModelError("anomaly model: the file is not a window isolation forest", path=str(directory),
                             kind=meta.get("kind"))
        params = {k: v for k, v in meta.get("params", {}).items() if k in cls().get_params()}
        return fill_from_sidecar(cls(**params), forest, meta, directory)


def compile_model_dir(directory: str | Path) -> Path:
    """Write (or refresh) the compiled ``forest.npz`` of the model in ``directory``."""
    d = Path(directory)
    attach_file(d, COMPILED_KEY, COMPILED_FILE, compile_forest(WindowIsolationForest.load(d).forest_))
    return d / COMPILED_FILE


def _json_bounds(values: list[float]) -> list[float | None]:
    """JSON has no infinity: an unbounded side is stored as null."""
    return [None if not np.isfinite(v) else float(v) for v in values]


__all__ = ["CADENCE_FEATURES", "DEFAULT_MODEL_NAME", "AnomalyDetector", "WindowIsolationForest",
           "compile_model_dir", "default_models_dir"]
