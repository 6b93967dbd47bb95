from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from recovery_logs.detectors.rulepack import RulePack, default_rules_dir, load_packs
from recovery_logs.schema import EVENT_SCHEMA, conform


@pytest.fixture(scope="session")
def pack() -> RulePack:
    return load_packs()


@pytest.fixture()
def rules_copy(tmp_path: Path) -> Path:
    """A private copy of the shipped rules directory that a test may break."""
    dst = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), dst)
    return dst


def events(*messages: str) -> pl.DataFrame:
    return conform(pl.DataFrame({"message": list(messages), "seq": list(range(len(messages))),
                                 "host": ["gpu-n1"] * len(messages)}), EVENT_SCHEMA)


@pytest.fixture()
def make_events():
    return events
