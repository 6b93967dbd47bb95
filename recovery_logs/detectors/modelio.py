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


def attach_file(directory: str | Path, key: str, name: str, data: bytes) -> None:
    """Write a file derived from the model (e.g. its compiled form) beside it and record it in the
    sidecar under ``key``: its sha256 and the sha256 of the model file it was derived from."""
    d = Path(directory)
    meta = read_sidecar(d)
    try:
        (d / name).write_bytes(data)
        meta[key] = {"file": name, "sha256": _sha256(data), "model_sha256": meta["sha256"]}
        (d / SIDECAR_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    except OSError as exc:
        raise ModelError("model: cannot write the model directory", path=str(d), reason=str(exc)) from exc


def read_attached(directory: str | Path, key: str, meta: dict[str, Any] | None = None) -> bytes | None:
    """The bytes of the file recorded under ``key`` (None when the sidecar has no such entry),
    after the same checks as ``load_artifact``: the model file matches the sidecar's sha256, the
    attached file matches its own and was derived from that model file. Nothing is unpickled."""
    d = Path(directory)
    meta = meta if meta is not None else read_sidecar(d)
    entry = meta.get(key)
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or "/" in entry["file"]:
        raise ModelError("model: sidecar entry is malformed", path=str(d / SIDECAR_FILE), key=key)
    mp = d / str(meta.get("model_file", MODEL_FILE))
    p = d / entry["file"]
    try:
        model_sha, data = _sha256(mp.read_bytes()), p.read_bytes()
    except OSError as exc:
        raise ModelError("model: model file missing or unreadable", path=str(p), reason=str(exc)) from exc
    if model_sha != meta["sha256"]:
        raise ModelError("model: checksum mismatch — the model file changed since it was written; refusing it",
                         path=str(mp), expected=meta["sha256"], got=model_sha)
    if entry.get("model_sha256") != meta["sha256"] or _sha256(data) != entry.get("sha256"):
        raise ModelError("model: checksum mismatch — the derived file does not belong to this model; refusing it",
                         path=str(p), expected=entry.get("sha256"), got=_sha256(data))
    return data


__all__ = ["FORMAT", "MODEL_FILE", "SIDECAR_FILE", "TRUSTED_TYPES", "attach_file", "library_versions",
           "load_artifact", "read_attached", "read_sidecar", "save_artifact"]
