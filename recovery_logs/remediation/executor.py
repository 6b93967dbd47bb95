"""The only code that changes the cluster: drain, resume, requeue (off the bad nodes), cancel.

Contract:

* argv lists only, through an injected ``CommandRunner`` (default: subprocess with a timeout on
  every command and SLURM_CONF passed through); never a shell string.
* Every target is validated first: node names by the Slurm hostname grammar, job ids as
  ``N`` or ``N_M``, reasons as printable text without ``=`` or control characters.
  ``UnsafeTargetError`` is raised before anything runs.
* One node per command (``scontrol update NodeName=a,b`` partly applies when one name is bad).
* Drain reasons carry our prefix: ``recovery-logs:<incident-id> <cause>``. We never drain a node
  that already carries someone else's reason (Slurm would silently overwrite it) and never
  resume a node whose reason is not ours: both come back as ``not_owner``.
* Every action is checked by observing Slurm again (node state and reason, job state,
  restarts and ExcNodeList) before it is reported ``done``.
* Each call is idempotent: it observes first, so running it again after a crash or a timeout
  (the command may have applied) never doubles the effect. A requeue carries the job's
  restart count seen before the first attempt (``baseline``) for that reason.
* ``SlurmUnavailable`` means "not done, try again later"; ``SlurmError`` means Slurm refused.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery_logs.errors import SlurmError, UnsafeTargetError
from recovery_logs.sources.slurm import (
    FINISHED_STATES,
    CommandResult,
    CommandRunner,
    NodeInfo,
    SlurmClient,
    SubprocessRunner,
    check,
    expand_hostlist,
)

REASON_PREFIX = "recovery-logs:"
_NODE_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})$")
_JOB_RE = re.compile(r"^[0-9]{1,10}(?:_[0-9]{1,10})?$")
_INCIDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING", "STOPPED", "RESIZING"})


# names Slurm reads as something other than one node: `ALL` (every node), hostlist expressions
# (`gpu-n[01-08]`, `a,b`: excluded by _NODE_RE), and the placeholders it prints for "none"
_SLURM_KEYWORDS = frozenset({"all", "none", "null", "unknown"})


def validate_node(name: object) -> str:
    if not isinstance(name, str) or not _NODE_RE.fullmatch(name) or ".." in name:
        raise UnsafeTargetError(f"executor: {name!r} is not a valid Slurm node name", target=repr(name))
    if name.lower() in _SLURM_KEYWORDS:
        raise UnsafeTargetError(f"executor: {name!r} is a Slurm keyword, not one node", target=repr(name))
    return name


def validate_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not _JOB_RE.fullmatch(job_id):
        raise UnsafeTargetError(f"executor: {job_id!r} is not a valid Slurm job id", target=repr(job_id))
    return job_id


def validate_reason(text: object, limit: int = 200) -> str:
    if not isinstance(text, str) or not text or len(text) > limit or "=" in text \
            or any(not ch.isprintable() for ch in text):
        raise UnsafeTargetError(f"executor: drain reason {text!r} is not allowed (printable, no '=', <= {limit})",
                                target=repr(text))
    return text


def validate_incident_id(inc: object) -> str:
    if not isinstance(inc, str) or not _INCIDENT_RE.fullmatch(inc):
        raise UnsafeTargetError(f"executor: {inc!r} is not a valid incident id", target=repr(inc))
    return inc


def drain_reason(incident_id: str, cause: str) -> str:
    """``recovery-logs:<incident-id> <cause>`` with the cause cleaned to what Slurm keeps intact."""
    cleaned = re.sub(r"[^A-Za-z0-9 ._:/()#,+-]", " ", cause or "").strip()
    cleaned = re.sub(r"\s+", " ", cleaned)[:120]
    return validate_reason(f"{REASON_PREFIX}{validate_incident_id(incident_id)} {cleaned}".strip())


@dataclass(frozen=True)
class Outcome:
    status: str                         # done | noop | not_owner | skipped | failed
    message: str
    observed: dict[str, Any] = field(default_factory=dict)
    retry: bool = False                 # failed, but trying again may work (the effect was not visible yet)

    @property
    def ok(self) -> bool:
        return self.status in ("done", "noop")


class SlurmExecutor:
    """Drives scontrol/scancel through ``runner``; ``poll_s`` bounds how long a check waits."""

    def __init__(self, runner: CommandRunner | None = None, *, timeout_s: float = 15.0, poll_s: float = 15.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.runner = runner or SubprocessRunner()
        self.client = SlurmClient(self.runner, timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.sleep = sleep
        self.commands: list[CommandResult] = []   # every command that changed something, in order

    # ------------------------------------------------------------------ helpers
    def _change(self, argv: list[str], what: str) -> CommandResult:
        res = self.runner.run(argv, self.timeout_s)
        self.commands.append(res)
        return check(res, what)

    def _poll(self, probe: Callable[[], tuple[bool, Any]]) -> tuple[bool, Any]:
        deadline = time.monotonic() + self.poll_s
        while True:
            ok, seen = probe()
            if ok or time.monotonic() >= deadline:
                return ok, seen
            self.sleep(0.2)

    @staticmethod
    def owns(node: NodeInfo) -> bool:
        return node.reason.startswith(REASON_PREFIX)

    # ------------------------------------------------------------------ node actions
    def drain(self, node: str, incident_id: str, cause: str) -> Outcome:
        node = validate_node(node)
        reason = drain_reason(incident_id, cause)
        self.client.ping()
        before = self.client.show_node(node)
        seen = {"state": before.state, "flags": list(before.flags), "reason": before.reason}
        if before.drained and self.owns(before):
            return Outcome("noop", f"{node} is already drained by recovery-logs ({before.reason})", seen)
        if before.reason and not self.owns(before):
            return Outcome("not_owner", f"{node} already carries a reason set by {before.reason_user or 'someone else'}"
                           f" ({before.reason!r}); not draining over it", seen)
        self._change(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], f"drain {node}")
        ok, after = self._poll(lambda: ((n := self.client.show_node(node)).drained and n.reason == reason, n))
        seen = {"state": after.state, "flags": list(after.flags), "reason": after.reason}
        if not ok:
            return Outcome("failed", f"{node}: drain not visible in Slurm (state {after.state}, reason {after.reason!r})",
                           seen, retry=True)
        return Outcome("done", f"{node} drained ({after.state}+DRAIN, reason {reason!r})", seen)

    def resume(self, node: str) -> Outcome:
        node = validate_node(node)
        self.client.ping()
        before = self.client.show_node(node)
        seen = {"state": before.state, "flags": list(before.flags), "reason": before.reason}
        if not before.drained and before.state not in ("down", "drained"):
            return Outcome("noop", f"{node} is not drained ({before.state})", seen)
        if not self.owns(before):
            return Outcome("not_owner", f"{node} was drained by {before.reason_user or 'someone else'} "
                           f"({before.reason!r}); not resuming it", seen)
        self._change(["scontrol", "update", f"NodeName={node}", "State=RESUME"], f"resume {node}")
        ok, after = self._poll(lambda: (not (n := self.client.show_node(node)).drained and n.state != "down", n))
        seen = {"state": after.state, "flags": list(after.flags), "reason": after.reason}
        if not ok:
            return Outcome("failed", f"{node}: still {after.state}+{'+'.join(after.flags)} after RESUME", seen,
                           retry=True)
        return Outcome("done", f"{node} resumed ({after.state})", seen)

    # ------------------------------------------------------------------ job actions
    def _job(self, job_id: str) -> dict[str, str]:
        info = self.client.show_job(job_id)
        if info is None:
            raise SlurmError(f"executor: job {job_id} is not known to slurmctld (finished long ago or never existed)",
                             argv=["scontrol", "show", "job", job_id], rc=1)
        return info

    @staticmethod
    def _job_seen(info: dict[str, str]) -> dict[str, Any]:
        return {"state": info.get("JobState"), "reason": info.get("Reason"), "restarts": int(info.get("Restarts", 0)),
                "exc_nodes": expand_hostlist(info.get("ExcNodeList")), "nodes": expand_hostlist(info.get("NodeList"))}

    def job_baseline(self, job_id: str) -> int:
        """The restart count to pass as ``baseline`` to ``requeue`` (observed before the first attempt)."""
        self.client.ping()
        return int(self._job(validate_job_id(job_id)).get("Restarts", 0))

    def requeue(self, job_id: str, exclude: Sequence[str] = (), baseline: int | None = None) -> Outcome:
        """Requeue a running job so that it never lands on ``exclude`` again (22.05: requeuehold,
        update ExcNodeList, release). Finished jobs are not requeued (Slurm would say rc 0 and
        resurrect them)."""
        job_id = validate_job_id(job_id)
        exclude = [validate_node(n) for n in exclude]
        self.client.ping()
        info = self._job(job_id)
        seen = self._job_seen(info)
        if baseline is None:
            baseline = seen["restarts"]
        state = seen["state"] or ""
        held_by_us = info.get("Reason") == "job_requeued_in_held_state"
        already = seen["restarts"] > baseline
        if not already:
            if state in FINISHED_STATES:
                return Outcome("skipped", f"job {job_id} already ended ({state}); not requeued", seen)
            if info.get("Requeue") == "0":
                return Outcome("failed", f"job {job_id} was submitted with --no-requeue; cannot requeue", seen)
            if state == "PENDING":
                if exclude and not set(exclude) <= set(seen["exc_nodes"]):
                    self._set_excluded(job_id, seen["exc_nodes"], exclude)
                return self._verify_requeue(job_id, exclude, baseline, pending_only=True)
            if state not in _RUNNING_STATES:
                return Outcome("failed", f"job {job_id} is {state}; not requeued", seen)
            self._change(["scontrol", "requeuehold", job_id], f"requeue-hold job {job_id}")
            held_by_us = True
        if exclude and not set(exclude) <= set(seen["exc_nodes"]):
            self._set_excluded(job_id, seen["exc_nodes"], exclude)
        if held_by_us:
            self._change(["scontrol", "release", job_id], f"release job {job_id}")
        return self._verify_requeue(job_id, exclude, baseline)

    def _set_excluded(self, job_id: str, current: Sequence[str], exclude: Sequence[str]) -> None:
        merged = sorted(set(current) | set(exclude))
        self._change(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(merged)}"],
                     f"exclude {','.join(exclude)} from job {job_id}")

    def _verify_requeue(self, job_id: str, exclude: Sequence[str], baseline: int,
                        pending_only: bool = False) -> Outcome:
        def probe() -> tuple[bool, dict[str, Any]]:
            info = self._job(job_id)
            s = self._job_seen(info)
            held = info.get("Reason") == "job_requeued_in_held_state" or info.get("Priority") == "0"
            ok = (set(exclude) <= set(s["exc_nodes"]) and not held
                  and (pending_only or s["restarts"] > baseline) and s["state"] not in FINISHED_STATES)
            return ok, s

        ok, seen = self._poll(probe)
        if not ok:
            return Outcome("failed", f"job {job_id}: requeue not visible (state {seen['state']}, restarts "
                           f"{seen['restarts']}, excluded {seen['exc_nodes']})", seen, retry=True)
        what = "kept pending" if pending_only else "requeued"
        return Outcome("done", f"job {job_id} {what} ({seen['state']}, restarts {seen['restarts']}), "
                       f"excluded {','.join(seen['exc_nodes']) or 'none'}", seen)

    def cancel(self, job_id: str) -> Outcome:
        job_id = validate_job_id(job_id)
        self.client.ping()
        info = self._job(job_id)
        seen = self._job_seen(info)
        if seen["state"] in FINISHED_STATES:
            return Outcome("noop", f"job {job_id} already ended ({seen['state']})", seen)
        self._change(["scancel", job_id], f"scancel {job_id}")   # rc 0 even for unknown ids: observe
        ok, seen = self._poll(lambda: ((s := self._job_seen(self._job(job_id)))["state"] == "CANCELLED", s))
        if not ok:
            return Outcome("failed", f"job {job_id}: still {seen['state']} after scancel", seen, retry=True)
        return Outcome("done", f"job {job_id} cancelled", seen)

    # ------------------------------------------------------------------ dispatch
    def execute(self, kind: str, target: str, *, incident_id: str = "manual", cause: str = "",
                exclude: Sequence[str] = (), baseline: int | None = None) -> Outcome:
        if kind == "drain_node":
            return self.drain(target, incident_id, cause)
        if kind == "resume_node":
            return self.resume(target)
        if kind == "requeue_job":
            return self.requeue(target, exclude, baseline)
        if kind == "cancel_job":
            return self.cancel(target)
        raise SlurmError(f"executor: {kind} is not an action the executor runs", kind=kind)

    def validate(self, kind: str, target: str | None, exclude: Sequence[str] = (),
                 incident_id: str | None = None, cause: str = "") -> None:
        """Validate without running anything (UnsafeTargetError on a bad target)."""
        if kind in ("drain_node", "resume_node"):
            validate_node(target)
            if kind == "drain_node":
                drain_reason(incident_id or "manual", cause)
        elif kind in ("requeue_job", "cancel_job"):
            validate_job_id(target)
            for n in exclude:
                validate_node(n)


__all__ = ["REASON_PREFIX", "CommandResult", "CommandRunner", "Outcome", "SlurmExecutor", "SubprocessRunner",
           "drain_reason", "validate_incident_id", "validate_job_id", "validate_node", "validate_reason"]
