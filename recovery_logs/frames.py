"""Incidents as Polars frames with fixed schemas: what the reports, grading and notebooks read.

Each builder takes a ``ReplayResult``, ``Incident`` objects, their ``to_dict()`` dicts, an
``incidents.json`` file or a directory holding one (``incident_dicts`` reads them all) and
returns a frame with a documented schema (the ``*_SCHEMA`` dicts below). Times are
``Datetime("ns", "UTC")``.

=====================  ==================================  ==========================
builder                one row per                         schema
=====================  ==================================  ==========================
``incidents_frame``    incident (ranked)                   ``INCIDENT_FRAME_SCHEMA``
``candidates_frame``   ranked root-cause candidate         ``CANDIDATE_FRAME_SCHEMA``
``evidence_frame``     evidence line (+ its LogsQL query)  ``EVIDENCE_FRAME_SCHEMA``
``actions_frame``      proposed action                     ``ACTION_FRAME_SCHEMA``
``jobs_frame``         Slurm job run (``JobRecord``)       ``JOB_FRAME_SCHEMA``
(``audit.load_audit``) audit record                        ``AUDIT_FRAME_SCHEMA``
=====================  ==================================  ==========================

``root_rule`` names the rule whose finding is the incident's root cause (the culprit node's
``cause`` line of the incident's category); backtests and self-grading count per root rule.
``logsql_for_line`` is the VictoriaLogs query that fetches one evidence line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.errors import InputError
from recovery_logs.schema import TIME, SchemaDict
from recovery_logs.timeutil import iso_to_ns, ns_to_iso

if TYPE_CHECKING:
    from recovery_logs.sources.slurm import JobRecord

__all__ = ["ACTION_FRAME_SCHEMA", "AUDIT_FRAME_SCHEMA", "CANDIDATE_FRAME_SCHEMA", "EVIDENCE_FRAME_SCHEMA", "INCIDENT_FRAME_SCHEMA", "JOB_FRAME_SCHEMA", "actions_frame", "candidates_frame", "evidence_frame", "incident_dicts", "incidents_frame", "jobs_frame", "logsql_for_line", "root_rule", "rows_frame"]


LIST_STR = pl.List(pl.String)


INCIDENT_FRAME_SCHEMA: SchemaDict = {
    "incident_id": pl.String, "rank": pl.Int32, "category": pl.String, "cause": pl.String,
    "severity": pl.String, "node": pl.String, "gpu": pl.Int32, "job_id": pl.String, "xid": pl.Int32,
    "confidence": pl.Float64, "status": pl.String, "first_seen": TIME, "detected_at": TIME, "last_seen": TIME,
    "count": pl.Int64, "nodes": LIST_STR, "suggested_action": pl.String, "root_rule": pl.String,
    "source": pl.String,
}
"""One row per incident, in the engine's ranking order (``rank`` 1 = most important) per source."""


CANDIDATE_FRAME_SCHEMA: SchemaDict = {
    "incident_id": pl.String, "rank": pl.Int32, "node": pl.String, "cause": pl.String, "score": pl.Float64,
    "gpu": pl.Int32, "reasons": LIST_STR,
}
"""One row per ranked root-cause candidate (``rank`` 1 = the culprit named by the incident)."""


EVIDENCE_FRAME_SCHEMA: SchemaDict = {
    "incident_id": pl.String, "time": TIME, "node": pl.String, "rule_id": pl.String, "message": pl.String,
    "file": pl.String, "line": pl.Int64, "logsql": pl.String,
}
"""One row per evidence line; ``logsql`` fetches the same line from VictoriaLogs."""


ACTION_FRAME_SCHEMA: SchemaDict = {
    "incident_id": pl.String, "time": TIME, "root_rule": pl.String, "category": pl.String, "node": pl.String,
    "job_id": pl.String, "kind": pl.String, "target": pl.String, "decision": pl.String, "reason": pl.String,
    "exclude": LIST_STR,
}
"""One row per proposed action; ``time`` is the incident's ``detected_at`` (when it was proposable);
``node`` / ``job_id`` are the incident's culprit node and job."""


AUDIT_FRAME_SCHEMA: SchemaDict = {
    "id": pl.Int64, "time": TIME, "kind": pl.String, "incident_id": pl.String, "action_id": pl.String,
    "action_kind": pl.String, "target": pl.String, "decision": pl.String, "status": pl.String,
    "by": pl.String, "reason": pl.String, "payload": pl.String,
}
"""One row per audit record; common payload keys lifted into columns, the whole payload as JSON text."""


