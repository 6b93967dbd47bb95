"""Text from logs, paths, node names and users is data: never markup, never terminal control.

Every output boundary goes through one of these:

* ``clean(s)`` — terminal and plain text: every control character except newline and tab
  (C0, DEL, C1 such as the 8-bit CSI ``\\x9b``) and the Unicode bidi overrides are replaced by
  a visible escape (``\\x1b``, ``\\u202e``). ``ESC[2J`` then prints as the six characters
  ``\\x1b[2J``: the operator sees that the log held an escape sequence, the terminal does nothing.
* ``text(s, style)`` — a ``rich.text.Text`` of ``clean(s)``: Rich never parses it as markup, so
  ``[/dev/nvidia3]``, ``[error]`` and ``[/bold]`` are printed as written.
* ``out_console(...)`` — the one way commands build a Rich console: markup, emoji and
  highlighting off (a ``str`` cell of a table is then literal text too); when stdout is not a
  terminal, no ANSI codes and a wide page (``PIPE_WIDTH``; ``--width`` wins), so piped tables are
  not cut to 80 columns.
* ``md_text(s)`` / ``md_code_block(lines)`` — Markdown: HTML-escaped (``<script>`` is shown,
  not run, by any renderer), table pipes escaped; code fences longer than any backtick run
  inside, so a log line cannot close the fence.
* ``json_dumps(obj)`` — JSON stays JSON: ``json.dumps`` escapes C0 controls already; this also
  escapes C1 controls and bidi overrides (``\\u009b``), which ``ensure_ascii=False`` leaves raw.

HTML pages escape with ``html.escape`` (the report) or Jinja2 autoescape (the web console), on
top of ``clean``.
"""

from __future__ import annotations

import html
import json
import re
import sys
from typing import IO, Any

from rich.console import Console
from rich.text import Text

__all__ = ["PIPE_WIDTH", "SafeConsole", "clean", "json_dumps", "md_code_block", "md_text", "out_console", "text"]

# C0 controls but \t and \n, DEL, C1, and the bidi embedding/override/isolate characters
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
PIPE_WIDTH = 200
"""Page width when stdout is not a terminal and ``--width`` is not given."""


def _esc(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(s: object) -> str:
    """``str(s)`` with every control character (but ``\\n``, ``\\t``) shown as an escape."""
    t = "" if s is None else str(s)
    return _UNSAFE.sub(_esc, t) if _UNSAFE.search(t) else t


def text(s: object, style: str = "") -> Text:
    """Literal rich text: no markup, no control characters."""
    return Text(clean(s), style=style)


def _json_esc(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group(0)):04x}"


def json_dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False)`` with C1 controls and bidi overrides escaped too."""
    kw.setdefault("ensure_ascii", False)
    s = json.dumps(obj, **kw)
    return _UNSAFE_JSON.sub(_json_esc, s)


def md_text(s: object) -> str:
    """Markdown inline text (table cells, headings): no HTML, no table break, no controls."""
    t = html.escape(clean(s), quote=False).replace("|", "\\|").replace("`", "\\`")
    return t.replace("\n", " ")


def md_code_block(lines: list[str], info: str = "") -> list[str]:
    """A fenced code block whose fence no line can close (CommonMark: a longer backtick run)."""
    body = [clean(ln) for ln in lines]
    longest = max((len(r) for ln in body for r in re.findall("`+", ln)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *body, fence]


class SafeConsole(Console):
    """A console whose plain ``str`` renderables (table cells, ``print("...")``) are literal text
    with control characters escaped; markup is off unless a caller passes ``markup=True`` for its
    own constant strings."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("markup", False)
        kw.setdefault("emoji", False)
        kw.setdefault("highlight", False)
        super().__init__(*args, **kw)

    def render_str(self, text: str, **kw: Any) -> Text:
        return super().render_str(clean(text), **kw)


def out_console(width: int | None = None, *, stderr: bool = False, file: IO[str] | None = None,
                markup: bool = False) -> Console:
    """A Rich console for command output: literal text, plain when not a terminal, wide when piped.
    ``markup=True`` only for callers that ``rich.markup.escape`` every value they print."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    if width is None and not is_tty:   # $COLUMNS describes a terminal, not this pipe: ignored here
        width = PIPE_WIDTH
    return SafeConsole(file=stream, width=width, force_terminal=None if is_tty else False,
                       no_color=None if is_tty else True, soft_wrap=False, markup=markup)
