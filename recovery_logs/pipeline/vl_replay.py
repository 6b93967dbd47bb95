"""``replay --source victorialogs://`` with the work pushed down to the server.

The engine needs most lines only as a count: windows (lines, first and last time per host, job
and window) and job spans are associative sums/minima/maxima (``windows.merge_windows``), so
the server counts them (``stats by (host fields, job fields, _time:WINDOW) count(), min(_time),
max(_time)``, :func:`recovery_logs.sources.vl_history.line_counts`) without sending a row. Rows
are fetched only where the engine needs the text: lines a rule can match (the pack's
:func:`~recovery_logs.detectors.literals.needed_literals`, the same derivation as the local
file prefilter) and the NCCL/NVML lines enrichment reads (:data:`ENRICH_LITERALS`). Those are
read as sliced concurrent exports parsed by Polars (``history_batches_fast``) and fed with
``Engine.count_lines = False``; the counts come in through ``Engine.absorb_counts``. The incidents
equal those of a replay of every row (tested on the real server), because

* a line without any needed literal produces no finding, no address and no GPU record;
* counted windows merged with the fetched lines' finding windows equal the windows of all lines.

Rows the readers drop as duplicates are left out of the counts too (``count_uniq`` over a row's
identity; their number is ``summary["duplicates"]``). What differs, and is said in
``summary["pushdown"]``: ``events.parquet`` (``--out``) and the quarantine hold only the fetched lines.
"""

from __future__ import annotations

import collections
import io
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from recovery_logs.detectors.literals import logsql_any, logsql_string, needed_literals
from recovery_logs.detectors.rulepack import Rule, RulePack
from recovery_logs.detectors.rules import gate_regex
from recovery_logs.errors import ConfigError
from recovery_logs.pipeline.engine import Engine, EnginePart
from recovery_logs.pipeline.enrich import ENRICH_LITERALS
from recovery_logs.pipeline.replay import ReplayOptions, ReplayResult, replay, resolve_line_scores
from recovery_logs.schema import EVENT_SCHEMA, FINDING_SCHEMA, conform, empty_findings, empty_quarantine
from recovery_logs.sources.formats import VL_JOB_FIELDS, short_host
from recovery_logs.sources.read_common import Batch, ReadOptions
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.sources.vl_history import (
    COUNT_SCHEMA,
    history_batches_fast,
    line_counts,
    logsql_field,
    plan_slices,
)
from recovery_logs.sources.vl_local import LocalSplit, ProgressSpec, split_frame
from recovery_logs.timeutil import rfc3339_to_ns_expr
from recovery_logs.windows import empty_spans, progress_windows, window_counts, window_us

__all__ = ["ENRICH_LITERALS", "ProgressSummary", "PushdownPlan", "local_split", "plan_pushdown", "progress_findings",
           "progress_summaries", "replay_source"]

NS = 1_000_000_000



_STEP_TIME_GROUPS = ("step_time_s", "step_time_ms", "it_per_s", "samples_per_s", "tokens_per_s")
_UNSAFE = ("(?=", "(?!", "(?<", "(?i", "(?s", "(?m", "(?x")


