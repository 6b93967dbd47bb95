"""Which literals a line must contain for the engine to need it, and how to ask a server for them.

The matcher (:mod:`recovery_logs.detectors.rules`) only tries a literal-carrying rule on a
message that contains one of the rule's literals (case-sensitive substrings; ``rules check``
proves each rule's examples contain one). So a line that contains none of the
:func:`needed_literals` of a pack cannot produce a finding, and any reader may drop it before
parsing — a local raw-line prefilter for files, or a server-side filter (LogsQL) for
VictoriaLogs. Both must derive the literals here, so they drop exactly the same lines.

API:

* :func:`needed_literals` — the minimal set of substrings (``None`` when some rule has no
  literal: then every line is needed).
* :func:`logsql_literal` / :func:`logsql_any` — a LogsQL filter that keeps every line with the
  literal (with any of them). A bare substring filter is ``_msg:~"<escaped>"`` (a regexp of the
  escaped literal: exact substring semantics). Where the literal has a *word-bounded core* (see
  :func:`phrase_core`) the phrase filter of the core is AND-ed in front: it is implied by the
  substring, so the result is the same set of lines, and the server can answer it from its
  per-word bloom filters instead of scanning every message with the regexp.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from recovery_logs.detectors.rulepack import RulePack

__all__ = ["logsql_any", "logsql_literal", "logsql_string", "needed_literals", "phrase_core", "word_char"]


def needed_literals(pack: RulePack, extra: Iterable[str] = ()) -> tuple[str, ...] | None:
    """Substrings one of which every line a non-suppress rule can match contains (plus ``extra``:
    other consumers' needs, e.g. enrichment), minimal (a literal containing another is dropped),
    sorted. ``None``: a rule without literals exists, so no line can be dropped. Suppress-only
    (benign) rules never make a line needed (``winners(prune_benign=True)`` drops such lines).
    (:meth:`RulePack.needed_literals`: the LogsQL prefilter is built from the same set.)"""
    return pack.needed_literals(extra)


def word_char(c: str) -> bool:
    """A character VictoriaLogs counts as part of a word (token): letters, digits, underscore
    (``lib/logstorage`` tokenizer: ``unicode.IsLetter || unicode.IsDigit || c == '_'``)."""
    return c == "_" or c.isalnum()


def phrase_core(lit: str) -> str | None:
    """The part of ``lit`` that, wherever ``lit`` occurs, occurs at word boundaries on both sides.

    A VictoriaLogs phrase filter ``"p"`` matches a message containing ``p`` where the character
    before ``p`` is not a word character if ``p`` starts with one, and likewise after (measured
    on the real v1.26.0: ``"VRM: Xi"`` does not match ``NVRM: Xid``, ``": Xid"`` does). A literal
    may be glued to neighbouring word characters in a line, so its first word (if it starts
    inside a word) and its last word (if it ends inside one) are cut off; what remains starts
    and ends at boundaries inside ``lit`` itself, so its phrase filter is implied by the
    substring. ``None`` when no word is left (``"loss"``, ``"NVRM: Xid"``)."""
    i, j = 0, len(lit)
    if i < j and word_char(lit[0]):
        while i < j and word_char(lit[i]):
            i += 1
    if i < j and word_char(lit[-1]):
        while j > i and word_char(lit[j - 1]):
            j -= 1
    core = lit[i:j].strip()
    if not any(word_char(c) for c in core):
        return None
    # a core with surrounding non-word characters is fine (they are matched literally); leading or
    # trailing spaces carry no boundary information, so they are stripped above
    return core


def logsql_string(text: str) -> str:
    """``text`` as a LogsQL double-quoted string (backslash and quote escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _re2_escape(lit: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", lit)


def logsql_literal(lit: str, field: str = "_msg", phrase: bool = True) -> str:
    """A LogsQL filter for "``field`` contains ``lit``" (case-sensitive substring), exact."""
    sub = f"{field}:~{logsql_string(_re2_escape(lit))}"
    core = phrase_core(lit) if phrase else None
    if core is None:
        return sub
    return f"({field}:{logsql_string(core)} AND {sub})"


def logsql_any(lits: Sequence[str], field: str = "_msg", phrase: bool = True) -> str:
    """A LogsQL filter for "``field`` contains one of ``lits``" (``*`` for none given)."""
    if not lits:
        return "*"
    parts = [logsql_literal(x, field, phrase) for x in lits]
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"
