"""The HTML report's timeline stays readable at 64+ nodes: culprits first, the time axis on top
and bottom, progress marks downsampled, detector anomalies drawn unlike confirmed faults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from recovery_logs.records import Incident
from recovery_logs.report.html import (
    ANOMALY_STYLE,
    PROGRESS_BUCKETS,
    ROLE_STYLE,
    timeline_figure,
    timeline_order,
)
from recovery_logs.schema import FINDING_SCHEMA, conform

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)


def _findings(nodes: int = 72, steps: int = 600) -> pl.DataFrame:
    rows = []
    for n in range(1, nodes + 1):
        host = f"gpu-n{n:02d}"
        for s in range(steps):                    # a progress line every 2 s on every node
            rows.append({"time": T0 + timedelta(seconds=2 * s), "host": host, "role": "progress",
                         "rule_id": "torch.step", "category": "training_progress"})
    rows.append({"time": T0 + timedelta(seconds=400), "host": "gpu-n57", "role": "cause", "rule_id": "xid.79",
                 "category": "xid"})
    for n in (3, 9):
        rows.append({"time": T0 + timedelta(seconds=700 + n), "host": f"gpu-n{n:02d}", "role": "symptom",
                     "rule_id": "nccl.watchdog_timeout", "category": "nccl_timeout_hang"})
    rows.append({"time": T0 + timedelta(seconds=300), "host": "gpu-n40", "role": "info", "rule_id": "detector.anomaly",
                 "category": "anomaly"})
    return conform(pl.DataFrame(rows), FINDING_SCHEMA)


def _incident() -> Incident:
    t = int((T0 + timedelta(seconds=400)).timestamp() * 1e9)
    return Incident(id="inc-000000000057", category="xid", cause="XID 79", severity="critical", node="gpu-n57",
                    gpu=2, job_id="1", xid=79, confidence=0.9, first_seen=t, last_seen=t, detected_at=t + 10**9,
                    count=1, nodes=("gpu-n57",), evidence=(), candidates=(), actions=())


def test_order_puts_culprit_then_faulty_nodes_first():
    f = _findings()
    order = timeline_order(f, [_incident()])
    assert order[:3] == ["gpu-n57", "gpu-n03", "gpu-n09"] and len(order) == 72
    assert order[3:] == sorted(order[3:])


def test_72_nodes_readable():
    f = _findings()
    fig = timeline_figure(f, [_incident()])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "gpu-n57" and len(labels) == 72
    culprit = ax.get_yticklabels()[0]
    assert culprit.get_fontweight() == "bold" and culprit.get_color() == "#d62728"
    lo, hi = ax.get_ylim()
    assert lo > hi                                              # first row drawn on top
    xa = ax.xaxis
    assert xa._major_tick_kw.get("label1On", True) and xa._major_tick_kw.get("label2On")   # labels bottom and top
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    prog = next(t for t in legend if t.startswith(ROLE_STYLE["progress"][4] + " ("))
    total, shown = (int(x.split()[0]) for x in prog.rsplit("(", 1)[1].rstrip(")").split(", "))
    assert total == 72 * 600 and shown <= 72 * (PROGRESS_BUCKETS + 1) and shown < total
    assert any(t.startswith(ANOMALY_STYLE[4]) for t in legend)
    assert any(t.startswith(ROLE_STYLE["cause"][4]) for t in legend)
    anomaly = next(c for c in ax.collections if c.get_label().startswith(ANOMALY_STYLE[4]))
    assert anomaly.get_facecolors().size == 0 or anomaly.get_facecolors()[0][3] == 0   # hollow
    # the figure grows with the nodes but stays a readable size
    w, h = fig.get_size_inches()
    assert 12 < h < 20
