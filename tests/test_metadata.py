"""Property and bad-input tests of `speclab.metadata` (Chapter 5).

Hypothesis draws ragged batches: 1 to 12 requests, 0 to 7 drafts each (token ids in [0, 50_000)), and either no
`cu_num_scheduled_tokens` (each request schedules 1 + n_b tokens) or 0 to 50 extra scheduled tokens per request
(prompt chunks, recomputed context). Each property runs on 300 examples.
"""
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from speclab.metadata import SpecDecodeMetadata, draft_tokens_from_inputs
from speclab.proof import LEVEL, chi_square_gof, detectable_tv, draws_for_tv
import speclab.metadata as metadata
import speclab.sampling as sampling_module
from speclab.sampling import (PLACEHOLDER_TOKEN_ID, ProcessorRows, SamplingMetadata, SpecDecodeIndices,
                              cu_num_draft_tokens, draw_tokens, expand_batch_to_tokens, rejection_sample,
                              rejection_sampler, sampling_probs)


@st.composite
def batches(draw):
    "(drafts, cu_num_scheduled_tokens or None, the scheduled counts actually used)."
    drafts = draw(st.lists(st.lists(st.integers(0, 49_999), max_size=7), min_size=1, max_size=12))
    if draw(st.booleans()):
        return drafts, None, [len(d) + 1 for d in drafts]
    counts = [len(d) + 1 + draw(st.integers(0, 50)) for d in drafts]
    return drafts, torch.cumsum(torch.tensor(counts), 0).tolist(), counts


def flat_input_ids(drafts, cu_sched, prompt_token=3):
    "A flat batch whose request b ends with [last committed token (b), *drafts[b]]; earlier positions are prompt."
    ids = torch.full((cu_sched[-1],), prompt_token)
    for b, (d, end) in enumerate(zip(drafts, cu_sched)):
        ids[end - len(d) - 1:end] = torch.tensor([b, *d])
    return ids


@settings(max_examples=300, deadline=None)
@given(batches())
def test_index_invariants(batch):
    drafts, cu_arg, counts = batch
    md = SpecDecodeMetadata.from_drafts(drafts, cu_arg)
    n = [len(d) for d in drafts]
    B, N = len(n), sum(n)
    cu_sched = torch.cumsum(torch.tensor(counts), 0)
    assert md.num_draft_tokens == n and md.max_spec_len == max(n)
    assert md.draft_token_ids.tolist() == [t for d in drafts for t in d]
    # one bonus index per request, one target index per draft, N + B logits indices
    assert md.bonus_logits_indices.shape == (B,) and md.target_logits_indices.shape == (N,)
    assert md.logits_indices.shape == (N + B,)
    # cu arrays: Chapter 3's prefix sum, and one sampled row more than drafts per request
    assert torch.equal(md.cu_num_draft_tokens, cu_num_draft_tokens(n))
    assert torch.equal(md.cu_num_sampled_tokens, cu_num_draft_tokens([k + 1 for k in n]))
    assert torch.equal(md.bonus_logits_indices, md.cu_num_sampled_tokens - 1)
    # logits indices strictly increasing, inside the scheduled batch, each request's last n_b + 1 positions
    li = md.logits_indices
    assert bool((li[1:] > li[:-1]).all()) and int(li[0]) >= 0 and int(li[-1]) < int(cu_sched[-1])
    expect = [p for b in range(B) for p in range(int(cu_sched[b]) - n[b] - 1, int(cu_sched[b]))]
    assert li.tolist() == expect
    # target and bonus rows partition range(N + B), in order
    is_bonus = torch.zeros(N + B, dtype=torch.bool)
    is_bonus[md.bonus_logits_indices] = True
    assert int(is_bonus.sum()) == B
    assert torch.equal(md.target_logits_indices, torch.arange(N + B)[~is_bonus])
    # the drafts are the inputs one sampled position after each target row
    assert torch.equal(draft_tokens_from_inputs(flat_input_ids(drafts, cu_sched.tolist()), md), md.draft_token_ids)
    assert all(v.dtype == torch.int64 for v in (md.draft_token_ids, md.cu_num_draft_tokens, md.cu_num_sampled_tokens,
                                               md.target_logits_indices, md.bonus_logits_indices, li))


