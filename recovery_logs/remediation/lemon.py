"""Lemon nodes: memory across jobs of which nodes keep failing.

``LemonTracker(state_dir).update(incidents)`` folds incidents into a persisted, time-decayed
score per node and returns each node's :class:`LemonState`. Score of a node at time ``now``
(the newest incident time seen, event time — so replaying history gives the same states)::

    Σ weight(category) · decay(age)                      incidents the node is the culprit of
    + 0.5 · (distinct jobs affected − 1) · decay(last)   failures follow the node, not the job
    + 1.0 · Σ (repeats − 1) · decay(last of the pair)    the same GPU failing with the same XID again
    + 0.25 · Σ decay(age)                                multi-node incidents it took part in
                                                         without being the culprit

``decay(age) = 0.5 ** (age / half_life)``. User bugs (software exceptions, GPU OOM) weigh 0.
States: healthy < ``watch`` <= watch < ``probation`` <= probation < ``drain`` <= drain.
Only a ``drain`` state suggests draining; the tracker itself never acts.

State is one JSON file (``lemon.json``) in ``state_dir``, written atomically. An incident id
seen again replaces its earlier record (updates are idempotent). Records older than
``horizon_half_lives`` half-lives are dropped, which bounds the state.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recovery_logs.errors import InputError
from recovery_logs.records import Incident
from recovery_logs.schema import HARDWARE_CATEGORIES
from recovery_logs.timeutil import ns_to_iso

STATE_FILE = "lemon.json"
STATE_VERSION = 1
_DAY_NS = 86_400 * 1_000_000_000

CATEGORY_WEIGHT: dict[str, float] = {
    **{str(c): 1.0 for c in HARDWARE_CATEGORIES},
    "nccl_network_error": 0.5, "nccl_timeout_hang": 0.5, "nccl_other": 0.3, "cuda_error": 0.5,
    "slurm_job_failure": 0.5, "oom_host": 0.3, "straggler": 0.5, "anomaly": 0.2,
    "software_exception": 0.0, "oom_gpu": 0.0,
}
STATES = ("healthy", "watch", "probation", "drain")


@dataclass(frozen=True)
class LemonState:
    node: str
    state: str                  # healthy | watch | probation | drain
    score: float
    incidents: int              # incidents with this node as culprit, within the horizon
    distinct_jobs: int
    repeat_gpu_xids: tuple[str, ...]   # e.g. ("gpu3:xid79x2",)
    multi_node: int             # multi-node incidents it took part in, not as culprit
    reasons: tuple[str, ...]
    as_of: int                  # ns, event time the score refers to

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["repeat_gpu_xids"] = list(self.repeat_gpu_xids)
        d["reasons"] = list(self.reasons)
        d["as_of"] = ns_to_iso(self.as_of)
        d["score"] = round(self.score, 4)
        return d


def _record(inc: Incident) -> dict[str, Any]:
    return {"node": inc.node, "gpu": inc.gpu, "xid": inc.xid, "job_id": inc.job_id, "category": inc.category,
            "time": int(inc.last_seen), "nodes": sorted(set(inc.nodes))}


@dataclass
class LemonTracker:
    state_dir: str | Path
    half_life_days: float = 7.0
    watch: float = 1.0
    probation: float = 2.5
    drain: float = 4.0
    horizon_half_lives: float = 10.0
    _records: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _now: int = 0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        p = self.path
        if p.exists():
            try:
                data = json.loads(p.read_text())
                if not isinstance(data, dict):
                    raise ValueError(f"expected a JSON object, found {type(data).__name__}")
                if data.get("version") != STATE_VERSION:
                    raise ValueError(f"unknown version {data.get('version')!r}")
                recs = data["incidents"]
                if not isinstance(recs, dict) or not all(isinstance(v, dict) and isinstance(v.get("time"), int)
                                                         for v in recs.values()):
                    raise ValueError("incidents must map ids to records with an integer time")
                self._records = dict(recs)
                self._now = int(data.get("now", 0))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InputError(f"lemon: state file unreadable ({exc}); remove it to start the lemon scores "
                                 "afresh", path=str(p), reason=str(exc)) from exc

    @property
    def path(self) -> Path:
        return Path(self.state_dir) / STATE_FILE

    def update(self, incidents: Sequence[Incident], now_ns: int | None = None) -> dict[str, LemonState]:
        """Fold incidents in, persist, and return every tracked node's state."""
        for inc in incidents:
            self._records[inc.id] = _record(inc)
            self._now = max(self._now, int(inc.last_seen))
        if now_ns is not None:
            self._now = max(self._now, int(now_ns))
        horizon = self.horizon_half_lives * self.half_life_days * _DAY_NS
        self._records = {k: v for k, v in self._records.items() if self._now - v["time"] <= horizon}
        self._save()
        return self.states()

    def states(self) -> dict[str, LemonState]:
        nodes = sorted({r["node"] for r in self._records.values() if r["node"]} |
                       {n for r in self._records.values() for n in r["nodes"]})
        return {n: self._score(n) for n in nodes}

    def _decay(self, t: int) -> float:
        return 0.5 ** (max(0, self._now - t) / (self.half_life_days * _DAY_NS))

    def _score(self, node: str) -> LemonState:
        mine = sorted((r for r in self._records.values() if r["node"] == node), key=lambda r: r["time"])
        others = [r for r in self._records.values() if r["node"] != node and node in r["nodes"] and len(r["nodes"]) > 1]
        weighted = [r for r in mine if CATEGORY_WEIGHT.get(r["category"], 0.3) > 0]
        base = sum(CATEGORY_WEIGHT.get(r["category"], 0.3) * self._decay(r["time"]) for r in weighted)
        jobs = {r["job_id"] for r in weighted if r["job_id"]}
        pairs: dict[tuple[int, int], int] = {}
        pair_last: dict[tuple[int, int], int] = {}
        for r in weighted:
            if r["gpu"] is not None and r["xid"] is not None:
                k = (r["gpu"], r["xid"])
                pairs[k] = pairs.get(k, 0) + 1
                pair_last[k] = max(pair_last.get(k, 0), r["time"])
        repeats = {k: v for k, v in pairs.items() if v > 1}
        multi = sum(self._decay(r["time"]) for r in others)
        last = self._decay(max(r["time"] for r in weighted)) if weighted else 0.0
        score = (base + 0.5 * max(0, len(jobs) - 1) * last
                 + sum((v - 1) * self._decay(pair_last[k]) for k, v in repeats.items()) + 0.25 * multi)
        reasons = []
        if weighted:
            reasons.append(f"{len(weighted)} incident(s) as culprit, decayed weight {base:.2f}")
        if len(jobs) > 1:
            reasons.append(f"{len(jobs)} distinct jobs affected")
        reasons += [f"GPU {g} XID {x} repeated {v} times" for (g, x), v in sorted(repeats.items())]
        if others:
            reasons.append(f"involved in {len(others)} multi-node incident(s) of other culprits")
        state = ("drain" if score >= self.drain else "probation" if score >= self.probation
                 else "watch" if score >= self.watch else "healthy")
        return LemonState(node=node, state=state, score=float(score) if math.isfinite(score) else 0.0,
                          incidents=len(weighted), distinct_jobs=len(jobs),
                          repeat_gpu_xids=tuple(f"gpu{g}:xid{x}x{v}" for (g, x), v in sorted(repeats.items())),
                          multi_node=len(others), reasons=tuple(reasons), as_of=self._now)

    def _save(self) -> None:
        d = Path(self.state_dir)
        data = {"version": STATE_VERSION, "now": self._now, "incidents": dict(sorted(self._records.items())),
                "nodes": {n: s.to_dict() for n, s in self.states().items()}}
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / (STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise InputError("lemon: cannot write the state dir", path=str(d), reason=str(exc)) from exc


__all__ = ["CATEGORY_WEIGHT", "STATES", "LemonState", "LemonTracker"]
