"""Drive one simulation: cluster -> timeline -> scripted fault lines -> chunked background -> sinks -> truth.

Everything is a function of (scenario, seed, nodes, gpus per node, duration): the same options
always write the same bytes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recovery_logs.analysis.truth import TRUTH_FILE
from recovery_logs.errors import ConfigError
from recovery_logs.simulate import script as sc
from recovery_logs.simulate.background import ROW_SCHEMA, chunk_background
from recovery_logs.simulate.cluster import Cluster, make_cluster, stable_hash
from recovery_logs.simulate.dialect import Dialect
from recovery_logs.simulate.scenarios import JOB_SIDE, SCENARIOS, SLOW_SCENARIOS, Fault, Spec
from recovery_logs.simulate.writer import TextSink, VLSink, add_noise, chunk_bounds
from recovery_logs.sources.victorialogs import VictoriaLogsClient, parse_url
from recovery_logs.timeutil import NS, ns_to_iso

FORMATS = ("text", "vl-jsonl", "both")
# How often every rank prints its own step-timing line. ``dense`` (the default): every ~4 s (fewer on
# huge jobs) — per-rank debug logging, ~4,000 lines per node-hour. ``fleet``: what production runs
# print — the iteration line from one rank every 10 iterations (Megatron's last rank, NeMo/Lightning's
# rank 0), its timing report, and each rank's own timings only every ~30 s (DeepSpeed's per-rank
# ``wall_clock_breakdown`` every ``steps_per_print``, Megatron's per-rank timers at ``--log-interval``):
# ~700 lines per node-hour, which is the ~17 M lines of a 1,024-node day the fleet benchmark reads.
LOG_PROFILES = {"dense": 4.0, "fleet": 30.0}
WARM_S = 240.0          # start-up plus a progress baseline before any fault


@dataclass(frozen=True)
class SimOptions:
    out: Path
    scenario: str = "all"
    seed: int = 0
    nodes: int = 4
    gpus_per_node: int = 8
    duration_s: float = 7200.0
    format: str = "text"
    to: str | None = None
    dup_rate: float = 5e-4
    garbage_rate: float = 3e-4
    chunk_s: float | None = None
    log_profile: str = "dense"


@dataclass
class SimResult:
    scenario: str
    path: Path
    truth: dict[str, Any]
    lines: int
    bytes: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else 0.0


def scenario_names() -> list[str]:
    return list(SCENARIOS)


def resolve_scenarios(text: str) -> list[str]:
    """``all``, ``a``, ``a,b`` (several runs) or ``a+b`` (one run with both faults)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError("simulate: no scenario given", option="--scenario")
    out: list[str] = []
    for item in items:
        if item == "all":
            out.extend(SCENARIOS)
            continue
        for part in item.split("+"):
            if part not in SCENARIOS:
                raise ConfigError(f"simulate: unknown scenario {part!r}", option="--scenario",
                                  known=", ".join(SCENARIOS))
        out.append(item)
    return list(dict.fromkeys(out))


def validate(opts: SimOptions) -> None:
    if opts.log_profile not in LOG_PROFILES:
        raise ConfigError(f"simulate: unknown log profile {opts.log_profile!r}", option="--log-profile",
                          known=", ".join(LOG_PROFILES))
    if opts.format not in FORMATS:
        raise ConfigError(f"simulate: unknown format {opts.format!r}", option="--format", known=", ".join(FORMATS))
    if opts.nodes < 2:
        raise ConfigError("simulate: need at least 2 nodes (faults cascade across nodes)", option="--nodes",
                          value=opts.nodes)
    if not 1 <= opts.gpus_per_node <= 16:
        raise ConfigError("simulate: --gpus-per-node must be 1..16", option="--gpus-per-node", value=opts.gpus_per_node)
    if opts.duration_s <= 0 or not math.isfinite(opts.duration_s):
        raise ConfigError("simulate: duration must be positive", option="--duration", value=opts.duration_s)
    for rate, name in ((opts.dup_rate, "dup_rate"), (opts.garbage_rate, "garbage_rate")):
        if not 0 <= rate < 0.5:
            raise ConfigError(f"simulate: {name} must be in [0, 0.5)", value=rate)


def _prepare_dir(root: Path, name: str) -> Path:
    d = root / name.replace("+", "__")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if d.exists() and any(d.iterdir()):
            if not (d / TRUTH_FILE).exists():
                raise ConfigError("simulate: output directory exists, is not empty and holds no simulator output; "
                                  "refusing to overwrite it", path=str(d))
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"simulate: cannot write the output directory: {exc.strerror}", path=str(d)) from exc
    return d


