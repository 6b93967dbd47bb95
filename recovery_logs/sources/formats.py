"""Per-format line parsers, vectorised in Polars, and format detection.

Every parser takes a frame of raw lines (``lineno`` Int64, ``text`` String) and returns the same
frame with these columns added (the "parsed lines" frame that ``files.py`` groups into events):

====================  ==========================================================================
``ts``                Int64 ns since the epoch (UTC) of the line's own timestamp, or null
``ts_inferred``       True when ``ts`` is an estimate (relative dmesg without a known boot time)
``has_ts``            True when the line carries a timestamp field (null ``ts`` then = bad_timestamp)
``header``            True when the line starts a record in this format (syslog/dmesg header,
                      JSON object); False lines may be continuations
``malformed``         True for a line that cannot be an event at all (bad JSON line)
``host`` ``job_id``   from the line itself (null when it does not say)
``source``            SourceKind value
``rank``              Int32 from ``[rank3]:`` / srun ``-l`` ``3: `` prefixes (job files, VL)
``stream_id``         VictoriaLogs ``_stream_id`` (JSON formats), else null
``message``           the text kept as the event message
====================  ==========================================================================

What ``message`` keeps (the rule packs match on it):

* syslog (RFC3164/RFC5424): the header (priority, time, host, ``program[pid]:``, SD) and a
  leading dmesg uptime ``[12345.678901]`` are stripped.
* dmesg: the ``[uptime]`` / ``[date]`` prefix is stripped.
* job output: only a pdsh/clush ``host: `` label (it sets ``host`` where the line names none of its
  own and the path names none) and the ``[rankN]:`` and srun ``-l`` ``N: `` prefixes are stripped
  (they set ``rank``); glog / torch / Python-logging headers stay in the message, because they carry the
  severity letter and the source file that rules match on.
* journald: ``MESSAGE`` (a list of byte values is decoded as UTF-8 with replacement).
* VictoriaLogs: ``_msg`` with a leading ``[rankN]:`` stripped (sets ``rank``), like job files.

Times without a zone (RFC3164, glog, ``dmesg -T``, Python logging) are read in ``tz``; RFC3164
and glog have no year, ``year`` supplies it.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import PurePath

import polars as pl

from recovery_logs.schema import SourceKind
from recovery_logs.schema import on_rows as _on_rows
from recovery_logs.sources.levels import level_expr, pri_level_expr
from recovery_logs.timeutil import frac_ns as _frac_ns
from recovery_logs.timeutil import rfc3339_to_ns_expr as rfc3339_ns

FORMATS = ("vl-jsonl", "journald", "syslog", "dmesg", "job", "parquet")
TEXT_FORMATS = ("vl-jsonl", "journald", "syslog", "dmesg", "job")

SLURM_DAEMONS = ("slurmd", "slurmctld", "slurmstepd", "slurmdbd")
_SLURM_FILE = re.compile(r"(?:^|[^a-z])(slurmd|slurmctld|slurmstepd|slurmdbd)(?:[^a-z]|$)", re.I)

# --- regexes (Rust regex syntax: Polars) -------------------------------------------------------
# Header regexes capture only the header; the message is the text after the whole match (capturing
# a trailing `(.*)` makes the regex engine several times slower).
RE_5424 = r"^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (-|(?:\[(?:[^\]\\]|\\.)*\])+) ?"
# The host is optional: `Mar 29 15:38:59 kernel: NVRM: ...` (journal exports, pastes) has none; a host
# token never ends in ':' (that is the program tag).
RE_3164 = (r"^(?:<\d{1,3}>)?([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))? "
           r"(?:(\S*[^\s:]) )?([^\s:\[]+)(?:\[\d+\])?: ?")
# The same header with the host present, as a one-pass regex (each byte decides the next step, no
# backtracking: captured ~2x faster): where it matches with a host that does not end in ':', RE_3164
# matches with the same groups (its greedy optional host takes that same first token; ``_rfc3164``)
RE_3164_HOST = (r"^(?:<\d{1,3}>)?([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))? "
                r"(\S+) ([^\s:\[]+)(?:\[\d+\])?: ?")
# rsyslog high-precision template (and journalctl -o short-iso): ISO time, host, program. The host holds no bracket
# and does not end in ':', the program does not start with a digit: a collector's bare stamp in front of a program's
# own line ("<time> slurmstepd: error: ...", "<time> [12.3] NVRM: ...", "<time> Core 0: +100.0°C") is no syslog header
RE_ISOSYSLOG = (r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})) "
                r"([^\s\[\]]*[^\s:\[\]]) ([^\s:\[0-9][^\s:\[]*)(?:\[\d+\])?: ?")
RE_UPTIME_PREFIX = r"^\[\s*\d+\.\d+\]\s?"
RE_DMESG = r"^\[\s*(\d+)\.(\d+)\] ?"
RE_DMESG_T = r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\] ?"
# torchrun "[rankN]: " and srun --label "N: ", right-aligned to the widest task id (Slurm
# src/common/write_labelled_message.c: "%*d: "), so " 3: " in a job of 10+ tasks
RE_RANK = r"^(?:\[rank(\d+)\]: ?| {0,4}(\d{1,6}): )"
RE_GLOG = r"^\[?([IWEF])(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?[\s\]]"
# one leading space allowed: Megatron-LM prints its iteration line as f" [{datetime}]" + " iteration …"
# (megatron/training/training.py training_log), so its own time starts the line after one space
RE_ISO_LEAD = r"^ ?\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)(Z|[+-]\d{2}:?\d{2})?[\]\s]"
# the stamp a collector puts in front of each line it prints: `kubectl logs --timestamps` and `docker logs -t` write
# "<RFC3339Nano time> <line>" (the date, "T", the time and a zone, then one space)
RE_TS_PREFIX = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2}) "
# indented job lines that are records of their own, not continuations: Megatron-LM's iteration line
# without its time (" iteration      182/  250000 |", releases before 2023) and a tqdm bar below 100 %
# (tqdm format_meter l_bar "{desc}{percentage:3.0f}%|": " 10%|█ …", "  5%|")
RE_JOB_HEAD = r"^(?: iteration +\d+/ *\d+ \||\s{1,2}\d{1,2}%\|)"
RE_NCCL_HOST = r"^([A-Za-z0-9][\w.-]*):\d+:\d+ \[\d+\] NCCL "
# pdsh/clush per-node output: each line behind its host's label (pdsh src/pdsh/dsh.c rsh(): out("%S: %s", host,
# buf), the same on stderr; cea-hpc/clustershell lib/ClusterShell/CLI/Display.py print_line(): "%s: " % nodeset, then
# the line). A label is a lowercase host name holding a digit (gpu-n01, node017.cluster) or an IPv4 address, then
# ": ": words ("RuntimeError: ", "NCCL version") are none, nor a gathered node set ("gpu-n[01-04]: ", several hosts);
# a counter-like word ("rank3: ", "epoch2: ") is not a host either (RE_NOT_HOST). dshbak/clush -b blocks are not read.
RE_HOST_LABEL = r"^([a-z][a-z0-9-]*[0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*|[0-9]{1,3}(?:\.[0-9]{1,3}){3}): "
RE_NOT_HOST = r"^(?:rank|local_rank|epoch|step|iter|iteration|batch|layer|cuda|device|gpu|worker|proc|task)[0-9]+$"
# Wrappers a launcher puts in front of a job line, stripped with what they say kept (one capture-free gate,
# RE_WRAP_TEST, admits the few lines that can hold one):
# * Ray's worker-log prefix and vLLM's worker processes: "(RayWorkerVllm pid=306, ip=10.4.80.152) INFO …"
#   (vllm-project/vllm#3722), "(train_rft pid=2657296) 2024-05-11 …" (NVIDIA/nccl#1283, a Ray actor on the
#   driver's node: no ip), "(VllmWorker rank=1 pid=123) …"; the ip is the line's host, rank= its rank;
# * Open MPI's `mpirun --tag-output` "[1,3]<stderr>:" (job id, rank) and Horovod's "[1]<stderr>:"
#   (pytorch/ignite#3466: "[1]<stderr>:RuntimeError: ncclCommInitRank failed: …"): the rank;
# * torchrun's `--tee` role prefix "[default0]:" (torch.distributed.elastic: "[{role}{local_rank}]:"): the
#   local rank ("[rankN]:", the global rank, is RE_RANK's).
RE_WRAP_TEST = r"^(?:\([A-Za-z_][\w.:-]* (?:rank=\d+ )?pid=|\(pid=|\[\d+(?:,\d+)?\]<std|\[[a-z_]+\d+\]:)"
# Ray's log deduplication suffix on a wrapped line ("… [repeated 6x across cluster]", vllm-project/vllm#7896)
RE_RAY_REPEAT = r" \[repeated \d+x across cluster\]$"
RE_WRAP = (r"^(?:\((?:[A-Za-z_][\w.:-]* )?(?:rank=(\d+) )?pid=\d+(?:, ip=([0-9A-Za-z.:-]+))?\) ?"
           r"|\[(?:\d+,)?(\d+)\]<std(?:out|err|diag)>: ?"
           r"|\[[a-z_]+(\d+)\]: ?)")
# The kubelet's container log line (CRI logging format, the files under /var/log/pods/ that log shippers read):
# "<RFC3339Nano time> <stdout|stderr> <F|P> <the line the container wrote>" (kubernetes/kubernetes
# pkg/kubelet/kuberuntime/logs/logs.go parseCRILog; tag F a full line, P a partial one the runtime split, >16 KiB):
# the time is the line's, the rest is read as the line itself.
RE_CRI = r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})) (?:stdout|stderr) [FP] "
# `docker compose logs` / `docker compose up` put each container's lines behind its name, padded to the widest, and
# "| " (docker/compose cmd/formatter/logs.go: "<name><padding> | <line>"; the name is the service's container,
# "<service>-<n>" in Compose v2, "<project>_<service>_<n>" in v1): the rest is read as the line itself
RE_COMPOSE = r"^[A-Za-z0-9][\w.-]*[-_]\d+ +\| "
# ANSI colour / cursor sequences (coloured loggers, tqdm), removed wherever the line holds an ESC
RE_ANSI = r"\x1b\[[0-9;?]*[A-Za-z]"
RE_SD_JOB = r"""(?:job_id|jobid|slurm_job_id)="(\d+(?:[._]\w+)?)\""""
RE_IPV4 = r"^\d+\.\d+\.\d+\.\d+$"



