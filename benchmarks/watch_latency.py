"""Watch latency, throughput and memory against the fixture-faithful test server.

    python benchmarks/watch_latency.py [--rate 2000] [--duration 60] [--refresh 1]
                                       [--throughput-lines 200000] [--memory-duration 120]

The server (tests/integration/victorialogs/vlserver.py, captured VictoriaLogs v1.26.0 tail semantics) and a
line generator run in a child process; the watcher runs in this process (one core), exactly as
``recovery-logs watch`` wires it (tail offset 1s, catch-up 5s, lateness 30s, rule prefilter).

1. latency: mixed training/NCCL/kernel lines at ``--rate`` lines/s over 64 nodes; every
   ``--fault-every`` seconds an XID 79 on a fresh node. Delay = the incident being emitted
   minus the fault line becoming visible on the server. Prints p50/p99/max and misses.
2. throughput: ``--throughput-lines`` lines already on the server, read with no prefilter
   (every line reaches the watcher): lines/s through query -> events -> Engine -> incidents.
3. memory: ``--memory-duration`` seconds at ``--rate``; RSS of the watcher process sampled
   every 10 s, with the dedupe keys and engine findings held (engine rebuilt every
   ``--rotate`` s from ``--context`` s of server history, as ``watch`` does every 30 min).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _vlserver():
    name = "recovery_logs_tests_vlserver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "integration" / "victorialogs" / "vlserver.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def fmt(ns: int) -> str:
    return _vlserver().format_time_ns(ns)


def noise(rng: random.Random, t: int, i: int) -> dict:
    node = rng.randrange(64)
    r = node * 8 + rng.randrange(8)
    kind = rng.random()
    if kind < 0.5:
        return {"_time": fmt(t), "host": f"gpu-n{node}", "unit": "train", "job_id": "184499", "rank": str(r),
                "_msg": f"[rank{r}]: step {i} | loss 1.9{i % 100:02d} | lr 3.0e-04 | tokens/s 118000"}
    if kind < 0.8:
        return {"_time": fmt(t), "host": f"gpu-n{node}", "unit": "train", "job_id": "184499", "rank": str(r),
                "_msg": f"[rank{r}]: NCCL INFO Channel {i % 32:02d}/0 : {r}[0] -> {r + 1}[1] via P2P/IPC"}
    return {"_time": fmt(t), "host": f"gpu-n{node}", "unit": "kernel",
            "_msg": f"systemd[1]: Started Session {i} of user root."}


def serve(port_q, fault_q, stop, shutdown, generated, rate: int, fault_every: float, preload: int) -> None:
    vls = _vlserver()
    srv = vls.VLServer(static=False).start()
    rng = random.Random(7)
    if preload:
        now = time.time_ns()
        span = 20 * 1_000_000_000
        for a in range(0, preload, 20_000):
            srv.ingest([noise(rng, now - span + (a + k) * span // preload, a + k)
                        for k in range(min(20_000, preload - a))])
    port_q.put(srv.port)
    i, f = 0, 0
    next_fault = time.monotonic() + 3.0 if fault_every < 1e6 else float("inf")
    tick = 0.1
    while not stop.is_set() and rate:
        t0 = time.monotonic()
        now = time.time_ns()
        n = max(1, int(rate * tick))
        srv.ingest([noise(rng, now + k * int(tick * 1e9) // n, i + k) for k in range(n)])
        i += n
        generated.value = i
        if t0 >= next_fault:
            node = f"gpu-f{f}"
            srv.ingest([{"_time": fmt(time.time_ns()), "host": node, "unit": "kernel",
                         "_msg": f"NVRM: Xid (PCI:0000:{(f % 200) + 16:02x}:00): 79, pid={1000 + f}, "
                                 "GPU has fallen off the bus."}])
            fault_q.put((node, time.time_ns()))
            f += 1
            next_fault += fault_every
        time.sleep(max(0.0, tick - (time.monotonic() - t0)))
    shutdown.wait(600)
    srv.stop()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(rate: int, fault_every: float, preload: int = 0):
    ctx = mp.get_context("fork")
    port_q, fault_q, stop, shutdown = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    generated = ctx.Value("q", 0)
    proc = ctx.Process(target=serve, args=(port_q, fault_q, stop, shutdown, generated, rate, fault_every, preload),
                       daemon=True)
    proc.start()
    GENERATED[0] = generated
    return proc, port_q.get(timeout=120), fault_q, (stop, shutdown)


GENERATED: list = [None]


def watcher(port: int, refresh: float, prefilter: bool = True, since_s: float | None = None, emit=None,
            duration_s: float | None = None, **kw):
    from recovery_logs.pipeline.watch import Watcher, WatchOptions

    opts = WatchOptions(sources=(f"victorialogs://127.0.0.1:{port}",), refresh_s=refresh, lateness_s=30.0,
                        catchup_s=5.0, tail_offset="1s", prefilter=prefilter, since_s=since_s,
                        duration_s=duration_s, **kw)
    return Watcher(opts, emit=emit).open()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def latency(args) -> dict:
    proc, port, fault_q, stop = start_server(args.rate, args.fault_every)
    emitted: dict[str, int] = {}
    w = watcher(port, args.refresh, emit=lambda k, inc: emitted.setdefault(inc.node or "", time.time_ns()),
                duration_s=args.duration + 10)
    faults: dict[str, int] = {}
    steps: list[float] = []
    last = [time.perf_counter()]

    def after(_w) -> None:
        now = time.perf_counter()
        steps.append(now - last[0])
        last[0] = now
        while not fault_q.empty():
            node, t = fault_q.get()
            faults[node] = t
        if time.monotonic() > t_stop:
            stop[0].set()   # the generator stops; the watcher runs 10 s more for the last faults

    t_stop = time.monotonic() + args.duration
    t_run = time.monotonic()
    cpu0 = time.process_time()
    try:
        w.run(after_step=after)
    finally:
        for ev in stop:
            ev.set()
        proc.join(10)
    lat = [(emitted[n] - t) / 1e9 for n, t in faults.items() if n in emitted]
    return {"rate_lines_s": args.rate, "generated_lines_s": int(GENERATED[0].value / (t_stop - t_run)),
            "refresh_s": args.refresh, "faults": len(faults), "detected": len(lat),
            "p50_s": round(pct(lat, 50), 3), "p99_s": round(pct(lat, 99), 3), "max_s": round(max(lat, default=0), 3),
            "steps": len(steps), "step_interval_p50_s": round(pct(steps, 50), 3),
            "watcher_cpu_share": round((time.process_time() - cpu0) / (time.monotonic() - t_run), 2),
            "lines_read": w.vl.stats["lines_read"], "duplicates": w.vl.stats["duplicates"]}


def throughput(args) -> dict:
    proc, port, _, stop = start_server(0, 1e9, preload=args.throughput_lines)
    try:
        w = watcher(port, args.refresh, prefilter=False, since_s=60.0, use_tail=False, background_catchup=False)
        c0, t0 = time.process_time(), time.perf_counter()
        w.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = w.stats["events"]
        w.close()
    finally:
        for ev in stop:
            ev.set()
        proc.join(10)
    return {"lines": n, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "lines_per_s": int(n / wall),
            "lines_per_cpu_s": int(n / cpu)}


def memory(args) -> dict:
    proc, port, _, stop = start_server(args.rate, 1e9)
    w = watcher(port, args.refresh, context_s=args.context, rotate_s=args.rotate)
    samples = []
    t_start = time.monotonic()
    next_sample = t_start
    try:
        while time.monotonic() - t_start < args.memory_duration:
            t0 = time.monotonic()
            w.step()
            if t0 >= next_sample:
                samples.append({"t_s": round(t0 - t_start), "rss_mb": round(rss_mb(), 1),
                                "generated": GENERATED[0].value, "events": w.stats["events"],
                                "lag_s": round(w.vl.lag_s() or 0, 1), "dedupe_keys": len(w.vl.dedupe),
                                "findings": w.engine.findings_rows, "rotations": w.stats["rotations"]})
                next_sample += 10
            time.sleep(max(0.0, args.refresh - (time.monotonic() - t0)))
    finally:
        for ev in stop:
            ev.set()
        w.close()
        proc.join(10)
    return {"rate_lines_s": args.rate, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=2000, help="lines/s ingested on the server")
    ap.add_argument("--duration", type=float, default=60.0, help="latency phase seconds")
    ap.add_argument("--fault-every", type=float, default=2.0)
    ap.add_argument("--refresh", type=float, default=1.0)
    ap.add_argument("--throughput-lines", type=int, default=200_000)
    ap.add_argument("--memory-duration", type=float, default=120.0)
    ap.add_argument("--context", type=float, default=60.0, help="memory phase: engine context seconds")
    ap.add_argument("--rotate", type=float, default=60.0, help="memory phase: engine rebuilt this often")
    ap.add_argument("--only", choices=["latency", "throughput", "memory"], default=None)
    args = ap.parse_args()
    out = {}
    for name, fn in (("latency", latency), ("throughput", throughput), ("memory", memory)):
        if args.only in (None, name):
            out[name] = fn(args)
            print(json.dumps({name: out[name]}), flush=True)


if __name__ == "__main__":
    main()
