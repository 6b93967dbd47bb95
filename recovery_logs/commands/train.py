"""``recovery-logs train``: fit the window isolation forest and write a model directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.errors import ConfigError


def train_model(data: list[Path], out: Path, seed: int = 0, contamination: float = 0.01,
                features: list[str] | None = None, window: str = "60s", n_estimators: int = 200,
                min_samples: int = 64, normal_only: bool = False) -> dict:
    """Library entry point behind the command: returns the sidecar written to ``out``."""
    import polars as pl

    from recovery_logs.analysis.detector_eval import training_frame
    from recovery_logs.detectors.features import MODEL_FEATURES, PIPELINE_FEATURES
    from recovery_logs.detectors.iforest import WindowIsolationForest

    feats = list(features) if features else list(MODEL_FEATURES)
    unknown = [f for f in feats if f not in PIPELINE_FEATURES]
    if unknown:
        raise ConfigError("train: unknown feature names", unknown=unknown, known=PIPELINE_FEATURES)
    X = training_frame(list(data), window, normal_only=normal_only)
    model = WindowIsolationForest(features=feats, n_estimators=n_estimators, contamination=contamination,
                                  random_state=seed, min_samples=min_samples).fit(X)
    scores = model.score_samples(X)
    flagged = X.with_columns(pl.Series("score", scores)).filter(pl.col("score") >= model.threshold_)
    ws = X["window_start"]
    training = {
        "data": [str(p) for p in data], "window": window, "seed": seed, "rows": X.height, "normal_only": normal_only,
        "sources": X["source"].n_unique() if "source" in X.columns else None,
        "window_start_min": str(ws.min()), "window_start_max": str(ws.max()),
    }
    metrics = {"train_flagged_windows": flagged.height, "train_flagged_share": round(flagged.height / X.height, 5)}
    model.save(out, training=training, metrics=metrics)
    return json.loads((out / "model.json").read_text())


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        data: Annotated[list[Path], typer.Option("--data", help="simulator output dir(s), log dir(s), or Parquet "
                                                 "(feature frames or findings); repeatable")],
        out: Annotated[Path, typer.Option("--out", help="model directory to write, e.g. models/NAME")],
        seed: Annotated[int, typer.Option("--seed", help="random_state of the forest")] = 0,
        contamination: Annotated[float, typer.Option("--contamination",
                                                     help="share of training windows above the threshold")] = 0.01,
        features: Annotated[str, typer.Option("--features", help="comma-separated feature names "
                                              "(default: the scale-free MODEL_FEATURES)")] = "",
        window: Annotated[str, typer.Option("--window", help="window width")] = "60s",
        n_estimators: Annotated[int, typer.Option("--n-estimators", help="trees in the isolation forest")] = 200,
        min_samples: Annotated[int, typer.Option("--min-samples", help="fewer training windows is an error")] = 64,
        normal_only: Annotated[bool, typer.Option("--normal-only", help="only windows before each scenario's "
                                                  "fault (truth.json): a novelty detector")] = False,
    ) -> None:
        """Train the anomaly model (IsolationForest over window features); skops + JSON sidecar."""
        feats = [f.strip() for f in features.split(",") if f.strip()] or None
        meta = train_model(data, out, seed, contamination, feats, window, n_estimators, min_samples, normal_only)
        typer.echo(f"wrote {out}: {meta['training']['rows']} windows, {len(meta['features'])} features, "
                   f"threshold {meta['threshold']:.4f}, sha256 {meta['sha256'][:12]}")
