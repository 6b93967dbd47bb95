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
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import requests
else:
    class _OnUse:
        """``requests`` imported on first use (~70 ms with urllib3: a replay of files, which imports
        this module through the audit anchors, never talks to a server)."""

        def __getattr__(self, name: str) -> Any:
            import requests  # heavy third-party module, imported on use
            return getattr(requests, name)

    requests = _OnUse()

from recovery_logs.errors import ConfigError, VictoriaLogsError
from recovery_logs.timeutil import ns_to_iso

__all__ = ["ABORT_MARKER", "FATAL_STATUS", "VLConnection", "VictoriaLogsClient", "format_time_param",
           "parse_url", "redact", "split_userinfo"]

ABORT_MARKER = "the connection has been aborted"
_QUERY_PATH = "/select/logsql/query"
_TAIL_PATH = "/select/logsql/tail"
_HITS_PATH = "/select/logsql/hits"
_FIELD_NAMES_PATH = "/select/logsql/field_names"
_STREAM_FIELD_NAMES_PATH = "/select/logsql/stream_field_names"
_INSERT_PATH = "/insert/jsonline"
_RETRY_STATUS = frozenset({502, 503, 504})
# answers that cannot clear by themselves: our own query rejected, wrong credentials, no access,
# wrong path prefix (VictoriaLogs answers an unknown /select path with 400, a proxy with 404)
FATAL_STATUS = frozenset({400, 401, 403, 404, 405, 414, 422})
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


def split_userinfo(source: str) -> tuple[str, str | None, str | None]:
    """``scheme://user:pass@host`` -> (``scheme://host``, user, password). The URL that is kept
    (and printed in every message) never carries a credential."""
    scheme, sep, rest = source.strip().partition("://")
    if not sep:
        return source, None, None
    netloc, slash, path = rest.partition("/")
    if "@" not in netloc:
        return source.strip(), None, None
    userinfo, _, host = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return f"{scheme}://{host}{slash}{path}", unquote(user) or None, unquote(password) if password else None


def parse_url(source: str) -> str:
    """``victorialogs://HOST:PORT[/prefix]`` -> ``http://HOST:PORT[/prefix]`` (``http(s)://`` pass
    through; ``victorialogs+https://`` is TLS). A ``user:pass@`` part is dropped here (see
    :func:`split_userinfo` and :class:`VLConnection`): it must never reach a message."""
    text, _, _ = split_userinfo(source.strip())
    scheme, sep, rest = text.partition("://")
    if not sep or not rest:
        raise ConfigError("not a VictoriaLogs URL; expected victorialogs://HOST:PORT", value=text)
    scheme = scheme.lower()
    if scheme in ("victorialogs", "vl", "http"):
        base = "http://" + rest
    elif scheme in ("victorialogs+https", "https"):
        base = "https://" + rest
    else:
        raise ConfigError("unknown VictoriaLogs URL scheme; expected victorialogs://HOST:PORT", value=text)
    parts = urlsplit(base)
    if not parts.hostname:
        raise ConfigError("VictoriaLogs URL has no host", value=text)
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ConfigError("VictoriaLogs URL has a bad port", value=text) from exc
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _read_secret(what: str, file: str | None, env: str | None) -> str | None:
    """A credential from a file (first line, stripped) or an environment variable; the error
    names where it was looked for, never what it holds."""
    if file and env:
        raise ConfigError(f"give the {what} as a file or an environment variable, not both", file=file, env=env)
    if file:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the {what} file: {exc.strerror}", path=file) from exc
        val = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not val:
            raise ConfigError(f"the {what} file is empty", path=file)
        return val
    if env:
        val = os.environ.get(env, "").strip()
        if not val:
            raise ConfigError(f"the {what} environment variable is not set or empty", env=env)
        return val
    return None


