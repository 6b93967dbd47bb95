"""A learned line classifier for wordings no rule was written for (issue 13).

Rules name the lines their writers have seen; a fault worded by a tool nobody wrote a rule for
gets no incident at all. This detector reads the lines **no rule claimed** that carry some
error-ish signal (``GATE``: error, fail, killed, timeout, ...), and where a small linear model of
their *words* is confident, emits a finding of a named corpus category (``xid``, ``oom_host``, ...).

What a finding of it is, and never more:

* ``rule_id`` ``textclass.<model name>``, role ``cause``, severity ``low`` (``medium`` above
  ``MEDIUM_PROB``), action ``investigate`` only: it never drains, resets, requeues or cancels;
* ``detail``: the model's probability and name; the line itself is the message (the evidence);
* attribution drops it for any job/host a rule or behavioural detector spoke about
  (``attribution.drop_model_findings``) and ranks a model-only incident after every other one,
  so a model finding never outranks a rule finding.

Features: the line masked as the template miner masks it (``templates.mask_expr``: numbers, hex,
paths, IPs...), lower-cased; word uni/bigrams and character 3-4-grams (``analyze``), sublinear TF-IDF,
L2-normalised; a multinomial logistic regression. It knows ``none``: benign excerpts, NCCL INFO
chatter and rule packs' must-not-match examples are its ``none`` training data.

Cost: each distinct masked template of a batch is classified once (vectorised masking, a dict
look-up per n-gram, a small dense dot product), and only for gated lines no rule won.

The artifact (``models/textclass/``) is plain data — ``model.json`` (vocabulary, classes,
threshold, sha256 of the weights) and ``weights.npz`` (idf, coefficients, intercepts) read with
``allow_pickle=False`` — written by ``models/train_textclass.py``; scikit-learn is needed only to
train. ``load`` refuses a directory whose weights do not match the sidecar's sha256.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recovery_logs.detectors.anomaly import default_models_dir  # the shipped models' folder
from recovery_logs.detectors.templates import WILDCARD, mask_expr
from recovery_logs.errors import ModelError
from recovery_logs.schema import FINDING_SCHEMA, conform, empty_findings

FORMAT = "recovery-logs-textclass/1"
SIDECAR = "model.json"
WEIGHTS = "weights.npz"
MODEL_SUBDIR = "textclass"
RULE_PREFIX = "textclass."
NONE = "none"
MEDIUM_PROB = 0.97         # severity medium at or above this probability, else low
MAX_CHARS = 400            # a line is classified on its first MAX_CHARS masked characters

# the error-ish signal a line needs before the model reads it (case-insensitive, on the raw line)
GATE = (r"(?i)error|fail|fatal|abort|killed|\boom\b|out of memory|oom-kill|timeout|timed out|exception|panic|"
        r"segfault|segmentation|\bxid\b|\becc\b|uncorrect|throttl|overheat|temperature|lost|\bdown\b|unreachable|"
        r"\breset|hang|straggl|invalid|cannot|unable|denied|signal|terminat|crash|corrupt|\bmce\b|hardware|"
        r"degrad|refused|closed|unhealthy|drain|not responding|critical|illegal|fault|watchdog|power|link")
_GATE_RE = re.compile(GATE)
_WORD = re.compile(r"[a-z][a-z_]+")


def gate(line: str) -> bool:
    return _GATE_RE.search(line) is not None


def normalise(masked: str) -> str:
    return " ".join(masked.replace(WILDCARD, " # ").lower().split())[:MAX_CHARS]


def masked_texts(lines: list[str]) -> list[str]:
    """The model's input text for raw lines (masked, lower-cased, spaces folded)."""
    if not lines:
        return []
    s = pl.Series("m", lines, dtype=pl.String).to_frame().select(mask_expr(pl.col("m"))).to_series()
    return [normalise(x or "") for x in s.to_list()]


