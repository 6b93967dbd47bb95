"""Helpers for the real VictoriaLogs server (v1.26.0) in integration tests.

The binary is found through ``RECOVERY_LOGS_VL_BIN`` or ``../shared/victorialogs/victoria-logs``
relative to the repository root (CI has ``../shared/`` beside the clone; ``.ci/run`` exports the
variable). Where neither exists — a user's fresh machine — these tests are skipped with that
reason; the fixture-faithful server in ``tests/victorialogs/`` still covers the client there.

Each server gets a fresh data dir and a free port, and flushes in-memory rows every second
(``-inmemoryDataFlushInterval=1s``) so restarts and crashes are quick to provoke.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NS = 1_000_000_000


def vl_binary() -> Path | None:
    env = os.environ.get("RECOVERY_LOGS_VL_BIN")
    cand = Path(env) if env else ROOT.parent / "shared" / "victorialogs" / "victoria-logs"
    return cand if cand.is_file() and os.access(cand, os.X_OK) else None


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fmt_ns(ns: int) -> str:
    sec, frac = divmod(ns, NS)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


class RealVL:
    """One ``victoria-logs`` process: start / stop (TERM) / kill (KILL) / restart on the same port
    and data dir; ingest with the content type the server needs."""

    def __init__(self, binary: Path, data_dir: Path, port: int | None = None) -> None:
        self.binary, self.data_dir = binary, data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / f"vl-{self.port}.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"victorialogs://127.0.0.1:{self.port}"

    def start(self) -> RealVL:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(self.binary), f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.data_dir}",
             "-retentionPeriod=100y", "-inmemoryDataFlushInterval=1s", "-loggerLevel=WARN"],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end:
            try:
                if urllib.request.urlopen(self.base + "/health", timeout=1).read().strip() == b"OK":
                    return self
            except OSError as exc:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"victoria-logs exited {self.proc.returncode}: "
                                       f"{self.log.read_text()[-500:]}") from exc
            time.sleep(0.05)
        raise RuntimeError("victoria-logs did not become healthy in 10 s")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> tuple[int, float]:
        """Send ``sig``; returns (exit code, seconds until it exited)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.proc = None
        return rc, time.monotonic() - t0

    def ingest(self, rows: list[dict], stream_fields: str = "host,unit", headers: dict[str, str] | None = None) -> None:
        body = "".join(json.dumps(r) + "\n" for r in rows).encode()
        req = urllib.request.Request(f"{self.base}/insert/jsonline?_stream_fields={stream_fields}", data=body,
                                     headers={"Content-Type": "application/stream+json", **(headers or {})})
        urllib.request.urlopen(req, timeout=10).read()

    def query(self, q: str, start: str = "100d", headers: dict[str, str] | None = None) -> list[dict]:
        data = urllib.parse.urlencode({"query": q, "start": start}).encode()
        req = urllib.request.Request(f"{self.base}/select/logsql/query", data=data, headers=headers or {})
        body = urllib.request.urlopen(req, timeout=30).read()
        return [json.loads(x) for x in body.splitlines() if x.strip()]

    def searchable(self, n: int, start: str = "3h", timeout: float = 10.0, poll_s: float = 0.2) -> bool:
        """Wait until the server shows at least ``n`` rows in the last ``start``; False after ``timeout``."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            got = self.query("* | stats count() as n", start=start)
            if got and int(got[0]["n"]) >= n:
                return True
            time.sleep(poll_s)
        return False

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


class CheckingProxy:
    """A reverse proxy under a path prefix that records every request's headers and demands
    basic auth ``user:password`` or a bearer ``token`` (401 otherwise) — what vmauth does."""

    def __init__(self, upstream: str, prefix: str, user: str | None = None, password: str | None = None,
                 token: str | None = None) -> None:
        self.upstream, self.prefix = upstream, prefix.rstrip("/")
        want = []
        if user:
            want.append("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        if token:
            want.append(f"Bearer {token}")
        self.want = want
        self.seen: list[dict[str, str]] = []
        proxy = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self._fwd()

            def do_POST(self):
                self._fwd()

            def _fwd(self):
                proxy.seen.append({"path": self.path, **{k: v for k, v in self.headers.items()}})
                if proxy.want and self.headers.get("Authorization") not in proxy.want:
                    self.send_response(401)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"Unauthorized")
                    return
                if not self.path.startswith(proxy.prefix + "/"):
                    self.send_response(404)
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command == "POST" else None
                fwd = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accountid", "projectid")}
                req = urllib.request.Request(proxy.upstream + self.path[len(proxy.prefix):], data=body, headers=fwd,
                                             method=self.command)
                try:
                    resp = urllib.request.urlopen(req, timeout=30)
                    code, data, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "text/plain")
                except urllib.error.HTTPError as exc:
                    code, data, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "text/plain")
                except OSError:
                    code, data, ctype = 502, b"bad gateway", "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


