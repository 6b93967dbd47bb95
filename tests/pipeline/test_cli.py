"""The replay/demo CLI: output contract, clear errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from recovery_logs.cli import main

INCIDENTS = Path(__file__).resolve().parents[2] / "recovery_logs" / "data" / "incidents"
INCIDENT_KEYS = {"id", "category", "cause", "severity", "node", "gpu", "job_id", "xid", "confidence", "first_seen",
                 "detected_at", "evidence", "candidates", "actions"}


def test_replay_json_follows_the_output_contract(capsys):
    assert main(["replay", str(INCIDENTS / "xid79_nccl_cascade"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"events", "malformed", "incidents"} <= set(out["summary"])
    assert out["summary"]["incidents"] == len(out["incidents"]) >= 1
    inc = out["incidents"][0]
    assert INCIDENT_KEYS <= set(inc)
    assert {"time", "node", "message"} <= set(inc["evidence"][0])
    assert {"node", "cause", "score"} <= set(inc["candidates"][0])
    assert {"kind", "target", "decision", "reason"} <= set(inc["actions"][0])
    assert all(a["decision"] == "record_only" for i in out["incidents"] for a in i["actions"])
    assert inc["first_seen"].endswith("Z") and len(inc["first_seen"].split(".")[1]) == 10


def test_missing_file_is_a_clear_input_error(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    assert main(["replay", str(missing)]) == 4
    err = capsys.readouterr().err
    assert "InputError" in err and str(missing) in err


def test_no_events_at_all_names_the_input(tmp_path, capsys):
    bad = tmp_path / "export.jsonl"
    bad.write_text('{"_msg": "no time"\n{not json}\n')
    code = main(["replay", str(bad), "--format", "vl-jsonl"])
    assert code == 4
    assert "export.jsonl" in capsys.readouterr().err


def test_unknown_format_and_nothing_to_replay(capsys):
    assert main(["replay", str(INCIDENTS / "healthy"), "--format", "bogus"]) == 2
    assert "unknown --format" in capsys.readouterr().err
    assert main(["replay"]) == 2
    assert "nothing to replay" in capsys.readouterr().err


def test_demo_lists_and_replays_bundled_incidents(capsys):
    assert main(["demo", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"xid79_nccl_cascade", "xid48_row_remap", "ib_link_down", "user_exception", "gpu_oom",
            "healthy"} <= set(names)
    assert main(["demo", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "gpu-n02" in out and "drain_node" in out and "(record only)" in out
    assert main(["demo", "nosuch"]) == 2


def test_package_reexports_the_notebook_api():
    import recovery_logs
    from recovery_logs import api

    assert set(api.__all__) <= set(recovery_logs.__all__)
    assert recovery_logs.incidents_frame is api.incidents_frame


def test_replay_goes_on_past_an_unreadable_file_and_says_so_in_its_exit_code(tmp_path, capsys):
    import json as _json

    from recovery_logs.cli import main as _main

    d = tmp_path / "logs"
    (d / "nodes" / "gpu-n01").mkdir(parents=True)
    (d / "nodes" / "gpu-n01" / "kern.log").write_text(
        "Nov 29 14:06:05 gpu-n01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    (d / "nodes" / "gpu-n02.log.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)
    rc = _main(["replay", str(d), "--year", "2026", "--json", "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert rc == 4
    res = _json.loads(out.out)
    assert res["summary"]["unreadable"] == 1 and res["incidents"][0]["node"] == "gpu-n01"
    assert "gpu-n02.log.gz" in out.err
    q = [_json.loads(x) for x in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in q] == ["unreadable"]


def test_quarantine_is_capped_per_reason_and_the_rest_counted(tmp_path):
    import polars as pl

    from recovery_logs.pipeline.replay import ReplayOptions, replay
    from recovery_logs.sources.files import ReadOptions

    p = tmp_path / "kern.log"
    p.write_bytes(b"Nov 29 14:06:05 n1 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n" * 5000
                  + b"Nov 29 14:06:0x n1 kernel: bad time\n" * 30)
    r = replay([p], ReplayOptions(read=ReadOptions(year=2026), quarantine_cap=100))
    assert r.summary["duplicates"] == 4999 and r.summary["bad_timestamp"] == 30
    counts = dict(r.quarantine.group_by("reason").len().iter_rows())
    assert counts == {"duplicate": 100, "bad_timestamp": 30}
    assert r.summary["quarantine_not_kept"] == 4899 and r.summary["quarantined"] == 130
    assert r.quarantine.filter(pl.col("reason") == "duplicate")["line"].to_list() == list(range(2, 102))


def test_progress_bar_only_on_a_terminal_or_when_asked(capsys):
    from recovery_logs.api import bundled_incident
    from recovery_logs.cli import main as _main

    d = str(bundled_incident("xid79_nccl_cascade"))
    assert _main(["replay", d, "--year", "2026", "--json"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""                                  # not a terminal: nothing
    assert _main(["replay", d, "--year", "2026", "--json", "--progress"]) == 0
    asked = capsys.readouterr()
    assert "replay" in asked.err and "lines/s" in asked.err and "ETA" in asked.err
    assert asked.out == quiet.out                           # stdout (the JSON contract) is untouched
