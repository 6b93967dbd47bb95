"""Attribution and planning over literal findings (no rule packs involved)."""

from __future__ import annotations

import polars as pl

from recovery_logs.attribution import Attributor
from recovery_logs.config import EngineConfig
from recovery_logs.remediation.plan import plan
from recovery_logs.testing import make_events, make_findings
from recovery_logs.timeutil import iso_to_ns
from recovery_logs.windows import job_spans

CFG = EngineConfig()
NODES = ["gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04"]


def _f(time, host, category, role, severity="high", action="investigate", rule="r", job=None, **kw):
    return {"time": time, "host": host, "job_id": job, "category": category, "role": role, "severity": severity,
            "action": action, "rule_id": rule, "message": kw.pop("message", f"{rule} on {host}"), **kw}


def _spans(job="184470", nodes=NODES, start="2026-11-29T14:00:00Z", end="2026-11-29T14:20:00Z"):
    rows = [{"time": t, "host": h, "job_id": job, "message": "x"} for h in nodes for t in (start, end)]
    return job_spans(make_events(rows))


def _run(rows, spans=None, addrs=None, cfg=CFG):
    att = Attributor(cfg, {"nccl.watchdog": "NCCL watchdog timeout"}, {79: "GPU has fallen off the bus",
                                                                      48: "DBE", 45: "preemptive removal"})
    incs = att.incidents(make_findings(rows), spans if spans is not None else _spans(), addrs or {})
    return [i.__class__(**{**i.__dict__, "actions": plan(i, cfg)}) for i in incs]


def _timeouts(t, nodes, job="184470"):
    return [_f(t, h, "nccl_timeout_hang", "symptom", rule="nccl.watchdog", job=job) for h in nodes]


def test_xid79_outranks_the_timeouts_it_causes():
    rows = [_f("2026-11-29T14:06:00.123456789Z", "gpu-n02", "xid", "cause", "critical",
               "drain_node_and_requeue", "xid.nvrm", xid=79, pci="0000:ab:00")]
    rows += _timeouts("2026-11-29T14:16:00Z", ["gpu-n01", "gpu-n03", "gpu-n04"])
    (inc,) = _run(rows)
    assert (inc.node, inc.category, inc.xid, inc.job_id) == ("gpu-n02", "xid", 79, "184470")
    assert inc.detected_at == iso_to_ns("2026-11-29T14:06:00.123456789Z")
    assert inc.cause == "XID 79 GPU has fallen off the bus on PCI 0000:ab:00"
    assert inc.confidence > 0.8
    kinds = [(a.kind, a.target, a.exclude) for a in inc.actions]
    assert kinds == [("drain_node", "gpu-n02", ()), ("requeue_job", "184470", ("gpu-n02",))]
    assert all(a.decision == "record_only" for a in inc.actions)
    assert [c.node for c in inc.candidates][0] == "gpu-n02"


def test_breadcrumb_never_wins_after_a_cause():
    rows = [_f("2026-11-29T14:05:00Z", "gpu-n03", "xid", "cause", "critical", "drain_node_and_requeue",
               "xid.nvrm", xid=48),
            _f("2026-11-29T14:05:01Z", "gpu-n03", "xid", "breadcrumb", "critical", "investigate", "xid.nvrm2", xid=45),
            _f("2026-11-29T14:05:01Z", "gpu-n01", "xid", "breadcrumb", "critical", "investigate", "xid.nvrm2", xid=45)]
    (inc,) = _run(rows)
    assert (inc.node, inc.xid) == ("gpu-n03", 48)
    assert inc.candidates[1].score < 0.1


def test_silent_node_is_a_suspect_but_not_drained():
    rows = _timeouts("2026-11-29T14:16:00Z", ["gpu-n01", "gpu-n03", "gpu-n04"])
    (inc,) = _run(rows)
    assert inc.node == "gpu-n02"
    assert "no collective timeout reported while 3 other node(s) did" in inc.candidates[0].reasons
    assert inc.category == "nccl_timeout_hang"
    assert "drain_node" not in [a.kind for a in inc.actions]


def test_nccl_network_errors_point_at_their_peer():
    rows = [_f(f"2026-11-29T14:03:{10 + n}Z", h, "nccl_network_error", "cause", "high", "drain_node_and_requeue",
               "nccl.net_ib", job="184470", peer="10.0.0.14<43211>") for n, h in enumerate(NODES[:3])]
    (inc,) = _run(rows, addrs={"10.0.0.14": "gpu-n04"})
    assert inc.node == "gpu-n04"
    assert any("named as failing peer by 3 node(s)" in r for r in inc.candidates[0].reasons)
    # gpu-n04 has no fault line of its own: investigate, never a blind drain
    assert [a.kind for a in inc.actions][0] == "investigate"


