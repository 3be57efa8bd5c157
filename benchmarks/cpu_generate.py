"""Plain generation on a CPU: speclab.model.generate against transformers' generate, same weights, same prompts.

    python benchmarks/cpu_generate.py                        # the shipped tiny target, 8 prompts x 128 new tokens
    python benchmarks/cpu_generate.py --model DIR --json     # any local Llama checkpoint folder

Both run greedy in fp32 with the same number of threads, alternating prompt by prompt so that a busy machine slows
both alike. Each prompt is a window of held-out standard-library source (the tiny pair's held-out split). Reports
tokens/s per implementation (median over prompts), the ratio, and how many generated tokens agree.
"""
import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone

import torch


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the shipped tiny target)")
    ap.add_argument("--prompts", type=int, default=8, help="number of held-out prompts (default 8)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    for k in ("prompts", "prompt_len", "new_tokens"):
        if getattr(a, k) < 1: ap.error(f"--{k.replace('_', '-')} must be >= 1")
    return a


def main(argv=None):
    a = parse_args(argv)
    from transformers import AutoModelForCausalLM
    from speclab.model import generate, load_model, load_tokenizer
    from speclab.train import eval_prompts, tiny_pair_path
    if a.threads: torch.set_num_threads(a.threads)
    folder = a.model or str(tiny_pair_path("target"))
    ours, tok = load_model(folder), load_tokenizer(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = eval_prompts(n=a.prompts, prompt_len=a.prompt_len)
    n = a.new_tokens
    generate(ours, None, prompts[0], 8, temperature=0)                                   # warm-up, both
    hf.generate(torch.tensor([prompts[0]]), max_new_tokens=8, do_sample=False, pad_token_id=0)
    rate = {"speclab": [], "transformers": []}
    same = total = 0
    for ids in prompts:
        t = time.perf_counter(); mine = generate(ours, None, ids, n, temperature=0); rate["speclab"].append(n / (time.perf_counter() - t))
        with torch.no_grad():
            t = time.perf_counter()
            theirs = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            rate["transformers"].append(n / (time.perf_counter() - t))
        theirs = theirs[0, len(ids):].tolist()
        k = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), n)   # tokens before the first divergence
        same += k; total += n
    med = {k: statistics.median(v) for k, v in rate.items()}
    res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
           f"{torch.get_num_threads()} torch threads", "torch": torch.__version__, "model": folder,
           "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": n,
           "speclab_tok_s": round(med["speclab"], 1), "transformers_tok_s": round(med["transformers"], 1),
           "ratio": round(med["speclab"] / med["transformers"], 3), "identical_prefix_fraction": round(same / total, 4)}
    if a.json: print(json.dumps(res))
    else:
        print(f"greedy fp32, {a.prompts} prompts x {n} new tokens ({a.prompt_len}-token prompts), {res['machine']}")
        print(f"  speclab.generate       {res['speclab_tok_s']:8.1f} tok/s")
        print(f"  transformers.generate  {res['transformers_tok_s']:8.1f} tok/s")
        print(f"  ratio                  {res['ratio']:8.2f}x")
        print(f"  tokens identical up to the first divergence: {100 * res['identical_prefix_fraction']:.1f}%")
    return res


if __name__ == "__main__": main()
