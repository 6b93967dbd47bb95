"""The remediation actions store: one row per idempotency key — the queue and its outcome.

It lives in the state dir's ``audit.db`` beside the audit table, so that an ``intent`` record and
the state change that goes with it commit in one transaction (``AuditLog.transaction()``). This
module and :mod:`recovery_logs.audit` are the only places that speak SQL.

Row life cycle (``status``): ``queued`` -> ``running`` (claimed, attempts + 1) -> ``done`` /
``noop`` / ``not_owner`` / ``skipped`` / ``failed``, or back to ``queued`` with a backoff; a
proposal that does not run ends ``record_only``, ``awaiting_approval`` (then ``rejected``, ``expired`` after the
policy's ``proposal_ttl_s``, or ``queued``), ``dry_run`` or ``denied`` (a denial that may clear has ``retry_until`` and is
re-evaluated until then, when it becomes ``expired``). ``executed_ts`` is a reservation while the
row is ``queued``/``running`` and the time of the verified effect once ``done``; any other end
clears it. The budget, the breaker and cooldowns count exactly the rows that have it. ``trust``
(JSON) keeps what the allocation check of a drain needs (``recovery_logs.trust``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from recovery_logs.audit import AuditLog

__all__ = ["COLUMNS", "TERMINAL", "ActionStore"]

_ACTIONS = """
CREATE TABLE IF NOT EXISTS actions (
    id TEXT PRIMARY KEY, idem_key TEXT UNIQUE NOT NULL, kind TEXT NOT NULL, target TEXT,
    incident_id TEXT, exclude TEXT NOT NULL DEFAULT '[]', cause TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt_ts REAL NOT NULL DEFAULT 0, baseline INTEGER,
    created_ts REAL NOT NULL, updated_ts REAL NOT NULL, executed_ts REAL, result TEXT, retry_until REAL,
    trust TEXT
);
CREATE INDEX IF NOT EXISTS actions_status ON actions(status);
"""
COLUMNS = ("id", "idem_key", "kind", "target", "incident_id", "exclude", "cause", "status", "decision", "reason",
           "attempts", "next_attempt_ts", "baseline", "created_ts", "updated_ts", "executed_ts", "result",
           "retry_until", "trust", "job_attempt", "job_chain")
# job actions carry the job's attempt identity ("cluster:job:submit_s:restarts") and its chain (the job across
# requeues, see sources.accounting); added to databases created before they existed
RAN = ("done", "noop", "queued", "running")   # a requeue in one of these counts toward the restart ceiling
TERMINAL = frozenset({"done", "noop", "not_owner", "skipped", "failed", "rejected", "denied", "dry_run",
                      "record_only", "expired"})
_UPDATABLE = frozenset(COLUMNS) - {"id", "idem_key", "created_ts"}


class ActionStore:
    """The ``actions`` table of one audit database. Rows are dicts keyed by ``COLUMNS``, in
    creation order. Writes join the caller's ``audit.transaction()`` when one is open."""

    def __init__(self, audit: AuditLog, *, create: bool = True) -> None:
        self.audit = audit
        if create:
            audit.conn.executescript(_ACTIONS)
            have = {r[1] for r in audit.conn.execute("PRAGMA table_info(actions)")}
            for col, typ in (("retry_until", "REAL"), ("trust", "TEXT"), ("job_attempt", "TEXT"),
                             ("job_chain", "TEXT")):   # a state dir written before these
                if col not in have:
                    audit.conn.execute(f"ALTER TABLE actions ADD COLUMN {col} {typ}")

    @classmethod
    def existing(cls, audit: AuditLog) -> ActionStore | None:
        """For readers (console, status): the store, or None when no action was ever recorded
        (nothing is created)."""
        found = audit.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'actions'").fetchone()
        return cls(audit, create=False) if found else None

    # ------------------------------------------------------------------ reading
    def _select(self, where: str = "1", args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.audit.conn.execute(
            f"SELECT {', '.join(COLUMNS)} FROM actions WHERE {where} ORDER BY created_ts, rowid", tuple(args))
        return [dict(zip(COLUMNS, r, strict=True)) for r in cur]

    def get(self, act_id: str) -> dict[str, Any] | None:
        rows = self._select("id = ?", (act_id,))
        return rows[0] if rows else None

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every row, or those with ``status``."""
        return self._select("status = ?", (status,)) if status else self._select()

    def executed(self, since_ts: float | None = None, incident_id: str | None = None) -> list[dict[str, Any]]:
        """Rows the policy let run (``executed_ts`` set); with ``since_ts``: those after it, plus
        every one of ``incident_id`` (the per-incident budget has no horizon)."""
        if since_ts is None:
            return self._select("executed_ts IS NOT NULL")
        return self._select("executed_ts IS NOT NULL AND (executed_ts > ? OR incident_id = ?)", (since_ts, incident_id))

    def retryable(self) -> list[dict[str, Any]]:
        """Denied rows whose denial may still clear (``retry_until`` set)."""
        return self._select("status = 'denied' AND retry_until IS NOT NULL")

    def requeues(self, target: str, chain: str | None) -> int:
        """Requeues of one job that ran or are running: of its chain of attempts when known, else
        of that job id among rows without a chain."""
        where, args = ("job_chain = ?", (chain,)) if chain else ("target = ? AND job_chain IS NULL", (target,))
        marks = ",".join("?" * len(RAN))
        row = self.audit.conn.execute(f"SELECT COUNT(*) FROM actions WHERE kind = 'requeue_job' AND {where}"
                                      f" AND status IN ({marks})", (*args, *RAN)).fetchone()
        return int(row[0])

    def attempt_acted(self, kind: str, job_attempt: str) -> bool:
        """A job action of ``kind`` for this attempt already ran or is running (attempt idempotency)."""
        marks = ",".join("?" * len(RAN))
        return self.audit.conn.execute(f"SELECT 1 FROM actions WHERE kind = ? AND job_attempt = ? AND status IN"
                                       f" ({marks}) LIMIT 1", (kind, job_attempt, *RAN)).fetchone() is not None

    def verified_requeues(self) -> list[dict[str, Any]]:
        return self._select("kind = 'requeue_job' AND status IN ('done', 'noop')")

    def counts(self) -> dict[str, int]:
        """Number of rows per status."""
        return dict(self.audit.conn.execute("SELECT status, COUNT(*) FROM actions GROUP BY status").fetchall())

    # ------------------------------------------------------------------ writing
    def insert(self, act_id: str, idem_key: str, kind: str, target: str | None, incident_id: str | None,
               exclude: Sequence[str], cause: str, status: str, decision: str, reason: str, now: float,
               executed_ts: float | None, retry_until: float | None = None,
               trust: dict[str, Any] | None = None, job_attempt: str | None = None,
               job_chain: str | None = None) -> None:
        self.audit.conn.execute(
            "INSERT INTO actions(id, idem_key, kind, target, incident_id, exclude, cause, status, decision, reason,"
            " created_ts, updated_ts, executed_ts, retry_until, trust, job_attempt, job_chain)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (act_id, idem_key, kind, target, incident_id, json.dumps(list(exclude)), cause or "", status, decision,
             reason, now, now, executed_ts, retry_until, json.dumps(trust) if trust else None, job_attempt, job_chain))

    def update(self, act_id: str, **cols: Any) -> None:
        """Set columns of one row (names from ``COLUMNS``; the caller passes ``updated_ts``)."""
        bad = set(cols) - _UPDATABLE
        if bad:
            raise ValueError(f"actions: not updatable columns {sorted(bad)}")
        sets = ", ".join(f"{k} = ?" for k in cols)
        self.audit.conn.execute(f"UPDATE actions SET {sets} WHERE id = ?", (*cols.values(), act_id))

    def claim(self, act_id: str, attempt: int, baseline: int | None, now: float) -> bool:
        """``queued`` -> ``running`` with the attempt number; False when another process took it."""
        return bool(self.audit.conn.execute(
            "UPDATE actions SET status = 'running', attempts = ?, baseline = ?, updated_ts = ?"
            " WHERE id = ? AND status = 'queued'", (attempt, baseline, now, act_id)).rowcount)
