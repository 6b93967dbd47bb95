"""Record what an NVML driver answers, and replay it: real-GPU behaviour as a test fixture.

:class:`RecordingNvml` wraps ``pynvml`` (or anything with its names) and writes every ``nvml*``
call the agent makes — arguments, the answer or the NVML error code, and how long it took
(the event-set wait included) — as JSON lines. :class:`ReplayNvml` answers the same calls from
such a file, in the order they were recorded (the last answer of a call repeats once the
recording runs out), so the agent's unit tests can assert what a real driver does rather than
what a fake guessed. ``scripts/nvml_record.sh`` makes a recording on a GPU host.

File format (one JSON object per line)::

    {"kind": "header", "version": 1, "host": "...", "synthetic": false, "note": "...", "constants": {...}}
    {"kind": "call", "fn": "nvmlDeviceGetPciInfo", "args": ["h0"], "ok": {"busId": "00000000:1B:00.0"}, "ms": 0.02}
    {"kind": "call", "fn": "nvmlEventSetWait_v2", "args": ["es0", 2000], "error": 10, "ms": 2001.3}

Handles are written as ``h<index>`` and the event set as ``es0``; structures as dicts of their
fields (``busId``, field values with ``nvmlReturn``/``valueType``/``value``, event data with its
``device`` handle); bytes as text. ``synthetic: true`` marks a recording made from the tests'
fake NVML — never mistake it for a real GPU's answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

VERSION = 1
_VALUE_ATTRS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _constants(nvml: Any) -> dict[str, int]:
    return {k: int(v) for k in dir(nvml) if k.startswith(("NVML_", "nvmlEventType", "nvmlClocks"))
            and isinstance(v := getattr(nvml, k), int)}


class RecordingNvml:
    """A pass-through proxy that records every ``nvml*`` call to ``out`` (a text stream)."""

    def __init__(self, nvml: Any, out: IO[str], *, host: str = "", note: str = "", synthetic: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._nvml, self._out, self._clock = nvml, out, clock
        self._tokens: dict[int, str] = {}
        self._objects: dict[str, Any] = {}
        self.NVMLError = getattr(nvml, "NVMLError", Exception)
        self._write({"kind": "header", "version": VERSION, "host": host, "synthetic": synthetic, "note": note,
                     "driver_module": getattr(nvml, "__name__", type(nvml).__name__),
                     "constants": _constants(nvml)})

    def _write(self, rec: dict[str, Any]) -> None:
        self._out.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self._out.flush()

    def _token(self, obj: Any, prefix: str) -> str:
        tok = self._tokens.get(id(obj))
        if tok is None:
            tok = f"{prefix}{sum(1 for t in self._tokens.values() if t.startswith(prefix))}"
            self._tokens[id(obj)] = tok
            self._objects[tok] = obj
        return tok

    def _arg(self, a: Any) -> Any:
        if isinstance(a, bool | int | float | str) or a is None:
            return a
        if isinstance(a, list | tuple):
            return [self._arg(x) for x in a]
        return self._tokens.get(id(a), repr(a))

    def _value(self, fn: str, v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode(errors="replace")
        if isinstance(v, bool | int | float | str) or v is None:
            return v
        if isinstance(v, list | tuple):
            return [self._value(fn, x) for x in v]
        if fn == "nvmlEventSetCreate":
            return {"__token__": self._token(v, "es")}
        if hasattr(v, "eventType"):
            return {"device": self._tokens.get(id(v.device), "unknown"), "eventType": int(v.eventType),
                    "eventData": int(v.eventData)}
        if hasattr(v, "busId"):
            return {"busId": self._value(fn, v.busId)}
        if hasattr(v, "nvmlReturn"):
            val = getattr(v, "value", None)
            return {"fieldId": int(getattr(v, "fieldId", 0)), "nvmlReturn": int(v.nvmlReturn),
                    "valueType": int(getattr(v, "valueType", 1)),
                    "value": {a: int(getattr(val, a)) for a in _VALUE_ATTRS if hasattr(val, a)} if val is not None
                    else {}}
        return repr(v)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(target):
            return target

        def call(*args: Any) -> Any:
            t0 = self._clock()
            rec: dict[str, Any] = {"kind": "call", "fn": name, "args": [self._arg(a) for a in args]}
            try:
                res = target(*args)
            except self.NVMLError as exc:
                rec.update(error=int(getattr(exc, "value", -1)), ms=round((self._clock() - t0) * 1000, 3))
                self._write(rec)
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._tokens[id(res)] = f"h{int(args[0])}"
                self._objects[f"h{int(args[0])}"] = res
                rec["ok"] = {"__token__": f"h{int(args[0])}"}
            else:
                rec["ok"] = self._value(name, res)
            rec["ms"] = round((self._clock() - t0) * 1000, 3)
            self._write(rec)
            return res

        return call


class ReplayNvml:
    """Answers the agent's NVML calls from a recording (see module doc)."""

    def __init__(self, path: str | Path, error_class: Any = None) -> None:
        lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
        if not lines or lines[0].get("kind") != "header":
            raise ValueError(f"{path}: not an NVML recording (no header line)")
        self.header = lines[0]
        for k, v in self.header.get("constants", {}).items():
            setattr(self, k, v)
        if error_class is None:
            import pynvml  # the real error tree (NVMLError(value) gives the right subclass)

            error_class = pynvml.NVMLError
        self.NVMLError = error_class
        self._answers: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._last: dict[tuple[str, str], dict[str, Any]] = {}
        self.fns: set[str] = set()
        for rec in lines[1:]:
            if rec.get("kind") == "call":
                self._answers.setdefault(self._key(rec["fn"], rec["args"]), []).append(rec)
                self.fns.add(rec["fn"])
        self._handles: dict[str, SimpleNamespace] = {}
        self.calls: list[str] = []

    @staticmethod
    def _key(fn: str, args: list[Any]) -> tuple[str, str]:
        # the event wait is answered in recorded order whatever timeout the replaying agent asks for
        return (fn, json.dumps(args[:1] if fn.startswith("nvmlEventSetWait") else args))

    @property
    def synthetic(self) -> bool:
        return bool(self.header.get("synthetic"))

    def _handle(self, tok: str) -> SimpleNamespace:
        return self._handles.setdefault(tok, SimpleNamespace(token=tok))

    def _arg(self, a: Any) -> Any:
        if isinstance(a, SimpleNamespace):
            return a.token
        if isinstance(a, list | tuple):
            return [self._arg(x) for x in a]
        return a

    def _build(self, fn: str, v: Any) -> Any:
        if isinstance(v, dict):
            if "__token__" in v:
                return self._handle(v["__token__"])
            if "eventType" in v:
                return SimpleNamespace(device=self._handle(v["device"]), eventType=v["eventType"],
                                       eventData=v["eventData"], gpuInstanceId=0, computeInstanceId=0)
            if "busId" in v and len(v) == 1:
                return SimpleNamespace(busId=v["busId"])
            if "nvmlReturn" in v:
                return SimpleNamespace(fieldId=v["fieldId"], nvmlReturn=v["nvmlReturn"], valueType=v["valueType"],
                                       value=SimpleNamespace(**v["value"]))
        if isinstance(v, list):
            return [self._build(fn, x) for x in v]
        return v

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml") or name not in self.__dict__.get("fns", set()):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            key = self._key(name, self._arg(list(args)))
            self.calls.append(name)
            queue = self._answers.get(key)
            if queue:
                rec = queue.pop(0)
                self._last[key] = rec
            elif key in self._last:
                rec = self._last[key]
            else:
                raise self.NVMLError(13)      # FunctionNotFound: never recorded with these arguments
            if "error" in rec:
                raise self.NVMLError(rec["error"])
            return self._build(name, rec.get("ok"))

        return call


__all__ = ["RecordingNvml", "ReplayNvml"]
