"""Loading, self-test (`rules check`), catalog completeness, LogsQL prefilter, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from recovery_logs.cli import main
from recovery_logs.detectors.rulecheck import check_packs
from recovery_logs.detectors.rulepack import default_rules_dir, load_packs
from recovery_logs.errors import RulePackError

CATALOG_MD = Path(__file__).resolve().parents[2] / "docs" / "reference" / "xid_catalog.md"
REPO = Path(__file__).resolve().parents[2]

GOOD_RULE = '''
[[rule]]
id = "{id}"
version = 1
category = "{category}"
severity = "high"
role = "cause"
action = "investigate"
priority = 1
literals = ["frobnicator"]
patterns = ['{pattern}']
must_match = ["frobnicator exploded"]
must_not_match = ["all fine"]
'''


def _write_pack(d: Path, name: str, *rules: str) -> Path:
    p = d / f"{name}.toml"
    p.write_text(f'[pack]\nname = "{name}"\nversion = 1\n' + "".join(rules))
    return p


def test_shipped_packs_pass_check():
    assert check_packs() == []


def test_default_rules_dir_is_checkout_rules():
    assert default_rules_dir() == REPO / "rules"
    assert (default_rules_dir() / "xid_catalog.toml").is_file()


def test_cli_rules_check_ok(capsys):
    assert main(["rules", "check"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


@pytest.mark.parametrize(("case", "rule_text", "expect"), [
    ("bad_regex", GOOD_RULE.format(id="t.bad", category="xid", pattern="frobnicator (exploded"), "t.bad"),
    ("unknown_category", GOOD_RULE.format(id="t.cat", category="gpu_sadness", pattern="frobnicator"), "gpu_sadness"),
    ("example_fails", GOOD_RULE.format(id="t.ex", category="xid", pattern="frobnicator imploded"), "t.ex"),
])
def test_cli_rules_check_fails_naming_the_rule(rules_copy, capsys, case, rule_text, expect):
    _write_pack(rules_copy, f"zz_{case}", rule_text)
    rc = main(["rules", "check", "--rules-dir", str(rules_copy)])
    err = capsys.readouterr().err
    assert rc == RulePackError.exit_code
    assert expect in err and f"zz_{case}" in err


def test_check_rejects_duplicate_id(rules_copy):
    rule = GOOD_RULE.format(id="nccl.watchdog_timeout", category="xid", pattern="frobnicator")
    _write_pack(rules_copy, "zz_dup", rule)
    failures = check_packs(rules_copy)
    assert any(f.rule == "nccl.watchdog_timeout" and "duplicate" in f.message for f in failures)
    with pytest.raises(RulePackError, match="duplicate rule id"):
        load_packs(rules_copy)


def test_check_flags_literal_that_misses_an_example(rules_copy):
    rule = GOOD_RULE.format(id="t.lit", category="xid", pattern="exploded").replace(
        'literals = ["frobnicator"]', 'literals = ["Frobnicator"]')
    _write_pack(rules_copy, "zz_lit", rule)
    failures = check_packs(rules_copy)
    assert any(f.rule == "t.lit" and "prefilter would drop" in f.message for f in failures)


def test_check_reports_catalog_gap(rules_copy):
    cat = rules_copy / "xid_catalog.toml"
    text = cat.read_text()
    start = text.index("[[xid]]\ncode = 13\n")
    end = text.index("[[xid]]", start + 5)
    cat.write_text(text[:start] + text[end:])
    failures = check_packs(rules_copy)
    assert any("catalog gap" in f.message and "13" in f.message for f in failures)


def test_typo_in_table_name_is_an_error(rules_copy):
    (rules_copy / "zz_typo.toml").write_text('[pack]\nname = "t"\n[[rules]]\nid = "t.x"\n')
    with pytest.raises(RulePackError, match="unknown top-level tables") as exc:
        load_packs(rules_copy)
    assert "zz_typo.toml" in str(exc.value)
    assert any("zz_typo.toml" in f.pack for f in check_packs(rules_copy))


def test_load_errors_name_the_file(tmp_path):
    (tmp_path / "broken.toml").write_text("[pack\nname=")
    with pytest.raises(RulePackError) as exc:
        load_packs(tmp_path)
    assert "broken.toml" in str(exc.value)
    with pytest.raises(RulePackError, match="does not exist"):
        load_packs(tmp_path / "nope")


def test_every_code_of_the_reference_catalog_is_in_the_toml(pack):
    md_codes = {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", CATALOG_MD.read_text(), re.M)}
    assert len(md_codes) >= 45
    md_codes |= set(range(162, 173))      # named in the prose under the table
    assert md_codes <= set(pack.xid_catalog)
    for code in md_codes:
        e = pack.xid_catalog[code]
        assert e.category and e.severity and e.role and e.action and e.mnemonic


def test_reference_engine_actions_are_kept(pack):
    """Where xid_catalog.md names one engine action, the TOML carries it."""
    rows = re.findall(r"^\| (\d+) \|.*\| `(\w+)`(?: \(deferred\))? \| [^|]+\|$", CATALOG_MD.read_text(), re.M)
    assert len(rows) >= 40
    for code, action in rows:
        assert pack.xid_catalog[int(code)].action == action, code


def test_catalog_roles_for_breadcrumbs_and_app_faults(pack):
    for code in (43, 45, 154):
        assert pack.xid(code).role == "breadcrumb"
    for code in (13, 31):
        e = pack.xid(code)
        assert (e.category, e.role, e.action) == ("xid", "cause", "none_user_bug")
    assert pack.xid(79).action == "drain_node_and_requeue"


def test_unknown_xid_is_investigate_never_fatal(pack):
    e = pack.xid(4242)
    assert e.action == "investigate" and e.severity != "critical"
    assert all(e.action != "drain_node_and_requeue" for e in (pack.xid(c) for c in (0, 173, 999)))


def test_logsql_prefilter_covers_every_must_match_example(pack):
    q = pack.logsql_prefilter()
    assert "(?i)" not in q and q != "*"
    regexps = [json.loads('"' + m + '"') for m in re.findall(r'_msg:~"((?:[^"\\]|\\.)*)"', q)]
    assert regexps
    compiled = [re.compile(r) for r in regexps]
    for r in pack.rules:
        if r.suppress:
            continue
        for ex in r.must_match:
            assert any(c.search(ex) for c in compiled), (r.id, ex)


def test_cli_rules_list_json(capsys):
    assert main(["rules", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ids = [r["id"] for r in rows]
    assert "nccl.watchdog_timeout" in ids and len(ids) == len(set(ids))
    prios = [r["priority"] for r in rows]
    assert prios == sorted(prios, reverse=True)


def test_cli_rules_test_shows_winner_and_fields(capsys):
    line = ("[rank11]:[E ProcessGroupNCCL.cpp:616] [Rank 11] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5035, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
            "600412 milliseconds before timing out.")
    assert main(["rules", "test", line]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["winner"] == "nccl.watchdog_timeout"
    assert out["finding"]["nccl_seq"] == 5035 and out["finding"]["nccl_op"] == "ALLREDUCE"
    assert json.loads(out["finding"]["detail"])["timeout_ms"] == "600000"
