"""Real-log corpus scoring: every excerpt through the real ``replay`` path, scored against its label.

A corpus directory holds excerpt files (``<id>.toml``, format in ``tests/corpus/real/README.md``):
verbatim log lines copied from public issue trackers with the category, action class and culprit an
operator would expect. ``load_corpus`` reads and validates them (a bad file is an ``InputError``
naming the file); ``evaluate_corpus`` replays each excerpt on its own (a temp file per excerpt, one
loaded rule pack and model shared by all) and scores:

* **category accuracy** on non-benign excerpts: the top incident's category (``none`` when there is
  no incident) equals the label;
* **benign actions**: benign excerpts whose incidents propose drain / reset / requeue / cancel;
* **action agreement**: the top incident's proposals, reduced to one class (reset_gpu > drain_node >
  cancel_job > requeue_job > investigate > none), equal the label (benign: investigate tolerated);
* **per family / per category precision and recall** (see :func:`per_family`, :func:`per_category`);
* **crashes**: excerpts whose replay raised.

Splits: a corpus root with ``dev/`` and ``holdout/`` subdirectories is scored per split (a missing
split is skipped); a directory of excerpts is one split named after it. Misses of a split named
``holdout`` are hidden unless asked for (nobody tuning rules may see them).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery_logs.config import EngineConfig
from recovery_logs.detectors.rulepack import load_packs
from recovery_logs.errors import ConfigError, InputError, RecoveryLogsError
from recovery_logs.pipeline.engine import Engine
from recovery_logs.pipeline.replay import ReplayOptions, replay
from recovery_logs.schema import Category

FAMILIES = ("xid", "gsp", "ecc_memory", "nvlink_nvswitch", "pcie", "infiniband", "nccl_network", "ucx_ibverbs",
            "nccl_timeout", "nccl_setup", "cuda_error", "oom_gpu", "oom_host", "thermal_power", "slurm",
            "software_exception", "segfault", "host_mce_edac", "nvml_error", "straggler_timing", "truncated",
            "benign")
CATEGORIES = (*(c.value for c in Category if c is not Category.ANOMALY), "none")
ACTIONS = ("drain_node", "reset_gpu", "requeue_job", "cancel_job", "investigate", "none")
DISRUPTIVE = frozenset({"drain_node", "reset_gpu", "requeue_job", "cancel_job"})
HIDDEN_SPLITS = frozenset({"holdout"})
SPLITS = ("dev", "holdout")
MAX_LINES = 40
_ID = re.compile(r"^[a-z0-9-]+$")
_KEYS = {"id": str, "source": str, "url": str, "family": str, "category": str, "benign": bool, "action": str,
         "culprit": str, "ambiguous": bool, "note": str, "text": str}
# One class per incident: the most disruptive proposal wins (reset implies a drain first).
_CLASS_ORDER = ("reset_gpu", "drain_node", "cancel_job", "requeue_job", "investigate", "none")


@dataclass(frozen=True)
class Excerpt:
    id: str
    source: str
    url: str
    family: str
    category: str
    benign: bool
    action: str
    culprit: str
    ambiguous: bool
    note: str
    text: str
    path: str = ""


@dataclass
class ExcerptResult:
    excerpt: Excerpt
    category: str = "none"            # top incident's category, "none" without incidents
    action: str = "none"              # action class of the top incident's proposals
    disruptive: tuple[str, ...] = ()  # disruptive proposal kinds over all incidents
    root_rule: str | None = None
    cause: str | None = None
    node: str | None = None
    incidents: int = 0
    error: str | None = None

    @property
    def category_ok(self) -> bool:
        return self.error is None and self.category == self.excerpt.category

    @property
    def action_ok(self) -> bool:
        if self.error is not None:
            return False
        if self.excerpt.benign:
            return self.action in ("none", "investigate")
        return self.action == self.excerpt.action

    @property
    def correct(self) -> bool:
        """Benign: nothing disruptive proposed. Otherwise: the category is right."""
        if self.excerpt.benign:
            return self.error is None and not self.disruptive
        return self.category_ok

    def miss_reason(self) -> str | None:
        e = self.excerpt
        if self.error is not None:
            return f"crash: {self.error}"
        if e.benign and self.disruptive:
            return f"benign, but proposes {', '.join(sorted(set(self.disruptive)))} ({self.category} via {self.root_rule})"
        if not e.benign and not self.category_ok:
            got = "no incident" if self.incidents == 0 else f"{self.category} via {self.root_rule}"
            return f"expected {e.category}, got {got}"
        return None

    def to_dict(self, with_text: bool = True) -> dict[str, Any]:
        e = self.excerpt
        d: dict[str, Any] = {"id": e.id, "family": e.family, "source": e.source, "expected_category": e.category,
                             "expected_action": e.action, "benign": e.benign, "ambiguous": e.ambiguous,
                             "category": self.category, "action": self.action, "root_rule": self.root_rule,
                             "cause": self.cause, "node": self.node, "incidents": self.incidents,
                             "error": self.error, "reason": self.miss_reason()}
        if with_text:
            d["note"] = e.note
        return d


@dataclass
class SplitReport:
    name: str
    results: list[ExcerptResult]
    totals: dict[str, Any]
    per_family: dict[str, dict[str, Any]]
    per_category: dict[str, dict[str, Any]]
    hidden: bool = False

    def misses(self) -> list[ExcerptResult]:
        return [r for r in self.results if r.miss_reason() is not None]

    def action_disagreements(self) -> list[ExcerptResult]:
        """Excerpts that are not misses but whose action class differs from the label."""
        return [r for r in self.results if r.miss_reason() is None and not r.action_ok]

    def to_dict(self, show_misses: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "totals": self.totals, "per_family": self.per_family,
                             "per_category": self.per_category}
        if self.hidden and not show_misses:
            d["misses"] = f"{len(self.misses())} hidden (--show-misses)"
            d["action_disagreements"] = f"{len(self.action_disagreements())} hidden (--show-misses)"
        else:
            d["misses"] = [r.to_dict() for r in self.misses()]
            d["action_disagreements"] = [r.to_dict() for r in self.action_disagreements()]
        return d


@dataclass
class CorpusReport:
    splits: list[SplitReport]
    missed: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.missed

    def to_dict(self, show_misses: bool = False) -> dict[str, Any]:
        return {"ok": self.ok, "missed": self.missed, "wall_s": round(self.wall_s, 3),
                "splits": {s.name: s.to_dict(show_misses) for s in self.splits}}


# ---- loading ------------------------------------------------------------------------------------

def load_excerpt(path: Path) -> Excerpt:
    """One excerpt file, validated; any problem is an InputError naming the file (and the key)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"corpus: cannot read excerpt: {exc}", path=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise InputError("corpus: excerpt is not UTF-8", path=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"corpus: excerpt is not valid TOML: {exc}", path=str(path)) from exc
    for key, typ in _KEYS.items():
        if key not in data:
            raise InputError("corpus: excerpt lacks a required key", path=str(path), key=key)
        if not isinstance(data[key], typ):
            raise InputError(f"corpus: '{key}' must be a {typ.__name__}", path=str(path), key=key)
    extra = sorted(set(data) - set(_KEYS))
    if extra:
        raise InputError("corpus: excerpt has unknown keys", path=str(path), keys=extra)
    if not _ID.match(data["id"]) or data["id"] != path.stem:
        raise InputError("corpus: id must be [a-z0-9-]+ and equal the file name", path=str(path), id=data["id"])
    for key, allowed in (("family", FAMILIES), ("category", CATEGORIES), ("action", ACTIONS)):
        if data[key] not in allowed:
            raise InputError(f"corpus: unknown {key} {data[key]!r}", path=str(path), allowed=", ".join(allowed))
    if data["benign"] and (data["category"] != "none" or data["action"] not in ("none", "investigate")):
        raise InputError("corpus: a benign excerpt has category 'none' and action 'none'", path=str(path))
    if not data["benign"] and data["category"] == "none":
        raise InputError("corpus: category 'none' needs benign = true", path=str(path))
    if not data["source"].strip():
        raise InputError("corpus: excerpt names no source", path=str(path))
    lines = data["text"].rstrip("\n").split("\n")
    if not data["text"].strip() or len(lines) > MAX_LINES:
        raise InputError(f"corpus: text must have 1-{MAX_LINES} lines", path=str(path), lines=len(lines))
    return Excerpt(**{k: data[k] for k in _KEYS}, path=str(path))