_QUOTE_LEAD = re.compile(r"[ \t]*(?:>[ \t]?)*")


def may_be_indented_paste(head: bytes) -> bool | None:
    """The stream's first byte after its leading newlines is a blank or a '>' (only then can
    ``paste_indent`` find an indent); None when ``head`` holds newlines only (not known yet)."""
    i, n = 0, len(head)
    while i < n and head[i] in (10, 13):
        i += 1
    return None if i == n else head[i] in (32, 9, 62)


def paste_indent(head: bytes) -> str | None:
    r"""The prefix every non-blank line of a pasted block shares, or None.

    A log pasted into a GitHub comment as an indented code block, or quoted in an e-mail or a
    markdown blockquote, has every line behind the same indent or ``> `` marks; read as it is, the
    first line is a record and every other line, indented, its continuation. ``head`` is the start of
    the stream (``DETECT_BYTES`` of it, or all of a shorter one): when every non-blank line of it (the
    cut-off last piece aside) begins with the same run of blanks and ``>`` marks, that run is the
    paste's indent, and the reader strips it from every line of the stream that begins with it. A
    line that is only marks (``>``) counts as blank. One decision per stream, from its head, so any
    chunking of the same bytes reads the same lines."""
    if not may_be_indented_paste(head):
        return None
    pieces = head.decode("utf-8", errors="replace").split("\n")
    if len(pieces) > 1 and not head.endswith(b"\n"):
        pieces = pieces[:-1]
    common: str | None = None
    for p in pieces:
        p = p.removesuffix("\r")
        m = _QUOTE_LEAD.match(p)
        lead = m.group(0) if m else ""
        if len(lead) == len(p):       # blank, or marks only
            continue
        common = lead if common is None else os.path.commonprefix([common, lead])
        if not common:
            return None
    return common or None


# `grep` over several log files (`grep -i xid /var/log/messages*`, `grep -r NVRM /var/log/`) puts each line behind its
# file's name and ":" (a context line of -A/-B/-C behind "-"; with -n the line number and ":"/"-" too): GNU grep
# src/grep.c print_line_head() prints the file name, then the separator, then the line. Read as it is, a kernel log
# so grepped has no time and no host. When most of a stream's head is such lines and a syslog, dmesg or ISO time header
# follows the name, the name is stripped from every line that carries one (a name with a "/" in it, or a log's own
# name: messages, syslog, kern.log, dmesg, *.log and their rotations); the rest is read as the line.
_GREP_PATH = (r"(?:(?:[\w.~+-]*/)+[\w.+-]+|(?:messages|syslog|kern\.log|kernel\.log|daemon\.log|user\.log|warn|localmessages"
              r"|dmesg|[\w.+-]+\.log)(?:[.-]\w+)*)")