@settings(max_examples=300, deadline=None)
@given(batches(), st.data())
def test_expand_batch_to_tokens(batch, data):
    drafts, cu_arg, _ = batch
    md = SpecDecodeMetadata.from_drafts(drafts, cu_arg)
    B, N = len(drafts), sum(md.num_draft_tokens)
    temp = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 0.7, 1.0, 1.3]), min_size=B, max_size=B)))
    rows = expand_batch_to_tokens(temp, md.cu_num_draft_tokens, N, replace_from=0.0, replace_to=1.0)
    req = torch.repeat_interleave(torch.arange(B), torch.tensor(md.num_draft_tokens))
    assert torch.equal(rows, torch.where(temp[req] == 0, 1.0, temp[req]))
    sampled = expand_batch_to_tokens(temp, md.cu_num_sampled_tokens, N + B, 0.0, 1.0)
    assert torch.equal(sampled[md.target_logits_indices], rows)
    assert torch.equal(expand_batch_to_tokens(temp, md.cu_num_sampled_tokens, N + B)[md.bonus_logits_indices], temp)


@settings(max_examples=100, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def test_feeds_rejection_sample(batch, seed):
    "Metadata built from drafts in [0, V) drives Chapter 3's sampler; the output is [B, max_spec_len + 1]."
    drafts, cu_arg, _ = batch
    V = 64
    drafts = [[t % V for t in d] for d in drafts]
    md = SpecDecodeMetadata.from_drafts(drafts, cu_arg)
    B, N = len(drafts), sum(md.num_draft_tokens)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N + B, V, generator=g)
    bonus = logits[md.bonus_logits_indices].argmax(-1)
    out = rejection_sample(md.draft_token_ids, md.num_draft_tokens, None,
                           torch.softmax(logits[md.target_logits_indices], -1), bonus,
                           generators=[torch.Generator().manual_seed(seed + b) for b in range(B)])
    assert out.shape == (B, md.max_spec_len + 1)
    emitted = (out != PLACEHOLDER_TOKEN_ID).sum(1)
    assert bool((emitted >= 1).all()) and bool((emitted <= torch.tensor(md.num_draft_tokens) + 1).all())
    for b in (b for b in range(B) if md.num_draft_tokens[b] == 0):
        assert out[b, 0] == bonus[b]


def test_worked_example():
    md = SpecDecodeMetadata.from_drafts([[11, 12, 13], [], [21, 22], [], [31]], [4, 104, 107, 207, 209])
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert md.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert md.max_spec_len == 3


def test_no_speculation():
    md = SpecDecodeMetadata.from_drafts([[], []])
    assert md.max_spec_len == 0 and md.logits_indices.tolist() == [0, 1] and md.target_logits_indices.numel() == 0


BAD = [
    (([],), "draft_token_ids"),
    ((None,), "draft_token_ids"),
    (([1, 2],), "draft_token_ids[0]"),
    (([[1], [2, PLACEHOLDER_TOKEN_ID]],), "draft_token_ids[1]"),
    (([[1.0]],), "draft_token_ids[0]"),
    (([[True]],), "draft_token_ids[0]"),
    (([[1], []], [2]), "cu_num_scheduled_tokens"),
    (([[1], []], [2, 3, 4]), "cu_num_scheduled_tokens"),
    (([[1], []], [2.0, 3.0]), "cu_num_scheduled_tokens"),
    (([[1], []], torch.tensor([2.0, 3.0])), "cu_num_scheduled_tokens"),
    (([[1], []], torch.tensor([[2, 3]])), "cu_num_scheduled_tokens"),
    (([[], []], [0, 1]), "cu_num_scheduled_tokens"),
    (([[], []], [3, 2]), "cu_num_scheduled_tokens"),
    (([[1, 2], []], [2, 5]), "cu_num_scheduled_tokens"),   # request 0 schedules 2 < n_b + 1 = 3
    (([[], [1]], [1, 2]), "cu_num_scheduled_tokens"),      # request 1 schedules 1 < 2
]


