"""LogsQL subset and time helpers of the test VictoriaLogs server (see vlserver.py).

Time: RFC3339 ``_time`` with up to 9 fraction digits <-> integer ns, trailing zeros trimmed
the way v1.26.0 prints them; durations (``5s``, ``1ms``); ``start``/``end`` parameters.
LogsQL: ``*``, words, ``"phrases"``, ``field:value``, ``field:~"regexp"``, ``field:="exact"``,
``{stream="filter"}``, ``and``/``or``/``not``/``!``, parentheses; pipes ``sort by (_time
[desc])``, ``fields a, b``, ``limit N``. Anything else is a QueryError (answered with 400).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from typing import Any


# --------------------------------------------------------------------------- time
def parse_time_ns(text: str) -> int:
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z", text)
    if not m:
        raise ValueError(text)
    sec = calendar.timegm(tuple(int(x) for x in m.groups()[:6]) + (0, 0, 0))
    return sec * 1_000_000_000 + int((m.group(7) or "0").ljust(9, "0"))


def format_time_ns(ns: int) -> str:
    sec, frac = divmod(ns, 1_000_000_000)
    t = time.gmtime(sec)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", t)
    return base + ("." + f"{frac:09d}".rstrip("0") if frac else "") + "Z"


_DUR = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_DUR_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9,
           "w": 7 * 86400 * 10**9, "y": 365 * 86400 * 10**9}


def parse_duration_ns(text: str) -> int:
    if text in ("0", ""):
        return 0
    pos, total = 0, 0
    for m in _DUR.finditer(text):
        if m.start() != pos:
            raise ValueError(text)
        total += int(float(m.group(1)) * _DUR_NS[m.group(2)])
        pos = m.end()
    if pos != len(text):
        raise ValueError(text)
    return total


def parse_param_time(text: str, now_ns: int) -> int:
    try:
        return parse_time_ns(text)
    except ValueError:
        pass
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    return now_ns - parse_duration_ns(text)


# --------------------------------------------------------------------------- LogsQL subset
class QueryError(ValueError):
    pass


_TOKEN = re.compile(r'\s*(?:(?P<q>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<p>[(){}|,!=~:\[\]])|(?P<w>[^\s(){}|,!=~:"`\[\]]+))')


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise QueryError(f"unexpected character at {text[pos:pos + 10]!r}")
        kind = m.lastgroup
        val = m.group(kind)
        if kind == "q":
            val = json.loads(val) if val.startswith('"') else val[1:-1]
        out.append((kind, val))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, toks: list[tuple[str, str]]):
        self.t, self.i = toks, 0

    def peek(self) -> tuple[str, str] | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise QueryError("unexpected end of query")
        self.i += 1
        return tok

    def expect(self, val: str) -> None:
        tok = self.take()
        if tok[1] != val:
            raise QueryError(f"expected {val!r}, got {tok[1]!r}")

    # a chain of terms is one flat any()/all() (the rule packs' prefilter is a thousand-term OR: nested
    # closures, one per term, ran past Python's recursion limit)
    def parse_or(self):
        terms = [self.parse_and()]
        while self.peek() and self.peek()[0] == "w" and self.peek()[1].lower() == "or":
            self.take()
            terms.append(self.parse_and())
        if len(terms) == 1:
            return terms[0]
        return lambda r: any(t(r) for t in terms)

    def parse_and(self):
        terms = [self.parse_unary()]
        while True:
            tok = self.peek()
            if tok is None or tok[1] in (")", "|") or (tok[0] == "w" and tok[1].lower() == "or"):
                return terms[0] if len(terms) == 1 else (lambda r: all(t(r) for t in terms))
            if tok[0] == "w" and tok[1].lower() == "and":
                self.take()
            terms.append(self.parse_unary())

    def parse_unary(self):
        tok = self.peek()
        if tok is None:
            raise QueryError("missing query")
        if tok[1] in ("!",) or (tok[0] == "w" and tok[1].lower() == "not"):
            self.take()
            inner = self.parse_unary()
            return lambda r: not inner(r)
        if tok[1] == "(":
            self.take()
            inner = self.parse_or()
            self.expect(")")
            return inner
        if tok[1] == "{":
            return self.parse_stream()
        return self.parse_term()

    def parse_stream(self):
        self.expect("{")
        conds = []
        while self.peek() and self.peek()[1] != "}":
            name = self.take()[1]
            self.expect("=")
            val = self.take()[1]
            conds.append((name, val))
            if self.peek() and self.peek()[1] == ",":
                self.take()
        self.expect("}")
        return lambda r: all(r.fields.get(k) == v for k, v in conds)

    def parse_term(self):
        kind, val = self.take()
        fname = "_msg"
        if kind == "w" and self.peek() and self.peek()[1] == ":":
            self.take()
            fname = val
            kind, val = self.take()
        if val == "*" and kind == "w":
            return lambda r: True
        if val == "~" and kind == "p":
            rx = re.compile(self.take()[1])
            return lambda r: rx.search(r.get(fname)) is not None
        if val == "=" and kind == "p":
            exact = self.take()[1]
            return lambda r: r.get(fname) == exact
        if kind == "p":
            raise QueryError(f"unexpected {val!r}")
        if fname == "_time":
            raise QueryError("_time filters are not supported by the test server; use start/end")
        if kind == "w" and val.endswith("*"):
            prefix = re.compile(r"(?<!\w)" + re.escape(val[:-1]))
            return lambda r: prefix.search(r.get(fname)) is not None
        word = re.compile(r"(?<!\w)" + re.escape(val) + r"(?!\w)")
        return lambda r: word.search(r.get(fname)) is not None


@dataclass
class Query:
    text: str
    match: Any
    sort_desc: bool | None = None
    fields: list[str] | None = None
    limit: int | None = None
    tail_forbidden: bool = False
    stats_step_ns: int | None = None     # `| stats by (_time:STEP) count() as NAME` (-1: `| stats count() as NAME`)
    stats_name: str = ""


def parse_query(text: str) -> Query:
    if not text.strip():
        raise QueryError("missing query")
    toks = _tokens(text)
    segs: list[list[tuple[str, str]]] = [[]]
    for tok in toks:
        if tok == ("p", "|"):
            segs.append([])
        else:
            segs[-1].append(tok)
    p = _Parser(segs[0])
    match = p.parse_or()
    if p.peek() is not None:
        raise QueryError(f"unexpected {p.peek()[1]!r}")
    q = Query(" ".join(f"{k}:{v}" for k, v in segs[0]), match)   # key of the filter part (match cache)
    for seg in segs[1:]:
        words = [v for _, v in seg]
        if not words:
            raise QueryError("missing pipe")
        if words[0] == "sort" and words[1:3] == ["by", "("]:
            if words[3] != "_time":
                raise QueryError("the test server sorts by _time only")
            q.sort_desc = "desc" in words[4:]
            q.tail_forbidden = True
        elif words[0] == "fields":
            q.fields = [w for w in words[1:] if w != ","]
        elif words[0] in ("limit", "head"):
            q.limit = int(words[1])
            q.tail_forbidden = True
        elif words[0] == "stats" and words[1:5] == ["by", "(", "_time", ":"] and words[6:11] == [
                ")", "count", "(", ")", "as"] and len(words) == 12:
            q.stats_step_ns = parse_duration_ns(words[5])
            q.stats_name = words[11]
            q.tail_forbidden = True
        elif words[0] == "stats" and words[1:4] == ["count", "(", ")"] and words[4:5] == ["as"] and len(words) == 6:
            q.stats_step_ns = -1            # one total
            q.stats_name = words[5]
            q.tail_forbidden = True
        elif words[0] == "stats":
            raise QueryError("the test server runs only `stats [by (_time:STEP)] count() as NAME`")
        else:
            raise QueryError(f"cannot parse {words[0]!r} pipe")
    return q


