"""Slurm accounting as an input stream: the **allocations** frame.

One row per (job attempt, node): who ran where, when, with which GPUs. It is what the engine
joins node-level findings against (``recovery_logs.jobjoin``), what the time-to-resume ledger
reads, and what a notebook (or a sharding planner) loads with :func:`load_accounting`.

``ALLOCATION_SCHEMA``::

    cluster         Slurm cluster name ("" when the dump does not say)
    job_id          the job's own (raw) id, as scontrol/scancel accept it
    array_job_id    array parent id, or null     array_task_id   array index, or null
    het_job_id      heterogeneous leader id, or null   het_offset  component, or null
    step            null for the job allocation (the only rows the join uses)
    user, partition, name
    node            one node of the allocation (hostlists are expanded)
    gpus            GPUs allocated on this node
    gpu_index       the node's GPU indices when Slurm says (squeue ``gres_detail`` IDX), else null
    submit, start, end   Datetime(ns, UTC); ``end`` null while the attempt runs
    state           RUNNING, REQUEUED, FAILED, NODE_FAIL, ... (sacct/squeue spelling)
    exit_code, signal    the job's exit status, when known (see below)
    restart_count   0 for the first run, +1 per requeue
    attempt         "cluster:job_id:submit_s:restart_count" — the attempt identity
    chain           "cluster:job_id:first_submit_s" — one job across its requeues
    source          sacct-json | sacct-parsable | squeue-json

Attempt identity: Slurm keeps the job id across requeues and reuses ids once its state (or the
accounting database) is wiped, so an id alone names neither an attempt nor a job. Measured on
22.05.8: a requeue sets the new run's ``submit`` to the requeue time (= the previous run's end);
``squeue --json`` carries ``restart_cnt``, sacct does not, so for sacct rows the restart count
is the run's place in its chain: runs of one id, ordered by submit, where each earlier run
ended REQUEUED / NODE_FAIL / PREEMPTED or ended when the next was submitted.

Exit codes: 22.05's ``sacct --json`` says SUCCESS/0 for every plain non-zero exit; ``squeue
--json`` carries the raw wait status (``93 << 8``) and ``sacct -P`` the right ``93:0``. The
poller takes exit codes from squeue; a ``sacct -P`` dump is right by itself.

Sources: :func:`load_accounting` (a saved ``sacct --json`` or ``sacct -P`` dump; a malformed
or truncated dump is an ``InputError`` naming the file and the record; a JSON dump from an
unknown data_parser is read best-effort with a warning, and a record it cannot read is an
error that says to dump with ``-P``), :func:`sacct_range` (live sacct for a replayed time
range) and :class:`AccountingPoller` (watch: ``squeue --json`` at most once per
``squeue_interval_s``, ``sacct --json`` at most once per ``sacct_interval_s`` from a cursor;
a command that times out or cannot reach slurmctld/slurmdbd leaves the frame as it was and
marks the source blind — see ``recovery_logs.source_health``).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import InputError, SlurmError, SlurmUnavailable
from recovery_logs.source_health import SourceHealth
from recovery_logs.sources.slurm import (
    CommandRunner,
    SubprocessRunner,
    check,
    expand_hostlist,
    parse_tres,
)

log = logging.getLogger("recovery_logs.accounting")

NS = 1_000_000_000
TIME = pl.Datetime("ns", "UTC")
ALLOCATION_SCHEMA: dict[str, Any] = {
    "cluster": pl.String, "job_id": pl.String, "array_job_id": pl.String, "array_task_id": pl.String,
    "het_job_id": pl.String, "het_offset": pl.Int32, "step": pl.String, "user": pl.String,
    "partition": pl.String, "name": pl.String, "node": pl.String, "gpus": pl.Int32,
    "gpu_index": pl.List(pl.Int32), "submit": TIME, "start": TIME, "end": TIME, "state": pl.String,
    "exit_code": pl.Int32, "signal": pl.Int32, "restart_count": pl.Int32, "attempt": pl.String,
    "chain": pl.String, "source": pl.String,
}
KEY = ["cluster", "job_id", "submit", "node"]
KNOWN_JSON = re.compile(r"dbv0\.0\.3[6-9]|data_parser/v0\.0\.(39|40|41|42)")
CHAIN_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "NODE_FAIL", "PREEMPTED"})
ACCOUNTING_FIELDS = ("JobIDRaw,JobID,Cluster,User,Partition,JobName,State,ExitCode,NodeList,Submit,Start,End,"
                     "AllocTRES")
_RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "PENDING"})


def empty_allocations() -> pl.DataFrame:
    return pl.DataFrame(schema=ALLOCATION_SCHEMA)


# ---------------------------------------------------------------------------- small parsers
def _num(v: Any) -> int | None:
    """22.05 ints, later ``{"set": true, "infinite": false, "number": N}`` objects."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool):
        return None
    return int(v) if isinstance(v, int | float) else None


