"""``replay --out DIR`` writes ``findings.parquet``: one row per flagged line (rules and the model)."""

from __future__ import annotations

import polars as pl
import pytest

from recovery_logs.api import bundled_incident, bundled_read_options
from recovery_logs.cli import main
from recovery_logs.pipeline.line_findings import LINE_FINDINGS_SCHEMA, MAX_LINES_PER_WINDOW
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.simulate import SimOptions, simulate_one
from recovery_logs.sources.lineformat import compile_line_format
from recovery_logs.sources.read_common import ReadOptions


def _check_against_events(out):
    f = pl.read_parquet(out / "findings.parquet")
    ev = pl.read_parquet(out / "events.parquet")
    assert dict(f.schema) == LINE_FINDINGS_SCHEMA
    lines = f.filter(pl.col("file") != "detector")
    # every flagged line is an event of the replay, with the same time and message
    joined = lines.join(ev.select("file", "line", pl.col("time").alias("ev_time"), pl.col("message").alias("ev_msg")),
                        on=["file", "line"], how="left")
    assert joined["ev_time"].null_count() == 0
    assert (joined["ev_time"] == joined["time"]).all() and (joined["ev_msg"] == joined["message"]).all()
    assert lines.select(pl.struct("file", "line").is_unique().all()).item()
    assert "progress" not in f["role"].to_list()
    return f


def test_rule_findings_one_row_per_line(tmp_path):
    name = "xid79_nccl_cascade"
    replay([str(bundled_incident(name))], ReplayOptions(read=bundled_read_options(name), out_dir=tmp_path))
    f = _check_against_events(tmp_path)
    xid = f.filter(pl.col("rule_id") == "xid.79")
    assert xid.height >= 1
    row = xid.row(0, named=True)
    assert row["host"] == "gpu-n02" and row["category"] == "xid" and row["role"] == "cause"
    assert row["severity"] == "critical" and row["file"].endswith("kern.log") and row["line"] > 0
    # the model scored the XID's window: the score is there, in (0, 1]
    assert row["score"] is not None and 0.0 < row["score"] <= 1.0
    assert row["window_score"] == row["score"] and row["window_flagged"] is not None
    assert f.filter(pl.col("rule_id") == "nccl.watchdog_timeout").height > 0


