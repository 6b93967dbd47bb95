"""Train the line classifier of ``recovery_logs.detectors.textclass`` (deterministic; dev-side data only).

    .venv/bin/python models/train_textclass.py [--out models/textclass] [--cv-only]

Data (never ``tests/corpus/real/holdout/``: only the ``url`` of its files is read, and any dev excerpt
whose URL is among them is dropped):

* rule packs' examples: a ``must_match`` example carries its rule's category (``none`` for a
  suppress/benign rule or a progress rule); a ``must_not_match`` example is ``none``. The examples of
  ``progress.deepspeed`` are dropped (they once came from a held-out thread).
* the dev corpus (``tests/corpus/real/dev/*.toml``), only its gated lines (``textclass.gate``), as
  the detector sees them: a benign excerpt's lines are ``none``; in a non-benign excerpt a line a
  rule wins (replayed with the classifier off) carries the finding's category, and an unclaimed
  line the excerpt's category (a weak label: the wording nobody wrote a rule for).

Model and threshold are chosen by 5-fold grouped cross-validation over the dev excerpts (group =
thread URL): each fold's excerpts are scored as if no rule existed (the top confident category
of their gated lines, ``none`` when none is confident) against their label.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recovery_logs.analysis.corpus_eval import CATEGORIES, excerpt_file, load_corpus  # noqa: E402
from recovery_logs.detectors import textclass as tc  # noqa: E402
from recovery_logs.detectors.rulepack import load_packs  # noqa: E402
from recovery_logs.pipeline.engine import Engine  # noqa: E402
from recovery_logs.pipeline.replay import ReplayOptions, replay  # noqa: E402

HOLDOUT = ROOT / "tests" / "corpus" / "real" / "holdout"   # only the `url` of its files is read
DROP_RULES = frozenset({"progress.deepspeed"})
NAME = "lr1"
SEED_FOLDS = 5
C_GRID = (2.0, 8.0, 32.0)
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
MIN_DF = 2


def holdout_urls() -> set[str]:
    """The held-out threads' URLs (a dev excerpt or rule example from one of them is dropped)."""
    return {str(tomllib.loads(p.read_text(encoding="utf-8"))["url"]) for p in sorted(HOLDOUT.glob("*.toml"))}


def rule_examples() -> list[tuple[str, str]]:
    pack = load_packs(ROOT / "rules")
    out = []
    cats = set(CATEGORIES)
    for r in pack.rules:
        if r.id in DROP_RULES:
            continue
        pos = tc.NONE if (r.suppress or r.category not in cats) else r.category
        out += [(x, pos) for x in r.must_match]
        out += [(x, tc.NONE) for x in r.must_not_match]
    return out


def dev_lines(cache: Path | None) -> list[dict[str, Any]]:
    """One record per dev excerpt: url, label, benign, and its gated lines with their weak labels."""
    if cache is not None and cache.exists():
        return list(json.loads(cache.read_text()))
    drop = holdout_urls()
    opts = ReplayOptions()
    opts = ReplayOptions(config=opts.config.with_(textclass=False))
    pack = load_packs(opts.config.rules_dir)
    cats = set(CATEGORIES)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ex in enumerate(load_corpus(ROOT / "tests/corpus/real/dev")):
            if ex.url in drop:
                continue
            p = excerpt_file(Path(tmp), i, ex)
            eng = Engine(opts.config, pack)
            replay([p], opts, engine=eng)
            f = eng.findings
            by_line: dict[int, str] = {}
            for ln, cat in f.select("line", "category").iter_rows():
                if ln is not None and cat in cats:
                    by_line.setdefault(int(ln), cat)
            lines = []
            for n, text in enumerate(ex.text.splitlines(), start=1):
                if not text.strip() or not tc.gate(text):
                    continue
                if ex.benign:
                    lab = tc.NONE
                else:
                    lab = by_line.get(n, ex.category)
                lines.append((text, lab, n in by_line))
            recs.append({"url": ex.url, "category": ex.category, "benign": ex.benign, "lines": lines})
    if cache is not None:
        cache.write_text(json.dumps(recs))
    return recs


def fit(texts: list[str], labels: list[str], c: float) -> tuple[Any, Any]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(analyzer=tc.analyze, sublinear_tf=True, min_df=MIN_DF, norm="l2", dtype=np.float64)
    x = vec.fit_transform(tc.masked_texts(texts))
    clf = LogisticRegression(C=c, max_iter=3000, class_weight="balanced")
    clf.fit(x, labels)
    return vec, clf


def as_model(vec: Any, clf: Any, threshold: float) -> tc.TextModel:
    vocab = {f: int(i) for f, i in vec.vocabulary_.items()}
    order = sorted(vocab, key=lambda f: vocab[f])
    vocab = {f: i for i, f in enumerate(order)}
    return tc.TextModel(NAME, tuple(str(c) for c in clf.classes_), vocab, np.asarray(vec.idf_),
                        np.asarray(clf.coef_), np.asarray(clf.intercept_), threshold, {})


