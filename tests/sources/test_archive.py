"""Archive: Parquet by day and node; reading it back equals replaying the logs; pruning."""

from __future__ import annotations

import json

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recovery_logs.api import bundled_incident, bundled_read_options
from recovery_logs.cli import main
from recovery_logs.errors import InputError
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.sources.archive import ArchiveWriter, archive_partitions, node_dir, write_archive
from recovery_logs.sources.files import ReadOptions, iter_batches, read_paths
from recovery_logs.timeutil import iso_to_ns


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    src = bundled_incident("xid79_nccl_cascade")
    opts = bundled_read_options("xid79_nccl_cascade")
    out = tmp_path_factory.mktemp("arch") / "a"
    meta = write_archive(iter_batches([src], opts), out)
    return src, opts, out, meta


def test_archive_is_partitioned_by_day_and_node_and_replays_identically(archived):
    src, opts, out, meta = archived
    ref = replay([src], ReplayOptions(read=opts))
    assert meta["events"] == ref.summary["events"]
    nodes = {p.name for p in out.glob("day=*/node=*")}
    assert node_dir("gpu-n14") in nodes or len(nodes) > 1
    assert all(f.suffix == ".parquet" for f in out.glob("day=*/node=*/*"))
    got = replay([out])
    assert got.to_dict()["incidents"] == ref.to_dict()["incidents"]
    assert_frame_equal(got.engine.findings, ref.engine.findings)


def test_pruning_by_time_and_nodes_opens_only_those_partitions(archived):
    src, opts, out, _ = archived
    ev = read_paths([src], opts).events
    host = ev["host"].drop_nulls()[0]
    only = read_paths([out], ReadOptions(nodes=frozenset({host}))).events
    assert set(only["host"]) == {host} and only.height == ev.filter(pl.col("host") == host).height
    ns = ev["time"].dt.epoch("ns").sort()
    mid = int(ns[len(ns) // 2])
    part = read_paths([out], ReadOptions(since_ns=mid)).events
    assert part.height == ev.filter(pl.col("time").dt.epoch("ns") >= mid).height < ev.height
    later = archive_partitions(out, ReadOptions(since_ns=iso_to_ns("2099-01-01T00:00:00Z")))
    assert later == []


def test_node_names_cannot_escape_their_partition(tmp_path):
    for bad in ["..", ".", "../../etc", "a/b", "_none_", "x\x00y"]:
        d = node_dir(bad)
        assert "/" not in d and d not in ("node=.", "node=..") and d != node_dir(None)
    ev = read_paths([bundled_incident("xid79_nccl_cascade")], bundled_read_options("xid79_nccl_cascade")).events
    ev = ev.with_columns(host=pl.when(pl.col("seq") % 2 == 0).then(pl.lit("../../evil")).otherwise(pl.col("host")))
    from recovery_logs.sources.read_common import Batch
    write_archive([Batch(ev, pl.DataFrame(), {})], tmp_path / "a")
    assert all(p.resolve().is_relative_to((tmp_path / "a").resolve()) for p in (tmp_path / "a").rglob("*"))
    assert read_paths([tmp_path / "a"]).events.height == ev.height


def test_archive_command_and_replay_options(archived, tmp_path, capsys):
    src, opts, _, _ = archived
    assert main(["archive", str(src), "--year", "2026", "--out", str(tmp_path / "a")]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["format"] == "recovery-logs-archive/1" and meta["events"] > 0
    assert main(["replay", str(tmp_path / "a"), "--json", "--nodes", "nobody"]) == 4   # nothing left: no events
    capsys.readouterr()
    with pytest.raises(InputError, match="on its own"):
        read_paths([tmp_path / "a", src])


def test_parts_written_before_the_level_column_still_read(tmp_path):
    # an archive begun by a version without the event `level` column, appended to by this one
    src = bundled_incident("xid79_nccl_cascade")
    opts = bundled_read_options("xid79_nccl_cascade")
    out = tmp_path / "a"
    old = write_archive(iter_batches([src], opts), out)
    for f in out.glob("day=*/node=*/*.parquet"):
        pl.read_parquet(f).drop("level").write_parquet(f)
    w = ArchiveWriter(out)
    w.write(read_paths([src], opts).events.with_columns(level=pl.lit("error")))
    w.close()
    got = read_paths([out]).events
    assert got.height == 2 * old["events"]
    assert got["level"].null_count() == old["events"] and got["level"].drop_nulls().unique().to_list() == ["error"]
