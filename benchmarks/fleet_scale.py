"""Fleet-scale replay: simulated nodes x hours, one process vs Ray workers; start-up; memory.

    python benchmarks/fleet_scale.py --nodes 256 --duration 1h            # lines/s and peak RSS, one process
    python benchmarks/fleet_scale.py --nodes 1024 --duration 24h --workers 2   # + the same on Ray, identical?
    python benchmarks/fleet_scale.py --nodes 1024 --duration 1h --jobs 8 --workers 2 --work /tmp/fleet
                                                 # a cluster's day: 8 jobs of 128 nodes, one controller log
    python benchmarks/fleet_scale.py --startup                            # replay of the bundled demo, and demo

The simulated logs are kept under ``--work`` (generated once). Each replay runs in a child process
so that its peak RSS is its own; with ``--workers`` the peak is the sum of the driver's and the Ray
worker processes' RSS, sampled every 0.2 s. The result of the sharded replay is compared with the
single-process one (summary and incidents, as JSON). ``--jobs K`` simulates K jobs (different
scenarios, ``--nodes``/K nodes each, disjoint node names and addresses) and lays them out as one
cluster's directory with one controller log: the input the replay by allocation spreads over the
workers (one simulated job is one allocation, so it is replayed read-parallel). The sharded run
prints where its time went (Ray start, the workers' read and judge steps, the driver's merge).
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
mode, out, compact = sys.argv[1], sys.argv[2], int(sys.argv[3])
paths = sys.argv[4:]
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
from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.replay import ReplayOptions
opts = ReplayOptions(config=EngineConfig(**({"progress_compact_rows": compact} if compact else {})))
if mode == "one":
    from recovery_logs.pipeline.replay import replay
    r = replay(paths, opts)
else:
    from recovery_logs.pipeline.scale import replay_sharded
    r = replay_sharded(paths, opts, workers=int(mode))
el = time.perf_counter() - t
open(out, "w").write(r.to_json())
ru = resource.getrusage(resource.RUSAGE_SELF)
rss = ru.ru_maxrss * 1024
print(json.dumps({"elapsed_s": el, "cpu_s": ru.ru_utime + ru.ru_stime, "lines": r.summary["lines"], "events": r.summary["events"],
                  "incidents": r.summary["incidents"], "peak_rss_mb": max(rss, peak[0]) / 2**20,
                  "stages": {k[6:]: v for k, v in r.engine.stats.items() if k.startswith("shard_")}}))
"""


