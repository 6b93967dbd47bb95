"""VictoriaLogs HTTP client: query, tail, hits and insert (requests).

Facts this client is built on were captured from a real VictoriaLogs v1.26.0 server
(``tests/fixtures/victorialogs/README.md``):

* ``/select/logsql/query`` streams JSON lines (chunked). An empty result is an empty body.
  A failure after streaming began keeps status 200 and *cuts* the stream (no final
  zero-length chunk, sometimes the raw text ``the connection has been aborted; ...``).
  A cut stream is a failed read and raises :class:`VictoriaLogsError`, never a short result.
* ``/select/logsql/tail`` never ends by itself; every end of a tail stream is a cut and
  raises :class:`VictoriaLogsError` so the caller reconnects (and deduplicates the replay).
  With gzip the headers only come with the first match, so tail asks for ``identity``.
* ``/insert/jsonline`` needs ``Content-Type: application/stream+json``; the form content
  type gets 200 and stores nothing.
* Errors: 400 ``text/plain`` for bad LogsQL, 422 JSON (Prometheus style) for stats errors,
  503 for timeouts / a full queue (retried with backoff).

Every third-party error is mapped here with ``raise ... from exc`` into
``VictoriaLogsError(message, status=, query=, server_message=)``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import requests

from recovery_logs.errors import ConfigError, VictoriaLogsError
from recovery_logs.timeutil import ns_to_iso

__all__ = ["ABORT_MARKER", "VictoriaLogsClient", "format_time_param", "parse_url"]

ABORT_MARKER = "the connection has been aborted"
_QUERY_PATH = "/select/logsql/query"
_TAIL_PATH = "/select/logsql/tail"
_HITS_PATH = "/select/logsql/hits"
_INSERT_PATH = "/insert/jsonline"
_POST_ABOVE = 4000          # queries longer than this go as a form POST (same API, captured)
_RETRY_STATUS = frozenset({502, 503, 504})
_DEFAULT = object()


def _short(text: str | None, n: int = 200) -> str | None:
    """Queries built from rule packs run to kilobytes; error text keeps their head."""
    if text is None or len(text) <= n:
        return text
    return text[:n] + f"... ({len(text)} chars)"


def _vl_error(message: str, query: str | None, **context: object) -> VictoriaLogsError:
    err = VictoriaLogsError(message, query=_short(query), **context)  # type: ignore[arg-type]  # context: status, server_message
    err.query = query     # the attribute keeps the whole query
    return err


def _conn_reason(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("[Errno", "timed out", "Read timed out"):
        i = text.find(marker)
        if i >= 0:
            return text[i:].split("'))")[0].split('"))')[0].rstrip(")")
    return text[-200:]


def parse_url(source: str) -> str:
    """``victorialogs://HOST:PORT`` -> ``http://HOST:PORT`` (``http(s)://`` pass through)."""
    text = source.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or not rest:
        raise ConfigError("not a VictoriaLogs URL; expected victorialogs://HOST:PORT", value=source)
    scheme = scheme.lower()
    if scheme in ("victorialogs", "vl", "http"):
        base = "http://" + rest
    elif scheme in ("victorialogs+https", "https"):
        base = "https://" + rest
    else:
        raise ConfigError("unknown VictoriaLogs URL scheme; expected victorialogs://HOST:PORT", value=source)
    parts = urlsplit(base)
    if not parts.hostname:
        raise ConfigError("VictoriaLogs URL has no host", value=source)
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ConfigError("VictoriaLogs URL has a bad port", value=source) from exc
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def format_time_param(value: int | str | datetime | None) -> str | None:
    """Integer ns -> RFC3339 with 9 fraction digits; strings pass through (RFC3339, unix, ``4h``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError("time parameter must be ns, RFC3339 text or a datetime", value=value)
    if isinstance(value, int):
        return ns_to_iso(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigError("naive datetime as a time parameter; give a UTC-aware one", value=value)
        return value.isoformat()
    return str(value)


def _server_message(resp: requests.Response) -> str:
    text = resp.text.strip()
    if "json" in resp.headers.get("Content-Type", ""):
        try:
            doc = json.loads(text)
        except ValueError:
            return text
        if isinstance(doc, dict) and "error" in doc:
            return str(doc["error"])
    return text


class VictoriaLogsClient:
    """A small, blocking client. Sessions are injected for tests; all calls are thread-safe
    except that one ``tail`` iterator must be consumed by one thread."""

    def __init__(self, base_url: str, session: requests.Session | None = None,
                 connect_timeout: float = 3.05, read_timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5, tail_idle_timeout: float | None = None) -> None:
        self.base_url = parse_url(base_url)
        self.session = session or requests.Session()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.tail_idle_timeout = tail_idle_timeout
        self._open: set[requests.Response] = set()
        self._lock = threading.Lock()
        self._closed = False

    # -- plumbing -----------------------------------------------------------------------
    def _request(self, method: str, path: str, query: str | None, *, stream: bool = False,
                 read_timeout: float | None | object = _DEFAULT, retry: bool = True,
                 **kwargs: Any) -> requests.Response:
        """Send with retries on connection errors and 502/503/504; map every failure."""
        url = self.base_url + path
        timeout = (self.connect_timeout, self.read_timeout if read_timeout is _DEFAULT else read_timeout)
        attempts = self.retries + 1 if retry else 1
        last: VictoriaLogsError | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            try:
                resp = self.session.request(method, url, stream=stream, timeout=timeout, **kwargs)  # type: ignore[arg-type]
            except requests.ConnectionError as exc:
                last = _vl_error(f"cannot connect to VictoriaLogs at {self.base_url}: {_conn_reason(exc)}",
                                 query, path=path)
                last.__cause__ = exc
                continue
            except requests.Timeout as exc:
                last = _vl_error(f"VictoriaLogs at {self.base_url} did not answer in time: {_conn_reason(exc)}",
                                 query, path=path)
                last.__cause__ = exc
                continue
            except requests.RequestException as exc:
                raise _vl_error(f"request to VictoriaLogs at {self.base_url} failed: {exc}", query,
                                path=path) from exc
            if resp.status_code < 400:
                return resp
            try:
                msg = _server_message(resp)
            except requests.RequestException:
                msg = ""
            finally:
                resp.close()
            if resp.status_code == 400:
                raise _vl_error(f"VictoriaLogs at {self.base_url} rejected the query {_short(query)!r}", query,
                                status=400, server_message=msg, path=path)
            if resp.status_code == 422:
                raise _vl_error(f"VictoriaLogs at {self.base_url} could not evaluate the query {_short(query)!r}",
                                query, status=422, server_message=msg, path=path)
            err = _vl_error(
                f"VictoriaLogs at {self.base_url} timed out or is overloaded" if resp.status_code == 503
                else f"VictoriaLogs at {self.base_url} answered HTTP {resp.status_code}",
                query, status=resp.status_code, server_message=msg, path=path)
            if resp.status_code not in _RETRY_STATUS:
                raise err
            last = err
        assert last is not None
        raise last

    def _lines(self, resp: requests.Response, query: str, what: str) -> Iterator[dict[str, str]]:
        """Yield JSON objects from a JSON-lines body; a cut or aborted stream raises."""
        buf = b""
        try:
            for chunk in resp.iter_content(chunk_size=None):
                if not chunk:
                    continue
                buf += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    if raw.strip():
                        yield self._decode(raw, query, what)
        except (requests.exceptions.ChunkedEncodingError, requests.ConnectionError,
                requests.exceptions.ContentDecodingError) as exc:
            if self._closed:
                return
            raise _vl_error(f"VictoriaLogs {what} stream was cut before it finished", query,
                            status=resp.status_code,
                            server_message=(buf.decode("utf-8", "replace").strip() or _conn_reason(exc))[:300]) from exc
        except (TimeoutError, requests.Timeout) as exc:
            raise _vl_error(f"VictoriaLogs {what} stream stalled past the read timeout", query,
                            status=resp.status_code, server_message=_conn_reason(exc)) from exc
        if buf.strip():
            yield self._decode(buf, query, what)

    @staticmethod
    def _decode(raw: bytes, query: str, what: str) -> dict[str, str]:
        text = raw.decode("utf-8", "replace").strip()
        if text.startswith(ABORT_MARKER):
            raise _vl_error(f"VictoriaLogs aborted the {what} stream", query, status=200, server_message=text)
        try:
            row = json.loads(text)
        except ValueError as exc:
            raise _vl_error(f"VictoriaLogs sent a line that is not JSON in the {what} stream", query,
                            status=200, server_message=text[:300]) from exc
        if not isinstance(row, dict):
            raise _vl_error(f"VictoriaLogs sent a non-object line in the {what} stream", query,
                            status=200, server_message=text[:300])
        return row

    # -- read APIs ------------------------------------------------------------------------
    def query(self, query: str, start: int | str | datetime | None = None,
              end: int | str | datetime | None = None, limit: int | None = None,
              fields: Sequence[str] | None = None) -> Iterator[dict[str, str]]:
        """Rows of ``/select/logsql/query``. ``end`` is inclusive (server semantics).

        Rows are unsorted unless the query sorts; ``limit`` gives the newest N. ``fields``
        appends ``| fields a, b`` (keep ``_time`` in it). Raises VictoriaLogsError on any
        failure, including a stream cut after rows were yielded.
        """
        q = query if not fields else f"{query} | fields {', '.join(fields)}"
        params: dict[str, str] = {"query": q}
        for key, val in (("start", start), ("end", end)):
            text = format_time_param(val)
            if text is not None:
                params[key] = text
        if limit is not None:
            params["limit"] = str(int(limit))
        if len(q) > _POST_ABOVE:
            resp = self._request("POST", _QUERY_PATH, q, stream=True, data=params)
        else:
            resp = self._request("GET", _QUERY_PATH, q, stream=True, params=params)
        with resp:
            yield from self._lines(resp, q, "query")

    def tail(self, query: str, start_offset: str = "5s", offset: str = "1s",
             refresh_interval: str = "1s") -> Iterator[dict[str, str]]:
        """Rows of ``/select/logsql/tail`` as they come. Never ends normally: when the
        server stops, restarts or cuts the stream this raises VictoriaLogsError (reconnect
        and deduplicate: a new connection replays ``start_offset``). ``close()`` from another
        thread ends it quietly."""
        params = {"query": query, "start_offset": start_offset, "offset": offset,
                  "refresh_interval": refresh_interval}
        resp = self._request("GET", _TAIL_PATH, query, stream=True, read_timeout=self.tail_idle_timeout,
                             retry=False, params=params, headers={"Accept-Encoding": "identity"})
        with self._lock:
            self._open.add(resp)
        try:
            yield from self._lines(resp, query, "tail")
            if self._closed:
                return
            raise _vl_error("VictoriaLogs tail stream ended (server closed it)", query, status=200)
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.close()

    def hits(self, query: str, start: int | str | datetime | None, end: int | str | datetime | None,
             step: str, field: str | None = None) -> dict[str, Any]:
        """``/select/logsql/hits``: ``{"hits": [{"fields", "timestamps", "values", "total"}]}``."""
        params: dict[str, str] = {"query": query, "step": step}
        for key, val in (("start", start), ("end", end)):
            text = format_time_param(val)
            if text is not None:
                params[key] = text
        if field:
            params["field"] = field
        resp = self._request("GET", _HITS_PATH, query, params=params)
        try:
            doc = resp.json()
        except ValueError as exc:
            raise _vl_error("VictoriaLogs hits answer is not JSON", query, status=resp.status_code,
                            server_message=resp.text[:300]) from exc
        if not isinstance(doc, dict) or "hits" not in doc:
            raise _vl_error("VictoriaLogs hits answer has no 'hits'", query, status=resp.status_code,
                            server_message=resp.text[:300])
        return doc

    # -- write API ------------------------------------------------------------------------
    def insert_jsonline(self, rows: Iterable[dict[str, Any]],
                        stream_fields: Sequence[str] = ("host", "unit", "job_id")) -> None:
        """POST rows as JSON lines (``_time``, ``_msg``, fields). Values that are not strings
        are sent as JSON values (the server stores them as strings)."""
        body = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows).encode()
        if not body:
            return
        params = {"_stream_fields": ",".join(stream_fields)}
        resp = self._request("POST", _INSERT_PATH, None, params=params, data=body,
                             headers={"Content-Type": "application/stream+json"})
        resp.close()

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """End open tails from any thread (their iterators return quietly) and the session."""
        self._closed = True
        with self._lock:
            open_now = list(self._open)
        for resp in open_now:
            _shutdown_socket(resp)
        self.session.close()


def _shutdown_socket(resp: requests.Response) -> None:
    """Best effort: shut the socket down so a recv blocked in another thread returns."""
    raw = getattr(resp, "raw", None)
    for sock in (getattr(getattr(raw, "_connection", None), "sock", None),
                 getattr(getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None), "_sock", None)):
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return


