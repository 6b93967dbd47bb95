"""A straggler verdict and advisory chatter in one job: the verdict ranks first (``attribution.defer_advisories``).

Made-up combinations over literal findings (no rule packs), and real text: the straggler excerpts of the dev corpus
with an NCCL set-up WARN in NCCL's own wording (NVIDIA/nccl src/transport/net_socket.cc, "NET/Socket : No usable
listening interface found", the form ``rules/nccl.toml`` cites) or with the dev corpus's own benign NCCL plugin
warnings (google/nccl-fastsocket#4) before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery_logs.analysis.corpus_eval import CorpusReplay, excerpt_file, load_excerpt
from recovery_logs.attribution import Attributor, is_advisory
from recovery_logs.config import EngineConfig
from recovery_logs.testing import make_events, make_findings
from recovery_logs.windows import job_spans

CFG = EngineConfig()
JOB = "184470"
DEV = Path(__file__).parent / "corpus" / "real" / "dev"


def _f(time, host, category, severity, action, rule, role="cause", job=JOB, **kw):
    return {"time": time, "host": host, "job_id": job, "category": category, "role": role, "severity": severity,
            "action": action, "rule_id": rule, "message": f"{rule} on {host}", **kw}


def _incidents(rows):
    ev = [{"time": t, "host": h, "job_id": JOB, "message": "x"} for h in ("gpu-n01", "gpu-n02")
          for t in ("2026-11-29T14:00:00Z", "2026-11-29T14:20:00Z")]
    return Attributor(CFG).incidents(make_findings(rows), job_spans(make_events(ev)), {})


def _straggler(host=None, severity="low", action="investigate", t="2026-11-29T14:10:00Z", job=JOB):
    return _f(t, host, "straggler", severity, action, "detector.straggler", job=job, rank=3)


SETUP_WARN = ("2026-11-29T14:01:00Z", "gpu-n01", "nccl_other", "medium", "investigate", "nccl.setup_interface")


@pytest.mark.parametrize("straggler", [_straggler(), _straggler("gpu-n02", "medium", "drain_node_and_requeue")],
                         ids=["rankless-low", "node-medium-drain"])
def test_a_straggler_verdict_outranks_setup_chatter_of_its_job(straggler):
    incs = _incidents([_f(*SETUP_WARN), straggler])
    assert [i.category for i in incs] == ["straggler", "nccl_other"]
    assert incs[1].severity == "info" and incs[1].suggested_action == "investigate"
    assert incs[0].severity == straggler["severity"]


@pytest.mark.parametrize("other", [
    ("2026-11-29T14:01:00Z", "gpu-n01", "nccl_other", "medium", "requeue_only", "nccl.unique_id_exchange_failed"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "xid", "medium", "investigate", "xid.nvrm"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "software_exception", "high", "investigate", "python.traceback"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "cuda_error", "medium", "none_user_bug", "cuda.user_error"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "software_exception", "medium", "none", "python.segfault"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "oom_host", "medium", "investigate", "oom.killer_invoked"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "slurm_job_failure", "medium", "investigate", "slurm.step_create_failed"),
    ("2026-11-29T14:01:00Z", "gpu-n01", "nccl_network_error", "medium", "investigate", "ucx.verbs_setup_failed"),
], ids=["proposes-requeue", "hardware", "high", "user-bug", "crash", "oom-kill", "step-failed", "network"])
def test_what_proposes_more_than_a_look_keeps_its_rank(other):
    incs = _incidents([_f(*other), _straggler()])
    assert incs[0].category == other[2] and incs[0].severity == other[3]
    assert incs[1].category == "straggler"


def test_chatter_of_another_job_or_far_from_the_verdict_is_not_deferred():
    other_job = _incidents([_f(*SETUP_WARN), _straggler(job="999")])
    assert other_job[0].category == "nccl_other" and other_job[0].severity == "medium"
    far = SETUP_WARN[0].replace("14:01", "13:01")   # an hour before the verdict: beyond the incident gap
    assert CFG.incident_gap_s < 3000
    late = _incidents([_f(far, *SETUP_WARN[1:]), _straggler()])
    assert [i.severity for i in late if i.category == "nccl_other"] == ["medium"]


def test_without_a_straggler_verdict_chatter_stays_as_it_was():
    (inc,) = _incidents([_f(*SETUP_WARN)])
    assert (inc.category, inc.severity) == ("nccl_other", "medium")
    assert is_advisory(inc)


NCCL_SETUP_WARN = "gpu-a01:1234:5678 [0] NCCL WARN NET/Socket : No usable listening interface found"
FASTSOCKET = "fastsocket-4-cannot-get-incoming-cpu"


@pytest.fixture(scope="module")
def corpus_replay() -> CorpusReplay:
    return CorpusReplay()


def _replay(corpus_replay, tmp_path, ex, text):
    return corpus_replay(excerpt_file(tmp_path, 1, ex.__class__(**{**ex.__dict__, "text": text})))


@pytest.mark.parametrize("name", ["e14-dlrover735-node-check-elapsed-times", "e15-traceml-readme-input-straggler"])
@pytest.mark.parametrize("chatter", ["setup-warn", "fastsocket"])
def test_real_straggler_excerpts_keep_their_verdict_first_after_nccl_chatter(corpus_replay, tmp_path, name, chatter):
    ex = load_excerpt(DEV / f"{name}.toml")
    alone = _replay(corpus_replay, tmp_path / "alone", ex, ex.text)
    assert alone[0].category == "straggler"
    head = NCCL_SETUP_WARN + "\n" if chatter == "setup-warn" else load_excerpt(DEV / f"{FASTSOCKET}.toml").text
    both = _replay(corpus_replay, tmp_path / "both", ex, head + ex.text)
    assert both[0].category == "straggler" and both[0].cause == alone[0].cause
    assert all(i.severity == "info" for i in both[1:] if i.category != "straggler")
    assert not [a for i in both for a in i.actions if a.kind != "investigate"]
