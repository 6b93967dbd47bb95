"""Parse fully only what can matter (sources/formats.py, read_text.group_records): the capturing
regexes, strptimes and host normalisation run only on the lines a capture-free test admits, and
multi-line grouping runs in full only where a continuation is possible. Property: on random
mixtures of real-shaped lines the result equals evaluating everything on every line — the
reference parsers below are the previous all-rows implementations, kept here as the oracle."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.schema import SourceKind
from recovery_logs.sources.formats import (
    RE_3164,
    RE_3164_HOST,
    RE_5424,
    RE_COMPOSE,
    RE_CRI,
    RE_GLOG,
    RE_HOST_LABEL,
    RE_ISO_LEAD,
    RE_ISOSYSLOG,
    RE_NCCL_HOST,
    RE_NOT_HOST,
    RE_RANK,
    RE_SD_JOB,
    RE_TS_PREFIX,
    RE_UPTIME_PREFIX,
    ParseContext,
    _base_cols,
    _file_kind,
    _program_source,
    _rfc3164,
    _year,
    _yearless,
    naive_to_utc_ns,
    parse_job,
    parse_syslog,
    short_host,
)
from recovery_logs.sources.levels import pri_level_expr
from recovery_logs.sources.read_text import _group_full, group_records
from recovery_logs.timeutil import frac_ns as _frac_ns
from recovery_logs.timeutil import rfc3339_to_ns_expr as rfc3339_ns

# shapes from the formats the readers document (torchrun/glog, Python logging, NCCL, RFC3164/5424,
# rsyslog ISO, kernel NVRM lines split over lines, tracebacks), plus junk
JOB = [
    "[rank3]: I1129 14:00:01.357565 2532391 torch/distributed/run.py:793] Setting OMP_NUM_THREADS",
    "[rank12]:W1129 14:00:02.000001 77 ProcessGroupNCCL.cpp:616] [Rank 12] Watchdog caught collective operation timeout",
    "3: [2026-11-29 14:00:03,123] INFO iteration 10/ 500 | elapsed time per iteration (ms): 812.5",
    "2026-11-29T14:00:04.5+01:00 step 7 loss 2.5",
    "[2026-11-29 14:00:05] iteration 11/ 500 | lm loss: 5.1",
    "gpu-n001.cluster:52731:52731 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "node-7:5776:5898 [3] NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with status=12",
    "10.1.2.3:1:1 [1] NCCL INFO Bootstrap : Using eth0:10.1.2.3<0>",
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "During handling of the above exception, another exception occurred:",
    "",
    "    indented continuation",
    "   ",
    "\u00a0\u2003indented by a no-break space and an em space",
    "\t\u00a0",
    "E1399 99:99:99.1 bad glog date",
    "[I1129 14:00:06.123456789] glog time in brackets, nine fraction digits",
    "F1129 14:00:07 glog time without a fraction",
    "W1129 14:00:08.5\tterminated by a tab",
    "I1129 14:00:09.1234567890 ten fraction digits: not a glog header",
    "I1129 14:00:1١.5 a non-ASCII digit in the seconds",
    "I0229 14:00:10.25] February 29th in a year without one",
    "[rank1]: ",
    "plain text without time",
    # pdsh/clush per-node labels (pdsh src/pdsh/dsh.c: "%S: %s"): the line behind the label is read as it stands
    "gpu-n003: [rank5]: W1129 14:00:02.000001 77 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught collective operation timeout",
    "node017.cluster: gpu-n001.cluster:52731:52731 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "10.0.0.7: 2026-11-29T14:00:04.5+01:00 step 7 loss 2.5",
    "gpu-n004: ",
    "gpu-n004:  indented behind the label",
    "rank3: a counter, not a host label",
    "Gpu-N01: upper case is not a label",
    "RuntimeError: a word is not a label",
    # a collector's stamp (kubectl logs --timestamps), the kubelet's CRI file line, docker compose's name column
    "2026-11-29T14:00:04.123456789Z slurmstepd: error: execve(): train.sh: No such file or directory",
    "2026-11-29T14:00:04.123456789Z stderr F [rank2]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "2026-11-29T14:00:05+01:00 stdout P a partial line",
    "2026-11-29T14:00:05Z stdout X an unknown tag: not CRI",
    "trainer-1   | node-7:5776:5898 [3] NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with status=12",
    "proj_vllm_1  | 2026-11-29T14:00:06.5Z INFO engine started",
    "trainer | no replica number: not a compose column",
]
SYSLOG = [
    "Nov 29 14:00:01 gpu-n001 kernel: [86000.123456] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
    "<6>Nov  9 04:00:01.5 gpu-n002.cluster kernel: NVRM: GPU at PCI:0000:3b:00: GPU-1234",
    "Nov 29 14:00:02 kernel: NVRM: message split over lines and",
    "Nov 29 14:00:02 gpu-n001 kernel: NVRM: continued here (lower case).",
    '<13>1 2026-11-29T14:00:03.25Z gpu-n003 slurmd 123 - [meta job_id="4242"] error: Node gpu-n003 not responding',
    "<13>1 2026-11-29T14:00:03Z - - - - - message with nil fields",
    "2026-11-29T14:00:04.123456+00:00 gpu-n004 slurmstepd[99]: error: *** JOB 77 ON gpu-n004 CANCELLED AT",
    "2026-11-29T14:00:05Z 10.0.0.7 kernel: mlx5_core 0000:0c:00.0 ibp12s0: Link down",
    "Dec 31 23:59:59 gpu-n001 systemd[1]: Started session.",
    "   indented syslog continuation",
    "",
    "Feb 30 10:00:00 gpu-n001 kernel: impossible date",
    "Nov 29 14:00:01 2001:db8::1 sshd[12]: an IPv6 host",
    "Nov 29 14:00:01 gpu-n001 a:b: a program tag with a colon in it",
    "Nov 29 14:00:01 gpu-n001 prog:no space after the tag",
    "Nov 29 14:00:01 gpu-n001: prog: a host token ending in a colon",
    "Nov  1 14:00:01 gpu-n001 p[x]: a pid that is not a number",
    "garbage without a header",
    "2026-11-29T14:00:04Z slurmstepd: error: a program's line behind a bare stamp (host ends in a colon)",
    "2026-11-29T14:00:04Z Core 0: +100.0°C  (a program tag starting with a digit)",
    "2026-11-29T14:00:04Z [12.5] NVRM: Xid (a bracketed host)",
]


def _ref_syslog(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    t = pl.col("text")
    # group 1 of each wrapped regex is the whole header, so the message needs no second regex pass
    df = lines.with_columns(a=t.str.extract_groups("^(" + RE_5424[1:] + ")"),
                            b=t.str.extract_groups("^(" + RE_3164[1:] + ")"),
                            c=t.str.extract_groups("^(" + RE_ISOSYSLOG[1:] + ")"))
    af, bf, cf = (lambda i: pl.col("a").struct.field(str(i + 1)), lambda i: pl.col("b").struct.field(str(i + 1)),
                  lambda i: pl.col("c").struct.field(str(i + 1)))
    is_a, is_b, is_c = af(2).is_not_null(), bf(1).is_not_null(), cf(1).is_not_null()
    # RFC3164 time: year from ctx
    b_str = pl.concat_str([_year(ctx), bf(1), bf(2).str.zfill(2), bf(3)], separator=" ")
    b_dt = b_str.str.strptime(pl.Datetime("us"), "%Y %b %d %H:%M:%S", strict=False)
    b_ns = _yearless(b_dt, ctx) + _frac_ns(bf(4))
    a_ns = rfc3339_ns(af(2))
    c_ns = rfc3339_ns(cf(1))
    host = pl.when(is_a).then(af(3)).when(is_b).then(bf(5)).when(is_c).then(cf(2))
    prog = pl.when(is_a).then(af(4)).when(is_b).then(bf(6)).when(is_c).then(cf(3))
    header = pl.coalesce(af(0), bf(0), cf(0))
    raw_msg = t.str.strip_prefix(header)
    df = df.with_columns(
        header=is_a | is_b | is_c,
        has_ts=pl.lit(True),
        ts=pl.when(is_a).then(a_ns).when(is_b).then(b_ns).when(is_c).then(c_ns),
        host=short_host(host),
        job_id=af(7).str.extract(RE_SD_JOB, 1),
        prog=prog,
        message=pl.when(is_a | is_b | is_c).then(raw_msg.str.replace(RE_UPTIME_PREFIX, "")).otherwise(t),
        level=pl.when(is_a | is_b).then(pri_level_expr(t)),     # the PRI, where the line carries one
    )
    # a line that is not a header but is indented is a continuation, not a bad timestamp
    df = df.with_columns(has_ts=pl.col("header") | ~t.str.contains(r"^\s")).with_columns(
        source=_program_source(pl.col("prog"), pl.col("message"), _file_kind(ctx, SourceKind.OTHER.value)),
        nvrm=pl.col("message").str.starts_with("NVRM: "),
        body=pl.col("message"))
    return _base_cols(df)



def _ref_job(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    raw = pl.col("text")
    is_cri = raw.str.contains(RE_CRI)
    lines = lines.with_columns(_cri_ns=pl.when(is_cri).then(rfc3339_ns(raw.str.extract(RE_CRI, 1))),
                               _c=pl.when(is_cri).then(raw.str.replace(RE_CRI, "")).otherwise(raw))
    c = pl.col("_c")
    lines = lines.with_columns(_c=pl.when(c.str.contains(RE_COMPOSE)).then(c.str.replace(RE_COMPOSE, "")).otherwise(c))
    lab = pl.col("_c").str.extract(RE_HOST_LABEL, 1)
    lines = lines.with_columns(_lab=pl.when(lab.str.contains(RE_NOT_HOST)).then(None).otherwise(lab))
    lines = lines.with_columns(_t=pl.when(pl.col("_lab").is_not_null())
                               .then(pl.col("_c").str.replace(RE_HOST_LABEL, "")).otherwise(pl.col("_c")))
    t = pl.col("_t")
    df = lines.with_columns(_rk=t.str.extract_groups(RE_RANK))
    rk = pl.col("_rk")
    rank = pl.coalesce(rk.struct.field("1"), rk.struct.field("2")).cast(pl.Int32, strict=False)
    body = pl.when(rk.struct.field("1").is_not_null() | rk.struct.field("2").is_not_null()).then(
        t.str.replace(RE_RANK, "")).otherwise(t)
    df = df.with_columns(rank=rank, body=body)
    b = pl.col("body")
    df = df.with_columns(_g=b.str.extract_groups(RE_GLOG), _iso=b.str.extract_groups(RE_ISO_LEAD),
                         _nccl=b.str.extract(RE_NCCL_HOST, 1))
    gf = lambda i: pl.col("_g").struct.field(str(i))  # noqa: E731
    g_str = pl.concat_str([_year(ctx), gf(2), gf(3), gf(4)], separator=" ")
    g_ns = _yearless(g_str.str.strptime(pl.Datetime("us"), "%Y %m %d %H:%M:%S", strict=False), ctx) + _frac_ns(gf(5))
    i_time, i_zone = pl.col("_iso").struct.field("1"), pl.col("_iso").struct.field("2")
    i_ns_utc = rfc3339_ns(pl.concat_str([i_time, i_zone.fill_null("")]))
    if ctx.tz.upper() == "UTC":
        i_ns = i_ns_utc
    else:
        i_dt = i_time.str.replace(",", ".").str.replace("T", " ").str.strptime(
            pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
        i_ns = pl.when(i_zone.is_not_null()).then(i_ns_utc).otherwise(naive_to_utc_ns(i_dt, ctx.tz))
    is_g, is_i = gf(1).is_not_null(), i_time.is_not_null()
    file_kind = _file_kind(ctx, SourceKind.JOB.value)
    df = df.with_columns(
        has_ts=is_g | is_i | pl.col("_cri_ns").is_not_null(),
        ts=pl.coalesce(pl.col("_cri_ns"), pl.when(is_g).then(g_ns).when(is_i).then(i_ns)),
        host=pl.coalesce(short_host(pl.col("_nccl")), short_host(pl.col("_lab"))),
        message=pl.when(is_i & b.str.contains(RE_TS_PREFIX)).then(b.str.replace(RE_TS_PREFIX, "")).otherwise(b),
        header=is_g | is_i,
        source=file_kind,
        nvrm=pl.lit(False),
    )
    return _base_cols(df)



TZS = st.sampled_from(["UTC", "Europe/Berlin"])


def _frame(texts: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"lineno": list(range(1, len(texts) + 1)), "text": texts},
                        schema={"lineno": pl.Int64, "text": pl.String})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(JOB), max_size=40), TZS, st.booleans())
def test_job_lines_parse_as_if_every_line_were_parsed_in_full(texts: list[str], tz: str, line_host: bool) -> None:
    lines = _frame(texts)
    ctx = ParseContext(file="job-1/gpu-n01.out", year=2026, tz=tz, rollover_after_ns=1_796_000_000 * 10**9,
                       line_host=line_host)
    got, want = parse_job(lines, ctx), _ref_job(lines, ctx)
    if not line_host:     # the path names the host: the line's own host is never used (never extracted)
        want = want.with_columns(host=pl.lit(None, pl.String))
    assert_frame_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(SYSLOG), max_size=40), TZS, st.booleans())
def test_syslog_lines_parse_as_if_every_line_were_parsed_in_full(texts: list[str], tz: str, roll: bool) -> None:
    lines = _frame(texts)
    ctx = ParseContext(file="kern.log", year=2026, tz=tz, rollover_after_ns=1_796_000_000 * 10**9 if roll else None)
    assert_frame_equal(parse_syslog(lines, ctx), _ref_syslog(lines, ctx))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(JOB)), max_size=60), st.booleans())
def test_many_files_parse_and_group_as_the_full_rules(rows: list[tuple[int, str]], syslog: bool) -> None:
    """Several files in one frame (read_many's columns): the cheap grouping (only files that can
    hold a continuation in full) equals the full rules; with ``streams=False`` the records agree."""
    if syslog:
        rows = [(f, SYSLOG[hash(t) % len(SYSLOG)]) for f, t in rows]
    rows = sorted(rows, key=lambda r: r[0])
    lines = pl.DataFrame({"_fid": [f for f, _ in rows], "text": [t for _, t in rows]},
                         schema={"_fid": pl.Int64, "text": pl.String}).with_columns(
        lineno=pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("_fid"),
        _year=pl.lit("2026"), _roll=pl.lit(None, pl.Int64), _fkind=pl.lit(None, pl.String),
        _boot=pl.lit(None, pl.Int64), _binf=pl.lit(False),
        _phost=pl.when(pl.col("_fid") == 1).then(pl.lit("gpu-n09")).otherwise(pl.lit(None, pl.String)))
    ctx = ParseContext(file="", year=0, columns=True)
    fmt = "syslog" if syslog else "job"
    parsed = (parse_syslog if syslog else parse_job)(lines, ctx)
    want = (_ref_syslog if syslog else _ref_job)(lines, ctx)
    if not syslog:    # file 1's path names its host: its lines' own host is not extracted
        want = want.with_columns(host=pl.when(pl.col("_fid") == 1).then(None).otherwise(pl.col("host")))
    assert_frame_equal(parsed, want)
    full = _group_full(parsed, fmt)
    assert_frame_equal(group_records(parsed, fmt), full)
    cheap = group_records(parsed, fmt, streams=False)
    records = ["lineno", "_fid", "cont", "drop"]
    assert_frame_equal(cheap.select(records), full.select(records))
    kept = ~pl.col("drop")
    assert_frame_equal(cheap.filter(kept).select("gfirst"), full.filter(kept).select("gfirst"))


_HEAD = st.text(alphabet="ab:[]1 .<>6", max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "<6>", "<13>"]), st.sampled_from(["Nov 29", "Nov  1", "Nov 1", "Feb 30"]),
                          st.sampled_from(["14:00:01", "14:00:01.25", "14:00"]), _HEAD, _HEAD), max_size=30))
def test_rfc3164_one_pass_regex_gives_the_groups_of_re_3164(parts: list[tuple[str, str, str, str, str]]) -> None:
    """``_rfc3164`` (RE_3164_HOST where it can decide, RE_3164 on the rest) = RE_3164 on every
    line: hosts and program tags made of letters, digits, ':', '[', ']', '.', '<', '>' and spaces."""
    texts = [f"{pri}{day} {hms} {a} {b}: msg" for pri, day, hms, a, b in parts]
    s = pl.Series("text", texts, dtype=pl.String)
    assert RE_3164_HOST.startswith("^")
    assert_frame_equal(_rfc3164(s).struct.unnest(), s.str.extract_groups("^(" + RE_3164[1:] + ")").struct.unnest())
