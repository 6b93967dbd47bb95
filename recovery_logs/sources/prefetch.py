"""Read ahead: a batch iterator driven in a background thread, a bounded number of batches ahead.

The read (split, header parse, grouping, dedupe) and the engine's work on a batch (rule matching,
windows) are each about half of a replay's CPU, and both are mostly Polars operations that release
the GIL. ``prefetch(batches, depth)`` lets the reader parse batch *n + 1* while the consumer
matches batch *n*: on a machine with a free core the two overlap.

Contract:

* the consumer sees exactly the items of ``batches``, in the same order (the iterator is driven by
  one thread only, so its state — the reader's dedupe memory, ``seq`` — advances as before);
* at most ``depth`` items are held ahead of the consumer (memory: ``depth`` batches more);
* an exception raised by ``batches`` is re-raised in the consumer, at the position it occurred
  (the items before it are delivered first);
* closing the returned generator early (the consumer stops, or raises) stops the thread: it
  finishes the item it is producing, drops it, and closes ``batches``.

``depth=0`` returns ``batches`` itself (no thread).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["prefetch"]

T = TypeVar("T")

_DONE = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetch(batches: Iterable[T], depth: int = 1) -> Iterator[T]:
    """``batches``' items, produced in a background thread up to ``depth`` ahead (module docstring)."""
    if depth < 0:
        raise ValueError(f"prefetch: depth must be >= 0, got {depth}")
    if depth == 0:
        return iter(batches)
    return _prefetched(iter(batches), depth)


def _prefetched(it: Iterator[T], depth: int) -> Iterator[T]:
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in it:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:   # handed to the consumer, raised there
            put(_Raised(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None and stop.is_set():
                close()

    th = threading.Thread(target=run, name="recovery-logs-prefetch", daemon=True)
    th.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item   # type: ignore[misc]  # the queue holds T, _DONE and _Raised
    finally:
        stop.set()
        th.join()
