"""`recovery-logs audit verify|export`: check and export the hash-chained audit trail."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

STATE_DIR_HELP = "state dir (default: $XDG_STATE_HOME/recovery-logs or ~/.local/state/recovery-logs)"


def _state_dir(state_dir: Path | None) -> Path:
    from recovery_logs.audit import default_state_dir

    return state_dir or default_state_dir()


def _open(state_dir: Path | None):
    from recovery_logs.audit import DB_NAME, AuditLog
    from recovery_logs.errors import AuditError

    path = _state_dir(state_dir) / DB_NAME
    if not path.exists():
        raise AuditError("audit: no audit database in the state dir", path=str(path))
    return AuditLog(path)


def register(app: typer.Typer) -> None:
    audit_app = typer.Typer(help="Verify and export the audit trail.", no_args_is_help=True)
    app.add_typer(audit_app, name="audit")

    @audit_app.command("verify")
    def verify(state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None,
               key_file: Annotated[Path | None, typer.Option("--key-file", help="HMAC key of the anchors (default: "
                                                               "$RECOVERY_LOGS_AUDIT_KEY_FILE)")] = None,
               anchors: Annotated[Path | None, typer.Option("--anchors", help="anchor file (default: "
                                                            "$RECOVERY_LOGS_AUDIT_ANCHORS or <state-dir>/audit.anchors)")] = None,
               anchors_from: Annotated[str | None, typer.Option("--anchors-from",
                                                                help="victorialogs://HOST:PORT: also check the anchors "
                                                                     "stored there")] = None) -> None:
        """Check the audit trail read-only: triggers, hash chain, anchors outside the DB, actions/kv
        digest; exit 3 naming the first record or anchor that disagrees."""
        import os

        from recovery_logs.anchors import ENV_KEY, anchor_path, load_key, vl_anchors
        from recovery_logs.audit import DB_NAME, verify_db

        sd = _state_dir(state_dir)
        key = load_key(key_file or os.environ.get(ENV_KEY))
        extra = []
        if anchors_from:
            from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url

            client = VictoriaLogsClient(parse_url(anchors_from))
            try:
                extra = vl_anchors(client)
            finally:
                client.close()
        rep = verify_db(sd / DB_NAME, key=key, anchor_file=anchors or anchor_path(sd), extra_anchors=extra)
        signed = "signed, key checked" if rep.signed else "signatures not checked"
        typer.echo(f"audit chain OK: {rep.records} records, {rep.anchors} anchors ({signed}) ({sd / DB_NAME})")
        for note in rep.notes:
            typer.echo(f"note: {note}")

    @audit_app.command("export")
    def export(fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet")] = "jsonl",
               out: Annotated[Path | None, typer.Option("--out", "-o", help="output file (default: audit.<format>)")] = None,
               to: Annotated[str | None, typer.Option("--to", help="victorialogs://HOST:PORT: insert as log lines")] = None,
               after: Annotated[int, typer.Option("--after", help="only records with a larger id")] = 0,
               state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None) -> None:
        """Write every audit record as JSON lines or Parquet, or insert them into VictoriaLogs."""
        from recovery_logs.errors import ConfigError

        if to is not None:
            if out is not None:
                raise ConfigError("audit export: give --out or --to, not both")
            from recovery_logs.audit import audit_rows
            from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url

            log = _open(state_dir)
            try:
                rows = audit_rows(log.records(after_id=after))
            finally:
                log.close()
            client = VictoriaLogsClient(parse_url(to))
            try:
                client.insert_jsonline(rows, stream_fields=("unit", "host"))
            finally:
                client.close()
            typer.echo(f"inserted {len(rows)} audit records into {to}")
            return
        if fmt not in ("jsonl", "parquet"):
            raise ConfigError(f"audit export: --format must be jsonl or parquet, not {fmt!r}")
        log = _open(state_dir)
        try:
            path = out or Path(f"audit.{fmt}")
            n = log.export(path, fmt)
        finally:
            log.close()
        typer.echo(f"exported {n} records to {path}")