@dataclass(frozen=True)
class VLConnection:
    """How to reach one VictoriaLogs: URL (with an optional path prefix: vmauth or a reverse
    proxy), basic auth or a bearer token, TLS verification (True, False or a CA bundle path),
    tenant (``AccountID``/``ProjectID`` headers) and ``extra_filters`` (sent as the server's own
    ``extra_filters`` argument, so a watcher can be scoped to a partition without editing the
    query). Credentials are kept out of ``repr`` and out of every message."""

    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    verify: bool | str = True
    account_id: str | None = None
    project_id: str | None = None
    extra_filters: str | None = None

    @classmethod
    def from_options(cls, source: str, *, user: str | None = None, password_file: str | None = None,
                     password_env: str | None = None, token_file: str | None = None, token_env: str | None = None,
                     ca_file: str | None = None, insecure: bool = False, account_id: str | None = None,
                     project_id: str | None = None, extra_filters: Sequence[str] = ()) -> VLConnection:
        _, url_user, url_password = split_userinfo(source)
        url = parse_url(source)
        password = _read_secret("password", password_file, password_env) or url_password
        token = _read_secret("bearer token", token_file, token_env)
        user = user or url_user
        if token and (user or password):
            raise ConfigError("give basic auth or a bearer token, not both", url=url)
        if password and not user:
            raise ConfigError("a password needs a user (--vl-user)", url=url)
        if ca_file and insecure:
            raise ConfigError("--vl-ca and --vl-insecure contradict each other", path=ca_file)
        if ca_file and not Path(ca_file).is_file():
            raise ConfigError("the CA bundle does not exist", path=ca_file)
        for name, val in (("AccountID", account_id), ("ProjectID", project_id)):
            if val is not None and not str(val).isdigit():
                raise ConfigError(f"{name} must be a non-negative integer", value=val)
        extra = " ".join(f"({f.strip()})" for f in extra_filters if f and f.strip()) or None
        return cls(url=url, user=user, password=password, token=token,
                   verify=ca_file if ca_file else not insecure, account_id=account_id, project_id=project_id,
                   extra_filters=extra)

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.password, self.token) if s)

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if self.account_id is not None:
            h["AccountID"] = str(self.account_id)
        if self.project_id is not None:
            h["ProjectID"] = str(self.project_id)
        return h


