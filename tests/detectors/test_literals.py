"""The literals a line must contain for the engine to need it, and their LogsQL filters
(the same derivation for the local file prefilter and the VictoriaLogs push-down)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.detectors.literals import (
    logsql_any,
    logsql_literal,
    needed_literals,
    phrase_core,
    word_char,
)
from recovery_logs.detectors.rulepack import load_packs, minimal_substrings
from recovery_logs.detectors.rules import match
from recovery_logs.testing import make_events


def _vl_phrase(text: str, phrase: str) -> bool:
    """VictoriaLogs' phrase filter as measured on v1.26.0 (tests/integration/victorialogs checks it
    against the real server): the substring, with a word boundary on each side where the phrase
    begins / ends with a word character."""
    for m in re.finditer(re.escape(phrase), text):
        i, j = m.start(), m.end()
        if word_char(phrase[0]) and i > 0 and word_char(text[i - 1]):
            continue
        if word_char(phrase[-1]) and j < len(text) and word_char(text[j]):
            continue
        return True
    return False


@pytest.mark.parametrize(("lit", "core"), [
    ("NVRM: Xid", None), ("loss", None), ("elapsed time per iteration", "time per"), (" CE ", "CE"),
    ("(Fatal)", "(Fatal)"), ("NCCL WARN", None), ("Bootstrap : Using", ":"), (" inventory", None),
    ("train_step_timing in s=", "in s="), ("Traceback (most recent call last)", "(most recent call last)"),
])
def test_phrase_core(lit, core):
    assert phrase_core(lit) == (core if core is None or any(word_char(c) for c in core) else None)


def test_phrase_core_is_implied_by_the_substring_wherever_it_is_glued():
    pack = load_packs()
    lits = needed_literals(pack)
    assert lits
    glue = ["", " ", "x", "_", "9", "é", ":", "[", "ab cd"]
    n = 0
    for lit in lits:
        core = phrase_core(lit)
        if core is None:
            continue
        for a in glue:
            for b in glue:
                assert _vl_phrase(a + lit + b, core), (lit, core, a, b)
                n += 1
    assert n > 1000


def test_every_rule_example_contains_a_needed_literal_and_lines_without_one_give_nothing():
    pack = load_packs()
    lits = needed_literals(pack)
    assert lits is not None and len(lits) > 50
    examples = [ex for r in pack.rules if not r.suppress for ex in r.must_match]
    assert len(examples) > 100
    assert all(any(x in ex for x in lits) for ex in examples)
    # a line none of the literals occurs in: no rule matches it
    plain = ["Accepted publickey for user from 10.0.0.1", "[rank3]: checkpoint saved", "systemd[1]: Started Session"]
    assert all(not any(x in p for x in lits) for p in plain)
    assert match(make_events([{"message": p} for p in plain]), pack).height == 0


def test_a_pack_with_a_rule_without_literals_needs_every_line(tmp_path):
    (tmp_path / "x.toml").write_text('[pack]\nname = "x"\nversion = 1\n\n[[rule]]\nid = "x.any"\nversion = 1\n'
                                     'category = "software_exception"\nseverity = "low"\nrole = "info"\naction = "none"\n'
                                     'patterns = ["boom"]\nmust_match = ["boom"]\n')
    assert needed_literals(load_packs(tmp_path)) is None


def test_logsql_filters_escape_and_and_the_phrase_in():
    assert logsql_literal("loss") == '_msg:~"loss"'
    assert logsql_literal("(Fatal)") == '(_msg:"(Fatal)" AND _msg:~"\\\\(Fatal\\\\)")'
    assert logsql_literal('say "hi" now', phrase=False) == '_msg:~"say \\"hi\\" now"'
    assert logsql_any([]) == "*"
    assert logsql_any(["a b c", "zz"]) == '((_msg:"b" AND _msg:~"a b c") OR _msg:~"zz")'


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=12))
def test_minimal_substrings_is_the_pairwise_definition(lits):
    # a literal is dropped when it contains another: the shortest-first pass gives the same set
    # as testing every pair (the definition), and a text holds one of either set alike
    want = tuple(x for x in sorted(set(lits)) if not any(y != x and y in x for y in set(lits)))
    assert minimal_substrings(lits) == want
    for text in ("", "abcabc", "cba", "aab", "ccc"):
        assert any(x in text for x in want) == any(x in text for x in lits)


# Steady and set-up chatter a healthy multi-node job prints by the thousand (NCCL_DEBUG=INFO: one
# channel line per channel, peer and direction), in the formats of NVIDIA/nccl src/transport.cc
# ("Channel %02d/%d : %d[%d] -> %d[%d] via %s"), src/init.cc (ring and tree summaries) and the
# benchmarks' systemd/slurmd chatter. None of them can produce a finding, so no needed literal may
# select them: a literal that does sends every such line through the rule matcher (a bare " -> 2" of
# the NCCL unwind rules once sent 23 % of a replay's rows to the engine).
_CHATTER = [
    "gpu-n1:3345:3400 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "gpu-n1:3345:3400 [5] NCCL INFO Channel 23/0 : 125[5] -> 126[6] via P2P/IPC/read",
    "gpu-n1:3345:3400 [7] NCCL INFO Channel 07/0 : 7[7] -> 8[0] [send] via NET/IB/0",
    "gpu-n1:3345:3400 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
    "gpu-n1:3345:3400 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    "gpu-n1:3345:3400 [0] NCCL INFO Ring 00 : 3 -> 0 [receive] via NET/IB/0",
    "gpu-n1:3345:3400 [0] NCCL INFO Connected all rings",
    "gpu-n1:3345:3400 [0] NCCL INFO 24 coll channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
    "systemd[1]: Started Session 4211 of User root.",
]


@pytest.mark.parametrize("line", _CHATTER)
def test_set_up_chatter_carries_no_needed_literal(line):
    lits = needed_literals(load_packs())
    assert lits is not None
    assert [lit for lit in lits if lit in line] == []
