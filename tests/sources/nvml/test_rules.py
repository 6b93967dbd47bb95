"""rules/nvml.toml against the messages the agent really emits, through the runtime matcher."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pynvml
import pytest

from recovery_logs.detectors import rulecheck, rulepack
from recovery_logs.detectors import rules as rules_matcher
from recovery_logs.sources.nvml import NvmlAgent

RULES = Path(__file__).resolve().parents[3] / "rules"


@pytest.fixture(scope="module", params=["nvml_only", "all_packs"])
def pack(request, tmp_path_factory):
    """rules/nvml.toml on its own (with the catalog), and with every shipped pack: no other pack's
    rule may win the agent's messages."""
    if request.param == "all_packs":
        return rulepack.load_packs(RULES)
    d = tmp_path_factory.mktemp("rules")
    for name in ("xid_catalog.toml", "nvml.toml"):
        shutil.copy(RULES / name, d / name)
    assert rulecheck.check_packs(d) == []
    return rulepack.load_packs(d)


def findings(pack, events: pl.DataFrame) -> list[tuple]:
    f = rules_matcher.match(events, pack)
    return list(zip(f["rule_id"], f["category"], f["role"], f["action"], f["gpu"], f["pci"], f["xid"], strict=True))


def test_healthy_baseline_yields_no_findings(pack, fake, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    events = agent.poll_once()
    assert events.height > 10
    assert findings(pack, events) == []


def test_faults_become_the_intended_findings(pack, fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    g0, g1 = gpus
    g0.remap = (2, 1, 1, 0)
    g0.ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)] = 1
    g1.remap = (0, 4, 0, 1)
    g1.reasons = pynvml.nvmlClocksEventReasonHwSlowdown
    g1.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    g1.nvlinks[0] = 0
    assert findings(pack, agent.poll_once()) == [
        ("nvml.ecc_uncorrectable", "ecc_memory", "cause", "drain_node_and_requeue", 0, "0000:1b:00", None),
        ("nvml.remap_pending", "ecc_memory", "cause", "reset_gpu", 0, "0000:1b:00", None),
        ("nvml.remap_failure", "ecc_memory", "cause", "drain_node_and_requeue", 1, "0000:cb:00", None),
        ("nvml.clock_slowdown", "thermal_power", "cause", "investigate", 1, "0000:cb:00", None),
        ("xid.154", "xid", "breadcrumb", "drain_node_and_requeue", 1, "0000:cb:00", 154),
        ("nvml.nvlink_down", "nvlink", "cause", "drain_node_and_requeue", 1, "0000:cb:00", None),
    ]


def test_xid_events_take_the_catalog_classification(pack, fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    fake.xid(gpus[1], 79)
    fake.xid(gpus[0], 63)
    fake.xid(gpus[0], 13)
    assert findings(pack, agent.wait_xid(100)) == [
        ("xid.79", "xid", "cause", "drain_node_and_requeue", 1, "0000:cb:00", 79),
        ("xid.63", "ecc_memory", "cause", "reset_gpu", 0, "0000:1b:00", 63),
        ("xid.13", "xid", "cause", "none_user_bug", 0, "0000:1b:00", 13),
    ]


def test_gpu_lost_is_a_draining_cause(pack, fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[1].lost = pynvml.NVMLError_GpuIsLost()
    assert findings(pack, agent.poll_once()) == [
        ("nvml.gpu_lost", "xid", "cause", "drain_node_and_requeue", 1, "0000:cb:00", None)]
    gpus[1].lost = None
    assert findings(pack, agent.poll_once()) == [
        ("nvml.gpu_answering", "xid", "info", "none", 1, "0000:cb:00", None)]


def test_reset_required_asks_for_a_gpu_reset(pack, fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[0].lost = pynvml.NVMLError_ResetRequired()
    assert findings(pack, agent.poll_once()) == [
        ("nvml.gpu_reset_required", "xid", "cause", "reset_gpu", 0, "0000:1b:00", None)]