def redact(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


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
    except that one ``tail`` iterator must be consumed by one thread.

    ``base_url`` is a URL string or a :class:`VLConnection` (auth, TLS, tenant, extra filters).
    Every read is a form ``POST`` (no URL length limit behind nginx / vmauth). Errors whose
    status is in :data:`FATAL_STATUS` carry ``fatal = True``: retrying cannot fix them."""

    def __init__(self, base_url: str | VLConnection, session: requests.Session | None = None,
                 connect_timeout: float = 3.05, read_timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5, tail_idle_timeout: float | None = None,
                 gzip_exports: bool = False) -> None:
        self.conn = base_url if isinstance(base_url, VLConnection) else VLConnection.from_options(base_url)
        self.base_url = self.conn.url
        self.session = session or requests.Session()
        if self.conn.user:
            self.session.auth = (self.conn.user, self.conn.password or "")
        self.session.verify = self.conn.verify
        self.session.headers.update(self.conn.headers())
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.tail_idle_timeout = tail_idle_timeout
        self.gzip_exports = gzip_exports      # query_bytes asks for gzip (a slow link; costs CPU both sides)
        self._open: set[requests.Response] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.reached = False          # True once the server answered anything (even an error)

    def clone(self, **kw: Any) -> VictoriaLogsClient:
        """The same connection with other timeouts/retries (a second session, e.g. for a tail)."""
        args: dict[str, Any] = dict(connect_timeout=self.connect_timeout, read_timeout=self.read_timeout,
                                    retries=self.retries, backoff=self.backoff,
                                    tail_idle_timeout=self.tail_idle_timeout, gzip_exports=self.gzip_exports)
        args.update(kw)
        return VictoriaLogsClient(self.conn, **args)

    def _params(self, params: dict[str, str]) -> dict[str, str]:
        if self.conn.extra_filters:
            params["extra_filters"] = self.conn.extra_filters
        return params

    # -- plumbing -----------------------------------------------------------------------
    def _err(self, message: str, query: str | None, **context: Any) -> VictoriaLogsError:
        secrets = self.conn.secrets()
        if secrets:
            message = redact(message, secrets)
            context = {k: redact(v, secrets) if isinstance(v, str) else v for k, v in context.items()}
        err = _vl_error(message, query, **context)
        err.fatal = context.get("status") in FATAL_STATUS   # type: ignore[attr-defined]
        return err

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
            except requests.exceptions.SSLError as exc:
                raise self._err(f"TLS to VictoriaLogs at {self.base_url} failed: {_conn_reason(exc)}", query,
                                path=path) from exc
            except requests.ConnectionError as exc:
                last = self._err(f"cannot connect to VictoriaLogs at {self.base_url}: {_conn_reason(exc)}",
                                 query, path=path)
                last.__cause__ = exc
                continue
            except requests.Timeout as exc:
                last = self._err(f"VictoriaLogs at {self.base_url} did not answer in time: {_conn_reason(exc)}",
                                 query, path=path)
                last.__cause__ = exc
                continue
            except requests.RequestException as exc:
                raise self._err(f"request to VictoriaLogs at {self.base_url} failed: {_conn_reason(exc)}", query,
                                path=path) from exc
            self.reached = True
            if resp.status_code < 400:
                return resp
            try:
                msg = _server_message(resp)[:500]
            except requests.RequestException:
                msg = ""
            finally:
                resp.close()
            code = resp.status_code
            if code == 400:
                raise self._err(f"VictoriaLogs at {self.base_url} rejected the query {_short(query)!r}", query,
                                status=400, server_message=msg, path=path)
            if code == 422:
                raise self._err(f"VictoriaLogs at {self.base_url} could not evaluate the query {_short(query)!r}",
                                query, status=422, server_message=msg, path=path)
            if code == 401:
                raise self._err(f"VictoriaLogs at {self.base_url} refused the credentials (HTTP 401)", query,
                                status=401, server_message=msg, path=path)
            if code == 403:
                raise self._err(f"VictoriaLogs at {self.base_url} denied access (HTTP 403)", query,
                                status=403, server_message=msg, path=path)
            err = self._err(
                f"VictoriaLogs at {self.base_url} timed out or is overloaded" if code == 503
                else f"VictoriaLogs at {self.base_url} answered HTTP {code}",
                query, status=code, server_message=msg, path=path)
            if code not in _RETRY_STATUS:
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
        resp = self._request("POST", _QUERY_PATH, q, stream=True, data=self._params(params))
        with resp:
            yield from self._lines(resp, q, "query")

    def query_bytes(self, query: str, start: int | str | datetime | None = None,
                    end: int | str | datetime | None = None) -> bytes:
        """The raw JSON-lines body of ``/select/logsql/query`` (for a columnar parser). A cut
        stream raises VictoriaLogsError, never a short body.

        Asked uncompressed unless ``gzip_exports`` is set: these are the bulk reads (replay
        slices, watch polls), and gzip made the server spend half as much CPU again on an
        export and us a quarter more on the inflate (120 MB of 64-host chatter on the real
        v1.26.0: server 1.2 vs 0.8 CPU-s, ours 0.6 vs 0.35), for bytes that mostly cross
        loopback or a LAN. Set it for a server behind a slow link."""
        params: dict[str, str] = {"query": query}
        for key, val in (("start", start), ("end", end)):
            text = format_time_param(val)
            if text is not None:
                params[key] = text
        headers = None if self.gzip_exports else {"Accept-Encoding": "identity"}
        resp = self._request("POST", _QUERY_PATH, query, stream=True, data=self._params(params), headers=headers)
        parts: list[bytes] = []
        with resp:
            try:
                for chunk in resp.iter_content(chunk_size=1 << 20):
                    parts.append(chunk)
            except (requests.exceptions.ChunkedEncodingError, requests.ConnectionError) as exc:
                raise self._err("VictoriaLogs query stream was cut before it finished", query,
                                status=resp.status_code, server_message=_conn_reason(exc)) from exc
            except (TimeoutError, requests.Timeout) as exc:
                raise self._err("VictoriaLogs query stream stalled past the read timeout", query,
                                status=resp.status_code, server_message=_conn_reason(exc)) from exc
        body = b"".join(parts)
        tail = body[-400:]
        if ABORT_MARKER.encode() in tail:
            raise self._err("VictoriaLogs aborted the query stream", query, status=200,
                            server_message=tail.decode("utf-8", "replace").strip()[-300:])
        return body

    def stats(self, query: str, start: int | str | datetime | None = None,
              end: int | str | datetime | None = None) -> list[dict[str, str]]:
        """Rows of a ``... | stats ...`` query through ``/select/logsql/query`` (values are strings,
        row order is not stable)."""
        return list(self.query(query, start=start, end=end))

    def tail(self, query: str, start_offset: str = "5s", offset: str = "1s",
             refresh_interval: str = "1s") -> Iterator[dict[str, str]]:
        """Rows of ``/select/logsql/tail`` as they come. Never ends normally: when the
        server stops, restarts or cuts the stream this raises VictoriaLogsError (reconnect
        and deduplicate: a new connection replays ``start_offset``). ``close()`` from another
        thread ends it quietly."""
        params = {"query": query, "start_offset": start_offset, "offset": offset,
                  "refresh_interval": refresh_interval}
        resp = self._request("POST", _TAIL_PATH, query, stream=True, read_timeout=self.tail_idle_timeout,
                             retry=False, data=self._params(params), headers={"Accept-Encoding": "identity"})
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
        resp = self._request("POST", _HITS_PATH, query, data=self._params(params))
        try:
            doc = resp.json()
        except ValueError as exc:
            raise _vl_error("VictoriaLogs hits answer is not JSON", query, status=resp.status_code,
                            server_message=resp.text[:300]) from exc
        if not isinstance(doc, dict) or "hits" not in doc:
            raise _vl_error("VictoriaLogs hits answer has no 'hits'", query, status=resp.status_code,
                            server_message=resp.text[:300])
        return doc

    def field_names(self, query: str, start: int | str | datetime | None,
                    end: int | str | datetime | None) -> dict[str, int]:
        """``/select/logsql/field_names``: the fields the rows of ``query`` in ``[start, end]``
        have, with the rows having each (``{"values": [{"value": name, "hits": n}, ...]}``)."""
        return self._names(_FIELD_NAMES_PATH, query, start, end)

    def stream_field_names(self, query: str, start: int | str | datetime | None,
                           end: int | str | datetime | None) -> dict[str, int]:
        """``/select/logsql/stream_field_names``: the stream fields (the labels of ``_stream``)
        of the rows of ``query`` in ``[start, end]``, with the rows having each."""
        return self._names(_STREAM_FIELD_NAMES_PATH, query, start, end)

    def _names(self, path: str, query: str, start: int | str | datetime | None,
               end: int | str | datetime | None) -> dict[str, int]:
        params: dict[str, str] = {"query": query}
        for key, val in (("start", start), ("end", end)):
            text = format_time_param(val)
            if text is not None:
                params[key] = text
        resp = self._request("POST", path, query, data=self._params(params))
        try:
            doc = resp.json()
            return {str(v["value"]): int(v.get("hits", 0)) for v in doc["values"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise _vl_error(f"VictoriaLogs {path.rsplit('/', 1)[-1]} answer is not a list of values", query,
                            status=resp.status_code, server_message=resp.text[:300]) from exc

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


