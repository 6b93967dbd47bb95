"""Fleet-scale replay: simulated nodes x hours, one process vs Ray workers; start-up; memory.

    python benchmarks/fleet_scale.py --nodes 256 --duration 1h            # lines/s and peak RSS, one process
    python benchmarks/fleet_scale.py --nodes 1024 --duration 24h --workers 2   # + the same on Ray, identical?
    python benchmarks/fleet_scale.py --nodes 1024 --duration 1h --jobs 8 --workers 2 --work /tmp/fleet
                                                 # a cluster's day: 8 jobs of 128 nodes, one controller log
    python benchmarks/fleet_scale.py --startup                            # replay of the bundled demo, and demo
    python benchmarks/fleet_scale.py --startup --startup-against /tmp/old # the same alternated with another checkout

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
import hashlib, json, os, resource, sys, threading, time
mode, out, compact, limit_mb, bin_mb = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
paths = sys.argv[6:]
peak = {"total": 0, "driver": 0, "workers": 0, "worker_max": 0, "sampler_cpu_s": 0.0}
cpu_seen = {}           # Ray process pid -> last sampled user + system CPU seconds (they end with the replay)
def kind_of(cmd):
    return ("hosts" if "BinHost" in cmd or "BinWorker" in cmd else "raylet" if "raylet" in cmd
            else "gcs" if "gcs_server" in cmd else "other ray")
def sample():
    # the local Ray's processes are this one's descendants (gcs, raylet, dashboard, agents, log
    # monitor; the workers under the raylet): looked for every 2 s (a scan of the process table is
    # ~1.5-2.5 ms of this process's CPU, taken from the replay it measures), read every 0.2 s
    import psutil
    me = psutil.Process()
    procs = {}
    n = 0
    while True:
        drv = me.memory_info().rss
        wk, wmax = 0, 0
        if mode not in ("one", "alloc"):
            if n % 10 == 0:
                for p in me.children(recursive=True):
                    try:
                        cmd = " ".join(p.cmdline())
                        procs[p.pid] = (procs[p.pid][0] if p.pid in procs else p, kind_of(cmd), "ray::" in cmd)
                    except Exception:
                        pass
            for pid, (p, kind, worker) in list(procs.items()):
                try:
                    r = p.memory_info().rss
                    ct = p.cpu_times()
                except Exception:
                    del procs[pid]
                    continue
                wk += r
                if worker:
                    wmax = max(wmax, r)
                cpu_seen[pid] = (kind, ct.user + ct.system)
        n += 1
        peak["driver"] = max(peak["driver"], drv)
        peak["workers"] = max(peak["workers"], wk)
        peak["worker_max"] = max(peak["worker_max"], wmax)
        peak["total"] = max(peak["total"], drv + wk)
        peak["sampler_cpu_s"] = time.thread_time()
        if limit_mb and (drv + wk) / 2**20 > limit_mb:     # never take the shared machine down
            print(json.dumps({"error": f"RSS {(drv + wk) / 2**20:.0f} MB above the limit {limit_mb:.0f} MB",
                              "after_s": time.perf_counter() - t}), flush=True)
            os._exit(3)
        time.sleep(0.2)
t = time.perf_counter()
threading.Thread(target=sample, daemon=True).start()
from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.replay import ReplayOptions
opts = ReplayOptions(config=EngineConfig(**({"progress_compact_rows": compact} if compact else {})))
if mode == "one":
    from recovery_logs.pipeline.replay import replay
    r = replay(paths, opts)
elif mode == "alloc":
    from recovery_logs.pipeline.scale import replay_by_allocation
    from recovery_logs.pipeline.scale import BIN_BYTES
    r = replay_by_allocation(paths, opts, bin_bytes=int(bin_mb * 2**20) if bin_mb else BIN_BYTES)
else:
    from recovery_logs.pipeline.scale import BIN_BYTES, replay_sharded
    r = replay_sharded(paths, opts, workers=int(mode), bin_bytes=int(bin_mb * 2**20) if bin_mb else BIN_BYTES)
el = time.perf_counter() - t
text = r.to_json()
open(out, "w").write(text)
ru = resource.getrusage(resource.RUSAGE_SELF)
rc = resource.getrusage(resource.RUSAGE_CHILDREN)
rss = ru.ru_maxrss * 1024
print(json.dumps({"elapsed_s": el, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "worker_cpu_s": sum(c for _, c in cpu_seen.values()) + rc.ru_utime + rc.ru_stime,
                  "ray_cpu_s": {k: round(sum(c for kk, c in cpu_seen.values() if kk == k), 1)
                                for k in sorted({kk for kk, _ in cpu_seen.values()})},
                  "lines": r.summary["lines"], "events": r.summary["events"],
                  "incidents": r.summary["incidents"], "peak_rss_mb": max(rss, peak["total"]) / 2**20,
                  "driver_rss_mb": max(rss, peak["driver"]) / 2**20, "workers_rss_mb": peak["workers"] / 2**20,
                  "worker_max_rss_mb": peak["worker_max"] / 2**20, "sampler_cpu_s": peak["sampler_cpu_s"],
                  "digest": hashlib.sha256(text.encode()).hexdigest(),
                  "stages": {k[6:]: v for k, v in r.engine.stats.items() if k.startswith("shard_")}}))
"""


