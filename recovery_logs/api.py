"""Notebook-facing loaders: everything an analyst needs as Polars frames.

Each loader returns a frame with a documented, fixed schema (the ``*_SCHEMA`` dicts below), so
notebooks and tests can rely on column names and types. Times are ``Datetime("ns", "UTC")``.

=====================  =========================================  ==========================
loader                 reads                                      schema
=====================  =========================================  ==========================
``load_events``        files, directories, globs, Parquet, or     ``schema.EVENT_SCHEMA``
                       ``victorialogs://HOST:PORT`` + LogsQL
``replay_incident``    a bundled incident by name (or paths)      a ``ReplayResult``
``incidents_frame``    ReplayResult / incidents / incidents.json  ``INCIDENT_FRAME_SCHEMA``
``candidates_frame``   same                                       ``CANDIDATE_FRAME_SCHEMA``
``evidence_frame``     same; adds the LogsQL query per line       ``EVIDENCE_FRAME_SCHEMA``
``actions_frame``      same; one row per proposed action          ``ACTION_FRAME_SCHEMA``
``load_audit``         a state dir or ``audit.db``                ``AUDIT_FRAME_SCHEMA``
``load_slurm_jobs``    ``sacct`` through ``SlurmClient``          ``JOB_FRAME_SCHEMA``
``jobs_frame``         ``JobRecord`` objects                      ``JOB_FRAME_SCHEMA``
=====================  =========================================  ==========================

Example::

    >>> import recovery_logs.api as rl
    >>> res = rl.replay_incident("xid79_nccl_cascade")
    >>> rl.incidents_frame(res).select("category", "node", "root_rule").row(0)
    ('xid', 'gpu-n02', 'xid.79')
    >>> rl.evidence_frame(res)["logsql"][0]          # paste into VictoriaLogs' UI  # doctest: +SKIP
    '_time:[2026-11-29T14:06:00.123457000Z, 2026-11-29T14:06:00.123457001Z) host:="gpu-n02" _msg:"NVRM: Xid ..."'

``root_rule`` names the rule whose finding is the incident's root cause (the culprit node's
``cause`` line of the incident's category); backtests and self-grading count per root rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from recovery_logs.errors import AuditError, ConfigError, InputError
from recovery_logs.schema import EVENT_SCHEMA, TIME
from recovery_logs.timeutil import iso_to_ns, ns_to_iso

__all__ = [
    "ACTION_FRAME_SCHEMA", "AUDIT_FRAME_SCHEMA", "CANDIDATE_FRAME_SCHEMA", "EVIDENCE_FRAME_SCHEMA",
    "INCIDENT_FRAME_SCHEMA", "JOB_FRAME_SCHEMA", "actions_frame", "bundled_incident", "bundled_incident_names", "bundled_read_options",
    "candidates_frame", "evidence_frame", "incident_dicts", "incidents_frame", "jobs_frame", "load_audit",
    "load_events", "load_slurm_jobs", "load_truth", "logsql_for_line", "replay_incident", "root_rule",
]

LIST_STR = pl.List(pl.String)

INCIDENT_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String, "rank": pl.Int32, "category": pl.String, "cause": pl.String,
    "severity": pl.String, "node": pl.String, "gpu": pl.Int32, "job_id": pl.String, "xid": pl.Int32,
    "confidence": pl.Float64, "status": pl.String, "first_seen": TIME, "detected_at": TIME, "last_seen": TIME,
    "count": pl.Int64, "nodes": LIST_STR, "suggested_action": pl.String, "root_rule": pl.String,
    "source": pl.String,
}
"""One row per incident, in the engine's ranking order (``rank`` 1 = most important) per source."""

CANDIDATE_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String, "rank": pl.Int32, "node": pl.String, "cause": pl.String, "score": pl.Float64,
    "gpu": pl.Int32, "reasons": LIST_STR,
}
"""One row per ranked root-cause candidate (``rank`` 1 = the culprit named by the incident)."""

EVIDENCE_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String, "time": TIME, "node": pl.String, "rule_id": pl.String, "message": pl.String,
    "file": pl.String, "line": pl.Int64, "logsql": pl.String,
}
"""One row per evidence line; ``logsql`` fetches the same line from VictoriaLogs."""

