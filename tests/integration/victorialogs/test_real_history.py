"""History against the real VictoriaLogs v1.26.0: ``replay --source`` (sliced concurrent export)
and ``watch --since`` give the incidents a replay of the same lines gives."""

from __future__ import annotations

import json
import sys
import time

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recovery_logs.config import EngineConfig
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.watch import Watcher, WatchOptions
from recovery_logs.simulate.generate import SimOptions, simulate
from recovery_logs.sources.files import events_from_vl_records
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.rowkeys import vl_time_ns
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.sources.vl_history import history_batches_fast

vlreal = sys.modules["recovery_logs_tests_vlreal"]
NS, fmt_ns = vlreal.NS, vlreal.fmt_ns
KEYS = ("id", "category", "cause", "node", "job_id", "count", "first_seen", "last_seen", "confidence")


_SIM: dict[str, list] = {}


def _simulated(tmp_path, scenario: str, end_ns: int) -> list[dict]:
    """A simulator scenario as VictoriaLogs rows, moved so its last line is at ``end_ns``."""
    if scenario not in _SIM:    # generated once per session (the simulator takes seconds)
        simulate(SimOptions(out=tmp_path / "sim", scenario=scenario, nodes=2, gpus_per_node=2, duration_s=960.0,
                            format="vl-jsonl"))
        _SIM[scenario] = [json.loads(x) for x in (tmp_path / "sim" / scenario / "vl.jsonl").read_text().splitlines()
                          if x.strip()]
    rows = [dict(r) for r in _SIM[scenario] if isinstance(r, dict)]
    rows = [r for r in rows if isinstance(r, dict) and "_time" in r]
    times = []
    for r in rows:
        try:
            times.append(vl_time_ns(r["_time"]))
        except ValueError:
            times.append(None)
    newest = max(t for t in times if t is not None)
    out = []
    for r, t in zip(rows, times, strict=True):
        if t is None:
            continue
        r = {k: v for k, v in r.items() if k not in ("_stream", "_stream_id")}
        r["_time"] = fmt_ns(t - newest + end_ns)
        out.append(r)
    return out


def _replayed(rows: list[dict]) -> list[dict]:
    rows = sorted(rows, key=lambda r: vl_time_ns(r["_time"]))
    eng = Engine(EngineConfig())
    eng.feed(events_from_vl_records(rows, ReadOptions(), 0, "victorialogs:test").events)
    eng.advance(eng.max_time_ns)
    return [{k: i.to_dict()[k] for k in KEYS} for i in eng.incidents()]


