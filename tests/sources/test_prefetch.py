"""sources.prefetch: the read-ahead thread delivers the same items in order, bounded, and stops."""

from __future__ import annotations

import threading
import time

import pytest

from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.prefetch import prefetch
from recovery_logs.sources.read_common import ReadOptions


def test_same_items_in_order():
    assert list(prefetch(iter(range(1000)), 2)) == list(range(1000))
    assert list(prefetch([], 1)) == []
    src = iter([1, 2])
    assert prefetch(src, 0) is src      # depth 0: no thread


def test_items_driven_by_one_thread_and_at_most_depth_ahead():
    produced: list[int] = []
    threads: set[str] = set()

    def gen():
        for i in range(20):
            threads.add(threading.current_thread().name)
            produced.append(i)
            yield i

    it = prefetch(gen(), 2)
    assert next(it) == 0
    time.sleep(0.3)        # the thread runs ahead: 1 and 2 queued, 3 produced and waiting for room
    assert len(produced) <= 1 + 2 + 1
    assert list(it) == list(range(1, 20))
    assert threads == {"recovery-logs-prefetch"}


def test_error_raised_at_its_position():
    def gen():
        yield 1
        yield 2
        raise ValueError("bad input at item 3")

    it = prefetch(gen(), 4)
    assert next(it) == 1
    assert next(it) == 2
    with pytest.raises(ValueError, match="item 3"):
        next(it)


def test_early_close_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def gen():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = {t.ident for t in threading.enumerate()}
    it = prefetch(gen(), 1)
    assert next(it) == 0
    it.close()
    assert closed.wait(2.0)
    assert not [t for t in threading.enumerate() if t.name == "recovery-logs-prefetch" and t.ident not in before]


def test_negative_depth_is_an_error():
    with pytest.raises(ValueError, match="depth"):
        prefetch([1], -1)


def test_replay_reads_ahead_with_the_same_result(tmp_path):
    """A directory of several files replayed with and without read-ahead: the same summary and
    incidents (the reader's dedupe and seq state is driven by one thread either way)."""
    lines = []
    for i in range(300):
        lines.append(f"Nov 29 10:{i // 60:02d}:{i % 60:02d} gpu-n01 kernel: [{1000 + i}.0] eth0: link up")
    lines.append("Nov 29 10:05:00 gpu-n01 kernel: [1300.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    lines.append("Nov 29 10:05:00 gpu-n01 kernel: [1300.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    for n in range(8):
        d = tmp_path / "nodes" / f"gpu-n0{n + 1}"
        d.mkdir(parents=True)
        (d / "kern.log").write_text("\n".join(x.replace("gpu-n01", f"gpu-n0{n + 1}") for x in lines) + "\n")
    read = ReadOptions(year=2026, batch_lines=100)    # 64 KiB groups: 8 files in several batches
    a = replay([tmp_path], ReplayOptions(read=read, read_ahead=0))
    b = replay([tmp_path], ReplayOptions(read=read, read_ahead=2))
    assert a.summary["incidents"] >= 1 and a.summary["duplicates"] == 8
    assert a.to_json() == b.to_json()
    assert a.quarantine.equals(b.quarantine)
