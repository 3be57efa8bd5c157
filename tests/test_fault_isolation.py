"""One request never hurts another: a request whose fields leave no token, or whose drafting, verifying or
update raises, ends alone with an error; every other request of its steps gives exactly the tokens it gives without
it, the pool's invariants hold after every step, and the engine goes on serving.

The faulty requests are the issue's own (`allowed_token_ids` [" x"] with the bad word " x", " x x", or with
`min_tokens`) on the shipped tiny pair and its tokenizer, under every drafting mode, and planted faults at each stage of
a step. The neighbours are compared with a run of the same requests without the faulty one: greedy ones and a seeded
random one (a seeded request draws from its own generators, so its tokens do not depend on its batch)."""
import functools
import weakref
from dataclasses import replace

import pytest
import torch

from speclab.request import SamplingParams
from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.engine import SpecDecoder
from speclab.kvlab import check_invariants
from speclab.sampling import NO_VALID_TOKEN_ID
from speclab.eagle import EagleDrafter
from speclab.serve import load_drafter
from speclab.model import load_model, load_tokenizer
from speclab.serve import bad_words_ids
from speclab.train import tiny_pair_path

PROMPT = "def add(a, b):\n"
NEIGHBOURS = ["def add(a, b):\n", "import os\n", "class Point:\n    def __init__(self"]
MODES = ("plain", "ngram", "draft", "eagle")


@functools.cache
def shipped(name: str):
    "The shipped pair's models (loaded once: weights are never written) and the tokenizer."
    if name == "tokenizer":
        return load_tokenizer(tiny_pair_path("target"))
    return load_model(tiny_pair_path(name), torch.float32, "cpu")


def engine(mode: str) -> SpecDecoder:
    "A fresh engine (as `speclab serve` builds it) on the shipped target, drafting by `mode`."
    target, folder = shipped("target"), tiny_pair_path("draft").parent / "eagle"
    drafter = {"plain": lambda: None, "ngram": lambda: NgramDrafter(3),
               "draft": lambda: ModelDrafter(shipped("draft"), tokenizer=shipped("tokenizer")),
               "eagle": lambda: load_drafter(target, folder, None, torch.float32, "cpu")}[mode]()
    return SpecDecoder(target, drafter, shipped("tokenizer"), kappa=0 if drafter is None else 3, seed=0)


@functools.cache
def expected(mode: str) -> list:
    "The neighbours' tokens without any faulty request beside them."
    return [o.token_ids for o in run_all(engine(mode), NEIGHBOURS, neighbour_params())]


@pytest.fixture(scope="module")
def x_id() -> int:
    "The id of ' x' in the shipped tokenizer (the issue's token 777)."
    (x,) = engine("plain").tokenizer(" x")["input_ids"]
    return x


def neighbour_params() -> list[SamplingParams]:
    "Two greedy neighbours and a seeded random one."
    return [SamplingParams(temperature=0, max_tokens=8), SamplingParams(temperature=0, max_tokens=6),
            SamplingParams(temperature=1.0, seed=5, max_tokens=8)]


HISTORY = weakref.WeakKeyDictionary()   # engine -> every request record it ran: their tokens stay finalized


def run_all(eng: SpecDecoder, prompts: list, params: list, on_tokens: dict | None = None) -> list:
    "Step `eng` until done; check the pool's invariants after every step. Outputs in request order."
    on_tokens = on_tokens or {}
    ids = [eng.add_request(p, sp, on_tokens.get(i)) for i, (p, sp) in enumerate(zip(prompts, params))]
    records = HISTORY.setdefault(eng, {})
    records.update({i: eng.requests[i] for i in ids})
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished is not None:
                done[out.req_id] = out.finished
        bad = check_invariants(eng.scheduler.block_manager, finalized={i: r.token_ids for i, r in records.items()})
        assert bad == [], bad
    assert eng.block_usage()[0] == 0      # every block back in the pool
    return [done[i] for i in ids]


