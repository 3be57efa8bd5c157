"""The official `openai` client against a `speclab serve` subprocess.

Nothing that would change the output may be silently ignored: every field of OpenAI's /v1/completions and of vLLM's
extra sampling fields is either honoured or refused with a 400 that names it. The client sends vLLM's extras through
`extra_body`, as a user of vLLM does. Honoured fields are checked against the engine's own answer (an in-process
engine on the same pair, greedy, so the comparison is token for token).
"""
import pytest

pytestmark = pytest.mark.xdist_group("openai_client")   # one worker: its module fixtures are built once

openai = pytest.importorskip("openai")

from speclab.request import SamplingParams
from speclab.serve import bad_words_ids, load_engine
from speclab.testing import serve_process
from speclab.train import tiny_pair_path

MODEL = "speclab-tiny"
PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def client():
    "An openai.OpenAI client on a `speclab serve` process (the shipped pair, kappa 3)."
    with serve_process("--max-num-seqs", "4", "--threads", "1", "--kappa", "3") as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as c:
            yield c


@pytest.fixture(scope="module")
def reference():
    "The engine the server runs, in process: what a completion must equal."
    return load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3, max_num_seqs=4)


REFUSED = [("best_of", dict(n=2, best_of=3)), ("suffix", dict(suffix=" end")),
           ("logprobs", dict(logprobs=21)), ("n", dict(n=0)),
           ("bad_words", dict(extra_body={"bad_words": [" "]})),
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


HONOURED = [("presence", dict(presence_penalty=1.5), dict(presence_penalty=1.5)),
            ("frequency", dict(frequency_penalty=2.0), dict(frequency_penalty=2.0)),
            ("repetition", dict(extra_body={"repetition_penalty": 1.6}), dict(repetition_penalty=1.6)),
            ("logit_bias", dict(logit_bias={"63": -100}), dict(logit_bias={63: -100})),
            ("min_p", dict(temperature=0.9, seed=3, extra_body={"min_p": 0.2}),
             dict(temperature=0.9, seed=3, min_p=0.2)),
            ("min_tokens", dict(extra_body={"min_tokens": 3, "stop_token_ids": [199]}),
             dict(min_tokens=3, stop_token_ids=(199,))),
            ("mixed", dict(temperature=0.8, seed=5, presence_penalty=0.5, frequency_penalty=0.5,
                           extra_body={"repetition_penalty": 1.2, "min_p": 0.05}),
             dict(temperature=0.8, seed=5, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2,
                  min_p=0.05))]


@pytest.mark.parametrize("name,kwargs,params", HONOURED, ids=[h[0] for h in HONOURED])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_honoured_fields_equal_the_engine(client, reference, name, kwargs, params, stream):
    """Each honoured field, through the client, gives the engine's own completion (greedy, or seeded: the request's
    own generators make it independent of the batch), streamed and not; and it does change the output."""
    kwargs = {"temperature": 0, **kwargs}
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, stream=stream, **kwargs)
    text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
    sp = SamplingParams(**{"temperature": 0, **params, "max_tokens": 16})
    want, plain = reference.generate([PROMPT, PROMPT], [sp, SamplingParams(temperature=sp.temperature, seed=sp.seed,
                                                                           max_tokens=16)])
    assert text == want.text
    assert want.token_ids != plain.token_ids, f"{name} left the completion unchanged: the check would be vacuous"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_bad_words_equal_the_engine(client, reference, stream):
    """bad_words through `extra_body`: the server tokenizes each word as vLLM does (`bad_words_ids`) and the completion
    equals the engine's with those token ids; the words are taken from the plain completion, so they change it."""
    tok = reference.tokenizer
    plain = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16))[0]
    words = [tok.decode(plain.token_ids[2:4]), tok.decode(plain.token_ids[6:7])]
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=stream,
                                    extra_body={"bad_words": words})
    text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
    ids = bad_words_ids(tok, words)
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, bad_words=ids))[0]
    assert text == want.text
    assert want.token_ids != plain.token_ids, "bad_words left the completion unchanged: the check would be vacuous"


