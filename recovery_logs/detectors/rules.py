"""Vectorised rule matching: events (EVENT_SCHEMA) -> findings (FINDING_SCHEMA).

No per-line Python loop. The steps, all Polars expressions over the whole batch:

1. **Prefilter** — one regex alternation of the rule literals (the gate) over every message, then
   one Aho-Corasick pass (``str.extract_many``) over the messages it admits: the literals each one
   holds. A message that holds none cannot be won by a literal-carrying rule.
2. **Candidates** — a message's candidates are the (rule, pattern) units of every literal it holds,
   plus every unit of a rule without literals (a candidate of every message), in winning order.
   They are made once per distinct set of literals (most lines of a log share theirs).
3. **Winner** — in rounds, each message's next candidate is tested with ``str.contains`` (per-row
   pattern column; Polars caches the compiled regexes); the first that matches wins: one finding
   per event at most.
4. **Extraction** — per winning pattern, ``str.extract_groups`` on the rows it won only. Named
   groups named like FINDING_SCHEMA columns fill those columns; ``step_time_ms`` and
   ``it_per_s``/``samples_per_s``/``tokens_per_s`` (inverted) become ``step_time_s``, ``step_time_ms_<part>`` groups are summed; every other group goes into ``detail`` (JSON).
5. **XID classification** — findings of ``category = "xid"`` rules with an ``xid`` take
   category/severity/role/action from the catalog (unknown code -> investigate, never
   fatal); XID 144-150 are decoded fatal/non-fatal (undecodable: the catalog's action for the code);
   XID 154 takes the action its recovery-action
   number names. Their ``rule_id`` is ``xid.<code>``; the matching rule is in ``detail.rule``.
"""

from __future__ import annotations

import functools

import polars as pl

from recovery_logs.detectors.rulepack import STEP_PART_PREFIX, Rule, RulePack
from recovery_logs.schema import EVENT_SCHEMA, FINDING_EXTRA_SCHEMA, FINDING_SCHEMA, check_events, conform

_META = ("rule_id", "rule_version", "category", "severity", "role", "action")
_VALUE_COLS = tuple(c for c in FINDING_EXTRA_SCHEMA if c not in _META + ("detail",))
_CONVERTED = {"step_time_ms", "it_per_s", "samples_per_s", "tokens_per_s"}
_DECODE_ONLY = {"nvl_unit", "nvl_status", "nvl_severity", "recovery_action"}
NVLINK5_XIDS = range(144, 151)


def _units(pack: RulePack) -> list[tuple[Rule, int]]:
    """(rule, pattern index) in winning order."""
    return [(r, i) for r in pack.rules for i in range(len(r.patterns))]


@functools.lru_cache(maxsize=8)
def _gate(rules: tuple[Rule, ...], prune_benign: bool) -> list[str]:
    """The literals a message must contain for any (non-benign) rule to win it, without those that
    contain another one ("Xid" already admits every line "NVRM: Xid" does): the same lines, a
    smaller automaton."""
    lits = list(dict.fromkeys(lit for r in rules if not (prune_benign and r.suppress) for lit in r.literals))
    if not lits:
        return []
    # one Aho-Corasick pass of the literals over themselves (a start-up cost of ~0.2 s as a
    # pairwise Python loop): a literal is dropped when it contains another one
    found = pl.Series(lits, dtype=pl.String).str.extract_many(lits, overlapping=True).to_list()
    return [x for x, hits in zip(lits, found, strict=True) if not any(y != x for y in hits)]


_META_CHARS = frozenset("\\.+*?()|[]{}^$#&-~")


def escape_literal(lit: str) -> str:
    """``lit`` as a Rust-regex literal (the characters ``regex::escape`` escapes)."""
    return "".join("\\" + c if c in _META_CHARS else c for c in lit)


@functools.lru_cache(maxsize=16)
def _gate_regex(lits: tuple[str, ...]) -> str:
    return "|".join(escape_literal(x) for x in lits)


def gate_regex(lits: list[str] | tuple[str, ...]) -> str:
    """One regex alternation of the literals: a line matches it iff it contains one of them. The
    Rust regex engine scans a large literal set about twice as fast as ``str.contains_any`` (362
    gate literals over 22 MB: 0.075 s vs 0.145 s), the same lines."""
    return _gate_regex(tuple(lits))


