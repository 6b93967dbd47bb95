"""A fixture-faithful VictoriaLogs stand-in on 127.0.0.1, run in a thread.

What it reproduces (from ``tests/fixtures/victorialogs/README.md``, captured from v1.26.0):

* **Static exchanges**: a request whose method, path and decoded parameters equal a captured
  ``*.txt`` exchange gets the captured status, headers and body byte for byte (chunked when
  the capture was). The mid-stream timeout capture is replayed as a cut stream: its rows,
  then the raw abort text, no final zero-length chunk, connection closed (the capture keeps
  only the tail of a 51 MB body; its first, partial row is left out).
* **Dynamic store** for everything else: ``/insert/jsonline`` (only with
  ``Content-Type: application/stream+json``; other types get 200 and store nothing; invalid
  lines are skipped), ``/select/logsql/query`` (unsorted, grouped by stream, unless
  ``| sort``; ``limit`` = newest N ascending; empty result = empty body; ``end`` inclusive),
  ``/select/logsql/hits`` and ``/select/logsql/tail`` with the captured semantics: every
  ``refresh_interval`` the window ``[previous end - start_offset, now - offset]``, per stream
  rows with ``_time <=`` the last sent one are skipped, one chunk per poll sorted by ``_time``,
  no heartbeat, no final chunk, a reconnect replays ``start_offset``.
* **Faults**: ``stop()`` / ``start()`` (down, restart on the same port: open tails see EOF,
  rows ingested in the last ``lose_recent_s`` are lost as captured), ``cut_queries`` (the next
  N queries stream ``cut_after`` rows then the abort text), ``slow_s`` (delay before a query
  answers), ``fail_status`` (the next N queries answer e.g. 503).

Only a LogsQL subset is understood: ``*``, words, ``"phrases"``, ``field:value``,
``field:~"regexp"``, ``field:="exact"``, ``{stream="filter"}``, ``and``/``or``/``not``/``!``,
parentheses; pipes ``sort by (_time [desc])``, ``fields a, b``, ``limit N``.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import json
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "victorialogs"


def _load_logsql():
    name = "recovery_logs_tests_vl_logsql"
    if name not in sys.modules:   # tests run with --import-mode=importlib: load the sibling by path
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "vl_logsql.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


_lq = _load_logsql()
Query, QueryError, parse_query = _lq.Query, _lq.QueryError, _lq.parse_query
parse_time_ns, format_time_ns = _lq.parse_time_ns, _lq.format_time_ns
parse_duration_ns, parse_param_time = _lq.parse_duration_ns, _lq.parse_param_time
ABORT_TEXT = b"\nthe connection has been aborted; see the last line in the response and/or in the server log for the reason\n"


# --------------------------------------------------------------------------- fixtures
@dataclass
class Exchange:
    name: str
    method: str
    path: str
    params: tuple[tuple[str, str], ...]
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool
    cut: bool
    request_headers: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.method, self.path, self.params)


def parse_exchange(path: Path) -> Exchange:
    raw = path.read_bytes()
    head, body = raw.split(b"\n\n", 1)
    lines = head.decode().split("\n")
    method, target = lines[0].split(" ", 1)
    parts = urlsplit(target)
    req_headers: dict[str, str] = {}
    i = 1
    notes: list[str] = []
    while lines[i].startswith("#"):
        if lines[i].startswith("# request-headers:"):
            req_headers = json.loads(lines[i].split(":", 1)[1])
        if lines[i].startswith("# note:"):
            notes.append(lines[i])
        if lines[i].startswith("# request-body: form-urlencoded:"):
            form = lines[i].split("form-urlencoded:", 1)[1].strip().split(" ")[0]
            parts = parts._replace(query=form)
        i += 1
    proto, code, *reason = lines[i].split(" ")
    assert proto == "HTTP/1.1", path
    headers = [tuple(h.split(": ", 1)) for h in lines[i + 1:]]
    chunked = any(k == "Transfer-Encoding" and v == "chunked" for k, v in headers)
    cut = any("stream was cut" in n or "LAST 900 RAW WIRE BYTES" in n for n in notes)
    params = tuple(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return Exchange(path.stem, method, parts.path, params, int(code), " ".join(reason),
                    [(k, v) for k, v in headers], body, chunked, cut, req_headers)


def load_exchanges(root: Path = FIXTURES) -> list[Exchange]:
    return [parse_exchange(p) for p in sorted(root.glob("*.txt"))
            if p.read_bytes()[:4] in (b"GET ", b"POST")]


# --------------------------------------------------------------------------- store
@dataclass
class Row:
    t: int
    stream_id: str
    stream: str
    msg: str
    fields: dict[str, str]
    ingested: float
    _matched: dict[str, bool] = field(default_factory=dict, repr=False)

    def matches(self, q: Query) -> bool:
        got = self._matched.get(q.text)
        if got is None:
            got = self._matched[q.text] = bool(q.match(self))
        return got

    def get(self, name: str) -> str:
        if name == "_msg":
            return self.msg
        if name == "_stream_id":
            return self.stream_id
        if name == "_stream":
            return self.stream
        return self.fields.get(name, "")

    def line(self, fields: list[str] | None) -> bytes:
        """The JSON line as the server writes it (cached per projection)."""
        key = "\x00".join(fields) if fields is not None else None
        cache = self.__dict__.setdefault("_lines", {})
        got = cache.get(key)
        if got is None:
            got = cache[key] = json.dumps(self.render(fields), ensure_ascii=False,
                                          separators=(",", ":")).encode() + b"\n"
        return got

    def render(self, fields: list[str] | None = None) -> dict[str, str]:
        full = {"_time": format_time_ns(self.t), "_stream_id": self.stream_id, "_stream": self.stream,
                "_msg": self.msg, **self.fields}
        if fields is None:
            return full
        return {k: full[k] for k in fields if k in full}


class Store:
    """Rows in ingestion order plus a time index (bisect), so tail polls and catch-up queries
    only look at their window."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._times: list[tuple[int, int]] = []   # (t, ingest seq), sorted
        self._by_time: list[Row] = []
        self._seq = 0
        self.lock = threading.Lock()

    def _index(self, row: Row) -> None:
        key = (row.t, self._seq)
        self._seq += 1
        i = bisect.bisect_right(self._times, key)
        self._times.insert(i, key)
        self._by_time.insert(i, row)

    def window(self, start: int | None, end: int | None, visible_before: float) -> list[Row]:
        with self.lock:
            lo = 0 if start is None else bisect.bisect_left(self._times, (start, -1))
            hi = len(self._times) if end is None else bisect.bisect_right(self._times, (end, 1 << 62))
            return [r for r in self._by_time[lo:hi] if r.ingested <= visible_before]

    def insert(self, docs: list[dict[str, Any]], stream_fields: list[str], now_ns: int) -> None:
        now = time.monotonic()
        with self.lock:
            for d in docs:
                flat = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in d.items()}
                t_text = flat.pop("_time", "")
                t = now_ns if t_text in ("", "0") else parse_time_ns(t_text)
                msg = flat.pop("_msg", "")
                labels = {k: flat[k] for k in sorted(stream_fields) if k in flat}
                stream = "{" + ",".join(f'{k}={json.dumps(v)}' for k, v in labels.items()) + "}"
                sid = "0" * 16 + hashlib.sha256(stream.encode()).hexdigest()[:32]
                row = Row(t, sid, stream, msg, flat, now)
                self.rows.append(row)
                self._index(row)

    def snapshot(self, visible_before: float) -> list[Row]:
        with self.lock:
            return [r for r in self.rows if r.ingested <= visible_before]

    def drop_ingested_after(self, t_monotonic: float) -> int:
        with self.lock:
            keep = [r for r in self.rows if r.ingested < t_monotonic]
            lost = len(self.rows) - len(keep)
            self.rows, self._times, self._by_time, self._seq = [], [], [], 0
        for r in keep:
            with self.lock:
                self.rows.append(r)
                self._index(r)
        return lost


