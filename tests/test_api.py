"""The notebook API: every loader returns its documented schema, and the values are right."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import polars as pl
import pytest

import recovery_logs.api as rl
from recovery_logs.errors import AuditError, ConfigError, InputError
from recovery_logs.schema import EVENT_SCHEMA

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "victorialogs"


@pytest.fixture(scope="module")
def xid79():
    return rl.replay_incident("xid79_nccl_cascade")


def test_events_from_a_bundled_incident_and_from_parquet(xid79, tmp_path):
    ev = rl.load_events(rl.bundled_incident("xid79_nccl_cascade"))
    assert dict(ev.schema) == EVENT_SCHEMA
    assert ev.height == xid79.summary["events"]
    assert set(ev["host"].drop_nulls().unique()) == {"gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04"}
    assert ev["time"].is_sorted()
    pq = tmp_path / "ev.parquet"
    ev.write_parquet(pq)
    back = rl.load_events(pq)
    assert dict(back.schema) == EVENT_SCHEMA and back.height == ev.height
    assert back["message"].to_list() == ev["message"].to_list()


class _VL(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        q = parse_qs(urlsplit(self.path).query)
        if self.command == "POST":   # the client sends every query as a form body (no URL length limit)
            q.update(parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()))
        _VL.seen.append({k: v[0] for k, v in q.items()})
        text = (FIXTURES / "query_time_range_filter.txt").read_text(encoding="utf-8")
        body = text.split("\n\n", 1)[1].encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/stream+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815 - http.server API

    def log_message(self, *args) -> None:
        pass


def test_events_from_victorialogs_over_http():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _VL)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        q = '_time:[2026-11-29T14:06:00Z, 2026-11-29T14:06:01Z)'
        ev = rl.load_events(f"victorialogs://127.0.0.1:{srv.server_address[1]}", query=q)
    finally:
        srv.shutdown()
        srv.server_close()
    assert _VL.seen[-1]["query"] == q
    assert dict(ev.schema) == EVENT_SCHEMA
    assert ev.height == 4
    assert ev["time"].is_sorted()
    assert ev.filter(pl.col("message").str.contains("Xid"))["host"].to_list() == ["gpu-n3"]


def test_incident_frames_have_the_documented_schemas(xid79):
    inc = rl.incidents_frame(xid79)
    assert dict(inc.schema) == rl.INCIDENT_FRAME_SCHEMA
    top = inc.row(0, named=True)
    i = xid79.incidents[0]
    assert (top["incident_id"], top["rank"], top["node"], top["category"], top["root_rule"]) == (
        i.id, 1, i.node, i.category, f"xid.{i.xid}")
    assert top["first_seen"].isoformat().startswith("2026-11-29T14:06:00")
    cand = rl.candidates_frame(xid79)
    assert dict(cand.schema) == rl.CANDIDATE_FRAME_SCHEMA
    assert cand.filter(pl.col("incident_id") == i.id)["node"].to_list() == [c.node for c in i.candidates]
    ev = rl.evidence_frame(xid79)
    assert dict(ev.schema) == rl.EVIDENCE_FRAME_SCHEMA
    assert ev.height == sum(len(x.evidence) for x in xid79.incidents)
    assert ev["logsql"].str.starts_with("_time:[").all()
    act = rl.actions_frame(xid79)
    assert dict(act.schema) == rl.ACTION_FRAME_SCHEMA
    assert act.select("kind", "target").rows() == [(a.kind, a.target) for a in i.actions]


def test_incidents_json_gives_the_same_frames(xid79, tmp_path):
    (tmp_path / "incidents.json").write_text(xid79.to_json(), encoding="utf-8")
    from polars.testing import assert_frame_equal

    for fn in (rl.incidents_frame, rl.candidates_frame, rl.evidence_frame, rl.actions_frame):
        assert_frame_equal(fn(tmp_path), fn(xid79))
    with pytest.raises(InputError, match="incidents file not found"):
        rl.incidents_frame(tmp_path / "nope.json")
    with pytest.raises(InputError, match="not an incident"):
        rl.incidents_frame([{"no": "id"}])


def test_empty_frames_keep_their_schemas():
    for fn, schema in ((rl.incidents_frame, rl.INCIDENT_FRAME_SCHEMA), (rl.candidates_frame,
                       rl.CANDIDATE_FRAME_SCHEMA), (rl.evidence_frame, rl.EVIDENCE_FRAME_SCHEMA),
                       (rl.actions_frame, rl.ACTION_FRAME_SCHEMA)):
        df = fn([])
        assert df.height == 0 and dict(df.schema) == schema


def test_logsql_for_line():
    t = 1_795_961_160_123_457_000
    assert rl.logsql_for_line(t, "gpu-n02", "NVRM: Xid 79\nsecond line") == (
        '_time:[2026-11-29T14:06:00.123457000Z, 2026-11-29T14:06:00.123457001Z) host:="gpu-n02" '
        '_msg:"NVRM: Xid 79"')
    assert rl.logsql_for_line(None, None, 'say "hi" \\ bye') == '_msg:"say \\"hi\\" \\\\ bye"'
    long = "word " * 60
    q = rl.logsql_for_line(None, "n", long, max_phrase=23)
    assert q == 'host:="n" _msg:"word word word word"'
    assert rl.logsql_for_line(None, None, None) == "*"


def test_root_rule_choices():
    roles = {"a.cause": ("xid", "cause"), "b.sym": ("nccl_timeout_hang", "symptom"), "c.cause": ("oom_gpu", "cause")}
    ev = [{"time": "2026-11-29T14:00:01Z", "node": "n2", "rule_id": "b.sym"},
          {"time": "2026-11-29T14:00:02Z", "node": "n1", "rule_id": "c.cause"}]
    base = {"category": "oom_gpu", "node": "n1", "xid": None, "rule_ids": ["b.sym", "c.cause"], "evidence": ev}
    assert rl.root_rule(base, roles) == "c.cause"
    assert rl.root_rule({**base, "xid": 79, "rule_ids": ["xid.79", "b.sym"]}, roles) == "xid.79"
    assert rl.root_rule({**base, "category": "straggler", "rule_ids": ["detector.straggler"],
                         "evidence": [{"node": "n1", "rule_id": "detector.straggler"}]}, roles) == "detector.straggler"
    assert rl.root_rule({**base, "category": "pcie", "rule_ids": [], "evidence": []}, roles) == "category:pcie"


def test_audit_frame(tmp_path):
    from recovery_logs.audit import AuditLog

    log = AuditLog.open(tmp_path, clock=lambda: 1_795_960_800.5)
    log.append("proposal", {"action_id": "x1", "kind": "drain_node", "target": "gpu-n02", "reason": "xid 79"},
               incident_id="inc-1", action_id="x1")
    log.append("decision", {"action_id": "x1", "kind": "drain_node", "target": "gpu-n02",
                            "decision": "record_only", "status": "record_only", "reason": "monitor"},
               incident_id="inc-1", action_id="x1")
    df = rl.load_audit(log)
    log.close()
    assert dict(df.schema) == rl.AUDIT_FRAME_SCHEMA
    assert df.select("id", "kind", "action_kind", "target", "decision", "reason").rows() == [
        (1, "proposal", "drain_node", "gpu-n02", None, "xid 79"),
        (2, "decision", "drain_node", "gpu-n02", "record_only", "monitor")]
    assert df["time"][0].isoformat() == "2026-11-29T14:00:00.500000+00:00"
    assert json.loads(df["payload"][1])["status"] == "record_only"
    assert rl.load_audit(tmp_path, kind="decision").height == 1
    with pytest.raises(AuditError, match="no audit database"):
        rl.load_audit(tmp_path / "empty")


def test_slurm_jobs_through_a_recording_runner():
    from recovery_logs.sources.slurm import CommandResult

    class Runner:
        def __init__(self) -> None:
            self.argv: list[list[str]] = []

        def run(self, argv, timeout_s):
            self.argv.append(list(argv))
            if "--json" in argv:
                return CommandResult(tuple(argv), 1, "", "sacct: unrecognized option '--json'")
            if "JobID,ExitCode" in argv:
                return CommandResult(tuple(argv), 0, "JobID|ExitCode\n184470|1:0\n184471|0:0\n", "")
            out = ("JobID|JobName|State|ExitCode|NodeList|Start|End|Submit|AllocTRES\n"
                   "184470|train|FAILED|1:0|gpu-n[01-02]|2026-11-29T14:00:00|2026-11-29T16:00:00|"
                   "2026-11-29T13:59:00|billing=16,cpu=16,gres/gpu=16,node=2\n"
                   "184471|eval|RUNNING|0:0|gpu-n03|2026-11-29T15:00:00|Unknown|2026-11-29T14:59:00|gres/gpu=8\n")
            return CommandResult(tuple(argv), 0, out, "")

    r = Runner()
    df = rl.load_slurm_jobs(["184470", "184471"], runner=r)
    assert dict(df.schema) == rl.JOB_FRAME_SCHEMA
    assert df.select("job_id", "state", "nodes", "gpus", "elapsed_s", "gpu_hours").rows() == [
        ("184470", "FAILED", ["gpu-n01", "gpu-n02"], 16, 7200.0, 32.0),
        ("184471", "RUNNING", ["gpu-n03"], 8, None, None)]
    assert any(a[0] == "sacct" for a in r.argv)


def test_unknown_bundled_incident_is_a_config_error():
    with pytest.raises(ConfigError, match="no bundled incident"):
        rl.bundled_incident("nope")
    assert "xid79_nccl_cascade" in rl.bundled_incident_names()
    assert rl.load_truth(rl.bundled_incident("healthy"))["expect_incident"] is False


def test_docstring_examples_hold():
    import doctest

    res = doctest.testmod(rl, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 2 and res.failed == 0
