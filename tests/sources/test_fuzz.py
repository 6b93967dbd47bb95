"""Garbage in any format never crashes a reader: every line ends up an event or in quarantine."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery_logs.errors import InputError
from recovery_logs.schema import check_events
from recovery_logs.sources.files import ReadOptions
from recovery_logs.sources.read_text import TextParser

PIECES = [b"Nov 29 14:06:00 gpu-n01 kernel: ", b"<4>1 2026-11-29T14:06:00.1Z h k - - - ", b"[12.5] ", b"[rank3]:",
          b"[Sun Nov 29 14:06:00 2026] ", b"E1129 14:06:00.000001 1 a.py:1] ", b"Traceback (most recent call last):",
          b"  File", b"ValueError: x", b"NVRM: ", b"NVRM: (PCI", b'{"_time":"2026-11-29T14:06:00Z","_msg":"m"}',
          b'{"__REALTIME_TIMESTAMP":"1","MESSAGE":[104,105]}', b"{", b"\xff\xfe", b"\r", b" ", b"\n", b"\n\n",
          b"Feb 30 25:61:61 h p: ", b"3: ", b"gpu-n9:1:2 [0] NCCL WARN "]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["syslog", "dmesg", "job", "vl-jsonl", "journald", None]),
       parts=st.lists(st.sampled_from(PIECES) | st.binary(max_size=20), max_size=60),
       cut=st.integers(0, 2000))
def test_garbage_never_crashes(fmt, parts, cut):
    data = b"".join(parts)
    tp = TextParser("fuzz/gpu-n01.log", ReadOptions(year=2026, boot_time_ns=0), fmt, mtime_ns=0)
    if fmt is None and data[:4] == b"PAR1":    # Parquet's magic: a clear error naming the file, not a text read
        with pytest.raises(InputError, match="not a text stream"):
            [tp.feed(data[:cut]), tp.feed(data[cut:]), tp.flush()]
        return
    batches = [tp.feed(data[:cut]), tp.feed(data[cut:]), tp.flush()]
    ev = pl.concat([b.events for b in batches])
    check_events(ev)
    assert ev["seq"].to_list() == list(range(ev.height))
    assert ev["time"].null_count() == 0
    lines = sum(b.stats["lines"] for b in batches)
    assert lines == (data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1))
