"""Detectors against real simulator logs (small runs), the shipped default model, novel faults."""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.analysis.detector_eval import (
    evaluate_detectors,
    evaluate_novel,
    inject_novel_fault,
    replay_rules,
    training_frame,
)
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.features import MODEL_FEATURES, PIPELINE_FEATURES
from recovery_logs.detectors.iforest import AnomalyDetector, WindowIsolationForest, default_models_dir
from recovery_logs.simulate import SimOptions, simulate

SCENARIOS = "silent_hang,straggler_node,workload_imbalance,healthy"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    simulate(SimOptions(out=root, scenario=SCENARIOS, seed=3, nodes=4, gpus_per_node=4, duration_s=1800))
    return root


def test_hang_and_straggler_detectors_on_simulator_output(sim):
    r = evaluate_detectors(sim)
    hang, strag = r["summary"]["hang"], r["summary"]["straggler"]
    assert (hang["tp"], hang["fp"], hang["fn"], hang["culprit_accuracy"]) == (1, 0, 0, 1.0)
    assert 500 < hang["mean_lead_over_watchdog_s"] < 600 and 0 < hang["mean_latency_s"] <= 70
    assert (strag["tp"], strag["fp"], strag["fn"], strag["culprit_accuracy"]) == (1, 0, 0, 1.0)
    by = {s["scenario"]: s for s in r["scenarios"]}
    assert by["workload_imbalance"]["straggler_drains"] == [] and by["workload_imbalance"]["straggler_imbalance"] == 1
    assert by["healthy"]["hang_findings"] == 0 and by["healthy"]["straggler_imbalance"] == 0


def test_shipped_model_loads_and_catches_a_novel_fault(sim, tmp_path):
    det = AnomalyDetector.default()
    assert (default_models_dir() / "default" / "model.json").is_file()
    assert det.model.features_ == MODEL_FEATURES
    truth = inject_novel_fault(sim / "healthy", tmp_path / "novel" / "novel_healthy", at_s=900, seed=1)
    r = replay_rules(tmp_path / "novel" / "novel_healthy")
    assert r.findings.filter(pl.col("message").str.contains("megaraid_sas|Sense Key|Add. Sense")).is_empty()   # no rule covers it
    out = evaluate_novel([tmp_path / "novel", sim / "healthy"], det)
    novel, healthy = (next(s for s in out["scenarios"] if s["scenario"] == n) for n in ("novel_healthy", "healthy"))
    assert novel["detected"] and novel["culprit"] == truth["culprit_node"] and novel["latency_s"] <= 120
    assert healthy["flagged"] == 0 and out["false_alarm_rate_healthy_windows"] == 0.0
    flagged = det.detect(r.findings, r.windows, DetectContext(r.watermark_ns))
    assert set(flagged.filter(pl.col("role") == "cause")["host"].to_list()) == {truth["culprit_node"]}
    assert set(flagged["action"].to_list()) == {"investigate"}


def test_training_frame_from_a_simulator_dir(sim):
    X = training_frame([sim / "healthy"], normal_only=True)
    assert set(PIPELINE_FEATURES) <= set(X.columns) and X.height > 50
    m = WindowIsolationForest(features=MODEL_FEATURES, n_estimators=20, min_samples=20).fit(X)
    assert m.n_train_ == X.height
