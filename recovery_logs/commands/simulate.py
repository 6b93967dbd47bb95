"""`recovery-logs simulate`: write simulated incident logs and their truth.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        scenario: Annotated[str | None, typer.Option("--scenario", help="NAME, all, a,b (several runs) or a+b "
                                                                        "(one run with both faults)")] = None,
        out: Annotated[Path | None, typer.Option("--out", help="output directory (one sub-directory per scenario)")] = None,
        seed: Annotated[int, typer.Option("--seed", help="random seed; same seed, same bytes")] = 0,
        nodes: Annotated[int, typer.Option("--nodes", help="nodes in the job")] = 4,
        gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs (ranks) per node")] = 8,
        duration: Annotated[str, typer.Option("--duration", help="simulated time, e.g. 30m, 2h, 24h")] = "2h",
        fmt: Annotated[str, typer.Option("--format", help="text | vl-jsonl | both")] = "text",
        log_profile: Annotated[str, typer.Option("--log-profile", help="dense (every rank logs every ~4 s) | fleet "
                                                                       "(iteration line from one rank, per-rank "
                                                                       "timings every ~30 s: ~700 lines per node-hour)")] = "dense",
        to: Annotated[str | None, typer.Option("--to", help="also push to victorialogs://HOST:PORT")] = None,
        list_only: Annotated[bool, typer.Option("--list", help="list scenario names and exit")] = False,
        progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                      help="progress bar (default: only on a terminal)")] = None,
    ) -> None:
        """Simulate a multi-node training job with injected faults; writes logs and truth.json."""
        from recovery_logs.errors import ConfigError
        from recovery_logs.simulate import SimOptions, scenario_names, simulate
        from recovery_logs.timeutil import parse_duration_s

        if list_only:
            from recovery_logs.simulate.scenarios import SCENARIOS

            for name in scenario_names():
                doc = (SCENARIOS[name][0].__doc__ or "").strip().splitlines()
                typer.echo(f"{name:<20} {doc[0] if doc else ''}".rstrip())
            return
        if scenario is None or out is None:
            raise ConfigError("simulate: --scenario and --out are required (see --list for scenario names)",
                              scenario=scenario, out=str(out) if out else None)
        try:
            duration_s = parse_duration_s(duration)
        except ValueError as exc:
            raise ConfigError("simulate: --duration is not a duration (e.g. 90s, 30m, 2h)", value=duration) from exc
        opts = SimOptions(out=out, scenario=scenario, seed=seed, nodes=nodes, gpus_per_node=gpus_per_node,
                          duration_s=duration_s, format=fmt, to=to, log_profile=log_profile)

        from recovery_logs.commands._progress import ProgressBar, wanted
        from recovery_logs.simulate.generate import resolve_scenarios

        with ProgressBar(wanted(progress), "simulate", total=len(resolve_scenarios(scenario)),
                         unit="scenarios") as bar:
            def show(r) -> None:
                bar.advance(1, r.scenario)
                typer.echo(f"{r.scenario:<22} {r.lines:>11,d} lines {r.bytes / 1e6:>9.1f} MB {r.seconds:>7.2f}s "
                           f"{r.lines_per_s:>12,.0f} lines/s  -> {r.path}")

            results = simulate(opts, on_result=show)
        total = sum(r.lines for r in results)
        secs = sum(r.seconds for r in results)
        typer.echo(f"{len(results)} scenario(s), {total:,d} lines in {secs:.2f}s "
                   f"({total / secs if secs else 0:,.0f} lines/s)")
