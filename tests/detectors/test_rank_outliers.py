"""Short-evidence straggler verdicts (``detectors/rank_outliers.py``): a few per-rank lines with one
slow rank, and reports that list per-rank values in one line. Line formats from the projects' own
source (named in ``rules/progress.toml``); runs go through ``replay`` like any log."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery_logs.detectors.rank_outliers import dict_values, etpt_values, slow_outliers
from recovery_logs.pipeline.replay import ReplayOptions, replay


def run(root: Path, lines: list[str], name: str = "gpu-c1.out") -> list:
    job = root / "job-6160"
    job.mkdir(parents=True)
    (job / name).write_text("\n".join(lines) + "\n")
    return [i for i in replay([job], ReplayOptions()).incidents if i.category == "straggler"]


def kinds(inc) -> list[str]:
    return [a.kind for a in inc.actions]


def test_slow_outliers_names_the_slow_rank_and_not_the_noise() -> None:
    o = slow_outliers({0: 1.00, 1: 1.02, 2: 0.99, 3: 1.61, 4: 1.01}, 1.3, 3.5, 0.05, 3)
    assert o is not None and o.ranks == (3,) and o.ratio == pytest.approx(1.61 / 1.005, rel=1e-3)
    # 10 % spread is normal jitter, a job-wide slowdown (half the ranks slow) is not one rank's fault
    assert slow_outliers({0: 1.0, 1: 1.1, 2: 0.95, 3: 1.05}, 1.3, 3.5, 0.05, 3) is None
    assert slow_outliers({0: 1.0, 1: 2.0, 2: 2.0, 3: 1.0}, 1.3, 3.5, 0.05, 3) is None
    assert slow_outliers({0: 1.0, 1: 3.0}, 1.3, 3.5, 0.05, 3) is None        # two ranks: who is slow?


def test_report_parsers_read_every_pair() -> None:
    # megatron/core/README_STRAGGLER.md lines, srun label and logger prefix kept
    msg = (" 0: INFO:megatron.core.utils:^^^^ Bottom 4 Ranks with lowest  Etpt(TF): 296.02/0, 296.17/2, 296.23/1, "
           "296.23/4,\n 0: INFO:megatron.core.utils:^^^^ Top    4 Ranks with highest Etpt(TF): 297.28/15, 297.28/11, "
           "297.32/12, 297.32/8,")
    assert etpt_values(msg) == {0: 296.02, 2: 296.17, 1: 296.23, 4: 296.23, 15: 297.28, 11: 297.28, 12: 297.32,
                                8: 297.32}
    assert dict_values("Rank 0 GPUs relative perf: {0: 0.9912, 1: 1.0, 2: 0.4871}") == {0: 0.9912, 1: 1.0, 2: 0.4871}


def rank_lines(slow: int | None, n_ranks: int = 4, steps: int = 3) -> list[str]:
    # the per-rank step form the progress rules read behind torchrun's "[rankN]:" prefix
    out = []
    for s in range(steps):
        for r in range(n_ranks):
            t = 0.452 + 0.003 * ((r + s) % 3) + (0.47 if r == slow else 0.0)
            out.append(f"[rank{r}]: step {10 * (s + 1)} step_time={t:.3f}s")
    return out


def test_one_slow_rank_in_a_few_lines_is_investigate_naming_it(tmp_path: Path) -> None:
    got = run(tmp_path, rank_lines(slow=2))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert "rank 2 slower than the other ranks" in got[0].cause


def test_even_ranks_and_a_job_wide_slowdown_are_no_straggler(tmp_path: Path) -> None:
    assert run(tmp_path / "a", rank_lines(slow=None)) == []
    lines = [f"[rank{r}]: step {10 * (s + 1)} step_time={0.45 if s < 2 else 0.9:.3f}s" for s in range(3) for r in range(4)]
    assert run(tmp_path / "b", lines) == []


def test_mpi_tagged_lines_carry_their_rank(tmp_path: Path) -> None:
    # Open MPI --tag-output "[jobid,rank]<stdout>:" in front of a per-rank step line
    lines = [f"[1,{r}]<stdout>:step {10 * (s + 1)} step_time={(1.9 if r == 5 else 1.0) + 0.01 * s:.2f}s"
             for s in range(2) for r in range(8)]
    got = run(tmp_path, lines)
    assert len(got) == 1 and "rank 5" in got[0].cause


def test_megatron_etpt_report_with_one_low_rank_is_investigate(tmp_path: Path) -> None:
    lines = [" 0: INFO:megatron.core.utils:^^^^ Bottom 4 Ranks with lowest  Etpt(TF): 151.40/6, 296.17/2, 296.23/1, "
             "296.23/4,",
             " 0: INFO:megatron.core.utils:^^^^ Top    4 Ranks with highest Etpt(TF): 297.28/15, 297.28/11, 297.32/12, "
             "297.32/8,"]
    got = run(tmp_path, lines)
    assert len(got) == 1 and kinds(got[0]) == ["investigate"] and "rank 6" in got[0].cause


def test_balanced_etpt_report_from_the_readme_does_not_alarm(tmp_path: Path) -> None:
    lines = [" 0: INFO:megatron.core.utils:^^^^ Bottom 4 Ranks with lowest  Etpt(TF): 296.02/0, 296.17/2, 296.23/1, "
             "296.23/4,",
             " 0: INFO:megatron.core.utils:^^^^ Top    4 Ranks with highest Etpt(TF): 297.28/15, 297.28/11, 297.32/12, "
             "297.32/8,"]
    assert run(tmp_path, lines) == []


def test_nvrx_score_dict_and_single_score_block(tmp_path: Path) -> None:
    got = run(tmp_path / "a", ["Rank 0 GPUs relative perf: {0: 0.9912, 1: 1.0, 2: 0.4871, 3: 0.9954}"])
    assert len(got) == 1 and "rank 2" in got[0].cause and kinds(got[0]) == ["investigate"]
    block = ["[NeMo I 2024-09-12 10:15:02 straggler_det_callback:167] ", "GPU relative performance:",
             " Worst performing 3/64 ranks:", "  Rank=13 Node=nid001234 Score=0.62", "  Rank=12 Node=nid001234 Score=0.97",
             "  Rank=40 Node=nid001240 Score=0.98"]
    got = run(tmp_path / "b", block)
    assert len(got) == 1 and kinds(got[0]) == ["investigate"] and "rank 13 on nid001234" in got[0].cause


def test_dlrover_node_check_times_and_its_own_straggler_verdict(tmp_path: Path) -> None:
    # dlrover master/elastic_training/rdzv_manager.py: "{name} round {r}: The node elapsed time are {rank: s}"
    times = ("[2024-03-01 10:00:00,123] [INFO] [rdzv_manager.py:770:check_fault_node] network-check round 1: "
             "The node elapsed time are {0: 10.21, 1: 10.35, 2: 31.04, 3: 10.18}")
    got = run(tmp_path / "a", [times])
    assert len(got) == 1 and "node rank 2" in got[0].cause and kinds(got[0]) == ["investigate"]
    even = times.replace("31.04", "10.40")
    assert run(tmp_path / "b", [even]) == []
    got = run(tmp_path / "c", ["[2024-03-01 10:00:00,125] [WARNING] [rdzv_manager.py:854:get_straggler] Straggler: {2: 31.04}."])
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]


def test_gpu_burn_line_with_one_slow_gpu(tmp_path: Path) -> None:
    # wilicc/gpu-burn gpu_burn-drv.cpp: "%.1f%%  proc'd: " then "%d (%.0f Gflop/s) " per GPU with "- " between
    def line(g: list[int]) -> str:
        return ("52.3%  proc'd: " + "- ".join(f"{1200 + i} ({v} Gflop/s) " for i, v in enumerate(g))
                + "  errors: " + "- ".join("0 " for _ in g) + "  temps: " + "- ".join("61 C " for _ in g))
    got = run(tmp_path / "a", [line([15100, 15020, 7010, 15080])])
    assert len(got) == 1 and "GPU 2" in got[0].cause
    assert run(tmp_path / "b", [line([15100, 15020, 14810, 15080])]) == []
    # a GPU that has not started yet (0 Gflop/s) is no straggler
    assert run(tmp_path / "c", [line([15100, 15020, 0, 15080])]) == []


def test_srun_label_and_lines_without_a_step_number(tmp_path: Path) -> None:
    # srun --label: "%*d: " (src/common/write_labelled_message.c) before each task's Megatron iteration line
    lines = [f"{r:2d}: [2024-05-01 10:00:0{s}] iteration {10 * (s + 1):8d}/  500000 | consumed samples: {1280 * (s + 1):12d}"
             f" | elapsed time per iteration (ms): {(1690.0 if r == 5 else 812.0) + s:.1f} | learning rate: 1.5E-04 |"
             for s in range(2) for r in range(8)]
    got = run(tmp_path / "a", lines)
    assert len(got) == 1 and "rank 5" in got[0].cause
    # hand-written per-rank prints with no step: a rank's n-th line against the others' n-th
    lines = [f"rank {r}: {(2.9 if r == 1 else 1.0) + 0.01 * r:.2f} s/it" for r in range(4)]
    got = run(tmp_path / "b", lines)
    assert len(got) == 1 and "rank 1" in got[0].cause
    assert run(tmp_path / "c", [f"rank {r}: {1.0 + 0.01 * r:.2f} s/it" for r in range(4)]) == []



def test_two_ranks_the_slower_named_only_when_it_persists(tmp_path: Path) -> None:
    # a pair has no median to single one out: the slower rank against the other, in two of the first steps
    got = run(tmp_path / "a", rank_lines(slow=1, n_ranks=2, steps=3))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert "rank 1 slower than the other rank:" in got[0].cause
    # one slow step of a pair is not enough, nor a pair 20 % apart
    assert run(tmp_path / "b", rank_lines(slow=1, n_ranks=2, steps=1)) == []
    even = [f"[rank{r}]: step {10 * (s + 1)} step_time={0.50 if r == 0 else 0.60:.3f}s" for s in range(4) for r in range(2)]
    assert run(tmp_path / "c", even) == []


# nccl-tests src/common.cu result rows: "%12li  %12li  %8s  %6s  %6i" (size, count, type, op, root), then
# "  %7s  %6.2f  %6.2f  %5g" (time, algbw, busbw, #wrong) for the out-of-place and the in-place run
def _nccl_rows(busbw: list[float], start: int = 1 << 20, tag: str = "") -> list[str]:
    out = []
    for i, bw in enumerate(busbw):
        size = start << i
        t = size / (bw * 1e3 / 1.75) if bw else 1.0
        out.append(f"{tag}{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}{tag}  {t:7.1f}  {bw / 1.75:6.2f}"
                   f"  {bw:6.2f}  {0:5d}{tag}  {t:7.1f}  {bw / 1.75:6.2f}  {bw:6.2f}  {0:5d}")
    return out


def test_nccl_tests_row_parser_reads_every_layout() -> None:
    from recovery_logs.detectors.stragglers import nccl_tests_row
    # NVIDIA/nccl-tests#232 (root column), #78 (no root; alltoall prints no op), NVIDIA/nccl#1453 (--tag-output)
    assert nccl_tests_row("    16777216       4194304     float     sum      -1    420.5   39.90   39.90      0"
                          "    419.9   39.95   39.95      0") == (16777216, 39.95)
    assert nccl_tests_row("   268435456       1048576     float           520935    0.52    0.51  0e+00   519562"
                          "    0.52    0.51  1e+00") == (268435456, 0.51)
    assert nccl_tests_row("[0]     67108864      16777216     float     sum      -1[0]     24410    2.75    5.27"
                          "      0[0]     24425    2.75    5.27      0") == (67108864, 5.27)
    # one rank (busbw = algbw x 2(n-1)/n = 0): nothing on the bus to judge; a header is no row
    assert nccl_tests_row("    16777216       4194304     float     sum      -1    40.5  414.20    0.00      0"
                          "    39.9  420.48    0.00      0") is None
    assert nccl_tests_row("#       size         count      type   redop    root     time   algbw   busbw #wrong") is None


def test_nccl_tests_busbw_collapse_and_low_bandwidth_are_investigated(tmp_path: Path) -> None:
    # the busbw falls to a fifth at 64 MiB and stays there (NVIDIA/nccl#1453's shape): investigate
    got = run(tmp_path / "a", _nccl_rows([1.2, 1.7, 12.9, 16.2, 24.1, 29.5, 5.3, 5.2, 4.1, 5.3]))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"] and "falls from 29.50 GB/s to 5.30 GB/s at 64 MiB" in got[0].cause
    # the same with mpirun --tag-output chunks
    got = run(tmp_path / "b", _nccl_rows([1.2, 1.7, 12.9, 16.2, 24.1, 29.5, 5.3, 5.2], tag="[0]"))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    # a dip at one size that recovers (a plugin's tuning artefact), a healthy sweep, a collapse at the last size
    # only (nothing shows it stays): no verdict
    assert run(tmp_path / "c", _nccl_rows([11.9, 16.6, 32.6, 19.1, 30.7, 42.6], start=8 << 20)) == []
    assert run(tmp_path / "d", _nccl_rows([40.0, 60.0, 80.0, 95.0, 96.0, 96.5])) == []
    assert run(tmp_path / "e", _nccl_rows([40.0, 60.0, 80.0, 95.0, 96.0, 9.0])) == []
    # every row of 128 MiB and up under 5 GB/s (NVIDIA/nccl-tests#78: 4.3 GB/s on 8 nodes of 100 Gb/s IB)
    got = run(tmp_path / "f", _nccl_rows([4.33, 4.32], start=256 << 20))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"] and "busbw 4.33 GB/s at 256 MiB" in got[0].cause
    assert run(tmp_path / "g", _nccl_rows([12.1, 12.2], start=256 << 20)) == []
    # the indented rows of a real log read as one record with the header before them
    lines = ["#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
             "   busbw #wrong", *[" " + r for r in _nccl_rows([4.33, 4.32], start=256 << 20)],
             "# Avg bus bandwidth    : 4.32178 "]
    got = run(tmp_path / "h", lines)
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
