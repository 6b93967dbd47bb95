"""Reproduce the shipped default anomaly model (models/default) from simulator output.

    python models/train_default.py [--work /tmp/rl-train] [--out models/default]

1. simulate every scenario except the ``novel_*`` ones (kept out of training: they are the
   novel-fault test) with seeds 0 and 1 (training) and 2 (held out), default options
   (4 nodes x 8 GPUs, 2 h);
2. replay each scenario with the rule packs only and build ``features.pipeline_features``;
3. fit ``WindowIsolationForest(features=MODEL_FEATURES, contamination, random_state=0)`` on the
   training windows (``--normal-only``: only windows before each scenario's fault);
4. evaluate on seed 2: scenario-level recall (a flagged culprit window within 10 min of the
   fault), false alarms on healthy runs, and recall on injected novel faults (a disk-controller
   event storm no rule covers, ``detector_eval.inject_novel_fault``, injected into 6 held-out runs)
   and on the simulator's own ``novel_*`` scenarios (seeds 0-4) — and store those metrics in the sidecar.

Everything is seeded: the same library versions give the same forest and the same scores
(``train_scores_sha256`` in the sidecar's metrics). The skops archive's bytes (and so its
sha256) still differ between runs, because skops names its array files by object id.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl

from recovery_logs.analysis.detector_eval import (
    _before_fault,
    evaluate_novel,
    inject_novel_fault,
    training_frame,
    window_labels,
)
from recovery_logs.analysis.truth import scenario_dirs
from recovery_logs.detectors.features import MODEL_FEATURES
from recovery_logs.detectors.iforest import AnomalyDetector, WindowIsolationForest
from recovery_logs.simulate import SimOptions, scenario_names, simulate

TRAIN_SEEDS = (0, 1)
TEST_SEED = 2
NOVEL_HOSTS = ("healthy", "straggler_node", "workload_imbalance", "gpu_oom", "user_exception", "xid13_app")


def known_scenarios() -> str:
    return ",".join(n for n in scenario_names() if not n.startswith("novel"))


def novel_scenarios() -> list[str]:
    return [n for n in scenario_names() if n.startswith("novel")]


def frames(work: Path, seed: int, normal_only: bool) -> pl.DataFrame:
    sim = work / f"sim-seed{seed}"
    if not sim.exists():
        simulate(SimOptions(out=sim, scenario=known_scenarios(), seed=seed))
    cache = work / f"features-seed{seed}{'-normal' if normal_only else ''}.parquet"
    if cache.exists():
        return pl.read_parquet(cache)
    df = training_frame([sim], normal_only=normal_only)
    df.write_parquet(cache)
    return df


def held_out(model: WindowIsolationForest, test: pl.DataFrame) -> dict:
    found = n_fault = healthy_flags = healthy_windows = pre_fault_flags = pre_fault_windows = 0
    for (src,), g in test.group_by("source", maintain_order=True):
        truth = json.loads((Path(src) / "truth.json").read_text())
        pred = model.predict(g)
        if truth.get("culprit_node"):
            n_fault += 1
            found += int((window_labels(g, truth).to_numpy() & pred).any())
        if truth.get("fault_kind") == "healthy":
            healthy_flags += int(pred.sum())
            healthy_windows += g.height
        pre = _before_fault(g, truth, "60s")
        pre_fault_flags += int(model.predict(pre).sum()) if pre.height else 0
        pre_fault_windows += pre.height
    return {"scenario_recall": round(found / n_fault, 4), "fault_scenarios": n_fault,
            "healthy_false_alarm_rate": round(healthy_flags / max(1, healthy_windows), 5),
            "pre_fault_false_alarm_rate": round(pre_fault_flags / max(1, pre_fault_windows), 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl-train"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "default")
    ap.add_argument("--contamination", type=float, default=0.01)
    ap.add_argument("--normal-only", action="store_true")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    train = pl.concat([frames(a.work, s, a.normal_only) for s in TRAIN_SEEDS], how="diagonal_relaxed")
    test = frames(a.work, TEST_SEED, False)
    model = WindowIsolationForest(features=list(MODEL_FEATURES), contamination=a.contamination, random_state=0).fit(train)
    train_scores = np.round(model.score_samples(train), 10)
    metrics = {"held_out_seed": TEST_SEED, **held_out(model, test),
               "train_scores_sha256": hashlib.sha256(train_scores.tobytes()).hexdigest()}
    novel_root = a.work / "novel"
    shutil.rmtree(novel_root, ignore_errors=True)
    sims = {d.name: d for d in scenario_dirs(a.work / f"sim-seed{TEST_SEED}")}
    for i, name in enumerate(NOVEL_HOSTS):
        inject_novel_fault(sims[name], novel_root / f"novel_{name}", at_s=1800 + 600 * i, seed=i)
    model.save(a.out)
    novel = evaluate_novel([novel_root, sims["healthy"]], AnomalyDetector(model=WindowIsolationForest.load(a.out)))
    metrics.update({"novel_fault_recall": novel["recall"], "novel_fault_scenarios": len(NOVEL_HOSTS),
                    "novel_latency_s": [p["latency_s"] for p in novel["scenarios"] if p["culprit"]],
                    "novel_flagged_other_hosts": sum(p["flagged_other_hosts"] for p in novel["scenarios"])})
    sim_novel = [a.work / f"novel-sim-seed{s}" for s in range(5)]
    for s, d in zip(range(5), sim_novel, strict=True):
        if not d.exists() and novel_scenarios():
            simulate(SimOptions(out=d, scenario=",".join(novel_scenarios()), seed=s))
    if novel_scenarios():
        sn = evaluate_novel(sim_novel, AnomalyDetector(model=WindowIsolationForest.load(a.out)))
        metrics.update({"simulator_novel_scenarios": novel_scenarios(), "simulator_novel_runs": len(sn["scenarios"]),
                        "simulator_novel_recall": sn["recall"],
                        "simulator_novel_latency_s": [p["latency_s"] for p in sn["scenarios"]],
                        "simulator_novel_flagged_other_hosts": sum(p["flagged_other_hosts"] for p in sn["scenarios"])})
    training = {"simulator_seeds": list(TRAIN_SEEDS), "scenarios": known_scenarios().split(","), "nodes": 4, "gpus_per_node": 8,
                "duration_s": 7200, "rows": train.height, "normal_only": a.normal_only, "window": "60s",
                "window_start_min": str(train["window_start"].min()), "window_start_max": str(train["window_start"].max()),
                "script": "models/train_default.py"}
    model.save(a.out, training=training, metrics=metrics)
    print(json.dumps({"out": str(a.out), "threshold": model.threshold_, "training": training, "metrics": metrics},
                     indent=2, default=str))


if __name__ == "__main__":
    main()
