"""Anchors of the audit chain outside the database, and the read-only verifier.

The hash chain inside ``audit.db`` proves that no record was changed *relative to the records
after it*. It cannot tell that the newest records were deleted, that an older copy was restored,
that the WAL was lost, or that someone appended a record (or re-hashed the whole chain) with the
same code we run. So after every write transaction the audit log writes an **anchor** outside the
database::

    {"v": 1, "count": 87, "head": "<hash of record 87>", "state": "<sha256 of the actions and kv tables>",
     "ts_ns": ..., "db": "/state/audit.db", "sig": "<HMAC-SHA256 of the other fields, or null>"}

to every configured sink:

* a separate append-only file (default ``<state-dir>/audit.anchors``; ``RECOVERY_LOGS_AUDIT_ANCHORS``
  names another path — put it on another file system or make it ``chattr +a``), fsynced;
* the journal / syslog (``/dev/log``, tag ``recovery-logs-audit``) unless
  ``RECOVERY_LOGS_AUDIT_SYSLOG=0``;
* VictoriaLogs (``unit=recovery-logs-audit-anchor``) when ``RECOVERY_LOGS_AUDIT_VL`` names a
  ``victorialogs://HOST:PORT``.

``RECOVERY_LOGS_AUDIT_KEY_FILE`` names a file whose bytes are an HMAC key: anchors are then signed,
and ``audit verify --key-file`` rejects any anchor that is unsigned or signed with another key.
``RECOVERY_LOGS_AUDIT_ANCHOR_EVERY`` (default 1) anchors every N records; a transaction that
changes the ``actions`` or ``kv`` tables (every action) is always anchored.

``audit.verify_db`` opens the database read-only (``mode=ro``; it never creates, migrates or repairs
anything) and checks, in order: the file is a non-empty SQLite database; the append-only
triggers exist; the chain links and hashes; every anchor (signature, then: the database has the
record the anchor names, with that hash); the newest anchor's ``state`` digest equals the current
``actions``/``kv`` tables; no record lies beyond the newest anchor. The first failure raises
``AuditChainBroken`` naming the anchor (sink, line, time) that disagrees.

What is and is not detectable is written down in ``docs/AUDIT.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import logging.handlers
import os
import socket
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from recovery_logs.errors import AuditChainBroken, AuditError, SourceError
from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url
from recovery_logs.timeutil import ns_to_iso

log = logging.getLogger("recovery_logs.audit")

ANCHOR_FILE = "audit.anchors"
SYSLOG_TAG = "recovery-logs-audit"
VL_UNIT = "recovery-logs-audit-anchor"
ENV_FILE, ENV_KEY, ENV_SYSLOG, ENV_VL, ENV_EVERY = (
    "RECOVERY_LOGS_AUDIT_ANCHORS", "RECOVERY_LOGS_AUDIT_KEY_FILE", "RECOVERY_LOGS_AUDIT_SYSLOG",
    "RECOVERY_LOGS_AUDIT_VL", "RECOVERY_LOGS_AUDIT_ANCHOR_EVERY")
TRIGGERS = ("audit_no_update", "audit_no_delete")
STATE_TABLES = ("actions", "kv")

__all__ = ["ANCHOR_FILE", "GENESIS", "Anchor", "Anchorer", "FileSink", "SyslogSink", "VerifyReport",
           "VictoriaLogsSink", "anchor_path", "check_anchors", "head_of", "load_key", "missing_triggers",
           "read_anchor_file", "state_digest", "vl_anchors"]


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def load_key(path: str | Path | None) -> bytes | None:
    """The HMAC key (the file's bytes, surrounding whitespace stripped); None without a path."""
    if path is None or str(path) == "":
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise AuditError(f"audit: cannot read the anchor key file: {exc.strerror or exc}", path=str(path)) from exc
    if len(key) < 16:
        raise AuditError("audit: the anchor key file holds fewer than 16 bytes", path=str(path))
    return key


@dataclass(frozen=True)
class Anchor:
    count: int                 # records in the chain (= id of the newest record; ids have no gaps)
    head: str                  # hash of record ``count`` (GENESIS for an empty chain)
    state: str                 # sha256 of the actions and kv tables
    ts_ns: int
    db: str = ""
    sig: str | None = None
    where: str = ""            # where it was read from (for messages), not part of the anchor

    def body(self) -> dict[str, Any]:
        return {"v": 1, "count": self.count, "head": self.head, "state": self.state, "ts_ns": self.ts_ns,
                "db": self.db}

    def signed(self, key: bytes | None) -> Anchor:
        if key is None:
            return self
        mac = hmac.new(key, _canon(self.body()).encode(), hashlib.sha256).hexdigest()
        return Anchor(self.count, self.head, self.state, self.ts_ns, self.db, mac, self.where)

    def sig_ok(self, key: bytes) -> bool:
        if not self.sig:
            return False
        want = hmac.new(key, _canon(self.body()).encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, self.sig)

    def line(self) -> str:
        return _canon({**self.body(), "sig": self.sig})

    @classmethod
    def parse(cls, text: str, where: str) -> Anchor:
        try:
            d = json.loads(text)
            return cls(int(d["count"]), str(d["head"]), str(d["state"]), int(d["ts_ns"]), str(d.get("db", "")),
                       d.get("sig"), where)
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditChainBroken(f"audit anchor at {where} is not a valid anchor", anchor=where) from exc


def state_digest(conn: sqlite3.Connection) -> str:
    """sha256 over every row of the tables that drive actions (``actions``, ``kv``), in key order."""
    h = hashlib.sha256()
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in STATE_TABLES:
        h.update(f"\x00{table}\x00".encode())
        if table not in have:
            continue
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        order = "id" if "id" in cols else "key"
        for row in conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order}"):
            h.update(_canon(dict(zip(cols, row, strict=True))).encode())
            h.update(b"\n")
    return h.hexdigest()


