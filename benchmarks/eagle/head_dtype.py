"""The EAGLE head's dtype on this CPU: tokens/s of the engine with the head in float16, bfloat16 and float32.

    python benchmarks/eagle/head_dtype.py [--concurrency 1 16] [--rounds 3] [--out FILE]

The shipped pair (fp32 target, one torch thread), Chapter 9c's 16 held-out prompts x 48 greedy tokens,
`max_num_seqs` = concurrency. Per concurrency: plain decoding (no drafter), and the shipped head in each dtype at a
fixed kappa 3 (every step drafts) and at kappa 0 (the drafter bound, every step plain: what the head costs when no one
drafts, its prompt catch-up and feature capture). Rounds are interleaved; medians of rounds. Also the CPU's matrix
product of the head's LM head (4,096 x 256) at 1 and 16 rows in each dtype, a tight loop (what `draft_dtype` times).
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch

from speclab.eagle import eagle_drafter
from speclab.engine import SpecDecoder
from speclab.model import load_model, load_tokenizer
from speclab.request import SamplingParams
from speclab.sweep import sweep_prompts
from speclab.train import tiny_pair_path

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def product_ms(dtype: torch.dtype, rows: int, repeats: int = 200) -> float:
    "Milliseconds of rows x 256 @ (4,096 x 256)^T in dtype, the fastest of `repeats`."
    x, w = torch.randn(rows, 256, dtype=dtype), torch.randn(4096, 256, dtype=dtype)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x @ w.T
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if min(a.concurrency) < 1 or a.rounds < 1:
        ap.error("--concurrency and --rounds must be >= 1")
    torch.set_num_threads(1)
    target, tok = load_model(tiny_pair_path("target")), load_tokenizer(tiny_pair_path("target"))
    prompts, params = sweep_prompts(16), SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    engs = {}
    for c in a.concurrency:
        engs[(c, "plain")] = SpecDecoder(target, None, tok, kappa=0, max_num_seqs=c)
        for name, dt in DTYPES.items():
            for k in (3, 0):
                engs[(c, f"{name}/kappa{k}")] = SpecDecoder(target, eagle_drafter(target, dtype=dt), tok,
                                                            kappa=k, max_num_seqs=c)
    for eng in engs.values():
        eng.generate(prompts[:2], params)                                  # warm
    rates = {key: [] for key in engs}
    alpha = {}
    for r in range(a.rounds):
        for key, eng in engs.items():
            drafted, accepted = eng.metrics.num_draft_tokens, eng.metrics.num_accepted_tokens
            t0 = time.perf_counter()
            outs = eng.generate(prompts, params)
            rates[key].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
            d = eng.metrics.num_draft_tokens - drafted
            alpha[key] = (eng.metrics.num_accepted_tokens - accepted) / d if d else None
        print(f"round {r + 1} of {a.rounds} done", flush=True)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor(),
           "cpus": os.cpu_count(), "threads": 1, "rounds": a.rounds,
           "product_ms": {name: {rows: product_ms(dt, rows) for rows in (1, 16)} for name, dt in DTYPES.items()},
           "tokens_per_s": {}, "acceptance": {}}
    for c in a.concurrency:
        plain = statistics.median(rates[(c, "plain")])
        out["tokens_per_s"][c] = {key[1]: statistics.median(v) for key, v in rates.items() if key[0] == c}
        out["acceptance"][c] = {key[1]: v for key, v in alpha.items() if key[0] == c and v is not None}
        print(f"C = {c}: plain {plain:.1f} tokens/s")
        for name in DTYPES:
            k3, k0 = (statistics.median(rates[(c, f"{name}/kappa{k}")]) for k in (3, 0))
            print(f"  {name:>8}: kappa 3 {k3:7.1f} ({k3 / plain:.3f} of plain, acceptance "
                  f"{alpha[(c, name + '/kappa3')]:.3f}); kappa 0 {k0:7.1f} ({k0 / plain:.3f} of plain)")
    print("LM-head product, ms (1 row, 16 rows):", {n: [round(v, 3) for v in d.values()]
                                                   for n, d in out["product_ms"].items()})
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
