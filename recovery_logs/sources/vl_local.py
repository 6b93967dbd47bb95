"""Rows of a VictoriaLogs scope selected, counted and summarised here, in Polars.

Measured on the real v1.26.0 (1 M rows of 64-host chatter, 2 cores): the server exports every
row of a range for about 1 CPU-second, but filtering them with the rule packs' ~370 literals
(one ``_msg:~"lit"`` substring filter each, OR-ed; phrase filters cost the same) costs it
3.9 CPU-seconds — the server tests each literal on each message — and a ``count_uniq`` line
count another second. Polars does the same selection with one pass of the literals as one
regex alternation (the matcher's gate, ``detectors.rules.gate_regex``, computed by the caller
into ``LocalSplit.needed_re``: 0.2 s for 1 M messages, against 0.7 s for ``str.contains_any``)
after a ~1.2 s JSON-lines parse of the fields the export has (:func:`read_export`). So
:func:`split_frame` takes a parsed export of the whole scope and returns, in one pass:

* the rows the engine needs as text: a needed literal (the pack's ``needed_literals``, the
  same derivation as the file prefilter and the server push-down) and not summarised;
* the scope's lines per (host, job, window) with first and last time (``vl_history.COUNT_SCHEMA``,
  what ``line_counts`` asks the server for: host and job resolved as the row readers do,
  duplicates as the readers drop them left out);
* per :class:`ProgressSpec` the training-progress lines without a step time counted per
  (host, job, step, window) with first and last time (what the server-side summaries give).

The selection of a progress spec is the server summary's ``where`` (see
``pipeline.vl_replay.ProgressSummary``), evaluated with the engine's own regex engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from recovery_logs.sources.formats import VL_JOB_FIELDS, short_host
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.timeutil import rfc3339_to_ns_expr

__all__ = ["PROGRESS_SCHEMA", "LocalSplit", "ProgressSpec", "count_frame", "host_job_exprs", "read_export",
           "row_identity", "split_frame", "step_prefix", "with_ts"]

# per (host, job, step, window) of one progress spec: lines (duplicates left out), first/last time
PROGRESS_SCHEMA = {"host": pl.String, "job_id": pl.String, "step": pl.Int64, "bucket": pl.Int64, "lines": pl.Int64,
                   "first": pl.Int64, "last": pl.Int64}
_COUNT_SCHEMA = {"host": pl.String, "job_id": pl.String, "bucket": pl.Int64, "lines": pl.Int64,
                 "first": pl.Int64, "last": pl.Int64, "duplicates": pl.Int64}


def _any(msg: pl.Expr, lits: Sequence[str], regex: str | None) -> pl.Expr:
    """``msg`` contains one of ``lits``: with ``regex`` (the same literals as one escaped
    alternation, ``detectors.rules.gate_regex``: the matcher's own gate) the Rust regex engine's
    literal scan, about 2-3x cheaper than ``contains_any`` over a few hundred literals."""
    if regex is not None:
        return msg.str.contains(regex)
    if len(lits) == 1:
        return msg.str.contains(lits[0], literal=True)
    return msg.str.contains_any(list(lits))


_STEP_GROUP = "(?P<step>\\d+)"
_STEP_TAIL = "\\b[^\\n]*?"
_ASCII_B = "(?-u:\\b)"
_ASCII_SPACE = "\\t\\n\\x0B\\f\\r "     # what \s matches among ASCII characters


@functools.lru_cache(maxsize=256)
def step_prefix(pattern: str) -> str | None:
    """For a progress pattern shaped ``A(?P<step>\\d+)\\b[^\\n]*?C`` — ``A`` one word (``\\b``
    around it allowed) and one ``[...]+`` of separators (no digit, no word character in it) —
    the prefix ``A(?P<step>\\d+)\\b``, whose first match gives the same ``step`` as the whole
    pattern's on every single-line message the whole pattern matches: ``A`` and the digits
    match one way only at each place, and a ``C`` after a later ``step`` is also after an earlier
    one (no line break between). Capturing with the prefix is ~2.5x cheaper (450 k progress lines:
    0.17 vs 0.43 CPU-s); None for any other shape (the whole pattern is used).

    The prefix comes back in ASCII classes (``(?-u:\\b)``, ``[0-9]``, the six ASCII spaces for
    ``\\s``): it is applied only to lines a :class:`ProgressSpec` selects, which are ASCII, and on
    ASCII text the Unicode and ASCII classes match the same characters; without Unicode word
    boundaries the regex engine resolves the capture with its one-pass DFA (112 k progress lines:
    0.026 instead of 0.060 CPU-s)."""
    if pattern.count(_STEP_GROUP) != 1:
        return None
    a, rest = pattern.split(_STEP_GROUP)
    if "(?P<step>" in rest:
        return None
    if not rest.startswith(_STEP_TAIL) or not a.endswith("]+") or "[" not in a:
        return None
    k = a.rindex("[")
    head, cls = a[:k], a[k + 1:-2]
    toks = cls.replace("\\s", "")
    if not cls or any(c.isalnum() or c in "^-\\]_" for c in toks):
        return None
    body = head.removeprefix("\\b").removesuffix("\\b")
    if not body[:1].isalpha() or not body.isascii() or not all(c.isalnum() or c == "_" for c in body):
        return None      # one word: a later match cannot start inside an earlier one
    head, cls = head.replace("\\b", _ASCII_B), cls.replace("\\s", _ASCII_SPACE)
    return f"{head}[{cls}]+(?P<step>[0-9]+){_ASCII_B}"


@dataclass(frozen=True)
class ProgressSpec:
    """Lines of progress rule ``rule_id`` won by ``pattern``: one of ``literals``, ``pattern``
    matches, none of ``earlier`` does, only ASCII, none of ``others`` (every other rule's and
    enrichment's literals; ``others_re``: the same as one regex alternation)."""

    rule_id: str
    literals: tuple[str, ...]
    pattern: str
    earlier: tuple[str, ...]
    others: tuple[str, ...]
    others_re: str | None = None

    def mask(self, msg: pl.Expr) -> pl.Expr:
        m = _any(msg, self.literals, None) & msg.str.contains(self.pattern)
        for p in self.earlier:
            m = m & ~msg.str.contains(p)
        # only ASCII: as many bytes as characters (a length compare, no regex pass)
        return m & (msg.str.len_bytes() == msg.str.len_chars()) & ~_any(msg, self.others, self.others_re)


@dataclass(frozen=True)
class LocalSplit:
    """``needed``: a row with one of these literals is an engine row (None: every row is);
    ``needed_re``: the same as one regex alternation (optional); ``bucket_ns``: the engine's
    window length."""

    needed: tuple[str, ...] | None
    bucket_ns: int
    progress: tuple[ProgressSpec, ...] = ()
    needed_re: str | None = None


def host_job_exprs(opts: ReadOptions) -> tuple[pl.Expr, pl.Expr]:
    """Host and job of a VictoriaLogs row as the row readers resolve them (first non-empty host
    field, short name; first non-empty job field; ``opts.host``/``opts.job`` override)."""

    def first(names: Sequence[str]) -> pl.Expr:
        return pl.coalesce([pl.when(pl.col(f) != "").then(pl.col(f)) for f in names])

    host = pl.lit(opts.host) if opts.host is not None else short_host(first(tuple(opts.host_fields)))
    job = pl.lit(opts.job) if opts.job is not None else first(VL_JOB_FIELDS)
    return host.cast(pl.String), job.cast(pl.String)


def _identity(dedupe: bool) -> pl.Expr:
    """Lines of a group as the readers keep them: one per (stream, time, rank, message) — a 64-bit
    hash of that identity (a collision among n rows of one export: ~n²/2^65) — or every row
    (``dedupe`` False, or no two rows of the export share an identity)."""
    return pl.col("__id").n_unique() if dedupe else pl.len()


def _seconds(t: pl.Expr) -> pl.Expr:
    """Epoch seconds of the ``YYYY-MM-DDTHH:MM:SS`` head, parsed once per distinct second
    (``strptime``'s cache: an export spans few seconds)."""
    return t.str.slice(0, 19).str.strptime(pl.Datetime("ms"), "%Y-%m-%dT%H:%M:%S", strict=False,
                                           cache=True).dt.epoch("s")


def with_ts(df: pl.DataFrame) -> pl.DataFrame:
    """``_ts``: ``_time`` as ns. VictoriaLogs writes RFC3339 in UTC with nanoseconds, trailing
    zeros trimmed (``YYYY-MM-DDTHH:MM:SS[.frac]Z``, 1-9 fraction digits: a shipper's milli- or
    microsecond times come back as 3 or 6). Every such shape is read in one path: the seconds
    once per distinct second, the fraction as one integer scaled by its length (1 M times in
    ~0.12 CPU-s; padding the fraction to nine digits first cost ~0.27); the general RFC3339
    parser for anything else."""
    t = pl.col("_time")
    n, c19 = t.str.len_bytes(), t.str.slice(19, 1)
    frac = t.str.slice(20, 9).str.strip_suffix("Z").str.to_integer(strict=False)
    frac_ns = pl.when(n == 20).then(pl.lit(0, pl.Int64)).otherwise(
        frac * pl.lit(10, pl.Int64).pow((30 - n).cast(pl.Int64)))
    shape = (t.str.ends_with("Z") & (((n == 20) & (c19 == "Z"))
                                     | ((c19 == ".") & n.is_between(22, 30) & (t.str.slice(20, 1) != "+"))))
    df = df.with_columns(pl.when(shape & (frac_ns >= 0)).then(_seconds(t) * 1_000_000_000 + frac_ns).alias("_ts"))
    if df["_ts"].null_count() > df["_time"].null_count():
        df = df.with_columns(pl.coalesce(pl.col("_ts"), rfc3339_to_ns_expr(pl.col("_time"))).alias("_ts"))
    return df


def read_export(body: bytes, keys: Sequence[str], full: Sequence[str] = ()) -> pl.DataFrame:
    """A JSON-lines export -> String columns ``keys`` (parsed), plus ``full``'s other columns as
    nulls (fields no row of the export has: not given to the parser, whose cost grows with its
    columns)."""
    schema = {k: pl.String for k in dict.fromkeys(keys)}
    if len(body) < 4096 and not body.strip():     # (no copy of a large body)
        df = pl.DataFrame(schema=schema)
    else:
        # (the bytes themselves: a BytesIO around them cost a copy, ~0.1 CPU-s per 100 MB)
        df = pl.read_ndjson(body, schema=schema, ignore_errors=True)
    missing = [k for k in dict.fromkeys(full) if k not in schema]
    return df.with_columns([pl.lit(None, pl.String).alias(k) for k in missing]) if missing else df


def row_identity() -> pl.Expr:
    """A row's identity as the readers' duplicate test sees it (stream, time, rank, message) as
    a 64-bit hash (``__id``)."""
    return pl.struct(["_stream_id", "_time", "rank", "_msg"]).hash(seed=5)


def _with_id(df: pl.DataFrame, dedupe: bool) -> pl.DataFrame:
    if not dedupe or "__id" in df.columns:
        return df
    return df.with_columns(row_identity().alias("__id"))


def _has_dups(df: pl.DataFrame, dedupe: bool) -> bool:
    """Do two rows of ``df`` share an identity? (a duplicate is rare: one cheap distinct count
    says whether the exact first-distinct / distinct-per-group passes are needed)"""
    return dedupe and df.height > 0 and df["__id"].n_unique() < df.height


def count_frame(df: pl.DataFrame, bucket_ns: int, opts: ReadOptions, dups: bool | None = None) -> pl.DataFrame:
    """Lines of ``df`` (parsed export with ``_ts``) per (host, job, window): COUNT_SCHEMA. Rows
    are grouped by their raw host/job fields first and host/job resolved once per group (the
    resolution is regex work); a duplicate (same identity as an earlier row of ``df``) is
    counted in ``duplicates``, not ``lines``, as the readers drop it. ``dups``: whether ``df``
    has duplicates, when the caller knows (:func:`_has_dups`)."""
    if df.height == 0:
        return pl.DataFrame(schema=_COUNT_SCHEMA)
    raw = [c for c in dict.fromkeys((*opts.host_fields, *VL_JOB_FIELDS)) if c in df.columns]
    df = _with_id(df, opts.dedupe)
    if dups is None:
        dups = _has_dups(df, opts.dedupe)
    keep = pl.col("__id").is_first_distinct() if dups else pl.lit(True)
    # rows grouped by a 64-bit hash of their raw host/job fields (one cheap column instead of
    # hashing eight string columns in the group-by), the fields taken from each group's first row
    # (a collision among the few distinct host/job combinations of an export: ~n^2/2^65)
    key = pl.struct(raw).hash(seed=3) if raw else pl.lit(0, pl.UInt64)
    g = (df.with_columns(keep.alias("__k"), (pl.col("_ts") // bucket_ns * bucket_ns).alias("__b"),
                                                key.alias("__g"))
         .group_by(["__g", "__b"])
         .agg(pl.col("__k").sum().cast(pl.Int64).alias("lines"), pl.len().cast(pl.Int64).alias("__all"),
              pl.col("_ts").min().alias("first"), pl.col("_ts").max().alias("last"), *[pl.col(c).first() for c in raw]))
    for c in (*opts.host_fields, *VL_JOB_FIELDS):
        if c not in g.columns:
            g = g.with_columns(pl.lit(None, pl.String).alias(c))
    host, job = host_job_exprs(opts)
    out = (g.with_columns(host.alias("__h"), job.alias("__j"))
           .group_by(["__h", "__j", "__b"])
           .agg(pl.col("lines").sum(), pl.col("__all").sum(), pl.col("first").min(), pl.col("last").max()))
    return out.select(pl.col("__h").alias("host"), pl.col("__j").alias("job_id"), pl.col("__b").alias("bucket"),
                      "lines", "first", "last", (pl.col("__all") - pl.col("lines")).alias("duplicates"))


def split_frame(df: pl.DataFrame, plan: LocalSplit, opts: ReadOptions
                ) -> tuple[pl.DataFrame, pl.DataFrame, list[tuple[ProgressSpec, pl.DataFrame]]]:
    """``df``: String columns of an export (``_time``, ``_msg``, ``_stream_id``, ``rank``, host
    and job fields; ``__id``, a row's identity, optional: computed from ``_stream_id`` where it
    is needed). Returns (rows the engine needs — with every input column, rows whose ``_time``
    does not parse among them —, line counts per window, progress counts per spec).

    Two rows with one identity share their ``_time``, so a frame whose times are distinct has
    no duplicate and needs no identity: its counts are plain row counts, made by one group-by
    of integer keys per table (a hash of the raw host/job fields, the window, the step) with
    host and job resolved per group. A frame with a repeated time takes the exact path (the
    identity of every row, duplicates counted as the readers drop them)."""
    added = "_ts" not in df.columns
    if added:
        df = with_ts(df)
    cols = df.columns
    if opts.dedupe and df.height and df["_ts"].n_unique() < df.height:
        ided = _with_id(df, True)
        if _has_dups(ided, True):
            return _split_exact(ided, plan, opts, cols, added)
    keep = [c for c in cols if added is False or c != "_ts"]
    # (a field no row has is null in every group: left to _host_table)
    raw = [c for c in dict.fromkeys((*opts.host_fields, *VL_JOB_FIELDS))
           if c in df.columns and df[c].null_count() < df.height]
    key = pl.struct(raw).hash(seed=3) if raw else pl.lit(0, pl.UInt64)
    b = plan.bucket_ns
    base = df.select(key.alias("__g"), (pl.col("_ts") // b * b).alias("__b"), "_ts", *raw)
    timed = base if df["_ts"].null_count() == 0 else base.filter(pl.col("_ts").is_not_null())
    g = timed.group_by(["__g", "__b"]).agg(
        pl.len().cast(pl.Int64).alias("lines"), pl.col("_ts").min().alias("first"), pl.col("_ts").max().alias("last"),
        *[pl.col(c).first() for c in raw])
    hosts = _host_table(g, raw, opts)
    counts = _resolved(g.select("__g", "__b", "lines", "first", "last"), hosts, ["__b"])
    counts = counts.select(pl.col("__h").alias("host"), pl.col("__j").alias("job_id"), pl.col("__b").alias("bucket"),
                           "lines", "first", "last", pl.lit(0, pl.Int64).alias("duplicates"))
    if plan.needed is None:
        return df.select(keep), counts, []
    msg = pl.col("_msg").fill_null("")
    untimed = pl.col("_ts").is_null()
    m = df.select((_any(msg, plan.needed, plan.needed_re) | untimed).alias("n"), untimed.alias("u"))
    need, cand = m["n"], m["n"] & ~m["u"]
    prog: list[tuple[ProgressSpec, pl.DataFrame]] = []
    summarised: pl.Series | None = None
    if plan.progress:
        idx = cand.arg_true()
        sub = base.with_columns(df["_msg"]).filter(cand)
        masks = sub.select(*[sp.mask(msg).alias(f"__p{i}") for i, sp in enumerate(plan.progress)])
        hit = masks.select(pl.any_horizontal(masks.columns)).to_series()
        summarised = pl.zeros(df.height, pl.Boolean, eager=True).scatter(idx.filter(hit), True)
        for i, spec in enumerate(plan.progress):
            sel = sub.filter(masks[f"__p{i}"])
            if sel.height == 0:
                prog.append((spec, pl.DataFrame(schema=PROGRESS_SCHEMA)))
                continue
            step = _step_expr(spec, sel)
            # (lazy: Polars' eager group-by of three keys took 2.5x as long on 450 k rows)
            g = (sel.lazy().select("__g", "__b", "_ts", step.alias("step")).group_by(["__g", "__b", "step"])
                 .agg(pl.len().cast(pl.Int64).alias("lines"), pl.col("_ts").min().alias("first"),
                      pl.col("_ts").max().alias("last")).collect())
            g = _resolved(g, hosts, ["step", "__b"])
            prog.append((spec, g.select(pl.col("__h").alias("host"), pl.col("__j").alias("job_id"), "step",
                                        pl.col("__b").alias("bucket"), "lines", "first", "last")))
    rows = df.filter(need if summarised is None else need & ~summarised)
    return rows.select(keep), counts, prog


def _step_expr(spec: ProgressSpec, sel: pl.DataFrame) -> pl.Expr:
    """The step number of ``spec``'s progress lines ``sel``: the pattern's fixed prefix before the
    step where it has one and no line is multi-line, else the whole pattern's ``step`` group."""
    pre = step_prefix(spec.pattern)
    if pre is not None and not sel["_msg"].str.contains("\n", literal=True).any():
        return pl.col("_msg").str.extract(pre, 1).cast(pl.Int64, strict=False)
    return pl.col("_msg").str.extract_groups(spec.pattern).struct.field("step").cast(pl.Int64, strict=False)


def _host_table(g: pl.DataFrame, raw: list[str], opts: ReadOptions) -> tuple[pl.DataFrame, bool]:
    """(``__g`` -> host ``__h`` and job ``__j`` as the readers resolve them from the raw fields
    ``g`` carries, whether no two ``__g`` resolve to the same (host, job))."""
    t = g.select("__g", *raw).unique("__g")
    for c in (*opts.host_fields, *VL_JOB_FIELDS):
        if c not in t.columns:
            t = t.with_columns(pl.lit(None, pl.String).alias(c))
    host, job = host_job_exprs(opts)
    t = t.select("__g", host.alias("__h"), job.alias("__j"))
    return t, t.select(pl.struct("__h", "__j").n_unique()).item() == t.height


def _resolved(g: pl.DataFrame, hosts: tuple[pl.DataFrame, bool], by: list[str]) -> pl.DataFrame:
    """Groups per raw host/job hash ``__g`` and ``by`` (``lines``, ``first``, ``last``) per
    resolved (host ``__h``, job ``__j``) and ``by`` (:func:`_host_table`): summed where two
    raw groups name one host and job."""
    t, distinct = hosts
    out = g.join(t, on="__g", how="left")
    if distinct:
        return out
    return out.group_by(["__h", "__j", *by]).agg(pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max())


def _split_exact(df: pl.DataFrame, plan: LocalSplit, opts: ReadOptions, cols: list[str], added: bool
                 ) -> tuple[pl.DataFrame, pl.DataFrame, list[tuple[ProgressSpec, pl.DataFrame]]]:
    """:func:`split_frame` of a frame with duplicates: every count over the rows' identities."""
    df = _with_id(df, opts.dedupe)
    dups = _has_dups(df, opts.dedupe)
    timed = df if df["_ts"].null_count() == 0 else df.filter(pl.col("_ts").is_not_null())
    counts = count_frame(timed, plan.bucket_ns, opts, dups)
    msg = pl.col("_msg").fill_null("")
    keep = [c for c in cols if added is False or c != "_ts"]
    if plan.needed is None:
        return df.select(keep), counts, []
    # the progress selections only on rows with a needed literal (their literals are among them)
    marked = df.filter(_any(msg, plan.needed, plan.needed_re) | pl.col("_ts").is_null())
    marked = marked.with_columns(*[(spec.mask(msg) & pl.col("_ts").is_not_null()).alias(f"__p{i}")
                                   for i, spec in enumerate(plan.progress)])
    summarised = pl.any_horizontal([f"__p{i}" for i in range(len(plan.progress))]) if plan.progress else pl.lit(False)
    rows = marked.filter(~summarised)
    prog: list[tuple[ProgressSpec, pl.DataFrame]] = []
    host, job = host_job_exprs(opts)
    for i, spec in enumerate(plan.progress):
        sel = marked.filter(pl.col(f"__p{i}"))
        if sel.height == 0:
            prog.append((spec, pl.DataFrame(schema=PROGRESS_SCHEMA)))
            continue
        step = _step_expr(spec, sel)
        g = (sel.with_columns(host.alias("host"), job.alias("job_id"), step.alias("step"),
                              (pl.col("_ts") // plan.bucket_ns * plan.bucket_ns).alias("bucket"))
             .group_by(["host", "job_id", "step", "bucket"])
             .agg(_identity(dups).cast(pl.Int64).alias("lines"), pl.col("_ts").min().alias("first"),
                  pl.col("_ts").max().alias("last")))
        prog.append((spec, g.select(list(PROGRESS_SCHEMA))))
    return rows.select(keep), counts, prog
