"""Line-level alert detection on labelled public HPC system logs: the engine vs a keyword rule.

Data (not shipped; public): LogHub, https://github.com/logpai/loghub, its 2k-line samples whose
first column is a label (``-`` for a non-alert line, an alert category tag such as KERNDTLB
otherwise). Of LogHub's samples only these two have that column:

* ``BGL/BGL_2k.log`` (BlueGene/L RAS log, LLNL; 143 alerts): the **development** set. Every
  constant of line scoring (``detectors.linescore.LineScoreParams``, which levels are flagged
  whatever their count) was chosen looking at it — its numbers are not a held-out result.
* ``Thunderbird/Thunderbird_2k.log`` (Sandia Thunderbird syslog; its 2,000 lines are all labelled
  ``-``): meant as **held out**, but no longer untouched: it was looked at twice — once when
  the new-template rule of line scores got its vocabulary-stability gate, once when
  ``pipeline.line_findings`` stopped flagging every line of a model-flagged window (the 314-line
  reboot minute of ``tbird-admin1``; its constants, 3 lines per window and a 2x lift, were set by
  reasoning, not by trying values on it). With no alert in it, it measures only false alarms:
  every flagged line is one.

``HPC/HPC_2k.log`` (LANL) has no label column; LogHub has no Liberty/Spirit sample. A site's own
labelled log can be given with ``--line-format``/``--time-format`` (reported as held out).

What runs, in one process, per dataset:

1. the label column is stripped into a temporary file (the engine never sees it);
2. ``replay`` with the dataset's line format, untuned (shipped rules + shipped anomaly model,
   never trained on these labels; line scores on, as for every site line format), ``--out`` a
   temporary directory; a line is *flagged* when it has a row in ``findings.parquet`` (a window
   the model flags is a ``file = detector`` row, counted apart as ``window_rows``; of its lines
   only the few it singles out are line rows: ``pipeline.line_findings``);
3. the same replay without the window model (``[engine] detectors = ["hangs", "stragglers"]``:
   rules + line scores), so what the shipped model adds or costs on a site's log is visible;
   baselines: a line is flagged when it contains FATAL, FAILURE or ERROR (case-sensitive, the
   label column excluded: the keyword rule of the issue); where the format has a level, also
   the plain level rules "level >= error" and "level >= critical" (so the share of the result
   that is only the level column is visible); and the engine's line-score policy over Drain3's
   templates instead of ours (``drain3``, default config plus our masks);
4. precision / recall / F1 against the labels; flagged lines and a breakdown by rule; every
   finding's action (none may be more than ``investigate``). As a diagnostic only, the best F1
   any threshold on the window model's score could reach (chosen on the labels: an upper bound);
5. reader speed (``--speed-lines``, the first dataset): its label-free lines repeated, read with
   the line format (``read_paths``, vectorised), with a Python ``re`` loop using the same regex,
   and the same lines as RFC3164 syslog through the built-in syslog reader (ratios in one run).

The window model stays on by default for site line formats (an operator's call, measured here):
a line format says how a site's lines are laid out, not what system wrote them — GPU nodes with a
site syslog layout get the same rule findings, hence the same window features, as the built-in
formats, and the model is what catches their un-ruled storms. On these two logs it costs little
since ``findings.parquet`` no longer expands a flagged window into its lines (BGL_2k: no window
flagged; Thunderbird_2k: one reboot minute, one ``investigate`` incident, three line rows) and adds
nothing; a site that sees the same drops it with ``[engine] detectors = ["hangs", "stragglers"]``.

    python benchmarks/hpc_logs.py --loghub /path/to/loghub            # BGL_2k and Thunderbird_2k
    python benchmarks/hpc_logs.py --data /path/to/BGL_2k.log --dataset bgl
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.config import EngineConfig
from recovery_logs.detectors.linescore import LineScoreParams, LineStats, score_lines
from recovery_logs.pipeline.line_findings import window_scores
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.schema import LEVEL_RANK
from recovery_logs.sources.files import read_paths
from recovery_logs.sources.lineformat import compile_line_format
from recovery_logs.sources.read_common import ReadOptions

FORMATS = {
    # LogHub BGL after the label column: epoch, date, node, time, node again, type, component, level, message
    "bgl": ("<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>", "%Y-%m-%d-%H.%M.%S%.f"),
    # LogHub Thunderbird after the label column (syslog times in the site's local time)
    "thunderbird": ("<Timestamp> <*> <Node> <*> <*> <*> <Location> <Component>: <Content>", "epoch"),
}
ROLE = {"bgl": "development", "thunderbird": "held out, looked at twice (see the docstring)"}
LOGHUB = {"bgl": "BGL/BGL_2k.log", "thunderbird": "Thunderbird/Thunderbird_2k.log"}
KEYWORDS = re.compile(r"FATAL|FAILURE|ERROR")
DISRUPTIVE = {"drain_node_and_requeue", "reset_gpu", "requeue_only", "cancel_job"}


def prf(flag: list[bool], truth: list[bool]) -> dict[str, float | int]:
    tp = sum(f and t for f, t in zip(flag, truth, strict=True))
    fp = sum(f and not t for f, t in zip(flag, truth, strict=True))
    fn = sum(t and not f for f, t in zip(flag, truth, strict=True))
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"flagged": tp + fp, "tp": tp, "fp": fp, "fn": fn, "precision": round(p, 4), "recall": round(r, 4),
            "f1": round(2 * p * r / (p + r), 4) if p + r else 0.0}


def drain3_templates(messages: list[str]) -> list[str]:
    """Drain3's template of each message (default config plus our masks), in one pass."""
    from drain3 import TemplateMiner  # dev extra; only this baseline needs it
    from drain3.masking import MaskingInstruction
    from drain3.template_miner_config import TemplateMinerConfig

    from recovery_logs.detectors.templates import MASKS

    logging.getLogger("drain3").setLevel(logging.WARNING)
    cfg = TemplateMinerConfig()
    cfg.masking_instructions = [MaskingInstruction(p, name) for name, p in MASKS]
    tm = TemplateMiner(config=cfg)
    ids = [tm.add_log_message(m)["cluster_id"] for m in messages]
    by_id = {c.cluster_id: c.get_template() for c in tm.drain.clusters}
    return [by_id[i] for i in ids]   # the final template of each line's cluster


