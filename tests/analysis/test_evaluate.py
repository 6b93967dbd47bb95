"""The evaluation harness: pure scoring, bad truth files, the CLI, and the engine end to end
against the issue's targets on a small seed set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery_logs.analysis.evaluate import EvalOptions, evaluate_engine, score
from recovery_logs.cli import main
from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.detectors.rules import explain
from recovery_logs.errors import ConfigError, InputError
from recovery_logs.simulate import SimOptions, scenario_names, simulate

TRUTH = {"scenario": "x", "fault_kind": "xid79_cascade", "category": "xid", "culprit_node": "n2", "culprit_gpu": 3,
         "node_fault": True, "fault_time": "2026-11-29T14:06:00.000000000Z",
         "decisive_time": "2026-11-29T14:06:01.000000000Z", "acceptable_actions": ["drain_node", "requeue_job"],
         "never_drain": ["n1", "n3"], "job_id": "7", "nodes": ["n1", "n2", "n3"], "expect_incident": True}
QUIET = {**TRUTH, "fault_kind": "healthy", "category": None, "culprit_node": None, "culprit_gpu": None,
         "node_fault": False, "fault_time": None, "decisive_time": None, "acceptable_actions": ["none"],
         "never_drain": ["n1", "n2", "n3"], "expect_incident": False}


def inc(category: str, node: str | None, actions=(), candidates=(), detected="2026-11-29T14:06:03.500000000Z",
        gpu=None) -> dict:
    return {"category": category, "node": node, "gpu": gpu, "xid": None, "cause": "c", "detected_at": detected,
            "actions": [{"kind": k, "target": t} for k, t in actions],
            "candidates": [{"node": n} for n in candidates]}


def test_score_a_correct_hardware_detection() -> None:
    m = score(TRUTH, [inc("xid", "n2", [("drain_node", "n2"), ("requeue_job", "7")], ["n2", "n1"], gpu=3)])
    assert (m["top1"], m["top3"], m["category_ok"], m["actions_ok"], m["gpu_ok"]) == (True, True, True, True, True)
    assert m["innocent_drains"] == 0 and m["disruptive"] == 0 and m["node_level"] and m["hardware"] is True
    assert m["latency_s"] == pytest.approx(3.5) and m["decisive_latency_s"] == pytest.approx(2.5)


def test_score_wrong_culprit_counts_the_innocent_drain_and_top3() -> None:
    incs = [inc("nccl_timeout_hang", "n1", [("drain_node", "n1")], ["n1", "n3", "n2"]), inc("xid", "n2")]
    m = score(TRUTH, incs)
    assert m["top1"] is False and m["top3"] is True and m["category_ok"] is False
    assert m["actions_ok"] is True          # drain_node is an acceptable kind, the target is what is wrong
    assert m["innocent_drains"] == 1
    assert m["latency_s"] == pytest.approx(3.5)     # from the first incident that names the fault


def test_score_missed_fault_and_unacceptable_action() -> None:
    m = score(TRUTH, [])
    assert (m["top1"], m["top3"], m["category_ok"], m["actions_ok"], m["latency_s"]) == (False, False, False, False, None)
    m = score(TRUTH, [inc("xid", "n2", [("cancel_job", "7")])])
    assert m["top1"] and m["actions_ok"] is False


def test_score_truth_without_node_fault_infers_it_from_never_drain() -> None:
    user_bug = {k: v for k, v in TRUTH.items() if k != "node_fault"}
    user_bug.update(category="oom_gpu", never_drain=["n1", "n2", "n3"], acceptable_actions=["none"])
    m = score(user_bug, [inc("oom_gpu", "n2", [("drain_node", "n2")])])
    assert m["node_level"] is False and m["top1"] is True
    assert m["innocent_drains"] == 1 and m["actions_ok"] is False
    assert score({k: v for k, v in TRUTH.items() if k != "node_fault"}, [])["node_level"] is True


def test_score_hang_lead_over_the_watchdog() -> None:
    hang = {**TRUTH, "category": "nccl_timeout_hang", "decisive_time": "2026-11-29T14:16:00.000000000Z"}
    m = score(hang, [inc("nccl_timeout_hang", None, detected="2026-11-29T14:07:30.000000000Z")])
    assert m["top1"] is False and m["category_ok"] is True
    assert m["latency_s"] == pytest.approx(90.0) and m["watchdog_lead_s"] == pytest.approx(510.0)


def test_score_quiet_run() -> None:
    m = score(QUIET, [])
    assert m["top1"] is None and m["category_ok"] is None and m["disruptive"] == 0 and m["actions_ok"]
    m = score(QUIET, [inc("anomaly", "n1", [("investigate", "n1")]), inc("xid", "n3", [("requeue_job", "7"),
                                                                                      ("drain_node", "n3")])])
    assert m["disruptive"] == 2 and m["innocent_drains"] == 1 and m["actions_ok"] is False


def _fake_tree(root: Path) -> None:
    for name, truth in (("good", TRUTH), ("quiet", QUIET)):
        d = root / name / "nodes" / "n1"
        d.mkdir(parents=True)
        (d / "kern.log").write_text("Nov 29 14:06:00 n1 kernel: [1.0] hello\n")
        (root / name / "truth.json").write_text(json.dumps({**truth, "scenario": name}))
    (root / "missing" / "nodes" / "n1").mkdir(parents=True)
    (root / "missing" / "nodes" / "n1" / "kern.log").write_text("x\n")
    (root / "corrupt" / "nodes" / "n1").mkdir(parents=True)
    (root / "corrupt" / "nodes" / "n1" / "kern.log").write_text("x\n")
    (root / "corrupt" / "truth.json").write_text("{not json")
    (root / "partial").mkdir()
    (root / "partial" / "truth.json").write_text(json.dumps({"scenario": "partial"}))


def test_evaluate_names_bad_truth_files_and_scores_the_rest(tmp_path: Path) -> None:
    _fake_tree(tmp_path)
    seen = []

    def fake_replay(paths, truth):
        seen.append(truth["scenario"])
        if truth["scenario"] == "good":
            return [inc("xid", "n2", [("drain_node", "n2")])], {"lines": 10, "events": 10}
        return [], {"lines": 5, "events": 5}

    rep = evaluate_engine(tmp_path, EvalOptions(replay=fake_replay))
    by = {s.path.rsplit("/", 1)[-1]: s for s in rep.scores}
    assert sorted(seen) == ["good", "quiet"]
    assert "truth.json is missing" in by["missing"].error and str(tmp_path / "missing" / "truth.json") in by["missing"].error
    assert "not JSON" in by["corrupt"].error and str(tmp_path / "corrupt" / "truth.json") in by["corrupt"].error
    assert "lacks required keys" in by["partial"].error
    assert by["good"].metrics["top1"] is True and by["quiet"].metrics["disruptive"] == 0
    assert rep.totals["errors"] == 3 and rep.totals["top1"] == 1.0 and rep.totals["lines"] == 15
    assert rep.totals["per_category"] == {"xid": {"true": 1, "predicted": 1, "precision": 1.0, "recall": 1.0}}
    assert rep.missed == ["3 scenario(s) could not be scored > 0"]
    assert evaluate_engine(tmp_path, EvalOptions(replay=fake_replay, max_errors=3)).ok


def test_evaluate_floors(tmp_path: Path) -> None:
    _fake_tree(tmp_path)

    def wrong(paths, truth):
        return [inc("pcie", "n1", [("drain_node", "n1")])], {"lines": 1}

    rep = evaluate_engine(tmp_path, EvalOptions(replay=wrong, max_errors=3, min_top1=0.5, min_category=0.5))
    assert rep.missed == ["top1 0.000 < 0.500", "category 0.000 < 0.500", "innocent drains 2 > 0",
                          "1 run(s) expecting no incident got drain/requeue/cancel/reset proposals"]


def test_evaluate_bad_options_and_dirs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown input"):
        evaluate_engine(tmp_path, EvalOptions(input="csv"))
    with pytest.raises(ConfigError, match="fraction"):
        evaluate_engine(tmp_path, EvalOptions(min_top1=1.5))
    with pytest.raises(InputError, match="does not exist"):
        evaluate_engine(tmp_path / "nope")
    with pytest.raises(InputError, match="no scenario directories"):
        evaluate_engine(tmp_path)


# ---- end to end: simulator -> replay -> score, the targets --------------------------------

SEEDS = (0, 1)
# Scenarios the engine currently gets wrong, with why (reported to the lead). xfail(strict=True):
# when detection is fixed the test XPASSes and fails, so this list must shrink, never rot.
KNOWN_MISSES: dict[str, str] = {}   # scenario -> why the engine misses it (strict xfail)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    reports = {}
    for seed in SEEDS:
        out = tmp_path_factory.mktemp(f"eval{seed}")
        simulate(SimOptions(out=out, scenario="all", seed=seed, nodes=3, gpus_per_node=2, duration_s=960.0))
        reports[seed] = {s.name: s for s in evaluate_engine(out, EvalOptions()).scores}
    return reports


def _case(name: str, seed: int):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[name])] if name in KNOWN_MISSES else []
    return pytest.param(name, seed, marks=marks, id=f"{name}-s{seed}")


# Wording variants of real software (simulate/dialect.py) that the shipped rules do not read yet:
# variant -> (a line in that wording, why). A run that drew the variant may miss while no rule wins
# that line; once a rule does, the run is held to the targets like every other (nothing to remove).
RULE_GAPS: dict[tuple[str, object], tuple[str, str]] = {
    ("nccl_transport", "socket"): (
        "gpu-n01:1200298:1200658 [6] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to recv from "
        "10.128.0.4<47793> failed : Connection reset by peer",
        "no rule reads NCCL NET/Socket 'socketProgressOpt: Call to recv from IP<port> failed' (the peer it names "
        "is the culprit); the rule comes with issue 13's real-log rules"),
}


@pytest.fixture(scope="module")
def open_gaps():
    pack = load_packs()
    return {k: why for k, (line, why) in RULE_GAPS.items() if explain(line, pack)["winner"] is None}


@pytest.mark.parametrize(("name", "seed"), [_case(n, s) for n in scenario_names() for s in SEEDS])
def test_engine_meets_the_targets(e2e, open_gaps, name: str, seed: int) -> None:
    s = e2e[seed][name]
    assert s.error is None, s.error
    drawn = (s.truth.get("wording_variants") or {}).items()
    gaps = [why for k, why in open_gaps.items() if k in drawn]
    try:
        _meets_the_targets(s)
    except AssertionError:
        if gaps:
            pytest.xfail("; ".join(gaps))
        raise


def _meets_the_targets(s) -> None:
    m, t = s.metrics, s.truth
    assert m["innocent_drains"] == 0, m["top"]
    if not t["expect_incident"]:
        assert m["disruptive"] == 0, f"quiet run got disruptive proposals: {m['top']}"
        return
    assert m["category_ok"], f"category: want {t['category']}, got {m['top']}"
    if t.get("node_fault"):
        assert m["top1"], f"culprit: want {t['culprit_node']}, got {m['top']}"
    assert m["actions_ok"], f"actions: want {t['acceptable_actions']}, got {m['top']}"
    if m["hardware"]:
        assert m["decisive_latency_s"] is not None and m["decisive_latency_s"] <= 5.0, m["decisive_latency_s"]


def test_cli_eval_json_and_exit_codes(tmp_path: Path, capsys) -> None:
    simulate(SimOptions(out=tmp_path, scenario="healthy,xid79_cascade", seed=0, nodes=3, gpus_per_node=2,
                        duration_s=1200.0))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "truth.json").write_text("[")
    rc = main(["eval", str(tmp_path), "--json", "--max-errors", "1"])
    out = json.loads(capsys.readouterr().out)
    assert {s["scenario"] for s in out["scenarios"]} == {"healthy", "xid79_cascade", "broken"}
    assert out["totals"]["errors"] == 1
    assert rc == (0 if out["ok"] else 1)
    assert main(["eval", str(tmp_path), "--json"]) == 1          # the broken truth.json misses max-errors 0
    assert "broken" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--input", "csv"]) == 2
    assert main(["eval", str(tmp_path / "absent")]) == 4


def test_scenario_inputs_choose_text_or_victorialogs(tmp_path: Path) -> None:
    from recovery_logs.analysis.evaluate import scenario_inputs

    d = tmp_path / "s"
    (d / "job-7").mkdir(parents=True)
    (d / "vl.jsonl").write_text("{}\n")
    assert scenario_inputs(d, "auto") == [d / "vl.jsonl"]
    with pytest.raises(InputError, match="no text logs"):
        scenario_inputs(d, "text")
    (d / "job-7" / "n1.out").write_text("x\n")
    assert scenario_inputs(d, "auto") == [d / "job-7" / "n1.out"]
    assert scenario_inputs(d, "vl") == [d / "vl.jsonl"]
    (d / "vl.jsonl").unlink()
    with pytest.raises(InputError, match="no vl.jsonl"):
        scenario_inputs(d, "vl")
