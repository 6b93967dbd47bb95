"""Progress of long commands (replay, backtest, eval, simulate): a rich bar on stderr.

Shown when stderr is a terminal, or always with ``--progress``; never otherwise (a non-terminal
gets nothing unless asked, so pipes and CI logs stay clean). Replay shows input bytes read of the
total, lines/s and an ETA from the bytes; the others count their units (cases, scenarios).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ProgressBar", "input_size", "wanted"]


def wanted(flag: bool | None) -> bool:
    """``--progress`` (True) / ``--no-progress`` (False) / unset: only on a terminal."""
    return flag if flag is not None else sys.stderr.isatty()


def input_size(paths: list[str]) -> int:
    """Bytes on disk of the files a replay will read (what the ETA is measured in)."""
    from recovery_logs.sources.files import expand_paths

    try:
        files, _ = expand_paths(paths)
    except Exception:  # noqa: BLE001 - the replay itself reports bad paths; the bar just has no total
        return 0
    total = 0
    for f in files:
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


class ProgressBar:
    """``with ProgressBar(on, "replay", total=...) as bar: bar.stats(counter)`` or ``bar.advance()``.

    ``unit="bytes"``: ``stats`` reads ``input_bytes`` and ``lines`` from the reader's counters;
    else each ``advance`` is one unit of ``total``."""

    def __init__(self, enabled: bool, description: str, total: int | None = None, unit: str = "bytes") -> None:
        self.enabled = enabled
        self.description = description
        self.total = total or None
        self.unit = unit
        self._p: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._done = 0

    def __enter__(self) -> ProgressBar:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        cols: list[Any] = [TextColumn("[bold]{task.description}"), BarColumn()]
        cols += [DownloadColumn()] if self.unit == "bytes" else [MofNCompleteColumn()]
        cols += [TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
        self._p = Progress(*cols, console=Console(stderr=True), transient=False, refresh_per_second=4)
        self._p.__enter__()
        self._task = self._p.add_task(self.description, total=self.total, rate="")
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._p is not None:
            if et is None and self.total:
                self._p.update(self._task, completed=self.total)
            self._p.__exit__(et, ev, tb)

    def stats(self, stats: Mapping[str, int]) -> None:
        """Reader counters so far (cumulative): bytes read and lines/s."""
        if self._p is None:
            return
        el = max(time.perf_counter() - self._t0, 1e-9)
        lines = int(stats.get("lines", 0))
        done = int(stats.get("input_bytes", 0))
        self._p.update(self._task, completed=min(done, self.total) if self.total else done,
                       rate=f"{lines:,} lines {lines / el:,.0f} lines/s")

    def advance(self, n: int = 1, note: str = "") -> None:
        if self._p is None:
            return
        self._done += n
        el = max(time.perf_counter() - self._t0, 1e-9)
        self._p.update(self._task, advance=n, rate=f"{self._done / el:.2f}/s {note}".rstrip())


def paths_of(paths: list[Path] | None) -> list[str]:
    return [str(p) for p in paths or []]
