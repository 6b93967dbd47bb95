"""Line-level alert detection on labelled public HPC system logs: the engine vs a keyword rule.

Data (not shipped; public): LogHub, https://github.com/logpai/loghub — ``BGL/BGL_2k.log`` (a
2,000-line sample of the BlueGene/L RAS log, LLNL; the full log is on Zenodo, linked from
LogHub's README). The first column is the label: ``-`` for a non-alert line, an alert category
tag (KERNDTLB, APPSEV …) otherwise.

What runs, in one process:

1. the label column is stripped into a temporary file (the engine never sees it);
2. ``replay`` with the BGL line format, untuned (shipped rules + shipped anomaly model, never
   trained on these labels), ``--out`` a temporary directory; a line is *flagged* when it has a
   row in ``findings.parquet`` (a rule won it, or it lies in a window the model flagged);
3. the baseline: a line is flagged when it contains FATAL, FAILURE or ERROR (case-sensitive,
   the label column excluded);
4. precision / recall / F1 of both against the labels. As a diagnostic only, the best F1 any
   threshold on the model's window score could reach (the threshold chosen on the labels, so it
   is an upper bound, not a result);
5. reader speed: the label-free lines repeated to ``--speed-lines`` lines, read with the line
   format (``read_paths``, vectorised), with a Python ``re`` loop using the same regex, and the
   same lines as RFC3164 syslog through the built-in syslog reader (ratios within one run).

    python benchmarks/hpc_logs.py --data /path/to/loghub/BGL/BGL_2k.log
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from recovery_logs.pipeline.line_findings import window_scores
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.files import read_paths
from recovery_logs.sources.lineformat import compile_line_format
from recovery_logs.sources.read_common import ReadOptions

FORMATS = {
    # LogHub BGL after the label column: epoch, date, node, time, node again, type, component, level, message
    "bgl": ("<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>", "%Y-%m-%d-%H.%M.%S%.f"),
    # LogHub Thunderbird after the label column (syslog times in the site's local time)
    "thunderbird": ("<Timestamp> <*> <Node> <*> <*> <*> <Location> <Component>: <Content>", "epoch"),
}
KEYWORDS = re.compile(r"FATAL|FAILURE|ERROR")


def prf(flag: list[bool], truth: list[bool]) -> dict[str, float | int]:
    tp = sum(f and t for f, t in zip(flag, truth, strict=True))
    fp = sum(f and not t for f, t in zip(flag, truth, strict=True))
    fn = sum(t and not f for f, t in zip(flag, truth, strict=True))
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "precision": round(p, 4), "recall": round(r, 4),
            "f1": round(2 * p * r / (p + r), 4) if p + r else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="a LogHub log with its label column (BGL_2k.log …)")
    ap.add_argument("--dataset", choices=sorted(FORMATS), default="bgl")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--speed-lines", type=int, default=200_000, help="lines for the reader speed check (0: skip)")
    a = ap.parse_args(argv)
    if not a.data.is_file():
        ap.error(f"--data {a.data}: no such file (get BGL/BGL_2k.log from https://github.com/logpai/loghub)")
    raw = a.data.read_text(encoding="utf-8", errors="replace").splitlines()
    labels, bodies = [], []
    for ln in raw:
        lab, _, rest = ln.partition(" ")
        labels.append(lab != "-")
        bodies.append(rest)
    if not any(labels):
        print(f"{a.data}: no alert lines in this file; nothing to measure", file=sys.stderr)
        return 1
    keyword = [bool(KEYWORDS.search(b)) for b in bodies]
    pattern, tf = FORMATS[a.dataset]
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / f"{a.dataset}.log"
        log.write_text("\n".join(bodies) + "\n", encoding="utf-8")
        opts = ReplayOptions(read=ReadOptions(line_formats=(compile_line_format(pattern, tf),), dedupe=False),
                             out_dir=Path(td) / "out")
        t0 = time.perf_counter()
        res = replay([str(log)], opts)
        elapsed = time.perf_counter() - t0
        f = pl.read_parquet(Path(td) / "out" / "findings.parquet").filter(pl.col("file") == str(log))
        ev = pl.read_parquet(Path(td) / "out" / "events.parquet")
        scores = window_scores(res.engine)
    flagged_lines = set(f["line"].to_list())
    engine = [i + 1 in flagged_lines for i in range(len(bodies))]
    by_source = f.group_by("rule_id").len().sort("len", descending=True)
    out = {
        "data": str(a.data), "dataset": a.dataset, "lines": len(bodies), "alerts": sum(labels),
        "replay": {k: res.summary[k] for k in ("events", "format_mismatch", "bad_timestamp", "findings", "incidents")},
        "replay_s": round(elapsed, 2),
        "engine": prf(engine, labels), "keyword_baseline": prf(keyword, labels),
        "engine_flags_by_rule": dict(zip(by_source["rule_id"].to_list(), by_source["len"].to_list(), strict=True)),
        "windows_scored": scores.height, "windows_flagged": int(scores["flagged"].sum() or 0) if scores.height else 0,
    }
    if scores.height:   # diagnostic: every line gets its window's score; the best threshold on the labels
        wn = int(scores["_wn"][0])
        lw = ev.select("line", "host", "job_id", ((pl.col("time").dt.epoch("ns") // wn) * wn).alias("_w")).join(
            scores.select("host", "job_id", "_w", "score"), on=["host", "job_id", "_w"], how="left", nulls_equal=True)
        s = dict(zip(lw["line"].to_list(), lw["score"].fill_null(0.0).to_list(), strict=True))
        line_score = [s.get(i + 1, 0.0) for i in range(len(bodies))]
        best = max((prf([x >= th for x in line_score], labels) | {"threshold": th}
                    for th in sorted(set(line_score))), key=lambda d: d["f1"])
        out["model_score_oracle_threshold"] = best
    if a.speed_lines > 0:
        out["reader_speed"] = reader_speed(bodies, pattern, tf, a.speed_lines)
    e, k = out["engine"], out["keyword_baseline"]
    out["engine_beats_keyword_f1"] = e["f1"] > k["f1"]
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{a.data} ({a.dataset}): {out['lines']} lines, {out['alerts']} alerts; replay {elapsed:.2f}s, "
          f"{out['replay']['events']} events, {out['replay']['format_mismatch']} format mismatches")
    print(f"{'':22s} {'precision':>9s} {'recall':>7s} {'F1':>6s} {'TP':>5s} {'FP':>5s} {'FN':>5s}")
    for name, m in (("engine (rules+model)", e), ("keyword FATAL|FAILURE|ERROR", k)):
        print(f"{name:22s} {m['precision']:9.3f} {m['recall']:7.3f} {m['f1']:6.3f} {m['tp']:5d} {m['fp']:5d} {m['fn']:5d}")
    print(f"engine flags by rule: {out['engine_flags_by_rule']}; windows scored {out['windows_scored']}, "
          f"flagged {out['windows_flagged']}")
    if "model_score_oracle_threshold" in out:
        o = out["model_score_oracle_threshold"]
        print(f"diagnostic (threshold picked on the labels, an upper bound): window score >= {o['threshold']:.3f} "
              f"gives P={o['precision']:.3f} R={o['recall']:.3f} F1={o['f1']:.3f}")
    print("engine beats the keyword baseline (F1):", "yes" if out["engine_beats_keyword_f1"] else "no")
    if "reader_speed" in out:
        r = out["reader_speed"]
        print(f"reader: {r['lines']} lines, line format {r['lines_per_s']:,.0f} lines/s (whole read: events, "
              f"quarantine, dedupe off), Python re loop {r['python_re_lines_per_s']:,.0f} lines/s: "
              f"{r['ratio_vs_python_re']:.1f}x; built-in syslog reader on the same lines {r['syslog_reader_lines_per_s']:,.0f} "
              f"lines/s ({r['ratio_vs_syslog_reader']:.2f}x)")
    return 0


def reader_speed(bodies: list[str], pattern: str, tf: str, n: int) -> dict[str, float | int]:
    """Lines per second: the line-format reader vs a Python ``re`` loop with the same regex."""
    lf = compile_line_format(pattern, tf)
    reps = max(1, n // max(1, len(bodies)))
    lines = bodies * reps
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "speed.log"
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        t0 = time.perf_counter()
        r = read_paths([p], ReadOptions(line_formats=(lf,), dedupe=False))
        t_reader = time.perf_counter() - t0
        assert r.events.height == len(lines)
        # the same lines as RFC3164 syslog, read by the built-in syslog reader
        sp = Path(td) / "speed.syslog"
        with sp.open("w", encoding="utf-8") as fh:
            for ev in r.events.select("host", "message").iter_rows():
                fh.write(f"Jun  3 15:42:50 {ev[0]} kernel: {ev[1]}\n")
        t0 = time.perf_counter()
        rs = read_paths([sp], ReadOptions(fmt="syslog", dedupe=False, year=2005))
        t_sys = time.perf_counter() - t0
        assert rs.events.height == len(lines)
        rx = re.compile(lf.regex)
        t0 = time.perf_counter()
        with p.open(encoding="utf-8") as fh:
            got = [m.groups() if (m := rx.match(ln.rstrip("\n"))) else None for ln in fh]
        t_re = time.perf_counter() - t0
        assert len(got) == len(lines)
    return {"lines": len(lines), "lines_per_s": round(len(lines) / t_reader),
            "python_re_lines_per_s": round(len(lines) / t_re), "ratio_vs_python_re": round(t_re / t_reader, 2),
            "syslog_reader_lines_per_s": round(len(lines) / t_sys), "ratio_vs_syslog_reader": round(t_sys / t_reader, 2)}


if __name__ == "__main__":
    raise SystemExit(main())
