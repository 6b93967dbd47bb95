"""Which source may speak for which node or job. Pure.

A finding says "node N has fault F". Whether that can ground an action on N depends on who said
it. Every finding gets an ``authority`` (an integer, lower is stronger):

===========  =====  =========================================================================
authority    value  when
===========  =====  =========================================================================
``node``     0      the node speaks for itself: its kernel log / dmesg / journald / NVML agent /
                    slurmd, and the host on the record is the host the file belongs to (or the
                    file names no host: one syslog stream per node, a central syslog with its
                    own headers, VictoriaLogs streams whose ``host`` the shipper set)
``job``      1      a job's own output (source ``job``, or any format inside a file whose path
                    names a job: ``job-123/``, ``slurm-123.out``) about the node its file belongs
                    to (``job-123/gpu-n01.out``). It speaks for the job's ranks and, at most, for
                    nodes in the job's allocation: before a drain the remediator checks the node
                    against Slurm's view of the job (``scontrol show job`` / accounting); where
                    Slurm cannot say, the file's own host is accepted
``job-line`` 2      a job's output whose host comes only from the line (an NCCL ``host:pid:tid``
                    prefix in ``slurm-123.out``): a drain needs Slurm to confirm the node is in
                    the job's allocation; where Slurm cannot say, it is refused
``claim``    3      a line naming another host: a controller line about a subject node
                    (``Nodes gpu-n02 not responding``: the rule captured ``node``), or a record
                    whose host differs from the host its file belongs to (a job printing
                    kernel-style lines with ``gpu-n14`` in the header from ``job-1/gpu-n01.out``).
                    A claim is evidence to corroborate and never grounds for a drain on its own
===========  =====  =========================================================================

Attribution keeps the strongest authority of each (host, rule) aggregate. An incident whose
culprit has no ``node``- or ``job``-authority fault line of its own gets ``investigate`` instead of a
drain (``recovery_logs.attribution``); an incident whose culprit rests on ``job`` authority is
marked so, and the remediator checks the allocation (``recovery_logs.remediation.remediator``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import polars as pl

from recovery_logs.sources.read_common import DEFAULT_PATH_HOST_REGEX, DEFAULT_PATH_JOB_REGEX
from recovery_logs.sources.read_text import path_field

NODE, JOB, JOB_LINE, CLAIM = 0, 1, 2, 3
NAMES = {NODE: "node", JOB: "job", JOB_LINE: "job-line", CLAIM: "claim"}
JOB_SOURCE = "job"

__all__ = ["CLAIM", "JOB", "JOB_LINE", "NAMES", "NODE", "allocation_check", "authority", "file_owner"]


def file_owner(file: str | None) -> tuple[str | None, str | None]:
    """(host, job) the file belongs to, from its path (``nodes/gpu-n01/kern.log``, ``job-1/gpu-n01.out``)."""
    if not file or file == "detector" or file.startswith(("victorialogs:", "nvml", "sim")):
        return None, None
    host = path_field(file, DEFAULT_PATH_HOST_REGEX)
    job = path_field(file, DEFAULT_PATH_JOB_REGEX)
    return (host.split(".")[0] if host else None), job


def authority(findings: pl.DataFrame) -> pl.Series:
    """Int8 Series (``NODE``/``JOB``/``JOB_LINE``/``CLAIM``) for each finding (FINDING_SCHEMA)."""
    n = findings.height
    if n == 0:
        return pl.Series("authority", [], dtype=pl.Int8)
    files = findings["file"].unique().to_list()
    owners = {f: file_owner(f) for f in files}
    fh = pl.Series([owners[f][0] for f in files], dtype=pl.String)
    fj = pl.Series([owners[f][1] for f in files], dtype=pl.String)
    keys = pl.Series(files, dtype=pl.String)
    df = findings.select("file", "host", "source", "detail").with_columns(
        pl.col("file").replace_strict(keys, fh, default=None, return_dtype=pl.String).alias("_fh"),
        pl.col("file").replace_strict(keys, fj, default=None, return_dtype=pl.String).alias("_fj"))
    subject = pl.col("detail").str.json_path_match("$.node").is_not_null()
    other_host = pl.col("_fh").is_not_null() & pl.col("host").is_not_null() & (pl.col("host") != pl.col("_fh"))
    job_output = (pl.col("source") == JOB_SOURCE) | pl.col("_fj").is_not_null()
    expr = (pl.when(subject | other_host).then(pl.lit(CLAIM))
            .when(job_output & pl.col("_fh").is_not_null()).then(pl.lit(JOB))
            .when(job_output).then(pl.lit(JOB_LINE))
            .otherwise(pl.lit(NODE))).cast(pl.Int8)
    return df.select(expr.alias("authority"))["authority"]


def allocation_check(node: str, job_id: str | None,
                     allocation: Callable[[str], Iterable[str] | None] | None) -> tuple[bool | None, str]:
    """Is ``node`` in the allocation of ``job_id``? (True/False, why); None = Slurm could not say."""
    if job_id is None:
        return None, "no job id: the allocation cannot be checked"
    nodes = allocation(job_id) if allocation is not None else None
    if nodes is None:
        return None, f"Slurm does not know the allocation of job {job_id}"
    nodes = sorted(set(nodes))
    if node in nodes:
        return True, f"{node} is in job {job_id}'s allocation"
    return False, (f"the evidence against {node} comes only from job {job_id}'s output, and {node} is not in "
                   f"its allocation ({','.join(nodes) or 'none'})")