ACTION_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String, "time": TIME, "root_rule": pl.String, "category": pl.String, "node": pl.String,
    "job_id": pl.String, "kind": pl.String, "target": pl.String, "decision": pl.String, "reason": pl.String,
    "exclude": LIST_STR,
}
"""One row per proposed action; ``time`` is the incident's ``detected_at`` (when it was proposable);
``node`` / ``job_id`` are the incident's culprit node and job."""

AUDIT_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Int64, "time": TIME, "kind": pl.String, "incident_id": pl.String, "action_id": pl.String,
    "action_kind": pl.String, "target": pl.String, "decision": pl.String, "status": pl.String,
    "by": pl.String, "reason": pl.String, "payload": pl.String,
}
"""One row per audit record; common payload keys lifted into columns, the whole payload as JSON text."""

JOB_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String, "name": pl.String, "state": pl.String, "nodes": LIST_STR, "n_nodes": pl.Int32,
    "gpus": pl.Int32, "submit": TIME, "start": TIME, "end": TIME, "exit_code": pl.Int32, "signal": pl.Int32,
    "elapsed_s": pl.Float64, "gpu_hours": pl.Float64,
}
"""One row per job run (a requeued job has several rows with the same ``job_id``)."""


# ---------------------------------------------------------------------------- bundled data
def _bundled_dir() -> Path:
    return Path(str(resources.files("recovery_logs") / "data" / "incidents"))


def bundled_incident_names() -> list[str]:
    """Names of the incidents shipped with the package (``recovery-logs demo --list``)."""
    d = _bundled_dir()
    return sorted(p.name for p in d.iterdir() if p.is_dir() and (p / "truth.json").is_file())


def bundled_incident(name: str) -> Path:
    """Directory of one bundled incident (logs + ``truth.json``)."""
    p = _bundled_dir() / name
    if not (p / "truth.json").is_file():
        raise ConfigError("api: no bundled incident with this name", name=name, known=bundled_incident_names())
    return p


def bundled_read_options(name: str) -> Any:
    """Read options for a bundled incident: its syslog/glog lines carry no year, its truth.json does."""
    from recovery_logs.sources.files import ReadOptions

    truth = load_truth(bundled_incident(name)) or {}
    return ReadOptions(year=truth.get("year"))


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


# ---------------------------------------------------------------------------- events
def load_events(source: str | Path | Sequence[str | Path], *, fmt: str = "auto", query: str = "*",
                start: int | str | None = None, end: int | str | None = None, limit: int | None = None,
                client: Any = None) -> pl.DataFrame:
    """Events (``EVENT_SCHEMA``, sorted by time then seq) from files or from VictoriaLogs.

    ``source``: paths (files, directories, globs, ``.parquet``), or ``victorialogs://HOST:PORT``
    (then ``query`` is LogsQL, ``start``/``end`` are ns or RFC3339, ``end`` inclusive). Pass a
    ready ``client`` (``VictoriaLogsClient``) to reuse a session.

    >>> ev = load_events(bundled_incident("healthy"))          # doctest: +SKIP
    >>> ev.columns == list(EVENT_SCHEMA)                       # doctest: +SKIP
    True
    """
    from recovery_logs.sources.files import ReadOptions, events_from_vl_records, read_paths

    if isinstance(source, str) and "://" in source:
        from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url

        own = client is None
        cl = client or VictoriaLogsClient(parse_url(source))
        try:
            rows = list(cl.query(query, start=start, end=end, limit=limit))
        finally:
            if own:
                cl.close()
        if not rows:
            return pl.DataFrame(schema=EVENT_SCHEMA)
        batch = events_from_vl_records(rows, ReadOptions(fmt="vl-jsonl"))
        return batch.events.sort(["time", "seq"], nulls_last=True)
    paths = [source] if isinstance(source, (str, Path)) else list(source)
    return read_paths(paths, ReadOptions(fmt=fmt)).events


