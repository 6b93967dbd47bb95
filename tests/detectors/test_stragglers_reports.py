"""The straggler detector on timing *reports* that already compare ranks (issue 13 §3): Megatron's
StragglerDetector line and ``(min, max) time across ranks`` block, nvidia-resiliency-ext warnings,
and a job whose step time jumps and stays. Line formats from the projects' own source (named in
``rules/progress.toml``); the runs go through ``replay`` like any log."""

from __future__ import annotations

from pathlib import Path

from recovery_logs.pipeline.replay import ReplayOptions, replay

HOSTS = ("gpu-b1", "gpu-b2")


def stamp(s: int) -> str:
    return f"2024-05-01 10:{s // 60:02d}:{s % 60:02d}"


def megatron_report(s: int, lo: float, hi: float, slow: int, clk_rank: int, tmp_rank: int) -> str:
    # megatron/core/utils.py StragglerDetector.report(): values "{:.2f}{unit}/{rank}"
    return (f"[{stamp(s)}] | MnRtt/Rnk: {lo:.2f}ms/2 | MxRtt/Rnk: {hi:.2f}ms/{slow} | MnPwr/Rnk: 412.00W/{clk_rank} | "
            f"MxPwr/Rnk: 690.00W/1 | MnTmp/Rnk: 48.00C/2 | MxTmp/Rnk: 88.00C/{tmp_rank} | MnUtl/Rnk: 96.00%/7 | "
            f"MxUtl/Rnk: 100.00%/0 | MnClk/Rnk: 1125.00MHz/{clk_rank} | MxClk/Rnk: 1980.00MHz/0 | "
            f"MnDRtt/Rnk: 11.20us/3 | MxDRtt/Rnk: 30.55us/1 | MnEtpt/Rnk: 201.10TF/{slow} | MxEtpt/Rnk: 297.32TF/0")


def titan_line(s: int, rank: int, step: int) -> str:
    # torchtitan metrics line behind torchrun's [rankN]: prefix; every rank equally fast (a rank -> host map only)
    return (f"[rank{rank}]:[titan] {stamp(s)},000 - root - INFO - step: {step:3d}  loss:  3.0112  "
            f"memory: 61.20GiB(77.26%)  tps: 6,012  tflops: 348.18  mfu: 35.21%")


def run(root: Path, files: dict[str, list[str]]) -> list:
    job = root / "job-5150"
    job.mkdir(parents=True)
    for name, lines in files.items():
        (job / name).write_text("\n".join(lines) + "\n")
    return list(replay([job], ReplayOptions()).incidents)