def texts_of(got, stream: bool) -> dict:
    "{choice index: text} of a completion, streamed (chunks joined per index) or not."
    if not stream:
        return {c.index: c.text for c in got.choices}
    out = {}
    for chunk in got:
        for c in chunk.choices:
            out[c.index] = out.get(c.index, "") + c.text
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_n_and_a_list_of_prompts(client, reference, stream):
    """Two prompts x n = 2 seeded samples: four choices, index = prompt * n + sample, sample s seeded seed + s (vLLM's
    rule for siblings), each equal to the engine's own request with that seed."""
    prompts = [PROMPT, "class Stack:\n"]
    got = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=10, temperature=0.9, seed=11,
                                    stream=stream)
    want = reference.generate([p for p in prompts for _ in range(2)],
                              [SamplingParams(temperature=0.9, seed=11 + s, max_tokens=10) for _ in prompts
                               for s in range(2)])
    assert texts_of(got, stream) == {i: w.text for i, w in enumerate(want)}
    assert want[0].text != want[1].text                  # the siblings differ: the seeds did their job


def test_logprobs_equal_plain_decoding(client):
    """logprobs: the target's raw log-prob of each emitted token and its top-k, as plain decoding (kappa 0) reports
    them, to float tolerance; with echo the prompt is scored too (its first token has none); streamed, a choice's
    logprobs come with its last chunk."""
    plain = load_engine(tiny_pair_path("target"), None, kappa=0)
    sp = SamplingParams(temperature=0, max_tokens=8, logprobs=3, frequency_penalty=0.5)
    want = plain.generate([PROMPT], sp)[0]
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                    frequency_penalty=0.5)
    lp = got.choices[0].logprobs
    assert len(lp.token_logprobs) == len(want.token_ids)
    assert lp.token_logprobs == pytest.approx([x[0] for x in want.logprobs], abs=1e-4)
    tok = plain.tokenizer
    for top, (_, alts) in zip(lp.top_logprobs, want.logprobs):
        assert top == pytest.approx({tok.decode([t]): v for t, v in alts}, abs=1e-4)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                       frequency_penalty=0.5, echo=True)
    c = echoed.choices[0]
    n_prompt = len(tok(PROMPT)["input_ids"])
    assert c.text == PROMPT + got.choices[0].text
    assert c.logprobs.token_logprobs[0] is None and len(c.logprobs.token_logprobs) == n_prompt + len(want.token_ids)
    assert c.logprobs.token_logprobs[n_prompt:] == pytest.approx(lp.token_logprobs, abs=1e-6)
    assert all(x < 0 for x in c.logprobs.token_logprobs[1:n_prompt])
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                            frequency_penalty=0.5, stream=True))
    last = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].finish_reason][0]
    assert last.logprobs.token_logprobs == pytest.approx(lp.token_logprobs, abs=1e-6)   # streamed: with the last chunk


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_echo_and_spec_stats(client, reference, stream):
    "echo puts the prompt before the completion; spec_decode_stats gives the request's own drafted/accepted counts."
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, echo=True,
                                    stream=stream, extra_body={"spec_decode_stats": True})
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12))[0]
    assert texts_of(got, stream) == {0: PROMPT + want.text}
    if stream:
        got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                        extra_body={"spec_decode_stats": True})
    stats = got.choices[0].model_extra["spec_decode"]
    assert stats["num_draft_tokens"] == want.num_draft_tokens > 0
    assert stats["num_accepted_tokens"] == want.num_accepted_tokens
    assert stats["mean_acceptance_length"] == pytest.approx(want.mean_acceptance_length)


def test_continuous_usage_stats(client, reference):
    """stream_options.continuous_usage_stats (guidellm sends it) puts usage in every chunk, vLLM's way: the
    prompt's length, the choice's tokens so far (growing to the request's count), their sum; the usage chunk after
    the choices says the same as a non-streamed request. Without it, chunks carry usage null."""
    n_prompt = len(reference.tokenizer(PROMPT)["input_ids"])
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(ch.usage is not None for ch in chunks), [ch.usage for ch in chunks]
    counts = [ch.usage.completion_tokens for ch in chunks]
    assert counts == sorted(counts) and counts[-1] == 16 and counts[0] >= 1
    assert all(ch.usage.prompt_tokens == n_prompt for ch in chunks)
    assert all(ch.usage.total_tokens == n_prompt + ch.usage.completion_tokens for ch in chunks)
    assert chunks[-1].choices == [] and chunks[-2].choices[0].finish_reason == "length"
    plain = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert all(ch.usage is None for ch in plain[:-1]) and plain[-1].usage.completion_tokens == 16


