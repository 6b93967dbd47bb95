"""Promotion gate: in autonomous mode a rule acts alone only once its graded precision earned it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from recovery_logs.errors import PolicyError
from recovery_logs.records import ActionProposal, Incident
from recovery_logs.remediation.policy import load_policy
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.testing import FakeClock


class NoCommands:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout_s: float):
        self.calls.append(tuple(argv))
        raise AssertionError(f"no Slurm command may run here: {argv}")


def _incident() -> Incident:
    return Incident(id="inc-1", category="xid", cause="XID 79", severity="critical", node="gpu-n02", gpu=6,
                    job_id="184470", xid=79, confidence=0.92, first_seen=1, last_seen=2, detected_at=1, count=1,
                    nodes=("gpu-n02",), evidence=(), candidates=(), root_rule="xid.79",
                    actions=(ActionProposal("drain_node", "gpu-n02", "record_only", "XID 79", "inc-1"),))


def test_unpromoted_rule_waits_for_an_operator(tmp_path):
    pol = tmp_path / "policy.toml"
    pol.write_text("mode = 'autonomous'\n[breaker]\ncluster_nodes = 4\n[promotion]\nmin_precision = 0.9\n"
                   "min_incidents = 5\n")
    runner = NoCommands()
    rem = Remediator.from_options(tmp_path / "state", mode="autonomous", policy_file=pol, runner=runner,
                                  clock=FakeClock())
    (d,) = rem.handle([_incident()])
    assert (d.decision, d.status) == ("proposed", "awaiting_approval")
    assert "promotion gate" in d.reason and "xid.79" in d.reason
    assert runner.calls == []


def test_promotion_keys_are_validated(tmp_path):
    pol = tmp_path / "policy.toml"
    pol.write_text("[promotion]\nmin_precision = 1.5\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(pol)
    assert "promotion.min_precision" in str(exc.value)
    pol.write_text("[promotion]\nmin_precision = 0.8\nmin_incidents = 10\n")
    cfg = load_policy(pol)
    assert (cfg.promotion_min_precision, cfg.promotion_min_incidents) == (0.8, 10)
    assert cfg.to_dict()["promotion"] == {"min_precision": 0.8, "min_incidents": 10}


def test_a_promotion_table_turns_the_gate_on_with_defaults(tmp_path):
    from recovery_logs.remediation.gate import PromotionGate

    pol = tmp_path / "policy.toml"
    pol.write_text("[promotion]\nmin_incidents = 5\n")
    gate = PromotionGate.from_policy(load_policy(pol))
    assert gate == PromotionGate(min_precision=0.9, min_incidents=5)
    assert PromotionGate.from_policy(load_policy(None)) is None
    pol.write_text("[promotion]\nmin_incidents = 0\n")
    with pytest.raises(PolicyError):
        load_policy(pol)
