"""The compiled forest (numpy) scores bit-for-bit as scikit-learn; replays never import it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recovery_logs.detectors.anomaly import AnomalyDetector, CompiledWindowModel
from recovery_logs.detectors.base import DetectContext
from recovery_logs.detectors.forest_np import NumpyForest, _distinct_rows, compile_forest
from recovery_logs.detectors.iforest import WindowIsolationForest, default_models_dir
from recovery_logs.errors import ModelError


@pytest.fixture(scope="module")
def shipped():
    return WindowIsolationForest.load(default_models_dir() / "default")


def test_shipped_model_has_a_compiled_form_that_matches_it(shipped):
    comp = CompiledWindowModel.load(default_models_dir() / "default")
    assert comp is not None and comp.features_ == shipped.features_ and comp.threshold_ == shipped.threshold_
    ref = NumpyForest(compile_forest(shipped.forest_))
    rng = np.random.default_rng(0)
    lo = np.nan_to_num(np.asarray(shipped.feature_lo_), neginf=-5.0)
    hi = np.nan_to_num(np.asarray(shipped.feature_hi_), posinf=50.0)
    for scale in (0.0, 0.5, 1.0, 3.0):
        m = lo + (hi - lo) * rng.uniform(-scale, 1 + scale, size=(5000, len(lo)))   # > one 4096-row chunk
        m[::7] = np.round(m[::7])                 # integers sit on split thresholds
        want = shipped.forest_.score_samples(m)
        assert np.array_equal(comp.forest_.score_samples(m), want)
        assert np.array_equal(ref.score_samples(m), want)


@pytest.mark.parametrize("max_features", [1.0, 0.5])
def test_any_fitted_forest_compiles_to_identical_scores(max_features):
    from sklearn.ensemble import IsolationForest

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 6))
    f = IsolationForest(n_estimators=40, max_features=max_features, random_state=3).fit(x)
    probe = np.vstack([rng.normal(size=(400, 6)) * 4, x[:50]])
    assert np.array_equal(NumpyForest(compile_forest(f)).score_samples(probe), f.score_samples(probe))


def test_repeated_rows_are_scored_once_with_the_same_bits(shipped):
    """Quiet windows share a feature vector: scoring distinct rows and spreading the scores back
    gives scikit-learn's scores bit for bit, whatever the order of the repeats."""
    ref = NumpyForest(compile_forest(shipped.forest_))
    rng = np.random.default_rng(5)
    lo = np.nan_to_num(np.asarray(shipped.feature_lo_), neginf=-5.0)
    hi = np.nan_to_num(np.asarray(shipped.feature_hi_), posinf=50.0)
    base = lo + (hi - lo) * rng.uniform(size=(300, len(lo)))
    m = base[rng.integers(0, 300, size=6000)]        # 6000 rows, at most 300 distinct, shuffled
    m[::97, 0] = np.round(m[::97, 0])                # some rows distinct again, on split thresholds
    want = shipped.forest_.score_samples(m)
    got = ref.score_samples(m)
    assert np.array_equal(got, want)
    assert got.shape == (6000,)
    assert np.array_equal(ref.score_samples(m[:1]), want[:1])


def test_detector_on_the_compiled_model_equals_the_skops_model(shipped):
    from recovery_logs.api import bundled_incident, bundled_read_options
    from recovery_logs.pipeline.replay import ReplayOptions, replay

    res = replay([str(bundled_incident("xid79_nccl_cascade"))],
                 ReplayOptions(read=bundled_read_options("xid79_nccl_cascade")))
    eng = res.engine
    ctx = DetectContext(watermark_ns=eng.max_time_ns, job_states=None, config=eng.config)
    lazy = AnomalyDetector.default(lazy=True)
    assert lazy.model is None
    for det in (lazy, AnomalyDetector(model=shipped), AnomalyDetector(model=shipped, supporting=True)):
        ref = AnomalyDetector(model=shipped, supporting=det.supporting).detect(eng.findings, eng.windows, ctx)
        assert_frame_equal(det.detect(eng.findings, eng.windows, ctx), ref)
    assert isinstance(lazy.model, CompiledWindowModel)


