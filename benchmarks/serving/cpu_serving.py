"""Serving on a CPU with speclab's engine: continuous batching against static batches, and prefix caching on and off,
side by side in one run.

    python benchmarks/serving/cpu_serving.py --threads 1       # the shipped tiny pair, both parts, two interleaved repeats
    python benchmarks/serving/cpu_serving.py --json            # one JSON object
    python benchmarks/serving/cpu_serving.py --part prefix     # one part only (batching | prefix)

(a) Continuous batching. --requests (64) held-out prompts of --prompt-len (64) tokens, greedy, ignore_eos, output
lengths spread evenly over --min-tokens..--max-tokens (16..256) in a shuffled (seeded) order, all arriving at once.
The same engine (SpecDecoder, --max-num-seqs 16, the same KV pool) serves them two ways: continuously (add_request
for all, then step() until done: a finished request's slot goes to the next waiting one at once) and as static
batches (generate() on groups of --max-num-seqs in arrival order: each group waits for its longest request, and the
next group starts after it). Tokens/s (output tokens / seconds), and the time to first token of each request
(timestamped by its on_tokens callback, from the moment all arrived) at p50 and p90, each with plain decoding (no
drafter) and with the draft model (ModelDrafter, --kappa 3). Prefix caching is off in this part, and every run has a
fresh engine, so nothing is reused between runs.

(b) Prefix caching. --prefix-requests (32) requests whose prompts share a --prefix-len (256) token prefix (held-out
text) and end in their own --suffix-len (16) tokens, --prefix-output (32) new tokens each (the pair's context is 512),
plain decoding, with enable_prefix_caching on and off. Two arrival patterns: "burst" (all requests at once: those
admitted in the same step each compute the prefix, since a block becomes shareable only once it is computed) and
"warm" (one request first, the others once it has finished: every later request finds the prefix cached). Reported:
the prompt tokens the target computed (prompt tokens - the engine's num_cached_tokens), everything the target
computed (engine.stats["target_tokens"], decoding included), the seconds, and whether the outputs with and without
the cache are equal.

Every configuration runs --repeats times (2), the configurations interleaved repeat by repeat so that a busy machine
slows all alike; a warm-up pass comes first. Times are wall-clock seconds; the medians over repeats are reported.
"""
import argparse
import json
import random
import statistics
import sys
import time

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402


