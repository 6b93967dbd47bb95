"""Fixtures shared by every test directory (the doubles themselves live in recovery_logs.testing)."""

from __future__ import annotations

import os
import tempfile

import pytest

from recovery_logs.cli import main
from recovery_logs.testing import FakeClock, RecordingRunner, make_incident

# compiled rule packs are cached per user (detectors/rulepack.py); tests use a private cache directory
os.environ.setdefault("RECOVERY_LOGS_CACHE_DIR", tempfile.mkdtemp(prefix="recovery-logs-test-cache-"))


@pytest.fixture
def recording():
    return RecordingRunner


@pytest.fixture
def incident():
    return make_incident


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_795_000_000.0)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run the real CLI entry point in-process: ``run_cli(*argv, slurm_conf=None) -> (rc, stdout, stderr)``."""

    def run(*argv: str, slurm_conf: str | None = None) -> tuple[int, str, str]:
        if slurm_conf:
            monkeypatch.setenv("SLURM_CONF", slurm_conf)
        capsys.readouterr()
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run
