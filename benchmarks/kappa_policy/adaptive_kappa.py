"""Tokens per second of plain decoding, fixed kappa and `--kappa auto` at each concurrency, per drafter.

    python benchmarks/kappa_policy/adaptive_kappa.py                                   # table
    python benchmarks/kappa_policy/adaptive_kappa.py --rounds 3 --json --out FILE      # also one JSON file

On the shipped tiny pair (fp32; `--threads`, by default `speclab serve`'s: every core but one), C clients each send
`--requests-per-client` held-out prompts (Chapter 9c's, at least 16 in all, new ones every round, so that no round
is served from the prefix cache of another) to engines with `max_num_seqs` = C (continuous batching), greedy,
`--tokens` new tokens each (with `--spread F`, each request's length drawn from tokens x [1 - F, 1 + F], the same
lengths for every engine). Per drafter (the draft model, n-gram lookup n <= 3, the shipped EAGLE head) the engines
are: kappa 1, 2 and 3 fixed, and what `speclab serve` builds for `--kappa auto`: `KappaPolicy.adaptive` on
`speclab.serve.calibrate` (this machine's costs, one calibration per drafter, recorded with the run with its
verdict; each request's live alpha; a trusted calibration's costs as they are, a refused one's refitted), kappa in
0..4. With `--refit`, also the same policy refitting the costs after every decode step (`learn=True`, the
calibration worth one step), side by side; with `--uncorrected`, also auto without the measured miss of each kind
of step (`KappaPolicy.correct` off: the costs as calibrated), side by side.
Plain decoding is shared by all drafters. Every engine is built once and warmed; in each round a concurrency's
engines run together, one step of each in turn, each timed by its own steps (`--interleave steps`), so a slow spell
of the machine, which lasts far longer than a step, slows them alike (`--interleave runs`: one engine's whole run
after another, as older records did). Medians over rounds; every ratio is of medians of the same run:

* auto / best: auto against max(plain, kappa 1, 2, 3), the issue's bar is 0.97;
* the same in the steady window: each engine's tokens and seconds of the steps it began with C or more unfinished
  requests (a round's last requests drain one by one, and do so later and more unevenly for drafting engines, whose
  requests finish at different steps, than for plain ones, whose requests of equal length finish together);
* by phase: auto against the best configuration in the steps that admit a prompt, the steady decode steps of a full
  batch, and the round's drain, each one's seconds and tokens per second;
* the calibration's predicted crossing (the batch from which plain is best at alpha = the drafter's measured
  acceptance at concurrency 1, kappa 3) next to the measured one (the first concurrency at which plain beats every
  fixed kappa).
"""
import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time

import torch

from speclab.cli import available_cores, serve_threads
from speclab.eagle import eagle_drafter
from speclab.request import SamplingParams
from speclab.drafters import ModelDrafter, NgramDrafter
from speclab.engine import SpecDecoder, cycle_collector_paused
from speclab.policy import KappaPolicy
from speclab.serve import calibrate
from speclab.model import load_model
from speclab.sweep import sweep_prompts
from speclab.train import tiny_pair_path

