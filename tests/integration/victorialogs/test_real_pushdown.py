"""Push-down filters against the real VictoriaLogs v1.26.0: the LogsQL built from the rule
packs keeps every rule example, and the phrase filters put in front of the substring regexps
change nothing (they are implied), on the rule examples and on them glued to other text."""

from __future__ import annotations

import re
import shutil
import sys
import time

from recovery_logs.config import EngineConfig
from recovery_logs.detectors.literals import needed_literals, phrase_core, word_char
from recovery_logs.detectors.rulepack import default_rules_dir, load_packs
from recovery_logs.detectors.rules import match
from recovery_logs.pipeline.enrich import ENRICH_LITERALS
from recovery_logs.pipeline.replay import ReplayOptions
from recovery_logs.pipeline.vl_replay import plan_pushdown, replay_source
from recovery_logs.sources.victorialogs import VictoriaLogsClient
from recovery_logs.testing import make_events

vlreal = sys.modules["recovery_logs_tests_vlreal"]
NS, fmt_ns = vlreal.NS, vlreal.fmt_ns


def _texts() -> tuple[list[str], list[str]]:
    pack = load_packs()
    must = [ex for r in pack.rules if not r.suppress for ex in r.must_match]
    must += [f"[rank3]: {ex}" for ex in must[::7]]
    other = [ex for r in pack.rules for ex in r.must_not_match]
    lits = needed_literals(pack, ENRICH_LITERALS) or ()
    glued = [f"{a}{lit}{b}" for lit in lits for a, b in (("x", "y"), ("_", "9"), ("", ""), ("é", "é"))]
    return must, other + glued


def _ids(real_vl, flt: str) -> set[str]:
    return {r["i"] for r in real_vl.query(f"{flt} | fields i", start="3h")}


def test_fetch_filter_keeps_every_rule_example_and_phrases_change_nothing(real_vl):
    must, other = _texts()
    texts = must + other
    now = time.time_ns() - 120 * NS
    rows = [{"_time": fmt_ns(now + k * 1000), "host": "h", "unit": "t", "i": str(k), "_msg": t}
            for k, t in enumerate(texts)]
    real_vl.ingest(rows)
    t_end = time.monotonic() + 10
    while len(real_vl.query("* | fields i", start="3h")) < len(rows) and time.monotonic() < t_end:
        time.sleep(0.2)
    pack = load_packs()
    with_phrase = plan_pushdown(pack, "*", phrase=True, progress=False).fetch
    plain = plan_pushdown(pack, "*", phrase=False, progress=False).fetch
    assert with_phrase and plain and with_phrase != plain
    got, got_plain = _ids(real_vl, with_phrase), _ids(real_vl, plain)
    assert {str(k) for k in range(len(must))} <= got            # every example of every rule is fetched
    assert got == got_plain                                      # the phrase filters are implied by the substrings
    lits = needed_literals(pack, ENRICH_LITERALS) or ()
    want = {str(k) for k, t in enumerate(texts) if any(x in t for x in lits)}
    assert got == want                                           # exactly the lines with a needed literal
    # with progress summaries: the summarised lines and the fetched ones partition those lines, and
    # on every summarised line the engine's matcher picks that rule and pattern (a step, no step time)
    plan = plan_pushdown(pack, "*", progress=True)
    assert plan.progress and plan.fetch
    fetched = _ids(real_vl, plan.fetch)
    for p in plan.progress:
        summed = _ids(real_vl, p.where)
        assert summed and not summed & fetched
        fetched |= summed
        msgs = [re.sub(r"^\[rank\d+\]:\s?", "", texts[int(k)]) for k in sorted(summed, key=int)]
        found = match(make_events([{"message": m} for m in msgs]), pack)
        assert found.height == len(msgs)
        assert set(found["rule_id"]) == {p.rule.id} and found["step"].null_count() == 0
        assert found["step_time_s"].null_count() == len(msgs)
    assert fetched == got


