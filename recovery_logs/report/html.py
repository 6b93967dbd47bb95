"""HTML report of a replay, with a per-node timeline plot (fault markers), and the plot itself
for notebooks.

matplotlib, because it renders headless (the Agg canvas, no display, no pyplot global state, so
it is safe in a library and in threads), its PNG output embeds in one self-contained HTML file
(base64 ``data:`` URI, nothing to fetch, works offline and as a CI artifact), and notebooks use
the very same ``timeline_figure``. An interactive library (plotly, bokeh) would add a large
JavaScript payload or a CDN dependency for a plot that is read, not explored.

``write_html_report(result, out_dir) -> Path`` writes ``out_dir/report.html``; pass the grades of
monitor-mode proposals (``grading.grade_proposals``) and a ``PromotionGate`` to add the
self-grading section.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from recovery_logs.errors import ConfigError
from recovery_logs.frames import (
    actions_frame,
    candidates_frame,
    evidence_frame,
    incident_dicts,
    incidents_frame,
)
from recovery_logs.remediation.gate import PromotionGate
from recovery_logs.remediation.grading import rule_precision
from recovery_logs.textsafe import clean
from recovery_logs.timeutil import iso_to_ns

if TYPE_CHECKING:
    from recovery_logs.pipeline.replay import ReplayResult

__all__ = ["ANOMALY_STYLE", "PROGRESS_BUCKETS", "ROLE_STYLE", "figure_png_base64", "html_report", "timeline_figure",
           "timeline_order", "write_html_report"]

# role -> (marker, colour, size, z-order, legend label)
ROLE_STYLE: dict[str, tuple[str, str, float, int, str]] = {
    "cause": ("X", "#d62728", 90.0, 5, "cause (fault)"),
    "symptom": ("^", "#ff7f0e", 40.0, 4, "symptom"),
    "breadcrumb": ("D", "#9467bd", 30.0, 3, "breadcrumb"),
    "clear": ("o", "#2ca02c", 40.0, 3, "clear"),
    "info": (".", "#7f7f7f", 30.0, 2, "info"),
    "progress": ("|", "#aec7e8", 12.0, 1, "progress"),
}


PROGRESS_BUCKETS = 300
"""Progress lines are downsampled to at most one mark per node per 1/PROGRESS_BUCKETS of the span."""
ANOMALY_STYLE = ("o", "#7b3294", 36.0, 4, "anomaly (detector, unconfirmed)")
"""Behavioural-detector findings: hollow circles, never the cross of a confirmed (rule) fault."""


def timeline_order(findings: pl.DataFrame, incidents: Sequence[Any] = ()) -> list[str]:
    """Rows of the timeline, top to bottom: each incident's culprit (in rank order), then nodes with
    a fault line (cause/symptom/breadcrumb) by their first one, then the rest by name."""
    f = findings.filter(pl.col("host").is_not_null() & pl.col("time").is_not_null())
    incs = incident_dicts(list(incidents)) if incidents else []
    order: list[str] = []
    for d in incs:
        if d.get("node") and d["node"] not in order:
            order.append(d["node"])
    faulty = (f.filter(pl.col("role").is_in(["cause", "symptom", "breadcrumb"]))
              .group_by("host").agg(pl.col("time").min()).sort(["time", "host"])["host"].to_list())
    order += [h for h in faulty if h not in order]
    order += sorted(h for h in f["host"].unique().to_list() if h not in order)
    return order


def timeline_figure(findings: pl.DataFrame, incidents: Sequence[Any] = (), *, title: str | None = None,
                    width_in: float = 11.0) -> Any:
    """A matplotlib ``Figure``: one row per node, a marker per finding by role, a dashed line at
    each incident's first fault and a solid one at its detection.

    Readable at 64+ nodes: culprits first (labelled in red), then nodes by their first fault line,
    then the rest; the time axis on top and bottom; progress lines downsampled per node
    (``PROGRESS_BUCKETS``); behavioural-detector findings (``detector.*``, e.g. anomalies) drawn
    as hollow circles, distinct from the crosses of confirmed rule faults.

    ``findings``: ``FINDING_SCHEMA`` (``ReplayResult.engine.all_findings()``); ``incidents``:
    ``Incident`` objects or their ``to_dict()``.
    """
    import matplotlib.dates as mdates  # matplotlib: heavy import, only when a plot is drawn
    from matplotlib.figure import Figure

    f = findings.filter(pl.col("host").is_not_null() & pl.col("time").is_not_null())
    incs = incident_dicts(list(incidents)) if incidents else []
    hosts = timeline_order(f, incs)
    culprits = {d.get("node") for d in incs if d.get("node")}
    many = len(hosts) > 32
    row_in = 0.2 if many else 0.45
    fig = Figure(figsize=(width_in, 1.6 + row_in * max(1, len(hosts))), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    y = {h: i for i, h in enumerate(hosts)}
    if f.height:
        epoch = f["time"].dt.epoch("ns")
        lo, hi = int(epoch.min()), int(epoch.max())  # type: ignore[arg-type]  # an Int64 series' min is int
        step = max(1, (hi - lo) // PROGRESS_BUCKETS)
        prog = f.filter(pl.col("role") == "progress")
        shown = (prog.with_columns(((pl.col("time").dt.epoch("ns") - lo) // step).alias("_b"))
                 .unique(["host", "_b"], keep="first", maintain_order=True).drop("_b"))
        detector = pl.col("rule_id").fill_null("").str.starts_with("detector.")
        layers: list[tuple[pl.DataFrame, tuple[str, str, float, int, str], int]] = []
        for role, style in ROLE_STYLE.items():
            if role == "progress":
                layers.append((shown, style, prog.height))
            else:
                part = f.filter((pl.col("role") == role) & ~detector)
                layers.append((part, style, part.height))
        anom = f.filter(detector)
        layers.append((anom, ANOMALY_STYLE, anom.height))
        for part, (marker, colour, size, z, label), total in layers:
            if part.height == 0:
                continue
            part = _thin(part, width_in)           # at most one marker per node per pixel
            xs = part["time"].dt.replace_time_zone(None).to_list()
            ys = [y[h] for h in part["host"].to_list()]
            note = f"{total}, {part.height} shown" if total != part.height else f"{total}"
            hollow = (marker, colour) == ANOMALY_STYLE[:2]
            colours: dict[str, Any] = {"facecolors": "none", "edgecolors": colour} if hollow else {"c": colour}
            ax.scatter(xs, ys, marker=marker, s=size * (0.6 if many else 1.0), zorder=z, label=f"{label} ({note})",
                       linewidths=1.2 if hollow or marker in ("|", "X") else 0.5, **colours)

    def dt(ns: int) -> datetime:
        return datetime.fromtimestamp(ns / 1e9, tz=UTC).replace(tzinfo=None)

    for n, d in enumerate(incs, 1):
        t0, td = iso_to_ns(d["first_seen"]), iso_to_ns(d["detected_at"])
        ax.axvline(dt(t0), color="#d62728", linestyle="--", linewidth=0.8, zorder=0)  # type: ignore[arg-type]  # date units
        ax.axvline(dt(td), color="#d62728", linestyle="-", linewidth=0.8, alpha=0.6, zorder=0)  # type: ignore[arg-type]
        if d.get("node") in y and n <= 10:
            ax.annotate(f"#{n} {d.get('category')}", (dt(t0), y[d["node"]]), xytext=(4, 6),
                        textcoords="offset points", fontsize=7 if many else 8, color="#d62728")
    ax.set_yticks(range(len(hosts)))
    ax.set_yticklabels(hosts, fontsize=6 if many else 9)
    for lab in ax.get_yticklabels():
        if lab.get_text() in culprits:
            lab.set_color("#d62728")
            lab.set_fontweight("bold")
    ax.set_ylim(max(0.7, len(hosts) - 0.3), -0.7)          # first row on top
    fmt = mdates.DateFormatter("%H:%M:%S")
    ax.xaxis.set_major_formatter(fmt)
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=True, labelbottom=True, labelsize=8)
    ax.set_xlabel("event time (UTC)   dashed: first fault line, solid: detected")
    ax.grid(axis="x", alpha=0.3)
    if f.height:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title((title or "per-node timeline") + (f" — {len(hosts)} nodes, culprits first" if many else ""),
                 fontsize=10, pad=18)
    fig.tight_layout()
    return fig


MAX_MARKERS = 2000


def _thin(part: pl.DataFrame, width_in: float) -> pl.DataFrame:
    """At most one marker per node per horizontal pixel: 433 k progress lines draw as the same
    picture in milliseconds instead of seconds (the legend still counts every finding)."""
    if part.height <= MAX_MARKERS:
        return part
    ns = pl.col("time").dt.epoch("ns")
    lo, hi = part.select(ns.min().alias("lo"), ns.max().alias("hi")).row(0)
    bins = max(1, int(width_in * 100))
    step = max(1, (hi - lo) // bins + 1)
    return part.with_columns(_b=(ns - lo) // step).unique(["host", "_b"], keep="first", maintain_order=True)


def figure_png_base64(fig: Any, dpi: int = 100) -> str:
    """PNG bytes of a figure, base64 text (for a ``data:image/png;base64,`` URI)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib: heavy, only when drawn

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _e(v: Any) -> str:
    return "-" if v is None else html.escape(clean(v))