def _epoch_ns(v: Any) -> int | None:
    n = _num(v)
    return n * NS if n is not None and n > 0 else None


def _state(v: Any) -> str:
    if isinstance(v, dict):
        v = v.get("current")
    if isinstance(v, list):
        v = v[0] if v else "UNKNOWN"
    return str(v or "UNKNOWN").split(" ")[0].upper()


def gpu_indices(detail: str | None) -> list[int] | None:
    """``gpu:h100:2(IDX:0-1)`` / ``gpu:2(IDX:0,2-3)`` -> [0, 1] / [0, 2, 3]; None when not given."""
    if not detail:
        return None
    m = re.search(r"IDX:([0-9,\-]+)", detail)
    if not m:
        return None
    out: list[int] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), int(hi) + 1) if hi.isdigit() else [int(lo)])
    return out


def _gres_count(detail: str) -> int | None:
    m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", detail or "")
    return int(m.group(1)) if m else None


def _total_gpus(tres: Mapping[str, float]) -> int:
    if "gres/gpu" in tres:
        return int(tres["gres/gpu"])
    return int(sum(v for k, v in tres.items() if k.startswith("gres/gpu:")))


def _text_time(v: str) -> int | None:
    """sacct text times are the local time of the host that ran sacct."""
    v = (v or "").strip()
    if not v or v in ("Unknown", "None", "N/A"):
        return None
    return int(time.mktime(time.strptime(v, "%Y-%m-%dT%H:%M:%S"))) * NS


def _str_or_none(v: Any) -> str | None:
    n = _num(v)
    if n is None or n == 0:
        return None
    return str(n)


@dataclass
class _Run:
    """One attempt before it is exploded per node."""

    cluster: str
    job_id: str
    nodes: list[str]
    gpus_total: int
    submit: int | None
    start: int | None
    end: int | None
    state: str
    source: str
    user: str | None = None
    partition: str | None = None
    name: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    het_job_id: str | None = None
    het_offset: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int | None = None
    per_node: list[tuple[int | None, list[int] | None]] = field(default_factory=list)  # (gpus, indices)


# ---------------------------------------------------------------------------- sacct --json
def _run_from_sacct_json(j: Mapping[str, Any], cluster_default: str) -> _Run:
    tres: dict[str, float] = {}
    for t in (j.get("tres") or {}).get("allocated", []) or []:
        count = _num(t.get("count"))
        if count is None:
            continue
        tres[str(t["type"]) + (f"/{t['name']}" if t.get("name") else "")] = float(count)
    ec = j.get("exit_code") or {}
    sig = _num((ec.get("signal") or {}).get("signal_id")) if isinstance(ec, dict) else None
    rc = _num(ec.get("return_code")) if isinstance(ec, dict) else None
    t = j.get("time") or {}
    arr, het = j.get("array") or {}, j.get("het") or {}
    nodes = expand_hostlist(j.get("nodes") if isinstance(j.get("nodes"), str) else None)
    job_id = _num(j["job_id"])
    if job_id is None:
        raise ValueError(f"job_id {j['job_id']!r} is not a number")
    return _Run(cluster=str(j.get("cluster") or cluster_default), job_id=str(job_id), nodes=nodes,
                gpus_total=_total_gpus(tres), submit=_epoch_ns(t.get("submission")), start=_epoch_ns(t.get("start")),
                end=_epoch_ns(t.get("end")), state=_state(j.get("state")), source="sacct-json",
                user=j.get("user"), partition=j.get("partition"), name=j.get("name"),
                array_job_id=_str_or_none(arr.get("job_id")), array_task_id=_str_or_none(arr.get("task_id")),
                het_job_id=_str_or_none(het.get("job_id")), het_offset=_num(het.get("job_offset")),
                exit_code=rc, signal=sig if sig else None)


