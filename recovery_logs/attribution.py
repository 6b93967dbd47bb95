"""Findings → ranked incidents. Pure and deterministic.

Steps (all functions of the accumulated findings, so replay and watch agree):

1. **Job fill** — a kernel finding names a host but no job; it joins the job seen on that host
   around that time (from the (host, job) spans of the events).
2. **Grouping** — findings of one scope (job, else host) and family (fault / straggler / anomaly)
   closer than ``incident_gap_s`` form one incident. Floods collapse: the per-(host, rule)
   aggregate keeps counts, first and last seen.
3. **Ranking** — every node of the incident is a candidate. Initiating hardware causes outrank
   the symptoms they cause; earlier outranks later; breadcrumbs (XID 45/43/154) never win when a
   cause precedes them; NCCL network errors point at their peer (address → host from NCCL's own
   INFO lines); in a job where several nodes report a collective timeout, a node of the job that
   did *not* is a suspect. Across incidents: an advisory one (proposes only a look, at most medium, set-up
   chatter such as an NCCL interface WARN, a software notice or an anomaly) of a job with a straggler verdict near it is
   reported at ``info``, so the verdict naming the slow rank comes first (``defer_advisories``).
4. **detected_at** — the earliest event time at which the ranking over the evidence seen so far
   already named the final culprit and category (or the same category for the job as a whole, when
   the culprit node is only named later, as for a silent hang): what a live run reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from recovery_logs.config import EngineConfig
from recovery_logs.records import Candidate, Evidence, Incident, incident_id
from recovery_logs.schema import HARDWARE_CATEGORIES, PROGRESS_CATEGORY, SEVERITY_RANK, Category
from recovery_logs.trust import CLAIM, JOB, JOB_LINE, NAMES, NODE, authority

PCIE_FORM_FACTOR_RULE = "nvlink.pcie_form_factor"
DRAINING_ACTIONS = frozenset({"drain_node_and_requeue", "reset_gpu"})
MODEL_RULE_PREFIX = "textclass."   # detectors.textclass.RULE_PREFIX (not imported: numpy-free module)
ROLE_WEIGHT = {"cause": 1.0, "symptom": 0.3, "breadcrumb": 0.15, "info": 0.05}
BREADCRUMB_AFTER_CAUSE = 0.02
HW_BONUS = 0.5
EARLY_BONUS = 0.3
EARLY_TAU_S = 60.0
SILENT_SUSPECT_SCORE = 0.45
PEER_SCORE = 0.35
SPECIFIC_BONUS = 0.3
ACTION_STRENGTH = {"none": 0, "none_user_bug": 0, "investigate": 1, "requeue_only": 2, "cancel_job": 2,
                   "reset_gpu": 3, "drain_node_and_requeue": 4}
APP_ACTIONS = {"none_user_bug", "none"}
# an advisory proposes only a look, in a category of set-up trouble or notices (no hardware, no process killed, no
# job failed): NCCL set-up warnings, a software notice, an anomaly
ADVISORY_ACTIONS = frozenset({"investigate"})
ADVISORY_CATEGORIES = frozenset({Category.NCCL_OTHER.value, Category.SOFTWARE_EXCEPTION.value, Category.ANOMALY.value})
TIMEOUT_CATEGORY = Category.NCCL_TIMEOUT_HANG.value
NET_CATEGORY = Category.NCCL_NETWORK_ERROR.value

ATTEMPT_COL = "_attempt"   # optional findings column: the job attempt (accounting), part of the scope
ATTEMPT_SEP = "@"
_ROW_COLS = ["category", "severity", "role", "action", "xid", "pci", "gpu", "message", "file", "line", "peer",
             "rank", "source", "time_inferred"]


@dataclass(frozen=True)
class Row:
    """One (host, rule) aggregate inside an incident group."""

    host: str | None
    rule_id: str
    count: int
    first: int
    last: int
    category: str
    severity: str
    role: str
    action: str
    xid: int | None
    pci: str | None
    gpu: int | None
    message: str
    file: str | None
    line: int | None
    peer: str | None
    escalated: bool = False
    rank: int | None = None
    inferred: bool = False   # the line had no timestamp of its own: its time is a neighbour's
    authority: int = NODE    # strongest source authority among its findings (recovery_logs.trust)


def fill_jobs(findings: pl.DataFrame, spans: pl.DataFrame, grace_s: float) -> pl.DataFrame:
    """Give host-only findings the job that ran on that host around that time."""
    if findings.height == 0 or spans.height == 0:
        return findings
    need = findings.with_row_index("_rid").filter(pl.col("job_id").is_null() & pl.col("host").is_not_null())
    if need.height == 0:
        return findings
    grace = pl.duration(nanoseconds=int(grace_s * 1e9))
    cand = (need.select("_rid", "host", "time")
            .join(spans.select("host", pl.col("job_id").alias("_job"), "first", "last"), on="host")
            .filter((pl.col("time") >= pl.col("first") - grace) & (pl.col("time") <= pl.col("last") + grace))
            .with_columns(
                pl.when(pl.col("time") < pl.col("first")).then(pl.col("first") - pl.col("time"))
                .when(pl.col("time") > pl.col("last")).then(pl.col("time") - pl.col("last"))
                .otherwise(pl.duration(nanoseconds=0)).dt.total_nanoseconds().alias("_dist"))
            .sort(["_rid", "_dist", "first", "_job"], descending=[False, False, True, False])
            .unique("_rid", keep="first")
            .select("_rid", "_job"))
    return (findings.with_row_index("_rid").join(cand, on="_rid", how="left")
            .with_columns(pl.coalesce("job_id", "_job").alias("job_id"))
            .drop("_rid", "_job"))


def drop_model_findings(findings: pl.DataFrame) -> pl.DataFrame:
    """Drop the learned classifier's findings (``detectors.textclass``) of any job, or host without a
    job, that a rule or a behavioural detector spoke about: a model finding never outranks, nor joins,
    a rule's incident; it only names what nothing else named."""
    is_model = pl.col("rule_id").str.starts_with(MODEL_RULE_PREFIX)
    if findings.height == 0 or not findings.select(is_model.any()).item():
        return findings
    key = pl.coalesce(pl.lit("job:") + pl.col("job_id"), pl.lit("host:") + pl.col("host"), pl.lit("global"))
    spoken = findings.filter(~is_model & (pl.col("role") != "info")).select(key.alias("_k")).unique()
    return (findings.with_columns(key.alias("_k"))
            .filter(~is_model | ~pl.col("_k").is_in(spoken.get_column("_k").implode())).drop("_k"))


