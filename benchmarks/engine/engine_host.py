"""The engine's host time, before and after issue 26's plan / runner / update split, side by side in one run.

    python benchmarks/engine_host.py                     # before = REF (a git revision), after = this checkout
    python benchmarks/engine_host.py --ref f81bdbf --rounds 2 --json

On the shipped tiny pair (fp32, one torch thread), each side runs in its own process (the old side from a git
worktree of REF, made under /tmp), alternating old, new, old, new so that a busy machine slows both alike. Per side:

- host time per speculative step (draft model, kappa 3, greedy) at batch 1 and 16, split into the forwards (every
  `forward_paged` call, target and draft), the sampler, and the rest: scheduling, block manager, metadata, processors,
  the update, text;
- plain decoding through the engine (no drafter) vs `speclab.model.generate` at batch 1, tokens/s each and the ratio;
- speculative vs plain through the engine at batch 1.
Medians over rounds; ratios new / old computed from the medians of the same run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="f81bdbf", help="git revision of the 'before' engine (default f81bdbf)")
    ap.add_argument("--new", default=None, help="git revision of the 'after' engine (default: this checkout)")
    ap.add_argument("--rounds", type=int, default=2, help="old/new alternations (default 2)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per request (default 96)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tokens < 8:
        ap.error("--rounds must be >= 1 and --tokens >= 8")
    return a


def timed(fn, bucket: list):
    "fn, adding each call's seconds to bucket[0]."
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        bucket[0] += time.perf_counter() - t0
        return out
    return wrapper


def step_split(target, draft, prompts: list, tokens: int) -> dict:
    "ms per step: total, forwards, sampler, rest, for one speculative generate over `prompts`."
    import speclab.engine as engine
    from speclab.engine import ModelDrafter, SamplingParams, SpecDecoder
    fwd, smp = [0.0], [0.0]
    original = engine.forward_paged
    engine.forward_paged = timed(original, fwd)
    try:
        eng = SpecDecoder(target, ModelDrafter(draft), kappa=3, max_num_seqs=len(prompts))
        holder = eng if getattr(eng, "runner", None) is None else eng.runner   # the runner holds it since issue 40
        holder.sampler = timed(holder.sampler, smp)
        t0 = time.perf_counter()
        eng.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        total = time.perf_counter() - t0
    finally:
        engine.forward_paged = original
    steps = eng.stats["steps"]
    ms = {"total": total, "forwards": fwd[0], "sampler": smp[0]}
    ms = {k: 1e3 * v / steps for k, v in ms.items()}
    ms["rest"] = ms["total"] - ms["forwards"] - ms["sampler"]
    ms["steps"] = steps
    return ms


def tokens_per_s(fn, prompts: list, tokens: int) -> float:
    "Generated tokens per second of fn(prompt) over the prompts, one at a time."
    t0 = time.perf_counter()
    for p in prompts:
        fn(p)
    return len(prompts) * tokens / (time.perf_counter() - t0)


def worker(tokens: int) -> dict:
    "Every figure of one side (the speclab on sys.path)."
    import torch
    from speclab.engine import ModelDrafter, SamplingParams, SpecDecoder
    from speclab.model import generate, load_model
    from speclab.train import eval_prompts, tiny_pair_path
    torch.set_num_threads(1)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    prompts = eval_prompts(n=16, prompt_len=48, seed=5)
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    out = {"batch1": step_split(target, draft, prompts[:1], tokens),
           "batch16": step_split(target, draft, prompts, tokens)}
    few = prompts[:4]
    plain = SpecDecoder(target, None, kappa=0)
    spec = SpecDecoder(target, ModelDrafter(draft), kappa=3)
    with torch.no_grad():
        out["generate_tok_s"] = tokens_per_s(lambda p: generate(target, None, p, tokens, temperature=0), few, tokens)
        out["plain_engine_tok_s"] = tokens_per_s(lambda p: plain.generate([p], greedy), few, tokens)
        out["spec_engine_tok_s"] = tokens_per_s(lambda p: spec.generate([p], greedy), few, tokens)
    return out


def worktree(ref: str) -> Path:
    "A checkout of `ref` under /tmp (made once)."
    path = Path("/tmp") / f"speclab-engine-host-{ref}"
    if not (path / "speclab").exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True,
                       capture_output=True)
    return path


def run_side(path: Path, tokens: int) -> dict:
    "One worker process with `path`'s speclab first on sys.path."
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, __file__, "--worker", "--tokens", str(tokens)], env=env, capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"the worker for {path} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def median_of(runs: list[dict], *keys: str) -> float:
    "The median over runs of runs[i][keys[0]][keys[1]]..."
    vals = []
    for run in runs:
        for k in keys:
            run = run[k]
        vals.append(run)
    return statistics.median(vals)


def main(argv: list[str] | None = None) -> dict:
    "Both sides, alternating; the table and the ratios."
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.tokens)))
        return {}
    from bench_env import load_average, machine, utc_now
    old_path, runs = worktree(a.ref), {"old": [], "new": []}
    new_path = ROOT if a.new is None else worktree(a.new)
    load0 = load_average()
    for _ in range(a.rounds):
        runs["old"].append(run_side(old_path, a.tokens))
        runs["new"].append(run_side(new_path, a.tokens))
    res = {"date": utc_now(), "machine": machine().replace("threads", "threads (workers: 1)"), "ref": a.ref, "new": a.new or "this checkout",
           "load_before": load0, "load_after": load_average(), "rounds": a.rounds, "tokens": a.tokens}
    for side in ("old", "new"):
        for b in ("batch1", "batch16"):
            for k in ("total", "forwards", "sampler", "rest"):
                res[f"{side}_{b}_{k}_ms"] = round(median_of(runs[side], b, k), 3)
        for k in ("generate_tok_s", "plain_engine_tok_s", "spec_engine_tok_s"):
            res[f"{side}_{k}"] = round(median_of(runs[side], k), 1)
        res[f"{side}_plain_vs_generate"] = round(res[f"{side}_plain_engine_tok_s"] / res[f"{side}_generate_tok_s"], 3)
        res[f"{side}_spec_vs_plain"] = round(res[f"{side}_spec_engine_tok_s"] / res[f"{side}_plain_engine_tok_s"], 3)
        res[f"{side}_spec_vs_generate"] = round(res[f"{side}_spec_engine_tok_s"] / res[f"{side}_generate_tok_s"], 3)
    for b in ("batch1", "batch16"):
        res[f"rest_new_over_old_{b}"] = round(res[f"new_{b}_rest_ms"] / res[f"old_{b}_rest_ms"], 3)
    if a.json:
        print(json.dumps(res, indent=1))
        return res
    print(f"{res['date']}  {res['machine']}  before={a.ref}  load {load0} -> {res['load_after']}")
    print(f"{'ms per step':<22}{'total':>9}{'forwards':>10}{'sampler':>9}{'rest':>9}")
    for b in ("batch1", "batch16"):
        for side in ("old", "new"):
            cells = "".join(f"{res[f'{side}_{b}_{k}_ms']:>{w}.2f}" for k, w in
                            (("total", 9), ("forwards", 10), ("sampler", 9), ("rest", 9)))
            print(f"{b + ' ' + side:<22}{cells}")
        print(f"{b + ' rest new/old':<22}{res[f'rest_new_over_old_{b}']:>37.3f}")
    for side in ("old", "new"):
        print(f"{side}: generate {res[f'{side}_generate_tok_s']} tok/s, plain engine {res[f'{side}_plain_engine_tok_s']}"
              f" ({res[f'{side}_plain_vs_generate']}x generate), speculative {res[f'{side}_spec_engine_tok_s']}"
              f" ({res[f'{side}_spec_vs_plain']}x plain, {res[f'{side}_spec_vs_generate']}x generate)")
    return res


if __name__ == "__main__":
    main()
