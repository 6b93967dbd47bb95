"""kill -9 at random moments, many times: a restarted watch prints nothing twice and, in the
end, has printed every incident replay finds, with replay's counts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.read_common import ReadOptions

XID = ("Nov 29 {h:02d}:{m:02d}:{s:02d} gpu-n{n:02d} kernel: [86483.123457] NVRM: Xid (PCI:0000:ba:00): 79, "
       "pid={pid}, name=python3, GPU has fallen off the bus.\n")


def _lines(start: int, n: int) -> str:
    # 25 nodes, each an incident of its own; a node's lines grow its incident (count) over the runs
    return "".join(XID.format(h=10 + (i // 3600) % 10, m=(i // 60) % 60, s=i % 60, n=10 + i % 25, pid=i)
                   for i in range(start, start + n))


def _watch(log: Path, state: Path, for_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recovery_logs.cli", "watch", "--source", f"file:{log}", "--json",
                             "--state-dir", str(state), "--refresh", "100ms", "--for", str(for_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RECOVERY_LOGS_AUDIT_SYSLOG": "0"})


def _reader(p: subprocess.Popen, into: list[str]) -> threading.Thread:
    th = threading.Thread(target=lambda: into.extend(iter(p.stdout.readline, "")), daemon=True)
    th.start()
    return th


def test_kill9_at_random_moments_prints_nothing_twice(tmp_path: Path):
    rng = random.Random(12)
    log, state = tmp_path / "kern.log", tmp_path / "state"
    printed: list[dict] = []
    written = 0
    kills = 0
    for _run in range(3):
        with open(log, "a") as fh:
            fh.write(_lines(written, 500))
        written += 500
        p = _watch(log, state, 60)
        got: list[str] = []
        th = _reader(p, got)
        t0 = time.monotonic()
        while not got and time.monotonic() - t0 < 30 and p.poll() is None:
            time.sleep(0.02)                           # running: it printed (or re-read) something
        for _ in range(2):                             # lines keep arriving while it runs
            with open(log, "a") as fh:
                fh.write(_lines(written, 300))
            written += 300
            time.sleep(rng.uniform(0.0, 0.6))
        p.send_signal(signal.SIGKILL)                  # at a random moment of its steps
        p.wait(timeout=30)
        th.join(10)
        kills += p.returncode == -signal.SIGKILL
        printed += [json.loads(x) for x in got if x.strip()]
    p = _watch(log, state, 3)                          # a last run to its end
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    printed += [json.loads(x) for x in out.splitlines() if x.strip()]
    assert kills == 3
    seen = [(i["id"], i["count"], i["last_seen"], i["status"]) for i in printed]
    assert len(seen) == len(set(seen)), "an incident version was printed twice"
    want = replay([log], ReplayOptions(read=ReadOptions(year=time.gmtime(log.stat().st_mtime).tm_year))).incidents
    last = {}
    for i in printed:
        last[i["id"]] = i["count"]
    assert last == {i.id: i.count for i in want}
    assert len(want) == 25