def group_findings(findings: pl.DataFrame, gap_s: float) -> pl.DataFrame:
    """Add `scope`, `family` and `group` (int) columns; progress/clear rows are kept out of groups."""
    f = findings.filter(pl.col("category") != PROGRESS_CATEGORY)
    # accounting tags a job's findings with their attempt (jobjoin.tag_attempts): one incident per attempt,
    # so a requeued or reused job id never groups with an earlier attempt's lines
    job = (pl.col("job_id") + pl.when(pl.col(ATTEMPT_COL).is_not_null()).then(pl.lit(ATTEMPT_SEP) + pl.col(ATTEMPT_COL))
           .otherwise(pl.lit(""))) if ATTEMPT_COL in f.columns else pl.col("job_id")
    f = f.with_columns(
        pl.coalesce(job, pl.lit("host:") + pl.col("host"), pl.lit("global")).alias("scope"),
        pl.when(pl.col("category") == Category.STRAGGLER.value).then(pl.lit("straggler"))
        .when(pl.col("category") == Category.ANOMALY.value).then(pl.lit("anomaly"))
        .otherwise(pl.lit("fault")).alias("family"),
    ).sort(["scope", "family", "time", "seq"], nulls_last=True)
    gap = int(gap_s * 1e9)
    f = f.with_columns(
        (pl.col("time").dt.epoch("ns").diff().over(["scope", "family"]).fill_null(gap + 1) > gap)
        .cast(pl.Int64).alias("_new"))
    return f.with_columns(pl.col("_new").cum_sum().alias("_g")).with_columns(
        (pl.col("scope") + "|" + pl.col("family") + "|" + pl.col("_g").cast(pl.String)).alias("group")
    ).drop("_new", "_g")


