"""The persisted watch cursor: JSON in ``--state-dir``, written atomically (tmp + rename).

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
            raise InputError(f"watch cursor is unreadable: {exc}", path=str(path)) from exc
        return cls(path, doc.get("complete_ns"), doc.get("files", {}), doc.get("reported", {}))

    def save(self) -> None:
        if self.path is None:
            return
        if len(self.reported) > self.max_reported:   # bounded: keep the most recently seen
            keep = sorted(self.reported.items(), key=lambda kv: kv[1].get("last_seen", 0))[-self.max_reported:]
            self.reported = dict(keep)
        doc = {"version": 1, "complete_ns": self.complete_ns, "files": self.files, "reported": self.reported}
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ConfigError(f"watch cursor cannot be written: {exc}", path=str(self.path)) from exc


def cursor_name(sources: Sequence[str], query: str | None) -> str:
    return hashlib.sha256(json.dumps([sorted(sources), query or ""]).encode()).hexdigest()[:16]
