"""Corrupted state files are a clear error naming the file (or a documented, audited reset),
never a traceback and never a silent fresh start; a policy file that is not UTF-8 TOML is a clear
error. Hypothesis draws the corruptions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery_logs.cli import main
from recovery_logs.errors import AuditError, InputError, PolicyError
from recovery_logs.pipeline.cursor import WatchCursor
from recovery_logs.remediation.lemon import LemonTracker
from recovery_logs.remediation.policy import load_policy
from recovery_logs.remediation.remediator import Remediator

NAME = "c0ffee"
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=8)


@pytest.mark.parametrize("text", ["[]", '"x"', "", "not json", "{", "1",
                                  '{"files": {"/var/log/kern.log": {"dev": 1, "ino": 2, "offset": -5}}}',
                                  '{"files": []}', '{"complete_ns": "soon"}', '{"reported": {"inc-1": 3}}'])
def test_corrupt_cursor_names_the_file(tmp_path: Path, text: str):
    (tmp_path / f"watch-{NAME}.json").write_text(text)
    with pytest.raises(InputError) as ei:
        WatchCursor.load(tmp_path, NAME)
    assert ei.value.context["path"] == str(tmp_path / f"watch-{NAME}.json")
    assert "remove it" in ei.value.message


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values | st.fixed_dictionaries({"files": st.dictionaries(st.text(max_size=5), json_values,
                                                                             max_size=2)}))
def test_any_cursor_loads_or_fails_clearly(tmp_path: Path, doc):
    p = tmp_path / f"watch-{NAME}.json"
    p.write_text(json.dumps(doc))
    try:
        c = WatchCursor.load(tmp_path, NAME)
    except InputError as exc:
        assert exc.context["path"] == str(p)
        return
    assert all(isinstance(v.get("offset", 0), int) and v.get("offset", 0) >= 0 for v in c.files.values())
    c.save()                                       # what loaded can be written back


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_lemon_file_loads_or_fails_clearly(tmp_path: Path, raw: bytes):
    (tmp_path / "lemon.json").write_bytes(raw)
    try:
        LemonTracker(tmp_path)
    except InputError as exc:
        assert exc.context["path"] == str(tmp_path / "lemon.json")


def test_lemon_list_is_a_clear_error(tmp_path: Path, capsys):
    (tmp_path / "lemon.json").write_text("[1,2,3]")
    with pytest.raises(InputError, match="lemon: state file unreadable"):
        LemonTracker(tmp_path)
    rc = main(["lemon", "show", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 4 and "lemon.json" in err and "Traceback" not in err


class NoSlurm:
    def run(self, argv, timeout_s):
        raise AssertionError(f"no Slurm command expected: {argv}")


@pytest.mark.parametrize("value", ["not json", "[1, 2]", "42"])
def test_corrupt_breaker_is_an_error_then_an_audited_reset(tmp_path: Path, capsys, value):
    rem = Remediator.from_options(tmp_path, mode="monitor", runner=NoSlurm(), cluster_nodes=4)
    rem.audit.set_state("breaker", {"tripped": False, "reason": "", "since": None})
    rem.close()
    import sqlite3

    con = sqlite3.connect(tmp_path / "audit.db")
    con.execute("UPDATE kv SET value = ? WHERE key = 'breaker'", (value,))
    con.commit()
    con.close()
    rem = Remediator.open_existing(tmp_path, mode="monitor", runner=NoSlurm())
    with pytest.raises(AuditError, match="state 'breaker'"):
        rem.breaker()
    rem.close()
    rc = main(["slurm", "status", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 12 and "breaker" in err and "Traceback" not in err
    rc = main(["slurm", "breaker-reset", "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "corrupt" in out
    rem = Remediator.open_existing(tmp_path, mode="monitor", runner=NoSlurm())
    assert rem.breaker()["tripped"] is False
    [reset] = [r for r in rem.audit.records("breaker") if r.payload.get("event") == "reset"]
    assert reset.payload["was"]["corrupt"] == value
    rem.close()


def test_policy_utf16_and_directory_are_clear_errors(tmp_path: Path, capsys):
    p = tmp_path / "policy.toml"
    p.write_text('mode = "approve"\n', encoding="utf-16")
    with pytest.raises(PolicyError, match="UTF-16"):
        load_policy(p)
    with pytest.raises(PolicyError, match="is a directory"):
        load_policy(tmp_path)
    (tmp_path / "latin1.toml").write_bytes('cluster = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(tmp_path / "latin1.toml")
    (tmp_path / "bom.toml").write_bytes('\ufeffmode = "approve"\n'.encode("utf-8"))
    assert load_policy(tmp_path / "bom.toml").mode == "approve"
    rc = main(["watch", "--source", f"file:{p}", "--slurm", "--policy", str(tmp_path), "--state-dir",
               str(tmp_path / "s"), "--for", "0.1"])
    err = capsys.readouterr().err
    assert rc == 11 and "is a directory" in err and "Traceback" not in err
