"""How much `measure_step_costs` moves from one calibration to the next: the single fastest step of each cell (the
former rule: 6 steps, `fastest=1`) against the fastest half (the default: 12 steps,
`fastest=6`), interleaved, on the shipped pair.

    python benchmarks/kappa_policy/calibration_spread.py                    # 3 calibrations per rule and drafter
    python benchmarks/kappa_policy/calibration_spread.py --repeats 5 --out benchmarks/kappa_policy/calibration_spread.json

Per drafter (n-gram lookup n <= 3, the draft model; kappa_max 4, as `speclab serve`) and rule, the script calibrates
`--repeats` times, the rules taking turns, with `speclab serve`'s torch threads (every core but one), and prints each
fitted cost (ms) per calibration, then its spread (max - min) per rule, and the crossing each calibration predicts at
alpha 0.5. No timing is asserted.
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

RULES = {"fastest step of 6": dict(steps=6, fastest=1), "fastest half of 12": dict(steps=12, fastest=6)}


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line."
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="calibrations per rule and drafter (3)")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    return a


def main(argv: list | None = None) -> int:
    "Calibrate, print, write."
    from speclab.cli import available_cores, serve_threads
    from speclab.drafters import ModelDrafter, NgramDrafter
    from speclab.policy import measure_step_costs
    from speclab.model import load_model
    from speclab.train import tiny_pair_path
    a = parse_args(argv)
    torch.set_num_threads(serve_threads(available_cores()))
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    drafters = {"ngram": lambda: NgramDrafter(3), "draft model": lambda: ModelDrafter(draft)}
    meta = {"date": utc_now(), "machine": machine(), "threads": torch.get_num_threads(), "command": " ".join(sys.argv),
            "load_before": load_average()}
    runs = {f"{d}/{r}": [] for d in drafters for r in RULES}
    for rep in range(a.repeats):
        for d, make in drafters.items():
            for r, kw in (RULES.items() if rep % 2 == 0 else list(RULES.items())[::-1]):
                t0 = time.perf_counter()
                costs = measure_step_costs(target, make(), 4, **kw)
                runs[f"{d}/{r}"].append({**dataclasses.asdict(costs), "seconds": time.perf_counter() - t0,
                                         "crossing": costs.crossing(0.5, 4)})
    meta["load_after"] = load_average()
    names = ("verify_s", "verify_token_s", "draft_s", "draft_request_s", "spec_s")
    print(f"measure_step_costs, {a.repeats} calibrations per rule, {meta['threads']} torch thread(s), load "
          f"{meta['load_before']} -> {meta['load_after']}; ms: " + ", ".join(names) + "; crossing at alpha 0.5")
    spread = {}
    for key, rows in runs.items():
        for row in rows:
            print(f"{key:32s} " + " ".join(f"{1e3 * row[n]:6.2f}" for n in names) + f"   crossing {row['crossing']}"
                  f"   ({row['seconds']:.1f} s)")
        spread[key] = {n: 1e3 * (max(r[n] for r in rows) - min(r[n] for r in rows)) for n in names}
        print(f"{key:32s} spread (max - min): " + " ".join(f"{spread[key][n]:6.2f}" for n in names))
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "runs": runs, "spread_ms": spread}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
