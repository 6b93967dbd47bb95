"""Fixtures for the VictoriaLogs tests: the fixture-faithful server (``vlserver.py``, for faults
the real one cannot produce: mid-stream cuts, slow bodies, static captures) and the real
VictoriaLogs server (``vlreal.py``: binary lookup, start/stop/kill, a checking reverse proxy;
those tests are skipped with a clear reason where the binary is absent)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def _load():
    name = "recovery_logs_tests_vlreal"
    if name not in sys.modules:   # tests run with --import-mode=importlib: load the sibling by path
        spec = importlib.util.spec_from_file_location(name, _HERE / "vlreal.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


vlreal = _load()
RealVL, CheckingProxy, vl_binary = vlreal.RealVL, vlreal.CheckingProxy, vlreal.vl_binary


@pytest.fixture
def vl_bin() -> Path:
    b = vl_binary()
    if b is None:
        pytest.skip("real VictoriaLogs binary not found: set RECOVERY_LOGS_VL_BIN or put it at "
                    "../shared/victorialogs/victoria-logs beside the checkout")
    return b


@pytest.fixture
def real_vl(vl_bin, tmp_path):
    srv = RealVL(vl_bin, tmp_path / "vl-data").start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def make_vl(vl_bin, tmp_path):
    """Factory: servers not started yet (e.g. a port the watcher tries before the server is up)."""
    made: list[RealVL] = []

    def make(port: int | None = None) -> RealVL:
        srv = RealVL(vl_bin, tmp_path / f"vl-data-{len(made)}", port)
        made.append(srv)
        return srv

    yield make
    for s in made:
        s.close()


@pytest.fixture
def proxy_factory():
    made: list[CheckingProxy] = []

    def make(*a, **kw) -> CheckingProxy:
        p = CheckingProxy(*a, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


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