@pytest.mark.parametrize("args,name", BAD)
def test_bad_input(args, name):
    before = copy.deepcopy(args)
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")):
        SpecDecodeMetadata.from_drafts(*args)
    for a, b in zip(args, before):   # nothing was modified on the way out
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)


def test_bad_input_helpers():
    md = SpecDecodeMetadata.from_drafts([[5, 6], []], [3, 10])
    with pytest.raises(ValueError, match="input_ids"):
        draft_tokens_from_inputs(torch.zeros(9, dtype=torch.long), md)
    with pytest.raises(ValueError, match="input_ids"):
        draft_tokens_from_inputs(torch.zeros(10), md)
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="num_tokens"):
        expand_batch_to_tokens(x, torch.tensor([2, 3]), 4)
    with pytest.raises(ValueError, match="cu_num_tokens"):
        expand_batch_to_tokens(x, torch.tensor([3, 2]), 2)
    with pytest.raises(ValueError, match="cu_num_tokens"):
        expand_batch_to_tokens(x, torch.tensor([1, 2, 3]), 3)
    with pytest.raises(ValueError, match="replace_from"):
        expand_batch_to_tokens(x, torch.tensor([1, 3]), 3, replace_from=0.0)
    with pytest.raises(ValueError, match="x must"):
        expand_batch_to_tokens([1.0, 2.0], torch.tensor([1, 3]), 3)


# --- the sampler entry point: SamplingMetadata + rejection_sampler ------------------------------------------------------

def settings_for(B, data, greedy=None):
    "Random per-request settings of a batch of B; `greedy` forces every temperature to 0 (True) or above 0 (False)."
    temps = [0.0, 0.5, 0.8, 1.0, 1.3] if greedy is None else ([0.0] if greedy else [0.5, 0.8, 1.0, 1.3])
    temperature = data.draw(st.lists(st.sampled_from(temps), min_size=B, max_size=B))
    top_k = data.draw(st.lists(st.sampled_from([0, 1, 3, 10]), min_size=B, max_size=B))
    top_p = data.draw(st.lists(st.sampled_from([1.0, 0.9, 0.6]), min_size=B, max_size=B))
    share = data.draw(st.lists(st.integers(0, 2), min_size=B, max_size=B))   # 0 and 1: shared generators, 2: own

    def make(seed):
        "Fresh generators with the drawn sharing pattern, seeded from `seed`."
        pool = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)]
        gens = [pool[s] if s < 2 else torch.Generator().manual_seed(seed + 2 + b) for b, s in enumerate(share)]
        return SamplingMetadata.from_lists(temperature, top_k, top_p, gens)
    return make


def manual_step(md, logits, draft_probs, sampling, backend="torch"):
    "The composition `rejection_sampler` replaces: expand the settings, transform, draw the bonus, verify."
    rows = len(md.logits_indices)
    cu = md.cu_num_sampled_tokens
    probs = sampling_probs(logits, expand_batch_to_tokens(sampling.temperature, cu, rows),
                           expand_batch_to_tokens(sampling.top_k, cu, rows),
                           expand_batch_to_tokens(sampling.top_p, cu, rows))
    bonus = draw_tokens(probs[md.bonus_logits_indices], sampling.is_greedy, sampling.generators)
    out = rejection_sample(md.draft_token_ids, md.num_draft_tokens, draft_probs, probs[md.target_logits_indices],
                           bonus, is_greedy=sampling.is_greedy, generators=sampling.generators, backend=backend)
    return out, bonus


def greedy_by_hand(md, logits):
    "Greedy verification one request at a time: each draft row's argmax until a mismatch, else the bonus row's."
    argmax = logits.argmax(-1).tolist()
    drafts = md.draft_token_ids.tolist()
    outs, row, first = [], 0, 0
    for n_b in md.num_draft_tokens:
        emitted = []
        for i in range(n_b):
            emitted.append(argmax[row + i])
            if drafts[first + i] != argmax[row + i]:
                break
        else:
            emitted.append(argmax[row + n_b])
        outs.append(emitted + [PLACEHOLDER_TOKEN_ID] * (md.max_spec_len + 1 - len(emitted)))
        row += n_b + 1
        first += n_b
    return torch.tensor(outs)