def test_phrase_filter_semantics_the_cores_rely_on(real_vl):
    """A phrase matches where the substring has a word boundary on each side that starts or ends
    with a word character — the property phrase_core() is built on."""
    texts = ["NVRM: Xid (PCI:0000:3b:00): 79", "xNVRM: Xidy", "elapsed time per iteration (ms)", "time perx",
             "a_time per b", "in s=0.5", "within s=0.5", "train_step_timing in s=0.5", "(Fatal)x", "é(Fatal)"]
    now = time.time_ns() - 60 * NS
    real_vl.ingest([{"_time": fmt_ns(now + k), "host": "h", "unit": "t", "i": str(k), "_msg": t}
                    for k, t in enumerate(texts)])
    t_end = time.monotonic() + 10
    while len(real_vl.query("* | fields i", start="3h")) < len(texts) and time.monotonic() < t_end:
        time.sleep(0.2)

    def ref(text: str, p: str) -> bool:
        for i in range(len(text) - len(p) + 1):
            if text[i:i + len(p)] == p and not (word_char(p[0]) and i > 0 and word_char(text[i - 1])) and not (
                    word_char(p[-1]) and i + len(p) < len(text) and word_char(text[i + len(p)])):
                return True
        return False

    for phrase in ("Xid", ": Xid", "time per", "in s=", "(Fatal)", "VRM: Xi"):
        q = '_msg:"' + phrase.replace('"', '\\"') + '"'
        assert _ids(real_vl, q) == {str(k) for k, t in enumerate(texts) if ref(t, phrase)}, phrase
    assert phrase_core("elapsed time per iteration") == "time per"


def test_line_scores_on_turn_the_pushdown_off(real_vl):
    """Line scores need every line's template: with them on, replay --source reads every row."""
    now = time.time_ns() - 60 * NS
    real_vl.ingest([{"_time": fmt_ns(now + k * NS), "host": "h", "unit": "t", "_msg": f"hello {k}"} for k in range(20)])
    t_end = time.monotonic() + 10
    while len(real_vl.query("*", start="3h")) < 20 and time.monotonic() < t_end:
        time.sleep(0.2)
    client = VictoriaLogsClient(real_vl.url)
    on = replay_source(client, "*", now - NS, now + 30 * NS, ReplayOptions(config=EngineConfig(line_scores=True)))
    off = replay_source(client, "*", now - NS, now + 30 * NS, ReplayOptions())
    assert "pushdown" not in on.summary and on.summary["events"] == 20
    assert off.summary["pushdown"]["lines_fetched"] == 0 and off.summary["events"] == 20


def test_a_rule_without_literals_turns_the_local_selection_off(real_vl, tmp_path):
    """A rule without literals can match any line: the export the local selection starts early
    (before the packs are loaded) is abandoned and every row is read, as with ``pushdown=False``."""
    rules = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), rules)
    toml = rules / "fallback.toml"
    text = toml.read_text()
    at = text.index("literals = ", text.index('id = "fallback.nvlink"'))
    toml.write_text(text[:at] + text[text.index("\n", at) + 1:])
    assert load_packs(rules).every_line_needed()
    now = time.time_ns() - 60 * NS
    # the fallback rule's must_match example (NVIDIA/open-gpu-kernel-modules#1150) among plain lines
    msgs = ["NVML:Unable to retrieve Nvlink information as all links are inActive", *(f"hello {k}" for k in range(19))]
    real_vl.ingest([{"_time": fmt_ns(now + k * NS), "host": "h", "unit": "t", "_msg": m} for k, m in enumerate(msgs)])
    t_end = time.monotonic() + 10
    while len(real_vl.query("*", start="3h")) < 20 and time.monotonic() < t_end:
        time.sleep(0.2)
    client = VictoriaLogsClient(real_vl.url)
    opts = ReplayOptions(config=EngineConfig(rules_dir=rules))
    got = replay_source(client, "*", now - NS, now + 30 * NS, opts)
    full = replay_source(client, "*", now - NS, now + 30 * NS, opts, pushdown=False)
    assert "pushdown" not in got.summary and got.summary["events"] == 20
    assert got.to_json() == full.to_json() and len(got.incidents) == 1
