"""Per-node progress lines without a rank (issue 13 §3, d8): a job's output gathered per host by syslog,
journald or VictoriaLogs names the host on every line but often no rank. Three or more hosts reporting the same
steps are compared host against host, like ranks; fewer hosts, or lines that carry a rank, are left as before."""

from __future__ import annotations

from pathlib import Path

from recovery_logs.pipeline.replay import ReplayOptions, replay


def _syslog(tmp_path: Path, times: dict[str, float], steps=(100, 110, 120), name: str = "job-3/ex3.log"):
    lines = [f"May  1 10:00:{s - 100:02d} {host} python[1234]: step {s} loss 2.3 step_time={t:.2f}s"
             for s in steps for host, t in times.items()]
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(lines) + "\n")
    return replay([p], ReplayOptions()).incidents


def test_a_slow_host_among_rankless_per_host_lines_is_named(tmp_path):
    inc = _syslog(tmp_path, {"gpu-node-0": 0.52, "gpu-node-1": 0.95, "gpu-node-2": 0.53, "gpu-node-3": 0.54})
    assert inc and inc[0].category == "straggler"
    assert "gpu-node-1" in (inc[0].cause or "")
    assert {a.kind for a in inc[0].actions} <= {"investigate"}


def test_balanced_hosts_and_two_hosts_give_no_straggler(tmp_path):
    even = _syslog(tmp_path, {f"gpu-node-{i}": 0.52 + 0.01 * i for i in range(4)}, name="job-4/ex4.log")
    assert not [i for i in even if i.category == "straggler"]
    pair = _syslog(tmp_path, {"gpu-node-0": 0.52, "gpu-node-1": 0.95}, name="job-5/ex5.log")
    assert not [i for i in pair if i.category == "straggler"]
