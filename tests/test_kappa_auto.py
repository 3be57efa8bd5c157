"""`--kappa auto` end to end: a server at the default `kappa="auto"` (calibrated where it runs, then a KappaPolicy
choosing each step's kappa in 0..4) behind the real `openai` client, and its /metrics read by prometheus_client's own
parser.

The policy's choices follow this machine's measured costs, so the tests assert what must hold whatever it chooses:
greedy output is plain greedy output, every request-step is counted once under the kappa planned for it (in the
per-choice `spec_decode.kappa_counts` and in the `speclab:spec_decode_kappa` histogram alike), and the histogram is
cumulative. One calibration for the module (a second or a few on an idle machine).
"""
import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from speclab.policy import UNTRUSTED_EXPLORE
from speclab.request import SamplingParams
from speclab.serve import AUTO_KAPPA_MAX, EngineLoop, ServerThread, build_app, load_engine
from speclab.train import tiny_pair_path

pytestmark = pytest.mark.xdist_group("serve")   # beside test_serve's servers: one worker for the CPU-heavy modules

MODEL = "speclab-tiny"
PROMPTS = ["def add(a, b):\n", "class Stack:\n    def push(self, x):\n", "import os\n\n", "    for i in range("]


@pytest.fixture(scope="module")
def auto_server():
    "(url, engine loop, calibration) of a server on the shipped pair at the default kappa 'auto'."
    seen = []
    engine = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), max_num_seqs=4, on_calibration=seen.append)
    lp = EngineLoop(engine)
    with ServerThread(build_app(lp, MODEL)) as srv:
        yield srv.url, lp, seen[0]


@pytest.fixture(scope="module")
def oai(auto_server):
    with openai.OpenAI(base_url=auto_server[0] + "/v1", api_key="none", timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def plain():
    "Plain greedy decoding of the same target (kappa 0: no drafter)."
    return load_engine(tiny_pair_path("target"), None, kappa=0)


def scrape(url):
    return httpx.get(url + "/metrics", timeout=60).text


def kappa_family(text):
    "speclab:spec_decode_kappa of a scrape: ({le: cumulative count}, _count, _sum)."
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "speclab:spec_decode_kappa")
    assert fam.type == "histogram" and "plain step" in fam.documentation
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    count = next(s.value for s in fam.samples if s.name.endswith("_count"))
    total = next(s.value for s in fam.samples if s.name.endswith("_sum"))
    return buckets, count, total


def test_the_engine_is_adaptive(auto_server):
    "No number given: a KappaPolicy plans in 0..AUTO_KAPPA_MAX with what the calibration measured."
    _, lp, cal = auto_server
    engine = lp.engine
    assert engine.config.kappa == cal.kappa_max == AUTO_KAPPA_MAX
    policy = engine.scheduler.policy
    assert type(policy).__name__ == "KappaPolicy" and policy.costs == cal.costs
    assert cal.seconds > 0 and "calibrated in" in cal.describe()
    assert (policy.learn, policy.explore) == ((False, 0.0) if cal.problem is None else (True, UNTRUSTED_EXPLORE))


def test_a_refused_calibration_is_said_and_explored_past(monkeypatch):
    """Costs that `calibration_problem` refuses (here: every one) are said in the start-up line, and the policy,
    which starts from them, also explores until its own steps have taught it both kinds of step."""
    refuse = lambda costs, steps, drafter: "a drafter measured to cost 0 s"
    monkeypatch.setattr("speclab.policy.calibration_problem", refuse)
    seen = []
    engine = load_engine(tiny_pair_path("target"), None, ngram=3, max_num_seqs=2, on_calibration=seen.append)
    assert seen[0].problem == "a drafter measured to cost 0 s"
    assert "refused: a drafter measured to cost 0 s" in seen[0].describe()
    assert engine.scheduler.policy.explore == UNTRUSTED_EXPLORE and engine.scheduler.policy.learn


