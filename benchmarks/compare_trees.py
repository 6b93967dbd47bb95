"""One replay, two checkouts, alternated: time, CPU and peak RSS of each, and whether the results agree.

    git worktree add -f /tmp/old <commit>
    python benchmarks/compare_trees.py --old /tmp/old --new . --rounds 3 bench-out/fleet/n256-1h/xid79_cascade

Each run is ``fleet_scale.py``'s one-process child (a fresh process: its peak RSS is its own)
started with the checkout as its working directory, so it imports that checkout's
``recovery_logs`` (the benchmark scripts run from the repository root the same way). Runs
alternate old, new, old, new ... so that a change in the machine's load falls on both; on a shared
machine compare the ratios of one run, not figures from different runs. The replay JSON (summary
and incidents) of the last old and new run are compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_scale import child_argv  # noqa: E402  (the benchmark's child script and its arguments, one source of truth)


def run(tree: Path, src: str, out: Path) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2")}
    p = subprocess.run(child_argv("one", [src], out), capture_output=True, text=True, cwd=tree, env=env, check=False)
    if p.returncode != 0:
        raise SystemExit(f"replay in {tree} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="checkout of the baseline commit")
    ap.add_argument("--new", type=Path, default=Path("."), help="checkout of the change (default: here)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("input", help="file or directory to replay")
    a = ap.parse_args(argv)
    trees = {"old": a.old.resolve(), "new": a.new.resolve()}
    src = str(Path(a.input).resolve())   # each run's working directory is its tree: a relative path would name that tree's copy
    res: dict[str, list[dict]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {k: Path(tmp) / f"{k}.json" for k in trees}
        for _ in range(a.rounds):
            for k, tree in trees.items():
                r = run(tree, src, outs[k])
                res[k].append(r)
                print(f"{k}: {r['elapsed_s']:6.1f} s wall, {r['cpu_s']:6.1f} s CPU, peak RSS {r['peak_rss_mb']:6.0f} MB, "
                      f"{r['lines']:,} lines, {r['incidents']} incidents; load {os.getloadavg()[0]:.1f}", flush=True)
        same = outs["old"].read_text() == outs["new"].read_text()
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("elapsed_s", "cpu_s", "peak_rss_mb")}
           for k, v in res.items()}
    print(f"median old/new: wall {med['old']['elapsed_s'] / med['new']['elapsed_s']:.2f}x, "
          f"CPU {med['old']['cpu_s'] / med['new']['cpu_s']:.2f}x; peak RSS "
          f"{med['old']['peak_rss_mb']:.0f} -> {med['new']['peak_rss_mb']:.0f} MB "
          f"(new/old {med['new']['peak_rss_mb'] / med['old']['peak_rss_mb']:.2f}); results identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
