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
)

CODE = """
import contextlib, io, json, sys
from recovery_logs.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    rc = main(["replay", sys.argv[1], "--year", "2026", "--json"])
print(json.dumps({"rc": rc, "incidents": len(json.loads(out.getvalue())["incidents"]),
                  "modules": sorted(sys.modules)}))
"""


def test_replay_of_the_demo_imports_no_heavy_module():
    d = str(bundled_incident("xid79_nccl_cascade"))
    p = subprocess.run([sys.executable, "-c", CODE, d], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and got["incidents"] >= 1          # it did replay and find the incident
    mods = set(got["modules"])
    assert "numpy" in mods and "polars" in mods               # the anomaly model was scored (the check is live)
    loaded = [m for m in NOT_ON_THE_REPLAY_PATH if m in mods]
    assert loaded == [], f"imported on the replay path: {loaded}"
