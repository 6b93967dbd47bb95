"""The compiled-pack cache (detectors/rulepack.py): same pack as a fresh load, keyed by content."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recovery_logs.detectors import rulepack
from recovery_logs.detectors.rulepack import default_rules_dir, load_packs
from recovery_logs.errors import RulePackError


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), d)
    monkeypatch.setenv("RECOVERY_LOGS_CACHE_DIR", str(tmp_path / "cache"))
    return d


def _same(a: rulepack.RulePack, b: rulepack.RulePack) -> None:
    assert a == b
    assert [r.fields for r in a.rules] == [r.fields for r in b.rules]     # not part of Rule equality


def test_second_load_comes_from_the_cache_and_equals_a_fresh_load(rules: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_packs(rules)
    cached = list((tmp_path / "cache" / "rulepacks").glob("*.json"))
    assert len(cached) == 1
    monkeypatch.setattr(rulepack, "_load_files", lambda *a: pytest.fail("validated again despite the cache"))
    second = load_packs(rules)
    _same(first, second)


def test_a_changed_pack_is_validated_again(rules: Path) -> None:
    load_packs(rules)
    f = rules / "ucx.toml"
    f.write_text(f.read_text() + '\n[[rule]]\nid = "x.bad"\ncategory = "other"\nseverity = "low"\nrole = "info"\n'
                 'action = "none"\npatterns = ["(?<=look-behind)"]\n')
    with pytest.raises(RulePackError, match="does not compile"):
        load_packs(rules)


def test_a_damaged_cache_file_is_ignored(rules: Path, tmp_path: Path) -> None:
    first = load_packs(rules)
    (cached,) = (tmp_path / "cache" / "rulepacks").glob("*.json")
    cached.write_text('{"key": "' + cached.stem + '", "rules": [{"id": 1}]}')
    _same(load_packs(rules), first)


def test_off_writes_nothing_and_loads_the_same(rules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = load_packs(rules)
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setenv("RECOVERY_LOGS_CACHE_DIR", "off")
    _same(load_packs(rules), cached)
    assert not (tmp_path / "cache").exists()
