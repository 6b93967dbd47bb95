"""sources.vl_local.split_frame: the selection, counts and progress summaries made here equal what
the row readers and the engine make of the same rows."""

from __future__ import annotations

import functools

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs.config import EngineConfig
from recovery_logs.errors import VictoriaLogsError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.vl_replay import local_split
from recovery_logs.schema import empty_findings
from recovery_logs.sources.files import events_from_vl_records
from recovery_logs.sources.formats import vl_columns
from recovery_logs.sources.read_common import ReadOptions
from recovery_logs.sources.vl_history import present_fields
from recovery_logs.sources.vl_local import LocalSplit, read_export, split_frame, step_prefix, with_ts
from recovery_logs.timeutil import rfc3339_to_ns_expr
from recovery_logs.windows import window_counts

W = 60 * 1_000_000_000


def _rows() -> list[dict[str, str]]:
    # formats: NVIDIA open-gpu-kernel-modules (NVRM: Xid ...); the progress line is the shape of
    # rules/progress.toml progress.step_loss's must_match example ("[rank10]: step 1913 | loss ...")
    rows = [
        {"_time": "2026-12-01T10:00:01.000000001Z", "_stream_id": "s1", "host": "gpu-n1.cluster.local",
         "unit": "kernel", "_msg": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."},
        {"_time": "2026-12-01T10:00:02Z", "_stream_id": "s2", "hostname": "gpu-n2", "unit": "sshd",
         "slurm_job_id": "77", "_msg": "Accepted publickey for user1 from 10.0.0.1"},
        {"_time": "2026-12-01T10:00:02Z", "_stream_id": "s2", "hostname": "gpu-n2", "unit": "sshd",
         "slurm_job_id": "77", "_msg": "Accepted publickey for user1 from 10.0.0.1"},       # a re-sent duplicate
        {"_time": "2026-12-01T10:01:05.5Z", "_stream_id": "s3", "host": "gpu-n1", "unit": "kernel",
         "_msg": "systemd[1]: Started Session 4 of User root."},
        {"_time": "not a time", "_stream_id": "s3", "host": "gpu-n1", "_msg": "systemd[1]: Started Session 5"},
    ]
    for k in range(6):
        rows.append({"_time": f"2026-12-01T10:00:{10 + k:02d}.25Z", "_stream_id": "s4", "host": "gpu-n3",
                     "unit": "train", "job_id": "184499", "rank": str(k % 3),
                     "_msg": f"[rank{k % 3}]: step {k // 3} | loss 1.9{k} | lr 3.0e-04 | tokens/s 118000"})
    return rows


def _frame(rows: list[dict[str, str]]) -> pl.DataFrame:
    keys = vl_columns(tuple(ReadOptions().host_fields))
    return pl.DataFrame([{k: r.get(k) for k in keys} for r in rows], schema={k: pl.String for k in keys})


def test_split_selects_counts_and_summarises_as_the_readers_and_the_engine_do():
    eng = Engine(EngineConfig())
    plan = local_split(eng.pack, W)
    assert [p.rule_id for p in plan.progress] == ["progress.step_loss"]
    rows = _rows()
    need, counts, prog = split_frame(_frame(rows), plan, ReadOptions())
    # needed as text: the Xid line and the line whose time does not parse (the readers quarantine it)
    assert sorted(need["_msg"].to_list()) == sorted([rows[0]["_msg"], rows[4]["_msg"]])
    # line counts per (host, job, window) = the readers' windows of every line
    ref = events_from_vl_records(rows, ReadOptions(), 0, "victorialogs:t").events
    want = (window_counts(ref, empty_findings(), 60.0).select("host", "job_id", "window_start", "lines")
            .sort("host", "job_id", "window_start"))
    got = (counts.select("host", "job_id", pl.col("bucket").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC")
                         .cast(want.schema["window_start"]).alias("window_start"), "lines")
           .sort("host", "job_id", "window_start"))
    assert got.to_dicts() == want.to_dicts()
    assert int(counts["duplicates"].sum()) == 1 and int(counts["lines"].sum()) == ref.height
    # progress: per (host, job, step, window): lines, first and last time — the findings the engine makes
    (spec, pc), = prog
    found = eng.partial(ref).findings.filter(pl.col("rule_id") == spec.rule_id)
    by = (found.group_by("host", "job_id", "step").agg(pl.len().alias("lines"),
                                                        pl.col("time").min().dt.epoch("ns").alias("first"),
                                                        pl.col("time").max().dt.epoch("ns").alias("last"))
          .sort("step"))
    assert pc.select("host", "job_id", "step", "lines", "first", "last").sort("step").to_dicts() == by.to_dicts()


def test_vl_time_fast_path_and_fallback_agree():
    df = pl.DataFrame({"_time": ["2026-12-01T10:00:01.123456789Z", "2026-12-01T10:00:01Z", "2026-12-01T11:00:01+01:00",
                                 "garbage", None]})
    got = with_ts(df)["_ts"].to_list()
    assert got[0] == got[1] + 123456789 and got[2] == got[1] and got[3] is None and got[4] is None


def test_vl_time_fast_path_equals_the_general_parser():
    # VictoriaLogs writes RFC3339 UTC with up to 9 fraction digits, trailing zeros cut (the fast
    # path); every other shape must come out as the general RFC3339 parser reads it
    times = ["2026-12-01T10:00:01.5Z", "2026-12-01T10:00:01.000000001Z", "2026-12-01T10:00:01Z",
             "2026-12-01T10:00:01.+5Z", "2026-12-01T10:00:01.-5Z", "2026-12-01T10:00:01.1234567891Z",
             "2026-12-01T10:00:01,5Z", "2026-12-01T10:00:01.5+00:00", "2026-12-01T10:00:01.5z", "2026-13-01T10:00:01Z",
             "2026-12-01T10:00:01.Z", "2026-12-01 10:00:01.5Z", "2026-12-01T10:00:61Z", "",
             # nine digits (30 bytes: the first fast path) and 30-byte look-alikes
             "2026-12-01T10:00:01.123456789Z", "2026-12-01T10:00:01.+12345678Z", "2026-12-01T10:00:01.-12345678Z",
             "2026-12-01T10:00:01.12345678aZ", "2026-12-01T10:00:01.1234567 9Z", "2026-12-01T10:00:01.123456789z",
             "2026-12-01T10:00:01 123456789Z", "2026-12-01T24:00:01.123456789Z",
             # a shipper's milli-/microsecond times as the server writes them back, every fraction length
             "2026-12-01T10:00:01.123Z", "2026-12-01T10:00:01.123456Z", "2026-12-01T10:00:01.12Z",
             "2026-12-01T10:00:01.1234Z", "2026-12-01T10:00:01.12345Z", "2026-12-01T10:00:01.1234567Z",
             "2026-12-01T10:00:01.12345678Z", "1969-12-31T23:59:59.25Z"]
    got = with_ts(pl.DataFrame({"_time": times}))["_ts"].to_list()
    want = pl.DataFrame({"_time": times}).select(rfc3339_to_ns_expr(pl.col("_time")))["_time"].to_list()
    assert got == want
    assert got[0] == got[2] + 500_000_000 and got[1] == got[2] + 1


def test_read_export_parses_only_the_present_fields_and_nulls_the_rest():
    body = b'{"_time":"2026-12-01T10:00:01Z","_msg":"a","host":"h1"}\n{"_time":"2026-12-01T10:00:02Z","_msg":"b"}\n'
    df = read_export(body, ["_time", "_msg", "host"], ["_time", "_msg", "rank", "host", "job_id"])
    assert df.columns == ["_time", "_msg", "host", "rank", "job_id"]
    assert df["host"].to_list() == ["h1", None] and df["rank"].null_count() == 2
    assert read_export(b"\n", ["_time"], ["_time", "rank"]).schema == {"_time": pl.String, "rank": pl.String}


class _Names:
    def __init__(self, answer: dict[str, int] | None) -> None:
        self.answer = answer

    def field_names(self, query: str, start: int, end: int) -> dict[str, int]:
        if self.answer is None:
            raise VictoriaLogsError("VictoriaLogs request failed", status=404)
        return self.answer


def test_present_fields_keeps_the_core_and_the_present_fields_drops_stream():
    keys = vl_columns(tuple(ReadOptions().host_fields))
    got = present_fields(_Names({"_time": 9, "_msg": 9, "_stream": 9, "_stream_id": 9, "host": 9, "rank": 0,
                                 "job_id": 3}), "*", 0, 1, keys)    # type: ignore[arg-type]
    assert got == ("_time", "_msg", "_stream_id", "host", "job_id")
    assert present_fields(_Names({}), "*", 0, 1, keys) == ("_time", "_msg", "_stream_id")   # type: ignore[arg-type]
    assert present_fields(_Names(None), "*", 0, 1, keys) is None     # type: ignore[arg-type]


STEP_LOSS = r"\bstep\b[\s:=]+(?P<step>\d+)\b[^\n]*?\bloss\b[\s:=]+(?P<loss>[-\d.eE+]+)"


def test_step_prefix_only_for_the_shape_it_is_exact_for():
    assert step_prefix(STEP_LOSS) == r"(?-u:\b)step(?-u:\b)[\t\n\x0B\f\r :=]+(?P<step>[0-9]+)(?-u:\b)"
    for p in (r"\bstep\b[\s:=0-9]+(?P<step>\d+)\b[^\n]*?x",      # separators that can be digits
              r"(?i)\bstep\b[\s:=]+(?P<step>\d+)\b[^\n]*?x",       # a flag
              r"\bst.p\b[\s]+(?P<step>\d+)\b[^\n]*?x",             # not one word
              r"\bstep\b[\s:=]+(?P<step>\d+)[^\n]*?x",             # no boundary after the digits
              r"\bstep\b[\s:=]+(?P<step>\d+)\b.*?x",               # '.' (single-line either way, but not this shape)
              r"\bstep\b[\w]+(?P<step>\d+)\b[^\n]*?x", r"\biter (?P<step>\d+): loss"):
        assert step_prefix(p) is None, p


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["step", "step:", "step=", "loss", "loss ", "1", "23", "x", " ", ":", "=", "|",
                                 "steps", "_step", "1.5", "e-3", "\n", "\t", "lossy", "[rank3]:", "\x0b", "\x0c", "\r",
                                 "\x1c", "\xa0", "é", "٣"]), max_size=24))