def child_argv(mode: str, paths: list[str], out: Path, compact: int = 0, limit_mb: float = 0,
               bin_mb: float = 0) -> list[str]:
    """The command line of one ``CHILD`` run: the one place that knows its positional arguments
    (``compare_trees.py`` builds its runs with it too)."""
    return [sys.executable, "-c", CHILD, mode, str(out), str(compact), str(limit_mb), str(bin_mb), *paths]


def _busy(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def bin_report(st: dict) -> list[str]:
    """Per bin and per host (``pipeline.scale._bin_trace``): lines, the read and judge steps' wall and
    CPU, and how long the hosts ran together (what a second core can give is bounded by that)."""
    bins = sorted({int(k[3:].split("_", 1)[0]) for k in st if k.startswith("bin") and k.endswith("_host")})
    if not bins:
        return []
    g = lambda b, f: st.get(f"bin{b}_{f}", 0)  # noqa: E731
    lines_all = sum(g(b, "lines") for b in bins) or 1
    out = []
    hosts: dict[int, dict] = {}
    for b in bins:
        h = hosts.setdefault(g(b, "host"), {"lines": 0, "spans": [], "read": 0.0, "judge": 0.0, "cpu": 0.0, "bins": 0})
        h["lines"] += g(b, "lines")
        h["bins"] += 1
        for step in ("read", "judge"):
            a, e = g(b, f"{step}_start_ms") / 1000, g(b, f"{step}_end_ms") / 1000
            h["spans"].append((a, e))
            h[step] += e - a
            h["cpu"] += g(b, f"{step}_cpu_ms") / 1000
        out.append(f"bin {b} on host {g(b, 'host')}: {g(b, 'lines'):>10,} lines ({g(b, 'bytes') / 1e6:6.1f} MB), read "
                   f"{g(b, 'read_start_ms') / 1000:6.1f}-{g(b, 'read_end_ms') / 1000:6.1f} s (CPU "
                   f"{g(b, 'read_cpu_ms') / 1000:5.1f} s), judge {g(b, 'judge_start_ms') / 1000:6.1f}-"
                   f"{g(b, 'judge_end_ms') / 1000:6.1f} s (CPU {g(b, 'judge_cpu_ms') / 1000:5.1f} s)")
    for k, h in sorted(hosts.items()):
        busy = _busy(h["spans"])
        out.append(f"host {k}: {h['bins']} bins, {h['lines']:,} lines ({h['lines'] / lines_all:.1%}), read {h['read']:.1f} s, "
                   f"judge {h['judge']:.1f} s wall, CPU {h['cpu']:.1f} s; busy {busy[0][0]:.1f}-{busy[-1][1]:.1f} s")
    if len(hosts) > 1:
        sets = [_busy(h["spans"]) for h in hosts.values()]
        both = sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in sets[0] for a2, b2 in sets[1]) if len(sets) == 2 else 0.0
        out.append(f"hosts 0 and 1 both busy {both:.1f} s")
    return out


