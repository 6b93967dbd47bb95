"""TextParser gives the same events as read_paths over any split of the bytes; seq continuity."""

from __future__ import annotations

import os

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.sources.files import ReadOptions, iter_batches, read_paths
from recovery_logs.sources.read_text import TextParser

from .conftest import FIX

FILES = [
    (FIX / "nodes" / "gpu-n01" / "kern.log", "syslog"),
    (FIX / "job-184470" / "gpu-n03.out", "job"),
    (FIX / "slurm-184471.out", "job"),
    (FIX / "gpu-n02.dmesg.log", "dmesg"),
    (FIX / "vl_dataset_small.jsonl", "vl-jsonl"),
    (FIX / "gpu-jd1.journal.json", "journald"),
    (FIX / "gpu-jd2.journal.json", "journald"),
]
OPTS = ReadOptions(year=2026, boot_time_ns=1_795_948_020_000_000_000)
DATA = {p: p.read_bytes() for p, _ in FILES}


def _by_parser(path, fmt, cuts) -> tuple[pl.DataFrame, pl.DataFrame]:
    data = DATA[path]
    tp = TextParser(str(path), OPTS, fmt)
    evs, qs, pos = [], [], 0
    for c in [*sorted(cuts), len(data)]:
        b = tp.feed(data[pos:c])
        evs.append(b.events)
        qs.append(b.quarantine)
        pos = c
    b = tp.flush()
    return pl.concat([*evs, b.events]), pl.concat([*qs, b.quarantine])


REFERENCE = {p: read_paths([p], ReadOptions(**{**OPTS.__dict__, "fmt": f})) for p, f in FILES}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=st.integers(0, len(FILES) - 1), fracs=st.lists(st.floats(0, 1), max_size=8))
def test_any_split_gives_the_same_events_as_read_paths(idx, fracs):
    path, fmt = FILES[idx]
    n = len(DATA[path])
    cuts = [int(f * n) for f in fracs]
    events, quar = _by_parser(path, fmt, cuts)
    ref = REFERENCE[path]
    assert_frame_equal(events.sort("seq"), ref.events.sort("seq"))
    assert_frame_equal(quar.sort("line", "reason"), ref.quarantine.sort("line", "reason"))


def test_byte_at_a_time_job_file():
    path, fmt = FILES[1]
    events, _ = _by_parser(path, fmt, list(range(len(DATA[path]))))
    assert_frame_equal(events, REFERENCE[path].events.sort("seq"))


def test_seq_continues_across_batches_and_files():
    paths = [FIX / "nodes" / "gpu-n01" / "kern.log", FIX / "job-184470" / "gpu-n03.out", FIX / "vl_dataset_small.jsonl"]
    seqs, nbatches = [], 0
    for b in iter_batches(paths, ReadOptions(year=2026, batch_lines=1), seq_start=100):
        seqs.extend(b.events["seq"].to_list())
        nbatches += 1
    assert seqs == list(range(100, 100 + len(seqs)))
    assert len(seqs) == 9 + 9 + 50
    assert nbatches == 1   # small files are read whole and parsed together (read_many)


def test_iter_batches_reads_large_files_in_bounded_chunks(tmp_path):
    p = tmp_path / "gpu-n01.kern.log"
    with open(p, "w") as f:
        for i in range(60_000):
            f.write(f"Nov 29 14:{i // 3600 % 60:02d}:{i // 60 % 60:02d} gpu-n01 kernel: message number {i}\n")
    batches = list(iter_batches([p], ReadOptions(year=2026, batch_lines=1000), seq_start=7))
    sizes = [b.events.height for b in batches]
    assert sum(sizes) == 60_000
    assert max(sizes) < 10_000          # never the whole file in one batch
    seqs = [s for b in batches for s in b.events["seq"].to_list()]
    assert seqs == list(range(7, 7 + 60_000))   # seq continues across the chunks of one file


