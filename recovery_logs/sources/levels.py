"""A log line's declared level, normalised: one vectorised expression for every reader.

Formats spell levels many ways: ``FATAL``/``SEVERE``/``FAILURE`` (BlueGene/L RAS), ``ERR``/
``WARNING`` (syslog keywords), ``E``/``W``/``F`` (glog; Android's ``V D I W E F A``), ``Error`` (.NET), a syslog priority
``3`` or a whole PRI ``<11>`` (facility * 8 + severity), journald ``PRIORITY``. They become the
``Level`` values of ``recovery_logs.schema`` (``fatal critical error warning notice info debug``);
anything else is null (the line declared no level we know, which is not the same as ``info``).

Syslog severities (RFC 5424 §6.2.1): 0 emerg and panic -> fatal, 1 alert and 2 crit -> critical,
3 err -> error, 4 warning, 5 notice, 6 info, 7 debug.
"""

from __future__ import annotations

import polars as pl

from recovery_logs.schema import Level

_WORDS: dict[str, str] = {
    **dict.fromkeys(("fatal", "emerg", "emergency", "panic", "f"), Level.FATAL.value),
    **dict.fromkeys(("critical", "crit", "alert", "failure", "severe", "a"), Level.CRITICAL.value),
    **dict.fromkeys(("error", "err", "e"), Level.ERROR.value),
    **dict.fromkeys(("warning", "warn", "w"), Level.WARNING.value),
    **dict.fromkeys(("notice", "n"), Level.NOTICE.value),
    **dict.fromkeys(("info", "information", "informational", "i"), Level.INFO.value),
    **dict.fromkeys(("debug", "trace", "verbose", "fine", "finer", "finest", "d", "v"), Level.DEBUG.value),
}
SYSLOG_SEVERITY: tuple[str, ...] = (Level.FATAL.value, Level.CRITICAL.value, Level.CRITICAL.value,
                                    Level.ERROR.value, Level.WARNING.value, Level.NOTICE.value,
                                    Level.INFO.value, Level.DEBUG.value)


def _normalise(word: pl.Expr) -> pl.Expr:
    word = word.str.strip_chars().str.strip_chars("[]<>():;,.|\"'").str.to_lowercase()
    num = word.cast(pl.Int32, strict=False)
    sev = pl.when((num >= 0) & (num <= 191)).then(num % 8)
    by_num = sev.replace_strict(list(range(8)), list(SYSLOG_SEVERITY), default=None, return_dtype=pl.String)
    by_word = word.replace_strict(_WORDS, default=None, return_dtype=pl.String)
    return pl.coalesce(by_word, by_num).cast(pl.String)


def _normalise_distinct(s: pl.Series) -> pl.Series:
    """Levels have a handful of distinct spellings: normalise those, then map the column (a hash
    lookup per row instead of four string passes)."""
    keys = s.drop_nulls().unique()
    if keys.len() == 0:
        return pl.Series(s.name, [None] * s.len(), dtype=pl.String)
    vals = pl.DataFrame({"k": keys}).select(_normalise(pl.col("k")))["k"]
    return s.replace_strict(keys, vals, default=None, return_dtype=pl.String)


def level_expr(raw: pl.Expr) -> pl.Expr:
    """A String expression of declared levels -> normalised ``Level`` values (null when unknown).

    Words are matched case-insensitively after stripping brackets and punctuation around them
    (``[ERROR]``, ``<warn>``, ``E:``); a number 0-7 is a syslog severity and a larger one (up to
    191) a PRI, whose low three bits are the severity."""
    return raw.cast(pl.String).map_batches(_normalise_distinct, return_dtype=pl.String)


def pri_level_expr(text: pl.Expr) -> pl.Expr:
    """The level of a line that starts with a syslog PRI ``<N>`` (null when it does not)."""
    return level_expr(text.str.extract(r"^<(\d{1,3})>", 1))


__all__ = ["SYSLOG_SEVERITY", "level_expr", "pri_level_expr"]
