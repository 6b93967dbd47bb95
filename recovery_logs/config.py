"""Engine configuration: frozen, validated, one loader. A missing config file is an error."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from recovery_logs.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the detection core (pure stages). Durations are seconds.

    window_s            width of the tumbling event-time windows (per host, job)
    incident_gap_s      findings of one job (or host) further apart than this start a new incident;
                        larger than the NCCL watchdog (600 s) so a fault and the timeouts it causes
                        10 minutes later stay one incident
    lateness_s          allowed lateness of events behind the watermark (watch)
    evidence_max        evidence lines kept per incident
    drain_min_confidence  below this, a proposed drain is downgraded to `investigate`
    job_span_grace_s    a kernel finding on a host is attributed to a job seen on that host within this
                        many seconds of the job's first/last line
    repeat_app_xid_jobs XID 13/31 on one GPU in at least this many distinct jobs escalates to investigate
    detectors           behavioural detectors to run (names of recovery_logs.detectors modules)
    gpus_per_node       for rank -> local GPU mapping when logs do not say
    progress_retention_s  progress lines older than this (behind the newest event) are compacted away once
                        more than ``progress_compact_rows`` are held; detector findings are kept
    line_scores         line-level template rarity (``detectors.linescore``: rare error-level lines and
                        new templates of the site's own logs, low-severity ``investigate`` findings).
                        None (the default): on exactly when a site line format (``--line-format``,
                        ``[[line_formats]]``) reads the input — logs no rule was written for — and off
                        for the built-in formats, whose faults the rules name; True/False: always/never
    textclass           the learned line classifier (``detectors.textclass``): gated lines no rule won,
                        classified into a named category where the model is confident (low/medium
                        ``investigate`` findings that never outrank a rule's); off by default (opt in with
                        ``[engine] textclass = true``: see models/MODEL_CARD.md for what it gains and costs)
    """

    window_s: float = 60.0
    incident_gap_s: float = 900.0
    lateness_s: float = 30.0
    evidence_max: int = 8
    drain_min_confidence: float = 0.55
    job_span_grace_s: float = 900.0
    repeat_app_xid_jobs: int = 2
    detectors: tuple[str, ...] = ("hangs", "stragglers", "anomaly")
    gpus_per_node: int = 8
    progress_retention_s: float = 7200.0
    progress_compact_rows: int = 400_000
    rules_dir: Path | None = None
    models_dir: Path | None = None
    line_scores: bool | None = None
    textclass: bool = False

    def __post_init__(self) -> None:
        for name in ("window_s", "incident_gap_s", "job_span_grace_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"engine config: {name} must be > 0", value=getattr(self, name))
        if self.lateness_s < 0:
            raise ConfigError("engine config: lateness_s must be >= 0", value=self.lateness_s)
        if not 0.0 <= self.drain_min_confidence <= 1.0:
            raise ConfigError("engine config: drain_min_confidence must be within [0, 1]",
                              value=self.drain_min_confidence)
        if self.line_scores is not None and not isinstance(self.line_scores, bool):
            raise ConfigError("engine config: line_scores must be true or false", value=self.line_scores)
        if not isinstance(self.textclass, bool):
            raise ConfigError("engine config: textclass must be true or false", value=self.textclass)
        if self.evidence_max < 1:
            raise ConfigError("engine config: evidence_max must be >= 1", value=self.evidence_max)

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)


def load_config(path: Path | str | None) -> EngineConfig:
    """Load `[engine]` from a TOML file. None gives the defaults; a missing file is an error."""
    if path is None:
        return EngineConfig()
    p = Path(path)
    data = read_config_toml(p)
    section = data.get("engine", {})
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError("unknown keys in [engine]", path=str(p), keys=unknown)
    kw: dict[str, Any] = dict(section)
    for k in ("rules_dir", "models_dir"):
        if kw.get(k) is not None:
            kw[k] = (p.parent / kw[k]).resolve()
    if "detectors" in kw:
        kw["detectors"] = tuple(kw["detectors"])
    try:
        return EngineConfig(**kw)
    except TypeError as exc:
        raise ConfigError(f"invalid [engine] section: {exc}", path=str(p)) from exc


def read_config_toml(path: str | Path) -> dict[str, Any]:
    """The engine config file as TOML data (a missing or invalid file is a ConfigError naming it);
    ``[engine]`` is read by ``load_config``, ``[[line_formats]]`` by ``sources.lineformat``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config file not found", path=str(p))
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file is not valid TOML: {exc}", path=str(p)) from exc
