"""`speclab serve`'s torch threads: every core (torch's choice) against every core but one (`serve_threads`, the
default), side by side in one run, served over HTTP.

    python benchmarks/serving/serve_threads.py                          # plain and draft model, C = 1 4 16, 2 repeats
    python benchmarks/serving/serve_threads.py --out benchmarks/serving/serve_threads.json
    python benchmarks/serving/serve_threads.py --quick                  # smoke run: plain, C = 1, 1 repeat, 16 tokens

What: the shipped tiny pair, `speclab serve` started once per (drafter, threads) with `--threads T` for T in 1 ..
cores (each server also at the same `--kappa`; plain is `--draft none`), all servers up at once, each warmed with a
few requests. How: the 8 held-out prompts of `sweep_prompts(8, 64)`, greedy with ignore_eos, `--max-tokens` tokens
each, streamed (`vllm_peer.run_level`: max(8, 2 C) requests with at most C in flight); at each concurrency the
servers take turns, the order reversed every other repeat; tokens/s is completion tokens over the level's seconds,
best of the repeats. It prints, per drafter and concurrency, each thread count's tokens/s and its ratio to the
default's. The load average is recorded around the run. No timing is asserted.
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm_peer"))   # its client and records
import vllm_env  # noqa: E402
from bench_env import load_average, machine, utc_now  # noqa: E402
from vllm_peer import run_level, warm_up  # noqa: E402


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line."
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafters", nargs="+", default=["plain", "draft_model"], choices=("plain", "draft_model"))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16], help="requests in flight (1 4 16)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per level (2)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request, ignore_eos (64)")
    p.add_argument("--kappa", default="auto", help="the speculative servers' --kappa (auto)")
    p.add_argument("--quick", action="store_true", help="smoke run: plain, C = 1, 1 repeat, 16 tokens")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.drafters, a.concurrency, a.repeats, a.max_tokens = ["plain"], [1], 1, 16
    if a.repeats < 1 or a.max_tokens < 1 or min(a.concurrency) < 1:
        p.error("--repeats, --max-tokens and --concurrency must be >= 1")
    return a


def server_argv(drafter: str, threads: int, kappa: str) -> list:
    "`speclab serve`'s flags for one drafter at one thread count."
    how = ["--draft", "none"] if drafter == "plain" else ["--draft", str(vllm_env.DRAFT), "--kappa", kappa]
    return [*how, "--threads", str(threads), "--max-num-seqs", "16", "--seed", "0"]


def measure(a: argparse.Namespace, cores: int) -> dict:
    "Every server up at once, every level interleaved: tokens/s per (drafter, threads, concurrency), all repeats."
    from speclab.remote import served_model
    from speclab.sweep import sweep_prompts
    prompts = [list(map(int, p)) for p in sweep_prompts(8, 64)]
    names = [(d, t) for d in a.drafters for t in range(1, cores + 1)]
    runs = {}
    with contextlib.ExitStack() as stack, httpx.Client(timeout=600) as client:
        urls = {n: stack.enter_context(vllm_env.speclab_server(*server_argv(*n, a.kappa))) for n in names}
        models = {n: served_model(client, u) for n, u in urls.items()}
        warm_up(client, urls, models, prompts)
        for rep in range(a.repeats):
            order = names if rep % 2 == 0 else names[::-1]
            for c in a.concurrency:
                work = prompts * max(1, -(-2 * c // len(prompts)))
                for n in order:
                    level = run_level(client, urls[n], models[n], work, c, a.max_tokens)
                    runs.setdefault(f"{n[0]}/{n[1]}/{c}", []).append(level["tok_s"])
    return runs


def summarize(a: argparse.Namespace, runs: dict, cores: int) -> list:
    "One row per (drafter, concurrency): each thread count's best tokens/s and its ratio to the default's."
    from speclab.cli import serve_threads
    default = serve_threads(cores)
    rows = []
    for d in a.drafters:
        for c in a.concurrency:
            best = {t: max(runs[f"{d}/{t}/{c}"]) for t in range(1, cores + 1)}
            rows.append({"drafter": d, "concurrency": c, "default_threads": default, "tok_s": best,
                         "ratio_to_default": {t: v / best[default] for t, v in best.items()},
                         "all": {t: runs[f"{d}/{t}/{c}"] for t in best}})
    return rows


def main(argv: list | None = None) -> int:
    "Run, print the table, write the JSON."
    from speclab.cli import available_cores
    a = parse_args(argv)
    cores = available_cores()
    meta = {"date": utc_now(), "machine": machine(), "cores": cores, "command": " ".join(sys.argv),
            "load_before": load_average()}
    runs = measure(a, cores)
    meta["load_after"] = load_average()
    rows = summarize(a, runs, cores)
    print(f"speclab serve, torch threads 1..{cores} (default {rows[0]['default_threads']}); tokens/s, best of "
          f"{a.repeats}; load {meta['load_before']} -> {meta['load_after']}")
    for r in rows:
        cells = "  ".join(f"{t} thread(s) {v:7.1f} ({r['ratio_to_default'][t]:.2f}x)" for t, v in r["tok_s"].items())
        print(f"{r['drafter']:12s} C={r['concurrency']:<3d} {cells}")
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