def faulty_cases(x: int, tokenizer) -> dict:
    "The issue's requests that no edge check can refuse: the row empties after one token."
    base = SamplingParams(temperature=1.0, seed=1, max_tokens=6, allowed_token_ids=[x])
    xx = [list(w) for w in bad_words_ids(tokenizer, [" x x"]) if list(w) == [x, x]]
    assert xx, "' x x' must tokenize to two ' x' tokens in the shipped tokenizer"
    return {"bad word x x": replace(base, bad_words=xx),
            "bad word x x, greedy": replace(base, temperature=0.0, bad_words=xx),
            "x x with min_tokens": replace(base, allowed_token_ids=[x, 0], min_tokens=3, bad_words=xx)}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_request_whose_fields_leave_no_token_ends_alone(mode, x_id):
    "Each variant: one token (the allowed ' x'), then an error naming the fields; the neighbours are untouched."
    eng = engine(mode)
    for name, sp in faulty_cases(x_id, eng.tokenizer).items():
        outs = run_all(eng, [PROMPT] + NEIGHBOURS, [sp] + neighbour_params())
        assert outs[0].finish_reason == "error", name
        assert outs[0].token_ids == [x_id], (name, outs[0].token_ids)      # never a token it excluded (EOS = 0)
        assert outs[0].error.startswith("ValueError: allowed_token_ids") and "output position 1" in outs[0].error
        assert [o.token_ids for o in outs[1:]] == expected(mode), name
        assert all(o.finish_reason in ("stop", "length") for o in outs[1:])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_contradictions_seen_in_the_fields_are_refused_before_queueing(temperature, x_id):
    "The issue's first request (allowed [' x'], bad word ' x') and its min_tokens variant: refused by name."
    eng = engine("draft")
    words = bad_words_ids(eng.tokenizer, [" x"])
    sp = SamplingParams(temperature=temperature, seed=1, max_tokens=6, allowed_token_ids=[x_id], bad_words=words)
    with pytest.raises(ValueError, match="^bad_words ban every token of allowed_token_ids"):
        eng.add_request(PROMPT, sp)
    with pytest.raises(ValueError, match="^min_tokens > 0 masks the stop tokens"):
        eng.add_request(PROMPT, replace(sp, allowed_token_ids=[x_id, eng.tokenizer.eos_token_id], min_tokens=3))
    assert not eng.has_unfinished()
    allowed = replace(sp, bad_words=None)                    # the same request without the contradiction is served
    (out,) = eng.generate([PROMPT], allowed)
    assert out.finish_reason == "length" and set(out.token_ids) == {x_id}


class Faulty:
    "Planted, before a drafter in the bases: drafting raises whenever a request of `max_tokens` 7 is in the batch."
    def propose(self, plan):
        if any(r.params.max_tokens == 7 for r in plan.requests):
            raise RuntimeError("planted drafting fault")
        return super().propose(plan)


class FaultyNgram(Faulty, NgramDrafter):
    "n-gram lookup, planted."


class FaultyModel(Faulty, ModelDrafter):
    "The draft model, planted."


class FaultyEagle(Faulty, EagleDrafter):
    "The EAGLE head, planted (its progress lives in the records: a request rerun alone loses none of it)."


def plant_drafter(eng: SpecDecoder) -> None:
    "Swap the engine's drafter for its planted twin, bound to the engine's pool as the runner binds its own."
    d = eng.drafter
    if isinstance(d, NgramDrafter):
        planted = FaultyNgram(d.n, d.min_n)
    elif isinstance(d, EagleDrafter):
        planted = FaultyEagle(d.head, d.target, d.greedy, d.dtype)
    else:
        planted = FaultyModel(d.model, d.greedy, d.tokenizer)
    eng.drafter = eng.runner.drafter = planted
    eng.drafter.bind(eng.config.num_blocks, eng.config.block_size, eng.config.sliding_window)


def plant_sampler(eng: SpecDecoder) -> None:
    "Planted: the step's sampler raises whenever a request at temperature 0.7 is in the batch (verify fails)."
    def sampler(md, logits, draft_probs, sampling, backend):
        if bool((sampling.temperature == 0.7).any()):
            raise RuntimeError("planted sampler fault")
        return original(md, logits, draft_probs, sampling, backend)
    original = eng.runner.sampler                              # the runner holds the one sampler
    eng.runner.sampler = sampler


