"""watch --slurm takes its mode from --mode, else the policy file, else monitor (no cluster needed)."""

from __future__ import annotations

import pytest

from recovery_logs.errors import ConfigError


def _rem(*args):
    import importlib

    watch_cmd = importlib.import_module("recovery_logs.commands.watch")
    return watch_cmd._remediator(*args)


def test_mode_precedence(tmp_path):
    pol = tmp_path / "policy.toml"
    pol.write_text("mode = 'approve'\n[budget]\nper_hour = 2\n")
    assert _rem(True, None, tmp_path / "a", None).config.mode == "monitor"
    rem = _rem(True, None, tmp_path / "b", pol)
    assert (rem.config.mode, rem.config.budget_per_hour) == ("approve", 2)
    assert _rem(True, "monitor", tmp_path / "c", pol).config.mode == "monitor"


def test_mode_or_policy_without_slurm_is_an_error(tmp_path):
    assert _rem(False, None, None, None) is None
    with pytest.raises(ConfigError):
        _rem(False, "autonomous", None, None)
    with pytest.raises(ConfigError):
        _rem(False, None, None, tmp_path / "p.toml")