def runs_from_sacct_json(data: Any, *, path: str = "<sacct --json>") -> list[_Run]:
    """Every run in a ``sacct --json`` document; InputError naming ``path`` and the record."""
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise InputError("accounting: not a sacct --json document (no 'jobs' list)", path=path)
    plugin = str(((data.get("meta") or {}).get("plugin") or {}).get("type", ""))
    if not KNOWN_JSON.search(plugin):
        log.warning("accounting: %s comes from an unknown sacct JSON data parser %r; reading it best-effort "
                    "(dump with `sacct -P -o %s` if records fail)", path, plugin, ACCOUNTING_FIELDS)
    out = []
    for i, j in enumerate(data["jobs"]):
        try:
            out.append(_run_from_sacct_json(j, ""))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            jid = j.get("job_id") if isinstance(j, dict) else None
            hint = "" if KNOWN_JSON.search(plugin) else f"; unknown data parser {plugin!r}: dump with sacct -P"
            raise InputError(f"accounting: record {i} of {path} is malformed ({type(exc).__name__}: {exc}){hint}",
                             path=path, record=i, job_id=jid) from exc
    return out


# ---------------------------------------------------------------------------- sacct -P
def runs_from_parsable(text: str, *, path: str = "<sacct -P>") -> list[_Run]:
    """``sacct -P -D -X -o JobIDRaw,JobID,Cluster,...`` (any subset holding JobID/JobIDRaw, NodeList,
    Submit, Start, End, State). Step rows (``1.batch``) are skipped; a row with the wrong number of
    fields (a truncated dump) is an InputError naming the file and the line."""
    lines = text.splitlines()
    body = [(n, ln) for n, ln in enumerate(lines, 1) if ln.strip()]
    if not body:
        return []
    head = body[0][1].split("|")
    need = {"NodeList", "Start", "End", "State"}
    if not ({"JobID", "JobIDRaw"} & set(head)) or not need <= set(head):
        raise InputError("accounting: sacct -P header lacks JobID/NodeList/Start/End/State", path=path, line=body[0][0],
                         header=body[0][1][:200])
    out = []
    for n, ln in body[1:]:
        parts = ln.split("|")
        if len(parts) != len(head):
            raise InputError(f"accounting: line {n} of {path} has {len(parts)} fields, the header {len(head)} "
                             "(truncated or not a sacct -P dump)", path=path, line=n, record=ln[:200])
        row = dict(zip(head, parts, strict=True))
        jid = row.get("JobIDRaw") or row.get("JobID", "")
        if "." in jid or "." in row.get("JobID", ""):
            continue
        try:
            code, _, sig = row.get("ExitCode", "").partition(":")
            tres = parse_tres(row.get("AllocTRES"))
            arr = re.fullmatch(r"(\d+)_(\d+)", row.get("JobID", ""))
            het = re.fullmatch(r"(\d+)\+(\d+)", row.get("JobID", ""))
            if not re.fullmatch(r"\d+", jid.split("_")[0].split("+")[0]):
                raise ValueError(f"job id {jid!r}")
            out.append(_Run(cluster=row.get("Cluster", ""), job_id=jid, nodes=expand_hostlist(row.get("NodeList")),
                            gpus_total=_total_gpus(tres), submit=_text_time(row.get("Submit", "")),
                            start=_text_time(row.get("Start", "")), end=_text_time(row.get("End", "")),
                            state=_state(row.get("State")), source="sacct-parsable", user=row.get("User"),
                            partition=row.get("Partition"), name=row.get("JobName"),
                            array_job_id=arr.group(1) if arr else None, array_task_id=arr.group(2) if arr else None,
                            het_job_id=het.group(1) if het else None, het_offset=int(het.group(2)) if het else None,
                            exit_code=int(code) if code.isdigit() else None,
                            signal=int(sig) if sig.isdigit() and int(sig) else None))
        except ValueError as exc:
            raise InputError(f"accounting: line {n} of {path} is malformed ({exc})", path=path, line=n,
                             record=ln[:200]) from exc
    return out