def test_step_prefix_gives_the_whole_patterns_step(parts):
    """On the lines it is applied to (single-line and ASCII, as a ProgressSpec selects them; its
    classes are ASCII): the whole pattern's step. \\x1c is a space to Python, not to \\s."""
    msgs = ["".join(parts), "step 7 | " + "".join(parts), "".join(parts) + " step 9 loss 1.0"]
    m = pl.col("m")
    df = pl.DataFrame({"m": msgs}).filter(m.str.contains(STEP_LOSS) & ~m.str.contains("\n")
                                          & (m.str.len_bytes() == m.str.len_chars()))
    full = df.select(pl.col("m").str.extract_groups(STEP_LOSS).struct.field("step"))["step"].to_list()
    fast = df.select(pl.col("m").str.extract(step_prefix(STEP_LOSS), 1))["m"].to_list()
    assert fast == full


def _canon(res: tuple[pl.DataFrame, pl.DataFrame, list]) -> tuple:
    rows, counts, prog = res
    return (rows.sort(pl.all()).to_dicts(), counts.sort(pl.all()).to_dicts(),
            [(spec.rule_id, pc.sort(pl.all()).to_dicts()) for spec, pc in prog])


# the progress line is the shape of rules/progress.toml progress.step_loss's must_match example;
# the Xid line: NVIDIA open-gpu-kernel-modules ("NVRM: Xid (PCI:...): 79, pid=..., ...")
_MSGS = ["[rank1]: step 4 | loss 1.93 | lr 3.0e-04", "[rank1]: step 5 | loss 1.90 | lr 3.0e-04",
         "[rank2]: step 4 | loss 1.91 | 0.52 s/step", "[rank2]: step 4 | loss 1.91 é",
         "systemd[1]: Started Session 4 of User root.",
         "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."]