def test_flood_collapses_into_one_incident_with_counts():
    base = iso_to_ns("2026-11-29T14:00:00Z")
    n = 50_000
    f = make_findings([_f(base, "gpu-n01", "xid", "cause", "critical", "drain_node_and_requeue", "xid.nvrm", xid=79)])
    flood = pl.concat([f] * n).with_columns(
        (pl.col("time") + pl.duration(milliseconds=pl.int_range(0, n))).alias("time"),
        pl.int_range(0, n).cast(pl.Int64).alias("seq"))
    att = Attributor(CFG)
    (inc,) = att.incidents(flood, _spans(), {})
    assert inc.count == n
    assert inc.first_seen == base and inc.last_seen == base + (n - 1) * 1_000_000
    assert inc.counts_by_rule == {"xid.nvrm": n}
    assert len(inc.evidence) == 1


def test_clear_cancels_and_flapping_does_not():
    down = [_f("2026-11-29T14:03:00Z", "gpu-n04", "infiniband_link", "cause", "high", "drain_node_and_requeue", "ib.down")]
    up = [_f("2026-11-29T14:03:30Z", "gpu-n04", "infiniband_link", "clear", "info", "none", "ib.up")]
    (inc,) = _run(down + up, spans=_spans(nodes=[]))
    assert inc.status == "cleared"
    assert [a.kind for a in inc.actions] == ["none"]
    flaps = [_f(f"2026-11-29T14:0{m}:00Z", "gpu-n04", "infiniband_link", "cause", "high", "drain_node_and_requeue",
                "ib.down") for m in (1, 2, 3)]
    (inc,) = _run(flaps + up, spans=_spans(nodes=[]))
    assert inc.status == "flapping"
    assert "drain_node" in [a.kind for a in inc.actions]


def test_kernel_finding_joins_the_job_on_its_host_and_incidents_split_by_gap():
    rows = [_f("2026-11-29T14:06:00Z", "gpu-n02", "xid", "cause", "critical", "drain_node_and_requeue", "x", xid=79),
            _f("2026-11-29T18:00:00Z", "gpu-n03", "pcie", "cause", "medium", "investigate", "aer")]
    incs = _run(rows)
    by_node = {i.node: i for i in incs}
    assert by_node["gpu-n02"].job_id == "184470"
    assert by_node["gpu-n03"].job_id is None and by_node["gpu-n03"].scope == "host:gpu-n03"


def test_app_xid_is_user_fault_until_it_repeats_on_one_gpu_across_jobs():
    one = [_f("2026-11-29T14:06:00Z", "gpu-n01", "xid", "cause", "high", "none_user_bug", "x", xid=13,
              job="1", pci="0000:18:00")]
    (inc,) = _run(one, spans=_spans(job="1"))
    assert [a.kind for a in inc.actions] == ["none"]
    two = one + [_f("2026-11-29T16:06:00Z", "gpu-n01", "xid", "cause", "high", "none_user_bug", "x", xid=13,
                    job="2", pci="0000:18:00")]
    incs = _run(two, spans=pl.concat([_spans(job="1"), _spans(job="2", start="2026-11-29T16:00:00Z",
                                                               end="2026-11-29T16:10:00Z")]))
    assert all(a.kind == "investigate" for i in incs for a in i.actions)


def test_low_confidence_drain_is_downgraded():
    cfg = EngineConfig(drain_min_confidence=0.99)
    rows = [_f("2026-11-29T14:06:00Z", "gpu-n02", "pcie", "cause", "low", "drain_node_and_requeue", "aer"),
            _f("2026-11-29T14:06:00Z", "gpu-n03", "pcie", "cause", "low", "drain_node_and_requeue", "aer")]
    (inc,) = _run(rows, cfg=cfg)
    assert inc.confidence < 0.99
    assert [a.kind for a in inc.actions] == ["investigate", "requeue_job"]


def test_progress_and_info_alone_make_no_incident():
    rows = [_f("2026-11-29T14:06:00Z", "gpu-n04", "progress", "progress", "info", "none", "progress.megatron",
               step=10, step_time_s=0.8),
            _f("2026-11-29T14:06:01Z", "gpu-n04", "nccl_other", "info", "info", "none", "nccl.info")]
    assert _run(rows) == []


def test_an_untimed_line_before_a_timed_one_of_its_file_counts_as_first():
    # a paste whose NCCL lines carry no time and whose Python traceback does: the reader gives the NCCL head the
    # traceback's time (time_inferred). File order says the NCCL error came first, so it names the incident; a line
    # that only carries an earlier line's time (after it in the file) still proves nothing about coming first.
    t = "2026-11-29T14:06:00Z"
    nccl = _f(t, "gpu-n02", "nccl_network_error", "symptom", "medium", "requeue_only", rule="nccl.socket_connect_failed",
              file="paste.log", line=1, time_inferred=True)
    trace = _f(t, "gpu-n02", "software_exception", "symptom", "low", "none_user_bug", rule="python.traceback_cut",
               file="paste.log", line=8)
    top = _run([nccl, trace])[0]
    assert top.category == "nccl_network_error" and top.root_rule == "nccl.socket_connect_failed"
    carried = {**nccl, "line": 9}     # after the timed line: its time is borrowed from before it
    top = _run([trace, carried])[0]
    assert top.category == "software_exception"
