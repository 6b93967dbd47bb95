"""``watch`` against the real VictoriaLogs v1.26.0: late lines, server restarts and crashes,
watcher restarts, auth and tenants through a checking proxy, the server down at start."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import pytest

from recovery_logs.config import EngineConfig
from recovery_logs.errors import VictoriaLogsError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.watch import Watcher, WatchOptions
from recovery_logs.sources.victorialogs import VictoriaLogsClient, VLConnection
from recovery_logs.sources.vl_live import Tier, VLPoller

vlreal = sys.modules["recovery_logs_tests_vlreal"]
NS, fmt_ns, free_port = vlreal.NS, vlreal.fmt_ns, vlreal.free_port

FAST_TIERS = (Tier(120, 10, 0.3), Tier(3600, 60, 0.6), Tier(6 * 3600, 600, 1.0))
_PACK: list = []


def _engine() -> Engine:
    if not _PACK:
        _PACK.append(Engine(EngineConfig()).pack)
    return Engine(EngineConfig(), pack=_PACK[0])


def xid(host: str, t_ns: int, pid: int = 4242) -> dict:
    # format: NVIDIA open-gpu-kernel-modules, src/nvidia/src/kernel/rmapi/event_notification.c (NVRM: Xid ...)
    return {"_time": fmt_ns(t_ns), "host": host, "unit": "kernel",
            "_msg": f"NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python3, GPU has fallen off the bus."}


def chatter(host: str, t_ns: int, i: int) -> dict:
    return {"_time": fmt_ns(t_ns), "host": host, "unit": "kernel",
            "_msg": f"systemd[1]: Started Session {i} of User root."}


def _opts(srv_url: str, state_dir=None, **kw) -> WatchOptions:
    base = dict(sources=(srv_url,), state_dir=state_dir, refresh_s=0.2, lateness_s=30.0, since_s=60.0,
                tiers=FAST_TIERS, unreachable_exit_s=None)
    base.update(kw)
    return WatchOptions(**base)


def _steps(w: Watcher, until, timeout: float = 15.0) -> list[tuple[str, object]]:
    out: list = []
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        out += w.step()
        if until(out, w):
            return out
        time.sleep(0.1)
    raise AssertionError(f"timed out; summary={w.summary()} nodes={[i.node for i in w.incidents]} now={time.time_ns()} frontier={w.vl.complete_ns} ranges={[w.vl._tier_range(i) for i in range(len(w.vl.tiers))]}")


def _caught_up(w: Watcher) -> bool:
    # the frontier trails now by the poll offset (2 s; wider while the loaded server makes rows searchable late)
    return (w.vl.complete_ns is not None and time.time_ns() - w.vl.complete_ns < w.vl.offset_ns + 0.5 * NS
            and w.vl.stats["polls"] >= 2)


def test_late_lines_40s_10min_5h_found_once_and_marked(real_vl):
    now = time.time_ns()
    real_vl.ingest([chatter("gpu-c", now - k * NS, k) for k in range(5)] + [xid("gpu-a", now - 2 * NS, 1)])
    emitted: list[tuple[str, str, str]] = []
    w = Watcher(_opts(real_vl.url), engine=_engine(),
                emit=lambda kind, inc: emitted.append((kind, inc.id, inc.node))).open()
    try:
        _steps(w, lambda out, w: _caught_up(w) and any(n == "gpu-a" for _, _, n in emitted))
        t = time.time_ns()
        real_vl.ingest([xid("gpu-l40s", t - 40 * NS), xid("gpu-l10m", t - 600 * NS), xid("gpu-l5h", t - 5 * 3600 * NS),
                        xid("gpu-a", t - 45 * NS, 2)])           # a late line into an incident already reported
        _steps(w, lambda out, w: {"gpu-l40s", "gpu-l10m", "gpu-l5h"} <= {n for _, _, n in emitted}
               and w.vl.stats["late_found"] >= 4, timeout=20)
        for _ in range(8):                                       # a few more reconciliations: nothing new
            w.step()
            time.sleep(0.15)
    finally:
        w.close()
    s = w.vl.stats
    # the 4 late lines (more if a loaded machine made a fresh row searchable only after the live read)
    assert s["late_found"] >= 4 and s["duplicates"] == 0
    assert w.stats["events"] == 5      # every candidate row (the 5 Xid lines; chatter is filtered) fed once
    news = [(i, n) for k, i, n in emitted if k == "new"]
    assert len(news) == len({i for i, _ in news}) == 4          # one new incident per node, never twice
    a_ids = {i for _, i, n in emitted if n == "gpu-a"}
    assert len(a_ids) == 1 and ("updated", *a_ids, "gpu-a") in emitted   # changed -> an update, same id
    by_node = {i.node: i for i in w.incidents}
    for node in ("gpu-l40s", "gpu-l10m", "gpu-l5h"):
        assert all(e.late for e in by_node[node].evidence if e.file != "accounting"), node   # not a log line (jobjoin)
    assert any(e.late for e in by_node["gpu-a"].evidence)   # its evidence now starts at the late line
    # bounded cost: only the changed buckets were read again, never the history
    assert s["buckets_reread"] <= 16 and s["rows_fetched"] <= 3 * s["lines_read"], dict(s)


def test_late_lines_are_counted_in_the_windows_once(real_vl):
    """Lines no rule wants (chatter, a progress line) that arrive 40 s late are found by the bucket
    counts and counted in their windows once — the windows equal a replay's."""
    import polars as pl

    now = time.time_ns()
    real_vl.ingest([chatter("gpu-w", now - k * NS, k) for k in range(3)])
    # searchable first: a row the server shows only after the live read passed it is found once its 10 s
    # bucket is closed (another case)
    real_vl.searchable(3, start="5m", poll_s=0.1)
    w = Watcher(_opts(real_vl.url), engine=_engine()).open()
    try:
        _steps(w, lambda out, w: _caught_up(w) and w.engine.windows.height > 0)
        t = time.time_ns()
        late = [chatter("gpu-w", t - 40 * NS + k * 1000, 100 + k) for k in range(7)]
        late.append({"_time": fmt_ns(t - 41 * NS), "host": "gpu-w", "unit": "train", "job_id": "77", "rank": "0",
                     "_msg": "[rank0]: step 5 | loss 1.2345 | lr 3.0e-04 | tokens/s 118000"})
        real_vl.ingest(late)
        _steps(w, lambda out, w: w.vl.stats["late_lines_counted"] >= 8, timeout=20)
        for _ in range(8):                                       # more reconciliations: nothing counted twice
            w.step()
            time.sleep(0.15)
    finally:
        w.close()
    win = w.engine.windows.filter(pl.col("host") == "gpu-w")
    assert int(win["lines"].sum()) == 3 + 8 and w.vl.stats["late_lines_counted"] == 8
    assert int(win.filter(pl.col("job_id") == "77")["lines"].sum()) == 1
    prog = w.engine.findings.filter((pl.col("host") == "gpu-w") & (pl.col("category") == "progress"))
    assert prog.height == 1 and prog["step"].to_list() == [5]     # summarised, not sent as a row
    assert w.stats["events"] == 0                                 # no row of these was needed as text


