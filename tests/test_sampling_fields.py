"""Every history-dependent sampling field is exact under speculation (issue 27; Chapters 3, 5 and 8).

Penalties (presence, frequency, repetition), logit_bias, min_p, min_tokens and allowed_token_ids are applied by one
stage to every verify position with the history plain decoding would have had there: the committed tokens plus the
drafts before that position. These tests check the engine's output law against `sequence_law` (plain decoding's
exact law with the same fields), on `tiny_random_pair` (V = 8, float64) after PROMPT, with kappa = 3 and max_tokens
4, so the first step verifies a full window of three drafts and the first three tokens come from positions 0, 1, 2
of that window (and, after a rejection, of the next ones).

* Each field alone and all of them mixed, in ONE batch per call (the eight settings interleaved, so a row read with a
  neighbour's history or settings shows as a bias), with both drafters (draft model and n-gram). A setting with a stop
  token (min_tokens) ends some requests early: both the law and the counts cut a sequence at its first stop token.
* The same through prefix-cache hits and preemption (block_size 2, a small pool, long greedy fillers that grow and
  preempt the newest requests; both events asserted to happen).
* Greedy with every field equals plain greedy decoding token for token, against a reference written here one token at
  a time with a per-token Python loop over the vocabulary (independent of the batched tensor code), in every batch.
* The Triton backend gets the same processed rows (the stage runs ahead of the kernels): its tokens equal torch's.
* Planted bugs, as test-local variants of `speclab.sampling.rows_at_positions` (what the sampler uses to give each
  position its history), must be REJECTED by the same counts test: the penalty history computed once per step (every
  position sees all of the step's drafts), the drafts' history missing at position i (every position sees only the
  committed tokens), and min_tokens decided at the window's start (every position gets the window's last count).

Power and cost. Pearson's chi-square at level LEVEL = 1e-3 over the first three tokens (512 outcomes, rare ones
pooled). Each test draws, for each setting, the fewest requests at which its test flags a TV bias of the target with
probability POWER = 0.999, pooled mass included (Chapter 1's `draws_for_law` and `law_detectable_tv`): TV_FIELDS = 0.12
in one batch (from 2,460 requests for min_p to 9,000 for the repetition penalty, 47,103 per drafter; until issue 25
every setting drew the largest size, 72,000 in all) and TV_FIELDS_EVENTS = 0.2 through prefix hits and preemption
(1,252 to 4,694, 22,878 in all; 1,000+ preemptions per run). The targets are sized to the planted bugs: measured
with the model drafter, they move the law by TV 0.13 to 0.61 (missing drafts on the repetition penalty is the
smallest), so each is caught with probability 0.999 at the one-batch sizes of the settings it breaks, and each must
give p < LEVEL there. (The first version of this file drew 6,000 and 2,000 requests and stated 0.085 and 0.13, ignoring
the pooled mass; with it counted, those sizes promised only 0.17 and 0.38.) This is weaker than the engine's law grid
(a three-token TV of 0.03, tests/test_engine.py), which tests the same sampler and verify path at full power without
fields; what these tests add is each position's history, and a wrong history moves the law by more than these
targets. (With the n-gram drafter a repetition-penalty history bug is invisible here: its drafts are prompt tokens,
already penalised; so the bugs run with the model drafter.) About 105 CPU seconds for the whole file (170 before).
The greedy fillers of the preemption runs emit 12 tokens: 1,602 preemptions with the model drafter and 4,083 with the
n-gram one, where one suffices (16 until issue 25: about three times as many, and a fifth more of the model drafter's
run; 8 preempts nothing), and each setting's size is computed once per process (`draw_size`), whichever subset of
settings asks.
SPECLAB_FIELDS_TV scales both targets for a quick local loop (above 1 the bounds are not asserted).
"""
import os
import zlib
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import pytest
import torch

import speclab.sampling as sampling
from speclab.engine import (ModelDrafter, NgramDrafter, SamplingParams, SpecDecoder, processor_rows,
                            request_probs)
from speclab.proof import LEVEL, chi_square_gof, draws_for_law, law_detectable_tv
from speclab.testing import reference_logits, sequence_law, tiny_random_pair

V, KAPPA, MAX_TOKENS = 8, 3, 4
PROMPT = [1, 2, 3, 1, 2]                      # "1 2" recurs: the n-gram drafter proposes "3 1 2" at once
STOP = 3                                      # the most likely token: min_tokens has mass to move
FIELDS = {"presence": dict(presence_penalty=1.5),
          "frequency": dict(frequency_penalty=1.0),
          "repetition": dict(repetition_penalty=2.0),
          "logit_bias": dict(logit_bias={4: 2.0, 0: -3.0}),
          "min_p": dict(min_p=0.15),
          "min_tokens": dict(min_tokens=2, stop_token_ids=(STOP,)),
          "allowed": dict(allowed_token_ids=(0, 2, 3, 5, 7)),
          "mixed": dict(temperature=0.8, top_k=6, presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.3,
                        logit_bias={6: 1.0}, min_p=0.05, min_tokens=1, stop_token_ids=(STOP,))}