def step_inputs(batch, seed, V=16, agree=0.5):
    "Metadata over drafts in [0, V), logits [N + B, V] whose argmax equals the draft at about `agree` of the rows, q."
    drafts, cu_arg, _ = batch
    drafts = [[t % V for t in d] for d in drafts]
    md = SpecDecodeMetadata.from_drafts(drafts, cu_arg)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(md.logits_indices), V, generator=g) * 2
    boost = torch.rand(len(md.draft_token_ids), generator=g) < agree
    logits[md.target_logits_indices[boost], md.draft_token_ids[boost]] += 10.0
    q = torch.softmax(torch.randn(len(md.draft_token_ids), V, generator=g) * 2, -1)
    return md, logits, q


def states(sampling):
    return [g.get_state() for g in sampling.generators]


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1), st.booleans(), st.data())
def test_sampler_equals_manual_composition(batch, seed, use_q, data):
    "A mixed batch: the sampler's tokens and generator states equal the hand-written sequence with the same seeds."
    md, logits, q = step_inputs(batch, seed)
    make = settings_for(len(md.num_draft_tokens), data)
    a, b = make(seed), make(seed)
    out = rejection_sampler(md, logits, q if use_q else None, a)
    expected, bonus = manual_step(md, logits, q if use_q else None, b)
    assert torch.equal(out, expected)
    assert all(torch.equal(x, y) for x, y in zip(states(a), states(b)))
    assert out.shape == (len(md.num_draft_tokens), md.max_spec_len + 1)
    for r in (r for r, n in enumerate(md.num_draft_tokens) if n == 0):   # no drafts: just the bonus
        assert out[r].tolist() == [int(bonus[r])] + [PLACEHOLDER_TOKEN_ID] * md.max_spec_len
    greedy_rows = a.is_greedy
    if greedy_rows.any():                                               # greedy requests: greedy verification
        assert torch.equal(out[greedy_rows], greedy_by_hand(md, logits)[greedy_rows])
    for gen, fresh in zip(a.generators, make(seed).generators):         # a generator only greedy requests use:
        users = [r for r, other in enumerate(a.generators) if other is gen]
        if bool(greedy_rows[users].all()):                              # never advanced
            assert torch.equal(gen.get_state(), fresh.get_state())


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1), st.data())
def test_all_greedy_early_return(batch, seed, data):
    "Every request greedy: argmax-based greedy verification, equal to the long way, and no generator moves."
    md, logits, q = step_inputs(batch, seed)
    make = settings_for(len(md.num_draft_tokens), data, greedy=True)
    sampling = make(seed)
    assert sampling.all_greedy
    before = states(sampling)
    out = rejection_sampler(md, logits, q, sampling)
    assert torch.equal(out, greedy_by_hand(md, logits))
    assert all(torch.equal(x, y) for x, y in zip(states(sampling), before))
    assert torch.equal(out, manual_step(md, logits, q, make(seed))[0])


