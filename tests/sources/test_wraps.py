"""Hard-wrapped pastes (issue 13, "a line wrapped in the middle of SeqNum=..."): a log copied out of a terminal's
scrollback keeps the terminal's wrap; the readers join the pieces back (``formats.wrap_widths``/``join_wraps``)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from recovery_logs.analysis.corpus_eval import CorpusReplay, Excerpt, excerpt_file, run_excerpt
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.formats import WrapWidth, join_wraps, wrap_widths
from recovery_logs.sources.read_common import Deduper
from recovery_logs.sources.read_many import WholeFile, parse_many
from recovery_logs.sources.read_text import DETECT_BYTES, TextParser

# PyTorch ProcessGroupNCCL's watchdog line as open-r1 #620 shows it, pasted from a terminal 137 columns wide
WATCHDOG = [
    "[rank2]:[E424 01:11:21.160832730 ProcessGroupNCCL.cpp:629] [Rank 2] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for "
    "1800010 milliseconds before timing out.",
    "[rank3]:[E424 01:11:21.160815008 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for "
    "1800011 milliseconds before timing out.",
]


def _wrap(lines: list[str], width: int) -> list[str]:
    return [ln[k:k + width] for ln in lines for k in range(0, len(ln), width)]


def _frame(lines: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"lineno": list(range(1, len(lines) + 1)), "text": lines})


def test_a_terminal_wrapped_paste_is_joined_back_into_its_lines():
    for width in (80, 100, 137):
        df = _frame(_wrap(WATCHDOG, width))
        w = wrap_widths(df)
        assert set(w) == {0} and w[0].width == width
        out = join_wraps(df, w)
        assert out["text"].to_list() == WATCHDOG
        assert out["lineno"].to_list() == [1, 1 + len(_wrap(WATCHDOG[:1], width))]


def test_one_long_line_or_a_cut_outside_a_word_is_no_wrap():
    cut = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, Time"
    lines = ["Traceback (most recent call last):", cut, "out(ms)=600000) ran for 600123 milliseconds."]
    assert wrap_widths(_frame(lines)) == {}          # one line of the longest length: every excerpt has one
    # two lines of the width, each followed by a record of its own: left alone (the cut is not inside a word, or
    # the next line starts as a record does)
    for end, nxt in ((")", "terminate called after throwing an instance of 'c10::Error'"),
                     ("1", "srun: error: gpu-n07: task 3: Exited with exit code 1"),
                     (".", "low memory! at or below SIGTERM limits"),
                     ("1", "  File \"/opt/train.py\", line 12, in <module>"), ("1", "Killed"),
                     ("1", "2024-03-05 10:11:12 next record"), ("1", "[rank3]: next record")):
        other = [f"RuntimeError: CUDA error: an illegal memory access was encountered (GPU 3, stream 0x7f) at 1{end}",
                 nxt, f"RuntimeError: CUDA error: an illegal memory access was encountered (GPU 5, stream 0x7f) at 1{end}",
                 "Done."]
        df = _frame(other)
        assert wrap_widths(df) == {}, nxt        # no piece goes on: no wrap
        assert join_wraps(df, {0: WrapWidth(len(other[0]))})["text"].to_list() == other, nxt


def test_fixed_width_tables_and_prefixed_lines_of_one_length_stay_as_they_are():
    smi = ["|=========================================+========================+======================|",
           "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |",
           "| N/A   33C    P0             70W /  700W |       4MiB /  81559MiB |      0%      Default |"]
    sacct = ["JobID           JobName  Partition      State ExitCode",
             "123456            train        gpu     FAILED      1:0",
             "123457            train        gpu  COMPLETED      0:0",
             "123458            train        gpu  CANCELLED      0:15"]
    kern = [f"[ 1234.5678{i}] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
            for i in range(4)]
    table = ["gpu-node-01 alloc   8   0/8/0/8   gpu:h100:8(S:0-1)   train running on the node",
             "gpu-node-02 alloc   8   0/8/0/8   gpu:h100:8(S:0-1)   train running on the node",
             "gpu-node-03 alloc   8   0/8/0/8   gpu:h100:8(S:0-1)   train running on the node"]
    # a program's log whose longest lines are of one template (NCCL's INFO lines of one length)
    nccl = [f"gpu-n0{i}:1234:1300 [{i}] NCCL INFO Channel 0{i}/0 : 0[0] -> 1[1] via P2P/IPC/read and more text" if i % 2
            else f"gpu-n0{i}:1234:1300 [{i}] NCCL INFO comm 0x5{i} rank {i} nranks 8 - Init COMPLETE" for i in range(8)]
    for lines in (smi, sacct, kern, table, nccl):
        df = _frame(lines)
        assert wrap_widths(df) == {}
        width = max(map(len, lines))
        assert join_wraps(df, {0: WrapWidth(width)})["text"].to_list() == lines


def test_the_readers_join_a_wrapped_paste_whole_split_at_any_chunk_and_among_other_files(tmp_path: Path):
    # Megatron-LM's iteration lines (megatron/training/training.py training_log), of the lengths their numbers give
    filler = [f" [2024-04-24 01:0{i % 10}:00] iteration {i:>8d}/  100000 | consumed samples: {i * 512:>12d} |"
              f" elapsed time per iteration (ms): {1000 + i * 7 % 900:.1f} | learning rate: {3e-4 / (1 + i):.6E} |"
              for i in range(1, 700)]
    lines = _wrap(WATCHDOG + filler + WATCHDOG + filler, 100)
    data = ("\n".join(lines) + "\n").encode()
    assert len(data) > 2 * DETECT_BYTES
    opts = ReadOptions(year=2026, dedupe=False)
    whole = TextParser("gpu-n01.out", opts, "job", mtime_ns=0).feed(data, final=True).events
    assert whole.height == len(filler) * 2 + 4
    assert whole.filter(pl.col("message").str.contains("OpType=BROADCAST", literal=True)).height == 4
    assert whole.filter(pl.col("message").str.contains("| learning rate: ", literal=True)).height == 2 * len(filler)
    for step in (DETECT_BYTES + 1, DETECT_BYTES + 97, 3 * DETECT_BYTES):
        tp = TextParser("gpu-n01.out", opts, "job", mtime_ns=0)
        parts = [tp.feed(data[i:i + step]).events for i in range(0, len(data), step)] + [tp.flush().events]
        split = pl.concat([p for p in parts if p.height])
        assert split.drop("seq").equals(whole.drop("seq")), step
    plain = ("\n".join(filler[:50]) + "\n").encode()
    files = [WholeFile("a/gpu-n01.out", data, 0, "job"), WholeFile("b/gpu-n02.out", plain, 0, "job")]
    many, _ = parse_many(files, opts, 0, Deduper(enabled=False))
    ref = [TextParser(f.path, opts, f.fmt, mtime_ns=0).feed(f.data, final=True).events for f in files]
    assert_frame_equal(many.events.drop("seq"), pl.concat(ref).drop("seq"))
    p = tmp_path / "job-7" / "gpu-n01.out"
    p.parent.mkdir()
    p.write_bytes(data)
    assert read_paths([p], opts).events.height == whole.height


def test_a_wrapped_watchdog_timeout_is_named_as_the_unwrapped_one(tmp_path: Path):
    rep = CorpusReplay()
    got = []
    for i, text in enumerate(("\n".join(WATCHDOG), "\n".join(_wrap(WATCHDOG, 80)))):
        ex = Excerpt(id=f"w{i}", source="", url="", family="nccl_timeout", category="nccl_timeout_hang",
                     benign=False, action="requeue_job", culprit="", ambiguous=False, note="", text=text + "\n")
        r = run_excerpt(ex, excerpt_file(tmp_path, i, ex), rep)
        got.append((r.category, r.root_rule))
    assert got[0] == got[1] and got[0][0] == "nccl_timeout_hang"