def load_corpus(directory: Path) -> list[Excerpt]:
    """Every ``*.toml`` excerpt in ``directory`` (sorted by id); ids must be unique."""
    if not directory.is_dir():
        raise InputError("corpus: not a directory", path=str(directory))
    out = [load_excerpt(p) for p in sorted(directory.glob("*.toml"))]
    if not out:
        raise InputError("corpus: no excerpt files (*.toml)", path=str(directory))
    return out


def discover_splits(root: Path) -> list[tuple[str, Path]]:
    """``dev``/``holdout`` subdirectories that exist, else ``root`` itself as one split."""
    if not root.exists():
        raise InputError("corpus: directory does not exist", path=str(root))
    found = [(s, root / s) for s in SPLITS if (root / s).is_dir() and any((root / s).glob("*.toml"))]
    return found or [(root.name, root)]


# ---- running ------------------------------------------------------------------------------------

def action_class(kinds: Sequence[str]) -> str:
    for k in _CLASS_ORDER:
        if k in kinds:
            return k
    return "none"


ReplayFn = Callable[[Path], list[Any]]


class CorpusReplay:
    """Replays one excerpt file through ``pipeline.replay`` with a fresh Engine sharing one loaded pack."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self._opts = ReplayOptions() if config is None else ReplayOptions(config=config)
        self._pack = load_packs(self._opts.config.rules_dir)

    def __call__(self, path: Path) -> list[Any]:
        return list(replay([path], self._opts, engine=Engine(self._opts.config, self._pack)).incidents)


def excerpt_file(root: Path, index: int, ex: Excerpt) -> Path:
    """Where an excerpt is written for replay: ``job-<n>/ex<n>.log`` — the path names a job and a
    node as a Slurm job's output file would, so excerpts whose lines name neither still replay as
    one node's log of one job (lines that name their own host keep it)."""
    d = root / f"job-{100000 + index}"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"ex{100000 + index}.log"
    p.write_text(ex.text, encoding="utf-8")
    return p