def winners(events: pl.DataFrame, pack: RulePack, prune_benign: bool = True) -> pl.DataFrame:
    """Which rule wins each event that any rule matches.

    Returns ``_row`` (index into ``events``), ``_u`` (index into the rule/pattern units),
    ``_rule_id`` and ``message``. Used by :func:`match` and by ``rulecheck.check_packs``.

    With ``prune_benign`` (the runtime default) a line that contains only the literals of
    ``suppress`` rules is dropped at the prefilter: no finding-producing rule could win it, so
    the benign rules need not run. ``check_packs`` passes False to prove that each suppress rule
    does win its own examples.
    """
    units = _units(pack)
    out_schema = {"_row": pl.UInt32, "_u": pl.UInt32, "_rule_id": pl.String, "message": pl.String}
    if events.height == 0 or not units:
        return pl.DataFrame(schema=out_schema)
    base = events.select(pl.col("message").cast(pl.String).fill_null("")).with_row_index("_row")
    unit_tab = pl.DataFrame({
        "_u": list(range(len(units))),
        "_pattern": [r.patterns[i] for r, i in units],
        "_rule_id": [r.id for r, _ in units],
    }, schema={"_u": pl.UInt32, "_pattern": pl.String, "_rule_id": pl.String})
    lit_rows = [(lit, u) for u, (r, _) in enumerate(units) for lit in r.literals]
    lit_tab = pl.DataFrame({"_lit": [a for a, _ in lit_rows], "_u": [b for _, b in lit_rows]},
                           schema={"_lit": pl.String, "_u": pl.UInt32})
    all_lits = lit_tab["_lit"].unique(maintain_order=True).to_list()
    free = [u for u, (r, _) in enumerate(units) if not r.literals]
    gate = _gate(pack.rules, prune_benign) if all_lits else []
    admitted = pl.col("message").str.contains(gate_regex(gate)) if gate else pl.lit(False)
    found = (pl.col("message").str.extract_many(all_lits, overlapping=True) if all_lits
             else pl.lit([], dtype=pl.List(pl.String)))
    if free:
        # a unit without literals is a candidate of every line: every row goes on, one the gate does not
        # admit with no literal (the literals it holds are only benign rules')
        rows = base.select("_row", pl.when(admitted).then(found).otherwise(pl.lit([], dtype=pl.List(pl.String)))
                           .alias("_lit"))
    else:
        rows = base.filter(admitted).select("_row", found.alias("_lit")).filter(pl.col("_lit").list.len() > 0)
    return _first_matching_by_set(rows, lit_tab, free, unit_tab,
                                  base.get_column("message")).select("_row", "_u", "_rule_id", "message")


# (row, candidate unit) pairs up to which every pair is tested in one pass (each round of the loop
# costs a few Polars calls, ~0.3 ms, whatever its size; one pair's regex test costs ~1 us)
ALL_PAIRS_MAX = 20_000