def _anchored(pattern: str) -> bool:
    """An anchor (``^ $ \\A \\z \\Z``) or a back reference outside a character class."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if not in_class and pattern[i + 1:i + 2] in ("A", "z", "Z") or pattern[i + 1:i + 2].isdigit():
                return True
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":
                i += 1
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif c in "^$":
            return True
        i += 1
    return False


def _prefix_safe(pattern: str) -> bool:
    """True when ``pattern`` finds the same leftmost match in a raw ``_msg`` as in the engine's
    ``message`` (the ``_msg`` without a leading ``[rankN]:`` prefix): it starts with ``\\b`` and
    a letter no such prefix can start a word with (not r/a/n/k or a digit), and has no anchor,
    lookaround, back reference or inline flag. A match then cannot begin inside the prefix, and
    the word boundary before ``message`` holds in ``_msg`` too (the prefix ends in ``:`` or a space)."""
    if not pattern.startswith("\\b") or len(pattern) < 3:
        return False
    c = pattern[2]
    return (c.isascii() and c.isalpha() and c not in "rankRANK" and not any(u in pattern for u in _UNSAFE)
            and not _anchored(pattern))


@dataclass(frozen=True)
class ProgressSummary:
    """Training-progress lines the server summarises instead of sending: lines of ``rule`` whose
    winning pattern is ``pattern`` (index ``index``), which carries a step but no step time. The
    hang detector needs such lines only as ticks (the first time each step was reported, per
    host), the windows and the anomaly features only as counts per window; the straggler
    detector never reads them (no step time). ``where`` selects exactly those lines:

    * one of the rule's literals, no literal of any other rule (so no other rule is tried on
      them), none of :data:`ENRICH_LITERALS`;
    * only ASCII characters (the server's RE2 and the engine's Rust regexes then agree on
      ``\\d``, ``\\s``, ``\\b``);
    * the rule's earlier patterns do not match, this one does (all :func:`_prefix_safe`).
    """

    rule: Rule
    index: int
    where: str

    others: tuple[str, ...] = ()

    @property
    def pattern(self) -> str:
        return self.rule.patterns[self.index]

    def spec(self) -> ProgressSpec:
        """The same selection as plain data, evaluated here (``sources.vl_local``)."""
        return ProgressSpec(self.rule.id, tuple(self.rule.literals), self.pattern,
                            tuple(self.rule.patterns[: self.index]), self.others, gate_regex(self.others))


def _regex(pattern: str) -> str:
    return f"_msg:~{logsql_string(pattern)}"


def progress_summaries(pack: RulePack) -> list[ProgressSummary]:
    """The progress (rule, pattern) pairs whose lines can be summarised (see :class:`ProgressSummary`)."""
    if pack.every_line_needed():
        return []
    out = []
    for r in pack.rules:
        if r.suppress or r.role != "progress" or not r.literals:
            continue
        for k in range(len(r.patterns)):
            names = set(r.group_names(k))
            if not all(_prefix_safe(p) for p in r.patterns[: k + 1]):
                break
            if "step" not in names or names & set(_STEP_TIME_GROUPS) or any(n.startswith("step_time_ms_") for n in names):
                continue
            if r.fields:     # constant fields (e.g. a step time) would need the line: not summarised
                break
            others = sorted({x for o in pack.rules if o.id != r.id for x in o.literals} | set(ENRICH_LITERALS))
            # cheapest first: the server narrows the rows filter by filter
            parts = [logsql_any(list(r.literals)), _regex(r.patterns[k]), *(f"NOT {_regex(p)}" for p in r.patterns[:k]),
                     '_msg:~"^[\\\\x00-\\\\x7f]*$"', f"NOT {logsql_any(others)}"]
            out.append(ProgressSummary(r, k, "(" + " AND ".join(parts) + ")", tuple(others)))
            break
    return out


@dataclass(frozen=True)
class PushdownPlan:
    """The LogsQL a push-down replay sends: ``count`` (every line of the scope, counted per
    window), ``fetch`` (the lines whose text is needed; None: every line is) and the progress
    lines summarised by the server (``progress``: their filters are left out of ``fetch``)."""

    count: str
    fetch: str | None
    progress: tuple[ProgressSummary, ...] = ()

    def explain(self) -> list[str]:
        out = [f"count: {self.count} | stats by (<host fields>, <job fields>, _time:WINDOW) count(), "
               "count_uniq(_stream_id, _time, rank, _msg), min(_time), max(_time)",
               f"fetch: {self.fetch if self.fetch is not None else self.count}"]
        out += [f"progress {p.rule.id}: {_scoped(self.count, p.where)} | extract_regexp ... | stats by "
                "(<host fields>, <job fields>, step, _time:WINDOW) count_uniq(...), min(_time), max(_time)"
                for p in self.progress]
        return out


def _scoped(query: str, flt: str) -> str:
    q = query.strip()
    return flt if q in ("", "*") else f"({q}) AND {flt}"


def plan_pushdown(pack: RulePack, query: str = "*", phrase: bool = False, progress: bool = False) -> PushdownPlan:
    lits = needed_literals(pack, ENRICH_LITERALS)
    count = query.strip() or "*"
    if lits is None:
        return PushdownPlan(count=count, fetch=None)
    summ = tuple(progress_summaries(pack)) if progress else ()
    fetch = logsql_any(lits, phrase=phrase)
    if summ:
        fetch = f"{fetch} AND NOT (" + " OR ".join(p.where for p in summ) + ")"
    return PushdownPlan(count=count, fetch=_scoped(count, fetch), progress=summ)


def local_split(pack: RulePack, bucket_ns: int, extra: tuple[str, ...] = (), progress: bool = True) -> LocalSplit:
    """What :func:`~recovery_logs.sources.vl_local.split_frame` keeps, counts and summarises for
    this pack: the rows with a needed literal (rules, enrichment, ``extra``), the progress lines
    without a step time summarised (``progress``)."""
    lits = needed_literals(pack, (*ENRICH_LITERALS, *extra))
    specs = tuple(p.spec() for p in progress_summaries(pack)) if progress and lits is not None else ()
    if extra:
        specs = tuple(replace(p, others=(o := tuple(sorted({*p.others, *extra}))), others_re=gate_regex(o))
                      for p in specs)
    # one regex alternation of the literals: the matcher's own gate (detectors.rules.gate_regex)
    return LocalSplit(lits, bucket_ns, specs, gate_regex(lits) if lits is not None else None)


def _merge_counts(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Counts of several slices/polls per (host, job, window) summed (a window cut by a boundary)."""
    return pl.concat(frames).group_by(["host", "job_id", "bucket"]).agg(
        pl.col("lines").sum(), pl.col("first").min(), pl.col("last").max(), pl.col("duplicates").sum())


