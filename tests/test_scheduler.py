"""Continuous batching, prefix caching and preemption in the engine (Chapter 8's SpecDecoder on Chapter 6's paged KV).

Everything runs on `tiny_random_pair()` (a 2-layer target and a 1-layer draft, float64, V = 8, context 64), with one
torch thread (`one_thread`: the tiny models gain nothing from a second one, and on a busy 2-core CPU two threads wait
on each other, ten times slower).

1. The law under engine events. Unseeded sampled requests on PROMPT (model drafter, kappa 3, two settings
   interleaved, max_tokens 4) arrive between steps; the counts of their first three tokens are tested against
   `sequence_law` with Pearson's chi-square at level LEVEL = 1e-3, in two engines with block_size 2 and up to 512
   running sequences: a roomy one (later arrivals find the prompt's two full blocks in the prefix cache) and one with
   a pool of LAW_POOL_BLOCKS blocks that preempts. A max_tokens-4 request is never preempted by its peers: its
   reservation at admission (5 prompt tokens + 3 draft slots = 4 blocks) covers its whole life. So the small-pool
   engine also runs greedy "filler" requests (one per two sampled ones, max_tokens 12, checked against plain greedy
   decoding) that grow past their reservations; when they need a block, the newest running requests, mostly sampled
   ones admitted the step before, are preempted and recompute later (about 9% of the sampled requests; >= 5% is
   asserted). The fillers are most of that engine's work: with max_tokens 16 (13% preempted) they emitted three
   tokens of every four, and the test cost a fifth more; with 8 almost nothing is preempted (0.3%).
2. Greedy under events: prompts sharing prefixes of one sequence, staggered arrivals, a small pool: plain greedy.
3. A seeded sampled request emits the same tokens in a roomy engine and in one whose small pool preempts it.
4. A fuzz of random engines, arrivals, lengths, kappa caps, stops and aborts: after every step Chapter 6's invariants,
   the batch limits, every cached block's K/V in both pools, and greedy tokens so far; the fuzz catches a block
   manager that caches drafts. The same fuzz runs with sliding windows.
5. The online API: abort, refusal of a request the pool cannot hold, streaming, the batch limits, caching off.
6. A sliding window: blocks are freed while requests run, and greedy output equals a windowed plain reference.

Statistical power (item 1). A chi-square test over b bins at n draws flags every TV bias >= detectable_tv(n, b) with
probability POWER = 0.999. Each setting draws the fewest requests at which its test flags TV_EVENTS = 0.045 over the
bins left after pooling (Chapter 1's `draws_for_law`: about 18,000 for temperature 0.7, 512 outcomes, and 9,800 for
top_k 3, 27 outcomes). That is weaker than the law grid of tests/test_engine.py (0.02), which tests the same sampler
at full power; what this test adds is the engine's events (joins, prefix hits, preemption), and a bug there moves the
law a long way (a preempted request that resumed with stale K/V, or a prefix hit that read the wrong block, changes
its next token's law entirely). The test asserts that the same counts reject the law of the other temperature (TV 0.20
and 0.09 from the true one). SPECLAB_SCHEDULER_TV sets TV_EVENTS for a quick local loop (above 0.045 the wrong-law
check is skipped where it is not powered).
"""
import os
import random
import zlib
from collections import deque
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pytest
import torch

from speclab.request import FINISHED, Output, RequestState, SamplingParams
from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.engine import SpecDecoder
from speclab.policy import KappaPolicy, StepCosts
from speclab.kv import FREED, hash_chain
from speclab.kvlab import BuggyPrefixManager, BuggyWindowManager, check_invariants, manager_state
from speclab.model import KVCache, Llama, forward
from speclab.model import generate as plain_generate
from speclab.proof import LEVEL, chi_square_gof, detectable_tv, draws_for_law
from speclab.testing import reference_logits, sequence_law, tiny_random_pair

V = 8
PROMPT = [1, 2, 3, 1, 2]                     # block_size 2: two full blocks ([1, 2], [3, 1]) reach the prefix cache
SETTINGS = [(0.7, 0), (1.0, 3)]              # (temperature, top_k) of the law requests, interleaved
TV_EVENTS = float(os.environ.get("SPECLAB_SCHEDULER_TV", 0.045))   # the TV bias each law test flags w.p. POWER
LAW_POOL_BLOCKS = 800                        # the preempting engine's pool (picked by trying: see the docstring)
FILLER = SamplingParams(temperature=0, max_tokens=12)   # the docstring says why 12
ARRIVAL_CHUNK = 512                          # the law driver keeps at most this many requests waiting


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    "One torch thread: the tiny models gain nothing from two, and on a busy 2-core CPU two threads wait on each other."
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- helpers ---------------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def pair() -> tuple[Llama, Llama]:
    "The (target, draft) pair, built once."
    return tiny_random_pair()


def engine_seed(*key: object) -> int:
    "A fixed engine seed per test and parameters (crc32 of the key: stable across runs and Python versions)."
    return zlib.crc32(repr(key).encode())


def make_drafter(name: str) -> ModelDrafter | NgramDrafter:
    "A fresh drafter: 'model' (the draft model, sampled like the request) or 'ngram' (prompt lookup, n = 2)."
    if name == "model":
        return ModelDrafter(pair()[1])
    return NgramDrafter(n=2)


def running_records(eng: SpecDecoder) -> list[RequestState]:
    "The running requests' records, oldest admission first."
    return [eng.requests[i] for i in eng.running_ids()]


def watch_preemptions(eng: SpecDecoder) -> list[tuple[int, int]]:
    "Record every victim of the engine's scheduler as (req_id, tokens it had emitted): wraps the instance's preempt."
    victims = []
    preempt = eng.scheduler.preempt

    def record(r: RequestState) -> None:
        "Note the victim, then preempt it as the scheduler does."
        victims.append((r.req_id, len(r.output_ids)))
        preempt(r)

    eng.scheduler.preempt = record
    return victims


