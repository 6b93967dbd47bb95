"""match(): vectorised rule matching, XID classification, field extraction, benign lines."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.detectors import rules as rules_mod
from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.detectors.rules import _gate, _units, gate_regex, match, winners
from recovery_logs.schema import EVENT_SCHEMA, FINDING_SCHEMA, check_findings, conform

DATASET = Path(__file__).resolve().parents[1] / "fixtures" / "victorialogs" / "dataset_small.jsonl"


def one(pack, make_events, line: str) -> dict:
    f = match(make_events(line), pack)
    assert f.height == 1, f"expected one finding for {line!r}, got {f.height}"
    return f.row(0, named=True)


def test_output_schema_and_order_on_real_dataset(pack, make_events):
    msgs = [json.loads(x)["_msg"] for x in DATASET.read_text().splitlines()]
    f = match(make_events(*msgs), pack)
    check_findings(f)
    assert f["seq"].to_list() == sorted(f["seq"].to_list())
    by_rule = f.group_by("rule_id").len().sort("rule_id")
    counts = dict(zip(by_rule["rule_id"], by_rule["len"], strict=True))
    assert counts["nccl.watchdog_timeout"] == 9
    assert counts["xid.79"] == 2          # the Xid line and the Xid-less "fallen off the bus" line
    assert counts["nccl.unhandled_cuda_error"] == 5
    assert "checkpoint" not in " ".join(f["message"].to_list())


def test_empty_and_unmatched_batches(pack, make_events):
    assert match(make_events(), pack).schema == pl.Schema(FINDING_SCHEMA)
    assert match(make_events("hello", "world"), pack).height == 0


def test_xid_79_fields_and_catalog_classification(pack, make_events):
    r = one(pack, make_events, "[12345.678] NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    assert (r["rule_id"], r["xid"], r["pci"]) == ("xid.79", 79, "0000:3b:00")
    assert (r["category"], r["role"], r["action"], r["severity"]) == ("xid", "cause", "drain_node_and_requeue", "critical")
    d = json.loads(r["detail"])
    assert d["rule"] == "nvidia_xid.xid" and d["pid"] == "1234" and d["process"] == "python"


@pytest.mark.parametrize("line", [
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this\nNVRM: system has fallen off the bus and is not responding to commands.",
    "Unable to determine the device handle for GPU00000000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU",
])
def test_fallen_off_bus_without_xid_is_79(pack, make_events, line):
    r = one(pack, make_events, line)
    assert (r["xid"], r["pci"], r["action"], r["role"]) == (79, "0000:3b:00", "drain_node_and_requeue", "cause")
    assert json.loads(r["detail"])["rule"] == "nvidia_xid.fallen_off_bus"


def test_xid_45_and_43_are_breadcrumbs(pack, make_events):
    for code in (45, 43):
        r = one(pack, make_events, f"NVRM: Xid (PCI:0000:b3:00): {code}, pid=123, name=python, Ch 00000010")
        assert r["role"] == "breadcrumb" and r["action"] != "drain_node_and_requeue"
        assert json.loads(r["detail"])["channel"] == "00000010"


@pytest.mark.parametrize("code", [13, 31])
def test_xid_13_31_are_user_bugs(pack, make_events, code):
    r = one(pack, make_events, f"NVRM: Xid (PCI:0000:cb:00): {code}, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
    assert (r["category"], r["role"], r["action"], r["xid"]) == ("xid", "cause", "none_user_bug", code)


@pytest.mark.parametrize(("line", "fatal", "action"), [
    ("NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)", True, "reset_gpu"),
    ("NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 0x00000000 0x00000000)", False, "investigate"),
    ("NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)", True, "reset_gpu"),
    ("NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)", False, "investigate"),
    # the decode sheet wins over the word the driver printed: TLW_RX status 0x2 is non-fatal
    ("NVRM: Xid (PCI:0000:04:00): 146, TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000a 0x00000002 0x00000000 0x00000000)", False, "investigate"),
    ("NVRM: Xid (PCI:0000:04:00): 147, TREX Nonfatal XC0 i0 Link 00 (0x0000000e 0x00000001 0x00000000 0x00000000)", False, "investigate"),
    ("NVRM: Xid (PCI:0000:04:00): 148, NVLPW_CTRL/NVLPW Nonfatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x00000000 0x00000000)", False, "investigate"),
    ("NVRM: Xid (PCI:0000:04:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x01000011 0x00000000 0x00000000 0x00000000)", True, "drain_node_and_requeue"),
    ("NVRM: Xid (PCI:0000:04:00): 149, NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000003 0x00000000 0x00000000)", False, "investigate"),
    ("NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)", True, "reset_gpu"),
    # a unit/status missing from the sheet falls back to the printed word
    ("NVRM: Xid (PCI:0000:04:00): 147, TREX Fatal XC0 i0 Link 03 (0x0000000e 0x00000400 0x00000000 0x00000000)", True, "reset_gpu"),
])
def test_nvlink5_fatal_decoding(pack, make_events, line, fatal, action):
    r = one(pack, make_events, line)
    assert r["fatal"] is fatal and r["action"] == action and r["category"] == "nvlink"
    assert r["severity"] == ("critical" if fatal else "low")


def test_xid_pid_without_name(pack, make_events):
    r = one(pack, make_events, "kernel: [94558.085056] NVRM: Xid (PCI:0000:02:00): 45, pid=12723, Ch 00000000")
    d = json.loads(r["detail"])
    assert (r["xid"], d["pid"], d["channel"]) == (45, "12723", "00000000") and d.get("process") is None


def test_plain_xid_has_null_fatal(pack, make_events):
    assert one(pack, make_events, "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE")["fatal"] is None


@pytest.mark.parametrize(("num", "action"), [(1, "reset_gpu"), (2, "drain_node_and_requeue"), (0, "none")])
def test_xid_154_recovery_action_number(pack, make_events, num, action):
    r = one(pack, make_events, f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x{num} (Whatever Label)")
    assert r["role"] == "breadcrumb" and r["action"] == action
    assert json.loads(r["detail"])["recovery_action"] == f"0x{num}"


def test_unknown_xid_code_investigate(pack, make_events):
    r = one(pack, make_events, "NVRM: Xid (PCI:0000:01:00): 4242, pid=1, name=x, brand new")
    assert (r["action"], r["rule_id"]) == ("investigate", "xid.4242")


def test_nccl_fields(pack, make_events):
    r = one(pack, make_events, "[rank8]:[E ProcessGroupNCCL.cpp:616] [Rank 8] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5033, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600412 milliseconds before timing out.")
    assert (r["nccl_seq"], r["nccl_op"], r["role"], r["category"]) == (5033, "ALLREDUCE", "symptom", "nccl_timeout_hang")
    assert json.loads(r["detail"])["ran_ms"] == "600412"
    r = one(pack, make_events, "NET/IB : Got completion from peer 10.0.0.12<44321> with status=12 opcode=0 len=0 vendor err 129 (Recv)")
    d = json.loads(r["detail"])
    assert (r["peer"], d["ib_status"], d["vendor_err"], d["direction"]) == ("10.0.0.12", "12", "129", "Recv")
    r = one(pack, make_events, "NCCL WARN NET/IB: Got completion from peer 10.153.235.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 localGid ::ffff:1.1.2.2 remoteGids::ffff:1.1.1.4 hca mlx5_1")
    d = json.loads(r["detail"])
    assert (r["peer"], d["ib_status"], d["ib_status_name"], d["hca"]) == ("10.153.235.13", "12", "IBV_WC_RETRY_EXC_ERR", "mlx5_1")


@pytest.mark.parametrize(("line", "step", "step_time_s"), [
    ("iteration      100/  500000 | consumed samples:        12800 | elapsed time per iteration (ms): 812.3 | learning rate: 1.500E-04 |", 100, 0.8123),
    ("Epoch 0: :   3%|▎         | 300/10000 [02:45<1:29:10, reduced_train_loss=2.340, global_step=299.0, consumed_samples=38400.0, train_step_timing in s=0.55]", 300, 0.55),
    ("Epoch 0:  10%|█         | 100/1000 [00:45<06:45,  2.50it/s, v_num=0, train_loss=2.34]", 100, 0.4),
    (" 10%|█         | 100/1000 [01:40<15:00,  1.25s/it]", 100, 1.25),
    ("\r 10%|█         | 100/1000 [01:40<15:00,  1.00it/s]\r 10%|█         | 101/1000 [01:41<15:00,  1.25it/s]", 101, 0.8),
    ("step 100 | loss 2.345 | lr 3e-4 (0.45 s/step)", 100, 0.45),
    ("[rank3] step 100 step_time=0.452s", 100, 0.452),
    ("[rank10]: step 1913 | loss 1.9403 | lr 3.0e-04 | tokens/s 100365 | mfu 41.2%", 1913, None),
])
def test_progress_fields(pack, make_events, line, step, step_time_s):
    r = one(pack, make_events, line)
    assert (r["category"], r["role"], r["step"]) == ("progress", "progress", step)
    if step_time_s is None:
        assert r["step_time_s"] is None
    else:
        assert r["step_time_s"] == pytest.approx(step_time_s)


BENIGN = [
    "[rank0]: NCCL INFO comm 0x55d1c2e0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId af000 commId 0x9e0c1b7f5c7a - Init COMPLETE",
    "gpu-n1:3345:3400 [0] NCCL INFO Channel 00/32 :    0   1   2   3   4   5   6   7",
    "gpu-n1:3345:3400 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.2.0.4<0>",
    "gpu-n1:3345:3400 [0] NCCL INFO Call to connect returned Connection refused, retrying",
    "NCCL_DEBUG=WARN",
    "export NCCL_IB_TIMEOUT=22 NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=600",
    "dhclient[1234]: DHCPREQUEST for 10.0.0.5 on eth0 to 10.0.0.1 port 67 (xid=0x3a2b1c4d)",
    "NetworkManager[1017]: <info>  [1700000000.1234] dhcp4 (eth0): activation: beginning transaction (timeout in 45 seconds) xid 0x6e2f13ab",
    "I1120 03:03:35.004000 1 health.go:72] Registering for nvmlEventTypeXidCriticalError events on GPU-3c1a",
    "[rank3]: checkpoint saved to /ckpt/run-184/step_1496.pt in 38.2s",
    "launch task StepId=184470.0 request from UID:1001 GID:1001 HOST:10.0.0.1 PORT:41888",
]


def test_benign_lines_produce_no_finding(pack, make_events):
    f = match(make_events(*BENIGN), pack)
    assert f.height == 0, f.select("message", "rule_id").to_dicts()


def test_one_finding_per_event_highest_priority_wins(pack, make_events):
    line = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"
    r = one(pack, make_events, line)      # both nvidia_xid.nvlink5 and nvidia_xid.xid match
    assert json.loads(r["detail"])["rule"] == "nvidia_xid.nvlink5"


def test_rule_without_literals_is_still_matched(tmp_path, make_events):
    (tmp_path / "t.toml").write_text('''
[pack]
name = "t"
version = 1
[[rule]]
id = "t.nolit"
version = 1
category = "cuda_error"
severity = "high"
role = "cause"
action = "investigate"
priority = 1
patterns = ['widget (?P<gpu>\\d+) melted']
must_match = ["widget 3 melted"]
[[rule]]
id = "t.lit"
version = 1
category = "xid"
severity = "high"
role = "cause"
action = "investigate"
priority = 2
literals = ["gizmo"]
patterns = ['gizmo broke']
must_match = ["gizmo broke"]
''')
    pack = load_packs(tmp_path)
    f = match(make_events("a", "widget 7 melted", "gizmo broke", "gizmo fine"), pack)
    assert f["rule_id"].to_list() == ["t.nolit", "t.lit"]
    assert f["gpu"].to_list() == [7, None]
    assert pack.logsql_prefilter() == "*"


_LIT_CHARS = "ab \\.+*?()|[]{}^$#&-~/:'\"\t\u00e9"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(_LIT_CHARS, min_size=1, max_size=6), min_size=1, max_size=12, unique=True),
       st.lists(st.text(_LIT_CHARS, max_size=30), min_size=1, max_size=30))
def test_the_gate_regex_admits_exactly_the_lines_containing_a_literal(lits: list[str], lines: list[str]) -> None:
    # the rule gate is one regex alternation of escaped literals: every regex metacharacter is literal
    got = pl.DataFrame({"m": lines}).select(pl.col("m").str.contains(gate_regex(lits)))["m"].to_list()
    assert got == [any(x in m for x in lits) for m in lines]


def test_the_gate_is_the_literals_without_those_containing_another(pack):
    lits = list(dict.fromkeys(x for r in pack.rules if not r.suppress for x in r.literals))
    assert _gate(pack.rules, True) == [x for x in lits if not any(y != x and y in x for y in lits)]
    lits = list(dict.fromkeys(x for r in pack.rules for x in r.literals))
    assert _gate(pack.rules, False) == [x for x in lits if not any(y != x and y in x for y in lits)]


# the matcher against the definition, on small random packs with and without literal-less rules
_WORDS = ("alpha", "beta", "gamma", "Xid")
_PATTERNS = (r"alpha \d+", r"beta", r"(?i)gamma.*alpha", r"\d{2}", r"Xid: (?P<xid>\d+)", r"a")
_rule_st = st.fixed_dictionaries({
    "patterns": st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=3, unique=True),
    "literals": st.lists(st.sampled_from(_WORDS), max_size=2, unique=True),
    "priority": st.integers(0, 3),
    "suppress": st.booleans(),
})
_line_st = st.lists(st.sampled_from([*_WORDS, "12", "7", " ", "GAMMA", "x"]), max_size=6).map(" ".join)


def _pack_toml(rules: list[dict]) -> str:
    out = ['[pack]\nname = "t"\nversion = 1\n']
    for k, r in enumerate(rules):
        out.append(f'''[[rule]]
id = "t.r{k}"
version = 1
category = "cuda_error"
severity = "high"
role = "cause"
action = "investigate"
priority = {r["priority"]}
suppress = {"true" if r["suppress"] else "false"}
patterns = {json.dumps(r["patterns"])}
literals = {json.dumps(r["literals"])}
''')
    return "\n".join(out)


def _winner_by_definition(line: str, pack) -> str | None:
    """Each (rule, pattern) in winning order is a candidate when its rule has no literal, or the
    line holds one of its literals and a literal of a non-benign rule (the gate): the first
    candidate whose pattern matches wins."""
    admitted = any(lit in line for r in pack.rules if not r.suppress for lit in r.literals)
    for r, i in _units(pack):
        if r.literals and not (admitted and any(lit in line for lit in r.literals)):
            continue
        if pl.select(pl.lit(line).str.contains(r.patterns[i])).item():
            return r.id
    return None


@settings(max_examples=40, deadline=None)
@given(st.lists(_rule_st, min_size=1, max_size=5), st.lists(_line_st, min_size=1, max_size=25))
def test_winners_are_the_first_matching_candidate(rules: list[dict], lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "t.toml").write_text(_pack_toml(rules))
        pack = load_packs(Path(d))
    events = conform(pl.DataFrame({"message": lines}), EVENT_SCHEMA)
    want = {k: w for k, line in enumerate(lines) if (w := _winner_by_definition(line, pack)) is not None}
    default = rules_mod.ALL_PAIRS_MAX
    try:
        for limit in (0, default):   # a round per candidate, and every (row, candidate) pair in one pass
            rules_mod.ALL_PAIRS_MAX = limit
            won = winners(events, pack)
            got = dict(zip(won["_row"].to_list(), won["_rule_id"].to_list(), strict=True))
            assert got == want, f"ALL_PAIRS_MAX={limit}"
            assert won["_row"].to_list() == sorted(got)
    finally:
        rules_mod.ALL_PAIRS_MAX = default