def test_no_drafts_emit_their_bonus():
    "A step in which nobody drafted is a plain decoding step: one token per request, drawn from its row."
    md = SpecDecodeMetadata.from_drafts([[], [], []], [5, 6, 20])
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    make = lambda: SamplingMetadata.from_lists([0.0, 1.0, 0.7], [0, 0, 3], [1.0, 0.9, 1.0],
                                               [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    out = rejection_sampler(md, logits, None, make())
    ref = make()
    probs = sampling_probs(logits, ref.temperature, ref.top_k, ref.top_p)
    assert out.shape == (3, 1)
    assert torch.equal(out[:, 0], draw_tokens(probs, ref.is_greedy, ref.generators))
    assert out[0, 0] == logits[0].argmax()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("greedy", [None, True])
def test_triton_backend_agrees(seed, greedy):
    "The Triton backend (Chapter 4, interpreted on a CPU) emits the torch backend's tokens from the same seeds."
    drafts = [[1, 2, 3], [], [4, 5], [6], [7, 8, 9, 10]]
    md, logits, q = step_inputs((drafts, None, None), seed)
    temperature = [0.0] * 5 if greedy else [0.0, 0.8, 1.0, 0.6, 1.2]
    make = lambda: SamplingMetadata.from_lists(temperature, [0, 0, 5, 0, 3], [1.0, 0.9, 1.0, 1.0, 0.8],
                                               [torch.Generator().manual_seed(seed + b % 2) for b in range(5)])
    for dp in (q, None):
        assert torch.equal(rejection_sampler(md, logits, dp, make(), backend="triton"),
                           rejection_sampler(md, logits, dp, make()))


# The law. Five requests with drafts [2, 0, 3, 1, 2] over V = 8, each with its own settings (request 4 greedy), fixed
# target logits and draft rows q (70% the target's law, 30% noise), repeated as R independent requests of each
# kind in one batch, drafts drawn from q afresh for each. Target rows do not depend on the drafts, so the token a request
# emits at position j (when it gets that far) must follow its j-th sampled row's law: target row j, or the bonus row at
# j = n_b. The law is computed here in float64 numpy, independently of Chapter 3. Each of the 10 positions of requests
# 0 to 3 is tested with Pearson's chi-square at level LEVEL = 1e-3. Position 0 of every request has R draws, the fewest
# that flag TV >= 0.02 (Chapter 1's standard) with probability 0.999: R = draws_for_tv(0.02, 8) = 35,444; every other
# position gets at least R / 2 (asserted: flags TV >= 0.03). Any mix-up of rows (a bonus drawn from a target row) or of settings (a row read with another
# request's temperature, top-k and top-p) moves a tested law by more than 0.05, which is asserted too, so such a bug is
# flagged with probability >= 0.999. Request 4 (greedy) must equal greedy verification in every trial.
LAW_DRAFTS = [2, 0, 3, 1, 2]
LAW_SETTINGS = ([0.7, 1.5, 1.0, 0.5, 0.0], [4, 0, 0, 3, 0], [1.0, 0.75, 1.0, 0.9, 1.0])


def reference_law(logits, temperature, top_k, top_p):
    "One row's law in float64 numpy: temperature, top-k on the logits, softmax, then the smallest nucleus >= top_p."
    z = np.asarray(logits, np.float64)
    if temperature == 0:
        return np.eye(len(z))[np.argmax(z)]
    z = z / temperature
    if 0 < top_k < len(z):
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros(len(p), bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0) / p[keep].sum()
    return p


@pytest.mark.slow
def test_sampler_emits_the_target_law():
    V, B = 8, len(LAW_DRAFTS)
    R = draws_for_tv(0.02, V)
    g = torch.Generator().manual_seed(17)
    one = SpecDecodeMetadata.from_drafts([[0] * n for n in LAW_DRAFTS])
    rows = len(one.logits_indices)
    base_logits = torch.randn(rows, V, generator=g) * 1.5
    owner = torch.repeat_interleave(torch.arange(B), torch.tensor(LAW_DRAFTS) + 1).tolist()
    laws = [reference_law(base_logits[j], *(s[owner[j]] for s in LAW_SETTINGS)) for j in range(rows)]
    noise = torch.softmax(torch.randn(sum(LAW_DRAFTS), V, generator=g) * 1.5, -1)
    q = 0.7 * torch.tensor(np.stack(laws))[one.target_logits_indices].float() + 0.3 * noise   # a decent draft
    drafts = torch.multinomial(q.repeat(R, 1), 1, generator=g)[:, 0].view(R, -1).tolist()
    cu = np.cumsum([0] + LAW_DRAFTS)
    md = SpecDecodeMetadata.from_drafts([trial[cu[b]:cu[b + 1]] for trial in drafts for b in range(B)])
    gen = torch.Generator().manual_seed(18)
    sampling = SamplingMetadata.from_lists(*(s * R for s in LAW_SETTINGS), [gen] * (B * R))
    out = rejection_sampler(md, base_logits.repeat(R, 1), q.repeat(R, 1), sampling)
    out = out.view(R, B, -1)
    ref = sampling_probs(base_logits, *(expand_batch_to_tokens(torch.tensor(s), one.cu_num_sampled_tokens, rows)
                                        for s in LAW_SETTINGS))
    assert np.allclose(ref.double().numpy(), np.stack(laws), atol=1e-6)     # the reference agrees with Chapter 3
    # request 4 is greedy: greedy verification of its drafts on the argmax rows, every trial
    am = base_logits.argmax(-1)
    g_rows = [j for j in range(rows) if owner[j] == 4]
    d4 = torch.tensor(drafts)[:, cu[4]:cu[5]]
    expect = torch.full((R, out.shape[2]), PLACEHOLDER_TOKEN_ID)
    alive = torch.ones(R, dtype=torch.bool)
    for i, j in enumerate(g_rows):
        expect[alive, i] = am[j]
        if i < LAW_DRAFTS[4]:
            alive &= d4[:, i] == am[j]
    assert torch.equal(out[:, 4], expect)
    pvals, counts, tested = [], [], []
    for j in range(rows):
        b = owner[j]
        if b == 4:
            continue
        pos = j - (int(one.cu_num_sampled_tokens[b]) - LAW_DRAFTS[b] - 1)
        tokens = out[:, b, pos]
        tokens = tokens[tokens != PLACEHOLDER_TOKEN_ID]
        counts.append(len(tokens))
        pvals.append(chi_square_gof(torch.bincount(tokens, minlength=V).numpy(), laws[j])[1])
        tested.append(j)
    assert min(counts) >= R // 2 and detectable_tv(R, V) <= 0.02 and detectable_tv(min(counts), V) < 0.03
    row_mixups = [0.5 * np.abs(laws[i] - laws[j]).sum() for i in tested for j in range(rows) if j != i]
    setting_mixups = [0.5 * np.abs(laws[j] - reference_law(base_logits[j], *(s[b] for s in LAW_SETTINGS))).sum()
                      for j in tested for b in range(B) if b != owner[j]]
    assert min(row_mixups + setting_mixups) > 0.05, "two laws are too close for this test to tell apart"
    assert min(pvals) > LEVEL, pvals


BAD_SAMPLER = [
    (lambda md, lg, q, s: (md, lg[:-1], q, s), ValueError, "logits must have N \\+ B"),
    (lambda md, lg, q, s: (md, lg.long(), q, s), TypeError, "logits"),
    (lambda md, lg, q, s: (md, lg[None], q, s), TypeError, "logits"),
    (lambda md, lg, q, s: (md, lg.index_fill(1, torch.tensor([0]), float("nan")), q, s), ValueError, "NaN"),
    (lambda md, lg, q, s: (md, lg, q[:, :4].softmax(-1), s), ValueError, "draft_probs"),
    (lambda md, lg, q, s: (md, lg, q[1:], s), ValueError, "draft_probs"),
    (lambda md, lg, q, s: (md, lg, q * 2, s), ValueError, "draft_probs"),
    (lambda md, lg, q, s: (md, lg[:, :3], None, s), ValueError, "draft_token_ids"),
    (lambda md, lg, q, s: (md, lg, q, SamplingMetadata.from_lists([1.0], [0], [1.0], [None])), ValueError,
     "sampling holds"),
    (lambda md, lg, q, s: (md, lg, q, [1.0, 1.0, 1.0]), TypeError, "sampling must"),
    (lambda md, lg, q, s: (md.draft_token_ids, lg, q, s), TypeError, "metadata must"),
    (lambda md, lg, q, s: (md, lg.index_fill(1, torch.tensor([2]), float("inf")), q, s), ValueError, "\\+inf"),
    (lambda md, lg, q, s: (md, lg[:, :0], None, s), ValueError, "logits must have"),
]


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("bad,error,match", BAD_SAMPLER)
def test_sampler_bad_input(bad, error, match, greedy):
    "Every bad call raises, naming the argument, before any generator moves (on both the greedy and the long path)."
    md, logits, q = step_inputs(([[1, 2], [], [3]], None, None), 0)
    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    sampling = SamplingMetadata.from_lists([0.0 if greedy else 1.0, 0.0 if greedy else 0.7, 0.0], [0, 0, 0],
                                           [1.0, 1.0, 1.0], gens)
    before = states(sampling)
    with pytest.raises(error, match=match):
        rejection_sampler(*bad(md, logits, q, sampling))
    assert all(torch.equal(x, y) for x, y in zip(states(sampling), before))
    with pytest.raises(ValueError, match="backend"):
        rejection_sampler(md, logits, q, sampling, backend="cuda")


BAD_SETTINGS = [
    (([1.0, -0.5], [0, 0], [1.0, 1.0], [None, None]), ValueError, "temperature\\[1\\]"),
    (([1.0, float("inf")], [0, 0], [1.0, 1.0], [None, None]), ValueError, "temperature"),
    (([1.0], [-1], [1.0], [None]), ValueError, "top_k\\[0\\]"),
    (([1.0], [2.5], [1.0], [None]), TypeError, "top_k"),
    (([1.0], [0], [0.0], [None]), ValueError, "top_p\\[0\\]"),
    (([1.0], [0], [1.5], [None]), ValueError, "top_p"),
    (([1.0, 1.0], [0, 0], [1.0], [None, None]), ValueError, "top_p"),
    (([1.0, 1.0], [0], [1.0, 1.0], [None, None]), ValueError, "top_k"),
    (([1.0, 1.0], [0, 0], [1.0, 1.0], [None]), ValueError, "generators"),
    (([1.0], [0], [1.0], [3]), TypeError, "generators\\[0\\]"),
    (([1.0], [0], [1.0], None), ValueError, "generators"),
    (([], [], [], []), ValueError, "temperature"),
    (("hot", [0], [1.0], [None]), TypeError, "temperature"),
    (([True], [0], [1.0], [None]), TypeError, "temperature"),
]


@pytest.mark.parametrize("args,error,match", BAD_SETTINGS)
def test_sampling_metadata_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        SamplingMetadata.from_lists(*args)


def test_sampling_metadata_bad_processors():
    with pytest.raises(TypeError, match="processors"):
        SamplingMetadata.from_lists([1.0], [0], [1.0], [None], processors={"min_p": 0.1})
    with pytest.raises(ValueError, match="min_p"):
        SamplingMetadata.from_lists([1.0], [0], [1.0], [None], processors=ProcessorRows(min_p=torch.tensor([-0.1])))


def test_sampling_metadata_fields():
    gen = torch.Generator()
    sm = SamplingMetadata(torch.tensor([0.0, 0.7], dtype=torch.float32), torch.tensor([0, 3], dtype=torch.int32),
                          torch.tensor([1.0, 0.9], dtype=torch.float32), (gen, gen))
    assert (sm.temperature.dtype, sm.top_k.dtype, sm.top_p.dtype) == (torch.float64, torch.int64, torch.float64)
    assert sm.is_greedy.tolist() == [True, False] and sm.all_greedy is False and sm.generators == [gen, gen]
    assert SamplingMetadata.from_lists([0.0, 0], [0, 0], [1.0, 1], [None, None]).all_greedy is True
    with pytest.raises(TypeError, match="temperature"):
        SamplingMetadata([0.5], torch.tensor([0]), torch.tensor([1.0]), [None])
    with pytest.raises(TypeError, match="top_p"):
        SamplingMetadata(torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1]), [None])


