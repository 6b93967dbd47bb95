"""``truth.json``: what a simulator scenario or bundled incident really was (culprit, fault time,
acceptable actions). The eval harness, backtests and the bundled incidents read it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recovery_logs.errors import InputError

__all__ = ["load_truth"]




def load_truth(case_dir: str | Path) -> dict[str, Any] | None:
    """``truth.json`` of a simulator scenario or bundled incident, or None when there is none."""
    p = Path(case_dir) / "truth.json"
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"api: truth.json is not readable JSON: {exc}", path=str(p)) from exc
    if not isinstance(data, dict):
        raise InputError("api: truth.json is not a JSON object", path=str(p))
    return data
