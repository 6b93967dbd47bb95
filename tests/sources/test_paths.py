"""Format detection, host/job from paths, directory walking, globs, option overrides."""

from __future__ import annotations

import gzip

import polars as pl
import pytest

from recovery_logs.sources.files import ReadOptions, detect_format, expand_paths, read_paths
from recovery_logs.sources.read_common import DEFAULT_PATH_HOST_REGEX, DEFAULT_PATH_JOB_REGEX
from recovery_logs.sources.read_text import TextParser, path_field

from .conftest import FIX


@pytest.mark.parametrize(("path", "host", "job"), [
    ("/data/nodes/gpu-n01/kern.log", "gpu-n01", None),
    ("gpu-n01/syslog", "gpu-n01", None),
    ("/logs/gpu-n01.kern.log", "gpu-n01", None),
    ("/runs/job-1234/gpu-n01.out", "gpu-n01", "1234"),
    ("/archive/host=gpu-n07/day=29/kern.log.gz", "gpu-n07", None),
    ("/home/u/slurm-184470.out", None, "184470"),
    ("/scratch/job_99/rank3.log", None, "99"),
    ("/var/log/kern.log", None, None),
    ("/tmp/pytest-of-root/pytest-12/test_x0/job.out", None, None),
])
def test_default_path_regexes(path, host, job):
    assert path_field(path, DEFAULT_PATH_HOST_REGEX) == host
    assert path_field(path, DEFAULT_PATH_JOB_REGEX) == job


@pytest.mark.parametrize(("name", "head", "fmt"), [
    ("kern.log", b"Nov 29 14:06:00 gpu-n01 kernel: [1.0] x\nNov 29 14:06:01 gpu-n01 kernel: y\n", "syslog"),
    ("x.log", b"<4>1 2026-11-29T14:06:00.123456Z gpu-n01 kernel - - - msg\n", "syslog"),
    ("x.txt", b"[12345.678901] NVRM: x\n[12345.7] y\n", "dmesg"),
    ("x.txt", b"[Sun Nov 29 14:06:00 2026] msg\n", "dmesg"),
    ("a.json", b'{"__REALTIME_TIMESTAMP":"1","MESSAGE":"m"}\n', "journald"),
    ("a.out", b'{"_time":"2026-11-29T14:06:00Z","_msg":"m"}\n', "vl-jsonl"),
    # an application's own JSON lines (NVIDIA/NVSentinel#1475's health monitor): read as text, not as
    # VictoriaLogs records that would all be quarantined
    ("hm.log", b'{"time":"2026-07-10T07:38:05.415Z","level":"INFO","msg":"m","module":"syslog-health-monitor"}\n',
     "job"),
    # JSON lines broken in two by a paste (NVIDIA/NVSentinel#953's slog records): none parses, so nothing says they are
    # VictoriaLogs' (read as such, every line would be quarantined); a file named .jsonl keeps its name's word
    ("paste.txt", b'{"time":"2026-03-06T09:34:56Z","level":"INFO","msg":"Handling event","event":{"a":1\n'
                  b'2}}\n{"time":"2026-03-06T09:34:57Z","level":"INFO","msg":"m","node":"10.0.1', "job"),
    ("cut.jsonl", b'{"_time":"2026-11-29T14:06:00Z","_msg":"a very long record cut by the head', "vl-jsonl"),
    # a head that ends in a newline has no cut-off last line: its last line counts too
    ("x.txt", b"plain\nmore plain\n[12345.678901] NVRM: x\n[12345.7] y\n", "dmesg"),
    ("a.out", b"[rank0]:hello\nplain\n", "job"),
    ("e.parquet", b"PAR1....", "parquet"),
    ("empty.jsonl", b"", "vl-jsonl"),
    ("x.gz", gzip.compress(b"[12345.678901] NVRM: x\n"), "dmesg"),
])
def test_detect_format(name, head, fmt):
    assert detect_format(name, head) == fmt


