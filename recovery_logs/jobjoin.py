"""Join node-level findings to the jobs Slurm had running there. Pure.

A finding at time *t* on node *n* belongs to every job attempt whose allocation on *n* covers
*t* (``start <= t <= end + grace``; ``end`` null while it runs): one on an exclusive node,
several on a shared one, none for an idle node. Where the finding names a GPU, only the
attempts holding that GPU are kept: the GPU index comes from the finding itself (NVML), from
the GPU inventory (PCI bus id -> index: agent inventory events or the job's NCCL init lines,
``recovery_logs.inventory``), and a job whose own NCCL line named that bus id is the one using
it. Slurm's ``gres_detail`` gives each allocation's GPU indices (squeue); a sacct dump does
not, so on a shared node without those the finding belongs to all the node's jobs.

Two steps, both functions of (findings, allocations, inventory):

1. :func:`fill_jobs` — before attribution: a host-only finding that belongs to exactly one
   attempt takes its job id, so it groups with that job's own lines (the NCCL cascade).
2. :func:`annotate` — after attribution: every incident gets ``jobs`` (all affected jobs,
   ``job_id`` first), ``attempts`` (the attempt identity and size of each), an attempt-keyed
   id, and one evidence line that says what accounting says: agrees with the job's output
   (confidence up), disagrees (confidence down, both named), no job on the node, or that no
   accounting was given (so a reader knows why ``job_id`` is null).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import polars as pl

from recovery_logs.inventory import GpuInventory, normalise_pci
from recovery_logs.records import Evidence, Incident
from recovery_logs.schema import PROGRESS_CATEGORY
from recovery_logs.timeutil import ns_to_iso

GRACE_NS = 5 * 1_000_000_000
AGREE_BONUS = 0.05
DISAGREE_FACTOR = 0.85
NODE_CATEGORIES_NO_JOB = frozenset({"source_health"})


def _jobs_of_allocs(allocs: pl.DataFrame) -> pl.DataFrame:
    return allocs.filter(pl.col("step").is_null()).select(
        pl.col("node").alias("host"), pl.col("job_id").alias("_job"), "start", "end", "gpu_index", "attempt")


def fill_jobs(findings: pl.DataFrame, allocs: pl.DataFrame, inventory: GpuInventory | None = None,
              grace_ns: int = GRACE_NS) -> pl.DataFrame:
    """Host-only findings that fall in exactly one attempt's allocation take its job id."""
    if findings.height == 0 or allocs.height == 0:
        return findings
    idx = findings.with_row_index("_rid")
    need = idx.filter(pl.col("job_id").is_null() & pl.col("host").is_not_null()
                      & (pl.col("category") != PROGRESS_CATEGORY))
    if need.height == 0:
        return findings
    grace = pl.duration(nanoseconds=grace_ns)
    cand = (need.select("_rid", "host", "time", "gpu", "pci").join(_jobs_of_allocs(allocs), on="host")
            .filter((pl.col("time") >= pl.col("start"))
                    & (pl.col("end").is_null() | (pl.col("time") <= pl.col("end") + grace)))
            .filter(pl.col("gpu").is_null() | pl.col("gpu_index").is_null()
                    | pl.col("gpu_index").list.contains(pl.col("gpu"))))
    if cand.height == 0:
        return findings
    # the grace after an attempt's end only counts when no attempt covers the finding's time itself
    cand = (cand.with_columns((pl.col("end").is_null() | (pl.col("time") <= pl.col("end"))).alias("_exact"))
            .with_columns(pl.col("_exact").any().over("_rid").alias("_any_exact"))
            .filter(pl.col("_exact") | ~pl.col("_any_exact")))
    if inventory is not None and inventory.users:
        users = pl.DataFrame([(h, p, j) for (h, p), jobs in inventory.users.items() for j in jobs],
                             schema={"host": pl.String, "pci": pl.String, "_job": pl.String}, orient="row")
        cand = (cand.join(users.with_columns(pl.lit(True).alias("_user")), on=["host", "pci", "_job"], how="left")
                .with_columns(pl.col("_user").fill_null(False).any().over("_rid").alias("_any"))
                .filter(pl.col("_user") | ~pl.col("_any")))
    one = (cand.group_by("_rid").agg(pl.col("_job").unique().alias("_jobs"))
           .filter(pl.col("_jobs").list.len() == 1).select("_rid", pl.col("_jobs").list.first().alias("_job")))
    if one.height == 0:
        return findings
    return (idx.join(one, on="_rid", how="left", maintain_order="left")
            .with_columns(pl.coalesce("job_id", "_job").alias("job_id")).drop("_rid", "_job"))


