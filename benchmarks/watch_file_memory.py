"""Soak: `recovery-logs watch` on a file flooded with XID lines stays bounded in memory.

    python benchmarks/watch_file_memory.py [--rate 10000] [--duration 180] [--nodes 8]

A child process appends kernel XID 79 lines (syslog format, current time, ``--nodes`` nodes)
to one file at ``--rate`` lines/s for ``--duration`` s, while ``recovery-logs watch --source
file:...`` follows it. The watcher's RSS (``/proc/PID/status`` VmRSS) is sampled every 5 s. The
same run is made twice in one invocation: with flood compaction (the default, ``--max-findings
200000``) and without it (``--max-findings`` effectively infinite, what watch did before issue
12), and the ratio of the final RSS values is printed. Every line is a finding, so the
uncompacted engine holds one row per line. Ratios are measured within one invocation, so a
loaded machine slows both runs alike.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = ("{ts} gpu-n{n:02d} kernel: [86483.123457] NVRM: Xid (PCI:0000:ba:00): 79, pid={pid}, name=python3, "
        "GPU has fallen off the bus.\n")


def _writer(path: str, rate: int, duration: float, nodes: int) -> None:
    t0 = time.monotonic()
    i = 0
    with open(path, "a", buffering=1 << 20) as fh:
        while (el := time.monotonic() - t0) < duration:
            want = int(el * rate)
            ts = time.strftime("%b %d %H:%M:%S", time.gmtime())
            fh.write("".join(LINE.format(ts=ts, n=(i + k) % nodes, pid=i + k) for k in range(want - i)))
            fh.flush()
            i = want
            time.sleep(0.05)


def _rss_mb(pid: int) -> float:
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(rate: int, duration: float, nodes: int, max_findings: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "kern.log"
        log.touch()
        w = mp.Process(target=_writer, args=(str(log), rate, duration, nodes))
        p = subprocess.Popen([sys.executable, "-m", "recovery_logs.cli", "watch", "--source", f"file:{log}", "--json",
                              "--for", str(duration + 10), "--refresh", "1s", "--max-findings", str(max_findings)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                             env={**os.environ, "RECOVERY_LOGS_AUDIT_SYSLOG": "0"})
        time.sleep(3)
        w.start()
        samples = []
        t0 = time.monotonic()
        while p.poll() is None:
            samples.append((round(time.monotonic() - t0), _rss_mb(p.pid)))
            time.sleep(5)
        w.join()
        err = p.stderr.read().decode() if p.stderr else ""
        lines = sum(1 for _ in open(log, "rb"))
    return {"max_findings": max_findings, "lines": lines, "rc": p.returncode, "samples": samples,
            "rss_first_mb": next((r for _, r in samples if r > 0), 0.0), "rss_peak_mb": max(r for _, r in samples),
            "stderr": err[-300:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--nodes", type=int, default=8)
    a = ap.parse_args()
    on = run(a.rate, a.duration, a.nodes, 200_000)
    off = run(a.rate, a.duration, a.nodes, 10**12)
    for r in (on, off):
        print(f"max_findings={r['max_findings']:>14}: {r['lines']} lines in {a.duration:g} s, RSS first "
              f"{r['rss_first_mb']:.0f} MB -> peak {r['rss_peak_mb']:.0f} MB (rc {r['rc']})")
        print("   samples (s, MB):", " ".join(f"{t}:{m:.0f}" for t, m in r["samples"]))
    print(f"peak RSS without / with compaction: {off['rss_peak_mb'] / max(on['rss_peak_mb'], 1):.2f}x; growth "
          f"with compaction {on['rss_peak_mb'] - on['rss_first_mb']:.0f} MB, without "
          f"{off['rss_peak_mb'] - off['rss_first_mb']:.0f} MB")


if __name__ == "__main__":
    main()
