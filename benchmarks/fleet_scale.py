"""Fleet-scale replay: simulated nodes x hours, one process vs Ray workers; start-up; memory.

    python benchmarks/fleet_scale.py --nodes 256 --duration 1h            # lines/s and peak RSS, one process
    python benchmarks/fleet_scale.py --nodes 1024 --duration 24h --workers 2   # + the same on Ray, identical?
    python benchmarks/fleet_scale.py --startup                            # replay of the bundled demo, and demo

The simulated logs are kept under ``--work`` (generated once). Each replay runs in a child process
so that its peak RSS is its own; with ``--workers`` the peak is the sum of the driver's and the Ray
worker processes' RSS, sampled every 0.2 s. The result of the sharded replay is compared with the
single-process one (summary and incidents, as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, threading, time
mode, out = sys.argv[1], sys.argv[2]
paths = sys.argv[3:]
peak = [0]
def sample():
    import psutil
    me = psutil.Process()
    while True:
        tot = me.memory_info().rss
        for p in psutil.process_iter(["name", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if p.pid != me.pid and ("ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd):
                    tot += p.memory_info().rss
            except Exception:
                pass
        peak[0] = max(peak[0], tot)
        time.sleep(0.2)
if mode != "one":
    threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
if mode == "one":
    from recovery_logs.pipeline.replay import replay
    r = replay(paths)
else:
    from recovery_logs.pipeline.scale import replay_sharded
    r = replay_sharded(paths, workers=int(mode))
el = time.perf_counter() - t
open(out, "w").write(r.to_json())
ru = resource.getrusage(resource.RUSAGE_SELF)
rss = ru.ru_maxrss * 1024
print(json.dumps({"elapsed_s": el, "cpu_s": ru.ru_utime + ru.ru_stime, "lines": r.summary["lines"], "events": r.summary["events"],
                  "incidents": r.summary["incidents"], "peak_rss_mb": max(rss, peak[0]) / 2**20}))
"""


def run_child(mode: str, paths: list[str], out: Path) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2")}
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(out), *paths], capture_output=True, text=True,
                       check=False, env=env)
    if p.returncode != 0:
        raise SystemExit(f"replay ({mode}) failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def startup(repeat: int = 5) -> None:
    from recovery_logs.api import bundled_incident

    exe = str(Path(sys.executable).with_name("recovery-logs"))
    d = str(bundled_incident("xid79_nccl_cascade"))
    for name, argv in (("replay of the bundled demo", [exe, "replay", d, "--year", "2026", "--width", "100"]),
                       ("demo", [exe, "demo", "--width", "100"])):
        times, cpus = [], []
        for _ in range(repeat):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            times.append(time.perf_counter() - t)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        # CPU time (user + system) is what the command costs; on a loaded machine wall time also
        # counts the wait for a core
        print(f"start-up: {name}: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"({repeat} runs, wall); CPU best {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s; "
              f"load {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--duration", default="1h")
    ap.add_argument("--scenario", default="xid79_cascade")
    ap.add_argument("--workers", type=int, default=0, help="also replay on N local Ray workers and compare")
    ap.add_argument("--work", type=Path, default=Path("bench-out/fleet"))
    ap.add_argument("--startup", action="store_true", help="only the start-up measurements")
    a = ap.parse_args(argv)
    if a.startup:
        startup()
        return 0
    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    d = a.work / f"n{a.nodes}-{a.duration}"
    if not (d / a.scenario / "truth.json").exists():
        t = time.perf_counter()
        res = simulate(SimOptions(out=d, scenario=a.scenario, nodes=a.nodes, duration_s=parse_duration_s(a.duration)))
        print(f"simulated {res[0].lines:,} lines in {time.perf_counter() - t:.0f} s -> {d / a.scenario}")
    paths = [str(d / a.scenario)]
    nbytes = sum(f.stat().st_size for f in (d / a.scenario).rglob("*") if f.is_file())
    one = run_child("one", paths, a.work / "one.json")
    print(f"{a.nodes} nodes x {a.duration}: {one['lines']:,} lines, {nbytes / 1e6:.0f} MB")
    print(f"  one process : {one['elapsed_s']:7.1f} s  {one['lines'] / one['elapsed_s']:>10,.0f} lines/s  "
          f"peak RSS {one['peak_rss_mb']:6.0f} MB  incidents {one['incidents']}; CPU {one['cpu_s']:.1f} s "
          f"({one['lines'] / one['cpu_s']:,.0f} lines per CPU-second); load {os.getloadavg()[0]:.1f}")
    if a.workers:
        many = run_child(str(a.workers), paths, a.work / "many.json")
        same = (a.work / "one.json").read_text() == (a.work / "many.json").read_text()
        print(f"  --workers {a.workers}: {many['elapsed_s']:7.1f} s  {many['lines'] / many['elapsed_s']:>10,.0f} lines/s  "
              f"peak RSS {many['peak_rss_mb']:6.0f} MB (driver + Ray)  incidents {many['incidents']}")
        print(f"  speed-up {one['elapsed_s'] / many['elapsed_s']:.2f}x; results identical: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
