"""`recovery-logs archive`: events as Parquet partitioned by day and node (zstd), for long backtests."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("archive")
    def archive_cmd(
        paths: Annotated[list[Path], typer.Argument(help="log files, directories or globs (anything replay reads)")],
        out: Annotated[Path, typer.Option("--out", help="archive directory (created, or appended to)")],
        fmt: Annotated[str, typer.Option("--format", help="auto|vl-jsonl|journald|syslog|dmesg|job|parquet")] = "auto",
        year: Annotated[int | None, typer.Option("--year", help="year for timestamps without one")] = None,
        host: Annotated[str | None, typer.Option("--host", help="node name for lines that carry none")] = None,
        job: Annotated[str | None, typer.Option("--job", help="Slurm job id for lines that carry none")] = None,
        progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                      help="progress bar (default: only on a terminal)")] = None,
    ) -> None:
        """Read logs once and keep their events as Parquet (day=/node= partitions, zstd); replay and
        backtest read the directory back, opening only the days and nodes asked for (--since/--until/--nodes)."""
        from recovery_logs.commands._progress import ProgressBar, input_size, wanted
        from recovery_logs.commands._replay_run import _read_options
        from recovery_logs.sources.archive import write_archive
        from recovery_logs.sources.files import iter_batches

        opts = _read_options(fmt, host, job, year, None)
        names = [str(p) for p in paths]
        on = wanted(progress)
        with ProgressBar(on, "archive", total=input_size(names) if on else None) as bar:
            def batches():
                seen: dict = {}
                for b in iter_batches(names, opts):
                    for k, v in b.stats.items():
                        seen[k] = seen.get(k, 0) + v
                    bar.stats(seen)
                    yield b

            meta = write_archive(batches(), out)
        sys.stdout.write(json.dumps(meta, indent=2) + "\n")
