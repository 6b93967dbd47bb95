"""Job output behind a launcher's wrapper, with colour codes, or pasted as an indented block.

The wrappers are read as what they say (host from Ray's ``ip=``, rank from ``rank=``, mpirun's
``[job,rank]<stderr>:``, Horovod's ``[rank]<stderr>:``, torchrun's ``[role{local_rank}]:``) and the
line behind them is read as if it stood alone. Sources of the wrapper formats are named beside each line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.formats import paste_indent
from recovery_logs.sources.read_common import Deduper
from recovery_logs.sources.read_many import WholeFile, parse_many
from recovery_logs.sources.read_text import TextParser
from recovery_logs.timeutil import iso_to_ns

WRAPPED = [
    # Ray's worker-log prefix with the worker's ip (vllm-project/vllm#3722)
    ("(RayWorkerVllm pid=306, ip=10.4.80.152) W1129 14:00:01.500000 306 pynccl.py:45] vLLM is using nccl==2.18.1",
     "10.4.80.152", None, "W1129 14:00:01.500000 306 pynccl.py:45] vLLM is using nccl==2.18.1"),
    # the same, with Ray's log-deduplication suffix (vllm-project/vllm#7896)
    ("(RayWorkerWrapper pid=92234, ip=172.19.24.110) RuntimeError: NCCL error: unhandled system error "
     "[repeated 2x across cluster]", "172.19.24.110", None, "RuntimeError: NCCL error: unhandled system error"),
    # a vLLM worker process that names its rank
    ("(VllmWorker rank=1 pid=123) RuntimeError: CUDA error: an illegal memory access was encountered",
     None, 1, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    # a Ray actor on the driver's node: no ip (NVIDIA/nccl#1283)
    ("(pid=2657296) W1129 14:00:02.000000 77 train.py:300] iter 5: loss 3.98", None, None,
     "W1129 14:00:02.000000 77 train.py:300] iter 5: loss 3.98"),
    # Open MPI `mpirun --tag-output`: [jobid,rank]<stream>:
    ("[1,3]<stderr>:RuntimeError: ncclCommInitRank failed: unhandled system error", None, 3,
     "RuntimeError: ncclCommInitRank failed: unhandled system error"),
    # Horovod's [rank]<stream>: (pytorch/ignite#3466)
    ("[1]<stderr>:RuntimeError: ncclCommInitRank failed: unhandled cuda error", None, 1,
     "RuntimeError: ncclCommInitRank failed: unhandled cuda error"),
    # torchrun --tee: "[{role}{local_rank}]:" (torch.distributed.elastic.multiprocessing)
    ("[default2]:W1129 14:00:03.000000 77 train.py:300] iter 6: loss 3.90", None, 2,
     "W1129 14:00:03.000000 77 train.py:300] iter 6: loss 3.90"),
    # colour codes of a coloured logger
    ("\x1b[31mERROR\x1b[0m rank 0 lost its NCCL communicator", None, None, "ERROR rank 0 lost its NCCL communicator"),
    # not a wrapper: the global rank prefix is RE_RANK's, a parenthesis without pid= is text
    ("[rank4]: RuntimeError: boom", None, 4, "RuntimeError: boom"),
    ("(see above) RuntimeError: boom", None, None, "(see above) RuntimeError: boom"),
]


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_launchers_wrapper_is_read_as_host_and_rank_and_the_line_behind_it_as_it_stands(tmp_path):
    p = _write(tmp_path / "job-77" / "slurm-77.out", [w[0] for w in WRAPPED])
    ev = read_paths([p], ReadOptions(year=2026)).events
    assert ev.select("host", "rank", "message").rows() == [(h, r, m) for _, h, r, m in WRAPPED]
    t = ev["time"].dt.epoch("ns").to_list()
    assert t[0] == iso_to_ns("2026-11-29T14:00:01.5Z")        # the glog time behind Ray's prefix
    assert t[3] == iso_to_ns("2026-11-29T14:00:02Z") and t[6] == iso_to_ns("2026-11-29T14:00:03Z")


def test_a_line_of_cursor_codes_only_is_no_event(tmp_path):
    # tqdm redrawing a bar: ESC[A ESC[2K and a carriage return, nothing else
    p = _write(tmp_path / "job-78" / "slurm-78.out", ["step 1", "\x1b[A\x1b[2K\r", "step 2"])
    r = read_paths([p], ReadOptions(year=2026))
    assert r.events["message"].to_list() == ["step 1", "step 2"]
    assert r.stats["lines"] == 3


PASTE = [
    "W1129 14:00:01.000000 77 train.py:300] iter 5: loss 3.98",
    "Traceback (most recent call last):",
    '  File "train.py", line 10, in <module>',
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "",
    "gpu-n01:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 8",
]


@pytest.mark.parametrize("prefix", ["    ", "\t", "> ", ">", "> > "])
def test_a_paste_indented_as_a_block_reads_as_the_lines_it_is(tmp_path, prefix):
    """A log pasted as a GitHub indented code block or a '> ' quote: the shared indent is the paste's, not
    a continuation mark; without that rule every line would join the first as one record."""
    plain = read_paths([_write(tmp_path / "a" / "gpu-n01.out", PASTE)], ReadOptions(year=2026)).events
    lines = [prefix + x if x else (prefix.rstrip() if ">" in prefix else "") for x in PASTE]
    pasted = read_paths([_write(tmp_path / "b" / "gpu-n01.out", lines)], ReadOptions(year=2026)).events
    assert plain.height == 3
    assert pasted.select("time", "host", "rank", "message").equals(plain.select("time", "host", "rank", "message"))


def test_an_indent_is_the_paste_only_when_every_line_of_the_head_has_it():
    assert paste_indent(b"    a\n    b\n      c\n") == "    "
    assert paste_indent(b"\n\n> a\n>\n> b\n") == "> "
    assert paste_indent(b"a\n    b\n") is None                  # a record and its continuation
    assert paste_indent(b"    a\nb\n") is None
    assert paste_indent(b"    a\n  b\n") == "  "                 # the indent they share
    assert paste_indent(b"   a\n   b\n   partial last pie") == "   "
    assert paste_indent(b"\n\n") is None


def test_an_indented_paste_reads_the_same_whole_split_anywhere_and_among_other_files(tmp_path):
    data = ("\n".join("    " + x if x else "" for x in PASTE * 40) + "\n").encode()
    opts = ReadOptions(year=2026, dedupe=False)
    whole = TextParser("gpu-n01.out", opts, "job", mtime_ns=0).feed(data, final=True).events
    assert whole.height == 3 * 40 and not whole["message"].str.starts_with(" ").any()
    for step in (1, 7, 97, 4096):
        tp = TextParser("gpu-n01.out", opts, "job", mtime_ns=0)
        parts = [tp.feed(data[i:i + step]).events for i in range(0, len(data), step)] + [tp.flush().events]
        split = pl.concat([p for p in parts if p.height])
        assert split.drop("seq").equals(whole.drop("seq")), step
    other = ("\n".join(PASTE) + "\n").encode()
    files = [WholeFile("a/gpu-n01.out", data, 0, "job"), WholeFile("b/gpu-n02.out", other, 0, "job")]
    many, _ = parse_many(files, opts, 0, Deduper(enabled=False))
    ref = [TextParser(f.path, opts, f.fmt, mtime_ns=0).feed(f.data, final=True).events for f in files]
    assert_frame_equal(many.events.drop("seq"), pl.concat(ref).drop("seq"))