# --- validation once, at the edge: the engine's trusted path ---------------------------------------------------------
# The engine validates each request's SamplingParams once, when it is added, and builds the step's metadata and
# settings itself; it calls SpecDecodeMetadata.from_drafts, SamplingMetadata.from_lists and rejection_sampler with
# check=False. These tests pin that the trusted path computes the same thing and that no validator runs on it, and that
# the checked path validates once (the pieces below rejection_sampler run unchecked).

VALIDATORS = [(metadata, "check_drafts"), (sampling_module, "_check_settings"), (sampling_module, "_numbers"),
              (sampling_module, "_check_sampler_inputs"), (sampling_module, "check_inputs"),
              (sampling_module, "check_prob_rows"), (sampling_module, "_check_draw")]


def engine_step(batch, seed, temperature, top_p, check):
    "What the engine does at one verify step: metadata, settings, sampler; each with `check`."
    drafts, cu_arg, _ = batch
    drafts = [[t % 16 for t in d] for d in drafts]
    md = SpecDecodeMetadata.from_drafts(drafts, None if cu_arg is None else torch.tensor(cu_arg), check=check)
    _, logits, q = step_inputs(batch, seed)
    gens = [torch.Generator().manual_seed(seed + b % 2) for b in range(len(drafts))]
    sm = SamplingMetadata.from_lists(temperature, [0] * len(drafts), top_p, gens, check=check)
    return md, rejection_sampler(md, logits, q, sm, check=check), states(sm)