def run_online(eng: SpecDecoder, items: list[tuple[list[int], SamplingParams]], chunk: int,
               after_step: Callable[[dict[int, RequestState]], None] | None = None) -> tuple[list[Output], list[int]]:
    """Feed (prompt, params) items between steps, keeping at most `chunk` of them waiting, and step until every one
    finished: requests join while others run. After each step `after_step` gets every request's state so far
    (finished ones included). Returns the outputs in item order and the req_id of each item."""
    pending = deque(enumerate(items))
    req_ids = [-1] * len(items)
    index, outputs, states = {}, {}, {}
    while pending or eng.has_unfinished():
        while pending and eng.num_waiting() < chunk:
            i, (prompt, params) = pending.popleft()
            req_ids[i] = eng.add_request(prompt, params)
            index[req_ids[i]] = i
            states[req_ids[i]] = eng.requests[req_ids[i]]
        outs = eng.step()
        assert outs, "a step with unfinished requests ran nothing: the scheduler is stuck"
        for out in outs:
            if out.finished is not None:
                outputs[index[out.req_id]] = out.finished
        if after_step is not None:
            after_step(states)
    return [outputs[i] for i in range(len(items))], req_ids


@lru_cache(maxsize=None)
def plain_greedy(prompt: tuple[int, ...], max_tokens: int, stop_token_ids: tuple[int, ...] = (),
                 sliding_window: int | None = None) -> list[int]:
    """The target's greedy continuation, one token at a time with no paged cache (Chapter 7's `generate`, or, with a
    window, `reference_logits` under the window mask), cut after the first stop token."""
    target = pair()[0]
    if sliding_window is None:
        out = plain_generate(target, None, list(prompt), max_tokens, temperature=0)
    else:
        seq = list(prompt)
        for _ in range(max_tokens):
            seq.append(int(reference_logits(target, seq, sliding_window)[-1].argmax()))
        out = seq[len(prompt):]
    return cut_at_stop(out, stop_token_ids)


def cut_at_stop(tokens: list[int], stop_token_ids: tuple[int, ...]) -> list[int]:
    "The tokens up to and including the first stop token (all of them if none is a stop token)."
    cut = next((i + 1 for i, t in enumerate(tokens) if t in stop_token_ids), len(tokens))
    return tokens[:cut]


def expected_greedy(prompt: list[int], params: SamplingParams, sliding_window: int | None = None) -> list[int]:
    "What a greedy request must emit: plain greedy decoding up to max_tokens, cut after its first stop token."
    return plain_greedy(tuple(prompt), params.max_tokens, tuple(params.stop_token_ids), sliding_window)


