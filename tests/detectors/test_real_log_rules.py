"""Engine behaviour issue 13 asks for, on real log lines (sources next to each line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import found, replay_text


def test_nvlink5_undecodable_falls_back_to_the_catalog_action(pack) -> None:
    # leptonai/gpud#1174: unit "NETIR" is not in the decode sheet; with the Fatal word the fatal action applies,
    # without any severity word (decode failed) the catalog's action for 149 (drain) applies, never 'investigate'
    f = found(pack, "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 "
                    "0x00000000 0x00000000 0x00000000)")
    assert f["action"].to_list() == ["drain_node_and_requeue"]
    f = found(pack, "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
                    "0x00000001 0x00000000 0x00100000 0x00000004)")
    assert f["action"].to_list() == ["investigate"]
    catalog = pack.xid(149).action
    assert catalog == "drain_node_and_requeue"


def test_xid45_caused_by_previous_xid_is_classified_as_that_xid(pack) -> None:
    # NVIDIA/open-gpu-kernel-modules#1150
    f = found(pack, "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
                    "previous Xid 149")
    row = f.row(0, named=True)
    assert (row["xid"], row["category"], row["action"], row["pci"]) == (149, "nvlink", "drain_node_and_requeue",
                                                                         "0000:dc:00")


def test_syslog_line_without_a_host_keeps_its_nvrm_text(tmp_path: Path) -> None:
    # NVIDIA developer forum 364958: journal lines with no hostname ("Mar 29 15:38:59 kernel: NVRM: ...")
    res = replay_text(tmp_path, "Mar 29 15:38:59 kernel: NVRM: Xid (PCI:0000:01:00): 120, GSP kernel exception: store access "
                        "page fault (cause:0xf) @ pc:0xffffffff93003d42, partition:4#0\n", "nodes/gpu-x7/kern.log")
    f = res.engine.findings
    assert f["rule_id"].to_list() == ["xid.120"] and f["host"].to_list() == ["gpu-x7"]
    assert res.incidents[0].suggested_action == "reset_gpu"


def test_sigkill_without_exception_is_said_to_be_likely_host_oom(tmp_path: Path) -> None:
    # hpcaitech/ColossalAI#3514: the dead rank's -9 is the cause, the agent's SIGTERMs are consequences
    res = replay_text(tmp_path, "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 812914 closing signal SIGTERM\n"
                        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 "
                        "(pid: 812917) of binary: /data/chenhao/anaconda3/envs/ColossalAI-Chat/bin/python\n")
    inc = res.incidents[0]
    assert inc.category == "oom_host" and inc.suggested_action == "investigate"
    assert inc.cause.startswith("Likely host OOM") and "SIGKILL" in inc.cause
    assert any("exitcode: -9" in e.message for e in inc.evidence)


def test_nvlink_down_on_a_pcie_gpu_is_not_a_drain(tmp_path: Path) -> None:
    # DCGM health text (dcgm_errors.h, as in NVIDIA/NVSentinel#1481) on a host whose log names a PCIe board
    down = "GPU 0's NvLink link 0 is currently down\nGPU 0's NvLink link 1 is currently down\n"
    sxm = replay_text(tmp_path / "a", down)
    assert sxm.incidents[0].category == "nvlink" and sxm.incidents[0].suggested_action == "drain_node_and_requeue"
    pcie = replay_text(tmp_path / "b", "    Product Name                    : NVIDIA A100 80GB PCIe\n" + down)
    inc = pcie.incidents[0]
    assert inc.category == "nvlink" and inc.suggested_action == "investigate"
    assert "drain_node" not in [a.kind for a in inc.actions]


def test_progress_step_time_from_rates_and_phase_sums(pack) -> None:
    f = found(pack,
              # deepspeedai/DeepSpeed#5779
              "[2024-07-17 19:53:24,981] [INFO] [timer.py:258:stop] epoch=0/micro_step=4500/global_step=4500, "
              "RunningAvgSamplesPerSec=16.124955167964504, CurrSamplesPerSec=16.807402094161112, MemAllocated=0.02GB, "
              "MaxMemAllocated=0.97GB",
              "[rank3] step 120 timing: forward-compute 812.40 ms | backward-compute 1630.25 ms | optimizer 95.10 ms",
              # karpathy/nanoGPT#110
              "iter 1631: loss 4.0863, time 561.94ms")
    got = dict(zip(f["rule_id"].to_list(), zip(f["step"].to_list(), f["step_time_s"].to_list(), strict=True),
                   strict=True))
    assert got["progress.deepspeed"][0] == 4500
    assert got["progress.deepspeed"][1] == pytest.approx(1 / 16.807402094161112)
    assert got["progress.rank_phase_timing"] == (120, pytest.approx(2.53775))
    assert got["progress.iter_time"] == (1631, pytest.approx(0.56194))


def test_older_deepspeed_timer_takes_the_current_rate_not_the_running_average(pack) -> None:
    f = found(pack,
              # deepspeedai/DeepSpeed#2629 (v0.7.7: epoch/step, then the running average before the current rate)
              "stdout: [2022-12-20 08:26:26,101] [INFO] [timer.py:197:stop] 0/17, RunningAvgSamplesPerSec=158.31157878546472, "
              "CurrSamplesPerSec=159.628891629629, MemAllocated=1.75GB, MaxMemAllocated=2.6GB",
              # huggingface/transformers#14531 (older still: one rate)
              "[2021-11-26 03:07:16,494] [INFO] [timer.py:181:stop] 0/2000, SamplesPerSec=9.526738918021234")
    got = sorted(zip(f["step"].to_list(), f["step_time_s"].to_list(), strict=True))
    assert got == [(17, pytest.approx(1 / 159.628891629629)), (2000, pytest.approx(1 / 9.526738918021234))]


def test_kernel_stall_is_the_host_unless_a_gpu_fault_is_beside_it(tmp_path: Path) -> None:
    # torvalds/linux kernel/watchdog.c "BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]"; an Xid on the same
    # node is the more specific cause (the stall is what the driver's fault looks like from the CPU)
    lock = "[ 5723.112233] watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [python:48211]\n"
    alone = replay_text(tmp_path / "a", lock).incidents
    assert [(i.category, i.root_rule) for i in alone[:1]] == [("host_hardware", "host_hardware.kernel_stall")]
    assert {a.kind for a in alone[0].actions} <= {"investigate"}
    xid = ("[ 5720.000001] NVRM: Xid (PCI:0000:3b:00): 79, pid=48211, name=python, GPU has fallen off the bus.\n" + lock)
    both = replay_text(tmp_path / "b", xid).incidents
    assert both and both[0].category == "xid"


def test_munge_failure_is_the_cluster_not_a_rejected_request(tmp_path: Path) -> None:
    # SchedMD/slurm src/plugins/auth/munge/auth_munge.c; the client's SLURM_PROTOCOL_AUTHENTICATION_ERROR text
    got = replay_text(tmp_path, 'sbatch: error: Munge encode failed: Failed to access "/var/run/munge/munge.socket.2": '
                                "No such file or directory\nsbatch: error: Batch job submission failed: Protocol "
                                "authentication error\n").incidents
    assert got[0].root_rule == "slurm.munge_auth_failure" and {a.kind for a in got[0].actions} == {"investigate"}