@pytest.mark.parametrize("stage", ["draft", "verify", "update"])
@pytest.mark.parametrize("mode", ["ngram", "draft", "eagle"])
def test_a_planted_fault_ends_its_request_alone(stage, mode):
    "A request that raises mid-step (drafting, verifying, or in its own update) beside others: only it fails."
    eng = engine(mode)
    faulty = SamplingParams(temperature=0.7, seed=2, max_tokens=7)
    on_tokens = {}
    if stage == "draft":
        plant_drafter(eng)
    elif stage == "verify":
        plant_sampler(eng)
    else:
        def callback(ids):
            raise RuntimeError("planted callback fault")
        on_tokens = {1: callback}
    prompts, params = NEIGHBOURS[:1] + [PROMPT] + NEIGHBOURS[1:], neighbour_params()
    outs = run_all(eng, prompts, params[:1] + [faulty] + params[1:], on_tokens)
    what = {"draft": "drafting", "verify": "sampler", "update": "callback"}[stage]
    assert (outs[1].finish_reason, outs[1].error) == ("error", f"RuntimeError: planted {what} fault")
    assert [o.token_ids for o in outs[:1] + outs[2:]] == expected(mode)
    again = run_all(eng, NEIGHBOURS, neighbour_params())           # the engine goes on serving, as before
    assert [o.token_ids for o in again] == expected(mode)


def test_a_fault_in_a_step_does_not_move_a_seeded_neighbours_generators():
    "The failed step's draws are undone: the seeded neighbour's target and draft streams are where they would be."
    eng = engine("draft")
    plant_sampler(eng)
    seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=8)
    outs = run_all(eng, [PROMPT, PROMPT], [SamplingParams(temperature=0.7, seed=3, max_tokens=7), seeded])
    (alone,) = run_all(engine("draft"), [PROMPT], [seeded])
    assert outs[0].finish_reason == "error" and outs[1].token_ids == alone.token_ids


def test_the_empty_row_marker_never_reaches_the_tokens(x_id):
    "NO_VALID_TOKEN_ID marks the sampler's output only: no Output ever holds it, nor a placeholder."
    eng = engine("draft")
    sp = faulty_cases(x_id, eng.tokenizer)["bad word x x"]
    outs = eng.generate([PROMPT] * 3, [sp, replace(sp, seed=2), replace(sp, temperature=0.0)])
    assert all(t >= 0 and t != NO_VALID_TOKEN_ID for o in outs for t in o.token_ids)
    assert torch.tensor([len(o.token_ids) for o in outs]).eq(1).all()


def test_through_the_server_a_fault_and_the_bad_requests_end_alone(x_id):
    """The requests above and a planted sampler fault sent at once with greedy neighbours, over HTTP: the fault is a
    500, the contradictions are 400s naming their field, the neighbours get their greedy text, and the server goes on
    serving with every block free."""
    import asyncio

    import httpx

    from speclab.serve import EngineLoop, ServerThread, build_app
    eng = engine("draft")
    plant_sampler(eng)
    greedy = {"max_tokens": 8, "temperature": 0}
    issue = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1, "seed": 1, "allowed_token_ids": [x_id]}
    bodies = [{"prompt": PROMPT, "max_tokens": 7, "temperature": 0.7, "seed": 2},       # the planted fault
              {**issue, "bad_words": [" x"]},                                          # refused at the edge
              {**issue, "bad_words": [" x x"]},                                        # empties after one token
              {**issue, "bad_words": [" x x"], "temperature": 0},                      # was EOS, silently
              {**issue, "allowed_token_ids": [x_id, 0], "min_tokens": 3, "bad_words": [" x"]},
              *[{"prompt": p, **greedy} for p in NEIGHBOURS]]
    want = [o.text for o in engine("draft").generate(NEIGHBOURS, SamplingParams(temperature=0, max_tokens=8))]
    lp = EngineLoop(eng)
    with ServerThread(build_app(lp, "tiny")) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as c:
                return await asyncio.gather(*[c.post("/v1/completions", json=b) for b in bodies])
        replies = asyncio.run(main())
        again = httpx.post(f"{srv.url}/v1/completions", json={"prompt": NEIGHBOURS[0], **greedy}, timeout=300)
        health = httpx.get(f"{srv.url}/health", timeout=60)
    fault, edge, empty, empty_greedy, with_min, *neighbours = replies
    assert fault.status_code == 500 and "RuntimeError: planted sampler fault" in fault.json()["error"]["message"]
    assert (edge.status_code, edge.json()["error"]["param"]) == (400, "bad_words")
    assert (with_min.status_code, with_min.json()["error"]["param"]) == (400, "min_tokens")
    for r in (empty, empty_greedy):
        assert (r.status_code, r.json()["error"]["param"]) == (400, "allowed_token_ids"), r.text
        assert "output position 1" in r.json()["error"]["message"]
    assert [r.status_code for r in neighbours] == [200] * len(NEIGHBOURS)
    assert [r.json()["choices"][0]["text"] for r in neighbours] == want
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == want[0]
    assert health.status_code == 200
    assert eng.block_usage()[0] == 0       # the engine thread has stopped