def test_a_late_line_is_read_again_only_in_its_changed_slots(real_vl):
    """A bucket that gained rows (within ``ids_s``) is read again only in the 250 ms slots whose
    server count changed, and of those rows only the ones not read before are split and counted:
    the late lines are counted once, the fault among them handed out once, marked late."""
    import polars as pl

    t0 = time.time_ns() - 20 * NS
    real_vl.ingest([chatter("gpu-d", t0 + k * 100_000_000, k) for k in range(60)])     # 6 s, 10 rows/s
    real_vl.searchable(60, start="5m", poll_s=0.1)
    w = Watcher(_opts(real_vl.url), engine=_engine()).open()
    try:
        _steps(w, lambda out, w: _caught_up(w) and w.engine.windows.height > 0)
        assert w.vl.stats["buckets_reread"] == 0
        # two lines in the slot of row 5 (which holds rows read before), 20 s behind now
        real_vl.ingest([chatter("gpu-d", t0 + 500_000_000 + 1000, 1000), xid("gpu-d", t0 + 500_000_000 + 2000)])
        out = _steps(w, lambda out, w: w.vl.stats["late_lines_counted"] >= 2 and any(i.node == "gpu-d" for _, i in out))
        for _ in range(6):                                       # more reconciliations: nothing counted twice
            out += w.step()
            time.sleep(0.15)
    finally:
        w.close()
    st = w.vl.stats
    assert st["late_lines_counted"] == 2 and st["late_found"] == 1
    assert st["reread_rows_known"] >= 1                   # the slot's earlier rows were read, not counted again
    assert 1 <= st["slots_reread"] <= 2 * st["buckets_reread"]   # never the whole 10 s bucket (40 slots)
    win = w.engine.windows.filter(pl.col("host") == "gpu-d")
    assert int(win["lines"].sum()) == 62
    reported = [i for _, i in out if i.node == "gpu-d"]
    assert len({i.id for i in reported}) == 1 and reported[0].evidence[0].late


def _writer(srv, stop: threading.Event, accepted: list[str], failed: list[int], unit: str = "seq") -> None:
    i = 0
    while not stop.is_set():
        rows = [{"_time": fmt_ns(time.time_ns()), "host": f"h{(i + k) % 4}", "unit": unit, "_msg": f"seq {i + k}"}
                for k in range(10)]
        try:
            srv.ingest(rows)
            accepted.extend(r["_msg"] for r in rows)
        except OSError:
            failed.append(i)
        i += 10
        time.sleep(0.05)


