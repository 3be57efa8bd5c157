"""Statistical and behavioural tests of the batched rejection sampler (Chapter 3, and Chapter 4's Triton backend).

Distribution tests. The target and the draft are first-order Markov chains over V tokens (the next-token law depends
on the previous token), so that every path must get conditioning right, not just marginals: a sampler that keeps the
tail after a rejection, or draws the bonus after one, emits tokens from distributions conditioned on a token that was
thrown away. Each trial starts from token 0 and calls the sampler repeatedly until it has L = kappa + 1 tokens of text;
the exact law of text position j is row 0 of P^j. Every position is tested with Pearson's chi-square at level
LEVEL = 1e-3 (Chapter 1's checker); for V = 16 the pair (text[0], text[1]) is tested jointly as well.

Power, not habit. Each law test names the smallest TV bias it must flag with probability POWER = 0.999 and draws the
fewest trials that reach it (Chapter 1's `draws_for_law`, which counts the bins left after pooling):
* TV_TOKEN = 0.02, Chapter 1's standard, for every position and the first pair at V = 16, and for `draw_tokens`;
* TV_WIDE = 0.04 at V = 4096. There every row is 4,096 wide (the Exp race over 4,096 entries, float32 running sums,
  the inverse CDF's fixed point), but the chain puts 99% of each row's mass on 16 tokens spread over the id range
  (0 and 4095 among them) and 1% on all the others, and the draft is 60% the target: acceptance is about 74%, so
  rejections, recoveries and bonuses all happen, and each position's law has few enough outcomes to be tested with
  power. (Random rows over all 4,096 tokens spread each position's law so thin that most outcomes are pooled: the old
  40,960-trial version could only promise TV 0.25.) Bounds count the pooled mass (Chapter 1's `law_detectable_tv`).
The wide test runs the sampler with check=False, the path the engine takes (its rows were validated once, upstream):
that skips only the validation of its 1,024 x 4,096 target and draft rows per call, and computes the same
tokens with the same coins (`test_unchecked_pieces_equal_checked`, every path; the narrow tests keep check=True, so the
law is established on both). Its exact laws and sizes are computed once per process (`wide_case`), for the three paths,
and it calls the sampler on WIDE_CHUNK = 512 trials at a time: with 4,096 (128 MB per row tensor) half of its CPU
time went to the kernel's page faults on fresh allocations, and 512 halves the block path's cost.
The planted bugs run at the narrow test's size and must each be rejected. The Triton interpreter is ~3,000x slower
than torch per trial, so it does not re-test the law: on seeded trials it must emit exactly the torch backend's text
(its kernels are the torch ops bit for bit, tests/test_kernels.py), and so it has the law established above.
"""
import math
from functools import lru_cache

import numpy as np
import pytest
import torch

from speclab.proof import LEVEL, chi_square_gof, detectable_tv, draws_for_law, law_detectable_tv
from speclab.sampling import (chain_sample, cu_num_draft_tokens, draw_tokens, generate_exponentials,
                              generate_residual_coins, generate_uniform_probs, random_sample, recovered_exponential,
                              recovered_inverse_cdf, rejection_sample, sampling_probs)

PATHS = [("standard", "exponential"), ("standard", "inverse_cdf"), ("block", "exponential")]
TV_TOKEN, TV_WIDE = 0.02, 0.04     # the smallest TV bias each law test flags with probability POWER (see above)
TRITON_TRIALS = 64                  # seeded trials each Triton path must reproduce token for token
WIDE_CHUNK = 512                    # wide trials per sampler call: 16 MB row tensors (see the docstring)


def markov(V, seed, sharpness):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, V, generator=g) * sharpness, -1)


def markov_wide(V, seed, support, sharpness=1.5, background=0.01):
    "A V x V chain with 1 - background of each row on `support` (softmax of random logits) and the rest spread evenly."
    g = torch.Generator().manual_seed(seed)
    P = torch.full((V, V), background / V)
    P[:, support] += (1 - background) * torch.softmax(torch.randn(V, len(support), generator=g) * sharpness, -1)
    return P