NAMES = list(FIELDS)
TV_SCALE = float(os.environ.get("SPECLAB_FIELDS_TV", 1.0))
TV_FIELDS, TV_FIELDS_EVENTS = 0.12 * TV_SCALE, 0.2 * TV_SCALE   # TV flagged w.p. POWER (see the docstring)
GREEDY_MAX_TOKENS = 10
BUGS = {"once_per_step": ("presence", "frequency", "repetition"),
        "missing_drafts": ("presence", "frequency", "repetition"),
        "min_tokens_at_window_start": ("min_tokens",)}


@pytest.fixture(autouse=True)
def one_thread():
    "The tiny models gain nothing from a second torch thread; on a shared 2-core machine it only waits."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@lru_cache(maxsize=None)
def pair():
    return tiny_random_pair(V)


@lru_cache(maxsize=None)
def sampled(name: str) -> SamplingParams:
    "The setting's sampled params, one object for all its requests (the engine never changes a request's params)."
    return SamplingParams(**{"max_tokens": MAX_TOKENS, **FIELDS[name]})


@lru_cache(maxsize=None)
def greedy(name: str) -> SamplingParams:
    "The setting's fields at temperature 0; 'filler': long greedy requests with penalties that never stop early."
    if name == "filler":
        return SamplingParams(temperature=0, max_tokens=12, presence_penalty=0.4, frequency_penalty=0.6,
                              repetition_penalty=1.2, logit_bias={5: 0.5})
    return SamplingParams(**{**FIELDS[name], "temperature": 0, "max_tokens": GREEDY_MAX_TOKENS})


# --- the references -------------------------------------------------------------------------------------------------

def canonical(tokens: np.ndarray, stop_ids: tuple) -> np.ndarray:
    "Codes of 3-token sequences [n, 3] cut at their first stop token and padded with it (what the engine emits)."
    tokens = np.array(tokens)
    for s in stop_ids:
        hit = np.cumsum(tokens == s, axis=1) > 0
        after = np.concatenate([np.zeros((len(tokens), 1), bool), hit[:, :-1]], axis=1)
        tokens = np.where(after, s, tokens)
    return tokens @ np.array([V * V, V, 1])


@lru_cache(maxsize=None)
def draw_size(name: str, tv: float) -> int:
    "The fewest requests of a setting at which its test flags a TV bias of `tv` with probability POWER."
    return draws_for_law(law(name), tv)


def draws(tv: float, names: tuple = tuple(NAMES)) -> tuple[int, ...]:
    "Requests per setting of `names`: each setting's `draw_size`."
    return tuple(draw_size(name, tv) for name in names)


@lru_cache(maxsize=None)
def law(name: str) -> np.ndarray:
    "Plain decoding's exact law of the first three tokens under the setting, cut at stop tokens like the engine."
    params = sampled(name)
    full = sequence_law(pair()[0], PROMPT, params, 3)
    seqs = np.stack(np.unravel_index(np.arange(V ** 3), (V, V, V)), axis=1)
    return np.bincount(canonical(seqs, params.stop_token_ids), weights=full, minlength=V ** 3)


def naive_logits(logits: torch.Tensor, params: SamplingParams, generated: list[int]) -> torch.Tensor:
    "vLLM's processors for one position, one token at a time: the independent reference of the batched stage."
    out = logits.clone()
    for v in range(V):
        if params.allowed_token_ids is not None and v not in params.allowed_token_ids:
            out[v] = -float("inf")
        if len(generated) < params.min_tokens and v in params.stop_token_ids:
            out[v] = -float("inf")
        out[v] += (params.logit_bias or {}).get(v, 0.0)
        count = generated.count(v)
        if v in PROMPT or count:
            r = params.repetition_penalty
            out[v] = out[v] / r if out[v] > 0 else out[v] * r
        out[v] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


@lru_cache(maxsize=None)
def plain_greedy(name: str) -> list[int]:
    "Plain greedy decoding with the setting's fields, one token per forward, cut at a stop token."
    params, generated = greedy(name), []
    while len(generated) < params.max_tokens:
        logits = reference_logits(pair()[0], PROMPT + generated)[-1].double()
        generated.append(int(naive_logits(logits, params, generated).argmax()))
        if generated[-1] in params.stop_token_ids:
            break
    return generated


