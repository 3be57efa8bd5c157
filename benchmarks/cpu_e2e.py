"""End to end on a CPU, side by side in one run: plain decoding, speclab with the draft model and with n-gram lookup,
and transformers' assisted generation (assistant_model=...) and prompt lookup, on the same prompts and models.

    python benchmarks/cpu_e2e.py                       # the shipped tiny pair, 8 held-out prompts x 128 tokens, greedy
    python benchmarks/cpu_e2e.py --kappa 4 --json      # another kappa; one JSON object

All runs are greedy in fp32, batch 1, one prompt at a time, the implementations interleaved prompt by prompt so that a
busy machine slows all alike. Reports tokens/s (total tokens / total seconds), the ratio to plain decoding, speclab's
acceptance (mean acceptance length, per-token alpha), the measured cost ratio c (draft step / target step, median
single-token steps), and the predicted speedup E(alpha, kappa) / (1 + kappa c) next to the measured one, and beside it
E / (v + kappa c) with v the measured cost of a (kappa + 1)-token verify forward in target steps (Chapter 2 takes v = 1,
true where a step is bound by streaming the weights; on a CPU the tiny pair's step is per-operation overhead and
arithmetic, and v > 1).
"""
import argparse
import json
import platform
import time
from datetime import datetime, timezone

import torch


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--kappa", type=int, default=3)
    ap.add_argument("--ngram", type=int, default=3, help="n-gram size for both prompt-lookup drafters")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for k in ("prompts", "prompt_len", "new_tokens", "kappa", "ngram"):
        if getattr(a, k) < 1: ap.error(f"--{k.replace('_', '-')} must be >= 1")
    return a


def main(argv=None):
    a = parse_args(argv)
    from transformers import AutoModelForCausalLM
    from speclab.engine import ModelDrafter, NgramDrafter, SamplingParams, SpecDecoder
    from speclab.model import generate, load_model, load_tokenizer
    from speclab.proof import expected_tokens
    from speclab.train import decode_step_seconds, eval_prompts, tiny_pair_path
    if a.threads: torch.set_num_threads(a.threads)
    tdir, ddir = str(tiny_pair_path("target")), str(tiny_pair_path("draft"))
    target, draft, tok = load_model(tdir), load_model(ddir), load_tokenizer(tdir)
    hf_t = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
    prompts = eval_prompts(n=a.prompts, prompt_len=a.prompt_len, seed=11)
    n, k = a.new_tokens, a.kappa
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    eng_d = SpecDecoder(target, ModelDrafter(draft), tok, kappa=k)
    eng_n = SpecDecoder(target, NgramDrafter(a.ngram), tok, kappa=k)
    hf_kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    runs = {
        "plain (speclab.model.generate)": lambda ids: generate(target, None, ids, n, temperature=0),
        "speclab, draft model": lambda ids: eng_d.generate([ids], sp)[0].token_ids,
        "speclab, n-gram": lambda ids: eng_n.generate([ids], sp)[0].token_ids,
        "transformers, assistant_model": lambda ids: hf_t.generate(torch.tensor([ids]), assistant_model=hf_d, **hf_kw)[0, len(ids):].tolist(),
        "transformers, prompt lookup": lambda ids: hf_t.generate(torch.tensor([ids]), prompt_lookup_num_tokens=k, max_matching_ngram_size=a.ngram, **hf_kw)[0, len(ids):].tolist(),
        "transformers, plain": lambda ids: hf_t.generate(torch.tensor([ids]), **hf_kw)[0, len(ids):].tolist(),
    }
    hf_d.generation_config.num_assistant_tokens = k
    hf_d.generation_config.num_assistant_tokens_schedule = "constant"
    for fn in runs.values(): fn(prompts[0][:16])                          # warm-up
    eng_d.metrics.__init__(); eng_n.metrics.__init__()
    secs, toks, outs = {r: 0.0 for r in runs}, {r: 0 for r in runs}, {r: [] for r in runs}
    for ids in prompts:
        for r, fn in runs.items():
            with torch.no_grad():
                t = time.perf_counter(); out = fn(ids); secs[r] += time.perf_counter() - t
            toks[r] += len(out); outs[r].append(out)
    t_step, d_step = decode_step_seconds(target, context=a.prompt_len + n // 2), decode_step_seconds(draft, context=a.prompt_len + n // 2)
    c = d_step / t_step
    v = decode_step_seconds(target, context=a.prompt_len + n // 2, block=k + 1) / t_step   # a (kappa+1)-token verify, in target steps
    rate = {r: toks[r] / secs[r] for r in runs}
    plain = rate["plain (speclab.model.generate)"]
    m = eng_d.metrics
    alpha = m.acceptance_rate
    res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
           "torch": torch.__version__, "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": n, "kappa": k,
           "tokens_per_s": {r: round(v, 1) for r, v in rate.items()},
           "ratio_to_plain": {r: round(v / plain, 3) for r, v in rate.items()},
           "speclab_vs_transformers_assisted": round(rate["speclab, draft model"] / rate["transformers, assistant_model"], 3),
           "identical_to_plain": {r: sum(o == p for o, p in zip(outs[r], outs["plain (speclab.model.generate)"])) for r in runs},
           "draft_mean_acceptance_length": round(m.mean_acceptance_length, 3), "alpha": round(alpha, 4),
           "per_position": [round(x, 3) for x in m.per_position], "ngram_mean_acceptance_length": round(eng_n.metrics.mean_acceptance_length, 3),
           "target_step_ms": round(t_step * 1e3, 3), "draft_step_ms": round(d_step * 1e3, 3), "c": round(c, 4),
           "predicted_speedup_from_alpha": round(float(expected_tokens(alpha, k)) / (1 + k * c), 3),
           "predicted_speedup_from_E": round(m.mean_acceptance_length / (1 + k * c), 3),
           "verify_cost_in_steps": round(v, 3), "predicted_speedup_measured_verify": round(m.mean_acceptance_length / (v + k * c), 3),
           "measured_speedup": round(rate["speclab, draft model"] / plain, 3), "log_line": m.log_line()}
    if a.json: print(json.dumps(res)); return res
    print(f"greedy fp32, batch 1, {a.prompts} held-out prompts x {n} new tokens, kappa = {k}, {res['machine']}\n")
    print(f"  {'run':<34} {'tok/s':>8} {'x plain':>8} {'same as plain':>14}")
    for r in runs: print(f"  {r:<34} {rate[r]:8.1f} {rate[r] / plain:8.2f} {res['identical_to_plain'][r]:>10}/{a.prompts}")
    print(f"\n  {m.log_line()}")
    print(f"  n-gram: mean acceptance length {res['ngram_mean_acceptance_length']:.2f}")
    print(f"  target step {res['target_step_ms']:.2f} ms, draft step {res['draft_step_ms']:.2f} ms: c = {c:.3f}")
    print(f"  predicted speedup E/(1 + kappa c): {res['predicted_speedup_from_alpha']:.2f}x from alpha = {alpha:.3f} "
          f"(iid), {res['predicted_speedup_from_E']:.2f}x from the measured E; measured {res['measured_speedup']:.2f}x")
    print(f"  a {k + 1}-token verify costs {v:.2f} target steps here (Chapter 2 charges it 1): E/(v + kappa c) = "
          f"{res['predicted_speedup_measured_verify']:.2f}x")
    print(f"  speclab (draft model) vs transformers assisted generation: {res['speclab_vs_transformers_assisted']:.2f}x")
    return res


if __name__ == "__main__": main()