def test_a_tampered_compiled_file_is_refused(tmp_path, shipped):
    d = shipped.save(tmp_path / "m")
    assert CompiledWindowModel.load(d) is not None
    blob = bytearray((d / "forest.npz").read_bytes())
    blob[len(blob) // 2] ^= 1
    (d / "forest.npz").write_bytes(bytes(blob))
    with pytest.raises(ModelError, match="derived file"):
        CompiledWindowModel.load(d)
    meta = json.loads((d / "model.json").read_text())
    del meta["compiled_forest"]
    (d / "model.json").write_text(json.dumps(meta))
    assert CompiledWindowModel.load(d) is None            # falls back to the skops file
    from sklearn.ensemble import IsolationForest

    fallback = AnomalyDetector.default(d.parent, name="m").model
    assert isinstance(fallback.forest_, IsolationForest)            # the skops forest, same scoring code
    probe = pl.DataFrame({f: [0.0, 1.0, 5.0] for f in shipped.features_})
    assert np.array_equal(fallback.score_samples(probe), shipped.score_samples(probe))


def test_replay_of_the_demo_never_imports_scikit_learn():
    code = ("import sys\nfrom recovery_logs.api import bundled_incident, bundled_read_options\n"
            "from recovery_logs.pipeline.replay import ReplayOptions, replay\n"
            "r = replay([str(bundled_incident('xid79_nccl_cascade'))], "
            "ReplayOptions(read=bundled_read_options('xid79_nccl_cascade')))\n"
            "assert r.incidents\n"
            "print(sorted(m for m in ('sklearn', 'scipy', 'skops', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_repeated_rows_are_scored_once_and_as_alone():
    comp = CompiledWindowModel.load(default_models_dir() / "default")
    assert comp is not None
    f = comp.forest_
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(6, f.n_features_in_))
    rows[1] = -0.0                                # 0.0 and -0.0: different bytes, equal values
    rows[2] = 0.0
    rows[3, 0] = np.nan
    m = rows[rng.integers(0, len(rows), size=300)]
    first, inverse = _distinct_rows(m.astype(np.float32))
    assert np.array_equal(m.astype(np.float32)[first][inverse], m.astype(np.float32), equal_nan=True)
    assert len(first) <= len(rows) and list(first) == sorted(first)
    alone = np.concatenate([f.score_samples(m[i:i + 1]) for i in range(len(m))])
    assert np.array_equal(f.score_samples(m).view(np.int64), alone.view(np.int64))


def test_leaves_are_each_trees_walk_nan_going_right(shipped):
    """Every (row, tree) path ends at the leaf a plain walk of that tree reaches (``x <= threshold``
    left, else right; NaN compares false and goes right), rows with NaN and ones on thresholds included."""
    f = NumpyForest(compile_forest(shipped.forest_))
    rng = np.random.default_rng(11)
    lo = np.nan_to_num(np.asarray(shipped.feature_lo_), neginf=-5.0)
    hi = np.nan_to_num(np.asarray(shipped.feature_hi_), posinf=50.0)
    x = (lo + (hi - lo) * rng.uniform(-0.5, 1.5, size=(60, len(lo)))).astype(np.float32)
    x[::5] = np.round(x[::5])
    x[::3, rng.integers(0, len(lo))] = np.nan
    leaves = f._leaves(x)
    assert leaves.shape == (60, len(f._roots))
    for r in range(x.shape[0]):
        for t, root in enumerate(f._roots):
            node = int(root)
            while f._inner[node]:
                node = int(f._left[node] if x[r, f._col[node]] <= f._threshold[node] else f._right[node])
            assert leaves[r, t] == node
