"""Which files Ray workers judge together: Slurm allocations, nodes outside jobs, the controller log.

Pure (no Ray): ``plan_allocations(paths, n, read, allocations)`` cuts the input into ``n`` bins
such that everything attribution and the detectors look at together is in one bin:

* **allocations** — every file is keyed by the host and the job its path names (the reader's own
  ``path_host_regex`` / ``path_job_regex``: ``job-123/gpu-n01.out``, ``nodes/gpu-n01/kern.log``)
  and, with accounting, every job is keyed with every node Slurm allocated it. Keys that meet are
  one **component** (union-find): all nodes of a job, every job that ran on a node, and those jobs'
  other nodes. A node outside any job is a component of its own (sharded by node);
* **the controller log** (``slurmctld``: it names every job and node of the cluster) is *shared*:
  every bin reads it, and what it alone produces is taken from one bin;
* components are packed into ``n`` bins balanced by their estimated **cost** (largest first, into
  the lightest bin): the read and judge CPU of their lines (estimated from the newlines in four
  4 KiB samples spread over each file) and bytes, by a model measured on the fleet day
  (:func:`AllocationPlan.cost`; bytes alone put a bin of 1.47 M lines and one of 1.34 M lines above
  one of 1.59 M). :func:`assign_hosts` gives the bins to the workers the same way.

A plan is a hypothesis: the logs themselves can tie bins together (a job id only a line names, an
NCCL peer on another bin's node). ``pipeline.scale`` checks the keys each bin's data actually
touched and merges bins that met (:func:`conflicts`) before it trusts a result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from recovery_logs.sources.files import expand_paths
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.read_text import path_field

__all__ = ["SHARED_FILE", "AllocationPlan", "BinKeys", "assign_hosts", "conflicts", "estimate_lines",
           "expand", "merge_bins", "owners_map", "plan_allocations", "scope_key"]

SHARED_FILE = re.compile(r"(?:^|[^a-z])slurmctld(?:[^a-z]|$)", re.I)
SAMPLES, SAMPLE_BYTES = 4, 4 << 10   # a file's lines: estimated from this many samples of this size
# A bin's read + judge CPU on the fleet day (8 bins of 1.3-3.2 M lines, one process at load ~3; each
# bin within 10 % of the model): ~6.5 s a million lines, ~0.025 s a MB, and the judge's ~1 s a
# (million lines)^2 (its per-job series grow with the job). Only relative costs matter.
COST_MLINE, COST_MB, COST_MLINE2 = 6.5, 0.025, 1.0


@dataclass
class AllocationPlan:
    files: list[str]                       # every input file, in reading order
    sizes: list[int]
    shared: list[int]                      # indices of the files every bin reads (the controller log)
    bins: list[list[int]]                  # per bin: indices of its own files, in reading order
    skipped: int = 0
    components: int = 0
    lines: list[int] = field(default_factory=list)   # per file, estimated (``estimate_lines``)

    def bin_bytes(self) -> list[int]:
        return [sum(self.sizes[i] for i in b) for b in self.bins]

    def cost(self, files: Iterable[int]) -> float:
        """The estimated CPU seconds of reading and judging these files together (``COST_*``); bytes
        where the plan has no line estimates."""
        fs = list(files)
        if not self.lines:
            return float(sum(self.sizes[i] for i in fs))
        ml = sum(self.lines[i] for i in fs) / 1e6
        return COST_MLINE * ml + COST_MB * sum(self.sizes[i] for i in fs) / 1e6 + COST_MLINE2 * ml * ml


def estimate_lines(path: str | Path, size: int) -> int:
    """A file's lines, estimated from the newlines in ``SAMPLES`` samples of ``SAMPLE_BYTES`` spread
    from its start to its end (counted where the file is no larger); a compressed or columnar file
    (gzip, Parquet) as ~4x its size at ~100 bytes a line. Only a scheduling hint: a wrong estimate
    makes a replay slower, never different."""
    try:
        with open(path, "rb") as f:
            head = f.read(SAMPLES * SAMPLE_BYTES)
            if head.startswith((b"\x1f\x8b", b"PAR1")):
                return size // 25
            if len(head) < SAMPLES * SAMPLE_BYTES:
                return head.count(b"\n") + (1 if head and not head.endswith(b"\n") else 0)
            n = got = 0
            for k in range(SAMPLES):
                f.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                b = f.read(SAMPLE_BYTES)
                n, got = n + b.count(b"\n"), got + len(b)
    except OSError:
        return 0
    return round(size * n / max(1, got))


def assign_hosts(costs: Sequence[float], hosts: int, load: Sequence[float] | None = None) -> list[int]:
    """The host of each bin: largest first onto the host with the least cost so far (``load``: what
    each host already has), then single moves and swaps off the most loaded host while they lower
    it. The read step waits for every bin (the judge needs the whole input's clock), so the hosts
    should end their reads together, and then their judges."""
    hosts = max(1, hosts)
    tot = list(load) if load is not None else [0.0] * hosts
    where = [0] * len(costs)
    for b in sorted(range(len(costs)), key=lambda b: (-costs[b], b)):
        h = min(range(hosts), key=lambda j: (tot[j], j))
        where[b] = h
        tot[h] += costs[b]
    for _ in range(4 * len(costs)):
        top = max(range(hosts), key=lambda j: (tot[j], -j))
        best: tuple[float, int, int, int] | None = None      # (new max of the pair, bin out, host, bin in or -1)
        for b in (b for b in range(len(costs)) if where[b] == top):
            for h in range(hosts):
                if h == top:
                    continue
                cands = [(-1, 0.0)] + [(o, costs[o]) for o in range(len(costs)) if where[o] == h]
                for o, co in cands:
                    m = max(tot[top] - costs[b] + co, tot[h] + costs[b] - co)
                    if m < tot[top] - 1e-9 and (best is None or m < best[0]):
                        best = (m, b, h, o)
        if best is None:
            break
        _, b, h, o = best
        where[b], tot[top], tot[h] = h, tot[top] - costs[b], tot[h] + costs[b]
        if o >= 0:
            where[o], tot[h], tot[top] = top, tot[h] - costs[o], tot[top] + costs[o]
    return where


@dataclass
class BinKeys:
    """What one bin's own data (not the shared files) touched: hosts, job ids, job-less host-less."""

    hosts: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    global_scope: bool = False

    def add(self, frame: pl.DataFrame) -> None:
        """Hosts and jobs named by a frame with ``host`` and ``job_id`` columns (events, findings)."""
        if frame.height == 0:
            return
        self.hosts.update(frame.get_column("host").drop_nulls().unique().to_list())
        self.jobs.update(frame.get_column("job_id").drop_nulls().unique().to_list())

    def add_unscoped(self, findings: pl.DataFrame) -> None:
        if findings.height and findings.filter(pl.col("host").is_null() & pl.col("job_id").is_null()
                                               & (pl.col("category") != "progress")).height:
            self.global_scope = True


class _Union:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, k: str) -> str:
        p = self.parent.setdefault(k, k)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[k] = p
        return p

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _allocation_pairs(allocations: pl.DataFrame | None) -> Iterable[tuple[str, str]]:
    if allocations is None or allocations.height == 0:
        return []
    a = allocations.filter(pl.col("step").is_null()).select("job_id", "node").drop_nulls().unique()
    return a.sort(["job_id", "node"]).iter_rows()


