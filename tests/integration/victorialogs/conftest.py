"""Fixtures for the VictoriaLogs client / watch tests: a fixture-faithful server on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def _load_vlserver():
    name = "recovery_logs_tests_vlserver"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / "vlserver.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


vlserver = _load_vlserver()


@pytest.fixture
def vls():
    """A fresh server with the 50-line dataset ingested (static fixtures answer byte for byte)."""
    srv = vlserver.VLServer()
    srv.ingest_file(vlserver.FIXTURES / "dataset_small.jsonl")
    with srv:
        yield srv


@pytest.fixture
def empty_vls():
    with vlserver.VLServer(static=False) as srv:
        yield srv
