"""The fallback layer (rules/fallback.toml, issue 13): one weak rule per subsystem for wordings no specific
rule knows. These tests hold it to its contract: it only ever says "investigate", it never takes a line a
specific rule matches, it never outranks a specific finding in an incident (replayed on the dev corpus with
and without it), and it stays quiet on the lines the packs call not-a-fault and on benign look-alikes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from recovery_logs.analysis.corpus_eval import DISRUPTIVE, Excerpt, load_corpus, run_all
from recovery_logs.detectors.rulepack import RulePack, load_packs
from recovery_logs.detectors.rules import winners
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay

DEV = Path(__file__).resolve().parents[1] / "corpus" / "real" / "dev"
FALLBACK = "fallback"


@pytest.fixture(scope="module")
def pack() -> RulePack:
    return load_packs()


def _without_fallback(pack: RulePack) -> RulePack:
    return dataclasses.replace(pack, rules=tuple(r for r in pack.rules if r.pack != FALLBACK))


def _winner_ids(pack: RulePack, lines: list[str]) -> list[str | None]:
    won = winners(pl.DataFrame({"message": lines}, schema={"message": pl.String}), pack, prune_benign=False)
    got = dict(zip(won["_row"].to_list(), won["_rule_id"].to_list(), strict=True))
    return [got.get(i) for i in range(len(lines))]


def test_every_subsystem_has_a_weak_fallback(pack: RulePack) -> None:
    fb = [r for r in pack.rules if r.pack == FALLBACK]
    assert {r.category for r in fb} >= {"nvlink", "infiniband_link", "host_hardware", "nccl_other",
                                        "nccl_network_error", "cuda_error"}
    lowest_specific = min(r.priority for r in pack.rules if r.pack != FALLBACK)
    for r in fb:
        assert (r.action, r.severity, r.role) == ("investigate", "low", "breadcrumb"), r.id
        assert r.priority < lowest_specific, f"{r.id} must lose every line a specific rule also matches"
        assert r.literals, f"{r.id} needs literals for the prefilter"


def test_specific_examples_and_benign_lines_are_never_won_by_a_fallback(pack: RulePack) -> None:
    lines = [ex for r in pack.rules if r.pack != FALLBACK for ex in r.must_match]
    assert len(lines) > 500
    taken = [(ln, w) for ln, w in zip(lines, _winner_ids(pack, lines), strict=True) if w and w.startswith("fallback.")]
    assert taken == []
    benign = [ex for r in pack.rules if r.suppress for ex in r.must_match]
    assert benign and not any(w and w.startswith("fallback.") for w in _winner_ids(pack, benign))


def _replay_fn(pack: RulePack):
    opts = ReplayOptions()

    def fn(path: Path) -> list:
        return list(replay([path], opts, engine=Engine(opts.config, pack)).incidents)
    return fn


def _fallback_only_excerpts(pack: RulePack, excerpts: list[Excerpt]) -> list[Excerpt]:
    """Excerpts with at least one line that only a fallback rule matches (the others cannot change)."""
    out = []
    for ex in excerpts:
        ids = _winner_ids(pack, ex.text.splitlines() or [""])
        if any(w and w.startswith("fallback.") for w in ids):
            out.append(ex)
    return out


def test_must_not_match_lines_a_fallback_reads_only_investigate(pack: RulePack, tmp_path: Path) -> None:
    lines = [ex for r in pack.rules if r.pack != FALLBACK and not r.suppress for ex in r.must_not_match]
    taken = [ln for ln, w in zip(lines, _winner_ids(pack, lines), strict=True) if w and w.startswith("fallback.")]
    # the lines the packs call "not this fault" that a fallback still reads (a garbled fatal SXid) are few
    assert len(taken) <= 3, taken
    excerpts = [Excerpt(id=f"mnm-{i}", source="rules", url="", family="benign", category="none", benign=True,
                        action="none", culprit="", ambiguous=False, note="", text=ln) for i, ln in enumerate(taken)]
    for res in run_all(excerpts, _replay_fn(pack), workers=1):
        assert res.error is None and not res.disruptive, res.to_dict()


def test_fallback_never_steals_a_root_cause_on_the_dev_corpus(pack: RulePack) -> None:
    dev = _fallback_only_excerpts(pack, load_corpus(DEV))
    assert len(dev) >= 10   # enough excerpts exercise the layer for the comparison to mean something
    with_fb = {r.excerpt.id: r for r in run_all(dev, _replay_fn(pack), workers=1)}
    without = {r.excerpt.id: r for r in run_all(dev, _replay_fn(_without_fallback(pack)), workers=1)}
    # info-severity breadcrumbs (NCCL's unwind trace "file:line -> N") are the weakest reading a specific pack makes,
    # weaker by design than a WARN line a fallback reads: those may give way, in the same category
    weakest = {r.id for r in pack.rules if r.role == "breadcrumb" and r.severity == "info"}
    assert weakest
    gained = 0
    for ex in dev:
        a, b = with_fb[ex.id], without[ex.id]
        assert a.error is None and b.error is None
        if b.incidents and b.root_rule in weakest:
            assert a.category == b.category, (ex.id, a.root_rule, b.root_rule)
        elif b.incidents:   # a specific rule named a root cause: the fallback must not replace it
            assert (a.root_rule, a.category) == (b.root_rule, b.category), (ex.id, a.root_rule, b.root_rule)
        elif a.incidents:
            gained += 1
            assert str(a.root_rule).startswith("fallback.")
            assert a.action in ("investigate", "none") and not set(a.disruptive) & DISRUPTIVE, ex.id
        if ex.benign:
            assert not a.disruptive, ex.id
    assert gained >= 5   # the layer does name subsystems that no specific rule knew
