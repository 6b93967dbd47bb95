"""Every analyst notebook executes without a cell error, uses only the public API, and git holds
it with clean outputs (the policy of scripts/strip_notebooks.py)."""

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


def test_committed_notebooks_hold_clean_outputs():
    strip = _strip_module()
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        assert strip.dirty(nb) == [], p.name
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs), f"{p.name}: no plot shown"


def test_notebooks_use_only_the_public_api():
    import re

    import recovery_logs
    import recovery_logs.simulate

    public = set(recovery_logs.__all__)
    for p in NOTEBOOKS:
        src = "\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
        mods = set(re.findall(r"^\s*(?:from|import) (recovery_logs[\w.]*)", src, flags=re.M))
        assert mods <= {"recovery_logs", "recovery_logs.simulate"}, f"{p.name} imports internals: {mods}"
        blocks = re.findall(r"^from recovery_logs import \(([^)]*)\)", src, flags=re.M)
        blocks += re.findall(r"^from recovery_logs import ([^(\n]+)$", src, flags=re.M)
        assert blocks or "import recovery_logs as rl" in src, p.name
        for block in blocks:
            names = {n.strip() for n in block.replace("\n", ",").split(",") if n.strip()}
            assert names <= public, f"{p.name}: {sorted(names - public)} not in recovery_logs.__all__"
        for names in re.findall(r"^from recovery_logs\.simulate import ([^\n]*)", src, flags=re.M):
            assert {n.strip() for n in names.split(",")} <= set(recovery_logs.simulate.__all__), p.name
        used = set(re.findall(r"\brl\.([A-Za-z_]\w*)", src))
        assert used <= public, f"{p.name}: rl.{sorted(used - public)} not public"


def test_policy_normalises_and_flags(tmp_path):
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
    assert strip.dirty(back) == [] and back.cells[0].outputs[0].data == {"text/plain": "2"}
    assert strip.main(["--check", str(p)]) == 0
    before = p.read_bytes()
    assert strip.main([str(p)]) == 0 and p.read_bytes() == before            # idempotent
    back.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="wrote /tmp/x/report.html")]
    nbformat.write(back, p)
    assert strip.main(["--check", str(p)]) == 1                               # machine path in an output
    back.cells[0].outputs = [nbformat.v4.new_output("error", ename="KeyError", evalue="x", traceback=[])]
    nbformat.write(back, p)
    assert strip.main(["--check", str(p)]) == 1                               # committed broken
    assert strip.main(["--strip", str(p)]) == 0
    assert strip.dirty(nbformat.read(p, as_version=4)) == ["no outputs (run `scripts/strip_notebooks.py --execute`)"]


async def _run_all(paths: list[Path]) -> dict[str, tuple[nbformat.NotebookNode, BaseException | None, float]]:
    """Run the notebooks side by side. Kernels are *started* one at a time: jupyter_client picks
    free ports, closes them and hands them to the kernel, so two kernels started together can be
    given the same port and one dies with "Kernel died before replying to kernel_info"
    (jupyter/jupyter_client#154, #490). Started in turn, each kernel holds its ports before the
    next picks. A kernel that still dies before its first cell (a port taken by another process
    in that window) is started once more; a cell error is never retried."""
    from nbclient import NotebookClient

    starting = asyncio.Lock()

    class OneAtATime(NotebookClient):
        async def async_start_new_kernel(self, **kwargs):
            await starting.acquire()
            try:
                await super().async_start_new_kernel(**kwargs)
            except BaseException:
                starting.release()
                raise

        async def async_start_new_kernel_client(self):
            try:
                return await super().async_start_new_kernel_client()
            finally:
                starting.release()

    async def one(p: Path):
        t0 = time.perf_counter()
        for attempt in (1, 2):
            nb = nbformat.read(p, as_version=4)
            client = OneAtATime(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
            try:
                await client.async_execute()
                err = None
            except Exception as exc:  # CellExecutionError and kernel failures alike
                err = exc
            if err is None or client.code_cells_executed > 0 or attempt == 2:
                break
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
