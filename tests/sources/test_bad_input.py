"""Bad input is counted and quarantined, never crashes; fatal problems name the file and line."""

from __future__ import annotations

import gzip

import polars as pl
import pytest

from recovery_logs.errors import InputError
from recovery_logs.sources.files import ReadOptions, read_paths

LINE = b"Nov 29 14:06:00 gpu-n01 kernel: hello\n"


def test_invalid_utf8_is_kept_replaced_and_quarantined(tmp_path):
    p = tmp_path / "kern.log"
    p.write_bytes(LINE + b"Nov 29 14:06:01 gpu-n01 kernel: bad \xff\xfe bytes\n"
                  + LINE.replace(b"hello", b"end").replace(b":00 ", b":02 "))
    r = read_paths([p], ReadOptions(year=2026))
    assert r.events["message"].to_list() == ["hello", "bad \ufffd\ufffd bytes", "end"]
    assert r.quarantine.rows() == [(str(p), 2, "invalid_utf8", "Nov 29 14:06:01 gpu-n01 kernel: bad \\xff\\xfe bytes")]
    assert r.stats["invalid_utf8"] == 1


def test_oversized_line_is_cut_and_quarantined_not_an_event(tmp_path):
    p = tmp_path / "job.out"
    big = b"x" * (1 << 20) + b"y" * 10
    p.write_bytes(b"before\n" + big + b"\nafter\n")
    r = read_paths([p])
    assert r.events["message"].to_list() == ["before", "after"]
    assert r.events["line"].to_list() == [1, 3]
    q = r.quarantine
    assert q.select("line", "reason").rows() == [(2, "oversized")]
    assert q["raw"][0] == "x" * 4096
    assert r.stats["oversized"] == 1


def test_oversized_line_fed_in_small_pieces_holds_bounded_memory(tmp_path):
    from recovery_logs.sources.read_text import TextParser
    tp = TextParser(str(tmp_path / "x.out"), ReadOptions(), "job")
    piece = b"z" * 65536
    for _ in range(40):          # 2.5 MiB without a newline
        tp.feed(piece)
        assert len(tp._pending) <= (1 << 20) + 65536
    b = tp.feed(b"\nok\n")
    f = tp.flush()
    assert b.quarantine.select("line", "reason").rows() == [(1, "oversized")]
    assert pl.concat([b.events, f.events])["message"].to_list() == ["ok"]


def test_malformed_json_lines_are_quarantined_not_events(tmp_path):
    p = tmp_path / "vl.jsonl"
    p.write_text('{"_time":"2026-11-29T14:19:10Z","_msg":"good line 1"}\n'
                 '{"_time":"2026-11-29T14:19:10Z","_msg": broken\n'
                 '{"_msg":"no time at all"}\n'
                 '{"_time":"yesterday","_msg":"bad time"}\n'
                 '[1, 2, 3]\n'
                 '{"_time":"2026-11-29T14:19:11Z","_msg":"good line 2"}\n')
    r = read_paths([p])
    assert r.events["message"].to_list() == ["good line 1", "good line 2"]
    assert r.quarantine.select("line", "reason").rows() == [(2, "malformed"), (3, "malformed"), (4, "malformed"),
                                                            (5, "malformed")]
    assert r.stats["malformed"] == 4


def test_malformed_journald_line(tmp_path):
    p = tmp_path / "j.json"
    p.write_text('{"__REALTIME_TIMESTAMP":"1795971816551714","MESSAGE":"ok","_HOSTNAME":"h1"}\n{"MESSAGE": \n')
    r = read_paths([p], ReadOptions(fmt="journald"))
    assert r.events["message"].to_list() == ["ok"]
    assert r.quarantine.select("line", "reason").rows() == [(2, "malformed")]


