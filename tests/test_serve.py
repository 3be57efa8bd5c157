"""`speclab serve` end to end (Chapter 11): the shipped pair behind the OpenAI API on 127.0.0.1.

One server runs in-process for the module (uvicorn in a thread, a free port, at most 4 running requests) and an
httpx client talks to it. Completions are compared with `SpecDecoder.generate` and the /metrics counters with an
in-process engine's; disconnects must leave the engine with no request and every block free; a failing step must cost
only its requests, and an engine error finish only its own; 16 concurrent requests against a running limit of 4 must
all complete. Then `speclab serve` runs as a real process, stopped by SIGINT and by SIGTERM, and its argument errors
are checked. Every wait is bounded.

The engine belongs to the engine thread: the tests read it through `lp.inspect()` (an `Inspect` command answered
between two steps). Faults are planted by giving the engine an instance `step` while it is idle (an attribute store,
which the engine thread reads at its next step).
"""
import dataclasses
import inspect
import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import speclab.serve
from speclab.cli import available_cores, serve_threads
from speclab.vllm_io import metrics_delta, parse_prometheus
from speclab.request import Output, SamplingParams, StepOutput
from speclab.serve import (Abort, Command, EngineLoop, Failed, ServerThread, Stream, build_app, engine_failure,
                           failure, load_engine)
from speclab.train import tiny_pair_path

pytestmark = pytest.mark.xdist_group("serve")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
SPECLAB = Path(sys.executable).parent / "speclab"
MODEL = "speclab-tiny"
PROMPTS = ["def add(a, b):\n", "class Stack:\n    def push(self, x):\n", "import os\n\n", "    for i in range("]


def pair_engine(**sizes):
    "The shipped pair at kappa 3, as the server's engine and as the in-process reference."
    return load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3, **sizes)


@pytest.fixture(scope="module")
def server():
    "(url, engine loop) of a server on the shipped pair with at most 4 running requests."
    lp = EngineLoop(pair_engine(max_num_seqs=4))
    with ServerThread(build_app(lp, MODEL)) as srv:
        yield srv.url, lp


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server[0], timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference():
    "An in-process engine on the same pair, for what the server must reproduce."
    return pair_engine(max_num_seqs=4)


def complete(client, **body):
    r = client.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(client, **body):
    "The JSON events of a streamed completion (the final [DONE] checked and dropped)."
    with client.stream("POST", "/v1/completions", json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-3:]
    return [json.loads(d) for d in data[:-1]]


def samples_of(text: str) -> dict:
    "Every sample of a /metrics scrape, summed over its label sets: {sample name: value}."
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0) + s.value
    return out


def samples(client) -> dict:
    return samples_of(client.get("/metrics").text)


