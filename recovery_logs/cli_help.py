"""One example per command, shown at the end of its ``--help`` (tested: every command has one,
every option has a help text).

Help is printed by click's plain formatter (``rich_markup_mode=None`` on the app), so texts such as
``[engine]`` or ``[promotion]`` are printed as written, never read as Rich markup.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXAMPLES", "apply_examples"]

EXAMPLES: dict[str, str] = {
    "archive": "recovery-logs archive /var/log/cluster/ --out /srv/recovery-logs/archive",
    "approve": "recovery-logs approve act-3f2a9c0d1e --state-dir /var/lib/recovery-logs",
    "reject": "recovery-logs reject act-3f2a9c0d1e --reason 'node already in maintenance'",
    "audit verify": "recovery-logs audit verify --state-dir /var/lib/recovery-logs",
    "audit export": "recovery-logs audit export --format parquet -o audit.parquet",
    "backtest": "recovery-logs backtest --policy deploy/policy.sample.toml sim-out/",
    "grade": "recovery-logs grade --state-dir /var/lib/recovery-logs",
    "console": "recovery-logs console --state-dir /var/lib/recovery-logs --once --width 160",
    "demo": "recovery-logs demo xid79_nccl_cascade --width 120",
    "eval": "recovery-logs eval sim-out/ --min-top1 0.9",
    "lemon update": "recovery-logs lemon update incidents.json --state-dir /var/lib/recovery-logs",
    "lemon show": "recovery-logs lemon show --state-dir /var/lib/recovery-logs",
    "nvml-agent": "recovery-logs nvml-agent --to victorialogs://127.0.0.1:9428 --interval 10s",
    "replay": "recovery-logs replay /var/log/cluster/ --out report/ --width 160",
    "rules check": "recovery-logs rules check",
    "rules list": "recovery-logs rules list",
    "rules test": "recovery-logs rules test 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.'",
    "serve": "recovery-logs serve --state-dir /var/lib/recovery-logs --users /etc/recovery-logs/users.toml",
    "serve-user": "recovery-logs serve-user alice --role operator --users /etc/recovery-logs/users.toml",
    "simulate": "recovery-logs simulate --scenario all --out sim-out/ --nodes 8",
    "slurm breaker-reset": "recovery-logs slurm breaker-reset --state-dir /var/lib/recovery-logs",
    "slurm status": "recovery-logs slurm status --json",
    "slurm ledger": "recovery-logs slurm ledger --json",
    "train": "recovery-logs train --data sim-out/ --out models/site",
    "version": "recovery-logs version",
    "watch": "recovery-logs watch --source victorialogs://127.0.0.1:9428 --state-dir /var/lib/recovery-logs "
             "--metrics-bind 127.0.0.1:9310",
}


def _epilog(path: str) -> str | None:
    ex = EXAMPLES.get(path)
    return None if ex is None else f"\b\nExample:\n  {ex}"


def _apply(typer_app: Any, prefix: str) -> None:
    for cmd in typer_app.registered_commands:
        name = cmd.name or (cmd.callback.__name__.replace("_", "-") if cmd.callback else "")
        path = f"{prefix} {name}".strip()
        if cmd.epilog is None:
            cmd.epilog = _epilog(path)
        if cmd.context_settings is None:
            cmd.context_settings = {"help_option_names": ["-h", "--help"]}
    for grp in typer_app.registered_groups:
        sub = grp.typer_instance
        name = grp.name or sub.info.name
        sub.info.context_settings = sub.info.context_settings or {"help_option_names": ["-h", "--help"]}
        if isinstance(sub.info.context_settings, dict):
            sub.info.context_settings.setdefault("help_option_names", ["-h", "--help"])
        _apply(sub, f"{prefix} {name}".strip())


def apply_examples(app: Any) -> None:
    """Attach the example of every registered command (and group member) as its help epilog."""
    _apply(app, "")
