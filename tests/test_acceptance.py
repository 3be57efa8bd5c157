"""Chapter 9 (speclab.acceptance) beyond the chapter's own examples: the closed-form alpha against a numerical
maximum of the per-draft likelihood, the chi-square against scipy's, the measured crossing against Chapter 2's on
a curve it knows, the sweep holding acceptance fixed while only the batch size changes, and what Chapter 9's modules
import."""
import functools
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import optimize, stats

from speclab.acceptance import fit_alpha, iid_probs, iid_test, metrics_from_hist
from speclab.sweep import measured_crossing, sweep
from speclab.vllm_io import load_table, save_table
from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.roofline import SpecMetrics
from speclab.roofline import batch_speedup, crossing_batch
from speclab.testing import tiny_random_pair


def random_hist(rng, kappas=(1, 3, 5)) -> dict:
    "A random histogram of drafts for each kappa (counts 0..50)."
    return {k: rng.integers(0, 50, k + 1).tolist() for k in kappas}


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_alpha_is_the_likelihood_maximum(seed):
    "A / (A + R) maximises sum over drafts of log Pr(k | kappa), computed cell by cell from iid_probs (not from A, R)."
    hist = random_hist(np.random.default_rng(seed))
    def nll(alpha):
        return -sum(n * math.log(p) for k, counts in hist.items() for n, p in zip(counts, iid_probs(alpha, k)) if n)
    best = optimize.minimize_scalar(nll, bounds=(1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-10})
    assert abs(fit_alpha(metrics_from_hist(hist)).alpha - best.x) < 1e-6


def test_interval_is_the_likelihood_ratio_set():
    "At both ends of the 95% interval the log-likelihood is chi2_1(0.95) / 2 below its maximum."
    m = metrics_from_hist({4: [12, 9, 7, 5, 20]})
    fit = fit_alpha(m)
    ll = lambda a: fit.accepted * math.log(a) + fit.rejected * math.log(1 - a)
    for end in (fit.low, fit.high):
        assert abs(ll(fit.alpha) - ll(end) - stats.chi2.ppf(0.95, 1) / 2) < 1e-8


def test_chi_square_matches_scipy_when_no_cell_is_pooled():
    "One kappa, every expected count >= 5: the statistic and p-value are scipy's with ddof = 1 for the fitted alpha."
    counts = [300, 190, 150, 360]
    t = iid_test(metrics_from_hist({3: counts}))
    expected = iid_probs(t.alpha, 3) * sum(counts)
    ref = stats.chisquare(counts, expected, ddof=1)
    assert (t.df, round(t.statistic, 9), round(t.p_value, 9)) == (2, round(ref.statistic, 9), round(ref.pvalue, 9))
    given = iid_test(metrics_from_hist({3: counts}), alpha=0.6)
    ref = stats.chisquare(counts, iid_probs(0.6, 3) * sum(counts))
    assert (given.df, round(given.p_value, 9)) == (3, round(ref.pvalue, 9))


def test_fit_needs_the_histogram():
    "Counters without a per-draft histogram (mixed-length vLLM logs) cannot be fitted, and say so."
    m = SpecMetrics(num_drafts=10, num_draft_tokens=25, num_accepted_tokens=12, accepted_per_pos=[6, 4, 2])
    with pytest.raises(ValueError, match="does not cover every draft"):
        fit_alpha(m)
    with pytest.raises(ValueError, match="does not cover every draft"):
        iid_test(m)


def test_measured_crossing_recovers_chapter_2_on_its_own_curve():
    "Sampled densely, Chapter 2's speedup curve crosses 1 where crossing_batch says (to the grid's interpolation error)."
    alpha, kappa, c, t_star = 0.7, 3, 0.165, 295.0
    batches = np.unique(np.round(np.geomspace(1, 512, 400)))
    measured = measured_crossing(batches, batch_speedup(alpha, kappa, c, batches, t_star))
    assert abs(measured - crossing_batch(alpha, kappa, c, t_star)) < 1.0


def test_sweep_changes_only_the_batch(tmp_path):
    """On a float64 random pair, greedy: every batch size decodes the same prompts to the same counts (acceptance does
    not depend on concurrency), each row is a ratio of its own two throughputs, and the table round-trips."""
    target, draft = tiny_random_pair(vocab_size=16, context=64)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    rows = sweep(target, {"draft_model": ModelDrafter(draft), "ngram": NgramDrafter(2)}, prompts, [1, 2, 4],
                 kappas=(3,), output_lens=(10,), repeats=1, progress=False)
    assert [(r["drafter"], r["batch"]) for r in rows] == [(d, b) for d in ("draft_model", "ngram") for b in (1, 2, 4)]
    for drafter in ("draft_model", "ngram"):
        hists = [r["metrics"].hist for r in rows if r["drafter"] == drafter]
        assert all(h == hists[0] for h in hists), hists
    for r in rows:
        assert r["requests"] == 4 and r["speedup"] == pytest.approx(r["spec_tok_s"] / r["plain_tok_s"])
        assert r["E"] == pytest.approx(1 + sum(r["r"]))
    for suffix in (".csv", ".json"):
        back = load_table(save_table(rows, tmp_path / f"t{suffix}"))
        assert [b["metrics"] for b in back] == [r["metrics"] for r in rows]


