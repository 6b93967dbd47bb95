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
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError, VictoriaLogsError
from recovery_logs.sources.files import events_from_vl_frame
from recovery_logs.sources.formats import VL_JOB_FIELDS, short_host, vl_columns
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.rowkeys import vl_time_ns
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.sources.vl_local import read_export, with_ts
from recovery_logs.timeutil import rfc3339_to_ns_expr

__all__ = ["COUNT_SCHEMA", "history_batches_fast", "line_counts", "logsql_field", "plan_slices", "present_fields",
           "stream_map"]

NS = 1_000_000_000
# slices parsed and selected at once (Polars runs each on its own pool too)
_CPU_STAGE = 2


def plan_slices(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                slice_rows: int = 250_000, probes: int = 64) -> list[tuple[int, int]]:
    """``[(lo, hi)]`` inclusive ns ranges covering ``[start, end]``, of about equal rows, about
    ``slice_rows`` or fewer each (a probe bucket's rows more at most)."""
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
    # ``n`` slices of about equal rows (the fewest of at most ~``slice_rows``): a cut before the
    # probe bucket where the rows before it come nearest each multiple of ``total / n``. (Cutting
    # whenever ``slice_rows`` would be passed left a small last slice, exported and parsed after
    # the others: a tail of the replay's wall time on its own.)
    total = sum(counts.values())
    n = max(1, -(-total // max(1, slice_rows)))
    cuts = [start_ns]
    acc = 0
    for t in sorted(counts):
        k = len(cuts)
        if k < n and acc and 2 * acc >= 2 * k * total / n - counts[t] and start_ns < t <= end_ns:
            cuts.append(t)
        acc += counts[t]
    out = []
    for i, lo in enumerate(cuts):
        hi = cuts[i + 1] - 1 if i + 1 < len(cuts) else end_ns
        if hi >= lo:
            out.append((lo, hi))
    return out


# always asked for (a row without them is malformed or has no identity)
_CORE_FIELDS = ("_time", "_msg", "_stream_id")


def present_fields(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                   keys: Sequence[str]) -> tuple[str, ...] | None:
    """``keys`` without the fields no row of ``query`` in ``[start, end]`` has, per the server's
    ``/select/logsql/field_names`` (one cheap call): the JSON-lines parser's cost grows with the
    columns it is given (1 M rows of 64-host chatter, 20 reader fields of which 7 present: 2.1 s ->
    1.2 s CPU). ``_stream`` is left out too: its labels are also fields of the row (VictoriaLogs
    stores the stream fields as fields), which the readers prefer, so it adds nothing. A server or
    proxy that does not answer the call: None (ask for ``keys``)."""
    try:
        names = client.field_names(query, start_ns, end_ns)
    except VictoriaLogsError:
        return None
    return tuple(k for k in keys if k in _CORE_FIELDS or (k != "_stream" and names.get(k, 0) > 0))


_MAX_STREAM_FIELDS = 16


def stream_map(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int
               ) -> tuple[tuple[str, ...], pl.DataFrame] | None:
    """(stream fields, their values -> ``_stream_id`` for every stream of ``query`` in ``[start,
    end]``), so an export can leave ``_stream_id`` out and get it back by a join: the id is 48
    hex characters on every row, a quarter of a row of 64-host chatter (1 M rows: 240 vs 176 MB;
    the server's export 1.45 vs 1.12 CPU-s, our parse 1.08 vs 0.95 s, fewer bytes to receive),
    while the stream fields are exported anyway and name the stream exactly (VictoriaLogs derives
    the id from them; a missing field is the empty value). Two cheap index queries
    (``/stream_field_names``, then ``stats by (<stream fields>, _stream_id) count()``). None —
    export ``_stream_id`` — where the server does not answer, a scope has more than 16 stream
    fields, or two streams share the values of the stream fields (a field that is a stream field
    of one stream and a plain field of another)."""
    try:
        names = client.stream_field_names(query, start_ns, end_ns)
    except VictoriaLogsError:
        return None
    fields = tuple(sorted(k for k, n in names.items() if n > 0 and not k.startswith("_")))
    if len(fields) > _MAX_STREAM_FIELDS or len(fields) != sum(1 for k, n in names.items() if n > 0):
        return None
    by = ", ".join([*(logsql_field(f) for f in fields), "_stream_id"])
    try:
        body = client.query_bytes(f"{query} | stats by ({by}) count() as __n", start_ns, end_ns)
    except VictoriaLogsError:
        return None
    schema = {**{f: pl.String for f in fields}, "_stream_id": pl.String}
    m = (pl.read_ndjson(io.BytesIO(body), schema=schema) if body.strip() else pl.DataFrame(schema=schema)
         ).with_columns(pl.col(f).fill_null("") for f in fields)
    if m["_stream_id"].null_count() or (fields and m.select(pl.struct(fields).is_duplicated().any()).item()) or (
            not fields and m.height > 1):
        return None
    return fields, m


def _with_stream_ids(df: pl.DataFrame, smap: tuple[tuple[str, ...], pl.DataFrame],
                     keep: tuple[str, ...]) -> pl.DataFrame | None:
    """``_stream_id`` joined onto an export parsed without it (``keep``: the columns to return);
    None when a row's stream is not in the map (it appeared after the map was taken)."""
    fields, m = smap
    df = df.drop("_stream_id", strict=False)
    if not fields:
        out = df.with_columns(pl.lit(m["_stream_id"][0] if m.height else None, pl.String).alias("_stream_id"))
    else:
        tmp = [f"__sk{i}" for i in range(len(fields))]
        out = (df.with_columns(pl.col(f).fill_null("").alias(t) for f, t in zip(fields, tmp, strict=True))
               .join(m.rename(dict(zip(fields, tmp, strict=True))), on=tmp, how="left", maintain_order="left"))
    if out.height and out["_stream_id"].null_count():
        return None
    return out.select(keep)


def _stream_identity(df: pl.DataFrame, smap: tuple[tuple[str, ...], pl.DataFrame],
                     with_id: bool = True) -> pl.DataFrame | None:
    """``__id`` (a row's identity, :func:`~recovery_logs.sources.vl_local.row_identity`'s
    equivalence) from the stream fields instead of ``_stream_id``, on an export parsed without
    the id: the map's field values name a stream exactly (:func:`stream_map` checked that no two
    streams share them; a missing field is the empty value), so two rows share (stream fields,
    time, rank, message) exactly when they share (stream id, time, rank, message); ``with_id``
    False: only the check. None when a row's stream is not in the map (it appeared after the map
    was taken)."""
    fields, m = smap
    if not fields:
        if m.height > 1:
            return None
        vals: list[pl.Expr] = []
    else:
        vals = [pl.col(f).fill_null("") for f in fields]
        key = pl.struct(vals).hash(seed=13)
        known = m.select(pl.struct(pl.col(f) for f in fields).hash(seed=13).alias("k"))["k"]
        if df.height and not df.select(key.is_in(known.implode()).all()).item():
            return None
    df = df.drop("_stream_id", strict=False)      # (a null column where the parse filled in the reader's fields)
    if not with_id:
        return df
    return df.with_columns(pl.struct([*vals, pl.col("_time"), pl.col("rank"), pl.col("_msg")]).hash(seed=5)
                           .alias("__id"))


def _parsed(body: bytes, keys: tuple[str, ...], full: tuple[str, ...]) -> pl.DataFrame:
    """A slice's JSON lines parsed (``keys``; ``full``'s others null) with ``_ts`` (pure Polars:
    run in the export pool, where it overlaps the reading thread's work on the previous slice)."""
    if len(body) < 4096 and not body.strip():     # (no copy of a large body)
        return pl.DataFrame(schema={**{k: pl.String for k in dict.fromkeys((*keys, *full))}, "_ts": pl.Int64})
    return with_ts(read_export(body, keys, full))


def _frame(df: pl.DataFrame, keys: tuple[str, ...], seq: int,
           split: Callable[[pl.DataFrame], pl.DataFrame] | None = None) -> pl.DataFrame:
    """A parsed slice (:func:`_parsed`) -> the reader's frame, in time order. ``text`` (the raw
    record, used for quarantine and as part of the duplicate key) is the record's JSON only for
    rows whose ``_time`` does not parse; for the others stream id, time and rank identify the line."""
    if df.height == 0:
        return df.drop("_ts")
    if split is not None:     # keep only the rows the engine needs (the rest counted/summarised by ``split``)
        df = split(df)
        if df.height == 0:
            return df.drop("_ts")
    df = df.with_columns(_tie=pl.struct("_stream_id", "_msg").hash(seed=11)).sort(["_ts", "_tie"], nulls_last=True)
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
                         workers: int = 2, plan_query: str | None = None,
                         split: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
                         select: Callable[[pl.DataFrame], tuple[pl.DataFrame, Any]] | None = None,
                         on_select: Callable[[Any], None] | None = None) -> Iterator[Any]:
    """Batches of the rows of ``query`` in ``[start, end]``, in time order. ``plan_query``: size
    the slices by the rows of this (cheaper, broader) query instead — a selective ``query``
    costs the server a scan of every message, its plain scope only a count. ``split``: called
    with each slice's parsed rows (String columns + ``_ts``), returns the rows to read on (e.g.
    ``vl_local.split_frame``'s needed rows; it counts the others), in this thread, in order.
    ``select``: the same, but pure, run in the export pool beside the parse (so it overlaps the
    other slices' exports and this thread's reading), returning (rows, anything) — the anything
    handed to ``on_select`` here, in slice order. Its rows may lack ``_stream_id`` and carry
    their identity as ``__id`` (from the stream fields, :func:`_stream_identity`): the id is
    joined onto the rows it keeps (1 M rows of 64-host chatter: a join of ~0.2 CPU-s saved for
    rows a selection mostly drops)."""
    opts = opts or ReadOptions()
    full = vl_columns(tuple(opts.host_fields))
    keys = present_fields(client, plan_query or query, start_ns, end_ns, full) or full
    q = f"{query} | fields {', '.join(keys)}"
    # the export without _stream_id, got back by a join on the stream fields (see stream_map)
    smap = stream_map(client, plan_query or query, start_ns, end_ns) if "_stream_id" in keys else None
    if smap is not None:
        lean = (*(k for k in keys if k != "_stream_id"), *(f for f in smap[0] if f not in keys))
        q_lean = f"{query} | fields {', '.join(lean)}"
    slices = plan_slices(client, plan_query or query, start_ns, end_ns, slice_rows)
    file = f"victorialogs:{client.base_url}"
    seq = 0
    order = (*dict.fromkeys((*keys, *full)), "_ts")

    # Two stages per slice, gated apart: the download (``workers`` at once: the server's share
    # of the cores) and the parse/selection (``cpu`` at once: ours). A slice whose body is in
    # waits for a CPU place without holding a download place, so the server always has the next
    # slices' exports in hand while Polars parses the earlier ones (with one gate for both, the
    # server sat idle while every in-flight slice was being parsed, and the last slice's export
    # started only after the first one was consumed).
    downloads, cpu = threading.Semaphore(max(1, workers)), threading.Semaphore(_CPU_STAGE)

    def body(query: str, lo: int, hi: int) -> bytes:
        with downloads:
            return client.query_bytes(query, lo, hi)

    def fetch(lo: int, hi: int) -> tuple[pl.DataFrame, Any]:
        # in the pool: the server exports the next slices and Polars parses (and ``select``s)
        # them (it releases the GIL) while this thread reads on the previous one
        df: pl.DataFrame | None = None
        if smap is not None:
            raw = body(q_lean, lo, hi)
            with cpu:
                df = _parsed(raw, lean, full)
                del raw
                if df.height == 0:
                    df = df.with_columns(pl.lit(None, pl.String).alias("_stream_id")).select(order)
                elif select is not None:
                    # the selection sees every row but keeps few: identity from the stream fields
                    # (only where two rows share a time: rows with distinct times are distinct
                    # lines, see vl_local.split_frame), the id joined onto the kept rows only
                    got = (_stream_identity(df, smap, True) if opts.dedupe and df["_ts"].n_unique() < df.height
                           else df.drop("_stream_id", strict=False))
                    if got is not None:
                        rows, extra = select(got)
                        if rows.height == 0:
                            return rows.with_columns(pl.lit(None, pl.String).alias("_stream_id")).select(order), extra
                        ided = _with_stream_ids(rows, smap, order)
                        if ided is not None:
                            return ided, extra
                    # a row whose stream the map lacks (it appeared after the map was taken):
                    # the slice exported again with _stream_id
                    df = None
                else:
                    df = _with_stream_ids(df, smap, order)
        if df is None:
            raw = body(q, lo, hi)
            with cpu:
                df = _parsed(raw, keys, full).select(order)
                del raw
                if select is not None:
                    return select(df)
        return df, None

    # up to ``ahead`` slices in flight (bodies and parsed frames held: memory ~ ahead x slice):
    # with ``select`` (replay) the downloads and the selections each have their full share; without
    # it (the watcher's re-reads, selected in this thread) as before, one slice beyond the downloads
    ahead = max(1, workers) + (_CPU_STAGE if select is not None else 1)
    with ThreadPoolExecutor(max_workers=ahead) as pool:
        futures: list[Future[tuple[pl.DataFrame, Any]] | None] = [pool.submit(fetch, lo, hi)
                                                                  for lo, hi in slices[:ahead]]
        nxt = len(futures)
        i = 0
        while i < len(futures):
            fut = futures[i]
            assert fut is not None
            try:
                parsed, extra = fut.result()
            except VictoriaLogsError:
                for f in futures[i + 1:]:
                    if f is not None:
                        f.cancel()
                raise
            if nxt < len(slices):
                futures.append(pool.submit(fetch, *slices[nxt]))
                nxt += 1
            futures[i] = None    # free the slice
            i += 1
            if on_select is not None:
                on_select(extra)
            df = _frame(parsed, keys, seq, split)
            del parsed
            if df.height == 0:
                continue
            batch = events_from_vl_frame(df, opts, seq_start=seq, file=file)
            seq += df.height
            yield batch


# per (host, job, time bucket): rows, first and last _time (ns), as the server counted them
COUNT_SCHEMA = {"host": pl.String, "job_id": pl.String, "bucket": pl.Int64, "lines": pl.Int64,
                "first": pl.Int64, "last": pl.Int64, "duplicates": pl.Int64}


def logsql_field(name: str) -> str:
    """A field name as LogsQL text (quoted: names such as ``host.name`` or ``_HOSTNAME``)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line_counts(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int, bucket_ns: int,
                opts: ReadOptions | None = None, slices: list[tuple[int, int]] | None = None,
                workers: int = 2) -> pl.DataFrame:
    """Rows of ``query`` in ``[start, end]`` counted by the server per (host, job, ``bucket_ns``
    bucket of ``_time``), with the first and last ``_time`` of each group (:data:`COUNT_SCHEMA`).

    One ``stats by (<host fields>, <job fields>, _time:BUCKET) count(), min(_time), max(_time)``
    per time slice (``slices``; default one), ``workers`` at once: the server answers it from its
    columns without sending a row. Host and job are resolved as the row readers resolve them
    (first non-empty host field, short host name; first non-empty job field; ``opts.host`` /
    ``opts.job`` override), so these counts are what :func:`events_from_vl_frame` would count
    for the same rows. ``lines`` leaves out rows the readers drop as duplicates (same
    ``_stream_id``, ``_time``, ``rank`` and ``_msg``; ``opts.dedupe``), ``duplicates`` counts them."""
    opts = opts or ReadOptions()
    host_fields, job_fields = tuple(opts.host_fields), tuple(VL_JOB_FIELDS)
    fields = list(dict.fromkeys((*host_fields, *job_fields)))
    by = ", ".join([*(logsql_field(f) for f in fields), f"_time:{int(bucket_ns)}ns"])
    # the readers drop a row seen twice (same stream, time, rank and message: a shipper that
    # re-sent); count_uniq over that identity counts what they keep, count() what the server has
    uniq = "count_uniq(_stream_id, _time, rank, _msg)" if opts.dedupe else "count()"
    q = f"{query} | stats by ({by}) count() as __all, {uniq} as __n, min(_time) as __t0, max(_time) as __t1"
    parts = slices or [(start_ns, end_ns)]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        bodies = list(pool.map(lambda lh: client.query_bytes(q, lh[0], lh[1]), parts))
    schema = {**{f: pl.String for f in fields}, "_time": pl.String, "__all": pl.String, "__n": pl.String,
              "__t0": pl.String, "__t1": pl.String}
    frames = [pl.read_ndjson(io.BytesIO(b), schema=schema) for b in bodies if b.strip()]
    if not frames:
        return pl.DataFrame(schema=COUNT_SCHEMA)
    df = pl.concat(frames)

    def first(names: tuple[str, ...]) -> pl.Expr:
        return pl.coalesce([pl.when(pl.col(f) != "").then(pl.col(f)) for f in names])

    host = pl.lit(opts.host) if opts.host is not None else short_host(first(host_fields))
    job = pl.lit(opts.job) if opts.job is not None else first(job_fields)
    out = df.select(host.cast(pl.String).alias("host"), job.cast(pl.String).alias("job_id"),
                    rfc3339_to_ns_expr(pl.col("_time")).alias("bucket"),
                    pl.col("__n").cast(pl.Int64).alias("lines"),
                    (pl.col("__all").cast(pl.Int64) - pl.col("__n").cast(pl.Int64)).alias("duplicates"),
                    rfc3339_to_ns_expr(pl.col("__t0")).alias("first"), rfc3339_to_ns_expr(pl.col("__t1")).alias("last"))
    bad = out.filter(pl.any_horizontal(pl.col("bucket", "lines", "first", "last").is_null()))
    if bad.height:
        raise VictoriaLogsError("VictoriaLogs stats answer has rows without a count or time", query=q,
                                server_message=str(bad.head(3).to_dicts())[:300])
    return out.group_by(["host", "job_id", "bucket"]).agg(pl.col("lines").sum(), pl.col("first").min(),
                                                          pl.col("last").max(), pl.col("duplicates").sum())
