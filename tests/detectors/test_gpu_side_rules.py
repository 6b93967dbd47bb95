"""GPU-side rule coverage from real text (issue 13): OOM in every framework's words, CUDA 802 as the
Fabric Manager, DCGM texts wrapped by ``dcgmi diag``'s table, nvidia-smi XML flags, DCGM failure codes.
Sources next to each line; replays go through the whole pipeline."""

from __future__ import annotations

import pytest

from .conftest import found, replay_text


@pytest.mark.parametrize(("line", "rule_id"), [
    # jax-ml/jax#13428, onpix/LLNeRF#9, XLA pjrt "Failed to allocate request for"
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.",
     "oom.gpu"),
    ("E0101 pjrt_stream_executor_client.cc:2985] Execution of replica 0 failed: RESOURCE_EXHAUSTED: Failed to allocate "
     "request for 2.00GiB (2147483648B) on device ordinal 0", "oom_gpu.xla"),
    # tensorflow/tensorflow#3304, CharlesShang/FastMaskRCNN#129
    ("W tensorflow/core/common_runtime/bfc_allocator.cc:271] Ran out of memory trying to allocate 220.5KiB.  See logs "
     "for memory state.", "oom_gpu.tf_allocator"),
    (": F tensorflow/core/common_runtime/gpu/gpu_device.cc:103] EigenAllocator for GPU ran out of memory when "
     "allocating 0. See error logs for more detailed info.", "oom_gpu.tf_allocator"),
    # QwenLM/Qwen3#873, microsoft/CNTK#220
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     "oom_gpu.cuda_library_alloc"),
    ("cuDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=PTNUWCL5099642 ; expr=finder(calgo, algoPerf)",
     "oom_gpu.cuda_library_alloc"),
    # kyuz0/amd-strix-halo-image-video-toolboxes#3
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.31 GiB. GPU 0 has a total capacity of 128.00 GiB "
     "of which 780.24 MiB is free.", "oom.gpu_framework"),
    # vllm-project/vllm#10439, sgl-project/sglang#4330
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
     "the engine.", "oom_gpu.kv_cache"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "oom_gpu.kv_cache"),
    # NCCL 2.19+ CUDACHECK wording
    ("gpu-n2:4567:4600 [3] include/alloc.h:124 NCCL WARN Cuda failure 2 'out of memory'", "oom.gpu"),
    # c10/cuda/CUDACachingAllocator.cpp: the message's later clauses on a line of their own
    ("Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated.",
     "oom_gpu.torch_message_tail"),
])
def test_gpu_oom_wordings_are_oom_gpu_and_no_node_action(pack, line, rule_id):
    f = found(pack, line)
    assert f["rule_id"].to_list() == [rule_id]
    assert f["category"].to_list() == ["oom_gpu"] and f["action"].to_list() == ["none"]


def test_tf_allocator_retry_warning_says_it_is_not_a_failure(tmp_path, pack):
    # tensorflow/tensorflow#43546: the BFC allocator's fallback warning, nothing failed
    line = ("2020-09-24 21:35:23.363348: W tensorflow/core/common_runtime/bfc_allocator.cc:246] Allocator (GPU_0_bfc) "
            "ran out of memory trying to allocate 1.02GiB with freed_by_count=0. The caller indicates that this is not "
            "a failure, but may mean that there could be performance gains if more memory were available.")
    assert found(pack, line).height == 0
    assert replay_text(tmp_path, line + "\n").incidents == []


def test_allocator_dump_without_its_oom_line_is_oom_gpu(tmp_path):
    # tensorflow/tensorflow#36780: the chunk dump TF prints only after a failed allocation, head cut off
    dump = "".join(f"2020-02-15 17:58:41.4{i}8862: I tensorflow/core/common_runtime/bfc_allocator.cc:905] InUse at "
                   f"00000007A03B6{i}00 next 26{i}9 of size 256\n" for i in range(4))
    inc = replay_text(tmp_path, dump).incidents[0]
    assert inc.category == "oom_gpu" and {a.kind for a in inc.actions} == {"none"}


