"""The watch loop end to end: real server on 127.0.0.1 -> Watcher -> Engine -> incidents.

Also the property that holds replay and watch together: for in-order data, feeding all events
at once equals feeding any split of them through the watcher's path (seq renumbering,
watermark advanced after each batch)."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.watch import Watcher, WatchOptions, compose_query, parse_sources
from recovery_logs.sources.files import ReadOptions, events_from_vl_records
from recovery_logs.sources.rowkeys import vl_time_ns
from recovery_logs.timeutil import NS

vlserver = sys.modules["recovery_logs_tests_vlserver"]
_ENGINES: dict[str, Engine] = {}


def _engine() -> Engine:
    """Engines share the (immutable) compiled pack; each test gets fresh state."""
    if "proto" not in _ENGINES:
        _ENGINES["proto"] = Engine(EngineConfig())
    return Engine(EngineConfig(), pack=_ENGINES["proto"].pack)


def dataset(shift_to_ns: int | None = None) -> list[dict]:
    """The captured 50-line dataset, optionally moved so its newest line is at ``shift_to_ns``."""
    rows = [json.loads(x) for x in (vlserver.FIXTURES / "dataset_small.jsonl").read_text().splitlines() if x.strip()]
    if shift_to_ns is None:
        return rows
    newest = max(vl_time_ns(r["_time"].replace("+00:00", "Z")) for r in rows)
    for r in rows:
        r["_time"] = vlserver.format_time_ns(vl_time_ns(r["_time"]) - newest + shift_to_ns)
    return rows


def replay_incidents(rows: list[dict], file: str = "victorialogs:test") -> list[dict]:
    rows = sorted(rows, key=lambda r: vl_time_ns(r["_time"]))
    eng = _engine()
    eng.feed(events_from_vl_records(rows, ReadOptions(), 0, file).events)
    eng.advance(eng.max_time_ns)
    return [i.to_dict() for i in eng.incidents()]


def _opts(srv, tmp_path=None, **kw) -> WatchOptions:
    base = dict(sources=(srv.url,), state_dir=tmp_path, refresh_s=0.1, lateness_s=30.0, catchup_s=0.3,
                since_s=1800.0, tail_offset="10ms", reconnect_backoff_s=0.05)
    base.update(kw)
    return WatchOptions(**base)


def _caught_up(w: Watcher, catchups: int = 1) -> bool:
    """The lossless frontier reached (almost) now, after at least `catchups` queries. The frontier
    trails now by the follower's offset (the poller's default is 2 s, the tail's 10 ms here)."""
    return (w.vl.stats["catchups"] >= catchups and w.vl.complete_ns is not None
            and time.time_ns() - w.vl.complete_ns < w.vl.offset_ns + 1 * NS)


def _run(w: Watcher, until, timeout=8.0) -> list[tuple[str, dict]]:
    out = []
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        out += [(k, i.to_dict()) for k, i in w.step()]
        if until(out, w):
            break
        time.sleep(0.1)
    return out


def test_parse_sources_and_query():
    assert parse_sources(["victorialogs://127.0.0.1:9428"]) == ("http://127.0.0.1:9428", [])
    assert parse_sources(["file:/a.log,file:/var/log/*.log"]) == (None, ["/a.log", "/var/log/*.log"])
    from recovery_logs.errors import ConfigError
    for bad in (["nope"], [], ["victorialogs://a:1", "victorialogs://b:2"], ["file:"]):
        with pytest.raises(ConfigError):
            parse_sources(bad)
    q = compose_query('{host="gpu-n3"}', '_msg:~"Xid"')
    assert q == '({host="gpu-n3"}) (_msg:~"Xid") NOT unit:="recovery-logs"'


def test_watch_matches_replay_and_ignores_duplicates(empty_vls, tmp_path):
    rows = dataset(time.time_ns() - 3 * NS)
    want = replay_incidents(rows)
    assert want, "the dataset must produce incidents"
    empty_vls.ingest(rows)
    empty_vls.ingest(rows)            # every line twice: no duplicate incidents, same counts
    w = Watcher(_opts(empty_vls, tmp_path, prefilter=False), engine=_engine()).open()
    try:
        _run(w, lambda out, w: _caught_up(w, 2), timeout=15)
        got = [i.to_dict() for i in w.incidents]
    finally:
        w.close()
    keys = ("id", "category", "cause", "node", "job_id", "count", "first_seen", "last_seen", "detected_at",
            "confidence", "candidates", "actions")
    assert [{k: i[k] for k in keys} for i in got] == [{k: i[k] for k in keys} for i in want]
    assert w.vl.stats["duplicates"] >= len(rows)


