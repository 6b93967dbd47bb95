"""Site line formats (``--line-format``, ``[[line_formats]]``) on real HPC system log lines.

The lines are short excerpts of LogHub's public samples (github.com/logpai/loghub):
``BGL/BGL_2k.log`` (BlueGene/L RAS log, LLNL) and ``Thunderbird/Thunderbird_2k.log`` (Sandia
Thunderbird syslog). LogHub's first column is the alert label; it is stripped here, as the
benchmark strips it before the engine sees the lines.
"""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.config import load_config
from recovery_logs.errors import ConfigError
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.lineformat import compile_line_format, load_line_formats, select_line_format
from recovery_logs.sources.read_text import TextParser

# LogHub BGL/BGL_2k.log, lines 1, 5 and two alert lines (KERNDTLB, APPREAD), label column removed
BGL = [
    "1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 R02-M1-N0-C:J12-U11 RAS KERNEL INFO "
    "instruction cache parity error corrected",
    "1117842440 2005.06.03 R23-M0-NE-C:J05-U01 2005-06-03-16.47.20.730545 R23-M0-NE-C:J05-U01 RAS KERNEL INFO "
    "63543 double-hummer alignment exceptions",
    "1117869872 2005.06.04 R04-M1-N4-I:J18-U11 2005-06-04-00.24.32.432192 R04-M1-N4-I:J18-U11 RAS APP FATAL "
    "ciod: failed to read message prefix on control stream (CioStream socket to 172.16.96.116:33569",
    "1118536327 2005.06.11 R30-M0-N9-C:J16-U01 2005-06-11-17.32.07.581048 R30-M0-N9-C:J16-U01 RAS KERNEL FATAL "
    "data TLB error interrupt",
]
BGL_FORMAT = "<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>"
BGL_TIME = "%Y-%m-%d-%H.%M.%S%.f"

# LogHub Thunderbird/Thunderbird_2k.log, lines 1, 100 and 459, label column removed
TBIRD = [
    "1131566461 2005.11.09 dn228 Nov 9 12:01:01 dn228/dn228 crond(pam_unix)[2915]: session closed for user root",
    "1131566491 2005.11.09 tbird-admin1 Nov 9 12:01:31 local@tbird-admin1 "
    "/apps/x86_64/system/ganglia-3.0.1/sbin/gmetad[1682]: data_thread() got not answer from any [Thunderbird_A2] "
    "datasource",
    "1131566665 2005.11.09 tbird-admin1 Nov 9 12:04:25 local@tbird-admin1 ntpd[1815]: kernel time sync disabled 0041",
]


def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _ns(iso: str) -> int:
    return int(pl.Series([iso]).str.to_datetime(time_unit="ns", time_zone="UTC").dt.epoch("ns")[0])


def test_bgl_lines_get_time_host_and_message(tmp_path):
    p = _write(tmp_path, "bgl.log", BGL)
    lf = compile_line_format(BGL_FORMAT, BGL_TIME)
    r = read_paths([p], ReadOptions(line_formats=(lf,)))
    ev = r.events.sort("line")
    assert ev["host"].to_list() == ["R02-M1-N0-C:J12-U11", "R23-M0-NE-C:J05-U01", "R04-M1-N4-I:J18-U11",
                                    "R30-M0-N9-C:J16-U01"]
    assert ev["message"].to_list()[3] == "data TLB error interrupt"
    assert ev["message"].to_list()[2].startswith("ciod: failed to read message prefix on control stream")
    assert ev["time"].dt.epoch("ns").to_list()[0] == _ns("2005-06-03T15:42:50.675872Z")
    assert not ev["time_inferred"].any()
    assert r.stats["format_mismatch"] == 0 and r.quarantine.height == 0


def test_bgl_epoch_seconds_field(tmp_path):
    p = _write(tmp_path, "bgl.log", BGL[:1])
    lf = compile_line_format("<Timestamp> <*> <Node> <*> <*> <*> <*> <Level> <Content>", "epoch")
    ev = read_paths([p], ReadOptions(line_formats=(lf,))).events
    assert ev["time"].dt.epoch("ns").to_list() == [1117838570 * 1_000_000_000]
    assert ev["message"].to_list() == ["instruction cache parity error corrected"]