def test_model_flagged_window_singles_out_its_unusual_lines(tmp_path):
    sim = simulate_one("novel_sas_storm", SimOptions(out=tmp_path / "sim", seed=1, nodes=2, duration_s=2400.0))
    out = tmp_path / "out"
    res = replay([str(sim.path)], ReplayOptions(out_dir=out))
    assert res.incidents[0].category == "anomaly"
    f = _check_against_events(out)
    model = f.filter(pl.col("rule_id") == "detector.anomaly")
    assert model.height > 0
    assert model["category"].unique().to_list() == ["anomaly"] and model["severity"].unique().to_list() == ["low"]
    assert model["score"].null_count() == 0 and model["score"].min() > 0
    # the lines the model flagged include the storm nobody wrote a rule for
    assert model.filter(pl.col("message").str.contains("mpt3sas|Result: hostbyte|Sense Key")).height > 0
    lines, windows = model.filter(pl.col("file") != "detector"), model.filter(pl.col("file") == "detector")
    assert windows.height > 0 and (windows["line"] == 0).all() and windows["window_flagged"].all()
    # a flagged window's lines carry that window's score; at most MAX_LINES_PER_WINDOW of them per window
    per_window = lines.with_columns((pl.col("time").dt.epoch("s") // 60).alias("w")).group_by("host", "job_id", "w").agg(
        pl.col("window_score").n_unique().alias("scores"), pl.len().alias("n"))
    assert (per_window["scores"] == 1).all() and per_window["n"].max() <= MAX_LINES_PER_WINDOW
    assert (lines["score"] == lines["window_score"]).all() and lines["window_flagged"].all()


def _reboot_minute_log(path):
    """An hour of cron chatter on two nodes, then a 240-line burst of boot messages in one minute on
    node01 (the shape of LogHub Thunderbird_2k's tbird-admin1 reboot: github.com/logpai/loghub;
    message texts of its CPU/ACPI/NET/gmetad lines, numbers changed)."""
    lines = []
    for m in range(60):
        for s in range(0, 60, 12):
            for node in ("node01", "node02"):
                lines.append(f"2026-11-09 12:{m:02d}:{s:02d} {node} crond[{2900 + m}]: session opened for user root "
                             "by (uid=0)")
        if m == 30:
            for i in range(240):
                msg = [f"CPU{i % 8}: Physical Processor ID: {i % 2}",
                       f"ACPI: PCI interrupt 0000:00:{i % 30:02x}.0[A] -> GSI {i} (level, low) -> IRQ {i + 16}",
                       "NET: Registered protocol family 2",
                       f"/apps/x86_64/system/ganglia-3.0.1/sbin/gmetad[{i}]: data_thread() got not answer from any "
                       "[Thunderbird_A8] datasource"][i % 4]
                lines.append(f"2026-11-09 12:30:{10 + i // 6:02d} node01 {msg}")
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def test_a_flagged_window_is_one_verdict_not_an_alert_per_line(tmp_path):
    log = tmp_path / "site.log"
    n = _reboot_minute_log(log)
    out = tmp_path / "out"
    res = replay([str(log)], ReplayOptions(read=ReadOptions(line_formats=(compile_line_format(
        "<Date> <Time> <Node> <Content>"),), dedupe=False), out_dir=out))
    f = _check_against_events(out)
    ev = pl.read_parquet(out / "events.parquet")
    assert ev.height == n
    win = f.filter(pl.col("file") == "detector")
    # the model flags the burst minute: one window row, with its score
    assert win.select("rule_id", "host", "line").rows() == [("detector.anomaly", "node01", 0)]
    assert win["window_score"][0] == win["score"][0] and win["window_flagged"][0] is True
    assert "12:30:00" in win["message"][0]
    # of its 245 lines only the first line of its most over-represented templates are line alerts (not 245)
    lines = f.filter(pl.col("file") != "detector")
    assert lines.height == MAX_LINES_PER_WINDOW == 3
    assert (lines["rule_id"] == "detector.anomaly").all() and (lines["window_score"] == win["window_score"][0]).all()
    assert not lines["message"].str.contains("crond").any()          # the chatter of every minute is not singled out
    assert lines["line"].to_list() == [311, 312, 313]                 # the burst's first line of three templates
    assert [i.category for i in res.incidents] == ["anomaly"]        # the window verdict itself is unchanged


def test_cli_line_format_replay_writes_findings(tmp_path, capsys):
    # LogHub BGL/BGL_2k.log (github.com/logpai/loghub), label column removed: two alert lines
    log = tmp_path / "ras.log"
    log.write_text(
        "1117869872 2005.06.04 R04-M1-N4-I:J18-U11 2005-06-04-00.24.32.432192 R04-M1-N4-I:J18-U11 RAS APP FATAL "
        "ciod: failed to read message prefix on control stream (CioStream socket to 172.16.96.116:33569\n"
        "1118536327 2005.06.11 R30-M0-N9-C:J16-U01 2005-06-11-17.32.07.581048 R30-M0-N9-C:J16-U01 RAS KERNEL FATAL "
        "data TLB error interrupt\n"
        "not a RAS line at all\n")
    out = tmp_path / "out"
    code = main(["replay", str(log), "--out", str(out), "--json",
                 "--line-format", "<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>",
                 "--time-format", "%Y-%m-%d-%H.%M.%S%.f"])
    assert code == 0
    assert '"format_mismatch": 1' in capsys.readouterr().out
    f = pl.read_parquet(out / "findings.parquet")
    assert dict(f.schema) == LINE_FINDINGS_SCHEMA
    ev = pl.read_parquet(out / "events.parquet")
    assert ev.sort("line")["host"].to_list()[:2] == ["R04-M1-N4-I:J18-U11", "R30-M0-N9-C:J16-U01"]
    q = (out / "quarantine.jsonl").read_text()
    assert '"reason": "format_mismatch"' in q and "not a RAS line at all" in q


@pytest.mark.parametrize(("flag", "want"), [([], 2), (["--no-line-scores"], 0)])
def test_cli_line_scores_default_on_for_a_site_format_and_switch(tmp_path, capsys, flag, want):
    # the two LogHub BGL_2k FATAL lines of the test above (github.com/logpai/loghub, label column removed)
    log = tmp_path / "ras.log"
    log.write_text(
        "1117869872 2005.06.04 R04-M1-N4-I:J18-U11 2005-06-04-00.24.32.432192 R04-M1-N4-I:J18-U11 RAS APP FATAL "
        "ciod: failed to read message prefix on control stream (CioStream socket to 172.16.96.116:33569\n"
        "1118536327 2005.06.11 R30-M0-N9-C:J16-U01 2005-06-11-17.32.07.581048 R30-M0-N9-C:J16-U01 RAS KERNEL FATAL "
        "data TLB error interrupt\n")
    out = tmp_path / "out"
    assert main(["replay", str(log), "--out", str(out), "--json", *flag,
                 "--line-format", "<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>",
                 "--time-format", "%Y-%m-%d-%H.%M.%S%.f"]) == 0
    capsys.readouterr()
    f = _check_against_events(out).filter(pl.col("rule_id") == "detector.line_rarity")
    assert f.height == want
    if want:
        assert f["level"].to_list() == ["fatal", "fatal"] and f["score"].null_count() == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--time-format", "%Y"], "--time-format needs --line-format"),
    (["--line-format", "<Node> <Content>", "--format", "syslog"], "give one"),
    (["--line-format", "<Node> <Lvl> <Content>"], "unknown field <Lvl>"),
])
def test_cli_line_format_errors(tmp_path, capsys, args, needle):
    log = tmp_path / "x.log"
    log.write_text("a b c\n")
    assert main(["replay", str(log), *args]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and needle in err


def test_cli_watch_file_source_with_a_line_format(tmp_path, capsys):
    import json
    import time

    # a site's own layout: date, time, node, component, level, then the message (an NVRM Xid line)
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    log = tmp_path / "site.log"
    log.write_text(f"{now}.250 gpu-n05 kernel ERR NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    args = ["watch", "--source", f"file:{log}", "--json", "--for", "1.0", "--refresh", "100ms",
            "--state-dir", str(tmp_path / "state"), "--line-format", "<Date> <Time> <Node> <Component> <Level> <Content>"]
    assert main(args) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [(o["node"], o["xid"], o["category"]) for o in out] == [("gpu-n05", 79, "xid")]
    assert main(["watch", "--source", f"file:{log}", "--time-format", "%Y"]) == 2
    assert "--time-format needs --line-format" in capsys.readouterr().err


def test_window_exemplars_rank_and_bounds():
    from datetime import UTC, datetime, timedelta

    from recovery_logs.pipeline.line_findings import window_exemplars

    t0 = datetime(2026, 11, 9, 12, 0, tzinfo=UTC)
    rows = []
    for m in range(10):   # chatter every minute on n1 (LogHub Thunderbird_2k crond lines, github.com/logpai/loghub)
        rows += [(t0 + timedelta(minutes=m, seconds=s), "n1", "info" if s else None,
                  f"crond[{2915 + s}]: session closed for user root") for s in range(4)]
    w = t0 + timedelta(minutes=5, seconds=30)
    rows += [(w, "n1", "info", f"CPU{i}: Physical Processor ID: {i % 2}") for i in range(6)]       # info: never
    rows += [(w, "n1", "warning", f"ide{i}: Wait for ready failed before probe !") for i in range(2)]
    rows += [(w, "n1", "error", "EXT3-fs error (device sda5): ext3_find_entry: reading directory #2 offset 0")]
    rows += [(w, "n1", None, "NET: Registered protocol family 2"), (w, "n1", None, "NET: Registered protocol family 2")]
    rows += [(w, "n1", "notice", "kernel: Linux version 2.6.5-7.191-smp")]
    ev = pl.DataFrame({"time": [r[0] for r in rows], "host": [r[1] for r in rows], "level": [r[2] for r in rows],
                       "message": [r[3] for r in rows]}).with_columns(
        file=pl.lit("site.log"), line=pl.int_range(1, pl.len() + 1, dtype=pl.Int64), job_id=pl.lit(None, pl.String))
    wn = 60 * 10**9
    w0 = int(t0.timestamp() * 1e9) + 5 * wn
    windows = pl.DataFrame({"host": ["n1"], "job_id": pl.Series([None], dtype=pl.String), "_w": [w0], "score": [0.7],
                            "_role": ["cause"]})
    got = window_exemplars(ev.lazy(), windows, wn)
    # one line per template, the first; the quiet lines (info, notice) and the every-minute chatter left out;
    # equal lift (each template only in this window): the worse level first, then time
    assert got["message"].to_list() == ["EXT3-fs error (device sda5): ext3_find_entry: reading directory #2 offset 0",
                                        "ide0: Wait for ready failed before probe !",
                                        "NET: Registered protocol family 2"]
    assert (got["score"] == 0.7).all() and (got["_lift"] >= 2.0).all()
    # the rule-won line is left to its rule; the next unusual one takes its place
    won = got.filter(pl.col("level") == "error").select("file", "line")
    again = window_exemplars(ev.lazy(), windows, wn, won)
    assert "EXT3-fs error" not in " ".join(again["message"].to_list()) and again.height == 2