FIXED = (1, 2, 3)
PROMPT_SEED = 3                   # round i serves sweep_prompts(..., seed=PROMPT_SEED + i): new prompts every round
VARIANTS = ("auto", "refit", "uncorrected")     # the policy's engines: their kappa counts and costs are recorded
KAPPA_MAX = 4                     # speclab serve's AUTO_KAPPA_MAX
DRAFTERS = ("model", "ngram", "eagle")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="max_num_seqs values")
    ap.add_argument("--drafters", nargs="+", choices=DRAFTERS, default=list(DRAFTERS), help="drafters to run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (default 48)")
    ap.add_argument("--requests-per-client", type=int, default=4, help="each of the C clients' requests in a round: "
                    "max(16, this x C) prompts (default 4; 1 puts all 16 prompts of C = 16 in one batch, whose "
                    "slowest request then sets the time)")
    ap.add_argument("--spread", type=float, default=0.0, help="each request's new tokens drawn uniformly from "
                    "--tokens x [1 - this, 1 + this], the same draws for every engine (default 0: every request "
                    "--tokens long, so plain decoding's requests finish together)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: speclab serve's, every core "
                    "but one; older saved runs used 2)")
    ap.add_argument("--refit", action="store_true", help="also run auto refitting its costs (name/refit)")
    ap.add_argument("--uncorrected", action="store_true", help="also run auto without the measured miss of each "
                    "kind of step (name/uncorrected: KappaPolicy.correct off), side by side")
    ap.add_argument("--interleave", choices=("steps", "runs"), default="steps", help="steps (default): each round "
                    "runs a concurrency's engines together, one step of each in turn, each timed by its own steps, so "
                    "the machine's slow spells hit every engine alike; runs: one engine's whole run after another")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tokens < 4 or min(a.concurrency) < 1 or a.requests_per_client < 1:
        ap.error("--rounds, --concurrency and --requests-per-client must be >= 1, --tokens >= 4")
    if not 0 <= a.spread < 1 or round(a.tokens * (1 - a.spread)) < 1:
        ap.error("--spread must be in [0, 1) and leave every request at least one token")
    return a


def make_drafter(name: str, target, draft):
    "A fresh drafter of a kind (each engine binds its own)."
    if name == "model":
        return ModelDrafter(draft)
    if name == "ngram":
        return NgramDrafter(3)
    return eagle_drafter(target)


def engines(target, draft, cals: dict, concurrency: int, drafters: list[str], refit: bool,
            uncorrected: bool = False) -> dict:
    "Every engine of one concurrency: plain, then per drafter kappa 1, 2, 3 and auto (and its variants asked for)."
    common = dict(max_num_seqs=concurrency, seed=0, num_blocks=16 * concurrency + 64)
    out = {"plain": SpecDecoder(target, None, kappa=0, **common),
           "plain-again": SpecDecoder(target, None, kappa=0, **common)}   # the control: the noise of a ratio of twins
    for name in drafters:
        for k in FIXED:
            out[f"{name}/kappa{k}"] = SpecDecoder(target, make_drafter(name, target, draft), kappa=k, **common)
        policy = KappaPolicy.adaptive(cals[name].costs, trusted=cals[name].problem is None)
        out[f"{name}/auto"] = SpecDecoder(target, make_drafter(name, target, draft), kappa=KAPPA_MAX, **common,
                                          policy=policy)
        if uncorrected:
            out[f"{name}/uncorrected"] = SpecDecoder(target, make_drafter(name, target, draft), kappa=KAPPA_MAX,
                                                     **common, policy=dataclasses.replace(policy, correct=False))
        if refit:
            out[f"{name}/refit"] = SpecDecoder(target, make_drafter(name, target, draft), kappa=KAPPA_MAX, **common,
                                               policy=KappaPolicy(cals[name].costs, optimism=1.0, learn=True))
    return out


def snapshot(eng: SpecDecoder):
    "A copy of the engine's speculation counters, to subtract later (`since`)."
    return dataclasses.replace(eng.metrics, kappa_counts=list(eng.metrics.kappa_counts))


def since(eng: SpecDecoder, before, tokens: int, seconds: float) -> tuple[float, float, list]:
    "(tokens per second, acceptance rate, kappa counts) of what the engine did since `before`."
    m = eng.metrics
    drafted, accepted = m.num_draft_tokens - before.num_draft_tokens, m.num_accepted_tokens - before.num_accepted_tokens
    counts = [a - (before.kappa_counts[i] if i < len(before.kappa_counts) else 0) for i, a in enumerate(m.kappa_counts)]
    return tokens / seconds, accepted / drafted if drafted else float("nan"), counts


def lengths_params(tokens: int, spread: float, num: int, seed: int) -> list[SamplingParams]:
    """Greedy SamplingParams for `num` requests, each `tokens` new tokens, or with `spread` a length drawn uniformly
    from tokens x [1 - spread, 1 + spread] by a generator seeded with `seed` (every engine gets the same lengths)."""
    rng = random.Random(seed)
    low, high = round(tokens * (1 - spread)), round(tokens * (1 + spread))
    return [SamplingParams(temperature=0, max_tokens=rng.randint(low, high), ignore_eos=True) for _ in range(num)]


