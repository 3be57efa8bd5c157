"""What an engine with a drafter costs when `--kappa auto` plans plain steps: tokens/s against plain decoding.

    python benchmarks/kappa_policy/drafter_overhead.py [--concurrency 16] [--requests 16] [--rounds 3] [--profile]

The shipped pair (fp32, one torch thread), Chapter 9c's held-out prompts (`--requests` of them) x 48 greedy tokens,
`max_num_seqs` = concurrency, a pool of 16 x concurrency + 64 blocks as in `adaptive_kappa.py` (so a round's prompts are
not found in the prefix cache from the round before). Engines: plain decoding (no drafter), and n-gram lookup, the draft
model and the shipped EAGLE head, each under `KappaPolicy.adaptive` with the costs recorded in
`adaptive_kappa_first_step.json` (so every run plans alike). At 16 requests the policy plans kappa 0 in nearly every
request-step, so an engine's distance from plain decoding is what its drafter costs on plain steps. `model/eager` is the
draft model's engine with the prefix cache's draft K/V shared as without a policy (every prompt drafted on as it
arrives, Chapter 8's "Under a policy, the draft waits"): the price of that sharing, side by side. Rounds are
interleaved; printed per engine: its best round over plain decoding's best, the median over rounds of its ratio to
plain's run of the same round, and the kappa counts of its last round. `--profile` adds the top speclab functions of one
more round per engine (cProfile).
"""
import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.eagle import eagle_drafter
from speclab.engine import SpecDecoder
from speclab.model import load_model, load_tokenizer
from speclab.policy import KappaPolicy, StepCosts
from speclab.request import SamplingParams
from speclab.roofline import SpecMetrics
from speclab.sweep import sweep_prompts
from speclab.train import tiny_pair_path

COSTS = Path(__file__).with_name("adaptive_kappa_first_step.json")


def engines(concurrency: int) -> dict:
    "Plain decoding and the three drafters under the adaptive policy, on the recorded costs."
    costs = json.loads(COSTS.read_text())["costs"]
    target, tok = load_model(tiny_pair_path("target")), load_tokenizer(tiny_pair_path("target"))
    drafters = {"ngram": NgramDrafter(3), "model": ModelDrafter(load_model(tiny_pair_path("draft"))),
                "eagle": eagle_drafter(target)}
    pool = dict(max_num_seqs=concurrency, seed=0, num_blocks=16 * concurrency + 64)
    out = {"plain": SpecDecoder(target, None, tok, kappa=0, **pool)}
    for name, drafter in drafters.items():
        policy = KappaPolicy.adaptive(StepCosts(**costs[name]))
        out[f"{name}/auto"] = SpecDecoder(target, drafter, tok, kappa=4, **pool, policy=policy)
    eager = SpecDecoder(target, ModelDrafter(drafters["model"].model), tok, kappa=4, **pool,
                        policy=KappaPolicy.adaptive(StepCosts(**costs["model"])))
    eager.scheduler.draft_reuses_prefix = True    # the engine's choice without a policy: prompts drafted on at once
    out["model/eager"] = eager
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=16, help="prompts per round (default 16: one batch at 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    if a.concurrency < 1 or a.rounds < 1 or a.requests < 1:
        ap.error("--concurrency, --requests and --rounds must be >= 1")
    torch.set_num_threads(1)
    prompts, params = sweep_prompts(a.requests), SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    engs = engines(a.concurrency)
    for eng in engs.values():
        eng.generate(prompts[:2], params)                       # warm
    seconds = {name: [] for name in engs}
    for r in range(a.rounds):
        for name, eng in engs.items():
            eng.metrics = SpecMetrics()
            t0 = time.perf_counter()
            eng.generate(prompts, params)
            seconds[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    plain = len(prompts) * params.max_tokens / min(seconds["plain"])
    for name, eng in engs.items():
        rate = len(prompts) * params.max_tokens / min(seconds[name])
        paired = statistics.median(p / t for p, t in zip(seconds["plain"], seconds[name]))   # the same round's plain
        print(f"{name:12s} {rate:8.1f} tokens/s  {rate / plain:.3f} of plain (best rounds), {paired:.3f} round by "
              f"round (median)  kappa counts {eng.metrics.kappa_counts}")
    for name, eng in engs.items() if a.profile else ():
        prof = cProfile.Profile()
        prof.enable()
        eng.generate(prompts, params)
        prof.disable()
        stats = pstats.Stats(prof)
        rows = sorted(((tt, n, f.split("speclab/")[-1] + ":" + fn) for (f, _, fn), (_, n, tt, _, _) in
                       stats.stats.items() if "speclab" in f), reverse=True)
        print(f"== {name}: {stats.total_tt * 1e3:.1f} ms in all")
        for tt, n, where in rows[:6]:
            print(f"   {tt * 1e3:8.1f} ms {n:6d} {where}")


if __name__ == "__main__":
    main()
