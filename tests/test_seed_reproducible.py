"""A seeded request's output is a function of its seed: the same text whatever its batch, the machine's load and the
policy, for a fixed kappa (chain), a token tree and `--kappa auto`.

Chapter 8 promises it: a seeded request draws from its own generators. The promise also needs every draw to happen
in the same order wherever the request runs, so the number of tokens it drafts in a step must not depend on its
neighbours or on the measured step costs (`seeded_kappas`). Load reaches the engine only through those costs, so a
heavily loaded machine is stood in for by costs under which drafting never pays, and an idle one by costs under which
it always pays. The shipped pair, T = 1, seed 7, 24 tokens: three times alone and three times in a batch of eight
beside unseeded and differently seeded requests, in fresh engines whose own generators differ.
"""
import pytest
import torch

from speclab.request import SamplingParams
from speclab.drafters import ModelDrafter
from speclab.engine import SpecDecoder
from speclab.policy import KappaPolicy, StepCosts
from speclab.model import load_model, load_tokenizer
from speclab.train import tiny_pair_path
from speclab.trees import TreeDrafter

pytestmark = pytest.mark.xdist_group("serve")   # the shipped pair's CPU-heavy modules share one worker

PROMPT = "def add(a, b):\n"
OTHERS = ["class Stack:\n    def push(self, x):\n", "import os\n\n", "    for i in range(", "def main():\n",
          "    return", "x = [", "if __name__ == '__main__':\n"]
SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=24)
IDLE = StepCosts(verify_s=10e-3, verify_token_s=1e-5, draft_s=1e-4, draft_request_s=1e-6)   # drafting always pays
BUSY = StepCosts(verify_s=1e-4, verify_token_s=5e-2, draft_s=1.0, draft_request_s=0.1)      # it never pays


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target = load_model(tiny_pair_path("target"))
    draft = load_model(tiny_pair_path("draft"))
    return target, draft, load_tokenizer(tiny_pair_path("target"))


def engines(pair, kind):
    "Fresh engines of one kind, as (name, SpecDecoder) pairs: the settings a seeded request must not notice."
    target, draft, tok = pair
    if kind == "chain":
        return [(f"kappa 3, engine seed {s}", SpecDecoder(target, ModelDrafter(draft), tok, kappa=3, seed=s))
                for s in (0, 1)]
    if kind == "tree":
        return [(f"top-2 tree, engine seed {s}", SpecDecoder(target, TreeDrafter(draft, topk=2, depth=3), tok,
                                                             kappa=4, seed=s)) for s in (0, 1)]
    return [(f"auto, {name} costs, engine seed {s}",
             SpecDecoder(target, ModelDrafter(draft), tok, kappa=4, seed=s, policy=KappaPolicy.adaptive(costs)))
            for s, (name, costs) in enumerate([("idle", IDLE), ("busy", BUSY)])]


def seeded_texts(eng) -> list[tuple[int, ...]]:
    "The seeded request's tokens, three times alone and three times in a batch of eight (its place in it moving)."
    outs = [eng.generate([PROMPT], SEEDED)[0].token_ids for _ in range(3)]
    for place in (0, 3, 7):
        prompts = OTHERS[:place] + [PROMPT] + OTHERS[place:]
        params = [SamplingParams(temperature=1.0, seed=None if i % 2 else 100 + i, max_tokens=24 + 3 * i)
                  for i in range(len(prompts))]
        params[place] = SEEDED
        outs.append(eng.generate(prompts, params)[place].token_ids)
    return [tuple(o) for o in outs]


@pytest.mark.parametrize("kind", ["chain", "tree", "auto"])
def test_seeded_request_ignores_batch_and_load(pair, kind):
    "One output, whatever the batch, the engine's own seed and (for auto) the costs the machine's load would give."
    seen = {}
    for name, eng in engines(pair, kind):
        for tokens in seeded_texts(eng):
            seen.setdefault(tokens, []).append(name)
        if kind == "auto":
            counts = list(eng.metrics.kappa_counts) + [0] * 5
            assert counts[4] > 0, f"{name}: the seeded request never drafted its cap: {counts}"
    assert len(seen) == 1, f"{kind}: {len(seen)} distinct outputs for one seed: " + "; ".join(
        f"{len(v)} x {v[0]}" for v in seen.values())


def test_auto_still_adapts_the_unseeded(pair):
    """The fix is for seeded requests only: under costs where drafting never pays, unseeded requests decode plainly
    (kappa 0 chosen) while a seeded one beside them drafts its cap."""
    target, draft, tok = pair
    eng = SpecDecoder(target, ModelDrafter(draft), tok, kappa=4, policy=KappaPolicy.adaptive(BUSY))
    eng.generate(OTHERS[:4], SamplingParams(temperature=1.0, max_tokens=12))
    counts = list(eng.metrics.kappa_counts) + [0] * 5
    assert counts[0] > 0 and sum(counts[1:]) == 0, counts
    eng.generate(OTHERS[:4] + [PROMPT], [SamplingParams(temperature=1.0, max_tokens=12)] * 4 + [SEEDED])
    after = list(eng.metrics.kappa_counts) + [0] * 5
    assert after[4] > counts[4] and after[0] > counts[0], after
