"""Property and bad-input tests of `speclab.metadata` (Chapter 5).

Hypothesis draws ragged batches: 1 to 12 requests, 0 to 7 drafts each (token ids in [0, 50_000)), and either no
`cu_num_scheduled_tokens` (each request schedules 1 + n_b tokens) or 0 to 50 extra scheduled tokens per request
(prompt chunks, recomputed context). Each property runs on 300 examples.
"""
import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from speclab.metadata import SpecDecodeMetadata, draft_tokens_from_inputs, expand_batch_to_tokens
from speclab.sampling import PLACEHOLDER_TOKEN_ID, cu_num_draft_tokens, rejection_sample


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
