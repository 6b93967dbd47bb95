"""Every analyst notebook executes without a cell error, and git holds them without outputs."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_incident_walkthrough", "02_fleet_health", "03_model_lab", "04_policy_backtest"]


def _strip_module():
    spec = importlib.util.spec_from_file_location("strip_notebooks", ROOT / "scripts" / "strip_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_four_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


def test_committed_notebooks_hold_no_outputs():
    strip = _strip_module()
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        assert strip.dirty(nb) == [], p.name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), p.name


def test_strip_removes_outputs(tmp_path):
    strip = _strip_module()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1 + 1")
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata["widgets"] = {"x": 1}
    p = tmp_path / "n.ipynb"
    nbformat.write(nb, p)
    assert strip.main(["--check", str(p)]) == 1
    assert strip.main([str(p)]) == 0
    back = nbformat.read(p, as_version=4)
    assert strip.dirty(back) == [] and back.cells[0].outputs == [] and back.cells[0].source == "1 + 1"
    assert strip.main(["--check", str(p)]) == 0


async def _run_all(paths: list[Path]) -> dict[str, tuple[nbformat.NotebookNode, BaseException | None, float]]:
    from nbclient import NotebookClient

    async def one(p: Path):
        nb = nbformat.read(p, as_version=4)
        t0 = time.perf_counter()
        try:
            await NotebookClient(nb, timeout=240, kernel_name="python3",
                                 resources={"metadata": {"path": str(ROOT)}}).async_execute()
            err = None
        except Exception as exc:  # CellExecutionError and kernel failures alike
            err = exc
        return p.stem, (nb, err, time.perf_counter() - t0)

    return dict(await asyncio.gather(*(one(p) for p in paths)))


@pytest.fixture(scope="module")
def executed():
    pytest.importorskip("nbclient")
    return asyncio.run(_run_all(NOTEBOOKS))


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes_without_errors(executed, name):
    nb, err, secs = executed[name]
    assert err is None, f"{name} failed after {secs:.1f} s:\n{str(err)[-3000:]}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == []
    pngs = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert pngs >= 1, f"{name} drew no plot"