def idle_and_free(lp, timeout=60):
    "Wait (bounded) until the engine has no unfinished request and every KV block is free; the last reading."
    deadline = time.monotonic() + timeout
    while True:
        s = lp.inspect(timeout)
        state = (s.unfinished, s.free_blocks, s.num_blocks, s.open_requests)
        if (not state[0] and state[1] == state[2] and state[3] == 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def plant_step(lp, step):
    "Give the idle engine an instance `step` (removed by `del engine.step`); the engine thread uses it next step."
    assert idle_and_free(lp)[0] is False, "the engine must be idle to have its step replaced"
    lp.engine.step = step


def test_server_reads_no_engine_internals():
    "The server talks to the engine through add_request, abort, step, has_unfinished and scheduler_stats only."
    src = inspect.getsource(speclab.serve)
    for internal in (r"engine\.requests", r"engine\.scheduler\b(?!_stats)", r"engine\.metrics",
                     r"(sched|scheduler)\.(waiting|running)\b", r"token_ids \+="):
        assert not re.search(internal, src), internal
    assert "visible_text" not in src and "tokenizer.decode(" in src      # decoding only for echo and logprobs


ENGINE_THREAD = {"LoopRun", "LoopRequests", "LoopSteps", "EngineLoop", "load_engine", "build_app"}


def test_only_the_engine_thread_touches_the_engine():
    """The thread rule as structure. No function or class of the server but the engine loop's own parts (and
    build_app, which reads the engine once into ServerInfo before the thread runs) mentions `.engine`; the loop's
    functions are EngineLoop methods; no command carries code (no Call(fn)); the queries are named."""
    for name, obj in vars(speclab.serve).items():
        if getattr(obj, "__module__", None) != "speclab.serve" or name in ENGINE_THREAD:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert not re.search(r"\.engine\b", inspect.getsource(obj)), f"{name} reaches into the engine"
    for name in ("next_commands", "run", "run_command", "add_request", "abort_request", "close_all", "step_once",
                 "deliver", "publish"):
        assert callable(getattr(EngineLoop, name)) and not hasattr(speclab.serve, name), name
    assert not hasattr(speclab.serve, "Call") and not hasattr(EngineLoop, "call")
    names = set()
    for cls in Command.__args__:
        names.add(cls.__name__)
        for f in dataclasses.fields(cls):
            assert f.name in ("future", "stream") or "Callable" not in str(f.type), (cls.__name__, f.name)
    assert names == {"Add", "Abort", "Score", "BadWords", "Inspect", "Stop"}


def test_health_and_models(client):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    m = models["data"][0]
    assert (m["id"], m["object"], m["max_model_len"]) == (MODEL, "model", 512)


def test_greedy_completion_matches_generate(client, reference):
    "Text, token count, finish reason and usage equal SpecDecoder.generate's for the same prompt."
    for prompt in PROMPTS[:2]:
        want = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
        got = complete(client, prompt=prompt, max_tokens=24, temperature=0)
        assert got["id"].startswith("cmpl-") and got["object"] == "text_completion" and got["model"] == MODEL
        (choice,) = got["choices"]
        assert (choice["text"], choice["finish_reason"], choice["index"], choice["logprobs"]) == \
            (want.text, want.finish_reason, 0, None)
        n_prompt = len(reference.tokenizer(prompt)["input_ids"])
        assert got["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(want.token_ids),
                                "total_tokens": n_prompt + len(want.token_ids)}


def test_token_id_prompts(client, reference):
    "A prompt of token ids (what a benchmark client sends), bare or in a list of one, is the same request."
    want = complete(client, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    ids = reference.tokenizer(PROMPTS[0])["input_ids"]
    for prompt in (ids, [ids], [PROMPTS[0]]):
        got = complete(client, prompt=prompt, max_tokens=12, temperature=0)
        assert (got["choices"][0]["text"], got["usage"]) == (want["choices"][0]["text"], want["usage"])


def test_stream_adds_up_to_the_completion(client):
    for body in (dict(prompt=PROMPTS[1], max_tokens=40, temperature=0),
                 dict(prompt="def add(a, b):\n    return", max_tokens=48, temperature=0, stop=["\n"])):
        whole = complete(client, **body)
        events = stream_events(client, stream_options={"include_usage": True}, **body)
        texts = [e["choices"][0]["text"] for e in events if e["choices"]]
        assert "".join(texts) == whole["choices"][0]["text"]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
        assert events[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]
        assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("cmpl-")
    assert whole["choices"][0]["finish_reason"] == "stop" and "\n" not in whole["choices"][0]["text"]
    plain = stream_events(client, prompt=PROMPTS[0], max_tokens=8, temperature=0)   # no usage unless asked
    assert all("usage" not in e for e in plain) and plain[-1]["choices"][0]["finish_reason"] == "length"


def kappa_buckets(text):
    "The cumulative buckets of speclab:spec_decode_kappa in a scrape, read by prometheus_client's parser: {le: n}."
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "speclab:spec_decode_kappa")
    assert fam.type == "histogram"
    return {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}


def d_kappa_steps(text1, text0):
    "Request-steps per planned kappa between two scrapes (the histogram's buckets, de-cumulated)."
    b1, b0 = kappa_buckets(text1), kappa_buckets(text0)
    les = [le for le in b1 if le != "+Inf"]
    cum = [b1[le] - b0[le] for le in les]
    return [int(c - p) for c, p in zip(cum, [0] + cum[:-1])]


def test_metrics_equal_the_engine(client, reference):
    "Counter deltas over N greedy requests equal an in-process engine's metrics for the same requests."
    text0, before = client.get("/metrics").text, samples(client)
    replies = [complete(client, prompt=p, max_tokens=20, temperature=0, ignore_eos=True) for p in PROMPTS]
    text1, after = client.get("/metrics").text, samples(client)
    got = metrics_delta(parse_prometheus(text1), parse_prometheus(text0))

    m0 = reference.metrics
    reference.metrics = type(m0)()
    for p in PROMPTS:                                   # one at a time, as the client sent them
        reference.generate([p], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    want, reference.metrics = reference.metrics, m0
    assert d_kappa_steps(text1, text0) == (want.kappa_counts + [0] * 4)[:4]   # kappa 0..3: the histogram's buckets
    K = 3
    assert (got.num_drafts, got.num_draft_tokens, got.num_accepted_tokens) == \
        (want.num_drafts, want.num_draft_tokens, want.num_accepted_tokens)
    assert got.accepted_per_pos == (want.accepted_per_pos + [0] * K)[:K]
    assert got.mean_acceptance_length == pytest.approx(want.mean_acceptance_length)
    d = {k: after[k] - before.get(k, 0) for k in after}
    assert d["vllm:generation_tokens_total"] == sum(r["usage"]["completion_tokens"] for r in replies) == 20 * 4
    assert d["vllm:prompt_tokens_total"] == sum(r["usage"]["prompt_tokens"] for r in replies)
    assert d["vllm:request_success_total"] == 4
    assert d["vllm:e2e_request_latency_seconds_count"] == d["vllm:time_to_first_token_seconds_count"] == 4
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


@pytest.mark.parametrize("body, status, param, kind", [
    ({"prompt": "x", "temperature": -1}, 400, "temperature", "invalid_request_error"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", "invalid_request_error"),
    ({"prompt": "x", "n": 0}, 400, "n", "invalid_request_error"),
    ({"prompt": "x", "n": 2, "best_of": 4}, 400, "best_of", "invalid_request_error"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "NotFoundError"),
    ({"max_tokens": 4}, 400, "prompt", "invalid_request_error"),
    ({"prompt": ["a", 3]}, 400, "prompt", "invalid_request_error"),
    ({"prompt": "x " * 600}, 400, "prompt", "invalid_request_error"),
    ({"prompt": [10 ** 9]}, 400, "prompt", "invalid_request_error"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_request_error"),
    ({"prompt": "x", "max_tokens": -5, "min_tokens": 3}, 400, "max_tokens", "invalid_request_error"),
    ({"prompt": "x", "max_tokens": 10 ** 20}, 400, "max_tokens", "invalid_request_error"),              # not prompt
    ({"prompt": "x", "top_p": 0}, 400, "top_p", "invalid_request_error"),
    ({"prompt": "x", "stop": 3}, 400, "stop", "invalid_request_error"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "invalid_request_error"),
    ({"prompt": "x", "temperature": "0.5"}, 400, "temperature", "invalid_request_error"),           # strict
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", "invalid_request_error"),
    ({"prompt": "x", "n": 1.5}, 400, "n", "invalid_request_error"),
    ({"prompt": "x", "echo": 1}, 400, "echo", "invalid_request_error"),
    ({"prompt": "x", "logit_bias": {"5": "1"}}, 400, "logit_bias.5", "invalid_request_error"),
    ({"prompt": "x", "stream": True, "stream_options": {"foo": 1}}, 400, "stream_options.foo",
     "invalid_request_error"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage",
     "invalid_request_error"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}, 400,
     "stream_options.continuous_usage_stats", "invalid_request_error"),
    (b'{"prompt": "x",', 400, "body", "invalid_request_error"),
    (b'[1, 2]', 400, "body", "invalid_request_error"),
])
def test_errors(client, body, status, param, kind):
    "OpenAI's error object, the field named in `param` and in the message; the server stays healthy."
    if isinstance(body, bytes):
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (kind, param, status), err
    assert param in err["message"] or (param == "body" and "body" in err["message"]), err
    assert client.get("/health").status_code == 200
    assert complete(client, prompt="x", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_unknown_route(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_failed_step_fails_its_requests_only(client, server):
    "An exception in step(): the open request gets a 500 naming the engine's error; the server serves on."
    lp = server[1]

    def boom():
        del lp.engine.step                               # the next step is the class's own again
        raise RuntimeError("injected failure")
    plant_step(lp, boom)
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8})
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "InternalServerError" and "injected failure" in err["message"]
    assert client.get("/health").status_code == 200
    assert idle_and_free(lp)[0] is False
    assert complete(client, prompt="x", max_tokens=3)["usage"]["completion_tokens"] == 3


def hold_until_an_abort(lp, timeout=60):
    """Make the engine wait, once a request has tokens, until a handler sends an abort of a live request, bounded.

    Without it a fast engine finishes the whole request before a slow client hangs up, and the test would pass
    without a disconnect ever reaching the engine. Any other command (an earlier test's late abort of a finished
    request, say) does not end the hold: once one did, and the request finished before the client could look. The
    held step runs afterwards; the hold then removes itself."""
    live_abort, send = threading.Event(), lp.send

    def watching_send(command):
        if isinstance(command, Abort) and command.req_id in lp.streams:
            live_abort.set()
        return send(command)

    engine = lp.engine

    def held_step():
        if any(r.num_output_tokens for r in engine.requests.values()):
            live_abort.wait(timeout)
            del engine.step                      # the class's own step again from here on
            del lp.send
        return type(engine).step(engine)
    plant_step(lp, held_step)
    lp.send = watching_send


def aborted(client) -> float:
    "vllm:request_success_total{finished_reason='abort'} as /metrics reads now."
    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(s.value for f in families for s in f.samples
               if s.name == "vllm:request_success_total" and s.labels.get("finished_reason") == "abort")


def test_stream_disconnect_frees_blocks(client, server):
    "A streamed request whose client hangs up mid-stream is aborted: counted as such, every block free again."
    lp, before = server[1], aborted(client)
    hold_until_an_abort(lp)
    with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 400, "stream": True,
                                                        "ignore_eos": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
        assert len(lp.streams) == 1                     # held: it cannot finish before we hang up
    unfinished, free, total, tracked = idle_and_free(lp)
    assert (unfinished, free, tracked) == (False, total, 0)
    assert aborted(client) == before + 1


def test_plain_disconnect_frees_blocks(client, server):
    "A non-streamed request whose client gives up (a read timeout closes the connection) is aborted too."
    (url, lp), before = server, aborted(client)
    hold_until_an_abort(lp)
    with httpx.Client(base_url=url, timeout=httpx.Timeout(120, read=1.0)) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 450, "ignore_eos": True})
    unfinished, free, total, tracked = idle_and_free(lp)
    assert (unfinished, free, tracked) == (False, total, 0)
    assert aborted(client) == before + 1


def test_late_request_joins_the_batch(client, server):
    "Continuous batching: a short request sent while a long stream runs finishes while the long one still runs."
    lp, log = server[1], []
    engine = lp.engine

    def step():
        "Hold the engine (bounded) once the long request has tokens, until the short one's Add arrives; then log."
        if not log and any(r.num_output_tokens for r in engine.requests.values()):
            deadline = time.monotonic() + 60
            while lp.commands.empty() and time.monotonic() < deadline:
                time.sleep(0.01)
        outs = type(engine).step(engine)
        log.append(([len(o.finished.token_ids) for o in outs if o.finished is not None], engine.has_unfinished()))
        return outs
    plant_step(lp, step)
    try:
        with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 300,
                                                            "temperature": 0, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            short = complete(client, prompt="x = ", max_tokens=4, temperature=0)
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    finally:
        idle_and_free(lp)
        engine.__dict__.pop("step", None)
    assert short["usage"]["completion_tokens"] == 4
    first_done = next((done, still_running) for done, still_running in log if done)
    assert first_done == ([4], True), f"the first request to finish (tokens, others running): {first_done}"
    assert rest[-1]["choices"][0]["finish_reason"] == "length"


def test_load_4x_the_running_limit(server):
    "16 concurrent requests, max_num_seqs 4: all complete with their token counts, requests queued; latency printed."
    url, lp = server
    n, lengths = 16, [4 + (7 * i) % 29 for i in range(16)]
    before = None
    waiting_seen = []

    async def one(c, i):
        t0 = time.perf_counter()
        r = await c.post("/v1/completions", json={"prompt": PROMPTS[i % 4], "max_tokens": lengths[i],
                                                  "temperature": 0.8, "seed": i, "ignore_eos": True})
        return r, time.perf_counter() - t0

    async def watch(c, stop):
        while not stop.is_set():
            waiting_seen.append(samples_of((await c.get("/metrics")).text)["vllm:num_requests_waiting"])
            await asyncio.sleep(0.02)

    async def main():
        nonlocal before
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=32)) as c:
            before = samples_of((await c.get("/metrics")).text)
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(c, stop))
            results = await asyncio.gather(*(one(c, i) for i in range(n)))
            stop.set()
            await watcher
            return results, samples_of((await c.get("/metrics")).text)

    results, after = asyncio.run(asyncio.wait_for(main(), timeout=300))
    assert [r.status_code for r, _ in results] == [200] * n, [r.text for r, _ in results if r.status_code != 200]
    assert [r.json()["usage"]["completion_tokens"] for r, _ in results] == lengths
    assert len({r.json()["id"] for r, _ in results}) == n
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == n
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == sum(lengths)
    assert max(waiting_seen, default=0) > 0 or lp.max_waiting > 0, (waiting_seen, lp.max_waiting)
    assert lp.max_waiting <= n - 4
    secs = sorted(t for _, t in results)
    q = statistics.quantiles(secs, n=100)
    print(f"\n16 requests, 4 running at most: latency p50 {q[49]:.2f} s, p90 {q[89]:.2f} s, p99 {q[98]:.2f} s; "
          f"the waiting queue peaked at {lp.max_waiting} (scrapes saw {max(waiting_seen, default=0):.0f})")