def analyze(text: str) -> list[str]:
    """Features of one normalised text: word uni/bigrams and character 3-4-grams (prefixed)."""
    words = _WORD.findall(text)
    feats = [f"w:{w}" for w in words]
    feats += [f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    padded = f" {text} "
    for n in (3, 4):
        feats += [f"c:{padded[i:i + n]}" for i in range(len(padded) - n + 1)]
    return feats


@dataclass(frozen=True)
class TextModel:
    name: str
    classes: tuple[str, ...]
    vocab: dict[str, int]
    idf: np.ndarray            # (n_features,)
    coef: np.ndarray           # (n_classes, n_features)
    intercept: np.ndarray      # (n_classes,)
    threshold: float
    meta: dict[str, Any]

    def features(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The text's (feature indices, sublinear TF-IDF values, L2-normalised): a sparse row."""
        counts: dict[int, int] = {}
        for f in analyze(text):
            j = self.vocab.get(f)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        idx = np.fromiter(counts, dtype=np.int64, count=len(counts))
        val = np.fromiter((1.0 + math.log(c) for c in counts.values()), dtype=np.float64, count=len(counts))
        val *= self.idf[idx]
        n = float(np.sqrt((val ** 2).sum()))
        return idx, (val / n if n > 0 else val)

    def proba(self, texts: list[str]) -> np.ndarray:
        """Class probabilities (softmax of the linear scores), one row per text."""
        z = np.tile(self.intercept, (len(texts), 1))
        for i, t in enumerate(texts):
            idx, val = self.features(t)
            if idx.size:
                z[i] += self.coef[:, idx] @ val
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        p: np.ndarray = e / e.sum(axis=1, keepdims=True)
        return p

    def predict(self, texts: list[str]) -> list[tuple[str, float]]:
        """(category, probability) per text; ``none`` below the threshold."""
        p = self.proba(texts)
        out = []
        for row in p:
            k = int(row.argmax())
            c, q = self.classes[k], float(row[k])
            out.append((c, q) if c != NONE and q >= self.threshold else (NONE, q))
        return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save(directory: Path, name: str, classes: list[str], vocab: dict[str, int], idf: np.ndarray,
         coef: np.ndarray, intercept: np.ndarray, threshold: float, meta: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    w = directory / WEIGHTS
    with w.open("wb") as fh:   # np.savez writes fixed zip timestamps: the bytes are a function of the arrays
        np.savez_compressed(fh, idf=idf.astype(np.float32), coef=coef.astype(np.float32),
                            intercept=intercept.astype(np.float32))
    feats = [f for f, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    side = {"format": FORMAT, "name": name, "classes": classes, "features": feats, "threshold": threshold,
            "weights": WEIGHTS, "sha256": _sha(w), **meta}
    (directory / SIDECAR).write_text(json.dumps(side, indent=1, sort_keys=True) + "\n")
    return directory


def load(directory: str | Path | None = None) -> TextModel:
    if directory is None:
        directory = default_models_dir() / MODEL_SUBDIR
    d = Path(directory)
    try:
        side = json.loads((d / SIDECAR).read_text())
        if side.get("format") != FORMAT:
            raise ModelError("textclass: not a text-classifier artifact", path=str(d))
        w = d / str(side["weights"])
        if _sha(w) != side["sha256"]:
            raise ModelError("textclass: weights do not match the sidecar's sha256", path=str(w))
        with np.load(w, allow_pickle=False) as z:
            idf, coef, intercept = (np.asarray(z[k], dtype=np.float64) for k in ("idf", "coef", "intercept"))
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError("textclass: cannot read the model", path=str(d), reason=str(exc)) from exc
    feats = list(side["features"])
    classes = tuple(side["classes"])
    if coef.shape != (len(classes), len(feats)) or idf.shape != (len(feats),) or intercept.shape != (len(classes),):
        raise ModelError("textclass: weights' shapes do not match the sidecar", path=str(d))
    return TextModel(str(side["name"]), classes, {f: i for i, f in enumerate(feats)}, idf, coef, intercept,
                     float(side["threshold"]), {k: v for k, v in side.items() if k != "features"})


@lru_cache(maxsize=4)
def default_model(models_dir: str | None = None) -> TextModel:
    """The model of ``models_dir/textclass`` when that folder exists, else the shipped one (cached)."""
    if models_dir is not None and (Path(models_dir) / MODEL_SUBDIR).is_dir():
        return load(Path(models_dir) / MODEL_SUBDIR)
    return load(None)


def classify_unclaimed(events: pl.DataFrame, found: pl.DataFrame, model: TextModel | Callable[[], TextModel]
                       ) -> pl.DataFrame:
    """FINDING_SCHEMA rows for the batch's gated lines no rule won where the model is confident.
    Each distinct masked template is classified once. ``model`` may be a loader, called only when
    some line passes the gate (a batch without one never loads the model)."""
    ev = events.filter(~pl.col("seq").is_in(found.get_column("seq").implode())) if found.height else events
    ev = ev.filter(pl.col("message").str.contains(GATE))
    if ev.height == 0:
        return empty_findings()
    if not isinstance(model, TextModel):
        model = model()
    ev = ev.with_columns(mask_expr(pl.col("message")).alias("_m"))
    uniq = ev.get_column("_m").unique(maintain_order=True).to_list()
    preds = model.predict([normalise(u or "") for u in uniq])
    keep = {u: p for u, p in zip(uniq, preds, strict=True) if p[0] != NONE}
    if not keep:
        return empty_findings()
    tab = pl.DataFrame({"_m": list(keep), "category": [p[0] for p in keep.values()],
                        "_p": [p[1] for p in keep.values()]}, schema={"_m": pl.String, "category": pl.String,
                                                                      "_p": pl.Float64})
    hit = ev.join(tab, on="_m", how="inner", maintain_order="left")
    rule = RULE_PREFIX + model.name
    hit = hit.with_columns(
        pl.lit(rule).alias("rule_id"),
        pl.when(pl.col("_p") >= MEDIUM_PROB).then(pl.lit("medium")).otherwise(pl.lit("low")).alias("severity"),
        pl.lit("cause").alias("role"),
        pl.lit("investigate").alias("action"),
        pl.format('{{"model":"{}","probability":{}}}', pl.lit(model.name), pl.col("_p").round(4)).alias("detail"),
    ).drop("_m", "_p")
    return conform(hit, FINDING_SCHEMA)
