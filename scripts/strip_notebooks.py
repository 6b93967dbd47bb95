#!/usr/bin/env python3
"""Strip outputs from notebooks so git holds code only.

    python scripts/strip_notebooks.py [PATHS...]          # strip in place (default: notebooks/)
    python scripts/strip_notebooks.py --check [PATHS...]  # exit 1 and list notebooks that hold outputs

Removes cell outputs and execution counts, and notebook/cell metadata other than the kernelspec,
language info and cell tags. Idempotent; a stripped notebook is left byte-for-byte unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

KEEP_NB_META = ("kernelspec", "language_info")
KEEP_CELL_META = ("tags",)


def dirty(nb: nbformat.NotebookNode) -> list[str]:
    """What in ``nb`` would be stripped (empty when it is clean)."""
    out = []
    for i, c in enumerate(nb.cells):
        if c.get("outputs"):
            out.append(f"cell {i}: {len(c['outputs'])} output(s)")
        if c.get("execution_count") is not None:
            out.append(f"cell {i}: execution_count {c['execution_count']}")
        extra = sorted(set(c.get("metadata", {})) - set(KEEP_CELL_META))
        if extra:
            out.append(f"cell {i}: metadata {extra}")
    extra = sorted(set(nb.metadata) - set(KEEP_NB_META))
    if extra:
        out.append(f"notebook metadata {extra}")
    return out


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
        c.metadata = {k: v for k, v in c.get("metadata", {}).items() if k in KEEP_CELL_META}
        c.pop("attachments", None) if c.cell_type != "markdown" else None
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_NB_META}
    return nb


def _paths(args: list[str]) -> list[Path]:
    roots = [Path(a) for a in args] or [Path(__file__).resolve().parent.parent / "notebooks"]
    out: list[Path] = []
    for r in roots:
        out += sorted(r.glob("*.ipynb")) if r.is_dir() else [r]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report; exit 1 when a notebook holds outputs")
    ap.add_argument("paths", nargs="*")
    a = ap.parse_args(argv)
    bad = 0
    for p in _paths(a.paths):
        if not p.is_file():
            print(f"{p}: no such notebook", file=sys.stderr)
            return 2
        nb = nbformat.read(p, as_version=4)
        problems = dirty(nb)
        if not problems:
            continue
        if a.check:
            bad += 1
            print(f"{p}: " + "; ".join(problems[:5]))
        else:
            nbformat.write(strip(nb), p)
            print(f"stripped {p}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
