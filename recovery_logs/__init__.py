"""recovery-logs: GPU-cluster fault detection and recovery from logs.

The public face, importable from here (``__all__``; ``dir(recovery_logs)`` and ``help()`` list it)::

    import recovery_logs as rl
    res = rl.replay_incident("xid79_nccl_cascade")      # -> ReplayResult
    rl.incidents_frame(res)                             # Polars frames with fixed schemas
    eng = rl.Engine(rl.EngineConfig())                  # the streaming engine: feed / advance / incidents
    res = rl.replay(["logs/"], rl.ReplayOptions())      # offline replay of files
    except rl.RecoveryLogsError: ...                    # the one error tree (rl.InputError, rl.PolicyError, ...)

* loaders (``recovery_logs.api``): ``load_events``, ``replay_incident``, ``load_audit``,
  ``load_slurm_jobs``, ``load_truth``, the bundled incidents, and the frame builders
  (``incidents_frame``, ``evidence_frame``, ...) with their ``*_FRAME_SCHEMA``;
* the engine: ``Engine``, ``EngineConfig``, ``load_config``, ``replay``, ``ReplayOptions``,
  ``ReplayResult``, ``ReadOptions``;
* records: ``Incident``, ``Evidence``, ``Candidate``, ``ActionProposal``;
* the error tree of :mod:`recovery_logs.errors`;
* the analyst's lab the notebooks use: ``timeline_figure``, ``SimOptions`` and the
  ``simulate`` subpackage, ``WindowIsolationForest`` and its features, ``PolicyConfig``,
  ``Remediator``, ``PromotionGate`` and the grading functions, ``backtest``, ``ledger``, ...

Names load on first use, so ``import recovery_logs`` stays cheap for the CLI; anything not listed
here is internal and may move.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = ("ACTION_FRAME_SCHEMA", "AUDIT_FRAME_SCHEMA", "CANDIDATE_FRAME_SCHEMA", "EVIDENCE_FRAME_SCHEMA",
        "INCIDENT_FRAME_SCHEMA", "JOB_FRAME_SCHEMA", "actions_frame", "bundled_incident", "bundled_incident_names",
        "bundled_read_options", "candidates_frame", "evidence_frame", "incident_dicts", "incidents_frame",
        "jobs_frame", "load_audit", "load_events", "load_slurm_jobs", "load_truth", "logsql_for_line",
        "replay_incident", "root_rule", "ALLOCATION_SCHEMA", "load_accounting", "resume_records")
_ERRORS = ("AuditChainBroken", "AuditError", "ConfigError", "EvalFloorMissed", "InputError", "ModelError",
           "NVMLUnavailable", "PolicyError", "RecoveryLogsError", "RulePackError", "SlurmError", "SlurmUnavailable",
           "SourceError", "TrainingDataError", "UnsafeTargetError", "VictoriaLogsError")
_WHERE: dict[str, str] = {
    **dict.fromkeys(_API, "recovery_logs.api"),
    **dict.fromkeys(_ERRORS, "recovery_logs.errors"),
    "Engine": "recovery_logs.pipeline.engine",
    "EngineConfig": "recovery_logs.config", "load_config": "recovery_logs.config",
    "replay": "recovery_logs.pipeline.replay", "ReplayOptions": "recovery_logs.pipeline.replay",
    "ReplayResult": "recovery_logs.pipeline.replay",
    "ReadOptions": "recovery_logs.sources.files",
    "Incident": "recovery_logs.records", "Evidence": "recovery_logs.records", "Candidate": "recovery_logs.records",
    "ActionProposal": "recovery_logs.records",
    # the analyst's lab (what the notebooks use): plots, simulator, model, policy, backtest, grading
    "timeline_figure": "recovery_logs.report.html",
    "SimOptions": "recovery_logs.simulate", "SimResult": "recovery_logs.simulate",
    "load_packs": "recovery_logs.detectors.rulepack",
    "MODEL_FEATURES": "recovery_logs.detectors.features", "pipeline_features": "recovery_logs.detectors.features",
    "WindowIsolationForest": "recovery_logs.detectors.iforest",
    "replay_rules": "recovery_logs.analysis.detector_eval", "window_labels": "recovery_logs.analysis.detector_eval",
    "plan": "recovery_logs.remediation.plan",
    "PolicyConfig": "recovery_logs.remediation.policy", "load_policy": "recovery_logs.remediation.policy",
    "Remediator": "recovery_logs.remediation.remediator",
    "LemonTracker": "recovery_logs.remediation.lemon",
    "PromotionGate": "recovery_logs.remediation.gate",
    "grade_proposals": "recovery_logs.remediation.grading",
    "outcomes_from_audit": "recovery_logs.remediation.grading",
    "outcomes_from_incidents": "recovery_logs.remediation.grading",
    "outcomes_from_jobs": "recovery_logs.remediation.grading",
    "proposals_from_audit": "recovery_logs.remediation.grading",
    "BacktestOptions": "recovery_logs.analysis.backtest", "backtest": "recovery_logs.analysis.backtest",
    "load_cases": "recovery_logs.analysis.backtest",
    "ledger": "recovery_logs.analysis.ledger",
    "JobRecord": "recovery_logs.sources.slurm", "SlurmClient": "recovery_logs.sources.slurm",
    "iso_to_ns": "recovery_logs.timeutil", "ns_to_iso": "recovery_logs.timeutil",
}
# public subpackages (their own __all__): `recovery_logs.simulate.simulate(rl.SimOptions(...))`
_MODULES = {"simulate": "recovery_logs.simulate"}

__all__ = sorted([*_WHERE, *_MODULES, "__version__"])

if TYPE_CHECKING:   # the static view of the same names (mypy, IDEs)
    from recovery_logs.api import (  # noqa: F401
        ACTION_FRAME_SCHEMA,
        AUDIT_FRAME_SCHEMA,
        CANDIDATE_FRAME_SCHEMA,
        EVIDENCE_FRAME_SCHEMA,
        INCIDENT_FRAME_SCHEMA,
        JOB_FRAME_SCHEMA,
        actions_frame,
        bundled_incident,
        bundled_incident_names,
        bundled_read_options,
        candidates_frame,
        evidence_frame,
        incident_dicts,
        incidents_frame,
        jobs_frame,
        load_audit,
        load_events,
        load_slurm_jobs,
        load_truth,
        logsql_for_line,
        replay_incident,
        root_rule,
    )
    from recovery_logs.config import EngineConfig, load_config  # noqa: F401
    from recovery_logs.errors import (  # noqa: F401
        AuditChainBroken,
        AuditError,
        ConfigError,
        EvalFloorMissed,
        InputError,
        ModelError,
        NVMLUnavailable,
        PolicyError,
        RecoveryLogsError,
        RulePackError,
        SlurmError,
        SlurmUnavailable,
        SourceError,
        TrainingDataError,
        UnsafeTargetError,
        VictoriaLogsError,
    )
    from recovery_logs.pipeline.engine import Engine  # noqa: F401
    from recovery_logs.pipeline.replay import ReplayOptions, ReplayResult, replay  # noqa: F401
    from recovery_logs.records import ActionProposal, Candidate, Evidence, Incident  # noqa: F401
    from recovery_logs.sources.files import ReadOptions  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'recovery_logs' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)   # lazy: `import recovery_logs` stays cheap for the CLI
    globals()[name] = value          # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    """The public face only (submodules stay importable, but are not the API)."""
    return list(__all__)