@settings(max_examples=30, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1), st.data())
def test_trusted_path_equals_checked(batch, seed, data):
    "check=False everywhere: the same metadata fields, the same tokens, the same generator states."
    B = len(batch[0])
    temperature = data.draw(st.lists(st.sampled_from([0.0, 0.7, 1.0]), min_size=B, max_size=B))
    top_p = data.draw(st.lists(st.sampled_from([1.0, 0.8]), min_size=B, max_size=B))
    (md_a, out_a, st_a), (md_b, out_b, st_b) = (engine_step(batch, seed, temperature, top_p, check)
                                                for check in (True, False))
    for name in ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
                 "bonus_logits_indices", "logits_indices"):
        assert torch.equal(getattr(md_a, name), getattr(md_b, name)), name
    assert md_a.num_draft_tokens == md_b.num_draft_tokens and md_a.max_spec_len == md_b.max_spec_len
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(x, y) for x, y in zip(st_a, st_b))


def refuse(name):
    def validator(*args, **kwargs):
        raise AssertionError(f"{name} ran")
    return validator


@pytest.mark.parametrize("with_processors", [False, True])
def test_trusted_path_runs_no_validator(monkeypatch, with_processors):
    "The engine's trusted step calls none of the validators; the checked step still works beside it."
    drafts = [[1, 2, 3], [], [4, 5]]
    _, logits, q = step_inputs((drafts, None, None), 0)
    procs = ProcessorRows(frequency_penalty=torch.tensor([0.5, 0.0, 1.0]), presence_penalty=torch.zeros(3),
                          repetition_penalty=torch.ones(3), prompt_mask=torch.zeros(3, 16, dtype=torch.bool),
                          output_counts=torch.zeros(3, 16, dtype=torch.int32)) if with_processors else None

    def step(check):
        md = SpecDecodeMetadata.from_drafts(drafts, torch.tensor([4, 20, 23]), check=check)
        sm = SamplingMetadata.from_lists([0.0, 0.8, 1.0], [0, 3, 0], [1.0, 1.0, 0.9],
                                         [torch.Generator().manual_seed(s) for s in range(3)], processors=procs,
                                         check=check)
        return rejection_sampler(md, logits, q, sm, check=check)
    expected = step(True)
    for module, name in VALIDATORS:
        monkeypatch.setattr(module, name, refuse(name))
    assert torch.equal(step(False), expected)
    with pytest.raises(AssertionError, match="ran"):
        step(True)


def test_checked_sampler_validates_once(monkeypatch):
    "rejection_sampler(check=True) validates its arguments once; the pieces it calls run unchecked."
    md, logits, q = step_inputs(([[1, 2], [], [3]], None, None), 0)
    sm = SamplingMetadata.from_lists([1.0, 0.7, 0.0], [0, 0, 0], [1.0, 0.9, 1.0],
                                     [torch.Generator().manual_seed(s) for s in range(3)])
    calls = []
    real = sampling_module.check_prob_rows
    monkeypatch.setattr(sampling_module, "check_prob_rows", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    for name in ("check_inputs", "_check_draw", "_check_settings"):
        monkeypatch.setattr(sampling_module, name, refuse(name))
    rejection_sampler(md, logits, q, sm)
    assert calls == ["draft_probs"]                     # q read once, by the entry point; target rows never