def tag_attempts(findings: pl.DataFrame, allocs: pl.DataFrame, grace_ns: int = GRACE_NS) -> pl.DataFrame:
    """Add ``_attempt``: the attempt of the finding's job that ran at the finding's time (any node,
    job output often names no host); null when accounting has no such attempt. Attribution makes
    it part of the incident scope."""
    if findings.height == 0 or allocs.height == 0:
        return findings
    runs = (allocs.filter(pl.col("step").is_null()).group_by("attempt")
            .agg(pl.col("job_id").first().alias("_job"), pl.col("start").min().alias("_s"),
                 pl.col("end").max().alias("_e"), pl.col("end").is_null().any().alias("_open")))
    idx = findings.with_row_index("_rid")
    need = idx.filter(pl.col("job_id").is_not_null()).select("_rid", "job_id", "time")
    grace = pl.duration(nanoseconds=grace_ns)
    cand = (need.join(runs, left_on="job_id", right_on="_job")
            .filter((pl.col("time") >= pl.col("_s") - grace)
                    & (pl.col("_open") | (pl.col("time") <= pl.col("_e") + grace)))
            .sort(["_rid", "_s"], descending=[False, True]).unique("_rid", keep="first")
            .select("_rid", pl.col("attempt").alias("_attempt")))
    return idx.join(cand, on="_rid", how="left", maintain_order="left").drop("_rid")


def covering(allocs: pl.DataFrame, host: str, t_ns: int, gpu: int | None = None,
             users: list[str] | None = None, grace_ns: int = GRACE_NS) -> list[dict[str, Any]]:
    """The attempts allocated on ``host`` at ``t_ns`` (GPU-aware), each with its whole size."""
    if allocs.height == 0:
        return []
    t = pl.lit(t_ns).cast(pl.Datetime("ns", "UTC"))
    rows = allocs.filter((pl.col("node") == host) & pl.col("step").is_null() & (pl.col("start") <= t)
                         & (pl.col("end").is_null() | (pl.col("end") + pl.duration(nanoseconds=grace_ns) >= t)))
    exact = rows.filter(pl.col("end").is_null() | (pl.col("end") >= t))
    rows = exact if exact.height else rows       # the grace after an end only when nothing covers t itself
    if gpu is not None:
        rows = rows.filter(pl.col("gpu_index").is_null() | pl.col("gpu_index").list.contains(gpu))
    if users:
        mine = rows.filter(pl.col("job_id").is_in(users))
        rows = mine if mine.height else rows
    out = []
    for r in rows.sort(["start", "job_id"]).iter_rows(named=True):
        whole = allocs.filter((pl.col("attempt") == r["attempt"]) & pl.col("step").is_null())
        out.append({"job_id": r["job_id"], "cluster": r["cluster"], "attempt": r["attempt"], "chain": r["chain"],
                    "restart_count": r["restart_count"], "submit": _iso(r["submit"]), "start": _iso(r["start"]),
                    "end": _iso(r["end"]), "state": r["state"], "exit_code": r["exit_code"],
                    "gpus": int(whole.get_column("gpus").fill_null(0).sum()),
                    "nodes": sorted(whole.get_column("node").to_list()),
                    "gpu_index": r["gpu_index"], "user": r["user"], "partition": r["partition"]})
    return out


def _iso(v: Any) -> str | None:
    if v is None:
        return None
    return ns_to_iso(round(v.timestamp() * 1e6) * 1000)


def attempt_id(inc_id: str, attempt: str) -> str:
    """An incident id keyed on the attempt: a reused job id never shares an incident (or its
    idempotency keys) with an earlier job of the same id."""
    return "inc-" + hashlib.sha256(f"{inc_id}|{attempt}".encode()).hexdigest()[:12]


def annotate(incidents: list[Incident], allocs: pl.DataFrame | None, inventory: GpuInventory | None = None,
             spans: pl.DataFrame | None = None, grace_s: float = 900.0) -> list[Incident]:
    """Give each incident its jobs, attempts and what accounting says (see module doc).

    ``allocs`` None: no accounting input at all; ``spans``: the (host, job) spans of the job output
    in the input (agreement is only claimed against a job's own output, never against accounting)."""
    return [_annotate_one(inc, allocs, inventory, spans, int(grace_s * 1e9)) for inc in incidents]


def _log_jobs(spans: pl.DataFrame | None, host: str, t_ns: int, grace_ns: int) -> list[str]:
    """Jobs whose own output puts them on ``host`` around ``t_ns``."""
    if spans is None or spans.height == 0:
        return []
    t = pl.lit(t_ns).cast(pl.Datetime("ns", "UTC"))
    g = pl.duration(nanoseconds=grace_ns)
    return sorted(spans.filter((pl.col("host") == host) & (pl.col("first") - g <= t) & (pl.col("last") + g >= t))
                  .get_column("job_id").unique().to_list())


