r"""Site-defined line formats: ``<Date> <Time> <Node> <Level> <Content>`` (the logparser/Drain
convention of named fields in angle brackets), for logs in a layout none of the built-in readers
knows (supercomputer RAS logs, a site's own syslog template, an application's log format).

A template is literal text with fields, compiled into one anchored regex: a field followed by
whitespace is one word (``\S+``), a field followed by other literal text runs up to it
(``<Component>: <Content>``), ``<Content>`` takes the rest of the line; runs of whitespace in
the literal text match any run of whitespace, and every other literal character must be there
as written. The whole file is
matched in one ``str.extract_groups`` pass (vectorised, like the other readers).

Field names (case-insensitive) and where they go in the event schema:

=====================================  =======================================================
``Content`` (also ``Message``, ``Msg``)  the event ``message`` (exactly one is required)
``Date Time Timestamp DateTime Year       the event time: the values of these fields, in the
Month Day``                              template's order, joined by one space, read with
                                         ``time_format``
``Node Host Hostname``                   ``host`` (short name, as Slurm knows it)
``Job JobId``                            ``job_id``
``Rank``                                 ``rank``
``Level Severity Priority``              ``level``, normalised (``sources.levels``: ``FATAL``,
                                         ``SEVERE``, ``err``, ``W``, a syslog number or PRI …);
                                         a value it does not know is null
``Component Process Program Pid``        attributes: validated, not kept (the event schema has
``Thread Tid Type Facility Module``      no column for them); a ``Component``/``Process``/
``Logger Location User NodeRepeat``      ``Program`` of ``kernel`` or a Slurm daemon still sets
                                         the event ``source``
``*``                                    a field to skip (anything, e.g. a label column)
=====================================  =======================================================

``time_format``: a strptime format (chrono syntax, as Polars reads it: ``%Y-%m-%d %H:%M:%S%.f``),
or ``epoch`` / ``epoch_ms`` / ``epoch_us`` / ``epoch_ns`` (numbers since 1970), or ``iso``
(the default: ISO 8601 / RFC 3339, ``T`` or space, optional fraction and zone). A format without
a year (``%b %d %H:%M:%S``) takes the reader's year, as RFC3164 syslog does; one without ``%z``
is read in the reader's time zone.

Lines that do not fit the template: an indented one continues the previous record (tracebacks,
wrapped messages); any other is kept as an event of its own (the whole line is its message, its
time is its neighbour's) and also quarantined as ``format_mismatch`` — counted, never dropped.
A line that fits but whose time does not parse is ``bad_timestamp``, as in every other format.

Config (``--config FILE``), next to ``[engine]``::

    [[line_formats]]
    name = "bgl"                                   # names the format in errors
    pattern = "<*> <*> <Node> <Time> <*> <Type> <Component> <Level> <Content>"
    time_format = "%Y-%m-%d-%H.%M.%S%.f"
    path = "*/bgl/*.log"                           # optional glob; without it every file

The first format whose ``path`` matches a file (glob on the path, or on the file name when the
glob has no ``/``) reads that file; a file no format matches is read as usual.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePath
from typing import Any

import polars as pl

from recovery_logs.config import read_config_toml
from recovery_logs.errors import ConfigError
from recovery_logs.schema import SourceKind
from recovery_logs.sources.formats import (
    SLURM_DAEMONS,
    ParseContext,
    file_source_kind,
    naive_to_utc_ns,
    short_host,
)
from recovery_logs.sources.levels import level_expr
from recovery_logs.timeutil import frac_ns

LINE_FORMAT = "line-format"     # the reader format name of a file read with a site line format

_ROLES: dict[str, str] = {
    **dict.fromkeys(("content", "message", "msg"), "content"),
    **dict.fromkeys(("date", "time", "timestamp", "datetime", "year", "month", "day"), "time"),
    **dict.fromkeys(("node", "host", "hostname"), "host"),
    **dict.fromkeys(("job", "jobid"), "job"),
    "rank": "rank",
    **dict.fromkeys(("component", "process", "program"), "program"),
    **dict.fromkeys(("level", "severity", "priority"), "level"),
    **dict.fromkeys(("pid", "thread", "tid", "type", "facility", "module", "logger", "location", "user",
                     "noderepeat"), "attr"),
    "*": "skip",
}
KNOWN_FIELDS = ("Content", "Message", "Msg", "Date", "Time", "Timestamp", "DateTime", "Year", "Month", "Day",
                "Node", "Host", "Hostname", "Job", "JobId", "Rank", "Component", "Process", "Program", "Pid",
                "Thread", "Tid", "Type", "Facility", "Module", "Logger", "Level", "Severity", "Priority",
                "Location", "User", "NodeRepeat", "*")
_FIELD = re.compile(r"<([^<>]*)>")
EPOCH_FORMATS = {"epoch": 1_000_000_000, "epoch_s": 1_000_000_000, "epoch_ms": 1_000_000,
                 "epoch_us": 1_000, "epoch_ns": 1}
ISO = "iso"
# chrono strptime directives (with the -, _, 0 padding flags); anything else after % is an error
_DIRECTIVE = re.compile(r"%(?:[-_0]?[YCymbBhdeaAwuUWGgVjDxFvHkIlPpMSRTXrZsnt%]|\.?[369]?f|:{0,2}z|#z)")
_HAS_YEAR = re.compile(r"%[-_0]?[YGyCsDFxv]")
_HAS_DATE = re.compile(r"%[-_0]?[mbBhjUWVdeDFxv]")
_HAS_ZONE = re.compile(r"%(?::{0,2}z|#z)")
_CONFIG_KEYS = {"name", "pattern", "time_format", "path"}


@dataclass(frozen=True)
class LineFormat:
    """One compiled site line format (build it with :func:`compile_line_format`)."""

    name: str
    pattern: str
    time_format: str
    path: str | None
    regex: str                                  # Rust regex, anchored; group 1 is the header
    roles: tuple[tuple[int, str, str], ...]     # (struct field of its group, role, field name as written);
                                                # 0 for a message that is the text after the header
    needs_year: bool = False
    zoned: bool = False
    where: str = field(default="--line-format", compare=False)

    def group(self, role: str) -> list[int]:
        return [i for i, r, _ in self.roles if r == role]


def _check_time_format(fmt: str, where: str) -> tuple[bool, bool]:
    """(needs a year, carries a zone) of a strptime format; ConfigError naming ``where`` if bad."""
    if fmt in EPOCH_FORMATS or fmt == ISO:
        return False, fmt == ISO
    if "%" not in fmt:
        raise ConfigError(f"{where}: time format {fmt!r} has no % directive; use a strptime format such as "
                          f"'%Y-%m-%d %H:%M:%S', or one of {', '.join(sorted([ISO, *EPOCH_FORMATS]))}",
                          value=fmt)
    rest = _DIRECTIVE.sub("", fmt)
    if "%" in rest:
        bad = re.search(r"%.?", rest)
        raise ConfigError(f"{where}: time format {fmt!r} has an unknown directive "
                          f"{bad.group(0) if bad else '%'!r}", value=fmt)
    if not _HAS_DATE.search(fmt) and not re.search(r"%[-_0]?s", fmt):
        raise ConfigError(f"{where}: time format {fmt!r} has no date (month/day); a time of day alone cannot "
                          "place a line in time", value=fmt)
    return not _HAS_YEAR.search(fmt), bool(_HAS_ZONE.search(fmt))


def compile_line_format(pattern: str, time_format: str | None = None, *, name: str = "line-format",
                        path: str | None = None, where: str = "--line-format") -> LineFormat:
    """Validate a template and build its regex. ConfigError (naming ``where``) for: no or two
    ``<Content>`` fields, an unknown field name, a time field without a time format that fits,
    a bad time format, a template with no literal between two fields that cannot be told apart."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ConfigError(f"{where}: the line format is empty", value=pattern)
    parts = _FIELD.split(pattern)
    literals, names = parts[0::2], parts[1::2]
    if not names:
        raise ConfigError(f"{where}: the line format has no <Field>; write e.g. '<Date> <Time> <Node> <Content>'",
                          value=pattern)
    if any(c in lit for lit in literals for c in "<>"):
        raise ConfigError(f"{where}: unbalanced '<' or '>' in the line format", value=pattern)
    roles: list[tuple[int, str, str]] = []
    for i, n in enumerate(names):
        role = _ROLES.get(n.strip().lower())
        if role is None:
            raise ConfigError(f"{where}: unknown field <{n}> in the line format", value=pattern,
                              known=", ".join(KNOWN_FIELDS))
        roles.append((i, role, n.strip()))
    content = [r for r in roles if r[1] == "content"]
    if len(content) != 1:
        raise ConfigError(f"{where}: the line format needs exactly one <Content> (the message); it has "
                          f"{len(content)}", value=pattern)
    for i in range(1, len(names)):
        if literals[i] == "":
            raise ConfigError(f"{where}: fields <{names[i - 1]}> and <{names[i]}> have nothing between them; "
                              "put the separator (a space, ':' …) between them", value=pattern)
    has_time = any(r == "time" for _, r, _ in roles)
    tf = time_format if time_format is not None else ISO
    if not isinstance(tf, str) or not tf.strip():
        raise ConfigError(f"{where}: the time format is empty", value=time_format)
    needs_year, zoned = _check_time_format(tf, where)
    if time_format is not None and not has_time:
        raise ConfigError(f"{where}: a time format is given but the line format has no time field "
                          "(<Date>, <Time>, <Timestamp> …)", value=pattern)
    # Only the fields the event needs are captured, and a message at the end is the text after the
    # header: capture groups (a trailing `(.*)` above all) make the regex engine several times slower.
    kept = {"time", "host", "job", "rank", "program", "level"}
    ci = next(i for i, r, _ in roles if r == "content")
    last = ci == len(roles) - 1
    parts = ["^(", _literal(literals[0])]       # group 1 (struct field "1"): the header
    out_roles: list[tuple[int, str, str]] = []
    group = 1
    for i, (_, role, nm) in enumerate(roles):
        nxt = literals[i + 1]
        if role == "content":
            if last:
                out_roles.append((0, role, nm))   # 0: the text after the header
                parts.append(")")
            else:                                 # fields follow the message: it is a group of its own
                group += 1
                out_roles.append((group, role, nm))
                parts.append(")(.*?)")
            parts.append(_literal(nxt))
            continue
        word = r"[^ \t]+" if nxt[:1].isspace() else r"[^ \t].*?"   # one word, or up to the next literal
        if role in kept:
            group += 1
            out_roles.append((group, role, nm))
            parts.append(f"({word})")
        else:
            parts.append(word)
        parts.append(_literal(nxt))
    if not last:
        parts.append(r"[ \t]*$")
    rx = "".join(parts)
    try:
        re.compile(rx)
    except re.error as exc:   # cannot happen for escaped literals; kept as a clear error, not a crash
        raise ConfigError(f"{where}: the line format does not compile ({exc})", value=pattern) from exc
    return LineFormat(name=name, pattern=pattern, time_format=tf, path=path, regex=rx, roles=tuple(out_roles),
                      needs_year=needs_year, zoned=zoned, where=where)


