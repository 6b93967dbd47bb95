"""Fixtures for the web console tests (helpers in webutil.py, the browser in browser.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web console needs the [web] extra (starlette, uvicorn, jinja2)")
sys.path.insert(0, str(Path(__file__).parent))
from webutil import WebServer, make_users, start_server  # noqa: E402


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple]:
    """(start(state_dir, **kw) -> WebServer, users_file, tokens): servers stop at teardown."""
    users_file = tmp_path / "users.toml"
    tokens = make_users(users_file, alice="operator", bob="operator", vera="viewer", root="admin")
    started: list[WebServer] = []

    def start(state_dir: Path, **kw) -> WebServer:
        s = start_server(state_dir, users_file, **kw)
        s.tokens = tokens
        started.append(s)
        return s

    yield start, users_file, tokens
    for s in started:
        s.stop()