STREAM_OPTIONS = [({"include_usage": True, "foo": 1}, "stream_options.foo"),
                  ({"continuous_usage_stats": "yes"}, "stream_options.continuous_usage_stats"),
                  ({"include_usage": False, "continuous_usage_stats": True}, "stream_options.continuous_usage_stats")]


@pytest.mark.parametrize("options, param", STREAM_OPTIONS)
def test_stream_options_refuse_what_they_cannot_honour(client, options, param):
    "An unknown key inside stream_options is refused by its path, as an unknown top-level field is (never dropped)."
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=True, stream_options=options)
    assert e.value.body["param"] == param and param in e.value.body["message"], e.value.body


@pytest.mark.parametrize("field, value", [("temperature", "0.5"), ("max_tokens", "8"), ("top_p", "1"), ("n", 1.5),
                                          ("seed", "3"), ("echo", "true"), ("logprobs", True)])
def test_numbers_and_bools_are_strict(client, field, value):
    "A string, a fraction or a bool where the API wants a number or a bool is a 400 naming the field."
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, **{"max_tokens": 4, field: value})
    assert e.value.body["param"] == field and field in e.value.body["message"], e.value.body
    ok = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, top_p=1,
                                   presence_penalty=0)          # JSON ints where floats are wanted: fine
    assert ok.usage.completion_tokens == 4


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_special_tokens_are_not_text(client, reference, stream):
    """skip_special_tokens is true by default (vLLM's): an EOS the request does not stop on (ignore_eos) is
    emitted but never written as <|endoftext|>: forced every time, the text is empty; mixed in at random (seeded),
    the text is the decode of the other tokens, streamed or not, and a stop string is still found across them."""
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=stream,
                                       logit_bias={"0": 100}, extra_body={"ignore_eos": True})
    assert texts_of(forced, stream) == {0: ""}
    tok = reference.tokenizer
    kw = dict(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True, logit_bias={0: 6})
    want = reference.generate([PROMPT], SamplingParams(**kw))[0]
    assert want.token_ids.count(0) >= 2 and want.token_ids[-1] != 0, want.token_ids   # EOS among other tokens
    assert want.text == tok.decode([t for t in want.token_ids if t != 0]) and want.text
    body = dict(temperature=1.0, seed=3, max_tokens=40, logit_bias={"0": 6}, stream=stream)
    got = client.completions.create(model=MODEL, prompt=PROMPT, extra_body={"ignore_eos": True}, **body)
    assert texts_of(got, stream) == {0: want.text}
    stop = want.text[len(want.text) // 2:len(want.text) // 2 + 2]
    cut = reference.generate([PROMPT], SamplingParams(**kw, stop=(stop,)))[0]
    got = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], extra_body={"ignore_eos": True}, **body)
    assert texts_of(got, stream) == {0: cut.text} and cut.finish_reason == "stop" and stop not in cut.text

    kept = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=stream,
                                     logit_bias={"0": 100},
                                     extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert texts_of(kept, stream) == {0: "<|endoftext|>" * 20}      # asked for: the special tokens are text


def test_the_engine_maps_what_the_server_maps():
    "SamplingParams itself (generate, not only the server): greedy below vLLM's epsilon, top_k clamped, a penalty range."
    from speclab.request import TOP_K_ALL
    assert SamplingParams(temperature=1e-40).greedy and SamplingParams(top_k=10 ** 30).top_k == TOP_K_ALL
    with pytest.raises(ValueError, match="^repetition_penalty must lie in"):
        SamplingParams(repetition_penalty=5e-324)
    with pytest.raises(TypeError, match="^skip_special_tokens must be True or False"):
        SamplingParams(skip_special_tokens=0)


TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    "The shipped target with a chat template in its tokenizer (weights linked, not copied): its folder."
    import json
    import os
    src, folder = tiny_pair_path("target"), tmp_path_factory.mktemp("templated")
    for name in os.listdir(src):
        if name != "tokenizer_config.json":
            os.symlink(src / name, folder / name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return folder


def test_chat_without_a_template_is_refused(client):
    "The shipped pair's tokenizer has no chat template: a 400 that says so, naming `messages`."
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert e.value.body["param"] == "messages" and "chat template" in e.value.body["message"]


@pytest.fixture(scope="module")
def chat_server(templated):
    "(url, in-process engine) of `speclab serve` on the templated target and the shipped draft."
    engine = load_engine(templated, tiny_pair_path("draft"), kappa=3)
    with serve_process("--target", str(templated), "--draft", "tiny", "--served-model-name", "chat", "--kappa", "3",
                       "--threads", "1") as url:
        yield url, engine


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_chat_with_a_template(chat_server, stream):
    "With a template the messages are rendered by it and served as that completion; chat's shape, streamed or not."
    url, engine = chat_server
    text = engine.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n")
    want = engine.generate([text], SamplingParams(temperature=0, max_tokens=12, presence_penalty=0.5))[0]
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as c:
        got = c.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12, temperature=0,
                                        presence_penalty=0.5, stream=stream)
        if stream:
            chunks = list(got)
            assert chunks[0].choices[0].delta.role == "assistant"
            assert chunks[0].object == "chat.completion.chunk"
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            assert chunks[-1].choices[0].finish_reason == want.finish_reason
        else:
            assert got.object == "chat.completion" and got.choices[0].message.role == "assistant"
            content = got.choices[0].message.content
            assert got.choices[0].finish_reason == want.finish_reason
    assert content == want.text


def chat_logprobs(got, stream: bool) -> list:
    "A chat choice's logprobs.content as plain dicts, streamed (the chunks' lists joined) or not."
    if not stream:
        return [e.model_dump() for e in got.choices[0].logprobs.content]
    return [e.model_dump() for ch in got if ch.choices and ch.choices[0].logprobs
            for e in ch.choices[0].logprobs.content]


def test_chat_logprobs_equal_the_completions_ones(chat_server):
    """Chat logprobs (logprobs: true, top_logprobs 3) in OpenAI's chat shape are the completions endpoint's entries for
    the templated prompt (the target's raw log-probs), streamed equal to not streamed; vLLM's echo prepends the last
    message when it is the assistant's."""
    url, engine = chat_server
    text = engine.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as c:
        kw = dict(model="chat", max_tokens=8, temperature=0, frequency_penalty=0.5)
        done = c.completions.create(prompt=text, logprobs=3, **kw).choices[0]
        chat = {stream: c.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=3, stream=stream,
                                                  **kw) for stream in (False, True)}
        entries = {stream: chat_logprobs(got, stream) for stream, got in chat.items()}
        echoed = c.chat.completions.create(messages=MESSAGES + [{"role": "assistant", "content": "  return"}],
                                           extra_body={"echo": True}, **kw).choices[0].message.content
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(messages=MESSAGES, top_logprobs=2, **kw)
    assert e.value.body["param"] == "top_logprobs"
    assert chat[False].choices[0].message.content == done.text
    lp = done.logprobs
    got = entries[False]
    assert [x["token"] for x in got] == lp.tokens
    assert [x["logprob"] for x in got] == pytest.approx(lp.token_logprobs, abs=1e-9)
    for x, top in zip(got, lp.top_logprobs):
        assert len(x["top_logprobs"]) == 3 and bytes(x["bytes"]).decode() == x["token"]
        assert {t["token"]: t["logprob"] for t in x["top_logprobs"]} == pytest.approx(top, abs=1e-9)
    assert entries[True] == got
    assert echoed.startswith("  return")


def test_chat_content_parts(chat_server):
    """Content as a list of parts (what current clients send): text parts are joined with newlines (vLLM's)
    and answered as the same text would be; any other part is a 400 naming it (messages.[i].content.[j])."""
    url, engine = chat_server
    parts = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "def add(a, b):"},
                                                       {"type": "text", "text": "    return a + b"}]}]
    joined = [MESSAGES[0], {"role": "user", "content": "def add(a, b):\n    return a + b"}]
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    picture = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120) as c:
        kw = dict(model="chat", max_tokens=10, temperature=0)
        got = c.chat.completions.create(messages=parts, **kw).choices[0].message.content
        want = c.chat.completions.create(messages=joined, **kw).choices[0].message.content
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(messages=picture, **kw)
    text = engine.tokenizer.apply_chat_template(joined, tokenize=False, add_generation_prompt=True)
    assert got == want == engine.generate([text], SamplingParams(temperature=0, max_tokens=10))[0].text
    assert e.value.body["param"] == "messages.[1].content.[1]" and "image_url" in e.value.body["message"]