def run_child(mode: str, paths: list[str], out: Path, compact: int = 0, limit_mb: float = 0,
              bin_mb: float = 0) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2")}
    p = subprocess.run(child_argv(mode, paths, out, compact, limit_mb, bin_mb),
                       capture_output=True, text=True, check=False, env=env)
    last = (p.stdout.strip().splitlines() or [""])[-1]
    if p.returncode == 3 and last.startswith("{"):
        return json.loads(last)
    if p.returncode != 0:
        raise SystemExit(f"replay ({mode}) failed: {p.stderr[-3000:]}")
    return json.loads(last)


LAUNCH = "import sys; from recovery_logs.cli import main; sys.exit(main())"
SPLIT_OF = ("polars", "numpy", "typer", "pydantic", "rich")    # the third-party imports the split names


def _startup_cmd(tree: Path | None, args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``recovery-logs ARGS`` as installed (``tree`` None: this environment's console script), or
    with the checkout ``tree``'s ``recovery_logs`` first on the path (started from /, so that no
    other checkout is on it)."""
    if tree is None:
        return [str(Path(sys.executable).with_name("recovery-logs")), *args], env
    return [sys.executable, "-c", LAUNCH, *args], {**env, "PYTHONPATH": str(tree)}


def _import_split(cmd: list[str], env: dict[str, str]) -> str:
    """One run under ``-X importtime``: the time spent importing each of the big third-party
    packages (inclusive: pydantic imported by typer counts in both) and all imports together."""
    # (the console script is a Python file: run by this interpreter, which takes the -X option)
    argv = [sys.executable, "-X", "importtime", *(cmd[1:] if cmd[0] == sys.executable else cmd)]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", check=True)
    rows = []
    for line in p.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2]
        rows.append(((len(name) - len(name.lstrip())) // 2, name.strip(), int(parts[1]) / 1e6))
    total = {k: 0.0 for k in SPLIT_OF}
    everything = 0.0
    above: list[str] = []              # the importing rows above this one (importtime prints a parent after its children)
    for depth, name, cum in reversed(rows):
        del above[depth:]
        top = name.split(".")[0]
        if depth == 0:
            everything += cum
        if top in total and not any(a.split(".")[0] == top for a in above):
            total[top] += cum
        above.append(name)
    return ", ".join(f"{k} {v:.2f}" for k, v in total.items() if v) + f"; all imports {everything:.2f} s"


def startup(repeat: int = 10, bytecode: bool = True, against: Path | None = None) -> None:
    """Start-up of ``replay`` of the bundled demo and of ``demo``. ``bytecode=True``: with Python's
    byte-code cache of the package's own modules, as an installed package starts (pip compiles a
    wheel's modules); ``False``: this shell's environment as it is — with
    ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` in the checkout, every start also compiles
    the ~75 project modules it imports (~0.25 s).

    ``against``: another checkout (``git worktree add /tmp/old main``); the runs alternate this
    checkout and that one, both started the same way (``_startup_cmd``), the ratio of the medians
    is printed, and the demo's ``replay --json`` of the two is compared byte for byte."""
    import recovery_logs
    from recovery_logs.api import bundled_incident

    here = Path(recovery_logs.__file__).resolve().parents[1]
    trees: dict[str, Path | None] = {"installed": None} if against is None else {"this": here, "other": against}
    d = str(bundled_incident("xid79_nccl_cascade"))
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    cached = (here / "recovery_logs" / "__pycache__").is_dir()
    print(f"start-up ({'with the byte-code cache' if bytecode else 'as this shell runs it'}; "
          f"PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r}, "
          f"package __pycache__ {'present' if cached or bytecode else 'absent'})"
          + ("" if against is None else f"; alternating this checkout ({here}) and the other ({against})") + ":")
    loads: list[float] = []
    for name, args in (("replay of the bundled demo", ["replay", d, "--year", "2026", "--width", "100"]),
                       ("demo", ["demo", "--width", "100"])):
        times: dict[str, list[float]] = {k: [] for k in trees}
        cpus: dict[str, list[float]] = {k: [] for k in trees}
        cmds = {k: _startup_cmd(t, args, env) for k, t in trees.items()}
        for cmd, e in cmds.values():
            subprocess.run(cmd, capture_output=True, check=True, env=e, cwd="/")   # warm: page and byte-code cache
        for i in range(repeat):
            for k in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                cmd, e = cmds[k]
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                subprocess.run(cmd, capture_output=True, check=True, env=e, cwd="/")
                times[k].append(time.perf_counter() - t)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus[k].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            loads.append(os.getloadavg()[0])
        # CPU time (user + system) is what the command costs; on a loaded machine wall time also
        # counts the wait for a core
        for k in trees:
            label = name if against is None else f"{name} [{k}]"
            print(f"start-up: {label}: best {min(times[k]):.2f} s, median {statistics.median(times[k]):.2f} s "
                  f"({repeat} runs, wall); CPU best {min(cpus[k]):.2f} s, median {statistics.median(cpus[k]):.2f} s; "
                  f"load {os.getloadavg()[0]:.1f}")
        if against is not None:
            print(f"start-up: {name}: this/other median wall "
                  f"{statistics.median(times['this']) / statistics.median(times['other']):.2f}x, CPU "
                  f"{statistics.median(cpus['this']) / statistics.median(cpus['other']):.2f}x")
        if bytecode:
            for k, (cmd, e) in cmds.items():
                print(f"start-up: {name}{'' if against is None else f' [{k}]'}: import split (s, one run): "
                      f"{_import_split(cmd, e)}")
    print(f"start-up: load (1 min) over the runs: min {min(loads):.1f}, median {statistics.median(loads):.1f}, "
          f"max {max(loads):.1f}")
    if against is not None:
        outs = [subprocess.run(_startup_cmd(t, ["replay", d, "--year", "2026", "--json"], env)[0], capture_output=True,
                               check=True, env=_startup_cmd(t, [], env)[1], cwd="/").stdout for t in trees.values()]
        print(f"start-up: replay --json of the demo: {'identical' if outs[0] == outs[1] else 'DIFFERENT'} "
              f"in the two checkouts ({len(outs[0]):,} bytes)")


SCENARIOS = ("xid79_cascade", "ib_link_down", "straggler_node", "xid48_row_remap", "nccl_net_error", "silent_hang",
             "xid13_app", "healthy")


def cluster_day(out: Path, jobs: int, nodes: int, duration: str, profile: str = "dense") -> Path:
    """``jobs`` simulated jobs of ``nodes`` nodes as one cluster's logs (module docstring)."""
    import shutil

    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    tag = "" if profile == "dense" else f"-{profile}"
    day = out / f"day-{jobs}x{nodes}-{duration}{tag}"
    if (day / "nodes" / "slurmctl01" / "slurmctld.log").exists():
        return day
    raw = out / f"raw-{jobs}x{nodes}-{duration}{tag}"
    names = [SCENARIOS[k % len(SCENARIOS)] for k in range(jobs)]
    t = time.perf_counter()
    res = simulate(SimOptions(out=raw, scenario=",".join(dict.fromkeys(names)), nodes=nodes,
                              duration_s=parse_duration_s(duration), log_profile=profile))
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
    ap.add_argument("--log-profile", default="dense", choices=("dense", "fleet"),
                    help="the simulator's logging profile (simulate --log-profile): fleet is ~700 lines per "
                         "node-hour, the ~17 M lines of a 1,024-node day")
    ap.add_argument("--single", nargs="*", default=["one"], choices=("one", "alloc"),
                    help="the one-process runs: one (replay) and/or alloc (replay --by-allocation: one "
                         "allocation after another, bounded memory); default: one")
    ap.add_argument("--bin-mb", type=float, default=0.0,
                    help="by allocation: at most this much input per bin (default: pipeline.scale.BIN_BYTES, "
                         "128 MiB); at 1/8 scale, 1/8 of it gives the full day's bins")
    ap.add_argument("--rss-limit-gb", type=float, default=0.0,
                    help="stop a run whose RSS (driver + Ray) passes this (0: no limit)")
    ap.add_argument("--work", type=Path, default=Path("bench-out/fleet"))
    ap.add_argument("--startup", action="store_true", help="only the start-up measurements")
    ap.add_argument("--startup-runs", type=int, default=10, help="--startup: runs of each command (median)")
    ap.add_argument("--startup-against", type=Path, default=None,
                    help="--startup: alternate with this other checkout (git worktree add /tmp/old main)")
    a = ap.parse_args(argv)
    if a.jobs > len(SCENARIOS):
        ap.error(f"--jobs: at most {len(SCENARIOS)} (one scenario each: their job ids differ)")
    if a.startup:
        against = a.startup_against.resolve() if a.startup_against else None
        startup(a.startup_runs, bytecode=False, against=against)    # first: before this run writes a byte-code cache
        startup(a.startup_runs, bytecode=True, against=against)
        return 0
    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    if a.jobs:
        src = cluster_day(a.work, a.jobs, a.nodes // a.jobs, a.duration, a.log_profile)
    else:
        d = a.work / (f"n{a.nodes}-{a.duration}" + ("" if a.log_profile == "dense" else f"-{a.log_profile}"))
        src = d / a.scenario
        if not (src / "truth.json").exists():
            t = time.perf_counter()
            res = simulate(SimOptions(out=d, scenario=a.scenario, nodes=a.nodes, duration_s=parse_duration_s(a.duration),
                                      log_profile=a.log_profile))
            print(f"simulated {res[0].lines:,} lines in {time.perf_counter() - t:.0f} s -> {src}")
    paths = [str(src)]
    nbytes = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    compact = 10**12 if a.no_compaction else 0
    limit = a.rss_limit_gb * 1024
    print(f"{a.nodes} nodes x {a.duration} ({a.log_profile} profile): {nbytes / 1e6:.0f} MB; load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) at the start", flush=True)
    runs: dict[str, dict] = {}
    for mode in [*a.single, *([str(a.workers)] if a.workers else [])]:
        r = run_child(mode, paths, a.work / f"{mode}.json", compact, limit, a.bin_mb)
        label = {"one": "one process", "alloc": "one process, by allocation"}.get(mode, f"--workers {mode}")
        if "error" in r:
            print(f"  {label:<27}: stopped after {r['after_s']:.0f} s: {r['error']}", flush=True)
            continue
        runs[mode] = r
        cpu = r["cpu_s"] + r["worker_cpu_s"]
        mem = (f"peak RSS {r['peak_rss_mb']:6.0f} MB" if mode in ("one", "alloc") else
               f"peak RSS {r['peak_rss_mb']:6.0f} MB (driver {r['driver_rss_mb']:.0f} MB, Ray processes "
               f"{r['workers_rss_mb']:.0f} MB, largest worker {r['worker_max_rss_mb']:.0f} MB)")
        print(f"  {label:<27}: {r['elapsed_s']:7.1f} s wall  {r['lines'] / r['elapsed_s']:>9,.0f} lines/s  CPU "
              f"{cpu:.1f} s ({r['lines'] / cpu:,.0f} lines per CPU-second)  {mem}  incidents {r['incidents']}  "
              f"sha256 {r['digest'][:16]}; load {os.getloadavg()[0]:.1f}", flush=True)
        if r.get("ray_cpu_s"):
            print("    CPU by process: driver " + f"{r['cpu_s']:.1f} s (of it the benchmark's memory sampler "
                  f"{r.get('sampler_cpu_s', 0):.1f} s), " + ", ".join(
                f"{k} {v:.1f} s" for k, v in r["ray_cpu_s"].items()), flush=True)
        st = r["stages"]
        if st:
            print("    where its time went: " + ", ".join(
                f"{k.removesuffix('_ms').replace('_', ' ')} {v / 1000:.1f} s" for k, v in st.items()
                if k.endswith("_ms") and not k.startswith("bin"))
                + f"; bins {st.get('bins', '-')}, merged groups {st.get('merges', 0)}", flush=True)
            for line in bin_report(st):
                print("    " + line, flush=True)
    if len(runs) > 1:
        first = next(iter(runs))
        base = runs[first]
        print(f"  lines {base['lines']:,}; results identical (JSON sha256): "
              f"{len({r['digest'] for r in runs.values()}) == 1}", flush=True)
        for mode, r in list(runs.items())[1:]:
            print(f"  {mode} vs {first}: {base['elapsed_s'] / r['elapsed_s']:.2f}x wall", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