def plan_allocations(paths: Sequence[str | Path], n: int, read: ReadOptions | None = None,
                     allocations: pl.DataFrame | None = None, bin_bytes: int | None = None) -> AllocationPlan:
    """Up to ``n`` bins of whole components (module docstring); bins with no files are dropped.
    ``bin_bytes``: more bins where the input is larger than ``n`` of that size (so no bin holds
    more, unless one component does). ``n`` = 1 (one host): packed by bytes, no line estimates."""
    ro = read or ReadOptions()
    found, skipped = expand_paths(paths)
    files = [str(f) for f in found]
    sizes = []
    for fp in found:
        try:
            sizes.append(max(1, fp.stat().st_size))
        except OSError:
            sizes.append(1)
    # one host reads its bins one after another: their balance changes nothing, so no estimate
    lines = [estimate_lines(f, s) for f, s in zip(files, sizes, strict=True)] if n > 1 else []
    uf = _Union()
    shared: list[int] = []
    first_key: list[str | None] = []
    for i, name in enumerate(files):
        if SHARED_FILE.search(Path(name).name):
            shared.append(i)
            first_key.append(None)
            continue
        host = ro.host or path_field(name, ro.path_host_regex)
        job = ro.job or path_field(name, ro.path_job_regex)
        keys = ([f"h:{host}"] if host else []) + ([f"j:{job}"] if job else []) or [f"f:{i}"]
        for k in keys[1:]:
            uf.union(keys[0], k)
        first_key.append(keys[0])
    for job, node in _allocation_pairs(allocations):
        uf.union(f"j:{job}", f"h:{node}")
    comps: dict[str, list[int]] = {}
    for i, fk in enumerate(first_key):
        if fk is not None:
            comps.setdefault(uf.find(fk), []).append(i)
    plan = AllocationPlan(files, sizes, shared, [], skipped, len(comps), lines)
    groups = sorted(comps.values(), key=lambda g: (-plan.cost(g), g[0]))
    n = max(1, n)
    if bin_bytes:
        n = max(n, min(len(groups), math.ceil(sum(sizes) / bin_bytes)))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    for g in groups:
        b = min(range(n), key=lambda j: (load[j], j))
        bins[b].extend(g)
        load[b] += plan.cost(g)
    out = [sorted(b) for b in bins if b]
    out.sort(key=lambda b: b[0])
    if not out and shared:
        out = [[]]
    plan.bins = out
    return plan


