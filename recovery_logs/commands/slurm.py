"""`recovery-logs slurm status|breaker-reset`: remediation state and the circuit breaker."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands.audit import STATE_DIR_HELP, _state_dir
from recovery_logs.errors import SlurmError
from recovery_logs.textsafe import clean, json_dumps


def register(app: typer.Typer) -> None:
    slurm_app = typer.Typer(help="Slurm remediation state.", no_args_is_help=True)
    app.add_typer(slurm_app, name="slurm")

    @slurm_app.command("breaker-reset")
    def breaker_reset(state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Close a tripped circuit breaker (recorded in the audit trail)."""
        from recovery_logs.remediation.remediator import Remediator

        rem = Remediator.open_existing(_state_dir(state_dir), mode="monitor")
        try:
            rem.breaker_reset(by=getpass.getuser())
            was = rem.audit.records("breaker", newest_first=True, limit=1)[0].payload.get("was") or {}
        finally:
            rem.close()
        if "corrupt" in was:
            typer.echo(clean(f"breaker reset (its stored state was corrupt: {was['corrupt']!r}; recorded in the audit)"))
            return
        typer.echo(clean("breaker reset" + (f" (was tripped: {was.get('reason')})" if was.get("tripped") else
                                            " (it was not tripped)")))

    @slurm_app.command("status")
    def status(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
               state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Breaker, budget, dry-run count and actions by status (reads the state dir only)."""
        from recovery_logs.report.console import Snapshot

        snap = Snapshot.load(_state_dir(state_dir))
        from recovery_logs.audit import AuditLog
        from recovery_logs.remediation.actions import ActionStore

        log = AuditLog.open(_state_dir(state_dir))
        try:
            store = ActionStore.existing(log)
            counts = store.counts() if store is not None else {}
        finally:
            log.close()
        data = {"mode": snap.mode, "breaker": snap.breaker, "budget_used_hour": snap.budget_used,
                "budget_per_hour": snap.budget_per_hour, "drained_in_window": list(snap.drained),
                "cluster_nodes": snap.cluster_nodes, "dry_runs": snap.dry_runs, "actions": counts,
                "awaiting_approval": [p.action_id for p in snap.pending]}
        if as_json:
            typer.echo(json_dumps(data, sort_keys=True))
            return
        for k, v in data.items():
            typer.echo(clean(f"{k}: {v}"))

    @slurm_app.command("ledger")
    def ledger_cmd(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
                   state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """GPU-hours lost, ETTR, MTTD and time to action for the incidents in the audit trail
        (job runs from sacct; SLURM_CONF names the cluster)."""
        import time

        from recovery_logs.analysis.ledger import action_times, incidents_from_audit, ledger
        from recovery_logs.audit import DB_NAME, AuditLog
        from recovery_logs.errors import AuditError
        from recovery_logs.sources.slurm import SlurmClient

        path = _state_dir(state_dir) / DB_NAME
        if not path.exists():
            raise AuditError("slurm ledger: no audit database in the state dir", path=str(path))
        log = AuditLog(path)
        try:
            incs = incidents_from_audit(log)
            acts = action_times(log)
        finally:
            log.close()
        jobs = sorted({i.job_id for i in incs if i.job_id and i.job_id.replace("_", "").isdigit()})
        runs: dict[str, list] = {}
        if jobs:
            for r in SlurmClient().jobs(jobs):
                runs.setdefault(r.job_id, []).append(r)
        out = ledger(incs, runs, acts, time.time_ns())
        log = AuditLog(path)
        from recovery_logs.analysis.resume import resume_records  # commands/ import on use (start-up)
        from recovery_logs.sources.accounting import sacct_jobs

        jobs = sorted(set(jobs) | {j for r in log.records("detection") for j in r.payload.get("jobs") or ()
                                   if str(j).replace("_", "").isdigit()})
        try:
            allocs = sacct_jobs(jobs) if jobs else None
        except SlurmError as exc:      # accounting blind: the records say "unknown", never "not resumed"
            typer.echo(f"slurm ledger: sacct unavailable, resumed_at unknown: {exc}", err=True)
            allocs = None
        try:
            records = [r.to_dict() for r in resume_records(log, allocs, time.time_ns())]
        finally:
            log.close()
        out["records"] = records
        if as_json:
            typer.echo(json_dumps(out, sort_keys=True))
            return
        for rec in records:
            typer.echo(f"{rec['incident_id']} job {rec['job_id']}: fault {rec['fault_at']} -> detected "
                       f"+{rec['detect_s']} s -> requeue verified +{rec['verify_s']} s -> running again "
                       f"{rec['resumed_at'] or '-'} -> progress {rec['progress_resumed_at'] or '-'}; "
                       f"{rec['gpu_hours_lost']:.4f} GPU-h lost (until {rec['lost_until']})")
        for f in out["incidents"]:
            typer.echo(clean(f"{f['incident_id']} job {f['job_id'] or '-'}: {f['gpu_hours_lost']:.4f} GPU-h lost "
                       f"({f['gpus']} GPUs), MTTD {f['mttd_s']:.1f} s, time to action "
                       f"{'-' if f['time_to_action_s'] is None else format(f['time_to_action_s'], '.1f') + ' s'}"))
        for j, v in out["jobs"].items():
            typer.echo(clean(f"job {j}: ETTR {'-' if v is None else format(v, '.3f')}"))
        typer.echo(f"total {out['gpu_hours_lost']:.4f} GPU-h lost; mean MTTD {out['mttd_mean_s']} s; "
                   f"mean time to action {out['time_to_action_mean_s']} s")
