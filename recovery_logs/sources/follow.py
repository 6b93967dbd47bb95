"""``tail -F`` of files: :class:`FileFollower`.

``poll()`` returns the bytes appended to each followed file since the last call, only whole
lines. New files matching a glob are picked up; a rotated file (new inode at the path) is read
to its end, then the new file from 0; a truncated file is read again from 0. Offsets are
persisted (by the watch cursor) so a restart resumes where it stopped. Inputs that cannot be
read are reported once through ``take_problems`` while the others keep being read (see the
class docstring: missing paths, empty globs, unreadable files, directories, FIFOs, ``.gz``).
"""

from __future__ import annotations

import glob as _glob
import os
import stat
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FileFollower"]


@dataclass
class _Followed:
    path: str
    fh: Any
    dev: int
    ino: int
    offset: int                      # bytes of the (decompressed) stream consumed so far
    partial: bytes = b""
    kind: str = "file"               # file | fifo | gz
    gz: Any = None                   # zlib decompressobj while reading a .gz
    gz_raw: int = 0                  # compressed bytes read
    done: bool = False               # a .gz read to its end (it is never appended to)


_GZ_MAGIC = b"\x1f\x8b"


class FileFollower:
    """``tail -F`` over paths and globs; only whole lines are returned.

    Every input is either read or reported once (``take_problems``), and one bad input never
    stops the others: a path that does not exist (yet), a glob that matches nothing, a file that
    cannot be opened (permissions, a symlink loop), a directory or device. A FIFO is read without
    blocking (``O_NONBLOCK``), so ``--for`` and the other sources keep running while it has no
    writer. A ``.gz`` file (gzip magic) is a finished, rotated log: it is decompressed and read
    once, in bounded steps; a truncated one yields its readable part and is reported.
    """

    def __init__(self, patterns: Sequence[str], offsets: dict[str, dict[str, int]] | None = None,
                 from_start: bool = True, read_max: int = 8 << 20) -> None:
        self.patterns = list(patterns)
        self.offsets = offsets if offsets is not None else {}
        self.from_start = from_start
        self.read_max = read_max
        self.files: dict[str, _Followed] = {}
        self.stats: Counter[str] = Counter()
        self.problems: dict[str, str] = {}        # path or pattern -> what is wrong with it now
        self._told: dict[str, str] = {}           # what was already reported
        self.more: set[str] = set()               # paths that had more data than one read returned

    # -- problems -------------------------------------------------------------------------
    def _problem(self, key: str, msg: str) -> None:
        self.problems[key] = msg

    def take_problems(self) -> list[tuple[str, str]]:
        """Problems not reported yet (each once; again only after it cleared and came back)."""
        out = [(k, m) for k, m in self.problems.items() if self._told.get(k) != m]
        for k, m in out:
            self._told[k] = m
            self.stats["problems"] += 1
        for k in [k for k in self._told if k not in self.problems]:
            del self._told[k]
        return out

    def _expand(self) -> list[str]:
        out: list[str] = []
        for pat in self.patterns:
            if _glob.has_magic(pat):
                hits = sorted(_glob.glob(pat, recursive=True))
                if not hits:
                    self._problem(pat, "no file matches this pattern (yet)")
                else:
                    self.problems.pop(pat, None)
            else:
                hits = [pat]
            out.extend(h for h in hits if h not in out)
        return out

    def _open(self, path: str, resume: bool) -> _Followed | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if path in self.patterns:
                self._problem(path, "no such file (waiting for it to appear)")
            return None
        except OSError as exc:
            self._problem(path, f"cannot open: {exc.strerror or exc}")
            return None
        if stat.S_ISDIR(st.st_mode):
            self._problem(path, "is a directory; give a glob such as DIR/*.log")
            return None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            self._problem(path, "not a regular file or FIFO; not read")
            return None
        try:
            if stat.S_ISFIFO(st.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self.problems.pop(path, None)
                return _Followed(path, fd, st.st_dev, st.st_ino, 0, kind="fifo")
            fh = open(path, "rb")  # noqa: SIM115 - kept open while followed
        except OSError as exc:
            self._problem(path, f"cannot open: {exc.strerror or exc}")
            return None
        self.problems.pop(path, None)
        st = os.fstat(fh.fileno())
        magic = fh.read(2)
        fh.seek(0)
        saved = self.offsets.get(path) or {}
        same = bool(saved) and saved.get("dev") == st.st_dev and saved.get("ino") == st.st_ino
        if magic == _GZ_MAGIC:
            f = _Followed(path, fh, st.st_dev, st.st_ino, 0, kind="gz", gz=zlib.decompressobj(wbits=31))
            if resume and same and saved.get("gz") and saved.get("done") and saved.get("size") == st.st_size:
                f.done = True        # read to its end before the restart
            return f
        off = 0
        if resume and same and 0 <= int(saved.get("offset", 0)) <= st.st_size:
            off = int(saved["offset"])
        elif resume and not self.from_start:
            off = st.st_size
        fh.seek(off)
        return _Followed(path, fh, st.st_dev, st.st_ino, off)

    def _raw(self, f: _Followed) -> bytes:
        if f.kind == "fifo":
            chunks, left = [], self.read_max
            while left > 0:
                try:
                    b = os.read(f.fh, min(left, 1 << 20))
                except BlockingIOError:
                    break
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
            data = b"".join(chunks)
            if left <= 0:
                self.more.add(f.path)
            return data
        if f.kind == "gz":
            return self._gunzip(f)
        data = f.fh.read(self.read_max)
        if len(data) == self.read_max:
            self.more.add(f.path)
        return data

    def _gunzip(self, f: _Followed) -> bytes:
        """Up to ``read_max`` decompressed bytes (memory stays bounded whatever the ratio)."""
        if f.done:
            return b""
        out: list[bytes] = []
        room = self.read_max
        while room > 0:
            if f.gz is not None and f.gz.unconsumed_tail:
                raw = f.gz.unconsumed_tail
            else:
                raw = f.fh.read(1 << 20)
                f.gz_raw += len(raw)
                if not raw:
                    if f.gz is not None:          # inside a member: the stream was cut
                        self._problem(f.path, f"truncated gzip: the stream ends after {f.gz_raw} compressed bytes; "
                                              f"the readable part ({f.offset + sum(map(len, out))} bytes) was read")
                        self.stats["gz_truncated"] += 1
                    f.done = True
                    break
                if f.gz is None:                      # the next member of a multi-member gzip
                    if raw[:2] != _GZ_MAGIC:
                        f.done = True
                        break
                    f.gz = zlib.decompressobj(wbits=31)
            try:
                got = f.gz.decompress(raw, room)
            except zlib.error as exc:
                self._problem(f.path, f"corrupt gzip after {f.gz_raw} compressed bytes ({exc}); the readable "
                                      "part was read")
                self.stats["gz_corrupt"] += 1
                f.done = True
                break
            out.append(got)
            room -= len(got)
            if f.gz.eof:   # a member ended; what follows it (if anything) is read again as raw
                rest = f.gz.unused_data
                f.gz = None
                if rest:
                    f.fh.seek(f.fh.tell() - len(rest))
                    f.gz_raw -= len(rest)
        if room <= 0:
            self.more.add(f.path)
        return b"".join(out)

    def _read(self, f: _Followed) -> bytes:
        data = self._raw(f)
        if f.kind == "gz" and f.done and f.partial and not data:
            data = b"\n"                    # the stream ended: its last line is whole now
        if not data:
            return b""
        f.offset += len(data)
        buf = f.partial + data
        cut = buf.rfind(b"\n") + 1
        f.partial = buf[cut:]
        if f.kind == "file":
            self.offsets[f.path] = {"dev": f.dev, "ino": f.ino, "offset": f.offset - len(f.partial)}
        elif f.kind == "gz" and f.done:
            self.offsets[f.path] = {"dev": f.dev, "ino": f.ino, "gz": 1, "done": 1,
                                    "size": os.fstat(f.fh.fileno()).st_size}
        self.stats["bytes"] += cut
        return buf[:cut]

    def start_of(self, path: str) -> int:
        """Byte offset (in the stream) where the next data ``poll`` returns for ``path`` begins."""
        f = self.files.get(path)
        return 0 if f is None else f.offset - len(f.partial)

    def poll(self) -> list[tuple[str, bytes, bool]]:
        """``(path, whole lines, restarted)`` per file with new data; ``restarted`` is True when
        the file was rotated or truncated (a new parser should start)."""
        return [(p, d, r) for p, d, r, _ in self.poll_at()]

    def poll_at(self) -> list[tuple[str, bytes, bool, int]]:
        """As ``poll``, with the byte offset (in the stream) where each chunk begins."""
        out: list[tuple[str, bytes, bool, int]] = []
        self.more = set()
        for path in self._expand():
            try:
                out.extend(self._poll_one(path))
            except OSError as exc:           # one bad file never stops the others
                self._problem(path, f"read failed: {exc.strerror or exc}")
                f = self.files.pop(path, None)
                if f is not None:
                    self._close(f)
        return out

    def _poll_one(self, path: str) -> list[tuple[str, bytes, bool, int]]:
        out: list[tuple[str, bytes, bool, int]] = []
        f = self.files.get(path)
        if f is None:
            f = self._open(path, resume=True)
            if f is None:
                return out
            self.files[path] = f
            restarted = True
        else:
            restarted = False
        if f.kind == "file":
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_ino != f.ino or st.st_dev != f.dev):
                start = f.offset - len(f.partial)
                tail = self._read(f) + f.partial       # rotated: finish the old file first
                if tail:
                    out.append((path, tail if tail.endswith(b"\n") else tail + b"\n", restarted, start))
                self._close(f)
                self.stats["rotations"] += 1
                nf = self._open(path, resume=False)
                if nf is None:
                    del self.files[path]
                    return out
                f = self.files[path] = nf
                restarted = True
            elif st is not None and st.st_size < f.offset:
                self.stats["truncations"] += 1
                f.fh.seek(0)
                f.offset, f.partial = 0, b""
                restarted = True
        start = f.offset - len(f.partial)
        data = self._read(f)
        if data or restarted:
            out.append((path, data, restarted, start))
        return out

    @staticmethod
    def _close(f: _Followed) -> None:
        if f.kind == "fifo":
            os.close(f.fh)
        else:
            f.fh.close()

    def close(self) -> None:
        for f in self.files.values():
            self._close(f)
        self.files.clear()
