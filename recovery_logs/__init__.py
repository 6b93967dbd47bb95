"""recovery-logs: GPU-cluster fault detection and recovery from logs.

The notebook-facing API (loaders returning Polars frames) lives in :mod:`recovery_logs.api` and is
re-exported here lazily, so ``import recovery_logs`` stays cheap for the CLI::

    import recovery_logs as rl
    res = rl.replay_incident("xid79_nccl_cascade")
    rl.incidents_frame(res)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = frozenset({
    "ACTION_FRAME_SCHEMA", "AUDIT_FRAME_SCHEMA", "CANDIDATE_FRAME_SCHEMA", "EVIDENCE_FRAME_SCHEMA",
    "INCIDENT_FRAME_SCHEMA", "JOB_FRAME_SCHEMA", "actions_frame", "bundled_incident", "bundled_incident_names", "bundled_read_options",
    "candidates_frame", "evidence_frame", "incident_dicts", "incidents_frame", "jobs_frame", "load_audit",
    "load_events", "load_slurm_jobs", "load_truth", "logsql_for_line", "replay_incident", "root_rule",
    "ALLOCATION_SCHEMA", "load_accounting", "resume_records",
})

__all__ = sorted(_API | {"__version__"})


def __getattr__(name: str) -> Any:
    if name in _API:
        from recovery_logs import api  # lazy on purpose: `import recovery_logs` stays cheap for the CLI

        return getattr(api, name)
    raise AttributeError(f"module 'recovery_logs' has no attribute {name!r}")