def test_cuda_802_is_the_fabric_manager_not_a_job_bug(tmp_path):
    # pytorch/pytorch#35710 (bandwidthTest and THC wording of cudaErrorSystemNotReady)
    res = replay_text(tmp_path, "RuntimeError: cuda runtime error (802) : system not yet initialized at /opt/conda/conda-bld/"
                        "pytorch_1579022034529/work/aten/src/THC/THCGeneral.cpp:50\n"
                        "CUDA error at bandwidthTest.cu:256 code=802(cudaErrorSystemNotReady) \"cudaSetDevice(currentDevice)\"\n")
    inc = res.incidents[0]
    assert inc.category == "nvlink" and inc.root_rule == "nvlink.fm_not_ready_cuda"
    assert inc.suggested_action == "investigate"


def test_dcgmi_diag_table_wrapped_thermal_and_row_remap(tmp_path, pack):
    # stas00/ml-engineering compute/accelerator/nvidia/debug.md: dcgmi diag -r 2 on a faulty node
    thermal = replay_text(tmp_path / "t", "| Warning                   | GPU 0 Thermal violations totaling 13.3 second  |\n"
                                  "|                           | s started at 9.7 seconds into the test for GP  |\n")
    assert thermal.incidents[0].category == "thermal_power" and thermal.incidents[0].gpu == 0
    remap = replay_text(tmp_path / "r", "| Error                     | GPU 3 has uncorrectable memory errors and row  |\n"
                                "|                           |  remappings are pending                        |\n")
    assert remap.incidents[0].category == "ecc_memory" and remap.incidents[0].suggested_action == "reset_gpu"
    zero = found(pack, "GPU 3 Thermal violations totaling 0.0 seconds started at 30.0 seconds into the test for GPU 3")
    assert "thermal_power.gpu_thermal_throttle" not in zero["rule_id"].to_list()


@pytest.mark.parametrize(("line", "category", "action"), [
    # nvidia-smi -q -x (netdata/netdata#2922 shows the element names)
    ("<clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>", "thermal_power", "investigate"),
    ("<clocks_event_reason_sw_thermal_slowdown>Active</clocks_event_reason_sw_thermal_slowdown>", "thermal_power",
     "investigate"),
    # DCGM failure-reason codes as health monitors log them (dcgmlib/dcgm_errors.h)
    (" Message:ErrorCode:DCGM_FR_CLOCKS_EVENT_THERMAL GPU:2 Recommended Action=NONE;", "thermal_power", "investigate"),
    (" Message:ErrorCode:DCGM_FR_NVLINK_DOWN GPU:0 Recommended Action=RESTART_BM;", "nvlink", "drain_node_and_requeue"),
    ("errorCode: DCGM_FR_NVLINK_ERROR_THRESHOLD", "nvlink", "investigate"),
    ("errorCode: DCGM_FR_VOLATILE_DBE_DETECTED", "ecc_memory", "drain_node_and_requeue"),
    ("errorCode: DCGM_FR_PENDING_ROW_REMAP", "ecc_memory", "reset_gpu"),
])
def test_smi_xml_flags_and_dcgm_codes(pack, line, category, action):
    f = found(pack, line)
    assert f["category"].to_list() == [category] and f["action"].to_list() == [action]


def test_not_active_flags_and_power_codes_are_not_thermal_faults(pack):
    lines = ["<clocks_throttle_reason_hw_slowdown>Not Active</clocks_throttle_reason_hw_slowdown>",
             "<clocks_throttle_reason_gpu_idle>Active</clocks_throttle_reason_gpu_idle>",
             "errorCode: DCGM_FR_CLOCKS_EVENT_POWER"]
    f = found(pack, *lines)
    assert all(a == "none" for a in f["action"].to_list())
    assert "thermal_power.gpu_thermal_codes" not in f["rule_id"].to_list()