def run_excerpt(ex: Excerpt, path: Path, replay_fn: ReplayFn) -> ExcerptResult:
    res = ExcerptResult(excerpt=ex)
    try:
        incidents = replay_fn(path)
    except RecoveryLogsError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    except Exception as exc:   # a crash is a result to report, not a reason to stop scoring the rest
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.incidents = len(incidents)
    if incidents:
        top = incidents[0]
        res.category = top.category
        res.action = action_class([a.kind for a in top.actions])
        res.root_rule = top.root_rule
        res.cause = top.cause
        res.node = top.node
    res.disruptive = tuple(a.kind for i in incidents for a in i.actions if a.kind in DISRUPTIVE)
    return res


# ---- scoring ------------------------------------------------------------------------------------

def _ratio(n: int, d: int) -> float | None:
    return n / d if d else None


def per_category(results: list[ExcerptResult]) -> dict[str, dict[str, Any]]:
    """Precision/recall of the predicted category (``none`` = no incident) against the label."""
    ok = [r for r in results if r.error is None]
    out: dict[str, dict[str, Any]] = {}
    for cat in sorted({r.excerpt.category for r in ok} | {r.category for r in ok}):
        tp = sum(1 for r in ok if r.excerpt.category == cat and r.category == cat)
        n_true = sum(1 for r in ok if r.excerpt.category == cat)
        n_pred = sum(1 for r in ok if r.category == cat)
        out[cat] = {"true": n_true, "predicted": n_pred, "precision": _ratio(tp, n_pred), "recall": _ratio(tp, n_true)}
    return out