def _first_matching_by_set(hits: pl.DataFrame, lit_tab: pl.DataFrame, free: list[int],
                           unit_tab: pl.DataFrame, messages: pl.Series) -> pl.DataFrame:
    """Per row the first unit, in unit (winning) order, whose pattern matches its message. A row's
    candidates are the units of every literal it holds (``hits``: ``_row`` and the list ``_lit``) and
    the units without literals (``free``). They are made once per distinct *set* of literals: most
    lines of a log share their set (every progress line of a job holds the same literal), so a row
    carries only its set's id and round ``k`` tries the set's ``k``-th unit; a row that matched is
    done. The same winners as testing every (row, candidate unit) pair and keeping each row's first
    match, without millions of pairs to dedupe and sort, and with fewer regex runs."""
    hits = hits.with_columns(pl.col("_lit").list.unique())
    # the set's key in the order the literals occur (sorting string lists is slow in Polars): the same
    # literals in another order are another key with the same units, which changes nothing
    hits = hits.with_columns(pl.col("_lit").list.join("\x00").alias("_key"))
    sets = hits.select("_key", "_lit").unique("_key", maintain_order=True).with_row_index("_set")
    set_units = sets.select("_set", "_lit").explode("_lit").join(lit_tab, on="_lit", how="inner").select("_set", "_u")
    if free:
        set_units = pl.concat([set_units, sets.select("_set").join(
            pl.DataFrame({"_u": free}, schema={"_u": pl.UInt32}), how="cross")])
    set_k = (set_units.unique().sort(["_set", "_u"])
             .with_columns(pl.int_range(pl.len(), dtype=pl.UInt32).over("_set").alias("_k")))
    alive = hits.select("_row", "_key").join(sets.select("_key", "_set"), on="_key", how="inner").select("_row", "_set")
    n_pairs = alive.join(set_k.group_by("_set").len(), on="_set", how="inner").get_column("len").sum()
    if n_pairs <= ALL_PAIRS_MAX:
        # few (row, candidate) pairs (an excerpt, a short window): every pair in one pass, each row's
        # lowest matching unit kept — the same winners as the rounds below, without a round per candidate
        hit = _tested(alive.join(set_k.select("_set", "_u"), on="_set", how="inner"), unit_tab, messages)
        return (hit.filter(pl.col("_ok")).sort(["_row", "_u"]).unique("_row", keep="first", maintain_order=True)
                .select("_row", "_u", "_rule_id", "message"))
    won: list[pl.DataFrame] = []
    k = 0
    while alive.height:
        head = _tested(alive.join(set_k.filter(pl.col("_k") == k).select("_set", "_u"), on="_set", how="inner"),
                       unit_tab, messages)
        if head.height == 0:
            break
        hit = head.filter(pl.col("_ok"))
        won.append(hit.select("_row", "_u", "_rule_id", "message"))
        alive = alive.join(head.select("_row"), on="_row", how="semi")     # rows that had a k-th candidate
        if hit.height:
            alive = alive.join(hit.select("_row"), on="_row", how="anti")
        k += 1
    if not won:
        return pl.DataFrame(schema={"_row": pl.UInt32, "_u": pl.UInt32, "_rule_id": pl.String, "message": pl.String})
    return pl.concat(won).sort("_row")


def _tested(pairs: pl.DataFrame, unit_tab: pl.DataFrame, messages: pl.Series) -> pl.DataFrame:
    """(row, unit) candidate pairs with the unit's rule id, the row's message and ``_ok``: its pattern matches."""
    head = (pairs.select("_row", "_u").sort("_u")     # by pattern: consecutive rows reuse the compiled regex
            .join(unit_tab, on="_u", how="left", maintain_order="left"))
    return (head.with_columns(messages.gather(head.get_column("_row")).alias("message"))
            .with_columns(pl.col("message").str.contains(pl.col("_pattern")).alias("_ok")))


def _extract(sub: pl.DataFrame, rule: Rule, pattern: str) -> pl.DataFrame:
    """Columns filled from one pattern's named groups (and the rule's constant fields)."""
    names = list(dict.fromkeys(rule.group_names(rule.patterns.index(pattern))))
    cols: dict[str, pl.Expr] = {}
    detail_fields: list[pl.Expr] = []
    frame = sub.select("_row", "message")
    if names:
        frame = frame.with_columns(pl.col("message").str.extract_groups(pattern).alias("_g"))
        g = pl.col("_g").struct.field
        for n in names:
            if n in _VALUE_COLS:
                cols[n] = g(n)
            if n == "step_time_ms":
                cols["step_time_s"] = g(n).str.replace_all(",", "").cast(pl.Float64, strict=False) / 1000.0
            elif n in ("it_per_s", "samples_per_s", "tokens_per_s"):
                # a rate: its inverse is the (relative) time per step, comparable across ranks of one job
                cols["step_time_s"] = 1.0 / g(n).str.replace_all(",", "").cast(pl.Float64, strict=False)
            if n in _DECODE_ONLY:
                cols["_" + n] = g(n)
            if n not in _VALUE_COLS:
                detail_fields.append(g(n).alias(n))
    parts = [n for n in names if n.startswith(STEP_PART_PREFIX)]
    if parts:   # per-phase timings (forward, backward, optimizer ...): their sum is the step time
        cols["step_time_s"] = pl.sum_horizontal(
            [g(n).str.replace_all(",", "").cast(pl.Float64, strict=False) for n in parts]) / 1000.0
    for k, v in rule.fields.items():   # constants; a named group of the same name wins where it matched
        cols[k] = pl.coalesce(cols[k].cast(pl.String), pl.lit(str(v))) if k in names else pl.lit(v)
    exprs = [pl.col("_row")]
    for c, e in cols.items():
        dtype = FINDING_SCHEMA.get(c, pl.String)
        if c in ("xid", "gpu", "nccl_seq", "step") and c in names:
            e = e.str.replace_all(",", "")
        if c == "pci":
            # "0000:3B:00.0" / "00000000:3b:00.0" / "PCI:0000:3b:00" -> "0000:3b:00", as Xid lines print it
            e = e.str.to_lowercase().str.replace(
                r"^(?:pci:)?(?:0000)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-7])?$", "$1")
        exprs.append(e.cast(dtype, strict=False).alias(c))
    if detail_fields:
        exprs.append(pl.struct(detail_fields).struct.json_encode().alias("_detail"))
    return frame.select(exprs)


