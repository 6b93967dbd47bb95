"""Many files parsed as one frame (read_many) give exactly what reading each file alone gives."""

from __future__ import annotations

import os
from dataclasses import replace

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.sources.files import iter_batches
from recovery_logs.sources.read_common import Deduper, ReadOptions
from recovery_logs.sources.read_many import WholeFile, parse_many
from recovery_logs.sources.read_text import TextParser

from .conftest import FIX

FILES = [
    (FIX / "nodes" / "gpu-n01" / "kern.log", "syslog"),
    (FIX / "job-184470" / "gpu-n03.out", "job"),
    (FIX / "slurm-184471.out", "job"),
    (FIX / "gpu-n02.dmesg.log", "dmesg"),
    (FIX / "gpu-n03.dmesg_T.log", "dmesg"),
    (FIX / "vl_dataset_small.jsonl", "vl-jsonl"),
    (FIX / "gpu-jd1.journal.json", "journald"),
    (FIX / "gpu-jd2.journal.json", "journald"),
]
DATA = {str(p): p.read_bytes() for p, _ in FILES}
MTIME = {str(p): os.stat(p).st_mtime_ns for p, _ in FILES}


def _one_by_one(files: list[WholeFile], opts: ReadOptions) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    dedup, seq, evs, qs, stats = Deduper(enabled=opts.dedupe), 10, [], [], {}
    for f in files:
        tp = TextParser(f.path, opts, f.fmt, seq, dedup=dedup, mtime_ns=f.mtime_ns)
        if f.fmt == "dmesg" and opts.boot_time_ns is None:
            from recovery_logs.sources.read_many import _boot_estimate
            tp.set_boot_time(_boot_estimate(f.data, f.mtime_ns), inferred=True)
        b = tp.feed(f.data, final=True)
        evs.append(b.events)
        qs.append(b.quarantine)
        for k, v in b.stats.items():
            stats[k] = stats.get(k, 0) + v
        seq = tp.next_seq
    return pl.concat(evs), pl.concat(qs), stats


def _check(files: list[WholeFile], opts: ReadOptions) -> None:
    ev_ref, q_ref, st_ref = _one_by_one(files, opts)
    b, nxt = parse_many(files, opts, 10, Deduper(enabled=opts.dedupe))
    assert_frame_equal(b.events, ev_ref)
    assert nxt == 10 + ev_ref.height
    key = ["file", "line", "reason", "raw"]
    assert_frame_equal(b.quarantine.sort(key), q_ref.sort(key))
    st = {k: v for k, v in b.stats.items() if k != "files" and v}
    assert st == {k: v for k, v in st_ref.items() if v}


def test_every_fixture_file_together_equals_each_alone():
    files = [WholeFile(str(p), DATA[str(p)], MTIME[str(p)], fmt) for p, fmt in FILES]
    _check(files, ReadOptions(year=2026))
    _check(files, ReadOptions())                                  # year and dmesg boot from the mtime
    _check(files, ReadOptions(year=2026, boot_time_ns=1_795_948_020_000_000_000, host="h9", job="77"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks=st.lists(st.sampled_from(range(len(FILES))), min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 4000), min_size=6, max_size=6),
       junk=st.lists(st.binary(max_size=40), min_size=6, max_size=6))