def test_directory_walk_skips_hidden_truth_binary_and_docs(tmp_path):
    (tmp_path / "nodes" / "gpu-n01").mkdir(parents=True)
    (tmp_path / "nodes" / "gpu-n01" / "kern.log").write_text("Nov 29 14:06:00 gpu-n01 kernel: a\n")
    (tmp_path / ".hidden.log").write_text("x\n")
    (tmp_path / "truth.json").write_text("{}\n")
    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "core.bin").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    files, skipped = expand_paths([tmp_path])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["nodes/gpu-n01/kern.log"]
    assert skipped == 4
    r = read_paths([tmp_path], ReadOptions(year=2026))
    assert r.stats["files"] == 1 and r.stats["skipped"] == 4


def test_glob_and_explicit_file_are_read(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"{n}.out").write_text(f"2026-11-29T14:06:00Z {n}\n")
    files, _ = expand_paths([str(tmp_path / "*.out")])
    assert [f.name for f in files] == ["a.out", "b.out"]


def test_host_and_job_options_override_line_and_path():
    r = read_paths([FIX / "nodes" / "gpu-n01" / "kern.log"], ReadOptions(year=2026, host="nodeX", job="7"))
    assert set(r.events["host"]) == {"nodeX"}
    assert set(r.events["job_id"]) == {"7"}


def test_nccl_prefix_fills_host_only_when_the_path_has_none(tmp_path):
    p = tmp_path / "job.out"
    p.write_text("2026-11-29T14:06:00Z start\ngpu-n05:1:2 [0] NCCL WARN x\n")
    r = read_paths([p])
    assert r.events["host"].to_list() == [None, "gpu-n05"]


def test_timezone_option_for_zoneless_times(tmp_path):
    p = tmp_path / "gpu-n01.kern.log"
    p.write_text("Jul 01 12:00:00 gpu-n01 kernel: summer\n")
    r = read_paths([p], ReadOptions(year=2026, tz="Europe/Berlin"))
    assert r.events["time"].dt.strftime("%Y-%m-%dT%H:%M:%S").to_list() == ["2026-07-01T10:00:00"]


CRASHED = (b"Nov 29 14:05:59 gpu-n07 kernel: mlx5_core 0000:3b:00.0: Port module event: up\n" + b"\x00" * 3000
           + b"Nov 29 14:06:05 gpu-n07 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")


def test_a_log_with_a_crash_stretch_of_nuls_is_read_not_skipped(tmp_path):
    # syslog after a hard reset: the file system had promised data it never wrote (NULs), and the first
    # line after the reboot follows them on the same line; it is the line that matters
    (tmp_path / "nodes" / "gpu-n07").mkdir(parents=True)
    (tmp_path / "nodes" / "gpu-n07" / "kern.log").write_bytes(CRASHED)
    files, skipped = expand_paths([tmp_path])
    assert len(files) == 1 and skipped == 0
    r = read_paths([tmp_path], ReadOptions(year=2026))
    xid = r.events.filter(pl.col("message").str.starts_with("NVRM: Xid"))
    assert xid["host"].to_list() == ["gpu-n07"] and xid["time_inferred"].to_list() == [False]
    assert str(xid["time"][0]).startswith("2026-11-29 14:06:05")
    assert r.stats["nul_prefixed"] == 1 and r.quarantine.height == 0


def test_the_streaming_parser_strips_the_same_nuls():
    tp = TextParser("nodes/gpu-n07/kern.log", ReadOptions(year=2026), mtime_ns=0)
    half = len(CRASHED) // 2
    evs = [tp.feed(CRASHED[:half]).events, tp.feed(CRASHED[half:], final=True).events]
    msgs = pl.concat(evs)["message"].to_list()
    assert msgs[-1].startswith("NVRM: Xid") and "\x00" not in "".join(msgs)


@pytest.mark.parametrize("blob", [
    b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"\x02\x00>\x00",                  # an executable
    b"SQLite format 3\x00" + bytes(range(200)),                              # a database
    bytes((i * 37) % 256 for i in range(4096)),                              # no magic, binary throughout
    b"step 1\n\x00\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00step 2\n",       # NULs scattered in a structure
])
def test_binary_files_in_a_directory_are_still_skipped(tmp_path, blob):
    (tmp_path / "node.log").write_text("Nov 29 14:06:00 gpu-n01 kernel: a\n")
    (tmp_path / "blob").write_bytes(blob)
    files, skipped = expand_paths([tmp_path])
    assert [f.name for f in files] == ["node.log"] and skipped == 1