def _progress_counts(client: VictoriaLogsClient, count_query: str, summ: ProgressSummary, start_ns: int, end_ns: int,
                     bucket_ns: int, read: ReadOptions, slices: list[tuple[int, int]] | None = None,
                     workers: int = 2) -> pl.DataFrame:
    """Per (host, job, step, window) of ``summ``'s lines: count (duplicates left out), first and
    last time; one query per time slice (each stays under the server's query time limit), summed
    over slices (a window cut by a slice boundary is merged by the consumers)."""
    host_fields, job_fields = tuple(read.host_fields), tuple(VL_JOB_FIELDS)
    fields = list(dict.fromkeys((*host_fields, *job_fields)))
    by = ", ".join([*(logsql_field(f) for f in fields), "step", f"_time:{int(bucket_ns)}ns"])
    uniq = "count_uniq(_stream_id, _time, rank, _msg)" if read.dedupe else "count()"
    q = (f"{_scoped(count_query, summ.where)} | extract_regexp {logsql_string(summ.pattern)} from _msg "
         f"| stats by ({by}) {uniq} as __n, min(_time) as __t0, max(_time) as __t1")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        bodies = list(pool.map(lambda lh: client.query_bytes(q, lh[0], lh[1]), slices or [(start_ns, end_ns)]))
    body = b"".join(bodies)
    schema = {**{f: pl.String for f in fields}, "step": pl.String, "_time": pl.String, "__n": pl.String,
              "__t0": pl.String, "__t1": pl.String}
    if not body.strip():
        return pl.DataFrame(schema={"host": pl.String, "job_id": pl.String, "step": pl.Int64, "lines": pl.Int64,
                                    "first": pl.Int64, "last": pl.Int64})
    df = pl.read_ndjson(io.BytesIO(body), schema=schema)

    def first(names: tuple[str, ...]) -> pl.Expr:
        return pl.coalesce([pl.when(pl.col(f) != "").then(pl.col(f)) for f in names])

    host = pl.lit(read.host) if read.host is not None else short_host(first(host_fields))
    job = pl.lit(read.job) if read.job is not None else first(job_fields)
    return df.select(host.cast(pl.String).alias("host"), job.cast(pl.String).alias("job_id"),
                     pl.col("step").cast(pl.Int64, strict=False), pl.col("__n").cast(pl.Int64).alias("lines"),
                     rfc3339_to_ns_expr(pl.col("__t0")).alias("first"), rfc3339_to_ns_expr(pl.col("__t1")).alias("last"))


