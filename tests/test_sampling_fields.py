"""Every history-dependent sampling field is exact under speculation (Chapters 3, 5 and 8).

Penalties (presence, frequency, repetition), logit_bias, min_p, min_tokens, allowed_token_ids and bad_words are applied
by one stage to every verify position with the history plain decoding would have had there: the committed tokens plus
the drafts before that position (for bad_words, vLLM's history: the generated tokens, drafts included, not the
prompt). The tests run `tiny_random_pair` (V = 8, float64) after PROMPT, with kappa = 3 and max_tokens 4, so the
first step verifies a full window of three drafts and the first three tokens come from positions 0, 1, 2 of that
window (and, after a rejection, of the next ones).

* The exact per-position test (deterministic, any bias size): the engine runs every setting, sampled and greedy, in one
  batch, with both drafters, in one batch and through prefix-cache hits and preemption (both asserted), with a spy
  as its sampler (SpecDecoder's `sampler` argument; a wrapper on that engine's runner reads each step's plan). At
  every verify position of every step it records the stage's processed logits and the distribution the sampler drew
  from, and compares both, to float tolerance, with `naive_logits` (a per-token Python loop over the vocabulary,
  independent of the batched code) and `naive_probs` for the history plain decoding would have had there.
* The law tests: the engine's counts of the first three tokens against `sequence_law` (plain decoding's exact law
  with the same fields). Each field alone and all of them mixed, in ONE batch per call (the settings interleaved, so a
  row read with a neighbour's history or settings shows as a bias), with both drafters; then the same through
  prefix-cache hits and preemption (block_size 2, a small pool, long greedy fillers that grow and preempt the newest
  requests). A setting with a stop token (min_tokens) ends some requests early: both the law and the counts cut a
  sequence at its first stop token. bad_words is in the law tests through the mixed setting; alone it would add
  5,695 + 2,662 requests per drafter, measured at about 15 CPU s more for the file (91 against 76, side by side), so
  bad_words alone is checked by the exact test, the greedy test and the planted bug's exact test.
* Greedy with every field equals plain greedy decoding token for token (the same naive reference), in every batch.
* The Triton backend gets the same processed rows (the stage runs ahead of the kernels): its tokens equal torch's.
* Planted bugs, as test-local variants of `speclab.sampling.rows_at_positions` (what the sampler uses to give each
  position its history), must be REJECTED by the exact test and by the counts test: the penalty history computed once
  per step (every position sees all of the step's drafts), the drafts missing from the penalties' history and from
  the bad words' history at position i (every position sees only the committed tokens), and min_tokens decided at the
  window's start (every position gets the window's last count).

Power and cost. The law tests use Pearson's chi-square at level LEVEL = 1e-3 over the first three tokens (512
outcomes, rare ones pooled). Each draws, for each setting, the fewest requests at which it flags a TV bias of the
target with probability POWER = 0.999, pooled mass included (Chapter 1's `draws_for_law` and `law_detectable_tv`):
TV_FIELDS = 0.12 in one batch (from 2,194 requests for the mixed setting to 9,000 for the repetition penalty, 46,119
per drafter) and TV_FIELDS_EVENTS = 0.2 through prefix hits and preemption (887 to 4,694, 22,320 in all). So what the
law tests state on their own is: a field's three-token law is within TV 0.12 (0.2 through preemption) of plain
decoding's. The planted bugs move it by TV 0.13 to 0.61 (measured with the model drafter) and each must give p < LEVEL
there. The mixed setting, every field at once, is also tested alone at the engine's usual power, the law grid's
TV_JOINT = 0.03 (tests/test_engine.py): 28,593 requests per drafter, 12.7 and 11.0 CPU s (model, n-gram) on the slower
2-core AMD EPYC (Zen 3), where each field alone at 0.03 would need 32,762 to 73,734 requests, 418,359 per drafter,
about 15 times as much. Each planted bug below gives p < 1e-300 on the mixed setting at that size. For each field
alone, the engine's usual power comes from the two other pieces together. Speculative sampling emits exactly the law
of the target rows p it is handed, whatever the draft's q (Chapter 1), and the grid checks the sampler and the verify
path at TV 0.03. The exact test checks that every p row the engine hands the sampler IS plain decoding's processed row
for that position's history, exactly, at every position of every step, through prefix hits and preemption. Exact rows
plus an exact sampler give plain decoding's law, at the grid's power; the law tests stay as the end-to-end check of
what neither piece sees (a drafter that draws from one q and reports another, stop handling, the engine's
bookkeeping), at 0.03 for the fields together and at the coarser TVs for each alone. (With the n-gram drafter a
repetition-penalty history bug is invisible to the law tests: its drafts are prompt tokens, already penalised; so the
bugs run with the model drafter.)
The greedy fillers of the preemption runs emit 12 tokens, one before every third sampled request: 36 preemptions with
the model drafter and 1,498 with the n-gram one, where one suffices (one before every second request until the exact
test took over the events' exactness: over 1,600 and 4,000 preemptions, and about 8 CPU s more, which the exact tests
and the bad-words bug spend instead: the file is at 76 CPU s against 74 before them, side by side). Each setting's
size is computed once per process (`draw_size`), whichever subset of settings asks.
SPECLAB_FIELDS_TV scales both targets for a quick local loop (above 1 the bounds are not asserted); the mixed
setting's 0.03 follows SPECLAB_ENGINE_TV, as the grid does.
"""
import os
import zlib
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import pytest
import torch

