"""Chunked writers: per-node text files in the layout the readers expect, and VictoriaLogs JSON lines.

Real-world noise is added here: duplicated lines (forwarder re-sends), garbage lines (binary junk,
cut lines, invalid UTF-8), interleaving of ranks that share one output file, and, in ``vl.jsonl``,
arrival order that differs from event order across hosts.

Layout under a scenario directory::

    nodes/<host>/kern.log        RFC3164 syslog of the kernel
    nodes/<host>/slurmd.log      slurmd (and its slurmstepd children)
    nodes/<ctl>/slurmctld.log    the controller
    job-<jobid>/<host>.out       the job's output on that node (torchrun, PyTorch, NCCL, Megatron)
    vl.jsonl                     the same records as VictoriaLogs /insert/jsonline rows
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from recovery_logs.simulate import formats as fmt
from recovery_logs.simulate.cluster import Cluster
from recovery_logs.timeutil import NS

INVALID_UTF8 = "\u0001INVALID-UTF8\u0001"   # replaced by raw invalid bytes in text files
GARBAGE = ("\x00\x00\x00\x00\x00\x00\x00\x00", "\x1b[A\x1b[2K\r", "\u2588" * 40 + "| 3071/8192 [12:47<21:19]",
           f"{INVALID_UTF8}torch.distri")


def stream_id(host: str, unit: str) -> str:
    h = zlib.crc32(f"{host}|{unit}".encode())
    h2 = zlib.crc32(f"{unit}|{host}|vl".encode())
    return f"0000000000000000{h:08x}{h2:08x}{h ^ h2:08x}{(h * 31) & 0xffffffff:08x}"


def add_noise(df: pl.DataFrame, rng: np.random.Generator, dup_rate: float, garbage_rate: float) -> pl.DataFrame:
    """Duplicate a few kernel/job lines and insert a few garbage lines into job output."""
    if df.height == 0:
        return df
    stream = df["stream"].to_numpy()
    eligible = (stream == "kern") | (stream == "job")
    dup = df.filter(pl.Series(eligible & (rng.random(df.height) < dup_rate)))
    jobmask = (stream == "job") & (rng.random(df.height) < garbage_rate)
    garb = df.filter(pl.Series(jobmask))
    if garb.height:
        choice = rng.integers(0, len(GARBAGE) + 1, size=garb.height)
        junk = [GARBAGE[i] if i < len(GARBAGE) else None for i in choice]
        garb = garb.with_columns(
            pl.when(pl.Series(junk).is_null()).then(pl.col("msg").str.slice(0, 23)).otherwise(pl.Series(junk)).alias("msg"),
            pl.col("t") + 1, pl.lit(None, pl.Int32).alias("rank"))
    return pl.concat([df, dup, garb], how="vertical")


def render_text(df: pl.DataFrame, c: Cluster) -> pl.DataFrame:
    """Add ``path`` and ``text`` (the line as the file holds it); each stream formatted on its own rows."""
    boot = dict(zip(c.nodes, c.boot_ns, strict=True))
    parts = []
    for (stream,), part in df.group_by(["stream"], maintain_order=True):
        if stream == "job":
            path = pl.concat_str([pl.lit(f"job-{c.job_id}/"), pl.col("host"), pl.lit(".out")])
            text = pl.col("msg")
        else:
            name = {"kern": "kern.log", "slurmd": "slurmd.log", "slurmctld": "slurmctld.log"}[stream]
            path = pl.concat_str([pl.lit("nodes/"), pl.col("host"), pl.lit("/" + name)])
            t = part["t"]
            if stream == "kern":
                up = t - part["host"].replace_strict(boot, default=0, return_dtype=pl.Int64)
                prefix = pl.concat_str([pl.lit(fmt.strftime_ns(t, "%b %e %H:%M:%S")), pl.lit(" "), pl.col("host"),
                                        pl.lit(" kernel: ["), pl.lit(up // NS).cast(pl.String).str.pad_start(5, " "),
                                        pl.lit("."), pl.lit((up % NS) // 1000).cast(pl.String).str.zfill(6),
                                        pl.lit("] ")])
            else:
                prefix = pl.concat_str([pl.lit("["), pl.lit(fmt.strftime_ns(t, "%Y-%m-%dT%H:%M:%S", 3)), pl.lit("] ")])
            text = pl.concat_str([prefix, pl.col("msg")])
        parts.append(part.with_columns(path.alias("path"), text.alias("text")))
    return pl.concat(parts, how="vertical")


class TextSink:
    """Appends chunks to the per-file text layout under ``root``."""

    def __init__(self, root: Path, max_open: int | None = None) -> None:
        self.root = root
        self.lines = 0
        self.bytes = 0
        self._seen: set[str] = set()
        self._open: dict[str, BinaryIO] = {}
        # keep files open across chunks (re-opening thousands of files per chunk dominates at scale),
        # within a share of the process's file-descriptor limit
        if max_open is None:
            import resource  # stdlib but POSIX-only: imported where the open-file limit is read

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            max_open = max(16, min(8192, (soft if soft > 0 else 1024) // 2))
        self.max_open = max_open

    def _handle(self, path: str) -> BinaryIO:
        fh = self._open.get(path)
        if fh is None:
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open))).close()
            fh = open(self.root / path, "ab")
            self._open[path] = fh
        return fh

    def close(self) -> None:
        for fh in self._open.values():
            fh.close()
        self._open.clear()

    def write(self, df: pl.DataFrame, c: Cluster, rng: np.random.Generator) -> None:
        if df.height == 0:
            return
        df = render_text(df, c)
        # ranks sharing one .out file interleave: each process's buffered output lands a few ms late,
        # so lines of different ranks come slightly out of order while one process keeps its own order
        lag = np.where(rng.random(c.world + 1) < 0.125, rng.integers(0, 15_000_000, size=c.world + 1), 0)
        key = pl.col("t") + pl.when(pl.col("stream") == "job").then(
            pl.col("rank").fill_null(c.world).replace_strict(list(range(c.world + 1)), lag.tolist(), default=0,
                                                              return_dtype=pl.Int64)).otherwise(0)
        hosts = {h: i for i, h in enumerate((*c.nodes, c.ctl_host))}
        code = {"kern": 0, "slurmd": 1, "slurmctld": 2, "job": 3}
        df = df.with_columns(key.alias("_k"), (pl.col("stream").replace_strict(code, return_dtype=pl.Int64) * 1_000_000
                                               + pl.col("host").replace_strict(hosts, return_dtype=pl.Int64)).alias("_f"))
        df = df.sort(["_f", "_k"], maintain_order=True)
        texts = df["text"].to_list()
        runs = df.select(pl.col("path").rle()).unnest("path")     # consecutive rows of one file
        start = 0
        for path, n in zip(runs["value"].to_list(), runs["len"].to_list(), strict=True):
            body = ("\n".join(texts[start:start + n]) + "\n").encode("utf-8")
            start += n
            if INVALID_UTF8.encode() in body:
                body = body.replace(INVALID_UTF8.encode(), b"\xff\xfe\xc3")
            if path not in self._seen:
                (self.root / path).parent.mkdir(parents=True, exist_ok=True)
                self._seen.add(path)
            self._handle(path).write(body)
            self.lines += n
            self.bytes += len(body)


class VLSink:
    """Writes VictoriaLogs JSON lines in arrival order (hosts deliver with different delays)."""

    def __init__(self, path: Path | None, c: Cluster, push=None) -> None:
        self.fh: BinaryIO | None = open(path, "wb") if path is not None else None
        self.lines = 0
        self.push = push
        hosts = list(c.nodes) + [c.ctl_host]
        rng = np.random.default_rng([c.seed, 991])
        self.delay = dict(zip(hosts, (int(x) for x in rng.integers(0, 800_000_000, size=len(hosts))), strict=True))

    def write(self, df: pl.DataFrame, c: Cluster, rng: np.random.Generator) -> None:
        if df.height == 0:
            return
        unit = pl.col("stream").replace_strict(fmt.STREAM_UNIT, return_dtype=pl.String)
        arrival = (pl.col("t") + pl.col("host").replace_strict(self.delay, default=0, return_dtype=pl.Int64)
                   + pl.Series(rng.integers(0, 400_000_000, size=df.height)))
        df = df.with_columns(
            pl.col("msg").str.replace_all(INVALID_UTF8, "\ufffd\ufffd", literal=True),
            unit.alias("unit"), arrival.alias("_a")).sort("_a", maintain_order=True)
        has_job = pl.col("stream").is_in(["job", "slurmd"])
        enc = df.select(
            fmt.rfc3339_expr(pl.col("t")).alias("_time"), pl.col("msg").alias("_msg"), pl.col("host"), pl.col("unit"),
            pl.when(has_job).then(pl.lit(c.job_id)).alias("job_id"), pl.col("rank").cast(pl.String).alias("rank"),
            pl.concat_str([pl.lit('{host="'), pl.col("host"), pl.lit('",unit="'), pl.col("unit"), pl.lit('"}')]).alias("_stream"),
        )
        sid = {f'{{host="{h}",unit="{u}"}}': stream_id(h, u) for h, u in
               enc.select("host", "unit").unique().iter_rows()}
        enc = enc.with_columns(pl.col("_stream").replace_strict(sid, return_dtype=pl.String).alias("_stream_id"))
        if self.fh is not None:
            lines = enc.select(pl.struct(pl.all()).struct.json_encode().str.replace_all(r',"(job_id|rank)":null', ""))
            body = ("\n".join(lines.to_series().to_list()) + "\n").encode("utf-8")
            self.fh.write(body)
        if self.push is not None:
            # the server derives _stream/_stream_id from the stream fields itself
            rows = enc.drop("_stream", "_stream_id").iter_rows(named=True)
            self.push([{k: v for k, v in row.items() if v is not None} for row in rows])
        self.lines += df.height

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def chunk_bounds(start: int, end: int, chunk_s: float) -> list[tuple[int, int]]:
    step = max(1, int(chunk_s * NS))
    out = []
    t = start
    while t < end:
        out.append((t, min(t + step, end)))
        t += step
    return out