def progress_findings(counts: pl.DataFrame, rule: Rule, seq_start: int) -> pl.DataFrame:
    """Progress findings from server counts per (host, job, step, window): ``lines`` rows per
    group, the first at the group's first time and the others at its last. Every reader of
    such findings gets what the lines give it: counts per window (windows, anomaly features),
    the last progress time per window, the first time each step was seen per host (hang ticks,
    the suspect host) — and no step time (these lines have none)."""
    if counts.height == 0:
        return empty_findings()
    ex = (counts.with_columns(pl.int_ranges(0, pl.col("lines")).alias("_k")).explode("_k")
          .with_columns(pl.when(pl.col("_k") == 0).then(pl.col("first")).otherwise(pl.col("last")).alias("_t")))
    df = ex.select(
        pl.col("_t").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").alias("time"),
        "host", "job_id", "step", pl.lit("job").alias("source"),
        pl.lit("(summarised)").alias("message"),      # <= 12 bytes: inline in a string view (1.5 M rows held live)
        pl.lit(False).alias("time_inferred"), pl.lit(rule.id).alias("rule_id"),
        pl.lit(rule.version).alias("rule_version"), pl.lit(rule.category).alias("category"),
        pl.lit(rule.severity).alias("severity"), pl.lit(rule.role).alias("role"), pl.lit(rule.action).alias("action"))
    df = df.sort("time").with_columns(pl.int_range(seq_start, seq_start + pl.len(), dtype=pl.Int64).alias("seq"))
    return conform(df, FINDING_SCHEMA)


def progress_parts(prog: list[tuple[ProgressSpec, pl.DataFrame]], rules: dict[str, Rule], window_s: float
                   ) -> list[tuple[pl.DataFrame, pl.DataFrame, int]]:
    """Progress counts as engine input, pure (run beside the export): per non-empty count frame,
    (its :func:`progress_findings` with seqs from 0, their window counts, the lines summarised)."""
    out = []
    for spec, pc in prog:
        if pc.height == 0:
            continue
        rule = rules[spec.rule_id]
        found = progress_findings(pc, rule, 0)
        win = progress_windows(pc, rule.category, window_s)
        if win is None:
            win = window_counts(pl.DataFrame(schema=EVENT_SCHEMA), found, window_s)
        out.append((found, win, int(pc["lines"].sum())))
    return out


def absorb_parts(eng: Engine, parts: list[tuple[pl.DataFrame, pl.DataFrame, int]], seq: int) -> tuple[int, int]:
    """Fold :func:`progress_parts` into ``eng`` in order, seqs from ``seq`` (the same findings as
    :func:`progress_findings` from each part's first seq). Returns (next seq, lines summarised)."""
    lines = 0
    for found, counts, n in parts:
        eng.absorb(EnginePart(found.with_columns(pl.col("seq") + seq), counts, empty_spans(), {}, None, 0))
        seq += found.height
        lines += n
    return seq, lines


def absorb_progress(eng: Engine, prog: list[tuple[ProgressSpec, pl.DataFrame]], seq: int) -> tuple[int, int]:
    """Fold progress counts (``split_frame``'s, or the server's) into ``eng`` as findings
    (:func:`progress_findings`) with seqs from ``seq``. Returns (next seq, lines summarised)."""
    return absorb_parts(eng, progress_parts(prog, {r.id: r for r in eng.pack.rules}, eng.config.window_s), seq)


class _Abandoned(Exception):
    """The early export of a replay that turned out not to take the local path."""