def replay_incident(name_or_paths: str | Path | Sequence[str | Path], config: Any = None) -> Any:
    """Replay a bundled incident (by name) or any paths; returns the ``ReplayResult``."""
    from recovery_logs.config import EngineConfig
    from recovery_logs.pipeline import ReplayOptions, replay

    read = None
    if isinstance(name_or_paths, str) and name_or_paths in bundled_incident_names():
        paths: list[str | Path] = [bundled_incident(name_or_paths)]
        read = bundled_read_options(name_or_paths)
    elif isinstance(name_or_paths, (str, Path)):
        paths = [name_or_paths]
    else:
        paths = list(name_or_paths)
    return replay(paths, ReplayOptions(read=read, config=config or EngineConfig()))


# ---------------------------------------------------------------------------- incidents
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
    from recovery_logs.rulepack import load_packs

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


def _frame(rows: list[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    time_cols = [k for k, v in schema.items() if v == TIME]
    raw = {k: (pl.Int64 if k in time_cols else v) for k, v in schema.items()}
    df = pl.DataFrame(rows, schema=raw, orient="row") if rows else pl.DataFrame(schema=raw)
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
    return _frame(rows, INCIDENT_FRAME_SCHEMA)


def candidates_frame(source: Any) -> pl.DataFrame:
    """One row per ranked candidate (``CANDIDATE_FRAME_SCHEMA``)."""
    rows = [{"incident_id": d["id"], "rank": n, "node": c.get("node"), "cause": c.get("cause"),
             "score": c.get("score"), "gpu": c.get("gpu"), "reasons": list(c.get("reasons") or [])}
            for d in incident_dicts(source) for n, c in enumerate(d.get("candidates") or [], 1)]
    return _frame(rows, CANDIDATE_FRAME_SCHEMA)


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
    return _frame(rows, EVIDENCE_FRAME_SCHEMA)


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
    return _frame(rows, ACTION_FRAME_SCHEMA)


# ---------------------------------------------------------------------------- audit
def load_audit(state: str | Path | Any, kind: str | None = None) -> pl.DataFrame:
    """Audit records (``AUDIT_FRAME_SCHEMA``) from a state dir, an ``audit.db`` or an ``AuditLog``.

    ``action_kind``, ``target``, ``decision``, ``status``, ``by`` and ``reason`` are lifted from the
    payload where present (``kind`` is the record kind: proposal, decision, approval, ...).
    """
    from recovery_logs.audit import DB_NAME, AuditLog, canonical_json

    own = not isinstance(state, AuditLog)
    if own:
        p = Path(state)
        db = p / DB_NAME if p.is_dir() else p
        if not db.is_file():
            raise AuditError("api: no audit database here", path=str(db))
        log = AuditLog(db)
    else:
        log = state
    try:
        recs = log.records(kind)
    finally:
        if own:
            log.close()
    rows = []
    for r in recs:
        p = r.payload
        rows.append({"id": r.id, "time": r.ts_ns, "kind": r.kind, "incident_id": r.incident_id,
                     "action_id": r.action_id or p.get("action_id"), "action_kind": p.get("kind"),
                     "target": p.get("target"), "decision": p.get("decision"), "status": p.get("status"),
                     "by": p.get("by"), "reason": p.get("reason") or p.get("message"),
                     "payload": canonical_json(p)})
    return _frame(rows, AUDIT_FRAME_SCHEMA)


# ---------------------------------------------------------------------------- Slurm
def jobs_frame(records: Iterable[Any]) -> pl.DataFrame:
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
    return _frame(rows, JOB_FRAME_SCHEMA)


def load_slurm_jobs(job_ids: Sequence[str] = (), *, start: str = "now-7days", end: str | None = None,
                    nodes: Sequence[str] = (), client: Any = None, runner: Any = None) -> pl.DataFrame:
    """Slurm accounting (``sacct``) as ``JOB_FRAME_SCHEMA``. ``client``: a ``SlurmClient``; ``runner``:
    a ``CommandRunner`` (e.g. a recording runner in tests); default runs the local ``sacct``."""
    from recovery_logs.sources.slurm import SlurmClient

    cl = client or SlurmClient(runner=runner)
    return jobs_frame(cl.jobs(list(job_ids), start=start, end=end, nodes=list(nodes)))