def run_child(mode: str, paths: list[str], out: Path, compact: int = 0) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2")}
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(out), str(compact), *paths], capture_output=True,
                       text=True,
                       check=False, env=env)
    if p.returncode != 0:
        raise SystemExit(f"replay ({mode}) failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def startup(repeat: int = 5, bytecode: bool = True) -> None:
    """Start-up of ``replay`` of the bundled demo and of ``demo``. ``bytecode=True``: with Python's
    byte-code cache of the package's own modules, as an installed package starts (pip compiles a
    wheel's modules); ``False``: this shell's environment as it is — with
    ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` in the checkout, every start also compiles
    the ~75 project modules it imports (~0.25 s)."""
    import recovery_logs
    from recovery_logs.api import bundled_incident

    exe = str(Path(sys.executable).with_name("recovery-logs"))
    d = str(bundled_incident("xid79_nccl_cascade"))
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    cached = (Path(recovery_logs.__file__).parent / "__pycache__").is_dir()
    print(f"start-up ({'with the byte-code cache' if bytecode else 'as this shell runs it'}; "
          f"PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r}, "
          f"package __pycache__ {'present' if cached or bytecode else 'absent'}):")
    for name, argv in (("replay of the bundled demo", [exe, "replay", d, "--year", "2026", "--width", "100"]),
                       ("demo", [exe, "demo", "--width", "100"])):
        times, cpus = [], []
        subprocess.run(argv, capture_output=True, check=True, env=env)    # warm: page cache (and byte-code cache)
        for _ in range(repeat):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True, env=env)
            times.append(time.perf_counter() - t)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        # CPU time (user + system) is what the command costs; on a loaded machine wall time also
        # counts the wait for a core
        print(f"start-up: {name}: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"({repeat} runs, wall); CPU best {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s; "
              f"load {os.getloadavg()[0]:.1f}")


SCENARIOS = ("xid79_cascade", "ib_link_down", "straggler_node", "xid48_row_remap", "nccl_net_error", "silent_hang",
             "xid13_app", "healthy")


def cluster_day(out: Path, jobs: int, nodes: int, duration: str) -> Path:
    """``jobs`` simulated jobs of ``nodes`` nodes as one cluster's logs (module docstring)."""
    import shutil

    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    day = out / f"day-{jobs}x{nodes}-{duration}"
    if (day / "nodes" / "slurmctl01" / "slurmctld.log").exists():
        return day
    raw = out / f"raw-{jobs}x{nodes}-{duration}"
    names = [SCENARIOS[k % len(SCENARIOS)] for k in range(jobs)]
    t = time.perf_counter()
    res = simulate(SimOptions(out=raw, scenario=",".join(dict.fromkeys(names)), nodes=nodes,
                              duration_s=parse_duration_s(duration)))
    ctl: list[bytes] = []
    for k, name in enumerate(names):
        letter = "abcdefghijklmnopqrstuvwxyz"[k]
        for f in sorted((raw / name).rglob("*")):
            if not f.is_file() or f.name == "truth.json":
                continue
            data = f.read_bytes().replace(b"gpu-n", f"gpu-{letter}".encode()).replace(b"10.128.", f"10.{128 + k}.".encode())
            if f.name == "slurmctld.log":
                ctl.extend(data.splitlines(keepends=True))
                continue
            dst = day / str(f.relative_to(raw / name)).replace("gpu-n", f"gpu-{letter}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
    (day / "nodes" / "slurmctl01").mkdir(parents=True, exist_ok=True)
    (day / "nodes" / "slurmctl01" / "slurmctld.log").write_bytes(b"".join(sorted(ctl, key=lambda x: x[:25])))
    shutil.rmtree(raw)
    print(f"simulated {sum(r.lines for r in res):,} lines ({jobs} jobs) in {time.perf_counter() - t:.0f} s -> {day}")
    return day


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--duration", default="1h")
    ap.add_argument("--scenario", default="xid79_cascade")
    ap.add_argument("--workers", type=int, default=0, help="also replay on N local Ray workers and compare")
    ap.add_argument("--jobs", type=int, default=0, help="a cluster's day of K jobs (--nodes/K nodes each)")
    ap.add_argument("--no-compaction", action="store_true",
                    help="both runs hold every progress row (the engine's progress compaction materialises "
                         "detector findings from what was read so far, so a one-process result depends on "
                         "the reading schedule once it compacts: see docs/SCALE.md)")
    ap.add_argument("--work", type=Path, default=Path("bench-out/fleet"))
    ap.add_argument("--startup", action="store_true", help="only the start-up measurements")
    a = ap.parse_args(argv)
    if a.jobs > len(SCENARIOS):
        ap.error(f"--jobs: at most {len(SCENARIOS)} (one scenario each: their job ids differ)")
    if a.startup:
        startup(bytecode=False)    # first: before this run writes a byte-code cache
        startup(bytecode=True)
        return 0
    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    if a.jobs:
        src = cluster_day(a.work, a.jobs, a.nodes // a.jobs, a.duration)
    else:
        d = a.work / f"n{a.nodes}-{a.duration}"
        src = d / a.scenario
        if not (src / "truth.json").exists():
            t = time.perf_counter()
            res = simulate(SimOptions(out=d, scenario=a.scenario, nodes=a.nodes, duration_s=parse_duration_s(a.duration)))
            print(f"simulated {res[0].lines:,} lines in {time.perf_counter() - t:.0f} s -> {src}")
    paths = [str(src)]
    nbytes = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    compact = 10**12 if a.no_compaction else 0
    one = run_child("one", paths, a.work / "one.json", compact)
    print(f"{a.nodes} nodes x {a.duration}: {one['lines']:,} lines, {nbytes / 1e6:.0f} MB")
    print(f"  one process : {one['elapsed_s']:7.1f} s  {one['lines'] / one['elapsed_s']:>10,.0f} lines/s  "
          f"peak RSS {one['peak_rss_mb']:6.0f} MB  incidents {one['incidents']}; CPU {one['cpu_s']:.1f} s "
          f"({one['lines'] / one['cpu_s']:,.0f} lines per CPU-second); load {os.getloadavg()[0]:.1f}")
    if a.workers:
        many = run_child(str(a.workers), paths, a.work / "many.json", compact)
        same = (a.work / "one.json").read_text() == (a.work / "many.json").read_text()
        print(f"  --workers {a.workers}: {many['elapsed_s']:7.1f} s  {many['lines'] / many['elapsed_s']:>10,.0f} lines/s  "
              f"peak RSS {many['peak_rss_mb']:6.0f} MB (driver + Ray)  incidents {many['incidents']}")
        print(f"  speed-up {one['elapsed_s'] / many['elapsed_s']:.2f}x; results identical: {same}")
        st = many["stages"]
        print("  where the sharded run's time went: " + ", ".join(
            f"{k.removesuffix('_ms').replace('_', ' ')} {v / 1000:.1f} s" for k, v in st.items() if k.endswith("_ms"))
            + f"; bins {st.get('bins', '-')}, merged groups {st.get('merges', 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
