"""VictoriaLogs JSON lines: every captured response body parses; records API == file reader."""

from __future__ import annotations

import json

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recovery_logs.sources.files import ReadOptions, events_from_vl_records, iter_batches, read_paths
from recovery_logs.sources.read_common import Deduper

from .conftest import FIX, events_frame

BODIES = sorted(FIX.glob("vl_*.jsonl"))


def _nonblank(path) -> int:
    return sum(1 for ln in path.read_text().splitlines() if ln.strip())


@pytest.mark.parametrize("path", BODIES, ids=[p.stem for p in BODIES])
def test_every_captured_body_parses_and_accounts_for_every_row(path):
    events, quarantine = [], []
    for b in iter_batches([path], ReadOptions(fmt="vl-jsonl")):
        events.append(b.events)
        quarantine.append(b.quarantine)
    ev, q = pl.concat(events), pl.concat(quarantine)
    malformed = q.filter(pl.col("reason") == "malformed").height
    dups = q.filter(pl.col("reason") == "duplicate").height
    assert ev.height + malformed + dups == _nonblank(path)
    assert ev["time"].null_count() == 0
    # rows with a _time are events; rows without one (stats, `| fields host, _msg`) are malformed
    with_time = sum(1 for ln in path.read_text().splitlines() if ln.strip() and "_time" in json.loads(ln))
    assert ev.height + dups == with_time


def test_nanoseconds_and_multiline_msg_are_kept():
    r = read_paths([FIX / "vl_query_time_range_filter.jsonl"])
    ns = r.events["time"].dt.epoch("ns").to_list()
    assert 1795961160123456789 in ns
    assert any("\nNVRM: nvidia-bug-report.sh" in m for m in r.events["message"])


def test_host_from_each_field_kind():
    hosts = {
        "vl_query_after_syslog.jsonl": {"gpu-sl1", "gpu-sl2"},        # hostname
        "vl_query_after_journald.jsonl": {"gpu-jd1"},                 # _HOSTNAME
        "vl_query_after_es_bulk.jsonl": {"gpu-es1", "gpu-es2"},       # host.name
        "vl_query_stream_filter.jsonl": {"gpu-n1"},                   # host
    }
    for name, want in hosts.items():
        r = read_paths([FIX / name])
        assert set(r.events["host"].to_list()) == want, name


def test_syslog_rows_source_and_job_from_meta():
    r = read_paths([FIX / "vl_query_after_syslog.jsonl"])
    got = sorted(zip(r.events["source"].to_list(), r.events["job_id"].to_list(), strict=True),
                 key=lambda t: (t[0], t[1] or ""))
    assert got == [("kernel", None), ("kernel", None), ("slurm", "185100")]


def test_records_api_equals_file_reader():
    path = FIX / "vl_query_all_unsorted.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    b = events_from_vl_records(rows, seq_start=0, file=str(path))
    ref = read_paths([path]).events.sort("seq")
    assert_frame_equal(b.events, ref)


def test_records_api_file_names_stream_and_missing_time_is_malformed():
    rows = [
        {"_time": "2026-11-29T14:06:00.000000001Z", "_stream_id": "abc", "_msg": "x", "host": "gpu-n1"},
        {"_msg": "no time", "host": "gpu-n1"},
        {"_time": "not a time", "_msg": "bad", "host": "gpu-n1"},
    ]
    b = events_from_vl_records(rows, ReadOptions(job="42"), seq_start=5)
    exp = events_frame([dict(time="2026-11-29T14:06:00.000000001Z", line=1, seq=5, host="gpu-n1", job="42",
                             source="other", stream_id="abc", message="x", file="victorialogs:abc")], "victorialogs")
    assert_frame_equal(b.events, exp)
    assert b.quarantine.select("file", "line", "reason").rows() == [("victorialogs", 2, "malformed"),
                                                                     ("victorialogs", 3, "malformed")]
    assert b.stats["malformed"] == 2


def test_tail_reconnect_duplicates_are_dropped_with_a_shared_deduper():
    d = Deduper()
    rows = [[json.loads(ln) for ln in (FIX / f"vl_tail_reconnect_{n}_connection.jsonl").read_text().splitlines()
             if ln.strip()] for n in ("1st", "2nd")]
    first = events_from_vl_records(rows[0], dedup=d)
    second = events_from_vl_records(rows[1], seq_start=first.events.height, dedup=d)
    assert first.events.height == 1
    assert second.events.height == 0
    assert second.quarantine["reason"].to_list() == ["duplicate"]


def test_records_that_are_not_dicts_or_not_strings_take_the_slow_path():
    rows = [{"_time": "2026-11-29T14:00:00Z", "_msg": ["a"], "rank": 3, "host": "h"}, "junk", {"_msg": "x"}]
    b = events_from_vl_records(rows)
    assert b.events.select("message", "rank", "host").rows() == [('["a"]', 3, "h")]
    assert b.quarantine.select("line", "reason", "raw").rows() == [(2, "malformed", '"junk"'),
                                                                   (3, "malformed", '{"_msg": "x"}')]


def test_records_fast_path_raw_lists_only_present_fields():
    b = events_from_vl_records([{"_msg": "x", "host": "h2"}])
    assert b.quarantine.select("line", "reason", "raw").rows() == [(1, "malformed", '{"_msg":"x","host":"h2"}')]
