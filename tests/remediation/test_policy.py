"""Pure policy tests: the budget is never exceeded, dry-run consumes nothing, the breaker holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.errors import PolicyError
from recovery_logs.remediation.policy import (
    ActionRequest,
    Executed,
    PolicyConfig,
    PolicyState,
    decide,
    load_policy,
    replay_policy,
)

NODES = [f"gpu-n{i:02d}" for i in range(1, 9)]
requests = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=600, allow_nan=False),           # seconds since the previous request
        st.sampled_from(["drain_node", "requeue_job", "cancel_job", "resume_node"]),
        st.sampled_from(NODES + ["101", "102", "103"]),
        st.sampled_from(["inc-a", "inc-b", "inc-c", "inc-d", None]),
    ), max_size=80)


def _timeline(reqs):
    t = 0.0
    out = []
    for gap, kind, target, inc in reqs:
        t += gap
        out.append((t, ActionRequest(kind, target, inc)))
    return out


@settings(max_examples=200, deadline=None)
@given(reqs=requests, per_hour=st.integers(0, 6), per_incident=st.integers(0, 4),
       cooldown=st.sampled_from([0.0, 60.0, 900.0]))
def test_budget_never_exceeded(reqs, per_hour, per_incident, cooldown):
    cfg = PolicyConfig(mode="autonomous", budget_per_hour=per_hour, budget_per_incident=per_incident,
                       cooldown_s=cooldown, breaker_max_drain_fraction=1.0, cluster_nodes=len(NODES))
    state, verdicts = replay_policy(cfg, PolicyState(), _timeline(reqs))
    times = [e.ts for e in state.executed]
    for t in times:   # every sliding hour ending at an executed action
        assert sum(1 for u in times if t - 3600 < u <= t) <= per_hour
    for inc in ("inc-a", "inc-b", "inc-c", "inc-d"):
        assert sum(1 for e in state.executed if e.incident_id == inc) <= per_incident
    for a in state.executed:          # cooldown per target
        later = [b for b in state.executed if b.target == a.target and a.ts < b.ts]
        assert all(b.ts - a.ts >= cooldown for b in later)
    assert sum(v.decision == "approved" for v in verdicts) == len(state.executed)


@settings(max_examples=150, deadline=None)
@given(reqs=requests)
def test_dry_run_consumes_nothing(reqs):
    """A dry-run policy approves what the real one would at the start, and never moves the state."""
    cfg = PolicyConfig(mode="autonomous", dry_run=True, budget_per_hour=2, cooldown_s=900,
                       breaker_max_drain_fraction=0.25, cluster_nodes=len(NODES))
    state, verdicts = replay_policy(cfg, PolicyState(), _timeline(reqs))
    assert state.executed == ()
    assert state.breaker_tripped is False
    assert state.dry_runs == sum(v.decision == "dry_run" for v in verdicts)
    # nothing was consumed, so nothing is ever denied for budget, cooldown or breaker
    assert [v.decision for v in verdicts] == ["dry_run"] * len(verdicts)
    assert not any(v.trip_breaker for v in verdicts)


@settings(max_examples=150, deadline=None)
@given(reqs=requests, frac=st.sampled_from([0.125, 0.25, 0.5]))
def test_breaker_bounds_drained_share(reqs, frac):
    cfg = PolicyConfig(mode="autonomous", budget_per_hour=1000, budget_per_incident=1000, cooldown_s=0,
                       breaker_max_drain_fraction=frac, breaker_window_s=3600, cluster_nodes=len(NODES))
    state, verdicts = replay_policy(cfg, PolicyState(), _timeline(reqs))
    for t in [e.ts for e in state.executed if e.kind == "drain_node"]:
        assert len(state.drained_in_window(t, 3600)) / len(NODES) <= frac
    tripped_at = next((i for i, v in enumerate(verdicts) if v.trip_breaker), None)
    if tripped_at is not None:       # once tripped, no drain is approved again (manual reset only)
        tl = _timeline(reqs)
        assert all(not (v.runs and tl[i][1].kind == "drain_node") for i, v in enumerate(verdicts) if i > tripped_at)


def test_tripped_breaker_never_blocks_resume():
    cfg = PolicyConfig(mode="autonomous", cluster_nodes=4, cooldown_s=900)
    st0 = PolicyState(executed=(Executed(0.0, "drain_node", "gpu-n01", "inc-a"),), breaker_tripped=True,
                      breaker_reason="test", cluster_nodes=4)
    assert decide(cfg, st0, ActionRequest("drain_node", "gpu-n02", "inc-b"), 10).decision == "denied"
    v = decide(cfg, st0, ActionRequest("resume_node", "gpu-n01", "inc-a", own_drain=True), 10)
    assert v.decision == "approved", v.reason


def test_modes():
    st0 = PolicyState(cluster_nodes=4)
    req = ActionRequest("drain_node", "gpu-n01", "inc-a")
    assert decide(PolicyConfig(), st0, req, 0).decision == "record_only"
    assert decide(PolicyConfig(mode="approve"), st0, req, 0).decision == "proposed"
    assert decide(PolicyConfig(mode="approve"), st0, req, 0, approved_by_human=True).decision == "approved"
    assert decide(PolicyConfig(mode="autonomous"), st0, req, 0).decision == "approved"
    assert decide(PolicyConfig(mode="autonomous"), st0, ActionRequest("investigate", "x", "i"), 0).decision \
        == "record_only"
    # unknown cluster size: a drain is denied rather than guessed
    assert decide(PolicyConfig(mode="autonomous"), PolicyState(), req, 0).decision == "denied"


def test_policy_file(tmp_path: Path):
    p = tmp_path / "policy.toml"
    p.write_text('mode = "approve"\ncooldown_s = 60\n[budget]\nper_hour = 4\n[breaker]\nmax_drain_fraction = 0.5\n'
                 'cluster_nodes = 16\n')
    cfg = load_policy(p)
    assert (cfg.mode, cfg.cooldown_s, cfg.budget_per_hour, cfg.breaker_max_drain_fraction, cfg.cluster_nodes) == \
        ("approve", 60, 4, 0.5, 16)
    assert load_policy(p, mode="autonomous").mode == "autonomous"
    for text, key in (('mode = "yolo"', "mode"), ("[budget]\nper_hour = -1", "budget.per_hour"),
                      ("[budget]\nper_day = 3", "budget.per_day"), ("colour = 1", "colour"),
                      ('[breaker]\nmax_drain_fraction = "half"', "breaker.max_drain_fraction"),
                      ("[breaker]\nmax_drain_fraction = 1.5", "breaker.max_drain_fraction"),
                      ("dry_run = 1", "dry_run")):
        p.write_text(text + "\n")
        with pytest.raises(PolicyError) as ei:
            load_policy(p)
        assert ei.value.context["key"] == key, (text, ei.value)
    with pytest.raises(PolicyError, match="not valid TOML"):
        p.write_text("mode = \n")
        load_policy(p)
    with pytest.raises(PolicyError, match="not found"):
        load_policy(tmp_path / "missing.toml")
