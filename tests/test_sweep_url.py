"""Lab 08's sweep against a live server: `speclab serve` processes on localhost, scraped like vLLM.

The claim of the `--url` mode is that it is the same experiment as the in-process sweep. With greedy decoding and a
fixed kappa every request drafts the same tokens at the same steps whoever shares its batch, so the counters the two
scrapes give must equal the in-process engine's exactly (drafts, draft tokens, accepted tokens, per position, the
per-draft histogram), and so must E and alpha-hat. Each server is a real `speclab serve` subprocess on 127.0.0.1
(`speclab.testing.serve_process`); every wait is bounded.
"""
import math
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from speclab.remote import scrape, sweep_url
from speclab.sweep import sweep, sweep_prompts
from speclab.cli import _sweep_table
from speclab.engine import ModelDrafter
from speclab.model import load_model, load_tokenizer
from speclab.testing import serve_process
from speclab.train import tiny_pair_path

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
    with serve_process("--num-spec-tokens", "3", "--max-num-seqs", "4", "--threads", "1") as spec_url, \
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