def test_thunderbird_yearless_syslog_time_in_the_site_zone(tmp_path):
    p = _write(tmp_path, "tbird.log", TBIRD)
    lf = compile_line_format("<*> <*> <Node> <Month> <Day> <Time> <Location> <Component>: <Content>",
                             "%b %d %H:%M:%S")
    # the syslog times are the site's local time (PST in November): LogHub's Unix seconds say so
    ev = read_paths([p], ReadOptions(line_formats=(lf,), year=2005, tz="America/Los_Angeles")).events.sort("line")
    assert ev["host"].to_list() == ["dn228", "tbird-admin1", "tbird-admin1"]
    assert ev["message"].to_list()[0] == "session closed for user root"
    assert ev["message"].to_list()[1] == "data_thread() got not answer from any [Thunderbird_A2] datasource"
    assert ev["time"].dt.epoch("ns").to_list()[0] == _ns("2005-11-09T20:01:01Z")
    assert ev["time"].dt.epoch("s").to_list() == [1131566461, 1131566491, 1131566665]


def test_time_zone_of_the_reader_applies_to_naive_times(tmp_path):
    p = _write(tmp_path, "site.log", ["2026-12-01 10:00:00.5 gpu-n01 ERROR oops"])
    lf = compile_line_format("<Date> <Time> <Node> <Level> <Content>")      # default: ISO
    ev = read_paths([p], ReadOptions(line_formats=(lf,), tz="Europe/Berlin")).events
    assert ev["time"].dt.epoch("ns").to_list() == [_ns("2026-12-01T09:00:00.5Z")]
    assert ev["host"].to_list() == ["gpu-n01"] and ev["message"].to_list() == ["oops"]


def test_non_matching_lines_are_kept_counted_and_quarantined(tmp_path):
    lines = [BGL[0], "    indented continuation of the record above", "garbage that is not a RAS line", "", BGL[2]]
    p = _write(tmp_path, "bgl.log", lines)
    r = read_paths([p], ReadOptions(line_formats=(compile_line_format(BGL_FORMAT, BGL_TIME),)))
    assert r.stats["format_mismatch"] == 1
    q = r.quarantine
    assert q.select("line", "reason", "raw").rows() == [(3, "format_mismatch", "garbage that is not a RAS line")]
    ev = r.events.sort("line")
    # the stray line is still an event (time from its neighbour), the indented one joins the record before it
    assert ev["line"].to_list() == [1, 3, 5]
    assert ev.filter(pl.col("line") == 3)["time_inferred"].to_list() == [True]
    assert ev.filter(pl.col("line") == 3)["message"].to_list() == ["garbage that is not a RAS line"]
    assert "indented continuation" in ev.filter(pl.col("line") == 1)["message"][0]


def test_a_line_that_fits_but_has_a_bad_time_is_bad_timestamp(tmp_path):
    bad = BGL[0].replace("2005-06-03-15.42.50.675872", "2005-13-03-15.42.50.675872")
    p = _write(tmp_path, "bgl.log", [BGL[1], bad])
    r = read_paths([p], ReadOptions(line_formats=(compile_line_format(BGL_FORMAT, BGL_TIME),)))
    assert r.quarantine.select("line", "reason").rows() == [(2, "bad_timestamp")]
    assert r.events.height == 2


def test_split_feeding_gives_the_same_events(tmp_path):
    data = ("\n".join(BGL * 3) + "\n").encode()
    lf = compile_line_format(BGL_FORMAT, BGL_TIME)
    opts = ReadOptions(line_formats=(lf,), dedupe=False)
    whole = TextParser("bgl.log", opts, mtime_ns=0).feed(data, final=True).events
    tp = TextParser("bgl.log", opts, mtime_ns=0)
    parts = [tp.feed(data[i:i + 97]).events for i in range(0, len(data), 97)] + [tp.flush().events]
    split = pl.concat([p for p in parts if p.height])
    assert split.drop("seq").equals(whole.drop("seq"))


@pytest.mark.parametrize(("pattern", "time_format", "needle"), [
    ("<Date> <Time> <Node> <Level>", None, "exactly one <Content>"),
    ("<Date> <Content> <Content>", None, "exactly one <Content>"),
    ("<Date> <Nodename> <Content>", None, "unknown field <Nodename>"),
    ("<Date><Node> <Content>", None, "nothing between them"),
    ("<Date> <Time> <Content>", "%Y-%m-%d %H:%M:%Q", "unknown directive '%Q'"),
    ("<Date> <Time> <Content>", "yyyy-mm-dd", "no % directive"),
    ("<Time> <Content>", "%H:%M:%S", "has no date"),
    ("<Node> <Content>", "%Y-%m-%d", "no time field"),
    ("", None, "empty"),
    ("plain text", None, "no <Field>"),
])
def test_bad_templates_name_the_option(pattern, time_format, needle):
    with pytest.raises(ConfigError) as ei:
        compile_line_format(pattern, time_format, where="--line-format")
    assert needle in str(ei.value) and "--line-format" in str(ei.value)


