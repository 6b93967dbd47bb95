"""Replay throughput against ripgrep and a plain Python `re` loop with the same rules, in one run.

    python benchmarks/replay_speed.py [--lines 1500000] [--out bench-out/replay]
    python benchmarks/replay_speed.py --threads-ab 3     # one thread vs reader + parse threads, alternated

Generates ~1.5 M mixed log lines (kernel syslog per node + job output with NCCL chatter, Megatron
progress lines and ~3 % fault lines), then measures, on the same files:

* ``rg``       ripgrep counting lines that match any rule pattern (``rg -c -f patterns``)
* ``python-re`` a per-line loop over the same compiled patterns (``re``)
* ``replay``   ``recovery-logs replay`` end to end (read, parse, match, windows, detect, attribute)

* ``replay --accounting``  the same replay joined against Slurm accounting for 1,024 nodes x 24 h
  (a ``sacct -P`` dump of back-to-back jobs of 1-8 nodes, some requeued; ~10 k allocation rows)

and prints lines/s and the ratios replay/rg and replay/python-re, and accounting/plain replay. Peak memory of replay is
measured in a child process at 1/3, 2/3 and all of the input — more nodes, same file sizes — to
show whether it stays flat as the input grows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

LINES_PER_NODE = 93_750
RG_CPU: list[float] = []   # CPU seconds (user + system) of each ripgrep run   # 1.5 M lines = 16 nodes; smaller inputs have fewer nodes with the same file sizes


def generate(out: Path, total_lines: int, seed: int = 7) -> list[Path]:
    """Write per-node kern.log and job output files; return the file list."""
    rnd = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    t0 = datetime(2026, 11, 29, 0, 0, 0, tzinfo=UTC)
    nodes = [f"gpu-n{n:03d}" for n in range(1, max(1, round(total_lines / LINES_PER_NODE)) + 1)]
    per_node = total_lines // len(nodes)
    files = []
    for ni, host in enumerate(nodes):
        kdir = out / "nodes" / host
        kdir.mkdir(parents=True, exist_ok=True)
        jdir = out / "job-900100"
        jdir.mkdir(parents=True, exist_ok=True)
        kern, job = [], []
        n_kern = per_node // 4
        for i in range(n_kern):
            t = t0 + timedelta(milliseconds=i * 337 + ni)
            up = 86000 + i * 0.337
            r = rnd.random()
            if r < 0.01:
                msg = f"NVRM: Xid (PCI:0000:{rnd.choice(['18', '2a', '3a', 'ab'])}:00): {rnd.choice([13, 31, 43, 45, 48, 63, 79, 94, 119])}, pid={rnd.randint(1000, 99999)}, name=python3, Ch 00000010"
            elif r < 0.02:
                msg = "mlx5_core 0000:0c:00.0 ibp12s0: Link down"
            elif r < 0.03:
                msg = "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0"
            elif r < 0.5:
                msg = f"audit: type=1400 audit({1795920000 + i}.123:{i}): apparmor=\"DENIED\" operation=\"open\" profile=\"snap.lxd\" name=\"/proc/{i}/status\""
            else:
                msg = f"systemd-journald[{400 + ni}]: Data hash table of /run/log/journal/{i:08x}/system.journal has a fill level at 75.0 ({i} of {i + 1000} items, 25165824 file size, 524 bytes per hash table item), suggesting rotation."
            kern.append(f"{t.strftime('%b %d %H:%M:%S')} {host} kernel: [{up:12.6f}] {msg}")
        for i in range(per_node - n_kern):
            t = t0 + timedelta(milliseconds=i * 113 + ni)
            r = rnd.random()
            g = i % 8
            if r < 0.02:
                line = (f"[rank{ni * 8 + g}]:[E{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d}000 ProcessGroupNCCL.cpp:616] "
                        f"[Rank {ni * 8 + g}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={i}, "
                        "OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000) ran for 600047 "
                        "milliseconds before timing out.")
            elif r < 0.03:
                line = (f"[{t.strftime('%Y-%m-%d %H:%M:%S')}] iteration {i:8d}/  500000 | consumed samples: {i * 512:12d} | "
                        f"elapsed time per iteration (ms): {800 + rnd.random() * 30:.1f} | learning rate: 1.500000E-04 | "
                        "global batch size:   512 | lm loss: 5.123456E+00 | loss scale: 1.0 | grad norm: 1.234 |")
            else:
                line = (f"{host}:{52731 + g}:{52731 + g} [{g}] NCCL INFO Channel {i % 32:02d}/0 : {ni * 8 + g}[{g}] -> "
                        f"{(ni * 8 + g + 1) % 128}[{(g + 1) % 8}] via P2P/CUMEM/read")
            job.append(line)
        kp, jp = kdir / "kern.log", jdir / f"{host}.out"
        kp.write_text("\n".join(kern) + "\n")
        jp.write_text("\n".join(job) + "\n")
        files += [kp, jp]
    return files


def rule_patterns() -> list[str]:
    from recovery_logs.detectors.rulepack import load_packs

    pack = load_packs()
    # the same rules as replay (benign/suppress rules drop lines, they do not find anything);
    # named groups become plain groups so all patterns combine into one set for rg and re
    # (patterns that span lines — tracebacks joined by the readers — cannot run line by line: left out)
    return [re.sub(r"\(\?P<\w+>", "(?:", p) for r in pack.rules if not getattr(r, "suppress", False)
            for p in r.patterns if "\\n" not in p and "\n" not in p]


def generate_accounting(path: Path, nodes: int = 1024, hours: float = 24.0, seed: int = 11) -> int:
    """A ``sacct -P -D -X`` dump: each block of 8 nodes runs back-to-back jobs of 1-8 nodes for
    ``hours`` from the logs' start; ~5 % of the jobs are requeued once. Returns the job runs written."""
    rnd = random.Random(seed)
    t0 = datetime(2026, 11, 29, 0, 0, 0, tzinfo=UTC).timestamp() - 3600
    end = t0 + hours * 3600 + 3600

    def ts(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))

    names = [f"gpu-n{n:03d}" for n in range(1, nodes + 1)]
    rows, job = ["JobIDRaw|JobID|Cluster|User|Partition|JobName|State|ExitCode|NodeList|Submit|Start|End|AllocTRES"], 100000
    for b in range(0, nodes, 8):
        block, t = names[b:b + 8], t0
        while t < end:
            k = rnd.choice([1, 2, 4, 8])
            dur = rnd.uniform(1800, 4 * 3600)
            job += 1
            nl = ",".join(rnd.sample(block, k))
            tres = f"cpu={k * 8},gres/gpu={k * 8},node={k}"
            if rnd.random() < 0.05:
                mid = t + dur / 3
                rows.append(f"{job}|{job}|bench|u{job % 50}|gpu|train|REQUEUED|0:0|{nl}|{ts(t - 60)}|{ts(t)}|"
                            f"{ts(mid)}|{tres}")
                rows.append(f"{job}|{job}|bench|u{job % 50}|gpu|train|COMPLETED|0:0|{nl}|{ts(mid)}|{ts(mid + 20)}|"
                            f"{ts(t + dur)}|{tres}")
            else:
                rows.append(f"{job}|{job}|bench|u{job % 50}|gpu|train|COMPLETED|0:0|{nl}|{ts(t - 60)}|{ts(t)}|"
                            f"{ts(t + dur)}|{tres}")
            t += dur + rnd.uniform(5, 120)
    path.write_text("\n".join(rows) + "\n")
    return len(rows) - 1


