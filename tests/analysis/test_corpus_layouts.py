"""Dev excerpts keep their category behind the prefixes container and log pipelines add (benchmarks/corpus_layouts.py's
layouts). The excerpts are the dev ones that a pipeline's prefix used to break: a bare stamp taken for an rsyslog ISO
header ("<time> slurmstepd: error: ..."), a rule anchored at the line's start behind kubectl's stamp, the kubelet's CRI
prefix or docker compose's name column."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from recovery_logs.analysis.corpus_eval import load_excerpt, run_groups

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "tests" / "corpus" / "real" / "dev"
_spec = importlib.util.spec_from_file_location("corpus_layouts", ROOT / "benchmarks" / "corpus_layouts.py")
assert _spec is not None and _spec.loader is not None
layouts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layouts)

IDS = ("arjuna-21-slurmstepd-execve-missing", "d7-lmsensors543-core-at-crit", "d9-k8stestinfra796-bare-xid79-code-only",
       "e14-k8s122256-last-state-exit-137", "kohya-897-childfailed-root-cause-cut", "d10-ucx3787-ibv-devinfo-port-down",
       "dxvk-1027-xid13-and-xid32", "e13-slurmexporter168-mem-spec-not-satisfied")


@pytest.fixture(scope="module")
def results() -> dict[str, list]:
    exs = [load_excerpt(DEV / f"{i}.toml") for i in IDS]
    names = ["kubectl_ts", "cri", "compose"]
    groups = [exs] + [[dataclasses.replace(e, text=layouts.LAYOUTS[n](e.text)) for e in exs] for n in names]
    base, *rest = run_groups(groups, None, 1)
    return {"as_pasted": base, **dict(zip(names, rest, strict=True))}


@pytest.mark.parametrize("layout", ["as_pasted", "kubectl_ts", "cri", "compose"])
def test_category_survives_the_layout(results: dict[str, list], layout: str) -> None:
    got = {r.excerpt.id: r.category for r in results[layout]}
    want = {r.excerpt.id: r.excerpt.category for r in results[layout]}
    assert got == want


def test_layouts_reframe_lines_and_keep_their_text() -> None:
    text = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\nsecond line"
    for name, fn in layouts.LAYOUTS.items():
        out = fn(text)
        if name == "crlf":
            assert out == text.replace("\n", "\r\n")
            continue
        assert len(out.split("\n")) == 2 and "GPU has fallen off the bus." in out and "second line" in out, name
    assert layouts.LAYOUTS["cri"](text).startswith("2026-12-03T12:00:00.123456789Z stdout F NVRM: Xid")
    assert layouts.LAYOUTS["dmesg_T"]("[ 12.5] NVRM: x") == "[Thu Dec  3 12:00:00 2026] NVRM: x"


def test_refuses_a_held_out_split(tmp_path: Path) -> None:
    (tmp_path / "holdout").mkdir()
    with pytest.raises(SystemExit):
        layouts.main(["--corpus", str(tmp_path)])