# --------------------------------------------------------------------------- server
class VLServer:
    """Start with ``with VLServer() as srv: srv.url``; ``srv.base`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, port: int = 0, static: bool = True, visibility_delay_s: float = 0.0,
                 clock=time.time_ns) -> None:
        self.port = port
        self.store = Store()
        self.exchanges = {e.key: e for e in load_exchanges()} if static else {}
        self.visibility_delay_s = visibility_delay_s
        self.clock = clock
        self.slow_s = 0.0
        self.cut_queries = 0
        self.cut_after = 1
        self.fail_status: list[int] = []
        self.lose_recent_s = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.counts: dict[str, int] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    # lifecycle ------------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"victorialogs://127.0.0.1:{self.port}"

    def start(self) -> VLServer:
        server = self

        class Handler(_Handler):
            srv = server

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._stopping.clear()
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name=f"vlserver:{self.port}")
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop listening and cut every open connection (tails see EOF). Returns rows lost."""
        self._stopping.set()
        lost = 0
        if self.lose_recent_s:
            lost = self.store.drop_ingested_after(time.monotonic() - self.lose_recent_s)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return lost

    def restart(self, down_for_s: float = 0.0) -> int:
        lost = self.stop()
        time.sleep(down_for_s)
        self.start()
        return lost

    def __enter__(self) -> VLServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # helpers --------------------------------------------------------------------------
    def ingest(self, docs: list[dict[str, Any]], stream_fields=("host", "unit", "job_id")) -> None:
        self.store.insert(docs, list(stream_fields), self.clock())

    def ingest_file(self, path: Path) -> None:
        self.ingest([json.loads(x) for x in path.read_text().splitlines() if x.strip()])

    def visible_rows(self) -> list[Row]:
        return self.store.snapshot(time.monotonic() - self.visibility_delay_s)

    def select(self, q: Query, start: int | None, end: int | None) -> list[Row]:
        rows = [r for r in self.store.window(start, end, time.monotonic() - self.visibility_delay_s)
                if r.matches(q)]
        if q.sort_desc is not None:
            rows.sort(key=lambda r: r.t, reverse=q.sort_desc)
        else:  # unsorted like the real server: grouped by stream, in ingestion order
            order = {sid: i for i, sid in enumerate(sorted({r.stream_id for r in rows}))}
            rows.sort(key=lambda r: order[r.stream_id])
        if q.limit is not None:
            rows = rows[:q.limit]
        return rows

    def bump(self, key: str) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    srv: VLServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.srv._lock:
            self.srv._socks.add(self.connection)

    def finish(self) -> None:
        with self.srv._lock:
            self.srv._socks.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # plumbing
    def _send(self, status: int, body: bytes, ctype: str, reason: str | None = None) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_chunked(self, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _cut(self) -> None:
        self.wfile.write(ABORT_TEXT)
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _params(self) -> tuple[str, dict[str, str], bytes]:
        parts = urlsplit(self.path)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        body = b""
        if self.command == "POST":
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded") \
                    and parts.path.startswith("/select/"):
                params.update(parse_qsl(body.decode(), keep_blank_values=True))
        return parts.path, params, body

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path, params, body = self._params()
        self.srv.requests.append((self.command, path, params))
        self.srv.bump(path)
        key = tuple(sorted(params.items()))
        ex = self.srv.exchanges.get((self.command, path, key))
        if ex is None and self.command == "POST" and path.startswith("/select/"):
            ex = self.srv.exchanges.get(("GET", path, key))   # the server reads a form POST as the same GET
        if ex is not None and path.startswith("/select/"):
            return self._replay(ex)
        try:
            if path == "/insert/jsonline":
                return self._insert(params, body)
            if path == "/select/logsql/query":
                return self._query(params)
            if path == "/select/logsql/tail":
                return self._tail(params)
            if path == "/select/logsql/hits":
                return self._hits(params)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return None
        return self._send(400, f'unsupported path requested: "{path}"\n'.encode(), "text/plain; charset=utf-8")

    def _replay(self, ex: Exchange) -> None:
        self.send_response(ex.status, ex.reason)
        for k, v in ex.headers:
            if k not in ("Date", "Transfer-Encoding", "Content-Length"):
                self.send_header(k, v)
        if not ex.chunked:
            self.send_header("Content-Length", str(len(ex.body)))
            self.end_headers()
            self.wfile.write(ex.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = ex.body
        if ex.cut and ABORT_TEXT in body:
            rows = body[:body.index(ABORT_TEXT)]
            rows = rows[:-2] if rows.endswith(b"\r\n") else rows   # the chunk terminator seen on the wire
            if not rows.startswith(b"{"):   # the capture starts mid-row: keep whole rows only
                rows = rows[rows.index(b"\n") + 1:] if b"\n" in rows else b""
            self._chunk(rows)
            return self._cut()
        self._chunk(body)
        if ex.cut:   # a tail capture: the stream never ends; close it like the client did
            self.close_connection = True
            return None
        self.wfile.write(b"0\r\n\r\n")
        return None

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _bad(self, text: str) -> None:
        self._send(400, (text + "\n").encode(), "text/plain; charset=utf-8")

    def _insert(self, params: dict[str, str], body: bytes) -> None:
        if self.headers.get("Content-Type", "").split(";")[0].strip() == "application/stream+json":
            docs = []
            for line in body.decode("utf-8", "replace").splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue   # the real server skips an invalid line and says so only in its log
                if isinstance(doc, dict):
                    docs.append(doc)
            fields = [f for f in params.get("_stream_fields", "").split(",") if f]
            self.srv.store.insert(docs, fields, self.srv.clock())
        self._send(200, b"", "application/json")

    def _query(self, params: dict[str, str]) -> None:
        text = params.get("query", "")
        try:
            q = parse_query(text)
        except (QueryError, re.error) as exc:
            return self._bad(f"cannot parse query [{text}]: {exc}; context: [{text}]")
        now = self.srv.clock()
        try:
            start = parse_param_time(params["start"], now) if "start" in params else None
            end = parse_param_time(params["end"], now) if "end" in params else None
        except ValueError as exc:
            return self._bad(f"cannot parse start/end: {exc}")
        if self.srv.slow_s:
            time.sleep(self.srv.slow_s)
        if self.srv.fail_status:
            status = self.srv.fail_status.pop(0)
            return self._send(status, b"the request couldn't be executed in 0.245 seconds; possible solutions: "
                                      b"to increase -search.maxQueryDuration=30s\n", "text/plain; charset=utf-8")
        rows = self.srv.select(q, start, end)
        if q.stats_step_ns == -1:
            body = (json.dumps({q.stats_name: str(len(rows))}) + "\n").encode()
            return self._send(200, body, "application/stream+json")
        if q.stats_step_ns:
            counts: dict[int, int] = {}
            for r in rows:
                b = r.t // q.stats_step_ns * q.stats_step_ns
                counts[b] = counts.get(b, 0) + 1
            body = "".join(json.dumps({"_time": format_time_ns(b), q.stats_name: str(n)}) + "\n"
                           for b, n in counts.items())
            return self._send(200, body.encode(), "application/stream+json")
        if "limit" in params:
            lim = int(params["limit"])
            rows = sorted(sorted(rows, key=lambda r: r.t)[-lim:], key=lambda r: r.t) if lim else rows
        if not rows:
            return self._send(200, b"", "application/stream+json")
        self._start_chunked("application/stream+json")
        lines = [r.line(q.fields) for r in rows]
        if self.srv.cut_queries > 0:
            self.srv.cut_queries -= 1
            self._chunk(b"".join(lines[:self.srv.cut_after]))
            return self._cut()
        for i in range(0, len(lines), 1000):
            self._chunk(b"".join(lines[i:i + 1000]))
        self.wfile.write(b"0\r\n\r\n")
        return None

    def _hits(self, params: dict[str, str]) -> None:
        q = parse_query(params.get("query", "*"))
        now = self.srv.clock()
        step = parse_duration_ns(params.get("step", "1d"))
        start = parse_param_time(params["start"], now) if "start" in params else None
        end = parse_param_time(params["end"], now) if "end" in params else None
        rows = self.srv.select(q, start, end)
        fld = params.get("field")
        series: dict[str, dict[int, int]] = {}
        for r in rows:
            key = r.get(fld) if fld else ""
            b = r.t - r.t % step
            series.setdefault(key, {})[b] = series.setdefault(key, {}).get(b, 0) + 1
        hits = [{"fields": ({fld: k} if fld else {}), "timestamps": [format_time_ns(t) for t in sorted(v)],
                 "values": [v[t] for t in sorted(v)], "total": sum(v.values())} for k, v in sorted(series.items())]
        self._send(200, json.dumps({"hits": hits}).encode(), "application/json")

    def _tail(self, params: dict[str, str]) -> None:
        text = params.get("query", "")
        durs = {}
        for name, default in (("start_offset", "5s"), ("offset", "1s"), ("refresh_interval", "1s")):
            raw = params.get(name, default)
            try:
                val = parse_duration_ns(raw)
            except ValueError:
                return self._bad(f"cannot parse {name}={raw!r}")
            if val < 10**6:
                return self._bad(f"{name}={val // 10**6}ms is out of allowed range [1ms ... 3153600000000ms]")
            durs[name] = val
        try:
            q = parse_query(text)
        except (QueryError, re.error) as exc:
            return self._bad(f"cannot parse query [{text}]: {exc}; context: [{text}]")
        if q.tail_forbidden:
            return self._bad(f"the query [{text}] cannot be used in live tailing; see "
                             "https://docs.victoriametrics.com/victorialogs/querying/#live-tailing for details")
        self._start_chunked("application/x-ndjson")
        if q.fields is not None and "_time" not in q.fields:
            return self._cut()
        srv = self.srv
        last_sent: dict[str, int] = {}
        end = srv.clock() - durs["offset"]
        start = end - durs["start_offset"]
        while not srv._stopping.is_set():
            rows = [r for r in srv.select(q, start, end) if r.t > last_sent.get(r.stream_id, -1)]
            rows.sort(key=lambda r: r.t)
            if rows:
                for r in rows:
                    last_sent[r.stream_id] = max(last_sent.get(r.stream_id, -1), r.t)
                self._chunk(b"".join(r.line(q.fields) for r in rows))
            if srv._stopping.wait(durs["refresh_interval"] / 1e9) or self._client_gone():
                break
            start = end - durs["start_offset"]
            end = srv.clock() - durs["offset"]
        self.close_connection = True
