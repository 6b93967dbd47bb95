"""One test per input format, each with the exact expected events frame."""

from __future__ import annotations

import gzip
import shutil

import polars as pl
from polars.testing import assert_frame_equal

from recovery_logs.schema import check_events
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.timeutil import iso_to_ns

from .conftest import FIX, events_frame


def test_syslog_rfc3164_rfc5424_iso_nvrm_join_and_bad_timestamp():
    path = FIX / "nodes" / "gpu-n01" / "kern.log"
    r = read_paths([path], ReadOptions(year=2026))
    check_events(r.events)
    k = dict(host="gpu-n01", source="kernel")
    exp = events_frame([
        dict(time="2026-11-29T14:05:59Z", line=1, **k, message="mlx5_core 0000:ca:00.0: mlx5_port_module_event:1131: "
             "Port module event: module 0, Cable plugged"),
        dict(time="2026-11-29T14:06:00Z", line=2, **k,
             message="NVRM: Xid (PCI:0000:cb:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
        dict(time="2026-11-29T14:06:00Z", line=3, **k, message="NVRM: GPU 0000:cb:00.0: GPU has fallen off the bus."),
        dict(time="2026-11-29T14:06:00Z", line=4, **k,
             message="NVRM: The NVIDIA GPU 0000:cb:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
                     "NVRM: fallen off the bus and is not responding to commands."),
        dict(time="2026-11-29T14:06:01Z", line=7, host="gpu-n01", source="slurm",
             message="error: _rpc_terminate_job: Job 184470 step 0 kill task failed"),
        dict(time="2026-11-29T14:06:02.123456789Z", line=8, host="gpu-n01", job="184470", source="slurm",
             level="warning", message="error: *** JOB 184470 ON gpu-n01 CANCELLED AT 2026-11-29T14:06:02 ***"),
        dict(time="2026-11-29T14:06:03Z", line=9, **k, message="pcieport 0000:c0:01.0: AER: Uncorrected (Fatal) "
             "error received: 0000:cb:00.0\n  continuation of the AER report"),
        dict(time="2026-11-29T14:06:03Z", inferred=True, line=11, **k, message="bad day of month"),
        dict(time="2026-11-29T14:06:04.25Z", line=12, host="gpu-n01", source="other",
             message="nvidia-persistenced.service: Main process exited"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.quarantine.rows() == [(str(path), 11, "bad_timestamp", "Nov 31 14:06:03 gpu-n01 kernel: bad day of month")]
    assert (r.stats["lines"], r.stats["events"], r.stats["multiline_joined"], r.stats["bad_timestamp"],
            r.stats["time_inferred"]) == (12, 9, 3, 1, 1)


def test_dmesg_relative_with_boot_time_keeps_ns_and_joins_nvrm():
    path = FIX / "gpu-n02.dmesg.log"
    boot = iso_to_ns("2026-11-29T10:27:00Z")
    r = read_paths([path], ReadOptions(boot_time_ns=boot))
    k = dict(host="gpu-n02", source="kernel")
    exp = events_frame([
        dict(time="2026-11-29T10:27:05.123456Z", line=1, **k,
             message="NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"),
        dict(time="2026-11-29T13:52:45.678901Z", line=2, **k,
             message="NVRM: Xid (PCI:0000:3b:00): 48, pid=2211, name=python, An uncorrectable double bit error (DBE) "
                     "has been detected on GPU in the framebuffer at partition 0, subpartition 0."),
        dict(time="2026-11-29T13:52:45.679Z", line=3, **k,
             message="NVRM: A GPU crash dump has been created. If possible, please run\nNVRM: nvidia-bug-report.sh as "
                     "root to collect this data before\nNVRM: the NVIDIA kernel module is unloaded."),
        dict(time="2026-11-29T13:52:46Z", line=6, **k, message="mlx5_core 0000:ca:00.0 ibp202s0: Link DOWN"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.quarantine.height == 0


def test_dmesg_relative_without_boot_time_is_inferred_from_mtime(tmp_path):
    path = tmp_path / "gpu-n02.dmesg"
    path.write_text("[  100.000000] first\n[  160.500000] last\n")
    mtime = iso_to_ns("2026-11-29T14:00:00Z")
    import os
    os.utime(path, ns=(mtime, mtime))
    r = read_paths([path])
    # boot = mtime - last uptime, so the last line lands on the mtime
    assert r.events["time"].dt.epoch("ns").to_list() == [mtime - 60_500_000_000, mtime]
    assert r.events["time_inferred"].to_list() == [True, True]
    assert r.stats["time_inferred"] == 2


def test_dmesg_T():
    path = FIX / "gpu-n03.dmesg_T.log"
    r = read_paths([path])
    k = dict(host="gpu-n03", source="kernel")
    exp = events_frame([
        dict(time="2026-11-01T09:00:00Z", line=3, seq=2, **k, message="early line"),
        dict(time="2026-11-29T14:06:00Z", line=1, seq=0, **k,
             message="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
        dict(time="2026-11-29T14:06:01Z", line=2, seq=1, **k, message="mlx5_core 0000:ca:00.0 ibp202s0: Link DOWN"),
    ], path)
    assert_frame_equal(r.events, exp)   # sorted by time; the early line is also out of order
    assert r.quarantine.rows() == [(str(path), 3, "out_of_order", "[Sun Nov  1 09:00:00 2026] early line")]


def test_journald_json_export():
    path = FIX / "gpu-jd1.journal.json"
    r = read_paths([path])
    exp = events_frame([
        dict(time="2026-11-29T17:03:36.551714Z", line=1, host="gpu-jd1", source="kernel", level="error",
             message="NVRM: Xid (PCI:0000:d8:00): 74, pid=2211, name=python, NVLink: fatal error detected on link "
                     "5(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"),
        dict(time="2026-11-29T17:03:36.553214Z", line=2, host="gpu-jd1", source="journald", level="warning",
             message="detected NVSwitch non-fatal error 12028 on NVSwitch pci bus id 00000000:07:00.0 physical id 0 "
                     "port 32"),
        dict(time="2026-11-29T17:03:37.000001Z", line=3, host="gpu-jd1", source="slurm",
             message="error: bad \ufffd byte"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.quarantine.select("line", "reason").rows() == [(3, "invalid_utf8")]
    assert r.stats["invalid_utf8"] == 1


def test_job_output_torchrun_glog_ranks_tracebacks_nccl_host():
    path = FIX / "job-184470" / "gpu-n03.out"
    r = read_paths([path], ReadOptions(year=2026))
    k = dict(host="gpu-n03", job="184470", source="job")
    tb = 'Traceback (most recent call last):\n  File "/opt/train.py", line 88, in <module>\n    main()\n'
    t_wd = "2026-11-29T14:06:05.000000123Z"
    exp = events_frame([
        dict(time="2026-11-29T14:05:00.123Z", line=1, **k, message="W1129 14:05:00.123000 140211 "
             "torch/distributed/run.py:779] Setting OMP_NUM_THREADS environment variable for each process to be 1"),
        dict(time=t_wd, line=2, rank=3, **k, message="[E1129 14:06:05.000000123 ProcessGroupNCCL.cpp:616] [Rank 3] "
             "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8812, OpType=ALLREDUCE, NumelIn=1, "
             "NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before timing out."),
        dict(time=t_wd, inferred=True, line=3, **k, message="gpu-n03:12345:12401 [3] NCCL WARN NET/IB : Got "
             "completion from peer 10.0.0.12<43514> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
             "::ffff:10.0.0.13 remoteGidsfe80::1"),
        dict(time=t_wd, inferred=True, line=4, rank=1, **k, message=tb + "torch.distributed.DistBackendError: NCCL "
             "error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error"),
        dict(time=t_wd, inferred=True, line=5, rank=3, **k, message=tb + "torch.distributed.DistBackendError: NCCL "
             "error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
        dict(time="2026-11-29T14:06:10.004Z", line=12, **k, message="E1129 14:06:10.004000 140211 "
             "torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 50274) "
             "of binary: /usr/bin/python"),
        dict(time="2026-11-29T14:06:11.25Z", line=13, **k, message="[2026-11-29 14:06:11,250] root: INFO: shutting down"),
        dict(time="2026-11-29T14:06:12.5Z", line=14, **k, message="training aborted"),
        dict(time="2026-11-29T14:06:12.5Z", inferred=True, line=15, rank=3, **k,
             message="srun: error: gpu-n03: task 3: Exited with exit code 1"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.stats["multiline_joined"] == 6


def test_job_output_chained_traceback_and_head_lines_take_next_time():
    path = FIX / "slurm-184471.out"
    r = read_paths([path])
    t = "2026-11-29T14:07:00.5Z"
    k = dict(job="184471", source="job", time=t)
    exp = events_frame([
        dict(inferred=True, line=1, **k, message="loading data"),
        dict(inferred=True, line=2, **k, message="epoch 0 starting"),
        dict(inferred=True, line=3, **k, message=(
            'Traceback (most recent call last):\n  File "train.py", line 10, in load\n    open(path)\n'
            "FileNotFoundError: [Errno 2] No such file or directory: '/data/x'\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            'Traceback (most recent call last):\n  File "train.py", line 20, in <module>\n    load()\n'
            "RuntimeError: dataset missing")),
        dict(line=14, **k, message="[2026-11-29 14:07:00,500] INFO: cleanup done\n    indented trailing detail"),
        dict(inferred=True, line=16, **k, message="after blank"),
    ], path)
    assert_frame_equal(r.events, exp)


def test_job_file_without_any_timestamp_uses_mtime(tmp_path):
    import os
    path = tmp_path / "job-77" / "gpu-n09.err"
    path.parent.mkdir()
    path.write_text("hello\nworld\n")
    mtime = iso_to_ns("2026-11-29T12:00:00.123456789Z")
    os.utime(path, ns=(mtime, mtime))
    r = read_paths([path])
    exp = events_frame([dict(time="2026-11-29T12:00:00.123456789Z", inferred=True, line=i + 1, host="gpu-n09",
                             job="77", source="job", message=m) for i, m in enumerate(["hello", "world"])], path)
    assert_frame_equal(r.events, exp)


def test_vl_jsonl_nanoseconds_stream_labels_and_key_order(tmp_path):
    path = tmp_path / "export.jsonl"
    path.write_text(
        '{"_time":"2026-11-29T14:06:00.123456789Z","_stream_id":"s1","_stream":"{host=\\"gpu-n3\\",unit=\\"kernel\\"}",'
        '"_msg":"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."}\n'
        '{"job_id":"184470","_msg":"[rank14]: boom","rank":"14","host":"gpu-n2.cluster","unit":"train",'
        '"_time":"2026-11-29T14:06:00.5Z"}\n'
        '{"_time":"2026-11-29T14:06:01Z","_msg":"error: x","hostname":"gpu-sl1","app_name":"slurmd",'
        '"meta.job_id":"185100","_stream_id":"s2"}\n'
        '\n')
    r = read_paths([path])
    exp = events_frame([
        dict(time="2026-11-29T14:06:00.123456789Z", line=1, host="gpu-n3", source="kernel", stream_id="s1",
             message="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
        dict(time="2026-11-29T14:06:00.5Z", line=2, host="gpu-n2", job="184470", source="job", rank=14,
             message="boom"),
        dict(time="2026-11-29T14:06:01Z", line=3, host="gpu-sl1", job="185100", source="slurm", stream_id="s2",
             message="error: x"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.stats["malformed"] == 0


def test_gzip_is_read_transparently(tmp_path):
    src = FIX / "nodes" / "gpu-n01" / "kern.log"
    gz = tmp_path / "gpu-n01" / "kern.log.gz"
    gz.parent.mkdir()
    with open(src, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    plain = read_paths([src], ReadOptions(year=2026)).events
    got = read_paths([gz], ReadOptions(year=2026)).events
    assert_frame_equal(got.drop("file"), plain.drop("file"))
    assert got["file"].unique().to_list() == [str(gz)]


def test_parquet_round_trip(tmp_path):
    src = FIX / "job-184470" / "gpu-n03.out"
    first = read_paths([src], ReadOptions(year=2026)).events
    pq = tmp_path / "events.parquet"
    first.write_parquet(pq)
    again = read_paths([pq]).events
    assert_frame_equal(again, first)


def test_parquet_compatible_frame_is_conformed(tmp_path):
    pq = tmp_path / "other.parquet"
    pl.DataFrame({"time": ["2026-11-29T14:06:00.123456789Z"], "message": ["hello"], "host": ["gpu-n1"],
                  "line": [7]}).write_parquet(pq)
    r = read_paths([pq])
    check_events(r.events)
    exp = events_frame([dict(time="2026-11-29T14:06:00.123456789Z", line=7, host="gpu-n1", source=None,
                             message="hello")], pq)
    assert_frame_equal(r.events, exp)


def test_yearless_times_roll_back_a_year_past_the_mtime(tmp_path):
    import os
    p = tmp_path / "gpu-n01.kern.log"
    p.write_text("Dec 31 23:59:59 gpu-n01 kernel: old year\nJan 01 00:00:01 gpu-n01 kernel: new year\n")
    mtime = iso_to_ns("2027-01-01T00:10:00Z")
    os.utime(p, ns=(mtime, mtime))
    r = read_paths([p])
    assert r.events["time"].dt.epoch("ns").to_list() == [iso_to_ns("2026-12-31T23:59:59Z"),
                                                         iso_to_ns("2027-01-01T00:00:01Z")]
    fixed = read_paths([p], ReadOptions(year=2027))      # an explicit year is taken as given
    assert fixed.events["time"].dt.year().to_list() == [2027, 2027]


def test_dmesg_gzip_boot_time_estimated_from_the_whole_stream(tmp_path):
    import os
    p = tmp_path / "gpu-n02.dmesg.gz"
    with gzip.open(p, "wb") as g:
        g.write(b"[   10.000000] a\n[   70.250000] b\n")
    mtime = iso_to_ns("2026-11-29T14:00:00Z")
    os.utime(p, ns=(mtime, mtime))
    r = read_paths([p])
    assert r.events["time"].dt.epoch("ns").to_list() == [mtime - 60_250_000_000, mtime]


def test_syslog_over_tcp_capture_with_priority_prefixes():
    path = FIX / "syslog_tcp_input.log"
    r = read_paths([path], ReadOptions(year=2026))
    exp = events_frame([
        dict(time="2026-11-29T17:03:41Z", line=3, seq=2, host="gpu-sl2", source="kernel", level="info",
             message="NVRM: GPU at PCI:0000:86:00: GPU-1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b"),
        dict(time="2026-11-29T17:03:41.976762Z", line=1, seq=0, host="gpu-sl1", source="kernel", level="error",
             message="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
        dict(time="2026-11-29T17:03:41.976762Z", line=2, seq=1, host="gpu-sl1", job="185100", source="slurm",
             level="warning",
             message="error: Node gpu-sl1 has low real_memory size"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.quarantine.select("line", "reason").rows() == [(3, "out_of_order")]


def test_slurmd_log_is_slurm_source_and_keeps_its_header():
    path = FIX / "slurm" / "gpu-n04.slurmd.log"
    r = read_paths([path])
    exp = events_frame([
        dict(time="2026-11-29T14:06:00.123Z", line=1, host="gpu-n04", source="slurm",
             message="[2026-11-29T14:06:00.123] [184470.0] error: *** STEP 184470.0 ON gpu-n04 CANCELLED AT "
                     "2026-11-29T14:06:00 ***"),
        dict(time="2026-11-29T14:06:01.5Z", line=2, host="gpu-n04", source="slurm",
             message="[2026-11-29T14:06:01.500] error: Kill task failed: 184470.0"),
        dict(time="2026-11-29T14:06:02Z", line=3, host="gpu-n04", source="slurm",
             message="[2026-11-29T14:06:02.000] debug:  _handle_terminate: uid = 0 JobId=184470"),
    ], path)
    assert_frame_equal(r.events, exp)


def test_journald_nvrm_block_split_over_records_is_joined_and_bad_line_quarantined():
    path = FIX / "gpu-jd2.journal.json"
    r = read_paths([path])
    k = dict(host="gpu-jd2", source="kernel", level="error")   # journald PRIORITY 3
    exp = events_frame([
        dict(time="2026-11-29T17:03:36Z", line=1, **k,
             message="NVRM: Xid (PCI:0000:cb:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
        dict(time="2026-11-29T17:03:36.0001Z", line=2, **k,
             message="NVRM: The NVIDIA GPU 0000:cb:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
                     "NVRM: fallen off the bus and is not responding to commands."),
        dict(time="2026-11-29T17:03:37Z", line=6, **k, message="mlx5_core 0000:ca:00.0 ibp202s0: Link DOWN"),
    ], path)
    assert_frame_equal(r.events, exp)
    assert r.quarantine.select("line", "reason").rows() == [(3, "malformed")]


def test_short_host_on_distinct_values_equals_row_by_row():
    from recovery_logs.sources.formats import _short_host_rows, short_host

    vals = ["gpu-n01.cluster", " gpu-n02 ", "-", "", None, "10.0.0.1", "a.b.c", ".x", "x.", "node", "fe80::1",
            "\u2003h.x"]
    # few distinct values (mapped) and mostly distinct ones (row by row)
    for v in (vals * 50, [f"h{i}.d" for i in range(200)] + vals, [None] * 3, []):
        df = pl.DataFrame({"h": v}, schema={"h": pl.String})
        got = df.select(short_host(pl.col("h")))["h"]
        want = df.select(_short_host_rows(pl.col("h")).alias("h"))["h"]
        assert got.equals(want)
    assert pl.DataFrame({"h": vals}).select(short_host(pl.col("h")))["h"].to_list() == [
        "gpu-n01", "gpu-n02", None, None, None, "10.0.0.1", "a", ".x", "x", "node", "fe80::1", "h"]


def test_job_indented_progress_lines_are_records_of_their_own(tmp_path):
    # Megatron-LM writes f" [{time}]" + " iteration …" (epfLLM/Megatron-LLM#11 pastes them without the time,
    # releases before 2023), tqdm a bar below 100 % as " 10%|…": each is a log line, not the continuation
    # of the line before; a traceback's indented lines still join their record
    out = tmp_path / "job-4711" / "slurm-4711.out"
    out.parent.mkdir()
    it = (" iteration      {}/  250000 | consumed samples:       186368 | elapsed time per iteration (ms): 126995.3 |"
          " learning rate: 1.365E-05 |")
    out.write_text("\n".join([
        " [2024-05-01 10:00:00] " + it.format(182).lstrip(),
        " [2024-05-01 10:02:07] " + it.format(183).lstrip(),
        it.format(184),
        " 10%|█         | 100/1000 [01:40<15:00,  1.00s/it]",
        "Traceback (most recent call last):",
        '  File "train.py", line 10, in <module>',
        "RuntimeError: boom",
    ]) + "\n")
    r = read_paths([out])
    ev = r.events
    assert ev.height == 5 and r.stats["multiline_joined"] == 2
    assert ev["message"].to_list()[:4] == [" [2024-05-01 10:00:00] " + it.format(182).lstrip(),
                                           " [2024-05-01 10:02:07] " + it.format(183).lstrip(), it.format(184),
                                           " 10%|█         | 100/1000 [01:40<15:00,  1.00s/it]"]
    assert ev["time"].dt.epoch("ns").to_list()[:2] == [iso_to_ns("2024-05-01T10:00:00Z"), iso_to_ns("2024-05-01T10:02:07Z")]


def test_pdsh_labelled_job_output_names_each_line_host(tmp_path):
    """pdsh's "host: line" (src/pdsh/dsh.c: out("%S: %s", host, buf)): the label is the line's host where the path
    names none and the line has no host of its own; the rest is read as it stands (rank prefix, glog time)."""
    body = ["gpu-n01: [rank0]: I1129 14:00:01.500000 77 train.py:300] iter 5: loss 3.98, time 561.94ms",
            "gpu-n02: gpu-n02b:1234:5678 [1] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
            "10.0.0.7: W1129 14:00:02.000000 77 train.py:300] iter 5: loss 3.98, time 1561.94ms",
            "rank3: hello"]
    (tmp_path / "pdsh").mkdir()
    path = tmp_path / "pdsh" / "out.txt"
    path.write_text("\n".join(body) + "\n")
    ev = read_paths([path], ReadOptions(year=2026)).events
    assert ev.select("host", "rank", "message").rows() == [
        ("gpu-n01", 0, body[0].split("[rank0]: ")[1]), ("gpu-n02b", None, body[1].split(": ", 1)[1]),
        ("10.0.0.7", None, body[2].split(": ", 1)[1]), (None, None, "rank3: hello")]
    assert ev["time"].dt.epoch("ns").to_list()[:3] == [iso_to_ns("2026-11-29T14:00:01.5Z")] * 2 + [
        iso_to_ns("2026-11-29T14:00:02Z")]
    named = tmp_path / "gpu-x07.out"          # the path names the host: it wins, as for NCCL's host
    shutil.copy(path, named)
    assert read_paths([named], ReadOptions(year=2026)).events["host"].unique().to_list() == ["gpu-x07"]


def test_container_log_layouts_are_read_as_the_lines_they_carry(tmp_path):
    """Pod and container logs: the kubelet's CRI file line ("<RFC3339Nano> <stream> <F|P> <line>", kubernetes
    pkg/kubelet/kuberuntime/logs/logs.go parseCRILog), `kubectl logs --timestamps` ("<RFC3339Nano> <line>") and
    docker compose's name column ("<name>  | <line>"): each line's message is what the program wrote (a rule
    anchored at its start sees it), its time the stamp's; a bare stamp before "prog: ..." is no syslog header."""
    lines = ["2026-11-29T14:00:01.5Z stderr F [rank2]: RuntimeError: CUDA error: an illegal memory access was encountered",
             "2026-11-29T14:00:02.250000000Z slurmstepd: error: execve(): train.sh: No such file or directory",
             "2026-11-29T14:00:03+01:00 Core 0:      +100.0°C  (high = +100.0°C, crit = +100.0°C)",
             "trainer-1    | node-7:5776:5898 [3] NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with status=12"]
    path = tmp_path / "pod.log"
    path.write_text("\n".join(lines) + "\n")
    ev = read_paths([path], ReadOptions(year=2026)).events.sort("line")
    assert ev["source"].unique().to_list() == ["job"]
    assert ev.select("rank", "message").rows() == [
        (2, "RuntimeError: CUDA error: an illegal memory access was encountered"),
        (None, "slurmstepd: error: execve(): train.sh: No such file or directory"),
        (None, "Core 0:      +100.0°C  (high = +100.0°C, crit = +100.0°C)"),
        (None, lines[3].split("| ", 1)[1])]
    assert ev["time"].dt.epoch("ns").to_list()[:3] == [
        iso_to_ns("2026-11-29T14:00:01.5Z"), iso_to_ns("2026-11-29T14:00:02.25Z"), iso_to_ns("2026-11-29T13:00:03Z")]
    assert ev["host"].to_list()[3] == "node-7"      # the NCCL line names its host behind the compose column


def test_a_cri_file_with_coloured_lines_keeps_every_line_stripped(tmp_path):
    """ANSI colour codes are removed after the CRI prefix: the lines without colour keep their prefix stripped too."""
    lines = ["2026-11-29T14:00:01Z stdout F \x1b[31mERROR\x1b[0m NCCL error: unhandled system error",
             "2026-11-29T14:00:02Z stdout F slurmstepd: error: execve(): train.sh: No such file or directory"]
    path = tmp_path / "pod.log"
    path.write_text("\n".join(lines) + "\n")
    ev = read_paths([path], ReadOptions(year=2026)).events.sort("line")
    assert ev["message"].to_list() == ["ERROR NCCL error: unhandled system error",
                                       "slurmstepd: error: execve(): train.sh: No such file or directory"]
