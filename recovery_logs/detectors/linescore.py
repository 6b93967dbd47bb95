"""Line-level template rarity: flag the lines of a site's own logs that an operator would read first.

For logs of a format no rule was written for (a supercomputer's RAS log, a site's own syslog
layout), the window model has nothing to count: its features are rule categories and log rate.
What is left is what an operator does with an unknown log: mine its templates, and read the
*rare* lines that declare themselves errors, and the lines of a kind never seen before.

State (``LineStats``, associative like the engine's other state, so any split of a replay gives
the same result):

* per template (``templates.mask_expr`` + hash): lines, first ``seq``;
* candidate lines: those with an error-or-worse level (``schema.ERROR_LEVELS``), at most
  ``max_per_template`` per template (a template with more lines than that is not rare by any
  reasonable threshold), and the first line of every template (for novelty).

Scoring (``score_lines``, a pure function of the state) over everything the engine has seen:

* ``rarity = 1 - log(count) / log(total)`` of the line's template, in [0, 1] (1: seen once);
* a line is **rare** when its template has at most ``max(rare_min, rare_share * total)`` lines;
* a line is **new** when it is its template's first line, more than ``warmup_lines`` lines of
  the site were seen before it (before that, everything is new), and the site's template
  vocabulary is stable: at most ``novelty_max_rate`` templates per line over everything seen
  (a log whose lines keep bringing new templates — a sparse sample, a format the masks do not
  fit — has no "usual" to be new against, and novelty would flag a line in ten);
* flagged: a line that declares itself ``fatal`` or ``critical`` (the system says it failed: never
  chronic noise, however often), an ``error`` line that is ``rare`` (a frequent error template
  is the chronic noise an operator learns to skip), or a ``new`` line whose level is not
  info/notice/debug. A line that declares itself informational is never flagged (no flood on
  INFO chatter); a line without a level can be flagged only as new. At most
  ``max_per_template`` lines of one template are ever flagged (the first ones; the detail counts
  the template's lines), so one repeating message cannot flood the findings.

Flags are findings ``detector.line_rarity``: category ``anomaly``, severity ``low``, action
``investigate`` (they never drain, reset, requeue or cancel on their own), the line's own file,
line, time and host, and ``detail.score`` = rarity. Lines a rule already won are left to the rule.
A new template's line has role ``cause`` (an ``anomaly`` incident: a kind of line the site never
wrote before, which no rule names, is what an operator wants to be told about); the level-based
flags have role ``info`` (rows of ``findings.parquet`` and evidence, never an incident alone: a
RAS log says FATAL hundreds of times a day on hundreds of nodes, and one incident per node would
bury the report).

The constants (``LineScoreParams``) were chosen on one labelled public log (LogHub BGL_2k,
``benchmarks/hpc_logs.py``, which reports the others as held out); they were never fitted to a
site. Off by default for the built-in formats (GPU-cluster logs have rules; see
``EngineConfig.line_scores``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import polars as pl

from recovery_logs.detectors.templates import mask_expr, template_id_expr
from recovery_logs.errors import ConfigError
from recovery_logs.schema import ERROR_LEVELS, FINDING_SCHEMA, conform, empty_findings

RULE_ID = "detector.line_rarity"
QUIET_LEVELS = frozenset({"info", "notice", "debug"})   # a line that says it is informational is never flagged
SEVERE_LEVELS = frozenset({"fatal", "critical"})        # flagged whatever their template's count

COUNT_SCHEMA = {"template_id": pl.UInt64, "template": pl.String, "count": pl.Int64, "first_seq": pl.Int64}
CAND_COLS = ["time", "time_inferred", "host", "job_id", "source", "file", "line", "seq", "stream_id", "rank",
             "message", "level", "template_id"]


@dataclass(frozen=True)
class LineScoreParams:
    """rare_share, rare_min: a template is rare with at most ``max(rare_min, rare_share * lines)``
    lines; warmup_lines: lines seen before a template's first line counts as new; novelty_max_rate:
    templates per line above which nothing counts as new; max_per_template: candidate lines kept
    (and flagged at most) per template."""

    rare_share: float = 0.01
    rare_min: int = 3
    warmup_lines: int = 1000
    novelty_max_rate: float = 0.01
    max_per_template: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.novelty_max_rate <= 1.0:
            raise ConfigError("line scores: novelty_max_rate must be within (0, 1]", value=self.novelty_max_rate)
        if not 0.0 < self.rare_share < 1.0:
            raise ConfigError("line scores: rare_share must be within (0, 1)", value=self.rare_share)
        if self.rare_min < 1 or self.warmup_lines < 0 or self.max_per_template < 1:
            raise ConfigError("line scores: rare_min and max_per_template must be >= 1, warmup_lines >= 0",
                              rare_min=self.rare_min, warmup_lines=self.warmup_lines,
                              max_per_template=self.max_per_template)


@dataclass
class LineStats:
    """Template counts and candidate lines of some events (see the module docstring)."""

    counts: pl.DataFrame
    candidates: pl.DataFrame
    total: int

    @classmethod
    def empty(cls) -> LineStats:
        return cls(pl.DataFrame(schema=COUNT_SCHEMA), _empty_candidates(), 0)

    @classmethod
    def of(cls, events: pl.DataFrame, params: LineScoreParams) -> LineStats:
        """The stats of one batch of events (EVENT_SCHEMA; a ``template`` column, where given, is used
        instead of this package's masks — ``benchmarks/hpc_logs.py`` compares Drain3's that way)."""
        if events.height == 0:
            return cls.empty()
        ev = events if "template" in events.columns else events.with_columns(
            template=mask_expr(pl.col("message").fill_null("")))
        ev = ev.with_columns(template_id=template_id_expr(pl.col("template"))).sort("seq")
        counts = ev.group_by("template_id").agg(
            pl.col("template").first(), pl.len().cast(pl.Int64).alias("count"), pl.col("seq").min().alias("first_seq"))
        first = pl.col("seq") == pl.col("seq").min().over("template_id")
        err = pl.col("level").is_in(list(ERROR_LEVELS)).fill_null(False)
        cand = ev.filter(first | err)
        return cls(counts.select(list(COUNT_SCHEMA)), _cap(cand.select(CAND_COLS), params), events.height)

    def merge(self, other: LineStats, params: LineScoreParams) -> LineStats:
        """Both as one (associative and commutative up to row order)."""
        if other.total == 0:
            return self
        if self.total == 0:
            return other
        counts = pl.concat([self.counts, other.counts]).group_by("template_id").agg(
            pl.col("template").first(), pl.col("count").sum(), pl.col("first_seq").min())
        cand = _cap(pl.concat([self.candidates, other.candidates]), params)
        return LineStats(counts.select(list(COUNT_SCHEMA)), cand, self.total + other.total)

    def shift_seq(self, offset: int) -> LineStats:
        if not offset or self.total == 0:
            return self
        return LineStats(self.counts.with_columns(pl.col("first_seq") + offset),
                         self.candidates.with_columns(pl.col("seq") + offset), self.total)


def _empty_candidates() -> pl.DataFrame:
    schema = {c: FINDING_SCHEMA[c] for c in CAND_COLS if c != "template_id"}
    return pl.DataFrame(schema={**schema, "template_id": pl.UInt64}).select(CAND_COLS)


def _cap(cand: pl.DataFrame, params: LineScoreParams) -> pl.DataFrame:
    """At most ``max_per_template`` candidates per template (the earliest) plus each template's first."""
    if cand.height == 0:
        return cand
    cand = cand.unique(["seq", "file", "line"], keep="first").sort("seq")
    r = pl.int_range(pl.len()).over("template_id")
    return cand.filter(r < params.max_per_template)