def _long_job_file() -> bytes:
    out = []
    for i in range(2600):
        r = i % 4
        if i % 97 == 0:
            out += [f"[rank{r}]: Traceback (most recent call last):", f'[rank{r}]:   File "t.py", line {i}, in f',
                    f"[rank{(r + 1) % 4}]: step {i} loss 1.0", f"[rank{r}]:     g()", f"[rank{r}]: ValueError: v{i}"]
        elif i % 131 == 0:
            out += [f"I1129 14:{i // 60 % 60:02d}:{i % 60:02d}.000000 1 x.py:1] tick {i}", "    detail a", "",
                    "    not joined after blank"]
        else:
            out.append(f"[rank{r}]: step {i} loss 1.0")
    return ("\n".join(out) + "\n").encode()


LONG = _long_job_file()
LONG_EXAMPLES = int(os.environ.get("LONG_EXAMPLES", "8"))   # raise for a deeper local run


@settings(max_examples=LONG_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fracs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_any_split_of_a_long_file_with_carried_records(fracs, tmp_path_factory):
    p = tmp_path_factory.mktemp("long") / "job-5.out"
    p.write_bytes(LONG)
    ref = read_paths([p], ReadOptions(year=2026))
    tp = TextParser(str(p), ReadOptions(year=2026), "job")
    evs, pos = [], 0
    for c in [*sorted(int(f * len(LONG)) for f in fracs), len(LONG)]:
        evs.append(tp.feed(LONG[pos:c]).events)
        pos = c
    evs.append(tp.flush().events)
    got = pl.concat(evs)
    assert_frame_equal(got.sort("seq"), ref.events.sort("seq"))
    tb = got.filter(pl.col("message").str.starts_with("Traceback"))
    want = [f'Traceback (most recent call last):\n  File "t.py", line {i}, in f\n    g()\nValueError: v{i}'
            for i in range(0, 2600, 97)]
    assert tb["message"].to_list() == want
    ticks = got.filter(pl.col("message").str.contains("tick"))["message"].to_list()
    assert ticks[0] == "I1129 14:02:11.000000 1 x.py:1] tick 131\n    detail a"


def test_feed_holds_only_the_open_record_and_drain_emits_it(tmp_path):
    p = tmp_path / "gpu-n01.kern.log"
    tp = TextParser(str(p), ReadOptions(year=2026), "syslog")
    b1 = tp.feed(b"Nov 29 14:06:00 gpu-n01 kernel: one\nNov 29 14:06:01 gpu-n01 kernel: NVRM: The NVIDIA GPU 0\n"
                 b"Nov 29 14:06:01 gpu-n01 kernel: NVRM: (PCI ID: 10de:2330) installed in this system has\nNov 29 14:0")
    assert b1.events["message"].to_list() == ["one"]          # the NVRM record may still continue
    b2 = tp.drain()
    assert b2.events["message"].to_list() == ["NVRM: The NVIDIA GPU 0\nNVRM: (PCI ID: 10de:2330) installed in this "
                                              "system has"]
    b3 = tp.feed(b"6:02 gpu-n01 kernel: two\n")
    b4 = tp.flush()
    assert pl.concat([b3.events, b4.events])["message"].to_list() == ["two"]
    assert [b.events["seq"].to_list() for b in (b1, b2)] == [[0], [1]]


def test_auto_format_parser_equals_read_paths():
    path = FILES[1][0]
    tp = TextParser(str(path), OPTS)
    evs = [tp.feed(DATA[path][:100]).events, tp.feed(DATA[path][100:]).events, tp.flush().events]
    assert_frame_equal(pl.concat(evs), REFERENCE[path].events.sort("seq"))


def test_feeding_after_flush_continues_lines_and_seq(tmp_path):
    tp = TextParser(str(tmp_path / "gpu-n01.kern.log"), ReadOptions(year=2026), "syslog")
    a = tp.feed(b"Nov 29 14:06:00 gpu-n01 kernel: one\n")
    b = tp.flush()
    c = tp.feed(b"Nov 29 14:06:01 gpu-n01 kernel: two\n")
    d = tp.flush()
    ev = pl.concat([x.events for x in (a, b, c, d)])
    assert ev.select("line", "seq", "message").rows() == [(1, 0, "one"), (2, 1, "two")]


def test_text_parser_refuses_parquet_content(tmp_path):
    import pytest

    from recovery_logs.errors import InputError
    tp = TextParser(str(tmp_path / "e.parquet"), ReadOptions())
    with pytest.raises(InputError, match="not a text stream"):
        tp.feed(b"PAR1" + b"\x00" * 70000)
