"""Token trees in the engine (Chapter 14's TreeDrafter through Chapter 8's SpecDecoder): exactness end to end.

Everything runs on the law harnesses of tests/test_engine.py (a batch of interleaved sampling settings plus greedy
requests) and tests/test_scheduler.py (requests arriving between steps, prefix hits, a small pool that preempts), on
`tiny_random_pair` (V = 8, float64), with EAGLE-2 trees from the draft model: 4 nodes per request (top-2, up to 3
levels), verified by the target-only rule.

Power. The grid tests two settings, (1.0, 0) with 512 outcomes and (0.7, 3) with 27, each at the fewest requests at
which its chi-square test (level 1e-3) flags a TV bias of TREE_TV = 0.04 with probability 0.999 (Chapter 1's
`draws_for_law`: 45,370 and 12,363). That is a little weaker than the chain grid's 0.03: a tree request costs about
1.6 ms of Python on this CPU, and the grid's 58,000 requests already take 1.5 minutes. The events test draws
test_scheduler's sizes (TV 0.045). A planted verifier that draws the residual from p itself (forgetting the refused
children) must be rejected by the same harness; its rejection is asserted at the grid's sizes.
The deterministic tests: greedy with trees is plain greedy decoding (the shipped pair, penalties included, whose
history must be each node's own path), logprobs equal plain decoding's, and a seeded request ignores its batch.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

import speclab.tree_verify
from speclab.request import SamplingParams
from speclab.engine import SpecDecoder
from speclab.model import load_model
from speclab.proof import LEVEL, chi_square_gof, detectable_tv, draws_for_law
from speclab.sampling import fixed_point_pick, tree_children
from speclab.train import eval_prompts, tiny_pair_path
from speclab.trees import TreeDrafter

import test_engine as grid
import test_scheduler as events

TREE_TV = 0.04
NODES, TOPK, DEPTH = 4, 2, 3
GROUPS = ((1.0, 0), (0.7, 3))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    "One torch thread, as in test_scheduler: on a busy 2-core CPU two threads wait on each other."
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tree_engine(call, batch, seed_key="tree"):
    return SpecDecoder(grid.pair()[0], TreeDrafter(grid.pair()[1], topk=TOPK, depth=DEPTH), kappa=NODES,
                       max_num_seqs=len(batch), max_num_batched_tokens=2 ** 20,
                       num_blocks=grid.pool_size(NODES, batch), seed=grid.engine_seed(seed_key, call))


def grid_sizes():
    return tuple(draws_for_law(np.asarray(grid.law(t, k)), TREE_TV) for t, k in GROUPS)


_RUNS = {}


def tree_counts(key="tree"):
    "The grid's counts [setting, outcome] and drafted tokens (computed once per key)."
    if key not in _RUNS:
        _RUNS[key] = grid.run_law(NODES, grid_sizes(), GROUPS, lambda call, batch: tree_engine(call, batch, key))
    return _RUNS[key]


@pytest.mark.xdist_group("tree-engine-grid")
@pytest.mark.parametrize("temperature,top_k", GROUPS)
def test_tree_law_of_first_three_tokens(temperature, top_k):
    """Trees keep the target's law: the first three tokens of unseeded requests (settings interleaved, a greedy request
    per 16 equal to plain greedy) follow `sequence_law` at level 1e-3, at the draws that flag TV >= 0.04."""
    s = GROUPS.index((temperature, top_k))
    counts, drafted = tree_counts()
    pval, df, flags = grid.check_law(counts[s], grid.law(temperature, top_k), grid_sizes()[s])
    assert drafted > 0 and df > 0
    assert flags <= TREE_TV + 1e-9, "fewer samples than the stated power needs"
    assert pval > LEVEL, f"chi-square p = {pval:.2e} on {df} df (this test flags TV >= {flags:.3f})"


def buggy_tree_verify(tree_tokens, parents, target_probs, coins, final_coin):
    "BUG: when every child of a node is refused, draw from p itself instead of p without the refused children."
    kids, tokens = tree_children(list(parents)), list(tree_tokens)
    node, out = 0, []
    while kids[node]:
        p = target_probs[node].double()
        mass = 0.0
        for child in kids[node]:
            mass += p[tokens[child]].item()
            if coins[node] < mass:
                break
        else:
            return out + [fixed_point_pick(p, final_coin)]
        out.append(tokens[child])
        node = child
    return out + [fixed_point_pick(target_probs[node].double(), final_coin)]


@pytest.mark.xdist_group("tree-engine-grid")
def test_planted_tree_verifier_is_rejected(monkeypatch):
    "The same harness and sizes reject a tree walk whose residual forgets the refused children."
    monkeypatch.setattr(speclab.tree_verify, "tree_verify", buggy_tree_verify)
    counts, _ = grid.run_law(NODES, grid_sizes()[:1], GROUPS[:1], lambda call, batch: tree_engine(call, batch, "bug"))
    pval, df, _ = grid.check_law(counts[0], grid.law(*GROUPS[0]), grid_sizes()[0])
    assert df > 0 and pval < LEVEL, f"the planted verifier passed: p = {pval:.3g}"


@pytest.mark.xdist_group("tree-engine-events")
def test_tree_law_under_engine_events():
    """Trees through arrivals, prefix hits and preemption (test_scheduler's small-pool config and its sizes): the law
    holds, greedy fillers equal plain greedy, and requests were preempted and hit the cache."""
    sizes = events.law_sizes()
    items, setting = [], []
    order = np.random.default_rng(1).permutation(np.repeat(np.arange(len(events.SETTINGS)), sizes))
    for i, s in enumerate(order):
        if i % 2 == 0:
            items.append((events.PROMPT, events.FILLER))
            setting.append(-1)
        items.append((events.PROMPT, events.LAW_PARAMS[s]))
        setting.append(int(s))
    eng = SpecDecoder(events.pair()[0], TreeDrafter(events.pair()[1], topk=TOPK, depth=DEPTH), kappa=NODES,
                      seed=events.engine_seed("tree-events", sizes), block_size=2, max_num_seqs=512,
                      num_blocks=events.LAW_POOL_BLOCKS)
    victims = events.watch_preemptions(eng)
    outs, _ = events.run_online(eng, items, events.ARRIVAL_CHUNK)
    setting = np.array(setting)
    greedy = events.expected_greedy(events.PROMPT, events.FILLER)
    assert all(o.token_ids == greedy for o, s in zip(outs, setting) if s < 0)
    assert eng.scheduler.num_preemptions > 0 and len(victims) > 0
    assert eng.scheduler.num_cached_tokens > 0
    assert eng.metrics.num_accepted_tokens > 0
    V = events.V
    codes = np.array([o.token_ids[:3] for o in outs]) @ np.array([V * V, V, 1])
    for s, (temperature, top_k) in enumerate(events.SETTINGS):
        counts = np.bincount(codes[setting == s], minlength=V ** 3)
        _, pval, df = chi_square_gof(counts, events.law(temperature, top_k))
        assert df > 0 and detectable_tv(sizes[s], df + 1) <= events.TV_EVENTS + 1e-9
        assert pval > LEVEL, f"{(temperature, top_k)}: chi-square p = {pval:.2e} on {df} df"


@pytest.fixture(scope="module")
def shipped():
    return load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=24),
    SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
    SamplingParams(temperature=0, max_tokens=20, logprobs=3),
], ids=["greedy", "penalties", "logprobs"])
def test_greedy_trees_are_plain_greedy(shipped, params):
    """Greedy with trees equals plain greedy decoding on the shipped pair, penalties included (each node's history is
    its own path) and logprobs equal plain decoding's; the trees accepted drafts."""
    target, draft = shipped
    prompts = eval_prompts(6, 40, seed=11)
    plain = SpecDecoder(target, None).generate(prompts, params)
    eng = SpecDecoder(target, TreeDrafter(draft, topk=3, depth=4), kappa=9, block_size=16, max_num_seqs=3)
    trees = eng.generate(prompts, params)
    assert [o.token_ids for o in trees] == [o.token_ids for o in plain]
    assert eng.metrics.num_accepted_tokens > 0
    if params.logprobs:
        for a, b in zip(trees, plain):
            assert len(a.logprobs) == len(b.logprobs)
            for (lp_a, top_a), (lp_b, top_b) in zip(a.logprobs, b.logprobs):
                assert abs(lp_a - lp_b) < 1e-4
                assert [t for t, _ in top_a] == [t for t, _ in top_b]


def test_seeded_tree_request_ignores_its_batch(shipped):
    "A seeded sampled request emits the same tokens alone and among other requests."
    target, draft = shipped
    prompts = eval_prompts(4, 32, seed=2)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=123)
    alone = SpecDecoder(target, TreeDrafter(draft), kappa=6).generate(prompts[:1], seeded)
    others = [SamplingParams(temperature=1.0, max_tokens=16)] * 3
    mixed = SpecDecoder(target, TreeDrafter(draft), kappa=6, seed=5).generate(prompts, [seeded] + others)
    assert alone[0].token_ids == mixed[0].token_ids


