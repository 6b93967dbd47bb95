"""``tail -F`` of files: :class:`FileFollower`.

``poll()`` returns the bytes appended to each followed file since the last call, only whole
lines. New files matching a glob are picked up; a rotated file (new inode at the path) is read
to its end, then the new file from 0; a truncated file is read again from 0. Offsets are
persisted (by the watch cursor) so a restart resumes where it stopped.
"""

from __future__ import annotations

import glob as _glob
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recovery_logs.errors import InputError

__all__ = ["FileFollower"]


@dataclass
class _Followed:
    path: str
    fh: Any
    dev: int
    ino: int
    offset: int
    partial: bytes = b""


class FileFollower:
    """``tail -F`` over paths and globs; only whole lines are returned."""

    def __init__(self, patterns: Sequence[str], offsets: dict[str, dict[str, int]] | None = None,
                 from_start: bool = True, read_max: int = 8 << 20) -> None:
        self.patterns = list(patterns)
        self.offsets = offsets if offsets is not None else {}
        self.from_start = from_start
        self.read_max = read_max
        self.files: dict[str, _Followed] = {}
        self.stats: Counter[str] = Counter()

    def _expand(self) -> list[str]:
        out: list[str] = []
        for pat in self.patterns:
            hits = sorted(_glob.glob(pat)) if _glob.has_magic(pat) else [pat]
            out.extend(h for h in hits if h not in out)
        return out

    def _open(self, path: str, resume: bool) -> _Followed | None:
        try:
            fh = open(path, "rb")  # noqa: SIM115 - kept open while followed
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"cannot open followed file: {exc}", path=path) from exc
        st = os.fstat(fh.fileno())
        off = 0
        saved = self.offsets.get(path)
        if resume and saved and saved.get("dev") == st.st_dev and saved.get("ino") == st.st_ino \
                and saved.get("offset", 0) <= st.st_size:
            off = int(saved["offset"])
        elif resume and not self.from_start:
            off = st.st_size
        fh.seek(off)
        return _Followed(path, fh, st.st_dev, st.st_ino, off)

    def _read(self, f: _Followed) -> bytes:
        data = f.fh.read(self.read_max)
        if not data:
            return b""
        f.offset += len(data)
        buf = f.partial + data
        cut = buf.rfind(b"\n") + 1
        f.partial = buf[cut:]
        self.offsets[f.path] = {"dev": f.dev, "ino": f.ino, "offset": f.offset - len(f.partial)}
        self.stats["bytes"] += cut
        return buf[:cut]

    def poll(self) -> list[tuple[str, bytes, bool]]:
        """``(path, whole lines, restarted)`` per file with new data; ``restarted`` is True when
        the file was rotated or truncated (a new parser should start)."""
        out: list[tuple[str, bytes, bool]] = []
        for path in self._expand():
            f = self.files.get(path)
            if f is None:
                f = self._open(path, resume=True)
                if f is None:
                    continue
                self.files[path] = f
                restarted = True
            else:
                restarted = False
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_ino != f.ino or st.st_dev != f.dev):
                tail = self._read(f) + f.partial       # rotated: finish the old file first
                if tail:
                    out.append((path, tail if tail.endswith(b"\n") else tail + b"\n", restarted))
                f.fh.close()
                self.stats["rotations"] += 1
                nf = self._open(path, resume=False)
                if nf is None:
                    del self.files[path]
                    continue
                f = self.files[path] = nf
                restarted = True
            elif st is not None and st.st_size < f.offset:
                self.stats["truncations"] += 1
                f.fh.seek(0)
                f.offset, f.partial = 0, b""
                restarted = True
            data = self._read(f)
            if data or restarted:
                out.append((path, data, restarted))
        return out

    def close(self) -> None:
        for f in self.files.values():
            f.fh.close()
        self.files.clear()