def test_watch_prefilter_keeps_the_root_cause(empty_vls):
    rows = dataset(time.time_ns() - 3 * NS)
    want = replay_incidents(rows)
    empty_vls.ingest(rows)
    w = Watcher(_opts(empty_vls), engine=_engine()).open()
    try:
        assert "_msg:~" in w.query and w.fields[0] == "_time"
        _run(w, lambda out, w: _caught_up(w, 1) and w.incidents, timeout=15)
    finally:
        w.close()
    assert (w.incidents[0].category, w.incidents[0].node) == (want[0]["category"], want[0]["node"])
    assert w.vl.stats["lines_read"] < len(rows)     # the prefilter pushed work to the server


def test_restart_resumes_without_gap_or_rereport(empty_vls, tmp_path):
    now = time.time_ns()
    rows = dataset(now - 3 * NS)
    empty_vls.ingest(rows)
    emitted1: list[str] = []
    w1 = Watcher(_opts(empty_vls, tmp_path), engine=_engine(), emit=lambda k, i: emitted1.append(i.id)).open()
    _run(w1, lambda out, w: _caught_up(w, 2) and out, timeout=15)
    w1.close()
    assert emitted1     # (updates come while the 30 min are read back in capped windows)
    # while the watcher is down, a new fault arrives
    down_line = {"_time": vlserver.format_time_ns(time.time_ns()), "host": "gpu-n7", "unit": "kernel",
                 "_msg": "NVRM: Xid (PCI:0000:86:00): 48, pid=999, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."}
    empty_vls.ingest([down_line])
    emitted2: list[tuple[str, str]] = []
    w2 = Watcher(_opts(empty_vls, tmp_path), engine=_engine(), emit=lambda k, i: emitted2.append((k, i.id))).open()
    try:
        assert w2.stats["rebuilt"] > 0       # context re-read before the resume window
        _run(w2, lambda out, w: any(i.node == "gpu-n7" for i in w.incidents), timeout=15)
    finally:
        w2.close()
    new_nodes = {i.node for i in w2.incidents if i.id in {x for _, x in emitted2}}
    assert new_nodes == {"gpu-n7"}          # only the fault that arrived while down is reported
    assert not set(emitted1) & {x for _, x in emitted2}


def test_export_incidents_and_metrics(empty_vls):
    from recovery_logs.pipeline.metrics import WatchMetrics

    empty_vls.ingest(dataset(time.time_ns() - 3 * NS))
    m = WatchMetrics()
    port = m.serve(0)
    w = Watcher(_opts(empty_vls, export_incidents=True), engine=_engine(), metrics=m).open()
    try:
        _run(w, lambda out, w: _caught_up(w, 2) and out, timeout=15)
        _run(w, lambda out, w: _caught_up(w, 3), timeout=10)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15).read().decode()
    finally:
        w.close()
        m.close()
    exported = [r for r in empty_vls.store.rows if r.fields.get("unit") == "recovery-logs"]
    exported_ids = {r.fields["incident_id"] for r in exported}
    # every incident was exported (a partial one that later merged into another stays exported)
    assert {i.id for i in w.incidents} <= exported_ids
    assert json.loads(exported[0].fields["incident"])["id"] == exported[0].fields["incident_id"]
    # our own exported lines are never read back as input
    assert w.summary()["vl_lines_read"] == w.stats["events"]
    assert all(("recovery-logs incident" not in m) for m in w.engine.findings["message"].to_list())
    lines = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert lines["recovery_logs_watch_lines_read_total"] == w.summary()["vl_lines_read"]
    assert lines['recovery_logs_watch_incidents_total{kind="new"}'] == len(exported_ids)
    assert "recovery_logs_watch_lag_seconds" in lines


def test_remediation_hook_gets_new_incidents(empty_vls):
    empty_vls.ingest(dataset(time.time_ns() - 3 * NS))
    seen: list[list[str]] = []
    w = Watcher(_opts(empty_vls), engine=_engine(), on_incidents=lambda incs: seen.append([i.id for i in incs])).open()
    try:
        _run(w, lambda out, w: _caught_up(w, 2) and out, timeout=15)
    finally:
        w.close()
    # every incident reached the hook (a partial one that later merged into another did too)
    assert seen and {i.id for i in w.incidents} <= {x for s in seen for x in s}


