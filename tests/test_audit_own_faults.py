"""The auditor's own false passes: no path from NaN, an empty sample or a zero-degree-of-freedom table to
"pass", and a server that crashes on or refuses a documented field is named, never passed.

The servers here are `speclab.testing.fake_pair`: two small in-process servers that draw from one known law over six
words, with one of `SERVER_FAULTS` planted in the audited one. No model runs, so an audit takes seconds. The power of
the audit against the engine's own faults is tests/test_audit.py's business; here each case is decided by
construction (an empty bin, a crash, a refusal, a point-mass law), not by chance, except the exact pair's pass, which
fails on chance with probability at most its level (0.001), as do the other audits below that assert a pass.
"""
import math

import pytest

from speclab.audit import (DEFAULT_PROMPTS, SETTINGS, _chi_square, count_test, format_plan, holm, plan_audit,
                           run_audit, two_sample_test)
from speclab.testing import SERVER_FAULTS, fake_pair

T1 = {"t1.0": SETTINGS["t1.0"]}
K20 = {"t1.0,k20": SETTINGS["t1.0,k20"]}


def audit(fault, **plan):
    "A small audit of the fake pair with `fault` planted in the audited server."
    kw = dict(prompts=DEFAULT_PROMPTS[:12], budget=900, concurrency=8, settings=T1, penalties={}, num_seeds=8,
              concurrency_n=0, level=0.001)
    with fake_pair(fault) as (url, reference_url):
        return run_audit(url, reference_url, plan_audit(**{**kw, **plan}), progress=False, backoff=0.05)


def status(report):
    return {c["check"]: c["status"] for c in report["checks"]}


def test_every_server_fault_has_a_case():
    assert set(SERVER_FAULTS) == {"repeats_high", "crash_on_top_k", "dies_on_top_k", "refuse_seed"}


# The statistics: what could not be computed is NaN, never p = 1, and Holm refuses it.

def test_empty_low_bins_are_a_test_not_nan():
    "The issue's example: 75 zeros against 75 fives once gave bins with no draws at all, p = NaN, reported pass."
    statistic, p_value, df, rows = count_test([0] * 75, [5] * 75)
    assert df == 1 and p_value < 1e-30, (statistic, p_value, rows)
    assert all(r[1] + r[2] > 0 for r in rows)


def test_what_cannot_be_computed_is_nan():
    assert math.isnan(count_test([], [1, 2])[1])                       # an empty sample
    assert math.isnan(two_sample_test([], ["a"])[1])
    assert math.isnan(two_sample_test(["a"] * 50, ["a"] * 50)[1])       # one bin: no degrees of freedom
    assert math.isnan(_chi_square([("a", 5, 0), ("b", 0, 0)])[1])      # one server drew nothing in any bin
    with pytest.raises(ValueError, match="NaN"):
        holm([0.5, math.nan])


# Audits of planted servers: each ends as the issue says.

def test_exact_fake_pair_passes_with_every_test_powered():
    report = audit(None)
    assert report["exit_code"] == 0, report["line"]
    assert "each with power" in report["line"]
    assert all(not c["untested"] for c in report["checks"])


def test_repeats_high_fails_the_repeats_check():
    "The audited server's repeat counts all lie in the top bin, the reference's in the low ones: a FAIL, not a NaN."
    report = audit("repeats_high", settings={}, penalties={"presence2.0": {"temperature": 1.0,
                                                                           "presence_penalty": 2.0}}, repeat_tokens=6)
    assert report["exit_code"] == 1, report["line"]
    assert status(report)["repeats"] == "FAIL"
    repeats = next(t for t in report["tests"] if t["check"] == "repeats")
    assert repeats["df"] >= 1 and repeats["p_value"] < 1e-6


def test_a_crash_on_top_k_is_a_named_failure_and_the_audit_goes_on():
    report = audit("crash_on_top_k", settings={**T1, **K20})
    assert report["exit_code"] == 1, report["line"]
    assert report["line"].startswith("speclab audit: FAIL: fields") and "top_k" in report["line"]
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["fields"]["status"] == "FAIL"
    assert checks["laws"]["tested"] >= 1                              # the t1.0 cells still ran
    assert any("top_k" in why for _, why in checks["laws"]["untested"])
    assert status(report)["seeds"] == "pass" and status(report)["greedy"] == "pass"


def test_a_server_that_dies_on_top_k_is_named_and_the_rest_not_passed():
    report = audit("dies_on_top_k", settings={**T1, **K20})
    assert report["exit_code"] == 1, report["line"]
    assert "top_k" in report["line"]
    assert "audited" in report["down"]
    assert status(report)["laws"] == "not tested"
    blamed = [t["name"].split(":")[0] for t in report["tests"] if t["check"] == "fields"]
    assert blamed == ["top_k"], blamed                               # not the fields sent after the engine died
    assert report["requests_sent"] < 900                              # the dead server's requests were not sent


def test_a_refused_seed_cannot_pass():
    report = audit("refuse_seed")
    assert report["exit_code"] == 2, report["line"]
    assert report["line"].startswith("speclab audit: could not judge")
    assert status(report)["seeds"] == "not tested"
    assert "seed" in report["line"]