def test_server_sigterm_and_sigkill_while_watching(real_vl):
    client = VictoriaLogsClient(real_vl.url, retries=0, read_timeout=5.0)
    p = VLPoller(client, 'unit:="seq"', refresh_s=0.2, offset_s=1.5, tiers=FAST_TIERS, count_query="*",
                 resume_from_ns=time.time_ns() - 5 * NS)
    read: list[str] = []
    stop, done = threading.Event(), threading.Event()
    accepted: list[str] = []
    failed: list[int] = []

    def poll_loop():
        while not done.is_set():
            read.extend(r["_msg"] for r in p.poll())
            time.sleep(0.1)

    pt = threading.Thread(target=poll_loop)
    wt = threading.Thread(target=_writer, args=(real_vl, stop, accepted, failed))
    pt.start()
    wt.start()
    try:
        time.sleep(2.0)
        before_term = len(accepted)
        rc_term, took_term = real_vl.stop(signal.SIGTERM)
        kept_before_term = accepted[:before_term]
        time.sleep(0.3)
        real_vl.start()
        time.sleep(2.0)
        real_vl.stop(signal.SIGKILL)
        time.sleep(0.3)
        real_vl.start()
        time.sleep(1.5)
        stop.set()
        wt.join()
        t_last = time.time_ns()
        t_end = time.monotonic() + 15
        while time.monotonic() < t_end and not (p.complete_ns and p.complete_ns > t_last + NS
                                                and p.stats["reconcile_queries"] >= 6):
            time.sleep(0.2)
        time.sleep(1.0)      # one more round of reconciliation after the frontier passed the end
    finally:
        done.set()
        stop.set()
        pt.join()
        wt.join()
    kept = {r["_msg"] for r in real_vl.query('unit:="seq"')}
    # the poller never holds a tail open, so a planned restart is graceful and keeps everything
    assert rc_term == 0 and took_term < 3.0
    assert set(kept_before_term) <= kept
    assert len(read) == len(set(read)), "a row was handed out twice"
    assert kept <= set(read), f"missed rows the server kept: {sorted(kept - set(read))[:5]} {dict(p.stats)}"
    assert set(read) <= set(accepted)
    assert p.stats["errors_poll"] >= 1 and failed       # the outages were real


def test_watcher_restarted_mid_stream_resumes_from_cursor(real_vl, tmp_path):
    now = time.time_ns()
    real_vl.ingest([xid("gpu-r1", now - 3 * NS, 1)] + [chatter("gpu-c", now - k * NS, k) for k in range(3)])
    emitted: list[tuple[str, str]] = []
    emit = lambda kind, inc: emitted.append((kind, inc.node))  # noqa: E731
    w = Watcher(_opts(real_vl.url, tmp_path), engine=_engine(), emit=emit).open()
    try:
        _steps(w, lambda out, w: _caught_up(w) and ("new", "gpu-r1") in emitted)
    finally:
        w.close()
    frontier = w.vl.complete_ns
    t = time.time_ns()
    real_vl.ingest([xid("gpu-r2", t, 2), xid("gpu-r1", frontier - 20 * NS, 3)])   # one during the gap, one late
    w2 = Watcher(_opts(real_vl.url, tmp_path), engine=_engine(), emit=emit).open()
    try:
        assert w2.vl.complete_ns == frontier                   # resumed from the cursor, not from --since
        _steps(w2, lambda out, w: _caught_up(w) and ("new", "gpu-r2") in emitted
               and ("updated", "gpu-r1") in emitted, timeout=20)
    finally:
        w2.close()
    assert [e for e in emitted if e[0] == "new"] == [("new", "gpu-r1"), ("new", "gpu-r2")]
    assert w2.vl.stats["duplicates"] == 0


