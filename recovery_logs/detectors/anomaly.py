"""The anomaly detector over window features, without scikit-learn at run time.

``AnomalyDetector`` (the Detector protocol) scores complete windows of
``recovery_logs.detectors.features.pipeline_features`` (findings + the windows frame's line counts) up to
the watermark and emits category ``anomaly`` findings, action ``investigate`` — anomalies never
drain a node on their own. By default only windows in which no rule fired are reported (role
``cause``: they can raise an ``anomaly`` incident); with ``supporting=True`` windows that rules
already explain are reported too, as role ``info`` evidence.

The model is the fitted ``iforest.WindowIsolationForest``. ``AnomalyDetector.default()`` loads its
compiled form (``forest.npz``, scored with numpy by ``forest_np.NumpyForest``, bit-for-bit the
same scores) when the model directory has one, so a replay never imports scikit-learn, scipy or
skops (seconds of start-up); a directory without it falls back to the skops file. Either way the
model is loaded on the first window that needs scoring, not when the engine is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recovery_logs.detectors.base import DetectContext, synthetic_findings, upto
from recovery_logs.detectors.features import (
    FINDING_INPUT_COLS,
    PIPELINE_FEATURES,
    pipeline_features,
    window_ns,
)
from recovery_logs.detectors.forest_np import NumpyForest
from recovery_logs.detectors.modelio import load_artifact, read_attached, read_sidecar
from recovery_logs.detectors.progress import progress_of
from recovery_logs.errors import ModelError
from recovery_logs.schema import empty_findings
from recovery_logs.timeutil import ns_to_iso

__all__ = ["CADENCE_FEATURES", "COMPILED_KEY", "DEFAULT_MODEL_NAME", "AnomalyDetector", "CompiledWindowModel",
           "WindowScoring", "default_models_dir", "load_model"]

CADENCE_FEATURES = frozenset({"progress_ratio"})
DEFAULT_MODEL_NAME = "default"
COMPILED_KEY = "compiled_forest"      # sidecar entry of forest.npz
COMPILED_FILE = "forest.npz"


class WindowScoring:
    """Scoring over named feature columns, shared by the estimator and its compiled form.

    Needs ``forest_`` (``score_samples`` as scikit-learn's, negative), ``features_``,
    ``threshold_``, ``feature_median_``, ``feature_scale_``, ``feature_lo_``, ``feature_hi_``."""

    forest_: Any
    features_: list[str]
    threshold_: float
    n_train_: int
    constant_features_: list[str]
    feature_median_: list[float]
    feature_scale_: list[float]
    feature_lo_: list[float]
    feature_hi_: list[float]

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
            return np.zeros(0, dtype=np.bool_)
        m = self._matrix(X, self.features_, ModelError)
        out = (m < np.asarray(self.feature_lo_)) | (m > np.asarray(self.feature_hi_))
        if only is not None:
            keep = np.asarray([f in set(only) for f in self.features_], dtype=np.bool_)
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



def fill_from_sidecar(est: Any, forest: Any, meta: dict[str, Any], directory: str | Path) -> Any:
    """Set the fitted attributes of ``est`` from a model sidecar (shared by both loaders)."""
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


class CompiledWindowModel(WindowScoring):
    """A fitted ``WindowIsolationForest`` for scoring only: its compiled ``forest.npz`` (no
    scikit-learn), or, where a model directory has none, its skops forest."""

    @classmethod
    def load(cls, directory: str | Path) -> CompiledWindowModel | None:
        """The compiled model of ``directory``, or None when it has none (checksums verified)."""
        meta = read_sidecar(directory)
        if meta.get("kind") != "window_isolation_forest":
            raise ModelError("anomaly model: the file is not a window isolation forest", path=str(directory),
                             kind=meta.get("kind"))
        data = read_attached(directory, COMPILED_KEY, meta)
        if data is None:
            return None
        try:
            forest = NumpyForest(data)
        except (ValueError, OSError, KeyError) as exc:
            raise ModelError("anomaly model: forest.npz is not a compiled forest", path=str(directory),
                             reason=str(exc)) from exc
        return fill_from_sidecar(cls(), forest, meta, directory)


def load_model(directory: str | Path) -> Any:
    """The compiled model when the directory has one, else the same scoring over the skops forest
    (``modelio.load_artifact``: checksum and trusted types first; imports scikit-learn)."""
    m = CompiledWindowModel.load(directory)
    if m is not None:
        return m
    forest, meta = load_artifact(directory)
    if meta.get("kind") != "window_isolation_forest" or type(forest).__name__ != "IsolationForest":
        raise ModelError("anomaly model: the file is not a window isolation forest", path=str(directory),
                         kind=meta.get("kind"))
    return fill_from_sidecar(CompiledWindowModel(), forest, meta, directory)


def default_models_dir() -> Path:
    """``recovery_logs/_models`` in an installed wheel, else the repository's ``models/``."""
    pkg = Path(__file__).resolve().parent.parent
    for cand in (pkg / "_models", pkg.parent / "models"):
        if cand.is_dir():
            return cand
    return pkg.parent / "models"


_LIST_DTYPES = {"float64": pl.Float64, "bool": pl.Boolean}


def _series(name: str, values: Any) -> pl.Series:
    """A numpy array as a Series. Polars reads an array's null mask through ``numpy.ma``, a ~20 ms
    import on a replay's first scoring; a short array (a small replay's few windows) goes through a
    list instead (the same values: float64 and bool round-trip exactly)."""
    if len(values) <= 65_536 and values.dtype.name in _LIST_DTYPES:
        return pl.Series(name, values.tolist(), dtype=_LIST_DTYPES[values.dtype.name])
    return pl.Series(name, values)


@dataclass
class AnomalyDetector:
    """Detector protocol over a fitted ``WindowIsolationForest`` or its compiled form (see module
    docstring). ``model`` may be None with ``model_dir`` set: it is loaded on first use."""

    model: Any = None
    window: str = "60s"
    model_name: str = DEFAULT_MODEL_NAME
    supporting: bool = False
    name: str = "anomaly"
    model_dir: Path | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.model is None:
            if self.model_dir is None:
                raise ModelError("anomaly detector: needs a model or a model directory")
            return
        self._check_model()

    def _check_model(self) -> None:
        self.model._check_fitted()
        missing = [f for f in self.model.features_ if f not in PIPELINE_FEATURES]
        if missing:
            raise ModelError("anomaly detector: the model needs features the pipeline cannot compute "
                             "(train it with --features from features.PIPELINE_FEATURES)", model=self.model_name,
                             missing=missing)

    @classmethod
    def default(cls, models_dir: str | Path | None = None, name: str = DEFAULT_MODEL_NAME,
                lazy: bool = False) -> AnomalyDetector:
        """The shipped (or ``models_dir``'s) model ``name``; ``lazy``: load it on first use."""
        d = (Path(models_dir) if models_dir is not None else default_models_dir()) / name
        if lazy:
            return cls(model=None, model_name=name, model_dir=d)
        return cls(model=load_model(d), model_name=name)

    def loaded(self) -> Any:
        """The model, loaded now if it was not yet."""
        if self.model is None:
            self.model = load_model(self.model_dir)   # type: ignore[arg-type]
            self._check_model()
        return self.model

    def score_windows(self, findings: pl.DataFrame, windows: pl.DataFrame, watermark_ns: int,
                      only_unexplained: bool = False, observed: pl.DataFrame | None = None) -> pl.DataFrame:
        """Every complete window up to the watermark with its features, ``score`` (higher = more
        anomalous), ``outside`` (a feature out of its training range) and ``flagged``.
        ``only_unexplained``: only windows in which no rule fired (what ``detect`` can report by
        default; each window is scored on its own, so the scores are the same). ``observed``: the progress
        observations (``detectors.progress.observations``) read instead of the frame's progress rows."""
        wn = window_ns(self.window)
        f = upto(findings.select(FINDING_INPUT_COLS), watermark_ns)    # only what the features read
        w = windows
        if not w.is_empty() and "window_start" in w.columns:
            w = w.filter(pl.col("window_start").dt.epoch("ns") <= watermark_ns)
        prog = None if observed is None else upto(observed, watermark_ns)
        feats = pipeline_features(f, w, self.window, observed=prog)
        feats = feats.filter(pl.col("window_start").dt.epoch("ns") + wn <= watermark_ns)
        if only_unexplained:
            feats = feats.filter(pl.col("n_findings") == 0)
        if feats.is_empty():
            return feats.with_columns(score=pl.lit(None, pl.Float64), outside=pl.lit(None, pl.Boolean),
                                      flagged=pl.lit(None, pl.Boolean))
        model = self.loaded()
        scores = model.score_samples(feats)
        # How often a job logs progress differs between frameworks and runs: that ratio out of its
        # training range is not evidence of a sick node (volume, fault counts and step times relative
        # to the job are).
        outside = model.out_of_range(feats, only=[f for f in model.features_ if f not in CADENCE_FEATURES])
        return feats.with_columns(_series("score", scores), _series("outside", outside)).with_columns(
            flagged=(pl.col("score") >= model.threshold_) | pl.col("outside"))

    def detect(self, findings: pl.DataFrame, windows: pl.DataFrame, ctx: DetectContext) -> pl.DataFrame:
        wn = window_ns(self.window)
        # closed windows only; by default only windows no rule explains can be reported: only those are scored
        scored = self.score_windows(findings, windows, ctx.scored_until, only_unexplained=not self.supporting,
                                    observed=progress_of(findings, ctx))
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
