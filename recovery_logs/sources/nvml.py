"""NVML agent: GPU health straight from the driver, as events in ``schema.EVENT_SCHEMA``.

Reads NVML through NVIDIA's bindings (``nvidia-ml-py``, module ``pynvml``) or any object with
the same names (the tests' fake): XID critical errors pushed through an NVML event set
(``wait_xid``), and polled state (``poll_once``): ECC counters, row remapping, retired pages,
clock event (throttle) reasons, temperature, power, NVLink state and error counters, the PCIe
replay counter and the GPU recovery action. Events have ``source="nvml"``, ``file="nvml"``,
``line=0`` and a stable key=value message that ``rules/nvml.toml`` matches::

    NVML gpu=3 uuid=GPU-8f1e... pci=0000:cb:00.0 remapped_rows pending=1 failure=0 correctable=2 uncorrectable=1
    NVML gpu=3 uuid=GPU-8f1e... pci=0000:cb:00.0 xid=79
    NVML gpu=3 uuid=GPU-8f1e... pci=0000:cb:00.0 inventory name="NVIDIA H200" serial="1650924060123" form_factor=sxm link_count=18 driver=570.86.15 cuda=12.8 mig=disabled

**Inventory.** One ``inventory`` event per GPU at start and whenever its inventory changes:
name, serial, board part number, form factor (from the name when it says SXM/PCIe/NVL, else
``sxm`` when NVLinks answer, else ``unknown``: NVML has no form-factor call), the number of
NVLinks that answer, driver and CUDA driver versions, MIG mode (``enabled``/``disabled``, with
``mig_pending`` when a change waits for a reset). A field NVML cannot give is left out; values
with spaces are double-quoted. The engine keeps the latest inventory per host and uses it to
name the GPU (index, UUID) behind a kernel log's PCI bus id (``recovery_logs.inventory``).

Contract:

* **Change-only.** A reading is emitted when first read, then only when it changes
  (temperature, power: when the level changes or it moves a step). XIDs as they arrive.
* **A GPU that stops answering is an event.** ``GpuIsLost`` / ``Unknown`` / ``ResetRequired``
  from one device gives one ``gpu_lost`` event, later ``gpu_answering``; other GPUs go on.
* **Unsupported is not an error.** ``NotSupported``, ``NoPermission``, ``FunctionNotFound``,
  ``InvalidArgument``: the reading is skipped from then on (``NvmlAgent.unsupported``). Any
  other NVML error is a ``read_error`` event (change-only) and the poll goes on.
* **No NVML, no GPU** raises ``NVMLUnavailable`` (CLI exit 9) with the reason.
* **Blocking.** ``poll_once``: only the NVML calls; ``wait_xid(timeout_ms)``: up to the
  timeout; ``run``: until ``stop_after`` cycles, or forever.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from recovery_logs.errors import NVMLUnavailable, SourceError
from recovery_logs.schema import EVENT_SCHEMA, SourceKind, check_events, conform
from recovery_logs.timeutil import ns_to_iso

__all__ = ["NvmlAgent", "NvmlThresholds", "RECOVERY_ACTIONS", "load_nvml", "parse_identity"]

# NVML return codes (nvml.h; the same values as pynvml.NVML_ERROR_*).
_ERR_INVALID_ARGUMENT, _ERR_NOT_SUPPORTED, _ERR_NO_PERMISSION = 2, 3, 4
_ERR_TIMEOUT, _ERR_FUNCTION_NOT_FOUND = 10, 13
_ERR_GPU_IS_LOST, _ERR_RESET_REQUIRED, _ERR_UNKNOWN = 15, 16, 999
_UNSUPPORTED = frozenset({_ERR_INVALID_ARGUMENT, _ERR_NOT_SUPPORTED, _ERR_NO_PERMISSION, _ERR_FUNCTION_NOT_FOUND})
_LOST = frozenset({_ERR_GPU_IS_LOST, _ERR_RESET_REQUIRED, _ERR_UNKNOWN})

# nvmlDeviceGpuRecoveryAction_t
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_p2p_and_reset",
                    5: "recover_imex", 6: "pcie_bus_reset", 7: "system_reboot"}
_FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

# nvmlClocksEventReason* bits that explain a slow GPU (idle, app clocks, sync boost and
# SW power cap are routine and are shown in the mask but never trigger an event).
_REASONS = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
            0x80: "hw_power_brake_slowdown"}

# NVLink error counters (nvmlNvLinkErrorCounter_t).
_NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))

_TEXT_FIELDS = frozenset({"name", "serial", "board_part"})
_ID_RE = re.compile(r"^NVML gpu=(?P<gpu>\S+) uuid=(?P<uuid>\S+) pci=(?P<pci>\S+) ")


@dataclass(frozen=True)
class NvmlThresholds:
    """When temperature and power readings count as a change worth an event."""

    temp_high_c: int = 85          # level "high" at or above
    temp_critical_c: int = 90      # level "critical" at or above when NVML has no slowdown threshold
    temp_step_c: int = 5           # also emit when it moved this far since the last event
    power_step_w: float = 100.0    # emit when power moved this far since the last event
    power_limit_frac: float = 0.95  # level "at_limit" at or above this share of the enforced limit
    max_nvlinks: int = 18          # links probed per GPU (NVML_NVLINK_MAX_LINKS is 18..36 by version)


def load_nvml() -> Any:
    """Import pynvml, or raise NVMLUnavailable saying how to get it."""
    try:
        import pynvml  # nvidia-ml-py: optional extra [nvml], imported only when the agent starts
    except ImportError as exc:
        raise NVMLUnavailable("nvml: the NVIDIA bindings are not installed (pip install 'recovery-logs[nvml]'"
                              " or pip install nvidia-ml-py)") from exc
    return pynvml


def parse_identity(message: str) -> dict[str, str] | None:
    """``{"gpu", "uuid", "pci"}`` from an agent message, or None when it is not one."""
    m = _ID_RE.match(message)
    return m.groupdict() if m else None


def _pci(bus_id: Any) -> str:
    """'00000000:CB:00.0' (NVML) -> '0000:cb:00.0' (the kernel's spelling)."""
    s = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else str(bus_id)
    s = s.strip().lower()
    dom, sep, rest = s.partition(":")
    if sep and len(dom) == 8 and dom.startswith("0000"):
        s = f"{dom[4:]}:{rest}"
    return s or "unknown"


def _err_name(exc: BaseException) -> str:
    return type(exc).__name__.removeprefix("NVMLError_") or "NVMLError"


@dataclass
class _Device:
    index: int
    handle: Any = None
    uuid: str = "unknown"
    pci: str = "unknown"
    lost: bool = False
    lost_error: BaseException | None = None
    identified: bool = False

    @property
    def prefix(self) -> str:
        return f"NVML gpu={self.index} uuid={self.uuid} pci={self.pci}"


class NvmlAgent:
    """Reads NVML on one node and emits change-only events.

    ``nvml`` is ``pynvml`` or an object with the same names; ``clock`` returns epoch seconds;
    ``sleep`` is used by ``wait_xid`` when the platform has no XID event support. The
    constructor initialises NVML (``nvmlInit``) and opens the event set; ``close()`` releases
    both (the agent is also a context manager).
    """

    def __init__(self, nvml: Any = None, host: str = "localhost", clock: Callable[[], float] = time.time, *,
                 sleep: Callable[[float], None] = time.sleep, thresholds: NvmlThresholds | None = None,
                 max_buffer: int = 100_000) -> None:
        self.nvml = load_nvml() if nvml is None else nvml
        self.host, self.clock, self.sleep, self.max_buffer = host, clock, sleep, max_buffer
        self.thresholds = thresholds or NvmlThresholds()
        self.unsupported: dict[int, set[str]] = {}     # GPU index -> readings it does not support
        self.xid_supported: dict[int, bool] = {}       # GPU index -> registered for XID events
        self.stats = {"delivered": 0, "sink_errors": 0, "dropped": 0}
        self._last: dict[tuple[int, str], Any] = {}
        self._seq = 0
        self._event_set: Any = None
        self._pending: list[pl.DataFrame] = []
        self._sink_error: SourceError | None = None
        self._init()

    # ----- lifecycle -------------------------------------------------------------------------
    def _nvml_error(self) -> type[BaseException]:
        return getattr(self.nvml, "NVMLError", Exception)

    def _init(self) -> None:
        err = self._nvml_error()
        try:
            self.nvml.nvmlInit()
        except err as exc:
            raise NVMLUnavailable(f"nvml: cannot initialise NVML on this host ({exc}); is the NVIDIA driver "
                                  "installed and loaded?", host=self.host, error=_err_name(exc)) from exc
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
        except err as exc:
            self._shutdown()
            raise NVMLUnavailable(f"nvml: cannot count GPUs ({exc})", host=self.host,
                                  error=_err_name(exc)) from exc
        if count == 0:
            self._shutdown()
            raise NVMLUnavailable("nvml: NVML is loaded but reports no GPUs on this host", host=self.host)
        self.devices = [_Device(i) for i in range(count)]
        for dev in self.devices:
            self._open(dev)
        self._open_event_set()

    def _open(self, dev: _Device) -> bool:
        """Get the handle, then (once) the UUID and PCI id of one device; False when NVML gives an
        error for it (kept in ``dev.lost_error``). A UUID or PCI id NVML cannot give stays "unknown"."""
        try:
            if dev.handle is None:
                dev.handle = self.nvml.nvmlDeviceGetHandleByIndex(dev.index)
            if not dev.identified:
                uuid = self._optional("nvmlDeviceGetUUID", dev.handle)
                info = self._optional("nvmlDeviceGetPciInfo", dev.handle)
                dev.uuid = str(uuid) if uuid else "unknown"
                dev.pci = _pci(info.busId) if info is not None else "unknown"
                dev.identified = True
        except self._nvml_error() as exc:
            dev.lost_error = exc
            return False
        return True

    def _open_event_set(self) -> None:
        try:
            self._event_set = self.nvml.nvmlEventSetCreate()
        except self._nvml_error():
            self._event_set = None
            return
        for dev in self.devices:
            self._register_xid(dev)

    def _register_xid(self, dev: _Device) -> None:
        """Register one device for XID critical errors (again after it was lost at start)."""
        self.xid_supported[dev.index] = False
        if dev.handle is None or self._event_set is None:
            return
        with contextlib.suppress(self._nvml_error()):
            xid_type = getattr(self.nvml, "nvmlEventTypeXidCriticalError", 0x8)
            self.nvml.nvmlDeviceRegisterEvents(dev.handle, xid_type, self._event_set)
            self.xid_supported[dev.index] = True

    def _shutdown(self) -> None:
        with contextlib.suppress(self._nvml_error()):
            self.nvml.nvmlShutdown()

    def close(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(self._nvml_error()):
                self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self._shutdown()

    def __enter__(self) -> NvmlAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- readers: each returns a dict of raw values (or raises the NVML error) -------------
    def _read_ecc(self, h: Any) -> dict[str, Any]:
        n, get = self.nvml, self.nvml.nvmlDeviceGetTotalEccErrors
        corr, unc = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        return {"volatile_corrected": int(get(h, corr, vol)), "volatile_uncorrected": int(get(h, unc, vol)),
                "aggregate_corrected": int(get(h, corr, agg)), "aggregate_uncorrected": int(get(h, unc, agg))}

    def _read_remapped_rows(self, h: Any) -> dict[str, Any]:
        corr, unc, pending, failure = self.nvml.nvmlDeviceGetRemappedRows(h)
        return {"pending": int(bool(pending)), "failure": int(bool(failure)), "correctable": int(corr),
                "uncorrectable": int(unc)}

    def _read_retired_pages(self, h: Any) -> dict[str, Any]:
        n = self.nvml
        sbe = len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
        dbe = len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
        pending = int(n.nvmlDeviceGetRetiredPagesPendingStatus(h))
        return {"sbe": sbe, "dbe": dbe, "pending": pending}

    def _optional(self, fn: str, *args: Any) -> Any:
        """Call an NVML function whose absence is fine: None when the driver lacks it or it is
        unsupported here; a lost GPU or any other NVML error still raises."""
        call = getattr(self.nvml, fn, None)
        if call is None:
            return None
        try:
            return call(*args)
        except self._nvml_error() as exc:
            if getattr(exc, "value", None) in _UNSUPPORTED:
                return None
            raise

    def _read_clock_events(self, h: Any) -> dict[str, Any]:
        mask = self._optional("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:  # older drivers only have the deprecated name
            mask = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        active = [name for bit, name in _REASONS.items() if int(mask) & bit]
        return {"active": ",".join(active) or "none", "mask": f"0x{int(mask):08x}"}

    def _read_temperature(self, h: Any) -> dict[str, Any]:
        n, th = self.nvml, self.thresholds
        t = int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        slowdown = self._optional("nvmlDeviceGetTemperatureThreshold", h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        crit = int(slowdown) if slowdown else th.temp_critical_c
        level = "critical" if t >= crit else "high" if t >= th.temp_high_c else "normal"
        return {"celsius": t, "level": level, "slowdown_c": int(slowdown) if slowdown else None}

    def _read_power(self, h: Any) -> dict[str, Any]:
        watts = round(int(self.nvml.nvmlDeviceGetPowerUsage(h)) / 1000.0, 1)
        limit_mw = self._optional("nvmlDeviceGetEnforcedPowerLimit", h)
        limit = round(int(limit_mw) / 1000.0, 1) if limit_mw else None
        level = "at_limit" if limit and watts >= self.thresholds.power_limit_frac * limit else "normal"
        return {"watts": watts, "limit_w": limit, "level": level}

    def _read_pcie(self, h: Any) -> dict[str, Any]:
        return {"replay_count": int(self.nvml.nvmlDeviceGetPcieReplayCounter(h))}

    def _read_recovery_action(self, h: Any) -> dict[str, Any]:
        n = self.nvml
        fid = getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _FI_GPU_RECOVERY_ACTION)
        fv = n.nvmlDeviceGetFieldValues(h, [fid])[0]
        ret = int(getattr(fv, "nvmlReturn", 0))
        if ret != 0:
            raise n.NVMLError(ret)
        val = fv.value
        vtype = int(getattr(fv, "valueType", 1))
        attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(vtype, "uiVal")
        v = int(getattr(val, attr))
        return {"value": v, "name": RECOVERY_ACTIONS.get(v, "unknown")}

    def _read_nvlink(self, h: Any) -> dict[int, dict[str, Any]]:
        links: dict[int, dict[str, Any]] = {}
        for link in range(self.thresholds.max_nvlinks):
            state = self._optional("nvmlDeviceGetNvLinkState", h, link)
            if state is None:
                continue
            row: dict[str, Any] = {"state": "active" if int(state) else "inactive"}
            for name, counter in _NVLINK_COUNTERS:
                row[name] = self._optional("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            links[link] = row
        if not links:
            raise self.nvml.NVMLError(_ERR_NOT_SUPPORTED)
        return links

    _TOPICS = ("ecc", "remapped_rows", "retired_pages", "clock_events", "temperature", "power", "pcie",
               "recovery_action", "nvlink")

    def _reader(self, topic: str) -> Callable[[Any], Any]:
        return getattr(self, f"_read_{topic}")

    def _system(self) -> dict[str, Any]:
        """Driver and CUDA driver versions (once per agent; NVML answers them without a device)."""
        if not hasattr(self, "_system_info"):
            out: dict[str, Any] = {}
            try:
                drv = self._optional("nvmlSystemGetDriverVersion")
                cuda = self._optional("nvmlSystemGetCudaDriverVersion")
            except self._nvml_error():
                drv = cuda = None
            if drv:
                out["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
            if cuda:
                out["cuda"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
            self._system_info = out
        return self._system_info

    def _read_inventory(self, dev: _Device) -> dict[str, Any]:
        """The GPU's identity and configuration (what the engine joins on). Unsupported fields are left out."""
        h, out = dev.handle, dict[str, Any]()
        for key, fn in (("name", "nvmlDeviceGetName"), ("serial", "nvmlDeviceGetSerial"),
                        ("board_part", "nvmlDeviceGetBoardPartNumber")):
            v = self._optional(fn, h)
            if v:
                out[key] = v.decode(errors="replace") if isinstance(v, bytes) else str(v)
        # links that answered the nvlink reading (no second probe of every link)
        links = sum(1 for (i, k) in self._last if i == dev.index and k.startswith("nvlink:"))
        name = out.get("name", "").lower()
        out["form_factor"] = ("pcie" if "pcie" in name else "nvl" if name.endswith(" nvl") else
                              "sxm" if "sxm" in name or links else "unknown")
        out["link_count"] = links
        out.update(self._system())
        mig = self._optional("nvmlDeviceGetMigMode", h)
        if mig is not None:
            cur, pend = (mig if isinstance(mig, list | tuple) else (mig, mig))[:2]
            out["mig"] = "enabled" if int(cur) else "disabled"
            if int(pend) != int(cur):
                out["mig_pending"] = "enabled" if int(pend) else "disabled"
        return out

    @staticmethod
    def _inventory_body(inv: dict[str, Any]) -> str:
        """``inventory k=v ...``; text fields (name, serial, part number) and any value with a space,
        a quote or ``=`` are double-quoted with ``\\`` and ``"`` escaped (recovery_logs.inventory parses it)."""
        def fmt(k: str, v: Any) -> str:
            t = str(v)
            if k in _TEXT_FIELDS or not t or any(c.isspace() or c in '"=\\' for c in t):
                return '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'
            return t
        return "inventory " + " ".join(f"{k}={fmt(k, v)}" for k, v in inv.items())

    def read_device(self, index: int) -> dict[str, Any]:
        """Everything NVML answers for one GPU, raw (for ``scripts/nvml_check.py``): the readers'
        dicts; a reading that failed shows as ``{"error": name}``."""
        dev = self.devices[index]
        ok = self._open(dev)
        out: dict[str, Any] = {"gpu": dev.index, "uuid": dev.uuid, "pci": dev.pci}
        if not ok:
            out["error"] = _err_name(dev.lost_error) if dev.lost_error else "unknown"
            return out
        for topic in self._TOPICS:
            try:
                out[topic] = self._reader(topic)(dev.handle)
            except self._nvml_error() as exc:
                out[topic] = {"error": _err_name(exc)}
        return out

    # ----- change detection and messages -----------------------------------------------------
    def _changed(self, dev: _Device, topic: str, reading: dict[str, Any]) -> bool:
        """Record and report whether ``reading`` is news: first seen, changed, or (temperature,
        power) changed level or moved a step; clock events count only the reasons in ``_REASONS``."""
        prev, th = self._last.get((dev.index, topic)), self.thresholds
        if prev is None or topic not in ("temperature", "power", "clock_events"):
            new = prev != reading
        elif topic == "clock_events":
            new = prev["active"] != reading["active"]
        else:
            value, step = ("celsius", th.temp_step_c) if topic == "temperature" else ("watts", th.power_step_w)
            new = prev["level"] != reading["level"] or abs(prev[value] - reading[value]) >= step
        if new:
            self._last[(dev.index, topic)] = reading
        return new

    @staticmethod
    def _body(topic: str, reading: dict[str, Any]) -> str:
        return " ".join([topic] + [f"{k}={v}" for k, v in reading.items() if v is not None])

    def _poll_device(self, dev: _Device, out: list[str]) -> None:
        err = self._nvml_error()
        was_lost = dev.lost
        if not self._open(dev):
            exc = dev.lost_error
            if getattr(exc, "value", None) in _LOST:
                self._mark_lost(dev, exc, "identity", out)
            elif self._changed(dev, "read_error:identity", {"error": _err_name(exc) if exc else "unknown"}):
                out.append(f"{dev.prefix} read_error reading=identity error={_err_name(exc) if exc else 'unknown'}")
            return
        skip = self.unsupported.setdefault(dev.index, set())
        answered = False
        for topic in self._TOPICS:
            if topic in skip:
                continue
            try:
                reading = self._reader(topic)(dev.handle)
            except err as exc:
                code = getattr(exc, "value", None)
                if code in _LOST:
                    self._mark_lost(dev, exc, topic, out)
                    return
                if code in _UNSUPPORTED:
                    skip.add(topic)
                    continue
                if self._changed(dev, f"read_error:{topic}", {"error": _err_name(exc)}):
                    out.append(f"{dev.prefix} read_error reading={topic} error={_err_name(exc)}")
                continue
            if not answered and was_lost:
                dev.lost = False
                out.append(f"{dev.prefix} gpu_answering")
                if not self.xid_supported.get(dev.index):
                    self._register_xid(dev)
            answered = True
            self._last.pop((dev.index, f"read_error:{topic}"), None)
            if topic == "nvlink":
                self._emit_links(dev, reading, out)
            elif self._changed(dev, topic, reading):
                out.append(f"{dev.prefix} {self._body(topic, reading)}")
        if answered:
            self._emit_inventory(dev, out)

    def _emit_inventory(self, dev: _Device, out: list[str]) -> None:
        """The inventory event, at the first poll a GPU answers and whenever it changes (an NVML
        error here only skips the inventory for this poll: the readings above report losses)."""
        try:
            inv = self._read_inventory(dev)
        except self._nvml_error():
            return
        if self._last.get((dev.index, "inventory")) != inv:
            self._last[(dev.index, "inventory")] = inv
            out.append(f"{dev.prefix} {self._inventory_body(inv)}")

    def _emit_links(self, dev: _Device, links: dict[int, dict[str, Any]], out: list[str]) -> None:
        for link, row in links.items():
            prev = self._last.get((dev.index, f"nvlink:{link}"))
            if self._changed(dev, f"nvlink:{link}", row):
                body = self._body(f"nvlink link={link}", row)
                if prev is not None and prev["state"] != row["state"]:
                    body += f" was={prev['state']}"
                out.append(f"{dev.prefix} {body}")

    def _mark_lost(self, dev: _Device, exc: BaseException | None, reading: str, out: list[str]) -> None:
        if not dev.lost:
            dev.lost = True
            name = _err_name(exc) if exc is not None else "unknown"
            out.append(f"{dev.prefix} gpu_lost error={name} reading={reading}")

    # ----- public API --------------------------------------------------------------------------
    def poll_once(self) -> pl.DataFrame:
        """Read every GPU once; return the events for readings that changed (EVENT_SCHEMA)."""
        messages: list[str] = []
        for dev in self.devices:
            self._poll_device(dev, messages)
        return self._frame(messages)

    def wait_xid(self, timeout_ms: int) -> pl.DataFrame:
        """Wait up to ``timeout_ms`` for XID events; return them (may be empty).

        After the first event, events already queued are drained without waiting further.
        Without event support on this platform it just sleeps ``timeout_ms``.
        """
        if self._event_set is None:
            if timeout_ms > 0:
                self.sleep(timeout_ms / 1000.0)
            return self._frame([])
        n, err = self.nvml, self._nvml_error()
        xid_type = getattr(n, "nvmlEventTypeXidCriticalError", 0x8)
        messages: list[str] = []
        wait = timeout_ms
        for _ in range(256):
            try:
                data = n.nvmlEventSetWait_v2(self._event_set, int(wait))
            except err as exc:
                if getattr(exc, "value", None) != _ERR_TIMEOUT:  # reported once; sleep instead of spinning
                    if self._last.get((-1, "event_wait")) != _err_name(exc):
                        self._last[(-1, "event_wait")] = _err_name(exc)
                        messages.append(f"NVML gpu=unknown uuid=unknown pci=unknown read_error reading=xid_events "
                                        f"error={_err_name(exc)}")
                    if wait > 0:
                        self.sleep(wait / 1000.0)
                break
            self._last.pop((-1, "event_wait"), None)
            wait = 0
            if int(data.eventType) & xid_type:
                messages.append(f"{self._device_of(data.device).prefix} xid={int(data.eventData)}")
        return self._frame(messages)

    def _device_of(self, handle: Any) -> _Device:
        try:
            uuid = str(self.nvml.nvmlDeviceGetUUID(handle))
        except self._nvml_error():
            uuid = None
        for dev in self.devices:
            if dev.handle is handle or (uuid is not None and dev.uuid == uuid):
                return dev
        return _Device(index=-1, uuid=uuid or "unknown")

    def run(self, sink: Callable[[pl.DataFrame], None], interval_s: float, stop_after: int | None = None) -> int:
        """Poll every ``interval_s``; in between, wait for XID events and hand each batch to ``sink``
        as it arrives. Stops after ``stop_after`` poll cycles (None: never); the last cycle only
        drains XID events already queued. Returns the number of events delivered.

        A sink that raises ``SourceError`` (e.g. VictoriaLogs down) does not stop the agent: the
        events are kept (at most ``max_buffer``; the oldest are dropped and counted) and sent with
        the next batch. Events still undelivered when ``run`` ends raise that ``SourceError``.
        """
        delivered, cycles = 0, 0
        while stop_after is None or cycles < stop_after:
            deadline = self.clock() + interval_s
            delivered += self._deliver(sink, self.poll_once())
            cycles += 1
            last = stop_after is not None and cycles >= stop_after
            while True:
                remaining_ms = 0 if last else max(0, int((deadline - self.clock()) * 1000))
                xids = self.wait_xid(remaining_ms)
                delivered += self._deliver(sink, xids)
                if remaining_ms == 0 or xids.height == 0:
                    break
        if self._pending:
            n = sum(f.height for f in self._pending)
            raise SourceError(f"nvml agent: {n} events were not delivered", host=self.host,
                              reason=str(self._sink_error)) from self._sink_error
        return delivered

    def _deliver(self, sink: Callable[[pl.DataFrame], None], frame: pl.DataFrame) -> int:
        if frame.height:
            self._pending.append(frame)
        if not self._pending:
            return 0
        batch = pl.concat(self._pending)
        try:
            sink(batch)
        except SourceError as exc:
            self._sink_error = exc
            self.stats["sink_errors"] += 1
            while sum(f.height for f in self._pending) > self.max_buffer and len(self._pending) > 1:
                self.stats["dropped"] += self._pending.pop(0).height
            return 0
        self._pending.clear()
        self.stats["delivered"] += batch.height
        return batch.height

    def _frame(self, messages: list[str]) -> pl.DataFrame:
        n, now_ns = len(messages), int(self.clock() * 1_000_000_000)
        df = pl.DataFrame({"time": [now_ns] * n, "time_inferred": [False] * n, "host": [self.host] * n,
                           "source": [SourceKind.NVML.value] * n, "file": ["nvml"] * n, "line": [0] * n,
                           "seq": list(range(self._seq, self._seq + n)), "message": messages},
                          schema_overrides={"time": pl.Int64, "message": pl.String, "host": pl.String,
                                            "source": pl.String, "file": pl.String})
        self._seq += n
        return check_events(conform(df, EVENT_SCHEMA), "nvml agent")

    @staticmethod
    def vl_rows(events: pl.DataFrame) -> list[dict[str, Any]]:
        """VictoriaLogs JSON-line rows: ``_time`` (RFC3339, ns), ``_msg``, host, unit=nvml, gpu, uuid, pci."""
        rows = []
        times = events.get_column("time").dt.epoch("ns").to_list()
        for t, host, msg in zip(times, events.get_column("host").to_list(), events.get_column("message").to_list(),
                                strict=True):
            ident = parse_identity(msg or "") or {"gpu": "unknown", "uuid": "unknown", "pci": "unknown"}
            rows.append({"_time": ns_to_iso(t), "_msg": msg, "host": host, "unit": "nvml", **ident})
        return rows
