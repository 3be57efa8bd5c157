"""Lab 08's sweep against a live server: `speclab serve` processes on localhost, scraped like vLLM.

The claim of the `--url` mode is that it is the same experiment as the in-process sweep. With greedy decoding and a
fixed kappa every request drafts the same tokens at the same steps whoever shares its batch, so the counters the two
scrapes give must equal the in-process engine's exactly (drafts, draft tokens, accepted tokens, per position, the
per-draft histogram), and so must E and alpha-hat. Each server is a real `speclab serve` subprocess on 127.0.0.1
(`speclab.testing.serve_process`); every wait is bounded.
"""
import json
import math
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest

from speclab.remote import base_url, scrape, sweep_url
from speclab.sweep import sweep, sweep_prompts
from speclab.cli import _sweep_table
from speclab.drafters import ModelDrafter
from speclab.model import load_model, load_tokenizer
from speclab.testing import serve_process
from speclab.train import tiny_pair_path
from speclab.vllm_io import metrics_delta, parse_prometheus

pytestmark = pytest.mark.xdist_group("sweep_url")   # one worker: its module fixtures are built once

SPECLAB = Path(sys.executable).parent / "speclab"
BATCHES = [1, 3]
OUTPUT_LEN = 12
NUM_PROMPTS = 4


def free_port() -> int:
    "A port nothing listens on now (for the test of a server that is not there)."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers():
    "A speculative server (the shipped pair, kappa 3) and a plain one (the target alone); both must stop cleanly."
    with serve_process("--kappa", "3", "--num-spec-tokens", "3", "--max-num-seqs", "4", "--threads", "1") as spec_url, \
            serve_process("--draft", "none", "--max-num-seqs", "4", "--threads", "1") as plain_url:
        yield spec_url, plain_url


@pytest.fixture(scope="module")
def in_process():
    "The in-process sweep of Chapter 9 on the same prompts, batch sizes and lengths."
    tok = load_tokenizer(tiny_pair_path("target"))
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    return sweep(target, {"draft_model": ModelDrafter(draft)}, sweep_prompts(NUM_PROMPTS), BATCHES, (3,), (0.0,),
                 (OUTPUT_LEN,), tok, repeats=1, progress=False)


def test_url_sweep_reproduces_the_in_process_table(servers, in_process):
    spec_url, plain_url = servers
    rows = sweep_url(spec_url, BATCHES, 0.0, OUTPUT_LEN, NUM_PROMPTS, baseline_url=plain_url, repeats=1,
                     progress=False)
    assert [r["batch"] for r in rows] == BATCHES
    for served, local in zip(rows, in_process):
        assert served["metrics"] == local["metrics"], (served["batch"], served["metrics"], local["metrics"])
        assert served["E"] == local["E"] and served["alpha_hat"] == local["alpha_hat"]
        assert served["r"] == local["r"] and served["kappa"] == local["kappa"] == 3
        assert served["requests"] == local["requests"]
        assert served["sample"] == local["sample"]                  # greedy: the very same text
        assert served["spec_tok_s"] > 0 and served["plain_tok_s"] > 0 and math.isfinite(served["speedup"])
        assert served["metrics"].num_drafts > 0


def test_url_sweep_without_a_baseline_has_no_speedup(servers):
    spec_url, _ = servers
    before = scrape(httpx.Client(), spec_url)
    (row,) = sweep_url(spec_url, [2], 0.0, 6, 2, repeats=1, progress=False)
    assert math.isnan(row["plain_tok_s"]) and math.isnan(row["speedup"]) and row["spec_tok_s"] > 0
    after = scrape(httpx.Client(), spec_url)
    warm_up_drafts = after.num_drafts - before.num_drafts - row["metrics"].num_drafts
    assert row["metrics"].num_drafts > 0 and warm_up_drafts == 1     # the window holds the point, not the warm-up
                                                                     # (2 tokens: one draft of one token)
    table = _sweep_table([row])
    assert "nan" not in table and table.splitlines()[1].split()[2:4] == ["-", "-"]   # unknown, shown as dashes


