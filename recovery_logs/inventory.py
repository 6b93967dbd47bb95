"""GPU inventory: which GPU (index, UUID) sits at which PCI bus id on which host, and which job
uses it. Pure functions over event frames; the engine keeps the latest answer per (host, PCI).

Two inputs say it:

* the NVML agent's **inventory events** (``recovery_logs.sources.nvml``), one per GPU at start
  and whenever it changes::

      NVML gpu=3 uuid=GPU-8f1e... pci=0000:cb:00.0 inventory name="NVIDIA H200" serial="1650924060123" ...

* the job's own **NCCL init lines**, which name the CUDA device, the NVML device (NCCL ≥ 2.19)
  and the bus id of every rank (``NVIDIA/nccl`` issue #1814, #1029)::

      hostname-test:984:1257 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE
      A03-R28-I49-3-9000018:193027:193119 [7] NCCL INFO comm 0x7fdf08000d00 rank 15 nranks 16 cudaDev 7 busId e7000 - Init COMPLETE

  NCCL's ``busId`` is the PCI id with the separators removed (``0000:9b:00.0`` -> ``9b000``);
  ``cudaDev`` counts only the devices the job can see (``CUDA_VISIBLE_DEVICES``), ``nvmlDev``
  is the host's own index. A job's line ties that bus id to the job.

PCI ids are normalised as the rules do (``0000:cb:00``: lower case, 4-digit domain, no function).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import polars as pl

_INV_RE = re.compile(r"^NVML gpu=(?P<gpu>-?\d+) uuid=(?P<uuid>\S+) pci=(?P<pci>\S+) inventory(?P<rest>.*)$")
_KV_RE = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|(\S+))')
_NCCL_BUS_RE = (r"(?:^|\s)(?:(?P<h>[A-Za-z0-9_.-]+):\d+:\d+ \[\d+\] )?NCCL INFO (?:ncclCommInitRank )?comm 0x[0-9a-f]+ rank \d+ "
                r"n[Rr]anks \d+ cudaDev (?P<cuda>\d+)(?: nvmlDev (?P<nvml>\d+))? busId (?P<bus>[0-9a-f]+)")


def normalise_pci(pci: str | None) -> str | None:
    """``00000000:CB:00.0`` / ``0000:cb:00.0`` / ``cb:00.0`` -> ``0000:cb:00`` (the rules' spelling)."""
    if not pci:
        return None
    m = re.fullmatch(r"(?:pci:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", pci.strip())
    if not m:
        return None
    dom = (m.group(1) or "0000")[-4:]
    return f"{dom}:{m.group(2)}:{m.group(3)}".lower()


def nccl_bus_to_pci(bus: str) -> str | None:
    """NCCL's ``busId`` (``9b000``, ``1b000``, ``7000``) -> ``0000:9b:00``."""
    try:
        v = int(bus, 16)
    except ValueError:
        return None
    dev, b, dom = (v >> 4) & 0xFF, (v >> 12) & 0xFF, v >> 20
    return f"{dom:04x}:{b:02x}:{dev:02x}"


@dataclass(frozen=True)
class GpuRecord:
    host: str
    pci: str            # normalised
    gpu: int | None     # NVML (host) index
    uuid: str | None
    time_ns: int
    fields: tuple[tuple[str, str], ...] = ()   # the inventory event's other fields (name, serial, ...)
    job_id: str | None = None                  # set for NCCL lines: the job that used this GPU


def parse_inventory_message(message: str) -> dict[str, Any] | None:
    """One agent inventory message -> ``{"gpu", "uuid", "pci", **fields}``; None if it is not one."""
    m = _INV_RE.match(message or "")
    if not m:
        return None
    out: dict[str, Any] = {"gpu": int(m.group("gpu")), "uuid": m.group("uuid"), "pci": m.group("pci")}
    for k, quoted, plain in _KV_RE.findall(m.group("rest")):
        out[k] = quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted or not plain else plain
    return out


def inventory_records(events: pl.DataFrame) -> list[GpuRecord]:
    """NVML inventory events in a batch (cheap: a literal prefilter first)."""
    cand = events.filter(pl.col("message").str.starts_with("NVML gpu="))
    cand = cand.filter(pl.col("message").str.contains(" inventory", literal=True)) if cand.height else cand
    out = []
    for host, t, msg in cand.select("host", pl.col("time").dt.epoch("ns"), "message").iter_rows():
        d = parse_inventory_message(msg)
        pci = normalise_pci(d["pci"]) if d else None
        if d is None or pci is None or host is None:
            continue
        extra = tuple((k, str(v)) for k, v in d.items() if k not in ("gpu", "uuid", "pci"))
        out.append(GpuRecord(host, pci, d["gpu"] if d["gpu"] >= 0 else None,
                             None if d["uuid"] == "unknown" else d["uuid"], int(t or 0), extra))
    return out


def nccl_gpu_records(events: pl.DataFrame) -> list[GpuRecord]:
    """(host, bus id) -> NVML index and job from NCCL init lines."""
    cand = events.filter(pl.col("message").str.contains("busId", literal=True))
    cand = cand.filter(pl.col("message").str.contains("NCCL INFO", literal=True)) if cand.height else cand
    if cand.height == 0:
        return []
    got = (cand.with_columns(pl.col("message").str.extract_groups(_NCCL_BUS_RE).alias("_m"))
           .select(pl.coalesce(pl.col("_m").struct.field("h"), pl.col("host")).alias("h"),
                   pl.col("_m").struct.field("nvml").alias("nvml"), pl.col("_m").struct.field("bus").alias("bus"),
                   pl.col("time").dt.epoch("ns").alias("t"), "job_id")
           .filter(pl.col("bus").is_not_null() & pl.col("h").is_not_null()))
    out = []
    for h, nvml, bus, t, job in got.iter_rows():
        pci = nccl_bus_to_pci(bus)
        if pci is not None:
            out.append(GpuRecord(h.split(".")[0], pci, int(nvml) if nvml is not None else None, None, int(t or 0),
                                 job_id=job))
    return out


class GpuInventory:
    """The latest inventory per (host, PCI), plus the jobs seen using each GPU (NCCL lines).
    ``update`` is order-free (the latest time wins, ties by content), so replay and watch over any
    split agree. The agent's inventory outranks what a job's NCCL line says about the index."""

    def __init__(self) -> None:
        self.agent: dict[tuple[str, str], GpuRecord] = {}
        self.nccl: dict[tuple[str, str], GpuRecord] = {}
        self.users: dict[tuple[str, str], dict[str, int]] = {}   # (host, pci) -> job -> first time

    def __len__(self) -> int:
        return len(self.agent) + len(self.nccl)

    @staticmethod
    def _newer(a: GpuRecord, b: GpuRecord | None) -> bool:
        return b is None or (a.time_ns, repr(a)) > (b.time_ns, repr(b))

    def update(self, records: list[GpuRecord]) -> None:
        for r in records:
            key = (r.host, r.pci)
            if r.job_id is not None:
                jobs = self.users.setdefault(key, {})
                jobs[r.job_id] = min(jobs.get(r.job_id, r.time_ns), r.time_ns)
            target = self.agent if r.job_id is None else self.nccl
            if (r.gpu is not None or r.job_id is None) and self._newer(r, target.get(key)):
                target[key] = r

    def lookup(self, host: str | None, pci: str | None) -> GpuRecord | None:
        p = normalise_pci(pci) if pci else None
        if host is None or p is None:
            return None
        return self.agent.get((host, p)) or self.nccl.get((host, p))

    def jobs_on(self, host: str | None, pci: str | None) -> list[str]:
        p = normalise_pci(pci) if pci else None
        if host is None or p is None:
            return []
        return sorted(self.users.get((host, p), {}))

    def per_host(self) -> dict[str, list[GpuRecord]]:
        """The latest agent inventory of every host, by GPU index."""
        out: dict[str, list[GpuRecord]] = {}
        for r in sorted(self.agent.values(), key=lambda r: (r.host, r.gpu if r.gpu is not None else -1)):
            out.setdefault(r.host, []).append(r)
        return out

    def index_map(self) -> dict[str, int]:
        """``"host|pci"`` -> GPU index (agent first, else a job's nvmlDev)."""
        out = {f"{h}|{p}": r.gpu for (h, p), r in self.nccl.items() if r.gpu is not None}
        out.update({f"{h}|{p}": r.gpu for (h, p), r in self.agent.items() if r.gpu is not None})
        return out


def fill_gpus(findings: pl.DataFrame, inventory: GpuInventory) -> pl.DataFrame:
    """Findings that name a PCI bus id but no GPU get the GPU index from the inventory."""
    if len(inventory) == 0 or findings.height == 0:
        return findings
    mapping = inventory.index_map()
    if not mapping:
        return findings
    key = pl.col("host") + "|" + pl.col("pci")
    looked = key.replace_strict(list(mapping), list(mapping.values()), default=None, return_dtype=pl.Int32)
    return findings.with_columns(
        pl.when(pl.col("gpu").is_null() & pl.col("pci").is_not_null()).then(looked).otherwise(pl.col("gpu"))
        .alias("gpu"))


__all__ = ["GpuInventory", "GpuRecord", "fill_gpus", "inventory_records", "nccl_bus_to_pci", "nccl_gpu_records",
           "normalise_pci", "parse_inventory_message"]
