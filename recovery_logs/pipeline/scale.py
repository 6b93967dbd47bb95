"""Replay at fleet scale on Ray: each worker judges what attribution needs to see together.

``replay_sharded(paths, options, workers=N | address=ADDR)`` gives the same ``ReplayResult`` as
``replay.replay`` (same summary, incidents, ids, evidence and order; tested on the simulator's
scenarios, on a mixed multi-job day and on layouts built to cut across shards). Two ways:

**By allocation** (the default). ``pipeline.shard_plan`` packs the input into one bin per worker
such that all nodes of a Slurm allocation, every job that ran on a node, and a node outside any
job, are each in one bin (union-find over the host and job each path names, and over the
accounting frame when ``--accounting`` gives one); the controller log (``slurmctld``) is read by
every bin. Each bin runs on a Ray actor in two steps:

1. **read**: the whole engine (``Engine.partial`` + ``absorb``: rules, windows, spans, addresses)
   over its files, read in reading order; ``seq`` is rewritten to (file's place in the global
   reading order, place in the file), so ties order as in one process. It returns what the driver
   needs to check and to set the clock: the hosts and jobs its own data touched, its NCCL address
   bindings, its first and last event time;
2. **judge**, with the *global* context the driver sends back: the last event time of the whole
   input (the watermark: a hang at the end of one job is decided as in one process), every NCCL
   address binding (an IP named as a failing peer resolves to the host another bin's log bound
   it to), and the accounting frame (for ``--accounting sacct``, asked once for the whole range).
   Detectors, attribution and ranking run as in one process; it returns the ranked incidents
   with their ranking keys (``attribution.rank_key``).

The driver checks, then merges. A bin whose own data touched a host or a job id of another bin
(a job id only a line names, an exact duplicate line across bins, a job accounting puts on another
bin's node), or an incident that names a node (culprit, candidate, evidence) or a job another bin
owns, is **not trusted**: those bins are merged and read and judged again together — the result is
never a different answer, only a slower one. Each incident is taken from the bin that owns its scope
(job, else host; the controller log's own from the first bin), and the lists are merged by the
ranking key: the single-process order. Counters add up (the controller log's once), quarantine is
re-ordered to the global reading order and capped again per reason.

**Read-parallel** (as before): where the plan cannot spread the work (one allocation holds more
than 3/4 of the bytes, e.g. one 1,024-node job), report files are asked for (``out_dir``: the
HTML timeline and the findings table need every progress finding in one engine) or line scores
are on (a template's rarity is counted over the whole site's lines), the files are cut
into contiguous runs; workers read and match (``Engine.partial``), the driver folds the parts in
order and judges everything once.

The result's ``engine`` after a replay by allocation holds the merged windows, spans, addresses and
non-progress findings, with the detectors' findings materialised (the progress lines stayed on the
workers). Known difference in both ways: an exact duplicate line (same host, time, message and
raw text) in files of different bins is kept twice (one process keeps the first); by allocation it
also makes the bins meet (same host), so they are judged together, but read apart.

Ray is optional (``pip install 'recovery-logs[scale]'``): ``--workers N`` starts a local Ray with N
CPUs, ``--ray-address ADDR`` joins an existing cluster (every node needs recovery-logs installed and
the input paths visible). Without Ray, ``replay`` runs in one process as always.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import ConfigError, InputError
from recovery_logs.pipeline.engine import Engine, EnginePart
from recovery_logs.pipeline.outputs import prepare_out_dir
from recovery_logs.pipeline.replay import (
    COALESCE_ROWS,
    QuarantineKeeper,
    ReplayOptions,
    ReplayResult,
    finish_replay,
    replay_summary,
    resolve_line_scores,
)
from recovery_logs.pipeline.shard_plan import (
    AllocationPlan,
    BinKeys,
    assign_hosts,
    conflicts,
    owners_map,
    plan_allocations,
    scope_key,
)
from recovery_logs.records import Incident
from recovery_logs.remediation.plan import RECORD_ONLY
from recovery_logs.schema import PROGRESS_CATEGORY, empty_findings
from recovery_logs.sources.accounting import load_accounting, sacct_range
from recovery_logs.sources.archive import is_archive
from recovery_logs.sources.files import ReadOptions, expand_paths, iter_batches
from recovery_logs.windows import empty_spans, empty_windows, merge_spans, merge_windows

__all__ = ["BIN_BYTES", "BinHost", "BinWorker", "plan_shards", "replay_by_allocation", "replay_part", "replay_sharded",
           "worker_threads"]


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


def worker_threads(workers: int | None, cpus: int | None, asked: str | None) -> int:
    """Polars threads for each local Ray worker: the machine's cores shared by the workers, at
    most what ``POLARS_MAX_THREADS`` asks (``asked``), at least one."""
    share = max(1, (cpus or 1) // max(1, workers or 1))
    if asked and asked.strip().isdigit():
        share = min(share, max(1, int(asked)))
    return share


def _ray(workers: int | None, address: str | None) -> Any:
    try:
        import ray  # optional heavy dependency (the [scale] extra)
    except ImportError as exc:
        raise ConfigError("--workers/--ray-address need Ray: pip install 'recovery-logs[scale]'") from exc
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            # the workers are the replay (the driver mostly waits): not Ray's default nice 15 for them
            os.environ.setdefault("RAY_worker_niceness", "0")
            # each worker is one CPU's share: Polars pools as wide as the machine in every worker
            # oversubscribe it (fleet day at 1/8 scale on 2 cores, 2 workers: 2 threads each spent
            # 2.3x the one-process CPU, 1 thread each 1.2x). The local Ray's processes inherit the
            # environment ray.init starts them with; the driver's own pool is already sized.
            before = os.environ.get("POLARS_MAX_THREADS")
            os.environ["POLARS_MAX_THREADS"] = str(worker_threads(workers, os.cpu_count(), before))
            try:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            finally:
                if before is None:
                    os.environ.pop("POLARS_MAX_THREADS", None)
                else:
                    os.environ["POLARS_MAX_THREADS"] = before
    return ray




# -- by allocation ---------------------------------------------------------------------------------
SEQ_SHIFT = 32           # seq = (file's place in the global reading order) << 32 | place in the bin's reading
GIANT_SHARE = 0.75       # one bin with more than this share of the bytes: read in parallel, judge on the driver
# At most this much input per bin (unless one allocation is larger): a bin's engine holds ~13x its
# input bytes of state (fleet profile, no compaction: 2.06 M lines, 225 MB -> 2.98 GB), and a
# host holds one bin's findings in memory at a time (``BinHost``)
BIN_BYTES = 128 << 20


@dataclass
class _Side:
    """What one side (the bin's own files, or the shared controller log) of a bin read."""

    stats: Counter[str] = field(default_factory=Counter)
    keeper: QuarantineKeeper | None = None
    windows: pl.DataFrame = field(default_factory=empty_windows)
    spans: pl.DataFrame = field(default_factory=empty_spans)
    gpus: list[Any] = field(default_factory=list)
    events: int = 0
    findings: int = 0


class BinWorker:
    """One bin on a Ray actor: ``read`` into a whole Engine, then ``judge`` at the global context."""

    def __init__(self, own: list[str], shared: list[str], ranks: dict[str, int], read: ReadOptions,
                 config: Any, cap: int) -> None:
        self.own, self.shared, self.ranks = own, shared, ranks
        self.read_opts, self.cap = read, cap
        self.eng = Engine(config)
        self.sides = {"own": _Side(keeper=QuarantineKeeper(cap)), "shared": _Side(keeper=QuarantineKeeper(cap))}
        self.keys = BinKeys()
        self.shared_hosts: set[str] = set()
        self.addresses: dict[str, tuple[int, str]] = {}
        self.spilled: Path | None = None

    def spill(self, path: Path) -> None:
        """Let go of the rule findings until ``judge`` (they wait in ``path``)."""
        self.eng.spill_findings(path)
        self.spilled = path

    def _feed(self, ev: pl.DataFrame, side: str) -> None:
        eng, sd = self.eng, self.sides[side]
        p = eng.partial(ev)
        if p.findings.height:
            rank = pl.col("file").replace_strict(self.ranks, default=0, return_dtype=pl.Int64)
            p = replace(p, findings=p.findings.with_columns((rank * (1 << SEQ_SHIFT) + pl.col("seq")).alias("seq")))
        eng.absorb(p)
        sd.windows = merge_windows(sd.windows, p.windows)
        sd.spans = merge_spans(sd.spans, p.spans)
        sd.gpus += p.gpus
        sd.events += p.events
        sd.findings += p.findings.height
        for ip, th in p.addresses.items():
            if ip not in self.addresses or th < self.addresses[ip]:
                self.addresses[ip] = th
        if side == "own":
            for frame in (p.findings, p.windows, p.spans):
                self.keys.add(frame)
            self.keys.add_unscoped(p.findings)
        else:
            self.shared_hosts.update(ev.get_column("host").drop_nulls().unique().to_list())

    def read(self) -> dict[str, Any]:
        for side, files in (("own", self.own), ("shared", self.shared)):
            if not files:
                continue
            sd = self.sides[side]
            pending: list[pl.DataFrame] = []
            rows = 0
            for b in iter_batches(files, self.read_opts, all_unreadable_raises=False):
                sd.stats.update(b.stats)
                assert sd.keeper is not None
                sd.keeper.add(b.quarantine)
                if b.events.height:
                    pending.append(b.events)
                    rows += b.events.height
                    if rows >= COALESCE_ROWS:
                        self._feed(pl.concat(pending), side)
                        pending, rows = [], 0
            if pending:
                self._feed(pl.concat(pending), side)
        return {"keys": self.keys, "shared_hosts": self.shared_hosts, "addresses": self.addresses,
                "max_time_ns": self.eng.max_time_ns, "min_time_ns": self.eng.min_time_ns,
                "stats": self.sides["own"].stats}

    def judge(self, watermark_ns: int | None, addresses: dict[str, tuple[int, str]],
              allocations: pl.DataFrame | None) -> dict[str, Any]:
        eng = self.eng
        if self.spilled is not None:
            eng.load_findings(self.spilled)
            self.spilled.unlink()
            self.spilled = None
        eng.absorb(EnginePart(empty_findings(), empty_windows(), empty_spans(), addresses, None, 0))
        if watermark_ns is not None:
            eng.advance(watermark_ns, final=True)   # the whole input's last event time: nothing more comes
        if allocations is not None:
            eng.set_accounting(allocations)
        ranked = eng.ranked_incidents(RECORD_ONLY)
        f = eng.rule_findings.filter(pl.col("category") != PROGRESS_CATEGORY)
        out: dict[str, Any] = {"ranked": ranked, "detector": eng.detector_findings()}
        for side, files in (("own", self.own), ("shared", self.shared)):
            sd = self.sides[side]
            assert sd.keeper is not None
            out[side] = {"findings": f.filter(pl.col("file").is_in(files)), "windows": sd.windows, "spans": sd.spans,
                         "gpus": sd.gpus, "events": sd.events, "findings_n": sd.findings, "stats": sd.stats,
                         "quarantine": sd.keeper.frame(), "dropped": sd.keeper.dropped}
        return out


def _trace(t: float, c: float) -> dict[str, float]:
    """One step of a host: its start and end (epoch seconds, comparable between the processes of one
    machine) and the CPU its process spent in it (on a host process, the step's own)."""
    return {"start": t, "end": time.time(), "cpu": time.process_time() - c, "pid": os.getpid()}


class BinHost:
    """One Ray actor per CPU (or, without Ray, this process): reads and judges the bins the driver
    gives it, one call at a time. The driver needs every bin read before it judges any (the
    watermark and the address bindings are the whole input's), so a host that holds more than one
    bin keeps each bin's rule findings — almost all of a bin's state — on its own disk between the
    two steps and holds one bin's findings in memory at a time: a fleet's day in memory bounded by
    the largest bin, not by the input. A bin's findings go to disk only when another bin needs the
    memory (the next read, or the judge of another bin): the bin read last is judged first, from
    memory (the driver asks for it first), so a host of k bins writes and reads back k - 1."""

    def __init__(self) -> None:
        self.bins: dict[int, BinWorker] = {}
        self.dir: Path | None = None
        self.held: int | None = None      # the bin whose findings are in memory (read, not judged)
        self.spills = 0

    def warm(self) -> int:
        """Nothing: the actor's process has started and imported this module (the driver calls it
        while it plans, so the first read does not wait for that)."""
        return os.getpid()

    def _let_go(self) -> None:
        """The held bin's findings to disk: another bin needs the memory."""
        if self.held is not None and self.held in self.bins:
            if self.dir is None:
                self.dir = Path(tempfile.mkdtemp(prefix="recovery-logs-bins-"))
            self.bins[self.held].spill(self.dir / f"bin-{self.held}.arrow")
            self.spills += 1
        self.held = None

    def read(self, bid: int, own: list[str], shared: list[str], ranks: dict[str, int],
             read: ReadOptions, config: Any, cap: int) -> dict[str, Any]:
        t, c = time.time(), time.process_time()
        self._let_go()
        w = BinWorker(own, shared, ranks, read, config, cap)
        info = w.read()
        self.bins[bid] = w
        self.held = bid
        info["trace"] = _trace(t, c)
        return info

    def judge(self, bid: int, watermark_ns: int | None, addresses: dict[str, tuple[int, str]],
              allocations: pl.DataFrame | None) -> dict[str, Any]:
        """The bin's judged result; the host lets go of the bin (a bin merged later is read again)."""
        t, c = time.time(), time.process_time()
        if self.held != bid:
            self._let_go()
        self.held = None
        out = self.bins.pop(bid).judge(watermark_ns, addresses, allocations)
        out["trace"] = _trace(t, c)
        return out

    def drop(self, bid: int) -> None:
        w = self.bins.pop(bid, None)
        if self.held == bid:
            self.held = None
        if w is not None and w.spilled is not None:
            w.spilled.unlink(missing_ok=True)

    def close(self) -> int:
        """Let go of everything; how many bins' findings went to disk."""
        self.bins.clear()
        self.held = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return self.spills


class _LocalCall:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class _LocalHandle:
    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> _LocalCall:
        return _LocalCall(getattr(self._obj, name))


class _LocalActor:
    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def remote(self, *args: Any) -> _LocalHandle:
        return _LocalHandle(self.cls(*args))


class _LocalRay:
    """The few Ray calls the replay by allocation makes, run in this process, one after another
    (``replay_by_allocation``): the same driver, with one host."""

    @staticmethod
    def remote(**_: Any) -> Any:
        return _LocalActor

    @staticmethod
    def put(x: Any) -> Any:
        return x

    @staticmethod
    def get(x: Any) -> Any:
        return x

    @staticmethod
    def kill(_: Any) -> None:
        return None


@dataclass
class _Bin:
    files: list[int]
    bid: int = -1
    host: int | None = None
    info: dict[str, Any] | None = None
    judged: dict[str, Any] | None = None


def _incident_conflicts(bins: list[_Bin], owners: dict[str, int]) -> tuple[list[tuple[Any, Incident, int]],
                                                                          list[set[int]]]:
    """(key, incident, bin) taken from the bin that owns each one, and the groups of bins an incident
    ties together (it names a node or job that another bin owns)."""
    first = 0
    taken: list[tuple[Any, Incident, int]] = []
    meets: list[set[int]] = []
    for b, bn in enumerate(bins):
        assert bn.judged is not None
        for key, inc in bn.judged["ranked"]:
            o = owners.get(scope_key(inc.scope))
            if o is None and inc.node:
                o = owners.get("h:" + inc.node)
            if (first if o is None else o) != b:
                continue
            names = ([f"h:{h}" for h in {inc.node, *inc.nodes, *(c.node for c in inc.candidates)} if h]
                     + [f"j:{j}" for j in {inc.job_id, *inc.jobs} if j])
            other = {owners[n] for n in names if n in owners and owners[n] != b}
            if other:
                meets.append({b, *other})
            taken.append((key, inc, b))
    return taken, _join(meets)


def _join(groups: list[set[int]]) -> list[set[int]]:
    out: list[set[int]] = []
    for g in groups:
        g = set(g)
        for o in [o for o in out if o & g]:
            g |= o
            out.remove(o)
        out.append(g)
    return out


def _owned_findings(det: pl.DataFrame, owners: dict[str, int], b: int) -> pl.DataFrame:
    """A bin's detector findings whose scope (job, else host) that bin owns (unowned: the first bin's)."""
    if det.height == 0:
        return det
    key = (pl.when(pl.col("job_id").is_not_null()).then(pl.lit("j:") + pl.col("job_id"))
           .when(pl.col("host").is_not_null()).then(pl.lit("h:") + pl.col("host")).otherwise(pl.lit("g")))
    owner = key.replace_strict(owners, default=0, return_dtype=pl.Int64)
    return det.filter(owner == b)


class _Hosts:
    """The driver's view of the hosts: which bin is on which, what each was given (estimated cost,
    ``AllocationPlan.cost``), and which bin each read last (its findings are still in memory there)."""

    def __init__(self, ray: Any, n: int) -> None:
        self.ray = ray
        self.actors = [ray.remote(num_cpus=1)(BinHost).remote() for _ in range(n)]
        self.load = [0.0] * n
        self.last: list[int | None] = [None] * n
        self.next_bid = 0
        self.spills = 0

    def warm(self) -> list[Any]:
        return [a.warm.remote() for a in self.actors]

    def keep(self, n: int) -> None:
        """Only the first ``n`` hosts (fewer bins than hosts started)."""
        for a in self.actors[n:]:
            self.ray.kill(a)
        del self.actors[n:], self.load[n:], self.last[n:]

    def close(self) -> None:
        """Let go of the hosts (again: nothing)."""
        actors, self.actors = self.actors, []
        try:
            self.spills += sum(self.ray.get([a.close.remote() for a in actors]))
        finally:
            for a in actors:
                self.ray.kill(a)


def _start(hosts: _Hosts, bins: list[_Bin], plan: AllocationPlan, read: ReadOptions, opts: ReplayOptions,
           cfg_ref: Any, ranks: dict[str, int]) -> None:
    """Read the bins not read yet: spread by estimated cost (``shard_plan.assign_hosts``, counting
    what each host was given before), each host's largest first."""
    todo = [bn for bn in bins if bn.info is None]
    shared = [plan.files[i] for i in plan.shared]
    costs = [plan.cost(bn.files) for bn in todo]
    where = assign_hosts(costs, len(hosts.actors), hosts.load)
    refs = []
    for k in sorted(range(len(todo)), key=lambda k: (where[k], -costs[k], k)):
        bn, h = todo[k], where[k]
        bn.bid, bn.host = hosts.next_bid, h
        hosts.next_bid += 1
        hosts.load[h] += costs[k]
        hosts.last[h] = bn.bid
        refs.append((bn, hosts.actors[h].read.remote(bn.bid, [plan.files[i] for i in bn.files], shared,
                                                     ranks, read, cfg_ref, opts.quarantine_cap)))
    for bn, info in zip([b for b, _ in refs], hosts.ray.get([r for _, r in refs]), strict=True):
        bn.info = info
    if opts.progress is not None:   # what the bins read so far (the controller log once)
        total: Counter[str] = Counter()
        for bn in bins:
            if bn.info is not None:
                total.update(bn.info["stats"])
        opts.progress(total)


def _merge(hosts: _Hosts, bins: list[_Bin], groups: list[set[int]]) -> list[_Bin]:
    """Bins after merging each group into one (to be read and judged again); the hosts let go of them."""
    out: list[_Bin] = []
    lead = {min(g): g for g in groups}
    gone = {b for g in groups for b in g}
    drops = []
    for b, bn in enumerate(bins):
        if b in lead:
            for m in lead[b]:
                old = bins[m]
                if old.host is not None and old.judged is None:
                    drops.append(hosts.actors[old.host].drop.remote(old.bid))
            out.append(_Bin(sorted(i for m in lead[b] for i in bins[m].files)))
        elif b not in gone:
            out.append(bn)
    hosts.ray.get(drops)
    return out


def _replay_by_allocation(ray: Any, hosts: _Hosts, plan: AllocationPlan, paths: Sequence[str | Path],
                          opts: ReplayOptions, read: ReadOptions, allocations: pl.DataFrame | None, t0: float,
                          timings: dict[str, float]) -> ReplayResult:
    ranks = {f: i for i, f in enumerate(plan.files)}
    cfg_ref = ray.put(opts.config)
    bins = [_Bin(b) for b in plan.bins]
    merges = 0
    ctx: tuple[int | None, int | None, dict[str, tuple[int, str]]] | None = None
    hosts.keep(max(1, min(len(hosts.actors), len(bins))))
    try:
        while True:
            t = time.perf_counter()
            _start(hosts, bins, plan, read, opts, cfg_ref, ranks)
            timings["read"] = timings.get("read", 0.0) + time.perf_counter() - t
            infos = [bn.info for bn in bins if bn.info is not None]
            if ctx is None:           # every file is in exactly one bin: the whole input's clock and addresses
                addr: dict[str, tuple[int, str]] = {}
                for info in infos:
                    for ip, th in info["addresses"].items():
                        if ip not in addr or th < addr[ip]:
                            addr[ip] = th
                mx = [i["max_time_ns"] for i in infos if i["max_time_ns"] is not None]
                mn = [i["min_time_ns"] for i in infos if i["min_time_ns"] is not None]
                ctx = (max(mx) if mx else None, min(mn) if mn else None, addr)
                if opts.accounting is not None and not isinstance(opts.accounting, pl.DataFrame) \
                        and str(opts.accounting) == "sacct":
                    allocations = sacct_range(ctx[1] or 0, ctx[0] or 0)
            shared_hosts = set().union(*(i["shared_hosts"] for i in infos))
            groups = conflicts([i["keys"] for i in infos], allocations, shared_hosts)
            if groups:
                bins, merges = _merge(hosts, bins, groups), merges + len(groups)
                continue
            # each host's bin read last first: its findings are still in memory there
            todo = sorted((bn for bn in bins if bn.judged is None),
                          key=lambda bn: (bn.bid != hosts.last[bn.host or 0], bn.bid))
            t = time.perf_counter()
            refs = []
            for bn in todo:
                assert bn.host is not None
                refs.append(hosts.actors[bn.host].judge.remote(bn.bid, ctx[0], ctx[2], allocations))
            for bn, res in zip(todo, ray.get(refs), strict=True):
                bn.judged = res
            timings["judge"] = timings.get("judge", 0.0) + time.perf_counter() - t
            owners = owners_map([i["keys"] for i in infos], allocations)
            taken, groups = _incident_conflicts(bins, owners)
            if groups:
                bins, merges = _merge(hosts, bins, groups), merges + len(groups)
                continue
            break
    finally:
        hosts.close()
    assert ctx is not None
    t = time.perf_counter()
    res = _assemble(bins, owners, taken, ctx, plan, paths, opts, allocations, merges, t0)
    timings["driver_merge"] = time.perf_counter() - t
    res.engine.stats.update(_bin_trace(bins, plan, time.time() - (time.perf_counter() - t0)))
    res.engine.stats["shard_spills"] = hosts.spills
    return _timed(res, timings)


def _bin_trace(bins: list[_Bin], plan: AllocationPlan, epoch0: float) -> dict[str, int]:
    """Per bin, where and when it ran (``engine.stats['shard_bin<b>_<field>']``, benchmarks/fleet_scale.py):
    its host, lines and bytes, and for each step (read, judge) start and end in ms from the start of
    the replay and the host process's CPU ms."""
    out: dict[str, int] = {}
    for b, bn in enumerate(bins):
        pre = f"shard_bin{b}_"
        out[pre + "host"] = bn.host if bn.host is not None else -1
        out[pre + "bytes"] = sum(plan.sizes[i] for i in bn.files)
        out[pre + "lines"] = int((bn.info or {}).get("stats", {}).get("lines", 0))
        for step, d in (("read", bn.info), ("judge", bn.judged)):
            tr = (d or {}).get("trace")
            if tr:
                out[pre + step + "_start_ms"] = round((tr["start"] - epoch0) * 1000)
                out[pre + step + "_end_ms"] = round((tr["end"] - epoch0) * 1000)
                out[pre + step + "_cpu_ms"] = round(tr["cpu"] * 1000)
    return out


def _assemble(bins: list[_Bin], owners: dict[str, int], taken: list[tuple[Any, Incident, int]],
              ctx: tuple[int | None, int | None, dict[str, tuple[int, str]]], plan: AllocationPlan,
              paths: Sequence[str | Path], opts: ReplayOptions, allocations: pl.DataFrame | None, merges: int,
              t0: float) -> ReplayResult:
    """The driver's merge: one light Engine (no progress rows), counters, quarantine, ranked incidents."""
    eng = Engine(opts.config, detectors=[])
    stats: Counter[str] = Counter(skipped=plan.skipped) if plan.skipped else Counter()
    quar: list[pl.DataFrame] = []
    dropped: Counter[str] = Counter()
    findings = 0
    sticky: list[pl.DataFrame] = []
    parts: list[dict[str, Any]] = []
    for b, bn in enumerate(bins):
        assert bn.judged is not None
        for side in ("own", "shared") if b == 0 else ("own",):
            sd = bn.judged[side]
            parts.append(sd)
            stats.update(sd["stats"])
            quar.append(sd["quarantine"])
            dropped.update(sd["dropped"])
            findings += sd["findings_n"]
        sticky.append(_owned_findings(bn.judged["detector"], owners, b))
    spans = [sd["spans"] for sd in parts if sd["spans"].height]
    found = [sd["findings"] for sd in parts if sd["findings"].height]
    eng.absorb(EnginePart(pl.concat(found) if found else empty_findings(), _all_windows(bins, parts),
                          merge_spans(spans[0], pl.concat(spans[1:])) if len(spans) > 1 else (spans or [empty_spans()])[0],
                          {}, None, sum(sd["events"] for sd in parts), [g for sd in parts for g in sd["gpus"]]))
    eng.absorb(EnginePart(empty_findings(), empty_windows(), empty_spans(), ctx[2], ctx[0], 0))
    eng.stats["findings"] = findings
    eng.min_time_ns = ctx[1]
    sticky = [s for s in sticky if s.height]
    if sticky:
        eng._sticky = pl.concat(sticky).sort(["time", "seq"], nulls_last=True)   # the detectors ran on the workers
    if eng.stats["events"] == 0:
        raise InputError("no events in the input: nothing to replay", path=", ".join(str(p) for p in paths) or None,
                         lines=stats.get("lines", 0), unreadable=stats.get("unreadable", 0))
    if ctx[0] is not None:
        eng.advance(ctx[0], final=True)
    if opts.accounting is not None:
        eng.set_accounting(allocations)
        stats["accounting_rows"] = allocations.height if allocations is not None else 0
    incidents = [inc for _, inc, _ in sorted(taken, key=lambda t: t[0])]
    keeper = QuarantineKeeper(opts.quarantine_cap)
    ranks = {f: i for i, f in enumerate(plan.files)}
    q = [x for x in quar if x.height]
    if q:   # the global reading order (a stable sort keeps each file's own order), then the cap again
        allq = pl.concat(q).with_columns(pl.col("file").replace_strict(ranks, default=len(ranks),
                                                                        return_dtype=pl.Int64).alias("_rank"))
        keeper.add(allq.sort("_rank", maintain_order=True).drop("_rank"))
    keeper.dropped.update(dropped)
    qf = keeper.frame()
    summary = replay_summary(stats, eng, incidents, qf)
    summary["quarantine_not_kept"] = int(sum(keeper.dropped.values()))
    eng.stats["shard_bins"] = len(bins)
    eng.stats["shard_merges"] = merges
    return ReplayResult(summary=summary, incidents=incidents, quarantine=qf, engine=eng,
                        elapsed_s=time.perf_counter() - t0)


def _all_windows(bins: list[_Bin], parts: list[dict[str, Any]]) -> pl.DataFrame:
    """Every bin's windows as one frame for ``Engine.absorb`` (which sorts it by key). A window's key
    is (host, job, window start); the bins' hosts are disjoint (else ``conflicts`` had merged them:
    checked again here from the hosts each side touched), so only rows without a host can share a
    key across parts: those are merged (``merge_windows``), the rest only concatenated (each part's
    keys are unique already) — the rows one ``merge_windows`` of every part gives, without grouping
    ~1.5 M host-windows of a fleet day again. Hosts not disjoint: one merge of every part."""
    wins = [sd["windows"] for sd in parts if sd["windows"].height]
    if len(wins) < 2:
        return (wins or [empty_windows()])[0]
    sets = [bn.info["keys"].hosts for bn in bins if bn.info is not None]
    if bins and bins[0].info is not None:
        sets.append(bins[0].info["shared_hosts"])
    if sum(len(h) for h in sets) != len(set().union(*sets)):
        return merge_windows(wins[0], pl.concat(wins[1:]))
    has = pl.col("host").is_not_null()
    nulls = [w.filter(~has) for w in wins]
    nulls = [w for w in nulls if w.height]
    rest = [w.filter(has) for w in wins]
    if len(nulls) > 1:
        rest.append(merge_windows(nulls[0], pl.concat(nulls[1:])))
    else:
        rest.extend(nulls)
    return pl.concat(rest)


def replay_sharded(paths: Sequence[str | Path], options: ReplayOptions | None = None, *,
                   workers: int | None = None, address: str | None = None,
                   mode: str = "auto", bin_bytes: int | None = BIN_BYTES) -> ReplayResult:
    """``replay`` on Ray; identical result (module docstring). ``mode``: ``auto`` (by allocation where
    the plan spreads the work and no report files are asked for), ``allocation`` or ``read``.
    ``bin_bytes``: by allocation, at most this much input per bin (an allocation is never cut), so
    more bins than workers where the input is large (``BinHost``); None: one bin per worker."""
    opts = resolve_line_scores(options or ReplayOptions())
    if workers is None and address is None:
        raise ConfigError("replay_sharded: give workers or a Ray address")
    if workers is not None and workers < 1:
        raise ConfigError("--workers must be at least 1", value=workers)
    if mode not in ("auto", "allocation", "read"):
        raise ConfigError("replay_sharded: mode is auto, allocation or read", value=mode)
    if any(is_archive(p) for p in paths):
        raise ConfigError("an archive is replayed in one process (its days are read in order)")
    t0 = time.perf_counter()
    # each Ray worker already has its share of the cores (POLARS_MAX_THREADS = cores / workers): a
    # parse thread per worker would oversubscribe them; the batches are the same either way
    read = replace(opts.read or ReadOptions(), parse_ahead=False)
    by_alloc = mode != "read" and opts.out_dir is None and not opts.config.line_scores
    if mode == "allocation" and not by_alloc:
        raise ConfigError("replay by allocation writes no report files and scores no lines (template rarity "
                          "is over the whole site): leave out --out and --line-scores, or use mode read")
    allocations = None
    if by_alloc:
        acc = opts.accounting
        allocations = (acc if isinstance(acc, pl.DataFrame) else
                       None if acc is None or str(acc) == "sacct" else load_accounting(acc))
    # a local Ray's start mostly waits for its processes: the plan (a walk of the input, a stat and
    # four 4 KiB samples of every file, shard_plan.estimate_lines) is made meanwhile, for ``workers`` hosts (a local Ray has that many CPUs)
    pool = ThreadPoolExecutor(1) if by_alloc and workers is not None and address is None else None
    early = (pool.submit(plan_allocations, paths, workers, read, allocations, bin_bytes=bin_bytes)
             if pool is not None and workers is not None else None)
    try:
        ray = _ray(workers, address)
        timings = {"ray_start": time.perf_counter() - t0}
        have = max(1, int(ray.cluster_resources().get("CPU", 1)))
        cpus = min(workers, have) if workers else have   # one actor per CPU: all of them hold their state at once
        if by_alloc:
            hosts = _Hosts(ray, cpus)
            hosts.warm()                                 # their processes start while the plan is finished
            try:
                t = time.perf_counter()
                plan = (early.result() if early is not None and cpus == workers else
                        plan_allocations(paths, cpus, read, allocations, bin_bytes=bin_bytes))
                timings["plan_wait"] = time.perf_counter() - t
                sizes = plan.bin_bytes()
                if mode == "allocation" or (len(plan.bins) > 1 and max(sizes) <= GIANT_SHARE * sum(sizes)):
                    return _replay_by_allocation(ray, hosts, plan, paths, opts, read, allocations, t0, timings)
            finally:
                hosts.close()                            # (their CPUs to the read-parallel tasks)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    return _replay_read_parallel(ray, paths, opts, read, 2 * cpus, t0, timings)


def replay_by_allocation(paths: Sequence[str | Path], options: ReplayOptions | None = None, *,
                         bin_bytes: int | None = BIN_BYTES) -> ReplayResult:
    """``replay`` in this process, without Ray, one allocation bin after another (``replay
    --by-allocation``): the driver of the replay by allocation with one host, so the same result
    as ``replay`` (and as ``replay_sharded``), in memory bounded by the largest bin (``bin_bytes``
    of input per bin, an allocation never cut) instead of by the input. No report files, no line
    scores (they need every progress finding, every line, in one engine)."""
    opts = resolve_line_scores(options or ReplayOptions())
    if opts.out_dir is not None or opts.config.line_scores:
        raise ConfigError("replay by allocation writes no report files and scores no lines (template rarity "
                          "is over the whole site): leave out --out and --line-scores")
    if any(is_archive(p) for p in paths):
        raise ConfigError("an archive is replayed in one process (its days are read in order)")
    t0 = time.perf_counter()
    read = opts.read or ReadOptions()
    acc = opts.accounting
    allocations = (acc if isinstance(acc, pl.DataFrame) else
                   None if acc is None or str(acc) == "sacct" else load_accounting(acc))
    plan = plan_allocations(paths, 1, read, allocations, bin_bytes=bin_bytes)
    local = _LocalRay()
    return _replay_by_allocation(local, _Hosts(local, 1), plan, paths, opts, read, allocations, t0, {})


def _timed(res: ReplayResult, timings: dict[str, float]) -> ReplayResult:
    """Where the time went, in ms, as ``engine.stats['shard_<stage>_ms']`` (benchmarks/fleet_scale.py)."""
    for k, v in timings.items():
        res.engine.stats[f"shard_{k}_ms"] = round(v * 1000)
    return res


# -- read-parallel -----------------------------------------------------------------------------------
def _replay_read_parallel(ray: Any, paths: Sequence[str | Path], opts: ReplayOptions, read: ReadOptions, n: int,
                          t0: float, timings: dict[str, float]) -> ReplayResult:
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
    t1 = time.perf_counter()
    timings["read_and_fold"] = t1 - t0 - timings["ray_start"]
    res = finish_replay(eng, stats, keeper, paths, out_dir, t0, accounting=opts.accounting)
    timings["driver_judge"] = time.perf_counter() - t1
    return _timed(res, timings)