def test_sequence_law_uses_the_naive_processors():
    "The law's one-position rows equal the per-token reference (so the law tests compare with the right law)."
    target = pair()[0]
    rng = np.random.default_rng(0)
    for name in NAMES:
        params = SamplingParams(**{**FIELDS[name], "temperature": 1.0, "top_k": 0})
        for _ in range(5):
            generated = rng.integers(0, V, rng.integers(0, 4)).tolist()
            logits = reference_logits(target, PROMPT + generated)[-1].double()
            rows = processor_rows([params], [PROMPT], [generated], [frozenset(params.stop_token_ids)], V)
            want = torch.softmax(naive_logits(logits, params, generated), -1)
            if params.min_p:
                want = torch.where(want < params.min_p * want.max(), 0.0, want)
                want = want / want.sum()
            got = request_probs(logits[None], [params], rows)[0].double()
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


# --- planted bugs: wrong histories per position ----------------------------------------------------------------------

def planted_rows(bug: str):
    "A variant of rows_at_positions that gives every position of a window one wrong history (see the docstring)."
    correct = sampling.rows_at_positions

    def rows(processors, md):
        out = correct(processors, md)
        n = torch.as_tensor(md.num_draft_tokens)
        owner = torch.repeat_interleave(torch.arange(len(n)), n + 1)
        last = torch.cumsum(n + 1, 0) - 1                    # each request's bonus row: all its drafts in history
        first = last - n                                     # position 0: none of them
        if bug == "once_per_step" and out.output_counts is not None:
            out.output_counts = out.output_counts[last[owner]]
        if bug == "missing_drafts" and out.output_counts is not None:
            out.output_counts = out.output_counts[first[owner]]
        if bug == "min_tokens_at_window_start" and out.num_generated is not None:
            out.num_generated = out.num_generated[last[owner]]
        return out
    return rows


@contextmanager
def planted(bug: str | None):
    "Run the engine with a planted bug in the sampler's per-position histories (None: the real code)."
    correct = sampling.rows_at_positions
    if bug is not None:
        sampling.rows_at_positions = planted_rows(bug)
    try:
        yield
    finally:
        sampling.rows_at_positions = correct


# --- the engine runs -------------------------------------------------------------------------------------------------

def make_drafter(name: str):
    return ModelDrafter(pair()[1]) if name == "model" else NgramDrafter(n=2)


CONFIGS = {"one-batch": dict(block_size=16),
           "preemption": dict(block_size=2, num_blocks=900, max_num_seqs=512)}   # picked by trying, with the fillers


