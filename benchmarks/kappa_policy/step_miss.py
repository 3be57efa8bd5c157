"""How far the calibration's step costs miss the engine's real decode steps, and what that does to the plan.

    python benchmarks/kappa_policy/step_miss.py [--drafter model] [--concurrency 1 4 16] [--json --out FILE]

On the shipped pair (fp32, one torch thread), `speclab.serve.calibrate` measures this machine's `StepCosts` for a
drafter, as `--kappa auto` does at start-up. Then fixed-kappa engines (plain, kappa 1, 2, 3) serve Chapter 9c's
held-out prompts in a closed loop of C clients x 4 requests (48 greedy tokens each) at each concurrency, and every
steady decode step (a full batch of C requests, all drafting kappa) is timed. Per (C, kappa): the measured median
step, the calibrated prediction for the same steps, their ratio, the acceptance rate, and the rate of a drafting step
over a plain one at the same C, measured (E / seconds, E from the steps' own acceptance) and predicted (the same E
over the predicted seconds). Where the two ratios straddle 1, the calibrated policy picks the wrong kind of step.
"""
import argparse
import dataclasses
import json
import os
import platform
import statistics
import time

import torch

from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.eagle import eagle_drafter
from speclab.engine import SpecDecoder
from speclab.model import load_model
from speclab.request import SamplingParams
from speclab.serve import calibrate
from speclab.sweep import sweep_prompts
from speclab.train import tiny_pair_path

KAPPAS = (0, 1, 2, 3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", choices=("model", "ngram", "eagle"), default="model")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (default 48)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    if min(a.concurrency) < 1 or a.tokens < 8:
        ap.error("--concurrency must be >= 1 and --tokens >= 8")
    return a


def make_drafter(name: str, target, draft):
    "A fresh drafter of a kind."
    return {"model": lambda: ModelDrafter(draft), "ngram": lambda: NgramDrafter(3),
            "eagle": lambda: eagle_drafter(target)}[name]()


def steady_steps(eng: SpecDecoder, prompts: list, params: SamplingParams, batch: int, kappa: int) -> list:
    "The StepTime of every decode step of a full batch in which every request drafted `kappa`."
    steps = []
    step = eng.step

    def timed():
        out = step()
        s = eng.last_step
        if s is not None and s.num_positions == batch * (1 + kappa) and s.num_drafting == (batch if kappa else 0):
            steps.append(s)
        return out

    eng.step = timed
    try:
        eng.generate(prompts, params)
    finally:
        del eng.step
    return steps


def cell(eng: SpecDecoder, costs, prompts: list, params: SamplingParams, batch: int, kappa: int) -> dict:
    "Measured and predicted seconds of one (concurrency, kappa)'s steady steps, and its acceptance."
    m0 = (eng.metrics.num_draft_tokens, eng.metrics.num_accepted_tokens)
    steps = steady_steps(eng, prompts, params, batch, kappa)
    drafted, accepted = eng.metrics.num_draft_tokens - m0[0], eng.metrics.num_accepted_tokens - m0[1]
    measured = statistics.median(s.seconds for s in steps) if steps else float("nan")
    predicted = statistics.median(costs.step_s(*s[:3], None, s.num_kv) for s in steps) if steps else float("nan")
    alpha = accepted / drafted if drafted else 0.0
    return {"steps": len(steps), "measured_s": measured, "predicted_s": predicted,
            "measured_over_predicted": measured / predicted, "alpha": alpha, "E": 1 + kappa * alpha}


def main(argv: list[str] | None = None) -> dict:
    "Calibrate, time the steady steps, print the table or the JSON."
    a = parse_args(argv)
    torch.set_num_threads(1)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    cal = calibrate(target, make_drafter(a.drafter, target, draft), max(KAPPAS) + 1)
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    cells = {}
    for c in a.concurrency:
        prompts = sweep_prompts(max(16, 4 * c), 64)
        for k in KAPPAS:
            eng = SpecDecoder(target, make_drafter(a.drafter, target, draft) if k else None, kappa=k,
                              max_num_seqs=c, seed=0, num_blocks=16 * c + 64)
            eng.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))        # warm
            cells[f"{c}/{k}"] = cell(eng, cal.costs, prompts, params, c, k)
            print(f"C = {c}, kappa {k}: {cells[f'{c}/{k}']['steps']} steady steps", flush=True)
    for c in a.concurrency:
        plain = cells[f"{c}/0"]
        for k in KAPPAS[1:]:
            x = cells[f"{c}/{k}"]
            x["gain_measured"] = x["E"] / x["measured_s"] * plain["measured_s"]
            x["gain_predicted"] = x["E"] / x["predicted_s"] * plain["predicted_s"]
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "threads": 1, "load": os.getloadavg()[0],
           "drafter": a.drafter, "calibration": cal.describe(), "costs": dataclasses.asdict(cal.costs), "cells": cells}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    if a.json:
        print(json.dumps(out, indent=1))
        return out
    print(cal.describe())
    print(f"{'C':>3} {'kappa':>5} {'steps':>5} {'measured ms':>11} {'predicted ms':>12} {'ratio':>6} {'alpha':>6} "
          f"{'gain measured':>13} {'gain predicted':>14}")
    for key, x in cells.items():
        c, k = key.split("/")
        gains = f"{x['gain_measured']:13.3f} {x['gain_predicted']:14.3f}" if k != "0" else ""
        print(f"{c:>3} {k:>5} {x['steps']:5d} {x['measured_s'] * 1e3:11.2f} {x['predicted_s'] * 1e3:12.2f} "
              f"{x['measured_over_predicted']:6.3f} {x['alpha']:6.3f} {gains}")
    return out


if __name__ == "__main__":
    main()
