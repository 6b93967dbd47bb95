"""Clock-event reasons as numbers (issue 13, d8): dcgm-exporter's bitmask gauge and per-reason counts, the
nvidia-smi -q counters, and the ``sec/batch`` step lines of the TensorFlow tutorials. Bit values from NVIDIA/DCGM
dcgm_fields.h (0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake; idle 0x1, application
clocks 0x2, SW power cap 0x4, sync boost 0x10 and display clocks 0x100 are normal)."""

from __future__ import annotations

import pytest

from .conftest import found, replay_text

FAULT_BITS = 0x08 | 0x20 | 0x40 | 0x80
LABELS = 'gpu="3",UUID="GPU-5b2f",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-7"'


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])
def test_bitmask_rule_fires_exactly_on_the_fault_bits(pack, name):
    values = list(range(0, 512))
    f = found(pack, *(f"{name}{{{LABELS}}} {v}" for v in values))
    hit = f.filter(f["rule_id"] == "thermal_power.dcgm_exporter_clock_reasons")["seq"].to_list()
    assert sorted(hit) == [v for v in values if v & FAULT_BITS]
    # the other rules leave these lines alone (no generic thermal or power reading of a metric line)
    assert set(f["rule_id"].to_list()) <= {"thermal_power.dcgm_exporter_clock_reasons"}


@pytest.mark.parametrize(("event", "count", "fires"), [
    ("hw_thermal", 1, True), ("sw_thermal", 3, True), ("hw_power_brake", 2, True), ("hw_slowdown", 1, True),
    ("hw_thermal", 0, False), ("gpu_idle", 5, False), ("power_cap", 9, False), ("sync_boost", 1, False),
])
def test_clock_event_counts_by_reason(pack, event, count, fires):
    line = (f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{LABELS},clock_event="{event}",window_size_in_ms="300000"}} {count}')
    ids = found(pack, line)["rule_id"].to_list()
    assert ids == (["thermal_power.dcgm_exporter_clock_events_count"] if fires else [])


def test_smi_counters_power_brake_is_a_weak_reading_and_power_capping_none(pack):
    f = found(pack, "        SW Power Capping                  : 165687 us",
              "        HW Power Braking                  : 1200 us", "        HW Power Braking                  : 0 us")
    assert f["seq"].to_list() == [1]
    assert f["rule_id"].to_list() == ["thermal_power.smi_power_brake_counter"] and f["role"].to_list() == ["symptom"]


def test_exporter_thermal_bits_give_a_thermal_incident_and_idle_gives_none(tmp_path):
    hot = replay_text(tmp_path, f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{LABELS}}} 96\n", "job-1/a.out").incidents
    assert [i.category for i in hot] == ["thermal_power"]
    assert {a.kind for a in hot[0].actions} <= {"investigate"}
    idle = replay_text(tmp_path, f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{LABELS}}} 1\n", "job-2/b.out").incidents
    assert idle == []


def test_sec_per_batch_step_lines_give_step_times(pack):
    # tensorflow/models cifar10_train.py and TF-slim learning.py step lines
    f = found(pack, "2017-03-27 19:27:15.323066: step 10, loss = 4.63 (212.7 examples/sec; 0.602 sec/batch)",
              "INFO:tensorflow:global step 14000: loss = 0.7438 (0.26 sec/step)")
    assert f["rule_id"].to_list() == ["progress.step_time_generic"] * 2
    assert f["step"].to_list() == [10, 14000]
    assert f["step_time_s"].to_list() == pytest.approx([0.602, 0.26])


def test_a_sec_per_batch_slowdown_is_a_straggler_slowdown(tmp_path):
    # a cifar10_train.py run whose step time triples and stays there (format string of the tutorial)
    lines = [f"2020-06-11 04:{27 + i // 6:02d}:{(i % 6) * 10:02d}.000000: step {10 * i}, loss = 4.{60 - i} "
             f"({'9000.0' if i < 6 else '3000.0'} examples/sec; {'0.014' if i < 6 else '0.042'} sec/batch)"
             for i in range(10)]
    inc = replay_text(tmp_path, "\n".join(lines) + "\n").incidents
    assert inc and inc[0].category == "straggler"
    assert {a.kind for a in inc[0].actions} <= {"investigate"}


def test_a_throughput_drop_of_a_half_that_stays_is_a_slowdown_and_a_spike_is_not(tmp_path):
    # apache/mxnet python/mxnet/callback.py Speedometer: "Epoch[%d] Batch [%d]\tSpeed: %.2f samples/sec\t%s"
    def lines(speeds):
        return "\n".join(f"INFO:root:Epoch[6] Batch [{10 * (i + 1)}]\tSpeed: {s:.2f} samples/sec\taccuracy=0.48"
                         for i, s in enumerate(speeds)) + "\n"
    # ~490 -> ~328 samples/sec (1.5x the step time) for the rest of the run: investigate the slowdown
    inc = replay_text(tmp_path / "a", lines([490.4, 486.6, 497.6, 492.6, 328.8, 328.9, 328.5, 328.6])).incidents
    assert inc and inc[0].category == "straggler" and {a.kind for a in inc[0].actions} <= {"investigate"}
    # one slow batch (a checkpoint save, an evaluation) and jitter of 10 %: nothing
    assert replay_text(tmp_path / "b", lines([490.4, 486.6, 497.6, 250.0, 491.0, 489.9, 452.0, 488.1])).incidents == []