def _literal(text: str) -> str:
    """Literal text of a template: runs of whitespace match runs of blanks, the rest as written."""
    out = []
    for piece in re.split(r"(\s+)", text):
        if not piece:
            continue
        out.append(r"[ \t]+" if piece.isspace() else re.escape(piece))
    return "".join(out)


def load_line_formats(path: str | Path) -> tuple[LineFormat, ...]:
    """``[[line_formats]]`` entries of a TOML config file (none: an empty tuple)."""
    data = read_config_toml(path)
    return line_formats_from_config(data.get("line_formats", []), str(path))


def line_formats_from_config(entries: Any, source: str) -> tuple[LineFormat, ...]:
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: line_formats must be an array of tables ([[line_formats]])")
    out = []
    seen: set[str] = set()
    for k, e in enumerate(entries):
        where = f"{source}: [[line_formats]] #{k + 1}"
        if not isinstance(e, dict):
            raise ConfigError(f"{where} is not a table")
        unknown = sorted(set(e) - _CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown keys", keys=unknown, known=sorted(_CONFIG_KEYS))
        name = e.get("name", f"line_format_{k + 1}")
        where = f"{source}: [[line_formats]] {name!r}"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: name must be a non-empty string")
        if name in seen:
            raise ConfigError(f"{where}: duplicate name")
        seen.add(name)
        if "pattern" not in e:
            raise ConfigError(f"{where}: pattern is missing")
        for key in ("pattern", "time_format", "path"):
            if key in e and not isinstance(e[key], str):
                raise ConfigError(f"{where}: {key} must be a string", value=repr(e[key]))
        out.append(compile_line_format(e["pattern"], e.get("time_format"), name=name, path=e.get("path"),
                                       where=where))
    return tuple(out)


def line_formats_from_cli(line_format: str | None, time_format: str | None,
                          config: str | Path | None, fmt: str = "auto") -> tuple[LineFormat, ...]:
    """``--line-format``/``--time-format`` (every file) first, then the ``--config`` file's
    ``[[line_formats]]``. ConfigError for a time format without a line format, or a line format
    together with an explicit ``--format``."""
    out: list[LineFormat] = []
    if line_format is not None:
        out.append(compile_line_format(line_format, time_format, where="--line-format"))
    elif time_format is not None:
        raise ConfigError("--time-format needs --line-format", value=time_format)
    if config is not None:
        out.extend(load_line_formats(config))
    if out and fmt != "auto":
        raise ConfigError("--format and a line format (--line-format or [[line_formats]]) both say how to read "
                          "the files; give one", format=fmt)
    return tuple(out)


def select_line_format(formats: Sequence[LineFormat], file: str) -> LineFormat | None:
    """The first format whose ``path`` glob matches ``file`` (a format without ``path`` matches all)."""
    if not formats:
        return None
    posix = PurePath(file).as_posix()
    name = PurePath(file).name
    for lf in formats:
        if lf.path is None:
            return lf
        target = posix if "/" in lf.path else name
        if fnmatchcase(target, lf.path) or fnmatchcase(posix, "*/" + lf.path.lstrip("/")):
            return lf
    return None


# --- parsing (vectorised) ------------------------------------------------------------------------
def _time_ns(s: pl.Expr, lf: LineFormat, ctx: ParseContext) -> pl.Expr:
    """The joined time fields -> Int64 ns UTC (null where they do not parse)."""
    tf = lf.time_format
    if tf in EPOCH_FORMATS:
        m = s.str.extract_groups(r"^\s*(-?\d+)(?:\.(\d{1,9}))?\s*$")
        whole = m.struct.field("1").cast(pl.Int64, strict=False)
        unit = EPOCH_FORMATS[tf]
        frac = frac_ns(m.struct.field("2")) // (1_000_000_000 // unit) if unit > 1 else pl.lit(0, pl.Int64)
        return whole * unit + frac
    if tf == ISO:
        v = s.str.strip_chars().str.replace(",", ".")
        zone = v.str.extract(r"(Z|z|[+-]\d{2}:?\d{2})$", 1)
        base = v.str.replace(r"(Z|z|[+-]\d{2}:?\d{2})$", "").str.replace("T", " ")
        naive = base.str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
        zoned = pl.concat_str([base, zone.str.replace("(?i)^z$", "+0000")]).str.strptime(
            pl.Datetime("ns", "UTC"), "%Y-%m-%d %H:%M:%S%.f%z", strict=False)
        return pl.when(zone.is_not_null()).then(zoned.dt.epoch("ns")).otherwise(naive_to_utc_ns(naive, ctx.tz))
    fmt, val = tf, s.str.strip_chars()
    if lf.needs_year:
        fmt, val = "%Y " + tf, pl.concat_str([pl.lit(str(ctx.year)), val], separator=" ")
    if lf.zoned:
        return val.str.strptime(pl.Datetime("ns", "UTC"), fmt, strict=False).dt.epoch("ns")
    dt = val.str.strptime(pl.Datetime("ns"), fmt, strict=False)
    ns = naive_to_utc_ns(dt, ctx.tz)
    if lf.needs_year and ctx.rollover_after_ns is not None:   # a December line in a file written in January
        ns = pl.when(ns > ctx.rollover_after_ns).then(naive_to_utc_ns(dt.dt.offset_by("-1y"), ctx.tz)).otherwise(ns)
    return ns


def parse_line_format(lines: pl.DataFrame, ctx: ParseContext, lf: LineFormat) -> pl.DataFrame:
    """Raw lines (``lineno``, ``text``) -> the parsed-lines frame of ``formats`` plus ``mismatch``."""
    t = pl.col("text")
    df = lines.with_columns(_m=t.str.extract_groups(lf.regex))
    g = lambda i: pl.col("_m").struct.field(str(i))  # noqa: E731
    header = g(1)
    ok = header.is_not_null()
    first = lambda role: pl.coalesce([g(i).str.strip_chars() for i in lf.group(role)]) if lf.group(  # noqa: E731
        role) else pl.lit(None, pl.String)
    time_groups = lf.group("time")
    ts = _time_ns(pl.concat_str([g(i).str.strip_chars() for i in time_groups], separator=" "), lf, ctx) \
        if time_groups else pl.lit(None, pl.Int64)
    (cg,) = lf.group("content")
    msg = t.str.strip_prefix(header) if cg == 0 else g(cg)
    prog = first("program").str.replace(r"\[\d+\]$", "").str.to_lowercase()
    file_kind = file_source_kind(ctx.file) or SourceKind.OTHER.value
    source = (pl.when(prog.eq("kernel") | msg.str.starts_with("NVRM:")).then(pl.lit(SourceKind.KERNEL.value))
              .when(prog.is_in(list(SLURM_DAEMONS))).then(pl.lit(SourceKind.SLURM.value))
              .otherwise(pl.lit(file_kind)))
    blank = t.str.strip_chars() == ""
    indented = t.str.contains(r"^\s")
    df = df.with_columns(
        header=ok,
        has_ts=ok & pl.lit(bool(time_groups)),
        ts=pl.when(ok).then(ts),
        host=pl.when(ok).then(short_host(first("host"))),
        job_id=pl.when(ok).then(first("job")),
        rank=pl.when(ok).then(first("rank").cast(pl.Int32, strict=False)),
        level=pl.when(ok).then(level_expr(first("level"))),
        message=pl.when(ok).then(msg).otherwise(t),
        source=pl.when(ok).then(source).otherwise(pl.lit(file_kind)),
        mismatch=~ok & ~blank & ~indented,
    ).with_columns(
        # a line that fits starts a record; so does a stray line that does not (it is quarantined too)
        header=pl.col("header") | pl.col("mismatch"),
        nvrm=pl.col("message").str.starts_with("NVRM: "),
        body=pl.col("message"),
    )
    cols = ["lineno", "text", "ts", "has_ts", "header", "host", "job_id", "source", "rank", "message",
            "body", "nvrm", "mismatch"]
    return df.select(
        pl.col(cols[0]), pl.col(cols[1]), pl.col("ts").cast(pl.Int64), pl.lit(False).alias("ts_inferred"),
        pl.col("has_ts").cast(pl.Boolean), pl.col("header").cast(pl.Boolean), pl.lit(False).alias("malformed"),
        pl.col("host").cast(pl.String), pl.col("job_id").cast(pl.String), pl.col("source").cast(pl.String),
        pl.col("rank").cast(pl.Int32), pl.lit(None, pl.String).alias("stream_id"), pl.col("message").cast(pl.String),
        pl.col("body").cast(pl.String), pl.col("nvrm"), pl.col("mismatch"), pl.col("level").cast(pl.String))


__all__ = ["KNOWN_FIELDS", "LINE_FORMAT", "LineFormat", "compile_line_format", "line_formats_from_cli",
           "line_formats_from_config", "load_line_formats", "parse_line_format", "select_line_format"]
