"""Identity of a VictoriaLogs row and bounded-memory deduplication of rows seen twice.

* :func:`vl_time_ns` — ``_time`` text (0-9 fraction digits, Z) to integer nanoseconds.
* :func:`record_key` — ``(stream id, _time ns, 8-byte hash of _msg)``: the same row read by the
  live tail, a catch-up query and a reconnect's replay gets the same key.
* :class:`SeenKeys` — remembers keys in one-second buckets, bounded by ``max_keys``.
"""

from __future__ import annotations

import calendar
import hashlib

from recovery_logs.timeutil import NS

__all__ = ["SeenKeys", "record_key", "vl_time_ns"]


_SEC_CACHE: dict[str, int] = {}


def vl_time_ns(text: str) -> int:
    """``2026-11-29T14:06:00.123456789Z`` (0-9 fraction digits, Z) -> integer ns. ValueError if not."""
    head = text[:19]
    sec = _SEC_CACHE.get(head)
    if sec is None:
        if len(text) < 20 or text[-1] not in "Zz" or text[4] != "-" or text[10] not in "Tt ":
            raise ValueError(f"not a VictoriaLogs _time: {text!r}")
        try:
            sec = calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                                   int(text[14:16]), int(text[17:19]), 0, 0, 0))
        except ValueError as exc:
            raise ValueError(f"not a VictoriaLogs _time: {text!r}") from exc
        if len(_SEC_CACHE) > 4096:
            _SEC_CACHE.clear()
        _SEC_CACHE[head] = sec
    frac = text[20:-1] if len(text) > 20 and text[19] == "." else ""
    if len(text) > 20 and text[19] != ".":
        raise ValueError(f"not a VictoriaLogs _time: {text!r}")
    if frac and (len(frac) > 9 or not frac.isdigit()):
        raise ValueError(f"not a VictoriaLogs _time: {text!r}")
    return sec * NS + (int(frac.ljust(9, "0")) if frac else 0)


def record_key(row: dict[str, str]) -> tuple[str, int, bytes]:
    """Identity of a row: (stream id, _time ns, 8-byte hash of _msg). Time -1 when unparseable."""
    sid = row.get("_stream_id") or row.get("_stream") or ""
    try:
        t = vl_time_ns(row.get("_time", ""))
    except ValueError:
        t = -1
    h = hashlib.blake2b(row.get("_msg", "").encode("utf-8", "replace"), digest_size=8).digest()
    return (sid, t, h)


class SeenKeys:
    """Remembers row keys in one-second buckets. ``evict_before(t)`` forgets keys older than
    ``t``; above ``max_keys`` the oldest buckets are dropped (counted in ``forced``), so memory
    is bounded whatever the input."""

    def __init__(self, max_keys: int = 2_000_000, bucket_ns: int = NS) -> None:
        self.max_keys = max_keys
        self.bucket_ns = bucket_ns
        self._buckets: dict[int, set[tuple[str, int, bytes]]] = {}
        self._size = 0
        self.forced = 0

    def __len__(self) -> int:
        return self._size

    def add(self, key: tuple[str, int, bytes]) -> bool:
        """True if the key is new (and remembers it), False for a duplicate."""
        b = key[1] // self.bucket_ns
        bucket = self._buckets.get(b)
        if bucket is None:
            bucket = self._buckets[b] = set()
        elif key in bucket:
            return False
        bucket.add(key)
        self._size += 1
        if self._size > self.max_keys:
            oldest = min(self._buckets)
            self._size -= len(self._buckets.pop(oldest))
            self.forced += 1
        return True

    def evict_before(self, t_ns: int) -> int:
        limit = t_ns // self.bucket_ns
        old = [b for b in self._buckets if b < limit]
        n = 0
        for b in old:
            n += len(self._buckets.pop(b))
        self._size -= n
        return n
