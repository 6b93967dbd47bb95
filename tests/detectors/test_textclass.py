"""The learned line classifier (detectors.textclass) and its artifact (models/textclass).

Lines are real, copied from the dev corpus (tests/corpus/real/dev; the thread is named beside each):
they are training lines of the shipped model, so these tests check that the detector, the artifact
and the wiring do what they say, not how well the model generalises (that is the grouped CV in the
model card and the corpus eval).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from recovery_logs.analysis.corpus_eval import CorpusOptions, evaluate_corpus
from recovery_logs.config import EngineConfig
from recovery_logs.detectors import textclass as tc
from recovery_logs.errors import ModelError
from recovery_logs.pipeline.replay import ReplayOptions, replay

POSITIVE = [
    # (line, category, source)
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_error", "XPixelGroup/BasicSR#211"),
    ("         Link 3: <inactive>", "nvlink", "Azure/azhpc-diagnostics#73"),
    ("\tstate:\t\t 1: DOWN", "infiniband_link", "NVIDIA/nccl#1935"),
    ("localhost.localdomain mcelog[2226]: Transaction: Memory read error", "host_hardware",
     "winddoing.github.io: kernel: mce: [Hardware Error]: Machine check events logged"),
]
BENIGN = [
    ("Mar 27 15:37:34 cc1 kernel: mlx5_core 0000:01:00.1 eth1: Link up", "bigstack-oss/cubecos#733"),
    ("Physical state: LinkUp", "kb.advancedclustering.com InfiniBand-Port-States"),
    ("фев 12 00:48:02 kernel: pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
     "GSConnect/gnome-shell-extension-gsconnect#1052"),
]
# lines no rule claims on their own (a replay of each alone makes a model-only incident)
MODEL_ONLY = [
    ("localhost.localdomain mcelog[2226]: Transaction: Memory read error", "host_hardware",
     "winddoing.github.io: kernel: mce: [Hardware Error]: Machine check events logged"),
    ("[   49.261465] NVRM: os_pci_init_handle: invalid context!", "xid", "Bumblebee-Project/Bumblebee#554"),
]
# a rule's own example (rules/nvidia_xid.toml must_match)
XID_LINE = "NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)"
DISRUPTIVE = {"drain_node", "reset_gpu", "requeue_job", "cancel_job"}


@pytest.fixture(scope="module")
def model() -> tc.TextModel:
    return tc.load()


def _replay(tmp_path: Path, lines: list[str], **cfg: object) -> list:   # type: ignore[type-arg]
    d = tmp_path / "job-100001"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "ex100001.log"
    p.write_text("\n".join(lines) + "\n")
    # the classifier is opt-in (EngineConfig.textclass defaults to False): these tests turn it on unless told
    return list(replay([p], ReplayOptions(config=EngineConfig(**{"textclass": True, **cfg}))).incidents)  # type: ignore[arg-type]


@pytest.mark.parametrize(("line", "category", "source"), POSITIVE)
def test_real_dev_lines_are_classified(model: tc.TextModel, line: str, category: str, source: str) -> None:
    assert tc.gate(line), source
    (got, p), = model.predict(tc.masked_texts([line]))
    assert (got, p >= model.threshold) == (category, True), source


@pytest.mark.parametrize(("line", "source"), BENIGN)
def test_quiet_on_benign_lines(model: tc.TextModel, line: str, source: str) -> None:
    (got, _), = model.predict(tc.masked_texts([line]))
    assert got == tc.NONE, source


def test_nccl_info_chatter_never_reaches_the_model() -> None:
    # NVIDIA NCCL's own INFO format (init.cc / net.cc): no error-ish word, the gate leaves it
    for line in ("node1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
                 "node1:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>"):
        assert not tc.gate(line)


@pytest.mark.parametrize(("line", "category", "source"), MODEL_ONLY)
def test_model_only_incident_investigates_and_names_the_category(tmp_path: Path, line: str, category: str,
                                                                 source: str) -> None:
    assert not _replay(tmp_path, [line], textclass=False), f"{source}: a rule claims it now; pick another line"
    incs = _replay(tmp_path, [line])
    assert incs, "the model's finding makes an incident where no rule spoke"
    top = incs[0]
    assert (top.root_rule or "").startswith(tc.RULE_PREFIX)
    assert top.category == category
    for i in incs:
        if (i.root_rule or "").startswith(tc.RULE_PREFIX):
            assert {a.kind for a in i.actions} <= {"investigate"}
            assert i.severity in ("low", "medium", "info")


def test_never_disruptive_even_for_a_hardware_category(tmp_path: Path) -> None:
    incs = _replay(tmp_path, [line for line, _, _ in MODEL_ONLY])
    model_incs = [i for i in incs if (i.root_rule or "").startswith(tc.RULE_PREFIX)]
    assert model_incs
    assert not {a.kind for i in model_incs for a in i.actions} & DISRUPTIVE


def test_a_rule_finding_outranks_and_absorbs_the_model(tmp_path: Path) -> None:
    lines = [line for line, _, _ in MODEL_ONLY] + [XID_LINE]
    incs = _replay(tmp_path, lines)
    assert incs
    assert not any((i.root_rule or "").startswith(tc.RULE_PREFIX) for i in incs)
    ruled = _replay(tmp_path, lines, textclass=False)
    assert [(i.category, i.root_rule) for i in incs] == [(i.category, i.root_rule) for i in ruled]


def test_switch_turns_it_off_and_it_is_off_by_default(tmp_path: Path) -> None:
    incs = _replay(tmp_path, [MODEL_ONLY[0][0]], textclass=False)
    assert not any((i.root_rule or "").startswith(tc.RULE_PREFIX) for i in incs)
    d = tmp_path / "job-100002"
    d.mkdir()
    (d / "ex.log").write_text(MODEL_ONLY[0][0] + "\n")
    assert EngineConfig().textclass is False
    assert not list(replay([d / "ex.log"], ReplayOptions()).incidents)


def test_corpus_eval_scores_the_engine_config_it_is_given(tmp_path: Path) -> None:
    line, category, source = MODEL_ONLY[0]
    (tmp_path / "ex-one.toml").write_text(
        f'id = "ex-one"\nsource = "{source}"\nurl = "https://example.invalid/{source}"\nfamily = "host_mce_edac"\n'
        f'category = "{category}"\nbenign = false\naction = "investigate"\nculprit = ""\nambiguous = false\n'
        f'note = "a model-only line"\ntext = \'\'\'\n{line}\n\'\'\'\n')
    off = evaluate_corpus(tmp_path, CorpusOptions(min_category=0.0, workers=1))
    on = evaluate_corpus(tmp_path, CorpusOptions(min_category=0.0, workers=1, config=EngineConfig(textclass=True)))
    assert off.splits[0].totals["category_accuracy"] == 0.0
    assert on.splits[0].totals["category_accuracy"] == 1.0


def test_loading_refuses_a_tampered_artifact(tmp_path: Path, model: tc.TextModel) -> None:
    src = Path(tc.__file__).resolve().parents[2] / "models" / tc.MODEL_SUBDIR
    d = tmp_path / "tc"
    shutil.copytree(src, d)
    assert tc.load(d).classes == model.classes
    w = d / tc.WEIGHTS
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(ModelError):
        tc.load(d)
    shutil.copy(src / tc.WEIGHTS, w)
    side = json.loads((d / tc.SIDECAR).read_text())
    side["format"] = "something-else/1"
    (d / tc.SIDECAR).write_text(json.dumps(side))
    with pytest.raises(ModelError):
        tc.load(d)


def test_training_is_deterministic_and_saving_reproduces_the_sha(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "train_textclass", Path(tc.__file__).resolve().parents[2] / "models" / "train_textclass.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    ex = train.rule_examples()
    texts, labels = [x for x, _ in ex], [y for _, y in ex]
    shas = []
    for k in range(2):
        vec, clf = train.fit(texts, labels, 8.0)
        m = train.as_model(vec, clf, 0.9)
        tc.save(tmp_path / str(k), "t", list(m.classes), m.vocab, m.idf, m.coef, m.intercept, 0.9, {})
        shas.append(json.loads((tmp_path / str(k) / tc.SIDECAR).read_text())["sha256"])
        if k == 1:   # the numpy inference is the scikit-learn model's
            want = clf.predict_proba(vec.transform(tc.masked_texts(texts[:50])))
            got = tc.load(tmp_path / "1").proba(tc.masked_texts(texts[:50]))
            assert np.allclose(got, want, atol=1e-4)
    assert shas[0] == shas[1]