def test_steps_that_fit_no_costs_refuse_the_calibration_instead_of_failing(monkeypatch):
    """A busy machine's noise can leave no costs at all (the fit puts none of the steps' time on the target: the
    error `speclab demo` once stopped with). The engine still starts: the calibration is refused with that reason and
    the policy learns its costs from its own steps, starting from the median step."""
    def no_fit(steps):
        raise ValueError("no StepCosts fits the measured steps: the fit put none of their time on the target")
    monkeypatch.setattr("speclab.policy.fit_step_costs", no_fit)
    seen = []
    engine = load_engine(tiny_pair_path("target"), None, ngram=3, max_num_seqs=2, on_calibration=seen.append)
    assert "refused: no StepCosts fits the measured steps" in seen[0].describe()
    assert seen[0].costs.verify_s > 0 and seen[0].costs.verify_token_s == 0
    assert engine.scheduler.policy.learn and engine.scheduler.policy.explore == UNTRUSTED_EXPLORE
    out = engine.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].token_ids) == 8


def test_greedy_is_plain_greedy_and_counts_every_step(auto_server, oai, plain):
    """Greedy through the auto server equals plain greedy; each choice's kappa_counts counts its steps: one
    request-step per step, so, one request at a time, its sum is the histogram's _count delta, and the planned
    drafts are at most the tokens it could have drafted. A max_tokens=1 request plans kappa 0 (no room to draft)."""
    url, lp, cal = auto_server
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(PROMPTS, params)]
    counts = []
    for p, ids in zip(PROMPTS + ["x = 1"], want + [None]):
        n = 24 if ids is not None else 1
        before = kappa_family(scrape(url))
        r = oai.completions.create(model=MODEL, prompt=p, max_tokens=n, temperature=0,
                                   extra_body={"spec_decode_stats": True, "ignore_eos": True})
        after = kappa_family(scrape(url))
        stats = r.choices[0].model_extra["spec_decode"]
        kc = stats["kappa_counts"]
        assert isinstance(kc, list) and all(isinstance(x, int) and x >= 0 for x in kc), stats
        assert sum(kc) == after[1] - before[1] >= 1                       # one count per request-step
        assert sum(k * c for k, c in enumerate(kc)) == after[2] - before[2]
        assert sum(kc) <= r.usage.completion_tokens == n                 # every step emitted a token
        assert stats["num_draft_tokens"] <= sum(k * c for k, c in enumerate(kc))   # a draft may stop short
        assert stats["num_drafts"] <= sum(kc[1:])
        counts.append(kc)
        if ids is not None:
            assert r.choices[0].text == plain.tokenizer.decode(ids)
    assert counts[-1] == [1]                                              # max_tokens 1: one plain step
    if cal.crossing is None or cal.crossing > 1:                         # speculation pays at batch 1 here:
        assert any(sum(kc[1:]) for kc in counts[:-1]), counts             # so the policy drafted at some step


def test_the_kappa_histogram(auto_server, oai):
    """The histogram after concurrent requests (sampled, and one of max_tokens 1, which has no room to draft):
    present from le="0" to le="4" and +Inf, cumulative, its _count the engine's request-steps (its
    SpecMetrics.kappa_counts, as published) and the sum of the choices' kappa_counts."""
    url, lp, _ = auto_server

    async def burst():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0) as c:
            return await asyncio.gather(*(c.completions.create(
                model=MODEL, prompt=p, max_tokens=16 if i else 1, temperature=0.8, seed=i,
                extra_body={"spec_decode_stats": True}) for i, p in enumerate(PROMPTS * 2)))

    before = kappa_family(scrape(url))
    replies = asyncio.run(asyncio.wait_for(burst(), timeout=300))
    buckets, count, total = kappa_family(scrape(url))
    assert list(buckets) == [str(k) for k in range(AUTO_KAPPA_MAX + 1)] + ["+Inf"]
    values = list(buckets.values())
    assert all(a <= b for a, b in zip(values, values[1:])) and values[-1] == count
    published = lp.snapshot.spec.kappa_counts
    assert [int(v) for v in values[:-1]] == [sum(published[:k + 1]) for k in range(AUTO_KAPPA_MAX + 1)]
    served = [r.choices[0].model_extra["spec_decode"]["kappa_counts"] for r in replies]
    assert count - before[1] == sum(map(sum, served))
    assert total - before[2] == sum(k * c for kc in served for k, c in enumerate(kc))
    assert values[0] - before[0]["0"] >= 1                               # the max_tokens=1 request's plain step
    assert served[0] == [1]