def _timeline(c: Cluster, rng: np.random.Generator, slow: list) -> tuple[sc.Timeline, float]:
    it_s = float(rng.uniform(0.6, 0.9))
    t_first = c.start_ns + int(25 * NS)
    n = int((c.end_ns - t_first) / NS / it_s * 1.02) + 16
    base = it_s * (1 + 0.012 * rng.standard_normal(n))
    base = np.clip(base, it_s * 0.9, it_s * 1.1)
    t_start = t_first + np.concatenate([[0], np.cumsum(base[:-1])]) * NS
    factor = np.ones(n)
    for _ranks, t_from, t_to, f in slow:     # the job waits for its slowest rank
        factor = np.where((t_start >= t_from) & (t_start < t_to), np.maximum(factor, f), factor)
    dur = base * factor
    it_end = (t_first + np.cumsum(dur) * NS).astype(np.int64)
    keep = it_end < c.end_ns
    return sc.Timeline(it_end=it_end[keep], it_dur_s=dur[keep], base_dur_s=base[keep]), it_s


def _fault_specs(names: list[str], c: Cluster, rng: np.random.Generator, duration_s: float) -> list[Spec]:
    specs: list[Spec] = []
    used: set[int] = set()
    for i, name in enumerate(names):
        need = SCENARIOS[name][1] + 30
        if duration_s < WARM_S + need:
            raise ConfigError(f"simulate: duration too short for scenario {name!r}", option="--duration",
                              need_s=WARM_S + need, got_s=duration_s)
        frac = float(rng.uniform(0.3, 0.45)) + 0.12 * i
        t_off = max(WARM_S, min(frac * duration_s, duration_s - need))
        pool = [n for n in range(len(c.nodes)) if n not in used and not (name == "node_fail" and n == 0)]
        if not pool:
            raise ConfigError("simulate: not enough nodes for this combination of faults", option="--nodes",
                              value=len(c.nodes))
        node = int(rng.choice(pool))
        used.add(node)
        other = (node + 1) % len(c.nodes)
        specs.append(Spec(node=node, gpu=int(rng.integers(0, c.gpus_per_node)), t=c.start_ns + int(t_off * NS),
                          other=other))
    return specs


def _truth(name: str, opts: SimOptions, c: Cluster, faults: list[Fault]) -> dict[str, Any]:
    def one(f: Fault) -> dict[str, Any]:
        return {"fault_kind": f.kind, "category": f.category,
                "culprit_node": c.nodes[f.culprit_node] if f.culprit_node is not None else None,
                "culprit_gpu": f.culprit_gpu, "node_fault": f.node_fault, "xid": f.xid,
                "fault_time": ns_to_iso(f.fault_t), "decisive_time": ns_to_iso(f.decisive_t),
                "decisive_node": f.decisive_host or (c.nodes[f.culprit_node] if f.culprit_node is not None
                                                     and f.decisive_t is not None else None),
                "acceptable_actions": list(f.actions), "expect_incident": f.expect_incident and not f.masked,
                "masked": f.masked}

    primary = one(faults[0])
    live = [f for f in faults if not f.masked]
    guilty = {c.nodes[f.culprit_node] for f in live if f.node_fault and f.culprit_node is not None}
    actions = sorted({a for f in live for a in f.actions})
    return {"scenario": name, "seed": opts.seed, **primary,
            "acceptable_actions": actions if len(faults) > 1 else primary["acceptable_actions"],
            "expect_incident": any(f.expect_incident for f in live),
            "never_drain": sorted(set(c.nodes) - guilty) + [c.ctl_host],
            "job_id": c.job_id, "nodes": list(c.nodes), "gpus_per_node": c.gpus_per_node,
            "start_time": ns_to_iso(c.start_ns), "end_time": ns_to_iso(c.end_ns),
            "faults": [one(f) for f in faults] if len(faults) > 1 else []}


