"""Append-only, hash-chained, write-ahead audit trail (SQLite, WAL).

Every record is one row of the ``audit`` table::

    id           1, 2, 3, ... (no gaps)
    ts_ns        wall-clock time the record was written (ns since the epoch, UTC)
    kind         detection | proposal | decision | intent | result | approval | rejection |
                 unsafe_target | untrusted | expired | reconcile | breaker | config | model |
                 session | anchor_gap | state_reset
    incident_id  the incident the record is about, or NULL
    action_id    the remediation action it is about, or NULL
    payload      canonical JSON text (sorted keys, no spaces)
    prev_hash    hash of record id-1 ("0" * 64 for the first record)
    hash         sha256 over the canonical JSON of {id, ts_ns, kind, incident_id, action_id,
                 payload (the stored text), prev_hash}

Triggers forbid UPDATE and DELETE on ``audit``; ``verify()`` recomputes the whole chain and
raises ``AuditChainBroken`` naming the first record that does not match, so a changed byte,
a deleted row or a re-ordered row is found even when someone dropped the triggers.

After every committed write transaction the head (record count, newest hash) and a digest of
the ``actions``/``kv`` tables are written *outside* the database as an anchor
(``recovery_logs.anchors``: an append-only file, syslog, VictoriaLogs; HMAC-signed with a key
file when one is configured). ``verify_db`` checks the database read-only against them, so
deleted newest records, a rollback to an older copy, a lost WAL, a forged appended record, a
re-hashed chain (with the key or an external anchor) and edits to ``actions``/``kv`` are found.
Opening a state dir whose ``audit.db`` is empty, missing while anchors exist, behind its anchors,
or without its triggers is an error, never a fresh start. See ``docs/AUDIT.md``.

The same database file holds the remediation state (``actions`` queue, ``kv`` for the
breaker), so that an intent record and the state change that goes with it commit in one
transaction (``AuditLog.transaction()``). Writers take SQLite's write lock up front
(``BEGIN IMMEDIATE``), so two processes (``watch`` and ``approve``) can append safely.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.anchors import (
    GENESIS,
    Anchorer,
    VerifyReport,
    anchor_path,
    check_anchors,
    head_of,
    missing_triggers,
    read_anchor_file,
)
from recovery_logs.errors import AuditChainBroken, AuditError
from recovery_logs.frames import AUDIT_FRAME_SCHEMA, rows_frame
from recovery_logs.timeutil import ns_to_iso

DB_NAME = "audit.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    kind TEXT NOT NULL,
    incident_id TEXT,
    action_id TEXT,
    payload TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_kind ON audit(kind);
CREATE INDEX IF NOT EXISTS audit_action ON audit(action_id);
CREATE INDEX IF NOT EXISTS audit_incident ON audit(incident_id);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/recovery-logs``, else ``~/.local/state/recovery-logs``."""
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base else Path.home() / ".local" / "state") / "recovery-logs"


def record_hash(rec_id: int, ts_ns: int, kind: str, incident_id: str | None, action_id: str | None,
                payload_text: str, prev_hash: str) -> str:
    body = canonical_json({"id": rec_id, "ts_ns": ts_ns, "kind": kind, "incident_id": incident_id,
                           "action_id": action_id, "payload": payload_text, "prev_hash": prev_hash})
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AuditRecord:
    id: int
    ts_ns: int
    kind: str
    incident_id: str | None
    action_id: str | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time": ns_to_iso(self.ts_ns), "ts_ns": self.ts_ns, "kind": self.kind,
                "incident_id": self.incident_id, "action_id": self.action_id, "payload": self.payload,
                "prev_hash": self.prev_hash, "hash": self.hash}

    def summary(self) -> str:
        p = self.payload
        bits = [str(p["action_id"])] if self.kind in ("approval", "rejection") and p.get("action_id") else []
        bits += [str(p[k]) for k in ("kind", "target", "decision", "outcome", "status", "event")
                 if k in p and p[k] not in (None, "")]
        if p.get("by"):
            bits.append(f"by {p['by']}")
        msg = p.get("reason") or p.get("message") or ""
        return " ".join(bits) + (f" — {msg}" if msg else "")

    def __rich__(self) -> str:
        t = ns_to_iso(self.ts_ns) or ""
        return f"#{self.id:<4} {t[11:19]} {self.kind:<10} {self.incident_id or '-':<16} {self.summary()}"


