"""A fake NVML with pynvml's names, constants and real ``pynvml.NVMLError`` subclasses.

Handles are the ``FakeGpu`` objects. Each GPU's state is plain attributes the test changes
between polls; ``lost`` (an NVMLError instance) makes every call on that GPU raise it, and a
function name in ``unsupported`` makes that call raise ``NVMLError_NotSupported``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest

from recovery_logs.testing import FakeClock


@dataclass
class FakeGpu:
    uuid: str
    bus_id: bytes
    ecc: dict = field(default_factory=lambda: {(0, 0): 0, (1, 0): 0, (0, 1): 0, (1, 1): 0})  # (errType, counter)
    remap: tuple = (0, 0, 0, 0)            # correctable, uncorrectable, pending, failure
    retired: dict = field(default_factory=lambda: {0: [], 1: []})
    retired_pending: int = 0
    reasons: int = 0
    temp: int = 45
    slowdown: int = 87
    power_mw: int = 300_000
    limit_mw: int = 700_000
    nvlinks: dict = field(default_factory=lambda: {0: 1, 1: 1})
    nvlink_counters: dict = field(default_factory=dict)  # (link, counter) -> n
    pcie_replay: int = 0
    recovery_action: int = 0
    lost: Exception | None = None
    unsupported: set = field(default_factory=set)
    name: str = "NVIDIA H200"
    serial: str = "1650924060123"
    mig: tuple = (0, 0)                    # current, pending


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None,
                 event_set_error: Exception | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks", "NVMLError_")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.event_set_error = event_set_error
        self.queue: list[tuple[FakeGpu, int, int]] = []
        self.registered: list[tuple[FakeGpu, int]] = []
        self.waits: list[int] = []
        self.calls: list[str] = []
        self.shutdown_called = False

    # --- helpers for tests
    def xid(self, gpu: FakeGpu, code: int) -> None:
        self.queue.append((gpu, pynvml.nvmlEventTypeXidCriticalError, code))

    def _g(self, gpu: FakeGpu, fname: str) -> FakeGpu:
        self.calls.append(fname)
        if gpu.lost is not None:
            raise gpu.lost
        if fname in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    # --- library
    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080

    def nvmlDeviceGetName(self, h):
        return self._g(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetSerial(self, h):
        return self._g(h, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetMigMode(self, h):
        return list(self._g(h, "nvmlDeviceGetMigMode").mig)

    def nvmlDeviceGetSupportedEventTypes(self, h):
        self._g(h, "nvmlDeviceGetSupportedEventTypes")
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self._g(self.gpus[i], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, h):
        return self._g(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._g(h, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetTotalEccErrors(self, h, err, counter):
        return self._g(h, "nvmlDeviceGetTotalEccErrors").ecc[(err, counter)]

    def nvmlDeviceGetRemappedRows(self, h):
        return self._g(h, "nvmlDeviceGetRemappedRows").remap

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return list(self._g(h, "nvmlDeviceGetRetiredPages").retired[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._g(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._g(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._g(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._g(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        assert which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return self._g(h, "nvmlDeviceGetTemperatureThreshold").slowdown

    def nvmlDeviceGetPowerUsage(self, h):
        return self._g(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._g(h, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._g(h, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetFieldValues(self, h, ids):
        g = self._g(h, "nvmlDeviceGetFieldValues")
        assert ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        return [SimpleNamespace(fieldId=ids[0], nvmlReturn=0, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                value=SimpleNamespace(uiVal=g.recovery_action))]

    def nvmlDeviceGetNvLinkState(self, h, link):
        g = self._g(h, "nvmlDeviceGetNvLinkState")
        if link not in g.nvlinks:
            raise pynvml.NVMLError_InvalidArgument()
        return g.nvlinks[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return self._g(h, "nvmlDeviceGetNvLinkErrorCounter").nvlink_counters.get((link, counter), 0)

    def nvmlEventSetCreate(self):
        if self.event_set_error is not None:
            raise self.event_set_error
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types, es):
        assert es == "event-set"
        self._g(h, "nvmlDeviceRegisterEvents")
        self.registered.append((h, types))

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        self.waits.append(timeout_ms)
        if not self.queue:
            raise pynvml.NVMLError_Timeout()
        gpu, etype, data = self.queue.pop(0)
        return SimpleNamespace(device=gpu, eventType=etype, eventData=data, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, es):
        pass


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa-0000", b"00000000:1B:00.0"), FakeGpu("GPU-bbbb-0001", b"00000000:CB:00.0")]


@pytest.fixture
def fake(gpus) -> FakeNvml:
    return FakeNvml(gpus)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_780_000_000.0)


@pytest.fixture
def kit() -> SimpleNamespace:
    """The fake classes, for tests that build their own (importlib mode forbids importing conftest)."""
    return SimpleNamespace(FakeGpu=FakeGpu, FakeNvml=FakeNvml, FakeClock=FakeClock)