def test_replay_source_sliced_equals_replay_of_the_lines(real_vl, tmp_path):
    end = time.time_ns() - 60 * NS
    rows = _simulated(tmp_path, "silent_hang", end)
    real_vl.ingest(rows, stream_fields="host,unit,job_id")
    t_end = time.monotonic() + 10
    while len(real_vl.query("*", start="2h")) < len(rows) and time.monotonic() < t_end:
        time.sleep(0.2)    # every row searchable (about 1 s after the insert, longer under load)
    want = _replayed(rows)
    assert want
    client = VictoriaLogsClient(real_vl.url)
    batches = history_batches_fast(client, "*", end - 3600 * NS, end, ReadOptions(), slice_rows=max(10, len(rows) // 7))
    res = replay([], ReplayOptions(), batches=batches)
    ordered = sorted(rows, key=lambda r: vl_time_ns(r["_time"]))
    ref = replay([], ReplayOptions(), batches=[events_from_vl_records(ordered, ReadOptions(), 0, "victorialogs:t")])
    assert res.summary["events"] == ref.summary["events"]      # every row once, across slices
    assert res.summary["out_of_order"] == 0 and res.summary["duplicates"] == ref.summary["duplicates"]
    assert [{k: i.to_dict()[k] for k in KEYS} for i in res.incidents] == want


def test_watch_since_equals_replay_no_hang_alarm_from_the_catch_up(real_vl, tmp_path):
    end = time.time_ns() - 5 * NS
    rows = _simulated(tmp_path, "silent_hang", end)
    real_vl.ingest(rows, stream_fields="host,unit,job_id")
    # the history must be on the server before the watcher reads it: rows the server makes searchable
    # only after the catch-up passed their windows are late lines (a different, tested case)
    _wait_rows(real_vl, len(rows))
    want = _replayed(rows)
    w = Watcher(WatchOptions(sources=(real_vl.url,), refresh_s=0.2, lateness_s=30.0, since_s=1800.0,
                             catchup_max_s=120.0, unreachable_exit_s=None)).open()
    try:
        t_end = time.monotonic() + 25
        while time.monotonic() < t_end:
            w.step()
            if w.vl.complete_ns and time.time_ns() - w.vl.complete_ns < w.vl.offset_ns + NS and w.vl.stats["polls"] > 5:
                break
            time.sleep(0.05)
        w.step()
    finally:
        w.close()
    got = [{k: i.to_dict()[k] for k in KEYS} for i in w.incidents]
    # the watcher is sent only the rows a rule can match, but the server counts every line per
    # (host, job, window): the windows the anomaly model scores are replay's
    ref = Engine(EngineConfig())
    ref.feed(events_from_vl_records(sorted(rows, key=lambda r: vl_time_ns(r["_time"])), ReadOptions(), 0, "t").events)
    keys = ["host", "job_id", "window_start", "lines"]
    assert_frame_equal(w.engine.windows.select(keys), ref.windows.select(keys))
    # the prefilter (selected here from the scope's export, sources.vl_local) left rows out of the engine
    assert w.vl.stats["rows_fetched"] == len(rows) and w.vl.stats["lines_read"] < len(rows)
    assert w.stats["incidents_new"] == len(got)                # nothing reported and later withdrawn
    # anomaly windows that score exactly alike on two hosts are named by feed order (an engine tie-break,
    # not the reader's doing): compare those without node and cause
    loose = ("node", "cause")
    strip = [lambda i: {k: v for k, v in i.items() if i["category"] != "anomaly" or k not in loose}][0]
    assert [strip(i) for i in got] == [strip(i) for i in want]
    assert [i for i in got if i["category"] != "anomaly"] == [i for i in want if i["category"] != "anomaly"]
    assert any(i["category"] == "nccl_timeout_hang" for i in got)       # the real hang, and only that one


def _wait_rows(real_vl, n: int, timeout: float = 10.0) -> None:
    if not real_vl.searchable(n, start="3h", timeout=timeout):
        raise AssertionError(f"the server did not make {n} rows searchable in {timeout} s")


@pytest.mark.parametrize(("scenario", "category"), [("silent_hang", "nccl_timeout_hang"), ("straggler_node", "straggler")])
def test_replay_source_pushdown_equals_replay_of_the_lines(real_vl, tmp_path, scenario, category):
    """The server counts lines per window, summarises training-progress lines that carry no step
    time (per host, job, step and window) and sends only the lines a rule (or enrichment) needs;
    the incidents equal those of a replay of every row from a file."""
    from recovery_logs.pipeline.vl_replay import replay_source

    end = time.time_ns() - 60 * NS
    rows = _simulated(tmp_path, scenario, end)
    # progress lines without a step time, on every host of the job (the server summarises them)
    hosts = sorted({r["host"] for r in rows if r.get("job_id")})
    job = next(r["job_id"] for r in rows if r.get("job_id"))
    t_first = min(vl_time_ns(r["_time"]) for r in rows)
    rows += [{"_time": fmt_ns(t_first + 5 * NS + k * 1_700_000_000 + 1000 * h), "host": hosts[h], "unit": "train",
              "job_id": job, "rank": str(h * 2 + k % 2),
              "_msg": f"[rank{h * 2 + k % 2}]: step {k // 2} | loss 1.{k % 97:02d} | lr 3.0e-04 | tokens/s 118000"}
             for k in range(0, 200) for h in range(len(hosts)) if scenario != "silent_hang" or k < 150]
    # two more ranks per host report each step (groups of 4 lines: the compact findings stand for them)
    prog = [r for r in rows if r.get("unit") == "train" and r["_msg"].startswith("[rank")]
    rows += [{**r, "_time": fmt_ns(vl_time_ns(r["_time"]) + 500_000), "rank": str(int(r["rank"]) + 100),
              "_msg": f"[rank{int(r['rank']) + 100}]" + r["_msg"].split("]", 1)[1]} for r in prog]
    # chatter no rule matches, with host and job in other fields the readers also accept
    # (VictoriaLogs stores no empty field: a row without a job simply has none)
    rows += [{"_time": fmt_ns(end - k * 997_000_000), "hostname": f"n{k % 2}.cluster.local", "unit": "sshd",
              **({"slurm_job_id": "4242"} if k % 3 else {}),
              "_msg": f"Accepted publickey for user{k} from 10.0.0.{k % 250}"} for k in range(300)]
    real_vl.ingest(rows, stream_fields="host,unit,job_id")
    _wait_rows(real_vl, len(rows))
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: vl_time_ns(r["_time"]))))
    ref = replay([str(path)], ReplayOptions(read=ReadOptions(fmt="vl-jsonl")))
    client = VictoriaLogsClient(real_vl.url)
    res = replay_source(client, "*", end - 3600 * NS, end, ReplayOptions(), slice_rows=max(10, len(rows) // 5),
                        progress=True, phrase=True, select="server")
    pd = res.summary["pushdown"]
    assert pd["lines_counted"] == ref.summary["events"] == res.summary["events"]
    assert res.summary["duplicates"] == ref.summary["duplicates"] > 0     # the simulator re-sends some lines
    assert res.summary["lines"] == len(rows) == ref.summary["lines"]
    assert 0 < pd["lines_fetched"] <= len(rows) - 300 - pd["progress_lines_summarised"]   # the rest only counted
    assert pd["progress_lines_summarised"] >= 150 * len(hosts)
    want = [{k: i.to_dict()[k] for k in KEYS} for i in ref.incidents]
    assert want and any(i["category"] == category for i in want)
    assert [{k: i.to_dict()[k] for k in KEYS} for i in res.incidents] == want
    # the engine state the incidents come from is the same, window by window and span by span
    assert_frame_equal(res.engine.windows, ref.engine.windows)
    assert_frame_equal(res.engine.spans, ref.engine.spans)
    full = replay_source(client, "*", end - 3600 * NS, end, ReplayOptions(), pushdown=False)
    assert [{k: i.to_dict()[k] for k in KEYS} for i in full.incidents] == want
    default = replay_source(client, "*", end - 3600 * NS, end, ReplayOptions(),   # no progress summaries, no phrases
                            select="server")
    assert default.summary["pushdown"]["progress_lines_summarised"] == 0
    assert [{k: i.to_dict()[k] for k in KEYS} for i in default.incidents] == want
    # the default: the scope exported, selected, counted and summarised here (sources.vl_local)
    local = replay_source(client, "*", end - 3600 * NS, end, ReplayOptions(), slice_rows=max(10, len(rows) // 5))
    lp = local.summary["pushdown"]
    assert lp["select"] == "local" and lp["progress_lines_summarised"] == pd["progress_lines_summarised"]
    assert lp["lines_fetched"] == pd["lines_fetched"] and lp["lines_counted"] == pd["lines_counted"]
    assert local.summary["duplicates"] == ref.summary["duplicates"] and local.summary["lines"] == len(rows)
    assert [{k: i.to_dict()[k] for k in KEYS} for i in local.incidents] == want
    assert_frame_equal(local.engine.windows, ref.engine.windows)
    assert_frame_equal(local.engine.spans, ref.engine.spans)


def test_exports_are_asked_uncompressed_gzip_on_request(real_vl):
    """The bulk reads (replay slices, watch polls) ask for an uncompressed body: gzip cost the
    server half as much CPU again per export and us the inflate, for bytes that mostly cross
    loopback or a LAN (``gzip_exports=True`` for a slow link gives the same rows)."""
    import requests

    t0 = time.time_ns() - 30 * NS
    real_vl.ingest([{"_time": fmt_ns(t0 + k * 1000), "host": f"h{k % 3}", "unit": "u", "_msg": f"line {k} " + "x" * 40}
                    for k in range(2000)])
    _wait_rows(real_vl, 2000)
    seen: list[str | None] = []
    bodies = []
    for gz in (False, True):
        session = requests.Session()
        session.hooks["response"].append(lambda r, *a, **k: seen.append(r.headers.get("Content-Encoding")))
        client = VictoriaLogsClient(real_vl.url, session=session, gzip_exports=gz)
        bodies.append(client.query_bytes("* | fields _time, _msg, host | sort by (_time)", t0 - NS, t0 + NS))
        assert client.clone().gzip_exports is gz
    assert seen == [None, "gzip"]
    assert bodies[0] == bodies[1] and bodies[0].count(b"\n") == 2000


def _stream_ids_read(client: VictoriaLogsClient, lo: int, hi: int, seen: list[pl.DataFrame] | None = None
                     ) -> tuple[dict[tuple[str, str], str], list[str]]:
    """(message, time) -> stream id of the events read, and the exports sent. ``seen``: read with a
    pool-side ``select`` keeping the rows with an even pid; the frames it saw are appended."""
    sent: list[str] = []
    orig = client.query_bytes

    def rec(q, *a, **k):
        sent.append(q)
        return orig(q, *a, **k)

    def select(df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        assert seen is not None
        seen.append(df)
        return df.filter(pl.col("_msg").str.extract(r"pid=(\d+)", 1).cast(pl.Int64) % 2 == 0), df.height

    client.query_bytes = rec      # type: ignore[method-assign]
    got = {}
    extra = {"select": select, "on_select": lambda n: None} if seen is not None else {}
    for b in history_batches_fast(client, "*", lo, hi, ReadOptions(dedupe=seen is not None), slice_rows=300, **extra):
        for r in b.events.select("time", "message", "stream_id").iter_rows():
            got[(r[1], r[0].isoformat())] = r[2]
    exports = [q for q in sent if "| fields" in q and "stats" not in q]
    return got, exports


def test_replay_export_leaves_stream_id_out_and_joins_it_back(real_vl):
    """``replay --source`` exports without ``_stream_id`` (a quarter of a chatter row) and joins
    it back from the stream fields: every event carries the id the server gives the row. Where
    the stream fields do not name the stream (``unit`` a stream field of one stream and a plain
    field of another) the id is exported as before."""
    t0 = time.time_ns() - 40 * NS
    rows = [{"_time": fmt_ns(t0 + k * 1_000_000), "host": f"h{k % 3}", **({"unit": f"u{k % 2}"} if k % 5 else {}),
             "_msg": f"NVRM: Xid (PCI:0000:{k % 200:02x}:00): 79, pid={k}, name=python3, GPU has fallen off the bus."}
            for k in range(900)]
    real_vl.ingest(rows, stream_fields="host,unit")
    _wait_rows(real_vl, 900)
    truth = {r["_msg"]: r["_stream_id"] for r in real_vl.query("* | fields _msg, _stream_id", start="1h")}
    client = VictoriaLogsClient(real_vl.url)
    got, exports = _stream_ids_read(client, t0 - NS, t0 + 5 * NS)
    assert len(got) == 900 and {m: s for (m, _), s in got.items()} == truth
    assert len(set(truth.values())) == 9                 # 3 hosts x (2 units + none)
    assert exports and all("_stream_id" not in q.split("| fields", 1)[1] for q in exports)
    # a selection in the export pool sees every row without the id (and, the rows' times being
    # distinct, without an identity: no two of them can be one line re-sent); the rows it keeps
    # get the server's id
    seen: list[pl.DataFrame] = []
    kept, exports = _stream_ids_read(VictoriaLogsClient(real_vl.url), t0 - NS, t0 + 5 * NS, seen)
    assert sum(d.height for d in seen) == 900
    assert all("_stream_id" not in d.columns and "__id" not in d.columns for d in seen if d.height)
    assert len(kept) == 450 and {m: s for (m, _), s in kept.items()} == {m: truth[m] for m, _ in kept}
    assert exports and all("_stream_id" not in q.split("| fields", 1)[1] for q in exports)
    # the same unit value as a plain field of a host-only stream: (host, unit) no longer names the stream
    t1 = t0 + 10 * NS
    real_vl.ingest([{"_time": fmt_ns(t1 + k * 1_000_000), "host": "h0", "unit": "u1", "_msg": f"plain unit {k}"}
                    for k in range(50)], stream_fields="host")
    _wait_rows(real_vl, 950)
    truth = {r["_msg"]: r["_stream_id"] for r in real_vl.query("* | fields _msg, _stream_id", start="1h")}
    got, exports = _stream_ids_read(VictoriaLogsClient(real_vl.url), t0 - NS, t1 + 5 * NS)
    assert len(got) == 950 and {m: s for (m, _), s in got.items()} == truth
    assert exports and all("_stream_id" in q.split("| fields", 1)[1] for q in exports)
