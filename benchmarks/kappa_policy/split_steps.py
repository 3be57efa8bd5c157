"""What a split batch costs: steps whose requests draft different numbers of tokens, against the same draws per step.

    python benchmarks/kappa_policy/split_steps.py                      # table
    python benchmarks/kappa_policy/split_steps.py --out FILE           # also one JSON file

On the shipped tiny pair (fp32, one torch thread, the draft model by default), a closed loop of `--concurrency`
clients each sending 4 held-out prompts (48 greedy tokens each), served by: plain decoding; kappa 1 and 2 fixed; and
two kappa-4 engines whose policy draws each step's kappas from {0, 1, 2} with weights 0.3, 0.35, 0.35 from its own
generator (never a request's): `per-step` draws one kappa for the whole batch, `per-request` one for each request.
Both mixes make the same number of drafts on average; only `per-request` splits a step's batch into requests that
verify different numbers of positions, which Chapter 7's paged attention runs as one group per length. Engines are
built once and warmed; each round runs them all, in list order in even rounds and reversed in odd ones. Medians over
rounds, each over plain's median.
"""
import argparse
import json
import os
import platform
import random
import statistics
import time

import sys
from pathlib import Path

import torch

from speclab.engine import SpecDecoder
from speclab.model import load_model
from speclab.request import SamplingParams
from speclab.sweep import sweep_prompts
from speclab.train import tiny_pair_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive_kappa import make_drafter  # noqa: E402  (the closed-loop benchmark's drafters, one per engine)

WEIGHTS = (0.3, 0.35, 0.35)        # kappa 0, 1, 2


class MixPolicy:
    "Draws each step's kappas from WEIGHTS with its own generator: one for the batch, or one per request."

    def __init__(self, per_request: bool, seed: int = 0):
        self.per_request = per_request
        self.rng = random.Random(seed)

    def draw(self) -> int:
        "One kappa from WEIGHTS."
        return self.rng.choices(range(len(WEIGHTS)), WEIGHTS)[0]

    def choose(self, view) -> list[int]:
        "The step's kappas, each at most its cap."
        k = self.draw()
        return [min(self.draw() if self.per_request else k, c) for c in view.caps]

    def observe(self, step) -> None:
        "Step times are not used."


def main(argv: list[str] | None = None) -> dict:
    "Run the engines; print the table, write the JSON."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16, help="max_num_seqs (default 16)")
    ap.add_argument("--drafter", choices=("model", "ngram", "eagle"), default="model", help="default: model")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.concurrency < 1:
        ap.error("--rounds and --concurrency must be >= 1")
    torch.set_num_threads(1)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    prompts = sweep_prompts(max(16, 4 * a.concurrency), 64)
    common = dict(max_num_seqs=a.concurrency, seed=0, num_blocks=16 * a.concurrency + 64)
    engines = {"plain": SpecDecoder(target, None, kappa=0, **common)}
    for k in (1, 2):
        engines[f"kappa{k}"] = SpecDecoder(target, make_drafter(a.drafter, target, draft), kappa=k, **common)
    for name, per_request in (("per-step", False), ("per-request", True)):
        engines[name] = SpecDecoder(target, make_drafter(a.drafter, target, draft), kappa=4,
                                    policy=MixPolicy(per_request), **common)
    for eng in engines.values():
        eng.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))          # warm
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    runs = {name: [] for name in engines}
    for i in range(a.rounds):
        for name in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
            t0 = time.perf_counter()
            outs = engines[name].generate(prompts, params)
            runs[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
        print(f"round {i + 1} of {a.rounds} done", flush=True)
    med = {name: statistics.median(v) for name, v in runs.items()}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "drafter": a.drafter,
           "concurrency": a.concurrency, "rounds": a.rounds, "weights": WEIGHTS, "tokens_per_s": runs,
           "median": med, "over_plain": {name: m / med["plain"] for name, m in med.items()}}
    for name, m in med.items():
        print(f"{name:>12} {m:8.1f} tokens/s  {m / med['plain']:.3f} of plain")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
