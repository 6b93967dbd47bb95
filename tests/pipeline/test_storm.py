"""An XID storm is one incident with counts; exact duplicate lines are quarantined, not counted twice."""

from __future__ import annotations

from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.files import ReadOptions


def test_xid_storm_collapses_and_keeps_every_line(tmp_path):
    n = 20_000
    lines = [f"Nov 29 14:06:{(i // 2000):02d} gpu-n07 kernel: [86400.{i:06d}] NVRM: Xid (PCI:0000:cb:00): 79, "
             f"pid=52737, name=python3, GPU has fallen off the bus." for i in range(n)]
    dup = lines[:50]   # a forwarder that resent 50 lines verbatim
    (tmp_path / "kern.log").write_text("\n".join(lines + dup) + "\n")
    res = replay([str(tmp_path / "kern.log")], ReplayOptions(read=ReadOptions(year=2026, host="gpu-n07")))
    assert res.summary["events"] == n
    assert res.summary["duplicates"] == 50
    (inc,) = res.incidents
    assert (inc.node, inc.xid, inc.count) == ("gpu-n07", 79, n)
    assert inc.counts_by_rule == {"xid.79": n}
