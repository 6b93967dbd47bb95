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


# ---- second GPU-side pass (d6g dev excerpts): sources next to each line ---------------------------------

def test_cuda_nvlink_uncorrectable_in_the_runtimes_words_is_nvlink(tmp_path):
    # MIC-DKFZ/nnUNet#1519: cudaGetErrorString(cudaErrorNvlinkUncorrectable), not the docs' sentence
    inc = replay_text(tmp_path, "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution\n"
                                "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                                "stacktrace below might be incorrect.\n").incidents[0]
    assert inc.category == "nvlink" and inc.root_rule == "nvlink.cuda_uncorrectable"


def test_nccl_buffer_allocation_failure_is_gpu_oom_not_an_nccl_setup_error(tmp_path):
    # NCCL src/include/alloc.h ncclCudaCalloc: the WARN, then the unhandled-CUDA-error tail NCCL returns
    res = replay_text(tmp_path, "gpu-n1:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc "
                                "6291456 bytes\n"
                                "gpu-n1:3063028:3066152 [3] NCCL INFO transport/p2p.cc:204 -> 1\n"
                                "[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.\n")
    assert res.incidents[0].category == "oom_gpu"


def test_a_hot_gpu_reading_is_a_look_and_loses_to_a_fault_line(tmp_path):
    row = "| N/A   93C    P0   298W / 300W |  30000MiB / 32510MiB |    100%      Default |\n"
    alone = replay_text(tmp_path / "a", row).incidents
    assert [i.category for i in alone] == ["thermal_power"] and alone[0].suggested_action == "investigate"
    # with an Xid 79 on the same node the hot reading is not the story
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    assert replay_text(tmp_path / "b", row + xid).incidents[0].category == "xid"
    cool = "| N/A   61C    P0   298W / 300W |  30000MiB / 32510MiB |    100%      Default |\n"
    assert replay_text(tmp_path / "c", cool).incidents == []


@pytest.mark.parametrize(("line", "rule_id"), [
    # NVIDIA/TensorRT#4258, linghu8812/tensorrt_inference#117, abetlen/llama-cpp-python#1944
    ("[11/22/2024-13:40:47] [E] Error[1]: [defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime (out of "
     "memory)", "oom_gpu.inference_runtime_alloc"),
    ("[08/03/2022-23:18:05] [E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)",
     "oom_gpu.inference_runtime_alloc"),
    ("llama_kv_cache_init: failed to allocate buffer for kv cache", "oom_gpu.inference_runtime_alloc"),
    # deepspeedai/DeepSpeedExamples#186
    ("[2022-07-13 21:09:13,651] [WARNING] [stage3.py:2391:step] 2 pytorch allocator cache flushes since last step. "
     "this happens when there is high memory pressure and is detrimental to performance.", "oom_gpu.memory_pressure"),
    # linux v5.6+ therm_throt.c, thomas-krenn/check_ipmi_sensor_v3#66, NVIDIA/gpu-operator#492
    ("[  836.709562] CPU7: Core temperature is above threshold, cpu clock is throttled (total events = 219)",
     "thermal_power.cpu_throttle"),
    ("3    | Dec-09-2024 | 21:12:29 | Power Supply 2 PS2 Status                         | Power Supply      | Critical | "
     "Power Supply Failure detected", "thermal_power.psu_failure"),
    ("               NVRM: BAR1 is 0M @ 0x0 (PCI:0000:14:00.0)", "pcie.nvidia_bar_invalid"),
])
def test_second_pass_wordings(pack, line, rule_id):
    assert found(pack, line)["rule_id"].to_list() == [rule_id]
