"""Self-test of the rule packs (``recovery-logs rules check``): an empty list means all is well.

Runs every ``must_match`` / ``must_not_match`` example through the same vectorised matcher used
at runtime (``detectors.rules.winners``), besides the static checks (TOML, schema, enums,
duplicate ids, regex compilation, literals, XID catalog gaps). It sits beside the loader, not in
it, because the matcher imports the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.detectors.rulepack import (
    CATALOG_FILE,
    Rule,
    RulePack,
    _check_top_level,
    _parse_catalog,
    _parse_rule,
    _read_toml,
    default_rules_dir,
    load_packs,
)
from recovery_logs.detectors.rules import winners
from recovery_logs.errors import RulePackError

__all__ = ["CheckFailure", "check_packs"]


@dataclass(frozen=True)
class CheckFailure:
    pack: str
    rule: str | None
    example: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.pack}:{self.rule}" if self.rule else self.pack
        ex = f" | example: {self.example!r}" if self.example is not None else ""
        return f"{where}: {self.message}{ex}"


def _static_failures(d: Path) -> list[CheckFailure]:
    """Load each file on its own, so that one broken file does not hide the others' problems."""
    out: list[CheckFailure] = []
    seen: dict[str, str] = {}
    for path in sorted(d.glob("*.toml")):
        data: dict[str, Any] = {}
        try:
            data = _read_toml(path)
            _check_top_level(data, str(path))
            for i, raw in enumerate(data.get("rule", []) or []):
                pack = (data.get("pack") or {}).get("name", path.stem)
                try:
                    r = _parse_rule(raw, pack, str(path), i)
                except RulePackError as exc:
                    out.append(CheckFailure(path.name, _rule_of(exc), None, str(exc)))
                    continue
                if r.id in seen:
                    out.append(CheckFailure(path.name, r.id, None, f"duplicate rule id (first in {seen[r.id]})"))
                seen.setdefault(r.id, path.name)
            if "xid" in data or "catalog" in data:
                _parse_catalog(data, str(path))
            if data.get("rule") and not isinstance(data.get("pack"), dict):
                out.append(CheckFailure(path.name, None, None, "missing [pack] table with a 'name'"))
        except RulePackError as exc:
            out.append(CheckFailure(path.name, _rule_of(exc), None, str(exc)))
    return out


def _rule_of(exc: RulePackError) -> str | None:
    rule = exc.context.get("rule")
    return None if rule is None else str(rule)


def check_packs(rules_dir: Path | None = None) -> list[CheckFailure]:
    """Compile and self-test every pack; an empty list means all is well.

    Checks: TOML and schema of every file, enum values (categories, roles, severities,
    actions), duplicate ids, that every pattern compiles in Polars' regex engine, that the
    literals of a rule occur in every ``must_match`` example (the prefilter must never drop a
    true match), that every ``must_match`` example is won by its rule and every
    ``must_not_match`` example is not, through the same vectorised matcher used at runtime,
    and that the XID catalog has no gaps (every code from 1 to its highest, every code a rule
    or the decode table refers to).
    """
    d = Path(rules_dir) if rules_dir is not None else default_rules_dir()
    if not d.is_dir():
        return [CheckFailure(str(d), None, None, "rules directory does not exist")]
    failures = _static_failures(d)
    if failures:
        return failures
    try:
        pack = load_packs(d)
    except RulePackError as exc:
        return [CheckFailure(str(d), _rule_of(exc), None, str(exc))]
    failures.extend(_catalog_failures(pack))
    texts: list[str] = []
    owners: list[tuple[Rule, bool]] = []
    for r in pack.rules:
        if not r.must_match:
            failures.append(CheckFailure(r.pack, r.id, None, "rule has no must_match examples"))
        for ex in r.must_match:
            if r.literals and not any(lit in ex for lit in r.literals):
                failures.append(CheckFailure(r.pack, r.id, ex, "no literal of the rule occurs in this example; "
                                             "the prefilter would drop it"))
            texts.append(ex)
            owners.append((r, True))
        for ex in r.must_not_match:
            texts.append(ex)
            owners.append((r, False))
    if not texts:
        return failures
    events = pl.DataFrame({"message": texts}, schema={"message": pl.String})
    won = winners(events, pack, prune_benign=False)
    got = dict(zip(won["_row"].to_list(), won["_rule_id"].to_list(), strict=True))
    for i, (r, positive) in enumerate(owners):
        winner = got.get(i)
        if positive and winner != r.id:
            why = "no rule matched" if winner is None else f"rule {winner!r} won instead"
            failures.append(CheckFailure(r.pack, r.id, texts[i], f"must_match example not won by this rule: {why}"))
        if not positive and winner == r.id:
            failures.append(CheckFailure(r.pack, r.id, texts[i], "must_not_match example matched this rule"))
    return failures


def _catalog_failures(pack: RulePack) -> list[CheckFailure]:
    out: list[CheckFailure] = []
    cat = pack.xid_catalog
    if any(r.category == "xid" for r in pack.rules) and not cat:
        out.append(CheckFailure(CATALOG_FILE, None, None, "XID rules exist but the XID catalog is empty"))
    if cat:
        missing = [c for c in range(1, max(cat) + 1) if c not in cat]
        if missing:
            out.append(CheckFailure(CATALOG_FILE, None, None, f"catalog gap: codes {missing} missing"))
    for r in pack.rules:
        x = r.fields.get("xid")
        if x is not None and int(x) not in cat:
            out.append(CheckFailure(r.pack, r.id, None, f"constant xid {x} is not in the catalog"))
    for xid, unit, status, _fatal in pack.nvlink5_decode:
        if xid not in cat:
            out.append(CheckFailure(CATALOG_FILE, f"nvlink5_decode {xid}/{unit}/{status:#x}", None,
                                    "decode row names an XID the catalog lacks"))
    for code, entry in cat.items():
        if entry.action == "drain_node_and_requeue" and entry.role != "cause":
            out.append(CheckFailure(CATALOG_FILE, f"xid.{code}", None, "a draining XID must have role 'cause'"))
    return out
