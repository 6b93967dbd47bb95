"""`recovery-logs eval`: replay simulated scenarios and score detection against their truth."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from recovery_logs.textsafe import clean, out_console


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if v is True:
        return "yes"
    if v is False:
        return "NO"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def report_table(report) -> Any:
    from rich.table import Table

    t = Table(title="recovery-logs eval", show_lines=False)
    for col in ("scenario", "truth", "top incident", "top1", "top3", "cat", "actions", "innocent", "latency s",
                "vs decisive s"):
        t.add_column(col, no_wrap=col in ("scenario", "top1", "top3", "cat"))
    for s in report.scores:
        if s.error:
            t.add_row(s.name, "", Text(clean(s.error), style="red"), "", "", "", "", "", "", "")
            continue
        m, tr = s.metrics, s.truth
        top = m.get("top") or {}
        truth = f"{tr.get('category') or 'none'}@{tr.get('culprit_node') or '-'}"
        got = f"{top.get('category')}@{top.get('node')}" if top else "(none)"
        innocent = m["innocent_drains"] + m["disruptive"]
        t.add_row(s.name, truth, got, _fmt(m.get("top1")), _fmt(m.get("top3")), _fmt(m.get("category_ok")),
                  _fmt(m.get("actions_ok")), _fmt(innocent), _fmt(m.get("latency_s")), _fmt(m.get("decisive_latency_s")))
    x = report.totals

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    t.add_section()
    t.add_row("TOTAL", f"{x['scenarios']} runs, {x['node_level']} node-level", f"{x['errors']} error(s)",
              pct(x["top1"]), pct(x["top3"]), pct(x["category"]), pct(x["actions"]),
              str(x["innocent_drains"] + x["unclean_quiet_runs"]), "",
              "-" if x["hardware_latency_max_s"] is None else f"max {x['hardware_latency_max_s']:.1f}")
    return t


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        directory: Annotated[Path | None, typer.Argument(help="output of `recovery-logs simulate` (or one scenario dir)")] = None,
        corpus: Annotated[Path | None, typer.Option("--corpus", help="score a real-log excerpt corpus (dir with "
                                                    "dev/ and holdout/, or a dir of excerpts) instead")] = None,
        show_misses: Annotated[bool, typer.Option("--show-misses", help="--corpus: also list the holdout's misses")] = False,
        min_holdout_category: Annotated[float | None, typer.Option(
            "--min-holdout-category", help="--corpus: category floor of the held-out split (default: --min-category)")] = None,
        max_benign_actions: Annotated[int, typer.Option("--max-benign-actions", help="--corpus: ceiling on benign "
                                                        "excerpts with drain/reset/requeue/cancel")] = 0,
        config: Annotated[Path | None, typer.Option("--config", help="--corpus: engine config TOML ([engine]) of "
                                                    "the replays, e.g. to score `textclass = true`")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
        input_kind: Annotated[str, typer.Option("--input", help="auto | text | vl")] = "auto",
        min_top1: Annotated[float, typer.Option("--min-top1", help="floor: top-1 culprit rate (node-level runs)")] = 0.0,
        min_top3: Annotated[float, typer.Option("--min-top3", help="floor: top-3 culprit rate")] = 0.0,
        min_category: Annotated[float | None, typer.Option("--min-category", help="floor: category rate "
                                                           "(default 0; with --corpus 0.90 on non-benign excerpts)")] = None,
        max_innocent_drains: Annotated[int, typer.Option("--max-innocent-drains", help="ceiling on innocent drains")] = 0,
        max_latency: Annotated[float | None, typer.Option("--max-latency", help="ceiling (s) on hardware-fault "
                                                                               "latency after the decisive line")] = None,
        max_errors: Annotated[int, typer.Option("--max-errors", help="ceiling on unscorable scenarios")] = 0,
        allow_unclean_healthy: Annotated[bool, typer.Option("--allow-unclean-healthy",
                                                            help="do not fail on disruptive proposals in quiet runs")] = False,
        width: Annotated[int | None, typer.Option("--width", help="terminal width")] = None,
        progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                      help="progress bar (default: only on a terminal)")] = None,
    ) -> None:
        """Replay every scenario in DIRECTORY, score it against truth.json; exit 1 when a floor is missed.

        With --corpus DIR: replay every real-log excerpt and print per-family/per-category precision and
        recall, category accuracy, benign excerpts with disruptive proposals, action agreement, crashes
        and every miss (the holdout split's misses only with --show-misses)."""

        from recovery_logs.analysis.evaluate import EvalOptions, evaluate_engine
        from recovery_logs.errors import ConfigError

        if (directory is None) == (corpus is None):
            raise ConfigError("eval: give a simulator output DIRECTORY or --corpus DIR (one of them)")
        if corpus is not None:
            from recovery_logs.commands._eval_corpus import run_corpus_eval

            run_corpus_eval(corpus, as_json=as_json, show_misses=show_misses,
                            min_category=0.90 if min_category is None else min_category,
                            min_holdout_category=min_holdout_category,
                            max_benign_actions=max_benign_actions, width=width, config=config)
            return
        assert directory is not None
        if config is not None:
            raise ConfigError("eval: --config applies to --corpus runs only", config=str(config))
        opts = EvalOptions(input=input_kind, min_top1=min_top1, min_top3=min_top3,
                           min_category=0.0 if min_category is None else min_category,
                           max_innocent_drains=max_innocent_drains, max_latency_s=max_latency,
                           require_healthy_clean=not allow_unclean_healthy, max_errors=max_errors)
        err = out_console(width, stderr=True)

        from recovery_logs.analysis.truth import scenario_dirs
        from recovery_logs.commands._progress import ProgressBar, wanted

        with ProgressBar(wanted(progress), "eval", total=len(scenario_dirs(directory)), unit="scenarios") as bar:
            def note(s) -> None:
                bar.advance(1, s.name)
                if s.error:
                    err.print(Text(clean(f"eval: {s.name}: {s.error}"), style="yellow"))

            report = evaluate_engine(directory, opts, on_score=note)
        if as_json:
            sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        else:
            out_console(width).print(report_table(report))
            x = report.totals
            def pr(v: float | None) -> str:
                return "-" if v is None else f"{v:.2f}"

            cats = x.get("per_category") or {}
            if cats:
                out_console(width).print("top-incident category precision/recall: " + "; ".join(
                    f"{c} P={pr(v['precision'])} R={pr(v['recall'])} (n={v['true']})" for c, v in cats.items()))
            if x["hang_watchdog_lead_min_s"] is not None:
                out_console(width).print(f"silent hangs flagged at least {x['hang_watchdog_lead_min_s']:.0f}s before "
                                           "the 600 s NCCL watchdog")
            if x["replay_lines_per_s"]:
                out_console(width).print(f"replayed {x['lines']:,d} lines in {x['replay_s']:.2f}s "
                                           f"({x['replay_lines_per_s']:,.0f} lines/s)")
        if report.missed:
            from recovery_logs.analysis.evaluate import EvalFloorMissed

            raise EvalFloorMissed("eval: floor missed: " + "; ".join(report.missed), directory=str(directory))
