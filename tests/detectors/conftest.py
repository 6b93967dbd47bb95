from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from recovery_logs.detectors.rulepack import RulePack, default_rules_dir, load_packs
from recovery_logs.detectors.rules import match
from recovery_logs.pipeline.replay import ReplayOptions, ReplayResult, replay
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


def found(pack: RulePack, *lines: str) -> pl.DataFrame:
    """The rule findings of ``lines`` (messages with no host), as the matcher returns them."""
    ev = conform(pl.DataFrame({"message": list(lines), "seq": list(range(len(lines)))}), EVENT_SCHEMA)
    return match(ev, pack)


def replay_text(tmp_path: Path, text: str, name: str = "job-7/gpu-y2.out") -> ReplayResult:
    """``text`` written as one job's output file under ``tmp_path`` and replayed end to end."""
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return replay([p], ReplayOptions())