def aggregate_rows(grouped: pl.DataFrame) -> pl.DataFrame:
    """One row per (group, host, rule_id): count, first/last, and the first finding's fields."""
    g = grouped.sort(["time", "seq"], nulls_last=True)
    return (g.group_by(["group", "scope", "family", "host", "rule_id"], maintain_order=True)
            .agg(pl.len().alias("count"),
                 pl.col("time").min().dt.epoch("ns").alias("first"),
                 pl.col("time").max().dt.epoch("ns").alias("last"),
                 pl.col("job_id").drop_nulls().first().alias("job_id"),
                 *[pl.col(c).first().alias(c) for c in _ROW_COLS],
                 pl.col("gpu").drop_nulls().first().alias("any_gpu"),
                 pl.col("authority").min().alias("authority"))
            .sort(["group", "first", "host", "rule_id"], nulls_last=True))


def repeated_app_xids(findings: pl.DataFrame, min_jobs: int) -> set[tuple[str, str]]:
    """(host, pci) pairs with XID 13/31 in at least `min_jobs` distinct jobs: escalate to investigate."""
    app = findings.filter(pl.col("xid").is_in([13, 31]) & pl.col("host").is_not_null()
                          & pl.col("job_id").is_not_null())
    if app.height == 0:
        return set()
    rep = (app.group_by(["host", pl.col("pci").fill_null("")]).agg(pl.col("job_id").n_unique().alias("jobs"))
           .filter(pl.col("jobs") >= min_jobs))
    return {(r["host"], r["pci"]) for r in rep.iter_rows(named=True)}


def row_score(r: Row, first_cause_ns: int | None) -> float:
    role = r.role
    if role == "breadcrumb" and first_cause_ns is not None and r.first >= first_cause_ns:
        w = BREADCRUMB_AFTER_CAUSE
    else:
        w = ROLE_WEIGHT.get(role, 0.05)
    app_fault = r.action in APP_ACTIONS and not r.escalated
    hw = HW_BONUS if (r.category in HARDWARE_CATEGORIES and not app_fault) or r.escalated else 0.0
    sev = 0.6 + 0.1 * SEVERITY_RANK.get(r.severity, 0)
    return w * (1.0 + hw) * sev