def expand(keys: Sequence[BinKeys], allocations: pl.DataFrame | None = None) -> list[BinKeys]:
    """Each bin's keys plus what accounting ties to them: the nodes of its jobs, the jobs on its nodes."""
    alloc_jobs: dict[str, set[str]] = {}     # node -> jobs allocated on it
    alloc_nodes: dict[str, set[str]] = {}    # job -> its nodes
    for job, node in _allocation_pairs(allocations):
        alloc_jobs.setdefault(node, set()).add(job)
        alloc_nodes.setdefault(job, set()).add(node)
    return [BinKeys(set(k.hosts) | {h for j in k.jobs for h in alloc_nodes.get(j, ())},
                    set(k.jobs) | {j for h in k.hosts for j in alloc_jobs.get(h, ())}, k.global_scope)
            for k in keys]


def conflicts(keys: Sequence[BinKeys], allocations: pl.DataFrame | None = None,
              shared_hosts: Iterable[str] = ()) -> list[set[int]]:
    """Groups of bins (of two or more) whose data met: the same host or job id, both with job-less
    host-less findings, or a job that accounting put on a node of another bin. Empty: none met.
    A bin whose own data has a host of the controller log meets every bin."""
    uf = _Union()
    shared = set(shared_hosts)
    owner: dict[str, int] = {}
    for b, k in enumerate(expand(keys, allocations)):
        uf.find(f"b:{b}")
        if k.hosts & shared:
            for other in range(len(keys)):
                uf.union(f"b:{other}", f"b:{b}")
        for m in [f"h:{h}" for h in k.hosts] + [f"j:{j}" for j in k.jobs] + (["g"] if k.global_scope else []):
            if m in owner:
                uf.union(f"b:{owner[m]}", f"b:{b}")
            else:
                owner[m] = b
    groups: dict[str, set[int]] = {}
    for b in range(len(keys)):
        groups.setdefault(uf.find(f"b:{b}"), set()).add(b)
    return [g for g in groups.values() if len(g) > 1]


def merge_bins(bins: list[list[int]], groups: Sequence[set[int]]) -> tuple[list[list[int]], list[int]]:
    """Bins after merging each group into one: (new bins, indices of the merged ones in it)."""
    merged_into: dict[int, int] = {}
    for g in groups:
        lead = min(g)
        for b in g:
            merged_into[b] = lead
    out: list[list[int]] = []
    changed: list[int] = []
    for b, files in enumerate(bins):
        lead = merged_into.get(b, b)
        if lead != b:
            continue
        if b in merged_into:
            files = sorted(i for m, lead_m in merged_into.items() if lead_m == b for i in bins[m])
            changed.append(len(out))
        out.append(files)
    return out, changed


def scope_key(scope: str) -> str:
    """An incident's scope (``JOB``, ``JOB@attempt``, ``host:H``, ``global``) as an ownership key."""
    if scope.startswith("host:"):
        return "h:" + scope[5:]
    if scope == "global" or not scope:
        return "g"
    return "j:" + scope.split("@", 1)[0]


def owners_map(keys: Sequence[BinKeys], allocations: pl.DataFrame | None = None) -> dict[str, int]:
    """Ownership key -> bin, for bins that met no other (``conflicts`` empty)."""
    out: dict[str, int] = {}
    for b, k in enumerate(expand(keys, allocations)):
        for h in k.hosts:
            out.setdefault(f"h:{h}", b)
        for j in k.jobs:
            out.setdefault(f"j:{j}", b)
        if k.global_scope:
            out.setdefault("g", b)
    return out