def run(eng: SpecDecoder, prompts: list, params: list[SamplingParams]) -> tuple[float, float, list, float, dict]:
    """(generated tokens per second, acceptance rate, kappa counts, the same rate, no phases) of one generate call over
    the prompts."""
    before = snapshot(eng)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    r = since(eng, before, sum(len(o.token_ids) for o in outs), time.perf_counter() - t0)
    return r + (r[0], {})                          # one whole run: no steady window or phases of its own


def run_together(engs: dict, names: list, prompts: list, params: list, concurrency: int) -> dict:
    """`run` for several engines at once: every engine gets the prompts, then they take one step each in turn until
    all are done, each engine's seconds its own steps' (a busy spell of the machine lasts far longer than a step, so
    it slows every engine alike). {name: (tokens per second, acceptance rate, kappa counts, steady tokens per
    second)}, the last counting only the steps an engine began with at least `concurrency` unfinished requests: the
    closed loop at its concurrency, before the round's last requests drain one by one; and the round's phases,
    {phase: [steps, seconds, tokens]} (`phase`)."""
    before = {n: snapshot(engs[n]) for n in names}
    for n in names:
        for prompt, sp in zip(prompts, params):
            engs[n].add_request(prompt, sp)
    seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    steady = {n: [0, 0.0] for n in names}
    phases = {n: {} for n in names}
    with cycle_collector_paused():
        while any(engs[n].has_unfinished() for n in names):
            for n in names:
                if engs[n].has_unfinished():
                    full = len(engs[n].requests) >= concurrency
                    t0 = time.perf_counter()
                    outs = engs[n].step()
                    dt = time.perf_counter() - t0
                    emitted = sum(len(o.new_token_ids) for o in outs)
                    seconds[n] += dt
                    tokens[n] += emitted
                    if full:
                        steady[n][0] += emitted
                        steady[n][1] += dt
                    tally = phases[n].setdefault(phase(engs[n].last_step, full), [0, 0.0, 0])
                    tally[0] += 1
                    tally[1] += dt
                    tally[2] += emitted
    return {n: since(engs[n], before[n], tokens[n], seconds[n]) + (steady[n][0] / steady[n][1], phases[n])
            for n in names}


def phase(step, full: bool) -> str:
    """Where a step falls in a closed-loop round: "admit" if it computed a prompt (more target positions than its
    requests' one each plus their drafts), else "decode" if it began with the concurrency's requests unfinished,
    else "drain" (the round's last requests, fewer than C)."""
    if step.num_positions > step.num_requests * (1 + step.kappa):
        return "admit"
    return "decode" if full else "drain"


def sum_phases(rounds) -> dict:
    "Every round's phases added up: {phase: [steps, seconds, tokens]}."
    total = {}
    for phases in rounds:
        for name, tally in phases.items():
            total[name] = [a + b for a, b in zip(total.get(name, [0, 0.0, 0]), tally)]
    return total


def phase_line(phases: dict, auto: str, best: str) -> str:
    """Auto against the best configuration phase by phase: each one's seconds and tokens per second there (where a
    policy loses: the batch's steady decode steps, the steps that admit a prompt, or the round's drain)."""
    parts = []
    for name in ("decode", "admit", "drain"):
        a, b = phases[auto].get(name, [0, 0.0, 0]), phases[best].get(name, [0, 0.0, 0])
        parts.append(f"{name} {a[1]:.2f} s / {b[1]:.2f} s, {a[2] / a[1] if a[1] else 0:.0f} / "
                     f"{b[2] / b[1] if b[1] else 0:.0f} tokens/s")
    return "; ".join(parts)