def test_out_of_order_is_kept_and_quarantined(tmp_path):
    p = tmp_path / "kern.log"
    p.write_bytes(b"Nov 29 14:06:05 n1 kernel: a\nNov 29 14:06:01 n1 kernel: b\nNov 29 14:06:06 n1 kernel: c\n")
    r = read_paths([p], ReadOptions(year=2026))
    assert r.events["message"].to_list() == ["b", "a", "c"]     # sorted by time for the pipeline
    assert r.quarantine.select("line", "reason").rows() == [(2, "out_of_order")]
    assert r.stats["out_of_order"] == 1


def test_duplicates_within_and_across_files_are_dropped_and_quarantined(tmp_path):
    a, b = tmp_path / "a" / "kern.log", tmp_path / "b" / "kern.log"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_bytes(b"Nov 29 14:06:05 n1 kernel: x\nNov 29 14:06:05 n1 kernel: x\nNov 29 14:06:06 n1 kernel: y\n")
    b.write_bytes(b"Nov 29 14:06:06 n1 kernel: y\nNov 29 14:06:06 n2 kernel: y\n")
    r = read_paths([a, b], ReadOptions(year=2026))
    assert r.events.select("host", "message").rows() == [("n1", "x"), ("n1", "y"), ("n2", "y")]
    assert r.quarantine.select("file", "line", "reason").rows() == [(str(a), 2, "duplicate"), (str(b), 1, "duplicate")]
    assert r.stats["duplicates"] == 2


def test_lines_with_inferred_time_are_not_duplicates(tmp_path):
    p = tmp_path / "job.out"
    p.write_text("same\nsame\n")
    r = read_paths([p])
    assert r.events["message"].to_list() == ["same", "same"]
    assert r.stats["duplicates"] == 0


def test_missing_path_names_the_path(tmp_path):
    missing = tmp_path / "nope.log"
    with pytest.raises(InputError) as ei:
        read_paths([missing])
    assert ei.value.path == str(missing)
    assert str(missing) in str(ei.value)


def test_empty_glob_names_the_glob(tmp_path):
    with pytest.raises(InputError, match="glob"):
        read_paths([str(tmp_path / "*.nothing")])


def test_unreadable_file_names_the_path(tmp_path):
    import os
    p = tmp_path / "secret.log"
    p.write_text("x\n")
    os.chmod(p, 0)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as a user who can read anything")
        with pytest.raises(InputError) as ei:
            read_paths([p])
        assert ei.value.path == str(p)
    finally:
        os.chmod(p, 0o644)