def test_auth_tenant_prefix_and_extra_filters_reach_the_server(real_vl, proxy_factory, tmp_path, caplog,
                                                               monkeypatch):
    password = "s3cr3t-pw-do-not-print"
    pw_file = tmp_path / "vl-password"
    pw_file.write_text(password + "\n")
    proxy = proxy_factory(real_vl.base, "/vl", user="ops", password=password)
    tenant = {"AccountID": "3", "ProjectID": "7"}
    now = time.time_ns()
    real_vl.ingest([xid("gpu-t1", now - 3 * NS, 31), xid("gpu-t2", now - 3 * NS, 32)], headers=tenant)
    real_vl.ingest([xid("gpu-t1", now - 2 * NS, 99)])          # tenant 0: must not be read
    conn = VLConnection.from_options(f"victorialogs://127.0.0.1:{proxy.port}/vl", user="ops",
                                     password_file=str(pw_file), account_id="3", project_id="7",
                                     extra_filters=['host:="gpu-t1"'])
    assert password not in repr(conn)
    caplog.set_level(logging.DEBUG)
    w = Watcher(_opts(conn.url, connection=conn), engine=_engine()).open()
    try:
        _steps(w, lambda out, w: _caught_up(w) and w.incidents)
        for _ in range(3):
            w.step()
    finally:
        w.close()
    assert [i.node for i in w.incidents] == ["gpu-t1"]
    assert all("pid=31" in e.message for e in w.incidents[0].evidence if e.file != "accounting")   # tenant 3:7 only
    assert proxy.seen and all(h.get("AccountID") == "3" and h.get("ProjectID") == "7"
                              and h.get("Authorization", "").startswith("Basic ") for h in proxy.seen)
    assert all(h["path"].startswith("/vl/select/") for h in proxy.seen)

    # a wrong password: 401 cannot clear by itself -> the watch stops with that message, no secret in it
    bad = tmp_path / "bad"
    bad.write_text("wrong-" + password)
    conn_bad = VLConnection.from_options(f"victorialogs://ops@127.0.0.1:{proxy.port}/vl", password_file=str(bad))
    w = Watcher(_opts(conn_bad.url, connection=conn_bad), engine=_engine()).open()
    with pytest.raises(VictoriaLogsError) as ei:
        w.run()
    assert ei.value.status == 401 and "refused the credentials" in str(ei.value)
    # a bearer token from an environment variable
    monkeypatch.setenv("RL_TEST_VL_TOKEN", "tok-" + password)
    tproxy = proxy_factory(real_vl.base, "", token="tok-" + password)
    conn_tok = VLConnection.from_options(f"victorialogs://127.0.0.1:{tproxy.port}", token_env="RL_TEST_VL_TOKEN",
                                         account_id="3", project_id="7")
    rows = list(VictoriaLogsClient(conn_tok).query("*", start="1h"))
    assert len(rows) == 2 and tproxy.seen[-1]["Authorization"] == "Bearer tok-" + password
    for text in (caplog.text, str(ei.value), repr(ei.value.context), str(w.summary())):
        assert password not in text


def test_server_down_at_start_then_up(make_vl):
    from recovery_logs.pipeline.metrics import WatchMetrics

    port = free_port()
    srv = make_vl(port)
    m = WatchMetrics()
    w = Watcher(_opts(f"victorialogs://127.0.0.1:{port}"), engine=_engine(), metrics=m).open()

    def gauge(name: str) -> float:
        return m.registry.get_sample_value(name, {"source": "victorialogs"})

    try:
        for _ in range(3):
            w.step()
            time.sleep(0.2)
        assert gauge("recovery_logs_source_up") == 0 and gauge("recovery_logs_watch_source_reached") == 0
        assert "cannot connect" in (w.last_error or "")
        assert w.engine.watermark_ns is None                  # no event-time progress while nothing was read
        srv.start()
        srv.ingest([xid("gpu-d1", time.time_ns(), 7)])
        _steps(w, lambda out, w: w.incidents)
    finally:
        w.close()
    assert gauge("recovery_logs_source_up") == 1 and gauge("recovery_logs_watch_source_reached") == 1
    assert w.incidents[0].node == "gpu-d1"


def test_two_watchers_disjoint_scopes_share_a_state_dir_same_scope_refused(real_vl, tmp_path):
    from recovery_logs.statelock import StateLocked

    now = time.time_ns()
    real_vl.ingest([xid("gpu-p1", now - 3 * NS, 1), xid("gpu-p2", now - 3 * NS, 2)])

    def conn(host: str) -> VLConnection:
        return VLConnection.from_options(real_vl.url, extra_filters=[f'host:="{host}"'])

    a = Watcher(_opts(real_vl.url, tmp_path, connection=conn("gpu-p1")), engine=_engine()).open()
    b = Watcher(_opts(real_vl.url, tmp_path, connection=conn("gpu-p2")), engine=_engine()).open()
    try:
        with pytest.raises(StateLocked, match="is held by pid"):
            Watcher(_opts(real_vl.url, tmp_path, connection=conn("gpu-p1")), engine=_engine()).open()
        for w in (a, b):
            _steps(w, lambda out, w: _caught_up(w) and w.incidents)
    finally:
        a.close()
        b.close()
    assert [i.node for i in a.incidents] == ["gpu-p1"] and [i.node for i in b.incidents] == ["gpu-p2"]
    assert a.cursor.path != b.cursor.path and a.cursor.path.exists() and b.cursor.path.exists()
    # released on close: the same scope can start again
    Watcher(_opts(real_vl.url, tmp_path, connection=conn("gpu-p1")), engine=_engine()).open().close()