def simulate_one(name: str, opts: SimOptions, push: Callable | None = None) -> SimResult:
    t_wall = time.perf_counter()
    validate(opts)
    resolve_scenarios(name)
    if push is None and opts.to:
        push = _vl_pusher(opts.to)
    parts = name.split("+")
    c = make_cluster(opts.seed, name, opts.nodes, opts.gpus_per_node, opts.duration_s)
    rng = np.random.default_rng([opts.seed, stable_hash("faults", name)])
    specs = _fault_specs(parts, c, rng, opts.duration_s)
    # two passes: faults declare slowdowns that shape the timeline their lines then refer to
    probe = sc.Script(c, np.random.default_rng([opts.seed, 1]), _timeline(c, np.random.default_rng([opts.seed, 2]), [])[0])
    probed = [SCENARIOS[part][0](probe, spec) for part, spec in zip(parts, specs, strict=True) if part in SLOW_SCENARIOS]
    slow = [x for f in probed for x in f.slow]
    hot = [(r, a, b) for f in probed if f.hot for r, a, b, _ in f.slow]   # slowed by temperature: reports show it
    tl, it_s = _timeline(c, np.random.default_rng([opts.seed, 2]), slow)
    s = sc.Script(c, np.random.default_rng([opts.seed, stable_hash("script", name)]), tl,
                  dialect=Dialect.draw(np.random.default_rng([opts.seed, stable_hash("dialect", name)])))
    sc.startup(s)
    faults = [SCENARIOS[part][0](s, spec) for part, spec in zip(parts, specs, strict=True)]
    for i, (part, f) in enumerate(zip(parts, faults, strict=True)):
        ended = min([g.job_end for g in faults[:i] if g.job_end is not None], default=1 << 62)
        f.masked = part in JOB_SIDE and f.fault_t is not None and f.fault_t >= ended
    job_end = min([f.job_end for f in faults if f.job_end is not None], default=1 << 62)
    progress_stop = min([f.progress_stop for f in faults if f.progress_stop is not None], default=1 << 62)
    node_dead = {f.node_dead[0]: f.node_dead[1] for f in faults if f.node_dead}
    for f in faults:
        if f.decisive_t is None and f.slow and f.culprit_node is not None:
            rank_every = _rank_every(c, it_s, opts.log_profile)
            k = np.nonzero((tl.it_end >= f.fault_t) & ((np.arange(len(tl.it_end)) + 1) % rank_every == 0))[0]
            f.decisive_t = int(tl.it_end[k[0]]) + c.skew_ns[f.culprit_node] if len(k) else None
    rows = pl.DataFrame(s.rows, schema=ROW_SCHEMA, orient="row")
    host_idx = {h: i for i, h in enumerate(c.nodes)}
    dead_t = pl.col("host").replace_strict({c.nodes[k]: v for k, v in node_dead.items()}, default=1 << 62,
                                           return_dtype=pl.Int64)
    rows = rows.filter(
        ~(pl.col("stream").is_in(["job", "slurmd"]) & (pl.col("t") > job_end + 10 * NS)) & (pl.col("t") < dead_t)
    ).sort("t", maintain_order=True)
    del host_idx

    t_prep = time.perf_counter()
    out_dir = _prepare_dir(opts.out, name)
    t_wall += time.perf_counter() - t_prep      # clearing an earlier run is not generation
    text = TextSink(out_dir) if opts.format in ("text", "both") else None
    vl = VLSink(out_dir / "vl.jsonl" if opts.format in ("vl-jsonl", "both") else None, c, push) \
        if opts.format in ("vl-jsonl", "both") or push else None
    compute_frac = np.random.default_rng([opts.seed, 3]).uniform(0.9, 0.96, size=len(tl.it_end))
    rank_every = _rank_every(c, it_s, opts.log_profile)
    rate = c.world / (rank_every * it_s) + len(c.nodes) / 45 + 1
    chunk_s = opts.chunk_s or float(np.clip(400_000 / rate, 30, max(30, opts.duration_s)))
    bounds = chunk_bounds(c.start_ns, c.end_ns, chunk_s)
    times = rows["t"].to_numpy()
    total = 0
    try:
        for i, (c0, c1) in enumerate(bounds):
            lo = 0 if i == 0 else int(np.searchsorted(times, c0))
            hi = len(times) if i == len(bounds) - 1 else int(np.searchsorted(times, c1))
            crng = np.random.default_rng([opts.seed, stable_hash("chunk", name), i])
            bg = chunk_background(c, tl, crng, c0, c1, rank_every=rank_every, log_every=10, compute_frac=compute_frac,
                                  slow=slow, progress_stop=progress_stop, job_end=job_end, node_dead=node_dead,
                                  dialect=s.dialect, hot=hot)
            df = pl.concat([rows.slice(lo, hi - lo), bg], how="vertical")
            df = add_noise(df, crng, opts.dup_rate, opts.garbage_rate)
            total += df.height
            if text is not None:
                text.write(df, c, crng)
            if vl is not None:
                vl.write(df, c, crng)
    finally:
        if text is not None:
            text.close()
        if vl is not None:
            vl.close()
    truth = _truth(name, opts, c, faults)
    seconds = time.perf_counter() - t_wall
    nbytes = text.bytes if text is not None else (out_dir / "vl.jsonl").stat().st_size if vl else 0
    truth["wording_variants"] = s.dialect.names()
    truth["generated"] = {"lines": total, "format": opts.format, "duration_s": opts.duration_s,
                          "gpus": c.world, "seconds_per_iteration": round(it_s, 4), "rank_log_every": rank_every}
    if opts.log_profile != "dense":     # the default's truth.json stays byte for byte what it was
        truth["generated"]["log_profile"] = opts.log_profile
    tmp = out_dir / (TRUTH_FILE + ".tmp")
    tmp.write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / TRUTH_FILE)
    return SimResult(name, out_dir, truth, total, nbytes, seconds)


def _rank_every(c: Cluster, it_s: float, profile: str = "dense") -> int:
    """Per-rank timing lines every N iterations: ``dense`` ~4 s apart on small jobs, fewer on huge
    ones; ``fleet`` ~30 s apart (``LOG_PROFILES``)."""
    return max(1, round(max(LOG_PROFILES[profile], c.world / 400) / it_s))


def simulate(opts: SimOptions, on_result: Callable[[SimResult], None] | None = None) -> list[SimResult]:
    validate(opts)
    names = resolve_scenarios(opts.scenario)
    push = _vl_pusher(opts.to) if opts.to else None
    results = []
    for name in names:
        r = simulate_one(name, opts, push)
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results


def _vl_pusher(url: str) -> Callable:
    client = VictoriaLogsClient(parse_url(url))

    def push(rows: list[dict[str, Any]]) -> None:
        client.insert_jsonline(rows)
    return push