class _EarlyExport:
    """``replay --source``'s export started before the engine and the local split are built (the
    rule packs' load and literal derivation, ~0.3 s of this thread, overlap the server's first
    slices): the export runs in a thread of its own up to its first batch, its pool's selection
    waiting for :meth:`start` (or :meth:`abandon`)."""

    def __init__(self, client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int, read: ReadOptions,
                 slice_rows: int, workers: int) -> None:
        self._ready = threading.Event()
        self._select: Callable[[pl.DataFrame], tuple[pl.DataFrame, Any]] | None = None
        self._collect: Callable[[Any], None] | None = None
        self._first: list[Any] = []
        self._error: list[BaseException] = []
        self._it = history_batches_fast(client, query, start_ns, end_ns, read, slice_rows=slice_rows,
                                        workers=workers, select=self._selected, on_select=self._collected)
        self._th = threading.Thread(target=self._run, name="vl-replay-export", daemon=True)
        self._th.start()

    def _run(self) -> None:
        try:
            self._first.append(next(self._it, _DONE))
        except BaseException as exc:     # re-raised in the reading thread (or dropped: abandoned)
            self._error.append(exc)

    def _selected(self, df: pl.DataFrame) -> tuple[pl.DataFrame, Any]:     # in the export pool
        self._ready.wait()
        if self._select is None:
            raise _Abandoned
        return self._select(df)

    def _collected(self, extra: Any) -> None:
        assert self._collect is not None
        self._collect(extra)

    def start(self, select: Callable[[pl.DataFrame], tuple[pl.DataFrame, Any]], collect: Callable[[Any], None]
              ) -> Iterator[Batch]:
        """Let the selection run; the export's batches."""
        self._select, self._collect = select, collect
        self._ready.set()
        self._th.join()
        if self._error:
            raise self._error[0]
        if self._first[0] is _DONE:
            return
        yield self._first[0]
        yield from self._it

    def abandon(self) -> None:
        """Stop without waiting: the pool's next selection raises, which ends the export in its
        own thread (one already waiting on the network ends when its request does)."""
        self._ready.set()


_DONE = object()


def _replay_local(early: _EarlyExport, query: str, opts: ReplayOptions, eng: Engine, read: ReadOptions,
                  split: LocalSplit) -> ReplayResult:
    """Every row of the scope exported (sliced, concurrent: ``early``), selected, counted and
    summarised here (``sources.vl_local.split_frame``, ``split``: :func:`local_split` of the
    engine's pack), beside the export in its pool; only the needed rows become events."""
    eng.count_lines = False
    counts: list[pl.DataFrame] = []
    fetched = [0]
    rules = {r.id: r for r in eng.pack.rules}
    box = {"summarised": 0, "seq": 1 << 40}      # the summaries' seqs: after every fetched line's

    def select(df: pl.DataFrame) -> tuple[pl.DataFrame, Any]:     # in the export pool
        rows, c, p = split_frame(df, split, read)
        return rows, (c, progress_parts(p, rules, eng.config.window_s))

    def collect(extra: Any) -> None:      # in slice order, in this thread, while later slices export
        counts.append(extra[0])
        # folded in now, not after the export: ~0.1 s per 450 k summarised lines off the serial tail
        box["seq"], n = absorb_parts(eng, extra[1], box["seq"])
        box["summarised"] += n

    def batches() -> Iterator[Batch]:
        for b in early.start(select, collect):
            st = collections.Counter(b.stats)
            n = st.pop("lines", 0)
            st.pop("duplicates", None)      # counted over every line (below)
            fetched[0] += n
            st["pushdown_fetched"] += n
            yield Batch(b.events, b.quarantine, st)
        merged = _merge_counts(counts) if counts else pl.DataFrame(schema=COUNT_SCHEMA)
        total = eng.absorb_counts(merged)
        dups = int(merged["duplicates"].sum()) if merged.height else 0
        yield Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(),
                    collections.Counter(lines=total + dups, duplicates=dups))

    res = replay([], opts, batches=batches(), engine=eng)
    res.summary["pushdown"] = {"lines_counted": int(res.summary["events"]), "lines_fetched": fetched[0],
                               "progress_lines_summarised": box["summarised"], "select": "local",
                               "count_query": query, "fetch_query": query}
    return res