CONFIG = """
[engine]
window_s = 60

[[line_formats]]
name = "bgl"
pattern = "<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>"
time_format = "%Y-%m-%d-%H.%M.%S%.f"
path = "ras-*.log"

[[line_formats]]
name = "site"
pattern = "<Date> <Time> <Host> <Content>"
"""


def test_toml_config_form_and_path_globs(tmp_path):
    cfg = tmp_path / "engine.toml"
    cfg.write_text(CONFIG)
    fmts = load_line_formats(cfg)
    assert [f.name for f in fmts] == ["bgl", "site"]
    assert load_config(cfg).window_s == 60      # [engine] still loads from the same file
    assert select_line_format(fmts, "/logs/ras-2005.log").name == "bgl"
    assert select_line_format(fmts, "/logs/other.log").name == "site"      # no path: every file
    ras = _write(tmp_path, "ras-1.log", BGL[:2])
    site = _write(tmp_path, "site.log", ["2026-12-01 10:00:00Z gpu-n07 NCCL WARN hello"])
    ev = read_paths([ras, site], ReadOptions(line_formats=fmts)).events.sort("file")
    assert ev["host"].to_list() == ["R02-M1-N0-C:J12-U11", "R23-M0-NE-C:J05-U01", "gpu-n07"]
    assert ev.filter(pl.col("host") == "gpu-n07")["message"].to_list() == ["NCCL WARN hello"]


@pytest.mark.parametrize(("body", "needle"), [
    ('[[line_formats]]\nname = "x"\npattern = "<Node> <Content>"\ncolour = "red"\n', "unknown keys"),
    ('[[line_formats]]\nname = "x"\n', "pattern is missing"),
    ('[[line_formats]]\nname = "x"\npattern = "<Node> <Msg> <Content>"\n', "exactly one <Content>"),
    ('[[line_formats]]\nname = "x"\npattern = "<Date> <Content>"\ntime_format = "%d/%m %k"\n'
     '[[line_formats]]\nname = "x"\npattern = "<Date> <Content>"\n', "duplicate name"),
    ('[[line_formats]]\nname = "x"\npattern = "<Date> <Content>"\ntime_format = 5\n', "must be a string"),
])
def test_bad_config_entries_name_file_and_entry(tmp_path, body, needle):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as ei:
        load_line_formats(cfg)
    assert needle in str(ei.value) and "bad.toml" in str(ei.value) and "line_formats" in str(ei.value)


def test_fields_after_the_message(tmp_path):
    # an application layout that puts the node last: `2026-12-01 10:00:00 <message> [gpu-n03]`
    p = _write(tmp_path, "app.log", ["2026-12-01 10:00:00 CUDA error: an illegal memory access was encountered [gpu-n03]",
                                     "2026-12-01 10:00:01 no node at the end"])
    lf = compile_line_format("<Date> <Time> <Content> [<Node>]")
    r = read_paths([p], ReadOptions(line_formats=(lf,)))
    ev = r.events.sort("line")
    assert ev["host"].to_list()[0] == "gpu-n03"
    assert ev["message"].to_list() == ["CUDA error: an illegal memory access was encountered",
                                       "2026-12-01 10:00:01 no node at the end"]
    assert r.quarantine.select("line", "reason").rows() == [(2, "format_mismatch")]


def test_windows_templates_and_the_model_see_line_format_events(tmp_path):
    from recovery_logs.detectors.features import event_features
    from recovery_logs.detectors.templates import mine
    from recovery_logs.pipeline.line_findings import window_scores
    from recovery_logs.pipeline.replay import ReplayOptions, replay

    # four BGL lines on four nodes: one (host, minute) window each
    p = _write(tmp_path, "bgl.log", BGL)
    lf = compile_line_format(BGL_FORMAT, BGL_TIME)
    res = replay([str(p)], ReplayOptions(read=ReadOptions(line_formats=(lf,))))
    w = res.engine.windows
    assert sorted(w["host"].to_list()) == sorted(["R02-M1-N0-C:J12-U11", "R23-M0-NE-C:J05-U01", "R04-M1-N4-I:J18-U11",
                                                  "R30-M0-N9-C:J16-U01"])
    assert w["lines"].sum() == 4
    ev = read_paths([p], ReadOptions(line_formats=(lf,))).events
    feats = event_features(ev)
    assert feats["n_templates"].sum() == 4 and feats["new_templates"].sum() == 4
    assert mine(ev["message"])["template"].to_list()[1] == "<*> double-hummer alignment exceptions"
    scored = window_scores(res.engine)      # the shipped model scores every complete window
    assert scored.height >= 3 and scored["score"].is_between(0.0, 1.0).all()
