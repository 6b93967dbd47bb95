"""Following without loss: dedupe, cursor, lossless history paging, VL tail + catch-up under
faults (real server on 127.0.0.1), and tail -F of files (rotation, truncation, globs, resume)."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.pipeline.cursor import WatchCursor
from recovery_logs.sources.follow import FileFollower
from recovery_logs.sources.history import history_rows
from recovery_logs.sources.rowkeys import SeenKeys, record_key, vl_time_ns
from recovery_logs.sources.tail import VLFollower
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.timeutil import NS, iso_to_ns

vlserver = sys.modules["recovery_logs_tests_vlserver"]


def test_vl_time_ns_keeps_nanoseconds():
    for text in ("2026-11-29T14:16:00Z", "2026-11-29T14:06:00.5Z", "2026-11-29T14:16:01.000001Z",
                 "2026-11-29T14:02:30.98047244Z", "2026-11-29T14:06:00.123456789Z"):
        assert vl_time_ns(text) == iso_to_ns(text)
    assert vl_time_ns("2026-11-29T14:06:00.123456789Z") % 1000 == 789
    for bad in ("", "2026-11-29", "2026-11-29T14:06:00.1234567891Z", "2026-11-29T14:06:00+01:00"):
        with pytest.raises(ValueError):
            vl_time_ns(bad)


def test_deduper_bounded():
    d = SeenKeys(max_keys=100)
    keys = [("s", i * NS // 10, b"x") for i in range(1000)]
    assert all(d.add(k) for k in keys)
    assert len(d) <= 100 and d.forced > 0
    assert not d.add(keys[-1])                      # recent keys are still remembered
    d2 = SeenKeys()
    for k in keys:
        d2.add(k)
    assert d2.evict_before(50 * NS) == 500 and len(d2) == 500
    assert record_key({"_stream_id": "a", "_time": "2026-11-29T14:06:00Z", "_msg": "m"}) != \
        record_key({"_stream_id": "a", "_time": "2026-11-29T14:06:00Z", "_msg": "n"})


def test_cursor_roundtrip(tmp_path):
    c = WatchCursor.load(tmp_path, "x")
    assert c.complete_ns is None
    c.complete_ns = 123
    c.reported["inc-1"] = {"count": 2, "last_seen": 5, "status": "open", "severity": "high"}
    c.files["/a"] = {"dev": 1, "ino": 2, "offset": 3}
    c.save()
    c2 = WatchCursor.load(tmp_path, "x")
    assert (c2.complete_ns, c2.reported, c2.files) == (123, c.reported, c.files)
    (tmp_path / "watch-bad.json").write_text("{not json")
    from recovery_logs.errors import InputError
    with pytest.raises(InputError):
        WatchCursor.load(tmp_path, "bad")


def _mk(t_ns: int, msg: str, host: str = "n1", unit: str = "train") -> dict:
    return {"_time": vlserver.format_time_ns(t_ns), "_msg": msg, "host": host, "unit": unit}


@settings(max_examples=15, deadline=None)
@given(times=st.lists(st.integers(0, 30), min_size=0, max_size=60), page=st.integers(1, 7))
def test_history_paging_is_lossless(times, page):
    """Pages by time with equal timestamps straddling page boundaries: every row exactly once."""
    base = iso_to_ns("2026-11-29T14:00:00Z")
    with vlserver.VLServer(static=False) as srv:
        srv.ingest([_mk(base + t * NS, f"m{i}", host=f"n{i % 3}") for i, t in enumerate(times)])
        c = VictoriaLogsClient(srv.base, retries=0)
        got = [r["_msg"] for rows in history_rows(c, "*", base, base + 60 * NS, page_size=page) for r in rows]
    assert sorted(got) == sorted(f"m{i}" for i in range(len(times)))
    assert len(got) == len(set(got))


def _drain(f: VLFollower, until, timeout=15.0, step=0.05) -> list[dict]:
    out: list[dict] = []
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        out += f.poll()
        if until(out):
            break
        time.sleep(step)
    return out


def _follower(srv, **kw) -> VLFollower:
    kw.setdefault("lateness_s", 30.0)
    kw.setdefault("catchup_s", 0.3)
    c = VictoriaLogsClient(srv.base, retries=0, read_timeout=3.0)
    return VLFollower(c, "*", tail_offset="10ms", tail_start_offset="5s", refresh="50ms",
                      reconnect_backoff_s=0.05, reconnect_max_s=0.2, **kw)


def test_follower_late_lines_caught_by_catchup_and_duplicates_dropped(empty_vls):
    now = time.time_ns()
    f = _follower(empty_vls, catchup_s=0.5).start()
    try:
        empty_vls.ingest([_mk(now, "A"), _mk(now + 1000, "B", "n2")])
        first = _drain(f, lambda o: len(o) >= 2)
        # E: 10 s late in a new stream -> the live tail never sends it; the catch-up does
        empty_vls.ingest([_mk(now - 10 * NS, "E late", "n5", "kernel")])
        # duplicates: the same rows ingested again come back from tail replay and catch-up
        empty_vls.ingest([_mk(now, "A"), _mk(now + 1000, "B", "n2")])
        rest = _drain(f, lambda o: any(r["_msg"] == "E late" for r in o))
        time.sleep(0.6)
        rest += f.poll()
    finally:
        f.close()
    msgs = [r["_msg"] for r in first + rest]
    assert sorted(msgs) == ["A", "B", "E late"]
    assert f.stats["duplicates"] >= 2
    assert f.complete_ns is not None and f.complete_ns >= now


def test_follower_server_down_at_start_keeps_retrying():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    srv = vlserver.VLServer(port=port, static=False)
    f = _follower(srv, catchup_s=0.1).start()
    try:
        time.sleep(0.3)
        assert f.poll() == []
        assert f.stats["errors_catchup"] >= 1 and "cannot connect" in (f.last_error or "")
        assert f.complete_ns is None
        srv.start()
        srv.ingest([_mk(time.time_ns(), "after start")])
        got = _drain(f, lambda o: len(o) >= 1)
        assert [r["_msg"] for r in got] == ["after start"]
    finally:
        f.close()
        srv.stop()


def test_follower_restart_mid_tail_and_cut_catchup_lose_nothing(empty_vls):
    f = _follower(empty_vls, catchup_s=0.2).start()
    sent = []
    try:
        for i in range(30):
            row = _mk(time.time_ns(), f"line {i}", host=f"n{i % 4}")
            empty_vls.ingest([row])
            sent.append(row["_msg"])
            if i == 10:
                empty_vls.restart(down_for_s=0.3)      # open tails see EOF; reconnect replays 5 s
            if i == 20:
                empty_vls.cut_queries, empty_vls.cut_after = 1, 1   # one catch-up cut mid-stream
            time.sleep(0.03)
        got = _drain(f, lambda o: len(o) >= 30, timeout=20)
        time.sleep(0.5)
        got += f.poll()
    finally:
        f.close()
    assert sorted(r["_msg"] for r in got) == sorted(sent)
    assert f.stats["tail_reconnects"] >= 1
    assert f.stats["errors_catchup"] >= 1        # the cut stream was a failed read, retried


def test_follower_slow_server(empty_vls):
    empty_vls.slow_s = 0.3
    f = _follower(empty_vls, catchup_s=0.1, use_tail=False).start()
    try:
        empty_vls.ingest([_mk(time.time_ns(), "slow")])
        got = _drain(f, lambda o: len(o) >= 1)
    finally:
        f.close()
    assert [r["_msg"] for r in got] == ["slow"]


# ------------------------------------------------------------------ files
def test_file_follower_rotation_truncation_glob_resume(tmp_path):
    a = tmp_path / "a.log"
    a.write_bytes(b"one\ntwo\npart")
    ff = FileFollower([str(tmp_path / "*.log")])
    got = ff.poll()
    assert got == [(str(a), b"one\ntwo\n", True)]
    with a.open("ab") as fh:
        fh.write(b"ial\n")
    assert ff.poll() == [(str(a), b"partial\n", False)]
    # rotation: the old file gets a last line after the rename; the new file starts
    os.rename(a, tmp_path / "a.log.1")
    with (tmp_path / "a.log.1").open("ab") as fh:
        fh.write(b"last-old\n")
    a.write_bytes(b"new1\n")
    got = ff.poll()
    assert got[0] == (str(a), b"last-old\n", False) and got[1] == (str(a), b"new1\n", True)
    assert ff.stats["rotations"] == 1
    # truncation (copytruncate): read again from 0
    a.write_bytes(b"x\n")
    assert ff.poll() == [(str(a), b"x\n", True)] and ff.stats["truncations"] == 1
    # a new file matching the glob is picked up
    (tmp_path / "b.log").write_bytes(b"b1\n")
    assert (str(tmp_path / "b.log"), b"b1\n", True) in ff.poll()
    offsets = dict(ff.offsets)
    ff.close()
    # resume from the persisted offsets: nothing re-read, new lines only
    with a.open("ab") as fh:
        fh.write(b"y\n")
    ff2 = FileFollower([str(tmp_path / "*.log")], offsets=offsets)
    got = dict((p, d) for p, d, _ in ff2.poll())
    ff2.close()
    assert got == {str(a): b"y\n", str(tmp_path / "b.log"): b""}


def test_follower_long_outage_caught_up_in_bounded_windows(empty_vls):
    """Resuming 10 minutes back: several capped catch-up queries, every row once."""
    now = time.time_ns()
    empty_vls.ingest([_mk(now - (600 - 5 * i) * NS, f"old {i}", host=f"n{i % 3}") for i in range(120)])
    f = _follower(empty_vls, catchup_s=0.1, lateness_s=5.0, use_tail=False, resume_from_ns=now - 601 * NS,
                  max_window_s=60.0).start()
    try:
        got = _drain(f, lambda o: len(o) >= 120, timeout=15, step=0.01)
    finally:
        f.close()
    assert sorted(r["_msg"] for r in got) == sorted(f"old {i}" for i in range(120))
    assert f.stats["catchups"] >= 9          # ~600 s of outage in windows of 60 s
    assert not f.behind
