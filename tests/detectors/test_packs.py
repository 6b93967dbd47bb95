"""Per-pack behaviour on real log lines: category, role, action and extracted fields."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.detectors.rules import match, winners
from recovery_logs.schema import EVENT_SCHEMA, conform

CASES = [
    # (line, rule_id, category, role, action, {column: value}, {detail key: value})
    ("[rank4]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
     "gpu_memory.uncorrectable_ecc_cuda", "ecc_memory", "cause", "drain_node_and_requeue", {}, {}),
    ("GPU 3 had uncorrectable memory errors and row remapping failed.",
     "gpu_memory.row_remap_failure", "ecc_memory", "cause", "drain_node_and_requeue", {"gpu": 3}, {}),
    ("GPU 2 had memory errors and row remappings are pending",
     "gpu_memory.row_remap_pending", "ecc_memory", "cause", "reset_gpu", {"gpu": 2}, {}),
    ("NVRM: Xid (PCI:0000:5e:00): 63, Row Remapper: New row (0x0000000000001234) was marked for remapping, reset gpu to activate.",
     "xid.63", "ecc_memory", "cause", "reset_gpu", {"xid": 63, "pci": "0000:5e:00"}, {}),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=4021, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
     "xid.48", "ecc_memory", "cause", "drain_node_and_requeue", {"xid": 48}, {"process": "python"}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
     "oom.gpu", "oom_gpu", "cause", "none", {"gpu": 0}, {"tried": "2.00 GiB"}),
    ("Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:87654321kB, file-rss:0kB",
     "oom.host_kill", "oom_host", "cause", "investigate", {}, {"pid": "4242", "process": "python"}),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=184470.0. Some of the step tasks have been OOM Killed.",
     "oom.cgroup_kill", "oom_host", "cause", "none_user_bug", {}, {"oom_events": "1"}),
    ("[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
     # a lone CUDA runtime error is a look, not a requeue (real-log corpus, issue 13)
     "cuda.runtime_error", "cuda_error", "symptom", "investigate", {}, {"cuda_error": "an illegal memory access was encountered"}),
    ("RuntimeError: CUDA error: device-side assert triggered",
     "cuda.user_error", "cuda_error", "cause", "none_user_bug", {}, {}),
    ("mlx5_core 0000:5c:00.0: Port module event[error]: module 0, Cable error, High Temperature",
     "infiniband.module_error", "infiniband_link", "cause", "drain_node_and_requeue", {"pci": "0000:5c:00"},
     {"module_error": "High Temperature"}),
    ("mlx5_core 0000:08:00.7 ens9f0v5: Link down",
     "infiniband.link_down", "infiniband_link", "cause", "requeue_only", {}, {"netdev": "ens9f0v5"}),
    ("mlx5_core 0000:04:00.0 enp4s0f0np0: Link up",
     "infiniband.link_up", "infiniband_link", "clear", "none", {}, {}),
    ("ib-monitor: mlx5_0 port 1 state changed DOWN -> ACTIVE",
     "infiniband.port_active", "infiniband_link", "clear", "none", {}, {"ib_port": "1"}),
    ("pcieport 0000:5e:02.0: AER: Uncorrected (Fatal) error received: 0000:5e:00.0",
     "pcie.aer_fatal", "pcie", "cause", "drain_node_and_requeue", {"pci": "0000:5e:00"}, {}),
    ("pcieport 0000:5e:02.0: AER: Corrected error received: 0000:5e:00.0",
     "pcie.aer_corrected", "pcie", "info", "none", {"pci": "0000:5e:00"}, {}),
    ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
     "nvidia_xid.sxid_fatal", "nvlink", "cause", "drain_node_and_requeue", {"pci": "0000:06:00", "fatal": True},
     {"sxid": "20034", "link": "48"}),
    ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
     "nvidia_xid.sxid_stall", "nvlink", "cause", "drain_node_and_requeue", {"fatal": False}, {"sxid": "12028"}),
    ("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33",
     "nvlink.fm_fatal", "nvlink", "cause", "drain_node_and_requeue", {"fatal": True}, {"port": "33"}),
    ("detected NVSwitch non-fatal error 12028 on NVSwitch pci bus id 00000000:07:00.0 physical id 0 port 32",
     "nvlink.fm_stall", "nvlink", "cause", "drain_node_and_requeue", {"fatal": False}, {"port": "32"}),
    ("slurmd: error: _rpc_terminate_job: Job 184470 step 0 kill task failed",
     "slurm.kill_task_failed", "slurm_job_failure", "cause", "drain_node_and_requeue", {}, {}),
    ("            HW Power Brake Slowdown           : Active",
     "thermal_power.power_brake", "thermal_power", "cause", "investigate", {}, {}),
    ("CPU12: Package temperature above threshold, cpu clock throttled (total events = 1042)",
     "thermal_power.cpu_throttle", "thermal_power", "cause", "investigate", {}, {"events": "1042"}),
    ("slurmstepd: error: *** JOB 6847502 ON udc-aw29-24b CANCELLED AT 2019-11-07T02:09:10 DUE TO TIME LIMIT ***",
     "slurm.time_limit", "slurm_job_failure", "cause", "none_user_bug", {}, {"slurm_job": "6847502", "node": "udc-aw29-24b"}),
    ("error: *** JOB 184470 ON gpu-n3 CANCELLED AT 2025-06-01T12:16:20 DUE TO NODE FAILURE ***",
     "slurm.node_failure_cancel", "slurm_job_failure", "symptom", "requeue_only", {}, {"node": "gpu-n3"}),
    ("slurmd: error: [job 184470] prolog failed status=1:0",
     "slurm.prolog_failed", "slurm_job_failure", "cause", "drain_node_and_requeue", {}, {"status": "1:0"}),
    ("slurmctld: update_node: node gpu-n3 reason set to: Kill task failed",
     "slurm.kill_task_failed", "slurm_job_failure", "cause", "drain_node_and_requeue", {}, {}),
    ("Traceback (most recent call last):\n  File \"/workspace/train.py\", line 212, in <module>\n    main(cfg)\n"
     "  File \"/workspace/train.py\", line 180, in main\n    batch = next(it)\nKeyError: 'input_ids'",
     "python.traceback", "software_exception", "cause", "none_user_bug", {}, {"exc_type": "KeyError", "exc_msg": "'input_ids'"}),
    ("Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\n    loss.backward()\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
     "oom.gpu", "oom_gpu", "cause", "none", {"gpu": 1}, {}),
    ("[rank3]:[E1120 03:20:16.001 ProcessGroupNCCL.cpp:1664] [PG 0 Rank 3] Timeout at NCCL work: 5035, last enqueued NCCL work: 5035, last completed NCCL work: 5034.",
     "nccl.timeout_at_work", "nccl_timeout_hang", "symptom", "requeue_only", {"nccl_seq": 5035}, {"last_completed": "5034"}),
    ("[rank5]:[E1120 03:30:16.000 ProcessGroupNCCL.cpp:1415] [PG 0 Rank 5] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=2",
     "nccl.heartbeat_timeout", "nccl_timeout_hang", "symptom", "requeue_only", {}, {"work_pending": "2"}),
    ("[rank2]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
     "nccl.remote_error", "nccl_network_error", "symptom", "requeue_only", {}, {}),
    ("gpu-n4:88:120 [0] misc/socket.cc:47 NCCL WARN socketProgress: Connection closed by remote peer gpu-n3<48732>",
     "nccl.socket_closed", "nccl_network_error", "symptom", "requeue_only", {"peer": "gpu-n3"}, {"peer_port": "48732"}),
    ("gpu-n1:3345:3400 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.12<43215> failed : Connection refused",
     "nccl.socket_connect_failed", "nccl_network_error", "symptom", "requeue_only", {"peer": "10.0.0.12"}, {}),
]


@pytest.mark.parametrize(("line", "rule_id", "category", "role", "action", "cols", "detail"), CASES,
                         ids=[c[1] + f"#{i}" for i, c in enumerate(CASES)])
def test_real_line(pack, make_events, line, rule_id, category, role, action, cols, detail):
    f = match(make_events(line), pack)
    assert f.height == 1, line
    r = f.row(0, named=True)
    assert (r["rule_id"], r["category"], r["role"], r["action"]) == (rule_id, category, role, action)
    for k, v in cols.items():
        assert r[k] == v, k
    d = json.loads(r["detail"]) if r["detail"] else {}
    for k, v in detail.items():
        assert d.get(k) == v, k


def test_suppress_examples_yield_nothing_and_pruning_is_exact(pack, make_events):
    """Every benign example is won by its suppress rule, and pruning benign-only lines at the
    prefilter changes no result on the union of all examples."""
    examples = [ex for r in pack.rules for ex in (*r.must_match, *r.must_not_match)]
    benign = [ex for r in pack.rules if r.suppress for ex in r.must_match]
    assert len(benign) >= 15
    assert match(make_events(*benign), pack).height == 0
    ev = make_events(*examples)
    full = winners(ev, pack, prune_benign=False)
    units = [r for r in pack.rules for _ in r.patterns]
    keep = full.filter(~pl.col("_u").is_in([u for u, r in enumerate(units) if r.suppress]))
    pruned = winners(ev, pack, prune_benign=True)
    pruned = pruned.filter(~pl.col("_u").is_in([u for u, r in enumerate(units) if r.suppress]))
    assert keep.sort("_row").equals(pruned.sort("_row"))


LINES = st.sampled_from([c[0] for c in CASES] + ["noise line", "NCCL_DEBUG=WARN", "[rank1] step 5 step_time=0.5s"])


@settings(max_examples=25, deadline=None)
@given(st.lists(LINES, min_size=1, max_size=30), st.integers(min_value=0, max_value=30))
def test_batch_split_does_not_change_findings(pack, lines, cut):
    """match() over a batch equals match() over any split of it (replay == watch)."""
    cut = min(cut, len(lines))
    ev = conform(pl.DataFrame({"message": lines, "seq": list(range(len(lines)))}), EVENT_SCHEMA)
    whole = match(ev, pack)
    parts = pl.concat([match(ev.slice(0, cut), pack), match(ev.slice(cut), pack)])
    assert whole.equals(parts)