def rank_candidates(rows: list[Row], job_hosts: set[str], addr_hosts: dict[str, str],
                    cause_text) -> list[tuple[Candidate, Row | None]]:
    """Rank every node of one incident. Returns (Candidate, best Row or None) best first."""
    scored = [r for r in rows if r.role in ROLE_WEIGHT]
    if not scored:
        return []
    # A node that reports a network error naming another node as its peer is that peer's victim.
    scored = [replace(r, role="symptom") if r.category == NET_CATEGORY and r.role == "cause" and r.peer
              and addr_hosts.get(_peer_addr(r.peer)) not in (None, r.host) else r for r in scored]
    causes = [r.first for r in scored if r.role == "cause" and not r.inferred] or \
        [r.first for r in scored if r.role == "cause"]
    first_cause = min(causes) if causes else None
    t0 = first_cause if first_cause is not None else min(r.first for r in scored)
    # a line with no time of its own that stands before a timed line of the same file and carries that line's time
    # (the reader fills a file's untimed head with its first time) did come no later than it: file order proves it
    last_timed: dict[tuple[str, int], int] = {}     # (file, time) -> the last timed line of the file at that time
    for r in scored:
        if not r.inferred and r.file is not None and r.line is not None:
            key = (r.file, r.first)
            last_timed[key] = max(last_timed.get(key, r.line), r.line)

    def before_timed(r: Row) -> bool:
        at = last_timed.get((r.file, r.first)) if r.file is not None else None
        return at is not None and r.line is not None and r.line < at

    def full(r: Row) -> float:
        role_w = ROLE_WEIGHT.get(r.role, 0.05) if r.role != "breadcrumb" or first_cause is None else 0.0
        if r.inferred and not before_timed(r):   # a borrowed timestamp cannot prove it came first
            role_w = 0.0
        early = EARLY_BONUS * role_w * math.exp(-max(0.0, (r.first - t0) / 1e9) / EARLY_TAU_S)
        # specific outranks generic: the driver's own XID verdict beats an application's echo of it
        spec = SPECIFIC_BONUS if r.xid is not None and r.role == "cause" else 0.0
        return row_score(r, first_cause) + early + spec

    best: dict[str | None, tuple[float, Row]] = {}
    ncause: dict[str | None, int] = {}
    for r in scored:
        s = full(r)
        cur = best.get(r.host)
        if cur is None or s > cur[0] + 1e-12 or (abs(s - cur[0]) <= 1e-12 and (r.inferred, r.first) <
                                                  (cur[1].inferred, cur[1].first)):
            best[r.host] = (s, r)
        if r.role == "cause":
            ncause[r.host] = ncause.get(r.host, 0) + r.count
    # A job-level finding (no host) does not compete with a node that carries the same finding.
    if None in best and any(r.host is not None and r.rule_id == best[None][1].rule_id for r in scored):
        del best[None]
    out: dict[str | None, tuple[float, Row | None, list[str]]] = {}
    for host, (s, r) in best.items():
        bonus = min(0.15, 0.05 * math.log10(1 + ncause.get(host, 0)))
        out[host] = (s + bonus, r, [f"{r.role} {r.rule_id}"])
    # NCCL network errors name a peer: the peer's host is a suspect.
    peers: dict[str, set[str | None]] = {}
    for r in scored:
        if r.category == NET_CATEGORY and r.peer:
            h = addr_hosts.get(_peer_addr(r.peer))
            if h and h != r.host:
                peers.setdefault(h, set()).add(r.host)
    for h, reporters in peers.items():
        add = PEER_SCORE + 0.05 * min(len(reporters), 6)
        s, top, why = out.get(h, (0.0, None, []))
        out[h] = (s + add, top, [*why, f"named as failing peer by {len(reporters)} node(s)"])
    # The node that did not report a collective timeout while the others did.
    timed_out = {r.host for r in scored if r.category == TIMEOUT_CATEGORY and r.role == "symptom" and r.host}
    if len(timed_out) >= 2:
        silent = sorted(h for h in job_hosts if h not in timed_out)
        if 0 < len(silent) < len(timed_out):
            for h in silent:
                s, top, why = out.get(h, (0.0, None, []))
                out[h] = (max(s, SILENT_SUSPECT_SCORE) + (0.05 if top is not None else 0.0), top,
                          [*why, f"no collective timeout reported while {len(timed_out)} other node(s) did"])
    ranked = sorted(out.items(), key=lambda kv: (-kv[1][0], kv[1][1].first if kv[1][1] else 2**63,
                                                 kv[0] or "~"))
    res: list[tuple[Candidate, Row | None]] = []
    for host, (s, top, why) in ranked:
        cause = cause_text(top) if top is not None else "silent node: " + why[-1]
        res.append((Candidate(node=host, cause=cause, score=s, gpu=top.gpu if top else None, reasons=tuple(why)), top))
    return res


def _peer_addr(peer: str) -> str:
    p = peer.strip()
    if "<" in p:
        p = p.split("<", 1)[0]
    if p.startswith("[") and "]" in p:
        return p[1:p.index("]")]
    if p.count(":") == 1:
        p = p.split(":", 1)[0]
    return p.removeprefix("::ffff:")


