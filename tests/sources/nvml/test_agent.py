"""NvmlAgent driven through a fake NVML that raises real pynvml error classes."""

from __future__ import annotations

import polars as pl
import pynvml
import pytest

from recovery_logs.errors import NVMLUnavailable, SourceError, VictoriaLogsError
from recovery_logs.schema import EVENT_SCHEMA, check_events
from recovery_logs.sources.nvml import NvmlAgent, parse_identity

G0 = "NVML gpu=0 uuid=GPU-aaaa-0000 pci=0000:1b:00.0"
G1 = "NVML gpu=1 uuid=GPU-bbbb-0001 pci=0000:cb:00.0"


def msgs(df: pl.DataFrame) -> list[str]:
    return df.get_column("message").to_list()


def test_first_poll_is_a_baseline_in_event_schema(fake, clock):
    agent = NvmlAgent(fake, host="node7", clock=clock)
    df = agent.poll_once()
    check_events(df)
    assert dict(df.schema) == EVENT_SCHEMA
    assert set(df.get_column("host")) == {"node7"}
    assert set(df.get_column("source")) == {"nvml"} and set(df.get_column("file")) == {"nvml"}
    assert df.get_column("seq").to_list() == list(range(df.height))
    m = msgs(df)
    assert f"{G0} ecc volatile_corrected=0 volatile_uncorrected=0 aggregate_corrected=0 aggregate_uncorrected=0" in m
    assert f"{G1} remapped_rows pending=0 failure=0 correctable=0 uncorrectable=0" in m
    assert f"{G0} retired_pages sbe=0 dbe=0 pending=0" in m
    assert f"{G0} clock_events active=none mask=0x00000000" in m
    assert f"{G0} temperature celsius=45 level=normal slowdown_c=87" in m
    assert f"{G0} power watts=300.0 limit_w=700.0 level=normal" in m
    assert f"{G0} pcie replay_count=0" in m
    assert f"{G0} recovery_action value=0 name=none" in m
    assert f"{G0} nvlink link=1 state=active replay=0 recovery=0 crc_flit=0 crc_data=0" in m
    assert df.get_column("time").dt.epoch("ns").to_list()[0] == 1_780_000_000 * 1_000_000_000


def test_unchanged_polls_emit_nothing_and_changes_emit_once(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    first = agent.poll_once()
    assert agent.poll_once().height == 0
    gpus[1].temp = 47          # below the 5 C step: not an event
    gpus[1].power_mw = 350_000  # below the 100 W step
    gpus[0].reasons = pynvml.nvmlClocksEventReasonSwPowerCap  # routine reason: not an event
    assert agent.poll_once().height == 0
    gpus[1].remap = (2, 1, 1, 0)
    df = agent.poll_once()
    assert msgs(df) == [f"{G1} remapped_rows pending=1 failure=0 correctable=2 uncorrectable=1"]
    assert df.get_column("seq").to_list() == [first.height]  # seq keeps counting across polls
    assert agent.poll_once().height == 0


def test_remap_failure_and_ecc_dbe(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[0].remap = (0, 3, 0, 1)
    gpus[0].ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)] = 2
    gpus[0].ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC)] = 5
    assert msgs(agent.poll_once()) == [
        f"{G0} ecc volatile_corrected=0 volatile_uncorrected=2 aggregate_corrected=0 aggregate_uncorrected=5",
        f"{G0} remapped_rows pending=0 failure=1 correctable=0 uncorrectable=3",
    ]