BLOCK_SIZE = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("both", "batching", "prefix"), default="both")
    ap.add_argument("--requests", type=int, default=64, help="(a) requests (default 64)")
    ap.add_argument("--prompt-len", type=int, default=64, help="(a) prompt length in tokens (default 64)")
    ap.add_argument("--min-tokens", type=int, default=16, help="(a) shortest output (default 16)")
    ap.add_argument("--max-tokens", type=int, default=256, help="(a) longest output (default 256)")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="(a) requests running at once (default 16)")
    ap.add_argument("--kappa", type=int, default=3, help="(a) draft tokens per step with the draft model (default 3)")
    ap.add_argument("--prefix-requests", type=int, default=32, help="(b) requests (default 32)")
    ap.add_argument("--prefix-len", type=int, default=256, help="(b) shared prefix in tokens (default 256)")
    ap.add_argument("--suffix-len", type=int, default=16, help="(b) each request's own tokens (default 16)")
    ap.add_argument("--prefix-output", type=int, default=32, help="(b) new tokens per request (default 32)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration, interleaved (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="order of the output lengths (default 0)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--save", default=None, help="also write the JSON object to this file")
    a = ap.parse_args(argv)
    for k in ("requests", "prompt_len", "min_tokens", "max_tokens", "max_num_seqs", "prefix_requests", "prefix_len",
              "suffix_len", "prefix_output", "repeats"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.kappa < 0:
        ap.error("--kappa must be >= 0")
    if a.min_tokens > a.max_tokens:
        ap.error("--min-tokens must not exceed --max-tokens")
    if a.threads is not None and a.threads < 1:
        ap.error("--threads must be >= 1")
    return a


def percentile(xs: list[float], q: float) -> float:
    "The q-quantile of xs (linear interpolation between order statistics)."
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def output_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    "n output lengths spread evenly over [low, high], in a seeded random order."
    lengths = [round(low + i * (high - low) / max(1, n - 1)) for i in range(n)]
    random.Random(seed).shuffle(lengths)
    return lengths


def run_continuous(engine: object, prompts: list[list[int]], params: list) -> dict:
    "Every request added at once, then step() until all finish; seconds, first-token times, outputs."
    first, outputs, index = {}, [None] * len(prompts), {}
    t0 = time.perf_counter()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        rid = engine.add_request(p, sp, on_tokens=lambda ids, i=i: first.setdefault(i, time.perf_counter()))
        index[rid] = i
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished is not None:
                outputs[index[out.req_id]] = out.finished.token_ids
    seconds = time.perf_counter() - t0
    return dict(seconds=seconds, ttft=[first[i] - t0 for i in range(len(prompts))], outputs=outputs)


def run_static(engine: object, prompts: list[list[int]], params: list, group: int) -> dict:
    "generate() on consecutive groups of `group` requests, each after the previous one finished."
    first, outputs = {}, []
    t0 = time.perf_counter()
    for g in range(0, len(prompts), group):
        outs = engine.generate(prompts[g:g + group], params[g:g + group],
                               on_tokens=lambda i, ids, g=g: first.setdefault(g + i, time.perf_counter()))
        outputs += [o.token_ids for o in outs]
    seconds = time.perf_counter() - t0
    return dict(seconds=seconds, ttft=[first[i] - t0 for i in range(len(prompts))], outputs=outputs)


def batching_part(a: argparse.Namespace, target: torch.nn.Module, draft: torch.nn.Module) -> dict:
    "(a): continuous batching vs static batches, plain and with the draft model."
    from speclab.request import SamplingParams
    from speclab.drafters import ModelDrafter
    from speclab.engine import SpecDecoder
    from speclab.train import eval_prompts
    prompts = eval_prompts(n=a.requests, prompt_len=a.prompt_len, seed=21)
    lengths = output_lengths(a.requests, a.min_tokens, a.max_tokens, a.seed)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    per_request = -(-(a.prompt_len + a.max_tokens + a.kappa + 1) // BLOCK_SIZE)
    num_blocks = a.max_num_seqs * per_request                  # every running request fits: no preemption

    def engine(with_draft: bool) -> object:
        "A fresh engine: same sizes and pool for every configuration."
        drafter = ModelDrafter(draft) if with_draft else None
        return SpecDecoder(target, drafter, kappa=a.kappa if with_draft else 0, max_num_seqs=a.max_num_seqs,
                           block_size=BLOCK_SIZE, num_blocks=num_blocks, enable_prefix_caching=False)

    configs = {(mode, d): None for d in ("plain", "draft model") for mode in ("continuous", "static")}
    warm_params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * a.max_num_seqs
    for d in ("plain", "draft model"):
        run_continuous(engine(d != "plain"), prompts[:a.max_num_seqs], warm_params)
    runs = {c: [] for c in configs}
    for _ in range(a.repeats):
        for mode, d in configs:
            eng = engine(d != "plain")
            if mode == "continuous":
                r = run_continuous(eng, prompts, params)
            else:
                r = run_static(eng, prompts, params, a.max_num_seqs)
            r["steps"] = eng.stats["steps"]
            r["E"] = eng.metrics.mean_acceptance_length
            runs[(mode, d)].append(r)
    total = sum(lengths)
    table = []
    for (mode, d), rs in runs.items():
        secs = statistics.median(r["seconds"] for r in rs)
        ttft = [t for r in rs for t in r["ttft"]]
        table.append(dict(mode=mode, drafter=d, seconds=round(secs, 2), tokens_per_s=round(total / secs, 1),
                          ttft_p50_s=round(percentile(ttft, 0.5), 3), ttft_p90_s=round(percentile(ttft, 0.9), 3),
                          steps=rs[0]["steps"], E=round(rs[0]["E"], 3),
                          all_seconds=[round(r["seconds"], 2) for r in rs]))
    by = {(row["mode"], row["drafter"]): row for row in table}
    ref = runs[("continuous", "plain")][0]["outputs"]
    same = {f"{m}, {d}": sum(o == p for o, p in zip(rs[0]["outputs"], ref)) for (m, d), rs in runs.items()}
    ratios = {d: round(by[("continuous", d)]["tokens_per_s"] / by[("static", d)]["tokens_per_s"], 3)
              for d in ("plain", "draft model")}
    return dict(requests=a.requests, prompt_len=a.prompt_len, output_tokens=total, lengths=[min(lengths),
                max(lengths)], max_num_seqs=a.max_num_seqs, kappa=a.kappa, num_blocks=num_blocks, table=table,
                continuous_over_static=ratios,
                draft_over_plain={m: round(by[(m, "draft model")]["tokens_per_s"] / by[(m, "plain")]["tokens_per_s"],
                                           3) for m in ("continuous", "static")},
                outputs_equal_to_continuous_plain=same)


def prefix_part(a: argparse.Namespace, target: torch.nn.Module) -> dict:
    "(b): a shared prefix with the prefix cache on and off, all at once ('burst') and after one request ('warm')."
    from speclab.request import SamplingParams
    from speclab.engine import SpecDecoder
    from speclab.train import eval_prompts
    prefix = eval_prompts(n=1, prompt_len=a.prefix_len, seed=31)[0]
    suffixes = eval_prompts(n=a.prefix_requests, prompt_len=a.suffix_len, seed=32)
    prompts = [prefix + s for s in suffixes]
    sp = SamplingParams(temperature=0, max_tokens=a.prefix_output, ignore_eos=True)
    per_request = -(-(a.prefix_len + a.suffix_len + a.prefix_output + 1) // BLOCK_SIZE)

    def run(pattern: str, cache: bool) -> dict:
        "One pass: a fresh engine, the requests in the given pattern; its counters and outputs."
        eng = SpecDecoder(target, None, kappa=0, max_num_seqs=a.prefix_requests, block_size=BLOCK_SIZE,
                          num_blocks=a.prefix_requests * per_request, enable_prefix_caching=cache)
        t0 = time.perf_counter()
        if pattern == "burst":
            outs = eng.generate(prompts, sp)
        else:
            outs = eng.generate(prompts[:1], sp) + eng.generate(prompts[1:], sp)
        seconds = time.perf_counter() - t0
        return dict(seconds=seconds, target_tokens=eng.stats["target_tokens"],
                    cached=eng.scheduler_stats().num_cached_tokens, outputs=[o.token_ids for o in outs])

    run("burst", True)                                         # warm-up
    runs = {(p, c): [] for p in ("burst", "warm") for c in (False, True)}
    for _ in range(a.repeats):
        for key in runs:
            runs[key].append(run(*key))
    prompt_tokens = sum(len(p) for p in prompts)
    table = []
    for (pattern, cache), rs in runs.items():
        r = rs[0]
        table.append(dict(pattern=pattern, prefix_cache=cache, prompt_tokens=prompt_tokens,
                          prompt_tokens_computed=prompt_tokens - r["cached"], cached_tokens=r["cached"],
                          target_tokens=r["target_tokens"],
                          seconds=round(statistics.median(x["seconds"] for x in rs), 2),
                          all_seconds=[round(x["seconds"], 2) for x in rs]))
    same = {p: sum(x == y for x, y in zip(runs[(p, True)][0]["outputs"], runs[(p, False)][0]["outputs"]))
            for p in ("burst", "warm")}
    speed = {p: round(statistics.median(x["seconds"] for x in runs[(p, False)])
                      / statistics.median(x["seconds"] for x in runs[(p, True)]), 3) for p in ("burst", "warm")}
    return dict(requests=a.prefix_requests, prefix_len=a.prefix_len, suffix_len=a.suffix_len,
                output_tokens=a.prefix_output, table=table, outputs_equal_with_and_without_cache=same,
                time_without_over_with_cache=speed)


def main(argv: list[str] | None = None) -> dict:
    "Run the parts asked for and report."
    a = parse_args(argv)
    from speclab.model import load_model
    from speclab.train import tiny_pair_path
    if a.threads:
        torch.set_num_threads(a.threads)
    target = load_model(tiny_pair_path("target"))
    draft = load_model(tiny_pair_path("draft"))
    res = dict(date=utc_now(), machine=machine(),
               torch=torch.__version__, load_average_before=load_average(),
               command="python benchmarks/serving/cpu_serving.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               repeats=a.repeats)
    t0 = time.perf_counter()
    if a.part in ("both", "batching"):
        res["batching"] = batching_part(a, target, draft)
    if a.part in ("both", "prefix"):
        res["prefix"] = prefix_part(a, target)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["load_average_after"] = load_average()
    if a.save:
        with open(a.save, "w") as f:
            json.dump(res, f, indent=1)
    if a.json:
        print(json.dumps(res))
    else:
        print_report(res)
    return res


def print_report(res: dict) -> None:
    "The result as tables."
    print(f"{res['machine']}; load average {res['load_average_before']} -> {res['load_average_after']}; "
          f"{res['repeats']} interleaved repeats, medians; {res['wall_s']} s in all")
    if "batching" in res:
        b = res["batching"]
        print(f"\n(a) {b['requests']} requests, {b['prompt_len']}-token prompts, outputs {b['lengths'][0]}.."
              f"{b['lengths'][1]} tokens ({b['output_tokens']} in all), max_num_seqs {b['max_num_seqs']}, greedy")
        print(f"  {'mode':<11} {'drafter':<12} {'tok/s':>8} {'seconds':>8} {'TTFT p50':>9} {'TTFT p90':>9} "
              f"{'steps':>6} {'E':>5}")
        for r in b["table"]:
            print(f"  {r['mode']:<11} {r['drafter']:<12} {r['tokens_per_s']:8.1f} {r['seconds']:8.2f} "
                  f"{r['ttft_p50_s']:8.2f}s {r['ttft_p90_s']:8.2f}s {r['steps']:6d} {r['E']:5.2f}")
        print(f"  continuous / static tokens/s: {b['continuous_over_static']}; draft model / plain: "
              f"{b['draft_over_plain']}")
        print(f"  outputs equal to continuous plain: {b['outputs_equal_to_continuous_plain']} of {b['requests']}")
    if "prefix" in res:
        p = res["prefix"]
        print(f"\n(b) {p['requests']} requests: a shared {p['prefix_len']}-token prefix + {p['suffix_len']} tokens "
              f"of their own, {p['output_tokens']} new tokens each, plain decoding")
        print(f"  {'pattern':<8} {'cache':<6} {'prompt tokens computed':>23} {'cached':>7} {'target tokens':>14} "
              f"{'seconds':>8}")
        for r in p["table"]:
            print(f"  {r['pattern']:<8} {str(r['prefix_cache']):<6} {r['prompt_tokens_computed']:>12} of "
                  f"{r['prompt_tokens']:<7} {r['cached_tokens']:>7} {r['target_tokens']:>14} {r['seconds']:8.2f}")
        print(f"  time without / with the cache: {p['time_without_over_with_cache']}; outputs equal with and "
              f"without: {p['outputs_equal_with_and_without_cache']} of {p['requests']}")


if __name__ == "__main__":
    main()
