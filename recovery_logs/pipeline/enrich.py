"""Finding enrichment the engine applies to every batch: facts a rule cannot see on its own line.

* ``fill_gpu`` — NCCL prefixes name the local GPU (``host:pid:tid [6] NCCL WARN ...``).
* ``subject_host`` — a controller line about another node is evidence about that node.
* ``nccl_addresses`` — NCCL bootstrap lines map an IP address to its host (for peer names).
"""

from __future__ import annotations

import polars as pl

from recovery_logs.schema import on_rows

__all__ = ["ADDRESS_LITERALS", "ENRICH_LITERALS", "fill_gpu", "nccl_addresses", "subject_host"]


_ADDR_RE = (r"(?:^|\s)(?:(?P<h>[A-Za-z0-9_.-]+):\d+:\d+ \[\d+\] )?NCCL INFO "
            r"(?:Bootstrap : Using|NET/Socket : Using|NET/IB : Using .*?OOB) \[?\S*?:(?P<ip>\d+\.\d+\.\d+\.\d+)<")


# every line _ADDR_RE matches contains one of these (a cheap prefilter before the regex)
ADDRESS_LITERALS = ("NCCL INFO Bootstrap : Using", "NCCL INFO NET/Socket : Using", "NCCL INFO NET/IB : Using ")

# Substrings every line the engine reads beyond the rules contains: NCCL address lines (_ADDR_RE:
# "NCCL INFO Bootstrap : Using ...", "NET/Socket : Using", "NET/IB : Using"), NCCL init lines with a
# bus id (inventory._NCCL_BUS_RE: "busId") and NVML inventory lines (inventory.inventory_records:
# messages starting "NVML gpu="). A reader that drops lines before parsing keeps lines with one of
# these as well as those with a rule literal (detectors.literals.needed_literals(pack, ENRICH_LITERALS)).
ENRICH_LITERALS = ("Bootstrap : Using", "NET/Socket : Using", "NET/IB : Using", "busId", "NVML gpu=")

_NCCL_GPU_RE = r"^[A-Za-z0-9_.-]+:\d+:\d+ \[(\d+)\] NCCL "


def fill_gpu(found: pl.DataFrame) -> pl.DataFrame:
    """NCCL prefixes name the local GPU (`host:pid:tid [6] NCCL WARN ...`): use it where a rule did not.
    The regex runs only on findings without a GPU whose message has an NCCL prefix's ``] NCCL ``
    (a large job's findings are mostly progress lines, which have neither)."""
    need = found.select((pl.col("gpu").is_null() & pl.col("message").str.contains("] NCCL ", literal=True))
                        .fill_null(False)).to_series()
    got = on_rows(found.select("message"), need, {
        "_g": pl.col("message").str.extract(_NCCL_GPU_RE, 1).cast(pl.Int32, strict=False)})["_g"]
    return found.with_columns(pl.coalesce(pl.col("gpu"), got).alias("gpu"))


def subject_host(found: pl.DataFrame) -> pl.DataFrame:
    """A controller line about another node (`Nodes gpu-n02 not responding`) is evidence about that node.

    Rules capture the subject as a `node` group (kept in `detail`); the finding moves to that host, and a
    captured `slurm_job` fills a missing job id. The reporting host stays in the event itself.
    """
    if "detail" not in found.columns:
        return found
    # only a detail that names a node or a Slurm job can change anything: parse those alone
    need = found.select(pl.col("detail").str.contains_any(['"node"', '"slurm_job"']).fill_null(False)).to_series()
    if not need.any():
        return found
    node = pl.col("detail").str.json_path_match("$.node")
    simple = node.str.contains(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    got = on_rows(found.select("detail"), need, {
        "_h": pl.when(node.is_not_null() & simple).then(node.str.split(".").list.first()),
        "_j": pl.col("detail").str.json_path_match("$.slurm_job").str.extract(r"^(\d+)", 1)})
    return found.with_columns(pl.coalesce(got["_h"], pl.col("host")).alias("host"),
                              pl.coalesce(pl.col("job_id"), got["_j"]).alias("job_id"))


def nccl_addresses(events: pl.DataFrame) -> list[tuple[str, str, int]]:
    """``(host, ip, time ns)`` of every NCCL bootstrap/transport line that names its address."""
    cand = events.filter(pl.col("message").str.contains_any(list(ADDRESS_LITERALS)))
    if cand.height == 0:
        return []
    got = (cand.with_columns(pl.col("message").str.extract_groups(_ADDR_RE).alias("_m"))
           .select(pl.coalesce(pl.col("_m").struct.field("h"), pl.col("host")).alias("h"),
                   pl.col("_m").struct.field("ip").alias("ip"), pl.col("time").dt.epoch("ns").alias("t"))
           .drop_nulls())
    return list(got.iter_rows())
