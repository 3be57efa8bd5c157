"""Token trees behind `speclab serve`: SGLang's words on the command line, the official `openai` client,
and `speclab audit` of a tree-drafting server against a plain one.

The audit runs the plan of tests/test_audit.py's `test_exact_pair_passes` (every check with power, level 0.001: a
correct pair fails on chance once in a thousand runs), with the audited server drafting EAGLE-2 trees from the
shipped draft model (top-2, up to 3 levels, 6 nodes a step) and the reference decoding plainly.
"""
import argparse

import pytest

from speclab.audit import DEFAULT_PROMPTS, PENALTIES, SETTINGS, plan_audit, run_audit
from speclab.cli import UsageError, build_parser, speculative_config, tree_plan
from speclab.serve import EngineLoop, ServerThread, build_app, load_engine
from speclab.testing import serve_process
from speclab.train import tiny_pair_path

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.xdist_group("tree_serve")     # one worker: the module's servers are built once
TREE = dict(topk=2, num_steps=3, num_draft_tokens=7)
AUDIT_BUDGET = 700                                     # test_audit's EXACT_BUDGET: every check has power


@pytest.fixture(scope="module")
def servers():
    "The shipped pair served in-process: trees (audited) and plain (reference)."
    target, draft = tiny_pair_path("target"), tiny_pair_path("draft")
    trees = EngineLoop(load_engine(target, draft, tree=TREE, max_num_seqs=16, seed=3))
    plain = EngineLoop(load_engine(target, None, kappa=0, max_num_seqs=16, seed=4))
    with ServerThread(build_app(trees, "speclab-tiny")) as a, ServerThread(build_app(plain, "speclab-tiny")) as b:
        yield a.url, b.url, trees


def test_audit_of_a_tree_server_passes(servers):
    "Every check of the audit passes with power at level 0.001, and the tree server really drafted trees."
    url, reference_url, trees = servers
    plan = plan_audit(prompts=DEFAULT_PROMPTS[:12], num_law_prompts=1, concurrency=8, settings={
        "t0.8,p0.6": SETTINGS["t0.8,p0.6"]}, penalties={"frequency2.0": PENALTIES["frequency2.0"]}, num_seeds=8,
        concurrency_n=60, greedy_tokens=8, budget=AUDIT_BUDGET, repeat_tokens=16, penalty_tokens=2, level=0.001)
    report = run_audit(url, reference_url, plan, progress=False, backoff=0.05)
    assert report["exit_code"] == 0, report["line"]
    assert {c["check"]: c["status"] for c in report["checks"]} == dict.fromkeys(
        ["fields", "laws", "penalties", "repeats", "concurrency", "seeds", "greedy", "logprobs"], "pass")
    assert all(c["tested"] == c["tests"] for c in report["checks"])
    metrics = trees.engine.metrics
    assert metrics.num_draft_tokens > metrics.num_drafts       # several nodes a step: trees, not chains
    assert metrics.num_accepted_tokens > 0


def test_openai_client_greedy_equals_plain(servers):
    "Greedy completions through the official client are the plain server's, text and logprobs tokens."
    url, reference_url, _ = servers
    texts = []
    for base in (url, reference_url):
        with openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120) as client:
            out = client.completions.create(model="speclab-tiny", prompt=list(DEFAULT_PROMPTS[:4]), max_tokens=24,
                                            temperature=0, logprobs=2)
            texts.append([(c.text, c.logprobs.tokens) for c in sorted(out.choices, key=lambda c: c.index)])
    assert texts[0] == texts[1]


def test_cli_serves_trees_with_sglangs_flags():
    "`speclab serve --speculative-eagle-topk 2 --speculative-num-steps 3 --speculative-num-draft-tokens 7` serves."
    with serve_process("--speculative-eagle-topk", "2", "--speculative-num-steps", "3",
                       "--speculative-num-draft-tokens", "7", "--max-num-seqs", "4") as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as client:
            out = client.completions.create(model="speclab-tiny", prompt="def add(a, b):", max_tokens=16,
                                            temperature=0)
            assert out.usage.completion_tokens == 16
        import httpx
        metrics = httpx.get(f"{url}/metrics").text
        drafted = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_draft_tokens_total")]
        assert drafted and float(drafted[0].split()[-1]) > 0


