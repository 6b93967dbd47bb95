"""Bundled incidents: the right top incident and culprit (checked against truth.json) and golden reports.

Regenerate the golden reports after an intended change with:
    UPDATE_GOLDEN=1 python -m pytest tests/pipeline/test_bundled.py
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.report.terminal import markdown_report
from recovery_logs.sources.files import ReadOptions
from recovery_logs.timeutil import iso_to_ns

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "recovery_logs" / "data" / "incidents"
GOLDEN = Path(__file__).resolve().parent / "golden"
NAMES = sorted(p.name for p in INCIDENTS.iterdir() if (p / "truth.json").is_file())
NODE_ACTIONS = {"drain_node", "requeue_job", "reset_gpu", "cancel_job"}


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    truth = json.loads((INCIDENTS / request.param / "truth.json").read_text())
    opts = ReplayOptions(read=ReadOptions(year=truth["year"]))
    return request.param, truth, replay([str(INCIDENTS / request.param)], opts)


def test_top_incident_and_culprit_match_the_truth(case):
    name, truth, res = case
    drained = {a.target for i in res.incidents for a in i.actions if a.kind == "drain_node"}
    assert not drained & set(truth["never_drain"]), f"{name}: innocent node drained"
    if not truth["expect_incident"]:
        assert not [a for i in res.incidents for a in i.actions if a.kind in NODE_ACTIONS], name
        return
    top = res.incidents[0]
    assert top.category == truth["category"], name
    assert top.node == truth["culprit_node"], name
    if truth.get("culprit_gpu") is not None:
        assert top.gpu == truth["culprit_gpu"], name
    if truth.get("xid") is not None:
        assert top.xid == truth["xid"], name
    assert {a.kind for a in top.actions} <= set(truth["acceptable_actions"]), name
    # detection within a few seconds of the first decisive line (syslog has whole seconds)
    latency = (top.detected_at - iso_to_ns(truth["decisive_time"])) / 1e9
    assert -1.0 <= latency <= 5.0, (name, latency)


def test_golden_markdown_report(case):
    name, _truth, res = case
    text = markdown_report(res)
    path = GOLDEN / f"{name}.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"missing golden report {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()
