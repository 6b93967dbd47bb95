"""Declared levels: normalisation (sources.levels) and the readers that carry them."""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.schema import EVENT_SCHEMA, Level, check_events
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.levels import level_expr
from recovery_logs.sources.lineformat import compile_line_format


@pytest.mark.parametrize(("raw", "want"), [
    ("FATAL", "fatal"), ("panic", "fatal"), ("emerg", "fatal"), ("F", "fatal"),
    ("FAILURE", "critical"), ("SEVERE", "critical"), ("crit", "critical"), ("ALERT", "critical"),
    ("ERROR", "error"), ("err", "error"), ("[ERROR]", "error"), ("E", "error"), ("Error:", "error"),
    ("WARNING", "warning"), ("warn", "warning"), ("<W>", "warning"),
    ("notice", "notice"), ("INFO", "info"), ("Informational", "info"), ("DEBUG", "debug"), ("trace", "debug"),
    # syslog severities and whole PRIs (facility * 8 + severity)
    ("0", "fatal"), ("3", "error"), ("4", "warning"), ("6", "info"), ("7", "debug"), ("<11>", "error"), ("28", "warning"),
    # not a level we know: null, not a guess
    ("RAS", None), ("", None), ("192", None), ("-1", None), (None, None),
])
def test_level_words_numbers_and_pri_normalise(raw, want):
    got = pl.DataFrame({"v": [raw]}, schema={"v": pl.String}).select(level_expr(pl.col("v")))["v"][0]
    assert got == want
    assert want is None or want in {lv.value for lv in Level}


def test_site_line_format_level_field_is_the_event_level(tmp_path):
    # the RAS-like sample of tests/detectors/test_linescore.py (hand-written, BlueGene/L-style columns)
    p = tmp_path / "ras.log"
    p.write_text("2026-11-29-14.00.00.000001 R01-M0-N0 RAS KERNEL INFO instruction cache parity error corrected\n"
                 "2026-11-29-14.00.01.000001 R01-M0-N1 RAS KERNEL FATAL data TLB error interrupt\n"
                 "2026-11-29-14.00.02.000001 R01-M0-N2 RAS APP SEVERE ciod: cannot open node map\n"
                 "2026-11-29-14.00.03.000001 R01-M0-N3 RAS KERNEL BOGUS odd level word\n", encoding="utf-8")
    lf = compile_line_format("<Time> <Node> <Type> <Component> <Level> <Content>", "%Y-%m-%d-%H.%M.%S%.f")
    r = read_paths([p], ReadOptions(line_formats=(lf,)))
    check_events(r.events)
    assert r.events.select("host", "level").rows() == [("R01-M0-N0", "info"), ("R01-M0-N1", "fatal"),
                                                       ("R01-M0-N2", "critical"), ("R01-M0-N3", None)]
    assert r.events["message"][1] == "data TLB error interrupt"


def test_formats_without_a_level_give_null(tmp_path):
    p = tmp_path / "train.out"
    p.write_text("[rank0]: step 1 loss 2.0\n[rank1]: RuntimeError: CUDA error: an illegal memory access\n",
                 encoding="utf-8")
    r = read_paths([p], ReadOptions(host="gpu-n01", fmt="job"))
    assert "level" in EVENT_SCHEMA and r.events["level"].null_count() == r.events.height == 2
