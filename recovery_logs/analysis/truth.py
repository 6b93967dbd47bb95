"""``truth.json``: what a simulator scenario or bundled incident really was (culprit, fault time,
acceptable actions), and where the scenarios are. The eval harness, backtests, detector
evaluation and the bundled incidents all read them here.

* ``load_truth(dir)`` — the directory's ``truth.json`` as a dict, or None when it has none.
  ``strict=True`` (the eval harness): a missing file, a missing required key (``TRUTH_KEYS``) or
  a ``fault_time``/``decisive_time`` that is not RFC3339 is an ``InputError`` too. Unreadable
  JSON or a value that is not a JSON object is an ``InputError`` either way.
* ``scenario_dirs(root)`` — ``root`` itself when it holds a ``truth.json``, else its
  sub-directories that do (sorted), else ``[]``. ``strict=True``: ``root`` must be an existing
  directory, sub-directories that look like simulator output (``nodes/``, ``vl.jsonl``,
  ``job-*``) count even without a ``truth.json`` (so its absence is reported for that
  directory), and finding none is an ``InputError``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recovery_logs.errors import InputError
from recovery_logs.timeutil import iso_to_ns

__all__ = ["TRUTH_FILE", "TRUTH_KEYS", "load_truth", "scenario_dirs"]

TRUTH_FILE = "truth.json"
TRUTH_KEYS = ("scenario", "fault_kind", "category", "culprit_node", "culprit_gpu", "fault_time", "decisive_time",
              "acceptable_actions", "never_drain", "job_id", "nodes", "expect_incident")


def load_truth(case_dir: str | Path, *, strict: bool = False) -> dict[str, Any] | None:
    """``truth.json`` of a simulator scenario or bundled incident (see the module docstring)."""
    p = Path(case_dir) / TRUTH_FILE
    if not p.is_file():
        if strict:
            raise InputError("truth: truth.json is missing", path=str(p))
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InputError(f"truth: truth.json is unreadable or not JSON: {exc}", path=str(p)) from exc
    if not isinstance(data, dict):
        raise InputError("truth: truth.json is not a JSON object", path=str(p))
    if strict:
        missing = [k for k in TRUTH_KEYS if k not in data]
        if missing:
            raise InputError("truth: truth.json lacks required keys", path=str(p), missing=missing)
        for k in ("fault_time", "decisive_time"):
            if data[k] is not None:
                try:
                    iso_to_ns(str(data[k]))
                except ValueError as exc:
                    raise InputError(f"truth: truth.json {k} is not an RFC3339 time", path=str(p),
                                     value=data[k]) from exc
    return data


def _looks_like_scenario(d: Path) -> bool:
    return (d / "nodes").is_dir() or (d / "vl.jsonl").exists() or any(d.glob("job-*"))


def scenario_dirs(root: str | Path, *, strict: bool = False) -> list[Path]:
    """Scenario directories under ``root`` (see the module docstring)."""
    r = Path(root)
    if strict:
        if not r.exists():
            raise InputError("scenarios: directory does not exist", path=str(r))
        if not r.is_dir():
            raise InputError("scenarios: not a directory", path=str(r))
    if (r / TRUTH_FILE).is_file():
        return [r]
    if not r.is_dir():
        return []
    out = sorted(d for d in r.iterdir() if d.is_dir() and ((d / TRUTH_FILE).is_file()
                                                           or (strict and _looks_like_scenario(d))))
    if strict and not out:
        raise InputError("scenarios: no scenario directories (with truth.json) found", path=str(r))
    return out