_HOSTS = [{"host": "gpu-n1"}, {"host": "gpu-n1.cluster.local"}, {"hostname": "gpu-n2"}, {}]
_JOBS = [{"job_id": "184499"}, {"slurm_job_id": "77"}, {}]


@functools.lru_cache(maxsize=1)
def _default_split() -> LocalSplit:
    return local_split(Engine(EngineConfig()).pack, W)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(_MSGS), st.integers(0, 3), st.integers(0, 2),
                          st.integers(0, 2), st.booleans()), min_size=0, max_size=40))
def test_split_without_identities_equals_the_exact_split(draw):
    """Rows with distinct times are split without an identity (plain row counts, one group-by per
    table of integer keys); the result equals the exact split's (every row's identity, duplicates
    counted as the readers drop them) on frames with distinct times, shared times and re-sent rows."""
    from recovery_logs.sources.vl_local import _split_exact
    plan = _default_split()
    for distinct in (False, True):      # times as drawn (shared, re-sent rows) / made distinct
        rows = [{"_time": "not a time" if bad and t == 0 else
                 f"2026-12-01T10:0{t}:01.{k if distinct else 5:09d}Z", "_stream_id": f"s{h}", "rank": str(rank),
                 "_msg": msg, **_HOSTS[h], **_JOBS[j]} for k, (t, msg, h, j, rank, bad) in enumerate(draw)]
        df = with_ts(_frame(rows))
        for opts in (ReadOptions(), ReadOptions(dedupe=False)):
            want = _split_exact(df, plan, opts, df.columns, False)
            assert _canon(split_frame(df, plan, opts)) == _canon(want)
