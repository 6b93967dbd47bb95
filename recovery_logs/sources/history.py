"""Lossless paging of VictoriaLogs ``/query`` by time: the watch rebuild and ``replay --source
victorialogs://...`` read history through it.

``history_rows`` yields pages of rows over ``[start, end]`` in ``_time`` order, each row exactly
once (ties at a page boundary are resolved by row key); ``history_batches`` turns them into
event ``Batch``es with ``line`` = the row's position in the whole read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from recovery_logs.errors import ConfigError
from recovery_logs.sources.files import events_from_vl_records
from recovery_logs.sources.formats import vl_columns
from recovery_logs.sources.read_common import Batch, ReadOptions
from recovery_logs.sources.rowkeys import record_key
from recovery_logs.sources.victorialogs import VictoriaLogsClient

__all__ = ["history_batches", "history_rows"]


def history_rows(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                 page_size: int = 50_000, fields: Sequence[str] | None = None) -> Iterator[list[dict[str, str]]]:
    """Pages of rows over ``[start_ns, end_ns]`` in ``_time`` order, each row exactly once.

    Each page is ``{query} | sort by (_time) | limit N`` from the last page's last timestamp
    (inclusive); rows at that timestamp already returned are skipped by key. A page made only
    of one timestamp is completed by reading that single timestamp without a limit.
    """
    if page_size < 1:
        raise ConfigError("page_size must be >= 1", value=page_size)
    proj = f" | fields {', '.join(fields)}" if fields else ""
    cur = start_ns
    seen_at_cur: set[tuple[str, int, bytes]] = set()
    while cur <= end_ns:
        rows = list(client.query(f"{query}{proj} | sort by (_time) | limit {page_size}", start=cur, end=end_ns))
        keyed = [(record_key(r), r) for r in rows]
        fresh = [(k, r) for k, r in keyed if k not in seen_at_cur]
        if len(rows) < page_size:
            if fresh:
                yield [r for _, r in fresh]
            return
        last_t = keyed[-1][0][1]
        if keyed[0][0][1] == last_t:   # the whole page is one timestamp: read it whole, move past it
            whole = list(client.query(f"{query}{proj}", start=last_t, end=last_t))
            extra = [r for r in whole if record_key(r) not in seen_at_cur]
            if extra:
                yield extra
            cur, seen_at_cur = last_t + 1, set()
            continue
        if fresh:
            yield [r for _, r in fresh]
        seen_at_cur = {k for k, _ in keyed if k[1] == last_t}   # last_t > cur here: a page spans >1 time
        cur = last_t


def history_batches(base_url: str, query: str, start_ns: int, end_ns: int, opts: ReadOptions | None = None,
                    page_size: int = 50_000, client: VictoriaLogsClient | None = None) -> Iterator[Batch]:
    """``replay --source victorialogs://...``: Batches (sources.files.Batch) over a time range,
    read losslessly by paging ``/query`` in ``_time`` order."""

    opts = opts or ReadOptions()
    c = client or VictoriaLogsClient(base_url)
    fields = list(vl_columns(tuple(getattr(opts, "host_fields", ("host", "hostname", "host.name", "_HOSTNAME")))))
    seq = 0
    for rows in history_rows(c, query, start_ns, end_ns, page_size, fields):
        batch = events_from_vl_records(rows, opts, seq_start=seq, file=f"victorialogs:{c.base_url}")
        if seq:   # `line` is the row's position in the whole read, as in one big export
            batch.events = batch.events.with_columns(line=batch.events["line"] + seq)
            if batch.quarantine.height:
                batch.quarantine = batch.quarantine.with_columns(line=batch.quarantine["line"] + seq)
        seq += len(rows)
        yield batch