def rank_key(i: Incident) -> tuple[Any, ...]:
    """The order of ranked incidents (a total order: the id breaks ties). A confirmed hardware cause
    that cascaded to other nodes comes first, whatever the confidence of single-line incidents; an
    unconfirmed incident (the culprit's only evidence is a claim, or a suspect without its own fault
    line) ranks below a confirmed one of the same severity; an anomaly ("unlike anything seen before")
    below a named failure of the same severity; an incident of the learned line classifier
    (``detectors.textclass``) after all of them. ``pipeline.scale`` merges sharded results by it."""
    return ((i.root_rule or "").startswith(MODEL_RULE_PREFIX),   # a learned classifier's incident after every other
            not (i.confirmed and i.category in HARDWARE_CATEGORIES and len(i.nodes) > 1),
            -SEVERITY_RANK.get(i.severity, 0), not i.confirmed,
            i.category == Category.ANOMALY.value, -i.confidence, i.first_seen, i.id)


def is_advisory(i: Incident) -> bool:
    """An incident that proposes nothing beyond a look (investigate), of a set-up/notice category and at most medium
    severity: set-up chatter (an NCCL interface warning), a WARN-level notice, an anomaly. A crash (``none``/
    ``none_user_bug``), an OOM kill, a job or step failure, a network or hardware fault is never advisory."""
    return (i.category in ADVISORY_CATEGORIES and i.suggested_action in ADVISORY_ACTIONS
            and SEVERITY_RANK.get(i.severity, 0) <= SEVERITY_RANK["medium"])


def defer_advisories(incidents: list[Incident], gap_s: float) -> list[Incident]:
    """An advisory incident (``is_advisory``) of a scope that also has a straggler verdict within the incident gap
    is reported at ``info`` severity, so the verdict ranks first: the question the operator asks of that job is
    which rank or node is slow, and the verdict names it while the advisory proposes only a look. Nothing that
    proposes a requeue, drain or reset, no crash, kill or failure, nothing of a hardware category and nothing above
    medium is deferred."""
    gap = int(gap_s * 1e9)
    spans: dict[str, list[tuple[int, int]]] = {}
    for i in incidents:
        if i.category == Category.STRAGGLER.value:
            spans.setdefault(i.scope, []).append((i.first_seen, i.last_seen))
    if not spans:
        return incidents
    return [replace(i, severity="info") if is_advisory(i) and any(
        f - gap <= i.last_seen and i.first_seen <= last + gap for f, last in spans.get(i.scope, ())) else i
        for i in incidents]


def _confidence(cands: list[tuple[Candidate, Row | None]]) -> float:
    s1 = cands[0][0].score
    s2 = cands[1][0].score if len(cands) > 1 else 0.0
    strength = min(1.0, s1 / 1.2)
    sep = s1 / (s1 + s2) if s1 + s2 > 0 else 0.0
    return max(0.0, min(1.0, (0.35 + 0.65 * sep) * strength))


