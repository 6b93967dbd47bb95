"""Soak the readers with hostile input sizes: memory and output stay bounded (issue 12).

    python benchmarks/soak_input.py                      # all three, default sizes
    python benchmarks/soak_input.py --inflated-mb 2048   # the reported 7 MB gzip -> 2 GiB case

1. **repeated line**: a gzip of one timestamped XID line repeated (``--inflated-mb`` inflated). Every
   copy after the first is a duplicate: counted, quarantine capped per reason. Reports wall time,
   peak RSS and the size of ``quarantine.jsonl``.
2. **one huge line**: a gzip of a single line without a newline (``--huge-mb`` inflated): held cut
   to a prefix, quarantined once as ``oversized``; peak RSS must not follow the line's size.
3. **many small files**: 5,000 one-line files vs the same 5,000 lines in one file.

Each case runs ``recovery-logs replay --out`` in a child process (peak RSS of the child).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

LINE = b"Nov 29 14:06:05 gpu-n07 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"


def gzip_repeated(path: Path, unit: bytes, total: int, newline_every: bool = True) -> None:
    """A gzip stream of ``unit`` repeated up to ``total`` bytes, compressed chunk by chunk."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = unit * max(1, (1 << 20) // len(unit))
    with path.open("wb") as fh:
        left = total
        while left > 0:
            piece = block[:left]
            fh.write(c.compress(piece))
            left -= len(piece)
        fh.write(c.compress(b"\n" if not newline_every else b""))
        fh.write(c.flush())


def replay_child(paths: list[str], out: Path) -> dict:
    exe = str(Path(sys.executable).with_name("recovery-logs"))
    t = time.perf_counter()
    p = subprocess.run([exe, "replay", *paths, "--year", "2026", "--json", "--out", str(out)], capture_output=True,
                       text=True, check=False)
    el = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if p.returncode not in (0, 4):
        raise SystemExit(f"replay failed ({p.returncode}): {p.stderr[-2000:]}")
    s = json.loads(p.stdout)["summary"]
    q = out / "quarantine.jsonl"
    return {"wall_s": el, "children_peak_rss_mb": rss, "rc": p.returncode, "summary": s,
            "quarantine_mb": q.stat().st_size / 2**20 if q.exists() else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inflated-mb", type=int, default=256)
    ap.add_argument("--huge-mb", type=int, default=512)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--work", type=Path, default=Path("bench-out/soak"))
    a = ap.parse_args(argv)
    w = a.work
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)

    rep = w / "repeated" / "kern.log.gz"
    rep.parent.mkdir()
    gzip_repeated(rep, LINE, a.inflated_mb << 20)
    r = replay_child([str(rep)], w / "out-repeated")
    s = r["summary"]
    print(f"repeated line: {rep.stat().st_size / 2**20:.1f} MB gzip -> {a.inflated_mb} MiB inflated, {s['lines']:,} lines: "
          f"{r['wall_s']:.1f} s, peak RSS {r['children_peak_rss_mb']:.0f} MB, duplicates {s['duplicates']:,}, "
          f"quarantine kept {s['quarantined']:,} (+{s['quarantine_not_kept']:,} counted only), "
          f"quarantine.jsonl {r['quarantine_mb']:.1f} MB, incidents {s['incidents']}")

    huge = w / "huge" / "job.out.gz"
    huge.parent.mkdir()
    gzip_repeated(huge, b"x" * 4096, a.huge_mb << 20, newline_every=False)
    r = replay_child([str(huge), str(rep.parent / "kern.log.gz")], w / "out-huge")
    s = r["summary"]
    print(f"one {a.huge_mb} MiB line (+ the repeated file): {r['wall_s']:.1f} s, peak RSS so far "
          f"{r['children_peak_rss_mb']:.0f} MB, oversized {s['oversized']}")

    many = w / "many"
    one = w / "one"
    many.mkdir()
    one.mkdir()
    lines = []
    for i in range(a.files):
        ln = f"Nov 29 14:{i // 60 % 60:02d}:{i % 60:02d} gpu-n{i % 100:03d} kernel: message {i}\n"
        lines.append(ln)
        (many / f"gpu-n{i % 100:03d}.{i}.log").write_text(ln)
    (one / "all.log").write_text("".join(lines))
    rm = replay_child([str(many)], w / "out-many")
    ro = replay_child([str(one)], w / "out-one")
    print(f"{a.files:,} one-line files: {rm['wall_s']:.2f} s vs one file of {a.files:,} lines: {ro['wall_s']:.2f} s "
          f"({rm['wall_s'] / ro['wall_s']:.2f}x); events {rm['summary']['events']:,} vs {ro['summary']['events']:,}")
    print(f"(peak RSS of any replay child: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB; "
          f"{os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