def per_family(results: list[ExcerptResult]) -> dict[str, dict[str, Any]]:
    """Per family: ``recall`` = share of the family's excerpts scored correct (benign: nothing
    disruptive); ``precision`` = of the excerpts the engine placed in this family's categories (the
    categories its excerpts are labelled with), the share that were right — a wrong prediction
    counts against every family whose categories contain it."""
    cats: dict[str, set[str]] = {}
    for r in results:
        cats.setdefault(r.excerpt.family, set()).add(r.excerpt.category)
    wrong = [r for r in results if r.error is None and not r.correct]
    out: dict[str, dict[str, Any]] = {}
    for fam in [f for f in FAMILIES if f in cats]:
        mine = [r for r in results if r.excerpt.family == fam]
        tp = sum(1 for r in mine if r.correct)
        fp = sum(1 for r in wrong if r.category in cats[fam] and not (r.excerpt.benign and fam == "benign"))
        out[fam] = {"n": len(mine), "correct": tp, "precision": _ratio(tp, tp + fp), "recall": _ratio(tp, len(mine)),
                    "actions": _ratio(sum(1 for r in mine if r.action_ok), len(mine)),
                    "ambiguous": sum(1 for r in mine if r.excerpt.ambiguous)}
    return out


def split_totals(results: list[ExcerptResult]) -> dict[str, Any]:
    non_benign = [r for r in results if not r.excerpt.benign]
    clear = [r for r in non_benign if not r.excerpt.ambiguous]
    benign = [r for r in results if r.excerpt.benign]
    return {
        "excerpts": len(results), "non_benign": len(non_benign), "benign": len(benign),
        "ambiguous": sum(1 for r in results if r.excerpt.ambiguous),
        "category_accuracy": _ratio(sum(1 for r in non_benign if r.category_ok), len(non_benign)),
        "category_accuracy_unambiguous": _ratio(sum(1 for r in clear if r.category_ok), len(clear)),
        "benign_with_actions": sum(1 for r in benign if r.disruptive),
        "action_agreement": _ratio(sum(1 for r in results if r.action_ok), len(results)),
        "crashes": sum(1 for r in results if r.error is not None),
        "misses": sum(1 for r in results if r.miss_reason() is not None),
    }


@dataclass(frozen=True)
class CorpusOptions:
    min_category: float = 0.90
    # The category floor of hidden (held-out) splits, scored separately: None means min_category.
    # Crashes and benign actions have the same floors in every split.
    holdout_min_category: float | None = None
    max_benign_actions: int = 0
    max_crashes: int = 0
    workers: int = 0                 # processes for the default replay; 0 = default_workers()
    replay: ReplayFn | None = None
    config: EngineConfig | None = None   # the engine config of the default replay (None: defaults)

    def check(self) -> None:
        if not 0.0 <= self.min_category <= 1.0:
            raise ConfigError("eval: --min-category must be a fraction in [0, 1]", value=self.min_category)
        if self.holdout_min_category is not None and not 0.0 <= self.holdout_min_category <= 1.0:
            raise ConfigError("eval: --min-holdout-category must be a fraction in [0, 1]",
                              value=self.holdout_min_category)
        if self.max_benign_actions < 0 or self.max_crashes < 0:
            raise ConfigError("eval: maximum counts must be >= 0")


def floors(split: SplitReport, o: CorpusOptions) -> list[str]:
    t, missed = split.totals, []
    floor = o.min_category
    if split.hidden and o.holdout_min_category is not None:
        floor = o.holdout_min_category
    if t["category_accuracy"] is not None and t["category_accuracy"] < floor:
        missed.append(f"{split.name}: category accuracy {t['category_accuracy']:.3f} < {floor:.3f}")
    if t["benign_with_actions"] > o.max_benign_actions:
        missed.append(f"{split.name}: {t['benign_with_actions']} benign excerpt(s) with drain/reset/requeue/cancel "
                      f"> {o.max_benign_actions}")
    if t["crashes"] > o.max_crashes:
        missed.append(f"{split.name}: {t['crashes']} excerpt(s) crashed the run > {o.max_crashes}")
    return missed


_WORKER_REPLAY: CorpusReplay | None = None


def _worker_init(config: EngineConfig | None) -> None:
    global _WORKER_REPLAY
    _WORKER_REPLAY = CorpusReplay(config)


def _worker_run(job: tuple[Excerpt, str]) -> ExcerptResult:
    assert _WORKER_REPLAY is not None
    return run_excerpt(job[0], Path(job[1]), _WORKER_REPLAY)