@torch.no_grad()
def plain_greedy_rows(prompts: list[tuple[int, ...]], max_tokens: int) -> dict[tuple[int, ...], list[int]]:
    """{prompt: its first max_tokens plain greedy tokens} for many prompts at once: Chapter 7's contiguous `KVCache`
    and `forward`, one row per prompt (right-padded, `num_new` real tokens each), one token per forward, as
    `generate` decodes one prompt. What `plain_greedy` gives, for a batch in max_tokens + 1 forwards."""
    target, prompts = pair()[0], sorted(set(prompts))
    if not prompts:
        return {}
    lens = torch.tensor([len(p) for p in prompts])
    tokens = torch.zeros(len(prompts), int(lens.max()), dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = torch.tensor(p)
    cache = KVCache(target.args, len(prompts), int(lens.max()) + max_tokens, dtype=target.head_weight.dtype)
    logits = forward(target, tokens, cache, lens)[torch.arange(len(prompts)), lens - 1]
    out = []
    for t in range(max_tokens):
        out.append(logits.argmax(-1))
        if t + 1 < max_tokens:
            logits = forward(target, out[-1][:, None], cache)[:, 0]
    rows = torch.stack(out, 1).tolist() if out else [[] for _ in prompts]
    return dict(zip(prompts, rows))


def tv(a: np.ndarray, b: np.ndarray) -> float:
    "Total variation distance between two probability vectors."
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# --- 1. the law under engine events ----------------------------------------------------------------------------------

LAW_PARAMS = [SamplingParams(temperature=t, top_k=k, max_tokens=4) for t, k in SETTINGS]
LAW_CONFIGS = {"prefix-cache": dict(block_size=2, max_num_seqs=512),
               "preemption": dict(block_size=2, max_num_seqs=512, num_blocks=LAW_POOL_BLOCKS),
               "adaptive": dict(block_size=2, max_num_seqs=512, num_blocks=LAW_POOL_BLOCKS)}
STOP_BELOW = 0.3          # the adaptive config's stopping rule: a draft token the draft gave < 0.3 ends its run
ADAPTIVE_COSTS = StepCosts(verify_s=0.1, verify_token_s=1e-4, draft_s=1e-3, draft_request_s=1e-6)   # ChoiceCounter's


class ChoiceCounter(KappaPolicy):
    """The adaptive policy, counting the kappas it chooses (planned, before the stopping rule). The synthetic
    costs (a fixed part worth a thousand positions) make the choice vary: while hundreds of requests run, a draft
    pays only for requests whose live alpha is high, and deeper runs pay as the batch drains."""
    def __init__(self):
        super().__init__(ADAPTIVE_COSTS, alpha_prior=0.5, optimism=1.0, pool=True)   # as KappaPolicy.adaptive plans
        object.__setattr__(self, "chosen", np.zeros(4, np.int64))

    def choose(self, step):
        kappas = super().choose(step)
        np.add.at(self.chosen, kappas, 1)
        return kappas


@lru_cache(maxsize=None)
def law(temperature: float, top_k: int) -> np.ndarray:
    "Exact law of the first three target tokens after PROMPT under a setting (512 outcomes, first token first)."
    return sequence_law(pair()[0], PROMPT, SamplingParams(temperature=temperature, top_k=top_k), 3)


def law_sizes(tv_bias: float = TV_EVENTS) -> tuple[int, ...]:
    "Requests per setting: the fewest at which the setting's test flags a TV bias of `tv_bias` with probability POWER."
    return tuple(draws_for_law(law(t, k), tv_bias) for t, k in SETTINGS)


def law_run(config: str, sizes: tuple[int, ...]) -> tuple[np.ndarray, SpecDecoder, int]:
    """Counts [setting, outcome] of the first three tokens of sizes[s] unseeded requests of each setting s (shuffled
    together by a fixed permutation), the engine, and how many sampled requests were preempted at least once. The
    preempting config adds one greedy FILLER per two sampled requests (checked against plain greedy here)."""
    fillers = config in ("preemption", "adaptive")
    items, setting = [], []
    order = np.random.default_rng(0).permutation(np.repeat(np.arange(len(SETTINGS)), sizes))
    for i, s in enumerate(order):
        if fillers and i % 2 == 0:
            items.append((PROMPT, FILLER))
            setting.append(-1)
        items.append((PROMPT, LAW_PARAMS[s]))
        setting.append(int(s))
    adaptive = config == "adaptive"
    drafter = ModelDrafter(pair()[1], min_confidence=STOP_BELOW) if adaptive else make_drafter("model")
    eng = SpecDecoder(pair()[0], drafter, kappa=3, seed=engine_seed("law", config, sizes),
                      policy=ChoiceCounter() if adaptive else None, **LAW_CONFIGS[config])
    victims = watch_preemptions(eng)
    outs, req_ids = run_online(eng, items, ARRIVAL_CHUNK)
    setting = np.array(setting)
    sampled = setting >= 0
    assert all(len(o.token_ids) == p.max_tokens and o.finish_reason == "length" for o, (_, p) in zip(outs, items))
    greedy = expected_greedy(PROMPT, FILLER)
    assert all(o.token_ids == greedy for o, s in zip(outs, setting) if s < 0)
    codes = np.array([o.token_ids[:3] for o in outs]) @ np.array([V * V, V, 1])
    counts = np.zeros((len(SETTINGS), V ** 3), np.int64)
    np.add.at(counts, (setting[sampled], codes[sampled]), 1)
    sampled_ids = {r for r, s in zip(req_ids, setting) if s >= 0}
    preempted = len({r for r, _ in victims if r in sampled_ids})
    return counts, eng, preempted


@pytest.mark.parametrize("config", list(LAW_CONFIGS))
def test_law_under_engine_events(config):
    """The first three tokens of unseeded sampled requests (model drafter, kappa 3) follow the target's law at level
    1e-3 while requests join mid-run, hit the prefix cache, and (second and third configs) are preempted and
    recompute; in the third the adaptive policy chooses each request's kappa per step (0 to 3, all chosen)
    and the draft's stopping rule cuts runs short. Each setting's test flags TV >= TV_EVENTS with probability 0.999 on
    its pooled bins; the counts must reject the other temperature's law (TV 0.20 and 0.09 from the true one)."""
    sizes = law_sizes()
    counts, eng, preempted = law_run(config, sizes)
    sched = eng.scheduler
    assert sched.num_cached_tokens > 0
    if config == "adaptive":
        chosen = sched.policy.chosen
        assert (chosen > 0).all(), f"kappas chosen 0, 1, 2, 3: {chosen.tolist()}"
        planned = int(np.dot(np.arange(len(eng.metrics.kappa_counts)), eng.metrics.kappa_counts))
        assert eng.metrics.num_draft_tokens < planned, "the stopping rule never stopped a run"
    if config in ("preemption", "adaptive"):
        assert sched.num_preemptions > 0
        share = 0.05 if config == "preemption" else 0.03    # fewer drafts reserve fewer slots: 4% were preempted
        assert preempted >= share * sum(sizes), f"only {preempted} sampled requests were preempted"
    else:
        assert sched.num_cached_tokens >= 2 * sum(sizes)    # most requests reuse the prompt's two blocks
    assert eng.metrics.num_draft_tokens > 0
    for s, (temperature, top_k) in enumerate(SETTINGS):
        _, pval, df = chi_square_gof(counts[s], law(temperature, top_k))
        flags = detectable_tv(sizes[s], df + 1)
        assert flags <= TV_EVENTS, "fewer samples than the stated power needs"
        assert pval > LEVEL, f"{(temperature, top_k)}: chi-square p = {pval:.2e} on {df} df (flags TV >= {flags:.3f})"
        wrong = law(1.7 - temperature, top_k)                    # the same counts reject the other temperature's law
        _, wrong_pval, wrong_df = chi_square_gof(counts[s], wrong)
        powered = tv(law(temperature, top_k), wrong) > detectable_tv(sizes[s], wrong_df + 1)
        assert powered or TV_EVENTS > 0.045, "the stated power does not cover the wrong law"
        assert wrong_pval < LEVEL or not powered, f"a wrong law passed: p = {wrong_pval:.3g}"


# --- 2. greedy under events ------------------------------------------------------------------------------------------

GREEDY_N = 50
SHARED_SEQ = [int(t) for t in np.random.default_rng(2024).integers(0, V, 20)]   # prompts start with a piece of it
GREEDY_POOL = {2: 30, 4: 16}      # num_blocks per block_size: >= the largest request (24, 12), small enough to preempt


def shared_prefix_prompt(rng: random.Random, max_suffix: int = 4) -> list[int]:
    "A random-length prefix (0..20 tokens) of SHARED_SEQ and 0..max_suffix random tokens (at least one token in all)."
    prefix = SHARED_SEQ[:rng.randint(0, len(SHARED_SEQ))]
    suffix = [rng.randrange(V) for _ in range(rng.randint(0, max_suffix))]
    return prefix + suffix or [rng.randrange(V)]


@lru_cache(maxsize=None)
def greedy_items() -> list[tuple[list[int], SamplingParams]]:
    "GREEDY_N greedy requests on shared-prefix prompts with max_tokens 4..20."
    rng = random.Random(7)
    return [(shared_prefix_prompt(rng), SamplingParams(temperature=0, max_tokens=rng.randint(4, 20)))
            for _ in range(GREEDY_N)]


@pytest.mark.parametrize("block_size", [2, 4])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_under_events(drafter, block_size):
    """Greedy requests give plain greedy decoding while they arrive four at a time, share prefix-cache blocks of
    their common prefixes, and are preempted and recomputed in a small pool (both must have happened)."""
    items = greedy_items()
    eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=3, seed=engine_seed("greedy", drafter, block_size),
                      block_size=block_size, num_blocks=GREEDY_POOL[block_size])
    outs, _ = run_online(eng, items, chunk=4)
    assert [o.token_ids for o in outs] == [expected_greedy(p, sp) for p, sp in items]
    assert eng.scheduler_stats().num_cached_tokens > 0
    assert eng.scheduler_stats().num_preemptions > 0
    assert eng.metrics.num_draft_tokens > 0
    assert eng.block_usage()[0] == 0


# --- 3. a seeded request survives preemption -------------------------------------------------------------------------

