"""The simulated cluster: nodes, ranks, GPUs, addresses and clocks, all derived from one seed.

Layout is Slurm/torchrun's: node ``i`` runs local ranks ``0..G-1`` as global ranks ``i*G .. i*G+G-1``;
local rank ``g`` drives GPU ``g``. Times are integer nanoseconds since the epoch (UTC).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from recovery_logs.timeutil import NS, iso_to_ns

BASE_START = "2026-11-29T14:00:00Z"
# HGX H100/B200 baseboard PCI bus numbers of the 8 GPUs, in nvidia-smi index order.
HGX_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
HCA_PCI = "0000:0c:00.0"
IB_NETDEV = "ibp12s0"
CTL_HOST = "slurmctl01"


def stable_hash(*parts: object) -> int:
    """A process-independent 32-bit hash (Python's hash() is salted per process)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode())


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[str, ...]
    gpus_per_node: int
    job_id: str
    start_ns: int
    end_ns: int
    seed: int
    ips: tuple[str, ...]
    boot_ns: tuple[int, ...]      # kernel boot time per node (kern.log uptime = t - boot)
    skew_ns: tuple[int, ...]      # per-node clock offset applied to every line that node writes
    pid_base: tuple[int, ...]     # pid of local rank 0's process per node
    agent_pid: tuple[int, ...]    # torchrun agent pid per node
    ctl_host: str = CTL_HOST

    @property
    def world(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def node_of_rank(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def host_of_rank(self, rank: int) -> str:
        return self.nodes[rank // self.gpus_per_node]

    def ranks_of(self, node: int) -> range:
        g = self.gpus_per_node
        return range(node * g, node * g + g)

    def pci(self, gpu: int) -> str:
        """Xid-style bus id, e.g. ``0000:cb:00``."""
        bus = HGX_BUS[gpu] if gpu < len(HGX_BUS) else f"{(0x18 + 0x11 * gpu) % 0xff:02x}"
        return f"0000:{bus}:00"

    def pid(self, rank: int) -> int:
        return self.pid_base[self.node_of_rank(rank)] + rank % self.gpus_per_node

    def nodelist(self) -> str:
        """Slurm's compressed hostlist for the job (``gpu-n[01-04]``)."""
        prefix = self.nodes[0].rstrip("0123456789")
        nums = [n[len(prefix):] for n in self.nodes]
        return f"{prefix}[{nums[0]}-{nums[-1]}]" if len(nums) > 1 else self.nodes[0]


def make_cluster(seed: int, scenario: str, nodes: int, gpus_per_node: int, duration_s: float) -> Cluster:
    rng = np.random.default_rng([seed, stable_hash("cluster", scenario)])
    width = max(2, len(str(nodes)))
    names = tuple(f"gpu-n{i + 1:0{width}d}" for i in range(nodes))
    start = iso_to_ns(BASE_START) + int(seed % 97) * 60 * NS
    ips = tuple(f"10.{128 + (i >> 16) % 64}.{(i >> 8) & 255}.{i & 255 or 254}" for i in range(1, nodes + 1))
    uptime = rng.integers(2 * 86400, 40 * 86400, size=nodes)
    boot = tuple(int(start - int(u) * NS - int(rng.integers(0, NS))) for u in uptime)
    skew = tuple(int(x) for x in rng.integers(-15_000_000, 15_000_000, size=nodes))
    pid_base = tuple(int(x) for x in rng.integers(20_000, 3_000_000, size=nodes))
    agent = tuple(p - int(rng.integers(50, 400)) for p in pid_base)
    job_id = str(180_000 + (seed * 7919 + stable_hash(scenario)) % 20_000)
    return Cluster(nodes=names, gpus_per_node=gpus_per_node, job_id=job_id, start_ns=start,
                   end_ns=start + int(duration_s * NS), seed=seed, ips=ips, boot_ns=boot, skew_ns=skew,
                   pid_base=pid_base, agent_pid=agent)