def run_dataset(name: str, data: Path, pattern: str, tf: str | None, role: str) -> dict[str, Any]:
    raw = data.read_text(encoding="utf-8", errors="replace").splitlines()
    labels, bodies = [], []
    for ln in raw:
        lab, _, rest = ln.partition(" ")
        labels.append(lab != "-")
        bodies.append(rest)
    keyword = [bool(KEYWORDS.search(b)) for b in bodies]
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / f"{name}.log"
        log.write_text("\n".join(bodies) + "\n", encoding="utf-8")
        opts = ReplayOptions(read=ReadOptions(line_formats=(compile_line_format(pattern, tf),), dedupe=False),
                             out_dir=Path(td) / "out")
        t0 = time.perf_counter()
        res = replay([str(log)], opts)
        elapsed = time.perf_counter() - t0
        fall = pl.read_parquet(Path(td) / "out" / "findings.parquet")
        f = fall.filter(pl.col("file") == str(log))
        window_rows = fall.filter(pl.col("rule_id") == "detector.anomaly", pl.col("file") == "detector").height
        ev = pl.read_parquet(Path(td) / "out" / "events.parquet").sort("seq")
        scores = window_scores(res.engine)
        # the same replay without the window model (what [engine] detectors = ["hangs", "stragglers"] gives)
        no_model = replay([str(log)], replace(opts, out_dir=Path(td) / "out_nomodel",
                                              config=EngineConfig(detectors=("hangs", "stragglers"))))
        fn = pl.read_parquet(Path(td) / "out_nomodel" / "findings.parquet").filter(pl.col("file") == str(log))
        no_model_lines = set(fn["line"].to_list())
        actions = sorted({str(a.kind) for i in res.incidents for a in i.actions})
        finding_actions = sorted(set(res.engine.all_findings()["action"].drop_nulls().to_list()))
    flagged_lines = set(f["line"].to_list())
    n = len(bodies)
    engine = [i + 1 in flagged_lines for i in range(n)]
    by_rule = f.group_by("rule_id").len().sort("len", descending=True)
    line_level = dict(zip(ev["line"].to_list(), ev["level"].to_list(), strict=True))
    rank = [LEVEL_RANK.get(line_level.get(i + 1) or "", -1) for i in range(n)]
    out: dict[str, Any] = {
        "dataset": name, "data": str(data), "role": role, "lines": n, "alerts": sum(labels),
        "replay": {k: res.summary[k] for k in ("events", "format_mismatch", "bad_timestamp", "findings", "incidents")},
        "replay_s": round(elapsed, 2), "levels_parsed": sum(r >= 0 for r in rank),
        "engine": prf(engine, labels), "keyword_baseline": prf(keyword, labels),
        "engine_without_window_model": prf([i + 1 in no_model_lines for i in range(n)], labels)
        | {"incidents": len(no_model.incidents)},
        "incident_categories": sorted(i.category for i in res.incidents),
        "engine_flags_by_rule": dict(zip(by_rule["rule_id"].to_list(), by_rule["len"].to_list(), strict=True)),
        "incident_actions": actions, "finding_actions": finding_actions,
        "disruptive_actions": sorted(set(finding_actions) & DISRUPTIVE),
        "window_rows": window_rows, "windows_scored": scores.height, "windows_flagged": int(scores["flagged"].sum() or 0) if scores.height else 0,
    }
    if out["levels_parsed"]:
        out["level_error_baseline"] = prf([r >= LEVEL_RANK["error"] for r in rank], labels)
        out["level_critical_baseline"] = prf([r >= LEVEL_RANK["critical"] for r in rank], labels)
    try:
        params = LineScoreParams()
        tpl = drain3_templates(ev["message"].fill_null("").to_list())
        st = LineStats.of(ev.with_columns(template=pl.Series(tpl, dtype=pl.String)), params)
        d = set(score_lines(st, params)["line"].to_list())
        out["drain3_line_scores"] = prf([i + 1 in d for i in range(n)], labels) | {"templates": len(set(tpl))}
        ours = LineStats.of(ev, params)
        out["our_templates"] = ours.counts.height
    except ImportError:
        out["drain3_line_scores"] = None
    if scores.height and any(labels):   # diagnostic: every line gets its window's score; the best threshold on the labels
        wn = int(scores["_wn"][0])
        lw = ev.select("line", "host", "job_id", ((pl.col("time").dt.epoch("ns") // wn) * wn).alias("_w")).join(
            scores.select("host", "job_id", "_w", "score"), on=["host", "job_id", "_w"], how="left", nulls_equal=True)
        sc = dict(zip(lw["line"].to_list(), lw["score"].fill_null(0.0).to_list(), strict=True))
        line_score = [sc.get(i + 1, 0.0) for i in range(n)]
        best = max((prf([x >= th for x in line_score], labels) | {"threshold": th}
                    for th in sorted(set(line_score))), key=lambda d: d["f1"])
        out["model_score_oracle_threshold"] = best
    e, k = out["engine"], out["keyword_baseline"]
    out["engine_beats_keyword_f1"] = e["f1"] > k["f1"] if any(labels) else None
    out["engine_fewer_false_alarms"] = e["fp"] < k["fp"]
    return out


def print_dataset(o: dict[str, Any]) -> None:
    print(f"\n== {o['dataset']} ({o['role']}): {o['data']}: {o['lines']} lines, {o['alerts']} alerts; replay "
          f"{o['replay_s']:.2f}s, {o['replay']['events']} events, {o['replay']['format_mismatch']} format mismatches, "
          f"{o['levels_parsed']} lines with a level")
    print(f"{'':34s} {'flagged':>7s} {'precision':>9s} {'recall':>7s} {'F1':>6s} {'TP':>5s} {'FP':>5s} {'FN':>5s}")
    rows = [("engine (rules+model+line scores)", o["engine"]),
            ("engine without the window model", o["engine_without_window_model"]),
            ("keyword FATAL|FAILURE|ERROR", o["keyword_baseline"])]
    for key, label in (("level_error_baseline", "level >= error"), ("level_critical_baseline", "level >= critical"),
                       ("drain3_line_scores", "line-score policy, Drain3 templates")):
        if o.get(key):
            rows.append((label, o[key]))
    for label, m in rows:
        print(f"{label:34s} {m['flagged']:7d} {m['precision']:9.3f} {m['recall']:7.3f} {m['f1']:6.3f} {m['tp']:5d} "
              f"{m['fp']:5d} {m['fn']:5d}")
    print(f"engine flags by rule: {o['engine_flags_by_rule']}; windows scored {o['windows_scored']}, flagged "
          f"{o['windows_flagged']} ({o['window_rows']} window rows); incidents {o['incident_categories']} (without the "
          f"model {o['engine_without_window_model']['incidents']}); finding actions {o['finding_actions']}, disruptive: {o['disruptive_actions'] or 'none'}")
    if o.get("drain3_line_scores"):
        print(f"templates: ours {o.get('our_templates')}, Drain3 {o['drain3_line_scores']['templates']}")
    if "model_score_oracle_threshold" in o:
        m = o["model_score_oracle_threshold"]
        print(f"diagnostic (threshold picked on the labels, an upper bound): window score >= {m['threshold']:.3f} "
              f"gives P={m['precision']:.3f} R={m['recall']:.3f} F1={m['f1']:.3f}")
    if o["alerts"]:
        print("engine beats the keyword baseline (F1):", "yes" if o["engine_beats_keyword_f1"] else "no")
    else:
        print(f"no alert in this sample: every flag is a false alarm; engine {o['engine']['fp']} vs keyword "
              f"{o['keyword_baseline']['fp']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loghub", type=Path, help="a LogHub checkout: run every labelled sample it has (BGL, Thunderbird)")
    ap.add_argument("--data", type=Path, help="one log with its label column (BGL_2k.log …)")
    ap.add_argument("--dataset", choices=sorted(FORMATS), default="bgl", help="the format of --data")
    ap.add_argument("--line-format", help="--data is a site's own labelled log in this line format (held out)")
    ap.add_argument("--time-format")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--speed-lines", type=int, default=200_000, help="lines for the reader speed check (0: skip)")
    a = ap.parse_args(argv)
    runs: list[tuple[str, Path, str, str | None, str]] = []
    if a.loghub is not None:
        for name, rel in LOGHUB.items():
            if (a.loghub / rel).is_file():
                runs.append((name, a.loghub / rel, *FORMATS[name], ROLE[name]))
        if not runs:
            ap.error(f"--loghub {a.loghub}: none of {sorted(LOGHUB.values())} there")
    if a.data is not None:
        if not a.data.is_file():
            ap.error(f"--data {a.data}: no such file (get BGL/BGL_2k.log from https://github.com/logpai/loghub)")
        if a.line_format:
            runs.append(("site", a.data, a.line_format, a.time_format, "held out"))
        else:
            runs.append((a.dataset, a.data, *FORMATS[a.dataset], ROLE[a.dataset]))
    if not runs:
        ap.error("give --loghub DIR or --data FILE")
    results = [run_dataset(*r) for r in runs]
    if a.speed_lines > 0:
        name, data, pattern, tf, _ = runs[0]
        bodies = [ln.partition(" ")[2] for ln in data.read_text(encoding="utf-8", errors="replace").splitlines()]
        results[0]["reader_speed"] = reader_speed(bodies, pattern, tf or "iso", a.speed_lines)
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    for o in results:
        print_dataset(o)
    if "reader_speed" in results[0]:
        r = results[0]["reader_speed"]
        print(f"\nreader: {r['lines']} lines, line format {r['lines_per_s']:,.0f} lines/s (whole read: events, "
              f"quarantine, dedupe off), Python re loop {r['python_re_lines_per_s']:,.0f} lines/s: "
              f"{r['ratio_vs_python_re']:.1f}x; built-in syslog reader on the same lines {r['syslog_reader_lines_per_s']:,.0f} "
              f"lines/s ({r['ratio_vs_syslog_reader']:.2f}x)")
    if any(o["disruptive_actions"] for o in results):
        print("ERROR: a disruptive action on an unknown-format log", file=sys.stderr)
        return 1
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
