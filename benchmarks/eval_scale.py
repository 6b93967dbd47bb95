"""Scale benchmark: simulate a large job, replay it, report speed, peak memory and accuracy together.

    python benchmarks/eval_scale.py                                  # 256 nodes x 8 GPUs, 1 h, 3 faults
    python benchmarks/eval_scale.py --nodes 1024 --duration 24h --scenario xid79_cascade
    python benchmarks/eval_scale.py --json

Generation runs in this process; each replay runs in a child process so its peak RSS
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``) is measured on its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _replay_child(scenario_dir: str) -> None:
    from recovery_logs.analysis.evaluate import EvalOptions, evaluate_engine

    t0 = time.perf_counter()
    rep = evaluate_engine(scenario_dir, EvalOptions(max_errors=99))
    s = rep.scores[0]
    out = {"wall_s": time.perf_counter() - t0, "error": s.error, **{k: v for k, v in s.metrics.items() if k != "top"},
           "top": s.metrics.get("top"), "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--duration", default="1h")
    ap.add_argument("--scenario", default="xid79_cascade,ib_link_down,straggler_node")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", default="text", choices=["text", "vl-jsonl", "both"])
    ap.add_argument("--out", type=Path, default=None, help="keep the generated logs here (default: a temp dir)")
    ap.add_argument("--no-replay", action="store_true", help="only measure generation")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replay-child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.replay_child:
        _replay_child(a.replay_child)
        return 0

    from recovery_logs.simulate import SimOptions, simulate
    from recovery_logs.timeutil import parse_duration_s

    out = a.out or Path(tempfile.mkdtemp(prefix="rl-eval-scale-"))
    rows = []
    try:
        results = simulate(SimOptions(out=out, scenario=a.scenario, seed=a.seed, nodes=a.nodes,
                                      gpus_per_node=a.gpus_per_node, duration_s=parse_duration_s(a.duration),
                                      format=a.format))
        gen_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for r in results:
            row = {"scenario": r.scenario, "lines": r.lines, "mb": round(r.bytes / 1e6, 1),
                   "gen_s": round(r.seconds, 2), "gen_lines_per_s": round(r.lines_per_s), "gen_peak_rss_mb": round(gen_rss)}
            if not a.no_replay:
                proc = subprocess.run([sys.executable, __file__, "--replay-child", str(r.path)], capture_output=True,
                                      text=True, check=False)
                if proc.returncode != 0:
                    row["replay_error"] = proc.stderr.strip().splitlines()[-1:] or ["failed"]
                else:
                    m = json.loads(proc.stdout.strip().splitlines()[-1])
                    lines = m.get("lines") or r.lines
                    row.update({"replay_s": round(m["replay_s"], 2), "replay_lines_per_s": round(lines / m["replay_s"]),
                                "replay_peak_rss_mb": round(m["maxrss_mb"]), "top1": m.get("top1"),
                                "category_ok": m.get("category_ok"), "innocent_drains": m.get("innocent_drains"),
                                "latency_s": m.get("latency_s"), "decisive_latency_s": m.get("decisive_latency_s"),
                                "top": m.get("top"), "error": m.get("error")})
            rows.append(row)
    finally:
        if a.out is None:
            shutil.rmtree(out, ignore_errors=True)
    if a.json:
        print(json.dumps({"nodes": a.nodes, "gpus_per_node": a.gpus_per_node, "duration": a.duration, "runs": rows},
                         indent=2))
        return 0
    print(f"eval_scale: {a.nodes} nodes x {a.gpus_per_node} GPUs, {a.duration}")
    hdr = ("scenario", "lines", "MB", "gen l/s", "replay l/s", "replay RSS MB", "top1", "cat", "innocent", "latency s")
    print("  ".join(f"{h:>14}" for h in hdr))
    for r in rows:
        vals = (r["scenario"], r["lines"], r["mb"], r["gen_lines_per_s"], r.get("replay_lines_per_s", "-"),
                r.get("replay_peak_rss_mb", "-"), r.get("top1", "-"), r.get("category_ok", "-"),
                r.get("innocent_drains", "-"),
                "-" if r.get("latency_s") is None else f"{r['latency_s']:.1f}")
        print("  ".join(f"{str(v):>14}" for v in vals))
        if r.get("replay_error") or r.get("error"):
            print(f"    error: {r.get('replay_error') or r.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
