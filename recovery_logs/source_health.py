"""A blind source is not a failure: source-health incidents. Pure.

When ``sacct``/``squeue`` time out, slurmctld or slurmdbd cannot be reached, or the log backend
stops answering, the engine cannot see — which says nothing about any job or node. Such an
outage never becomes evidence (the allocations frame keeps its last good state, see
``sources.accounting.AccountingPoller``) and never triggers an action: it is reported as an
incident of category ``source_health`` whose only proposal is ``none`` (record only), opened
when the source first fails and ``cleared`` when it answers again. (A public case for the rule:
a job manager restarted a healthy job 24 times because its status checks timed out.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from recovery_logs.records import ActionProposal, Evidence, Incident, incident_id

CATEGORY = "source_health"
NS = 1_000_000_000


@dataclass
class SourceHealth:
    """One source's state: healthy, or blind since ``blind_since`` (epoch s) with ``error``."""

    name: str
    blind_since: float | None = None
    error: str = ""
    last_ok: float | None = None
    last_fail: float | None = None
    failures: int = 0
    outages: list[tuple[float, float | None, str]] = field(default_factory=list)   # (since, until, error)

    def fail(self, now: float, error: str) -> None:
        self.failures += 1
        self.error, self.last_fail = error, now
        if self.blind_since is None:
            self.blind_since = now
            self.outages.append((now, None, error))

    def ok(self, now: float) -> None:
        self.last_ok = now
        if self.blind_since is not None and self.outages:
            since, _, err = self.outages[-1]
            self.outages[-1] = (since, now, err)
        self.blind_since = None
        self.error = ""


def outage_incidents(name: str, outages: Iterable[tuple[float, float | None, str]], failures: int = 1,
                     last_failure: float | None = None) -> list[Incident]:
    """One incident per outage ``(since_s, until_s or None, error)`` of source ``name``."""
    out = []
    for since, until, error in outages:
        since_ns = int(since * NS)
        last_ns = int((until if until is not None else (last_failure or since)) * NS)
        iid = incident_id(f"source:{name}", CATEGORY, since_ns)
        status = "cleared" if until is not None else "open"
        why = (f"source {name} is blind since the first failed poll: this is not evidence against any job or "
               "node, and nothing is done about it")
        what = f"{name} answered again; the next poll caught up" if until is not None else f"{name} failing: {error}"
        out.append(Incident(
            id=iid, category=CATEGORY, cause=f"{name} unavailable ({error[:160]})", severity="medium", node=None,
            gpu=None, job_id=None, xid=None, confidence=1.0, first_seen=since_ns, last_seen=last_ns,
            detected_at=since_ns, count=max(1, failures), nodes=(),
            evidence=(Evidence(since_ns, None, f"{name}: {error[:300]}", f"source.{name}", name),
                      Evidence(last_ns, None, what, f"source.{name}", name)),
            candidates=(), actions=(ActionProposal("none", None, "record_only", why, iid),), status=status,
            suggested_action="none", scope=f"source:{name}", root_rule=f"source.{name}"))
    return out


def health_incidents(health: Iterable[SourceHealth], keep: int = 20) -> list[Incident]:
    """Incidents for the last ``keep`` outages of every source."""
    out: list[Incident] = []
    for h in health:
        out.extend(outage_incidents(h.name, h.outages[-keep:], h.failures, h.last_fail))
    return out


__all__ = ["CATEGORY", "SourceHealth", "health_incidents", "outage_incidents"]