@lru_cache(maxsize=None)
def law_counts(drafter: str, sizes: tuple[int, ...], config: str = "one-batch", bug: str | None = None,
               names: tuple = tuple(NAMES)) -> tuple[np.ndarray, object]:
    """Counts [setting, outcome] of the canonical first three tokens of sizes[k] sampled requests of setting names[k]
    (the settings shuffled together by a fixed permutation, in one generate call; greedy requests of every setting
    among them, checked against plain greedy), and the engine. The preemption config adds long greedy fillers that
    grow past their reservations."""
    items, setting = [], []
    order = np.random.default_rng(0).permutation(np.repeat(np.arange(len(names)), sizes))
    for i, k in enumerate(order):
        if i % 97 == 0:                                       # greedy, every setting in turn
            items.append(greedy(names[(i // 97) % len(names)]))
            setting.append(-1 - NAMES.index(names[(i // 97) % len(names)]))
        if config == "preemption" and i % 2 == 0:
            items.append(greedy("filler"))
            setting.append(-1 - len(NAMES))
        items.append(sampled(names[k]))
        setting.append(NAMES.index(names[k]))
    kw = dict(max_num_seqs=len(items), max_num_batched_tokens=2 ** 20) if config == "one-batch" else {}
    seed = zlib.crc32(repr((drafter, sizes, config, bug)).encode())
    eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=KAPPA, seed=seed, **CONFIGS[config], **kw)
    with planted(bug):
        outs = eng.generate([PROMPT] * len(items), items)
    setting = np.array(setting)
    for o, p, s in zip(outs, items, setting):
        assert o.error is None, o.error
        name = (NAMES + ["filler"])[-1 - s] if s < 0 else None
        if s < 0 and bug is None:
            assert o.token_ids == plain_greedy(name), (name, o.token_ids, plain_greedy(name))
    counts = np.zeros((len(NAMES), V ** 3), np.int64)
    first3 = np.array([o.token_ids[:3] + [STOP] * (3 - len(o.token_ids[:3])) for o in outs])
    for k, name in enumerate(NAMES):
        if (setting == k).any():
            np.add.at(counts[k], canonical(first3[setting == k], sampled(name).stop_token_ids), 1)
    return counts, eng


def check(counts: np.ndarray, name: str) -> tuple[float, float]:
    "(p-value, detectable TV) of one setting's counts against plain decoding's law."
    _, pval, df = chi_square_gof(counts, law(name))
    return pval, law_detectable_tv(law(name), int(counts.sum()))


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_each_field_and_mixed_in_one_batch(drafter):
    "The law of every setting, all eight interleaved in one batch, equals plain decoding's with the same fields."
    counts, eng = law_counts(drafter, draws(TV_FIELDS))
    assert eng.metrics.num_draft_tokens > 0
    for k, name in enumerate(NAMES):
        pval, flags = check(counts[k], name)
        assert flags <= TV_FIELDS, f"{name}: detectable TV {flags:.3f} above the stated"
        assert pval > LEVEL, f"{drafter} {name}: p = {pval:.2e}"


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_fields_through_prefix_hits_and_preemption(drafter):
    "The same law while requests hit the prefix cache and are preempted and recomputed (both must happen)."
    counts, eng = law_counts(drafter, draws(TV_FIELDS_EVENTS), "preemption")
    assert eng.scheduler.num_preemptions > 0
    assert eng.scheduler.num_cached_tokens > 0
    for k, name in enumerate(NAMES):
        pval, flags = check(counts[k], name)
        assert flags <= TV_FIELDS_EVENTS, f"{name}: detectable TV {flags:.3f} above the stated"
        assert pval > LEVEL, f"{drafter} {name}: p = {pval:.2e}"


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bugs_are_rejected(bug):
    "Each wrong per-position history is rejected by the same counts test on the settings it breaks."
    names = BUGS[bug]
    counts, _ = law_counts("model", draws(TV_FIELDS, names), bug=bug, names=names)
    for name in names:
        pval, _ = check(counts[NAMES.index(name)], name)
        assert pval < LEVEL, f"planted {bug} passed on {name}: p = {pval:.3g}"


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_with_fields_is_plain_greedy(drafter):
    "Greedy with each field (and long penalised fillers) equals plain greedy token for token, alone in the engine."
    for name in NAMES + ["filler"]:
        eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=KAPPA)
        assert eng.generate([PROMPT], greedy(name))[0].token_ids == plain_greedy(name), name


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bugs_break_greedy(bug):
    "The greedy comparison catches each planted bug too, on the settings it breaks (deterministic, no draws)."
    broken = set()
    for drafter in ("model", "ngram"):
        for name in NAMES + ["filler"]:
            eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=KAPPA)
            with planted(bug):
                if eng.generate([PROMPT], greedy(name))[0].token_ids != plain_greedy(name):
                    broken.add(name)
    assert set(BUGS[bug]) <= broken, f"planted {bug}: greedy unchanged on {set(BUGS[bug]) - broken}"


def test_triton_backend_applies_the_same_stage():
    """The stage runs ahead of the sampler's backend: the Triton kernels (interpreted here) get the processed rows and
    emit exactly the torch backend's tokens for the same requests and engine seed (every setting, seeded and not)."""
    params = [SamplingParams(**{**FIELDS[name], "max_tokens": 6, "seed": None if k % 2 else 100 + k})
              for k, name in enumerate(NAMES)]
    outs = {}
    for backend in ("torch", "triton"):
        eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=KAPPA, backend=backend, seed=5)
        outs[backend] = [o.token_ids for o in eng.generate([PROMPT] * len(params), params)]
    assert outs["torch"] == outs["triton"]


def test_bad_field_values_fail_alone():
    "Bad values raise naming the field; a request whose rows would be all -inf is refused, and fails alone in a batch."
    bad_values = [(dict(presence_penalty=2.5), "presence_penalty"),
                  (dict(repetition_penalty=0.0), "repetition_penalty"),
                  (dict(min_p=-0.1), "min_p"), (dict(min_tokens=9, max_tokens=4), "min_tokens"),
                  (dict(logit_bias={1: 101}), "logit_bias"), (dict(logit_bias={-1: 1}), "logit_bias"),
                  (dict(allowed_token_ids=[]), "allowed_token_ids"), (dict(logprobs=21), "logprobs")]
    for bad, word in bad_values:
        with pytest.raises(ValueError, match=word):
            SamplingParams(**bad)
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=KAPPA)
    empty = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(3,), allowed_token_ids=(3,))
    outs = eng.generate([PROMPT] * 3, [sampled("mixed"), empty, SamplingParams(max_tokens=4, logit_bias={V: 1.0})])
    assert outs[0].error is None and len(outs[0].token_ids) >= 1
    assert outs[1].finish_reason == "error" and "allowed_token_ids" in outs[1].error
    assert outs[2].finish_reason == "error" and "logit_bias" in outs[2].error