@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_seeded_request_survives_preemption(drafter):
    """A seeded sampled request emits the same tokens in a roomy engine and in a 24-block pool where an older greedy
    request grows into the blocks it needs: it is preempted (after emitting tokens: it waits in the queue with them),
    recomputes its context when readmitted, and its generators carry on where they were."""
    target = pair()[0]
    mine = SamplingParams(temperature=0.9, top_k=5, seed=4321, max_tokens=30)
    older = ([6, 1, 0, 3, 3, 5, 2, 7, 4, 1], SamplingParams(temperature=0, max_tokens=30))
    roomy = SpecDecoder(target, make_drafter(drafter), kappa=3, seed=1, block_size=2)
    roomy_outs, _ = run_online(roomy, [older, (PROMPT, mine)], chunk=2)
    assert roomy.scheduler.num_preemptions == 0
    alone = SpecDecoder(target, make_drafter(drafter), kappa=3, seed=2, block_size=2).generate([PROMPT], [mine])[0]
    assert roomy_outs[1].token_ids == alone.token_ids
    eng = SpecDecoder(target, make_drafter(drafter), kappa=3, seed=3, block_size=2, num_blocks=24)
    victims = watch_preemptions(eng)
    older_id = eng.add_request(*older)
    req_id = eng.add_request(PROMPT, mine)
    state = eng.requests[req_id]
    outputs, waited_with_tokens = {}, False
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished is not None:
                outputs[out.req_id] = out.finished
        waited_with_tokens |= state.req_id in eng.waiting_ids() and len(state.output_ids) > 0
    assert any(r == req_id and emitted > 0 for r, emitted in victims), victims
    assert waited_with_tokens
    assert outputs[req_id].token_ids == alone.token_ids
    assert outputs[older_id].token_ids == expected_greedy(*older)


# --- 4. fuzz: block accounting and cached K/V after every step -------------------------------------------------------

FUZZ_SEEDS = 20                # every branch 50 seeds reach, each reached by at least 6 of these (the test says how)
FUZZ_WINDOW_SEEDS = 10         # per window size: with window 3, seed 8 is the first to reach every arc of the 10
FUZZ_ARRIVAL_STEPS = 60        # requests arrive during the first 60 steps; then the engine drains
FUZZ_MAX_STEPS = 400           # a run that has not drained by then fails
FUZZ_MAX_PROMPT = 24           # shared_prefix_prompt's longest prompt (20 + 4)
FUZZ_MAX_TOKENS = 16
KV_ATOL = 1e-9                 # float64: the paged and the contiguous forward differ by rounding only


FRESH_KV: dict[tuple[int, tuple[int, ...], int], torch.Tensor] = {}    # (which, key, block_size) -> fresh_kv's rows


def fresh_kv(which: int, keys: list[tuple[int, ...]], block_size: int) -> torch.Tensor:
    """K/V rows [len(keys), layers, 2 (K, V), block_size, kv_heads, head_dim] of the last block_size positions of each
    key, computed afresh by the contiguous `KVCache` + `forward` of model `which` (0: target, 1: draft). The keys not
    computed before go through one batched forward (right-padded rows: causal attention never reads the padding), and
    every result is kept in FRESH_KV: a key's K/V do not change."""
    missing = sorted({key for key in keys if (which, key, block_size) not in FRESH_KV})
    if missing:
        model = pair()[which]
        lens = torch.tensor([len(key) for key in missing])
        tokens = torch.zeros(len(missing), int(lens.max()), dtype=torch.int64)
        for b, key in enumerate(missing):
            tokens[b, :len(key)] = torch.tensor(key)
        cache = KVCache(model.args, len(missing), int(lens.max()), dtype=model.head_weight.dtype)
        forward(model, tokens, cache, lens)
        for b, key in enumerate(missing):
            pos = slice(len(key) - block_size, len(key))
            FRESH_KV[which, key, block_size] = torch.stack(
                [torch.stack([k[b, :, pos].transpose(0, 1), v[b, :, pos].transpose(0, 1)])
                 for k, v in zip(cache.k, cache.v)])
    return torch.stack([FRESH_KV[which, key, block_size] for key in keys])


def record_fed_sequences(eng: SpecDecoder) -> list[list[int]]:
    "Every sequence a step feeds (a request's tokens + its drafts), recorded as the runner drafts: wraps its draft."
    fed, draft = [], eng.runner.draft

    def record(plan, catch_up):
        proposal = draft(plan, catch_up)
        fed.extend(r.token_ids + d for r, d in zip(plan.requests, proposal.drafts))
        return proposal
    eng.runner.draft = record
    return fed


def cached_kv_violations(eng: SpecDecoder, finalized: list[list[int]]) -> list[str]:
    """Prefix-cache blocks whose K/V, in the target's pool or the draft model's, differ from a fresh computation of
    their key's tokens: a request that hits such a block would read K/V of other tokens (an uncommitted slot)."""
    bm = eng.scheduler.block_manager
    if not bm.cached:
        return []
    if not hasattr(eng, "key_prefix"):
        eng.key_prefix, eng.chained, eng.fed_chained = {}, set(), 0
    prefix = eng.key_prefix                        # chained key -> tokens up to its block's end, kept between steps
    fed = getattr(eng, "fed_sequences", [])        # drafts too: a wrong manager may cache them
    for seq in finalized + fed[eng.fed_chained:]:  # the sequences not chained at an earlier step
        seq = tuple(seq)
        if seq not in eng.chained:
            eng.chained.add(seq)
            for i, key in enumerate(hash_chain(seq, eng.config.block_size)):
                prefix.setdefault(key, seq[:(i + 1) * eng.config.block_size])
    eng.fed_chained = len(fed)
    unknown = [key for key in bm.cached if key not in prefix]
    if unknown:
        return [f"prefix cache: {len(unknown)} key(s) chain no finalized sequence's blocks"]
    keys = [prefix[key] for key in bm.cached]
    blocks = torch.tensor(list(bm.cached.values()))
    pools = [("target", 0, eng.runner.cache)]
    if isinstance(eng.drafter, ModelDrafter):
        pools.append(("draft", 1, eng.drafter.cache))
    bad = []
    for name, which, pool in pools:
        got = torch.stack([torch.stack([kv.k[blocks], kv.v[blocks]], 1) for kv in pool], 1)
        want = fresh_kv(which, keys, eng.config.block_size)
        err = (got - want).abs().flatten(1).amax(1)
        for i in (err > KV_ATOL).nonzero()[:, 0].tolist():
            bad.append(f"prefix cache: block {int(blocks[i])} of the {name} pool does not hold the K/V of its key "
                       f"{keys[i]} (max error {float(err[i]):.1e})")
    return bad


FUZZ_CHECKS = ("invariants", "kv", "greedy")


