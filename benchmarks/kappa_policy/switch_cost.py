"""What a switch between plain and drafting steps costs: each step's miss by its place in a run of its kind.

    python benchmarks/kappa_policy/switch_cost.py [--drafter model] [--concurrency 16] [--pattern 0002222]

On the shipped pair (fp32, one torch thread), `speclab.serve.calibrate` measures this machine's `StepCosts` as
`--kappa auto` does at start-up. Then one engine serves Chapter 9c's held-out prompts (4 a client, 48 greedy tokens
each) under a policy that repeats a fixed pattern of depths, one a step (`--pattern 0002222`: three plain steps, four
drafting two), so runs of each kind follow each other as they do when `--kappa auto` changes its mind. Every decode
step of the whole batch (no prompt in it) is kept, with the calibrated prediction for that very step. Per depth and
place in its run (0: the first step after a switch; 3: the fourth and later): the steps, and the median of measured
over predicted seconds. A first drafting step after plain ones catches the draft up on every token of the plain run;
a first plain step after drafting ones has nothing to catch up. Where the place-0 median stands above the later ones,
that switch costs the difference.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from speclab.engine import SpecDecoder
from speclab.request import SamplingParams
from speclab.serve import calibrate
from speclab.sweep import sweep_prompts
from speclab.model import load_model
from speclab.train import tiny_pair_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_miss import make_drafter  # noqa: E402

LAST_PLACE = 3          # places 3 and later share a row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", choices=("model", "ngram", "eagle"), default="model")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--pattern", default="0002222", help="the depths a step takes in turn, one digit each")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of 4 prompts a client (default 3)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    if a.concurrency < 1 or a.rounds < 1:
        ap.error("--concurrency and --rounds must be >= 1")
    if not a.pattern.isdigit() or len(set(int(c) > 0 for c in a.pattern)) < 2 or max(a.pattern) > "4":
        ap.error("--pattern must be digits 0-4 with plain (0) and drafting steps both in it, e.g. 0002222")
    return a


class PatternPolicy:
    "A kappa policy that takes the pattern's depths in turn, one a step, whatever the batch (each request's cap kept)."

    def __init__(self, pattern: list[int]):
        self.pattern, self.num_steps, self.steps = pattern, 0, []

    def choose(self, view) -> list[int]:
        K = self.pattern[self.num_steps % len(self.pattern)]
        self.num_steps += 1
        return [min(K, cap) for cap in view.caps]

    def observe(self, step) -> None:
        self.steps.append(step)


def places(steps: list) -> list[int]:
    "Each step's place in its run of steps of its kind (plain or drafting): 0 for the first after a switch."
    out = []
    for i, step in enumerate(steps):
        same = i > 0 and (steps[i - 1].kappa > 0) == (step.kappa > 0)
        out.append(out[-1] + 1 if same else 0)
    return out


def table(steps: list, costs, batch: int) -> dict:
    """{(kappa, place): [steps, median measured / predicted seconds]} over the decode steps of the whole batch (every
    request computing one position and its drafts, no prompt)."""
    groups = {}
    for step, place in zip(steps, places(steps)):
        if step.num_requests != batch or step.num_positions > batch * (1 + step.kappa):
            continue
        predicted = costs.step_s(step.num_positions, step.num_drafting, step.kappa, None, step.num_kv)
        groups.setdefault((step.kappa, min(place, LAST_PLACE)), []).append(step.seconds / predicted)
    return {key: [len(v), statistics.median(v)] for key, v in sorted(groups.items())}


def main(argv: list[str] | None = None) -> dict:
    "Run the pattern; print the table (and write the JSON)."
    a = parse_args(argv)
    torch.set_num_threads(1)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    cal = calibrate(target, make_drafter(a.drafter, target, draft), 4)
    policy = PatternPolicy([int(c) for c in a.pattern])
    eng = SpecDecoder(target, make_drafter(a.drafter, target, draft), kappa=4, max_num_seqs=a.concurrency, seed=0,
                      num_blocks=16 * a.concurrency + 64, policy=policy)
    eng.generate(sweep_prompts(2, 64, seed=99), SamplingParams(temperature=0, max_tokens=4))
    policy.steps.clear()
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    start = time.perf_counter()
    for i in range(a.rounds):
        eng.generate(sweep_prompts(4 * a.concurrency, 64, seed=100 + i), params)
        print(f"round {i + 1}/{a.rounds}: {len(policy.steps)} steps, {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    rows = table(policy.steps, cal.costs, a.concurrency)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "load": os.getloadavg()[0], "drafter": a.drafter,
           "concurrency": a.concurrency, "pattern": a.pattern, "calibration": cal.describe(),
           "rows": [{"kappa": k, "place": p, "steps": n, "miss": m} for (k, p), (n, m) in rows.items()]}
    print(out["calibration"])
    print(f"{'kappa':>5} {'place':>6} {'steps':>6} {'measured / predicted':>21}")
    for (k, p), (n, m) in rows.items():
        print(f"{k:>5} {str(p) + ('+' if p == LAST_PLACE else ''):>6} {n:>6} {m:>21.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
