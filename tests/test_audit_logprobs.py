"""The audit's logprobs check and the pilot's replacements, live: the shipped pair served in-process, speculation on
and off.

The pair is built here (as `speclab.testing.audit_pair` builds it) so that a test can reach the speculative engine's
runner and shift every log-prob it returns by 0.05 nats, its text and law untouched: a fault no law test can see.
The logprobs check is deterministic (a returned log-prob beyond 0.001 + 0.001 |log-prob| of the reference's fails),
so the fault's case fails by construction, not by chance. The exact pair's audit fails on chance with probability at
most its level, 0.001, as in tests/test_audit.py.
"""
import json
from contextlib import contextmanager

import pytest

from speclab.audit import (DEFAULT_PROMPTS, LOGPROB_ATOL, PENALTIES, SETTINGS, format_report, plan_audit,
                           run_audit)

pytestmark = pytest.mark.xdist_group("audit")      # one worker for the audits' servers
OFF_BY = 0.05                                       # nats added to every log-prob the faulty server returns


@pytest.fixture(scope="module")
def pair():
    "(audited url, reference url, the audited engine's runner)."
    from speclab.serve import EngineLoop, ServerThread, build_app, load_engine
    from speclab.train import tiny_pair_path
    target, draft = tiny_pair_path("target"), tiny_pair_path("draft")
    spec = EngineLoop(load_engine(target, draft, kappa=3, max_num_seqs=16, seed=0))
    plain = EngineLoop(load_engine(target, None, kappa=0, max_num_seqs=16, seed=1))
    with ServerThread(build_app(spec, "speclab-tiny")) as a, ServerThread(build_app(plain, "speclab-tiny")) as b:
        yield a.url, b.url, spec.engine.runner


@contextmanager
def logprobs_off(runner, by: float):
    "Every log-prob the runner returns (the sampled token's and its top alternatives') moved by `by` nats."
    correct = runner._logprobs

    def shifted(batch, logits, rows, out):
        per = correct(batch, logits, rows, out)
        if per is None:
            return None
        return [[(lp + by, [(t, v + by) for t, v in top]) for lp, top in lps] for lps in per]
    runner._logprobs = shifted
    try:
        yield
    finally:
        del runner._logprobs


def status(report):
    return {c["check"]: c["status"] for c in report["checks"]}


# Every check with power at level 0.001 on the exact pair: 12 greedy prompts and 16 seed pairs; law and penalty
# cells at 2 tokens (their pilots split at this budget's draws per cell), the three default penalty cells on
# 'raise ValueError(' (one of them a point mass on the shipped pair in some runs: the pilot replaces it).
EXACT = dict(prompts=DEFAULT_PROMPTS[:12], num_law_prompts=1, concurrency=8, settings={"t0.8,p0.6":
             SETTINGS["t0.8,p0.6"]}, penalties=PENALTIES, num_seeds=8, concurrency_n=60, repeat_tokens=16,
             penalty_tokens=2, level=0.001, budget=1_400)


def test_exact_pair_passes_with_the_default_penalty_cells_and_logprobs_checked(pair):
    url, reference_url, _ = pair
    plan = plan_audit(**EXACT)
    assert "'raise ValueError(' @ frequency2.0" in [f"{c.prompt!r} @ {c.setting}" for c in plan.cells]
    report = run_audit(url, reference_url, plan, progress=False, backoff=0.05)
    assert report["exit_code"] == 0, format_report(report)
    assert set(status(report).values()) <= {"pass", "written off"} and status(report)["logprobs"] == "pass"
    logprobs = next(t for t in report["tests"] if t["check"] == "logprobs")
    assert logprobs["n"][1] >= 2 and logprobs["statistic"] <= LOGPROB_ATOL       # compared, and within tolerance
    for swap in report["replaced"]:                                  # each replacement printed with its reason
        said = ("replaced" if swap["by"] else "written off") + f": {swap['check']}: {swap['cell']}"
        assert any(n.startswith(said) for n in report["notes"]), (said, report["notes"])
    json.dumps(report)


def test_logprobs_off_by_a_twentieth_of_a_nat_fail(pair):
    "Text and law untouched, log-probs moved by 0.05 nats: the laws cannot see it, the logprobs check fails."
    url, reference_url, runner = pair
    plan = plan_audit(prompts=["Once upon a time"], num_law_prompts=1, concurrency=8, settings={},
                      penalties={"presence2.0": PENALTIES["presence2.0"]}, num_seeds=0, concurrency_n=0,
                      repeat_tokens=8, penalty_tokens=2, budget=400, logprob_checks=4, pilot=0)
    with logprobs_off(runner, OFF_BY):
        report = run_audit(url, reference_url, plan, progress=False, backoff=0.05)
    assert report["exit_code"] == 1, format_report(report)
    assert report["line"].startswith("speclab audit: FAIL: logprobs")
    logprobs = next(t for t in report["tests"] if t["check"] == "logprobs")
    assert abs(logprobs["statistic"] - OFF_BY) < 1e-3, logprobs
    assert status(report)["penalties"] != "FAIL"                     # the law of the text did not move
