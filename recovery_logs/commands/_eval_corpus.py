"""`recovery-logs eval --corpus DIR`: printing the real-log corpus report (scoring is in corpus_eval)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recovery_logs.analysis.corpus_eval import CorpusOptions, CorpusReport, SplitReport, evaluate_corpus
from recovery_logs.errors import EvalFloorMissed
from recovery_logs.textsafe import out_console


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def family_table(split: SplitReport) -> Table:
    t = Table(title=f"{split.name}: per family")
    for col in ("family", "n", "correct", "precision", "recall", "actions", "ambiguous"):
        t.add_column(col, justify="left" if col == "family" else "right")
    for fam, v in split.per_family.items():
        t.add_row(fam, str(v["n"]), str(v["correct"]), _pct(v["precision"]), _pct(v["recall"]), _pct(v["actions"]),
                  str(v["ambiguous"]))
    return t


def category_table(split: SplitReport) -> Table:
    t = Table(title=f"{split.name}: per category (predicted = top incident, none = no incident)")
    for col in ("category", "true", "predicted", "precision", "recall"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for cat, v in split.per_category.items():
        t.add_row(cat, str(v["true"]), str(v["predicted"]), _pct(v["precision"]), _pct(v["recall"]))
    return t


def summary_line(split: SplitReport) -> str:
    x = split.totals
    return (f"{split.name}: {x['excerpts']} excerpts ({x['non_benign']} non-benign, {x['benign']} benign, "
            f"{x['ambiguous']} ambiguous) | category accuracy on non-benign {_pct(x['category_accuracy'])} "
            f"(unambiguous only {_pct(x['category_accuracy_unambiguous'])}) | benign with drain/reset/requeue/cancel "
            f"{x['benign_with_actions']} | action agreement {_pct(x['action_agreement'])} | crashes {x['crashes']}")


def print_report(report: CorpusReport, console: Console, show_misses: bool) -> None:
    for split in report.splits:
        console.print(family_table(split))
        console.print(category_table(split))
        console.print(escape(summary_line(split)))
        misses = split.misses()
        disagree = split.action_disagreements()
        if split.hidden and not show_misses:
            console.print(f"{split.name}: {len(misses)} miss(es) and {len(disagree)} action disagreement(s) "
                          "hidden (use --show-misses)")
            continue
        for r in misses:
            e = r.excerpt
            amb = " [ambiguous]" if e.ambiguous else ""
            console.print(escape(f"  miss {e.id} ({e.family}{amb}): {r.miss_reason()}; action {r.action} "
                                 f"(expected {e.action}); cause: {r.cause}"), soft_wrap=True)
        for r in disagree:
            e = r.excerpt
            amb = " [ambiguous]" if e.ambiguous else ""
            console.print(escape(f"  action {e.id} ({e.family}{amb}): expected {e.action}, got {r.action} "
                                 f"({r.category} via {r.root_rule})"), soft_wrap=True)
    console.print(f"corpus scored in {report.wall_s:.1f}s")


def run_corpus_eval(corpus: Path, *, as_json: bool, show_misses: bool, min_category: float,
                    max_benign_actions: int, width: int | None, min_holdout_category: float | None = None,
                    config: Path | None = None) -> None:
    from recovery_logs.config import load_config

    cfg = load_config(config) if config is not None else None
    report = evaluate_corpus(corpus, CorpusOptions(min_category=min_category, max_benign_actions=max_benign_actions,
                                                   holdout_min_category=min_holdout_category, config=cfg))
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(show_misses), indent=2) + "\n")
    else:
        print_report(report, out_console(width, markup=True), show_misses)   # values are escape()d
    if report.missed:
        raise EvalFloorMissed("eval: floor missed: " + "; ".join(report.missed), corpus=str(corpus))


__all__: list[Any] = ["category_table", "family_table", "print_report", "run_corpus_eval"]
