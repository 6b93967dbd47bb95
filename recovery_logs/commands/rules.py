"""`recovery-logs rules check | list | test`: validate, list and try the rule packs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recovery_logs.errors import RulePackError

_DIR_HELP = "Rules directory (default: the repository's rules/ or the installed package's copy)."
RulesDir = Annotated[Path | None, typer.Option("--rules-dir", help=_DIR_HELP)]


def register(app: typer.Typer) -> None:
    rules_app = typer.Typer(help="Validate, list and try the rule packs (rules/*.toml).", no_args_is_help=True)
    app.add_typer(rules_app, name="rules")

    @rules_app.command("check")
    def check(rules_dir: RulesDir = None) -> None:
        """Compile every pack and run every must_match / must_not_match example."""
        from recovery_logs.detectors.rulecheck import check_packs
        from recovery_logs.detectors.rulepack import default_rules_dir, load_packs

        failures = check_packs(rules_dir)
        if failures:
            for f in failures:
                typer.echo(f"FAIL {f}", err=True)
            raise RulePackError(f"{len(failures)} rule pack check(s) failed",
                                rules_dir=str(rules_dir or default_rules_dir()))
        pack = load_packs(rules_dir)
        examples = sum(len(r.must_match) + len(r.must_not_match) for r in pack.rules)
        typer.echo(f"ok: {len(pack.rules)} rules in {len(pack.sources)} files, {examples} examples, "
                   f"{len(pack.xid_catalog)} XID codes")

    @rules_app.command("list")
    def list_rules(
        rules_dir: RulesDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON array of rules on stdout.")] = False,
    ) -> None:
        """List the rules in winning order (priority, then file and position)."""
        from recovery_logs.detectors.rulepack import load_packs

        pack = load_packs(rules_dir)
        if as_json:
            typer.echo(json.dumps([
                {"id": r.id, "version": r.version, "pack": r.pack, "category": r.category, "severity": r.severity,
                 "role": r.role, "action": r.action, "priority": r.priority, "suppress": r.suppress,
                 "patterns": list(r.patterns), "literals": list(r.literals), "fields": r.fields,
                 "description": r.description} for r in pack.rules], indent=2))
            return
        for r in pack.rules:
            flag = " (benign: suppresses)" if r.suppress else ""
            typer.echo(f"{r.priority:>4}  {r.id:<40} {r.category:<20} {r.severity:<8} {r.role:<10} {r.action}{flag}")

    @rules_app.command("test")
    def test_line(
        line: Annotated[str, typer.Argument(help="A log message (\\n in the text is read as a newline).")],
        rules_dir: RulesDir = None,
    ) -> None:
        """Show which rule wins LINE and what it extracts."""
        from recovery_logs.detectors.rulepack import load_packs
        from recovery_logs.detectors.rules import explain

        result = explain(line.replace("\\n", "\n"), load_packs(rules_dir))
        typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
