"""An exclusive, self-describing lock on a state dir (or one scope inside it).

``StateLock(state_dir, scope="watch").acquire()`` takes ``flock(LOCK_EX | LOCK_NB)`` on
``<state_dir>/<scope>.lock`` and writes who holds it (pid, host, start time, command line) into
the file. A second holder gets ``StateLocked`` (a ``ConfigError``, exit 2) naming the holder, at
once, instead of running beside it. The kernel drops the lock when the holder dies (``kill -9``
included), so a stale file never blocks a restart: its content is only a description.

Scopes let several watchers share one state dir when each owns a different part (a scoped
VictoriaLogs watcher can lock ``watch-<cursor name>``); one scope has one holder.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from recovery_logs.errors import ConfigError

__all__ = ["StateLock", "StateLocked"]


class StateLocked(ConfigError):
    """Another live process holds the lock (``holder`` says who)."""


class StateLock:
    def __init__(self, state_dir: Path | str, scope: str = "watch") -> None:
        if not scope or "/" in scope or scope.startswith("."):
            raise ConfigError("state lock: scope must be a plain name", value=scope)
        self.path = Path(state_dir) / f"{scope}.lock"
        self.scope = scope
        self._fd: int | None = None

    def holder(self) -> dict[str, Any]:
        """What the lock file says about its holder ({} if unreadable)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> StateLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"state lock: cannot open {self.path}: {exc.strerror or exc}", path=str(self.path)) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            h = self.holder()
            who = (f"pid {h.get('pid')} on {h.get('host')} since {h.get('since')} ({h.get('command')})"
                   if h else "another process")
            raise StateLocked(f"state dir is in use: {self.scope} is held by {who}; stop it first or use "
                              "another --state-dir", path=str(self.path), holder=h.get("pid")) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": " ".join(sys.argv)[:300], "scope": self.scope}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
