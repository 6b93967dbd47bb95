"""The public face (httpx's test_exported_members): ``__all__`` is exactly what is importable,
every name resolves, ``dir()`` and ``help()`` show it, the loaders carry real return types."""

from __future__ import annotations

import inspect
import pydoc
import typing

import recovery_logs as rl
from recovery_logs import errors


def test_all_matches_what_is_importable():
    assert rl.__all__ == sorted(set(rl.__all__)), "sorted, no duplicates"
    for name in rl.__all__:
        assert getattr(rl, name) is not None, name
    assert dir(rl) == rl.__all__
    for need in ("Engine", "EngineConfig", "replay", "ReplayOptions", "ReplayResult", "Incident", "load_events",
                 "replay_incident", "incidents_frame", "RecoveryLogsError"):
        assert need in rl.__all__, need
    assert set(errors.__all__) <= set(rl.__all__), "the whole error tree is public"
    ns: dict = {}
    exec("from recovery_logs import *", ns)
    assert set(rl.__all__) <= set(ns)


def test_the_error_tree_is_one_tree():
    for name in errors.__all__:
        cls = getattr(rl, name)
        assert issubclass(cls, rl.RecoveryLogsError) and isinstance(cls.exit_code, int)


def test_help_lists_the_api_and_loaders_have_return_types():
    text = pydoc.render_doc(rl, renderer=pydoc.plaintext)
    for name in ("replay_incident", "load_events", "Engine", "InputError"):
        assert name in text, name
    hints = typing.get_type_hints(rl.replay_incident)
    assert hints["return"] is rl.ReplayResult
    for fn in (rl.load_events, rl.incidents_frame, rl.evidence_frame, rl.load_audit):
        ret = inspect.signature(fn).return_annotation
        assert ret not in (inspect.Signature.empty, "Any", typing.Any), fn.__name__