def wide_pair(V=4096):
    "The wide test's target and draft: 16 support tokens including 0 and V - 1; the draft is 60% the target."
    g = torch.Generator().manual_seed(3)
    support = torch.cat([torch.tensor([0, V - 1]), torch.randperm(V - 2, generator=g)[:14] + 1])
    P = markov_wide(V, 4, support)
    return P, 0.6 * P + 0.4 * markov_wide(V, 5, support)


def generate_text(sample, P, Q, kappa, trials, use_draft_probs, seed, chunk=None):
    """Text of kappa + 1 tokens per trial from repeated speculative steps; `sample(draft_ids, num, draft_probs,
    target_probs, bonus)` is the sampler under test. Drafts come from Q, target rows from P, both Markov."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the sampler draws from torch's global generator: seed it, or the tests run before decide
    L, V = kappa + 1, P.shape[0]
    chunk = chunk or trials
    offset = torch.arange(V, dtype=torch.float64)[:, None]
    # draws by inverse CDF, O(log V) a draw at V = 4096: row k's normalised CDF shifted to (k, k + 1], all V rows in
    # one sorted vector, searched at k + u (no [rows, V] gather per draw)
    cdf_q, cdf_p = ((M.double().cumsum(1) / M.double().sum(1, keepdim=True) + offset).reshape(-1) for M in (Q, P))

    def draw(cdf, rows):
        u = torch.rand(len(rows), 1, generator=g, dtype=torch.float64)[:, 0]
        return (torch.searchsorted(cdf, rows + u, right=True) - rows * V).clamp_(0, V - 1)
    texts = []
    for start in range(0, trials, chunk):
        R = min(chunk, trials - start)
        text = torch.full((R, L), -1)
        length = torch.zeros(R, dtype=torch.long)
        last = torch.zeros(R, dtype=torch.long)
        while (length < L).any():
            rows = (length < L).nonzero()[:, 0]
            prev, drafts = last[rows], []
            for _ in range(kappa):
                prev = draw(cdf_q, prev)
                drafts.append(prev)
            drafts = torch.stack(drafts, 1)                                   # [r, kappa]
            ctx = torch.cat([last[rows, None], drafts[:, :-1]], 1)            # token before each draft
            target_probs = P[ctx].reshape(-1, V)
            draft_probs = Q[ctx].reshape(-1, V) if use_draft_probs else None
            bonus = draw(cdf_p, drafts[:, -1])
            out = sample(drafts.reshape(-1), torch.full((len(rows),), kappa), draft_probs, target_probs, bonus)
            take = torch.minimum((out >= 0).sum(1), L - length[rows])       # emitted tokens still needed
            keep = torch.arange(out.shape[1])[None] < take[:, None]
            r_idx = rows[:, None].expand_as(out)[keep]
            text[r_idx, (length[rows, None] + torch.arange(out.shape[1])[None])[keep]] = out[keep]
            length[rows] += take
            last[rows] = text[rows, length[rows] - 1]
        texts.append(text)
    return torch.cat(texts)


def position_laws(P, L, pairs=False):
    "Exact laws of text positions 0 .. L-1 (row 0 of P^(j+1)), and of the first pair when asked."
    P = P.double()
    law, laws = torch.eye(P.shape[0], dtype=torch.float64)[0], []
    for _ in range(L):
        law = law @ P
        laws.append(law.numpy())
    if pairs:
        laws.append((P[0][:, None] * P).reshape(-1).numpy())
    return laws


def trials_for(P, L, tv, pairs=False):
    "Fewest trials at which every position (and the pair) test flags a TV bias of `tv` with probability POWER."
    return max(draws_for_law(law, tv) for law in position_laws(P, L, pairs))


def position_tests(text, P, pairs=False, laws=None):
    "Chi-square p-values of every text position (and optionally the first pair) against the exact Markov law."
    V, L = P.shape[0], text.shape[1]
    codes = [text[:, j] for j in range(L)] + ([text[:, 0] * V + text[:, 1]] if pairs else [])
    laws = laws or position_laws(P, L, pairs)   # Pr(text0 = a, text1 = b) = P[0,a] P[a,b] for the pair
    return [chi_square_gof(torch.bincount(c, minlength=len(law)).numpy(), law)[1] for c, law in zip(codes, laws)]


def flagged_tv(P, L, trials, pairs=False):
    "The largest TV bias, over the position (and pair) tests, that they might miss at `trials` draws."
    return max(law_detectable_tv(law, trials) for law in position_laws(P, L, pairs))


def sampler(method, recovery, backend="torch", check=True):
    return lambda *a: rejection_sample(*a, method=method, recovery=recovery, backend=backend, check=check)


@lru_cache(maxsize=None)
def wide_case(kappa=2):
    """The wide test's chains, the exact laws of its kappa + 1 positions, its trials (`trials_for` at TV_WIDE) and the
    TV its tests flag: computed once per process for the three paths."""
    P, Q = wide_pair()
    laws = position_laws(P, kappa + 1)
    trials = max(draws_for_law(law, TV_WIDE) for law in laws)
    return P, Q, laws, trials, max(law_detectable_tv(law, trials) for law in laws)


# --- distribution: every path, every position -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("method,recovery", PATHS)
@pytest.mark.parametrize("use_draft_probs", [True, False])
def test_distribution_narrow_vocab(method, recovery, use_draft_probs):
    "V = 16, kappa = 3: each of the 4 positions and the first pair follow the target (each test flags TV_TOKEN)."
    V = 16
    P, Q = markov(V, 1, 1.5), markov(V, 2, 1.5)
    trials = trials_for(P, 4, TV_TOKEN, pairs=True)
    text = generate_text(sampler(method, recovery), P, Q, 3, trials, use_draft_probs, seed=3)
    assert flagged_tv(P, 4, trials, pairs=True) <= TV_TOKEN
    pvals = position_tests(text, P, pairs=True)
    assert min(pvals) > LEVEL, pvals


@pytest.mark.slow
@pytest.mark.parametrize("method,recovery", PATHS)
def test_distribution_wide_vocab(method, recovery):
    """V = 4096, kappa = 2: each position follows the target (each test flags TV_WIDE, pooled mass included). The
    sampler runs unchecked, as in the engine (see the module docstring)."""
    P, Q, laws, trials, flags = wide_case()
    text = generate_text(sampler(method, recovery, check=False), P, Q, 2, trials, True, seed=6, chunk=WIDE_CHUNK)
    assert flags <= TV_WIDE
    pvals = position_tests(text, P, laws=laws)
    assert min(pvals) > LEVEL, pvals


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_greedy_equals_greedy_decoding(backend):
    "Temperature zero: speculative output is exactly the target's greedy chain, whatever the drafts."
    V, kappa, R = 32, 4, 300
    P, Q = markov(V, 7, 2.0), markov(V, 8, 2.0)
    greedy_next = P.argmax(-1)
    g = torch.Generator().manual_seed(9)
    last = torch.randint(V, (R,), generator=g)
    drafts = torch.stack([torch.randint(V, (R,), generator=g) if i % 2 else greedy_next[last] for i in range(kappa)], 1)
    ctx = torch.cat([last[:, None], drafts[:, :-1]], 1)
    out = rejection_sample(drafts.reshape(-1), [kappa] * R, None, P[ctx].reshape(-1, V), greedy_next[drafts[:, -1]],
                           is_greedy=torch.ones(R, dtype=torch.bool), backend=backend)
    for r in range(R):
        emitted, prev = out[r][out[r] >= 0].tolist(), last[r].item()
        for tok in emitted:
            assert tok == greedy_next[prev].item()
            prev = tok


# --- planted bugs are caught ------------------------------------------------------------------------------------------

def _bug_sample(bug):
    "Chapter 1's classic bugs as batched torch variants of the standard path (bug='none': the correct rule)."
    def sample(draft_ids, num, draft_probs, target_probs, bonus):
        n = torch.as_tensor(num)
        cu, B, kappa = cu_num_draft_tokens(n), len(n), int(n[0])
        u, e = generate_uniform_probs(n), generate_exponentials(n, target_probs.shape[1])
        rec = recovered_exponential(cu, draft_ids, draft_probs, target_probs, e)
        if bug == "resample_from_p": rec = torch.argmax(target_probs / e.repeat_interleave(kappa, 0), -1)
        rows = torch.arange(B * kappa)
        p, q = target_probs[rows, draft_ids].double(), draft_probs[rows, draft_ids].double()
        acc = ((p >= 0.1) if bug == "threshold_on_p" else (u * q < p)).view(B, kappa)
        d, rec = draft_ids.view(B, kappa), rec.view(B, kappa)
        tokens = torch.where(acc, d, rec)
        out = torch.full((B, kappa + 2), -1)
        if bug == "keep_tail":                       # never stop: every position emits, then the bonus
            out[:, :kappa], out[:, kappa] = tokens, bonus
            return out[:, : kappa + 1]
        num_acc = torch.cumprod(acc.long(), 1).sum(1)
        pos = torch.arange(kappa)[None]
        out[:, :kappa] = torch.where(pos <= num_acc[:, None], tokens, -1)
        full = num_acc == kappa
        out[full, kappa] = bonus[full]
        if bug == "bonus_after_reject": out[~full, num_acc[~full] + 1] = bonus[~full]
        return out
    return sample


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["resample_from_p", "threshold_on_p", "keep_tail", "bonus_after_reject"])
def test_planted_bugs_are_caught(bug):
    "Each of Chapter 1's bugs is rejected by the narrow test at the narrow test's own size."
    V = 16
    P, Q = markov(V, 1, 1.5), markov(V, 2, 1.5)
    text = generate_text(_bug_sample(bug), P, Q, 3, trials_for(P, 4, TV_TOKEN, pairs=True), True, seed=11)
    assert min(position_tests(text, P, pairs=True)) < LEVEL


def test_correct_variant_of_bug_harness_passes():
    "The same harness with no bug passes, so the bug tests measure the bugs and not the harness."
    V = 16
    P, Q = markov(V, 1, 1.5), markov(V, 2, 1.5)
    text = generate_text(_bug_sample("none"), P, Q, 3, trials_for(P, 4, TV_TOKEN, pairs=True), True, seed=11)
    assert min(position_tests(text, P, pairs=True)) > LEVEL


# --- seeds: determinism and batch independence ------------------------------------------------------------------------

def _seeded_case(V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    num = [3, 0, 4, 2]
    N = sum(num)
    target = torch.softmax(torch.randn(N, V, generator=g), -1)
    draft = torch.softmax(torch.randn(N, V, generator=g), -1)
    ids = torch.randint(V, (N,), generator=g)
    return ids, num, draft, target, torch.randint(V, (4,), generator=g)


@pytest.mark.parametrize("method,recovery", PATHS)
def test_seeded_determinism(method, recovery):
    ids, num, draft, target, bonus = _seeded_case()
    gens = lambda: [torch.Generator().manual_seed(s) for s in (1, 2, 3, 4)]
    outs = [rejection_sample(ids, num, draft, target, bonus, generators=gens(), method=method, recovery=recovery)
            for _ in range(20)]
    assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("method,recovery", PATHS)
def test_seeded_row_independent_of_batch(method, recovery):
    "Request 2 (seeded) gives the same tokens alone, in its batch, and in a reshuffled, larger batch."
    ids, num, draft, target, bonus = _seeded_case()
    kw = dict(method=method, recovery=recovery)
    rows = slice(3, 7)  # request 2's rows in the flat layout
    alone = rejection_sample(ids[rows], [4], draft[rows], target[rows], bonus[2:3],
                             generators=[torch.Generator().manual_seed(5)], **kw)[0]
    full = rejection_sample(ids, num, draft, target, bonus, generators=[None, None, torch.Generator().manual_seed(5), None], **kw)[2]
    perm = [2, 3, 6, 4, 5, 0, 1, 7, 8]  # a batch with the request first, then the others' rows
    order = torch.cat([torch.arange(3, 7), torch.arange(7, 9), torch.arange(0, 3)])
    other = rejection_sample(ids[order], [4, 2, 3], draft[order], target[order], bonus[[2, 3, 0]],
                             generators=[torch.Generator().manual_seed(5), None, torch.Generator().manual_seed(9)], **kw)[0]
    assert torch.equal(alone, full) and torch.equal(alone, other)


# --- endpoints ---------------------------------------------------------------------------------------------------------

def test_zero_coin_never_accepts_zero_probability():
    V = 5
    target = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]] * 2)
    draft = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0]] * 2)
    ids, num, bonus = torch.tensor([0, 0]), [1, 1], torch.tensor([1, 2])
    zero = torch.zeros(2, dtype=torch.float64)
    for method, recovery in PATHS:
        for dp in (draft, None):
            out = rejection_sample(ids, num, dp, target, bonus, method=method, recovery=recovery, uniform_probs=zero)
            assert (out[:, 0] != 0).all() and (target[0, out[:, 0]] > 0).all(), (method, recovery, dp is None)


def test_coin_just_below_one_never_returns_zero_probability():
    V = 7
    target = torch.tensor([[0.0, 0.3, 0.2, 0.5, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[0.0, 0.6, 0.4, 0.0, 0.0, 0.0, 0.0]])
    cu, ids = cu_num_draft_tokens([1]), torch.tensor([1])
    top = torch.tensor([1 - 2 ** -53], dtype=torch.float64)
    assert recovered_inverse_cdf(cu, ids, draft, target, top).item() == 3        # residual: only token 3
    assert recovered_inverse_cdf(cu, ids, None, target, top).item() == 3         # p without token 1: the last positive
    tiny = torch.full((1, V), torch.finfo(torch.float32).tiny)
    assert target[0, recovered_exponential(cu, ids, None, target, tiny).item()] > 0
    out = rejection_sample(ids, [1], draft, target, torch.tensor([3]), recovery="inverse_cdf", uniform_probs=top,
                           residual_coins=top)
    assert target[0, out[0, 0]] > 0


def test_exponentials_are_never_zero():
    e = generate_exponentials(torch.tensor([1] * 64), 4096)
    assert (e > 0).all() and torch.isfinite(e).all()


@pytest.mark.parametrize("bad,match", [
    (lambda t: t.fill_(float("nan")), "NaN"), (lambda t: t.fill_(float("inf")), "NaN"),
    (lambda t: t.mul_(1.1), "sum to 1"), (lambda t: t.neg_(), "negative"),
])
def test_bad_rows_raise(bad, match):
    ids, num, draft, target, bonus = _seeded_case()
    with pytest.raises(ValueError, match=match):
        rejection_sample(ids, num, draft, bad(target.clone()), bonus)
    with pytest.raises(ValueError, match=match):
        rejection_sample(ids, num, bad(draft.clone()), target, bonus)


def test_bad_arguments_raise():
    ids, num, draft, target, bonus = _seeded_case()
    with pytest.raises(ValueError, match="num_draft_tokens"): rejection_sample(ids, [3, 0, 4, 1], draft, target, bonus)
    with pytest.raises(ValueError, match="num_draft_tokens"): rejection_sample(ids, [3, 0, 4, -2, 4], draft, target, bonus)
    with pytest.raises(ValueError, match="draft_token_ids"): rejection_sample(ids + 100, num, draft, target, bonus)
    with pytest.raises(ValueError, match="draft_probs"): rejection_sample(ids, num, draft[:, :10].softmax(-1), target, bonus)
    with pytest.raises(ValueError, match="is_greedy"): rejection_sample(ids, num, draft, target, bonus, is_greedy=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="generators"): rejection_sample(ids, num, draft, target, bonus, generators=[None])
    with pytest.raises(ValueError, match="recovery"): rejection_sample(ids, num, draft, target, bonus, recovery="gumbel")
    with pytest.raises(ValueError, match="threshold_acc"): rejection_sample(ids, num, draft, target, bonus, threshold_acc=0)
    with pytest.raises(TypeError, match="target_probs"): rejection_sample(ids, num, draft, target.numpy(), bonus)


def test_sampling_transforms_identical_for_draft_and_target():
    "One function, per-row parameters: the same logits and parameters give the same rows, in any row order."
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g) * 2
    t, k, p = torch.tensor([0.5, 1.0, 0.8, 1.2, 0.0, 1.0]), torch.tensor([0, 10, 40, 0, 0, 299]), torch.tensor([0.9, 1.0, 0.7, 0.5, 1.0, 0.95])
    a = sampling_probs(logits, t, k, p)
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    assert torch.equal(sampling_probs(logits[perm], t[perm], k[perm], p[perm]), a[perm])
    assert torch.allclose(sampling_probs(logits, t, k, p, top_p_method="sort"), a)


@pytest.mark.parametrize("use_draft_probs", [True, False])
@pytest.mark.parametrize("method,recovery", PATHS)
def test_triton_emits_the_torch_text(method, recovery, use_draft_probs):
    """The Triton backend (interpreter) on TRITON_TRIALS seeded trials of the narrow harness emits exactly the torch
    backend's text, token for token: the same coins reach the same kernels' decisions, so Triton has the law the
    torch tests above establish at full power. The trials cover rejections, full acceptances and the bonus."""
    V, trials = 16, TRITON_TRIALS
    P, Q = markov(V, 1, 1.5), markov(V, 2, 1.5)
    emitted = []   # tokens emitted per call of the torch sampler: rejections, acceptances and (with q) the bonus
    def torch_sampler(*args):
        out = sampler(method, recovery)(*args)
        emitted.append((out >= 0).sum(1))
        return out
    torch_text = generate_text(torch_sampler, P, Q, 3, trials, use_draft_probs, seed=13)
    triton_text = generate_text(sampler(method, recovery, backend="triton"), P, Q, 3, trials, use_draft_probs, seed=13)
    assert torch.equal(triton_text, torch_text)
    emitted = torch.cat(emitted)
    assert (emitted == 1).any() and (emitted >= 2).any(), emitted.bincount()
    assert (emitted == 4).any() or not use_draft_probs, emitted.bincount()   # one-hot q: all 3 accepted is rare


# --- draw_tokens: one token per row (the bonus draw) -----------------------------------------------------------------

def _draw_case(rows=9, V=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(rows, V, generator=g) * 2, -1)
    greedy = (torch.rand(rows, generator=g) < 0.3).tolist()
    share = torch.randint(0, 3, (rows,), generator=g).tolist()   # which of three generators each row uses
    return probs, greedy, share


@pytest.mark.parametrize("seed", range(5))
def test_draw_tokens_one_call_per_generator(seed):
    "Rows sharing a generator draw as one multinomial call over them in row order; greedy rows take the argmax."
    probs, greedy, share = _draw_case(seed=seed)
    pool = [torch.Generator().manual_seed(100 + k) for k in range(3)]
    tokens = draw_tokens(probs, greedy, [pool[k] for k in share])
    ref = probs.argmax(-1)
    for k in range(3):
        rows = [i for i, (gr, s) in enumerate(zip(greedy, share)) if s == k and not gr]
        if rows:
            ref[rows] = torch.multinomial(probs[rows], 1, generator=torch.Generator().manual_seed(100 + k))[:, 0]
    assert torch.equal(tokens, ref)
    again = [torch.Generator().manual_seed(100 + k) for k in range(3)]
    assert torch.equal(draw_tokens(probs, torch.tensor(greedy), [again[k] for k in share]), tokens)   # a bool tensor


def test_draw_tokens_greedy_rows_touch_no_generator():
    probs, greedy, share = _draw_case()
    gens = [torch.Generator().manual_seed(k) for k in range(len(greedy))]
    before = [g.get_state() for g in gens]
    assert torch.equal(draw_tokens(probs, [True] * len(gens), gens), probs.argmax(-1))
    assert all(torch.equal(g.get_state(), b) for g, b in zip(gens, before))
    # a greedy row in the batch does not change what the random rows sharing its generator draw
    mixed = draw_tokens(probs[:4], [False, True, False, False], [torch.Generator().manual_seed(1)] * 4)
    alone = draw_tokens(probs[[0, 2, 3]], [False] * 3, [torch.Generator().manual_seed(1)] * 3)
    assert torch.equal(mixed[[0, 2, 3]], alone) and mixed[1] == probs[1].argmax()


def test_draw_tokens_seeded_reproducible():
    "Same generator states, same tokens; a row with its own generator draws the same alone and in any batch."
    probs, greedy, share = _draw_case(rows=6)
    greedy = [False] * 6
    make = lambda: [torch.Generator().manual_seed(7)] + [torch.Generator().manual_seed(3)] * 5
    first = draw_tokens(probs, greedy, make())
    assert all(torch.equal(draw_tokens(probs, greedy, make()), first) for _ in range(5))
    alone = draw_tokens(probs[:1], [False], [torch.Generator().manual_seed(7)])
    order = [3, 1, 0, 5]
    shuffled = draw_tokens(probs[order], [False] * 4, [torch.Generator().manual_seed(9)] * 2 +
                           [torch.Generator().manual_seed(7), torch.Generator().manual_seed(9)])
    assert first[0] == alone[0] == shuffled[2]


def test_draw_tokens_law():
    "Rows of one law over V = 8, all sharing one generator, tested with chi-square at level LEVEL (flags TV_TOKEN)."
    V = 8
    p = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(4)), 0)
    n = draws_for_law(p.double().numpy(), TV_TOKEN)
    tokens = draw_tokens(p.expand(n, -1), [False] * n, [torch.Generator().manual_seed(5)] * n)
    assert chi_square_gof(torch.bincount(tokens, minlength=V).numpy(), p.double().numpy())[1] > LEVEL


@pytest.mark.parametrize("args,error,match", [
    ((torch.ones(3) / 3, [False], [None]), TypeError, "probs"),
    ((torch.ones(2, 3, dtype=torch.long), [False] * 2, [None] * 2), TypeError, "probs"),
    ((torch.ones(2, 3) / 3, [False], [None] * 2), ValueError, "is_greedy"),
    ((torch.ones(2, 3) / 3, [0, 1], [None] * 2), ValueError, "is_greedy"),
    ((torch.ones(2, 3) / 3, [False] * 2, [None]), ValueError, "generators"),
    ((torch.ones(2, 3) / 3, [False] * 2, None), ValueError, "generators"),
    ((torch.ones(2, 3) / 3, [False] * 2, [None, 5]), TypeError, "generators\\[1\\]"),
])
def test_draw_tokens_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        draw_tokens(*args)


# --- check=False: the trusted path of each piece does the same arithmetic, without the checks -----------------------

@pytest.mark.parametrize("method,recovery", PATHS)
@pytest.mark.parametrize("use_draft_probs", [True, False])
def test_unchecked_pieces_equal_checked(method, recovery, use_draft_probs):
    "rejection_sample, sampling_probs and draw_tokens with check=False: the same outputs and generator states."
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(9, 16, generator=g) * 2
    temperature, top_k = torch.tensor([0.0, 0.7, 1.3] * 3), torch.tensor([0, 3, 0] * 3)
    top_p, min_p = torch.tensor([1.0, 1.0, 0.8] * 3), torch.tensor([0.0, 0.1, 0.0] * 3)
    probs = sampling_probs(logits, temperature, top_k, top_p, min_p=min_p)
    assert torch.equal(sampling_probs(logits, temperature, top_k, top_p, min_p=min_p, check=False), probs)
    greedy = temperature == 0
    bonus = draw_tokens(probs[:3], greedy[:3], [torch.Generator().manual_seed(1)] * 3)
    assert torch.equal(draw_tokens(probs[:3], greedy[:3], [torch.Generator().manual_seed(1)] * 3, check=False), bonus)
    drafts, n = torch.randint(16, (6,), generator=g), [3, 0, 3]
    q = torch.softmax(torch.randn(6, 16, generator=g), -1) if use_draft_probs else None
    outs, states = [], []
    for check in (True, False):
        gens = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8), torch.Generator().manual_seed(7)]
        outs.append(rejection_sample(drafts, n, q, probs[3:], bonus, is_greedy=torch.tensor([False, True, False]),
                                     generators=gens, method=method, recovery=recovery, check=check))
        states.append([x.get_state() for x in gens])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*states))


def test_unchecked_rejection_sample_skips_the_row_checks(monkeypatch):
    "check=False reads no probability row for validation: check_inputs is never called."
    import speclab.sampling as sampling
    target = torch.softmax(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), -1)
    drafts, bonus = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 5])
    gens = lambda: [torch.Generator().manual_seed(3)] * 2
    expected = rejection_sample(drafts, [2, 2], None, target, bonus, generators=gens())

    def refuse(*args, **kwargs):
        raise AssertionError("check_inputs ran on the trusted path")
    monkeypatch.setattr(sampling, "check_inputs", refuse)
    assert torch.equal(rejection_sample(drafts, [2, 2], None, target, bonus, generators=gens(), check=False), expected)
    with pytest.raises(AssertionError, match="trusted path"):
        rejection_sample(drafts, [2, 2], None, target, bonus, generators=gens())
