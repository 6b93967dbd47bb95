"""Slurm readers: sacct / squeue / sinfo (``--json``) and ``scontrol show node/job`` (22.05+).

Everything runs through a ``CommandRunner`` (argv lists, a timeout on every command), so the
same code drives the real CLI, a recording runner in tests, or a remote shell.

* ``SlurmClient.jobs(...)`` — ``sacct --json`` parsed by the data_parser named in
  ``meta.plugin.type`` (22.05: ``openapi/dbv0.0.38``); falls back to ``sacct --parsable2`` when
  the JSON output is not available or unknown. 22.05's JSON exit code is wrong for plain
  non-zero exits (always SUCCESS/0), so exit codes come from ``sacct -P -X -o JobID,ExitCode``.
* ``jobs_on(host, time_ns)`` — (host, time) → the jobs that ran there then.
* ``nodes()`` (``sinfo --json``), ``queue()`` (``squeue --json``), ``show_node`` / ``show_job``
  (``scontrol show -o``; ``--json`` for scontrol only arrived in 23.02).

Failures map to ``SlurmUnavailable`` (controller or slurmdbd unreachable, command timed out)
or ``SlurmError`` (anything else), both carrying argv, rc and stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from recovery_logs.errors import SlurmError, SlurmUnavailable
from recovery_logs.timeutil import NS

FINISHED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
_UNAVAILABLE = ("Unable to contact slurm controller", "Connection refused", "Socket timed out",
                "Munge encode failed", "Zero Bytes were transmitted", "slurmdbd: Connection",
                "Problem talking to the database", "persistent connection", "Transport endpoint")


# ---------------------------------------------------------------------------- command runner
@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float = 0.0


class CommandRunner(Protocol):
    """Runs one command. Contract: ``argv`` is a list (never a shell string); blocks at most
    ``timeout_s``; returns the exit status and output whatever the status; raises
    ``SlurmUnavailable`` when the command could not finish in time or could not be started."""

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


class SubprocessRunner:
    """The default runner: ``subprocess.run`` with a timeout; ``slurm_conf`` sets SLURM_CONF."""

    def __init__(self, slurm_conf: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self.env,
                               stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"slurm: {argv[0]} did not answer within {timeout_s:g} s", argv=list(argv),
                                   stderr=(exc.stderr or b"").decode("utf-8", "replace")
                                   if isinstance(exc.stderr, bytes) else exc.stderr) from exc
        except OSError as exc:
            raise SlurmUnavailable(f"slurm: cannot run {argv[0]}: {exc.strerror}", argv=list(argv)) from exc
        return CommandResult(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


# Slurm's message -> what it means for us (measured on 22.05.8; see scripts/slurm and shared README)
_MEANING = (
    ("Invalid node name specified", "the node is not known to Slurm"),
    ("Invalid job id specified", "the job id is not known to slurmctld"),
    ("Requested operation is presently disabled", "the job does not allow requeue (submitted with --no-requeue)"),
    ("Job is pending execution", "the job is pending, there is nothing to requeue"),
    ("Invalid node state specified", "the node is not in a state that allows this change"),
    ("You must specify a reason", "Slurm needs a reason to drain a node"),
    ("Access/permission denied", "this user may not change the cluster (needs root or SlurmUser)"),
    ("Job/step already completing or completed", "the job has already ended"),
)


def check(res: CommandResult, what: str) -> CommandResult:
    """Raise the mapped error for a failed command; return it otherwise."""
    if res.rc == 0:
        return res
    text = (res.stderr or "") + (res.stdout or "")
    msg = text.strip().splitlines()[-1] if text.strip() else f"exit status {res.rc}"
    meaning = next((m for k, m in _MEANING if k in text), None)
    if meaning:
        msg = f"{meaning} ({msg})"
    if any(s in text for s in _UNAVAILABLE):
        raise SlurmUnavailable(f"slurm: {what}: controller or accounting unreachable ({msg})",
                               argv=list(res.argv), rc=res.rc, stderr=res.stderr.strip())
    raise SlurmError(f"slurm: {what} failed: {msg}", argv=list(res.argv), rc=res.rc, stderr=res.stderr.strip())


# ---------------------------------------------------------------------------- parsing helpers
def expand_hostlist(expr: str | None) -> list[str]:
    """``gpu-n[01-03,07],cpu1`` -> ``['gpu-n01', 'gpu-n02', 'gpu-n03', 'gpu-n07', 'cpu1']``."""
    if not expr or expr in ("(null)", "None"):
        return []
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if hi:
                width = len(lo)
                for i in range(int(lo), int(hi) + 1):
                    out.extend(f"{prefix}{i:0{width}d}{x}" for x in (expand_hostlist(rest) or [""]))
            else:
                out.extend(f"{prefix}{lo}{x}" for x in (expand_hostlist(rest) or [""]))
    return out


_KV = re.compile(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s+[A-Za-z][\w:/.]*=|\s*$)")


def parse_scontrol(text: str) -> dict[str, str]:
    """Parse one record of ``scontrol show node|job -o`` (``Key=value`` pairs; values may hold spaces)."""
    return {m.group(1): m.group(2).strip() for m in _KV.finditer(text.strip())}


def parse_tres(text: str | None) -> dict[str, float]:
    """``cpu=2,mem=2000M,gres/gpu=4`` -> ``{'cpu': 2, 'mem': 2000, 'gres/gpu': 4}``."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        k, _, v = item.partition("=")
        m = re.match(r"^([\d.]+)", v)
        if k and m:
            out[k] = float(m.group(1))
    return out