_GREP_HEADER = (r"(?:<\d{1,3}>)?[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d|\[\s*\d+\.\d+\]|\[[A-Z][a-z]{2} [A-Z][a-z]{2} "
                r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
RE_GREP_LEAD = r"^" + _GREP_PATH + r"[:-](?:\d+[:-])?(" + _GREP_HEADER + r")"
_GREP_LEAD = re.compile(RE_GREP_LEAD)


def _head_lines(text: str) -> list[str]:
    """The lines of a stream's head, without a cut-off last piece (a head that ends in a newline has none)."""
    lines = text.splitlines()
    return lines[:-1] if len(lines) > 1 and not text.endswith(("\n", "\r")) else lines


def _is_grep_sample(sample: list[str]) -> bool:
    """At least half of ``sample`` (a head's non-blank lines) and one of its first three lines (a paste may open with
    its prompt line, not more) are `grep` output of log files (``RE_GREP_LEAD``)."""
    if not any(_GREP_LEAD.match(ln) for ln in sample[:3]):
        return False
    return sum(bool(_GREP_LEAD.match(ln)) for ln in sample) * 2 >= len(sample)


def grep_lead(head: bytes) -> bool:
    """Most of the head's lines (``_is_grep_sample`` over its first 40 non-blank ones) are `grep` output of log
    files: a file name, ":" or "-", then a syslog/dmesg/ISO time header (``RE_GREP_LEAD``). One decision per stream,
    from its head, so any chunking reads the same lines; format detection decides on the same sample rule."""
    text = head[:16384].decode("utf-8", errors="replace")
    return _is_grep_sample([ln for ln in _head_lines(text) if ln.strip()][:40])


def strip_grep_lead(text: pl.Expr) -> pl.Expr:
    """``text`` without a grep file-name lead where one stands before a time header (``grep_lead``)."""
    return text.str.replace(RE_GREP_LEAD, "${1}")


# Hard-wrapped pastes (issue 13: "a line wrapped in the middle of SeqNum=..."). A log copied out of a terminal
# multiplexer's scrollback, a CI log viewer, an e-mail or a notebook cell keeps the terminal's wrap: every line longer
# than the terminal is cut into pieces of exactly its width, and the pieces read as lines of their own (a rule sees
# "OpTy" and "pe=BROADCAST", the kernel reader a line without its prefix). The width is decided once per stream from
# its head: its longest line, when that is 60-400 characters and at least two different lines of that length end in a
# character that is not a blank (one long line is what every excerpt has; a wrap cuts every long line), and two of
# them go on in the next line by the test below (a program's longest lines, two of one template, do not). A line of
# exactly that width is joined with the next where the cut can only be inside a line: a letter, digit or "_" (or one
# blank after a word) before it, and after it a lower-case letter, a digit, "_" or the punctuation that goes on an
# expression — never a blank, a capital, "[", "<", "|" or "+" — and the next line cannot be a record of its own: it
# does not start with a date or clock time, a known program's "tag:", a "key:  value" row, a separator run, the lead
# of this line or of a line that starts a record elsewhere in the head, nor with a field aligned at this line's
# column (a table's rows).
# A wrap that fell elsewhere (before a capital or a blank) stays two lines: a missed join costs little, a false one
# merges two records.
WRAP_MIN, WRAP_MAX = 60, 400
_WRAP_NOT_NEXT = (r"^(?:(?:kernel|slurm(?:stepd|d|ctld|dbd)|srun|sbatch|salloc|systemd(?:-oomd)?|oom_reaper|earlyoom|"
                  r"nvidia-smi|dcgmi|nv-hostengine|nvidia-(?:persistenced|fabricmanager)|mlx5_core|bash|sh|python\d*|"
                  r"wandb|torchrun|deepspeed|mpirun|orterun)(?:\[\d+\])?:(?:\s|$)|[\w.-]+:\s{2,}\S|--|={3}|_{3}|\.{3}"
                  r"|\d{4}-\d\d-\d\d|\d{1,2}:\d\d:\d\d|\d{9,}(?:\.\d+)?\s)")
_WRAP_WORD_END, _WRAP_WORD_START = r"(?:[A-Za-z0-9_]|[^\s] )$", r"^[a-z0-9_=,.;:/)}\]'\"%(-]"


@dataclass(frozen=True)
class WrapWidth:
    """A stream's terminal width and the leads of its head's record starts (``wrap_widths``)."""

    width: int
    leads: frozenset[str] = frozenset()


def _lead(t: pl.Expr) -> pl.Expr:
    """A line's lead: its first word with every run of digits as 0 ("gpu5:35917:35994" -> "gpu0:0:0")."""
    return t.str.extract(r"^(\S{1,32})").str.replace_all(r"\d+", "0")


def wrap_widths(df: pl.DataFrame, fid: str | None = None, head_bytes: int = 64 * 1024) -> dict[int, WrapWidth]:
    """The terminal width each stream of ``df`` (``lineno``, ``text``; streams told apart by ``fid``,
    key 0 without) was hard-wrapped at, from its first ``head_bytes`` of lines (see above), with the
    leads of the head's lines that follow a line shorter than the width (they start records: NCCL's
    "host:pid:tid", a logger's prefix; a line with one of them is never a piece); streams with no
    wrap are left out. Decided from the head alone, so any chunking of a stream reads it the same.
    The regular expressions run only on the lines of the width and the lines after them (and on the
    heads of the streams that still look wrapped then): a fleet's files cost a length and a sum."""
    if df.height < 2:
        return {}
    fcol = pl.col(fid) if fid else pl.lit(0, pl.Int64)
    t = pl.col("text")
    h = (df.head(4096) if not fid else df.filter(pl.col("lineno") <= 4096)).select(
        fcol.cast(pl.Int64).alias("__f"), "text", t.str.len_chars().alias("__l"),
        (t.str.len_bytes() + 1).cum_sum().over(fcol).alias("__b"))
    h = h.filter(pl.col("__b") <= head_bytes)
    top = h.group_by("__f").agg(pl.col("__l").max().alias("__w"), pl.len().alias("__n"))
    top = top.filter(pl.col("__w").is_between(WRAP_MIN, WRAP_MAX) & (pl.col("__n") >= 2))
    if top.height == 0:
        return {}
    h = h.join(top.select("__f", "__w"), on="__f", maintain_order="left")
    at = (h.filter(pl.col("__l") == pl.col("__w")).filter(~t.str.contains(r"\s$"))
          .group_by("__f").agg(pl.col("__w").first(), t.n_unique().alias("__k")).filter(pl.col("__k") >= 2))
    if at.height == 0:
        return {}
    h = h.filter(pl.col("__f").is_in(at["__f"].implode())).select("__f", "text", "__l", "__w")

    def joins(wraps: dict[int, WrapWidth], rows: pl.DataFrame) -> dict[int, int]:
        m = _join_mask(rows.select("__f", "text"), wraps, "__f")
        return dict(rows.select("__f").with_columns(m.alias("__j")).group_by("__f").agg(pl.col("__j").sum()).iter_rows())

    # a wrap shows itself in the head: at least two of its pieces go on in the next line (a program's log whose
    # longest lines are two of one template has none); first without the leads (an upper bound), then with them
    bare = {int(f): WrapWidth(int(w)) for f, w, _ in at.iter_rows()}
    keep = [f for f, n in joins(bare, h).items() if n >= 2]
    if not keep:
        return {}
    h = h.filter(pl.col("__f").is_in(keep))
    sure = (pl.col("__l").shift(1).over("__f") != pl.col("__w")).fill_null(True)
    leads = (h.filter(sure).select("__f", _lead(t).alias("__lead")).drop_nulls().unique()
             .group_by("__f").agg(pl.col("__lead")))
    got = {int(f): frozenset(ls) for f, ls in leads.iter_rows()}
    cand = {f: WrapWidth(bare[f].width, got.get(f, frozenset())) for f in keep}
    return {f: cand[f] for f, n in joins(cand, h).items() if n >= 2}


def _join_mask(df: pl.DataFrame, wraps: dict[int, WrapWidth], fid: str | None) -> pl.Series:
    """Per line of ``df``: it is a piece that goes on in the next line (see the comment above). Only
    the lines of their stream's width (and the lines after them) are tested."""
    fcol = pl.col(fid) if fid else pl.lit(0, pl.Int64)
    keys = list(wraps)
    x = df.select(fcol.cast(pl.Int64).alias("__f"), "text").with_row_index("__i")
    x = x.with_columns(pl.col("__f").replace_strict(keys, [w.width for w in wraps.values()], default=None,
                                                    return_dtype=pl.Int64).alias("__w"),
                       pl.col("text").shift(-1).alias("__n"), pl.col("__f").shift(-1).alias("__nf"))
    t, nxt = pl.col("text"), pl.col("__n")
    c = x.filter((t.str.len_chars() == pl.col("__w")) & (pl.col("__nf") == pl.col("__f")))
    c = c.filter(t.str.contains(_WRAP_WORD_END) & nxt.str.contains(_WRAP_WORD_START) & ~nxt.str.contains(_WRAP_NOT_NEXT))
    if c.height:
        # a table's rows: a field aligned at the same column after a run of blanks (lm-sensors, sacct, nvidia-smi -q)
        col = r"^(\S[^\n]*?\s{2,})\S"
        c = c.with_columns(_lead(nxt).alias("__lead"))
        c = c.filter((pl.col("__lead") != _lead(t)).fill_null(True)
                     & (nxt.str.extract(col).str.len_chars() != t.str.extract(col).str.len_chars()).fill_null(True))
    if c.height and any(w.leads for w in wraps.values()):
        known = pl.DataFrame({"__f": [f for f, w in wraps.items() for _ in w.leads],
                              "__lead": [ld for w in wraps.values() for ld in w.leads]},
                             schema={"__f": pl.Int64, "__lead": pl.String})
        c = c.join(known, on=["__f", "__lead"], how="anti")
    mask = pl.repeat(False, df.height, dtype=pl.Boolean, eager=True).alias("j")
    return mask.scatter(c["__i"].cast(pl.Int64), True) if c.height else mask


def join_wraps(df: pl.DataFrame, wraps: dict[int, WrapWidth], fid: str | None = None) -> pl.DataFrame:
    """``df`` (``lineno``, ``text``, one stream's lines in order, or many streams' told apart by ``fid``)
    with each hard-wrapped line's pieces joined back into one line (the first piece's ``lineno``).
    ``wraps``: each stream's :func:`wrap_widths` (by ``fid`` value; key 0 without ``fid``)."""
    if not wraps or df.height < 2:
        return df
    if fid and len(wraps) < df[fid].n_unique():     # only the wrapped streams' lines are looked at
        hit = pl.col(fid).is_in(list(wraps))
        wrapped = join_wraps(df.filter(hit), wraps, fid)
        return pl.concat([df.filter(~hit), wrapped]).sort([fid, "lineno"], maintain_order=True)
    j = _join_mask(df, wraps, fid)
    if not j.any():
        return df
    cols = df.columns
    return (df.with_columns((~j.shift(1, fill_value=False)).cum_sum().alias("__g"))
            .group_by("__g", maintain_order=True)
            .agg(*[pl.col(c).first() for c in cols if c != "text"], pl.col("text").str.join(""))
            .select(cols))


def strip_paste_indent(text: pl.Expr, indent: pl.Expr | str) -> pl.Expr:
    """``text`` without a paste's ``indent`` (``paste_indent``); a line that is only the indent's marks
    (a quote's blank line, ``>``) is blank, as ``paste_indent`` counted it."""
    ind = pl.lit(indent) if isinstance(indent, str) else indent
    return (pl.when(text == ind.str.strip_chars_end(" \t")).then(pl.lit(""))
            .otherwise(text.str.strip_prefix(ind)))


def _after(t: pl.Expr, regex: str) -> pl.Expr:
    """The text after the match of ``regex`` (null where it does not match)."""
    return t.str.strip_prefix(t.str.extract(regex, 0))


@dataclass(frozen=True)
class ParseContext:
    """What a parser needs besides the lines: the file's defaults."""

    file: str
    year: int
    tz: str = "UTC"
    boot_time_ns: int | None = None
    boot_inferred: bool = False
    host_fields: tuple[str, ...] = ("host", "hostname", "host.name", "_HOSTNAME")
    # when the year was guessed from the file's mtime: a yearless time more than 2 days after it
    # belongs to the year before (a December line in a file written in January)
    rollover_after_ns: int | None = None
    # many files parsed as one frame (``read_many``): the per-file values above come from the
    # columns ``_year`` (String), ``_roll`` (Int64), ``_fkind`` (String), ``_boot`` (Int64) and
    # ``_binf`` (Boolean) of the lines frame instead; ``_fid`` (the file's index) is kept
    columns: bool = False
    # False: the line's own host is never used (the caller names the host, or the path does for job
    # output, where the path wins); job lines then skip extracting it. In ``columns`` mode a
    # ``_phost`` column (the path's host per row) is honoured the same way.
    line_host: bool = True


def _mask(df: pl.DataFrame, expr: pl.Expr) -> pl.Series:
    return df.select(expr.fill_null(False)).to_series()


def _year(ctx: ParseContext) -> pl.Expr:
    return pl.col("_year") if ctx.columns else pl.lit(str(ctx.year))


def _file_kind(ctx: ParseContext, default: str | None) -> pl.Expr:
    if ctx.columns:
        return pl.col("_fkind").fill_null(pl.lit(default, pl.String))
    return pl.lit(file_source_kind(ctx.file) or default, pl.String)


def file_source_kind(path: str) -> str | None:
    """SourceKind implied by a file name (Slurm daemon logs), or None."""
    return SourceKind.SLURM.value if _SLURM_FILE.search(PurePath(path).name) else None


def _short_host_rows(col: pl.Expr) -> pl.Expr:
    c = col.str.strip_chars()
    return (pl.when(c.is_null() | c.eq("") | c.eq("-")).then(pl.lit(None, pl.String))
            .when(c.str.contains(RE_IPV4)).then(c)
            .otherwise(c.str.replace(r"^([^.]+)\..*$", "${1}")))


def _short_host_distinct(s: pl.Series) -> pl.Series:
    """A column has a handful of distinct host names: normalise those, then map the column (a
    hash lookup per row instead of three string passes)."""
    keys = s.cast(pl.String).drop_nulls().unique()
    if keys.len() * 4 > s.len():      # mostly distinct: row by row is as cheap
        return pl.DataFrame({"h": s.cast(pl.String)}).select(_short_host_rows(pl.col("h"))).to_series().alias(s.name)
    vals = pl.DataFrame({"h": keys}).select(_short_host_rows(pl.col("h"))).to_series()
    return s.cast(pl.String).replace_strict(keys, vals, default=None, return_dtype=pl.String).alias(s.name)


def short_host(col: pl.Expr) -> pl.Expr:
    """FQDN -> short host name (as Slurm knows it); IPv4 addresses and nulls kept as they are."""
    return col.map_batches(_short_host_distinct, return_dtype=pl.String)


def naive_to_utc_ns(dt: pl.Expr, tz: str) -> pl.Expr:
    """A naive Datetime expression read in ``tz`` -> Int64 ns UTC (null for times that do not exist)."""
    if tz.upper() == "UTC":
        return dt.dt.epoch("ns")
    return dt.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null").dt.epoch("ns")


def _yearless(dt: pl.Expr, ctx: ParseContext) -> pl.Expr:
    """ns UTC of a naive datetime parsed with ``ctx.year``, rolled back a year when past the mtime."""
    ns = naive_to_utc_ns(dt, ctx.tz)
    if ctx.columns:
        roll = pl.col("_roll")
        return pl.when(roll.is_not_null() & (ns > roll)).then(
            naive_to_utc_ns(dt.dt.offset_by("-1y"), ctx.tz)).otherwise(ns)
    if ctx.rollover_after_ns is None:
        return ns
    prev = naive_to_utc_ns(dt.dt.offset_by("-1y"), ctx.tz)
    return pl.when(ns > ctx.rollover_after_ns).then(prev).otherwise(ns)


def _program_source(program: pl.Expr, message: pl.Expr, file_kind: pl.Expr) -> pl.Expr:
    p = program.str.to_lowercase()
    e = (pl.when(p.eq("kernel") | message.str.starts_with("NVRM:")).then(pl.lit(SourceKind.KERNEL.value))
         .when(p.is_in(list(SLURM_DAEMONS))).then(pl.lit(SourceKind.SLURM.value)))
    return e.otherwise(file_kind)


def _base_cols(df: pl.DataFrame) -> pl.DataFrame:
    """The columns every parser returns, with defaults, in a fixed order."""
    defaults = {"ts": pl.Int64, "ts_inferred": pl.Boolean, "has_ts": pl.Boolean, "header": pl.Boolean,
                "malformed": pl.Boolean, "host": pl.String, "job_id": pl.String, "source": pl.String,
                "rank": pl.Int32, "stream_id": pl.String, "message": pl.String, "level": pl.String}
    cols = [pl.col("lineno"), pl.col("text")]
    for name, dtype in defaults.items():
        if name in df.columns:
            cols.append(pl.col(name).cast(dtype))
        elif dtype == pl.Boolean:
            cols.append(pl.lit(False).alias(name))
        else:
            cols.append(pl.lit(None, dtype).alias(name))
    extra = [c for c in ("body", "nvrm", "bad_utf8", "_fid") if c in df.columns]
    return df.select(cols + [pl.col(c) for c in extra])


# --- syslog ------------------------------------------------------------------------------------
def parse_syslog(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    """RFC5424, RFC3164 and rsyslog ISO lines (mixed in one file is fine)."""
    t = pl.col("text")
    # Each header regex runs only on the lines whose first bytes can start it (a capture-free test);
    # group 1 of each wrapped regex is the whole header, so the message needs no second regex pass.
    df = lines
    for key, regex, test in (("a", RE_5424, r"^<\d{1,3}>1 "), ("b", RE_3164, r"^(?:<\d{1,3}>)?[A-Z][a-z]{2} "),
                             ("c", RE_ISOSYSLOG, r"^\d{4}-\d{2}-\d{2}T")):
        df = _on_rows(df, _mask(df, t.str.contains(test)), functools.partial(_syslog_header, key, regex, ctx))
    df = df.with_columns(pl.col("_is_a", "_is_b", "_is_c").fill_null(False))
    is_a, is_b, is_c = pl.col("_is_a"), pl.col("_is_b"), pl.col("_is_c")
    host = pl.when(is_a).then(pl.col("_h_a")).when(is_b).then(pl.col("_h_b")).when(is_c).then(pl.col("_h_c"))
    prog = pl.when(is_a).then(pl.col("_p_a")).when(is_b).then(pl.col("_p_b")).when(is_c).then(pl.col("_p_c"))
    header = pl.coalesce("_hdr_a", "_hdr_b", "_hdr_c")
    raw_msg = t.str.strip_prefix(header)
    df = df.with_columns(
        header=is_a | is_b | is_c,
        has_ts=pl.lit(True),
        ts=pl.when(is_a).then(pl.col("_ts_a")).when(is_b).then(pl.col("_ts_b")).when(is_c).then(pl.col("_ts_c")),
        host=short_host(host),
        job_id=pl.col("_sd").str.extract(RE_SD_JOB, 1),
        prog=prog,
        message=pl.when(is_a | is_b | is_c).then(raw_msg.str.replace(RE_UPTIME_PREFIX, "")).otherwise(t),
    )
    # the PRI, where the line carries one (read only on the lines that start with one: most have none)
    df = _on_rows(df, _mask(df, (is_a | is_b) & t.str.starts_with("<")), {"level": pri_level_expr(t)})
    # a line that is not a header but is indented is a continuation, not a bad timestamp
    df = df.with_columns(has_ts=pl.col("header") | ~t.str.contains(r"^\s")).with_columns(
        source=_program_source(pl.col("prog"), pl.col("message"), _file_kind(ctx, SourceKind.OTHER.value)),
        nvrm=pl.col("message").str.starts_with("NVRM: "),
        body=pl.col("message"))
    return _base_cols(df)


def _syslog_header(key: str, regex: str, ctx: ParseContext, lines: pl.DataFrame) -> pl.DataFrame:
    """One syslog header variant's columns (``_is_<key>``, ``_hdr_<key>``, ``_ts_<key>``, host, program)."""
    if key == "b":
        g = lines.select(_rfc3164(lines["text"]).alias("_g"), *(
            [pl.col("_year"), pl.col("_roll")] if ctx.columns else []))
    else:
        g = lines.select(pl.col("text").str.extract_groups("^(" + regex[1:] + ")").alias("_g"))

    def f(i: int) -> pl.Expr:
        return pl.col("_g").struct.field(str(i + 1))

    if key == "a":
        return g.select(_is_a=f(2).is_not_null(), _hdr_a=f(0), _ts_a=rfc3339_ns(f(2)), _h_a=f(3), _p_a=f(4),
                        _sd=f(7))
    if key == "b":
        b_str = pl.concat_str([_year(ctx), f(1), f(2).str.zfill(2), f(3)], separator=" ")
        b_dt = b_str.str.strptime(pl.Datetime("us"), "%Y %b %d %H:%M:%S", strict=False)
        return g.select(_is_b=f(1).is_not_null(), _hdr_b=f(0), _ts_b=_yearless(b_dt, ctx) + _frac_ns(f(4)),
                        _h_b=f(5), _p_b=f(6))
    return g.select(_is_c=f(1).is_not_null(), _hdr_c=f(0), _ts_c=rfc3339_ns(f(1)), _h_c=f(2), _p_c=f(3))


def _rfc3164(text: pl.Series) -> pl.Series:
    r"""``RE_3164``'s groups (wrapped: group 1 is the whole header) of each line, as a struct.

    The usual line (``Nov 29 14:00:01 gpu-n001 kernel: ...``) names its host: ``RE_3164_HOST``
    captures it. Where that regex finds no header, or a "host" ending in ':' (``Nov 29 14:00:01
    kernel: NVRM: ...`` has none: RE_3164 then takes ``kernel`` as the program), RE_3164 itself runs,
    on those lines only. When RE_3164_HOST matches with a host not ending in ':', RE_3164's groups are
    the same: both are anchored and identical up to the host; RE_3164's optional host
    ``(\S*[^\s:]) `` is greedy and is tried first, and it can only be the whole first token (no
    spaces in it, a space after it), which it is when that token does not end in ':'; the rest of
    both regexes is the same."""
    g = text.str.extract_groups("^(" + RE_3164_HOST[1:] + ")")
    host = g.struct.field("6")
    slow = (g.struct.field("1").is_null() | host.str.ends_with(":")).fill_null(True)
    k = int(slow.sum())
    if k == 0:
        return g
    full = text.filter(slow).str.extract_groups("^(" + RE_3164[1:] + ")")
    if k == g.len():
        return full
    idx = slow.arg_true()      # (a struct Series has no scatter: field by field)
    names = g.struct.fields
    return pl.DataFrame([g.struct.field(n).scatter(idx, full.struct.field(n)) for n in names]).to_struct(g.name)


# --- dmesg -------------------------------------------------------------------------------------
def parse_dmesg(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    """``[12345.678901] msg`` (needs a boot time) and ``dmesg -T`` ``[Sun Nov 29 14:06:00 2026] msg``."""
    t = pl.col("text")
    lines = lines.with_columns(_r=t.str.extract_groups(RE_DMESG), _a=t.str.extract_groups(RE_DMESG_T))
    rf, af = (lambda i: pl.col("_r").struct.field(str(i))), (lambda i: pl.col("_a").struct.field(str(i)))
    is_r, is_a = rf(1).is_not_null(), af(1).is_not_null()
    up_ns = rf(1).cast(pl.Int64, strict=False) * 1_000_000_000 + _frac_ns(rf(2))
    boot = ctx.boot_time_ns
    boot_e = pl.col("_boot") if ctx.columns else pl.lit(boot, pl.Int64) if boot is not None else None
    inferred = (pl.col("_binf") | pl.col("_boot").is_null()) if ctx.columns else pl.lit(
        ctx.boot_inferred or boot is None)
    a_dt = af(1).str.replace_all(" +", " ").str.strptime(pl.Datetime("us"), "%a %b %d %H:%M:%S %Y", strict=False)
    ts = (pl.when(is_r).then(up_ns + boot_e if boot_e is not None else pl.lit(None, pl.Int64))
          .when(is_a).then(naive_to_utc_ns(a_dt, ctx.tz)))
    msg = pl.when(is_r).then(_after(t, RE_DMESG)).when(is_a).then(_after(t, RE_DMESG_T)).otherwise(t)
    df = lines.with_columns(
        header=is_r | is_a, ts=ts, message=msg,
        ts_inferred=is_r & inferred,
    ).with_columns(
        has_ts=pl.col("header") | ~t.str.contains(r"^\s"),
        source=pl.lit(SourceKind.KERNEL.value),
        nvrm=pl.col("message").str.starts_with("NVRM: "),
        body=pl.col("message"))
    return _base_cols(df)


# --- job output --------------------------------------------------------------------------------
def _rewrite(lines: pl.DataFrame, t: pl.Expr, test: pl.Expr, text: pl.Expr,
             extra: dict[str, pl.Expr] | None = None) -> tuple[pl.DataFrame, pl.Expr]:
    """One layer of a job line taken off: on the rows ``test`` admits, ``_ltext`` becomes ``text`` (and
    ``extra``'s columns are added); every other row keeps the text the earlier layers left (``t``). Returns the
    frame and the expression of the line's text from here on."""
    mask = _mask(lines, test)
    if not mask.any():
        return lines, t
    lines = _on_rows(lines, mask, {"__rw": text, **(extra or {})})
    return lines.with_columns(_ltext=pl.coalesce(pl.col("__rw"), t)).drop("__rw"), pl.col("_ltext")


def parse_job(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    """Job stdout/stderr: optional rank prefix, then glog / Python-logging / ISO time or none."""
    t = pl.col("text")
    # a container runtime's CRI prefix first (RE_CRI): its time is the line's, the rest is read as the line
    lines, t = _rewrite(lines, t, t.str.contains(RE_CRI), t.str.replace(RE_CRI, ""),
                        {"_cri_ns": rfc3339_ns(t.str.extract(RE_CRI, 1))})
    # ANSI colour codes anywhere in the line (a memchr test for ESC admits the lines)
    lines, t = _rewrite(lines, t, t.str.contains("\x1b", literal=True), t.str.replace_all(RE_ANSI, ""))
    # Docker Compose's container-name column (RE_COMPOSE)
    lines, t = _rewrite(lines, t, t.str.contains(RE_COMPOSE), t.str.replace(RE_COMPOSE, ""))
    # a pdsh/clush host label first (RE_HOST_LABEL): the rest of the line is read as if it stood alone
    lh = t.str.extract(RE_HOST_LABEL, 1)
    is_host = ~lh.str.contains(RE_NOT_HOST)
    lines, t = _rewrite(lines, t, t.str.contains(RE_HOST_LABEL), pl.when(is_host).then(t.str.replace(RE_HOST_LABEL, "")),
                        {"_lhost": pl.when(is_host).then(lh)})
    # a launcher's wrapper (RE_WRAP: Ray/vLLM worker, mpirun --tag-output, torchrun --tee)
    wg = t.str.extract_groups(RE_WRAP)
    wf = lambda i: wg.struct.field(str(i))  # noqa: E731
    rest = t.str.replace(RE_WRAP, "").str.replace(RE_RAY_REPEAT, "")
    lines, t = _rewrite(lines, t, t.str.contains(RE_WRAP_TEST) & ~t.str.starts_with("[rank"),
                        pl.when(t.str.contains(RE_WRAP)).then(rest),
                        {"_wrank": pl.coalesce(wf(1), wf(3), wf(4)).cast(pl.Int32, strict=False), "_wip": wf(2)})
    if "_wip" in lines.columns:   # the wrapper's address is the line's host label where it has none
        lines = lines.with_columns(
            _lhost=pl.coalesce(*(["_lhost"] if "_lhost" in lines.columns else []), "_wip")).drop("_wip")
    # the rank prefix, the glog and ISO times and the NCCL host are extracted only on the lines a
    # capture-free test admits (most job lines have no time, many no rank prefix)
    rk = t.str.extract_groups(RE_RANK)
    df = _on_rows(lines, _mask(lines, t.str.contains(RE_RANK)), {
        "rank": pl.coalesce(rk.struct.field("1"), rk.struct.field("2")).cast(pl.Int32, strict=False),
        "_body": t.str.replace(RE_RANK, "")})
    df = df.with_columns(body=pl.coalesce(pl.col("_body"), t)).drop("_body")
    if "_wrank" in df.columns:
        df = df.with_columns(rank=pl.coalesce("rank", "_wrank"))
    b = pl.col("body")
    df = df.with_columns(_is_g=b.str.contains(RE_GLOG).fill_null(False),
                         _is_i=b.str.contains(RE_ISO_LEAD).fill_null(False),
                         _is_h=b.str.contains(RE_JOB_HEAD).fill_null(False))
    df = _on_rows(df, df["_is_g"], functools.partial(_glog_ns, ctx))
    df = _on_rows(df, df["_is_i"], functools.partial(_iso_ns, ctx))
    need_host = b.str.contains("] NCCL ", literal=True)
    if ctx.columns and "_phost" in df.columns:
        need_host = need_host & pl.col("_phost").is_null()
    if ctx.line_host:
        df = _on_rows(df, _mask(df, need_host), {"host": short_host(b.str.extract(RE_NCCL_HOST, 1))})
        if "_lhost" in df.columns:   # the line's own NCCL host first, else its label's
            keep = pl.col("_lhost").is_not_null() & pl.col("host").is_null()
            if ctx.columns and "_phost" in df.columns:
                keep = keep & pl.col("_phost").is_null()
            df = _on_rows(df, _mask(df, keep), {"_lh": short_host(pl.col("_lhost"))})
            df = df.with_columns(host=pl.coalesce("host", "_lh")).drop("_lh")
    else:
        df = df.with_columns(host=pl.lit(None, pl.String))
    is_g, is_i = pl.col("_is_g"), pl.col("_is_i")
    file_kind = _file_kind(ctx, SourceKind.JOB.value)
    # a collector's bare RFC3339 stamp in front of the line (RE_TS_PREFIX: kubectl logs --timestamps, docker logs -t)
    # is not part of the message: the time is read into ``ts`` and a rule anchored at the message's start sees what
    # the program wrote. A program's own time (Python logging, Megatron's "[time]", glog) stays in its message.
    df = _on_rows(df, df["_is_i"], {"_nots": pl.when(b.str.contains(RE_TS_PREFIX)).then(b.str.replace(RE_TS_PREFIX, ""))})
    msg = pl.coalesce(pl.col("_nots"), b)
    ts: pl.Expr = pl.when(is_g).then(pl.col("_g_ns")).when(is_i).then(pl.col("_i_ns"))
    has_ts = is_g | is_i
    if "_cri_ns" in df.columns:     # the runtime's time of the line (UTC, to the ns) before the program's own
        ts = pl.coalesce(pl.col("_cri_ns"), ts)
        has_ts = has_ts | pl.col("_cri_ns").is_not_null()
    df = df.with_columns(
        has_ts=has_ts,
        ts=ts,
        message=msg,
        header=is_g | is_i | pl.col("_is_h"),
        source=file_kind,
        nvrm=pl.lit(False),
    )
    return _base_cols(df)


def _glog_ns(ctx: ParseContext, d: pl.DataFrame) -> pl.DataFrame:
    """``_g_ns``: the glog time of each row of ``d`` (its ``body``), ns UTC."""
    g = d.select(pl.col("body").str.extract_groups(RE_GLOG).alias("_g"),
                 *([pl.col("_year"), pl.col("_roll")] if ctx.columns else []))
    gf = lambda i: pl.col("_g").struct.field(str(i))  # noqa: E731
    g_str = pl.concat_str([_year(ctx), gf(2), gf(3), gf(4)], separator=" ")
    return g.select(_g_ns=_yearless(g_str.str.strptime(pl.Datetime("us"), "%Y %m %d %H:%M:%S", strict=False), ctx)
                    + _frac_ns(gf(5)))


def _iso_ns(ctx: ParseContext, d: pl.DataFrame) -> pl.DataFrame:
    """``_i_ns``: the leading ISO time of each row of ``d`` (its ``body``), ns UTC."""
    g = d.select(pl.col("body").str.extract_groups(RE_ISO_LEAD).alias("_iso"))
    i_time, i_zone = pl.col("_iso").struct.field("1"), pl.col("_iso").struct.field("2")
    i_ns_utc = rfc3339_ns(pl.concat_str([i_time, i_zone.fill_null("")]))
    if ctx.tz.upper() == "UTC":
        return g.select(_i_ns=i_ns_utc)
    i_dt = i_time.str.replace(",", ".").str.replace("T", " ").str.strptime(
        pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
    return g.select(_i_ns=pl.when(i_zone.is_not_null()).then(i_ns_utc).otherwise(naive_to_utc_ns(i_dt, ctx.tz)))


# --- JSON lines: VictoriaLogs and journald -----------------------------------------------------
VL_JOB_FIELDS = ("job_id", "job", "slurm_job_id", "meta.job_id")
VL_LEVEL_FIELDS = ("level", "PRIORITY")   # a record's declared level (sources.levels), where it has one
VL_SOURCE_FIELDS = ("unit", "app_name", "_TRANSPORT", "_SYSTEMD_UNIT", "SYSLOG_IDENTIFIER")


def json_fields(lines: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """Add one String column per key (missing = null) and ``valid`` (the line is a JSON object).

    Fast path: Polars' native NDJSON reader over the whole frame (values that are not strings, such
    as journald byte lists, come back as their JSON text). If any line in the frame is not a JSON
    object, that frame falls back to ``json.loads`` line by line."""
    schema = {k: pl.String for k in keys}
    if lines.height == 0:
        return pl.concat([lines, pl.DataFrame(schema={**schema, "valid": pl.Boolean})], how="horizontal")
    if lines.select(pl.col("text").str.strip_chars_start().str.starts_with("{").all()).item():
        try:
            blob = lines.select(pl.col("text").str.join("\n")).item().encode()
            dec = pl.read_ndjson(io.BytesIO(blob), schema=schema)
            if dec.height == lines.height:
                return pl.concat([lines, dec, pl.DataFrame({"valid": [True] * lines.height})], how="horizontal")
        except pl.exceptions.PolarsError:
            pass
    cols: dict[str, list] = {k: [] for k in keys}
    ok: list[bool] = []
    for line in lines["text"].to_list():
        try:
            obj = json.loads(line)
        except (ValueError, TypeError):
            obj = None
        good = isinstance(obj, dict)
        ok.append(good)
        for k in keys:
            v = obj.get(k) if good else None
            cols[k].append(v if v is None or isinstance(v, str) else json.dumps(v))
    extra = pl.DataFrame({**cols, "valid": ok}, schema={**{k: pl.String for k in keys}, "valid": pl.Boolean})
    return pl.concat([lines, extra], how="horizontal")


def _stream_label(key: str) -> pl.Expr:
    return pl.col("_stream").str.extract(r'[{,]' + re.escape(key) + r'="((?:[^"\\]|\\.)*)"', 1)


def vl_columns(host_fields: tuple[str, ...]) -> tuple[str, ...]:
    keys = ["_time", "_msg", "_stream", "_stream_id", "rank", *host_fields, *VL_JOB_FIELDS, *VL_SOURCE_FIELDS,
            *VL_LEVEL_FIELDS]
    return tuple(dict.fromkeys(keys))


def vl_frame_to_parsed(df: pl.DataFrame, host_fields: tuple[str, ...]) -> pl.DataFrame:
    """A frame of VictoriaLogs fields (String columns, missing = null) -> parsed-lines columns.

    Needs ``lineno`` and ``text`` (the raw record, kept for quarantine) and ``valid`` (Boolean: the
    record was a JSON object)."""
    for k in vl_columns(host_fields):
        if k not in df.columns:
            df = df.with_columns(pl.lit(None, pl.String).alias(k))
    direct = {"_host": pl.coalesce([pl.col(k) for k in host_fields]),
              "_job": pl.coalesce([pl.col(k) for k in VL_JOB_FIELDS]),
              "_src": pl.coalesce([pl.col(k) for k in VL_SOURCE_FIELDS])}
    df = df.with_columns(**direct)
    # `_stream` labels only where a field is missing from the row (regex work only where needed)
    need = (pl.col("_host").is_null() | pl.col("_job").is_null() | pl.col("_src").is_null()) & pl.col(
        "_stream").is_not_null()
    if df.select(need.any()).item():
        df = df.with_columns(
            _host=pl.when(need).then(pl.coalesce(pl.col("_host"), *[_stream_label(k) for k in host_fields]))
            .otherwise(pl.col("_host")),
            _job=pl.when(need).then(pl.coalesce(pl.col("_job"), *[_stream_label(k) for k in VL_JOB_FIELDS]))
            .otherwise(pl.col("_job")),
            _src=pl.when(need).then(pl.coalesce(pl.col("_src"), *[_stream_label(k) for k in VL_SOURCE_FIELDS]))
            .otherwise(pl.col("_src")))
    host, job, src = pl.col("_host"), pl.col("_job"), pl.col("_src")
    msg = pl.col("_msg").fill_null("")
    rk = msg.str.extract(r"^\[rank(\d+)\]:", 1)
    df = df.with_columns(ts=rfc3339_ns(pl.col("_time")),     # materialised once, used twice below
                         rank=pl.coalesce(pl.col("rank").cast(pl.Int32, strict=False), rk.cast(pl.Int32, strict=False)))
    ts, rank = pl.col("ts"), pl.col("rank")
    s = src.str.to_lowercase()
    source = (pl.when(s.eq("kernel") | msg.str.starts_with("NVRM:")).then(pl.lit(SourceKind.KERNEL.value))
              .when(s.str.replace(r"\.service$", "").is_in(list(SLURM_DAEMONS))).then(pl.lit(SourceKind.SLURM.value))
              .when(job.is_not_null() | rank.is_not_null()).then(pl.lit(SourceKind.JOB.value))
              .when(pl.col("_TRANSPORT").is_not_null()).then(pl.lit(SourceKind.JOURNALD.value))
              .otherwise(pl.lit(SourceKind.OTHER.value)))
    out = df.with_columns(
        has_ts=pl.lit(True), header=pl.lit(True),
        malformed=~pl.col("valid") | pl.col("_time").is_null() | ts.is_null(),
        host=short_host(host), job_id=job, source=source,
        stream_id=pl.col("_stream_id"),
        level=level_expr(pl.coalesce([pl.col(k) for k in VL_LEVEL_FIELDS])),
        message=pl.when(rk.is_not_null()).then(msg.str.replace(r"^\[rank\d+\]:\s?", "")).otherwise(msg),
        nvrm=pl.lit(False),
    )
    return _base_cols(out)


def parse_vl_jsonl(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    df = json_fields(lines.filter(pl.col("text").str.strip_chars() != ""), vl_columns(ctx.host_fields))
    return vl_frame_to_parsed(df, ctx.host_fields)


def parse_journald(lines: pl.DataFrame, ctx: ParseContext) -> pl.DataFrame:
    """``journalctl -o json``: one JSON object per line."""
    keys = ("__REALTIME_TIMESTAMP", "MESSAGE", "_HOSTNAME", "SYSLOG_IDENTIFIER", "_TRANSPORT",
            "_SYSTEMD_UNIT", "_COMM", "PRIORITY")
    df = json_fields(lines.filter(pl.col("text").str.strip_chars() != ""), keys)
    m = pl.col("MESSAGE")
    as_bytes = m.str.starts_with("[")
    msg = pl.when(as_bytes).then(
        m.map_elements(_decode_byte_list, return_dtype=pl.String)).otherwise(m)
    us = pl.col("__REALTIME_TIMESTAMP").cast(pl.Int64, strict=False)
    ident = pl.coalesce(pl.col("SYSLOG_IDENTIFIER"), pl.col("_COMM"), pl.col("_SYSTEMD_UNIT")).str.replace(
        r"\.service$", "")
    kind = (pl.when(pl.col("_TRANSPORT").eq("kernel") | ident.eq("kernel")).then(pl.lit(SourceKind.KERNEL.value))
            .when(ident.is_in(list(SLURM_DAEMONS))).then(pl.lit(SourceKind.SLURM.value))
            .otherwise(pl.lit(SourceKind.JOURNALD.value)))
    bad = pl.when(as_bytes).then(m.map_elements(_byte_list_is_bad_utf8, return_dtype=pl.Boolean)).otherwise(False)
    df = df.with_columns(message=msg.fill_null(""), bad_utf8=bad.fill_null(False)).with_columns(
        ts=us * 1000, has_ts=pl.lit(True), header=pl.lit(True),
        malformed=~pl.col("valid") | us.is_null(),
        host=short_host(pl.col("_HOSTNAME")), source=kind, level=level_expr(pl.col("PRIORITY")),
        nvrm=pl.col("message").str.starts_with("NVRM: "), body=pl.col("message"),
    )
    return _base_cols(df)


def _byte_list_is_bad_utf8(v: str | None) -> bool:
    try:
        bytes(json.loads(v or "")).decode("utf-8")
    except UnicodeDecodeError:
        return True
    except (ValueError, TypeError):
        return False
    return False


def _decode_byte_list(v: str | None) -> str | None:
    # only for journald MESSAGE fields that are not valid UTF-8 (rare): a JSON list of byte values
    try:
        return bytes(json.loads(v or "")).decode("utf-8", errors="replace")
    except (ValueError, TypeError):
        return v


PARSERS = {"syslog": parse_syslog, "dmesg": parse_dmesg, "job": parse_job,
           "vl-jsonl": parse_vl_jsonl, "journald": parse_journald}


def parse_lines(lines: pl.DataFrame, fmt: str, ctx: ParseContext) -> pl.DataFrame:
    return PARSERS[fmt](lines, ctx)


# --- detection ---------------------------------------------------------------------------------
_R3164 = re.compile(r"^(?:<\d{1,3}>)?[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d+)? \S+ [^\s:\[]+(?:\[\d+\])?:")
_R5424 = re.compile(r"^<\d{1,3}>1 \S+ \S+ \S+")
_RISO = re.compile(RE_ISOSYSLOG)
_RDMESG = re.compile(r"^\[\s*\d+\.\d+\]|^\[[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}\]")
_SYSLOG_NAMES = re.compile(r"(kern\.log|syslog|messages)", re.I)
_DMESG_NAMES = re.compile(r"dmesg", re.I)


def detect_format(path: str, head: bytes) -> str:
    """Format of a file from its first KBs of content (gzip heads are inflated) and its name.

    Returns one of ``FORMATS``. Content wins over the name; the name decides ties and empty heads.
    """
    return _detect(path, head)[0]


def _clean(line: str) -> bool:
    """A line that can be evidence of a format when scanning past junk: long enough, no control
    bytes, no invalid UTF-8 (binary junk has short runs of printable bytes between newlines)."""
    return len(line) >= 16 and not any((ch < " " and ch != "\t") or ch == "\ufffd" for ch in line)


def _detect(path: str, head: bytes, strict: bool = False) -> tuple[str, bool]:
    """(format, decided by content) — False when only the name or the default decided."""
    name = PurePath(path).name.lower()
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, 1 << 16)
        except zlib.error:
            head = b""
        name = name.removesuffix(".gz")
    if head[:4] == b"PAR1" or name.endswith(".parquet"):
        return "parquet", True
    text = head.decode("utf-8", errors="replace")
    sample = [ln for ln in _head_lines(text) if ln.strip() and (not strict or _clean(ln))][:40]
    if _is_grep_sample(sample):
        sample = [_GREP_LEAD.sub(r"\1", ln) for ln in sample]     # grep output of log files (``grep_lead``)
    if sample:
        js = [ln for ln in sample if ln.lstrip().startswith("{")]
        if len(js) * 2 >= len(sample):
            other_json = parsed = False
            for ln in js:
                try:
                    obj = json.loads(ln)
                except ValueError:
                    continue
                parsed = True
                if isinstance(obj, dict):
                    if "__REALTIME_TIMESTAMP" in obj or "__CURSOR" in obj or "MESSAGE" in obj:
                        return "journald", True
                    if "_msg" in obj or "_time" in obj or "_stream" in obj:
                        return "vl-jsonl", True
                    other_json = True
            # an application's own JSON lines (slog/zap/structlog: "time", "msg", "level" ...) carry
            # none of VictoriaLogs' fields; read as VictoriaLogs every record would be quarantined,
            # so they are read as a job's text lines (the rules match inside the JSON text). Lines that
            # only start like JSON and none of which parses (a pasted record broken in two, a log line that
            # opens with "{") are text too: nothing says they are VictoriaLogs'.
            if other_json or (not parsed and not name.endswith((".jsonl", ".ndjson"))):
                return "job", True
            return "vl-jsonl", True
        n = len(sample)
        sys_hits = sum(bool(_R3164.match(s) or _R5424.match(s) or _RISO.match(s)) for s in sample)
        dm_hits = sum(bool(_RDMESG.match(s)) for s in sample)
        if sys_hits * 2 >= n and sys_hits >= dm_hits:
            return "syslog", True
        if dm_hits * 2 >= n:
            return "dmesg", True
    if name.endswith((".jsonl", ".ndjson")):
        return "vl-jsonl", False
    if not sample and _SYSLOG_NAMES.search(name):
        return "syslog", False
    if not sample and _DMESG_NAMES.search(name):
        return "dmesg", False
    return "job", any(_clean(ln) for ln in sample)     # junk-only heads decide nothing


DETECT_REGION = 64 * 1024
DETECT_SCAN_BYTES = 16 << 20


def detect_format_scan(path: str, data: bytes) -> str:
    """``detect_format`` region by region: when the first 64 KiB hold no recognisable line (binary
    junk, a corrupt head), the next regions (up to 16 MiB) are looked at, and the first one whose
    content decides names the format. ``data`` is plain (inflated) bytes."""
    fmt, strong = _detect(path, data[:DETECT_REGION])
    if strong or len(data) <= DETECT_REGION:
        return fmt
    off = DETECT_REGION
    end = min(len(data), DETECT_SCAN_BYTES)
    while off < end:
        region = data[off: off + DETECT_REGION]
        nl = region.find(b"\n")
        f, ok = _detect(path, region[nl + 1:] if nl >= 0 else region, strict=True)
        if ok:
            return f
        off += DETECT_REGION
    return fmt
