"""The engine's training-progress observations, held narrow (``detectors.progress``; issues 16, 15).

:class:`ProgressStore` holds the plain progress findings of everything fed as
``PROGRESS_SCHEMA`` rows (about 70 bytes a row instead of the full finding's ~270 and its text),
in chunks sorted once on demand, like the engine's other findings. It drops rows by time
(the engine's compaction) and spills to disk with them (``pipeline.scale``).

The text of a progress line is kept only where something reads it later: the first line of a job
after a silence of ``RESUME_GAP_S`` or more (or its first line at all) — the line a requeued job's
"progress resumed" audit record quotes (``remediation.remediator.observe_progress``). A handful of
lines per job attempt; every other line's text is at its file and line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from recovery_logs.detectors.progress import empty_progress, narrow, time_seq_order, widen
from recovery_logs.timeutil import NS

RESUME_GAP_S = 30.0


def sorted_chunks(chunks: list[pl.DataFrame]) -> pl.DataFrame:
    """The chunks as one frame in (time, seq) order (nulls last), the same rows as
    ``concat(chunks).sort(...)``, gathered a column at a time and each unsorted column let go once
    gathered: the whole frame is held twice only a column at a time (on a fleet hour the sort's two
    copies of the findings were the replay's peak). ``chunks`` is emptied. The engine's full findings
    and this store's narrow rows are both sorted with it."""
    df = pl.concat(chunks) if len(chunks) > 1 else chunks[0]
    chunks.clear()
    if _in_time_seq_order(df):      # (chunks that came in order: no gather of every column)
        return df
    order = time_seq_order(df)
    cols: list[pl.Series] = []
    for name in df.columns:
        cols.append(df.get_column(name).gather(order))
        df = df.drop(name)
    return pl.DataFrame(cols)


def _in_time_seq_order(df: pl.DataFrame, key: str = "time") -> bool:
    """Whether ``df`` already is in (time, seq) order: times ascending without a null, ``seq``
    without a null and ascending within equal times (``sorted_chunks`` of a replay's summarised
    progress, which comes slice after slice: 450 k rows checked in ~2 ms instead of gathered in ~60 ms)."""
    if df.height < 2:
        return True
    t, seq = df.get_column(key), df.get_column("seq")
    if t.null_count() or seq.null_count() or not t.is_sorted():
        return False
    if seq.is_sorted():
        return True
    tie = (t.to_physical().diff() == 0) & (seq.diff() < 0)
    return not bool(tie.any())


class ProgressStore:
    """Plain progress findings as narrow rows; see the module docstring."""

    def __init__(self) -> None:
        self._chunks: list[pl.DataFrame] = []
        self._cache: pl.DataFrame | None = None
        self._rows = 0
        self.oldest_ns: int | None = None          # earliest time held (None: none held)
        self.texts: dict[int, tuple[int, str]] = {}  # seq -> (time ns, message) of resumption lines
        self._last: dict[str, int] = {}              # job -> latest progress time ns seen

    @property
    def height(self) -> int:
        return self._rows

    @property
    def frame(self) -> pl.DataFrame:
        """Every row held, in (time, seq) order."""
        if self._cache is None:
            self._cache = empty_progress() if not self._chunks else sorted_chunks(self._chunks)
            self._chunks = [self._cache]
        return self._cache

    def add(self, found: pl.DataFrame) -> None:
        """Hold these plain progress findings (full rows; their text is let go, but see the module)."""
        if found.height == 0:
            return
        self._keep_texts(found)
        rows = narrow(found)
        self._chunks.append(rows)
        self._cache = None
        self._rows += rows.height
        t0 = rows.select(pl.col("time").min().dt.epoch("ns")).item()
        if t0 is not None and (self.oldest_ns is None or t0 < self.oldest_ns):
            self.oldest_ns = int(t0)

    def _keep_texts(self, found: pl.DataFrame) -> None:
        gap = int(RESUME_GAP_S * NS)
        p = (found.select("job_id", "seq", pl.col("time").dt.epoch("ns").alias("t"))
             .with_row_index("_i")
             .filter(pl.col("job_id").is_not_null() & pl.col("t").is_not_null()))
        if p.height == 0:
            return
        # the rows in (t, seq) order, so each job's rows, taken in frame order by ``over``, are in that
        # order too; the text is gathered for the few rows kept only
        if not _in_time_seq_order(p, "t"):      # (summarised progress comes in order: no gather)
            p = p[time_seq_order(p, "t")]
        prev = pl.col("t").shift(1).over("job_id")
        first = pl.int_range(pl.len()).over("job_id") == 0
        last = pl.col("job_id").replace_strict(self._last, default=None, return_dtype=pl.Int64) if self._last \
            else pl.lit(None, pl.Int64)
        before = pl.when(first).then(last).otherwise(prev)
        hits = p.filter(before.is_null() | (pl.col("t") - before >= gap))
        msgs = found.get_column("message").gather(hits.get_column("_i")).to_list()
        for (s, t), msg in zip(hits.select("seq", "t").iter_rows(), msgs, strict=True):
            if s is not None:
                self.texts[int(s)] = (int(t), msg or "")
        for job, t in p.group_by("job_id").agg(pl.col("t").max()).iter_rows():
            if t > self._last.get(job, -(2**62)):
                self._last[job] = t

    def widened(self) -> pl.DataFrame:
        """The rows as findings (``FINDING_SCHEMA``; text only where kept)."""
        return widen(self.frame, {s: m for s, (_, m) in self.texts.items()})

    def keep(self, expr: pl.Expr) -> int:
        """Keep only the rows ``expr`` holds for. Returns the rows dropped."""
        if self._rows == 0:
            return 0
        f = self.frame
        kept = f.filter(expr)
        dropped = f.height - kept.height
        if dropped:
            self._chunks, self._cache, self._rows = [kept], kept, kept.height
            t0 = kept.select(pl.col("time").min().dt.epoch("ns")).item()
            self.oldest_ns = None if t0 is None else int(t0)
            # the engine drops by time (older than a horizon): the texts of the rows dropped with them
            self.texts = {} if self.oldest_ns is None else {
                s: v for s, v in self.texts.items() if v[0] >= self.oldest_ns}
        return dropped

    def spill(self, path: Path) -> None:
        """Write the rows to ``path`` (Arrow IPC, lz4) and let go of them until :meth:`load`."""
        self.frame.write_ipc(path, compression="lz4")
        self._chunks, self._cache, self._rows = [], None, 0

    def load(self, path: Path) -> None:
        """The rows :meth:`spill` wrote, held again (same rows, same order); ``path`` is removed."""
        rows = pl.read_ipc(path)
        self._chunks, self._cache, self._rows = [rows], None, rows.height
        path.unlink()


__all__ = ["RESUME_GAP_S", "ProgressStore", "sorted_chunks"]
