"""scripts/nvml_check.py: its no-NVML path for real (this host has no driver), its GPU path via the fake."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

import recovery_logs.sources.nvml as nvml_mod

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "nvml_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("nvml_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _host_has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_script_without_nvml_exits_9_with_one_clear_line():
    if _host_has_nvml():  # pragma: no cover - only on a GPU host
        pytest.skip("this host has NVML; the GPU path is exercised by running the script itself")
    r = subprocess.run([sys.executable, str(SCRIPT), "--wait-ms", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 9
    assert r.stderr.startswith("nvml_check: NVML unavailable on ") and "NVML Shared Library Not Found" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_script_prints_every_reading_per_gpu(monkeypatch, kit, capsys):
    g = [kit.FakeGpu("GPU-aaaa", b"00000000:1B:00.0"),
         kit.FakeGpu("GPU-bbbb", b"00000000:CB:00.0", remap=(1, 1, 1, 0), unsupported={"nvmlDeviceGetRetiredPages"})]
    fake = kit.FakeNvml(g)
    fake.xid(g[1], 79)
    monkeypatch.setattr(nvml_mod, "load_nvml", lambda: fake)
    assert _load().main(["--wait-ms", "5"]) == 0
    out = capsys.readouterr().out
    assert "driver_version: 570.86.15" in out and "gpus: 2" in out
    assert out.count("name: NVIDIA H200") == 2
    assert 'remapped_rows: {"correctable": 1, "failure": 0, "pending": 1, "uncorrectable": 1}' in out
    assert 'retired_pages: {"error": "NotSupported"}' in out
    assert "supported_event_types: 0xa" in out
    assert "== poll 2: 0 events" in out
    assert "  NVML gpu=1 uuid=GPU-bbbb pci=0000:cb:00.0 xid=79" in out
    assert 'unsupported readings: {"0": [], "1": ["retired_pages"]}' in out
