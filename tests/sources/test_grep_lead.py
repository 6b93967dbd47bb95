"""`grep` output of log files (issue 13, pasted logs): `grep -i xid /var/log/messages*` puts each line behind its
file's name and ":" (GNU grep print_line_head()); the readers strip the name where a time header follows, so the
lines keep their time and host (``formats.grep_lead`` / ``strip_grep_lead``)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from recovery_logs.pipeline.replay import replay
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.formats import detect_format, grep_lead
from recovery_logs.sources.read_common import Deduper
from recovery_logs.sources.read_many import WholeFile, parse_many
from recovery_logs.sources.read_text import DETECT_BYTES, TextParser

# the kernel's own lines (linux mm/oom_kill.c, NVIDIA open-gpu-kernel-modules nv.c Xid), as grep prints them from
# rotated syslog files: "<file>:<line>", a context line "<file>-<line>", with -n "<file>:<n>:<line>", and "--"
GREPPED = [
    "messages-20150510:May  9 23:40:38 gpu-n7 kernel: Out of memory: Kill process 4242 (python) score 900 or "
    "sacrifice child",
    "messages-20150510-May  9 23:40:39 gpu-n7 kernel: Killed process 4242 (python) total-vm:1000kB, anon-rss:900kB, "
    "file-rss:0kB",
    "--",
    "/var/log/kern.log.1:May  9 23:40:40 gpu-n8 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen "
    "off the bus.",
    "/var/log/syslog:12:2026-05-09T23:40:41.000000+00:00 gpu-n8 kernel: [ 1234.5] NVRM: GPU 0000:3b:00.0: GPU has "
    "fallen off the bus.",
]


def test_grep_output_of_log_files_is_read_as_the_log_it_came_from():
    data = ("\n".join(GREPPED) + "\n").encode()
    assert grep_lead(data) and detect_format("paste.txt", data) == "syslog"
    ev = TextParser("paste.txt", ReadOptions(year=2026, dedupe=False), mtime_ns=0).feed(data, final=True).events
    assert ev["host"].to_list() == ["gpu-n7", "gpu-n7", None, "gpu-n8", "gpu-n8"]
    assert ev["message"][0].startswith("Out of memory: Kill process 4242")
    assert ev["message"][3].startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert ev.filter(pl.col("host").is_not_null())["time"].dt.strftime("%m-%d %H:%M:%S").to_list() == [
        "05-09 23:40:38", "05-09 23:40:39", "05-09 23:40:40", "05-09 23:40:41"]


def test_the_readers_agree_whole_split_and_among_other_files(tmp_path: Path):
    filler = [f"/var/log/messages:May  9 23:{i // 60 % 60:02d}:{i % 60:02d} gpu-n{i % 4} kernel: eth0: link {i}"
              for i in range(3000)]
    data = ("\n".join(GREPPED + filler) + "\n").encode()
    assert len(data) > 2 * DETECT_BYTES
    opts = ReadOptions(year=2026, dedupe=False)
    whole = TextParser("paste.txt", opts, mtime_ns=0).feed(data, final=True).events
    assert whole.filter(pl.col("host").is_null()).height == 1          # the "--" separator only
    for step in (4093, DETECT_BYTES + 1, 3 * DETECT_BYTES):           # any chunking, the format found or given
        for fmt in (None, "syslog"):
            tp = TextParser("paste.txt", opts, fmt, mtime_ns=0)
            parts = [tp.feed(data[i:i + step]).events for i in range(0, len(data), step)] + [tp.flush().events]
            split = pl.concat([p for p in parts if p.height])
            assert split.drop("seq").equals(whole.drop("seq")), (step, fmt)
    plain = b"May  9 23:40:38 gpu-n9 kernel: eth0: link up\n"
    files = [WholeFile("a/paste.txt", data, 0, "syslog"), WholeFile("b/messages", plain, 0, "syslog")]
    many, _ = parse_many(files, opts, 0, Deduper(enabled=False))
    ref = [TextParser(f.path, opts, f.fmt, mtime_ns=0).feed(f.data, final=True).events for f in files]
    assert_frame_equal(many.events.drop("seq"), pl.concat(ref).drop("seq"))
    p = tmp_path / "paste.txt"
    p.write_bytes(data)
    assert read_paths([p], opts).events.filter(pl.col("host").is_not_null()).height == whole.height - 1


def test_a_grepped_kernel_log_names_its_culprit(tmp_path: Path):
    p = tmp_path / "grep.txt"
    p.write_text("\n".join(GREPPED[:4]) + "\n")
    res = replay([p])
    xid = [i for i in res.incidents if i.category == "xid"]
    assert xid and xid[0].node == "gpu-n8"


def test_lines_that_only_look_like_a_grep_lead_are_left_alone():
    for text in (
        # job output whose lines start with "word:" and a time of their own: no log file's name
        "RuntimeError:2024-01-01T10:00:00 boom\nValueError:2024-01-01T10:00:01 bad\n",
        # a syslog file as written
        "May  9 23:40:38 gpu-n7 kernel: eth0: link up\nMay  9 23:40:39 gpu-n7 kernel: eth0: link down\n",
        # a grep lead on one line of ten: most of the stream is something else
        "/var/log/messages:May  9 23:40:38 gpu-n7 kernel: x\n" + "plain job line\n" * 9,
        # a file name before text that is no time header
        "train.log: epoch 3 loss 0.1\ntrain.log: epoch 4 loss 0.09\n",
    ):
        data = text.encode()
        assert not grep_lead(data), text
        ev = TextParser("x.out", ReadOptions(year=2026, dedupe=False), mtime_ns=0).feed(data, final=True).events
        raw = [ln for ln in text.splitlines() if ln]
        assert all(any(m in r for r in raw) for m in ev["message"].to_list()), text


def test_format_detection_and_the_readers_decide_a_grep_lead_alike():
    # detection strips the names from its sample by the same rule the readers strip lines by: when the readers keep
    # the names (no grep line among the first three), detection must not call the stream syslog either
    late = ["$ uptime", "  up 3 days", "$ grep -i xid /var/log/messages*", "$ echo done"] + GREPPED[:1] * 6
    data = ("\n".join(late) + "\n").encode()
    assert not grep_lead(data) and detect_format("paste.txt", data) == "job"
    data = ("\n".join(["$ grep -i xid /var/log/messages*"] + GREPPED[:1] * 6) + "\n").encode()
    assert grep_lead(data) and detect_format("paste.txt", data) == "syslog"
