"""The real-log corpus under the layouts log pipelines put around a line (issue 13): does an excerpt the engine
names right stay right when its lines arrive behind a collector's prefix?

    .venv/bin/python benchmarks/corpus_layouts.py [--corpus tests/corpus/real/dev] [--layouts kubectl_ts,cri] [--json]

Each excerpt of the corpus is replayed as it was pasted and once per layout, every line rewritten the way the
pipeline writes it (the texts stay the excerpt's: only the framing changes). Per layout: excerpts whose category was
right and is no longer ("lost"), that were wrong and become right ("gained"), benign excerpts that gain a
drain/reset/requeue/cancel proposal, new crashes. Lost excerpts are listed by id. Only a dev split is accepted: the
held-out split's per-excerpt results are never shown (tests/corpus/real/README.md).

The layouts, each as the emitter writes it:
* ``syslog``: rsyslog's traditional file format, "<Mmm dd hh:mm:ss> <host> <tag>: " (RFC 3164 header);
* ``journal_iso``: ``journalctl -o short-iso``, "<ISO time with zone> <host> <tag>: ";
* ``kubectl_ts``: ``kubectl logs --timestamps`` / ``docker logs -t``, "<RFC3339Nano> ";
* ``cri``: the kubelet's container log file, "<RFC3339Nano> stdout F " (kubernetes pkg/kubelet/kuberuntime/logs);
* ``compose``: ``docker compose logs``, "<service>-<n>  | " (docker/compose cmd/formatter);
* ``rank_prefix``: torchrun's ``--tee``/log prefix "[rankN]: ";
* ``srun_label``: ``srun --label``, "N: " (Slurm write_labelled_message.c);
* ``crlf``: CRLF line ends (a Windows paste, some shippers);
* ``indent4``: four spaces before every line (a Markdown code block pasted as it is);
* ``dmesg_T``: ``dmesg -T`` human times in place of the seconds since boot;
* ``wrap80``, ``wrap120``: a terminal's hard wrap kept by the copy (tmux/screen scrollback, a CI log viewer, a
  notebook's output): every line longer than 80 / 120 characters cut into pieces of exactly that width. The readers
  join the pieces back where the cut can only be inside a line (``formats.join_wraps``); a cut before a capital or
  a blank stays two lines, so some loss is expected here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recovery_logs.analysis.corpus_eval import default_workers, load_corpus, run_groups  # noqa: E402

_DMESG = re.compile(r"^\[\s*\d+\.\d+\] ")


def _each_line(fmt: Callable[[str, int], str]) -> Callable[[str], str]:
    return lambda text: "\n".join(fmt(line, i) for i, line in enumerate(text.split("\n")))


def _wrapped(text: str, width: int) -> str:
    """Every line longer than ``width`` cut into ``width``-character pieces (a terminal's hard wrap kept
    by the copy: tmux/screen scrollback, a CI log viewer, a notebook's output)."""
    out = []
    for ln in text.split("\n"):
        out.extend([ln[k:k + width] for k in range(0, len(ln), width)] or [""])
    return "\n".join(out)


def _sec(i: int) -> str:
    return f"{i % 60:02d}"


LAYOUTS: dict[str, Callable[[str], str]] = {
    "syslog": _each_line(lambda ln, i: f"Dec  3 12:00:{_sec(i)} gpu-node-07 kernel: {ln}" if ln else ln),
    "journal_iso": _each_line(lambda ln, i: f"2026-12-03T12:00:{_sec(i)}+0000 gpu-node-07 kernel: {ln}" if ln else ln),
    "kubectl_ts": _each_line(lambda ln, i: f"2026-12-03T12:00:{_sec(i)}.123456789Z {ln}"),
    "cri": _each_line(lambda ln, i: f"2026-12-03T12:00:{_sec(i)}.123456789Z stdout F {ln}"),
    "compose": _each_line(lambda ln, i: f"trainer-1  | {ln}"),
    "rank_prefix": _each_line(lambda ln, i: f"[rank3]: {ln}"),
    "srun_label": _each_line(lambda ln, i: f"3: {ln}"),
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "indent4": _each_line(lambda ln, i: f"    {ln}"),
    "dmesg_T": _each_line(lambda ln, i: _DMESG.sub(f"[Thu Dec  3 12:00:{_sec(i)} 2026] ", ln)),
    "wrap80": lambda text: _wrapped(text, 80),
    "wrap120": lambda text: _wrapped(text, 120),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(ROOT / "tests" / "corpus" / "real" / "dev"))
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, from: " + ", ".join(LAYOUTS))
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    corpus = Path(a.corpus)
    if corpus.name == "holdout" or (corpus / "holdout").is_dir():
        ap.error("only a dev split: the held-out split's per-excerpt results are never shown")
    names = [n for n in a.layouts.split(",") if n]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layout(s): {', '.join(unknown)}")
    excerpts = load_corpus(corpus)
    t0 = time.perf_counter()
    groups = [excerpts] + [[dataclasses.replace(e, text=LAYOUTS[n](e.text)) for e in excerpts] for n in names]
    base, *runs = run_groups(groups, None, a.workers)
    right = [b.category == b.excerpt.category for b in base]
    out: dict = {"corpus": str(corpus), "excerpts": len(excerpts), "right_as_pasted": sum(right),
                 "wall_s": 0.0, "layouts": {}}
    for name, rs in zip(names, runs, strict=True):
        lost = [r.excerpt.id for r, ok in zip(rs, right, strict=True) if ok and r.category != r.excerpt.category]
        gained = [r.excerpt.id for r, ok in zip(rs, right, strict=True) if not ok and r.category == r.excerpt.category]
        benign = [r.excerpt.id for r, b in zip(rs, base, strict=True) if r.excerpt.benign and r.disruptive and not b.disruptive]
        crashes = [r.excerpt.id for r, b in zip(rs, base, strict=True) if r.error and not b.error]
        out["layouts"][name] = {"lost": lost, "gained": gained, "benign_disruptive": benign, "crashes": crashes}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['excerpts']} excerpts, {out['right_as_pasted']} named right as pasted ({corpus}), {out['wall_s']} s")
    print(f"{'layout':12s} {'lost':>5s} {'gained':>7s} {'benign+':>8s} {'crashes':>8s}")
    for name, r in out["layouts"].items():
        print(f"{name:12s} {len(r['lost']):5d} {len(r['gained']):7d} {len(r['benign_disruptive']):8d} "
              f"{len(r['crashes']):8d}  {' '.join(r['lost'] + r['benign_disruptive'] + r['crashes'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
