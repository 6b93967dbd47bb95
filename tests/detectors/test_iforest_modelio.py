"""Isolation-forest estimator, skops persistence (checksum, trusted types), AnomalyDetector, train."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import skops.io as sio
from polars.testing import assert_frame_equal
from sklearn.preprocessing import FunctionTransformer

from recovery_logs.cli import main as cli_main
from recovery_logs.detectors import synth
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.features import MODEL_FEATURES, finding_features, pipeline_features
from recovery_logs.detectors.iforest import AnomalyDetector, WindowIsolationForest
from recovery_logs.detectors.modelio import MODEL_FILE, SIDECAR_FILE, load_artifact, save_artifact
from recovery_logs.errors import ModelError, TrainingDataError
from recovery_logs.schema import FINDING_SCHEMA
from recovery_logs.timeutil import NS

FEATS = ["a", "b", "c"]


def frame(n=200, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"a": rng.normal(shift, 1, n), "b": rng.normal(shift, 1, n), "c": rng.uniform(0, 1, n) + shift})


@pytest.fixture(scope="module")
def fitted():
    return WindowIsolationForest(features=FEATS, n_estimators=50, contamination=0.02, random_state=0).fit(frame())


def test_fit_sets_attributes_and_score_direction(fitted):
    assert fitted.features_ == FEATS and fitted.n_train_ == 200 and fitted.constant_features_ == []
    normal = fitted.score_samples(frame(50, seed=1))
    outliers = fitted.score_samples(frame(50, seed=2, shift=8.0))
    assert 0 < normal.max() <= 1 and outliers.min() > np.median(normal)   # higher = more anomalous
    assert fitted.predict(frame(50, seed=2, shift=8.0)).all()
    assert fitted.predict(frame()).mean() == pytest.approx(0.02, abs=0.011)


def test_fit_is_reproducible_with_a_seed():
    a = WindowIsolationForest(features=FEATS, n_estimators=30, random_state=7).fit(frame())
    b = WindowIsolationForest(features=FEATS, n_estimators=30, random_state=7).fit(frame())
    np.testing.assert_array_equal(a.score_samples(frame(seed=3)), b.score_samples(frame(seed=3)))


def test_too_little_data_names_the_count_needed():
    with pytest.raises(TrainingDataError, match="too little data to train: 10 windows, need at least 64"):
        WindowIsolationForest(features=FEATS).fit(frame(10))


def test_nans_are_refused_with_the_columns():
    bad = frame().with_columns(pl.when(pl.int_range(pl.len()) < 3).then(None).otherwise(pl.col("b")).alias("b"))
    with pytest.raises(TrainingDataError) as ei:
        WindowIsolationForest(features=FEATS).fit(bad)
    assert ei.value.context["columns"] == {"b": 3}


def test_constant_features(caplog):
    const = frame().with_columns(pl.lit(1.0).alias("c"))
    m = WindowIsolationForest(features=FEATS, n_estimators=20).fit(const)
    assert m.constant_features_ == ["c"] and "constant feature" in caplog.text
    with pytest.raises(TrainingDataError, match="every feature is constant"):
        WindowIsolationForest(features=["c"]).fit(const)


def test_missing_feature_column_is_named(fitted):
    with pytest.raises(ModelError) as ei:
        fitted.score_samples(frame().drop("b"))
    assert ei.value.context["missing"] == ["b"]


def test_round_trip(tmp_path, fitted):
    fitted.save(tmp_path / "m", training={"rows": 200})
    back = WindowIsolationForest.load(tmp_path / "m")
    np.testing.assert_array_equal(back.score_samples(frame(seed=5)), fitted.score_samples(frame(seed=5)))
    assert back.threshold_ == fitted.threshold_ and back.get_params() == fitted.get_params()
    meta = json.loads((tmp_path / "m" / SIDECAR_FILE).read_text())
    assert meta["features"] == FEATS and meta["training"] == {"rows": 200}
    assert {"scikit-learn", "skops", "numpy", "polars"} <= set(meta["versions"])


def test_tampered_model_is_refused(tmp_path, fitted):
    d = fitted.save(tmp_path / "m")
    data = bytearray((d / MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(ModelError, match="checksum mismatch"):
        WindowIsolationForest.load(d)


class Payload:
    """A type nobody put on the trusted list."""

    def __init__(self) -> None:
        self.x = 1


def test_untrusted_type_is_refused_even_with_a_valid_checksum(tmp_path):
    d = save_artifact(FunctionTransformer(func=Payload), tmp_path / "evil", {"kind": "window_isolation_forest"})
    untrusted = sio.get_untrusted_types(file=d / MODEL_FILE)
    assert any(t.endswith("Payload") for t in untrusted)
    with pytest.raises(ModelError, match="outside the trusted list") as ei:
        load_artifact(d)
    assert any(t.endswith("Payload") for t in ei.value.context["untrusted"])


def test_missing_sidecar_and_wrong_kind(tmp_path, fitted):
    with pytest.raises(ModelError, match="sidecar missing"):
        WindowIsolationForest.load(tmp_path / "nothing")
    d = save_artifact(fitted.forest_, tmp_path / "k", {"kind": "something_else"})
    with pytest.raises(ModelError, match="not a window isolation forest"):
        WindowIsolationForest.load(d)


def _jobs(seed, slow=None, t0=0.0):
    hosts = [f"h{seed}{x}" for x in "abcd"]
    return synth.training_job(f"j{seed}", hosts, 2, 900, 1.0, slow=slow, seed=seed, t0=t0)


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    train = pl.concat([pipeline_features(synth.findings(_jobs(s)), pl.DataFrame()) for s in range(4)])
    m = WindowIsolationForest(features=MODEL_FEATURES, n_estimators=50, contamination=0.01, min_samples=20).fit(train)
    d = m.save(tmp_path_factory.mktemp("models") / "default")
    return AnomalyDetector.default(d.parent)


def test_anomaly_detector_flags_a_slow_host_and_never_drains(detector):
    f = synth.findings(_jobs(9, slow={"h9b": 2.0}, t0=0.0))
    out = detector.detect(f, pl.DataFrame(), DetectContext(int(f["time"].dt.epoch("ns").max())))
    assert dict(out.schema) == FINDING_SCHEMA and out.height > 0
    assert set(out["host"].to_list()) == {"h9b"}
    assert set(out["action"].to_list()) == {"investigate"} and set(out["category"].to_list()) == {"anomaly"}
    assert "step_time_rel_job" in out["message"][0] and "no rule covers it" in out["message"][0]


def test_anomaly_detector_is_quiet_on_normal_jobs_and_batch_independent(detector):
    f = synth.findings(_jobs(11) + _jobs(12, slow={"h12a": 2.0}))
    end = int(f["time"].dt.epoch("ns").max())
    final = detector.detect(f, pl.DataFrame(), DetectContext(end))
    assert set(final["host"].to_list()) == {"h12a"}
    mid = synth.T0 + 400 * NS
    early = detector.detect(f.filter(pl.col("time").dt.epoch("ns") <= mid), pl.DataFrame(), DetectContext(mid))
    assert early.height > 0
    assert_frame_equal(early, final.filter(pl.col("time").dt.epoch("ns") <= mid))


def test_anomaly_detector_refuses_models_needing_event_features(tmp_path):
    X = frame().rename({"a": "n_templates", "b": "new_templates", "c": "n_findings"})
    m = WindowIsolationForest(features=["n_templates", "new_templates", "n_findings"], n_estimators=10).fit(X)
    with pytest.raises(ModelError, match="cannot compute") as ei:
        AnomalyDetector(model=m)
    assert ei.value.context["missing"] == ["n_templates", "new_templates"]


def test_train_command_writes_a_loadable_model(tmp_path):
    feats = finding_features(synth.findings(_jobs(1) + _jobs(2)))
    feats.with_columns(pl.lit(0.0).alias("n_events"), pl.lit(0.0).alias("log_rate"), pl.lit(0.0).alias("log_rate_dev"),
                       pl.lit(0.0).alias("log_rate_z")).write_parquet(tmp_path / "f.parquet")
    rc = cli_main(["train", "--data", str(tmp_path / "f.parquet"), "--out", str(tmp_path / "m"), "--seed", "3",
                   "--contamination", "0.05", "--features", "step_time_rel_job,step_time_cv,progress_ratio",
                   "--min-samples", "10", "--n-estimators", "20"])
    assert rc == 0
    m = WindowIsolationForest.load(tmp_path / "m")
    assert m.features_ == ["step_time_rel_job", "step_time_cv", "progress_ratio"] and m.random_state == 3
    assert m.sidecar_["training"]["rows"] == feats.height
    rc = cli_main(["train", "--data", str(tmp_path / "f.parquet"), "--out", str(tmp_path / "m2"),
                   "--min-samples", str(feats.height + 1)])
    assert rc == 6 and not (tmp_path / "m2").exists()      # TrainingDataError, nothing written


def test_windows_rules_already_explain_are_left_out_unless_supporting(detector):
    rows = _jobs(9, slow={"h9b": 2.0})
    t_xid = rows[len(rows) // 2]["t"]
    xid = {"t": t_xid, "job_id": "j9", "host": "h9b", "rule_id": "xid.79", "category": "xid", "role": "cause",
           "severity": "critical", "action": "drain_node_and_requeue", "message": "Xid 79"}
    f = synth.findings(rows + [xid])
    ctx = DetectContext(int(f["time"].dt.epoch("ns").max()))
    plain = detector.detect(f, pl.DataFrame(), ctx)
    both = AnomalyDetector(model=detector.model, supporting=True).detect(f, pl.DataFrame(), ctx)
    assert set(plain["role"].to_list()) == {"cause"}
    info = both.filter(pl.col("role") == "info")
    assert info.height == 1 and "rules already flagged this window" in info["message"][0]
    assert both.height == plain.height + 1