def test_any_files_cut_and_spliced_together_equal_each_alone(picks, cuts, junk):
    """Random subsets, truncations and byte garbage (invalid UTF-8, blank lines, bare CRs) per file."""
    files = []
    for i, (k, c, j) in enumerate(zip(picks, cuts, junk, strict=False)):
        p, fmt = FILES[k]
        d = DATA[str(p)]
        d = d[: len(d) * c // 4000] + j + d[len(d) * c // 4000:]
        files.append(WholeFile(f"{p.parent}/{i}-{p.name}", d, MTIME[str(p)], fmt))
    _check(files, ReadOptions(year=2026))


def test_multiline_records_never_cross_files(tmp_path):
    a = b"Traceback (most recent call last):\n  File \"x.py\", line 1\n"
    b = b"  continued?\nRuntimeError: boom\n"
    files = [WholeFile(str(tmp_path / "job-1/n1.out"), a, 1, "job"), WholeFile(str(tmp_path / "job-1/n2.out"), b, 1, "job")]
    batch, _ = parse_many(files, ReadOptions(year=2026), 0, Deduper())
    ev = batch.events.sort("seq")
    assert ev["file"].to_list() == [files[0].path, files[1].path, files[1].path]
    assert ev["host"].to_list() == ["n1", "n2", "n2"]
    _check(files, ReadOptions(year=2026))


def test_groups_parsed_ahead_give_the_same_batches(tmp_path):
    """``ReadOptions.parse_ahead``: groups parsed in the parse thread and finished in order give the
    same batches (events, seq, quarantine, stats) as parsing each group in turn, over many groups,
    with duplicates across groups, an unreadable file and a large (streamed) file between them."""
    root = tmp_path / "logs"
    for p, _ in FILES:
        for n in range(3):
            dst = root / f"copy{n}" / p.relative_to(FIX)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(DATA[str(p)])      # the same lines again: duplicates across groups
    (root / "copy1" / "gpu-n08.log.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"not a deflate stream" * 50)   # unreadable
    big = root / "copy2" / "big" / "gpu-n09.out"
    big.parent.mkdir(parents=True)
    big.write_text("".join(f"[rank0]: step {i} loss 1.0\n" for i in range(40_000)))   # over one chunk: streamed
    opts = ReadOptions(year=2026, batch_lines=500)   # 80 KB groups: many of them

    def read(ahead: bool) -> list:
        return list(iter_batches([root], replace(opts, parse_ahead=ahead)))

    a, b = read(False), read(True)
    assert len(a) == len(b) > 5
    for x, y in zip(a, b, strict=True):
        assert_frame_equal(x.events, y.events)
        assert_frame_equal(x.quarantine, y.quarantine)
        assert x.stats == y.stats
    assert sum(x.stats["duplicates"] for x in a) > 0 and sum(x.stats["unreadable"] for x in a) == 1


def test_files_with_and_without_a_last_newline_equal_each_alone():
    """The last line's "\\n" is not cut off the bytes: the empty piece after it is dropped instead."""
    line = b"Nov 29 10:00:00 gpu-n01 kernel: [1.0] eth0: link up"
    datas = [b"", b"\n", b"\n\n", line, line + b"\n", line + b"\r\n", line + b"\n" + line, line + b"\n\n", b"\r\n"]
    files = [WholeFile(f"n{i}/kern.log", d, 1_795_948_020_000_000_000, "syslog") for i, d in enumerate(datas)]
    _check(files, ReadOptions(year=2026))


def test_a_small_file_that_grew_after_its_stat_is_read_whole(tmp_path, monkeypatch):
    """A small file is read in one call of its stat size + 1; if it is longer by then, the rest is
    read as before (up to the small-file limit)."""
    from recovery_logs.sources import files as files_mod

    p = tmp_path / "nodes" / "gpu-n01" / "kern.log"
    p.parent.mkdir(parents=True)
    lines = [f"Nov 29 10:{i // 60:02d}:{i % 60:02d} gpu-n01 kernel: [{i}.0] eth0: link up {'x' * 40}" for i in range(3000)]
    p.write_text("\n".join(lines) + "\n")
    want = pl.concat([b.events for b in iter_batches([p], ReadOptions(year=2026))])
    size = p.stat().st_size
    assert 2 * 65536 < size < 8 << 20       # half of it is still above the detection head: read in one call
    real = os.stat

    class Shorter:
        def __init__(self, st: os.stat_result) -> None:
            self._st = st
            self.st_size = st.st_size // 2      # the file "grew" by half between the stat and the read

        def __getattr__(self, name: str):
            return getattr(self._st, name)

    monkeypatch.setattr(files_mod.os, "stat", lambda f, *a, **k: Shorter(real(f, *a, **k)) if str(f) == str(p)
                        else real(f, *a, **k))
    got = pl.concat([b.events for b in iter_batches([p], ReadOptions(year=2026))])
    assert got.height == len(lines)
    assert_frame_equal(got, want)
