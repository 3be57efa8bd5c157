"""Statistical, property-based and bad-input tests of speclab.proof (Chapter 1).

The notebook's own examples test each function on chosen cases; here hypothesis draws the cases, and the statistical
tests check the checkers themselves: their level (how often a correct sampler fails) and their power (how often a
biased one is flagged).
"""
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from speclab.proof import (LEVEL, POWER, accept_prob, acceptance_rate, accepted_mass, as_probs, chain_law,
                           check_chain_exactness, check_exactness, chi_square_gof, detectable_tv,
                           emitted_distribution, expected_tokens, greedy_fn, greedy_step, least_favourable_shift,
                           sample_token, spec_step, speculative_sample, step_law, target_law, thresholded_distribution,
                           toy_next_token_fn, tv_distance)


# --- strategies ---------------------------------------------------------------------------------------------------

@st.composite
def prob_vectors(draw, min_size=1, max_size=64, size=None):
    "Probability vectors with exact zeros, near-ties and point masses among them."
    n = size or draw(st.integers(min_size, max_size))
    w = np.array(draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1.0)), min_size=n, max_size=n)))
    if w.sum() == 0: w[draw(st.integers(0, n - 1))] = 1.0
    return w / w.sum()


@st.composite
def prob_pairs(draw, max_size=64):
    n = draw(st.integers(1, max_size))
    return draw(prob_vectors(size=n)), draw(prob_vectors(size=n))


# --- one position: the identities, on arbitrary pairs ---------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(prob_pairs())
def test_one_position_identities(pq):
    p, q = pq
    acc = accepted_mass(p, q)
    np.testing.assert_allclose(acc, np.minimum(p, q), atol=1e-15)
    assert abs(acceptance_rate(p, q) - (1 - tv_distance(p, q))) < 1e-12
    assert abs(np.maximum(p - q, 0).sum() - (1 - acceptance_rate(p, q))) < 1e-12
    assert np.abs(emitted_distribution(p, q) - p).max() < 1e-12


@settings(max_examples=100, deadline=None)
@given(prob_pairs(max_size=16), st.floats(0.05, 1.0))
def test_threshold_only_exact_at_one(pq, t):
    "Raising acceptance by 1/threshold leaves p unchanged only when it changes nothing (t = 1 or q accepted anyway)."
    p, q = pq
    out = thresholded_distribution(p, q, t)
    assert abs(out.sum() - 1) < 1e-12
    if t == 1.0: assert np.abs(out - p).max() < 1e-12
    # the bias is never away from the draft: the output is at least as close to q as p is
    assert tv_distance(out, q) <= tv_distance(p, q) + 1e-12


# --- chaining: exact laws by enumeration -----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 10_000), st.sampled_from([0.2, 1.0, 5.0]))
def test_chain_law_equals_target_law(V, kappa, seed, conc):
    tf, df = toy_next_token_fn(V, seed=seed), toy_next_token_fn(V, seed=seed + 1, concentration=conc)
    n_tokens = 2 if V == 4 else 3
    spec, ref = chain_law((seed % V,), tf, df, kappa, n_tokens), target_law((seed % V,), tf, n_tokens)
    assert set(spec) <= set(ref)
    assert max(abs(spec.get(k, 0.0) - v) for k, v in ref.items()) < 1e-12


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(0, 10_000))
def test_step_law_is_a_distribution_with_mean_E(V, kappa, seed):
    "With the same (p, q) at every position, the step length has mean E(alpha, kappa), alpha = 1 - TV."
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.full(V, 0.5))
    law = step_law((), lambda t: p, lambda t: q, kappa)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert all(1 <= len(s) <= kappa + 1 for s in law)
    mean_len = sum(len(s) * m for s, m in law.items())
    assert abs(mean_len - expected_tokens(acceptance_rate(p, q), kappa)) < 1e-12


@pytest.mark.parametrize("bug", ["keep_tail", "bonus_after_reject"])
def test_chain_bugs_are_biased_exactly(bug):
    tf, df = toy_next_token_fn(3, seed=5), toy_next_token_fn(3, seed=6, concentration=0.5)
    assert tv_distance(chain_law((0,), tf, df, 2, 3, **{bug: True}), target_law((0,), tf, 3)) > 0.05


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_greedy_collapse(V, kappa, seed):
    "The exact rule on one-hot distributions is a point mass on greedy_step's output, which is plain greedy text."
    tf, df = toy_next_token_fn(V, seed=seed, concentration=0.5), toy_next_token_fn(V, seed=seed + 7, concentration=0.5)
    out = greedy_step((0,), tf, df, kappa)
    assert step_law((0,), greedy_fn(tf), greedy_fn(df), kappa) == {tuple(out): 1.0}
    assert list(target_law((0,), greedy_fn(tf), len(out))) == [tuple(out)]


# --- sampling edge cases -------------------------------------------------------------------------------------------

class FixedCoin:
    "A stand-in generator whose every coin is `u`: drives sample_token to the ends of [0, 1)."
    def __init__(self, u): self.u = u
    def random(self): return self.u


@settings(max_examples=200, deadline=None)
@given(prob_vectors(max_size=32))
def test_sample_token_never_emits_zero_probability(p):
    for u in (0.0, np.nextafter(1.0, 0.0)):
        assert p[sample_token(p, FixedCoin(u))] > 0


def test_accept_prob_edges():
    assert accept_prob(0.0, 0.0) == 0.0 and accept_prob(0.3, 0.0) == 0.0
    assert accept_prob(0.6, 0.3) == 1.0 and accept_prob(0.3, 0.6) == 0.5