JOB_FRAME_SCHEMA: SchemaDict = {
    "job_id": pl.String, "name": pl.String, "state": pl.String, "nodes": LIST_STR, "n_nodes": pl.Int32,
    "gpus": pl.Int32, "submit": TIME, "start": TIME, "end": TIME, "exit_code": pl.Int32, "signal": pl.Int32,
    "elapsed_s": pl.Float64, "gpu_hours": pl.Float64,
}
"""One row per job run (a requeued job has several rows with the same ``job_id``)."""


def incident_dicts(source: Any) -> list[dict[str, Any]]:
    """Incidents as ``Incident.to_dict()`` dicts from a ReplayResult, Incident objects, dicts,
    an ``incidents.json`` file or a directory holding one."""
    if hasattr(source, "incidents") and not isinstance(source, Mapping):
        source = source.incidents
    if isinstance(source, (str, Path)):
        p = Path(source)
        if p.is_dir():
            p = p / "incidents.json"
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise InputError("api: incidents file not found", path=str(p)) from exc
        except (OSError, ValueError) as exc:
            raise InputError(f"api: incidents file is not JSON: {exc}", path=str(p)) from exc
        source = doc.get("incidents", []) if isinstance(doc, dict) else doc
    if isinstance(source, Mapping):
        source = source.get("incidents", [source])
    out = []
    for i in source:
        d = i.to_dict() if hasattr(i, "to_dict") else i
        if not isinstance(d, Mapping) or "id" not in d:
            raise InputError("api: not an incident (expected Incident or its to_dict())", value=str(d)[:120])
        out.append(dict(d))
    return out


@lru_cache(maxsize=4)
def _rule_roles(rules_dir: str | None = None) -> dict[str, tuple[str, str]]:
    pack = load_packs(Path(rules_dir) if rules_dir else None)
    out = {r.id: (r.category, r.role) for r in pack.rules}
    for code, e in pack.xid_catalog.items():
        out.setdefault(f"xid.{code}", (e.category, e.role))
    return out


def root_rule(incident: Mapping[str, Any], roles: Mapping[str, tuple[str, str]] | None = None) -> str:
    """The rule behind an incident's root cause (a ``to_dict()`` incident).

    XID incidents: ``xid.<code>`` when the engine matched it. Otherwise the earliest evidence line
    on the culprit node whose rule is a ``cause`` of the incident's category; then any evidence
    rule of that category; then a behavioural detector's rule; else ``category:<category>``.
    """
    if incident.get("root_rule"):
        return str(incident["root_rule"])
    roles = roles if roles is not None else _rule_roles()
    rules = list(incident.get("rule_ids") or [])
    xid = incident.get("xid")
    if xid is not None and f"xid.{xid}" in rules:
        return f"xid.{xid}"
    cat, node = incident.get("category"), incident.get("node")
    ev = sorted(incident.get("evidence") or [], key=lambda e: (e.get("time") or "", e.get("node") or ""))
    picks = [
        [e["rule_id"] for e in ev if e.get("node") == node and roles.get(e.get("rule_id") or "", ("", ""))
         == (cat, "cause")],
        [r for r in rules if roles.get(r, ("", ""))[0] == cat and roles.get(r, ("", ""))[1] == "cause"],
        [e["rule_id"] for e in ev if e.get("node") == node and roles.get(e.get("rule_id") or "", ("",))[0] == cat],
        [e["rule_id"] for e in ev if (e.get("rule_id") or "").startswith("detector.")],
    ]
    for p in picks:
        if p:
            return str(p[0])
    return f"category:{cat}"


def _t(s: str | None) -> int | None:
    return iso_to_ns(s) if s else None


def rows_frame(rows: list[dict[str, Any]], schema: SchemaDict) -> pl.DataFrame:
    """Row dicts -> a frame of exactly ``schema`` (a missing key is null, other keys are dropped);
    ``TIME`` columns are given as integer ns. The one row-to-frame helper of the package."""
    time_cols = [k for k, v in schema.items() if v == TIME]
    raw = {k: (pl.Int64 if k in time_cols else v) for k, v in schema.items()}
    df = pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=raw, orient="row") if rows else \
        pl.DataFrame(schema=raw)
    return df.with_columns([pl.col(c).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME)
                            for c in time_cols])


def incidents_frame(source: Any, source_name: str | None = None) -> pl.DataFrame:
    """One row per incident (``INCIDENT_FRAME_SCHEMA``).

    >>> incidents_frame([]).columns[:3]
    ['incident_id', 'rank', 'category']
    """
    rows = []
    for n, d in enumerate(incident_dicts(source), 1):
        rows.append({"incident_id": d["id"], "rank": n, "category": d.get("category"), "cause": d.get("cause"),
                     "severity": d.get("severity"), "node": d.get("node"), "gpu": d.get("gpu"),
                     "job_id": d.get("job_id"), "xid": d.get("xid"), "confidence": d.get("confidence"),
                     "status": d.get("status"), "first_seen": _t(d.get("first_seen")),
                     "detected_at": _t(d.get("detected_at")), "last_seen": _t(d.get("last_seen")),
                     "count": d.get("count"), "nodes": list(d.get("nodes") or []),
                     "suggested_action": d.get("suggested_action"), "root_rule": root_rule(d),
                     "source": source_name})
    return rows_frame(rows, INCIDENT_FRAME_SCHEMA)


