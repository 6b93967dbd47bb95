"""A plain command line of one command, read without typer (the CLI's direct dispatch, issue 16).

Reads the part of click's syntax such a command line uses: long options ``--name VALUE`` and
``--name=VALUE``, flags, positional arguments anywhere among them. Anything else (``-h``,
``--help``, ``--``, ``-``, a short or unknown option, an option given twice, a value missing, empty
or starting with ``-``, an int that is not plain digits, a NUL) gives None, and the CLI hands the
command line to typer, which prints the help or the usage error and exit code it always has. What
:func:`parse` returns is what typer passes to the command for the same line; a test checks it on
generated command lines.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["parse"]

_INT = re.compile(r"(?:0|[1-9][0-9]{0,17})\Z")   # what Pydantic's int reads the same on any version


def _value(kind: str, text: str) -> Any:
    if kind == "int":
        return int(text) if _INT.match(text) else None
    if kind == "path":
        return Path(text)
    return text       # "str", "strs"


def parse(args: list[str], options: dict[str, tuple[str, str]], argument: tuple[str, str]) -> dict[str, Any] | None:
    """The parameters given on ``args`` (the command's own arguments), by name; or None.

    ``options``: option -> (parameter, kind), kinds ``str``, ``int``, ``path``, ``strs`` (repeatable,
    a list), ``on``/``off`` (a flag setting True/False). ``argument``: (parameter, ``paths``: any
    number of paths, a list, absent when none) or (parameter, ``str``: at most one). A parameter not
    on the line is absent: the command's default applies."""
    kw: dict[str, Any] = {}
    pos: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a or "\0" in a:
            return None
        if not a.startswith("-"):
            pos.append(a)
            continue
        opt, eq, text = a.partition("=")
        spec = options.get(opt)
        if spec is None:
            return None
        name, kind = spec
        if kind in ("on", "off"):
            if eq:
                return None
            value: Any = kind == "on"
        else:
            if not eq:
                if i >= len(args):
                    return None
                text = args[i]
                i += 1
            if not text or text.startswith("-") or "\0" in text:
                return None
            value = _value(kind, text)
            if value is None:
                return None
        if kind == "strs":
            kw.setdefault(name, []).append(value)
            continue
        if name in kw:
            return None
        kw[name] = value
    name, kind = argument
    if kind == "paths":
        if pos:
            kw[name] = [Path(p) for p in pos]
    elif len(pos) > 1:
        return None
    elif pos:
        kw[name] = pos[0]
    return kw