# ---------------------------------------------------------------------------- squeue --json
def runs_from_squeue_json(data: Any) -> list[_Run]:
    """``squeue --json`` (running, pending and recently finished jobs): GPU indices per node,
    ``restart_cnt`` and the raw exit status. Pending jobs have no allocation and are skipped."""
    out = []
    for j in (data or {}).get("jobs", []) or []:
        state = _state(j.get("job_state"))
        nodes = expand_hostlist(j.get("nodes") or None)
        if not nodes or state == "PENDING":
            continue
        details = list(j.get("gres_detail") or [])
        per_node = [(_gres_count(d), gpu_indices(d)) for d in details] if len(details) == len(nodes) else []
        raw = _num(j.get("exit_code"))
        code = sig = None
        if raw is not None and state not in _RUNNING:
            code, sig = (raw >> 8) & 0xFF, raw & 0x7F
        end = _epoch_ns(j.get("end_time")) if state not in _RUNNING else None
        out.append(_Run(cluster=str(j.get("cluster") or ""), job_id=str(_num(j["job_id"])), nodes=nodes,
                        gpus_total=_total_gpus(parse_tres(j.get("tres_alloc_str"))),
                        submit=_epoch_ns(j.get("submit_time")), start=_epoch_ns(j.get("start_time")), end=end,
                        state=state, source="squeue-json", user=j.get("user_name"), partition=j.get("partition"),
                        name=j.get("name"), array_job_id=_str_or_none(j.get("array_job_id")),
                        array_task_id=_str_or_none(j.get("array_task_id")),
                        het_job_id=_str_or_none(j.get("het_job_id")), het_offset=_num(j.get("het_job_offset"))
                        if _str_or_none(j.get("het_job_id")) else None,
                        exit_code=code, signal=sig or None, restart_count=_num(j.get("restart_cnt")),
                        per_node=per_node))
    return out


# ---------------------------------------------------------------------------- frame
def frame_from_runs(runs: Iterable[_Run]) -> pl.DataFrame:
    """Explode runs per node; attempt identity is filled by :func:`with_attempts`."""
    cols: dict[str, list[Any]] = {k: [] for k in ALLOCATION_SCHEMA}
    for r in runs:
        if not r.nodes:
            continue
        share = r.gpus_total // len(r.nodes) if r.nodes else 0
        for i, node in enumerate(r.nodes):
            n_gpu, idx = r.per_node[i] if i < len(r.per_node) else (None, None)
            vals = {"cluster": r.cluster, "job_id": r.job_id, "array_job_id": r.array_job_id,
                    "array_task_id": r.array_task_id, "het_job_id": r.het_job_id, "het_offset": r.het_offset,
                    "step": None, "user": r.user, "partition": r.partition, "name": r.name, "node": node,
                    "gpus": n_gpu if n_gpu is not None else share, "gpu_index": idx, "submit": r.submit,
                    "start": r.start, "end": r.end, "state": r.state, "exit_code": r.exit_code, "signal": r.signal,
                    "restart_count": r.restart_count, "attempt": None, "chain": None, "source": r.source}
            for k, v in vals.items():
                cols[k].append(v)
    df = pl.DataFrame({k: v for k, v in cols.items() if k not in ("submit", "start", "end")},
                      schema={k: t for k, t in ALLOCATION_SCHEMA.items() if k not in ("submit", "start", "end")})
    df = df.with_columns(*[pl.Series(k, cols[k], dtype=pl.Int64).cast(TIME) for k in ("submit", "start", "end")])
    return with_attempts(df.select(list(ALLOCATION_SCHEMA)))


