"""The persisted watch cursor: JSON in ``--state-dir``, written ahead atomically (tmp, fsync,
rename, directory fsync); a damaged cursor is an error naming the file and the field.

It holds the VictoriaLogs resume point (``complete_ns``), file offsets (only of fully parsed
data) and the incidents already reported (id -> last printed version), so a restart never
re-reports them. ``cursor_name`` names the file after the sources and query.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery_logs.errors import ConfigError, InputError

__all__ = ["WatchCursor", "cursor_name"]


@dataclass
class WatchCursor:
    """Persisted watch state: the VictoriaLogs resume point, file offsets, and the incidents
    already reported (id -> last printed version) so a restart never re-reports them."""

    path: Path | None
    complete_ns: int | None = None
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_reported: int = 20_000
    _written: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, state_dir: Path | None, name: str) -> WatchCursor:
        if state_dir is None:
            return cls(None)
        try:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"state directory cannot be created: {exc}", path=str(state_dir)) from exc
        path = Path(state_dir) / f"watch-{name}.json"
        if not path.exists():
            return cls(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"watch cursor is unreadable: {exc}; remove it to read every source again from "
                             "its start", path=str(path)) from exc
        complete, files, reported = _check_cursor(doc, path)
        return cls(path, complete, files, reported)

    def save(self) -> None:
        """Write-ahead: the new cursor is written to a temporary file, fsynced, renamed over the
        old one and the directory fsynced, so a crash leaves either the old or the new cursor."""
        if self.path is None:
            return
        if len(self.reported) > self.max_reported:   # bounded: keep the most recently seen
            keep = sorted(self.reported.items(), key=lambda kv: kv[1].get("last_seen", 0))[-self.max_reported:]
            self.reported = dict(keep)
        doc = {"version": 1, "complete_ns": self.complete_ns, "files": self.files, "reported": self.reported}
        text = json.dumps(doc, sort_keys=True)
        if text == self._written:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise ConfigError(f"watch cursor cannot be written: {exc}", path=str(self.path)) from exc
        self._written = text


def _check_cursor(doc: Any, path: Path) -> tuple[int | None, dict[str, dict[str, int]], dict[str, dict[str, Any]]]:
    """Validate a cursor document; InputError naming the file and the bad field otherwise."""
    def bad(what: str) -> InputError:
        return InputError(f"watch cursor is corrupt: {what}; remove it to read every source again from its start",
                          path=str(path))

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not isinstance(doc, dict):
        raise bad(f"expected a JSON object, found {type(doc).__name__}")
    complete = doc.get("complete_ns")
    if complete is not None and not is_int(complete):
        raise bad("complete_ns is not an integer")
    files = doc.get("files", {})
    if not isinstance(files, dict):
        raise bad("files is not an object")
    for name, f in files.items():
        if not isinstance(f, dict):
            raise bad(f"files[{name!r}] is not an object")
        for k in ("dev", "ino", "offset", "line", "size"):
            if k in f and (not is_int(f[k]) or f[k] < 0):
                raise bad(f"files[{name!r}].{k} is {f[k]!r} (a non-negative integer is required)")
    reported = doc.get("reported", {})
    if not isinstance(reported, dict) or not all(isinstance(v, dict) for v in reported.values()):
        raise bad("reported is not an object of objects")
    return complete, files, reported


def cursor_name(sources: Sequence[str], query: str | None) -> str:
    return hashlib.sha256(json.dumps([sorted(sources), query or ""]).encode()).hexdigest()[:16]