class Attributor:
    """Stateless ranking over accumulated findings; `cause_text(row)` names a root cause."""

    def __init__(self, config: EngineConfig, rule_descriptions: dict[str, str] | None = None,
                 xid_names: dict[int, str] | None = None) -> None:
        self.config = config
        self.rule_descriptions = rule_descriptions or {}
        self.xid_names = xid_names or {}

    def cause_text(self, r: Row) -> str:
        if r.xid is not None:
            name = self.xid_names.get(int(r.xid), "unknown XID")
            pci = f" on PCI {r.pci}" if r.pci else ""
            return f"XID {r.xid} {name}{pci}"
        desc = self.rule_descriptions.get(r.rule_id)
        if desc is None and r.rule_id.startswith("detector.") and r.message:
            desc = r.message.splitlines()[0][:200]   # a detector's message explains its evidence
        return desc or r.rule_id

    def incidents(self, findings: pl.DataFrame, spans: pl.DataFrame, addr_hosts: dict[str, str]) -> list[Incident]:
        cfg = self.config
        f = findings.filter(pl.col("category") != PROGRESS_CATEGORY)
        if f.height == 0:
            return []
        f = drop_model_findings(fill_jobs(f, spans, cfg.job_span_grace_s))
        if f.height == 0:
            return []
        f = f.with_columns(authority(f))
        escal = repeated_app_xids(f, cfg.repeat_app_xid_jobs)
        grouped = group_findings(f, cfg.incident_gap_s)
        agg = aggregate_rows(grouped)
        job_hosts: dict[str, set[str]] = {}
        for h, j in spans.select("host", "job_id").iter_rows():
            job_hosts.setdefault(j, set()).add(h)
        out: list[Incident] = []
        for (group,), part in agg.partition_by(["group"], as_dict=True, maintain_order=True).items():
            inc = self._one(group, part, job_hosts, addr_hosts, escal)
            if inc is not None:
                out.append(inc)
        out = defer_advisories(out, cfg.incident_gap_s)
        # ranked by rank_key (a confirmed cascading hardware cause first, ...)
        out.sort(key=rank_key)
        return out

    def _one(self, group: str, part: pl.DataFrame, job_hosts: dict[str, set[str]],
             addr_hosts: dict[str, str], escal: set[tuple[str, str]]) -> Incident | None:
        recs: list[dict[str, Any]] = part.to_dicts()
        scope, family = recs[0]["scope"], recs[0]["family"]
        rows = [Row(host=d["host"], rule_id=d["rule_id"], count=int(d["count"]), first=int(d["first"]),
                    last=int(d["last"]), category=d["category"], severity=d["severity"], role=d["role"],
                    action=d["action"] or "investigate", xid=d["xid"], pci=d["pci"],
                    gpu=d["gpu"] if d["gpu"] is not None else d["any_gpu"], message=d["message"],
                    file=d["file"], line=d["line"], peer=d["peer"], rank=d["rank"],
                    inferred=bool(d["time_inferred"]), authority=int(d["authority"]),
                    escalated=d["xid"] in (13, 31) and (d["host"], d["pci"] or "") in escal)
                for d in recs]
        clears = [r for r in rows if r.role == "clear"]
        scored = [r for r in rows if r.role in ROLE_WEIGHT]
        if not any(r.role in ("cause", "symptom", "breadcrumb") for r in scored):
            return None
        hosts_in_job = job_hosts.get(scope.split(ATTEMPT_SEP)[0], set())
        cands = rank_candidates(scored, hosts_in_job, addr_hosts, self.cause_text)
        top, top_row = cands[0]
        if top_row is None:   # a silent suspect: describe the incident by its strongest symptom
            top_row = max(scored, key=lambda r: (row_score(r, None), -r.first))
        category = top_row.category
        severity = max((r.severity for r in scored if r.host == top.node and r.role != "breadcrumb"),
                       key=lambda s: SEVERITY_RANK.get(s, 0), default=top_row.severity)
        if SEVERITY_RANK.get(top_row.severity, 0) > SEVERITY_RANK.get(severity, 0):
            severity = top_row.severity
        gpu = top_row.gpu
        if gpu is None:
            gpu = next((r.gpu for r in scored if r.host == top.node and r.gpu is not None
                        and (top_row.pci is None or r.pci in (None, top_row.pci))), None)
        if gpu is None and top_row.host == top.node and (category in HARDWARE_CATEGORIES
                                                         or category in ("cuda_error", "oom_gpu")):
            # one process per GPU in rank order (torchrun's default): local GPU = rank mod GPUs per node
            gpu = next((r.rank % self.config.gpus_per_node for r in sorted(scored, key=lambda r: r.first)
                        if r.host == top.node and r.rank is not None and r.role in ("cause", "symptom")), None)
        action = top_row.action
        if top_row.escalated:
            action = "investigate"
        # XID 154 restates what the driver now requires for that GPU: never propose less than that.
        for r in scored:
            if (r.xid == 154 and r.host == top.node and r.host is not None
                    and ACTION_STRENGTH.get(r.action, 0) > ACTION_STRENGTH.get(action, 0)):
                action = r.action
        if top.node is not None and top_row.host != top.node:
            action = "investigate"   # a suspect without its own fault line: look, don't drain
        if (category == Category.NVLINK.value and action in DRAINING_ACTIONS
                and any(r.rule_id == PCIE_FORM_FACTOR_RULE and r.host == top.node for r in rows)):
            action = "investigate"   # the log names a PCIe-form-factor GPU: "NVLink down" there is no fault
        own = [r.authority for r in scored if r.host == top.node and r.role == "cause"]
        auth = min(own) if own else (top_row.authority if top_row.host == top.node else CLAIM)
        if auth == CLAIM and action in DRAINING_ACTIONS:
            action = "investigate"   # a line naming another host is a claim to corroborate, not grounds to drain
        confirmed = top_row.host == top.node and top_row.role == "cause" and (
            auth == NODE or (auth in (JOB, JOB_LINE) and category not in HARDWARE_CATEGORIES))
        detected = self._detected_at(scored, hosts_in_job, addr_hosts, top.node, category)
        status = "open"
        if top.node is not None:
            related = [r for r in scored if r.host == top.node and r.category == category and r.role == "cause"]
            last_fault = max((r.last for r in related), default=None)
            n_fault = sum(r.count for r in related)
            cl = [c for c in clears if c.host == top.node and c.category == category and last_fault is not None
                  and c.last > last_fault]
            if cl:
                status = "flapping" if n_fault >= 3 else "cleared"
        first_seen = min(r.first for r in scored)
        ev_rows = sorted(scored, key=lambda r: (-row_score(r, None) - (1.0 if r.host == top.node else 0.0), r.first))
        ev_rows = ev_rows[: self.config.evidence_max]
        evidence = tuple(Evidence(time=r.first, node=r.host, message=r.message, rule_id=r.rule_id, file=r.file,
                                  line=r.line) for r in sorted(ev_rows, key=lambda r: (r.first, r.host or "")))
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.rule_id] = counts.get(r.rule_id, 0) + r.count
        job = None if scope.startswith("host:") or scope == "global" else scope.split(ATTEMPT_SEP)[0]
        return Incident(
            id=incident_id(scope, family, first_seen), category=category, cause=top.cause, severity=severity,
            node=top.node, gpu=gpu, job_id=job, xid=top_row.xid if top_row.host == top.node else None,
            confidence=_confidence(cands), first_seen=first_seen, last_seen=max(r.last for r in rows),
            detected_at=detected, count=sum(r.count for r in rows),
            nodes=tuple(sorted({r.host for r in rows if r.host})), evidence=evidence,
            candidates=tuple(c for c, _ in cands[:5]), rule_ids=tuple(sorted(counts)),
            counts_by_rule=counts, status=status, pci=top_row.pci if top_row.host == top.node else None,
            suggested_action=action, scope=scope,
            root_rule=top_row.rule_id if top_row.host == top.node else "attribution.suspect",
            authority=NAMES[auth], confirmed=confirmed)

    def _detected_at(self, scored: list[Row], job_hosts: set[str], addr_hosts: dict[str, str],
                     node: str | None, category: str) -> int:
        """Earliest prefix time at which the ranking already names (node, category)."""
        # Only lines with their own timestamp move the clock: a borrowed (inferred) time is a lower
        # bound of when the line was written, so it cannot prove the evidence was there that early.
        exact = [r for r in scored if not r.inferred]
        times = sorted({r.first for r in exact}) or [max(r.first for r in scored)]
        if len(times) > 256:   # evaluate at most 256 prefixes: the times where the culprit's rows appear first
            keep = {r.first for r in exact if r.host == node or r.role == "cause"}
            times = sorted(keep)[:256] + [times[-1]]
        for t in times:
            prefix = [r for r in scored if r.first <= t]
            cands = rank_candidates(prefix, job_hosts, addr_hosts, self.cause_text)
            if not cands:
                continue
            c, r = cands[0]
            cat = r.category if r is not None else None
            if c.node == node and (cat == category or r is None):
                return t
            if c.node is None and cat == category:   # detected for the job; the culprit was named later
                return t
        return max(r.first for r in scored)
