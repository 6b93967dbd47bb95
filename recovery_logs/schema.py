"""The one canonical event schema, the findings schema, and the shared enumerations.

Every stage boundary speaks these frames:

* **events**   (``EVENT_SCHEMA``): one row per log record (a multi-line record is one row).
  Produced by every source (files, VictoriaLogs, NVML, simulator), consumed by detectors.
* **findings** (``FINDING_SCHEMA``): events that a rule or a behavioural detector flagged,
  plus what it extracted. Attribution turns findings into incidents.
* **quarantine** (``QUARANTINE_SCHEMA``): input that could not become an event, kept aside.

Times are always timezone-aware UTC with nanosecond precision (``pl.Datetime("ns", "UTC")``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

import polars as pl
from polars.datatypes import DataTypeClass

from recovery_logs.errors import InputError

SCHEMA_VERSION = 1

ColumnType = pl.DataType | DataTypeClass
"""A column's type in a schema dict: an instance (``pl.Datetime("ns", "UTC")``) or a class (``pl.String``)."""
SchemaDict = dict[str, ColumnType]
"""Column name -> type, in column order: every ``*_SCHEMA`` of the package."""
TIME = pl.Datetime("ns", "UTC")

EVENT_SCHEMA: SchemaDict = {
    "time": TIME,               # event time; null only if a source has no usable clock at all
    "time_inferred": pl.Boolean,  # True when the line had no timestamp and time was carried from a neighbour
    "host": pl.String,          # node name (normalised: short hostname as Slurm knows it)
    "job_id": pl.String,        # Slurm job id when known
    "source": pl.String,        # SourceKind value
    "file": pl.String,          # path, or "victorialogs:<stream_id>", or "nvml", or "sim"
    "line": pl.Int64,           # 1-based line number of the record's first line in `file` (0 if none)
    "seq": pl.Int64,            # global ingestion order, unique within one run
    "stream_id": pl.String,     # VictoriaLogs _stream_id, or null
    "rank": pl.Int32,           # distributed rank from a `[rank3]:` prefix, or null
    "message": pl.String,       # the log text without the syslog/dmesg/glog prefix; joined with "\n" if multi-line
    "level": pl.String,         # Level value the line declared (site line format <Level>, syslog PRI, JSON
                                # level/PRIORITY), normalised; null where the format has none
}

FINDING_EXTRA_SCHEMA: SchemaDict = {
    "rule_id": pl.String,       # e.g. "xid.79", "nccl.watchdog_timeout", "detector.hang"
    "rule_version": pl.Int32,
    "category": pl.String,      # Category value, or "progress"
    "severity": pl.String,      # Severity value
    "role": pl.String,          # Role value
    "action": pl.String,        # suggested EngineAction value
    "xid": pl.Int32,
    "pci": pl.String,           # PCI bus id as printed, e.g. "0000:cb:00"
    "gpu": pl.Int32,            # GPU index when known
    "nccl_seq": pl.Int64,
    "nccl_op": pl.String,
    "peer": pl.String,          # peer address / host named by NCCL or IB errors
    "step": pl.Int64,           # training iteration from progress lines
    "step_time_s": pl.Float64,  # seconds per iteration from progress lines
    "fatal": pl.Boolean,        # decoded fatal flag (XID 144-150), null when unknown
    "detail": pl.String,        # JSON object of any further extracted fields
}

FINDING_SCHEMA: SchemaDict = {**EVENT_SCHEMA, **FINDING_EXTRA_SCHEMA}

QUARANTINE_SCHEMA: SchemaDict = {
    "file": pl.String,
    "line": pl.Int64,
    "reason": pl.String,        # QuarantineReason value
    "raw": pl.String,           # the offending text (invalid bytes as \\x escapes, long lines cut to 4 KiB)
}


class SourceKind(StrEnum):
    KERNEL = "kernel"       # kern.log, dmesg, journald kernel transport, NVRM
    JOB = "job"             # job stdout/stderr, torchrun, NCCL
    SLURM = "slurm"         # slurmd / slurmctld / slurmstepd logs
    JOURNALD = "journald"   # journalctl -o json records that are not kernel
    NVML = "nvml"           # the NVML agent
    OTHER = "other"