def test_plain_server(reference, client):
    "--draft none: no spec-decode families (as vLLM), and greedy text equal to the speculative server's."
    lp = EngineLoop(load_engine(tiny_pair_path("target"), None, kappa=0, max_num_seqs=4))
    with ServerThread(build_app(lp, MODEL)) as srv, httpx.Client(base_url=srv.url, timeout=120) as plain:
        got = complete(plain, prompt=PROMPTS[3], max_tokens=16, temperature=0)
        text = plain.get("/metrics").text
    assert got["choices"][0]["text"] == complete(client, prompt=PROMPTS[3], max_tokens=16,
                                                 temperature=0)["choices"][0]["text"]
    assert "vllm:spec_decode" not in text and "vllm:generation_tokens_total" in text
    assert not lp.alive


def _speclab(*argv, timeout=60):
    return subprocess.run([str(SPECLAB), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("argv, words", [
    (["--port", "-1"], ["argument --port", "-1"]),
    (["--port", "70000"], ["argument --port", "[0, 65535]"]),
    (["--num-spec-tokens", "-1"], ["argument --num-spec-tokens", "must be >= 0"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs must be >= 1"]),
    (["--draft", "tiny", "--ngram", "2"], ["--ngram", "not allowed with argument --draft"]),
    (["--kappa", "abc"], ["argument --kappa: expected auto or an integer >= 0, got 'abc'"]),
    (["--min-confidence", "1.5"], ["--min-confidence must lie in [0, 1), got 1.5"]),
    (["--kappa", "3", "--num-spec-tokens", "2"], ["--kappa 3 and --num-spec-tokens 2 disagree"]),
    (["--speculative-config", '{"kappa": "fast"}'], ["argument --speculative-config", "kappa must be"]),
])
def test_cli_argument_errors(argv, words):
    r = _speclab("serve", *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("speclab serve: error:"), r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_speclab_serve_process(tmp_path, sig):
    """`speclab serve` as a real process: it prints its URL, serves, and SIGINT or SIGTERM (which once exited 143
    without it) stops it with status 0 after its closing line. The SIGINT run starts at the defaults, --kappa auto
    (it prints its calibration) and every core but one for torch (`serve_threads`); the SIGTERM run at a fixed kappa
    and one thread prints no calibration."""
    out = (tmp_path / "out.txt").open("w")
    fixed = ["--kappa", "3", "--threads", "1"] if sig == signal.SIGTERM else []
    proc = subprocess.Popen([str(SPECLAB), "serve", "--port", "0", "--max-num-seqs", "2", *fixed],
                            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            words = [w for w in (tmp_path / "out.txt").read_text().split() if w.startswith("http://")]
            url = words[0] if words else None
            time.sleep(0.1)
        assert url, (tmp_path / "out.txt").read_text()
        with httpx.Client(base_url=url, timeout=120) as c:
            while c.get("/health").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "def f(x):\n", "max_tokens": 6})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6, r.text
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, (tmp_path / "out.txt").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    text = (tmp_path / "out.txt").read_text()
    assert "speclab serve: stopped" in text and "Traceback" not in text, text
    if fixed:
        assert "kappa = 3" in text and "calibrated" not in text and ", 1 torch thread(s)," in text, text
    else:
        assert f", {serve_threads(available_cores())} torch thread(s)," in text, text
        assert "kappa auto (0..4)" in text and "speclab serve: calibrated in " in text, text
        # a trusted calibration plans with its costs, a refused one (a busy machine) learns them from the steps
        assert "kappa chosen per step in 0..4" in text and "(--kappa auto)" in text, text
        assert "refused" not in text or "costs learned from the engine's own steps" in text, text


def test_fresh_server_scrapes_at_zero(reference):
    "Before any request, /metrics already holds every spec-decode counter at 0: a sweep's first scrape parses."
    lp = EngineLoop(reference)
    with ServerThread(build_app(lp, MODEL)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        m = parse_prometheus(c.get("/metrics").text)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.accepted_per_pos) == (0, 0, 0, [0, 0, 0])


def test_siblings_share_prefix_blocks(client, server):
    "n samples of one prompt are sibling requests: all but the first find the prompt's full blocks in the prefix cache."
    _, lp = server
    prompt = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    engine = lp.engine
    n_prompt = len(engine.tokenizer(prompt)["input_ids"])
    full = n_prompt // engine.config.block_size * engine.config.block_size
    assert full >= engine.config.block_size, "the prompt must fill a block"
    idle_and_free(lp)                              # the counter is read while the engine thread has nothing to do
    before = engine.scheduler_stats().num_cached_tokens
    got = complete(client, prompt=prompt, n=4, max_tokens=6, temperature=0.8, seed=1)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    assert got["usage"]["prompt_tokens"] == n_prompt                     # the prompt is counted once
    idle_and_free(lp)
    cached = engine.scheduler_stats().num_cached_tokens - before
    assert cached >= 3 * full, f"only {cached} prompt tokens came from the cache for 3 siblings of {full}"


def test_deliver_turns_engine_errors_into_failed(reference):
    """The engine's contract: a StepOutput finished with finish_reason "error" and Output.error
    "Type: message" becomes Failed: 400 with the message alone for ValueError/TypeError (the request's own fields,
    `param` read from its first word), 500 with the whole error otherwise; counted under "error"; the other requests
    of the same step are delivered as usual. Fabricated outputs: no engine runs."""
    lp = EngineLoop(reference)                          # never started: deliver is a plain method here
    lp.streams = {i: Stream(deltas=i == 3, loop=None, index=i) for i in range(5)}
    why = "allowed_token_ids and bad_words leave no token to sample at output position 2: the request ends there"
    errors = [f"ValueError: {why}", "TypeError: bad_words must be token ids", "RuntimeError: drafter exploded",
              "ValueError: no colon in this one"]
    outs = [StepOutput(i, [], "", 4, Output([5, 6], "ab", "error", e), 2, 0.0) for i, e in enumerate(errors)]
    outs.insert(2, StepOutput(4, [7], "c", 4, Output([5, 6, 7], "abc", "length"), 3, 0.0))
    events = {stream.index: e for stream, e in lp.deliver(outs)}
    assert events[0] == Failed(0, 400, why) and events[1] == Failed(1, 400, "bad_words must be token ids")
    assert events[2].status == 500 and "RuntimeError: drafter exploded" in events[2].message
    assert events[3] == Failed(3, 400, "no colon in this one")          # a stream that had deltas: the error event
    assert (events[4].text, events[4].output.finish_reason) == ("abc", "length")
    assert lp.stats.request_success == {"stop": 0, "length": 1, "abort": 0, "error": 4} and lp.streams == {}
    assert (failure(events[0]).param, failure(events[0]).status) == ("allowed_token_ids", 400)
    assert (failure(events[2]).param, failure(events[2]).kind) == (None, "InternalServerError")
    assert engine_failure(0, None).status == 500                          # an error finish without a reason


def fail_once(lp, prompt_ids, error, after):
    """A planted step: the real step, then the first request with these prompt ids that has at least `after` tokens
    ends as the engine ends a request in error (dropped from the engine, its StepOutput an "error" Output)."""
    engine = lp.engine

    def step():
        outs = type(engine).step(engine)
        for i, o in enumerate(outs):
            r = engine.requests.get(o.req_id)
            if o.finished is None and r is not None and r.prompt_ids == prompt_ids and r.num_output_tokens >= after:
                engine.abort(o.req_id)
                outs[i] = StepOutput(o.req_id, o.new_token_ids, "", o.num_prompt_tokens,
                                     Output(r.output_ids, None, "error", error), o.num_output_tokens, o.arrival_time)
                del engine.step
                break
        return outs
    return step


def errors_counted(client) -> float:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(s.value for f in families for s in f.samples
               if s.name == "vllm:request_success_total" and s.labels.get("finished_reason") == "error")


def test_engine_error_finish_ends_its_request_alone(client, server, reference):
    """An engine error finish through the server: the streamed victim gets its text so far, then the error event
    (400, `param` allowed_token_ids, no type prefix); the request beside it in the same steps gets exactly its greedy
    completion; an internal error is a 500; each counts under finished_reason="error"; every block is free after."""
    url, lp = server
    victim, other = PROMPTS[2], PROMPTS[3]
    ids = reference.tokenizer(victim)["input_ids"]
    why = "allowed_token_ids and bad_words leave no token to sample at output position 6: the request ends there"
    before = errors_counted(client)
    plant_step(lp, fail_once(lp, ids, f"ValueError: {why}", after=5))       # its second step (4 tokens at the first)
    body = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            async def streamed():
                async with c.stream("POST", "/v1/completions", json={**body, "prompt": victim, "stream": True}) as r:
                    return [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]
            return await asyncio.gather(streamed(), c.post("/v1/completions", json={**body, "prompt": other}))
    events, plain = asyncio.run(asyncio.wait_for(main(), timeout=300))
    want = reference.generate([other], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == want.text
    *deltas, last = events
    assert deltas and all(e["choices"][0]["finish_reason"] is None for e in deltas)
    assert last["error"] == {"message": why, "type": "invalid_request_error", "param": "allowed_token_ids",
                             "code": 400}
    plant_step(lp, fail_once(lp, ids, "RuntimeError: the drafter raised", after=0))
    r = client.post("/v1/completions", json={**body, "prompt": victim})
    assert r.status_code == 500 and "RuntimeError: the drafter raised" in r.json()["error"]["message"], r.text
    assert errors_counted(client) == before + 2
    unfinished, free, total, tracked = idle_and_free(lp)
    assert (unfinished, free, tracked) == (False, total, 0)
    assert "step" not in lp.engine.__dict__


def test_kv_cache_usage_and_inter_token_latency(client, server):
    """vLLM's vllm:kv_cache_usage_perc (a gauge in [0, 1]: above 0 while a request holds blocks, 0 once
    all are free) and vllm:inter_token_latency_seconds (one observation per step after a request's first, vLLM's
    buckets, read against a real vLLM 0.32 scrape), parsed by prometheus_client."""
    lp = server[1]

    def families():
        return {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}

    def itl_count(fams):
        return next(s.value for s in fams["vllm:inter_token_latency_seconds"].samples if s.name.endswith("_count"))

    idle_and_free(lp)
    before = families()
    assert before["vllm:kv_cache_usage_perc"].type == "gauge"
    with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 60, "temperature": 0,
                                                        "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))     # published before this event was sent
        during = families()["vllm:kv_cache_usage_perc"].samples[0].value
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    after = families()
    assert 0 < during <= 1, during
    assert after["vllm:kv_cache_usage_perc"].samples[0].value == 0.0
    assert 1 <= itl_count(after) - itl_count(before) <= 59                 # at most one per token after the first
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    vllm = {f.name: f for f in text_string_to_metric_families(
        (ROOT / "tests" / "data" / "vllm_0.32_metrics.txt").read_text())}
    for name in ("vllm:inter_token_latency_seconds", "vllm:kv_cache_usage_perc"):
        assert after[name].type == vllm[name].type
        assert [s.labels.get("le") for s in after[name].samples if s.name.endswith("_bucket")] == \
            [s.labels.get("le") for s in vllm[name].samples if s.name.endswith("_bucket")]


FUZZ_FINDINGS = [   # what tests/test_schema_fuzz.py found, each a request and what it must get now
    ({"": {}, "prompt": "x"}, 400, '""'),                                    # was param "" (an empty name, unnamed)
    (b'7\xff\xfe$\x80', 400, "body"),                                       # was param null (FastAPI's own 400)
    ({"prompt": "0", "repetition_penalty": 5e-324}, 400, "repetition_penalty"),   # was a 500 (NaN probabilities)
    ({"prompt": "0", "repetition_penalty": 1e300}, 400, "repetition_penalty"),
    ({"prompt": "x", "top_k": 336435326713160886520905728, "max_tokens": 4}, 200, None),   # was a 400 blaming prompt
    ({"prompt": "x", "temperature": 1e-40, "max_tokens": 4}, 200, None),   # was a 500 (below float32: vLLM's greedy)
    ({"prompt": [5.0, 6.0], "n": 1.0, "max_tokens": 4.0, "allowed_token_ids": [7.0, 8]}, 200, None),   # JSON's 2.0 is 2
    ({"prompt": "x", "n": 1.5}, 400, "n"),
    ({"prompt": "", "max_tokens": 4}, 400, "prompt"),
]


@pytest.mark.parametrize("body, status, param", FUZZ_FINDINGS)
def test_fuzz_findings(client, body, status, param):
    "The schema fuzzer's findings, kept as plain requests: the status, and the field a 400 names."
    if isinstance(body, bytes):
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == param and param.strip('"') in r.json()["error"]["message"], r.text
    else:
        assert r.json()["usage"]["completion_tokens"] == 4


def test_greedy_below_sampling_eps(client):
    "A temperature below vLLM's 1e-5 is greedy, as in vLLM: the same text as temperature 0."
    tiny = complete(client, prompt=PROMPTS[0], max_tokens=12, temperature=1e-40, seed=3)
    assert tiny["choices"][0]["text"] == complete(client, prompt=PROMPTS[0], max_tokens=12,
                                                  temperature=0)["choices"][0]["text"]


def test_stream_schema_describes_events(client):
    """Schemathesis reads a text/event-stream `schema` (OpenAPI before 3.2) as one event, {data, event}: the schema
    says so (it said `string`, and every streamed 200 failed its check)."""
    app_schema = client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        event = app_schema["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        assert (event["type"], event["required"], event["properties"]["data"]) == ("object", ["data"],
                                                                                  {"type": "string"})
