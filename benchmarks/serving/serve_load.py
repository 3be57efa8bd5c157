"""`speclab serve` under load on localhost: many more concurrent streamed requests than the server runs at once.

    python benchmarks/serving/serve_load.py                    # 64 requests against --max-num-seqs 16, the shipped pair
    python benchmarks/serving/serve_load.py --draft none       # the same against a plain server
    python benchmarks/serving/serve_load.py --json             # one JSON object

Starts `speclab serve` as a subprocess on 127.0.0.1 (`speclab.testing.serve_process`; nothing leaves this machine),
then sends --requests streamed completions at once (greedy, ignore_eos, output lengths spread evenly over
--min-tokens..--max-tokens in a seeded order, prompts from the held-out set). Each client records the time to its
first text chunk (TTFT) and to the end of its stream, and counts the tokens the final usage chunk reports. The
/metrics counters are scraped before and after. The run fails (exit 1) unless every request completed with exactly
its max_tokens, the server counted exactly those requests and tokens, and its waiting queue was seen non-empty
(the load really queued). Reports TTFT and latency percentiles, tokens/s, and the server's E. Every wait is bounded
(--timeout for the whole run); the server is stopped with Ctrl-C at the end.
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="concurrent requests (default 64)")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="the server's running limit (default 16)")
    ap.add_argument("--min-tokens", type=int, default=16, help="shortest output (default 16)")
    ap.add_argument("--max-tokens", type=int, default=128, help="longest output (default 128)")
    ap.add_argument("--draft", default="tiny", help="the server's --draft: tiny (default) or none")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="order of the output lengths (default 0)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the whole run (default 900)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    for k in ("requests", "max_num_seqs", "min_tokens", "max_tokens", "threads"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.min_tokens > a.max_tokens:
        ap.error("--min-tokens must not exceed --max-tokens")
    return a


def samples(text: str) -> dict:
    "Every sample of a /metrics text summed over its label sets: {name: value}."
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int, t0: float) -> dict:
    "One streamed completion: its TTFT, its latency and the tokens its usage chunk reports."
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    first, tokens, done = None, None, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": (await r.aread()).decode()[:300]}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0]["text"]:
                first = time.perf_counter() - t0
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return {"status": 200, "ttft": first, "latency": time.perf_counter() - t0, "tokens": tokens, "done": done,
            "want": max_tokens}


async def load(url: str, prompts: list, lengths: list) -> tuple:
    "All requests at once, the queue watched through /metrics: (results, seconds, before, after, most waiting)."
    limits = httpx.Limits(max_connections=len(lengths) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        before = samples((await client.get("/metrics")).text)
        waiting = []
        stop = asyncio.Event()

        async def watch():
            while not stop.is_set():
                waiting.append(samples((await client.get("/metrics")).text).get("vllm:num_requests_waiting", 0))
                await asyncio.sleep(0.05)
        watcher = asyncio.create_task(watch())
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, prompts[i % len(prompts)], n, t0)
                                         for i, n in enumerate(lengths)))
        seconds = time.perf_counter() - t0
        stop.set()
        await watcher
        after = samples((await client.get("/metrics")).text)
    return results, seconds, before, after, max(waiting, default=0)


def pct(xs: list, q: int) -> float:
    "The q-th percentile of xs (statistics.quantiles, inclusive)."
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def main(argv: list[str] | None = None) -> int:
    "Run the load, check nothing was lost, report."
    a = parse_args(argv)
    from speclab.remote import url_prompts
    from speclab.testing import serve_process
    lengths = [a.min_tokens + round(i * (a.max_tokens - a.min_tokens) / max(1, a.requests - 1))
               for i in range(a.requests)]
    random.Random(a.seed).shuffle(lengths)
    load_before = load_average()
    argv = ["--draft", a.draft, "--max-num-seqs", str(a.max_num_seqs), "--threads", str(a.threads)]
    with serve_process(*argv) as url:
        results, seconds, before, after, most_waiting = asyncio.run(
            asyncio.wait_for(load(url, url_prompts(16), lengths), a.timeout))
    ok = [r for r in results if r["status"] == 200 and r["done"] and r["tokens"] == r["want"]]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0)
    E = 1 + delta.get("vllm:spec_decode_num_accepted_tokens_total", 0) / drafts if drafts else 1.0
    checks = {"every request completed with its tokens": len(ok) == len(results),
              "the server counted every request": delta.get("vllm:request_success_total") == len(results),
              "the server counted every token": delta.get("vllm:generation_tokens_total") == sum(lengths),
              "requests queued": most_waiting > 0}
    ttft, lat = [r["ttft"] for r in ok], [r["latency"] for r in ok]
    report = {"date": utc_now(), "machine": machine(), "command": " ".join(sys.argv),
              "load_average_before": load_before, "load_average_after": load_average(),
              "requests": a.requests, "max_num_seqs": a.max_num_seqs, "draft": a.draft, "server_threads": a.threads,
              "output_tokens": sum(lengths), "seconds": round(seconds, 2),
              "tokens_per_s": round(sum(lengths) / seconds, 1), "most_waiting_seen": most_waiting,
              "E": round(E, 3), "checks": checks}
    if len(ok) >= 2:
        report |= {f"{name}_p{q}": round(pct(xs, q), 3) for name, xs in (("ttft_s", ttft), ("latency_s", lat))
                   for q in (50, 90, 99)}
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in report.items():
            print(f"{k}: {v}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