def with_attempts(df: pl.DataFrame) -> pl.DataFrame:
    """Fill ``restart_count`` (where the source did not give it), ``attempt`` and ``chain``."""
    if df.height == 0:
        return df
    runs = (df.group_by(["cluster", "job_id", "submit"], maintain_order=True)
            .agg(pl.col("end").first(), pl.col("state").first(), pl.col("restart_count").max())
            .sort(["cluster", "job_id", "submit"], nulls_last=True))
    rc, chain = [], []
    prev: tuple[Any, ...] | None = None
    count, first = 0, 0
    for c, j, sub, end, state, given in runs.iter_rows():
        sub_s = int(sub.timestamp()) if sub is not None else 0
        same = prev is not None and prev[0] == c and prev[1] == j and (
            prev[3] in CHAIN_STATES or (prev[2] is not None and sub is not None and abs(sub_s - prev[2]) <= 2))
        count, first = (count + 1, first) if same else (0, sub_s)
        if given is not None:
            count = int(given)
        rc.append(count)
        chain.append(f"{c}:{j}:{first}")
        prev = (c, j, int(end.timestamp()) if end is not None else None, state)
    runs = runs.with_columns(pl.Series("_rc", rc, dtype=pl.Int32), pl.Series("_chain", chain))
    out = df.join(runs.select("cluster", "job_id", "submit", "_rc", "_chain"), on=["cluster", "job_id", "submit"],
                  how="left", nulls_equal=True)
    return out.with_columns(
        pl.coalesce("restart_count", "_rc").alias("restart_count"),
        pl.col("_chain").alias("chain"),
        (pl.col("cluster") + ":" + pl.col("job_id") + ":"
         + pl.col("submit").dt.epoch("s").cast(pl.String).fill_null("0") + ":"
         + pl.coalesce("restart_count", "_rc").cast(pl.String)).alias("attempt"),
    ).select(list(ALLOCATION_SCHEMA))


def merge_allocations(old: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """The newer observation of an attempt wins; GPU indices, exit codes and restart counts it
    lacks are kept from the older one (squeue knows indices, sacct outlives squeue's memory), and
    an attempt seen ended stays ended (slurmdbd lags slurmctld: a sacct answer may still say
    RUNNING for a job squeue already shows CANCELLED)."""
    if old.height == 0:
        return new
    if new.height == 0:
        return old
    both = pl.concat([old.with_columns(pl.lit(0).alias("_o")), new.with_columns(pl.lit(1).alias("_o"))])
    keep = ("gpu_index", "exit_code", "signal", "end")
    ended = pl.col("end").is_not_null()
    merged = (both.sort("_o").group_by(KEY, maintain_order=True)
              .agg(*[pl.col(c).last() for c in ALLOCATION_SCHEMA
                     if c not in KEY and c not in keep and c not in ("state", "restart_count")],
                   *[pl.col(c).drop_nulls().last() for c in keep],
                   # squeue's restart_cnt is Slurm's own count; one computed from a sacct window that
                   # misses earlier runs can only be lower
                   pl.col("restart_count").max(),
                   # an attempt that ended never runs again: sacct lagging slurmctld cannot resurrect it
                   pl.when(ended.any()).then(pl.col("state").filter(ended).last()).otherwise(pl.col("state").last())
                   .alias("state")))
    return with_attempts(merged.select(list(ALLOCATION_SCHEMA)).sort(["cluster", "job_id", "submit", "node"],
                                                                      nulls_last=True))


# ---------------------------------------------------------------------------- public loaders
def parse_accounting_text(text: str, *, path: str = "<accounting>") -> pl.DataFrame:
    """A saved dump (``sacct --json``, ``squeue --json`` or ``sacct -P``) as the allocations frame."""
    s = text.lstrip()
    if s.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"accounting: {path} is not valid JSON (truncated?): {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}", path=path, line=exc.lineno) from exc
        if isinstance(data, dict) and data.get("jobs") and isinstance(data["jobs"], list) \
                and isinstance(data["jobs"][0], dict) and "job_state" in data["jobs"][0]:
            return frame_from_runs(runs_from_squeue_json(data))
        return frame_from_runs(runs_from_sacct_json(data, path=path))
    return frame_from_runs(runs_from_parsable(text, path=path))