def test_throttle_reasons_thermal_and_power(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[1].reasons = (pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
                       | pynvml.nvmlClocksEventReasonSwPowerCap)
    gpus[1].temp = 88
    gpus[1].power_mw = 690_000
    assert msgs(agent.poll_once()) == [
        f"{G1} clock_events active=hw_slowdown,hw_thermal_slowdown mask=0x0000004c",
        f"{G1} temperature celsius=88 level=critical slowdown_c=87",
        f"{G1} power watts=690.0 limit_w=700.0 level=at_limit",
    ]
    gpus[1].reasons = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert msgs(agent.poll_once()) == [f"{G1} clock_events active=hw_power_brake_slowdown mask=0x00000080"]
    gpus[1].reasons = 0
    assert msgs(agent.poll_once()) == [f"{G1} clock_events active=none mask=0x00000000"]


def test_old_driver_falls_back_to_throttle_reasons(fake, gpus, clock):
    gpus[0].unsupported.add("nvmlDeviceGetCurrentClocksEventReasons")
    gpus[0].reasons = pynvml.nvmlClocksThrottleReasonHwSlowdown
    agent = NvmlAgent(fake, host="n", clock=clock)
    assert f"{G0} clock_events active=hw_slowdown mask=0x00000008" in msgs(agent.poll_once())


def test_xid_event_set(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    assert [(g.uuid, t) for g, t in fake.registered] == [
        ("GPU-aaaa-0000", pynvml.nvmlEventTypeXidCriticalError), ("GPU-bbbb-0001", pynvml.nvmlEventTypeXidCriticalError)]
    assert agent.wait_xid(250).height == 0
    assert fake.waits == [250]
    fake.xid(gpus[1], 79)
    fake.xid(gpus[0], 48)
    df = agent.wait_xid(1000)
    check_events(df)
    assert msgs(df) == [f"{G1} xid=79", f"{G0} xid=48"]
    assert fake.waits[1:] == [1000, 0, 0]  # first waits, queued ones are drained without waiting


def test_no_event_support_sleeps_instead(kit, gpus, clock):
    slept = []
    fake = kit.FakeNvml(gpus, event_set_error=pynvml.NVMLError_NotSupported())
    agent = NvmlAgent(fake, host="n", clock=clock, sleep=slept.append)
    assert agent.wait_xid(1500).height == 0
    assert slept == [1.5]


def test_gpu_lost_is_reported_once_others_keep_reading(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[1].lost = pynvml.NVMLError_GpuIsLost()
    gpus[0].remap = (0, 0, 1, 0)
    assert msgs(agent.poll_once()) == [
        f"{G0} remapped_rows pending=1 failure=0 correctable=0 uncorrectable=0",
        f"{G1} gpu_lost error=GpuIsLost reading=ecc",
    ]
    assert agent.poll_once().height == 0  # still lost: not reported again
    gpus[1].lost = None
    assert msgs(agent.poll_once()) == [f"{G1} gpu_answering"]


def test_gpu_unknown_error_on_one_reading_counts_as_lost(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    fake_err = pynvml.NVMLError_Unknown()

    def broken(h, sensor):
        raise fake_err
    fake.nvmlDeviceGetTemperature = broken
    m = msgs(agent.poll_once())
    assert m == [f"{G0} gpu_lost error=Unknown reading=temperature", f"{G1} gpu_lost error=Unknown reading=temperature"]


def test_gpu_lost_at_start_has_no_identity_but_is_reported(kit, clock):
    bad = kit.FakeGpu("GPU-cccc", b"00000000:CB:00.0", lost=pynvml.NVMLError_GpuIsLost())
    agent = NvmlAgent(kit.FakeNvml([bad]), host="n", clock=clock)
    assert msgs(agent.poll_once()) == ["NVML gpu=0 uuid=unknown pci=unknown gpu_lost error=GpuIsLost reading=identity"]
    assert agent.xid_supported == {0: False}


def test_unsupported_readings_are_skipped_without_events(fake, gpus, clock):
    gpus[0].unsupported |= {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetFieldValues"}
    agent = NvmlAgent(fake, host="n", clock=clock)
    m = msgs(agent.poll_once())
    assert not any(x.startswith(G0) and ("retired_pages" in x or "nvlink" in x or "recovery_action" in x) for x in m)
    assert agent.unsupported[0] == {"retired_pages", "nvlink", "recovery_action"}
    fake.calls.clear()
    agent.poll_once()
    assert fake.calls.count("nvmlDeviceGetRetiredPages") == 2  # GPU 1 only (SBE + DBE); GPU 0 no longer asked
    assert fake.calls.count("nvmlDeviceGetFieldValues") == 1


def test_transient_error_is_a_read_error_event_once(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    real = fake.nvmlDeviceGetPcieReplayCounter

    def timeout(h):
        raise pynvml.NVMLError_Timeout()
    fake.nvmlDeviceGetPcieReplayCounter = timeout
    assert msgs(agent.poll_once()) == [f"{G0} read_error reading=pcie error=Timeout",
                                       f"{G1} read_error reading=pcie error=Timeout"]
    assert agent.poll_once().height == 0
    fake.nvmlDeviceGetPcieReplayCounter = real
    gpus[0].pcie_replay = 4
    assert msgs(agent.poll_once()) == [f"{G0} pcie replay_count=4"]


def test_nvlink_down_and_recovery_action(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    agent.poll_once()
    gpus[1].nvlinks[1] = 0
    gpus[1].nvlink_counters[(1, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)] = 3
    gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    assert msgs(agent.poll_once()) == [
        f"{G1} recovery_action value=2 name=node_reboot",
        f"{G1} nvlink link=1 state=inactive replay=0 recovery=3 crc_flit=0 crc_data=0 was=active",
    ]


def test_no_nvml_raises_nvml_unavailable(kit, clock):
    fake = kit.FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    with pytest.raises(NVMLUnavailable, match="cannot initialise NVML.*NVML Shared Library Not Found"):
        NvmlAgent(fake, host="n", clock=clock)
    with pytest.raises(NVMLUnavailable, match="no GPUs"):
        NvmlAgent(kit.FakeNvml([]), host="n", clock=clock)


def test_close_frees_and_shuts_down(fake, clock):
    with NvmlAgent(fake, host="n", clock=clock):
        pass
    assert fake.shutdown_called


def test_vl_rows(fake, gpus, clock):
    clock.now = 1_780_000_000.123456789
    agent = NvmlAgent(fake, host="node7", clock=clock)
    agent.poll_once()
    fake.xid(gpus[1], 79)
    rows = agent.vl_rows(agent.wait_xid(10))
    ns = int(1_780_000_000.123456789 * 1e9)
    assert rows == [{"_time": f"2026-05-28T20:26:40.{ns % 1_000_000_000:09d}Z", "_msg": f"{G1} xid=79",
                     "host": "node7", "unit": "nvml", "gpu": "1", "uuid": "GPU-bbbb-0001", "pci": "0000:cb:00.0"}]
    assert parse_identity("NVRM: Xid (PCI:0000:cb:00): 79") is None


def test_run_cycles_and_sink(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    batches: list[pl.DataFrame] = []
    fake.xid(gpus[0], 94)
    n = agent.run(batches.append, interval_s=10, stop_after=2)
    # cycle 1: baseline poll, delivered at once; wait up to 10 s for XIDs: 94 arrives (delivered at
    # once, queue drained with a 0 ms wait), wait again for the rest of the interval (times out);
    # cycle 2 (the last): nothing changed, drain queued XIDs without waiting.
    assert [b.height for b in batches][1:] == [1] and msgs(batches[1]) == [f"{G0} xid=94"]
    assert n == sum(b.height for b in batches) == agent.stats["delivered"]
    assert fake.waits == [10_000, 0, 10_000, 0]


def test_sink_failure_keeps_events_until_delivered(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock)
    calls: list[int] = []

    def flaky(frame: pl.DataFrame) -> None:
        calls.append(frame.height)
        if len(calls) == 1:
            raise VictoriaLogsError("insert failed", status=503)

    baseline = agent.poll_once().height
    agent._last.clear()  # make the next poll re-emit the baseline
    fake.xid(gpus[0], 79)
    n = agent.run(flaky, interval_s=1, stop_after=1)
    assert calls == [baseline, baseline + 1]  # failed batch is re-sent together with the XID
    assert n == baseline + 1 and agent.stats["sink_errors"] == 1 and agent.stats["dropped"] == 0


def test_buffer_is_bounded_and_undelivered_events_raise_at_the_end(fake, gpus, clock):
    agent = NvmlAgent(fake, host="n", clock=clock, max_buffer=5)
    fake.xid(gpus[1], 79)

    def down(frame: pl.DataFrame) -> None:
        raise VictoriaLogsError("connection refused")

    with pytest.raises(SourceError, match="^nvml agent: 1 events were not delivered"):
        agent.run(down, interval_s=1, stop_after=1)
    # attempt 1: the 22 baseline events (20 readings + 2 inventory) fail; attempt 2: baseline + the XID
    # fail, over max_buffer, so the oldest frame (the baseline) is dropped and counted; the XID is left.
    assert agent.stats == {"delivered": 0, "sink_errors": 2, "dropped": 22}


def test_event_wait_failure_is_reported_once_and_does_not_spin(fake, clock):
    slept: list[float] = []
    agent = NvmlAgent(fake, host="n", clock=clock, sleep=slept.append)

    def broken(es, timeout_ms):
        raise pynvml.NVMLError_Unknown()
    fake.nvmlEventSetWait_v2 = broken
    assert msgs(agent.wait_xid(2000)) == ["NVML gpu=unknown uuid=unknown pci=unknown read_error reading=xid_events "
                                          "error=Unknown"]
    assert agent.wait_xid(2000).height == 0
    assert slept == [2.0, 2.0]  # waits out the timeout instead of returning at once


def test_no_permission_on_a_gpu_is_a_read_error_not_a_lost_gpu(kit, clock):
    locked = kit.FakeGpu("GPU-dddd", b"00000000:01:00.0", lost=pynvml.NVMLError_NoPermission())
    agent = NvmlAgent(kit.FakeNvml([locked]), host="n", clock=clock)
    assert msgs(agent.poll_once()) == ["NVML gpu=0 uuid=unknown pci=unknown read_error reading=identity error=NoPermission"]
    assert agent.poll_once().height == 0


def test_missing_pci_info_keeps_the_gpu(fake, gpus, clock):
    gpus[0].unsupported.add("nvmlDeviceGetPciInfo")  # e.g. FunctionNotFound for _v3 on an old driver
    agent = NvmlAgent(fake, host="n", clock=clock)
    m = msgs(agent.poll_once())
    assert "NVML gpu=0 uuid=GPU-aaaa-0000 pci=unknown pcie replay_count=0" in m
    assert not any("gpu_lost" in x for x in m)
