"""Automatic compaction (pipeline/engine.py): it runs only when something is old enough to drop.

More progress lines than ``progress_compact_rows``, none older than the retention: compacting would
drop nothing and only re-run every detector (once per batch, on a fleet replay). The engine skips
it, and the incidents are those of an engine that never compacts; once a progress line is older
than the retention, it compacts (and drops it)."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.vl_replay import absorb_progress, local_split
from recovery_logs.testing import make_events

T0 = 1_796_000_000 * 10**9


def _batch(start: int, n: int, step_s: int = 10) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        for h in ("gpu-n01", "gpu-n02"):
            rows.append({"time": T0 + i * step_s * 10**9, "host": h, "job_id": "77", "source": "job",
                         "message": f"[2026-11-29 14:00:00] iteration {i:6d}/  500000 | elapsed time per "
                                    f"iteration (ms): {800 + (i % 7):.1f} | lm loss: 5.1E+00 |"})
    rows.append({"time": T0 + (start + n) * step_s * 10**9, "host": "gpu-n02", "job_id": "77", "source": "kernel",
                 "message": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."})
    return rows


def _run(cfg: EngineConfig, batches: list[list[dict]]) -> tuple[Engine, int]:
    eng = Engine(cfg)
    calls = [0]
    real = eng.compact

    def counting(horizon_ns: int) -> int:
        calls[0] += 1
        return real(horizon_ns)

    eng.compact = counting  # type: ignore[method-assign]
    seq = 0
    for rows in batches:
        ev = make_events(rows, seq_start=seq)
        seq += ev.height
        eng.feed(ev)
    return eng, calls[0]


def test_nothing_old_enough_no_compaction_same_incidents() -> None:
    batches = [_batch(i * 30, 30) for i in range(4)]          # 20 min of progress, retention 2 h
    cfg = replace(EngineConfig(), progress_compact_rows=50, detectors=("hangs", "stragglers"))
    eng, calls = _run(cfg, batches)
    ref, _ = _run(replace(cfg, progress_compact_rows=10**9), batches)
    assert eng.findings.filter(eng.findings["category"] == "progress").height > 50
    assert calls == 0 and eng.stats["compacted"] == 0
    got = [i.to_dict() for i in eng.incidents()]
    assert got and got == [i.to_dict() for i in ref.incidents()]


def test_progress_older_than_the_retention_is_compacted() -> None:
    batches = [_batch(0, 30), _batch(1000, 30)]                # the second batch is ~2.8 h later
    cfg = replace(EngineConfig(), progress_compact_rows=50, progress_retention_s=3600.0,
                  detectors=("hangs", "stragglers"))
    eng, calls = _run(cfg, batches)
    assert calls == 1 and eng.stats["compacted"] > 0


def test_compact_progress_bounds_what_a_live_reader_holds():
    """Engine.compact_progress (watch with the local selection): only above the row bound, only
    when something is older than horizon - slack, then every progress finding before the horizon."""
    ns = 1_000_000_000
    t0 = 1_796_000_000 * ns
    eng = Engine(EngineConfig())
    spec = local_split(eng.pack, 60 * ns).progress[0]
    counts = pl.DataFrame({"host": ["h1"] * 100, "job_id": ["7"] * 100, "step": list(range(100)), "lines": [3] * 100,
                           "first": [t0 + k * ns for k in range(100)], "last": [t0 + k * ns + ns // 2 for k in range(100)]})
    absorb_progress(eng, [(spec, counts)], 0)
    assert eng.progress_rows == 300
    assert eng.compact_progress(t0 + 50 * ns, above_rows=1000) == 0                  # under the bound
    assert eng.compact_progress(t0 + 50 * ns, above_rows=100, slack_ns=60 * ns) == 0  # nothing older than that
    assert eng.compact_progress(t0 + 50 * ns, above_rows=100) == 150
    assert eng.progress_rows == 150
    assert eng.findings.select(pl.col("time").min().dt.epoch("ns")).item() == t0 + 50 * ns