# Below this many excerpts the default replay runs in this process: each spawned worker imports the
# engine and loads the rule pack and the anomaly model itself (~2-4 s on a 2-core machine, about as long
# as replaying 20-30 excerpts), so a pool only pays for itself on a corpus-sized run.
MIN_EXCERPTS_FOR_POOL = 64


def run_all(excerpts: list[Excerpt], replay_fn: ReplayFn | None, workers: int,
            config: EngineConfig | None = None) -> list[ExcerptResult]:
    """Replay every excerpt on its own (one engine each: no excerpt sees another's lines or clock).

    The default replay runs in ``workers`` processes (spawned, each loading the pack and model once);
    a custom ``replay_fn`` runs in this process.
    """
    return run_groups([excerpts], replay_fn, workers, config)[0]


def run_groups(groups: Sequence[list[Excerpt]], replay_fn: ReplayFn | None, workers: int,
               config: EngineConfig | None = None) -> list[list[ExcerptResult]]:
    """``run_all`` over several groups (the splits of a corpus) with one pool for all of them; each
    group's excerpts are written under their own folder with the same names ``run_all`` gives them."""
    with tempfile.TemporaryDirectory(prefix="rl-corpus-") as tmp:
        jobs = [(ex, excerpt_file(Path(tmp) / f"g{g}", i, ex))
                for g, excerpts in enumerate(groups) for i, ex in enumerate(excerpts)]
        if replay_fn is not None or workers <= 1 or len(jobs) < max(MIN_EXCERPTS_FOR_POOL, 2 * workers):
            fn = replay_fn or CorpusReplay(config)
            flat = [run_excerpt(ex, p, fn) for ex, p in jobs]
        else:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(workers, initializer=_worker_init, initargs=(config,)) as pool:
                flat = pool.map(_worker_run, [(ex, str(p)) for ex, p in jobs],
                                chunksize=max(1, len(jobs) // (4 * workers)))
    out, at = [], 0
    for excerpts in groups:
        out.append(flat[at:at + len(excerpts)])
        at += len(excerpts)
    return out


def split_report(name: str, results: list[ExcerptResult]) -> SplitReport:
    return SplitReport(name=name, results=results, totals=split_totals(results), per_family=per_family(results),
                       per_category=per_category(results), hidden=name in HIDDEN_SPLITS)


def default_workers() -> int:
    """Processes for the default replay: two on a 2-core machine (measured 2026-12-03: the 717-excerpt
    corpus in 63 s with two, 95 s with one, one run each), at most four, about one per two cores above that."""
    cpus = os.cpu_count() or 1
    return 1 if cpus < 2 else min(4, max(2, cpus // 2))


def evaluate_corpus(root: str | Path, options: CorpusOptions | None = None) -> CorpusReport:
    """Score every split under ``root``; ``missed`` lists the floors not met (per split)."""
    o = options or CorpusOptions()
    o.check()
    t0 = time.perf_counter()
    splits = [(name, load_corpus(d)) for name, d in discover_splits(Path(root))]
    seen: dict[str, str] = {}
    for name, excerpts in splits:
        for ex in excerpts:
            if ex.id in seen:
                raise InputError("corpus: excerpt id used in two splits", id=ex.id, splits=f"{seen[ex.id]}, {name}")
            seen[ex.id] = name
    workers = o.workers or default_workers()
    results = run_groups([excerpts for _, excerpts in splits], o.replay, workers, o.config)
    reports = [split_report(name, res) for (name, _), res in zip(splits, results, strict=True)]
    missed = [m for r in reports for m in floors(r, o)]
    return CorpusReport(splits=reports, missed=missed, wall_s=time.perf_counter() - t0)


__all__ = ["ACTIONS", "CATEGORIES", "FAMILIES", "CorpusOptions", "CorpusReplay", "CorpusReport", "Excerpt",
           "ExcerptResult", "SplitReport", "action_class", "discover_splits", "evaluate_corpus",
           "load_corpus", "load_excerpt", "per_category", "per_family", "run_all", "run_groups", "split_report",
           "split_totals"]
