"""Load and validate the rule packs (``rules/*.toml``) and the XID catalog.

A rule pack is data (see docs/ARCHITECTURE.md, "Rule packs"). This module turns the TOML files
into frozen records and checks them; matching itself lives in ``recovery_logs.detectors.rules``
and the self-test of every example (``check_packs``) in ``recovery_logs.detectors.rulecheck``,
which runs them through the very matcher used at runtime.

Files in a rules directory:

* ``<pack>.toml`` with ``[pack]`` (name, version, description) and ``[[rule]]`` tables;
* ``xid_catalog.toml`` with ``[catalog]``, ``[[xid]]`` rows (code -> mnemonic, category,
  severity, role, action), ``[[nvlink5_decode]]`` rows (XID 144-150 unit + error status ->
  fatal) and ``[xid154_actions]`` (NVML recovery-action number -> engine action).

Any problem (unreadable file, bad TOML, missing key, unknown enum value, pattern that does
not compile) raises ``RulePackError`` naming the file and the rule.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import RulePackError
from recovery_logs.schema import FINDING_EXTRA_SCHEMA, RULE_CATEGORIES, EngineAction, Role, Severity

CATALOG_FILE = "xid_catalog.toml"
ROLES = frozenset(r.value for r in Role)
SEVERITIES = frozenset(s.value for s in Severity)
ACTIONS = frozenset(a.value for a in EngineAction)
# Named groups with these names are converted into FINDING_SCHEMA columns by the matcher.
UNIT_GROUPS = frozenset({"step_time_ms", "it_per_s", "samples_per_s", "tokens_per_s", "xid_hex", "nvl_status", "nvl_unit",
                         "nvl_severity", "recovery_action"})
# Groups named step_time_ms_<part> (e.g. step_time_ms_fwd, step_time_ms_bwd) are summed into step_time_s.
STEP_PART_PREFIX = "step_time_ms_"
FIELD_COLUMNS = frozenset(FINDING_EXTRA_SCHEMA) - {"rule_id", "rule_version", "category", "severity", "role",
                                                   "action", "detail"}
_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_TOP_KEYS = {"pack", "rule", "catalog", "xid", "nvlink5_decode", "xid154_actions", "xid_fatal_actions"}
_RULE_KEYS = {"id", "version", "category", "severity", "role", "action", "priority", "patterns", "literals",
              "fields", "must_match", "must_not_match", "description", "suppress"}


@dataclass(frozen=True)
class Rule:
    id: str
    version: int
    pack: str
    category: str
    severity: str
    role: str
    action: str
    priority: int
    patterns: tuple[str, ...]
    literals: tuple[str, ...]
    fields: dict = field(default_factory=dict, hash=False, compare=False)
    must_match: tuple[str, ...] = ()
    must_not_match: tuple[str, ...] = ()
    description: str = ""
    suppress: bool = False          # a benign-line rule: when it wins, the line yields no finding

    def group_names(self, pattern_index: int) -> tuple[str, ...]:
        return tuple(_GROUP_NAME.findall(self.patterns[pattern_index]))


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    category: str
    severity: str
    role: str
    action: str
    description: str
    cause: str


def minimal_substrings(lits: Iterable[str]) -> tuple[str, ...]:
    """``lits`` without any that contains another, sorted: a line contains one of the result
    exactly when it contains one of ``lits``. Shortest first: a literal that contains another
    contains a kept one (containment is transitive), so each is tested against the kept few only
    (the default packs: 961 literals, 797 kept, 0.026 s against 0.077 s for testing every pair)."""
    kept: list[str] = []
    for x in sorted(set(lits), key=lambda s: (len(s), s)):
        if not any(k in x for k in kept):
            kept.append(x)
    return tuple(sorted(kept))


@dataclass(frozen=True)
class RulePack:
    rules: tuple[Rule, ...]
    xid_catalog: dict[int, XidEntry]
    sources: tuple[str, ...]
    nvlink5_decode: tuple[tuple[int, str, int, bool], ...] = ()   # (xid, unit, error_status, fatal)
    xid154_actions: dict[int, str] = field(default_factory=dict)
    xid_fatal_actions: dict[int, str] = field(default_factory=dict)   # XID 144-150 when decoded fatal

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    def xid(self, code: int) -> XidEntry:
        """The catalog entry for ``code``; an unknown code is 'investigate', never fatal."""
        entry = self.xid_catalog.get(int(code))
        if entry is not None:
            return entry
        return XidEntry(code=int(code), mnemonic="UNKNOWN_XID", category="xid", severity="medium", role="cause",
                        action=EngineAction.INVESTIGATE.value,
                        description=f"Xid {code} is not in the catalog", cause="unknown")

    def literals(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for r in self.rules:
            for lit in r.literals:
                seen.setdefault(lit, None)
        return tuple(seen)

    def every_line_needed(self) -> bool:
        """A rule without literals exists: it is tried on every message (even a suppress rule), so no
        line can be dropped (:meth:`needed_literals` is then None)."""
        return any(not r.literals for r in self.rules)

    def needed_literals(self, extra: Iterable[str] = ()) -> tuple[str, ...] | None:
        """Substrings one of which every line a non-suppress rule can match contains (plus
        ``extra``), minimal (a literal containing another is dropped), sorted; ``None`` when a
        rule has no literals (every line is needed). The one derivation behind the file
        prefilter, the replay/watch selection and the LogsQL prefilter
        (``detectors.literals.needed_literals``, :meth:`logsql_prefilter`)."""
        if self.every_line_needed():
            return None
        active = [r for r in self.rules if not r.suppress]
        return minimal_substrings({lit for r in active for lit in r.literals} | {x for x in extra if x})

    def logsql_prefilter(self) -> str:
        """A VictoriaLogs LogsQL filter that keeps every line any rule could match.

        One case-sensitive substring filter per :meth:`needed_literals` literal (``_msg:~"NVRM: Xid"``;
        regex metacharacters escaped), OR-ed: each is a plain substring test there, with no ``(?i)``
        (a case-insensitive regexp is 10-30x slower in VictoriaLogs). Rules without literals
        cannot be prefiltered, so their presence yields ``*`` (all lines). Suppress-only (benign)
        rules never need a line, so their literals are left out.
        """
        lits = self.needed_literals()
        if not lits:
            return "*"
        parts = ['_msg:~"' + _re2_escape(lit).replace("\\", "\\\\").replace('"', '\\"') + '"' for lit in lits]
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def _re2_escape(lit: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", lit)


def default_rules_dir() -> Path:
    """The checkout's top-level ``rules/`` when running from a checkout, else the packaged copy."""
    pkg = Path(__file__).resolve().parent.parent   # recovery_logs/
    checkout = pkg.parent / "rules"
    if checkout.is_dir() and (pkg.parent / "pyproject.toml").is_file():
        return checkout
    return pkg / "_rules"


