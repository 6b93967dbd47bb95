"""The notebook façade: everything an analyst needs as Polars frames, in one import.

The loaders below read sources; the frame builders live in :mod:`recovery_logs.frames`, the
audit loader in :mod:`recovery_logs.audit` and ``load_truth`` in :mod:`recovery_logs.analysis.truth`;
they are re-exported here.

Each loader returns a frame with a documented, fixed schema (the ``*_SCHEMA`` dicts below), so
notebooks and tests can rely on column names and types. Times are ``Datetime("ns", "UTC")``.

=====================  =========================================  ==========================
loader                 reads                                      schema
=====================  =========================================  ==========================
``load_events``        files, directories, globs, Parquet, or     ``schema.EVENT_SCHEMA``
                       ``victorialogs://HOST:PORT`` + LogsQL
``replay_incident``    a bundled incident by name (or paths)      a ``ReplayResult``
``incidents_frame``    ReplayResult / incidents / incidents.json  ``INCIDENT_FRAME_SCHEMA``
``candidates_frame``   same                                       ``CANDIDATE_FRAME_SCHEMA``
``evidence_frame``     same; adds the LogsQL query per line       ``EVIDENCE_FRAME_SCHEMA``
``actions_frame``      same; one row per proposed action          ``ACTION_FRAME_SCHEMA``
``load_audit``         a state dir or ``audit.db``                ``AUDIT_FRAME_SCHEMA``
``load_slurm_jobs``    ``sacct`` through ``SlurmClient``          ``JOB_FRAME_SCHEMA``
``jobs_frame``         ``JobRecord`` objects                      ``JOB_FRAME_SCHEMA``
=====================  =========================================  ==========================

Example::

    >>> import recovery_logs.api as rl
    >>> res = rl.replay_incident("xid79_nccl_cascade")
    >>> rl.incidents_frame(res).select("category", "node", "root_rule").row(0)
    ('xid', 'gpu-n02', 'xid.79')
    >>> rl.evidence_frame(res)["logsql"][0]          # paste into VictoriaLogs' UI  # doctest: +SKIP
    '_time:[2026-11-29T14:06:00.123457000Z, 2026-11-29T14:06:00.123457001Z) host:="gpu-n02" _msg:"NVRM: Xid ..."'

``root_rule`` names the rule whose finding is the incident's root cause (the culprit node's
``cause`` line of the incident's category); backtests and self-grading count per root rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import polars as pl

from recovery_logs.analysis.resume import resume_records
from recovery_logs.analysis.truth import load_truth, scenario_dirs
from recovery_logs.audit import load_audit
from recovery_logs.config import EngineConfig
from recovery_logs.errors import ConfigError
from recovery_logs.frames import (
    ACTION_FRAME_SCHEMA,
    AUDIT_FRAME_SCHEMA,
    CANDIDATE_FRAME_SCHEMA,
    EVIDENCE_FRAME_SCHEMA,
    INCIDENT_FRAME_SCHEMA,
    JOB_FRAME_SCHEMA,
    actions_frame,
    candidates_frame,
    evidence_frame,
    incident_dicts,
    incidents_frame,
    jobs_frame,
    logsql_for_line,
    root_rule,
)
from recovery_logs.pipeline.replay import ReplayOptions, ReplayResult, replay
from recovery_logs.schema import EVENT_SCHEMA
from recovery_logs.sources.accounting import ALLOCATION_SCHEMA, load_accounting
from recovery_logs.sources.files import ReadOptions, events_from_vl_records, read_paths
from recovery_logs.sources.slurm import CommandRunner, SlurmClient
from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url

__all__ = [
    "ACTION_FRAME_SCHEMA", "AUDIT_FRAME_SCHEMA", "CANDIDATE_FRAME_SCHEMA", "EVIDENCE_FRAME_SCHEMA",
    "INCIDENT_FRAME_SCHEMA", "JOB_FRAME_SCHEMA", "actions_frame", "bundled_incident", "bundled_incident_names", "bundled_read_options",
    "candidates_frame", "evidence_frame", "incident_dicts", "incidents_frame", "jobs_frame", "load_audit",
    "load_events", "load_slurm_jobs", "load_truth", "logsql_for_line", "replay_incident", "root_rule",
    "ALLOCATION_SCHEMA", "load_accounting", "resume_records",
]


# ---------------------------------------------------------------------------- bundled data
def _bundled_dir() -> Path:
    return Path(str(resources.files("recovery_logs") / "data" / "incidents"))


def bundled_incident_names() -> list[str]:
    """Names of the incidents shipped with the package (``recovery-logs demo --list``)."""
    return [d.name for d in scenario_dirs(_bundled_dir())]


def bundled_incident(name: str) -> Path:
    """Directory of one bundled incident (logs + ``truth.json``)."""
    p = _bundled_dir() / name
    if not (p / "truth.json").is_file():
        raise ConfigError("api: no bundled incident with this name", name=name, known=bundled_incident_names())
    return p


def bundled_read_options(name: str) -> ReadOptions:
    """Read options for a bundled incident: its syslog/glog lines carry no year, its truth.json does."""

    truth = load_truth(bundled_incident(name)) or {}
    return ReadOptions(year=truth.get("year"))


# ---------------------------------------------------------------------------- events
def load_events(source: str | Path | Sequence[str | Path], *, fmt: str = "auto", query: str = "*",
                start: int | str | None = None, end: int | str | None = None, limit: int | None = None,
                client: VictoriaLogsClient | None = None) -> pl.DataFrame:
    """Events (``EVENT_SCHEMA``, sorted by time then seq) from files or from VictoriaLogs.

    ``source``: paths (files, directories, globs, ``.parquet``), or ``victorialogs://HOST:PORT``
    (then ``query`` is LogsQL, ``start``/``end`` are ns or RFC3339, ``end`` inclusive). Pass a
    ready ``client`` (``VictoriaLogsClient``) to reuse a session.

    >>> ev = load_events(bundled_incident("healthy"))          # doctest: +SKIP
    >>> ev.columns == list(EVENT_SCHEMA)                       # doctest: +SKIP
    True
    """

    if isinstance(source, str) and "://" in source:
        own = client is None
        cl = client or VictoriaLogsClient(parse_url(source))
        try:
            rows = list(cl.query(query, start=start, end=end, limit=limit))
        finally:
            if own:
                cl.close()
        if not rows:
            return pl.DataFrame(schema=EVENT_SCHEMA)
        batch = events_from_vl_records(rows, ReadOptions(fmt="vl-jsonl"))
        return batch.events.sort(["time", "seq"], nulls_last=True)
    paths = [source] if isinstance(source, (str, Path)) else list(source)
    return read_paths(paths, ReadOptions(fmt=fmt)).events


def replay_incident(name_or_paths: str | Path | Sequence[str | Path], config: EngineConfig | None = None) -> ReplayResult:
    """Replay a bundled incident (by name) or any paths; returns the ``ReplayResult``."""

    read = None
    if isinstance(name_or_paths, str) and name_or_paths in bundled_incident_names():
        paths: list[str | Path] = [bundled_incident(name_or_paths)]
        read = bundled_read_options(name_or_paths)
    elif isinstance(name_or_paths, (str, Path)):
        paths = [name_or_paths]
    else:
        paths = list(name_or_paths)
    return replay(paths, ReplayOptions(read=read, config=config or EngineConfig()))


# ---------------------------------------------------------------------------- Slurm


def load_slurm_jobs(job_ids: Sequence[str] = (), *, start: str = "now-7days", end: str | None = None,
                    nodes: Sequence[str] = (), client: SlurmClient | None = None,
                    runner: CommandRunner | None = None) -> pl.DataFrame:
    """Slurm accounting (``sacct``) as ``JOB_FRAME_SCHEMA``. ``client``: a ``SlurmClient``; ``runner``:
    a ``CommandRunner`` (e.g. a recording runner in tests); default runs the local ``sacct``."""

    cl = client or SlurmClient(runner=runner)
    return jobs_frame(cl.jobs(list(job_ids), start=start, end=end, nodes=list(nodes)))