def test_the_api_refuses_what_the_cli_refuses():
    """One rule set (Chapter 8a's check_drafting_rules) for the Python API and the command line: a kappa policy with a
    tree, and a fixed shape whose node count is not kappa, are refused by SpecDecoder, load_engine and the CLI in the
    same words, before any model loads (the CLI) or any pool is allocated (the engine)."""
    from speclab.cli import UsageError, build_parser, tree_plan
    from speclab.policy import KappaPolicy, StepCosts
    from speclab.serve import load_engine
    from speclab.testing import tiny_random_pair
    target, draft = tiny_random_pair()
    shape = "[(0,), (1,), (0, 0)]"
    policy = KappaPolicy(StepCosts(verify_s=1e-3, verify_token_s=1e-4))
    cases = [(lambda: SpecDecoder(target, TreeDrafter(draft), kappa=4, policy=policy),
              ["--speculative-config", '{"topk": 2, "num_steps": 3, "num_draft_tokens": 7}', "--kappa", "auto"],
              "no kappa policy for trees"),
             (lambda: SpecDecoder(target, TreeDrafter(draft, token_tree=shape), kappa=7),
              ["--speculative-config", f'{{"speculative_token_tree": "{shape}", "num_speculative_tokens": 7}}'],
              "7 and the token tree's 3 nodes disagree")]
    for api, argv, words in cases:
        with pytest.raises(ValueError) as api_error:
            api()
        with pytest.raises(UsageError) as cli_error:
            tree_plan(build_parser().parse_args(["serve", *argv]))
        assert words in str(api_error.value) and str(api_error.value) in str(cli_error.value)
    with pytest.raises(ValueError, match="3 nodes disagree"):
        load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=7,
                    tree={"speculative_token_tree": shape})
    eng = SpecDecoder(target, TreeDrafter(draft, token_tree=shape), kappa=3)      # the agreeing pair runs
    assert eng.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))[0].finish_reason == "length"


def test_auto_calibration_fits_a_short_context():
    """load_engine(kappa="auto") on a 64-position model: the calibration sizes itself to the context (fewer steps),
    and the caller can size it (`calibration`); a size the context cannot hold names its remedy."""
    import json
    import shutil
    import tempfile
    from speclab.serve import load_engine
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for name in ("target", "draft"):
            folders[name] = Path(tmp) / name
            shutil.copytree(tiny_pair_path(name), folders[name])
            cfg = folders[name] / "config.json"
            cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "max_position_embeddings": 64}))
        seen = []
        eng = load_engine(folders["target"], folders["draft"], on_calibration=seen.append,
                          calibration=dict(batch_sizes=(1, 2)))
        assert eng.config.context == 64 and len(seen) == 1
        out = eng.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8))[0]
        assert out.finish_reason == "length"
        with pytest.raises(ValueError, match="calibration=dict"):
            load_engine(folders["target"], folders["draft"], calibration=dict(steps=40, batch_sizes=(1,)))