def candidates_frame(source: Any) -> pl.DataFrame:
    """One row per ranked candidate (``CANDIDATE_FRAME_SCHEMA``)."""
    rows = [{"incident_id": d["id"], "rank": n, "node": c.get("node"), "cause": c.get("cause"),
             "score": c.get("score"), "gpu": c.get("gpu"), "reasons": list(c.get("reasons") or [])}
            for d in incident_dicts(source) for n, c in enumerate(d.get("candidates") or [], 1)]
    return rows_frame(rows, CANDIDATE_FRAME_SCHEMA)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def logsql_for_line(time_ns: int | None, node: str | None, message: str | None, max_phrase: int = 160) -> str:
    """A LogsQL query that fetches one log line from VictoriaLogs.

    ``_time:[t, t+1ns)`` (half-open, nanosecond precision) narrows to the line's instant,
    ``host:="..."`` is an exact match on the node and ``_msg:"..."`` a phrase filter on the first
    line of the message, cut at a word boundary to at most ``max_phrase`` characters.

    >>> logsql_for_line(1795961160123457000, "gpu-n02", "NVRM: Xid (PCI:0000:ba:00): 79, pid=1")
    '_time:[2026-11-29T14:06:00.123457000Z, 2026-11-29T14:06:00.123457001Z) host:="gpu-n02" _msg:"NVRM: Xid (PCI:0000:ba:00): 79, pid=1"'
    """
    parts = []
    if time_ns is not None:
        parts.append(f"_time:[{ns_to_iso(time_ns)}, {ns_to_iso(time_ns + 1)})")
    if node:
        parts.append(f"host:={_quote(node)}")
    first = (message or "").splitlines()[0].strip() if message else ""
    if len(first) > max_phrase:
        cut = first[:max_phrase]
        first = cut[: cut.rfind(" ")] if " " in cut else cut
    if first:
        parts.append(f"_msg:{_quote(first)}")
    return " ".join(parts) or "*"


def evidence_frame(source: Any) -> pl.DataFrame:
    """One row per evidence line with its LogsQL query (``EVIDENCE_FRAME_SCHEMA``)."""
    rows = []
    for d in incident_dicts(source):
        for e in d.get("evidence") or []:
            t = _t(e.get("time"))
            rows.append({"incident_id": d["id"], "time": t, "node": e.get("node"), "rule_id": e.get("rule_id"),
                         "message": e.get("message"), "file": e.get("file"), "line": e.get("line"),
                         "logsql": logsql_for_line(t, e.get("node"), e.get("message"))})
    return rows_frame(rows, EVIDENCE_FRAME_SCHEMA)


def actions_frame(source: Any) -> pl.DataFrame:
    """One row per proposed action (``ACTION_FRAME_SCHEMA``), with the incident's root rule."""
    rows = []
    for d in incident_dicts(source):
        rr = root_rule(d)
        for a in d.get("actions") or []:
            rows.append({"incident_id": d["id"], "time": _t(d.get("detected_at")), "root_rule": rr,
                         "category": d.get("category"), "node": d.get("node"), "job_id": d.get("job_id"),
                         "kind": a.get("kind"), "target": a.get("target"),
                         "decision": a.get("decision"), "reason": a.get("reason"),
                         "exclude": list(a.get("exclude") or [])})
    return rows_frame(rows, ACTION_FRAME_SCHEMA)


def jobs_frame(records: Iterable[JobRecord]) -> pl.DataFrame:
    """``sources.slurm.JobRecord`` objects -> ``JOB_FRAME_SCHEMA``.

    ``elapsed_s`` is end - start (null while running); ``gpu_hours`` is gpus x elapsed / 3600.
    """
    rows = []
    for j in records:
        el = (j.end_ns - j.start_ns) / 1e9 if j.end_ns is not None and j.start_ns is not None else None
        rows.append({"job_id": j.job_id, "name": j.name, "state": j.state, "nodes": list(j.nodes),
                     "n_nodes": len(j.nodes), "gpus": j.gpus, "submit": j.submit_ns, "start": j.start_ns,
                     "end": j.end_ns, "exit_code": j.exit_code, "signal": j.signal, "elapsed_s": el,
                     "gpu_hours": None if el is None else j.gpus * el / 3600.0})
    return rows_frame(rows, JOB_FRAME_SCHEMA)
