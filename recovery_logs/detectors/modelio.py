"""Model persistence: skops file + JSON sidecar, never pickle.

A model directory holds::

    model.skops    the fitted scikit-learn object, written by ``skops.io.dump``
    model.json     sidecar: format, sha256 of model.skops, features, library versions,
                   training data window, parameters, metrics, anything the caller adds

``load_artifact`` refuses (``ModelError``) a directory whose sidecar is missing or unreadable,
whose ``model.skops`` does not match the sidecar's sha256, or whose skops file contains any type
outside the explicit ``TRUSTED_TYPES`` list (checked with ``skops.io.get_untrusted_types``
before anything is loaded).
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from recovery_logs.errors import ModelError

MODEL_FILE = "model.skops"
SIDECAR_FILE = "model.json"
FORMAT = "recovery-logs-model/1"

# Types skops does not trust by default that our IsolationForest needs. Nothing else is loaded.
TRUSTED_TYPES: tuple[str, ...] = (
    "sklearn.tree._tree.Tree",
)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("scikit-learn", "skops", "numpy", "polars", "recovery-logs"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def _deterministic_zip(data: bytes) -> bytes:
    """Re-pack a skops archive compressed, sorted and with fixed timestamps. (skops names array
    files by ``id()``, so two fits of the same model still differ in bytes; compare scores.)"""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for name in sorted(src.namelist()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            dst.writestr(info, src.read(name))
    return out.getvalue()


def save_artifact(obj: Any, directory: str | Path, sidecar: dict[str, Any]) -> Path:
    """Write ``obj`` with skops and the sidecar (sha256, versions added). Returns the directory."""
    import skops.io as sio  # skops: heavy import, only when a model is saved or loaded

    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        data = _deterministic_zip(sio.dumps(obj))
        (d / MODEL_FILE).write_bytes(data)
        meta = {"format": FORMAT, "model_file": MODEL_FILE, "sha256": _sha256(data),
                "versions": library_versions(), **sidecar}
        (d / SIDECAR_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    except OSError as exc:
        raise ModelError("model: cannot write the model directory", path=str(d), reason=str(exc)) from exc
    return d


def read_sidecar(directory: str | Path) -> dict[str, Any]:
    d = Path(directory)
    p = d / SIDECAR_FILE
    try:
        meta = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ModelError("model: sidecar missing (a model directory needs model.json)", path=str(p)) from exc
    except (OSError, ValueError) as exc:
        raise ModelError("model: sidecar unreadable", path=str(p), reason=str(exc)) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("sha256"), str):
        raise ModelError("model: sidecar is not a recovery-logs model description", path=str(p),
                         format=meta.get("format") if isinstance(meta, dict) else None)
    return meta


def load_artifact(directory: str | Path, trusted: tuple[str, ...] = TRUSTED_TYPES) -> tuple[Any, dict[str, Any]]:
    """Verify checksum and types, then load. Returns (object, sidecar)."""
    import skops.io as sio  # skops: heavy import, only when a model is saved or loaded

    d = Path(directory)
    meta = read_sidecar(d)
    p = d / str(meta.get("model_file", MODEL_FILE))
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ModelError("model: model file missing or unreadable", path=str(p), reason=str(exc)) from exc
    got = _sha256(data)
    if got != meta["sha256"]:
        raise ModelError("model: checksum mismatch — the model file changed since it was written; refusing it",
                         path=str(p), expected=meta["sha256"], got=got)
    try:
        untrusted = sio.get_untrusted_types(data=data)
    except Exception as exc:  # skops raises assorted errors on a corrupt archive
        raise ModelError("model: not a readable skops file", path=str(p), reason=str(exc)) from exc
    bad = sorted(t for t in untrusted if t not in trusted)
    if bad:
        raise ModelError("model: file carries types outside the trusted list; refusing to load it",
                         path=str(p), untrusted=bad)
    try:
        obj = sio.loads(data, trusted=[t for t in untrusted])
    except Exception as exc:
        raise ModelError("model: skops could not load the file", path=str(p), reason=str(exc)) from exc
    return obj, meta


__all__ = ["FORMAT", "MODEL_FILE", "SIDECAR_FILE", "TRUSTED_TYPES", "library_versions", "load_artifact",
           "read_sidecar", "save_artifact"]