def step_violations(eng: SpecDecoder, states: dict[int, RequestState],
                    checks: tuple[str, ...] = FUZZ_CHECKS) -> list[str]:
    """What must hold between two steps. 'invariants': Chapter 6's invariants over every request's finalized tokens
    (finished and aborted ones included) and the computed lengths; 'kv': the cached blocks' K/V in both pools;
    'greedy': greedy requests' tokens so far are a prefix of plain greedy decoding (`fuzz_run` checks this one from
    the tokens it records after each step, against references computed in one batch: `greedy_violations`)."""
    bad = []
    if "invariants" in checks:
        finalized = [r.prompt_ids + r.output_ids for r in states.values()]
        bad += check_invariants(eng.scheduler.block_manager, finalized=finalized)
        bad += length_violations(eng)
    if "kv" in checks and eng.config.sliding_window is None:      # fresh_kv attends to every position
        bad += cached_kv_violations(eng, [r.prompt_ids + r.output_ids for r in states.values()])
    if "greedy" in checks:
        for r in states.values():
            want = expected_greedy(r.prompt_ids, r.params, eng.config.sliding_window)
            if r.params.greedy and r.output_ids != want[:len(r.output_ids)]:
                bad.append(f"request {r.req_id}: greedy tokens {r.output_ids} are not plain greedy decoding")
    return bad


def greedy_references(states: dict[int, RequestState], sliding_window: int | None) -> dict[int, list[int]]:
    """What each greedy request among `states` must emit (`expected_greedy`); without a window, from one batched
    plain greedy reference (`plain_greedy_rows`) for all of them."""
    greedy = [r for r in states.values() if r.params.greedy]
    if sliding_window is not None:
        return {r.req_id: expected_greedy(r.prompt_ids, r.params, sliding_window) for r in greedy}
    rows = plain_greedy_rows([tuple(r.prompt_ids) for r in greedy], FUZZ_MAX_TOKENS)
    return {r.req_id: cut_at_stop(rows[tuple(r.prompt_ids)][:r.params.max_tokens], tuple(r.params.stop_token_ids))
            for r in greedy}


def greedy_violations(recorded: list[tuple[int, int, tuple[int, ...]]],
                      want: dict[int, list[int]]) -> tuple[int | None, list[str]]:
    """The 'greedy' check of `step_violations` on the tokens recorded after each step, (step, req_id, tokens so far):
    the first step at which a greedy request's tokens were not a prefix of `want`, and its violations (None, [])."""
    bad = [(step, f"request {req_id}: greedy tokens {list(tokens)} are not plain greedy decoding")
           for step, req_id, tokens in recorded if list(tokens) != want[req_id][:len(tokens)]]
    if not bad:
        return None, []
    return bad[0][0], [msg for step, msg in bad if step == bad[0][0]]


def length_violations(eng: SpecDecoder) -> list[str]:
    "Running requests whose target or draft computed length is out of range between steps."
    bad = []
    for r in running_records(eng):
        if r.num_computed_tokens > len(r.token_ids) - 1:
            bad.append(f"request {r.req_id}: num_computed_tokens {r.num_computed_tokens} > "
                       f"{len(r.token_ids)} tokens - 1")
        if r.num_draft_computed > r.num_computed_tokens:
            bad.append(f"request {r.req_id}: num_draft_computed {r.num_draft_computed} > num_computed_tokens "
                       f"{r.num_computed_tokens}")
    return bad


def fuzz_request(rng: random.Random) -> tuple[list[int], SamplingParams]:
    """A random request: shared-prefix prompt, greedy or sampled (seeded or not, top_k or not), max_tokens 1..16,
    a kappa cap (None, 0, 1, 2 or 5) and 0..2 stop token ids."""
    prompt = shared_prefix_prompt(rng)
    temperature = 0.0 if rng.random() < 0.5 else rng.choice((0.6, 1.0, 1.4))
    seed = rng.randrange(2 ** 32) if rng.random() < 0.3 else None
    stops = tuple(rng.sample(range(V), rng.choice((0, 0, 0, 1, 2))))
    params = SamplingParams(temperature=temperature, top_k=rng.choice((0, 0, 3)), seed=seed,
                            max_tokens=rng.randint(1, FUZZ_MAX_TOKENS), stop_token_ids=stops,
                            kappa=rng.choice((None, None, 0, 1, 2, 5)))
    return prompt, params


def fuzz_engine(rng: random.Random, seed: int, policy: str, sliding_window: int | None = None) -> SpecDecoder:
    """A random engine: block_size 1, 2 or 4, kappa 1..4, the draft model or n-grams, a pool between one and two
    times the largest request, a few batch limits; `policy`: 'speclab', or Chapter 6's 'buggy_prefix' or 'buggy_window'
    (its `BuggyPrefixManager` and `BuggyWindowManager` subclasses)."""
    block_size = rng.choice((1, 2, 4))
    kappa = rng.randint(1, 4)
    drafter = rng.choice(("model", "model", "ngram"))
    need = -(-(FUZZ_MAX_PROMPT + FUZZ_MAX_TOKENS + kappa + 1) // block_size)
    num_blocks = need + rng.randint(0, need)
    eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=kappa, seed=engine_seed("fuzz", seed),
                      block_size=block_size, num_blocks=num_blocks, max_num_seqs=rng.choice((2, 4, 8, 256)),
                      max_num_batched_tokens=rng.choice((16, 64, 8192)), sliding_window=sliding_window)
    eng.fed_sequences = record_fed_sequences(eng)
    if policy != "speclab":
        wrong = {"buggy_prefix": BuggyPrefixManager, "buggy_window": BuggyWindowManager}[policy]
        eng.scheduler.block_manager = wrong(num_blocks, block_size, eng.scheduler.block_manager.sliding_window)
    return eng


