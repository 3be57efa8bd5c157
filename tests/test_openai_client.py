"""The official `openai` client against a `speclab serve` subprocess (issue 27).

Nothing that would change the output may be silently ignored: every field of OpenAI's /v1/completions and of vLLM's
extra sampling fields is either honoured or refused with a 400 that names it. The client sends vLLM's extras through
`extra_body`, as a user of vLLM does. Honoured fields are checked against the engine's own answer (an in-process
engine on the same pair, greedy, so the comparison is token for token).
"""
import pytest

openai = pytest.importorskip("openai")

from speclab.engine import SamplingParams
from speclab.serve import load_engine
from speclab.testing import serve_process
from speclab.train import tiny_pair_path

MODEL = "speclab-tiny"
PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def client():
    "An openai.OpenAI client on a `speclab serve` process (the shipped pair, kappa 3)."
    with serve_process("--max-num-seqs", "4", "--threads", "1") as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as c:
            yield c


@pytest.fixture(scope="module")
def reference():
    "The engine the server runs, in process: what a completion must equal."
    return load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3, max_num_seqs=4)


REFUSED = [("best_of", dict(best_of=2)), ("suffix", dict(suffix=" end")),
           ("echo", dict(echo=True)), ("logprobs", dict(logprobs=2)), ("n", dict(n=2)),
           ("bad_words", dict(extra_body={"bad_words": ["x"]})),
           ("guided_regex", dict(extra_body={"guided_regex": "a+"})),
           ("no_such_field", dict(extra_body={"no_such_field": 3}))]


@pytest.mark.parametrize("field,kwargs", REFUSED, ids=[f for f, _ in REFUSED])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_unhonoured_field_is_refused_by_name(client, field, kwargs, stream):
    "A field the server cannot honour is a 400 naming it, streamed or not: never a 200 that ignored it."
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=stream, **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == field, e.value.body
    assert field in e.value.body["message"]


def test_neutral_values_and_user_are_accepted(client, reference):
    "A field at its 'off' value changes nothing, and `user` means nothing for generation: both are served."
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, user="u1",
                                    presence_penalty=0, frequency_penalty=0, best_of=1, logit_bias={},
                                    extra_body={"repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0})
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))[0]
    assert got.choices[0].text == want.text
