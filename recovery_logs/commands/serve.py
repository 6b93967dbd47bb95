"""`recovery-logs serve` (the web console) and `recovery-logs serve-user` (issue a token)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.commands.audit import STATE_DIR_HELP, _state_dir

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        users: Annotated[Path, typer.Option("--users", help="users TOML: [[user]] name, role, token_sha256")],
        state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_DIR_HELP)] = None,
        bind: Annotated[str, typer.Option("--bind", help="HOST:PORT to listen on (default loopback only)")] = "127.0.0.1:8080",
        trust_proxy_header: Annotated[str | None, typer.Option(
            "--trust-proxy-header", help="take the user name from this header set by an authenticating reverse "
                                         "proxy (e.g. X-Forwarded-User); off by default")] = None,
        insecure_cookie: Annotated[bool, typer.Option(
            "--insecure-cookie", help="session cookie without the Secure flag (plain HTTP beyond localhost; "
                                      "prefer TLS at a reverse proxy)")] = False,
        victorialogs: Annotated[str | None, typer.Option(
            "--victorialogs", help="http://HOST:PORT of VictoriaLogs: evidence links open there")] = None,
    ) -> None:
        """Web console: incidents (live), approvals, policy, ledger, audit; roles from the users file."""
        try:
            import uvicorn

            from recovery_logs.web.app import build_app
        except ImportError as exc:   # optional extra
            from recovery_logs.errors import ConfigError

            raise ConfigError(f"serve needs the web extra: pip install 'recovery-logs[web]' ({exc})") from exc
        from recovery_logs.audit import DB_NAME
        from recovery_logs.errors import AuditError
        from recovery_logs.pipeline.metrics import parse_bind
        from recovery_logs.web.auth import Users

        sd = _state_dir(state_dir)
        if not (sd / DB_NAME).exists():
            raise AuditError("serve: no audit database in the state dir (start `watch --slurm` first)",
                             path=str(sd / DB_NAME))
        host, port = parse_bind(bind)
        user_db = Users.load(users)
        if host not in LOOPBACK:
            typer.echo(f"serve: listening on {host}, beyond this machine: put TLS in front", err=True)
        web = build_app(sd, user_db, trust_proxy_header=trust_proxy_header, secure_cookie=not insecure_cookie,
                        victorialogs=victorialogs)
        typer.echo(f"serve: http://{host}:{port}/ ({len(user_db)} users, state {sd})", err=True)
        uvicorn.run(web, host=host, port=port, log_level="warning", access_log=False, server_header=False,
                    proxy_headers=False)

    @app.command("serve-user")
    def serve_user(
        name: Annotated[str, typer.Argument(help="user name (recorded in the audit trail with every decision)")],
        role: Annotated[str, typer.Option("--role", help="viewer | operator | admin")] = "viewer",
        users: Annotated[Path, typer.Option("--users", help="users TOML to append to (created 0600)")] = Path("users.toml"),
    ) -> None:
        """Add a user with a new random token; the token is printed once, only its sha256 is stored."""
        from recovery_logs.web.auth import write_user

        token = write_user(users, name, role)
        typer.echo(token)
        typer.echo(f"added {name} ({role}) to {users}; give them the token above, it is not stored", err=True)
