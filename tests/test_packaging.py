"""A plain (non-editable) install finds the rule packs, models and bundled incidents."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    (whl,) = out.glob("recovery_logs-*.whl")
    return whl


def test_wheel_ships_rules_models_and_incidents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_rules = {n.split("/")[-1] for n in names if n.startswith("recovery_logs/_rules/")}
    assert shipped_rules == {p.name for p in (ROOT / "rules").glob("*.toml")}
    assert any(n.startswith("recovery_logs/_models/") for n in names)
    assert "recovery_logs/data/incidents/xid79_nccl_cascade/truth.json" in names
    assert "recovery_logs/py.typed" in names


def test_installed_copy_runs_the_demo_from_packaged_data(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from recovery_logs.detectors.rulepack import default_rules_dir, load_packs\n"
            "d = default_rules_dir(); assert d.name == '_rules', d\n"
            "assert len(load_packs().rules) > 50\n"
            "from recovery_logs.cli import main\n"
            "raise SystemExit(main(['demo', '--json']))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert '"node": "gpu-n02"' in p.stdout