@settings(max_examples=12, deadline=None)
@given(cuts=st.lists(st.integers(1, 49), max_size=8, unique=True))
def test_replay_equals_watch_over_any_split(cuts):
    rows = sorted(dataset(), key=lambda r: vl_time_ns(r["_time"]))
    want = replay_incidents(rows, file="victorialogs:http://127.0.0.1:9")
    w = Watcher(WatchOptions(sources=("victorialogs://127.0.0.1:9",)), engine=_engine())   # never opened
    bounds = [0, *sorted(cuts), len(rows)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        part = rows[a:b]
        w._feed(w._vl_events(part))     # the watcher's own path: conversion, line and seq numbering
        w.engine.advance(vl_time_ns(part[-1]["_time"]) - w.lateness_ns)
    w.engine.advance(w.engine.max_time_ns)
    assert [i.to_dict() for i in w.engine.incidents()] == want


def test_history_batches_for_replay(vls):
    """replay --source victorialogs:// reads history as Batches: all 50 rows once, in time
    order, `line` numbered across pages, nanoseconds kept."""
    from recovery_logs.sources.history import history_batches
    from recovery_logs.sources.victorialogs import parse_url
    from recovery_logs.timeutil import iso_to_ns

    start, end = iso_to_ns("2026-11-29T14:00:00Z"), iso_to_ns("2026-11-29T14:20:00Z")
    batches = list(history_batches(parse_url(vls.url), "*", start, end, ReadOptions(), page_size=7))
    assert len(batches) >= 7
    import polars as pl
    ev = pl.concat([b.events for b in batches])
    assert ev.height == 50
    assert ev["line"].to_list() == list(range(1, 51))
    ns = ev["time"].dt.epoch("ns").to_list()
    assert ns == sorted(ns) and iso_to_ns("2026-11-29T14:06:00.123456789Z") in ns


def test_late_events_counted_and_attributed(empty_vls):
    """Lateness 1 s: a fault stamped 3 s ago (still inside the tail's 5 s re-scan) is older
    than the watermark when it arrives: counted as late, still an incident."""
    w = Watcher(_opts(empty_vls, lateness_s=1.0, since_s=None), engine=_engine()).open()
    try:
        _run(w, lambda out, w: _caught_up(w, 1), timeout=10)
        empty_vls.ingest([{"_time": vlserver.format_time_ns(time.time_ns() - 3 * NS), "host": "gpu-n9",
                           "unit": "kernel", "_msg": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."}])
        _run(w, lambda out, w: any(i.node == "gpu-n9" for i in w.incidents), timeout=15)
    finally:
        w.close()
    assert w.stats["late"] >= 1
    assert any(i.node == "gpu-n9" and i.xid == 79 for i in w.incidents)


def test_cli_watch_server_never_reached_exits_non_zero(tmp_path, capsys):
    import socket

    from recovery_logs.cli import main

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc = main(["watch", "--source", f"victorialogs://127.0.0.1:{port}", "--json", "--for", "1.5",
               "--refresh", "200ms", "--catchup", "300ms", "--state-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 7 and captured.out == ""                # never reached: an error, not a quiet watch
    assert f"never reached VictoriaLogs at http://127.0.0.1:{port}" in captured.err
    assert f"cannot connect to VictoriaLogs at http://127.0.0.1:{port}" in captured.err
    assert len(captured.err) < 4000                      # clear, not a wall of query text


def test_engine_rotation_keeps_incidents_and_bounds_state(empty_vls):
    """rotate_s (the server-prefilter path, local_select=False; the local selection bounds memory by
    compaction instead): the engine is rebuilt from the server's context history; the incidents and
    their ids stay, nothing is reported twice, and rows are not fed twice."""
    empty_vls.ingest(dataset(time.time_ns() - 3 * NS))
    emitted: list[str] = []
    w = Watcher(_opts(empty_vls, rotate_s=0.5, context_s=1800.0, local_select=False), engine=_engine(),
                emit=lambda k, i: emitted.append(i.id)).open()
    try:
        _run(w, lambda out, w: _caught_up(w, 1) and w.incidents, timeout=15)
        before = [(i.id, i.count) for i in w.incidents]
        findings_before = w.engine.findings.height
        reported_before = len(emitted)
        _run(w, lambda out, w: w.stats["rotations"] >= 2, timeout=15)
        after = [(i.id, i.count) for i in w.incidents]
    finally:
        w.close()
    assert w.stats["rotations"] >= 2 and w.stats["rotated_rows"] > 0
    assert after == before and w.engine.findings.height == findings_before
    assert len(emitted) == reported_before      # rotations report nothing again
