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
* components are packed into ``n`` bins balanced by bytes (largest first, into the lightest bin).

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

__all__ = ["SHARED_FILE", "AllocationPlan", "BinKeys", "conflicts", "expand", "merge_bins", "owners_map",
           "plan_allocations", "scope_key"]

SHARED_FILE = re.compile(r"(?:^|[^a-z])slurmctld(?:[^a-z]|$)", re.I)


@dataclass
class AllocationPlan:
    files: list[str]                       # every input file, in reading order
    sizes: list[int]
    shared: list[int]                      # indices of the files every bin reads (the controller log)
    bins: list[list[int]]                  # per bin: indices of its own files, in reading order
    skipped: int = 0
    components: int = 0

    def bin_bytes(self) -> list[int]:
        return [sum(self.sizes[i] for i in b) for b in self.bins]


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
    more, unless one component does)."""
    ro = read or ReadOptions()
    found, skipped = expand_paths(paths)
    files = [str(f) for f in found]
    sizes = []
    for fp in found:
        try:
            sizes.append(max(1, fp.stat().st_size))
        except OSError:
            sizes.append(1)
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
    groups = sorted(comps.values(), key=lambda g: (-sum(sizes[i] for i in g), g[0]))
    n = max(1, n)
    if bin_bytes:
        n = max(n, min(len(groups), math.ceil(sum(sizes) / bin_bytes)))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for g in groups:
        b = min(range(n), key=lambda j: (load[j], j))
        bins[b].extend(g)
        load[b] += sum(sizes[i] for i in g)
    out = [sorted(b) for b in bins if b]
    out.sort(key=lambda b: b[0])
    if not out and shared:
        out = [[]]
    return AllocationPlan(files, sizes, shared, out, skipped, len(groups))


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
