"""Template miner masks and bounded state; window features on literal frames."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.detectors import synth
from recovery_logs.detectors.features import (
    FINDING_FEATURES,
    PIPELINE_FEATURES,
    finding_features,
    line_features,
    pipeline_features,
    window_features,
)
from recovery_logs.detectors.templates import TemplateMiner, mine
from recovery_logs.errors import ConfigError
from recovery_logs.schema import TIME
from recovery_logs.timeutil import NS


@pytest.mark.parametrize(("message", "template"), [
    ("NVRM: Xid (PCI:0000:cb:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     "NVRM: Xid (PCI:<*>): <*>, pid=<*>, name=python, GPU has fallen off the bus."),
    ("mlx5_core 0000:3b:00.1: Port module event: module 0, Cable unplugged",
     "mlx<*>_core <*>: Port module event: module <*>, Cable unplugged"),
    ("connection to 10.0.0.12:29500 refused at 0xdeadBEEF", "connection to <*> refused at <*>"),
    ("GPU-5b1a2c3d-1234-5678-9abc-def012345678 temp 83", "<*> temp <*>"),
    ("Saving checkpoint to /lustre/ckpt/run_17/iter_0001200/model.pt", "Saving checkpoint to <*>"),
    ("[rank12]: step 5 loss 2.345E+00 lr 1.0e-4", "<*>: step <*> loss <*> lr <*>"),
    ("fe80::1ff:fe23:4567:890a link up", "<*> link up"),
])
def test_masks(message, template):
    assert mine([message])["template"].to_list() == [template]


def test_same_shape_same_id_and_different_shape_different_id():
    out = mine(["rank 3 step 10 took 0.81 s", "rank 12 step 11 took 0.79 s", "rank 3 step 10 failed"])
    ids = out["template_id"].to_list()
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_miner_new_templates_and_bounded_state():
    ev = synth.events([{"t": float(i), "host": "a", "message": m} for i, m in
                       enumerate(["a 1", "a 2", "b 1", "c 1", "a 3"])])
    tm = TemplateMiner(max_templates=2)
    got = tm.add(ev).select("message", "is_new")
    assert_frame_equal(got, pl.DataFrame({"message": ["a 1", "a 2", "b 1", "c 1", "a 3"],
                                          "is_new": [True, False, True, True, False]}))
    assert len(tm) == 2                      # "b <*>" (least recently seen) evicted
    assert sorted(tm.templates["template"].to_list()) == ["a <*>", "c <*>"]
    again = tm.add(synth.events([{"t": 10.0, "host": "a", "message": "b 9"}]))
    assert again["is_new"].to_list() == [True]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["x 1", "x 22", "y 0x1f", "z /a/b", "y 0x2", "w"]), min_size=1, max_size=30),
       st.integers(1, 29))
def test_new_template_flags_do_not_depend_on_batches(msgs, cut):
    ev = synth.events([{"t": float(i), "host": "h", "message": m} for i, m in enumerate(msgs)])
    whole = TemplateMiner().add(ev)["is_new"].to_list()
    tm = TemplateMiner()
    parts = tm.add(ev.head(cut))["is_new"].to_list() + tm.add(ev.slice(cut))["is_new"].to_list()
    assert whole == parts
    assert sum(whole) == len({m.split(" ")[0] + (" <*>" if " " in m else "") for m in msgs})


def _rule(t, host, cat, role="cause", job="j"):
    return {"t": t, "job_id": job, "host": host, "rule_id": f"r.{cat}", "category": cat, "role": role,
            "severity": "high", "action": "investigate", "message": cat}


def test_finding_features_literal():
    o = (60 - (synth.T0 // NS) % 60) % 60          # seconds from T0 to the next minute boundary
    f = synth.findings([
        synth.progress("j", "a", 1, o + 1.0, 1.0, 0), synth.progress("j", "a", 2, o + 2.0, 3.0, 0),
        synth.progress("j", "b", 1, o + 1.0, 1.0, 1), synth.progress("j", "b", 2, o + 2.0, 1.0, 1),
        _rule(o + 30.0, "a", "xid"), _rule(o + 31.0, "a", "nccl_timeout_hang", "symptom"),
        synth.progress("j", "a", 3, o + 61.0, 4.0, 0),
    ])
    out = finding_features(f, "60s").select("host", "window_start", "cat_xid", "cat_nccl_timeout_hang", "n_findings",
                                            "n_cause", "n_symptom", "n_progress", "step_time_med", "step_time_ratio",
                                            "step_time_rel_job")
    w0 = synth.T0 + o * NS
    w1 = w0 + 60 * NS
    want = pl.DataFrame({
        "host": ["a", "a", "b"], "window_start": [w0, w1, w0],
        "cat_xid": [1.0, 0.0, 0.0], "cat_nccl_timeout_hang": [1.0, 0.0, 0.0], "n_findings": [2.0, 0.0, 0.0],
        "n_cause": [1.0, 0.0, 0.0], "n_symptom": [1.0, 0.0, 0.0], "n_progress": [2.0, 1.0, 2.0],
        "step_time_med": [2.0, 4.0, 1.0], "step_time_ratio": [1.0, 2.0, 1.0],
        "step_time_rel_job": [2.0 / 1.5, 1.0, 1.0 / 1.5]},
        schema_overrides={"window_start": pl.Int64}).with_columns(
        pl.col("window_start").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME))
    assert_frame_equal(out, want)


def test_features_never_null_and_baseline_is_causal():
    rows = synth.training_job("j", ["a", "b"], 2, 300, 1.0)
    f = synth.findings(rows)
    ev = synth.events([{"t": r["t"], "host": r["host"], "job_id": "j", "message": r["message"]} for r in rows])
    full = window_features(ev, f)
    assert full.select(pl.all().is_null().sum()).sum_horizontal().item() == 0
    assert set(FINDING_FEATURES) <= set(full.columns)
    cut = synth.T0 + 150 * NS
    part = window_features(ev.filter(pl.col("time").dt.epoch("ns") < cut // (60 * NS) * 60 * NS),
                           f.filter(pl.col("time").dt.epoch("ns") < cut // (60 * NS) * 60 * NS))
    # windows complete before the cut have identical features with or without later data
    assert part.height > 0
    assert_frame_equal(part, full.join(part.select("host", "job_id", "window_start"),
                                       on=["host", "job_id", "window_start"], how="semi"))


def test_line_features_and_pipeline_features_detect_a_burst():
    w0 = synth.T0 // (60 * NS) * 60 * NS
    lines = [10] * 10 + [200]
    windows = pl.DataFrame({"host": ["a"] * 11, "job_id": [None] * 11,
                            "window_start": [w0 + i * 60 * NS for i in range(11)], "lines": lines},
                           schema_overrides={"job_id": pl.String}).with_columns(
        pl.col("window_start").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"))
    lf = line_features(windows)
    assert lf["log_rate_z"].to_list()[-1] == pytest.approx((200 - 10) / 10 ** 0.5)
    assert lf["log_rate_z"].to_list()[:10] == [0.0] * 10
    pf = pipeline_features(synth.findings([]), windows)
    assert pf.columns == ["host", "job_id", "window_start", *PIPELINE_FEATURES]
    assert pf["step_time_ratio"].to_list() == [1.0] * 11


def test_nvml_aggregates_from_agent_lines():
    ev = synth.events([
        {"t": 1.0, "host": "a", "source": "nvml", "message": "NVML gpu=0 uuid=GPU-x pci=0000:1b:00.0 temperature celsius=81 level=warn slowdown_c=90"},
        {"t": 2.0, "host": "a", "source": "nvml", "message": "NVML gpu=1 uuid=GPU-y pci=0000:1c:00.0 temperature celsius=86 level=warn"},
        {"t": 3.0, "host": "a", "source": "nvml", "message": "NVML gpu=0 uuid=GPU-x pci=0000:1b:00.0 power watts=600.5 limit_w=700"},
        {"t": 4.0, "host": "a", "source": "kernel", "message": "temperature 99 from a kernel line is not NVML"},
    ])
    out = window_features(ev, synth.findings([]), "1h")
    assert out.select("nvml_temp_max", "nvml_power_mean", "nvml_samples", "n_events").row(0) == (86.0, 600.5, 3.0, 4.0)


def test_bad_window_is_a_config_error():
    with pytest.raises(ConfigError, match="window must be a positive duration"):
        finding_features(synth.findings([]), "0s")
