"""``replay --source victorialogs://``: a time range read at export speed.

The range is cut into time slices of about ``slice_rows`` rows each (sized with one cheap
``/select/logsql/hits`` call), each slice is fetched as one unsorted ``/query`` export of only
the fields the engine uses (``| fields ...``), ``workers`` slices in flight at once, parsed as
JSON lines by Polars, sorted by ``_time`` (then stream id and message, so ties are
deterministic) and turned into events by the same code as every other VictoriaLogs reader.
Slices are disjoint and yielded in time order, so the whole read is in time order and each row
comes exactly once. A cut stream is a failed read (VictoriaLogsError), never a short replay.

Compared with paging ``| sort by (_time) | limit N`` (``sources.tail.history_rows``, still used
for small context reads) this avoids the server-side sort and the per-row Python JSON decoding:
``benchmarks/vl_real.py --only replay`` measures both against a plain ``curl`` export.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError, VictoriaLogsError
from recovery_logs.sources.files import events_from_vl_frame
from recovery_logs.sources.formats import vl_columns
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.rowkeys import vl_time_ns
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.timeutil import rfc3339_to_ns_expr

__all__ = ["history_batches_fast", "plan_slices"]

NS = 1_000_000_000


def plan_slices(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                slice_rows: int = 250_000, probes: int = 64) -> list[tuple[int, int]]:
    """``[(lo, hi)]`` inclusive ns ranges covering ``[start, end]``, about ``slice_rows`` rows each."""
    if end_ns < start_ns:
        raise ConfigError("--end is before --start", start=start_ns, end=end_ns)
    span = end_ns - start_ns + 1
    step_s = max(1, -(-span // (probes * NS)))
    doc = client.hits(query, start_ns, end_ns, step=f"{step_s}s")
    counts: dict[int, int] = {}
    for series in doc.get("hits", []):
        for ts, v in zip(series.get("timestamps", []), series.get("values", []), strict=False):
            try:
                t = vl_time_ns(str(ts))
            except ValueError:
                continue
            counts[t] = counts.get(t, 0) + int(v)
    cuts = [start_ns]
    acc = 0
    for t in sorted(counts):
        if acc and acc + counts[t] > slice_rows and start_ns < t <= end_ns:
            cuts.append(t)
            acc = 0
        acc += counts[t]
    out = []
    for i, lo in enumerate(cuts):
        hi = cuts[i + 1] - 1 if i + 1 < len(cuts) else end_ns
        if hi >= lo:
            out.append((lo, hi))
    return out


def _frame(body: bytes, keys: tuple[str, ...], seq: int) -> pl.DataFrame:
    """JSON lines -> the reader's frame, in time order. ``text`` (the raw record, used for
    quarantine and as part of the duplicate key) is the record's JSON only for rows whose
    ``_time`` does not parse; for the others stream id, time and rank identify the line."""
    schema = {k: pl.String for k in keys}
    if not body.strip():
        return pl.DataFrame(schema=schema)
    df = pl.read_ndjson(io.BytesIO(body), schema=schema, ignore_errors=True)
    df = df.with_columns(_ts=rfc3339_to_ns_expr(pl.col("_time")),
                         _tie=pl.struct("_stream_id", "_msg").hash(seed=11)).sort(["_ts", "_tie"], nulls_last=True)
    ok = df.filter(pl.col("_ts").is_not_null())
    bad = df.filter(pl.col("_ts").is_null())
    ok = ok.with_columns(text=pl.concat_str([pl.col("_stream_id"), pl.col("_time"), pl.col("rank")],
                                            separator="\t", ignore_nulls=True))
    if bad.height:
        raw = pl.struct(list(keys)).struct.json_encode().str.replace_all(r'"[^"]*":null,?', "").str.replace(
            r",\}$", "}")
        bad = bad.with_columns(text=raw.str.slice(0, 4096))
        ok = pl.concat([ok, bad])
    return ok.drop("_ts", "_tie").with_columns(valid=pl.lit(True),
                                               lineno=pl.int_range(seq + 1, seq + ok.height + 1, dtype=pl.Int64))


def history_batches_fast(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                         opts: ReadOptions | None = None, slice_rows: int = 100_000,
                         workers: int = 2) -> Iterator[Any]:
    opts = opts or ReadOptions()
    keys = vl_columns(tuple(opts.host_fields))
    q = f"{query} | fields {', '.join(keys)}"
    slices = plan_slices(client, query, start_ns, end_ns, slice_rows)
    file = f"victorialogs:{client.base_url}"
    seq = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(client.query_bytes, q, lo, hi) for lo, hi in slices[:workers]]
        nxt = len(futures)
        i = 0
        while i < len(futures):
            try:
                body = futures[i].result()
            except VictoriaLogsError:
                for f in futures[i + 1:]:
                    f.cancel()
                raise
            if nxt < len(slices):
                futures.append(pool.submit(client.query_bytes, q, *slices[nxt]))
                nxt += 1
            futures[i] = None   # type: ignore[call-overload]  # free the body
            i += 1
            df = _frame(body, keys, seq)
            del body
            if df.height == 0:
                continue
            batch = events_from_vl_frame(df, opts, seq_start=seq, file=file)
            seq += df.height
            yield batch
