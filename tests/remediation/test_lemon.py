"""Lemon-node tracker: scoring, states, persistence, idempotence."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.errors import InputError
from recovery_logs.records import Incident
from recovery_logs.remediation.lemon import STATES, LemonTracker

DAY = 86_400 * 1_000_000_000
T = 1_795_000_000 * 1_000_000_000


def inc(i, node, t_days, category="xid", job="j1", gpu=None, xid=None, nodes=None):
    t = T + int(t_days * DAY)
    return Incident(id=f"inc-{i}", category=category, cause=category, severity="high", node=node, gpu=gpu,
                    job_id=job, xid=xid, confidence=0.9, first_seen=t, last_seen=t, detected_at=t, count=1,
                    nodes=tuple(nodes or ([node] if node else [])), evidence=(), candidates=())


def test_states_escalate_with_repeats_jobs_and_same_gpu(tmp_path):
    lt = LemonTracker(tmp_path)
    s = lt.update([inc(1, "n1", 0, gpu=3, xid=79)])
    assert s["n1"].state == "watch" and s["n1"].score == pytest.approx(1.0)
    s = lt.update([inc(2, "n1", 1, gpu=3, xid=79, job="j2")])
    # 1.0 * 0.5**(1/7) + 1.0 + 0.5 (2 jobs) + 1.0 (gpu3 xid79 twice)
    assert s["n1"].score == pytest.approx(0.5 ** (1 / 7) + 1.0 + 0.5 + 1.0)
    assert s["n1"].state == "probation" and s["n1"].repeat_gpu_xids == ("gpu3:xid79x2",)
    s = lt.update([inc(3, "n1", 1.5, gpu=3, xid=79, job="j3")])
    assert s["n1"].state == "drain" and s["n1"].distinct_jobs == 3
    assert any("GPU 3 XID 79 repeated 3 times" in r for r in s["n1"].reasons)


def test_user_bugs_do_not_count_and_bystanders_get_a_little(tmp_path):
    lt = LemonTracker(tmp_path)
    s = lt.update([inc(1, "n1", 0, category="software_exception"), inc(2, "n1", 0.1, category="oom_gpu"),
                   inc(3, "n2", 0.2, category="xid", nodes=["n2", "n3", "n4"])])
    assert s["n1"].state == "healthy" and s["n1"].score == 0.0
    assert s["n3"].multi_node == 1 and s["n3"].score == pytest.approx(0.25)
    assert s["n2"].state == "watch"


def test_decay_returns_a_node_to_healthy(tmp_path):
    lt = LemonTracker(tmp_path, half_life_days=7)
    lt.update([inc(1, "n1", 0, gpu=0, xid=48), inc(2, "n1", 0.5, gpu=0, xid=48, job="j2")])
    assert lt.states()["n1"].state == "probation"            # 0.95 + 1 + 0.5 + 1 = 3.45
    later = lt.update([], now_ns=T + 30.5 * DAY)             # 30 days on: everything x 0.5**(30/7)
    assert later["n1"].state == "healthy" and later["n1"].score == pytest.approx(3.45 * 0.5 ** (30 / 7), rel=0.02)
    assert lt.update([], now_ns=T + 200 * DAY) == {}          # past the horizon: forgotten


def test_state_persists_and_reloads(tmp_path):
    LemonTracker(tmp_path).update([inc(1, "n1", 0, gpu=3, xid=79), inc(2, "n1", 1, gpu=3, xid=79, job="j2")])
    data = json.loads((tmp_path / "lemon.json").read_text())
    assert data["nodes"]["n1"]["state"] == "probation"
    again = LemonTracker(tmp_path).states()
    assert again["n1"].state == "probation" and again["n1"].incidents == 2


def test_corrupt_state_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "lemon.json").write_text("{not json")
    with pytest.raises(InputError, match="lemon: state file unreadable") as ei:
        LemonTracker(tmp_path)
    assert ei.value.path == str(tmp_path / "lemon.json")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.floats(0, 20), st.sampled_from(["xid", "nvlink",
       "software_exception", "straggler"]), st.integers(0, 3)), min_size=1, max_size=12), st.integers(0, 12))
def test_updates_are_idempotent_and_split_independent(tmp_path_factory, items, cut):
    incs = [inc(i, n, t, category=c, gpu=g, xid=79 if c == "xid" else None, job=f"j{i % 3}")
            for i, (n, t, c, g) in enumerate(items)]
    a = LemonTracker(tmp_path_factory.mktemp("a")).update(incs)
    tb = LemonTracker(tmp_path_factory.mktemp("b"))
    tb.update(incs[:cut])
    b = tb.update(incs[cut:])
    b2 = tb.update(incs)                                      # replaying the same incidents changes nothing
    assert a == b == b2
    assert all(s.state in STATES for s in a.values())


def test_lemon_cli_update_and_show(tmp_path, capsys):
    from recovery_logs.cli import main as cli_main

    def rec(i, node, day, job):
        t = f"2026-11-{10 + day:02d}T00:00:00.000000000Z"
        return {"id": f"inc-{i}", "category": "xid", "cause": "xid 79", "severity": "critical", "node": node,
                "gpu": 3, "job_id": job, "xid": 79, "confidence": 0.9, "first_seen": t, "last_seen": t,
                "detected_at": t, "count": 1, "nodes": [node]}
    (tmp_path / "a.json").write_text(json.dumps({"summary": {}, "incidents": [rec(1, "n7", 0, "j1"),
                                                                              rec(2, "n7", 1, "j2")]}))
    assert cli_main(["lemon", "update", str(tmp_path / "a.json"), "--state-dir", str(tmp_path / "st"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n7"]["state"] == "probation"
    assert cli_main(["lemon", "show", "--state-dir", str(tmp_path / "st")]) == 0
    assert "probation" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text(json.dumps({"incidents": [{"id": "x"}]}))
    assert cli_main(["lemon", "update", str(tmp_path / "bad.json"), "--state-dir", str(tmp_path / "st")]) == 4