# --------------------------------------------------------------------------- loading

def _toml_bytes(path: Path, blob: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(blob.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RulePackError("rule file is not valid TOML", file=str(path), reason=str(exc)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise RulePackError("rule file is not valid TOML", file=str(path), reason=str(exc)) from exc


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise RulePackError("cannot read rule file", file=str(path), reason=str(exc)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise RulePackError("rule file is not valid TOML", file=str(path), reason=str(exc)) from exc


def _str_tuple(value: Any, what: str, file: str, rule: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RulePackError(f"'{what}' must be a list of strings", file=file, rule=rule)
    return tuple(value)


def _enum(value: Any, allowed: frozenset[str], what: str, file: str, rule: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise RulePackError(f"unknown {what} {value!r} (allowed: {', '.join(sorted(allowed))})",
                            file=file, rule=rule)
    return value


def _compile_check(pattern: str, file: str, rule: str) -> None:
    try:
        pl.select(pl.lit("", dtype=pl.String).str.contains(pattern))
    except pl.exceptions.PolarsError as exc:
        msg = str(exc).split("\n\nThis error occurred")[0]
        raise RulePackError("pattern does not compile (Rust regex syntax: no look-around, no back-references)",
                            file=file, rule=rule, pattern=pattern, reason=msg) from exc


def _parse_rule(raw: Any, pack: str, file: str, index: int) -> Rule:
    if not isinstance(raw, dict):
        raise RulePackError(f"[[rule]] #{index} is not a table", file=file)
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise RulePackError(f"[[rule]] #{index} has no string 'id'", file=file)
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise RulePackError(f"unknown keys {sorted(unknown)}", file=file, rule=rid)
    for key in ("version", "priority"):
        if not isinstance(raw.get(key, 1 if key == "version" else 0), int):
            raise RulePackError(f"'{key}' must be an integer", file=file, rule=rid)
    patterns = _str_tuple(raw.get("patterns"), "patterns", file, rid)
    if not patterns:
        raise RulePackError("rule has no patterns", file=file, rule=rid)
    for p in patterns:
        _compile_check(p, file, rid)
        for name in _GROUP_NAME.findall(p):
            if name in {"rule_id", "category", "severity", "role", "action", "detail"} | set(
                    ("time", "host", "message", "seq")):
                raise RulePackError(f"named group {name!r} would overwrite a fixed column", file=file, rule=rid)
    fields = raw.get("fields", {}) or {}
    if not isinstance(fields, dict):
        raise RulePackError("'fields' must be a table", file=file, rule=rid)
    for k in fields:
        if k not in FIELD_COLUMNS:
            raise RulePackError(f"constant field {k!r} is not a finding column "
                                f"({', '.join(sorted(FIELD_COLUMNS))})", file=file, rule=rid)
    return Rule(
        id=rid, version=int(raw.get("version", 1)), pack=pack,
        category=_enum(raw.get("category"), RULE_CATEGORIES, "category", file, rid),
        severity=_enum(raw.get("severity"), SEVERITIES, "severity", file, rid),
        role=_enum(raw.get("role"), ROLES, "role", file, rid),
        action=_enum(raw.get("action"), ACTIONS, "action", file, rid),
        priority=int(raw.get("priority", 0)), patterns=patterns,
        literals=tuple(x for x in _str_tuple(raw.get("literals"), "literals", file, rid) if x),
        fields=dict(fields),
        must_match=_str_tuple(raw.get("must_match"), "must_match", file, rid),
        must_not_match=_str_tuple(raw.get("must_not_match"), "must_not_match", file, rid),
        description=str(raw.get("description", "")), suppress=bool(raw.get("suppress", False)),
    )


def _action_table(data: dict[str, Any], key: str, file: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for k, v in (data.get(key, {}) or {}).items():
        if not str(k).isdigit():
            raise RulePackError(f"{key} keys must be integers", file=file, rule=str(k))
        out[int(k)] = _enum(v, ACTIONS, "action", file, f"{key}.{k}")
    return out


def _parse_catalog(data: dict[str, Any], file: str) -> tuple[dict[int, XidEntry], tuple, dict[int, str]]:
    catalog: dict[int, XidEntry] = {}
    for i, row in enumerate(data.get("xid", []) or []):
        code = row.get("code") if isinstance(row, dict) else None
        if not isinstance(code, int) or code <= 0:
            raise RulePackError(f"[[xid]] #{i} has no positive integer 'code'", file=file)
        name = f"xid.{code}"
        if code in catalog:
            raise RulePackError("duplicate XID code in catalog", file=file, rule=name)
        catalog[code] = XidEntry(
            code=code, mnemonic=str(row.get("mnemonic", "")),
            category=_enum(row.get("category"), RULE_CATEGORIES, "category", file, name),
            severity=_enum(row.get("severity"), SEVERITIES, "severity", file, name),
            role=_enum(row.get("role"), ROLES, "role", file, name),
            action=_enum(row.get("action"), ACTIONS, "action", file, name),
            description=str(row.get("description", "")), cause=str(row.get("cause", "")))
    decode = []
    for i, row in enumerate(data.get("nvlink5_decode", []) or []):
        try:
            decode.append((int(row["xid"]), str(row["unit"]), int(row["error_status"]), bool(row["fatal"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise RulePackError(f"[[nvlink5_decode]] #{i} needs xid, unit, error_status, fatal", file=file) from exc
    return catalog, tuple(decode), _action_table(data, "xid154_actions", file)


def _check_top_level(data: dict[str, Any], file: str) -> None:
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise RulePackError(f"unknown top-level tables {unknown} (allowed: {', '.join(sorted(_TOP_KEYS))})", file=file)
    if not data.get("rule") and not data.get("xid"):
        raise RulePackError("file defines no [[rule]] and no [[xid]] entries", file=file)


def load_packs(rules_dir: Path | None = None) -> RulePack:
    """Load every ``*.toml`` under ``rules_dir`` (default: ``default_rules_dir()``).

    Rules are ordered by priority (descending), then file name, then position in the file;
    that is the order in which the matcher lets them win.
    """
    d = Path(rules_dir) if rules_dir is not None else default_rules_dir()
    if not d.is_dir():
        raise RulePackError("rules directory does not exist", path=str(d))
    files = sorted(d.glob("*.toml"))
    if not files:
        raise RulePackError("no rule packs (*.toml) in rules directory", path=str(d))
    blobs = []
    for path in files:
        try:
            blobs.append(path.read_bytes())
        except OSError as exc:
            raise RulePackError("cannot read rule file", file=str(path), reason=str(exc)) from exc
    key = _cache_key(files, blobs)
    cached = _cache_read(key, files)
    if cached is not None:
        return cached
    pack = _load_files(files, blobs)
    _cache_write(key, pack)
    return pack


def _load_files(files: list[Path], blobs: list[bytes]) -> RulePack:
    rules: list[Rule] = []
    catalog: dict[int, XidEntry] = {}
    decode: tuple = ()
    actions: dict[int, str] = {}
    fatal_actions: dict[int, str] = {}
    seen: dict[str, str] = {}
    for path, blob in zip(files, blobs, strict=True):
        data = _toml_bytes(path, blob)
        file = str(path)
        _check_top_level(data, file)
        if "xid" in data or "catalog" in data:
            cat, dec, act = _parse_catalog(data, file)
            dup = set(cat) & set(catalog)
            if dup:
                raise RulePackError("XID codes defined twice", file=file, codes=sorted(dup))
            catalog.update(cat)
            decode = decode + dec
            actions.update(act)
            fatal_actions.update(_action_table(data, "xid_fatal_actions", file))
        raw_rules = data.get("rule", []) or []
        if not raw_rules:
            continue
        pack_meta = data.get("pack")
        if not isinstance(pack_meta, dict) or not isinstance(pack_meta.get("name"), str):
            raise RulePackError("missing [pack] table with a 'name'", file=file)
        pack_name = pack_meta["name"]
        for i, raw in enumerate(raw_rules):
            rule = _parse_rule(raw, pack_name, file, i)
            if rule.id in seen:
                raise RulePackError("duplicate rule id", file=file, rule=rule.id, first_defined_in=seen[rule.id])
            seen[rule.id] = file
            rules.append(rule)
    order = sorted(range(len(rules)), key=lambda i: (-rules[i].priority, i))
    return RulePack(rules=tuple(rules[i] for i in order), xid_catalog=dict(sorted(catalog.items())),
                    sources=tuple(str(p) for p in files), nvlink5_decode=decode, xid154_actions=actions,
                    xid_fatal_actions=fatal_actions)


# --------------------------------------------------------------------------- compiled-pack cache
# Loading validates every pattern by compiling it (~0.3 s for the shipped packs) and parses 17 TOML
# files; a replay of a small directory would spend most of its start-up there. The validated pack is
# kept as JSON (data only, never code) under the user's cache directory, keyed by the sha256 of the
# pack files' names and bytes, this module's own source and the Polars version (the regex engine
# that validated the patterns): any change to a pack, the loader or Polars is a different key.
# RECOVERY_LOGS_CACHE_DIR names the directory ("off" disables the cache); default
# $XDG_CACHE_HOME/recovery-logs or ~/.cache/recovery-logs. A cache that cannot be read or written
# is ignored (loading is then as before).
CACHE_FORMAT = 1


def cache_dir() -> Path | None:
    """Where compiled packs are cached, or None when caching is off."""
    env = os.environ.get("RECOVERY_LOGS_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "recovery-logs"


def _cache_key(files: list[Path], blobs: list[bytes]) -> str:
    h = hashlib.sha256(f"rulepack-cache {CACHE_FORMAT} polars {pl.__version__}\n".encode())
    try:
        h.update(Path(__file__).read_bytes())
    except OSError:
        h.update(b"?")
    for path, blob in zip(files, blobs, strict=True):
        h.update(f"{path.name}\0{len(blob)}\0".encode())
        h.update(blob)
    return h.hexdigest()


def _cache_path(key: str) -> Path | None:
    d = cache_dir()
    return None if d is None else d / "rulepacks" / f"{key}.json"


def _cache_read(key: str, files: list[Path]) -> RulePack | None:
    path = _cache_path(key)
    if path is None:
        return None
    try:
        data = json.loads(path.read_bytes())
        if data.get("key") != key:
            return None
        rules = tuple(Rule(**{**r, "patterns": tuple(r["patterns"]), "literals": tuple(r["literals"]),
                              "must_match": tuple(r["must_match"]), "must_not_match": tuple(r["must_not_match"])})
                      for r in data["rules"])
        catalog = {int(e["code"]): XidEntry(**e) for e in data["xid_catalog"]}
        return RulePack(rules=rules, xid_catalog=catalog, sources=tuple(str(p) for p in files),
                        nvlink5_decode=tuple((int(a), str(b), int(c), bool(d)) for a, b, c, d in data["nvlink5_decode"]),
                        xid154_actions={int(k): v for k, v in data["xid154_actions"].items()},
                        xid_fatal_actions={int(k): v for k, v in data["xid_fatal_actions"].items()})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None     # no cache (or a damaged one): load and validate as usual


def _cache_write(key: str, pack: RulePack) -> None:
    path = _cache_path(key)
    if path is None:
        return
    data = {"key": key, "rules": [asdict(r) for r in pack.rules],
            "xid_catalog": [asdict(e) for e in pack.xid_catalog.values()],
            "nvlink5_decode": [list(x) for x in pack.nvlink5_decode],
            "xid154_actions": {str(k): v for k, v in pack.xid154_actions.items()},
            "xid_fatal_actions": {str(k): v for k, v in pack.xid_fatal_actions.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        pass            # a read-only or full cache directory only costs the next start-up


# --------------------------------------------------------------------------- self-test


__all__ = ["CATALOG_FILE", "STEP_PART_PREFIX", "Rule", "RulePack", "XidEntry", "cache_dir", "default_rules_dir",
           "load_packs", "minimal_substrings"]