def fuzz_run(seed: int, policy: str = "speclab", checks: tuple[str, ...] = FUZZ_CHECKS,
             sliding_window: int | None = None) -> tuple[list[str], dict[str, int]]:
    """Drive a random engine with random arrivals and aborts, checking `step_violations` after every step (and that
    the step kept max_num_seqs, and max_num_batched_tokens unless it ran one request alone); stop at the first
    violation. Returns the violations (empty: none) and counts of what happened."""
    rng = random.Random(seed)
    eng = fuzz_engine(rng, seed, policy, sliding_window)
    victims = watch_preemptions(eng)
    states, outputs, live = {}, {}, []
    recorded, last = [], {}                 # (step, req_id, tokens) of a greedy request after a step that added any
    seen = dict(aborted_running=0, aborted_waiting=0, kappa0=0, freed_entries=0)
    for step in range(FUZZ_MAX_STEPS):
        if step >= FUZZ_ARRIVAL_STEPS and not eng.has_unfinished():
            break
        if step < FUZZ_ARRIVAL_STEPS and rng.random() < 0.4:
            for _ in range(rng.randint(1, 3)):
                req_id = eng.add_request(*fuzz_request(rng))
                states[req_id] = eng.requests[req_id]
                live.append(req_id)
                seen["kappa0"] += states[req_id].params.kappa == 0
        if live and rng.random() < 0.05:
            req_id = live.pop(rng.randrange(len(live)))
            seen["aborted_running" if req_id in eng.running_ids() else "aborted_waiting"] += 1
            eng.abort(req_id)
        before = eng.stats["target_tokens"]
        outs = eng.step()
        for out in outs:
            if out.finished is not None:
                live.remove(out.req_id)
                outputs[out.req_id] = out.finished
        bad = step_violations(eng, states, tuple(c for c in checks if c != "greedy"))
        if "greedy" in checks:
            for r in states.values():
                if r.params.greedy and last.get(r.req_id) != len(r.output_ids):
                    last[r.req_id] = len(r.output_ids)
                    recorded.append((step, r.req_id, tuple(r.output_ids)))
        seen["freed_entries"] += sum(r.block_table.count(FREED) for r in running_records(eng))
        if len(outs) > eng.config.max_num_seqs:
            bad.append(f"{len(outs)} requests ran in one step, max_num_seqs is {eng.config.max_num_seqs}")
        if eng.stats["target_tokens"] - before > eng.config.max_num_batched_tokens and len(outs) > 1:
            bad.append(f"{len(outs)} requests computed {eng.stats['target_tokens'] - before} positions in one step, "
                       f"max_num_batched_tokens is {eng.config.max_num_batched_tokens}")
        if bad:
            first, greedy_bad = greedy_violations(recorded, greedy_references(states, sliding_window))
            if first is not None and first < step:                  # greedy went wrong at an earlier step
                return [f"seed {seed}, step {first}: {b}" for b in greedy_bad], seen
            return [f"seed {seed}, step {step}: {b}" for b in bad + greedy_bad], seen
    want = greedy_references(states, sliding_window)
    first, greedy_bad = greedy_violations(recorded, want)
    if greedy_bad:
        return [f"seed {seed}, step {first}: {b}" for b in greedy_bad], seen
    bm = eng.scheduler.block_manager
    assert not eng.has_unfinished() and not eng.requests and not bm.requests, f"seed {seed}: did not drain"
    assert all(r.status == FINISHED for r in states.values())
    assert bm.free_blocks == bm.num_blocks
    for req_id, out in outputs.items():
        r = states[req_id]
        assert 1 <= len(out.token_ids) <= r.params.max_tokens
        if r.params.greedy:
            assert out.token_ids == want[req_id], f"seed {seed}, request {req_id}"
    seen.update(requests=len(states), finished=len(outputs), preemptions=eng.scheduler_stats().num_preemptions,
                preempted_mid_run=sum(emitted > 0 for _, emitted in victims),
                cached_tokens=eng.scheduler_stats().num_cached_tokens, steps=step)
    return [], seen


def test_fuzz_block_accounting_every_step():
    """FUZZ_SEEDS random engines and workloads (arrivals, prompt lengths, max_tokens, kappa caps incl. 0, greedy and
    sampled, stop tokens, aborts of waiting and running requests, a pool that preempts): after every step Chapter 6's
    invariants hold (no leaked, double-owned or stale block), computed lengths are in range, every prefix-cache block
    holds in both pools the K/V of its key's tokens, and greedy requests follow plain greedy decoding. At the end
    everything drained and every block is free. The workload must have exercised what it claims to.

    Why 20 seeds: 50 seeds (this test's earlier count) reach 1,107 arcs (line to next line) of speclab's
    engine.py, kv.py and sampling.py; seeds 0-5 already reach every one of them, and seeds 0-19 reach each at least
    6 times (a sys.settrace arc tracer, on the engine of commit ca10f5e)."""
    total = {}
    for seed in range(FUZZ_SEEDS):
        bad, seen = fuzz_run(seed)
        assert not bad, bad[:5]
        for name, count in seen.items():
            total[name] = total.get(name, 0) + count
    for name in ("preemptions", "preempted_mid_run", "cached_tokens", "aborted_running", "aborted_waiting", "kappa0"):
        assert total[name] > 0, f"the fuzz never exercised {name}: {total}"
    assert total["finished"] > 0.8 * total["requests"]


@pytest.mark.parametrize("window", [3, 8])
def test_fuzz_with_a_sliding_window(window):
    """The same fuzz on engines with a sliding window (blocks freed behind it while requests run, prefix hits,
    aborts): the invariants and the batch limits hold after every step, greedy requests follow the windowed plain
    reference, everything drains. The K/V check is left out (`fresh_kv` attends to every position), and preemptions
    are rare here: the pool must hold a whole request (prompt + max_tokens) while a windowed one holds few blocks."""
    total = {}
    for seed in range(FUZZ_WINDOW_SEEDS):
        bad, seen = fuzz_run(1000 + seed, sliding_window=window)
        assert not bad, bad[:5]
        for name, count in seen.items():
            total[name] = total.get(name, 0) + count
    for name in ("freed_entries", "cached_tokens", "aborted_running", "aborted_waiting"):
        assert total[name] > 0, f"the fuzz never exercised {name}: {total}"


@pytest.mark.parametrize("checks", [("invariants",), ("kv",)], ids=["invariants", "kv"])
def test_fuzz_catches_a_manager_that_caches_drafts(checks):
    """The fuzz can fail: with Chapter 6's `buggy_prefix` block manager (its commit offers the prefix cache the block
    the step's last token completes, before that token's K/V is written: the slot still holds a rejected draft's)
    each of the first 8 workloads fails, within a few steps, the invariant check alone and the K/V check alone (a
    cached block whose K/V are not its key's tokens'), the latter in the target's pool and in the draft's."""
    found = [fuzz_run(seed, "buggy_prefix", checks)[0] for seed in range(8)]
    assert all(found), found
    if checks == ("kv",):
        lines = [line for bad in found for line in bad]
        assert any("target pool" in line for line in lines) and any("draft pool" in line for line in lines), found


