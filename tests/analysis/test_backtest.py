"""Backtest: exact counts on literal histories; bundled incidents + a small simulated history; CLI."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.analysis.backtest import BacktestOptions, Case, backtest, grade_against_truth, load_cases
from recovery_logs.errors import ConfigError, InputError
from recovery_logs.remediation.gate import PromotionGate
from recovery_logs.remediation.policy import PolicyConfig
from recovery_logs.timeutil import ns_to_iso

T0 = 1_795_960_800 * 10**9
S = 10**9


def inc(iid: str, t_s: float, node: str, job: str, xid: int = 79, kinds=("drain_node", "requeue_job")) -> dict:
    t = ns_to_iso(T0 + int(t_s * S))
    acts = [{"kind": k, "target": node if k == "drain_node" else job, "decision": "record_only", "reason": "r"}
            for k in kinds]
    return {"id": iid, "category": "xid", "node": node, "job_id": job, "xid": xid, "rule_ids": [f"xid.{xid}"],
            "first_seen": t, "detected_at": t, "evidence": [], "actions": acts}


def case(name: str, *incs: dict, truth: dict | None = None) -> Case:
    return Case(name, (Path(name),), truth, tuple(incs), None, frozenset({"n1", "n2", "n3", "n4"}))


def policy(**kw) -> PolicyConfig:
    base = {"mode": "monitor", "cooldown_s": 0.0, "budget_per_hour": 100, "budget_per_incident": 10,
            "breaker_max_drain_fraction": 1.0, "breaker_window_s": 3600.0, "cluster_nodes": 4}
    return PolicyConfig(**{**base, **kw})


def test_budget_of_two_per_hour_denies_exactly_the_second_incident():
    cases = [case("a", inc("A", 0, "n1", "j1")), case("b", inc("B", 600, "n2", "j2")),
             case("c", inc("C", 3700, "n1", "j3"))]
    r = backtest(cases, policy(budget_per_hour=2))
    s = r.summary()
    assert (s["proposals"], s["executed"], s["denied_budget"], s["denied_breaker"]) == (6, 4, 2, 0)
    assert r.decisions.filter(pl.col("outcome") == "budget")["incident_id"].to_list() == ["B", "B"]
    assert s["max_concurrent_drains"] == 1            # n1 twice, n2 never ran
    # no truth: A's drain is right because n1 failed again (incident C); the rest is unknown
    assert dict(zip(r.decisions["incident_id"] + "/" + r.decisions["kind"], r.decisions["grade"], strict=True)) == {
        "A/drain_node": "right", "A/requeue_job": "unknown", "B/drain_node": "unknown",
        "B/requeue_job": "unknown", "C/drain_node": "unknown", "C/requeue_job": "unknown"}
    per_rule = r.per_rule()
    assert per_rule.select("root_rule", "proposals", "executed", "budget").rows() == [("xid.79", 6, 4, 2)]
    per_action = r.per_action()
    assert per_action.select("kind", "executed", "budget", "max_concurrent_drains").rows() == [
        ("drain_node", 2, 1, 1), ("requeue_job", 2, 1, 0)]


def test_the_policy_mode_is_overridden_to_autonomous_but_monitor_can_be_asked_for():
    cases = [case("a", inc("A", 0, "n1", "j1"))]
    assert backtest(cases, policy()).summary()["executed"] == 2
    mon = backtest(cases, policy(), BacktestOptions(mode="monitor")).summary()
    assert (mon["executed"], mon["record_only"]) == (0, 0)
    assert backtest(cases, policy()).policy.mode == "autonomous"


def test_breaker_trips_once_and_holds_later_drains():
    cases = [case(f"c{i}", inc(f"I{i}", 10 * i, f"n{i + 1}", f"j{i}", kinds=("drain_node",))) for i in range(4)]
    r = backtest(cases, policy(breaker_max_drain_fraction=0.5))
    s = r.summary()
    assert (s["drains_executed"], s["denied_breaker"], s["breaker_trips"], s["max_concurrent_drains"]) == (2, 2, 1, 2)
    assert r.decisions["breaker_trip"].to_list() == [False, False, True, False]


def test_cooldown_denies_a_second_action_on_the_same_node():
    cases = [case("a", inc("A", 0, "n1", "j1", kinds=("drain_node",))),
             case("b", inc("B", 100, "n1", "j2", kinds=("drain_node",)))]
    s = backtest(cases, policy(cooldown_s=900.0)).summary()
    assert (s["executed"], s["denied_cooldown"]) == (1, 1)


def test_promotion_gate_holds_a_rule_until_it_has_earned_precision():
    cases = [case("a", inc("A", 0, "n1", "j1")), case("b", inc("B", 100, "n1", "j2"))]
    r = backtest(cases, policy(), BacktestOptions(gate=PromotionGate(0.5, 1)))
    s = r.summary()
    assert (s["gate_held"], s["executed"]) == (2, 2)
    assert r.decisions.filter(pl.col("decision") == "held")["incident_id"].to_list() == ["A", "A"]


def test_spacing_lays_cases_end_to_end():
    a = Case("a", (Path("a"),), None, (inc("A", 0, "n1", "j1", kinds=("drain_node",)),), T0, frozenset({"n1"}))
    b = Case("b", (Path("b"),), None, (inc("B", 0, "n2", "j2", kinds=("drain_node",)),), T0, frozenset({"n2"}))
    r = backtest([a, b], policy(budget_per_hour=1), BacktestOptions(spacing_s=7200))
    assert r.decisions["time"].dt.epoch("s").to_list() == [T0 // S, T0 // S + 7200]
    assert r.summary()["executed"] == 2         # two hours apart: the budget of one per hour holds both
    assert backtest([a, b], policy(budget_per_hour=1)).summary()["executed"] == 1
    with pytest.raises(ConfigError):
        BacktestOptions(spacing_s=0)


def test_grade_against_truth():
    truth = {"acceptable_actions": ["drain_node", "requeue_job"], "culprit_node": "n2", "never_drain": ["n1"],
             "job_id": "7", "fault_kind": "xid79"}
    assert grade_against_truth("drain_node", "n2", truth)[0] == "right"
    assert grade_against_truth("drain_node", "n1", truth) == ("wrong", "n1 must never be drained (xid79)")
    assert grade_against_truth("drain_node", "n3", truth)[0] == "wrong"
    assert grade_against_truth("requeue_job", "7", truth)[0] == "right"
    assert grade_against_truth("requeue_job", "8", truth)[0] == "wrong"
    assert grade_against_truth("cancel_job", "7", truth)[0] == "wrong"


def _policy_file(tmp_path: Path, per_hour: int) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(f'mode = "monitor"\ncooldown_s = 0\n[budget]\nper_hour = {per_hour}\nper_incident = 10\n'
                 '[breaker]\nmax_drain_fraction = 1.0\nwindow_s = 3600\n', encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[list[Case], Path]:
    from recovery_logs.api import bundled_incident
    from recovery_logs.simulate import SimOptions, simulate

    sim = tmp_path_factory.mktemp("sim")
    simulate(SimOptions(out=sim, scenario="xid79_cascade,xid48_row_remap", seed=3, duration_s=1200))
    bundled = bundled_incident("xid79_nccl_cascade").parent
    return load_cases([bundled, sim]), sim


def test_bundled_plus_simulated_history_budget_of_one_per_hour(history):
    """8 cases laid 5 minutes apart fit in one hour: a budget of 1 per hour runs exactly one action
    and denies every other executable proposal."""
    from recovery_logs.frames import actions_frame

    cases, _sim = history
    assert len(cases) == 8 and all(c.truth is not None for c in cases)
    executable = sum(actions_frame(list(c.incidents))["kind"].is_in(["drain_node", "requeue_job", "cancel_job"])
                     .sum() for c in cases)
    proposals = sum(actions_frame(list(c.incidents)).height for c in cases)
    assert executable >= 4          # the XID cases propose drain + requeue
    r = backtest(cases, policy(budget_per_hour=1), BacktestOptions(spacing_s=300))
    s = r.summary()
    assert (s["proposals"], s["executable"], s["executed"], s["denied_budget"]) == (
        proposals, executable, 1, executable - 1)
    assert s["right"] + s["wrong"] == proposals        # every case has truth: nothing unknown
    drains = sum(actions_frame(list(c.incidents))["kind"].eq("drain_node").sum() for c in cases)
    first = r.decisions.filter(pl.col("outcome") == "executed")["kind"].item()
    row = r.per_action().filter(pl.col("kind") == "drain_node").row(0, named=True)
    assert (row["proposals"], row["executed"], row["budget"]) == (
        drains, int(first == "drain_node"), drains - int(first == "drain_node"))


def test_backtest_cli_json(history, tmp_path):
    from typer.testing import CliRunner

    from recovery_logs.cli import app

    _cases, sim = history
    pol = _policy_file(tmp_path, 2)
    out = CliRunner().invoke(app, ["backtest", "--policy", str(pol), str(sim / "xid48_row_remap"), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    s = doc["summary"]
    assert s["cases"] == 1 and s["executable"] >= 2 and s["executed"] == 2
    assert s["denied_budget"] == s["executable"] - s["executed"]
    assert doc["policy"]["mode"] == "autonomous" and doc["mode_evaluated"] == "autonomous"
    assert {r["kind"] for r in doc["per_action"]} >= {"drain_node", "requeue_job"}


def test_policy_promotion_table_becomes_the_gate(tmp_path):
    from recovery_logs.analysis.backtest import run_backtest
    from recovery_logs.api import bundled_incident

    pol = _policy_file(tmp_path, 100)
    pol.write_text(pol.read_text() + "[promotion]\nmin_precision = 0.9\nmin_incidents = 50\n", encoding="utf-8")
    r = run_backtest(pol, [bundled_incident("xid79_nccl_cascade")])
    s = r.summary()
    assert r.options.gate == PromotionGate(0.9, 50)
    assert s["executed"] == 0 and s["gate_held"] == s["executable"]


def test_bad_inputs_name_what_is_wrong(tmp_path):
    from recovery_logs.analysis.backtest import run_backtest

    with pytest.raises(InputError, match="does not exist"):
        load_cases([tmp_path / "nope"])
    with pytest.raises(ConfigError, match="policy file not found"):
        run_backtest(tmp_path / "missing.toml", [tmp_path])


@settings(max_examples=20, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 4 * 3600), st.integers(1, 4)), min_size=1, max_size=25),
       per_hour=st.integers(0, 6), fraction=st.sampled_from([0.25, 0.5, 1.0]))
def test_executed_actions_never_exceed_the_budget_or_the_breaker(events, per_hour, fraction):
    cases = [case(f"c{k}", inc(f"I{k}", t, f"n{node}", f"j{k}")) for k, (t, node) in enumerate(events)]
    r = backtest(cases, policy(budget_per_hour=per_hour, breaker_max_drain_fraction=fraction))
    ex = r.decisions.filter(pl.col("outcome") == "executed")
    times = [t.timestamp() for t in ex["time"].to_list()]
    for t in times:
        assert sum(1 for u in times if t - 3600 < u <= t) <= per_hour
    assert r.summary()["max_concurrent_drains"] <= int(fraction * 4)
    s = r.summary()
    assert s["executed"] + s["denied_budget"] + s["denied_breaker"] + s["denied_cooldown"] + s["gate_held"] \
        + s["record_only"] == s["proposals"]