GENESIS = "0" * 64


def head_of(conn: sqlite3.Connection) -> tuple[int, str]:
    row = conn.execute("SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
    return (int(row[0]), str(row[1])) if row else (0, GENESIS)


# --------------------------------------------------------------------------- sinks
class AnchorSink(Protocol):
    """Where anchors go. ``write`` must not raise for a transient failure of its medium (it logs
    and counts ``failures``); the file sink raises AuditError, because it is what verify reads."""

    name: str

    def write(self, anchor: Anchor) -> None: ...


class FileSink:
    """One JSON line per anchor, opened ``O_APPEND``, fsynced before ``write`` returns."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = f"file:{self.path}"

    def write(self, anchor: Anchor) -> None:
        data = (anchor.line() + "\n").encode()
        try:
            if self.path.exists() and self.path.stat().st_size:
                with open(self.path, "rb") as fh:   # a torn last line (crash mid-write): start a fresh one
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        data = b"\n" + data
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise AuditError(f"audit: cannot write the anchor file: {exc.strerror or exc}",
                             path=str(self.path)) from exc


class SyslogSink:
    """The journal / syslog through ``/dev/log`` (or ``address``), tag ``recovery-logs-audit``."""

    def __init__(self, address: str | tuple[str, int] = "/dev/log") -> None:
        self.name = f"syslog:{address}"
        self.failures = 0
        self._handler = logging.handlers.SysLogHandler(
            address=address, facility=logging.handlers.SysLogHandler.LOG_AUTHPRIV,
            socktype=socket.SOCK_DGRAM)
        self._handler.ident = f"{SYSLOG_TAG}: "

    def write(self, anchor: Anchor) -> None:
        rec = logging.LogRecord(SYSLOG_TAG, logging.INFO, __file__, 0, "anchor %s", (anchor.line(),), None)
        try:
            self._handler.emit(rec)
        except Exception:   # noqa: BLE001 - logging handlers raise anything; never stop the audit for syslog
            self.failures += 1

    def close(self) -> None:
        self._handler.close()


class VictoriaLogsSink:
    """Anchors as log lines in VictoriaLogs (``unit=recovery-logs-audit-anchor``)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.name = f"victorialogs:{client.base_url}"
        self.failures = 0

    def write(self, anchor: Anchor) -> None:
        row = {"_time": ns_to_iso(anchor.ts_ns) or "", "unit": VL_UNIT, "_msg": f"recovery-logs audit anchor "
               f"{anchor.count} {anchor.head}", "anchor": anchor.line()}
        try:
            self.client.insert_jsonline([row], stream_fields=("unit",))
        except SourceError as exc:
            self.failures += 1
            log.warning("audit anchor not written to %s: %s", self.name, exc)


def vl_anchors(client: Any, start_ns: int = 0) -> list[Anchor]:
    """Anchors stored in VictoriaLogs, oldest first."""
    rows = client.query(f'unit:="{VL_UNIT}" | sort by (_time)', start=start_ns or "1970-01-01T00:00:00Z")
    return [Anchor.parse(r["anchor"], f"{client.base_url} _time {r.get('_time', '')}")
            for r in rows if r.get("anchor")]


# --------------------------------------------------------------------------- writer side
@dataclass
class Anchorer:
    """Writes an anchor after a commit when ``every`` records were added since the last one, or
    when the actions/kv tables changed (every action)."""

    sinks: list[Any]
    key: bytes | None = None
    every: int = 1
    db: str = ""
    last: tuple[int, str] | None = None       # (count, state) of the last anchor written
    written: int = 0

    @classmethod
    def from_env(cls, state_dir: Path, db: Path, env: dict[str, str] | None = None) -> Anchorer:
        env = dict(os.environ) if env is None else env
        sinks: list[Any] = [FileSink(anchor_path(state_dir, env))]
        if env.get(ENV_SYSLOG, "1") not in ("0", "false", "no", "") and Path("/dev/log").exists():
            try:
                sinks.append(SyslogSink())
            except OSError as exc:
                log.warning("audit anchors: syslog unavailable: %s", exc)
        if env.get(ENV_VL):
            sinks.append(VictoriaLogsSink(VictoriaLogsClient(parse_url(env[ENV_VL]), retries=1)))
        try:
            every = max(1, int(env.get(ENV_EVERY, "1")))
        except ValueError as exc:
            raise AuditError(f"audit: {ENV_EVERY} must be an integer", value=env.get(ENV_EVERY)) from exc
        return cls(sinks, load_key(env.get(ENV_KEY)), every, str(db))

    def prepare(self, conn: sqlite3.Connection, ts_ns: int) -> Anchor | None:
        """The anchor for what is about to be committed (called inside the write transaction, so
        two writers' anchors are taken in commit order), or None when none is due."""
        count, head = head_of(conn)
        state = state_digest(conn)
        if self.last == (count, state):
            return None
        if self.last is not None and self.last[1] == state and count - self.last[0] < self.every:
            return None
        return Anchor(count, head, state, ts_ns, self.db).signed(self.key)

    def write(self, anchor: Anchor | None) -> None:
        """Write a prepared anchor to every sink (after the commit)."""
        if anchor is None:
            return
        for s in self.sinks:
            s.write(anchor)
        self.last = (anchor.count, anchor.state)
        self.written += 1

    def close(self) -> None:
        for s in self.sinks:
            if hasattr(s, "close"):
                s.close()


def anchor_path(state_dir: Path, env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env[ENV_FILE]) if env.get(ENV_FILE) else Path(state_dir) / ANCHOR_FILE


def read_anchor_file(path: Path) -> list[Anchor]:
    """Every anchor in the file, in order. A torn line (a crash while writing: an anchor's JSON cut
    short, with no closing brace) is skipped; any other line that is not an anchor is an error
    naming the line."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AuditError(f"audit: cannot read the anchor file: {exc.strerror or exc}", path=str(path)) from exc
    lines = text.split("\n")
    out = []
    for i, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        if ln.startswith('{"count":') and not ln.rstrip().endswith("}"):
            continue   # torn write
        out.append(Anchor.parse(ln, f"{path}:{i}"))
    return out


# --------------------------------------------------------------------------- verifier
@dataclass
class VerifyReport:
    records: int
    anchors: int
    signed: bool
    notes: list[str] = field(default_factory=list)


def missing_triggers(conn: sqlite3.Connection) -> list[str]:
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    return [t for t in TRIGGERS if t not in have]


def check_anchors(conn: sqlite3.Connection, anchors: Sequence[Anchor], key: bytes | None, path: str,
                  count: int) -> list[str]:
    """Every anchor against the database; returns notes, raises AuditChainBroken at the first disagreement."""
    notes: list[str] = []
    if anchors:
        top = max(enumerate(anchors), key=lambda ia: (ia[1].count, ia[0]))[1]
        if key is not None and not top.sig_ok(key):
            raise AuditChainBroken(f"audit anchor at {top.where} is {'not signed' if not top.sig else 'signed with another key'}"
                                   " (forged or edited anchor)", anchor=top.where, path=path)
        if top.count > count:
            raise AuditChainBroken(f"audit anchor at {top.where} says the chain had {top.count} records; the database "
                                   f"has {count}: records were deleted, the WAL was lost, or an older copy was "
                                   "restored", anchor=top.where, path=path, record_id=count + 1)
    for a in anchors:
        if key is not None and not a.sig_ok(key):
            raise AuditChainBroken(f"audit anchor at {a.where} is {'not signed' if not a.sig else 'signed with another key'}"
                                   f" (forged or edited anchor)", anchor=a.where, path=path)
        if a.count > count:
            raise AuditChainBroken(f"audit anchor at {a.where} says the chain had {a.count} records; the database has "
                                   f"{count}: records were deleted, the WAL was lost, or an older copy was restored",
                                   anchor=a.where, path=path, record_id=count + 1)
        if a.count == 0:
            continue
        row = conn.execute("SELECT hash FROM audit WHERE id = ?", (a.count,)).fetchone()
        if row is None or row[0] != a.head:
            raise AuditChainBroken(f"audit record {a.count} does not match the anchor at {a.where} (the chain was "
                                   f"rewritten or re-hashed)", anchor=a.where, path=path, record_id=a.count)
    if not anchors:
        notes.append("no anchors: only the chain itself was checked (deleted newest records, rollback and "
                     "re-hashing are not detectable)")
        return notes
    last = max(anchors, key=lambda a: a.count)
    if count > last.count:
        raise AuditChainBroken(f"audit records {last.count + 1}..{count} are not anchored (newest anchor at "
                               f"{last.where} covers {last.count}): appended outside recovery-logs, or a crash "
                               f"between commit and anchor that no restart has closed yet",
                               anchor=last.where, path=path, record_id=last.count + 1)
    newest = max(enumerate(anchors), key=lambda ia: (ia[1].count, ia[1].ts_ns, ia[0]))[1]
    if newest.count == count and state_digest(conn) != newest.state:
        raise AuditChainBroken(f"the actions/kv tables differ from the anchor at {newest.where} (edited outside "
                               f"recovery-logs)", anchor=newest.where, path=path)
    return notes