def count_lines(files: list[Path]) -> int:
    n = 0
    for f in files:
        with f.open("rb") as fh:
            n += sum(buf.count(b"\n") for buf in iter(lambda: fh.read(1 << 20), b""))
    return n


def bench_rg(files: list[Path], patterns: list[str], workdir: Path) -> tuple[float, int]:
    rg = shutil.which("rg")
    if rg is None:
        raise SystemExit("ripgrep (rg) is not installed: apt-get install ripgrep")
    pf = workdir / "patterns.txt"
    pf.write_text("\n".join(patterns) + "\n")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([rg, "-c", "--no-filename", "-f", str(pf), *map(str, files)], capture_output=True, text=True,
                       check=False)
    el = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    RG_CPU.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    if p.returncode not in (0, 1):
        raise SystemExit(f"rg failed: {p.stderr[:500]}")
    return el, sum(int(x) for x in p.stdout.split())


def bench_python_re(files: list[Path], patterns: list[str]) -> tuple[float, int]:
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error:
            compiled.append(re.compile(re.escape(p)))
    t = time.perf_counter()
    hits = 0
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                for c in compiled:
                    if c.search(line):
                        hits += 1
                        break
    return time.perf_counter() - t, hits


def bench_stages_child(paths: list[str]) -> dict:
    """Per-stage split in a child process: read+parse (iter_batches), rule matching (Engine.partial
    on the same batches) and the rest (windows/detectors/attribution = end to end minus both)."""
    code = (
        "import json,sys,time\n"
        "import polars as pl\n"
        "from recovery_logs.sources.files import iter_batches, ReadOptions\n"
        "from recovery_logs.detectors.rules import match\n"
        "from recovery_logs.detectors.rulepack import load_packs\n"
        "pack=load_packs(); t=time.perf_counter(); evs=[]\n"
        "for b in iter_batches(sys.argv[1:], ReadOptions()):\n"
        "    evs.append(b.events)\n"
        "read=time.perf_counter()-t; ev=pl.concat(evs); t=time.perf_counter()\n"
        "n=0\n"
        "for i in range(0, ev.height, 200000):\n"
        "    n+=match(ev.slice(i,200000), pack).height\n"
        "m=time.perf_counter()-t\n"
        "print(json.dumps({'read_s':read,'match_s':m,'findings':n}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=False,
                       env={**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2")})
    if p.returncode != 0:
        raise SystemExit(f"stages failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_replay_child(paths: list[str], accounting: Path | None = None, serial: bool = False) -> dict:
    """Run replay in a child process; return its wall time, peak RSS and summary. ``serial``: without
    the read-ahead and parse threads (``ReplayOptions.read_ahead=0``, ``ReadOptions.parse_ahead=False``)."""
    code = (
        "import json,os,resource,sys,time\n"
        "from recovery_logs.pipeline.replay import ReplayOptions, replay\n"
        "from recovery_logs.sources.read_common import ReadOptions\n"
        "acc=os.environ.get('RL_BENCH_ACCOUNTING') or None\n"
        "serial=os.environ.get('RL_BENCH_SERIAL')=='1'\n"
        "ro=ReplayOptions(accounting=acc, read_ahead=0, read=ReadOptions(parse_ahead=False)) if serial else ReplayOptions(accounting=acc)\n"
        "t=time.perf_counter(); r=replay(sys.argv[1:], ro); el=time.perf_counter()-t\n"
        "ru=resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(json.dumps({'elapsed_s':el,'peak_rss_mb':ru.ru_maxrss/1024,'cpu_s':ru.ru_utime+ru.ru_stime,"
        "'events':r.summary['events'],'findings':r.summary['findings'],'incidents':r.summary['incidents'],"
        "'with_job':sum(1 for i in r.incidents if i.jobs),'accounting_rows':r.summary.get('accounting_rows',0),"
        "'incidents_s':(lambda t0: (r.engine.incidents(), time.perf_counter()-t0)[1])(time.perf_counter())}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=False,
                       env={**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2"),
                            "RL_BENCH_ACCOUNTING": str(accounting or ""), "RL_BENCH_SERIAL": "1" if serial else ""})
    if p.returncode != 0:
        raise SystemExit(f"replay failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def memory_runs(out: Path, sizes: list[int]) -> None:
    """Peak RSS of a replay (child process) per input size: more nodes, the same file sizes."""
    print("memory vs input size (replay peak RSS):")
    for n in sorted(sizes):
        d = out / f"lines-{n}"
        if not d.exists():
            t = time.perf_counter()
            generate(d, n)
            print(f"  (generated {n:,} lines in {time.perf_counter() - t:.0f} s)")
        files = sorted(p for p in d.rglob("*") if p.is_file())
        r = bench_replay_child([str(d)])
        print(f"  {count_lines(files):>10,} lines  {sum(f.stat().st_size for f in files) / 1e6:7.0f} MB  "
              f"{r['peak_rss_mb']:7.0f} MB peak RSS  {r['elapsed_s']:6.1f} s  {r['events']:,} events")


def threads_ab(out: Path, n_lines: int, rounds: int) -> None:
    """Replay in one thread vs with the read-ahead and parse threads, alternated ``rounds`` times."""
    import statistics

    d = out / f"lines-{n_lines}"
    if not d.exists():
        generate(d, n_lines)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(rounds):
        for serial in (True, False):
            runs[serial].append(bench_replay_child([str(d)], serial=serial))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("elapsed_s", "cpu_s", "peak_rss_mb")}
           for k, v in runs.items()}
    same = all(r["findings"] == runs[True][0]["findings"] and r["incidents"] == runs[True][0]["incidents"]
               for v in runs.values() for r in v)
    print(f"replay of {n_lines:,} lines, {rounds} alternations (medians): one thread {med[True]['elapsed_s']:.2f} s wall, "
          f"{med[True]['cpu_s']:.2f} s CPU, {med[True]['peak_rss_mb']:.0f} MB; reader+parse threads "
          f"{med[False]['elapsed_s']:.2f} s wall, {med[False]['cpu_s']:.2f} s CPU, {med[False]['peak_rss_mb']:.0f} MB; "
          f"wall ratio {med[True]['elapsed_s'] / med[False]['elapsed_s']:.2f}x; same findings and incidents: {same}; "
          f"load {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_500_000)
    ap.add_argument("--out", type=Path, default=Path("bench-out/replay"))
    ap.add_argument("--no-memory", action="store_true", help="skip the memory-growth runs")
    ap.add_argument("--no-python-re", action="store_true", help="skip the (slow) Python re baseline")
    ap.add_argument("--memory-lines", type=int, nargs="+", default=None, metavar="N",
                    help="input sizes (lines) of the memory-vs-size runs (default: 1/3, 2/3 and all of --lines); "
                         "e.g. --memory-lines 1500000 5000000 10000000")
    ap.add_argument("--memory-only", action="store_true", help="only the memory-vs-size runs")
    ap.add_argument("--threads-ab", type=int, default=0, metavar="N",
                    help="only: N alternations of replay in one thread (no read-ahead, no parse thread) vs the "
                         "default (reader and parse threads), wall/CPU/RSS medians and whether the results agree")
    args = ap.parse_args()
    if args.threads_ab:
        threads_ab(args.out, args.lines, args.threads_ab)
        return
    if args.memory_only:
        memory_runs(args.out, args.memory_lines or [args.lines])
        return
    results: dict = {}
    for frac in ((1, 3), (2, 3), (3, 3)) if not args.no_memory else ((3, 3),):
        n = args.lines * frac[0] // frac[1]
        d = args.out / f"lines-{n}"
        if not d.exists():
            generate(d, n)
        files = sorted(p for p in d.rglob("*") if p.is_file())
        results[n] = {"files": files, "lines": count_lines(files)}
    full = max(results)
    files, lines = results[full]["files"], results[full]["lines"]
    patterns = rule_patterns()
    print(f"input: {lines:,} lines in {len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.0f} MB; "
          f"{len(patterns)} rule patterns")
    rg_s, rg_hits = bench_rg(files, patterns, args.out)
    py_s, py_hits = bench_python_re(files, patterns) if not args.no_python_re else (None, 0)
    rep = bench_replay_child([str(args.out / f"lines-{full}")])
    rows = [("ripgrep (rg -c -f)", rg_s, rg_hits), ("python re loop", py_s, py_hits),
            ("recovery-logs replay", rep["elapsed_s"], rep["findings"])]
    rows = [r for r in rows if r[1] is not None]
    print(f"{'tool':24s} {'seconds':>9s} {'lines/s':>12s} {'matches':>9s}")
    for name, s, h in rows:
        print(f"{name:24s} {s:9.2f} {lines / s:12,.0f} {h:9,d}")
    print(f"ratio replay/ripgrep lines/s:  {rg_s / rep['elapsed_s']:.2f}x (wall); "
          f"{RG_CPU[-1] / rep['cpu_s']:.2f}x (CPU: rg {RG_CPU[-1]:.2f} s, replay {rep['cpu_s']:.2f} s); "
          f"load {os.getloadavg()[0]:.1f}")
    if py_s is not None:
        print(f"ratio replay/python-re lines/s: {py_s / rep['elapsed_s']:.2f}x")
    print(f"replay: {rep['events']:,} events, {rep['incidents']} incidents, peak RSS {rep['peak_rss_mb']:.0f} MB")
    st = bench_stages_child([str(args.out / f"lines-{full}")])
    rest = max(0.0, rep["elapsed_s"] - st["read_s"] - st["match_s"])
    print(f"per stage (share of end to end): read+parse {st['read_s']:.2f} s ({st['read_s'] / rep['elapsed_s']:.0%}), "
          f"rule matching {st['match_s']:.2f} s ({st['match_s'] / rep['elapsed_s']:.0%}), "
          f"windows/detectors/attribution {rest:.2f} s ({rest / rep['elapsed_s']:.0%}); "
          f"read+parse alone vs ripgrep: {rg_s / st['read_s']:.2f}x")
    acc = args.out / "accounting-1024x24h.txt"
    runs = generate_accounting(acc)
    tries = [(bench_replay_child([str(args.out / f"lines-{full}")]),            # alternated, best of 2 each:
              bench_replay_child([str(args.out / f"lines-{full}")], accounting=acc)) for _ in range(2)]   # noise
    plain = min((p for p, _ in tries), key=lambda r: r["elapsed_s"])
    joined = min((j for _, j in tries), key=lambda r: r["elapsed_s"])
    print(f"replay --accounting (1,024 nodes x 24 h: {runs:,} job runs, {joined['accounting_rows']:,} allocation "
          f"rows): {joined['elapsed_s']:.2f} s vs {plain['elapsed_s']:.2f} s without "
          f"(ratio {joined['elapsed_s'] / plain['elapsed_s']:.3f}x; {joined['with_job']}/{joined['incidents']} incidents "
          f"name a job, {plain['with_job']} without); peak RSS {joined['peak_rss_mb']:.0f} MB vs {plain['peak_rss_mb']:.0f} MB")
    print(f"  of which Engine.incidents() (the join runs there): {joined['incidents_s']:.3f} s vs "
          f"{plain['incidents_s']:.3f} s without")
    if args.memory_lines:
        memory_runs(args.out, args.memory_lines)
    elif not args.no_memory:
        print("memory vs input size (replay peak RSS):")
        for n in sorted(results):
            r = rep if n == full else bench_replay_child([str(args.out / f"lines-{n}")])
            print(f"  {results[n]['lines']:>10,} lines  {r['peak_rss_mb']:7.0f} MB  {r['elapsed_s']:6.2f} s")
    print(f"(this process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
