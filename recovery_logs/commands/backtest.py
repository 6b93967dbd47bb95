"""`recovery-logs backtest` (a policy over history, dry) and `recovery-logs grade` (monitor-mode
self-grading from the audit trail)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer


def _gate(min_precision: float | None, min_incidents: int | None):
    from recovery_logs.remediation.gate import PromotionGate

    if min_precision is None and min_incidents is None:
        return None
    return PromotionGate(0.9 if min_precision is None else min_precision,
                         20 if min_incidents is None else min_incidents)


def register(app: typer.Typer) -> None:
    @app.command("backtest")
    def backtest_cmd(
        data: Annotated[list[Path], typer.Argument(help="history: simulator output, bundled incidents, log dirs")],
        policy: Annotated[Path | None, typer.Option("--policy", help="policy TOML ([promotion] = gate)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
        spacing: Annotated[str | None, typer.Option("--spacing", help="lay cases end to end, e.g. 20m")] = None,
        mode: Annotated[str, typer.Option("--mode", help="mode to evaluate the policy in")] = "autonomous",
        min_precision: Annotated[float | None, typer.Option("--min-precision", help="promotion gate")] = None,
        min_incidents: Annotated[int | None, typer.Option("--min-incidents", help="promotion gate")] = None,
        cluster_nodes: Annotated[int, typer.Option("--cluster-nodes", help="0: policy, else nodes seen")] = 0,
        drain_hold: Annotated[str | None, typer.Option("--drain-hold", help="how long a drain lasts")] = None,
        width: Annotated[int | None, typer.Option("--width", help="terminal width")] = None,
        workers: Annotated[int | None, typer.Option("--workers", help="replay on N local Ray workers ([scale])")] = None,
        ray_address: Annotated[str | None, typer.Option("--ray-address", help="use an existing Ray cluster")] = None,
        since: Annotated[str | None, typer.Option("--since", help="archive input: RFC3339 start (inclusive)")] = None,
        until: Annotated[str | None, typer.Option("--until", help="archive input: RFC3339 end (exclusive)")] = None,
        nodes: Annotated[str | None, typer.Option("--nodes", help="archive input: only these nodes (a,b,c)")] = None,
        progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                      help="progress bar (default: only on a terminal)")] = None,
    ) -> None:
        """Replay history under a policy (never touches a cluster): proposals per rule and action,
        budget/breaker/cooldown hits, nodes drained at once, and how many proposals were right."""
        from recovery_logs.analysis.backtest import BacktestOptions, run_backtest
        from recovery_logs.commands._replay_run import _read_options
        from recovery_logs.timeutil import parse_duration_s

        opts = BacktestOptions(spacing_s=parse_duration_s(spacing) if spacing else None, mode=mode,
                               gate=_gate(min_precision, min_incidents), cluster_nodes=cluster_nodes,
                               drain_hold_s=parse_duration_s(drain_hold) if drain_hold else None,
                               read=_read_options("auto", None, None, None, None, since=since, until=until,
                                                  nodes=nodes) if (since or until or nodes) else None,
                               workers=workers, ray_address=ray_address)
        from recovery_logs.analysis.backtest import count_cases
        from recovery_logs.commands._progress import ProgressBar, wanted

        with ProgressBar(wanted(progress), "backtest", total=count_cases(data), unit="cases") as bar:
            res = run_backtest(policy, data, opts, on_case=lambda c: bar.advance(1, c.name))
        if as_json:
            sys.stdout.write(res.to_json() + "\n")
            return
        from recovery_logs.textsafe import out_console

        out_console(width).print(res)

    @app.command("grade")
    def grade_cmd(
        state_dir: Annotated[Path, typer.Option("--state-dir", help="state dir holding audit.db")],
        later: Annotated[list[Path] | None, typer.Argument(help="later logs: incidents there grade drains")] = None,
        horizon: Annotated[str, typer.Option("--horizon", help="how long after a proposal to look")] = "7d",
        min_precision: Annotated[float, typer.Option("--min-precision", help="gate: precision a rule needs")] = 0.9,
        min_incidents: Annotated[int, typer.Option("--min-incidents", help="gate: graded incidents a rule needs")] = 20,
        as_json: Annotated[bool, typer.Option("--json", help="print grades and gate as JSON")] = False,
        width: Annotated[int | None, typer.Option("--width", help="table width (default: terminal; 200 when piped)")] = None,
    ) -> None:
        """Grade monitor-mode proposals from the audit trail (approvals, rejections) and later
        incidents; per-rule precision and which rules the promotion gate lets act alone."""
        from recovery_logs.analysis.backtest import rows_with_iso_times
        from recovery_logs.analysis.selfgrade import grading_from_state
        from recovery_logs.remediation.gate import PromotionGate
        from recovery_logs.timeutil import parse_duration_s

        gate = PromotionGate(min_precision, min_incidents)
        grades, table = grading_from_state(state_dir, later or [], gate, parse_duration_s(horizon))
        if as_json:
            doc = {"gate": {"min_precision": gate.min_precision, "min_incidents": gate.min_incidents},
                   "rules": table.to_dicts(),
                   "grades": rows_with_iso_times(grades)}
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            return
        from recovery_logs.report.terminal import precision_renderable
        from recovery_logs.textsafe import out_console

        out_console(width).print(precision_renderable(table, gate))