def _row(r: tuple) -> AuditRecord:
    return AuditRecord(id=r[0], ts_ns=r[1], kind=r[2], incident_id=r[3], action_id=r[4],
                       payload=json.loads(r[5]), prev_hash=r[6], hash=r[7])


class AuditLog:
    """The audit trail of one state dir. ``clock`` returns seconds since the epoch."""

    def __init__(self, path: Path, clock: Callable[[], float] | None = None,
                 anchorer: Anchorer | None = None) -> None:
        self.path = Path(path)
        self.clock = clock or time.time
        self._depth = 0
        prior = read_anchor_file(anchor_path(self.path.parent))
        existed = self.path.exists()
        if existed and self.path.is_file() and self.path.stat().st_size == 0:
            raise AuditError("audit: the audit database is empty (0 bytes) in an existing state dir; its records "
                             "were lost. Restore it from a backup or move the state dir away to start afresh",
                             path=str(self.path))
        if not existed and prior and max(a.count for a in prior) > 0:
            raise AuditError(f"audit: the audit database is missing, but its anchors record "
                             f"{max(a.count for a in prior)} records; restore it or move the state dir away",
                             path=str(self.path))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                        check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            fresh = self.conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'audit'").fetchone()[0] == 0
            if not fresh and missing_triggers(self.conn):
                raise AuditError(f"audit: the append-only triggers were dropped ({', '.join(missing_triggers(self.conn))})"
                                 "; records may have been changed. Run `recovery-logs audit verify`",
                                 path=str(self.path))
            self.conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise AuditError("audit: cannot open the audit database", path=str(self.path),
                             error=str(exc)) from exc
        self.anchorer = anchorer if anchorer is not None else Anchorer.from_env(self.path.parent, self.path)
        self._adopt(prior)

    def _adopt(self, prior: list[Any]) -> None:
        """Compare the database with its newest anchor before writing anything: behind it or
        rewritten is an error; records beyond it (a crash between commit and anchor) are recorded
        as an ``anchor_gap`` and anchored."""
        count, _ = head_of(self.conn)
        if prior:
            last = max(prior, key=lambda a: a.count)
            if last.count > count:
                raise AuditError(f"audit: the database has {count} records but the anchor at {last.where} recorded "
                                 f"{last.count}: records were deleted, the WAL was lost or an older copy was "
                                 "restored. Run `recovery-logs audit verify`", path=str(self.path))
            row = self.conn.execute("SELECT hash FROM audit WHERE id = ?", (last.count,)).fetchone()
            if last.count and (row is None or row[0] != last.head):
                raise AuditError(f"audit: record {last.count} does not match the anchor at {last.where}: the chain "
                                 "was rewritten. Run `recovery-logs audit verify`", path=str(self.path))
            self.anchorer.last = (prior[-1].count, prior[-1].state)
            if count > last.count:
                self.append("anchor_gap", {"from": last.count + 1, "to": count,
                                           "note": "records committed but not anchored (a crash between commit and "
                                                   "anchor, or appended outside recovery-logs); anchored at restart"})
        elif count:
            self.append("anchor_gap", {"from": 1, "to": count, "note": "first anchor of an existing audit trail"})


    @classmethod
    def open(cls, state_dir: Path, clock: Callable[[], float] | None = None) -> AuditLog:
        return cls(Path(state_dir) / DB_NAME, clock=clock)

    def close(self) -> None:
        self.conn.close()
        self.anchorer.close()

    # ------------------------------------------------------------------ transactions
    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (nestable); audit appends and state changes inside commit together."""
        if self._depth:
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise AuditError("audit: cannot lock the audit database", path=str(self.path),
                             error=str(exc)) from exc
        self._depth = 1
        try:
            yield self.conn
        except BaseException:
            self._depth = 0
            self.conn.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            pending = self.anchorer.prepare(self.conn, int(self.clock() * 1e9))
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise AuditError("audit: commit failed", path=str(self.path), error=str(exc)) from exc
        self.anchorer.write(pending)

    # ------------------------------------------------------------------ writing
    def append(self, kind: str, payload: dict[str, Any], *, incident_id: str | None = None,
               action_id: str | None = None) -> AuditRecord:
        text = canonical_json(payload)
        ts_ns = int(self.clock() * 1e9)
        try:
            with self.transaction() as c:
                last = c.execute("SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
                rec_id, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
                h = record_hash(rec_id, ts_ns, kind, incident_id, action_id, text, prev)
                c.execute("INSERT INTO audit(id, ts_ns, kind, incident_id, action_id, payload, prev_hash, hash)"
                          " VALUES (?,?,?,?,?,?,?,?)", (rec_id, ts_ns, kind, incident_id, action_id, text, prev, h))
        except sqlite3.Error as exc:
            raise AuditError("audit: cannot append a record", path=str(self.path), kind=kind,
                             error=str(exc)) from exc
        return AuditRecord(rec_id, ts_ns, kind, incident_id, action_id, json.loads(text), prev, h)

    # ------------------------------------------------------------------ state (kv)
    def get_state(self, key: str, default: Any = None) -> Any:
        """A kv value; AuditError naming the key and the database when it is not JSON of the
        default's type (a damaged or hand-edited state is never read as "not set")."""
        row = self.conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        if not row:
            return default
        try:
            val = json.loads(row[0])
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit: state {key!r} is not JSON ({str(row[0])[:40]!r}); run `recovery-logs audit "
                             "verify`", path=str(self.path), key=key) from exc
        if default is not None and not isinstance(val, type(default)) and not (
                isinstance(default, (int, float)) and isinstance(val, (int, float)) and not isinstance(val, bool)):
            raise AuditError(f"audit: state {key!r} has the wrong type ({type(val).__name__}); run `recovery-logs "
                             "audit verify`", path=str(self.path), key=key)
        return val

    def raw_state(self, key: str) -> str | None:
        """The stored text of a kv value, unparsed (to record a corrupt value before resetting it)."""
        row = self.conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])[:200]

    def set_state(self, key: str, value: Any) -> None:
        with self.transaction() as c:
            c.execute("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (key, canonical_json(value)))

    # ------------------------------------------------------------------ reading
    def records(self, kind: str | None = None, *, incident_id: str | None = None,
                action_id: str | None = None, after_id: int = 0, limit: int | None = None,
                newest_first: bool = False) -> list[AuditRecord]:
        q = "SELECT id, ts_ns, kind, incident_id, action_id, payload, prev_hash, hash FROM audit WHERE id > ?"
        args: list[Any] = [after_id]
        for col, val in (("kind", kind), ("incident_id", incident_id), ("action_id", action_id)):
            if val is not None:
                q += f" AND {col} = ?"
                args.append(val)
        q += " ORDER BY id DESC" if newest_first else " ORDER BY id"
        if limit is not None:
            q += f" LIMIT {int(limit)}"
        return [_row(r) for r in self.conn.execute(q, args)]

    def count(self, kind: str | None = None) -> int:
        if kind is None:
            return self.conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM audit WHERE kind = ?", (kind,)).fetchone()[0]

    def last_detection_status(self, incident_id: str) -> str | None:
        """``status`` of the newest ``detection`` record of an incident (None: never recorded)."""
        row = self.conn.execute(
            "SELECT json_extract(payload, '$.status') FROM audit WHERE kind = 'detection' AND incident_id = ?"
            " ORDER BY id DESC LIMIT 1", (incident_id,)).fetchone()
        return None if row is None else row[0]

    def open_intents(self) -> list[AuditRecord]:
        """Intent records with no result record for the same action and attempt (write-ahead gaps)."""
        out = []
        for rec in self.records("intent"):
            attempt = rec.payload.get("attempt")
            done = self.conn.execute(
                "SELECT 1 FROM audit WHERE kind IN ('result', 'reconcile') AND action_id = ? AND id > ?"
                " AND json_extract(payload, '$.attempt') = ? LIMIT 1", (rec.action_id, rec.id, attempt)).fetchone()
            if not done:
                out.append(rec)
        return out

    def verify(self) -> int:
        """Recompute the chain through this (writing) connection. Returns the number of records;
        raises AuditChainBroken at the first bad one. ``verify_db`` is the full, read-only check."""
        return check_chain(self.conn, str(self.path))

    # ------------------------------------------------------------------ export
    def export(self, out: Path, fmt: str = "jsonl") -> int:
        """Write every record to ``out`` as JSON lines or Parquet. Returns the number written."""
        recs = self.records()
        out = Path(out)
        if fmt == "jsonl":
            with out.open("w", encoding="utf-8") as fh:
                for r in recs:
                    fh.write(canonical_json(r.to_dict()) + "\n")
        elif fmt == "parquet":
            df = pl.DataFrame(
                {"id": [r.id for r in recs], "ts_ns": [r.ts_ns for r in recs], "kind": [r.kind for r in recs],
                 "incident_id": [r.incident_id for r in recs], "action_id": [r.action_id for r in recs],
                 "payload": [canonical_json(r.payload) for r in recs], "prev_hash": [r.prev_hash for r in recs],
                 "hash": [r.hash for r in recs]},
                schema={"id": pl.Int64, "ts_ns": pl.Int64, "kind": pl.String, "incident_id": pl.String,
                        "action_id": pl.String, "payload": pl.String, "prev_hash": pl.String, "hash": pl.String})
            df = df.with_columns(pl.col("ts_ns").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").alias("time"))
            df.write_parquet(out)
        else:
            raise AuditError(f"audit export: unknown format {fmt!r} (use jsonl or parquet)", format=fmt)
        return len(recs)



def check_chain(conn: sqlite3.Connection, path: str) -> int:
    """Recompute the hash chain; the number of records, or AuditChainBroken at the first bad one."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit'").fetchone() is None:
        raise AuditChainBroken("audit database has no audit table", path=path)
    prev, expect_id = GENESIS, 1
    cur = conn.execute("SELECT id, ts_ns, kind, incident_id, action_id, payload, prev_hash, hash FROM audit ORDER BY id")
    for rec_id, ts_ns, kind, inc, act, payload, prev_hash, h in cur:
        where = {"path": path, "kind": kind}
        if rec_id != expect_id:
            raise AuditChainBroken(f"audit record {expect_id} is missing (next record is {rec_id})",
                                   record_id=expect_id, **where)
        if prev_hash != prev:
            raise AuditChainBroken(f"audit record {rec_id} does not link to record {rec_id - 1}", record_id=rec_id,
                                   **where)
        if not isinstance(payload, str) or record_hash(rec_id, ts_ns, kind, inc, act, payload, prev_hash) != h:
            raise AuditChainBroken(f"audit record {rec_id} was changed (hash mismatch)", record_id=rec_id, **where)
        try:
            json.loads(payload)
        except ValueError as exc:
            raise AuditChainBroken(f"audit record {rec_id} payload is not JSON", record_id=rec_id, **where) from exc
        prev = h
        expect_id += 1
    return expect_id - 1


def open_readonly(db: Path) -> sqlite3.Connection:
    """The audit DB, read-only (``mode=ro``): nothing is created, migrated, repaired or checkpointed."""
    if not db.exists():
        raise AuditError("audit: no audit database in the state dir", path=str(db))
    if not db.is_file():
        raise AuditChainBroken("audit database is not a file", path=str(db))
    if db.stat().st_size == 0:
        raise AuditChainBroken("audit database is empty (0 bytes): its records were lost or it was truncated",
                               path=str(db))
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30, isolation_level=None)
        conn.execute("PRAGMA query_only=1")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise AuditChainBroken(f"audit database is not a readable SQLite database: {exc}", path=str(db)) from exc
    return conn


def verify_db(db: Path, key: bytes | None = None, anchor_file: Path | None = None,
              extra_anchors: Sequence[Any] = ()) -> VerifyReport:
    """Read-only verification of ``db``: triggers, chain, every anchor (the file next to the
    database unless ``anchor_file``, plus ``extra_anchors`` read elsewhere, e.g. VictoriaLogs),
    and the actions/kv digest of the newest anchor. AuditChainBroken names what disagrees."""
    db = Path(db)
    conn = open_readonly(db)
    try:
        try:
            found = read_anchor_file(anchor_file or anchor_path(db.parent))
            no_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit'"
                                    ).fetchone() is None
            if no_table and (found or extra_anchors):   # lost whole (e.g. the WAL held everything): say so
                check_anchors(conn, [*found, *extra_anchors], key, str(db), 0)
            gone = missing_triggers(conn)
            count = check_chain(conn, str(db))
            if gone:
                raise AuditChainBroken(f"audit triggers dropped: {', '.join(gone)} (records could be changed in "
                                       "place)", path=str(db))
            notes = check_anchors(conn, found, key, str(db), count)
            if extra_anchors:
                check_anchors(conn, list(extra_anchors), key, str(db), count)
        except sqlite3.Error as exc:
            raise AuditChainBroken(f"audit database cannot be read: {exc}", path=str(db)) from exc
        if found and key is None and any(a.sig for a in found):
            notes.append("anchors are signed but no key was given: signatures not checked")
        return VerifyReport(count, len(found) + len(extra_anchors), key is not None, notes)
    finally:
        conn.close()


def audit_rows(records: list[AuditRecord]) -> list[dict[str, str]]:
    """Audit records as VictoriaLogs log lines (``unit=recovery-logs-audit``), so operators find
    every decision beside the logs that caused it. All values are strings, as the server stores them."""

    rows = []
    for r in records:
        p = r.payload
        target = p.get("target") or p.get("node") or ""
        what = " ".join(str(x) for x in (p.get("kind"), target, p.get("decision") or p.get("status")) if x)
        rows.append({"_time": ns_to_iso(r.ts_ns) or "", "unit": "recovery-logs-audit", "host": str(target),
                     "audit_id": str(r.id), "audit_kind": r.kind, "incident_id": r.incident_id or "",
                     "action_id": r.action_id or "", "hash": r.hash,
                     "_msg": f"recovery-logs audit #{r.id} {r.kind}" + (f" {what}" if what else "")
                             + (f" incident {r.incident_id}" if r.incident_id else ""),
                     "payload": json.dumps(p, sort_keys=True, ensure_ascii=False, default=str)})
    return rows


def load_audit(state: str | Path | Any, kind: str | None = None) -> pl.DataFrame:
    """Audit records (``AUDIT_FRAME_SCHEMA``) from a state dir, an ``audit.db`` or an ``AuditLog``.

    ``action_kind``, ``target``, ``decision``, ``status``, ``by`` and ``reason`` are lifted from the
    payload where present (``kind`` is the record kind: proposal, decision, approval, ...).
    """
    own = not isinstance(state, AuditLog)
    if isinstance(state, AuditLog):
        log = state
    else:
        where = Path(state)
        db = where / DB_NAME if where.is_dir() else where
        if not db.is_file():
            raise AuditError("audit: no audit database here", path=str(db))
        log = AuditLog(db)
    try:
        recs = log.records(kind)
    finally:
        if own:
            log.close()
    rows = []
    for r in recs:
        p = r.payload
        rows.append({"id": r.id, "time": r.ts_ns, "kind": r.kind, "incident_id": r.incident_id,
                     "action_id": r.action_id or p.get("action_id"), "action_kind": p.get("kind"),
                     "target": p.get("target"), "decision": p.get("decision"), "status": p.get("status"),
                     "by": p.get("by"), "reason": p.get("reason") or p.get("message"),
                     "payload": canonical_json(p)})
    return rows_frame(rows, AUDIT_FRAME_SCHEMA)


__all__ = ["AuditLog", "AuditRecord", "DB_NAME", "GENESIS", "audit_rows", "canonical_json", "check_chain",
           "default_state_dir", "load_audit", "open_readonly", "record_hash", "verify_db"]
