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