def load_accounting(path: str | Path) -> pl.DataFrame:
    """Load a saved ``sacct --json`` / ``sacct -P`` / ``squeue --json`` dump (gzip allowed) as the
    allocations frame (``ALLOCATION_SCHEMA``, one row per attempt and node). For notebooks,
    ``replay --accounting FILE`` and anything that plans over allocations (sharding)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except FileNotFoundError as exc:
        raise InputError("accounting: file not found", path=str(p)) from exc
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"accounting: cannot read {p}: {exc}", path=str(p)) from exc
    return parse_accounting_text(text, path=str(p))


def _sacct_time(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ns / NS))


def sacct_range(start_ns: int, end_ns: int, runner: CommandRunner | None = None, timeout_s: float = 30.0
                ) -> pl.DataFrame:
    """Ask the live ``sacct`` for every attempt that overlapped ``[start, end]`` (replay
    ``--accounting sacct``). ``--json`` first; an unknown JSON shape falls back to ``-P`` with a
    warning."""
    runner = runner or SubprocessRunner()
    sel = ["-a", "-D", "-S", _sacct_time(start_ns - 86400 * NS), "-E", _sacct_time(end_ns)]
    frame = _sacct(runner, sel, timeout_s, None)
    lo, hi = pl.lit(start_ns).cast(TIME), pl.lit(end_ns).cast(TIME)
    return frame.filter((pl.col("start") <= hi) & (pl.col("end").is_null() | (pl.col("end") >= lo)))


def sacct_jobs(job_ids: list[str], runner: CommandRunner | None = None, timeout_s: float = 30.0) -> pl.DataFrame:
    """Every run of the given jobs from the live sacct (``--json``, ``-P`` fallback)."""
    if not job_ids:
        return empty_allocations()
    return _sacct(runner or SubprocessRunner(), ["-D", "-j", ",".join(job_ids)], timeout_s, None)


def _sacct(runner: CommandRunner, sel: list[str], timeout_s: float, json_ok: list[bool] | None) -> pl.DataFrame:
    if json_ok is None or json_ok[0]:
        res = runner.run(["sacct", "--json", *sel], timeout_s)
        check(res, "sacct --json")
        try:
            data = json.loads(res.stdout)
        except json.JSONDecodeError:
            data = None
        plugin = str((((data or {}).get("meta") or {}).get("plugin") or {}).get("type", "")) \
            if isinstance(data, dict) else ""
        if isinstance(data, dict) and KNOWN_JSON.search(plugin):
            return frame_from_runs(runs_from_sacct_json(data, path="sacct --json"))
        log.warning("accounting: sacct --json gave %s; falling back to sacct --parsable2",
                    f"an unknown data parser {plugin!r}" if plugin else "no usable JSON")
        if json_ok is not None:
            json_ok[0] = False
    res = check(runner.run(["sacct", "-P", "-X", "-o", ACCOUNTING_FIELDS, *sel], timeout_s), "sacct --parsable2")
    return frame_from_runs(runs_from_parsable(res.stdout, path="sacct -P"))


# ---------------------------------------------------------------------------- live poller
class AccountingPoller:
    """Live allocations for ``watch``: squeue every ``squeue_interval_s``, sacct every
    ``sacct_interval_s`` (never more often, whatever the caller's rate), incrementally from a
    cursor (``-S`` = the last successful sacct minus ``overlap_s``; the first poll reads back
    ``lookback_s``).

    Contract: ``poll(now)`` blocks for at most the commands it runs (each bounded by
    ``timeout_s``), returns True when the frame changed, and never raises for an unreachable
    or slow Slurm: the source is marked blind (``health``), the frame keeps its last good
    state (a job missing from a failed poll has not ended), and the next successful poll
    catches up from the cursor. ``calls`` counts the commands run, per command."""

    def __init__(self, runner: CommandRunner | None = None, *, squeue_interval_s: float = 10.0,
                 sacct_interval_s: float = 60.0, timeout_s: float = 10.0, lookback_s: float = 86400.0,
                 overlap_s: float = 120.0) -> None:
        self.runner = runner or SubprocessRunner()
        self.squeue_interval_s, self.sacct_interval_s = squeue_interval_s, sacct_interval_s
        self.timeout_s, self.lookback_s, self.overlap_s = timeout_s, lookback_s, overlap_s
        self.frame = empty_allocations()
        self.cursor_s: float | None = None
        self.calls: dict[str, int] = {"squeue": 0, "sacct": 0}
        self.health = {"squeue": SourceHealth("squeue"), "sacct": SourceHealth("sacct")}
        self._next = {"squeue": 0.0, "sacct": 0.0}
        self._json_ok = [True]
        self.ready = False      # a command has answered at least once (before that the frame says nothing)

    def poll(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        changed = False
        if now >= self._next["squeue"]:
            self._next["squeue"] = now + self.squeue_interval_s
            changed |= self._one("squeue", now, self._squeue)
        if now >= self._next["sacct"]:
            self._next["sacct"] = now + self.sacct_interval_s
            changed |= self._one("sacct", now, lambda: self._sacct(now))
        return changed

    def _one(self, name: str, now: float, fn: Any) -> bool:
        self.calls[name] += 1
        try:
            got = fn()
        except (SlurmUnavailable, SlurmError, InputError) as exc:
            self.health[name].fail(now, str(exc))
            log.warning("accounting: %s failed: %s", name, exc)
            return False
        self.health[name].ok(now)
        before, first = self.frame, not self.ready
        self.frame = merge_allocations(self.frame, got)
        self.ready = True
        return first or not before.equals(self.frame)

    def _squeue(self) -> pl.DataFrame:
        res = check(self.runner.run(["squeue", "--json"], self.timeout_s), "squeue --json")
        try:
            data = json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"accounting: squeue --json is not JSON ({exc.msg})", argv=list(res.argv)) from exc
        if data.get("errors"):
            raise SlurmUnavailable(f"accounting: squeue --json reported {data['errors']}", argv=list(res.argv))
        return frame_from_runs(runs_from_squeue_json(data))

    def _sacct(self, now: float) -> pl.DataFrame:
        since = (self.cursor_s - self.overlap_s) if self.cursor_s is not None else now - self.lookback_s
        frame = _sacct(self.runner, ["-a", "-D", "-S", _sacct_time(int(since * NS))], self.timeout_s, self._json_ok)
        self.cursor_s = now
        return frame

    def blind(self) -> list[SourceHealth]:
        return [h for h in self.health.values() if h.blind_since is not None]


__all__ = ["ACCOUNTING_FIELDS", "ALLOCATION_SCHEMA", "AccountingPoller", "SourceHealth", "empty_allocations",
           "frame_from_runs", "gpu_indices", "load_accounting", "merge_allocations", "parse_accounting_text",
           "runs_from_parsable", "runs_from_sacct_json", "runs_from_squeue_json", "sacct_jobs", "sacct_range", "with_attempts"]