def test_sweep_cycles_prompts_to_fill_a_large_batch():
    "A batch larger than the prompt list repeats prompts to fill it; the smaller batches decode the list once."
    target, draft = tiny_random_pair(vocab_size=16, context=64)
    rows = sweep(target, {"ngram": NgramDrafter(2)}, [[1, 2, 3], [4, 5, 6]], [1, 3], output_lens=(4,), repeats=1,
                 progress=False)
    assert [r["requests"] for r in rows] == [2, 3]


def test_measure_points_share_one_plain_baseline_and_refuse_bad_rate_sets():
    """`measure_points` times plain decoding once for every rate set: each row carries the same plain throughput, the
    exact row's counts do not depend on which synthetic rows ride along, and bad rate sets fail before any decoding."""
    from speclab.sweep import measure_points, sweep_tiny_pair
    from speclab.request import SamplingParams
    target, draft = tiny_random_pair(vocab_size=16, context=64)
    prompts, params = [[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=8)
    rows = measure_points(target, ModelDrafter(draft), prompts, 2, params, 3, rate_sets=[None, [0.9, 0.5, 0.2]],
                          repeats=1)
    alone = measure_points(target, ModelDrafter(draft), prompts, 2, params, 3, rate_sets=[None], repeats=1)
    assert len(rows) == 2 and rows[0]["plain_tok_s"] == rows[1]["plain_tok_s"]
    assert [r["synthetic"] for r in rows] == [False, True]
    assert rows[0]["metrics"].hist == alone[0]["metrics"].hist
    with pytest.raises(ValueError, match="rate_sets"):
        measure_points(target, ModelDrafter(draft), prompts, 2, params, 3, rate_sets=[])
    with pytest.raises(ValueError, match="exclude each other"):
        sweep_tiny_pair([1], synthetic=True, with_synthetic=True)


def test_synthetic_sampler_rates():
    """SyntheticSampler([0.9, 0.6, 0.3]) in the engine, kappa 3: the measured per-position acceptance is within the
    binomial tolerance z * sqrt(a (1 - a) / drafted_i) of the requested rate a at each position, z = the two-sided
    normal quantile at level 1e-3 (3.29). Rates are taken over the drafts that reached each position
    (accepted_per_pos / drafted_per_pos), so steps whose kappa was capped near max_tokens do not bias them. More than
    5,000 drafts reach each position, so at the widest tolerance (a = 0.6: z * SE = 0.023) a rate off by 0.03 is
    flagged with probability above 0.85, one off by 0.05 with probability above 0.999."""
    from speclab.sweep import SyntheticSampler
    from speclab.request import SamplingParams
    from speclab.engine import SpecDecoder
    from speclab.proof import LEVEL
    target, draft = tiny_random_pair()
    rates = [0.9, 0.6, 0.3]
    eng = SpecDecoder(target, ModelDrafter(draft), kappa=3, sampler=SyntheticSampler(rates), seed=7)
    eng.generate([[1, 2, 3, 1, 2]] * 1000, SamplingParams(temperature=1.0, max_tokens=24))
    m, z = eng.metrics, stats.norm.isf(LEVEL / 2)
    assert len(m.per_position) == 3 and min(m.drafted_per_pos) > 5_000
    for a, acc, n in zip(rates, m.accepted_per_pos, m.drafted_per_pos):
        assert abs(acc / n - a) <= z * np.sqrt(a * (1 - a) / n), (acc / n, a, n)


def test_synthetic_sampler_refuses_bad_rates():
    "Rates must be a non-increasing list in [0, 1]; measure_point refuses synthetic rates without a drafter."
    from speclab.sweep import SyntheticSampler, measure_point
    from speclab.request import SamplingParams
    with pytest.raises(ValueError, match="non-increasing"):
        SyntheticSampler([0.3, 0.6])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SyntheticSampler([1.2])
    with pytest.raises(ValueError, match="drafter"):
        measure_point(tiny_random_pair()[0], None, [[1]], 1, SamplingParams(), 3, synthetic_rates=[0.5])


LOADED = """
import sys
import speclab.acceptance, speclab.vllm_io
heavy = ("torch", "speclab.model", "speclab.engine", "speclab.train", "speclab.sweep", "speclab.remote", "httpx")
print(" ".join(m for m in heavy if m in sys.modules))
"""


@functools.lru_cache(maxsize=1)
def loaded_by_statistics_and_readers() -> frozenset:
    "The heavy modules a fresh interpreter holds after importing speclab.acceptance and speclab.vllm_io."
    r = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return frozenset(r.stdout.split())


def test_statistics_and_readers_import_no_sweep_no_client():
    "Chapter 9's statistics and readers work on counters: they import neither the sweep, the training code nor httpx."
    assert not {"speclab.train", "speclab.sweep", "speclab.remote", "httpx"} & loaded_by_statistics_and_readers()


def test_statistics_and_readers_import_no_model():
    "The statistics and the readers import no model, no engine and no torch (a fresh interpreter)."
    assert not {"torch", "speclab.model", "speclab.engine"} & loaded_by_statistics_and_readers()