@pytest.mark.parametrize("batch_lines", [500, 200_000])     # streamed in chunks / read whole
def test_truncated_gzip_keeps_its_readable_part_and_names_the_first_cut_line(tmp_path, batch_lines):
    import zlib
    lines = b"".join(b"Nov 29 14:06:%02d n1 kernel: line %d\n" % (i % 60, i) for i in range(20000))
    blob = gzip.compress(lines)
    p = tmp_path / "kern.log.gz"
    p.write_bytes(blob[: len(blob) // 2])      # truncated stream
    readable = zlib.decompressobj(wbits=31).decompress(blob[: len(blob) // 2])
    whole = readable.count(b"\n")             # lines read whole; line whole+1 is cut
    assert 1000 < whole < 19000
    r = read_paths([p], ReadOptions(year=2026, batch_lines=batch_lines, dedupe=False))
    assert r.events.height == whole
    last = r.events.sort("line")[-1]
    assert last["line"].item() == whole and last["message"].item() == f"line {whole - 1}"
    q = r.quarantine.filter(pl.col("reason") == "truncated")
    assert q["line"].to_list() == [whole + 1] and q["file"].to_list() == [str(p)]
    assert "truncated gzip" in q["raw"][0]
    assert r.stats["truncated"] == 1


def test_corrupt_gzip_alone_names_path(tmp_path):
    p = tmp_path / "kern.log.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 200)     # gzip magic, then no valid deflate data
    with pytest.raises(InputError) as ei:
        read_paths([p])
    assert str(p) in str(ei.value)


def test_no_events_at_all_names_the_inputs(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"_msg": "no time"}\n')
    with pytest.raises(InputError) as ei:
        read_paths([p])
    assert str(p) in str(ei.value)


def test_parquet_not_in_event_schema(tmp_path):
    p = tmp_path / "x.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(p)
    with pytest.raises(InputError, match="event schema") as ei:
        read_paths([p])
    assert ei.value.path == str(p)
    q = tmp_path / "y.parquet"
    pl.DataFrame({"time": [1.5], "message": ["m"]}).write_parquet(q)
    with pytest.raises(InputError, match="time") as ei:
        read_paths([q])
    assert ei.value.path == str(q)


def test_unknown_format_option():
    with pytest.raises(InputError, match="unknown format"):
        read_paths(["x"], ReadOptions(fmt="xml"))


def test_dedupe_can_be_turned_off_for_storms(tmp_path):
    p = tmp_path / "kern.log"
    p.write_bytes(b"Nov 29 14:06:05 n1 kernel: NVRM: Xid 79\n" * 3)
    assert read_paths([p], ReadOptions(year=2026)).events.height == 1
    r = read_paths([p], ReadOptions(year=2026, dedupe=False))
    assert r.events.height == 3 and r.stats["duplicates"] == 0


def test_file_that_cannot_be_opened_names_the_path(tmp_path):
    import socket
    p = tmp_path / "node.sock"           # a UNIX socket exists but cannot be opened for reading
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(p))
        with pytest.raises(InputError, match="cannot read") as ei:
            read_paths([p])
        assert ei.value.path == str(p)
    finally:
        s.close()


def test_parquet_rows_without_a_usable_time_are_counted_and_quarantined(tmp_path):
    p = tmp_path / "events.parquet"
    pl.DataFrame({"time": ["2026-11-29T14:06:00Z", "yesterday", None, "2026-11-29T14:06:01.5Z"],
                  "message": ["a", "b", "c", "d"], "host": ["n1"] * 4}).write_parquet(p)
    r = read_paths([p])
    assert r.events["message"].to_list() == ["a", "d"]
    assert r.events["time"].null_count() == 0
    assert r.stats["bad_timestamp"] == 2
    q = r.quarantine.sort("line")
    assert q["line"].to_list() == [2, 3] and set(q["reason"]) == {"bad_timestamp"}
    assert q["raw"][0] == "time=yesterday message=b"


def test_one_unreadable_file_in_a_directory_is_reported_and_the_others_are_read(tmp_path):
    (tmp_path / "nodes" / "gpu-n01").mkdir(parents=True)
    (tmp_path / "nodes" / "gpu-n01" / "kern.log").write_text(
        "Nov 29 14:06:05 gpu-n01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    bad = tmp_path / "nodes" / "gpu-n02.log.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)          # not inflatable at all
    (tmp_path / "zz.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    r = read_paths([tmp_path], ReadOptions(year=2026))
    assert r.events["host"].to_list() == ["gpu-n01"]
    assert r.stats["unreadable"] == 2
    q = r.quarantine.filter(pl.col("reason") == "unreadable").sort("file")
    assert q["file"].to_list() == [str(bad), str(tmp_path / "zz.parquet")]
    assert "gzip" in q["raw"][0] and "Parquet" in q["raw"][1]


def test_a_fault_line_after_binary_junk_keeps_its_host_and_time(tmp_path):
    import random
    rnd = random.Random(5)
    junk = bytes(rnd.randrange(256) for _ in range(1 << 20))
    p = tmp_path / "node.log"
    p.write_bytes(junk + b"\nNov 29 14:06:05 gpu-n07 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    r = read_paths([p], ReadOptions(year=2026))
    hit = r.events.filter(pl.col("message").str.contains("Xid"))
    assert hit["host"].to_list() == ["gpu-n07"]
    assert hit["time_inferred"].to_list() == [False]
    assert str(hit["time"][0]).startswith("2026-11-29 14:06:05")
