"""Tokens per second of plain decoding, fixed kappa and the adaptive policy at each concurrency (issue 41, first cut).

    python benchmarks/adaptive_kappa.py                         # table
    python benchmarks/adaptive_kappa.py --rounds 3 --json       # one JSON object

On the shipped tiny pair (draft model; fp32; two torch threads), the same 16 held-out prompts (Chapter 9c's) are
served with `max_num_seqs` = concurrency (continuous batching), greedy, `--tokens` new tokens each, by four engines:
plain decoding, kappa 1 and 3 fixed, and `KappaPolicy(calibrate_costs(...), learn=True)` with kappa at most 5. The
engines are built once and warmed; each round runs every configuration at every concurrency in one interleaved order,
so a busy machine slows them alike. Medians over rounds; ratios from the medians of the same run.
"""
import argparse
import dataclasses
import json
import os
import statistics
import time

import torch

from speclab.engine import KappaPolicy, ModelDrafter, SamplingParams, SpecDecoder
from speclab.model import load_model
from speclab.sweep import calibrate_costs, sweep_prompts
from speclab.train import tiny_pair_path

CONFIGS = ("plain", "kappa1", "kappa3", "adaptive")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="max_num_seqs values")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (default 48)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tokens < 4 or min(a.concurrency) < 1:
        ap.error("--rounds and --concurrency must be >= 1, --tokens >= 4")
    return a


def engines(target, draft, costs, concurrency: int) -> dict:
    "The four engines of one concurrency."
    common = dict(max_num_seqs=concurrency, seed=0)
    return {"plain": SpecDecoder(target, None, kappa=0, **common),
            "kappa1": SpecDecoder(target, ModelDrafter(draft), kappa=1, **common),
            "kappa3": SpecDecoder(target, ModelDrafter(draft), kappa=3, **common),
            "adaptive": SpecDecoder(target, ModelDrafter(draft), kappa=5, **common,
                                    policy=KappaPolicy(costs, alpha_prior=0.6, learn=True))}


def tokens_per_s(eng: SpecDecoder, prompts: list, params: SamplingParams) -> float:
    "Generated tokens per second of one generate call over the prompts."
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    "Run the grid; print the table or the JSON."
    a = parse_args(argv)
    torch.set_num_threads(2)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    costs = calibrate_costs(target, draft, positions=(1, 4, 16, 64))
    prompts = sweep_prompts(16, 64)
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    grid = {c: engines(target, draft, costs, c) for c in a.concurrency}
    for engs in grid.values():
        for eng in engs.values():
            eng.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))      # warm
    runs = {c: {name: [] for name in CONFIGS} for c in a.concurrency}
    for _ in range(a.rounds):
        for c, engs in grid.items():
            for name, eng in engs.items():
                runs[c][name].append(tokens_per_s(eng, prompts, params))
    med = {c: {name: statistics.median(v) for name, v in r.items()} for c, r in runs.items()}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg()[0],
           "calibrated_costs": dataclasses.asdict(costs),
           "tokens": a.tokens, "rounds": a.rounds, "tokens_per_s": med,
           "adaptive_over_best": {c: m["adaptive"] / max(m["plain"], m["kappa1"], m["kappa3"]) for c, m in med.items()}}
    if a.json:
        print(json.dumps(out, indent=1))
        return out
    print(f"calibrated: {costs}")
    print(f"{'concurrency':>11} " + " ".join(f"{n:>9}" for n in CONFIGS) + "  adaptive / best")
    for c, m in med.items():
        print(f"{c:>11} " + " ".join(f"{m[n]:9.1f}" for n in CONFIGS) + f"  {out['adaptive_over_best'][c]:.3f}")
    return out


if __name__ == "__main__":
    main()
