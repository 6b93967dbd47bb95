"""Every tampering case of issue 12 is caught by `audit verify` (exit 3, naming what disagrees),
verify never writes, and a damaged state dir is an error on open, never a fresh start."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recovery_logs.anchors import ANCHOR_FILE, Anchor, Anchorer, FileSink, SyslogSink, read_anchor_file
from recovery_logs.audit import DB_NAME, AuditLog, record_hash, verify_db
from recovery_logs.cli import main
from recovery_logs.errors import AuditChainBroken, AuditError

KEY = b"0123456789abcdef-test-key"


def _fill(state: Path, n: int = 30, key_file: Path | None = None) -> None:
    """A trail with records, actions rows and kv state, as the remediator writes them."""
    t = iter(range(1_795_000_000, 1_795_100_000))
    anch = Anchorer([FileSink(state / ANCHOR_FILE)], key=key_file.read_bytes().strip() if key_file else None,
                    db=str(state / DB_NAME))
    state.mkdir(parents=True, exist_ok=True)
    log = AuditLog(state / DB_NAME, clock=lambda: float(next(t)), anchorer=anch)
    log.conn.execute("CREATE TABLE IF NOT EXISTS actions (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
    for i in range(n):
        with log.transaction() as c:
            log.append("decision", {"i": i, "target": f"gpu-n0{i % 4 + 1}"}, incident_id=f"inc-{i}",
                       action_id=f"act-{i}")
            c.execute("INSERT INTO actions(id, status) VALUES (?, 'done')", (f"act-{i}",))
    log.set_state("breaker", {"tripped": True, "reason": "3 of 8 nodes"})
    log.close()


def _run_verify(state: Path, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["audit", "verify", "--state-dir", str(state), *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


def _sql(db: Path, script: str, args: tuple = (), keep_triggers: bool = True) -> None:
    """Tamper as an attacker with file access would: drop the triggers, change, put them back."""
    con = sqlite3.connect(db)
    con.executescript("DROP TRIGGER IF EXISTS audit_no_update; DROP TRIGGER IF EXISTS audit_no_delete;")
    con.execute(script, args)
    con.commit()
    if keep_triggers:
        con.executescript("""
        CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;""")
    con.close()


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    _fill(state)
    return state


def test_intact_trail_verifies(trail: Path, capsys):
    rc, out = _run_verify(trail, capsys)
    assert rc == 0, out
    assert "audit chain OK: 30 records" in out and "anchors" in out


@pytest.mark.parametrize("n", [1, 10, "all"])
def test_deleting_the_newest_records_is_detected(trail: Path, capsys, n):
    where = "1" if n == "all" else f"id > (SELECT MAX(id) FROM audit) - {n}"
    _sql(trail / DB_NAME, f"DELETE FROM audit WHERE {where}")
    rc, out = _run_verify(trail, capsys)
    assert rc == 3, out
    assert "says the chain had 30 records" in out and ANCHOR_FILE in out


def test_zero_byte_db_is_detected_and_never_a_fresh_start(trail: Path, capsys):
    (trail / DB_NAME).write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        (trail / (DB_NAME + suffix)).unlink(missing_ok=True)
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and "empty (0 bytes)" in out
    with pytest.raises(AuditError, match="empty"):
        AuditLog.open(trail)
    assert (trail / DB_NAME).stat().st_size == 0          # nothing was created over it


def test_missing_db_with_anchors_is_an_error(trail: Path):
    for suffix in ("", "-wal", "-shm"):
        (trail / (DB_NAME + suffix)).unlink(missing_ok=True)
    with pytest.raises(AuditError, match="missing, but its anchors record 30 records"):
        AuditLog.open(trail)
    assert not (trail / DB_NAME).exists()


def test_unreadable_db_is_an_error(trail: Path, capsys):
    (trail / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    (trail / (DB_NAME + "-wal")).unlink(missing_ok=True)
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and "not a readable SQLite database" in out
    with pytest.raises(AuditError):
        AuditLog.open(trail)


def test_wal_deleted_after_kill9_is_detected(tmp_path: Path, capsys):
    state = tmp_path / "state"
    code = textwrap.dedent(f"""
        import os, signal
        from recovery_logs.audit import AuditLog
        log = AuditLog.open({str(state)!r})
        for i in range(87):
            log.append("decision", {{"i": i}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert (state / (DB_NAME + "-wal")).exists()             # the records live in the WAL until a checkpoint
    (state / (DB_NAME + "-wal")).unlink()
    (state / (DB_NAME + "-shm")).unlink(missing_ok=True)
    rc, out = _run_verify(state, capsys)
    assert rc == 3, out
    assert "says the chain had 87 records; the database has 0" in out
    with pytest.raises(AuditError, match="has 0 records but the anchor"):
        AuditLog.open(state)


def test_rollback_to_an_older_copy_is_detected(tmp_path: Path, capsys):
    state = tmp_path / "state"
    _fill(state, n=5)
    backup = tmp_path / "old.db"
    shutil.copy(state / DB_NAME, backup)
    log = AuditLog.open(state)
    for i in range(3):
        log.append("decision", {"later": i})
    log.close()
    shutil.copy(backup, state / DB_NAME)
    rc, out = _run_verify(state, capsys)
    assert rc == 3 and "an older copy was restored" in out


def test_forged_record_with_a_correct_hash_is_detected(trail: Path, capsys):
    con = sqlite3.connect(trail / DB_NAME)
    rid, prev = con.execute("SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
    payload = json.dumps({"kind": "drain_node", "target": "gpu-n07", "decision": "approved"},
                         sort_keys=True, separators=(",", ":"))
    h = record_hash(rid + 1, 1_795_000_999_000_000_000, "decision", "inc-x", "act-x", payload, prev)
    con.execute("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?)",
                (rid + 1, 1_795_000_999_000_000_000, "decision", "inc-x", "act-x", payload, prev, h))
    con.commit()
    con.close()
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and f"records {rid + 1}..{rid + 1} are not anchored" in out


def _rehash_all(db: Path) -> None:
    """Rewrite every record's payload and recompute the whole chain with our own hash function."""
    con = sqlite3.connect(db)
    rows = con.execute("SELECT id, ts_ns, kind, incident_id, action_id, payload FROM audit ORDER BY id").fetchall()
    con.close()
    prev = "0" * 64
    new = []
    for rid, ts, kind, inc, act, payload in rows:
        payload = payload.replace("gpu-n01", "gpu-n02")
        h = record_hash(rid, ts, kind, inc, act, payload, prev)
        new.append((payload, prev, h, rid))
        prev = h
    con = sqlite3.connect(db)
    con.executescript("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
    con.executemany("UPDATE audit SET payload = ?, prev_hash = ?, hash = ? WHERE id = ?", new)
    con.commit()
    con.close()


def test_rehashed_chain_is_detected_by_the_anchor_file(trail: Path, capsys):
    _rehash_all(trail / DB_NAME)                               # the chain alone is consistent again
    con = sqlite3.connect(trail / DB_NAME)
    con.executescript("""
        CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;""")
    con.close()
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and "does not match the anchor at" in out and "re-hashed" in out


def test_rehashed_chain_with_rewritten_anchors_needs_the_key(tmp_path: Path, capsys):
    """An attacker who also rewrites the anchor file (without the key) is caught by the signature;
    without a key that case is undetectable from this host alone (docs/AUDIT.md says so)."""
    key_file = tmp_path / "audit.key"
    key_file.write_bytes(KEY)
    state = tmp_path / "state"
    _fill(state, key_file=key_file)
    _rehash_all(state / DB_NAME)
    con = sqlite3.connect(state / DB_NAME)
    con.executescript("""
        CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'append-only'); END;""")
    rows = con.execute("SELECT id, hash FROM audit ORDER BY id").fetchall()
    con.close()
    old = read_anchor_file(state / ANCHOR_FILE)
    forged = [Anchor(a.count, dict(rows)[a.count] if a.count else a.head, a.state, a.ts_ns, a.db) for a in old]
    (state / ANCHOR_FILE).write_text("".join(a.line() + "\n" for a in forged))
    rc, out = _run_verify(state, capsys)
    assert rc == 0, out                                      # no key: the documented blind spot
    rc, out = _run_verify(state, capsys, "--key-file", str(key_file))
    assert rc == 3 and "is not signed" in out
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(b"another-key-of-enough-bytes")
    rc, out = _run_verify(tmp_path / "state", capsys, "--key-file", str(wrong))
    assert rc == 3


def test_signed_trail_verifies_with_its_key(tmp_path: Path, capsys):
    key_file = tmp_path / "audit.key"
    key_file.write_bytes(KEY)
    _fill(tmp_path / "s", key_file=key_file)
    rc, out = _run_verify(tmp_path / "s", capsys, "--key-file", str(key_file))
    assert rc == 0 and "key checked" in out, out


@pytest.mark.parametrize("edit", ["UPDATE actions SET status = 'failed' WHERE id = 'act-3'",
                                  "DELETE FROM actions WHERE id = 'act-7'",
                                  "UPDATE kv SET value = '{\"tripped\":false}' WHERE key = 'breaker'",
                                  "INSERT INTO kv(key, value) VALUES ('cluster_nodes', '800')"])
def test_edits_to_actions_and_kv_are_detected(trail: Path, capsys, edit):
    con = sqlite3.connect(trail / DB_NAME)
    con.execute(edit)
    con.commit()
    con.close()
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and "actions/kv tables differ from the anchor" in out


def test_dropped_triggers_are_detected_and_not_healed(trail: Path, capsys):
    con = sqlite3.connect(trail / DB_NAME)
    con.executescript("DROP TRIGGER audit_no_delete;")
    con.close()
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and "triggers dropped: audit_no_delete" in out
    with pytest.raises(AuditError, match="triggers were dropped"):
        AuditLog.open(trail)
    con = sqlite3.connect(trail / DB_NAME)
    assert con.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 1
    con.close()


def _digest(state: Path) -> dict[str, str]:
    """Bytes of everything but the shared-memory index; an empty WAL (which any SQLite reader of a
    WAL database may create) holds no data and counts as absent."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.iterdir())
            if p.name != DB_NAME + "-shm" and not (p.name == DB_NAME + "-wal" and p.stat().st_size == 0)}


def test_verify_never_writes(tmp_path: Path, capsys):
    """Also with records still in the WAL (a watcher killed before any checkpoint)."""
    state = tmp_path / "state"
    code = textwrap.dedent(f"""
        import os, signal
        from recovery_logs.audit import AuditLog
        log = AuditLog.open({str(state)!r})
        for i in range(20):
            log.append("decision", {{"i": i}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    before = _digest(state)
    mtimes = {p.name: p.stat().st_mtime_ns for p in state.iterdir() if not p.name.endswith("-shm")}
    assert (state / (DB_NAME + "-wal")).stat().st_size > 0
    rc, out = _run_verify(state, capsys)
    assert rc == 0 and "20 records" in out, out
    assert _digest(state) == before
    assert {p.name: p.stat().st_mtime_ns for p in state.iterdir() if not p.name.endswith("-shm")} == mtimes
    # read-only is read-only: a dropped trigger is reported, never re-created by verify
    con = sqlite3.connect(state / DB_NAME)
    con.executescript("DROP TRIGGER audit_no_update;")
    con.close()
    before = _digest(state)
    assert _run_verify(state, capsys)[0] == 3
    assert _digest(state) == before


def test_crash_between_commit_and_anchor_is_recorded_at_restart(tmp_path: Path, capsys):
    state = tmp_path / "state"
    _fill(state, n=3)
    lines = (state / ANCHOR_FILE).read_text().splitlines()
    (state / ANCHOR_FILE).write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:17])   # lost + torn anchors
    rc, out = _run_verify(state, capsys)
    assert rc == 3 and "are not anchored" in out
    log = AuditLog.open(state)                                 # the writer closes the gap visibly
    gap = log.records("anchor_gap")
    assert len(gap) == 1 and "anchored at restart" in gap[0].payload["note"]
    log.close()
    assert _run_verify(state, capsys)[0] == 0


def test_syslog_sink_writes_to_a_real_socket(tmp_path: Path):
    path = str(tmp_path / "log.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(5)
    try:
        sink = SyslogSink(address=path)
        a = Anchor(12, "ab" * 32, "cd" * 32, 1_795_000_000_000_000_000, "/s/audit.db").signed(KEY)
        sink.write(a)
        msg = srv.recv(65536).decode()
        sink.close()
    finally:
        srv.close()
    assert "recovery-logs-audit: anchor " in msg and a.line() in msg
    assert msg.startswith("<")                                 # a syslog priority header


def test_env_configures_sinks_and_key(tmp_path: Path):
    key_file = tmp_path / "k"
    key_file.write_bytes(KEY)
    other = tmp_path / "elsewhere" / "anchors.jsonl"
    other.parent.mkdir()
    env = {"RECOVERY_LOGS_AUDIT_ANCHORS": str(other), "RECOVERY_LOGS_AUDIT_KEY_FILE": str(key_file),
           "RECOVERY_LOGS_AUDIT_SYSLOG": "0"}
    a = Anchorer.from_env(tmp_path / "s", tmp_path / "s" / DB_NAME, env)
    assert [s.name for s in a.sinks] == [f"file:{other}"] and a.key == KEY
    (tmp_path / "short").write_bytes(b"short")
    with pytest.raises(AuditError, match="fewer than 16 bytes"):
        Anchorer.from_env(tmp_path, tmp_path / DB_NAME, {**env, "RECOVERY_LOGS_AUDIT_KEY_FILE": str(tmp_path / "short")})
    assert os.environ.get("RECOVERY_LOGS_AUDIT_ANCHORS") is None


def test_broken_anchor_line_is_named(trail: Path, capsys):
    with open(trail / ANCHOR_FILE, "a") as fh:
        fh.write("{not an anchor}\n")
    rc, out = _run_verify(trail, capsys)
    assert rc == 3 and f"{ANCHOR_FILE}:" in out and "not a valid anchor" in out


def test_chain_error_is_still_named_first(trail: Path, capsys):
    _sql(trail / DB_NAME, "UPDATE audit SET payload = '{\"i\":99}' WHERE id = 4")
    with pytest.raises(AuditChainBroken) as ei:
        verify_db(trail / DB_NAME)
    assert ei.value.record_id == 4