def test_cli_sweep_url_prints_the_table(servers, tmp_path):
    spec_url, plain_url = servers
    out = tmp_path / "table.csv"
    r = subprocess.run([str(SPECLAB), "sweep", "--url", spec_url, "--baseline-url", plain_url, "--batch-sizes", "1,2",
                        "--output-len", "6", "--num-prompts", "2", "--repeats", "1", "--no-progress", "--out",
                        str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SpecDecoding metrics: Mean acceptance length" in r.stdout
    assert "speedup" in r.stdout and "crossing" in r.stdout
    assert out.exists() and out.read_text().count("\n") == 3                       # a header and two rows


def test_url_sweep_names_a_server_that_is_not_there():
    port = free_port()
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}.*is the server running"):
        sweep_url(f"http://127.0.0.1:{port}", [1], 0.0, 4, 1, repeats=1, progress=False)


def test_cli_sweep_url_errors_are_one_line():
    r = subprocess.run([str(SPECLAB), "sweep", "--url", "localhost:8000"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--url" in r.stderr, r.stderr
    r = subprocess.run([str(SPECLAB), "sweep", "--baseline-url", "http://127.0.0.1:9"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--baseline-url needs --url" in r.stderr, r.stderr
    r = subprocess.run([str(SPECLAB), "sweep", "--url", "http://127.0.0.1:9", "--synthetic"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--synthetic" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Real vLLM 0.32 /metrics text (tests/data, recorded for Chapter 9d), served by an httpx.MockTransport: no server
# ---------------------------------------------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data"
VLLM_MODEL = "/work/main/speclab/data/tiny-pair/target"          # the id the recorded vLLM server listed


def fake_vllm(scrapes: list, seen: list) -> httpx.MockTransport:
    "A vLLM stand-in: /v1/models, /metrics answering `scrapes` in turn (the last one repeats), canned completions."
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": VLLM_MODEL, "object": "model"}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=scrapes[min(seen.count("GET /metrics"), len(scrapes)) - 1])
        if request.url.path == "/v1/completions":
            body = json.loads(request.content)
            assert body["model"] == VLLM_MODEL and body["temperature"] == 0.0 and body["ignore_eos"] is True
            return httpx.Response(200, json={"choices": [{"text": "x" * body["max_tokens"]}],
                                             "usage": {"completion_tokens": body["max_tokens"]}})
        return httpx.Response(404, json={"detail": "Not Found"})
    return httpx.MockTransport(handle)


def through(monkeypatch, transport: httpx.MockTransport) -> None:
    "Every httpx.Client the sweep opens talks to `transport`."
    monkeypatch.setattr(httpx, "Client", partial(httpx.Client, transport=transport))


def test_scrape_of_a_plain_vllm_names_the_server():
    "A plain vLLM's real /metrics has no spec-decode counters: the error names the URL it scraped."
    plain = (DATA / "vllm_0.32_metrics_plain.txt").read_text()
    client = httpx.Client(transport=fake_vllm([plain], []))
    with pytest.raises(RuntimeError, match=r"GET http://vllm:8000/metrics: no vllm:spec_decode_\* counter"):
        scrape(client, "http://vllm:8000")


def test_url_sweep_refuses_a_plain_vllm_before_any_request(monkeypatch):
    "--url given a plain server (or the two URLs swapped): one scrape, then the error; no completion is sent."
    seen = []
    through(monkeypatch, fake_vllm([(DATA / "vllm_0.32_metrics_plain.txt").read_text()], seen))
    with pytest.raises(RuntimeError, match="http://vllm:8000/metrics"):
        sweep_url("http://vllm:8000", [1], 0.0, 4, 1, baseline_url="http://plain:8001", repeats=1, progress=False)
    assert seen == ["GET /metrics"]


def test_url_sweep_reads_real_vllm_counters(monkeypatch):
    "A point's window is the difference of two real scrapes, whatever else the scrapes hold; /v1 in --url is dropped."
    fresh, after = (DATA / "vllm_0.32_metrics_fresh.txt").read_text(), (DATA / "vllm_0.32_metrics.txt").read_text()
    seen = []
    through(monkeypatch, fake_vllm([fresh, fresh, after], seen))      # the check, then before and after the point
    (row,) = sweep_url("http://vllm:8000/v1/", [1], 0.0, 4, 1, repeats=1, progress=False)
    assert row["url"] == "http://vllm:8000" and seen.count("GET /metrics") == 3
    assert row["metrics"] == metrics_delta(parse_prometheus(after), parse_prometheus(fresh))
    assert row["kappa"] == 3 and row["E"] == 1 + 4327 / 2885 and row["r"] == [1989 / 2885, 1386 / 2885, 952 / 2885]
    assert math.isfinite(row["alpha_hat"]) and math.isnan(row["speedup"])


def test_base_url():
    assert base_url("http://localhost:8000/v1/") == "http://localhost:8000"
    assert base_url("http://localhost:8000//") == "http://localhost:8000"
    assert base_url("https://host/vllm/v1") == "https://host/vllm"
    assert base_url("https://host/v1x") == "https://host/v1x"
    with pytest.raises(ValueError, match="baseline_url must be an http"):
        base_url("localhost:8000", "baseline_url")