# --- the checkers: level and power ---------------------------------------------------------------------------------
# Each check runs at level LEVEL = 1e-3 (a correct sampler fails with probability 1e-3) and, at its default
# n = 50,000, is sized to flag a TV bias of 0.02 on V <= 8 with probability >= POWER = 0.999. The tests below measure
# both with vectorised multinomial counts; their own pass/fail bounds are binomial tails at 1e-6, so a correct
# implementation fails these tests with probability about 1e-6 (they are seeded, hence deterministic, anyway).

@pytest.mark.parametrize("V", [2, 3, 5, 8])
def test_checker_level_and_power(V):
    rng = np.random.default_rng(V)
    p = rng.dirichlet(np.ones(V))
    n, trials = 50_000, 3000
    assert detectable_tv(n, V) < 0.02
    false_alarms = sum(chi_square_gof(c, p)[1] < LEVEL for c in rng.multinomial(n, p, size=trials))
    assert false_alarms <= stats.binom.isf(1e-6, trials, LEVEL)
    biased = least_favourable_shift(p, 0.02)
    misses = sum(chi_square_gof(c, p)[1] >= LEVEL for c in rng.multinomial(n, biased, size=trials))
    assert misses <= stats.binom.isf(1e-6, trials, 1 - POWER)


def random_shift(p, tv, rng):
    "A law at TV distance exactly `tv` from p in a random direction (moves mass between random token sets)."
    for _ in range(1000):
        d = rng.normal(size=len(p)) * (p > 0)
        d -= d[p > 0].mean() * (p > 0)
        d *= tv / (0.5 * np.abs(d).sum())
        if (p + d).min() >= 0: return p + d
    raise RuntimeError("no feasible shift")


def test_checker_flags_random_biases():
    "Biases of TV 0.02 in random directions (not designed to be caught) are all flagged at n = 50,000."
    rng = np.random.default_rng(0)
    for trial in range(200):
        V = int(rng.integers(2, 9))
        p = rng.dirichlet(np.ones(V))
        counts = rng.multinomial(50_000, random_shift(p, 0.02, rng))
        assert chi_square_gof(counts, p)[1] < LEVEL, (trial, V)


def test_check_exactness_end_to_end():
    "Real sampler callables through check_exactness: the exact rule passes, a TV-0.02 biased sampler fails."
    rng = np.random.default_rng(1)
    for V in (2, 5, 8):
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        assert check_exactness(speculative_sample, p, q, seed=V).passed
        shifted = random_shift(p, 0.02, rng)
        report = check_exactness(lambda p_, q_, r: sample_token(shifted, r), p, q, seed=V)
        assert not report.passed and report.detectable_tv < 0.02


def test_impossible_token_fails_outright():
    p = np.array([0.5, 0.5, 0.0])
    stat, pval, _ = chi_square_gof([10, 10, 1], p)
    assert stat == float("inf") and pval == 0.0


def test_check_chain_exactness():
    tf, df = toy_next_token_fn(3, seed=21), toy_next_token_fn(3, seed=22, concentration=0.5)
    good = check_chain_exactness(spec_step, tf, df, (1,), 3, 3, n=20_000, seed=3)
    assert good.passed, good
    for bug in ("keep_tail", "bonus_after_reject"):
        step = partial(spec_step, **{bug: True})
        assert not check_chain_exactness(step, tf, df, (1,), 3, 3, n=20_000, seed=3).passed, bug


# --- bad input --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,match", [
    ([[0.5, 0.5]], "1-D"), ([], "non-empty"), ([0.5, float("nan")], "NaN"), ([0.5, float("inf")], "NaN"),
    ([1.2, -0.2], "negative"), ([0.5, 0.50001], "sum to 1"), (np.zeros(3), "sum to 1"),
])
def test_bad_probability_vectors(bad, match):
    with pytest.raises(ValueError, match=match):
        as_probs(bad, "draft_probs")
    with pytest.raises(ValueError, match="draft_probs"):
        as_probs(bad, "draft_probs")


def test_bad_arguments_name_themselves():
    p, q = np.full(4, 0.25), np.full(3, 1 / 3)
    tf = toy_next_token_fn(3)
    with pytest.raises(ValueError, match="same length"): emitted_distribution(p, q)
    with pytest.raises(ValueError, match="same length"): check_exactness(speculative_sample, p, q)
    with pytest.raises(ValueError, match="n must be >= 1"): check_exactness(speculative_sample, q, q, n=0)
    with pytest.raises(ValueError, match="kappa must be >= 1"): spec_step((), tf, tf, 0, np.random.default_rng())
    with pytest.raises(ValueError, match="kappa must be >= 1"): step_law((), tf, tf, 0)
    with pytest.raises(ValueError, match="kappa must be >= 1"): check_chain_exactness(spec_step, tf, tf, (), 0, 2)
    with pytest.raises(ValueError, match="n_tokens must be >= 1"): check_chain_exactness(spec_step, tf, tf, (), 2, 0)
    with pytest.raises(TypeError, match="kappa must be an int"): greedy_step((), tf, tf, 1.5)
    with pytest.raises(ValueError, match="alpha"): expected_tokens(-0.1, 3)
    with pytest.raises(ValueError, match="threshold"): thresholded_distribution(q, q, 1.5)
    with pytest.raises(ValueError, match="same length"):
        check_chain_exactness(spec_step, tf, toy_next_token_fn(4), (), 2, 2)


# --- the main job ------------------------------------------------------------------------------------------------------

def test_speclab_proof_cli():
    exe = Path(sys.executable).parent / "speclab"
    r = subprocess.run([exe, "proof", "--n", "20000"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert sum("exact" in l and "BIASED" not in l for l in lines) >= 6
    assert any("planted bug" in l and "caught" in l for l in lines)
