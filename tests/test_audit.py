"""speclab audit (Chapter 13) against live servers: the shipped pair, speculation on and off, served in-process.

One pair of servers for the module (`speclab.testing.audit_pair`); each planted fault is switched on in the
speculative engine between audits (`set_fault`), never through a request field. Each audit's budget is sized by the
power calculation: the plan's own bound for the targeted cells (two_sample_bound / rate_bound, probability 0.99 at
the Holm-corrected level 0.01) lies below the size of the fault's effect on the shipped pair, which for the law
faults is the exact first-token total-variation distance computed from the two models (numbers in each case below;
see benchmarks/audit_faults.py for the default budget against every fault). A correct pair fails an audit with
probability at most 0.01 (the level, whatever the plan), so `test_exact_pair_passes` is flaky with that probability.
"""
import json

import pytest

from speclab.audit import DEFAULT_PROMPTS, PENALTIES, SETTINGS, plan_audit, run_audit
from speclab.testing import FAULTS, audit_pair

pytestmark = pytest.mark.xdist_group("audit")      # one worker, one pair of servers
TOP_P = {"t0.8,p0.6": SETTINGS["t0.8,p0.6"]}
T1 = {"t1.0": SETTINGS["t1.0"]}


@pytest.fixture(scope="module")
def pair():
    with audit_pair(max_num_seqs=16) as (url, reference_url, set_fault):
        yield url, reference_url, set_fault


def audit(pair, fault, **plan):
    "Plant `fault` (None: the correct engine), run a small audit, return its report."
    url, reference_url, set_fault = pair
    set_fault(fault)
    try:
        kw = dict(prompts=DEFAULT_PROMPTS[:2], num_law_prompts=1, concurrency=8, settings={}, penalties={},
                  num_seeds=0, concurrency_n=0, greedy_tokens=8)
        return run_audit(url, reference_url, plan_audit(**{**kw, **plan}), progress=False, backoff=0.05)
    finally:
        set_fault(None)


def failed(report):
    "{check: worst test} of the failed checks."
    return {c["check"]: c["worst"] for c in report["checks"] if c["status"] == "FAIL"}


# penalties_per_step is planted and changes the law (Chapter 95's test: on the random pair, repeats within a step go
# from 12% to 32% at frequency_penalty 2), but on the shipped pair its effect on the first four tokens' text is below
# what the default budget detects (benchmarks/RESULTS.md); it has no case here until the audit has a statistic for it.
NOT_CAUGHT = {"penalties_per_step"}


def test_every_fault_has_a_case():
    assert set(FAULTS) - NOT_CAUGHT == {name for name, *_ in CASES}


def test_exact_pair_passes(pair, tmp_path):
    "Every check on the correct pair: exit 0, and the report says what was run."
    report = audit(pair, None, budget=1_600, settings={**T1, **TOP_P}, penalties={"frequency0.8":
                   PENALTIES["frequency0.8"]}, num_seeds=4, concurrency_n=30, prompts=DEFAULT_PROMPTS[:4])
    assert report["exit_code"] == 0, report["line"]
    assert report["line"].startswith("speclab audit: PASS")
    assert {c["check"]: c["status"] for c in report["checks"]} == dict.fromkeys(
        ["laws", "penalties", "concurrency", "seeds", "greedy"], "pass")
    assert report["requests_sent"] <= 1_600 * 1.05 + 30
    json.dumps(report)


# (fault, plan, check that must fail, text its worst test must contain). Effect sizes on the shipped pair:
# top-p 0.6 at temperature 0.8 with p unfiltered: first-token TV 0.39; argmax: the law collapses to one text (TV
# > 0.5); recovered from p: TV 0.25 at 'with open(' (t0.8, p0.6); a bonus after a rejection: the second token's
# law moves (caught at TV-bound 0.5 budgets in trials); rolled q rows: laws at concurrency 8 and seeds; shared stream:
# every pair identical at concurrency 1 (reference: ~0.1); seed ignored: same-seed agreement 1 -> ~0.1.
CASES = [
    ("top_p_target_only", dict(budget=260, settings=TOP_P), "laws", "t0.8,p0.6"),
    ("argmax_always", dict(budget=120, settings=T1), "laws", "t1.0"),
    ("recovered_from_p", dict(budget=700, settings=TOP_P, prompts=["with open(", "raise ValueError("]), "laws",
     "with open("),
    ("bonus_after_reject", dict(budget=500, settings=TOP_P, prompts=["# Copyright", "if __name__ =="]), "laws",
     "t0.8,p0.6"),
    ("batch_dependent", dict(budget=400, settings=TOP_P, num_seeds=6), "", ""),
    ("shared_rng", dict(budget=200, settings=T1, concurrency_n=40), "concurrency", "concurrency 1"),
    ("seed_ignored", dict(budget=200, settings=T1, num_seeds=8), "seeds", "same seed"),
]


@pytest.mark.parametrize("fault,plan,check,where", CASES, ids=[c[0] for c in CASES])
def test_planted_fault_is_caught(pair, fault, plan, check, where):
    report = audit(pair, fault, **plan)
    assert report["exit_code"] == 1, (fault, report["line"])
    caught = failed(report)
    if check:
        assert check in caught and where in caught[check], (fault, caught)
        assert report["line"].startswith("speclab audit: FAIL: ")
