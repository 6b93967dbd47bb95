"""Line-level template rarity (detectors.linescore) on a log of a format no rule knows.

The sample is generated here (not LogHub data): BlueGene/L-style RAS columns
(``<Time> <Node> <Type> <Component> <Level> <Content>``) with messages written for this test in
the manner of RAS logs — chronic INFO chatter, a chronic ERROR that repeats all day, a few rare
ERROR lines, FATAL lines, and two templates that first appear late (one WARNING, one INFO).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from recovery_logs.config import EngineConfig
from recovery_logs.detectors.linescore import RULE_ID, LineScoreParams, LineStats, score_lines
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.pipeline.watch import Watcher, WatchOptions
from recovery_logs.schema import EVENT_SCHEMA, conform
from recovery_logs.sources.files import ReadOptions, read_paths
from recovery_logs.sources.lineformat import compile_line_format

FMT = compile_line_format("<Time> <Node> <Type> <Component> <Level> <Content>", "%Y-%m-%d-%H.%M.%S%.f")
DISRUPTIVE = {"drain_node", "requeue_job", "cancel_job", "reset_gpu"}


def ras_sample(path: Path) -> dict[str, list[int]]:
    """Writes the sample; returns the line numbers of each kind."""
    kinds: dict[str, list[int]] = {"fatal": [], "rare_error": [], "chronic_error": [], "new_warning": [],
                                   "new_info": [], "info": []}
    lines = []

    def add(kind: str, level: str, comp: str, msg: str, node: int) -> None:
        n = len(lines)
        t = f"2026-11-29-{10 + n // 3600:02d}.{n // 60 % 60:02d}.{n % 60:02d}.{n * 7919 % 1_000_000:06d}"
        lines.append(f"{t} R{node // 32:02d}-M{node // 16 % 2}-N{node % 16:X} RAS {comp} {level} {msg}")
        kinds[kind].append(n + 1)

    for i in range(1200):
        node = i * 37 % 64
        if i in (300, 650, 910, 1010, 1150):
            add("fatal", "FATAL", "KERNEL", "data TLB error interrupt", node)
        elif i in (420, 880):
            add("rare_error", "ERROR", "MMCS", f"node card {i % 7} voltage regulator fault at 0x{i:04x}", node)
        elif i == 1100:
            add("new_warning", "WARNING", "DISCOVERY", "link card clock select changed on midplane", node)
        elif i == 1120:
            add("new_info", "INFO", "KERNEL", f"{i} floating point alignment exceptions", node)
        elif i % 5 == 0:
            add("chronic_error", "ERROR", "MMCS", f"idoproxydb hit ASSERT condition: ASSERT expression={i % 3}", node)
        elif i % 2:
            add("info", "INFO", "KERNEL", f"instruction cache parity error corrected at 0x{i * 13:08x}", node)
        else:
            add("info", "INFO", "KERNEL", f"generating core.{i}", node)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return kinds


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[int]]]:
    p = tmp_path_factory.mktemp("ras") / "ras.log"
    return p, ras_sample(p)


@pytest.fixture(scope="module")
def replayed(sample, tmp_path_factory):
    path, kinds = sample
    out = tmp_path_factory.mktemp("out")
    res = replay([str(path)], ReplayOptions(read=ReadOptions(line_formats=(FMT,)), out_dir=out))
    return res, pl.read_parquet(out / "findings.parquet"), kinds


def test_rare_error_fatal_and_new_warning_lines_are_flagged_with_a_score(replayed):
    res, f, kinds = replayed
    assert res.engine.config.line_scores is True          # auto: on for a site line format
    lr = f.filter(pl.col("rule_id") == RULE_ID)
    want = sorted(kinds["fatal"] + kinds["rare_error"] + kinds["new_warning"])
    assert sorted(lr["line"].to_list()) == want
    # never the chronic ERROR, never an INFO line (not even the late new INFO template)
    assert not set(lr["line"].to_list()) & set(kinds["chronic_error"] + kinds["info"] + kinds["new_info"])
    by_line = dict(zip(lr["line"].to_list(), lr["score"].to_list(), strict=True))
    assert all(0.0 < s <= 1.0 for s in by_line.values())
    # seen once (the new WARNING), twice (rare ERROR template), five times (FATAL): rarer scores higher
    assert by_line[kinds["new_warning"][0]] == 1.0
    assert by_line[kinds["new_warning"][0]] > by_line[kinds["rare_error"][0]] > by_line[kinds["fatal"][0]]
    assert set(lr["level"].to_list()) == {"fatal", "error", "warning"}
    assert set(lr["severity"].to_list()) == {"low"} and set(lr["category"].to_list()) == {"anomaly"}


def test_line_scores_never_propose_a_disruptive_action(replayed):
    res, _f, _kinds = replayed
    det = res.engine.detector_findings().filter(pl.col("rule_id") == RULE_ID)
    assert det.height > 0 and set(det["action"].to_list()) == {"investigate"}
    kinds = {str(a.kind) for i in res.incidents for a in i.actions}
    assert kinds and not kinds & DISRUPTIVE
    # only the new template is an incident; the level-based flags are evidence rows (no flood)
    assert [i.category for i in res.incidents] == ["anomaly"]
    assert dict(zip(det["line"].to_list(), det["role"].to_list(), strict=True)) == {
        ln: ("cause" if ln in _kinds["new_warning"] else "info") for ln in det["line"].to_list()}
    detail = json.loads(det["detail"][0])
    assert {"score", "template", "template_lines", "lines", "why"} <= set(detail)


def test_off_by_default_for_built_in_formats_and_when_turned_off(sample, tmp_path):
    path, _kinds = sample
    # the same events read as a plain job log (no site format): auto is off
    res = replay([str(path)], ReplayOptions(read=ReadOptions(fmt="job", host="r01")))
    assert res.engine.config.line_scores is False
    assert res.engine.all_findings().filter(pl.col("rule_id") == RULE_ID).height == 0
    off = replay([str(path)], ReplayOptions(read=ReadOptions(line_formats=(FMT,)),
                                            config=EngineConfig(line_scores=False)))
    assert off.engine.all_findings().filter(pl.col("rule_id") == RULE_ID).height == 0


def test_any_split_of_the_input_gives_the_same_line_scores(sample):
    path, _kinds = sample
    ev = read_paths([path], ReadOptions(line_formats=(FMT,))).events
    cfg = EngineConfig(line_scores=True, detectors=())
    whole = Engine(cfg)
    whole.feed(ev)
    parts = Engine(cfg)
    for lo, hi in ((0, 77), (77, 600), (600, ev.height)):
        parts.feed(ev.slice(lo, hi - lo))
    a, b = whole.line_scores(), parts.line_scores()
    assert a.height > 0
    assert a.select("file", "line", "detail").rows() == b.select("file", "line", "detail").rows()


def test_flagged_lines_of_one_template_are_bounded_and_novelty_needs_a_stable_vocabulary():
    params = LineScoreParams(max_per_template=4)
    n = 3000
    ev = pl.DataFrame({
        "file": ["f"] * n, "line": list(range(1, n + 1)), "seq": list(range(n)), "host": ["h"] * n,
        "level": ["fatal"] * n, "message": ["machine check"] * (n - 1) + ["brand new text"],
    })
    ev = conform(ev.with_columns(time=pl.col("seq").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")), EVENT_SCHEMA)
    flagged = score_lines(LineStats.of(ev, params), params)
    assert flagged.height == 5            # 4 of the repeating FATAL template + the new template's line
    # a vocabulary that keeps growing (every line its own template): nothing is "new"
    chatter = ev.with_columns(level=pl.lit(None, pl.String), message=pl.format("kind {} of line", pl.col("seq")
                                                                                .map_elements(_word, pl.String)))
    assert score_lines(LineStats.of(chatter, params), params).height == 0


def _word(i: int) -> str:
    return "".join(chr(97 + int(d)) for d in str(i))     # digits as letters: no mask folds them together


@pytest.mark.parametrize(("line_scores", "prefiltered"), [(None, True), (True, False)])
def test_watch_drops_the_rule_prefilter_when_line_scores_are_on(line_scores, prefiltered):
    opts = WatchOptions(sources=("victorialogs://127.0.0.1:9",), config=EngineConfig(line_scores=line_scores))
    w = Watcher(opts).prepare()       # builds the query; no network
    pre = w.engine.pack.logsql_prefilter()
    assert w.query is not None and pre not in ("", "*") and (pre in w.query) is prefiltered