def two_host_job(reports: list[str]) -> dict[str, list[str]]:
    """Ranks 0-3 on gpu-b1, 4-7 on gpu-b2 (per-rank lines), rank 0 prints the reports."""
    files: dict[str, list[str]] = {h: [] for h in HOSTS}
    for k in range(4):
        for r in range(8):
            files[HOSTS[r // 4]].append(titan_line(10 * k, r, 10 * k + 10))
    files[HOSTS[0]] += reports
    return {f"{h}.out": v for h, v in files.items()}


def straggler(incidents: list) -> list:
    return [i for i in incidents if i.category == "straggler"]


def kinds(inc) -> list[str]:
    return [a.kind for a in inc.actions]


def test_same_slow_rank_with_low_clock_in_repeated_reports_is_a_slow_node(tmp_path: Path) -> None:
    reps = [megatron_report(60 + 30 * k, 3215.0, 3300.0 if k == 0 else 4810.0, 5, 5, 5) for k in range(5)]
    got = straggler(run(tmp_path, two_host_job(reps)))
    assert len(got) == 1 and got[0].node == "gpu-b2"          # rank 5 runs on gpu-b2
    assert "drain_node" in kinds(got[0])
    assert "lowest GPU clock" in got[0].cause and "rank 5" in got[0].cause


def test_slow_rank_without_hardware_hint_is_investigate_only(tmp_path: Path) -> None:
    reps = [megatron_report(60 + 30 * k, 3215.0, 4810.0, 5, 1, 2) for k in range(5)]
    got = straggler(run(tmp_path, two_host_job(reps)))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert "no GPU clock or temperature points at it" in got[0].cause


def test_slowest_rank_that_shifts_between_reports_is_never_a_drain(tmp_path: Path) -> None:
    reps = [megatron_report(60 + 30 * k, 3215.0, 4810.0, r, r, r) for k, r in enumerate([5, 1, 6, 3, 0])]
    got = straggler(run(tmp_path, two_host_job(reps)))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert not any(a.kind in ("drain_node", "requeue_job") for i in got for a in i.actions)


def test_balanced_reports_and_warm_up_spread_do_not_alarm(tmp_path: Path) -> None:
    # the first report (warm-up) is 1.6x, the rest within 1 %: no straggler
    reps = [megatron_report(60, 3215.0, 5200.0, 5, 5, 5)] + [
        megatron_report(90 + 30 * k, 3453.08, 3468.20, 0, 28, 21) for k in range(4)]
    assert straggler(run(tmp_path, two_host_job(reps))) == []


def timers_block(fwd: tuple[float, float], batch: tuple[float, float] = (0.45, 0.61)) -> list[str]:
    # megatron/core/timers.py _get_global_min_max_time_string(): name.ljust(48, '.') and "({:.2f}, {:.2f})"
    rows = [("forward-backward", (4350.12, 4362.80)), ("forward-compute", fwd), ("backward-compute", (2730.40, 2771.02)),
            ("batch-generator", batch), ("layernorm-grads-all-reduce", (0.02, 0.03)),
            ("all-grads-sync", (12.55, 901.30)), ("optimizer", (20.11, 20.89))]
    return ["(min, max) time across ranks (ms):"] + [f"    {(n + ' ').ljust(48, '.')}: ({a:.2f}, {b:.2f})"
                                                       for n, (a, b) in rows]


def iteration(it: int, ms: float) -> str:
    return (f" iteration {it:8d}/  500000 | consumed samples: {it * 512:12d} | elapsed time per iteration (ms): {ms:.1f} "
            "| learning rate: 3.000000E-04 | global batch size:   512 | lm loss: 2.104512E+00 | loss scale: 1.0 |")


def test_compute_timer_spread_in_two_blocks_is_investigate(tmp_path: Path) -> None:
    lines: list[str] = []
    for k, fwd in enumerate([(1450.2, 1480.9), (1450.2, 2710.5), (1449.8, 2698.0)]):
        lines += [iteration(100 * (k + 1), 4400.0)] + timers_block(fwd)
    got = straggler(run(tmp_path, {"gpu-b1.out": lines}))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert "forward-compute" in got[0].cause and "names no rank" in got[0].cause


def test_wait_and_data_timer_spreads_are_normal(tmp_path: Path) -> None:
    # all-grads-sync (12.55, 901.30) is waiting, batch-generator (0.5, 310) a prefetch hiccup: no straggler
    lines: list[str] = []
    for k in range(3):
        lines += [iteration(100 * (k + 1), 4400.0)] + timers_block((1450.2, 1480.9), batch=(0.52, 310.4))
    assert straggler(run(tmp_path, {"gpu-b1.out": lines})) == []


def nvrx_warning(s: int, node: str) -> str:
    # straggler_det_callback.py _print_stragglers(): a set of StragglerId(rank, node)
    return (f"[NeMo W {stamp(s)} straggler_det_callback:125] STRAGGLER DETECTION WARNING: Some GPUs have worse "
            f"relative performance. Affected ranks: {{StragglerId(rank=13, node='{node}')}}")


def test_nvrx_one_warning_is_investigate_repeated_node_is_a_drain(tmp_path: Path) -> None:
    once = straggler(run(tmp_path / "a", {"n.out": [nvrx_warning(60, "nid001234")]}))
    assert [kinds(i) for i in once] == [["investigate"]]
    twice = straggler(run(tmp_path / "b", {"n.out": [nvrx_warning(60, "nid001234"), nvrx_warning(360, "nid001234")]}))
    drains = [i for i in twice if "drain_node" in kinds(i)]
    assert len(drains) == 1 and drains[0].node == "nid001234"


def test_nvrx_score_block_rows_are_read(tmp_path: Path) -> None:
    block = ["[NeMo I 2024-09-12 10:15:02 straggler_det_callback:162] ", "GPU relative performance:",
             " Worst performing 3/64 ranks:", "  Rank=13 Node=nid001234 Score=0.62", "  Rank=12 Node=nid001234 Score=0.70",
             "  Rank=40 Node=nid001240 Score=0.98", " Best performing 3/64 ranks:", "  Rank=1 Node=nid001201 Score=1.00"]
    # one report (its score block and its warning are the same report): not yet persistent
    once = straggler(run(tmp_path / "a", {"n.out": block + [nvrx_warning(400, "nid001234")]}))
    assert not any("drain_node" in kinds(i) for i in once)
    got = straggler(run(tmp_path / "b", {"n.out": block + block}))     # two reports, worst rows all on nid001234
    drains = [i for i in got if "drain_node" in kinds(i)]
    assert len(drains) == 1 and drains[0].node == "nid001234" and "2 reports" in drains[0].cause


def took(s: int, secs: float) -> str:
    return f"2015-11-21 05:{s // 60:02d}:{s % 60:02d},834: Iteration took {secs:.3f} s."


def test_step_time_that_triples_and_stays_is_a_slowdown(tmp_path: Path) -> None:
    secs = [32.7, 32.4, 32.8, 31.7, 30.5, 108.5, 102.5, 101.5, 102.8]
    got = straggler(run(tmp_path, {"x.out": [took(5 * i, v) for i, v in enumerate(secs)]}))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]
    assert got[0].root_rule == "detector.straggler" and "rose from" in got[0].cause and "3.1" in got[0].cause


def test_single_slow_iteration_is_not_a_slowdown(tmp_path: Path) -> None:
    secs = [32.7, 32.4, 32.8, 95.0, 31.7, 30.5, 32.1, 32.9, 31.8]     # one checkpoint-save iteration
    assert straggler(run(tmp_path, {"x.out": [took(5 * i, v) for i, v in enumerate(secs)]})) == []


def all_ranks_block(slow_ms: float, slow: int = 2) -> list[str]:
    # megatron/core/timers.py _get_all_ranks_time_string() (--timing-log-option all)
    rows = ["times across ranks (ms):", "  forward-compute:"]
    rows += [f"     rank {r:2d}: {slow_ms if r == slow else 611.0 + r:.2f}" for r in range(8)]
    rows += ["  all-grads-sync:"] + [f"     rank {r:2d}: {900.0 if r != slow else 12.0:.2f}" for r in range(8)]
    return rows


def test_all_ranks_timer_blocks_name_the_slow_rank(tmp_path: Path) -> None:
    lines: list[str] = []
    for k in range(4):
        lines += [iteration(100 * (k + 1), 4400.0)] + all_ranks_block(944.18)
    got = straggler(run(tmp_path, {"gpu-b1.out": lines}))
    assert len(got) == 1 and kinds(got[0]) == ["investigate"]      # no clock/temperature in this report
    assert "rank 2 the slowest in 3 consecutive Megatron per-rank timer reports" in got[0].cause
    balanced: list[str] = []
    for k in range(4):
        balanced += [iteration(100 * (k + 1), 4400.0)] + all_ranks_block(615.0)
    assert straggler(run(tmp_path / "b", {"gpu-b1.out": balanced})) == []


def test_slow_node_that_reports_thermal_throttling_stays_a_thermal_incident(tmp_path: Path) -> None:
    reps = [megatron_report(60 + 30 * k, 3215.0, 4810.0, 5, 5, 5) for k in range(5)]
    files = two_host_job(reps)
    # NVIDIA/DCGM#270 wording (nv-hostengine.log puts its timestamp first), from the slow rank's node
    files["gpu-b2.out"].append(f"{stamp(75)}.102 ERROR [1514002:1514004] [[Health]] Detected a WARNING in health system Thermal: 'Detected "
                               "clocks event due to thermal violation in GPU 1. Verify that the cooling on this machine is "
                               "functional, including external, thermal material interface, fans, and any other components.")
    incidents = run(tmp_path, files)
    assert incidents and incidents[0].category == "thermal_power" and incidents[0].node == "gpu-b2"
    assert not any(a.kind == "drain_node" for i in incidents for a in i.actions)