# --- 5. the online API -----------------------------------------------------------------------------------------------

def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    "Greedy SamplingParams."
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def test_abort_waiting_and_running_requests():
    """abort() of a running request returns its blocks at once, abort() of a waiting one drops it from the queue;
    neither ever emits again, the others still decode to plain greedy, and in the end every block is free. Aborting
    an unknown, an already aborted or a finished request raises ValueError naming the id."""
    prompts = [[1, 2, 3, 4, 5, 6, 7], [0, 4, 0, 4, 0], [6, 6, 6], [5, 4, 3, 2, 1], [2, 7]]
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=3, seed=engine_seed("abort"), block_size=2,
                      num_blocks=64, max_num_seqs=2)
    ids = [eng.add_request(p, greedy(12)) for p in prompts]
    eng.step()
    bm = eng.scheduler.block_manager
    assert eng.running_ids() == ids[:2]
    assert eng.waiting_ids() == ids[2:]
    free = bm.free_blocks
    held = len(eng.requests[ids[0]].block_table)
    assert held > 0 and all(bm.ref_cnt[b] == 1 for b in eng.requests[ids[0]].block_table)   # private blocks
    eng.abort(ids[0])
    assert bm.free_blocks == free + held
    assert ids[0] not in bm.requests and ids[0] not in eng.requests and ids[0] not in eng.running_ids()
    eng.abort(ids[3])
    assert bm.free_blocks == free + held
    assert ids[3] not in bm.requests and ids[3] not in eng.requests
    assert eng.waiting_ids() == [ids[2], ids[4]]
    assert check_invariants(bm) == []
    with pytest.raises(ValueError, match="id 12345$"):
        eng.abort(12345)
    with pytest.raises(ValueError, match=f"id {ids[0]}$"):
        eng.abort(ids[0])
    outputs = {}
    while eng.has_unfinished():
        for out in eng.step():
            assert out.req_id not in (ids[0], ids[3])
            if out.finished is not None:
                outputs[out.req_id] = out.finished.token_ids
    assert outputs == {i: expected_greedy(prompts[k], greedy(12)) for k, i in enumerate(ids) if k in (1, 2, 4)}
    with pytest.raises(ValueError, match=f"id {ids[1]}$"):
        eng.abort(ids[1])
    assert bm.free_blocks == bm.num_blocks and not bm.requests


def test_request_larger_than_the_pool_is_refused():
    """A request that could not run even alone in the pool (prompt + max_tokens + kappa slots) is refused with a
    ValueError naming num_blocks, and changes nothing: the queue and the other request are untouched. In generate()
    it comes back alone as an error Output while the rest is decoded."""
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=3, block_size=2, num_blocks=8)
    fits = eng.add_request(PROMPT, greedy(4))                       # 5 + 4 + 3 + 1 slots: 7 blocks
    before = (list(eng.requests), eng.waiting_ids(), manager_state(eng.scheduler.block_manager))
    with pytest.raises(ValueError, match="num_blocks"):
        eng.add_request(PROMPT, greedy(20))                         # 15 blocks
    assert (list(eng.requests), eng.waiting_ids(), manager_state(eng.scheduler.block_manager)) == before
    outs = eng.generate([PROMPT, PROMPT], [greedy(20), greedy(3)])
    assert outs[0].finish_reason == "error" and "num_blocks" in outs[0].error
    assert outs[1].token_ids == expected_greedy(PROMPT, greedy(3))
    assert fits not in eng.requests and eng.block_usage() == (0, 8)


def test_requests_added_between_steps_stream_their_output():
    """Requests added between steps (greedy, sampled, seeded, with stop tokens) in a pool small enough to preempt
    stream through on_tokens exactly the tokens of their StepOutputs and of their final Output, in order (a preempted
    request streams nothing twice); greedy ones give plain greedy decoding."""
    rng = random.Random(5)
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=3, seed=engine_seed("stream"), block_size=2,
                      num_blocks=26)
    streamed, stepped, outputs, items = {}, {}, {}, {}
    for step in range(300):
        if step < 30 and rng.random() < 0.6:
            prompt = shared_prefix_prompt(rng)
            stops = tuple(rng.sample(range(V), rng.choice((0, 0, 1))))
            params = SamplingParams(temperature=rng.choice((0, 0.8)), seed=rng.choice((None, step)),
                                    max_tokens=rng.randint(1, 20), stop_token_ids=stops)
            key = len(items)
            items[key] = (prompt, params)
            streamed[key] = []
            req_id = eng.add_request(prompt, params, on_tokens=streamed[key].extend)
            stepped[req_id] = (key, [])
        if step >= 30 and not eng.has_unfinished():
            break
        for out in eng.step():
            key, tokens = stepped[out.req_id]
            tokens += out.new_token_ids
            if out.finished is not None:
                outputs[key] = out.finished.token_ids
    assert len(outputs) == len(items) > 10
    assert all(streamed[k] == stepped_tokens for k, stepped_tokens in stepped.values())
    assert all(streamed[k] == outputs[k] for k in items)
    assert all(outputs[k] == expected_greedy(*items[k]) for k in items if items[k][1].greedy)
    assert eng.scheduler_stats().num_preemptions > 0


def test_max_num_batched_tokens_bounds_every_step():
    """No step computes more target positions (context not yet cached + drafts) than max_num_batched_tokens, except
    the documented one: a request whose prompt alone exceeds the budget runs alone in its first step. The budget does
    hold requests back (the first step admits only some of them), and greedy outputs are plain greedy decoding."""
    limit = 16
    rng = random.Random(11)
    items = [(shared_prefix_prompt(rng, max_suffix=2)[:10], greedy(rng.randint(2, 12))) for _ in range(24)]
    long_prompt = [(3 * i + 2) % V for i in range(30)]              # 30 tokens, alone over the budget (no prefix hit)
    items.insert(12, (long_prompt, greedy(8)))
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=3, seed=engine_seed("budget"), block_size=4,
                      num_blocks=200, max_num_batched_tokens=limit)
    ids = [eng.add_request(p, sp) for p, sp in items]
    over, first_batch, outputs = [], None, {}
    while eng.has_unfinished():
        before = eng.stats["target_tokens"]
        outs = eng.step()
        used = eng.stats["target_tokens"] - before
        first_batch = len(outs) if first_batch is None else first_batch
        if used > limit:
            over.append((used, [o.req_id for o in outs]))
        for out in outs:
            if out.finished is not None:
                outputs[out.req_id] = out.finished.token_ids
    assert over == [(len(long_prompt) + 3, [ids[12]])], over   # its prompt and three drafts, alone in the step
    assert first_batch < len(items)
    assert eng.scheduler_stats().num_preemptions == 0
    assert [outputs[i] for i in ids] == [expected_greedy(p, sp) for p, sp in items]


