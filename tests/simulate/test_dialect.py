"""Wording variants of the simulator (``simulate/dialect.py``): drawn per run, written as drawn."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np

from recovery_logs.simulate import SimOptions, simulate_one
from recovery_logs.simulate.dialect import Dialect

SMALL = {"nodes": 3, "gpus_per_node": 4, "duration_s": 1200.0}


def _text(root: Path) -> str:
    parts = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "truth.json":
            data = p.read_bytes()
            parts.append((gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8", "replace"))
    return "\n".join(parts)


def test_default_dialect_is_the_old_wording():
    d = Dialect()
    assert d.names() == {}
    assert d.xid_who_text(123) == "pid=123, name=python3, "
    assert d.cuda_error("unspecified launch failure", 9) == "RuntimeError: CUDA error: unspecified launch failure"
    assert d.ib_completion("10.0.0.2", 5000, 12, 7).startswith(
        "WARN NET/IB : Got completion from peer 10.0.0.2<5000> with status=12 opcode=7 len=0 vendor err 129 (Recv)")


def test_variant_wordings():
    d = Dialect(xid_who="unknown", xid45_form="caused_by", cuda_old=True, ib_completion_old=True)
    assert d.xid_who_text(1) == "pid='<unknown>', name=<unknown>, "
    assert Dialect(xid_who="pid").xid_who_text(77) == "pid=77, "
    assert d.xid45_tail(3, 149) == "Ch 00000003 caused by previous Xid 149"
    assert d.cuda_error("an illegal memory access was encountered", 280) == (
        "RuntimeError: cuda runtime error (77) : an illegal memory access was encountered at "
        "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:280")
    assert d.ib_completion("10.0.0.2", 5000, 12, 7) == (
        "WARN NET/IB : Got completion from peer 10.0.0.2<5000> with error 12, opcode 7, len 7, vendor err 129 (Recv)")
    assert set(d.names()) == {"xid_who", "xid45_form", "cuda_old", "ib_completion_old"}


def test_draw_covers_every_variant():
    seen: dict[str, set] = {}
    for seed in range(40):
        for k, v in Dialect.draw(np.random.default_rng(seed)).__dict__.items():
            seen.setdefault(k, set()).add(v)
    assert all(len(v) >= 2 for v in seen.values()), seen
    assert seen["xid_who"] == {"named", "unknown", "pid"}


def test_runs_write_the_variants_their_truth_names(tmp_path):
    socket = ib = 0
    for seed in range(6):
        r = simulate_one("nccl_net_error", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        names = r.truth["wording_variants"]
        text = _text(r.path)
        if names.get("nccl_transport") == "socket":
            socket += 1
            assert "NCCL WARN socketProgressOpt: Call to recv from 10." in text
            assert "Got completion from peer" not in text
        else:
            ib += 1
            assert "Got completion from peer" in text
            assert ("with error 12, opcode" in text) == bool(names.get("ib_completion_old"))
        assert (" misc/socket.cc:46 NCCL WARN" in text or " transport/net_ib.cc:1295 NCCL WARN" in text) == bool(
            names.get("nccl_warn_src"))
        assert ("NumelIn=" in text) == (names.get("watchdog_numel", True) and "Watchdog caught" in text)
    assert socket and ib      # both transports among six seeds
    again = simulate_one("nccl_net_error", SimOptions(out=tmp_path / "again", seed=0, **SMALL))
    assert _text(again.path) == _text(tmp_path / "0" / "nccl_net_error")    # same seed, same bytes


def test_xid_scenarios_use_the_drawn_pid_form(tmp_path):
    forms = set()
    for seed in range(5):
        r = simulate_one("xid95_uncontained", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        who = r.truth["wording_variants"].get("xid_who", "named")
        forms.add(who)
        xid95 = [ln for ln in _text(r.path).splitlines() if "): 95, " in ln]
        assert xid95
        want = {"named": ", name=python3, Uncontained", "unknown": "95, pid='<unknown>', name=<unknown>, Uncontained",
                "pid": "Uncontained"}[who]
        assert all(want in ln for ln in xid95)
        if who == "pid":
            assert all("name=" not in ln for ln in xid95)
        caused = r.truth["wording_variants"].get("xid45_form") == "caused_by"
        xid45 = [ln for ln in _text(r.path).splitlines() if "): 45, " in ln]
        assert xid45 and all(("caused by previous Xid 95" in ln) == caused for ln in xid45)
    assert len(forms) >= 2


def test_timing_variants_are_written_as_drawn(tmp_path):
    """Per-rank phase timings, Megatron's (min, max) timer block and StragglerDetector line (issue 13 §5)."""
    seen = set()
    for seed in range(8):
        r = simulate_one("straggler_node", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        names = r.truth["wording_variants"]
        text = _text(r.path)
        phase = names.get("rank_timing") == "phase"
        assert ("] step " in text and " timing: forward-compute " in text) == phase
        tf = names.get("step_line") == "tf"
        assert (" step_time=" in text) == (not phase and not tf)
        assert (" examples/sec; " in text and " sec/batch)" in text) == (not phase and tf)
        report = names.get("timing_report", "none")
        seen.add(report)
        assert ("(min, max) time across ranks (ms):\n    forward-backward ......" in text) == (report == "megatron_timers")
        assert ("| MnRtt/Rnk: " in text and "| MxClk/Rnk: " in text) == (report == "megatron_straggler")
    assert seen == {"none", "megatron_timers", "megatron_straggler"}


def test_thermal_scenario_writes_its_wording(tmp_path):
    forms = set()
    for seed in range(6):
        r = simulate_one("gpu_thermal", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        form = r.truth["wording_variants"].get("thermal_form", "dcgm4")
        forms.add(form)
        text = _text(r.path)
        assert r.truth["category"] == "thermal_power" and r.truth["culprit_gpu"] is not None
        table = bool(r.truth["wording_variants"].get("thermal_table")) and form != "smi"
        want = {"dcgm4": "Detected clocks event due to thermal violation in GPU ",
                "dcgm3": "Detected clock throttling due to thermal violation in GPU ",
                "smi": "            HW Thermal Slowdown           : Active"}[form]
        exporter = r.truth["wording_variants"].get("thermal_exporter", "none")
        if exporter != "none":   # dcgm-exporter's scrape instead of DCGM's or nvidia-smi's words
            assert want not in text
            gpu = r.truth["culprit_gpu"]
            want = (f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="{gpu}",' if exporter == "bitmask"
                    else f'DCGM_EXP_CLOCK_EVENTS_COUNT{{gpu="{gpu}",')
        elif table:   # dcgmi diag's result table instead of the health-watch line
            assert want not in text
            want = f"| Warning                   | GPU {r.truth['culprit_gpu']} Thermal violations totaling "
        assert want in text
        assert text.count(want) >= 2        # the health check repeats while the GPU stays hot
    assert len(forms) >= 2


def test_dcgmi_diag_table_wraps_the_thermal_warning():
    rows = Dialect(thermal_table=True).thermal_report(3, "3b", smi_old=False)
    assert rows[2] == "| Warning                   | GPU 3 Thermal violations totaling 15.0 seconds |"
    assert all(len(r) == len(rows[0]) for r in rows)      # fixed-width cells, text cut mid-word
    assert rows[-1].startswith("|                           | al interface, fans")
    assert Dialect(thermal_table=True, thermal_form="smi").thermal_report(3, "3b", False)[0] == "GPU 00000000:3b:00.0"


def test_gpu_oom_is_written_in_the_drawn_stack(tmp_path):
    want = {"torch": "CUDA out of memory. Tried to allocate 2.00 GiB",   # either PyTorch wording (oom_old)
            "hip": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU ",
            "xla": "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes.",
            "cublas": "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "vllm": "ValueError: No available memory for the cache blocks."}
    assert Dialect(oom_stack="torch", oom_old=True).gpu_oom(3).startswith(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; ")
    seen = set()
    for seed in range(6):
        r = simulate_one("gpu_oom", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        stack = r.truth["wording_variants"].get("oom_stack", "torch")
        seen.add(stack)
        text = _text(r.path)
        assert want[stack] in text
        assert all(want[other] not in text for other in want if other != stack)
    assert len(seen) >= 2


def test_oom_pressure_warnings_precede_the_oom_when_drawn(tmp_path):
    """``oom_pressure``: DeepSpeed ZeRO-3's allocator-cache-flush warnings (timestamped, rank-prefixed) come
    before the OOM exception of the same rank; without the variant the run has none."""
    warn = "pytorch allocator cache flushes since last step. this happens when there is high memory pressure"
    assert Dialect.oom_pressure_warning(5).startswith(f"5 {warn}")
    seen = set()
    for seed in range(8):
        r = simulate_one("gpu_oom", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        drawn = bool(r.truth["wording_variants"].get("oom_pressure", False))
        seen.add(drawn)
        lines = _text(r.path).splitlines()
        flushes = [i for i, ln in enumerate(lines) if warn in ln]
        if not drawn:
            assert flushes == []
            continue
        assert len(flushes) == 3
        assert all("] [WARNING] [stage3.py:2069:step] " in lines[i] and lines[i].startswith("[rank") for i in flushes)
        oom = next(i for i, ln in enumerate(lines) if "out of memory" in ln.lower() or "RESOURCE_EXHAUSTED" in ln
                   or "ALLOC_FAILED" in ln or "No available memory" in ln)
        assert flushes[-1] < oom                                                   # before the OOM
        assert lines[oom].split("]:", 1)[0] == lines[flushes[0]].split("]:", 1)[0]   # the same rank
    assert seen == {True, False}


def test_collective_timeout_writes_the_dump_signal_when_drawn(tmp_path):
    # PyTorch >= 2.3 wording (lsdefine/simple_GRPO#46, vllm-project/vllm-omni#2928 in the corpus): the rank whose
    # watchdog fired first says "this local rank", the others name it
    seen = set()
    for seed in range(6):
        r = simulate_one("silent_hang", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        text = _text(r.path)
        drawn = bool(r.truth["wording_variants"].get("watchdog_dump"))
        seen.add(drawn)
        assert ("Received a dump signal due to a collective timeout from this local rank" in text) == drawn
        if drawn:
            named = {int(m) for m in re.findall(r"collective timeout from  rank (\d+) and", text)}
            assert len(named) == 1 and f"Rank {named.pop()}] Received a dump signal due to a collective timeout from this local rank" in text
    assert seen == {True, False}


def test_megatron_iteration_lines_written_indented_when_drawn_and_read_one_by_one(tmp_path):
    # Megatron-LM's own f" [{time}] iteration …" (epfLLM/Megatron-LLM#11 in the corpus): the reader must keep
    # each such line a record of its own with its own time, as it does the unindented form
    from recovery_logs.sources.files import read_paths
    seen = set()
    for seed in range(6):
        r = simulate_one("healthy", SimOptions(out=tmp_path / str(seed), seed=seed, **SMALL))
        drawn = bool(r.truth["wording_variants"].get("iteration_indent"))
        seen.add(drawn)
        files = [p for p in r.path.rglob("*.out")]
        text = "\n".join(p.read_text(errors="replace") for p in files)
        lines = [ln for ln in text.split("\n") if "] iteration " in ln and "elapsed time per iteration" in ln]
        assert lines and all(ln.startswith(" [") == drawn for ln in lines)
        ev = read_paths(files).events
        its = ev.filter(ev["message"].str.contains("elapsed time per iteration", literal=True))
        assert its.height == len(lines) and not its["message"].str.contains("\n", literal=True).any()
    assert seen == {True, False}


def test_recovery_verdict_and_nvlink_job_error_are_written_as_drawn(tmp_path):
    """``recovery_report``: the GPU-reset verdict after a GPU fault as the driver's Xid 154, DCGM's health text or
    ``nvidia-smi -q``'s GPU Reset Status block; ``nvlink_job_error``: the NVLink fault's rank dies with NCCL's
    unhandled cuda error or CUDA's contained error (the d7-* excerpts' families). The top incident stays the
    fault's own category, with a GPU-level action, whichever wording was drawn."""
    from recovery_logs.pipeline.replay import replay

    d = Dialect(recovery_report="dcgm")
    assert d.recovery_lines(3, "0000:3b:00", "3b") == ("job", [
        "ERROR [4003:4005] [[Health]] GPU 3 requires a reset to recover from a fault. Recovery action: 1 (GPU_RESET)."])
    assert Dialect().recovery_lines(3, "0000:3b:00", "3b") == ("kern", [
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"])
    assert "Reset Required                    : Yes" in Dialect(recovery_report="smi").recovery_lines(0, "x", "3b")[1][2]
    reports, errors = set(), set()
    for seed in range(6):
        r = simulate_one("xid95_uncontained", SimOptions(out=tmp_path / f"e{seed}", seed=seed, **SMALL))
        form = r.truth["wording_variants"].get("recovery_report", "xid154")
        reports.add(form)
        text = _text(r.path)
        assert ("): 154, GPU recovery action changed" in text) == (form == "xid154")
        assert ("Recovery action: 1 (GPU_RESET)." in text) == (form == "dcgm")
        assert ("    GPU Reset Status" in text) == (form == "smi")
        top = replay([r.path], None).incidents[0]
        assert (top.category, top.node) == ("ecc_memory", r.truth["culprit_node"])
        n = simulate_one("xid74_nvlink", SimOptions(out=tmp_path / f"n{seed}", seed=seed, **SMALL))
        job_error = n.truth["wording_variants"].get("nvlink_job_error", "nccl")
        errors.add(job_error)
        assert ("Invalid access of peer GPU memory over nvlink" in _text(n.path)) == (job_error == "contained")
        top = replay([n.path], None).incidents[0]
        assert (top.category, top.node) == ("nvlink", n.truth["culprit_node"])
    assert reports == {"xid154", "dcgm", "smi"} and errors == {"nccl", "contained"}


def test_exporter_thermal_scrape_sets_only_thermal_bits_on_the_hot_gpu():
    """dcgm-exporter wording of a hot GPU: its reasons gauge carries SW/HW thermal or HW slowdown bits (DCGM
    dcgm_fields.h), a neighbour reads 0; the count form counts thermal events only."""
    for k in range(3):
        lines = Dialect(thermal_exporter="bitmask").exporter_thermal_report(2, "gpu-n03", k)
        hot, cold = (int(ln.rsplit(" ", 1)[1]) for ln in lines[1:])
        assert hot & (0x08 | 0x20 | 0x40) and not hot & ~(0x08 | 0x20 | 0x40) and cold == 0
        assert 'gpu="2"' in lines[1] and 'Hostname="gpu-n03"' in lines[1] and 'gpu="3"' in lines[2]
    count = Dialect(thermal_exporter="count").exporter_thermal_report(2, "gpu-n03", 0)
    assert [ln.split('clock_event="')[1].split('"')[0] for ln in count[1:]] == ["sw_thermal", "hw_thermal", "power_cap"]
    assert count[3].endswith(" 0")


def test_host_oom_victim_report_and_node_return_are_written_as_drawn(tmp_path):
    """``oom_victim_report``: the OOM killer's victim reported by torchrun, MPICH hydra's banner or the batch
    shell (the e17-* excerpts' families); with the kernel log not collected and a non-torchrun launcher, that
    report is the only evidence and the top incident is still the node's host OOM. ``node_fail_return``: the dead
    node re-registers with slurmctld (unexpected reboot; the batch host's job missing) and stays the culprit."""
    from recovery_logs.pipeline.replay import replay

    assert Dialect.hydra_banner(3, 4242, "gpu-n02", old=False)[1:4] == [
        "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   RANK 3 PID 4242 RUNNING AT gpu-n02",
        "=   KILLED BY SIGNAL: 9 (Killed)"]
    assert "=   EXIT CODE: 9" in Dialect.hydra_banner(3, 4242, "gpu-n02", old=True)
    assert Dialect.shell_killed("184470", 28, 4242) == (
        "/var/spool/slurmd/job184470/slurm_script: line 28:   4242 Killed                  python3 -u train.py")
    reports, launcher_only, returned = set(), 0, 0
    for seed in range(12):
        r = simulate_one("host_oom", SimOptions(out=tmp_path / f"o{seed}", seed=seed, **SMALL))
        w = r.truth["wording_variants"]
        form = w.get("oom_victim_report", "elastic")
        reports.add(form)
        text = _text(r.path)
        assert ("BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in text) == (form == "hydra")
        assert ("/slurm_script: line " in text) == (form == "shell")
        assert ("ChildFailedError" in text) == (form == "elastic")
        only = form != "elastic" and w.get("host_oom_seen") == "job"
        launcher_only += only
        assert ("oom_kill event" in text or "oom-kill event" in text) == (not only)
        top = replay([r.path], None).incidents[0]
        assert (top.category, top.node) == ("oom_host", r.truth["culprit_node"])
        n = simulate_one("node_fail", SimOptions(out=tmp_path / f"f{seed}", seed=seed, **SMALL))
        back = bool(n.truth["wording_variants"].get("node_fail_return"))
        returned += back
        assert ("unexpectedly rebooted boot_time=" in _text(n.path)) == back
        top = replay([n.path], None).incidents[0]
        assert (top.category, top.node) == ("slurm_job_failure", n.truth["culprit_node"])
    assert reports == {"elastic", "hydra", "shell"} and launcher_only and returned
