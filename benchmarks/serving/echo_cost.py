"""The stall an echoed, scored prompt costs every running stream, per prompt length.

`echo` with `logprobs` scores the prompt: one target forward over it (`Score`, Chapter 11), run on the engine thread
between two steps. While it runs no stream gets a token. This script measures how long that is on the shipped pair.

    python benchmarks/serving/echo_cost.py                      # prompt lengths 16, 64, 128, 256, 480
    python benchmarks/serving/echo_cost.py --lengths 32,480 --json

(a) Score alone. An EngineLoop on the shipped pair (kappa 3), idle; `Score(ids, params, 5)` asked and waited for:
the prompt decoded and scored with its top 5 alternatives. Reported: the median over --repeats (5) of the wall time,
in milliseconds, per prompt length (random token ids from a fixed seed).

(b) Streams. The same engine behind the OpenAI server in this process (ServerThread, max_num_seqs 8); --streams (4)
streamed requests (ignore_eos, max_tokens 400) run; once each has sent 5 chunks, one more request arrives with a
prompt of L token ids, max_tokens 1, logprobs 5, either with echo (scored: Score, then its prefill) or without (its
prefill only). Reported, per L and kind: the longest gap between two chunks of any stream while that request was
served, and the median gap before it (one step of the running batch); the median over --repeats of each. The
difference between the echo and the plain request's longest gap is what scoring adds to a stall.

Every figure is wall time on this machine and its load; the machine line and the load average are printed with them.
"""
import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.request import SamplingParams  # noqa: E402
from speclab.serve import EngineLoop, Score, ServerThread, build_app, load_engine  # noqa: E402
from speclab.train import tiny_pair_path  # noqa: E402

MODEL = "speclab-tiny"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="16,64,128,256,480", help="prompt lengths in tokens (comma-separated)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per length (default 5)")
    ap.add_argument("--streams", type=int, default=4, help="streams running while the prompt is scored (default 4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as `speclab serve --threads 1`)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        a.lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths must be comma-separated ints, got {a.lengths!r}")
    if not all(1 <= n <= 500 for n in a.lengths):
        ap.error("--lengths must lie in [1, 500] (the shipped target's context is 512)")
    if a.repeats < 1 or a.streams < 1 or a.threads < 1:
        ap.error("--repeats, --streams and --threads must be >= 1")
    return a


def prompt_of(length: int, vocab: int) -> list[int]:
    "A prompt of `length` random token ids (fixed seed; id 0, the EOS, left out)."
    return np.random.default_rng(length).integers(1, vocab, length).tolist()


def score_alone(lp: EngineLoop, lengths: list[int], repeats: int, vocab: int) -> dict:
    "(a) Milliseconds of one Score per prompt length: the median over `repeats`."
    out = {}
    for n in lengths:
        ids, times = prompt_of(n, vocab), []
        for _ in range(repeats):
            t0 = time.perf_counter()
            lp.ask(Score(ids, SamplingParams(max_tokens=1), 5)).result(timeout=120)
            times.append(time.perf_counter() - t0)
        out[n] = round(1000 * statistics.median(times), 1)
    return out


def stream(url: str, i: int, arrivals: list, stop: threading.Event) -> None:
    "One long streamed request; the arrival time of each chunk goes into `arrivals` until `stop`."
    body = {"model": MODEL, "prompt": f"def f{i}(x):\n", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=url, timeout=300) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if stop.is_set():
                return
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())


def stall(url: str, ids: list[int], echo: bool, streams: int) -> tuple[float, float]:
    "(b) One run: (longest chunk gap while the request was served, median gap before it), in milliseconds."
    arrivals, stop = [[] for _ in range(streams)], threading.Event()
    threads = [threading.Thread(target=stream, args=(url, i, arrivals[i], stop), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while min(len(a) for a in arrivals) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1, "logprobs": 5,
                                                  "echo": echo, "temperature": 0}, timeout=300)
    t1 = time.perf_counter()
    time.sleep(0.3)                                  # the gap that spans t1 closes with the next chunk
    stop.set()
    r.raise_for_status()
    during, before = [], []
    for a in arrivals:
        for prev, cur in zip(a, a[1:]):
            if cur <= t0:
                before.append(cur - prev)
            elif prev < t1:
                during.append(cur - prev)
    for t in threads:
        t.join(timeout=120)
    return 1000 * max(during), 1000 * statistics.median(before)


def streams_stalled(url: str, lengths: list[int], repeats: int, streams: int, vocab: int) -> dict:
    "(b) Per length and kind (echo, plain): the medians over `repeats` of the longest gap and of the usual gap."
    out = {}
    for n in lengths:
        ids = prompt_of(n, vocab)
        for kind in ("echo", "plain"):
            runs = [stall(url, ids, kind == "echo", streams) for _ in range(repeats)]
            out[f"{n}/{kind}"] = {"longest_gap_ms": round(statistics.median(r[0] for r in runs), 1),
                                  "usual_gap_ms": round(statistics.median(r[1] for r in runs), 1)}
    return out


def table(result: dict) -> str:
    "The markdown table of a run."
    rows = ["| prompt tokens | Score alone (ms) | longest gap, echo (ms) | longest gap, plain (ms) | usual gap (ms) |",
            "|---:|---:|---:|---:|---:|"]
    for n in result["lengths"]:
        e, p = result["streams"][f"{n}/echo"], result["streams"][f"{n}/plain"]
        rows.append(f"| {n} | {result['score_ms'][n]} | {e['longest_gap_ms']} | {p['longest_gap_ms']} | "
                    f"{e['usual_gap_ms']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    engine = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3, max_num_seqs=8)
    vocab = engine.target.args.vocab_size
    lp = EngineLoop(engine)
    result = {"when": utc_now(), "machine": machine(), "load_before": load_average(), "lengths": a.lengths,
              "repeats": a.repeats, "streams": a.streams}
    with ServerThread(build_app(lp, MODEL)) as srv:
        result["score_ms"] = score_alone(lp, a.lengths, a.repeats, vocab)
        result["streams"] = streams_stalled(srv.url, a.lengths, a.repeats, a.streams, vocab)
    result["load_after"] = load_average()
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['when']}; {result['machine']}; load {result['load_before']} -> {result['load_after']}")
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
