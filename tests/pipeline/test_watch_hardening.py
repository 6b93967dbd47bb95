"""Issue 12, watch side: inputs that used to vanish are read or reported once, a FIFO never
hangs, watch scores windows as replay does, memory stays bounded under a flood, offsets resume
exactly, one watcher per state dir."""

from __future__ import annotations

import gzip
import os
import threading
import time
from pathlib import Path

import pytest

from recovery_logs.cli import main
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.watch import Watcher, WatchOptions
from recovery_logs.simulate.generate import SimOptions, simulate_one
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.statelock import StateLock, StateLocked
from recovery_logs.timeutil import NS

# the NVIDIA driver's XID 79 line as syslog writes it (bundled incident xid79_nccl_cascade)
XID = "Nov 29 14:{m:02d}:{s:02d} {host} kernel: [86483.123457] NVRM: Xid (PCI:0000:ba:00): 79, pid={pid}, " \
      "name=python3, GPU has fallen off the bus."
FAR = 2_000_000_000 * NS          # a wall clock well after every event: every window is past the watermark


def _xid(host: str, i: int = 0) -> str:
    return XID.format(m=(i // 60) % 60, s=i % 60, host=host, pid=1000 + i) + "\n"


def _watch(patterns: list[str], state: Path | None = None, clock: int = FAR, **kw) -> Watcher:
    opts = WatchOptions(sources=tuple(f"file:{p}" for p in patterns), state_dir=state, lateness_s=0,
                        read=ReadOptions(year=2026), **kw)
    return Watcher(opts, clock=lambda: clock).open()


def _steps(w: Watcher, n: int = 3) -> list:
    out = []
    for i in range(n):
        out += w.step(final=i == n - 1)
    return out


def test_gz_valid_and_truncated_are_read_and_reported(tmp_path: Path):
    good = tmp_path / "good.log.gz"
    good.write_bytes(gzip.compress(_xid("gpu-n01").encode()))
    data = gzip.compress("".join(_xid("gpu-n02", i) for i in range(2000)).encode())
    bad = tmp_path / "cut.log.gz"
    bad.write_bytes(data[: len(data) // 2])
    w = _watch([str(tmp_path / "*.gz")])
    try:
        _steps(w)
    finally:
        w.close()
    nodes = {i.node for i in w.incidents}
    assert nodes == {"gpu-n01", "gpu-n02"}                    # the readable part of the cut file counts
    [(path, why)] = w.problems.items()
    assert path.endswith("cut.log.gz") and "truncated gzip" in why
    assert w.stats["input_problems"] == 1


def test_missing_path_unreadable_and_looping_files_do_not_stop_the_others(tmp_path: Path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text(_xid("gpu-n01"))
    (logs / "b.log").write_text(_xid("gpu-n03"))
    os.symlink("loop.log", logs / "loop.log")                 # a symlink loop: ELOOP on open
    (logs / "dir.log").mkdir()
    w = _watch([str(logs / "*.log"), str(tmp_path / "nope.log")])
    try:
        _steps(w)
        _steps(w)                                              # reported once, not every step
    finally:
        w.close()
    assert {i.node for i in w.incidents} == {"gpu-n01", "gpu-n03"}
    probs = w.problems
    assert "no such file" in probs[str(tmp_path / "nope.log")]
    assert "symbolic links" in probs[str(logs / "loop.log")]
    assert "directory" in probs[str(logs / "dir.log")]
    assert w.stats["input_problems"] == 3


def test_cli_watch_reports_a_missing_path_once(tmp_path: Path, capsys):
    (tmp_path / "a.log").write_text(_xid("gpu-n01"))
    rc = main(["watch", "--source", f"file:{tmp_path / 'a.log'},file:{tmp_path / 'missing.log'}", "--json",
               "--for", "1", "--refresh", "200ms"])
    out = capsys.readouterr()
    assert rc == 0 and '"gpu-n01"' in out.out
    assert out.err.count("missing.log: no such file") == 1


def test_fifo_never_hangs_watch_or_replay(tmp_path: Path, capsys):
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    other = tmp_path / "node.log"
    other.write_text(_xid("gpu-n04"))
    t0 = time.monotonic()
    rc = main(["watch", "--source", f"file:{fifo},file:{other}", "--json", "--for", "1.5", "--refresh", "200ms"])
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert rc == 0 and took < 20 and '"gpu-n04"' in out       # no writer: --for still ends it
    # with a writer, the lines it sends are read
    def write() -> None:
        with open(fifo, "w") as fh:
            fh.write(_xid("gpu-n05"))
    th = threading.Thread(target=write)
    th.start()
    w = _watch([str(fifo)])
    try:
        for _ in range(50):
            w.step(final=True)
            if w.incidents:
                break
            time.sleep(0.05)
    finally:
        w.close()
        th.join(5)
    assert [i.node for i in w.incidents] == ["gpu-n05"]
    # replay: a FIFO named on the command line is read until its writer closes it; one without a
    # writer is empty at once; one inside a directory is skipped (never opened)
    th = threading.Thread(target=write)
    th.start()
    res = replay([fifo], ReplayOptions(read=ReadOptions(year=2026)))
    th.join(5)
    assert [i.node for i in res.incidents] == ["gpu-n05"]
    t0 = time.monotonic()
    res = replay([tmp_path], ReplayOptions(read=ReadOptions(year=2026)))
    assert time.monotonic() - t0 < 20 and [i.node for i in res.incidents] == ["gpu-n04"]


def test_watch_scores_windows_as_replay_does(tmp_path: Path, scenario: str = "healthy"):
    """A live reader behind its files (read in small steps, state compacted as it goes): before
    closed-window scoring it raised hang and anomaly incidents on healthy nodes that replay of the
    same lines never raised (the probe saw 18-64). Now watch ends with replay's incidents."""
    sim = simulate_one(scenario, SimOptions(out=tmp_path, scenario=scenario, nodes=4, duration_s=1200, seed=3)).path
    res = replay([sim], ReplayOptions(read=ReadOptions(year=2026)))
    w = _watch([str(sim / "**" / "*.log"), str(sim / "**" / "*.out")], clock=res.engine.max_time_ns,
               max_findings=50)
    w.files.read_max = 4096
    try:
        for _ in range(5000):
            w.step()
            if not w.files.more:
                break
        w.step(final=True)
    finally:
        w.close()
    assert w.stats["events"] == res.summary["events"] and w.stats["compactions"] > 0
    assert [(i.id, i.category, i.node) for i in w.incidents] == [(i.id, i.category, i.node) for i in res.incidents]


def test_flood_keeps_memory_bounded_and_counts_exact(tmp_path: Path):
    log = tmp_path / "kern.log"
    n = 40_000
    with open(log, "w") as fh:                                 # one node, 40 000 XIDs over 11 hours
        for i in range(n):
            fh.write(XID.format(m=(i // 60) % 60, s=i % 60, host="gpu-n07", pid=i).replace(
                "Nov 29 14:", f"Nov 29 {3 + i // 3600:02d}:") + "\n")
    w = _watch([str(log)], max_findings=2_000)
    w.files.read_max = 256 * 1024
    held = []
    try:
        for _ in range(400):
            w.step()
            held.append(w.engine.findings.height)
            if not w.files.more:
                break
        w.step(final=True)
    finally:
        w.close()
    want = replay([log], ReplayOptions(read=ReadOptions(year=2026))).incidents
    assert w.stats["compactions"] > 0 and max(held) < 2_000 + 256 * 1024 // 100
    assert w.engine.stats["flood_compacted"] > n // 2           # a handful kept per half incident gap
    assert [(i.id, i.count, i.first_seen, i.last_seen) for i in w.incidents] == \
        [(i.id, i.count, i.first_seen, i.last_seen) for i in want]
    assert w.incidents[0].count == n


def test_restart_resumes_exactly_at_the_held_line(tmp_path: Path):
    log = tmp_path / "kern.log"
    lines = [_xid(f"gpu-n{10 + i % 5}", i) for i in range(300)]
    log.write_text("".join(lines[:150]))
    state = tmp_path / "state"
    w = _watch([str(log)], state)
    try:
        first = _steps(w, 2)
    finally:
        w.close()
    with open(log, "a") as fh:
        fh.write("".join(lines[150:]))
    w = _watch([str(log)], state)
    try:
        second = _steps(w, 2)
    finally:
        w.close()
    printed = [(k, i.id, i.count) for k, i in first + second]
    assert len({(i, c) for _, i, c in printed}) == len(printed)          # nothing printed twice
    want = replay([log], ReplayOptions(read=ReadOptions(year=2026))).incidents
    final = {i.id: i.count for _, i in first + second}
    assert final == {i.id: i.count for i in want}
    logged = [e for i in w.incidents for e in i.evidence if e.file != "accounting"]   # not a log line (jobjoin)
    assert {e.line for e in logged} <= set(range(1, 301))
    ev = {(e.node, e.line) for e in logged}
    assert ev <= {(f"gpu-n{10 + (ln - 1) % 5}", ln) for ln in range(1, 301)}   # line numbers as in one run


def test_second_watcher_on_a_state_dir_is_refused(tmp_path: Path, capsys):
    state = tmp_path / "state"
    log = tmp_path / "a.log"
    log.write_text(_xid("gpu-n01"))
    w = _watch([str(log)], state)
    try:
        with pytest.raises(StateLocked, match=rf"held by pid {os.getpid()}"):
            _watch([str(log)], state)
        rc = main(["watch", "--source", f"file:{log}", "--json", "--for", "0.5", "--state-dir", str(state)])
        err = capsys.readouterr().err
        assert rc == 2 and "state dir is in use" in err and f"pid {os.getpid()}" in err
    finally:
        w.close()
    with StateLock(state) as lk:                     # released on close: the next one gets it
        assert lk.held
