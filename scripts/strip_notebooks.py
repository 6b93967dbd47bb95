#!/usr/bin/env python3
"""Keep the committed notebooks readable on a repository browser and clean in git.

    python scripts/strip_notebooks.py --execute [PATHS...]  # run them, keep outputs, normalise (default: notebooks/)
    python scripts/strip_notebooks.py [PATHS...]            # normalise in place (outputs kept)
    python scripts/strip_notebooks.py --check [PATHS...]    # exit 1 and list notebooks that break the policy
    python scripts/strip_notebooks.py --strip [PATHS...]    # remove every output (a code-only copy)

Policy (chosen so that a reader browsing the repository sees the tables and plots, while a
diff shows only what changed): notebooks are committed **with** their outputs, produced by
``--execute`` from the bundled incidents and small simulator runs. Normalising removes what
changes on every run without meaning anything: execution counts, execution timing and widget
metadata, and notebook/cell metadata other than the kernelspec, language info and cell tags.
``--check`` fails on a notebook that has no outputs (it was stripped or never run), an
execution count, volatile metadata, an error output or a traceback on stderr (it was
committed broken), output that names a path on the machine that ran it (``/tmp/``, ``/work/``,
``/home/``, ``/root/``: outputs must print relative or bundled names), or more than
``MAX_BYTES`` of output (plots stay small PNGs). CI executes the notebooks anyway
(``tests/analysis/test_notebooks.py``), so committed outputs are checked against the code there.
Idempotent: a normalised notebook is left byte-for-byte unchanged.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
KEEP_NB_META = ("kernelspec", "language_info")
KEEP_CELL_META = ("tags",)
MAX_BYTES = 2_500_000
HOST_PATH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root)/")


def _output_text(o: nbformat.NotebookNode) -> str:
    parts = [o.get("text", "")] if o.get("output_type") == "stream" else []
    data = o.get("data", {})
    parts += [v if isinstance(v, str) else "\n".join(v) for k, v in data.items() if k.startswith("text/")]
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def dirty(nb: nbformat.NotebookNode, *, need_outputs: bool = True) -> list[str]:
    """What in ``nb`` breaks the commit policy (empty when it is clean)."""
    out = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    if need_outputs and code and not any(c.get("outputs") for c in code):
        out.append("no outputs (run `scripts/strip_notebooks.py --execute`)")
    for i, c in enumerate(nb.cells):
        if c.get("execution_count") is not None:
            out.append(f"cell {i}: execution_count {c['execution_count']}")
        extra = sorted(set(c.get("metadata", {})) - set(KEEP_CELL_META))
        if extra:
            out.append(f"cell {i}: metadata {extra}")
        for o in c.get("outputs", []):
            if o.get("execution_count") is not None:
                out.append(f"cell {i}: output execution_count")
            if o.get("output_type") == "error":
                out.append(f"cell {i}: error output {o.get('ename')}")
            if o.get("output_type") == "stream" and o.get("name") == "stderr" and "Traceback" in o.get("text", ""):
                out.append(f"cell {i}: traceback on stderr")
            m = HOST_PATH.search(_output_text(o))
            if m:
                out.append(f"cell {i}: output names a machine path ({m.group(0)}...)")
            if o.get("metadata"):
                out.append(f"cell {i}: output metadata")
    extra = sorted(set(nb.metadata) - set(KEEP_NB_META))
    if extra:
        out.append(f"notebook metadata {extra}")
    size = sum(len(json.dumps(c.get("outputs", []))) for c in code)
    if size > MAX_BYTES:
        out.append(f"outputs are {size:,} bytes (> {MAX_BYTES:,})")
    return out


def normalise(nb: nbformat.NotebookNode, *, keep_outputs: bool = True) -> nbformat.NotebookNode:
    for c in nb.cells:
        if c.cell_type == "code":
            c.execution_count = None
            if not keep_outputs:
                c.outputs = []
            for o in c.outputs:
                if "execution_count" in o:
                    o.execution_count = None
                if "metadata" in o:
                    o.metadata = {}
        c.metadata = {k: v for k, v in c.get("metadata", {}).items() if k in KEEP_CELL_META}
        c.pop("attachments", None) if c.cell_type != "markdown" else None
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_NB_META}
    return nb


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Every output removed (a code-only copy)."""
    return normalise(nb, keep_outputs=False)


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    from nbclient import NotebookClient  # dev dependency, only for --execute

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def _paths(args: list[str]) -> list[Path]:
    roots = [Path(a) for a in args] or [ROOT / "notebooks"]
    out: list[Path] = []
    for r in roots:
        out += sorted(r.glob("*.ipynb")) if r.is_dir() else [r]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only report; exit 1 when a notebook breaks the policy")
    mode.add_argument("--execute", action="store_true", help="run each notebook, keep its outputs, normalise")
    mode.add_argument("--strip", action="store_true", help="remove every output")
    ap.add_argument("paths", nargs="*")
    a = ap.parse_args(argv)
    bad = 0
    for p in _paths(a.paths):
        if not p.is_file():
            print(f"{p}: no such notebook", file=sys.stderr)
            return 2
        nb = execute(p) if a.execute else nbformat.read(p, as_version=4)
        if a.check:
            problems = dirty(nb)
            if problems:
                bad += 1
                print(f"{p}: " + "; ".join(problems[:5]))
            continue
        new = strip(nb) if a.strip else normalise(nb)
        text = nbformat.writes(new) + "\n"
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
            print(f"{'executed' if a.execute else 'normalised'} {p}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