def excerpt_pred(model: tc.TextModel, lines: list[str]) -> list[tuple[str, float]]:
    """Best non-none (category, probability) per threshold-free scoring: the top line's."""
    if not lines:
        return []
    p = model.proba(tc.masked_texts(lines))
    out = []
    none_i = model.classes.index(tc.NONE) if tc.NONE in model.classes else -1
    for row in p:
        k = int(row.argmax())
        if k != none_i:
            out.append((model.classes[k], float(row[k])))
    return out


def folds(recs: list[dict[str, Any]], k: int) -> list[int]:
    urls = sorted({r["url"] for r in recs})
    rng = np.random.default_rng(13)
    perm = rng.permutation(len(urls))
    fold_of = {urls[j]: int(i % k) for i, j in enumerate(perm)}
    return [fold_of[r["url"]] for r in recs]


def cross_validate(recs: list[dict[str, Any]], rules: list[tuple[str, str]]) -> dict[str, Any]:
    fo = folds(recs, SEED_FOLDS)
    table: dict[str, Any] = {}
    for c in C_GRID:
        preds: list[list[tuple[str, float]]] = [[] for _ in recs]
        for k in range(SEED_FOLDS):
            tr = [r for r, f in zip(recs, fo, strict=True) if f != k]
            texts = [x for x, _ in rules] + [t for r in tr for t, _, _ in r["lines"]]
            labels = [y for _, y in rules] + [y for r in tr for _, y, _ in r["lines"]]
            vec, clf = fit(texts, labels, c)
            m = as_model(vec, clf, 0.0)
            for i, (r, f) in enumerate(zip(recs, fo, strict=True)):
                if f == k:
                    preds[i] = excerpt_pred(m, [t for t, _, _ in r["lines"]])
        rows = {}
        for th in THRESHOLDS:
            nb = [(r, p) for r, p in zip(recs, preds, strict=True) if not r["benign"]]
            bn = [(r, p) for r, p in zip(recs, preds, strict=True) if r["benign"]]

            def top(p: list[tuple[str, float]], th: float = th) -> str | None:
                ok = [x for x in p if x[1] >= th]
                return max(ok, key=lambda x: x[1])[0] if ok else None
            said = [(r, top(p)) for r, p in nb]
            fired = [(r, t) for r, t in said if t is not None]
            correct = sum(1 for r, t in fired if t == r["category"])
            rows[str(th)] = {"nonbenign": len(nb), "coverage": len(fired) / len(nb),
                             "precision": correct / len(fired) if fired else None,
                             "accuracy_alone": correct / len(nb),
                             "benign": len(bn), "benign_flagged": sum(1 for _, p in bn if top(p) is not None) / len(bn)}
        table[str(c)] = rows
        print(json.dumps({"C": c, "cv": rows}), flush=True)
    return table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "models" / "textclass"))
    ap.add_argument("--cache", default=None, help="cache the dev replay here (json)")
    ap.add_argument("--cv-only", action="store_true")
    ap.add_argument("--no-cv", action="store_true", help="train with --c/--threshold, keep the card's CV table")
    ap.add_argument("--cv-from", default=None, help="with --no-cv: the CV table from a --cv-only run's output")
    ap.add_argument("--c", type=float, default=32.0)
    ap.add_argument("--threshold", type=float, default=0.9)
    a = ap.parse_args()
    recs = dev_lines(Path(a.cache) if a.cache else None)
    rules = rule_examples()
    print(json.dumps({"excerpts": len(recs), "dev_lines": sum(len(r["lines"]) for r in recs),
                      "rule_examples": len(rules)}), flush=True)
    cv = None if a.no_cv else cross_validate(recs, rules)
    if a.cv_only:
        return 0
    texts = [x for x, _ in rules] + [t for r in recs for t, _, _ in r["lines"]]
    labels = [y for _, y in rules] + [y for r in recs for _, y, _ in r["lines"]]
    vec, clf = fit(texts, labels, a.c)
    m = as_model(vec, clf, a.threshold)
    meta: dict[str, Any] = {"C": a.c, "min_df": MIN_DF, "training": {
        "excerpts": len(recs), "dev_lines": sum(len(r["lines"]) for r in recs), "rule_examples": len(rules),
        "labels": {c: labels.count(c) for c in sorted(set(labels))}}}
    if cv is not None:
        meta["cv"] = cv
    elif a.cv_from:
        rows = [json.loads(x) for x in Path(a.cv_from).read_text().splitlines() if x.startswith('{"C"')]
        meta["cv"] = {str(r["C"]): r["cv"] for r in rows}
    tc.save(Path(a.out), NAME, list(m.classes), m.vocab, m.idf, m.coef, m.intercept, a.threshold, meta)
    print(json.dumps({"out": a.out, "features": len(m.vocab), "classes": list(m.classes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
