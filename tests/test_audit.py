"""Audit trail: append-only, hash-chained, `audit verify` exit 3 naming the first bad record."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery_logs.audit import DB_NAME, AuditLog, verify_db
from recovery_logs.errors import AuditChainBroken


def _fill(state: Path, n: int = 6) -> AuditLog:
    t = iter(range(1_795_000_000, 1_795_000_000 + 1000))
    log = AuditLog.open(state, clock=lambda: float(next(t)))
    for i in range(n):
        log.append("decision" if i % 2 else "proposal", {"i": i, "target": f"gpu-n0{i % 4 + 1}", "note": "é ✓"},
                   incident_id=f"inc-{i // 2}", action_id=f"act-{i // 2}")
    return log


def _tamper(path: Path, sql: str, args=()) -> None:
    con = sqlite3.connect(path)
    con.executescript("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
    con.execute(sql, args)
    con.commit()
    con.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recovery_logs.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_chain_links_and_verifies(tmp_path: Path):
    log = _fill(tmp_path)
    recs = log.records()
    assert [r.id for r in recs] == [1, 2, 3, 4, 5, 6]
    assert recs[0].prev_hash == "0" * 64
    assert all(b.prev_hash == a.hash for a, b in zip(recs, recs[1:], strict=False))
    assert log.verify() == 6


def test_triggers_forbid_update_and_delete(tmp_path: Path):
    log = _fill(tmp_path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log.conn.execute("UPDATE audit SET payload = '{}' WHERE id = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log.conn.execute("DELETE FROM audit WHERE id = 6")
    assert log.verify() == 6


def test_tampered_db_fails_verify_cli_exit_3(tmp_path: Path):
    _fill(tmp_path).close()
    ok = _cli("audit", "verify", "--state-dir", str(tmp_path))
    assert ok.returncode == 0 and "6 records" in ok.stdout
    _tamper(tmp_path / DB_NAME, "UPDATE audit SET payload = replace(payload, 'gpu-n04', 'gpu-n03') WHERE id = 4")
    bad = _cli("audit", "verify", "--state-dir", str(tmp_path))
    assert bad.returncode == 3, bad.stderr
    assert "AuditChainBroken" in bad.stderr and "audit record 4 was changed" in bad.stderr
    assert "record_id=4" in bad.stderr


def test_deleted_record_is_named(tmp_path: Path):
    _fill(tmp_path).close()
    _tamper(tmp_path / DB_NAME, "DELETE FROM audit WHERE id = 3")
    with pytest.raises(AuditChainBroken) as ei:
        verify_db(tmp_path / DB_NAME)
    assert ei.value.record_id == 3 and "missing" in str(ei.value)


def test_rechained_forgery_breaks_at_the_next_link(tmp_path: Path):
    """Recomputing the changed record's own hash is not enough: the next record still links to the old one."""
    from recovery_logs.audit import record_hash

    log = _fill(tmp_path)
    r = log.records()[1]
    forged = json.dumps({**r.payload, "i": 99}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    h = record_hash(r.id, r.ts_ns, r.kind, r.incident_id, r.action_id, forged, r.prev_hash)
    log.close()
    _tamper(tmp_path / DB_NAME, "UPDATE audit SET payload = ?, hash = ? WHERE id = 2", (forged, h))
    with pytest.raises(AuditChainBroken) as ei:
        verify_db(tmp_path / DB_NAME)
    assert ei.value.record_id == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_changed_byte_breaks_the_chain(tmp_path_factory, data):
    template = tmp_path_factory.getbasetemp() / "audit-template"
    if not (template / DB_NAME).exists():
        _fill(template, 5).close()                  # the last close folds the WAL into the db file
    state = tmp_path_factory.mktemp("audit")
    shutil.copy(template / DB_NAME, state / DB_NAME)
    con = sqlite3.connect(state / DB_NAME)
    rows = con.execute("SELECT id, ts_ns, kind, incident_id, action_id, payload, prev_hash, hash FROM audit").fetchall()
    con.close()
    rid = data.draw(st.integers(1, len(rows)))
    col = data.draw(st.sampled_from(["ts_ns", "kind", "incident_id", "action_id", "payload", "prev_hash", "hash"]))
    old = rows[rid - 1][["id", "ts_ns", "kind", "incident_id", "action_id", "payload", "prev_hash", "hash"].index(col)]
    if col == "ts_ns":
        new: object = old + data.draw(st.integers(1, 10**9))
    else:
        b = bytearray(old.encode("utf-8"))
        pos = data.draw(st.integers(0, len(b) - 1))
        b[pos] = (b[pos] + data.draw(st.integers(1, 94))) % 95 + 32 if b[pos] < 128 else b[pos]
        new = b.decode("utf-8", "replace")
        if new == old:
            new = old + "x"
    _tamper(state / DB_NAME, f"UPDATE audit SET {col} = ? WHERE id = ?", (new, rid))
    with pytest.raises(AuditChainBroken) as ei:
        verify_db(state / DB_NAME)
    assert ei.value.record_id in (rid, rid + 1)


def test_export_jsonl_and_parquet(tmp_path: Path, run_cli):
    _fill(tmp_path).close()
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"a.{fmt}"
        rc, stdout, err = run_cli("audit", "export", "--format", fmt, "-o", str(out), "--state-dir", str(tmp_path))
        assert rc == 0 and "exported 6 records" in stdout, err
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [1, 2, 3, 4, 5, 6] and lines[5]["payload"]["note"] == "é ✓"
    df = pl.read_parquet(tmp_path / "a.parquet")
    assert df["hash"].to_list() == [x["hash"] for x in lines]
    assert df.schema["time"] == pl.Datetime("ns", "UTC")
    assert run_cli("audit", "export", "--format", "csv", "--state-dir", str(tmp_path))[0] == 2


def test_missing_db_is_an_audit_error(tmp_path: Path, run_cli):
    rc, _, err = run_cli("audit", "verify", "--state-dir", str(tmp_path / "nope"))
    assert rc == 12 and "no audit database" in err