def _ts(v: Any) -> int | None:
    if isinstance(v, dict):  # later data_parser versions: {"set": true, "number": N}
        v = v.get("number") if v.get("set", True) else None
    return int(v) * NS if isinstance(v, int | float) and v > 0 else None


def _text_time(v: str) -> int | None:
    """sacct's text times are local time of the host that runs sacct."""
    if not v or v in ("Unknown", "None", "N/A"):
        return None
    return int(time.mktime(time.strptime(v, "%Y-%m-%dT%H:%M:%S"))) * NS


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True)
class JobRecord:
    """One run of a job (a requeued job has several runs with the same ``job_id``)."""

    job_id: str
    name: str
    state: str
    nodes: tuple[str, ...]
    gpus: int
    start_ns: int | None
    end_ns: int | None
    submit_ns: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    tres: dict[str, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES or self.state == "REQUEUED"

    def ran_on(self, host: str, t_ns: int) -> bool:
        if host not in self.nodes or self.start_ns is None or t_ns < self.start_ns:
            return False
        return self.end_ns is None or t_ns <= self.end_ns


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str                 # base state, lower case (idle, mixed, allocated, down, ...)
    flags: tuple[str, ...]     # DRAIN, NOT_RESPONDING, ...
    reason: str                # without the "[user@time]" suffix
    reason_user: str | None
    gpus: int

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    def __rich__(self) -> str:
        fl = "+" + "+".join(self.flags) if self.flags else ""
        return f"{self.name} {self.state}{fl} {self.reason}".rstrip()


def gpus_from_tres(tres: Mapping[str, float]) -> int:
    if "gres/gpu" in tres:
        return int(tres["gres/gpu"])
    return int(sum(v for k, v in tres.items() if k.startswith("gres/gpu:")))


def node_from_scontrol(kv: Mapping[str, str]) -> NodeInfo:
    parts = kv.get("State", "").split("+")
    base = parts[0].rstrip("*").lower()
    flags = tuple(p.rstrip("*") for p in parts[1:])
    reason = kv.get("Reason", "")
    user = None
    m = re.match(r"^(.*?)\s*\[([^@\]]+)@[^\]]*\]$", reason)
    if m:
        reason, user = m.group(1), m.group(2)
    return NodeInfo(kv.get("NodeName", ""), base, flags, reason, user,
                    gpus_from_tres(parse_tres(kv.get("CfgTRES"))))


# ---------------------------------------------------------------------------- sacct parsers
def parse_sacct_json(data: Mapping[str, Any]) -> list[JobRecord]:
    """Parse ``sacct --json``; keyed on ``meta.plugin.type`` (22.05: openapi/dbv0.0.38)."""
    plugin = str(((data.get("meta") or {}).get("plugin") or {}).get("type", ""))
    if not re.search(r"dbv0\.0\.3[6-9]|data_parser/v0\.0\.(39|40|41)", plugin):
        raise SlurmError(f"slurm: sacct --json from an unknown data parser {plugin!r}", plugin=plugin)
    out = []
    for j in data.get("jobs", []):
        st = j.get("state", {})
        state = st.get("current") if isinstance(st, dict) else st
        if isinstance(state, list):          # newer parsers: ["FAILED"]
            state = state[0] if state else "UNKNOWN"
        tres: dict[str, float] = {}
        for t in (j.get("tres") or {}).get("allocated", []) or []:
            if t.get("count") is None:
                continue
            key = t["type"] + (f"/{t['name']}" if t.get("name") else "")
            tres[key] = float(t["count"])
        ec = j.get("exit_code") or {}
        sig = (ec.get("signal") or {}).get("signal_id") if isinstance(ec, dict) else None
        rc = ec.get("return_code") if isinstance(ec, dict) else None
        if isinstance(rc, dict):
            rc = rc.get("number")
        t = j.get("time") or {}
        out.append(JobRecord(job_id=str(j["job_id"]), name=j.get("name", ""), state=str(state),
                             nodes=tuple(expand_hostlist(j.get("nodes"))), gpus=gpus_from_tres(tres),
                             start_ns=_ts(t.get("start")), end_ns=_ts(t.get("end")),
                             submit_ns=_ts(t.get("submission")), exit_code=rc, signal=sig, tres=tres))
    return out


PARSABLE_FIELDS = "JobID,JobName,State,ExitCode,NodeList,Start,End,Submit,AllocTRES"


def parse_sacct_parsable(text: str) -> list[JobRecord]:
    """Parse ``sacct -P -D -X -o JobID,JobName,State,ExitCode,NodeList,Start,End,Submit,AllocTRES``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    head = lines[0].split("|")
    out = []
    for ln in lines[1:]:
        row = dict(zip(head, ln.split("|"), strict=False))
        if "." in row.get("JobID", ""):
            continue
        code, _, sig = row.get("ExitCode", "0:0").partition(":")
        tres = parse_tres(row.get("AllocTRES"))
        out.append(JobRecord(job_id=row["JobID"], name=row.get("JobName", ""),
                             state=row.get("State", "").split(" ")[0], nodes=tuple(expand_hostlist(row.get("NodeList"))),
                             gpus=gpus_from_tres(tres), start_ns=_text_time(row.get("Start", "")),
                             end_ns=_text_time(row.get("End", "")), submit_ns=_text_time(row.get("Submit", "")),
                             exit_code=int(code) if code.isdigit() else None,
                             signal=int(sig) if sig.isdigit() and int(sig) else None, tres=tres))
    return out


# ---------------------------------------------------------------------------- client
class SlurmClient:
    """Reads Slurm. ``runner`` defaults to ``SubprocessRunner(slurm_conf)``."""

    def __init__(self, runner: CommandRunner | None = None, slurm_conf: str | None = None,
                 timeout_s: float = 15.0) -> None:
        self.runner = runner or SubprocessRunner(slurm_conf)
        self.timeout_s = timeout_s
        self.json_ok: bool | None = None

    def _run(self, argv: list[str], what: str) -> CommandResult:
        return check(self.runner.run(argv, self.timeout_s), what)

    def ping(self) -> None:
        """Raise SlurmUnavailable unless slurmctld answers (``scontrol ping`` is instant when it is down)."""
        res = self.runner.run(["scontrol", "ping"], self.timeout_s)
        if res.rc != 0 or "is UP" not in res.stdout:
            raise SlurmUnavailable("slurm: slurmctld is not responding (scontrol ping)", argv=list(res.argv),
                                   rc=res.rc, stderr=(res.stdout + res.stderr).strip()[:300])

    def jobs(self, job_ids: Sequence[str] = (), *, start: str = "now-7days", end: str | None = None,
             nodes: Sequence[str] = (), use_json: bool | None = None) -> list[JobRecord]:
        """Accounting records (every run of every job), JSON first, ``--parsable2`` as fallback."""
        sel = ["-j", ",".join(job_ids)] if job_ids else ["-S", start] + (["-E", end] if end else [])
        if nodes:
            sel += ["-N", ",".join(nodes)]
        want_json = self.json_ok is not False if use_json is None else use_json
        recs: list[JobRecord] | None = None
        if want_json:
            res = self.runner.run(["sacct", "--json", *sel], self.timeout_s)
            try:
                check(res, "sacct --json")
                recs = parse_sacct_json(json.loads(res.stdout))
                self.json_ok = True
            except SlurmUnavailable:
                raise
            except (SlurmError, ValueError, KeyError, TypeError):
                self.json_ok = False if use_json is None else self.json_ok
                recs = None
        if recs is None:
            res = self._run(["sacct", "-P", "-D", "-X", "-o", PARSABLE_FIELDS, *sel], "sacct --parsable2")
            return parse_sacct_parsable(res.stdout)
        return self._fix_exit_codes(recs, sel)

    def _fix_exit_codes(self, recs: list[JobRecord], sel: list[str]) -> list[JobRecord]:
        """22.05 JSON says SUCCESS/0 for every normal exit; the text ExitCode is right."""
        if not recs:
            return recs
        res = self._run(["sacct", "-P", "-n", "-D", "-X", "-o", "JobID,State,ExitCode", *sel], "sacct exit codes")
        codes: dict[tuple[str, str], list[int]] = {}
        for ln in res.stdout.splitlines():
            parts = ln.split("|")
            if len(parts) == 3 and ":" in parts[2]:
                code = parts[2].split(":")[0]
                codes.setdefault((parts[0], parts[1].split(" ")[0]), []).append(int(code) if code.isdigit() else 0)
        out = []
        for r in recs:
            lst = codes.get((r.job_id, r.state))
            if lst and r.signal is None:
                r = JobRecord(**{**r.__dict__, "exit_code": lst.pop(0)})
            out.append(r)
        return out

    def jobs_on(self, host: str, t_ns: int, *, window_s: int = 86400) -> list[JobRecord]:
        """(host, time) -> the job runs that were on ``host`` at ``t_ns``."""
        lo = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_ns / NS - window_s))
        hi = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_ns / NS + 60))
        return [r for r in self.jobs(start=lo, end=hi, nodes=[host]) if r.ran_on(host, t_ns)]

    def nodes(self) -> list[NodeInfo]:
        res = self._run(["sinfo", "--json"], "sinfo --json")
        data = json.loads(res.stdout)
        if data.get("errors"):   # rc 0 with an error list when slurmctld is down
            raise SlurmUnavailable(f"slurm: sinfo --json reported {data['errors']}", argv=list(res.argv))
        out = []
        for n in data.get("nodes", []):
            out.append(NodeInfo(n["name"], str(n.get("state", "")).lower(), tuple(n.get("state_flags") or ()),
                                n.get("reason") or "", n.get("reason_set_by_user"),
                                gpus_from_tres(parse_tres(n.get("tres")))))
        return out

    def queue(self) -> list[dict[str, Any]]:
        """``squeue --json`` jobs (includes jobs finished in the last MinJobAge seconds)."""
        res = self._run(["squeue", "--json"], "squeue --json")
        data = json.loads(res.stdout)
        if data.get("errors"):
            raise SlurmUnavailable(f"slurm: squeue --json reported {data['errors']}", argv=list(res.argv))
        return list(data.get("jobs", []))

    def show_node(self, name: str) -> NodeInfo:
        res = self.runner.run(["scontrol", "show", "node", "-o", name], self.timeout_s)
        if res.rc != 0 and "not found" in res.stdout:
            raise SlurmError(f"slurm: node {name} is not known to slurmctld", argv=list(res.argv), rc=res.rc,
                             stderr=res.stdout.strip())
        check(res, f"scontrol show node {name}")
        return node_from_scontrol(parse_scontrol(res.stdout.splitlines()[0]))

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job -o`` as a dict; None when slurmctld no longer knows the id."""
        res = self.runner.run(["scontrol", "show", "job", "-o", job_id], self.timeout_s)
        if res.rc != 0 and "Invalid job id" in res.stderr:
            return None
        check(res, f"scontrol show job {job_id}")
        return parse_scontrol(res.stdout.splitlines()[0])


__all__ = ["FINISHED_STATES", "CommandResult", "CommandRunner", "JobRecord", "NodeInfo", "SlurmClient",
           "SubprocessRunner", "check", "expand_hostlist", "gpus_from_tres", "node_from_scontrol",
           "parse_sacct_json", "parse_sacct_parsable", "parse_scontrol", "parse_tres"]
