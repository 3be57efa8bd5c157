"""The paged cache's view for a request whose blocks are consecutive (Chapter 7's `key_start`) against the gather it
replaces, and both against `speclab.model.generate` (the contiguous cache), at batch 1 on the shipped pair.

    python benchmarks/cpu_decode/paged_view.py                      # plain and speculative (kappa 3) decoding, 1 thread

Each round decodes the same held-out prompts greedily through: `generate`; the engine with no drafter (view, then
gather); the engine with the draft model (view, then gather). "gather" is the same engine with
`speclab.model._consecutive_start` patched to return None, so every step gathers its keys with `index_select` as
before the view existed. Rounds alternate, so a busy machine slows all alike; tokens/s are medians over rounds, and
every run's tokens must equal `generate`'s. A measurement, not a test.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import speclab.model as model_mod
from speclab.request import SamplingParams
from speclab.drafters import ModelDrafter
from speclab.engine import SpecDecoder
from speclab.model import generate, load_model, load_tokenizer
from speclab.train import shipped_heldout_ids, tiny_pair_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402


def timed(fn):
    "(result, seconds) of fn()."
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def engine_run(target, draft, tok, prompts, new_tokens, view):
    "Greedy through a fresh engine; view=False patches the view away. (token lists, seconds)."
    original = model_mod._consecutive_start
    if not view:
        model_mod._consecutive_start = lambda *a: None
    try:
        eng = SpecDecoder(target, ModelDrafter(draft) if draft is not None else None, tok, kappa=3, seed=0)
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        outs, secs = [], 0.0
        for p in prompts:
            out, s = timed(lambda: eng.generate([p], params))
            outs.append(out[0].token_ids)
            secs += s
        return outs, secs
    finally:
        model_mod._consecutive_start = original


def generate_run(target, prompts, new_tokens):
    "Greedy through speclab.model.generate, one prompt at a time. (token lists, seconds)."
    outs, secs = [], 0.0
    for p in prompts:
        out, s = timed(lambda: generate(target, None, p, new_tokens, temperature=0.0))
        outs.append(list(out))
        secs += s
    return outs, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    tok = load_tokenizer(tiny_pair_path("target"))
    ids = shipped_heldout_ids()
    step = len(ids) // a.prompts
    prompts = [ids[i * step:i * step + a.prompt_len].tolist() for i in range(a.prompts)]
    load0 = load_average()
    runs = {"generate": [], "plain, view": [], "plain, gather": [], "spec, view": [], "spec, gather": []}
    ref = None
    for r in range(a.rounds):
        ref, s = generate_run(target, prompts, a.new_tokens)
        runs["generate"].append(s)
        for name, d in (("plain", None), ("spec", draft)):
            for view in ((True, False) if r % 2 == 0 else (False, True)):       # which goes first alternates too
                outs, s = engine_run(target, d, tok, prompts, a.new_tokens, view)
                assert outs == ref, f"{name} ({'view' if view else 'gather'}) differs from generate"
                runs[f"{name}, {'view' if view else 'gather'}"].append(s)
    n = a.prompts * a.new_tokens
    tps = {k: n / statistics.median(v) for k, v in runs.items()}
    print(f"{utc_now()}, {machine()}, load {load0} -> {load_average()}; "
          f"{a.prompts} prompts x {a.new_tokens} tokens, greedy, {a.rounds} alternating rounds, medians")
    print("| run | tok/s | vs generate |\n|---|---|---|")
    for k, v in tps.items():
        print(f"| {k} | {v:.1f} | {v / tps['generate']:.3f}x |")
    print(f"view over gather: plain {tps['plain, view'] / tps['plain, gather']:.3f}x, "
          f"spec {tps['spec, view'] / tps['spec, gather']:.3f}x; every run's tokens equal generate's")


if __name__ == "__main__":
    main()