import speclab.sampling as sampling
from speclab.request import SamplingParams
from speclab.processors import processor_rows, request_probs
from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.engine import SpecDecoder
from speclab.proof import LEVEL, chi_square_gof, draws_for_law, law_detectable_tv
from speclab.testing import reference_logits, sequence_law, tiny_random_pair
from test_engine import TV_JOINT

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
          "bad_words": dict(bad_words=((0,), (3, 3), (7, 3))),
          "mixed": dict(temperature=0.8, top_k=6, presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.3,
                        logit_bias={6: 1.0}, min_p=0.05, min_tokens=1, stop_token_ids=(STOP,),
                        bad_words=((5,), (1, 2), (7, 1)))}
NAMES = list(FIELDS)
LAW_NAMES = [name for name in NAMES if name != "bad_words"]   # bad_words alone: the exact test's (see the docstring)
TV_SCALE = float(os.environ.get("SPECLAB_FIELDS_TV", 1.0))
TV_FIELDS, TV_FIELDS_EVENTS = 0.12 * TV_SCALE, 0.2 * TV_SCALE   # TV flagged w.p. POWER (see the docstring)
GREEDY_MAX_TOKENS = 10
BUGS = {"once_per_step": ("presence", "frequency", "repetition"),
        "missing_drafts": ("presence", "frequency", "repetition"),
        "bad_words_missing_drafts": ("mixed",),
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


def draws(tv: float, names: tuple = tuple(LAW_NAMES)) -> tuple[int, ...]:
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
        if any(w[-1] == v and bad_word_due(w, generated) for w in params.bad_words or ()):
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


def bad_word_due(word: tuple, generated: list[int]) -> bool:
    "vLLM's rule, written out: a word's last token is banned when the generated tokens end with its other tokens."
    head = list(word[:-1])
    return len(generated) >= len(head) and generated[len(generated) - len(head):] == head


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
        if bug == "bad_words_missing_drafts" and out.recent_tokens is not None:
            out.recent_tokens = out.recent_tokens[first[owner]]
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


FILLER_EVERY = 3                              # a greedy filler before every FILLER_EVERY-th sampled request
CONFIGS = {"one-batch": dict(block_size=16),
           "preemption": dict(block_size=2, num_blocks=900, max_num_seqs=512)}   # picked by trying, with the fillers


@lru_cache(maxsize=None)
def law_counts(drafter: str, sizes: tuple[int, ...], config: str = "one-batch", bug: str | None = None,
               names: tuple = tuple(LAW_NAMES)) -> tuple[np.ndarray, object]:
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
        if config == "preemption" and i % FILLER_EVERY == 0:
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
    for name in LAW_NAMES:
        pval, flags = check(counts[NAMES.index(name)], name)
        assert flags <= TV_FIELDS, f"{name}: detectable TV {flags:.3f} above the stated"
        assert pval > LEVEL, f"{drafter} {name}: p = {pval:.2e}"


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_every_field_at_once_at_the_grids_power(drafter):
    """The mixed setting (every field at once, sampled, with greedy requests of it among them) at the law grid's power:
    its three-token law is within TV_JOINT = 0.03 of plain decoding's with the same fields (tests/test_engine.py)."""
    counts, eng = law_counts(drafter, draws(TV_JOINT, ("mixed",)), names=("mixed",))
    assert eng.metrics.num_draft_tokens > 0
    pval, flags = check(counts[NAMES.index("mixed")], "mixed")
    assert flags <= TV_JOINT, f"mixed: detectable TV {flags:.3f} above the grid's"
    assert pval > LEVEL, f"{drafter} mixed at the grid's power: p = {pval:.2e}"


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_fields_through_prefix_hits_and_preemption(drafter):
    "The same law while requests hit the prefix cache and are preempted and recomputed (both must happen)."
    counts, eng = law_counts(drafter, draws(TV_FIELDS_EVENTS), "preemption")
    assert eng.scheduler_stats().num_preemptions > 0
    assert eng.scheduler_stats().num_cached_tokens > 0
    for name in LAW_NAMES:
        pval, flags = check(counts[NAMES.index(name)], name)
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
                  (dict(allowed_token_ids=[]), "allowed_token_ids"), (dict(logprobs=21), "logprobs"),
                  (dict(bad_words=[[]]), "bad_words"), (dict(bad_words=[[1, -2]]), "bad_words"),
                  (dict(bad_words="word"), "bad_words")]
    for bad, word in bad_values:
        with pytest.raises(ValueError, match=word):
            SamplingParams(**bad)
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=KAPPA)
    empty = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(3,), allowed_token_ids=(3,))
    outs = eng.generate([PROMPT] * 4, [sampled("mixed"), empty, SamplingParams(max_tokens=4, logit_bias={V: 1.0}),
                                       SamplingParams(max_tokens=4, bad_words=[[1, V]])])
    assert outs[0].error is None and len(outs[0].token_ids) >= 1
    assert outs[1].finish_reason == "error" and "allowed_token_ids" in outs[1].error
    assert outs[2].finish_reason == "error" and "logit_bias" in outs[2].error
    assert outs[3].finish_reason == "error" and "bad_words" in outs[3].error


