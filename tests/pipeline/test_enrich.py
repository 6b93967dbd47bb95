"""Finding enrichment (pipeline/enrich.py) runs its regexes and JSON paths only on the findings a
cheap test admits; the result equals evaluating them on every finding (the previous all-rows
implementations below are the oracle), on random mixtures of real-shaped findings."""

from __future__ import annotations

import json

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recovery_logs.pipeline.enrich import _NCCL_GPU_RE, fill_gpu, subject_host
from recovery_logs.testing import make_findings

MESSAGES = [
    "gpu-n01:5776:5898 [3] NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with status=12",
    "gpu-n01.cluster:1:1 [12] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "x] NCCL y: an NCCL marker without a prefix",
    "I1129 14:04:49.636890 2701068 train.py:318] [rank1730] step 424 step_time=0.570s",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
    "error: Nodes gpu-n02 not responding",
    "",
]
DETAILS = [None, json.dumps({"node": "gpu-n02.cluster"}), json.dumps({"node": "bad name!"}),
           json.dumps({"slurm_job": "4242_1"}), json.dumps({"node": "gpu-n03", "slurm_job": "77"}),
           json.dumps({"rule": "xid.generic", "mnemonic": "GPU has fallen off the bus"}),
           json.dumps({"other": "node"}), json.dumps({"nodes": "gpu-n09"})]


def _ref_fill_gpu(found: pl.DataFrame) -> pl.DataFrame:
    return found.with_columns(
        pl.coalesce(pl.col("gpu"), pl.col("message").str.extract(_NCCL_GPU_RE, 1).cast(pl.Int32, strict=False))
        .alias("gpu"))


def _ref_subject_host(found: pl.DataFrame) -> pl.DataFrame:
    if found.filter(pl.col("detail").is_not_null()).height == 0:
        return found
    node = pl.col("detail").str.json_path_match("$.node")
    job = pl.col("detail").str.json_path_match("$.slurm_job").str.extract(r"^(\d+)", 1)
    simple = node.str.contains(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    return found.with_columns(
        pl.when(node.is_not_null() & simple).then(node.str.split(".").list.first()).otherwise(pl.col("host"))
        .alias("host"),
        pl.coalesce(pl.col("job_id"), job).alias("job_id"))


ROW = st.fixed_dictionaries({
    "message": st.sampled_from(MESSAGES), "detail": st.sampled_from(DETAILS),
    "gpu": st.sampled_from([None, 0, 5]), "job_id": st.sampled_from([None, "9"]),
    "host": st.sampled_from(["gpu-n01", "slurmctl01"])})


@settings(max_examples=60, deadline=None)
@given(st.lists(ROW, max_size=25))
def test_enrichment_equals_evaluating_every_finding(rows: list[dict]) -> None:
    f = make_findings([{"rule_id": "r", "category": "xid", **r} for r in rows])
    assert_frame_equal(fill_gpu(f), _ref_fill_gpu(f))
    assert_frame_equal(subject_host(f), _ref_subject_host(f))