def match(events: pl.DataFrame, pack: RulePack) -> pl.DataFrame:
    """EVENT_SCHEMA in, FINDING_SCHEMA out: one finding per event that a rule wins.

    Output rows keep the input order. Lines won by a ``suppress`` (benign) rule yield nothing.
    """
    check_events(events, "rules.match input")
    won = winners(events, pack)
    units = _units(pack)
    if won.height:
        suppressed = [u for u, (r, _) in enumerate(units) if r.suppress]
        won = won.filter(~pl.col("_u").is_in(suppressed))
    if won.height == 0:
        return pl.DataFrame(schema=FINDING_SCHEMA)
    parts = []
    for u in won["_u"].unique().sort().to_list():
        rule, pi = units[u]
        sub = won.filter(pl.col("_u") == u)
        part = _extract(sub, rule, rule.patterns[pi])
        meta = {"rule_id": rule.id, "rule_version": rule.version, "category": rule.category,
                "severity": rule.severity, "role": rule.role, "action": rule.action}
        part = part.with_columns([pl.lit(v).alias(k) for k, v in meta.items()])
        parts.append(part)
    ext = pl.concat(parts, how="diagonal_relaxed")
    for c in ("_detail", "_nvl_unit", "_nvl_status", "_nvl_severity", "_recovery_action", *_VALUE_COLS):
        if c not in ext.columns:
            ext = ext.with_columns(pl.lit(None, dtype=FINDING_SCHEMA.get(c, pl.String)).alias(c))
    ext = _classify_xid(ext, pack).sort("_row")
    # one finding per won event (_row is unique): the events' rows gathered in order, not joined
    # (a name in both keeps the event's column, as the join did)
    ev = pl.concat([events.gather(ext["_row"]), ext.drop("_row", *[c for c in ext.columns if c in events.columns])],
                   how="horizontal")
    return conform(ev, FINDING_SCHEMA)


def _classify_xid(ext: pl.DataFrame, pack: RulePack) -> pl.DataFrame:
    """XID findings classified from the catalog (module docstring, step 5); the other rows as they
    are, with ``detail`` from ``_detail``. Only the XID rows go through the catalog joins (on a fleet
    nearly every row is a progress line): the rows come back in another order (the caller sorts)."""
    is_xid = ((pl.col("category") == "xid") & pl.col("xid").is_not_null()).fill_null(False)
    mask = ext.select(is_xid).to_series()
    if not mask.any():
        return ext.with_columns(pl.col("_detail").alias("detail"))
    rest = ext.filter(~mask).with_columns(pl.col("_detail").alias("detail"))
    out = _classify_xid_rows(ext.filter(mask), pack)
    return pl.concat([out, rest], how="diagonal_relaxed")