# --- the exact per-position test: a spy on the stage ----------------------------------------------------------------

def naive_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    "Plain decoding's distribution from one processed row: temperature, min-p, top-k (vLLM's order; no top-p here)."
    assert params.top_p == 1
    if params.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), V).double()
    scaled = logits / params.temperature
    p = torch.softmax(scaled, -1)
    scaled = torch.where(p < params.min_p * p.max(), -float("inf"), scaled)
    if params.top_k:
        scaled = torch.where(scaled < scaled.sort(descending=True).values[params.top_k - 1], -float("inf"), scaled)
    return torch.softmax(scaled, -1)


class StageSpy:
    """The engine's sampler, wrapped (SpecDecoder's `sampler` argument) to record, at every verify step, the stage's
    processed logits and the probabilities the sampler drew from, with each request's committed tokens (read from the
    step's plan by a wrapper on this engine's runner) and the step's drafts."""

    def __init__(self):
        self.steps, self.batch = [], None

    def bind(self, eng: SpecDecoder) -> None:
        verify = eng.runner.verify

        def verify_and_remember(plan, proposal):
            self.batch = [(r.params, list(r.output_ids)) for r in plan.requests]
            return verify(plan, proposal)
        eng.runner.verify = verify_and_remember

    def __call__(self, md, logits, draft_probs, sampling_md, backend):
        seen, stage, probs = {}, sampling.process_logits, sampling.sampling_probs

        def spy_stage(x, rows):
            seen["logits"] = stage(x, rows)
            return seen["logits"]

        def spy_probs(x, *args, **kw):
            seen["probs"] = probs(x, *args, **kw)
            return seen["probs"]
        sampling.process_logits, sampling.sampling_probs = spy_stage, spy_probs
        try:
            out = sampling.rejection_sampler(md, logits, draft_probs, sampling_md, backend, check=False)
        finally:
            sampling.process_logits, sampling.sampling_probs = stage, probs
        self.steps.append((self.batch, list(md.num_draft_tokens), md.draft_token_ids.tolist(), logits.double(),
                           seen.get("logits"), seen.get("probs")))
        return out