def parse(*argv):
    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize("argv,words", [
    (["--speculative-eagle-topk", "2"], "missing num_steps, num_draft_tokens"),
    (["--speculative-config", '{"topk": 2, "num_steps": 3, "num_draft_tokens": 7}', "--speculative-eagle-topk", "3"],
     "--speculative-eagle-topk 3 and 'topk' 2"),
    (["--speculative-config", '{"topk": 2, "num_steps": 3, "num_draft_tokens": 7, "num_speculative_tokens": 3}'],
     "drop num_speculative_tokens"),
    (["--speculative-config", '{"speculative_token_tree": "[(0,), (1,)]", "topk": 2}'], "fixes the tree: drop topk"),
    (["--speculative-config", '{"speculative_token_tree": "[(0,), (1,)]", "num_speculative_tokens": 3}'],
     r"kappa \(num_speculative_tokens\) 3 and the token tree's 2 nodes disagree"),
    (["--speculative-config", '{"speculative_token_tree": "[(0,), (2, 0)]"}'], "has no parent"),
    (["--speculative-eagle-topk", "2", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "7", "--kappa",
      "auto"], "no kappa policy for trees"),
    (["--speculative-config", '{"speculative_token_tree": "[(0,), (1,)]", "kappa": "auto"}'], "no kappa policy for trees"),
])
def test_tree_flags_conflicts_are_named(argv, words):
    with pytest.raises(UsageError, match=words):
        tree_plan(parse(*argv))


def test_tree_keys_in_speculative_config():
    assert speculative_config('{"topk": 2, "num_steps": 3, "num_draft_tokens": 7}') == TREE
    with pytest.raises(argparse.ArgumentTypeError, match="does not implement"):
        speculative_config('{"topk": 2, "eagle_topk": 3}')
    assert tree_plan(parse("--speculative-config", '{"topk": 2, "num_steps": 3, "num_draft_tokens": 7}')) == TREE
    assert tree_plan(parse()) is None
    shape = {"speculative_token_tree": "[(0,), (1,), (0, 0)]"}
    assert tree_plan(parse("--speculative-config", '{"speculative_token_tree": "[(0,), (1,), (0, 0)]", '
                           '"num_speculative_tokens": 3}')) == shape


@pytest.mark.parametrize("tree,words", [
    (dict(topk=2, num_steps=3, num_draft_tokens=1), "num_draft_tokens must be an int >= 2"),
    (dict(topk=2, num_steps=0, num_draft_tokens=7), "num_steps must be an int >= 1"),
    (dict(topk=2, num_steps=3), "exactly topk, num_steps, num_draft_tokens"),
])
def test_load_engine_names_a_bad_tree(tree, words):
    with pytest.raises(ValueError, match=words):
        load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), tree=tree)


@pytest.mark.parametrize("draft,tree", [
    ("draft", {"speculative_token_tree": "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"}),   # vLLM's fixed shape
    ("eagle", dict(topk=2, num_steps=4, num_draft_tokens=9)),                                  # the EAGLE head's
], ids=["fixed-shape", "eagle-head"])
def test_other_trees_serve_plain_greedy(servers, draft, tree):
    "A fixed shape (vLLM's word) and the EAGLE head's trees, served: greedy texts equal the plain server's."
    from speclab.eagle import eagle_path
    _, reference_url, _ = servers
    folder = eagle_path() if draft == "eagle" else tiny_pair_path("draft")
    loop = EngineLoop(load_engine(tiny_pair_path("target"), folder, tree=tree, max_num_seqs=4, seed=7))
    texts = []
    with ServerThread(build_app(loop, "speclab-tiny")) as server:
        for base in (server.url, reference_url):
            with openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120) as client:
                out = client.completions.create(model="speclab-tiny", prompt=list(DEFAULT_PROMPTS[:4]), max_tokens=24,
                                                temperature=0)
                texts.append([c.text for c in sorted(out.choices, key=lambda c: c.index)])
    assert texts[0] == texts[1]
    assert loop.engine.metrics.num_accepted_tokens > 0