def _classify_xid_rows(ext: pl.DataFrame, pack: RulePack) -> pl.DataFrame:
    """Rows that are all XID findings (category ``xid``, code set; :func:`_classify_xid` picks
    them) classified from the catalog."""
    codes = ext["xid"].unique().drop_nulls().to_list()
    entries = [pack.xid(int(c)) for c in codes]
    cat = pl.DataFrame({
        "xid": [e.code for e in entries], "_x_category": [e.category for e in entries],
        "_x_severity": [e.severity for e in entries], "_x_role": [e.role for e in entries],
        "_x_action": [e.action for e in entries], "_x_mnemonic": [e.mnemonic for e in entries],
    }, schema_overrides={"xid": pl.Int32})
    ext = ext.join(cat, on="xid", how="left")
    # XID 144-150: fatal from the decode sheet (unit + error status), else from the Fatal/Nonfatal word.
    status = pl.col("_nvl_status").str.replace(r"^0[xX]", "").str.to_integer(base=16, strict=False)
    if pack.nvlink5_decode:
        dec = pl.DataFrame([{"xid": x, "_nvl_unit": u, "_status_i": s, "_dec_fatal": f}
                            for x, u, s, f in pack.nvlink5_decode],
                           schema={"xid": pl.Int32, "_nvl_unit": pl.String, "_status_i": pl.Int64,
                                   "_dec_fatal": pl.Boolean})
        ext = (ext.with_columns(status.cast(pl.Int64).alias("_status_i"))
               .join(dec, on=["xid", "_nvl_unit", "_status_i"], how="left"))
    else:
        ext = ext.with_columns(pl.lit(None, pl.Boolean).alias("_dec_fatal"), pl.lit(None, pl.Int64).alias("_status_i"))
    word = (pl.when(pl.col("_nvl_severity").str.to_lowercase().str.starts_with("non")).then(False)
            .when(pl.col("_nvl_severity").str.to_lowercase().str.contains("fatal")).then(True))
    in_nvl5 = pl.col("xid").is_in(list(NVLINK5_XIDS))
    fatal = pl.when(in_nvl5).then(pl.coalesce(pl.col("_dec_fatal"), word)).otherwise(pl.col("fatal"))
    ext = ext.with_columns(fatal.alias("fatal"))
    fatal_act = pl.col("xid").replace_strict(pack.xid_fatal_actions or {0: "reset_gpu"}, default=None,
                                             return_dtype=pl.String)
    act154 = (pl.col("_recovery_action").str.replace(r"^0[xX]", "").str.to_integer(base=16, strict=False)
              .replace_strict(pack.xid154_actions or {-1: "investigate"}, default=None, return_dtype=pl.String))
    action = (pl.when(in_nvl5 & pl.col("fatal").eq(True)).then(pl.coalesce(fatal_act, pl.col("_x_action")))
              .when(in_nvl5 & pl.col("fatal").eq(False)).then(pl.lit("investigate"))
              # decode failed (unit/status not in the sheet, no Fatal/Nonfatal word): the catalog's action
              # for the code stands, never a weaker one
              .when(in_nvl5).then(pl.col("_x_action"))
              .when(pl.col("xid") == 154).then(pl.coalesce(act154, pl.col("_x_action")))
              .otherwise(pl.col("_x_action")))
    severity = (pl.when(in_nvl5 & pl.col("fatal").eq(True)).then(pl.lit("critical"))
                .when(in_nvl5 & pl.col("fatal").eq(False)).then(pl.lit("low"))
                .otherwise(pl.col("_x_severity")))
    extra = pl.struct(pl.col("rule_id").alias("rule"), pl.col("_x_mnemonic").alias("mnemonic")).struct.json_encode()
    detail = (pl.when(pl.col("_detail").is_null()).then(extra)
              .otherwise(pl.concat_str([extra.str.strip_suffix("}"), pl.lit(","),
                                        pl.col("_detail").str.strip_prefix("{")])))
    return ext.with_columns(
        action.alias("action"), severity.alias("severity"),
        pl.col("_x_role").alias("role"), pl.col("_x_category").alias("category"),
        pl.concat_str([pl.lit("xid."), pl.col("xid").cast(pl.String)]).alias("rule_id"),
        detail.alias("detail"),
    )


def explain(line: str, pack: RulePack) -> dict:
    """What `rules test LINE` prints: every rule whose pattern matches, the winner, the finding."""
    events = conform(pl.DataFrame({"message": [line]}), EVENT_SCHEMA)
    won = winners(events, pack, prune_benign=False)
    matching = [r.id for r in pack.rules
                if any(pl.select(pl.lit(line).str.contains(p)).item() for p in r.patterns)
                and (not r.literals or any(lit in line for lit in r.literals))]
    winner = won["_rule_id"][0] if won.height else None
    found = match(events, pack)
    finding = None
    if found.height:
        row = found.row(0, named=True)
        finding = {k: row[k] for k in FINDING_EXTRA_SCHEMA if row[k] is not None}
    suppressed = winner is not None and pack.rule(winner).suppress
    return {"line": line, "matching_rules": matching, "winner": winner, "suppressed": suppressed,
            "finding": finding}


__all__ = ["explain", "match", "winners"]