class Category(StrEnum):
    XID = "xid"
    ECC_MEMORY = "ecc_memory"
    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND_LINK = "infiniband_link"
    NCCL_NETWORK_ERROR = "nccl_network_error"
    NCCL_TIMEOUT_HANG = "nccl_timeout_hang"
    NCCL_OTHER = "nccl_other"
    CUDA_ERROR = "cuda_error"
    OOM_GPU = "oom_gpu"
    OOM_HOST = "oom_host"
    THERMAL_POWER = "thermal_power"
    SLURM_JOB_FAILURE = "slurm_job_failure"
    SOFTWARE_EXCEPTION = "software_exception"
    HOST_HARDWARE = "host_hardware"     # host CPU / memory machine checks (MCE, EDAC, APEI GHES)
    STRAGGLER = "straggler"
    ANOMALY = "anomaly"


# Categories a rule may carry that never become incidents on their own.
PROGRESS_CATEGORY = "progress"
RULE_CATEGORIES = frozenset({c.value for c in Category} | {PROGRESS_CATEGORY})

# Hardware failure domains: an initiating fault here outranks software symptoms.
HARDWARE_CATEGORIES = frozenset({
    Category.XID, Category.ECC_MEMORY, Category.NVLINK, Category.PCIE, Category.INFINIBAND_LINK,
    Category.THERMAL_POWER, Category.HOST_HARDWARE,
})


class Severity(StrEnum):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"


SEVERITY_RANK = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}


class Level(StrEnum):
    """A log line's own declared level, normalised from the many spellings (``sources.levels``)."""

    FATAL = "fatal"         # emerg, panic, fatal, glog F
    CRITICAL = "critical"   # alert, crit, critical, failure, severe (java.util.logging's highest)
    ERROR = "error"         # err, error, glog E
    WARNING = "warning"     # warn, warning
    NOTICE = "notice"
    INFO = "info"           # info, informational
    DEBUG = "debug"         # debug, trace, verbose


LEVEL_RANK = {"fatal": 6, "critical": 5, "error": 4, "warning": 3, "notice": 2, "info": 1, "debug": 0}
ERROR_LEVELS = frozenset({"fatal", "critical", "error"})    # "error or worse"


class Role(StrEnum):
    CAUSE = "cause"             # can initiate an incident and be its root cause
    SYMPTOM = "symptom"         # consequence seen on other ranks/nodes (NCCL timeout, remote exited)
    BREADCRUMB = "breadcrumb"   # never the root cause when a cause precedes it (XID 45, XID 43, XID 154)
    PROGRESS = "progress"       # training progress line (step, step time)
    CLEAR = "clear"             # clears an earlier fault of the same category on the same host
    INFO = "info"               # worth keeping as evidence, never an incident alone


class EngineAction(StrEnum):
    """What a rule / the XID catalog suggests. Planning turns these into ActionKind proposals."""

    DRAIN_NODE_AND_REQUEUE = "drain_node_and_requeue"
    RESET_GPU = "reset_gpu"
    REQUEUE_ONLY = "requeue_only"
    CANCEL_JOB = "cancel_job"
    INVESTIGATE = "investigate"
    NONE_USER_BUG = "none_user_bug"
    NONE = "none"


class ActionKind(StrEnum):
    DRAIN_NODE = "drain_node"
    REQUEUE_JOB = "requeue_job"
    CANCEL_JOB = "cancel_job"
    RESET_GPU = "reset_gpu"
    RESUME_NODE = "resume_node"
    INVESTIGATE = "investigate"
    NONE = "none"


class QuarantineReason(StrEnum):
    MALFORMED = "malformed"             # not parseable in the declared/detected format
    INVALID_UTF8 = "invalid_utf8"       # kept (decoded with replacement) AND recorded here
    OVERSIZED = "oversized"             # line over 1 MiB: cut, recorded here
    BAD_TIMESTAMP = "bad_timestamp"     # timestamp present but unparseable
    OUT_OF_ORDER = "out_of_order"       # kept, but earlier than its predecessor in the same file/stream
    DUPLICATE = "duplicate"             # exact duplicate of an earlier record (same host, time, message)
    FORMAT_MISMATCH = "format_mismatch"  # kept, but the line does not fit the site line format (--line-format)
    UNREADABLE = "unreadable"           # a whole file that could not be read (raw: why); the others are read
    TRUNCATED = "truncated"             # a gzip stream cut short: the readable part is kept, line = first line cut


def empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema=FINDING_SCHEMA)


def empty_quarantine() -> pl.DataFrame:
    return pl.DataFrame(schema=QUARANTINE_SCHEMA)


def conform(df: pl.DataFrame, schema: SchemaDict) -> pl.DataFrame:
    """Add missing columns as nulls, cast to the schema's types, order columns as the schema."""
    exprs = []
    for name, dtype in schema.items():
        if name in df.columns:
            exprs.append(pl.col(name).cast(dtype, strict=False).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(exprs)


def records_frame(rows: Sequence[Mapping[str, Any]], schema: SchemaDict) -> pl.DataFrame:
    """Records (dicts, ``time`` as integer ns since the epoch) -> a frame conformed to ``schema``
    (``EVENT_SCHEMA``, ``FINDING_SCHEMA``): types inferred over all rows, then cast; missing
    columns are null, other keys dropped."""
    if not rows:
        return pl.DataFrame(schema=schema)
    has_time = any("time" in r for r in rows)
    df = pl.DataFrame(list(rows), schema_overrides={"time": pl.Int64} if has_time else None, infer_schema_length=None)
    if has_time:
        df = df.with_columns(pl.col("time").cast(pl.Int64).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"))
    return conform(df, schema)


def on_rows(df: pl.DataFrame, mask: pl.Series,
             exprs: dict[str, pl.Expr] | Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """``df`` plus new columns evaluated only on the rows where ``mask`` is true, null elsewhere:
    ``exprs`` (name -> expression) or a function from the admitted rows to a frame of the new
    columns. "Parse fully only what can matter": a capturing regex, a strptime or a host
    normalisation runs on the few lines a cheap test admits (a line without a glog header never
    needs the glog time parsed). Exact when every new column is null outside ``mask`` anyway."""
    build = exprs if callable(exprs) else (lambda d: d.select(**exprs))
    n = df.height
    k = int(mask.sum())
    if k == n:
        return df.with_columns(build(df))
    sub = build(df.filter(mask) if k else df.head(0))
    idx = mask.arg_true() if k else None
    cols = []
    for name in sub.columns:
        full = pl.Series(name, [], dtype=sub.schema[name]).extend_constant(None, n)
        if idx is not None:
            full = full.scatter(idx, sub[name])
        cols.append(full)
    return df.with_columns(cols)


def own_strings(df: pl.DataFrame) -> pl.DataFrame:
    """Copy string columns into buffers of their own.

    Polars string columns are views: a few rows filtered out of a large batch keep the whole
    batch's string buffers alive. Anything kept across batches (findings, quarantine) goes through
    this, or memory grows with the input instead of with what is kept.
    """
    cols = [c for c, t in df.schema.items() if t == pl.String]
    if not cols or df.height == 0:
        return df
    return df.with_columns([(pl.col(c) + pl.lit("")).alias(c) for c in cols])


def check_frame(df: pl.DataFrame, schema: SchemaDict, stage: str) -> pl.DataFrame:
    """Stage-boundary check: exact column names and types, or an InputError naming the stage."""
    got = dict(df.schema)
    if list(got) != list(schema) or any(got[k] != v for k, v in schema.items()):
        diff = {k: (str(got.get(k)), str(v)) for k, v in schema.items() if got.get(k) != v}
        extra = [k for k in got if k not in schema]
        raise InputError(f"{stage}: frame does not match the schema", mismatched=diff, extra=extra)
    return df


def check_events(df: pl.DataFrame, stage: str = "events") -> pl.DataFrame:
    return check_frame(df, EVENT_SCHEMA, stage)


def check_findings(df: pl.DataFrame, stage: str = "findings") -> pl.DataFrame:
    return check_frame(df, FINDING_SCHEMA, stage)