def _table(df: pl.DataFrame, cols: Sequence[str] | None = None, code: Sequence[str] = ()) -> str:
    cols = list(cols or df.columns)
    df = df.with_columns([pl.col(c).dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%d %H:%M:%S%.9f")
                          for c in cols if isinstance(df.schema[c], pl.Datetime)])
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for r in df.select(cols).iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float):
                v = f"{v:.3f}"
            elif isinstance(v, list):
                v = ", ".join(map(str, v))
            cells.append(f"<td><code>{_e(v)}</code></td>" if c in code else f"<td>{_e(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;
text-align:left;vertical-align:top}th{background:#f3f3f3}code{font-size:12px;word-break:break-all}
.crit{color:#b00}img{max-width:100%}"""


def html_report(result: ReplayResult, grades: pl.DataFrame | None = None, gate: PromotionGate | None = None) -> str:
    """The HTML text of a replay report (see ``write_html_report``)."""
    s = result.summary
    incs = result.incidents
    fig = timeline_figure(result.engine.all_findings(), incs, title="per-node timeline (findings by role)")
    png = figure_png_base64(fig)
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>recovery-logs replay report</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>recovery-logs replay report</h1>",
             f"<p>{_e(s.get('events'))} events from {_e(s.get('files'))} file(s), {_e(s.get('quarantined'))} "
             f"quarantined, {_e(s.get('incidents'))} incident(s), {_e(s.get('first_event'))} to "
             f"{_e(s.get('last_event'))}. Replay records proposals; it never acts on a cluster.</p>",
             f"<h2>Timeline</h2><img alt='per-node timeline with fault markers' "
             f"src='data:image/png;base64,{png}'>"]
    if not incs:
        parts.append("<p>No incidents: nothing needs recovery.</p>")
    else:
        inc = incidents_frame(result)
        parts += ["<h2>Incidents, most important first</h2>",
                  _table(inc, ["rank", "severity", "category", "node", "gpu", "job_id", "confidence", "detected_at",
                               "root_rule", "cause"])]
        cand, ev, act = candidates_frame(result), evidence_frame(result), actions_frame(result)
        for n, i in enumerate(incs, 1):
            parts += [f"<h3>{n}. {_e(i.cause)}</h3>",
                      f"<p>category <b>{_e(i.category)}</b>, severity {_e(i.severity)}, culprit {_e(i.node)}"
                      f"{'' if i.gpu is None else ' GPU ' + str(i.gpu)}, job {_e(i.job_id)}, status {_e(i.status)}</p>",
                      "<h4>Ranked causes</h4>",
                      _table(cand.filter(pl.col("incident_id") == i.id), ["rank", "node", "score", "cause"]),
                      "<h4>Proposed actions (record only)</h4>",
                      _table(act.filter(pl.col("incident_id") == i.id), ["kind", "target", "decision", "reason"]),
                      "<h4>Evidence (with the LogsQL query that fetches each line from VictoriaLogs)</h4>",
                      _table(ev.filter(pl.col("incident_id") == i.id), ["time", "node", "rule_id", "message",
                                                                        "logsql"], code=["logsql"])]
    if grades is not None:
        g = gate or PromotionGate()
        table = g.table(rule_precision(grades))
        parts += ["<h2>Self-grading of monitor-mode proposals</h2>",
                  f"<p>Promotion gate: a rule acts alone once its precision is at least {g.min_precision:.2f} "
                  f"over at least {g.min_incidents} graded incidents.</p>", _table(table)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html_report(result: ReplayResult, out_dir: str | Path, *, grades: pl.DataFrame | None = None,
                      gate: PromotionGate | None = None) -> Path:
    """Write ``out_dir/report.html`` (self-contained: the timeline plot is an embedded PNG)."""

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "report.html"
        path.write_text(html_report(result, grades, gate), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"html report: cannot write: {exc}", path=str(out)) from exc
    return path
