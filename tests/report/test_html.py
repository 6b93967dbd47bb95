"""HTML report: written, self-contained, carries the timeline plot and the evidence."""

from __future__ import annotations

import base64
import re

import polars as pl
import pytest

import recovery_logs.api as rl
from recovery_logs.report.html import timeline_figure, write_html_report

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def xid79():
    return rl.replay_incident("xid79_nccl_cascade")


def test_html_report_is_written_with_the_plot(xid79, tmp_path):
    path = write_html_report(xid79, tmp_path / "out")
    assert path == tmp_path / "out" / "report.html"
    text = path.read_text(encoding="utf-8")
    m = re.search(r"<img alt='per-node timeline with fault markers' src='data:image/png;base64,([A-Za-z0-9+/=]+)'",
                  text)
    assert m, "timeline image missing"
    png = base64.b64decode(m.group(1))
    assert png.startswith(PNG) and len(png) > 5000
    inc = xid79.incidents[0]
    assert inc.cause.replace("&", "&amp;") in text
    assert "host:=&quot;gpu-n02&quot;" in text            # LogsQL for the evidence, HTML-escaped
    assert "Self-grading" not in text


def test_html_report_with_grades(xid79, tmp_path):
    from recovery_logs.remediation.gate import PromotionGate
    from recovery_logs.remediation.grading import grade_proposals

    acts = rl.actions_frame(xid79)
    outcomes = pl.DataFrame(schema={"time": acts.schema["time"], "kind": pl.String, "target": pl.String,
                                    "incident_id": pl.String, "detail": pl.String})
    grades = grade_proposals(acts, outcomes)
    text = write_html_report(xid79, tmp_path, grades=grades, gate=PromotionGate(0.8, 5)).read_text()
    assert "Self-grading of monitor-mode proposals" in text and "at least 0.80 over at least 5" in text
    assert f"<td>{acts['root_rule'][0]}</td>" in text


def test_timeline_marks_faults_per_node(xid79):
    fig = timeline_figure(xid79.engine.all_findings(), xid79.incidents)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == xid79.incidents[0].node == "gpu-n02"          # the culprit's row first
    assert sorted(labels) == ["gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("cause (fault)") for t in legend)
    assert any(a.get_text().startswith("#1 xid") for a in ax.texts)


def test_unwritable_out_dir_is_a_config_error(xid79, tmp_path):
    from recovery_logs.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write"):
        write_html_report(xid79, blocker / "sub")


def test_timeline_thins_a_flood_of_progress_markers_to_one_per_pixel_and_keeps_the_count():
    import time as _time

    from recovery_logs.report.html import timeline_figure
    from recovery_logs.schema import FINDING_SCHEMA, conform

    n = 200_000
    t0 = 1_795_948_020_000_000_000
    f = conform(pl.DataFrame({
        "time": pl.Series(t0 + pl.int_range(0, n, eager=True) * 17_000_000).cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"),
        "host": [f"gpu-n{i % 4:02d}" for i in range(n)], "role": ["progress"] * n, "category": ["progress"] * n,
    }), FINDING_SCHEMA)
    t = _time.perf_counter()
    fig = timeline_figure(f, [])
    built = _time.perf_counter() - t
    pts = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    assert 4 <= pts <= 4 * 1100 + 4          # at most one marker per node per pixel column
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == [f"progress ({n}, {pts} shown)"]   # every finding counted, the drawn ones said
    assert built < 30                          # not a timing test: a sanity bound on a loaded machine