def stage_mismatches(spy: StageSpy) -> tuple[int, set]:
    """Compare every verify position of every recorded step with plain decoding at that position's history (committed
    tokens + drafts before it): the processed logits and the sampled distribution, to float tolerance. Returns the
    number of positions checked and the names of the settings whose rows differed."""
    checked, wrong = 0, set()
    for batch, n, drafts, raw, processed, probs in spy.steps:
        row, start = 0, 0
        for (params, generated), n_b in zip(batch, n):
            for i in range(n_b + 1):
                ref = naive_logits(raw[row], params, generated + drafts[start:start + i])
                got = raw[row] if processed is None else processed[row].double()
                same = torch.equal(got.isinf(), ref.isinf()) and torch.allclose(
                    got[~got.isinf()], ref[~ref.isinf()], atol=1e-5, rtol=0)
                if same and probs is not None:
                    same = torch.allclose(probs[row].double(), naive_probs(ref, params), atol=1e-5, rtol=0)
                if not same:
                    wrong.add(next((k for k in NAMES if params in (sampled(k), greedy(k))), "filler"))
                checked += 1
                row += 1
            start += n_b
    return checked, wrong


SPY_CONFIGS = {"one-batch": dict(block_size=16, num_blocks=400, max_num_seqs=256),
               "preemption": dict(block_size=2, num_blocks=150, max_num_seqs=64)}


def spy_run(drafter: str, config: str, bug: str | None = None) -> tuple[StageSpy, SpecDecoder]:
    "Every setting sampled and greedy, interleaved in one generate call (the preemption config adds the fillers)."
    items = [p for k in range(6) for name in NAMES for p in (sampled(name),) + ((greedy(name),) if k < 2 else ())]
    if config == "preemption":
        items = [p for k, q in enumerate(items) for p in ((q, greedy("filler")) if k % 2 == 0 else (q,))]
    spy = StageSpy()
    eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=KAPPA, seed=1, sampler=spy, **SPY_CONFIGS[config])
    spy.bind(eng)
    with planted(bug):
        outs = eng.generate([PROMPT] * len(items), items)
    assert all(o.error is None for o in outs)
    return spy, eng


@pytest.mark.parametrize("config", list(SPY_CONFIGS))
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_every_position_is_plain_decoding_exactly(drafter, config):
    """Deterministic and exact at any bias size: at every verify position of every step, the stage's processed logits
    and the sampler's distribution equal plain decoding's for the history plain decoding would have had there."""
    spy, eng = spy_run(drafter, config)
    checked, wrong = stage_mismatches(spy)
    assert eng.metrics.num_draft_tokens > 0 and checked > len(spy.steps)
    if config == "preemption":
        assert eng.scheduler_stats().num_preemptions > 0 and eng.scheduler_stats().num_cached_tokens > 0
    assert not wrong, f"{drafter} {config}: positions off plain decoding for {sorted(wrong)}"


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bugs_fail_the_exact_test(bug):
    "Each planted wrong history is caught by the exact test on every setting it breaks."
    _, wrong = stage_mismatches(spy_run("model", "one-batch", bug)[0])
    broken = set(BUGS[bug]) | ({"bad_words"} if bug.startswith("bad_words") else set())   # alone: see NAMES
    assert broken <= wrong, f"planted {bug}: the exact test missed {broken - wrong}"
