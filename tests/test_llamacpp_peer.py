"""llama.cpp as the second peer engine: its server's command, its counters, the pair in GGUF, and the live checks.

The unit tests run everywhere: they need neither a build nor a server. The live tests need llama.cpp's
`llama-server` built from PyPI's llama-cpp-python source and the pair converted to GGUF, outside the repository
(`benchmarks/common/llamacpp_env.py`: about 5 minutes on 2 cores, once per machine). `.ci/run` builds it before the
tests; anywhere the build is missing they are skipped, with the command that makes it:

    .venv/bin/python benchmarks/common/llamacpp_env.py

With the build: under a minute on 2 cores. No timing is asserted; benchmarks/llamacpp_peer measures speed.
"""
import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks" / "common"), str(ROOT / "benchmarks" / "llamacpp_peer")]
import llamacpp_env  # noqa: E402  (standard library only)

pytestmark = pytest.mark.xdist_group("llamacpp-peer")   # one worker: the module's servers are started once

NUM_PROMPTS = 8
MAX_TOKENS = 32
# What llama-server printed on /metrics after 13 drafting steps of one request (its own counter names).
METRICS = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 37
llamacpp:spec_decode_num_accepted_tokens_total 16
llamacpp:spec_decode_num_drafts_total 13
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 3
llamacpp:n_decode_total 40
"""


def test_plain_command_has_openai_semantics_and_no_draft():
    "Plain: no speculation flag, llama.cpp's default truncations off, temperature first, no fixed server seed."
    cmd = llamacpp_env.llamacpp_command(Path("llama-server"), Path("t.gguf"), 8080, parallel=4, threads=2)
    assert "--spec-draft-model" not in cmd and "--spec-type" not in cmd
    assert cmd[cmd.index("--top-k") + 1] == "0" and cmd[cmd.index("--min-p") + 1] == "0.0"
    assert cmd[cmd.index("--samplers") + 1].split(";")[:2] == ["penalties", "temperature"]
    assert "--seed" not in cmd                 # a fixed default seed would give every unseeded request one stream
    assert cmd[cmd.index("-c") + 1] == str(4 * llamacpp_env.CONTEXT) and cmd[cmd.index("--parallel") + 1] == "4"


def test_draft_command_turns_speculation_on():
    "With a draft: the draft-model speculation type (llama.cpp's default is none), up to num_draft, any p."
    cmd = llamacpp_env.llamacpp_command(Path("llama-server"), Path("t.gguf"), 8080, Path("d.gguf"), num_draft=3)
    assert cmd[cmd.index("--spec-type") + 1] == "draft-simple"
    assert cmd[cmd.index("--spec-draft-model") + 1] == "d.gguf"
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "3" and cmd[cmd.index("--spec-draft-p-min") + 1] == "0"


@pytest.mark.parametrize("kw,name", [(dict(model=Path("/no/such.gguf")), "model"), (dict(num_draft=0), "num_draft"),
                                     (dict(parallel=0), "parallel")])
def test_server_refuses_bad_arguments_before_starting(kw, name, tmp_path):
    model = tmp_path / "t.gguf"
    model.write_bytes(b"")
    with pytest.raises(ValueError, match=name):
        with llamacpp_env.llamacpp_server(**{"model": model, **kw}):
            pass


def test_shipped_tokenizer_is_what_the_converter_is_told(tmp_path):
    "The shipped pair's tokenizer is byte-level BPE split by GPT-2's regex; another tokenizer is refused, named."
    llamacpp_env.check_gpt2_pretokenizer(llamacpp_env.TARGET)
    llamacpp_env.check_gpt2_pretokenizer(llamacpp_env.DRAFT)
    tok = json.loads((llamacpp_env.TARGET / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="not a byte-level BPE"):
        llamacpp_env.check_gpt2_pretokenizer(tmp_path)


def test_counters_are_read_and_differenced():
    "llama-server's counters: E = 1 + accepted / drafts, and the per-position rates, between two scrapes."
    import llamacpp_peer
    parsed = {}
    for name, pos, value in llamacpp_peer.LLAMA_COUNTER.findall(METRICS):
        parsed.setdefault(name, []).append((pos, float(value)))
    assert parsed["num_drafts"] == [("", 13.0)] and len(parsed["num_accepted_tokens_per_pos"]) == 3
    after = dict(num_drafts=13.0, num_draft_tokens=37.0, num_accepted_tokens=16.0, per_pos=[9.0, 4.0, 3.0])
    acc = llamacpp_peer.llamacpp_acceptance(after, {"per_pos": []})
    assert acc["E"] == pytest.approx(1 + 16 / 13, abs=1e-4)
    assert acc["per_position"] == pytest.approx([9 / 13, 4 / 13, 3 / 13], abs=1e-4)
    assert llamacpp_peer.llamacpp_acceptance(after, after) == {}        # no drafting step between the scrapes


SKIP_REASON = ("needs llama.cpp's llama-server built from PyPI's llama-cpp-python source and the pair in GGUF: "
               "`.venv/bin/python benchmarks/common/llamacpp_env.py` makes both (minutes)")


@pytest.fixture(scope="module")
def gguf() -> tuple:
    "The shipped pair in f32 GGUF; the live tests are skipped, with their reason, without the build."
    if not llamacpp_env.binary_path().is_file() or shutil.which("cmake") is None:
        pytest.skip(SKIP_REASON)
    try:
        return llamacpp_env.gguf_pair()
    except RuntimeError as e:
        pytest.skip(f"{e}; {SKIP_REASON}")


@pytest.fixture(scope="module")
def prompts() -> list:
    "The held-out prompts of the sweeps (64 token ids each): every engine gets the same ids."
    from speclab.sweep import sweep_prompts
    return sweep_prompts(NUM_PROMPTS)


def complete(url: str, prompt, **body) -> dict:
    "One completion's first choice (ValueError with the server's answer if it is not 200)."
    with httpx.Client(timeout=300) as client:
        r = client.post(f"{url}/v1/completions", json=dict(model="m", prompt=prompt, **body))
    if r.status_code != 200:
        raise ValueError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
    return r.json()["choices"][0]


def greedy_texts(url: str, prompts: list) -> list[str]:
    "Each prompt's greedy text, ignore_eos, one request at a time."
    return [complete(url, p, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)["text"] for p in prompts]


@pytest.fixture(scope="module")
def servers(gguf, tmp_path_factory):
    "(plain url, speculative url): llama-server on the converted pair, 4 slots each, stopped after the module."
    logs = tmp_path_factory.mktemp("llamacpp")
    with llamacpp_env.llamacpp_server(gguf[0], parallel=4, threads=1, log=logs / "plain.log") as plain, \
            llamacpp_env.llamacpp_server(gguf[0], gguf[1], parallel=4, threads=1, log=logs / "spec.log") as spec:
        yield plain, spec


def test_llamacpp_tokenizes_as_the_shipped_tokenizer(servers):
    "The converted vocabulary and pre-tokenizer split text into the same ids as the shipped tokenizer."
    from speclab.model import load_tokenizer
    tok = load_tokenizer(llamacpp_env.TARGET)
    texts = ["raise ValueError(", "with open(", "# Copyright", "def f(x):\n    return x  # ünïcode", "In 1492,"]
    with httpx.Client(timeout=60) as client:
        ids = [client.post(f"{servers[0]}/tokenize", json={"content": t}).json()["tokens"] for t in texts]
    assert ids == [tok.encode(t) for t in texts]


def test_llamacpp_greedy_equals_speclab_plain(servers, prompts):
    "The converted model is the same model: llama.cpp's greedy text is speclab's plain engine's, prompt for prompt."
    from speclab.engine import SpecDecoder
    from speclab.model import load_model, load_tokenizer
    from speclab.request import SamplingParams
    eng = SpecDecoder(load_model(llamacpp_env.TARGET), None, kappa=0)
    outs = eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    tok = load_tokenizer(llamacpp_env.TARGET)
    ours = [tok.decode(o.token_ids) for o in outs]
    assert greedy_texts(servers[0], prompts) == ours


def test_llamacpp_speculation_drafts_and_keeps_greedy_text(servers, prompts):
    "llama.cpp's draft-model speculation drafts (its own counters move) and writes its plain greedy text."
    import llamacpp_peer
    with httpx.Client(timeout=60) as client:
        before = llamacpp_peer.llamacpp_scrape(client, servers[1])
        texts = greedy_texts(servers[1], prompts)
        after = llamacpp_peer.llamacpp_scrape(client, servers[1])
    acc = llamacpp_peer.llamacpp_acceptance(after, before)
    assert acc and acc["num_drafts"] > 0 and 1 < acc["E"] <= 4
    assert texts == greedy_texts(servers[0], prompts)