def score_lines(stats: LineStats, params: LineScoreParams, ruled: pl.DataFrame | None = None) -> pl.DataFrame:
    """Findings (FINDING_SCHEMA) of the flagged lines; ``ruled``: (file, line) a rule already won."""
    if stats.total == 0 or stats.candidates.height == 0:
        return empty_findings()
    n = stats.total
    rare_max = max(params.rare_min, params.rare_share * n)
    log_n = math.log(max(n, 2))
    c = stats.candidates.join(stats.counts.select("template_id", "template", "count", "first_seq"),
                              on="template_id", how="left")
    level = pl.col("level")
    rare = pl.col("count") <= rare_max
    stable = stats.counts.height <= params.novelty_max_rate * n
    new = (pl.col("seq") == pl.col("first_seq")) & (pl.col("first_seq") >= params.warmup_lines) & pl.lit(stable)
    err = level.is_in(list(ERROR_LEVELS)).fill_null(False)
    severe = level.is_in(list(SEVERE_LEVELS)).fill_null(False)
    quiet = level.is_in(list(QUIET_LEVELS)).fill_null(False)
    c = c.with_columns(_rare=rare, _new=new & ~quiet, _err=err, _severe=severe).filter(
        pl.col("_severe") | (pl.col("_rare") & pl.col("_err")) | pl.col("_new"))
    if ruled is not None and ruled.height and c.height:
        c = c.join(ruled.select("file", "line").unique(), on=["file", "line"], how="anti")
    if c.height == 0:
        return empty_findings()
    rarity = (1.0 - pl.col("count").cast(pl.Float64).log() / log_n).clip(0.0, 1.0)
    c = c.with_columns(_score=rarity.round(4))
    details = []
    for s, t, k, r, w, e, v, lv in c.select("_score", "template", "count", "_rare", "_new", "_err", "_severe",
                                            "level").iter_rows():
        why = (f"{lv} line; its template has {k} of {n} lines" if v else
               f"rare {lv} line: its template has {k} of {n} lines" if r and e else
               f"first line of a template not seen in the first {params.warmup_lines} lines")
        details.append(json.dumps({"score": s, "template": t, "template_lines": k, "lines": n, "rare": bool(r),
                                   "new_template": bool(w), "level": lv, "why": why}, sort_keys=True))
    out = c.with_columns(
        rule_id=pl.lit(RULE_ID), rule_version=pl.lit(1, pl.Int32), category=pl.lit("anomaly"),
        severity=pl.lit("low"), role=pl.when(pl.col("_new")).then(pl.lit("cause")).otherwise(pl.lit("info")),
        action=pl.lit("investigate"),
        detail=pl.Series(details, dtype=pl.String))
    return conform(out, FINDING_SCHEMA).sort(["time", "seq"], nulls_last=True)


__all__ = ["QUIET_LEVELS", "RULE_ID", "SEVERE_LEVELS", "LineScoreParams", "LineStats", "score_lines"]