def _annotate_one(inc: Incident, allocs: pl.DataFrame | None, inventory: GpuInventory | None,
                  spans: pl.DataFrame | None, grace_ns: int) -> Incident:
    if inc.category in NODE_CATEGORIES_NO_JOB:
        return inc
    rec = inventory.lookup(inc.node, inc.pci) if inventory is not None else None
    gpu = inc.gpu if inc.gpu is not None else (rec.gpu if rec is not None else None)
    changes: dict[str, Any] = {}
    if gpu is not None and inc.gpu is None:
        changes["gpu"] = gpu
    if rec is not None and rec.uuid:
        changes["gpu_uuid"] = rec.uuid
    if inc.node is None:
        return replace(inc, jobs=(inc.job_id,) if inc.job_id else (), **changes)
    where = f"{inc.node} at {ns_to_iso(inc.first_seen)}" + (f" GPU {gpu}" if gpu is not None else "")
    if allocs is None:
        if inc.job_id:
            return replace(inc, jobs=(inc.job_id,), **changes)
        ev = Evidence(inc.first_seen, inc.node, f"accounting: none in the input, so the job(s) on {where} are not "
                      "known (replay --accounting FILE|sacct, or watch --slurm)", "accounting.none", "accounting")
        return replace(inc, evidence=(*inc.evidence, ev), **changes)
    users = inventory.jobs_on(inc.node, inc.pci) if inventory is not None else []
    cov = covering(allocs, inc.node, inc.first_seen, gpu, users)
    ids = list(dict.fromkeys(a["job_id"] for a in cov))
    logs = _log_jobs(spans, inc.node, inc.first_seen, grace_ns)
    job = inc.job_id or (ids[0] if ids else None)
    jobs = tuple(dict.fromkeys([j for j in (job,) if j] + ids)) if (job in ids or not job) else (job,)
    conf = inc.confidence
    named = ", ".join("job " + j for j in ids)
    if logs and ids and job in ids and job in logs:
        a = next(a for a in cov if a["job_id"] == job)
        msg = (f"accounting agrees with the job's output: job {job} (attempt {a['restart_count']}, "
               f"{a['gpus']} GPUs on {','.join(a['nodes'])}) was allocated on {where}")
        conf, rid = min(1.0, conf + AGREE_BONUS), "accounting.agree"
    elif logs and not set(logs) & set(ids):
        seen = named or "no job"
        msg = (f"accounting disagrees: the job output puts {', '.join('job ' + j for j in logs)} on {where}, "
               f"but Slurm accounting shows {seen}")
        conf, rid = conf * DISAGREE_FACTOR, "accounting.disagree"
    elif inc.job_id and inc.job_id not in ids:
        msg = f"accounting disagrees: the logs name job {inc.job_id}, but Slurm accounting shows " \
              f"{named or 'no job'} on {where}"
        conf, rid = conf * DISAGREE_FACTOR, "accounting.disagree"
    elif ids:
        shared = f" (shared node: {len(ids)} jobs)" if len(ids) > 1 else ""
        a = next(a for a in cov if a["job_id"] == job)
        msg = (f"accounting: {named} allocated on {where}{shared}; job {job} attempt {a['restart_count']}, "
               f"{a['gpus']} GPUs on {','.join(a['nodes'])}")
        rid = "accounting.job"
    else:
        msg = f"accounting: no job was allocated on {where} (a node incident)"
        rid = "accounting.no_job"
    if job and not inc.job_id:
        changes["job_id"] = job
    attempts = tuple(dict(a) for a in cov if a["job_id"] in jobs)
    primary = next((a for a in attempts if a["job_id"] == job), None)
    new_id = attempt_id(inc.id, primary["attempt"]) if primary else inc.id
    ev = Evidence(inc.first_seen, inc.node, msg, rid, "accounting")
    actions = tuple(replace(p, incident_id=new_id) if p.incident_id == inc.id else p for p in inc.actions)
    return replace(inc, id=new_id, jobs=jobs, attempts=attempts, confidence=conf, evidence=(*inc.evidence, ev),
                   actions=actions, **changes)


def logged_jobs(spans: pl.DataFrame) -> set[str]:
    """Jobs whose own output is in the input (the engine's (host, job) spans)."""
    if spans.height == 0:
        return set()
    return set(spans.get_column("job_id").drop_nulls().unique().to_list())


__all__ = ["GRACE_NS", "annotate", "attempt_id", "covering", "fill_jobs", "logged_jobs", "normalise_pci",
           "tag_attempts"]
