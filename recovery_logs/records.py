"""Frozen records passed between stages after detection.

The JSON shape of ``Incident.to_dict()`` is the output contract of ``replay --json`` and
``watch --json`` (see README "Output contract"). Times are ISO-8601 UTC strings with
nanosecond precision in JSON (``2026-11-29T14:06:00.123456789Z``).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from recovery_logs.timeutil import iso_to_ns, ns_to_iso


@dataclass(frozen=True)
class Evidence:
    time: int | None      # ns since epoch, UTC
    node: str | None
    message: str
    rule_id: str | None = None
    file: str | None = None
    line: int | None = None
    late: bool = False    # watch: the line reached the server after the live read had passed its time

    def to_dict(self) -> dict[str, Any]:
        d = {"time": ns_to_iso(self.time), "node": self.node, "message": self.message,
             "rule_id": self.rule_id, "file": self.file, "line": self.line}
        if self.late:
            d["late"] = True
        return d


@dataclass(frozen=True)
class Candidate:
    node: str | None
    cause: str
    score: float
    gpu: int | None = None
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "cause": self.cause, "score": round(self.score, 4), "gpu": self.gpu,
                "reasons": list(self.reasons)}


@dataclass(frozen=True)
class ActionProposal:
    kind: str             # ActionKind value
    target: str | None    # node name, job id, "node:gpu", or None for investigate/none
    decision: str         # record_only | proposed | approved | rejected | executed | denied | dry_run
    reason: str
    incident_id: str | None = None
    exclude: tuple[str, ...] = ()   # for requeue_job: nodes to exclude
    attempt: str | None = None      # job actions: "cluster:job_id:submit_s:restart_count" (jobjoin)
    chain: str | None = None        # job actions: "cluster:job_id:first_submit_s" (one job across requeues)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "target": self.target, "decision": self.decision,
                             "reason": self.reason}
        if self.exclude:
            d["exclude"] = list(self.exclude)
        if self.attempt:
            d["attempt"] = self.attempt
        return d

    @property
    def idempotency_key(self) -> str:
        return f"{self.kind}:{self.target}:{self.incident_id}"


@dataclass(frozen=True)
class Incident:
    id: str
    category: str
    cause: str
    severity: str
    node: str | None
    gpu: int | None
    job_id: str | None
    xid: int | None
    confidence: float
    first_seen: int          # ns
    last_seen: int           # ns
    detected_at: int         # ns, event time at which a live reader had enough evidence
    count: int               # findings collapsed into this incident
    nodes: tuple[str, ...]   # every node that contributed evidence
    evidence: tuple[Evidence, ...]
    candidates: tuple[Candidate, ...]
    actions: tuple[ActionProposal, ...] = ()
    rule_ids: tuple[str, ...] = ()
    counts_by_rule: dict[str, int] = field(default_factory=dict)
    status: str = "open"     # open | cleared | flapping
    pci: str | None = None
    suggested_action: str = "investigate"   # EngineAction of the root-cause finding (input to plan)
    scope: str = ""          # job id, or "host:<name>" when no job is known
    root_rule: str | None = None   # rule id of the root-cause finding (what grading and backtest count per)
    authority: str = "node"  # who vouches for the culprit's fault line: node | job | claim (recovery_logs.trust)
    confirmed: bool = True   # the culprit has its own fault line from a source with authority over it
    jobs: tuple[str, ...] = ()     # every job the incident affects, job_id first (jobjoin: shared nodes)
    attempts: tuple[dict[str, Any], ...] = ()   # per affected job: attempt identity, GPUs, nodes (accounting)
    gpu_uuid: str | None = None    # from the GPU inventory when the evidence names a PCI bus id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "category": self.category, "cause": self.cause, "severity": self.severity,
            "node": self.node, "gpu": self.gpu, "job_id": self.job_id, "xid": self.xid,
            "confidence": round(self.confidence, 4),
            "first_seen": ns_to_iso(self.first_seen), "last_seen": ns_to_iso(self.last_seen),
            "detected_at": ns_to_iso(self.detected_at), "count": self.count, "nodes": list(self.nodes),
            "status": self.status, "pci": self.pci, "suggested_action": self.suggested_action,
            "root_rule": self.root_rule,
            "jobs": list(self.jobs), "attempts": [dict(a) for a in self.attempts], "gpu_uuid": self.gpu_uuid,
            "rule_ids": list(self.rule_ids),
            "counts_by_rule": dict(sorted(self.counts_by_rule.items())),
            "evidence": [e.to_dict() for e in self.evidence],
            "candidates": [c.to_dict() for c in self.candidates],
            "actions": [a.to_dict() for a in self.actions],
        }

    def as_dict_raw(self) -> dict[str, Any]:
        return asdict(self)


def incident_id(scope: str, category: str, first_seen_ns: int) -> str:
    """Stable id: the same evidence always yields the same id (replay/watch equality, idempotency)."""
    h = hashlib.sha256(f"{scope}|{category}|{first_seen_ns}".encode()).hexdigest()[:12]
    return f"inc-{h}"

__all__ = ["ActionProposal", "Candidate", "Evidence", "Incident", "incident_id", "iso_to_ns", "ns_to_iso"]