def point_mass_audit(**plan):
    "'with open(' at top-p 0.6 as the only law cell: the fake law there is one text, so no budget gives it power."
    lines = []
    with fake_pair(None) as (url, reference_url):
        kw = dict(prompts=["with open("] + list(DEFAULT_PROMPTS[:11]), budget=900, concurrency=8, num_law_prompts=1,
                  settings={"t0.8,p0.6": SETTINGS["t0.8,p0.6"]}, penalties={}, num_seeds=8, concurrency_n=0,
                  level=0.001)      # a pass is asserted: it fails on chance with probability at most 0.001
        report = run_audit(url, reference_url, plan_audit(**{**kw, **plan}), progress=False, on_power=lines.append)
    return report, lines[0]


def test_a_point_mass_cell_is_replaced_and_the_report_says_by_what():
    "The pilot sees one text; a spare prompt whose pilot splits takes the cell's place before the test's requests."
    report, power = point_mass_audit()
    assert report["exit_code"] == 0, report["line"]
    [swap] = report["replaced"]
    assert swap["cell"] == "'with open(' @ t0.8,p0.6" and swap["by"] not in (None, swap["cell"])
    assert "one bin" in swap["why"] and "no budget" in swap["why"]
    assert swap["tried"][0].startswith("'raise ValueError(' (")           # the spares in the prompts' order
    assert f"replaced: laws: {swap['cell']} by {swap['by']}" in power       # printed before the test's requests
    assert "NO POWER PREDICTED" not in power
    assert [c["prompt"] for c in report["plan"]["cells"]] == [swap["by"].split(" @ ")[0][1:-1]]
    assert any(n.startswith("replaced: laws") for n in report["notes"])
    assert report["requests_sent"] <= 900 * 1.05 + 30                   # the probes on top of the plan


def test_a_point_mass_cell_without_a_spare_is_written_off_with_its_reason():
    """No spare pilots: the powerless cell stays (a fault that splits its answers is still caught), and when its
    answers do fall into one bin the report says the pilot wrote it off: not tested, but no reason for exit 2."""
    report, power = point_mass_audit(spare_pilots=0)
    [swap] = report["replaced"]
    assert swap["by"] is None and swap["tried"] == [] and not swap["spent"]
    assert f"written off: laws: {swap['cell']}: no power" in power and "spare pilots spent" in power
    assert [c["prompt"] for c in report["plan"]["cells"]] == ["with open("]
    laws = next(c for c in report["checks"] if c["check"] == "laws")
    assert laws["status"] == "written off" and laws["untested"] == [] and len(laws["written_off"]) == 1
    assert report["exit_code"] == 0, report["line"]
    assert "written off by the pilot" in report["line"]


def test_the_plan_names_checks_without_power_and_what_would_give_it():
    "Four prompts cannot give the greedy check power, nor three seeds the seeds check: the plan says so, up front."
    text = format_plan(plan_audit(prompts=DEFAULT_PROMPTS[:4], budget=3000, num_seeds=3))
    greedy = next(line for line in text.splitlines() if line.lstrip().startswith("greedy"))
    seeds = next(line for line in text.splitlines() if line.lstrip().startswith("seeds"))
    assert "none (not tested)" in greedy and "no power: needs at least" in greedy
    assert "none (not tested)" in seeds and "seed pairs" in seeds
    assert "none" not in next(line for line in text.splitlines() if line.lstrip().startswith("laws"))


def test_a_server_that_returns_no_logprobs_is_not_a_finding():
    "The fake servers return tokens without token_logprobs: the logprobs check is not run, says so, and passes stand."
    report = audit(None, penalties={"presence2.0": {"temperature": 1.0, "presence_penalty": 2.0}}, repeat_tokens=6)
    assert status(report)["logprobs"] == "not run"
    assert any(n.startswith("logprobs: no audited penalty-cell answer came with a log-prob") for n in report["notes"])
    assert report["exit_code"] == 0, report["line"]


def test_one_text_cell_is_set_aside_only_beside_tested_cells():
    """A two-sample cell whose answers from both servers fell into one bin cannot reject (df 0): beside a tested cell
    of its check it is listed and the audit can PASS; as its check's only cell it still makes it "could not judge"."""
    from speclab.audit import TestResult, summarise, verdict_line
    one = TestResult("laws", "'a' @ t1.0", math.nan, math.nan, 0, (300, 300), reason="every answer in one bin")
    split = TestResult("laws", "'b' @ t1.0", 3.0, 0.4, 4, (300, 300), bound=0.2)
    greedy = TestResult("greedy", "greedy", 0.0, 1.0, 1, (12, 12), bound=0.3)
    checks = summarise([one, split, greedy], 0.01)
    laws = next(c for c in checks if c["check"] == "laws")
    assert laws["status"] == "pass" and laws["untested"] == [] and laws["written_off"] == [[one.name, one.reason]]
    code, line = verdict_line(checks, 0.01, 3, 600, 1.0)
    assert code == 0 and "one text on both servers" in line, line
    alone = summarise([one, greedy], 0.01)
    assert next(c for c in alone if c["check"] == "laws")["status"] == "not tested"
    assert verdict_line(alone, 0.01, 2, 600, 1.0)[0] == 2
