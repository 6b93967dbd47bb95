"""Output writing of a replay: events.parquet (streamed while reading), incidents.json, report.md,
quarantine.jsonl, report.html and findings.parquet (one row per flagged line) under the output directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.pipeline.line_findings import write_line_findings
from recovery_logs.report.html import write_html_report
from recovery_logs.report.terminal import markdown_report
from recovery_logs.textsafe import json_dumps

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from recovery_logs.pipeline.replay import ReplayResult

__all__ = ["prepare_out_dir", "write_events", "write_outputs"]


def prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output directory is not writable: {exc}", path=str(out_dir)) from exc
    (out_dir / "events.parquet").unlink(missing_ok=True)


def write_events(out_dir: Path, events: pl.DataFrame, writer: pq.ParquetWriter | None) -> pq.ParquetWriter:
    import pyarrow.parquet as pq  # heavy (~0.05-0.2 s to import): only when events.parquet is written

    table = events.to_arrow()
    if writer is None:
        writer = pq.ParquetWriter(str(out_dir / "events.parquet"), table.schema, compression="zstd")
    writer.write_table(table)
    return writer


def write_outputs(res: ReplayResult, out_dir: Path) -> dict[str, Path]:
    """incidents.json, report.md, quarantine.jsonl, report.html and findings.parquet under out_dir."""

    paths = {"json": out_dir / "incidents.json", "markdown": out_dir / "report.md",
             "quarantine": out_dir / "quarantine.jsonl"}
    paths["json"].write_text(res.to_json() + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_report(res), encoding="utf-8")
    with paths["quarantine"].open("w", encoding="utf-8") as fh:
        for row in res.quarantine.iter_rows(named=True):
            fh.write(json_dumps(row) + "\n")

    paths["html"] = write_html_report(res, out_dir)
    paths["findings"] = write_line_findings(res.engine, out_dir)
    return paths
