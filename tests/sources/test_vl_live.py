"""VLPoller bookkeeping that needs no server (the reads themselves: tests/integration/victorialogs)."""

from __future__ import annotations

from recovery_logs.sources.vl_live import VLPoller

NS = 1_000_000_000


class _NoServer:
    """A client the poller must not call (the live read is not due, reconciliation is off)."""

    reached = True

    def __getattr__(self, name):
        raise AssertionError(f"unexpected call to the server: {name}")


def test_buckets_given_up_on_are_forgotten_past_the_horizon():
    now = 10_000 * NS
    p = VLPoller(_NoServer(), "*", horizon_s=600, reconcile=False, clock=lambda: now, resume_from_ns=now - 2 * NS)
    p._next_live = now + NS           # the live read is not due: poll() only keeps its books
    p._dirty = {now - 700 * NS: 6, now - 603 * NS: 6, now - 30 * NS: 2}   # horizon: complete - 600 s
    assert p.poll() == []
    assert p._dirty == {now - 30 * NS: 2}      # within the horizon a short bucket is still retried


def test_count_store_is_held_compact_and_reads_back_the_same():
    """The per-bucket counts are held with categorical kind/host/job and Int32 counts: the
    consolidated store reads back as the plain sums, in 48 bytes a row (a plain row: 64 and more,
    88 measured in a soak, where strings past 12 bytes live outside their views)."""
    import polars as pl
    from polars.testing import assert_frame_equal

    from recovery_logs.sources.vl_live import _STORE_SCHEMA, _held, _plain

    def part(k: int) -> pl.DataFrame:
        n = 6000
        return pl.DataFrame({"fb": [i // 200 for i in range(n)], "kind": ["" if i % 3 else "progress.step_loss"
                                                                        for i in range(n)],
                             "host": [f"gpu-n{i % 64}" for i in range(n)], "job_id": ["184499"] * n,
                             "step": [None if i % 3 else i // 8 for i in range(n)], "lines": [k + i % 5 for i in range(n)],
                             "first": [i * 1000 + k for i in range(n)], "last": [i * 1000 + 500 + k for i in range(n)]},
                            schema=_STORE_SCHEMA)

    p = VLPoller(_NoServer(), "*", reconcile=False)
    parts = [part(k) for k in range(3)]
    p._store_parts = [_held(x) for x in parts[:2]]
    p._consolidate()
    # later parts: newer buckets and (a re-read) buckets the store has; only those are summed again
    parts.append(part(3).with_columns(pl.col("fb") + 5))
    p._store_parts = [_held(parts[2]), _held(parts[3])]
    p._consolidate()
    key = ["fb", "kind", "host", "job_id", "step"]
    want = pl.concat(parts).group_by(key).agg(pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max())
    assert dict(p._store.schema)["host"] == pl.Categorical() and p._store.schema["lines"] == pl.Int32()
    assert_frame_equal(_plain(p._store).sort(key), want.select(list(_STORE_SCHEMA)).sort(key))
    assert p._store.estimated_size() <= 49 * p._store.height < want.estimated_size()
    # buckets past store_s are cut once they are half a minute's worth (each cut copies the store)
    fine = p.ledger.bucket_ns
    p.complete_ns = p.store_ns + 10 * fine       # 10 buckets past store_s: kept for now
    p._consolidate()
    assert p._store.height == want.height
    p.complete_ns = p.store_ns + 20 * fine       # 20 past, more than 30 s (15 buckets): cut to the 20th on
    p._consolidate()
    assert p._store["fb"].min() == 20
    assert_frame_equal(_plain(p._store).sort(key), want.filter(pl.col("fb") >= 20).select(list(_STORE_SCHEMA)).sort(key))
