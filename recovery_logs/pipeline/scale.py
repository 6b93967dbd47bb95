"""Replay at fleet scale: the reading and rule matching spread over Ray workers, one engine.

``replay_sharded(paths, options, workers=N | address=ADDR)`` gives the same ``ReplayResult`` as
``replay.replay`` (same summary, incidents, ids, evidence and order; tested on the simulator's
scenarios and on a mixed multi-job day), because it splits only what is associative:

* **shards** are contiguous runs of the input files in reading order (balanced by bytes, about two
  per worker). A file is never split, so multi-line records, per-file time inference and
  out-of-order checks are as in one process;
* each **worker** reads its files and runs ``Engine.partial`` — rule matching, window counts,
  (host, job) spans, NCCL addresses: functions of the events alone — and returns the merged
  ``EnginePart``, its counters and its (capped) quarantine;
* the **driver** shifts each part's ``seq`` by the events of the shards before it (so ``seq`` is
  the global reading order, as in one process), folds the parts into one ``Engine`` in shard order
  and runs what needs everything together — behavioural detectors, attribution across all nodes of
  a job (a Slurm allocation's nodes are never judged apart), ranking, planning — once.

Known difference: an exact duplicate line (same host, time, message and raw text) in two files of
different shards is kept twice; one process keeps the first. Duplicates come from forwarders
re-sending into the same file, so this does not arise in the layouts we read; it is counted in the
summary (``duplicates``) either way.

Ray is optional (``pip install 'recovery-logs[scale]'``): ``--workers N`` starts a local Ray with N
CPUs, ``--ray-address ADDR`` joins an existing cluster (every node needs recovery-logs installed and
the input paths visible). Without Ray, ``replay`` runs in one process as always.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.pipeline.engine import Engine, EnginePart
from recovery_logs.pipeline.outputs import prepare_out_dir
from recovery_logs.pipeline.replay import (
    COALESCE_ROWS,
    QuarantineKeeper,
    ReplayOptions,
    ReplayResult,
    finish_replay,
    resolve_line_scores,
)
from recovery_logs.sources.archive import is_archive
from recovery_logs.sources.files import ReadOptions, expand_paths, iter_batches

__all__ = ["plan_shards", "replay_part", "replay_sharded"]


def plan_shards(paths: Sequence[str | Path], n: int) -> tuple[list[list[str]], int]:
    """(shards, files skipped as not logs): up to ``n`` contiguous runs of the files, by bytes."""
    files, skipped = expand_paths(paths)
    sizes = []
    for f in files:
        try:
            sizes.append(max(1, f.stat().st_size))
        except OSError:
            sizes.append(1)
    total = sum(sizes)
    n = max(1, min(n, len(files)))
    shards: list[list[str]] = [[]]
    acc, target = 0, total / n
    for f, s in zip(files, sizes, strict=True):
        if shards[-1] and acc + s / 2 > target * len(shards) and len(shards) < n:
            shards.append([])
        shards[-1].append(str(f))
        acc += s
    return [s for s in shards if s], skipped


def replay_part(files: list[str], read: ReadOptions, config: Any, cap: int) -> tuple[Any, ...]:
    """One shard, in a worker: (EnginePart | None, counters, quarantine, kept, dropped)."""
    eng = Engine(config, detectors=[])
    keeper = QuarantineKeeper(cap)
    stats: Counter[str] = Counter()
    part: EnginePart | None = None
    pending: list[pl.DataFrame] = []
    rows = 0

    def flush() -> None:
        nonlocal part, rows
        if pending:
            ev = pl.concat(pending) if len(pending) > 1 else pending[0]
            pending.clear()
            rows = 0
            p = eng.partial(ev)
            part = p if part is None else part.merge(p)

    for b in iter_batches(files, read, all_unreadable_raises=False):
        stats.update(b.stats)
        keeper.add(b.quarantine)
        if b.events.height:
            pending.append(b.events)
            rows += b.events.height
            if rows >= COALESCE_ROWS:
                flush()
    flush()
    return part, stats, keeper.frame(), keeper.kept, keeper.dropped


def _ray(workers: int | None, address: str | None) -> Any:
    try:
        import ray  # optional heavy dependency (the [scale] extra)
    except ImportError as exc:
        raise ConfigError("--workers/--ray-address need Ray: pip install 'recovery-logs[scale]'") from exc
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return ray


def replay_sharded(paths: Sequence[str | Path], options: ReplayOptions | None = None, *,
                   workers: int | None = None, address: str | None = None) -> ReplayResult:
    """``replay`` with the reading and matching on Ray workers; identical result (module docstring)."""
    opts = resolve_line_scores(options or ReplayOptions())
    if workers is None and address is None:
        raise ConfigError("replay_sharded: give workers or a Ray address")
    if workers is not None and workers < 1:
        raise ConfigError("--workers must be at least 1", value=workers)
    if any(is_archive(p) for p in paths):
        raise ConfigError("an archive is replayed in one process (its days are read in order)")
    t0 = time.perf_counter()
    read = opts.read or ReadOptions()
    ray = _ray(workers, address)
    n = 2 * (workers or int(ray.cluster_resources().get("CPU", 1)))
    shards, skipped = plan_shards(paths, n)
    out_dir = Path(opts.out_dir) if opts.out_dir else None
    if out_dir is not None:
        prepare_out_dir(out_dir)
    task = ray.remote(replay_part)
    cfg = ray.put(opts.config)
    refs = [task.remote(files, read, cfg, opts.quarantine_cap) for files in shards]
    eng = Engine(opts.config)
    stats: Counter[str] = Counter(skipped=skipped) if skipped else Counter()
    quar: list[pl.DataFrame] = []
    dropped: Counter[str] = Counter()
    offset = 0
    for ref in refs:                 # in shard order: seq and quarantine stay in reading order
        part, st, q, kept, drop = ray.get(ref)
        stats.update(st)
        quar.append(q)
        dropped.update(drop)
        if part is not None:
            eng.absorb(part.shift_seq(offset))
            offset += part.events
        if opts.progress is not None:
            opts.progress(stats)
    keeper = QuarantineKeeper(opts.quarantine_cap)
    for q in quar:
        keeper.add(q)
    keeper.dropped.update(dropped)   # what the workers only counted
    return finish_replay(eng, stats, keeper, paths, out_dir, t0, accounting=opts.accounting)
