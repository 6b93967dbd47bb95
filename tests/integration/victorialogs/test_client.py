"""VictoriaLogsClient against the fixture-faithful server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import pytest

from recovery_logs.errors import ConfigError, VictoriaLogsError
from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url

vlserver = sys.modules["recovery_logs_tests_vlserver"]  # loaded by conftest.py
FX = vlserver.FIXTURES


def _rows(name: str) -> list[dict]:
    ex = vlserver.parse_exchange(FX / name)
    return [json.loads(x) for x in ex.body.decode().splitlines() if x.strip()]


def _client(srv, **kw) -> VictoriaLogsClient:
    kw.setdefault("retries", 0)
    kw.setdefault("read_timeout", 5.0)
    return VictoriaLogsClient(srv.base, **kw)


def test_parse_url():
    assert parse_url("victorialogs://127.0.0.1:9428") == "http://127.0.0.1:9428"
    assert parse_url("http://vl:9428/") == "http://vl:9428"
    with pytest.raises(ConfigError):
        parse_url("ftp://x:1")
    with pytest.raises(ConfigError):
        parse_url("victorialogs://host:notaport")


def test_every_fixture_parses():
    exchanges = vlserver.load_exchanges()
    assert len(exchanges) >= 50
    for ex in exchanges:
        assert ex.status in (200, 400, 422, 503), ex.name
        if ex.status == 200 and ex.body.strip() and not ex.cut and "json" in dict(ex.headers).get("Content-Type", ""):
            ctype = dict(ex.headers)["Content-Type"]
            if "stream" in ctype or "ndjson" in ctype:
                for line in ex.body.decode().splitlines():
                    assert isinstance(json.loads(line), dict), ex.name
            else:
                json.loads(ex.body)


@pytest.mark.parametrize("name", ["query_basic.txt", "query_sorted_fields.txt", "query_stream_filter.txt",
                                  "query_time_range_filter.txt", "query_all_unsorted.txt",
                                  "query_limit_with_time_field.txt", "query_post_form.txt"])
def test_query_golden(vls, name):
    ex = vlserver.parse_exchange(FX / name)
    p = dict(ex.params)
    c = _client(vls)
    if ex.method == "POST":  # a long query goes as a form; force that path with the captured params
        resp = c.session.post(vls.base + ex.path, data=p)
        assert resp.content == ex.body
        return
    got = list(c.query(p.pop("query"), start=p.pop("start", None), end=p.pop("end", None),
                       limit=int(p["limit"]) if "limit" in p else None))
    assert got == _rows(name)
    # the keys of every row are kept exactly as sent (all strings, _time untouched)
    assert all(isinstance(v, str) for r in got for v in r.values())


def test_static_bodies_byte_for_byte(vls):
    c = _client(vls)
    for ex in vlserver.load_exchanges():
        if ex.method != "GET" or not ex.path.startswith("/select/") or ex.cut:
            continue
        resp = c.session.get(vls.base + ex.path, params=dict(ex.params), timeout=5)
        assert resp.status_code == ex.status, ex.name
        assert resp.content == ex.body, ex.name


def test_dynamic_store_matches_captures(empty_vls):
    """The dynamic store (not the static table) reproduces sorted captures from the dataset."""
    empty_vls.ingest_file(FX / "dataset_small.jsonl")
    c = _client(empty_vls)
    for name in ("query_sorted_fields.txt", "query_basic.txt", "query_limit_with_time_field.txt"):
        ex = vlserver.parse_exchange(FX / name)
        p = dict(ex.params)
        got = list(c.query(p["query"], start=p.get("start"), end=p.get("end"),
                           limit=int(p["limit"]) if "limit" in p else None))
        want = _rows(name)
        assert [(r["_time"], r["_msg"]) for r in got] == [(r["_time"], r["_msg"]) for r in want], name
    allrows = list(c.query("*", start="2026-11-29T14:00:00Z", end="2026-11-29T14:20:00Z"))
    # _stream_id is the server's own hash of the stream; everything else is identical
    key = lambda r: json.dumps({k: v for k, v in r.items() if k != "_stream_id"}, sort_keys=True)  # noqa: E731
    assert sorted(map(key, allrows)) == sorted(map(key, _rows("query_all_unsorted.txt")))


def test_empty_body_is_empty_result(vls):
    assert list(_client(vls).query("_time:5m")) == []


def test_bad_logsql_400_names_query(vls):
    with pytest.raises(VictoriaLogsError) as ei:
        list(_client(vls).query('_msg:~"Xid|(NCCL"'))
    err = ei.value
    assert err.status == 400 and err.query == '_msg:~"Xid|(NCCL"'
    assert "missing closing )" in err.server_message
    assert '_msg:~"Xid|(NCCL"' in str(err)


def test_422_json_message(vls):
    c = _client(vls)
    with pytest.raises(VictoriaLogsError) as ei:
        c._request("GET", "/select/logsql/stats_query", "*", params={"query": "*"})
    assert ei.value.status == 422
    assert ei.value.server_message == "missing `| stats ...` pipe in the query [*]"


def test_503_retried_then_error(vls):
    vls.fail_status = [503, 503]
    c = _client(vls, retries=1, backoff=0.01)
    with pytest.raises(VictoriaLogsError) as ei:
        list(c.query("*"))
    assert ei.value.status == 503 and "couldn't be executed" in ei.value.server_message
    vls.fail_status = [503]
    assert len(list(_client(vls, retries=2, backoff=0.01).query("Xid"))) > 0


def test_midstream_cut_is_an_error_not_a_short_result(vls):
    # the captured 51 MB export cut by a timeout: rows, then the raw abort text, no final chunk
    with pytest.raises(VictoriaLogsError) as ei:
        list(vls_query_raw(vls, {"query": "*", "timeout": "300ms"}))
    assert ei.value.status == 200
    vls.cut_queries, vls.cut_after = 1, 3
    got = []
    with pytest.raises(VictoriaLogsError):
        for row in _client(vls).query("*"):
            got.append(row)
    assert len(got) == 3


def vls_query_raw(srv, params):
    c = _client(srv)
    resp = c._request("GET", "/select/logsql/query", params["query"], stream=True, params=params)
    return c._lines(resp, params["query"], "query")


def test_connection_refused_names_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = VictoriaLogsClient(f"victorialogs://127.0.0.1:{port}", retries=1, backoff=0.01)
    with pytest.raises(VictoriaLogsError) as ei:
        list(c.query("*"))
    assert f"127.0.0.1:{port}" in str(ei.value)


def test_slow_server_read_timeout(vls):
    vls.slow_s = 0.6
    with pytest.raises(VictoriaLogsError) as ei:
        list(_client(vls, read_timeout=0.2).query("*"))
    assert "in time" in str(ei.value)


def test_hits(vls):
    doc = _client(vls).hits("*", "2026-11-29T14:00:00Z", "2026-11-29T14:20:00Z", "5m")
    assert doc["hits"][0]["total"] == 50 and doc["hits"][0]["values"] == [22, 23, 5]


def test_insert_jsonline_content_type(empty_vls):
    c = _client(empty_vls)
    c.insert_jsonline([{"_time": "2026-11-29T14:19:00.000000001Z", "_msg": "hello", "host": "n1", "unit": "kernel"}])
    rows = list(c.query("hello"))
    assert [(r["_time"], r["_msg"], r["_stream"]) for r in rows] == \
        [("2026-11-29T14:19:00.000000001Z", "hello", '{host="n1",unit="kernel"}')]
    # the trap: the form content type is answered 200 and stores nothing
    c.session.post(empty_vls.base + "/insert/jsonline", data=b'{"_msg":"dropped","host":"n1"}\n',
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert list(c.query("dropped")) == []
    assert empty_vls.requests[0][0:2] == ("POST", "/insert/jsonline")


def test_tail_semantics_and_close(empty_vls):
    """Captured tail semantics: same/older timestamps in one stream dropped; a reconnect
    replays start_offset; close() from another thread ends the iterator quietly."""
    now = time.time_ns()
    mk = lambda dt, msg, host="n1": {"_time": vlserver.format_time_ns(now + int(dt * 1e9)), "_msg": msg,  # noqa: E731
                                     "host": host, "unit": "train"}
    empty_vls.ingest([mk(-2.0, "A"), mk(-1.5, "B", "n2")])
    c = _client(empty_vls, tail_idle_timeout=10)
    got: list[str] = []

    def run():
        for row in c.tail("*", start_offset="5s", offset="1ms", refresh_interval="50ms"):
            got.append(row["_msg"])
            assert "_stream_id" in row and "_time" in row

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.4)
    # D: same _time as A in A's stream; F: older than A in A's stream -> both dropped (captured)
    empty_vls.ingest([mk(-2.0, "D same ts"), mk(-2.5, "F older"), mk(-1.0, "C", "n2")])
    time.sleep(0.4)
    c.close()
    th.join(5)
    assert not th.is_alive()
    assert got == ["A", "B", "C"]
    # a reconnect replays start_offset: the same rows come again
    again: list[str] = []
    c2 = _client(empty_vls, tail_idle_timeout=10)
    th = threading.Thread(target=lambda: [again.append(r["_msg"]) for r in c2.tail("*", offset="1ms")])
    th.start()
    time.sleep(0.3)
    c2.close()
    th.join(5)
    assert {"A", "B", "C"} <= set(again)
    with pytest.raises(VictoriaLogsError) as ei:
        list(_client(empty_vls).tail("*", start_offset="0"))
    assert ei.value.status == 400 and "out of allowed range" in ei.value.server_message


def test_tail_cut_by_server_restart_raises(empty_vls):
    c = _client(empty_vls, tail_idle_timeout=10)
    it = c.tail("*", offset="1ms", refresh_interval="50ms")
    errors = []
    def run():
        try:
            for _ in it:
                pass
        except VictoriaLogsError as exc:
            errors.append(exc)
    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.3)
    empty_vls.restart()
    th.join(5)
    assert errors and "tail" in str(errors[0])


def test_tail_query_without_time_is_aborted(vls):
    with pytest.raises(VictoriaLogsError) as ei:
        list(_client(vls).tail("host:gpu-n11 | fields _msg"))
    assert ei.value.status == 200 and "cut" in str(ei.value)


def test_input_fixtures_parse():
    """The request bodies behind the captures: every JSON line of the JSON inputs parses."""
    for name in ("dataset_small.jsonl", "es_bulk.ndjson"):
        lines = [x for x in (FX / name).read_text().splitlines() if x.strip()]
        assert lines and all(isinstance(json.loads(x), dict) for x in lines), name
    assert len((FX / "dataset_small.jsonl").read_text().splitlines()) == 50
    assert "MESSAGE=" in (FX / "journald_export.txt").read_text()
    assert (FX / "syslog_tcp_input.txt").read_text().count("gpu-sl") >= 2


def test_tail_timeline_reproduced_time_scaled(empty_vls):
    """tail_stream_timeline.txt replayed at 1/10 speed against the dynamic server: the same
    lines are delivered (A B C E2 H1-4 G) and the same are lost (D same ts, E 8 s late,
    F older than the last sent of its stream)."""
    want = [json.loads(x)["_msg"] for x in vlserver.parse_exchange(FX / "tail_stream.txt").body.decode().splitlines()]
    scale = 0.1
    events = []   # (offset s, line) from the timeline's ingestion log
    for ln in (FX / "tail_stream_timeline.txt").read_text().splitlines():
        if ln[:1] in "+-" and ln.split(" ", 2)[1:2] and ln.split(" ", 2)[1].startswith("["):
            events.append((float(ln.split(" ", 1)[0]), json.loads(ln[ln.index("{"):])))
    t_req = time.time_ns()
    c = _client(empty_vls, tail_idle_timeout=10)
    got: list[str] = []
    # rows keep their captured timing relative to the request, compressed by `scale`; B was
    # stamped when its insert returned at +0.941 s, which fixes the capture's request time
    b_ns = vlserver.parse_time_ns("2026-11-29T17:04:02.884054818Z")
    cap_req_ns = b_ns - int(0.941 * 1e9)

    def shift(doc):
        d = dict(doc)
        d["_time"] = vlserver.format_time_ns(t_req + int((vlserver.parse_time_ns(d["_time"]) - cap_req_ns) * scale))
        return d

    pre = [doc for off, doc in events if off < 0]
    empty_vls.ingest([shift(d) for d in pre])
    th = threading.Thread(target=lambda: [got.append(r["_msg"]) for r in
                                          c.tail("*", start_offset="500ms", offset="100ms", refresh_interval="100ms")])
    th.start()
    t0 = time.monotonic()
    for off, doc in [e for e in events if e[0] >= 0]:
        time.sleep(max(0.0, t0 + off * scale - time.monotonic()))
        empty_vls.ingest([shift(doc)])
    time.sleep(1.3 - (time.monotonic() - t0))
    c.close()
    th.join(5)
    assert got == want
