"""Start-up: ``replay`` of the bundled demo imports only what it uses (issue 16: < 1 s wall).

Each module named here was once on the demo's path without being needed there; the test runs the
real CLI in a fresh interpreter and reads ``sys.modules`` at the end."""

from __future__ import annotations

import json
import subprocess
import sys

from recovery_logs.api import bundled_incident

NOT_ON_THE_REPLAY_PATH = (
    "sklearn", "scipy", "skops", "matplotlib", "pyarrow", "requests", "ray",   # optional heavy dependencies
    "recovery_logs.audit", "sqlite3",          # the audit store: only self-grading from a state dir reads it
    "numpy.ma",                                # Polars' numpy-array conversion (anomaly scores of a small replay)
    # a plain `replay` command line is run without typer (cli._direct): typer builds a Pydantic
    # validator per parameter, and registering every command imports every command module
    "typer", "click", "pydantic", "pydantic_core", "recovery_logs.commands.replay", "recovery_logs.commands.watch",
    "recovery_logs.commands.nvml_agent", "recovery_logs.commands.eval",
)
NOT_ON_THE_DEMO_PATH = ("typer", "click", "pydantic", "recovery_logs.commands.replay", "sklearn", "scipy",
                        "matplotlib", "pyarrow", "requests", "ray")

CODE = """
import contextlib, io, json, sys
from recovery_logs.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "incidents": len(json.loads(out.getvalue())["incidents"]),
                  "modules": sorted(sys.modules)}))
"""


def _run(*argv: str) -> tuple[int, int, set[str]]:
    p = subprocess.run([sys.executable, "-c", CODE, *argv], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    return got["rc"], got["incidents"], set(got["modules"])


def test_replay_of_the_demo_imports_no_heavy_module():
    rc, incidents, mods = _run("replay", str(bundled_incident("xid79_nccl_cascade")), "--year", "2026", "--json")
    assert rc == 0 and incidents >= 1                          # it did replay and find the incident
    assert "numpy" in mods and "polars" in mods               # the anomaly model was scored (the check is live)
    loaded = [m for m in NOT_ON_THE_REPLAY_PATH if m in mods]
    assert loaded == [], f"imported on the replay path: {loaded}"


def test_demo_imports_no_typer_and_no_heavy_module():
    rc, incidents, mods = _run("demo", "--json")
    assert rc == 0 and incidents >= 1
    assert "recovery_logs.commands._replay_run" in mods      # it ran the command's function
    loaded = [m for m in NOT_ON_THE_DEMO_PATH if m in mods]
    assert loaded == [], f"imported on the demo path: {loaded}"


def test_help_still_goes_through_typer():
    # the check above is not vacuous: a command line the direct dispatch leaves alone imports typer
    p = subprocess.run([sys.executable, "-c", "import sys; from recovery_logs.cli import main; main(['replay', '-h']);"
                        " print('typer' in sys.modules and 'recovery_logs.commands.replay' in sys.modules)"],
                       capture_output=True, text=True, check=True, timeout=120)
    assert "Example:" in p.stdout and p.stdout.strip().splitlines()[-1] == "True"


def test_commands_that_need_no_engine_import_no_polars():
    # every command module is imported to register it (help, version, approve ...): none imports polars
    code = ("import contextlib, io, sys; from recovery_logs.cli import main\n"
            "for argv in (['version'], ['-h'], ['approve', '-h']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        assert main(argv) == 0, argv\n"
            "print(sorted(m for m in ('polars', 'numpy', 'typer', 'recovery_logs.commands.train') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert p.stdout.strip().splitlines()[-1] == "['recovery_logs.commands.train', 'typer']"   # all registered; no polars
