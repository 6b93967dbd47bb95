"""The fitted isolation forest as plain arrays, scored with numpy: no scikit-learn at run time.

Importing scikit-learn (with scipy and skops) costs seconds on every replay; scoring a few
thousand windows with 200 small trees costs milliseconds. ``compile_forest`` copies what
``IsolationForest.score_samples`` reads from a fitted forest — per tree the node arrays
(children, feature, threshold), the per-node decision-path length and average path length, and
the tree's feature subset — into one ``forest.npz`` beside ``model.skops`` (sha256 in the
sidecar, loaded with ``allow_pickle=False``). ``NumpyForest.score_samples`` repeats scikit-learn's
arithmetic in the same order (inputs as float32, ``x <= threshold`` goes left, per tree
``depths += path[leaf] + avg[leaf] - 1.0`` in tree order, ``2 ** -(depths / denominator)``), so
its scores are bit-for-bit those of scikit-learn (tested against it).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

__all__ = ["NumpyForest", "compile_forest"]

_KEYS = ("left", "right", "feature", "threshold", "path", "avg", "node_offset", "feat_idx", "feat_offset",
         "denominator")


def compile_forest(forest: Any) -> bytes:
    """The ``forest.npz`` bytes of a fitted ``sklearn.ensemble.IsolationForest``."""
    from sklearn.ensemble._iforest import _average_path_length  # heavy: only when compiling

    trees = forest.estimators_
    left, right, feat, thr, path, avg, noff, fidx, foff = [], [], [], [], [], [], [0], [], [0]
    for i, est in enumerate(trees):
        t = est.tree_
        left.append(t.children_left.astype(np.int64))
        right.append(t.children_right.astype(np.int64))
        feat.append(t.feature.astype(np.int64))
        thr.append(t.threshold.astype(np.float64))
        path.append(np.asarray(forest._decision_path_lengths[i], dtype=np.float64))
        avg.append(np.asarray(forest._average_path_length_per_tree[i], dtype=np.float64))
        noff.append(noff[-1] + t.node_count)
        fs = np.asarray(forest.estimators_features_[i], dtype=np.int64)
        fidx.append(fs)
        foff.append(foff[-1] + len(fs))
    denom = len(trees) * float(_average_path_length([forest._max_samples])[0])
    arrays = {"left": np.concatenate(left), "right": np.concatenate(right), "feature": np.concatenate(feat),
              "threshold": np.concatenate(thr), "path": np.concatenate(path), "avg": np.concatenate(avg),
              "node_offset": np.asarray(noff, dtype=np.int64), "feat_idx": np.concatenate(fidx),
              "feat_offset": np.asarray(foff, dtype=np.int64), "denominator": np.asarray([denom]),
              "n_features_in": np.asarray([forest.n_features_in_], dtype=np.int64),
              "subsample": np.asarray([forest._max_features != forest.n_features_in_])}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


class NumpyForest:
    """An isolation forest loaded from ``compile_forest`` bytes; ``score_samples`` as scikit-learn's."""

    def __init__(self, data: bytes) -> None:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        missing = [k for k in _KEYS if k not in a]
        if missing:
            raise ValueError(f"forest.npz lacks {missing}")
        self.n_features_in_ = int(a["n_features_in"][0])
        self._subsample = bool(a["subsample"][0])
        self._denominator = float(a["denominator"][0])
        no, fo = a["node_offset"], a["feat_offset"]
        self._trees = []
        for i in range(len(no) - 1):
            s = slice(int(no[i]), int(no[i + 1]))
            self._trees.append((a["left"][s], a["right"][s], a["feature"][s], a["threshold"][s], a["path"][s],
                                a["avg"][s], a["feat_idx"][int(fo[i]):int(fo[i + 1])]))

    @staticmethod
    def _apply(x: np.ndarray, left: np.ndarray, right: np.ndarray, feature: np.ndarray,
               threshold: np.ndarray) -> np.ndarray:
        node = np.zeros(x.shape[0], dtype=np.int64)
        rows = np.arange(x.shape[0])
        while True:
            inner = left[node] != -1
            if not inner.any():
                return node
            f = np.where(inner, feature[node], 0)
            go_left = x[rows, f] <= threshold[node]
            node = np.where(inner, np.where(go_left, left[node], right[node]), node)

    def score_samples(self, m: np.ndarray) -> np.ndarray:
        """scikit-learn's ``IsolationForest.score_samples`` (negative: lower = more anomalous)."""
        x = np.asarray(m, dtype=np.float32)
        depths = np.zeros(x.shape[0], order="f")
        for left, right, feature, threshold, path, avg, feats in self._trees:
            xs = x[:, feats] if self._subsample else x
            leaves = self._apply(xs, left, right, feature, threshold)
            depths += path[leaves] + avg[leaves] - 1.0
        d = self._denominator
        scores = 2 ** (-np.divide(depths, d, out=np.ones_like(depths), where=d != 0))
        return -scores