def crossings(med: dict, alpha: dict, costs: dict, drafters: list[str]) -> dict:
    "Per drafter: the predicted crossing (calibrated costs, measured alpha) and the measured one."
    out = {}
    for name in drafters:
        measured = next((c for c, m in med.items() if m["plain"] >= max(m[f"{name}/kappa{k}"] for k in FIXED)), None)
        a = alpha[name]
        predicted = costs[name].crossing(a, max(FIXED)) if 0 < a < 1 else None
        out[name] = {"alpha": a, "predicted": predicted, "measured": measured}
    return out


def best_name(med: dict, name: str) -> str:
    "The configuration with the highest median among plain and the drafter's fixed kappas."
    return max(["plain"] + [f"{name}/kappa{k}" for k in FIXED], key=lambda key: med[key])


def paired_ratios(runs: dict, num: str, den: str) -> dict:
    """num / den of the same round (run minutes apart, so a slow spell of the machine hits both), over the rounds:
    median, min and max."""
    r = [x[0] / y[0] for x, y in zip(runs[num], runs[den])]
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r}


def main(argv: list[str] | None = None) -> dict:
    "Run the grid; print the table or the JSON."
    a = parse_args(argv)
    torch.set_num_threads(a.threads or serve_threads(available_cores()))
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    cals = {name: calibrate(target, make_drafter(name, target, draft), KAPPA_MAX) for name in a.drafters}
    costs = {name: cal.costs for name, cal in cals.items()}
    # fresh held-out prompts every round: the same prompts again would be prefix-cache hits from the second round on,
    # which spare plain decoding its prefills and not a policy's draft (Chapter 8: the draft waits for its first draft)
    prompts = {c: [sweep_prompts(max(16, a.requests_per_client * c), 64, seed=PROMPT_SEED + i) for i in range(a.rounds)]
               for c in a.concurrency}
    params = {c: [lengths_params(a.tokens, a.spread, len(p), PROMPT_SEED + i) for i, p in enumerate(ps)]
              for c, ps in prompts.items()}
    grid = {c: engines(target, draft, cals, c, a.drafters, a.refit, a.uncorrected) for c in a.concurrency}
    warm = sweep_prompts(2, 64, seed=PROMPT_SEED - 1)                   # prompts no round serves
    for engs in grid.values():
        for eng in engs.values():
            eng.generate(warm, SamplingParams(temperature=0, max_tokens=4))
    runs = {c: {name: [] for name in engs} for c, engs in grid.items()}
    loads = [os.getloadavg()[0]]
    start = time.perf_counter()
    for i in range(a.rounds):
        for c, engs in grid.items():
            order = list(engs) if i % 2 == 0 else list(engs)[::-1]      # drift in the machine hits all alike
            if a.interleave == "steps":
                for name, r in run_together(engs, order, prompts[c][i], params[c][i], c).items():
                    runs[c][name].append(r)
            else:
                for name in order:
                    runs[c][name].append(run(engs[name], prompts[c][i], params[c][i]))
            print(f"round {i + 1}/{a.rounds}, concurrency {c}: {len(engs)} engines done, "
                  f"{time.perf_counter() - start:.0f} s so far", file=sys.stderr, flush=True)
        loads.append(os.getloadavg()[0])
    med = {c: {name: statistics.median(r[0] for r in v) for name, v in rs.items()} for c, rs in runs.items()}
    chosen = {c: {name: [sum(x) for x in zip(*(r[2] for r in v))] for name, v in rs.items()
                  if name.endswith(VARIANTS)}
              for c, rs in runs.items()}
    alpha = {name: statistics.median(r[1] for r in runs[min(runs)][f"{name}/kappa3"]) for name in a.drafters}
    best = {c: {name: max([m["plain"]] + [m[f"{name}/kappa{k}"] for k in FIXED]) for name in a.drafters}
            for c, m in med.items()}
    ratio = {name: {c: m[f"{name}/auto"] / best[c][name] for c, m in med.items()} for name in a.drafters}
    steady = {c: {name: statistics.median(r[3] for r in v) for name, v in rs.items()} for c, rs in runs.items()}
    phases = {c: {name: sum_phases(r[4] for r in v) for name, v in rs.items()} for c, rs in runs.items()}
    steady_ratio = {name: {c: m[f"{name}/auto"] / max([m["plain"]] + [m[f"{name}/kappa{k}"] for k in FIXED])
                           for c, m in steady.items()} for name in a.drafters}
    paired = {name: {c: paired_ratios(runs[c], f"{name}/auto", best_name(med[c], name)) for c in med}
              for name in a.drafters}
    control = {c: paired_ratios(runs[c], "plain-again", "plain") for c in med}
    refit = {name: {c: m[f"{name}/refit"] / best[c][name] for c, m in med.items()} for name in a.drafters} \
        if a.refit else None
    uncorrected = {name: {c: m[f"{name}/uncorrected"] / best[c][name] for c, m in med.items()} for name in a.drafters} \
        if a.uncorrected else None
    learned = {c: {name: dataclasses.asdict(eng.scheduler.policy.costs) for name, eng in engs.items()
                   if name.endswith(VARIANTS)} for c, engs in grid.items()}
    misses = {c: {name: {b: {k: list(eng.scheduler.policy.miss(2 ** (b - 1), k)) for k in sorted(depths)}
                         for b, depths in eng.scheduler.policy.misses.items()}
                  for name, eng in engs.items() if name.endswith(VARIANTS)} for c, engs in grid.items()}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "load": loads,
           "tokens": a.tokens, "spread": a.spread, "rounds": a.rounds,
           "prompts": {c: len(p[0]) for c, p in prompts.items()},
           "prompt_seeds": [PROMPT_SEED + i for i in range(a.rounds)],
           "calibration_s": {n: cal.seconds for n, cal in cals.items()},
           "calibration_problem": {n: cal.problem for n, cal in cals.items()},
           "costs": {n: dataclasses.asdict(c) for n, c in costs.items()}, "learned_costs": learned,
           "tokens_per_s": med, "auto_over_best": ratio, "auto_over_best_paired": paired, "control_paired": control,
           "order": "engines in list order in even rounds, reversed in odd ones", "interleave": a.interleave,
           "refit_over_best": refit, "steady_tokens_per_s": steady, "steady_auto_over_best": steady_ratio,
           "phases": phases,
           "uncorrected_over_best": uncorrected, "misses": misses, "kappa_counts": chosen,
           "crossing": crossings(med, alpha, costs, a.drafters)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    if a.json:
        print(json.dumps(out, indent=1))
        return out
    for name in a.drafters:
        print(f"{name}: {cals[name].describe()}")
        cols = ["plain"] + [f"{name}/kappa{k}" for k in FIXED] + [f"{name}/auto"]
        cols += [f"{name}/refit"] if refit else []
        cols += [f"{name}/uncorrected"] if uncorrected else []
        print(f"{'concurrency':>11} " + " ".join(f"{c.split('/')[-1]:>9}" for c in cols) + "  auto / best" +
              ("  refit / best" if refit else "") + ("  uncorrected / best" if uncorrected else ""))
        for c, m in med.items():
            print(f"{c:>11} " + " ".join(f"{m[col]:9.1f}" for col in cols) + f"  {ratio[name][c]:.3f}" +
                  (f"  {refit[name][c]:.3f}" if refit else "") +
                  (f"  {uncorrected[name][c]:.3f}" if uncorrected else ""))
        print("steady window (C requests in flight), auto / best: " + "  ".join(
            f"{c}: {r:.3f}" for c, r in steady_ratio[name].items()))
        if a.interleave == "steps":
            for c in med:
                print(f"{c:>11} auto / {best_name(med[c], name)} by phase: "
                      f"{phase_line(phases[c], f'{name}/auto', best_name(med[c], name))}")
        print(f"crossing: {out['crossing'][name]}")
        print("auto / best, round by round (median [min, max]): " + "  ".join(
            f"{c}: {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}]" for c, r in paired[name].items()))
    print("control, plain-again / plain round by round: " + "  ".join(
        f"{c}: {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}]" for c, r in control.items()))
    return out


if __name__ == "__main__":
    main()
