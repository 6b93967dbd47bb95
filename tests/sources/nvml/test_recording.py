"""NVML recordings: record every call the agent makes, replay it, and get the same events.

Every directory under ``tests/fixtures/nvml/`` with ``calls.jsonl`` + ``agent.jsonl`` (what
``scripts/nvml_record.sh`` writes on a GPU host) is replayed through the agent, which must print
the recorded events again. The only recording today is ``synthetic-fake-h200``: made from the
tests' FakeNvml (header ``synthetic: true``) — NOT from a real GPU; a real-GPU recording is
the open item of issue 18.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from recovery_logs.inventory import parse_inventory_message
from recovery_logs.sources.nvml import NvmlAgent
from recovery_logs.sources.nvml_record import RecordingNvml, ReplayNvml

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
SYNTH = FIX / "synthetic-fake-h200"
CYCLES = 3


def _run(nvml, clock, cycles: int, after_batch=None) -> list[str]:
    got: list[str] = []

    def sink(frame) -> None:
        got.extend(frame.get_column("message").to_list())
        if after_batch is not None:
            after_batch()

    with NvmlAgent(nvml, host="gpu-n01", clock=clock, sleep=lambda s: None) as agent:
        agent.run(sink, interval_s=0, stop_after=cycles)
    return got


def synthetic_recording(kit) -> tuple[str, list[str]]:
    """The fake's two H200s: GPU 1 lacks retired pages and NVLink (NotSupported), an XID 79 arrives on
    GPU 1, and its memory starts remapping rows in the second poll."""
    gpus = [kit.FakeGpu("GPU-aaaa-0000", b"00000000:1B:00.0"),
            kit.FakeGpu("GPU-bbbb-0001", b"00000000:CB:00.0",
                        unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetNvLinkState"})]
    fake = kit.FakeNvml(gpus)
    fake.xid(gpus[1], 79)
    out = io.StringIO()
    rec = RecordingNvml(fake, out, host="gpu-n01", synthetic=True,
                        note="SYNTHETIC: recorded from tests/nvml/conftest.py FakeNvml, not from a real GPU",
                        clock=iter(range(10**6)).__next__)

    def remap() -> None:        # the fake's state changes after the first poll, as a driver's would
        gpus[1].remap = (0, 1, 1, 0)

    msgs = _run(rec, kit.FakeClock(), CYCLES, after_batch=remap)
    return out.getvalue(), msgs


def test_the_committed_synthetic_recording_is_what_the_fake_records_today(kit):
    calls, msgs = synthetic_recording(kit)
    assert (SYNTH / "calls.jsonl").read_text() == calls, "regenerate: python tests/nvml/test_recording.py"
    assert [json.loads(x)["_msg"] for x in (SYNTH / "agent.jsonl").read_text().splitlines()] == msgs
    header = json.loads(calls.splitlines()[0])
    assert header["synthetic"] is True and "not from a real GPU" in header["note"]


@pytest.mark.parametrize("rec_dir", sorted(p.parent for p in FIX.glob("*/calls.jsonl")), ids=lambda p: p.name)
def test_replaying_a_recording_prints_the_recorded_events(rec_dir: Path, kit):
    meta = json.loads((rec_dir / "meta.json").read_text())
    nvml = ReplayNvml(rec_dir / "calls.jsonl")
    assert nvml.synthetic == meta["synthetic"]
    want = [json.loads(x)["_msg"] for x in (rec_dir / "agent.jsonl").read_text().splitlines() if x.strip()]
    got = _run(nvml, kit.FakeClock(), meta["cycles"])
    assert got == want
    inv = [parse_inventory_message(m) for m in got if " inventory " in m]
    assert inv and all(d is not None and d["uuid"].startswith("GPU-") for d in inv)


def test_replay_answers_what_the_driver_answered(kit):
    nvml = ReplayNvml(SYNTH / "calls.jsonl")
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetPciInfo(h1).busId == "00000000:CB:00.0"
    with pytest.raises(nvml.NVMLError) as e:
        nvml.nvmlDeviceGetRetiredPages(h1, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    assert e.value.value == 3          # NotSupported, as recorded
    assert not hasattr(nvml, "nvmlDeviceGetBAR1MemoryInfo")     # never called: not offered


if __name__ == "__main__":   # regenerate the synthetic fixture
    import importlib.util
    import sys
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("nvml_conftest", Path(__file__).with_name("conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nvml_conftest"] = mod
    spec.loader.exec_module(mod)
    calls, msgs = synthetic_recording(SimpleNamespace(FakeGpu=mod.FakeGpu, FakeNvml=mod.FakeNvml,
                                                      FakeClock=mod.FakeClock))
    SYNTH.mkdir(parents=True, exist_ok=True)
    (SYNTH / "calls.jsonl").write_text(calls)
    (SYNTH / "agent.jsonl").write_text("".join(json.dumps({"_msg": m}) + "\n" for m in msgs))
    (SYNTH / "meta.json").write_text(json.dumps({"interval_s": 0, "cycles": CYCLES, "host": "gpu-n01",
                                                 "synthetic": True}) + "\n")
    print(f"wrote {SYNTH}")