def test_max_num_seqs_bounds_the_running_batch():
    """The running batch never holds more than max_num_seqs requests, and it does reach that size."""
    rng = random.Random(13)
    items = [(shared_prefix_prompt(rng), greedy(rng.randint(1, 12))) for _ in range(16)]
    eng = SpecDecoder(pair()[0], make_drafter("ngram"), kappa=3, block_size=2, num_blocks=200, max_num_seqs=3)
    sizes = []
    outs, _ = run_online(eng, items, chunk=16, after_step=lambda _: sizes.append(eng.num_running()))
    assert max(sizes) == 3
    assert eng.stats["steps"] >= len(items) / 3
    assert [o.token_ids for o in outs] == [expected_greedy(p, sp) for p, sp in items]


def test_prefix_caching_off():
    """enable_prefix_caching=False: no block is ever cached or reused (num_cached_tokens == 0 and an empty prefix
    cache after every step), and the outputs are the same plain greedy ones the caching engine gives."""
    items = greedy_items()
    runs = {}
    for caching in (True, False):
        eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=3, seed=engine_seed("caching"), block_size=2,
                          num_blocks=GREEDY_POOL[2], enable_prefix_caching=caching)
        cached = []
        cache = eng.scheduler.block_manager.cached
        outs, _ = run_online(eng, items, chunk=4, after_step=lambda _: cached.append(len(cache)))
        runs[caching] = ([o.token_ids for o in outs], eng.scheduler_stats().num_cached_tokens, max(cached))
    assert runs[False][1:] == (0, 0)
    assert runs[True][1] > 0
    assert runs[False][0] == runs[True][0] == [expected_greedy(p, sp) for p, sp in items]


# --- 6. sliding window -----------------------------------------------------------------------------------------------

WINDOW = 8


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_sliding_window(drafter):
    """sliding_window = 8, block_size 2, prompts of 14 to 30 tokens: blocks behind the window are returned while
    requests run (FREED entries in block tables; a step in which no request finished and none was admitted still
    grows the free list), Chapter 6's invariants hold after every step, and greedy outputs equal a plain reference
    decoded one token at a time with no cache under the same window mask (`reference_logits`)."""
    rng = random.Random(21)
    items = [([rng.randrange(V) for _ in range(rng.randint(14, 30))], greedy(rng.randint(8, 20))) for _ in range(8)]
    eng = SpecDecoder(pair()[0], make_drafter(drafter), kappa=3, seed=engine_seed("window", drafter), block_size=2,
                      num_blocks=40, sliding_window=WINDOW)
    bm = eng.scheduler.block_manager
    seen = dict(freed_entries=0, grew=0)
    last = dict(free=bm.free_blocks, ids=set())

    def after_step(states: dict[int, RequestState]) -> None:
        "Check the invariants, and note window frees: FREED entries, and free-list growth with the same batch."
        finalized = [r.prompt_ids + r.output_ids for r in states.values()]
        assert check_invariants(bm, finalized=finalized) == []
        running = set(eng.running_ids())
        seen["freed_entries"] += sum(r.block_table.count(FREED) for r in running_records(eng))
        seen["grew"] += running == last["ids"] and bm.free_blocks > last["free"]
        last.update(free=bm.free_blocks, ids=running)

    outs, _ = run_online(eng, items, chunk=2, after_step=after_step)
    assert seen["freed_entries"] > 0 and seen["grew"] > 0, seen
    assert [o.token_ids for o in outs] == [expected_greedy(p, sp, WINDOW) for p, sp in items]
    assert [o.token_ids for o in outs] != [expected_greedy(p, sp) for p, sp in items]   # the window does matter
    assert bm.free_blocks == bm.num_blocks


def test_a_burst_sharing_a_prefix_computes_it_once():
    """Requests that arrive together with the same first block: the first one admitted computes the prefix, and the
    others wait one step (a block becomes shareable only once computed), then find every shared block cached. So the
    target computes the shared prefix once, not once per request, and the outputs are the plain greedy ones."""
    prefix = [1, 2, 3, 4, 5, 6, 7, 0]                                   # two blocks of 4
    items = [(prefix + [i % 8, (i + 3) % 8], greedy(5)) for i in range(6)]
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=2, block_size=4, num_blocks=64, max_num_seqs=6)
    for p, sp in items:
        eng.add_request(p, sp)
    first_step = []
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs.setdefault(o.req_id, [])
            outs[o.req_id] += o.new_token_ids
        first_step = first_step or eng.running_ids()
    assert len(first_step) == 1                                         # the others waited for the prefix
    assert eng.scheduler_stats().num_cached_tokens == 5 * len(prefix)           # ... and then reused all of it
    assert [outs[i] for i in sorted(outs)] == [expected_greedy(p, sp) for p, sp in items]


def test_q_rows_only_when_someone_reads_them():
    """An all-greedy step hands the sampler no draft q (its greedy path compares argmaxes); a step with one sampled
    request hands it every q row, one per draft token."""
    from speclab.sampling import rejection_sampler
    seen = []

    def spy(metadata, logits, draft_probs, sampling, backend):
        seen.append((sampling.all_greedy, None if draft_probs is None else draft_probs.shape[0],
                     len(metadata.draft_token_ids)))
        return rejection_sampler(metadata, logits, draft_probs, sampling, backend)
    eng = SpecDecoder(pair()[0], make_drafter("model"), kappa=2, block_size=4, num_blocks=64, sampler=spy)
    eng.generate([[1, 2, 3], [4, 5, 6]], [greedy(4), greedy(4)])
    assert seen and all(g and q is None for g, q, _ in seen)
    seen.clear()
    eng.generate([[1, 2, 3], [4, 5, 6]], [greedy(4), SamplingParams(temperature=1.0, max_tokens=4, seed=1)])
    assert any(not g for g, _, _ in seen)
    assert all(q == n if not g else q is None for g, q, n in seen)         # q rows for the mixed steps only
