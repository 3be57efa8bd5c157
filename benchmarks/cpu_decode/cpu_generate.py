"""Plain generation on a CPU: speclab.model.generate and speclab's engine with no drafter, against transformers'
generate, same weights, same prompts.

    python benchmarks/cpu_decode/cpu_generate.py                        # the shipped tiny target, 8 prompts x 128 new tokens
    python benchmarks/cpu_decode/cpu_generate.py --model DIR --json     # any local Llama checkpoint folder

All three run greedy in fp32 with the same number of threads, alternating prompt by prompt so that a busy machine
slows all alike. speclab.model.generate decodes through the contiguous cache of Chapter 7; the engine
(speclab.engine.SpecDecoder with no drafter) through the paged cache, with its scheduler and sampler around every
step. Each prompt is a window of held-out standard-library source (the tiny pair's held-out split). Reports tokens/s
per implementation (median over prompts), the ratios to transformers, and how many generated tokens agree with it.
"""
import argparse
import json
import statistics
import sys
import time

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the shipped tiny target)")
    ap.add_argument("--prompts", type=int, default=8, help="number of held-out prompts (default 8)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    for k in ("prompts", "prompt_len", "new_tokens"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.threads is not None and a.threads < 1:
        ap.error("--threads must be >= 1")
    return a


def agreeing(mine: list[int], theirs: list[int]) -> int:
    "Tokens before the first divergence."
    return next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))


def main(argv: list[str] | None = None) -> dict:
    "Time the three implementations prompt by prompt and report."
    a = parse_args(argv)
    from transformers import AutoModelForCausalLM
    from speclab.request import SamplingParams
    from speclab.engine import SpecDecoder
    from speclab.model import generate, load_model
    from speclab.train import eval_prompts, tiny_pair_path
    if a.threads:
        torch.set_num_threads(a.threads)
    load_before = load_average()
    folder = a.model or str(tiny_pair_path("target"))
    ours = load_model(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    engine = SpecDecoder(ours, None, kappa=0, enable_prefix_caching=False)
    prompts = eval_prompts(n=a.prompts, prompt_len=a.prompt_len)
    n = a.new_tokens
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    hf_kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    runs = {
        "speclab.generate": lambda ids: generate(ours, None, ids, n, temperature=0),
        "speclab engine": lambda ids: engine.generate([ids], sp)[0].token_ids,
        "transformers": lambda ids: hf.generate(torch.tensor([ids]), **hf_kw)[0, len(ids):].tolist(),
    }
    for fn in runs.values():                                    # warm-up, all three
        with torch.no_grad():
            fn(prompts[0][:16])
    rate = {r: [] for r in runs}
    same = {r: 0 for r in runs}
    for ids in prompts:
        outs = {}
        for r, fn in runs.items():
            with torch.no_grad():
                t = time.perf_counter()
                outs[r] = fn(ids)
                rate[r].append(len(outs[r]) / (time.perf_counter() - t))
        for r in runs:
            same[r] += agreeing(outs[r], outs["transformers"])
    med = {r: statistics.median(v) for r, v in rate.items()}
    res = {"date": utc_now(),
           "machine": machine(),
           "load_average_before": load_before, "load_average_after": load_average(),
           "torch": torch.__version__, "model": folder,
           "command": "python benchmarks/cpu_decode/cpu_generate.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": n,
           "tok_s": {r: round(v, 1) for r, v in med.items()},
           "ratio_to_transformers": {r: round(v / med["transformers"], 3) for r, v in med.items()},
           "identical_prefix_fraction": {r: round(same[r] / (n * a.prompts), 4) for r in runs}}
    if a.json:
        print(json.dumps(res))
        return res
    print(f"greedy fp32, {a.prompts} prompts x {n} new tokens ({a.prompt_len}-token prompts), {res['machine']}, "
          f"load average {res['load_average_before']} -> {res['load_average_after']}")
    for r in runs:
        print(f"  {r:<18} {res['tok_s'][r]:8.1f} tok/s  {res['ratio_to_transformers'][r]:5.2f}x transformers  "
              f"tokens identical to transformers' up to the first divergence: "
              f"{100 * res['identical_prefix_fraction'][r]:.1f}%")
    return res


if __name__ == "__main__":
    main()