def replay_source(client: VictoriaLogsClient, query: str, start_ns: int, end_ns: int,
                  options: ReplayOptions | None = None, pushdown: bool = True, slice_rows: int = 250_000,
                  workers: int = 2, phrase: bool = False, progress: bool | None = None,
                  select: str = "local") -> ReplayResult:
    """Replay ``[start, end]`` of ``query`` from a VictoriaLogs server (``pushdown=False``: read
    every row, as ``history_batches_fast`` does).

    ``progress``: let the server summarise progress lines without a step time (off by default:
    on the 2-core benchmark machine it cut our CPU 5x but cost the server 4x more than it saved
    us — the exclusion of every other rule's literals is a scan per literal; worth it where the
    server has cores to spare). ``phrase``: AND the literals' phrase cores in front of their
    regexps (same lines; no server CPU saved in the benchmark, so off by default).

    ``select="local"`` (default): the server only exports the scope; the rows are selected,
    counted and summarised here (``sources.vl_local``: one Aho-Corasick pass over the messages
    instead of the server testing ~370 literals on each — 4x its CPU of a plain export on the
    benchmark machine), progress summaries on unless ``progress=False``. ``select="server"``:
    the LogsQL push-down above (for a server far away: only the needed rows cross the network)."""
    opts = resolve_line_scores(options or ReplayOptions())
    read = opts.read or ReadOptions()
    if select not in ("local", "server"):
        raise ConfigError("unknown push-down selection; use local or server", value=select)
    if select == "local" and pushdown and not opts.config.line_scores:
        early = _EarlyExport(client, query.strip() or "*", start_ns, end_ns, read, slice_rows, workers)
        try:
            eng = Engine(opts.config)
            # (the needed literals derived once, in local_split: ~0.05 s a derivation for the default packs)
            split = local_split(eng.pack, window_us(eng.config.window_s) * 1000, progress=progress is not False)
        except BaseException:
            early.abandon()
            raise
        if split.needed is not None:
            return _replay_local(early, query.strip() or "*", opts, eng, read, split)
        early.abandon()      # a rule without literals: every line is an engine row (below)
    else:
        eng = Engine(opts.config)
    plan = plan_pushdown(eng.pack, query, phrase=phrase, progress=bool(progress))
    if not pushdown or plan.fetch is None or eng.config.line_scores:   # line scores need every line's template
        return replay([], opts, batches=history_batches_fast(client, query, start_ns, end_ns, read,
                                                             slice_rows=slice_rows, workers=workers), engine=eng)
    eng.count_lines = False
    bucket_ns = window_us(eng.config.window_s) * 1000      # the engine's windows
    box: dict[str, Any] = {}

    slices = plan_slices(client, plan.count, start_ns, end_ns, slice_rows)

    def count() -> None:
        try:
            box["counts"] = line_counts(client, plan.count, start_ns, end_ns, bucket_ns, read, slices, workers)
            box["progress"] = [(p, _progress_counts(client, plan.count, p, start_ns, end_ns, bucket_ns, read, slices,
                                                    workers)) for p in plan.progress]
        except BaseException as exc:    # re-raised in the reading thread
            box["error"] = exc

    th = threading.Thread(target=count, name="vl-line-counts", daemon=True)
    th.start()
    fetched, summarised = [0], [0]

    def batches() -> Iterator[Batch]:
        for b in history_batches_fast(client, plan.fetch or "*", start_ns, end_ns, read, slice_rows=slice_rows,
                                      workers=workers, plan_query=plan.count):
            st = collections.Counter(b.stats)
            n = st.pop("lines", 0)
            st.pop("duplicates", None)      # the server's count of them covers every line (below)
            fetched[0] += n
            st["pushdown_fetched"] += n
            yield Batch(b.events, b.quarantine, st)
        th.join()
        if "error" in box:
            raise box["error"]
        counts: pl.DataFrame = box["counts"]
        total = eng.absorb_counts(counts)
        seq = 1 << 40      # after every fetched line's seq
        for p, pc in box["progress"]:
            found = progress_findings(pc, p.rule, seq)
            seq += found.height
            summarised[0] += int(pc["lines"].sum()) if pc.height else 0
            if found.height:
                eng.absorb(EnginePart(found, window_counts(pl.DataFrame(schema=EVENT_SCHEMA), found, eng.config.window_s),
                                      empty_spans(), {}, None, 0))
        dups = int(counts["duplicates"].sum()) if counts.height else 0
        yield Batch(pl.DataFrame(schema=EVENT_SCHEMA), empty_quarantine(),
                    collections.Counter(lines=total + dups, duplicates=dups))

    res = replay([], opts, batches=batches(), engine=eng)
    res.summary["pushdown"] = {"lines_counted": int(res.summary["events"]), "lines_fetched": fetched[0],
                               "progress_lines_summarised": summarised[0],
                               "count_query": plan.count, "fetch_query": plan.fetch}
    return res
