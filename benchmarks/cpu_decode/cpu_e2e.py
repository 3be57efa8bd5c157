"""End to end on a CPU, side by side in one run: plain decoding two ways, speclab with the draft model and with n-gram
lookup, transformers' assisted generation and prompt lookup, on the same prompts and models, with the step costs v
and c measured in the same run.

    python benchmarks/cpu_decode/cpu_e2e.py --threads 1      # the shipped tiny pair, 8 held-out prompts x 128 tokens, greedy
    python benchmarks/cpu_decode/cpu_e2e.py                  # torch's default thread count
    python benchmarks/cpu_decode/cpu_e2e.py --compile --json # also the runs through speclab.model.compile_paged; one JSON

All runs are greedy in fp32, batch 1, one prompt at a time, the implementations interleaved prompt by prompt so that
a busy machine slows all alike. Plain decoding is measured twice: speclab.model.generate (the contiguous cache of
Chapter 7) and the engine with no drafter (SpecDecoder(target): the paged path every speculative run takes). Reports
tokens/s (total tokens / total seconds) and the ratio of each run to both plain runs.

Between prompts the script times bare forwards (each with its paged_batch, as the engine calls them; the median of
all of them at the end), at a context of prompt-len + new-tokens / 2: a target step t (1 token), a target verify of
kappa + 1 tokens (v = its time / t), a draft step back to back with others (c = its time / t; eight untimed steps
first, so that the draft's weights are in the caches: the c of Chapter 2, a bare step), and a draft step right
after a target verify (c_cold, the mean of kappa such steps: the target's stream of weights has pushed the draft's
out of the caches, and they come back over a few steps, which is what the engine sees). The target's steps and the
warm draft step are also timed through the contiguous path (the forward of speclab.train.decode_step_seconds).
From them, Chapter 2's prediction E / (1 + kappa c), E / (v + kappa c) and E / (v + kappa c_cold), next to the
measured speedup. The engine's own split of a speculative step (draft_s and target_s per step, and the rest, in
units of t) says where the time went.

--compile adds the engine runs (plain and draft model) with both models under speclab.model.compile_paged
(torch.compile, dynamic shapes): a warm-up pass pays the compilation (its seconds are reported, not counted in
tokens/s), then they join the interleaved loop.
"""
import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402


PLAIN = "plain (speclab.model.generate)"
ENGINE_PLAIN = "plain (engine, no drafter)"
DRAFT = "speclab, draft model"
NGRAM = "speclab, n-gram"
HF_ASSISTED = "transformers, assistant_model"
HF_LOOKUP = "transformers, prompt lookup"
HF_PLAIN = "transformers, plain"
ENGINE_PLAIN_C = "plain (engine, no drafter), compiled"
DRAFT_C = "speclab, draft model, compiled"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--kappa", type=int, default=3, help="draft tokens per step (default 3)")
    ap.add_argument("--ngram", type=int, default=3, help="n-gram size for both prompt-lookup drafters")
    ap.add_argument("--bare-steps", type=int, default=12, help="bare forwards of each kind timed after each prompt")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--compile", action="store_true", help="also run the engine through speclab.model.compile_paged")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers runs")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--save", default=None, help="also write the JSON object to this file")
    a = ap.parse_args(argv)
    for k in ("prompts", "prompt_len", "new_tokens", "kappa", "ngram", "bare_steps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.threads is not None and a.threads < 1:
        ap.error("--threads must be >= 1")
    return a


class BareSteps:
    "Timed bare forwards of the target and the draft at one context: paged (as the engine runs them) and contiguous."

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, context: int, kappa: int,
                 block_size: int = 16):
        from speclab.model import KVCache, forward, paged_cache
        self.target = target
        self.draft = draft
        self.context = context
        self.kappa = kappa
        self.block_size = block_size
        blocks = -(-(context + kappa + 1) // block_size)
        self.table = list(range(blocks))
        self.pools = {m: paged_cache(m.args, blocks, block_size) for m in (target, draft)}
        self.caches = {m: KVCache(m.args, 1, context + kappa + 1) for m in (target, draft)}
        prompt = [1] * context
        for m in (target, draft):
            forward(m, torch.tensor([prompt]), self.caches[m])
            self.paged(m, len(prompt), start=0)
        self.times = {k: [] for k in ("t", "t_verify", "d", "d_cold", "t_contig", "t_verify_contig", "d_contig")}

    def paged(self, model: torch.nn.Module, n: int, start: int | None = None) -> None:
        "One paged forward of n new tokens at the context's end (or at `start`), its paged_batch included."
        from speclab.model import forward_paged, paged_batch
        pb = paged_batch([[1] * n], [self.context if start is None else start], [self.table], self.block_size)
        forward_paged(model, self.pools[model], pb, pb.last_token_indices)

    def contiguous(self, model: torch.nn.Module, n: int) -> None:
        "One contiguous-cache forward of n new tokens at the context's end, rolled back after."
        from speclab.model import forward
        cache = self.caches[model]
        forward(model, torch.ones(1, n, dtype=torch.int64), cache)
        cache.rollback(0, n)

    def record(self, steps: int) -> None:
        "Time `steps` forwards of each kind, interleaved kind by kind."
        k = self.kappa
        kinds: list[tuple[str, Callable[[], None]]] = [
            ("t", lambda: self.paged(self.target, 1)),
            ("t_verify", lambda: self.paged(self.target, k + 1)),
            ("d", lambda: self.paged(self.draft, 1)),
            ("t_contig", lambda: self.contiguous(self.target, 1)),
            ("t_verify_contig", lambda: self.contiguous(self.target, k + 1)),
            ("d_contig", lambda: self.contiguous(self.draft, 1)),
        ]
        for name, fn in kinds:
            for _ in range(8):                                  # back to back until the caches hold its weights
                fn()
            for _ in range(steps):
                t0 = time.perf_counter()
                fn()
                self.times[name].append(time.perf_counter() - t0)
        for _ in range(steps):                                  # kappa draft steps right after a target verify
            self.paged(self.target, k + 1)
            t0 = time.perf_counter()
            for _ in range(k):
                self.paged(self.draft, 1)
            self.times["d_cold"].append((time.perf_counter() - t0) / k)

    def medians(self) -> dict:
        "Median seconds of each kind."
        return {k: statistics.median(v) for k, v in self.times.items()}


def timed(fn: Callable[[list[int]], list[int]], ids: list[int]) -> tuple[float, list[int]]:
    "Seconds and output of one call."
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn(ids)
    return time.perf_counter() - t0, out


def build_runs(a: argparse.Namespace) -> tuple[dict, dict]:
    "The runs (name -> fn(prompt ids) -> new ids) and the objects the report reads (models, engines, compile time)."
    from speclab.request import SamplingParams
    from speclab.drafters import ModelDrafter, NgramDrafter
    from speclab.engine import SpecDecoder
    from speclab.model import compile_paged, generate, load_model
    from speclab.train import tiny_pair_path
    tdir, ddir = str(tiny_pair_path("target")), str(tiny_pair_path("draft"))
    target, draft = load_model(tdir), load_model(ddir)
    n, k = a.new_tokens, a.kappa
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    kw = dict(enable_prefix_caching=False)                     # every prompt is computed: no hit on a warm-up's blocks
    eng_plain = SpecDecoder(target, None, kappa=0, **kw)
    eng_d = SpecDecoder(target, ModelDrafter(draft), kappa=k, **kw)
    eng_n = SpecDecoder(target, NgramDrafter(a.ngram), kappa=k, **kw)
    runs = {
        PLAIN: lambda ids: generate(target, None, ids, n, temperature=0),
        ENGINE_PLAIN: lambda ids: eng_plain.generate([ids], sp)[0].token_ids,
        DRAFT: lambda ids: eng_d.generate([ids], sp)[0].token_ids,
        NGRAM: lambda ids: eng_n.generate([ids], sp)[0].token_ids,
    }
    objs = dict(target=target, draft=draft, eng_plain=eng_plain, eng_d=eng_d, eng_n=eng_n)
    if a.compile:
        target_c = compile_paged(load_model(tdir))
        draft_c = compile_paged(load_model(ddir))
        eng_plain_c = SpecDecoder(target_c, None, kappa=0, **kw)
        eng_d_c = SpecDecoder(target_c, ModelDrafter(draft_c), kappa=k, **kw)
        runs[ENGINE_PLAIN_C] = lambda ids: eng_plain_c.generate([ids], sp)[0].token_ids
        runs[DRAFT_C] = lambda ids: eng_d_c.generate([ids], sp)[0].token_ids
        objs.update(eng_plain_c=eng_plain_c, eng_d_c=eng_d_c)
    if not a.no_transformers:
        from transformers import AutoModelForCausalLM
        hf_t = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
        hf_d = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
        hf_d.generation_config.num_assistant_tokens = k
        hf_d.generation_config.num_assistant_tokens_schedule = "constant"
        hf_kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

        def hf(ids: list[int], **extra: object) -> list[int]:
            "New ids of one transformers generate call."
            return hf_t.generate(torch.tensor([ids]), **hf_kw, **extra)[0, len(ids):].tolist()

        runs[HF_ASSISTED] = lambda ids: hf(ids, assistant_model=hf_d)
        runs[HF_LOOKUP] = lambda ids: hf(ids, prompt_lookup_num_tokens=k, max_matching_ngram_size=a.ngram)
        runs[HF_PLAIN] = lambda ids: hf(ids)
    return runs, objs


def warm_up(runs: dict, objs: dict, ids: list[int]) -> dict:
    "One short call of every run (compiled runs: the prompts' shapes too); seconds of each. Resets the counters."
    from speclab.roofline import SpecMetrics
    warm = {}
    for name, fn in runs.items():
        calls = [ids[:16], ids] if "compiled" in name else [ids[:16]]
        t0 = time.perf_counter()
        for x in calls:
            with torch.no_grad():
                fn(x)
        warm[name] = round(time.perf_counter() - t0, 2)
    for key in ("eng_plain", "eng_d", "eng_n", "eng_plain_c", "eng_d_c"):
        if key in objs:
            objs[key].metrics = SpecMetrics()
            objs[key].stats = {k: 0 * v for k, v in objs[key].stats.items()}
    return warm


def engine_split(eng: object, seconds: float, t_step: float) -> dict:
    "The engine's own split of a step (draft, target, the rest) in ms per step and in units of a bare target step."
    steps = max(1, eng.stats["steps"])
    ms = {"draft": 1e3 * eng.stats["draft_s"] / steps, "target": 1e3 * eng.stats["target_s"] / steps}
    ms["other"] = 1e3 * seconds / steps - ms["draft"] - ms["target"]
    out = {"steps": eng.stats["steps"]}
    for part, x in ms.items():
        out[f"{part}_ms_per_step"] = round(x, 3)
        out[f"{part}_in_target_steps"] = round(x / 1e3 / t_step, 3)
    return out


def compiled_graphs() -> int | None:
    "Graphs torch.compile has built in this process so far (None where the counter is unavailable)."
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 -- a private counter: its layout may change between torch versions
        return None


def main(argv: list[str] | None = None) -> dict:
    "Run every implementation prompt by prompt, time the bare steps between prompts, report."
    a = parse_args(argv)
    from speclab.proof import expected_tokens
    from speclab.train import eval_prompts
    if a.threads:
        torch.set_num_threads(a.threads)
    load_before = load_average()
    runs, objs = build_runs(a)
    prompts = eval_prompts(n=a.prompts, prompt_len=a.prompt_len, seed=11)
    n, k = a.new_tokens, a.kappa
    warm = warm_up(runs, objs, prompts[0])
    graphs_before = compiled_graphs()
    bare = BareSteps(objs["target"], objs["draft"], a.prompt_len + n // 2, k)
    bare.record(2)                                              # warm-up of the bare forwards, discarded
    bare.times = {key: [] for key in bare.times}
    secs = {r: 0.0 for r in runs}
    toks = {r: 0 for r in runs}
    outs = {r: [] for r in runs}
    t_run = time.perf_counter()
    for ids in prompts:
        for r, fn in runs.items():
            s, out = timed(fn, ids)
            secs[r] += s
            toks[r] += len(out)
            outs[r].append(out)
        bare.record(a.bare_steps)
    wall = time.perf_counter() - t_run
    graphs_after = compiled_graphs()
    med = bare.medians()
    t_step = med["t"]
    v = med["t_verify"] / t_step
    c = med["d"] / t_step
    c_cold = med["d_cold"] / t_step
    v_contig = med["t_verify_contig"] / med["t_contig"]
    c_contig = med["d_contig"] / med["t_contig"]
    rate = {r: toks[r] / secs[r] for r in runs}
    m = objs["eng_d"].metrics
    E = m.mean_acceptance_length
    alpha = m.acceptance_rate
    measured = rate[DRAFT] / rate[ENGINE_PLAIN]
    pred_v = E / (v + k * c)
    res = {
        "date": utc_now(), "machine": machine(),
        "torch": torch.__version__, "load_average_before": load_before, "load_average_after": load_average(),
        "command": "python benchmarks/cpu_decode/cpu_e2e.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": n, "kappa": k, "wall_s": round(wall, 1),
        "warmup_s": warm,
        "tokens_per_s": {r: round(x, 1) for r, x in rate.items()},
        "ratio_to_plain_generate": {r: round(x / rate[PLAIN], 3) for r, x in rate.items()},
        "ratio_to_plain_engine": {r: round(x / rate[ENGINE_PLAIN], 3) for r, x in rate.items()},
        "identical_to_plain": {r: sum(o == p for o, p in zip(outs[r], outs[PLAIN])) for r in runs},
        "draft_mean_acceptance_length": round(E, 3), "alpha": round(alpha, 4),
        "per_position": [round(x, 3) for x in m.per_position],
        "ngram_mean_acceptance_length": round(objs["eng_n"].metrics.mean_acceptance_length, 3),
        "bare_ms": {key: round(1e3 * x, 3) for key, x in med.items()},
        "v": round(v, 3), "c": round(c, 4), "c_cold": round(c_cold, 4),
        "v_contiguous": round(v_contig, 3), "c_contiguous": round(c_contig, 4),
        "predicted_chapter2": round(E / (1 + k * c), 3),
        "predicted_iid_alpha": round(float(expected_tokens(alpha, k)) / (v + k * c), 3),
        "predicted_measured_v": round(pred_v, 3),
        "predicted_measured_v_cold_c": round(E / (v + k * c_cold), 3),
        "measured_speedup_vs_engine_plain": round(measured, 3),
        "measured_speedup_vs_generate": round(rate[DRAFT] / rate[PLAIN], 3),
        "measured_over_predicted": round(measured / pred_v, 3),
        "engine_split": engine_split(objs["eng_d"], secs[DRAFT], t_step),
        "engine_plain_split": engine_split(objs["eng_plain"], secs[ENGINE_PLAIN], t_step),
        "log_line": m.log_line(),
    }
    if HF_ASSISTED in rate:
        res["speclab_vs_transformers_assisted"] = round(rate[DRAFT] / rate[HF_ASSISTED], 3)
        res["plain_generate_vs_transformers_plain"] = round(rate[PLAIN] / rate[HF_PLAIN], 3)
    if DRAFT_C in rate:
        res["measured_speedup_compiled_vs_engine_plain_compiled"] = round(rate[DRAFT_C] / rate[ENGINE_PLAIN_C], 3)
        res["compiled_draft_mean_acceptance_length"] = round(objs["eng_d_c"].metrics.mean_acceptance_length, 3)
        res["compiled_graphs"] = {"after_warmup": graphs_before, "after_timed_runs": graphs_after}
    if a.save:
        with open(a.save, "w") as f:
            json.dump(res, f, indent=1)
    if a.json:
        print(json.dumps(res))
        return res
    print_report(res, runs, a)
    return res


def print_report(res: dict, runs: dict, a: argparse.Namespace) -> None:
    "The result as tables."
    print(f"greedy fp32, batch 1, {a.prompts} held-out prompts x {a.new_tokens} new tokens, kappa = {a.kappa}, "
          f"{res['machine']}; load average {res['load_average_before']} -> {res['load_average_after']}\n")
    print(f"  {'run':<40} {'tok/s':>8} {'x generate':>11} {'x engine':>9} {'same as plain':>14}")
    for r in runs:
        print(f"  {r:<40} {res['tokens_per_s'][r]:8.1f} {res['ratio_to_plain_generate'][r]:11.2f} "
              f"{res['ratio_to_plain_engine'][r]:9.2f} {res['identical_to_plain'][r]:>10}/{a.prompts}")
    b = res["bare_ms"]
    print(f"\n  {res['log_line']}")
    print(f"  n-gram: mean acceptance length {res['ngram_mean_acceptance_length']:.2f}")
    print(f"  bare forwards, paged (ms): target step {b['t']:.3f}, verify of {a.kappa + 1} {b['t_verify']:.3f}, "
          f"draft step {b['d']:.3f}, draft steps after a verify {b['d_cold']:.3f} each")
    print(f"  bare forwards, contiguous (ms): target step {b['t_contig']:.3f}, verify {b['t_verify_contig']:.3f}, "
          f"draft step {b['d_contig']:.3f}")
    print(f"  v = {res['v']:.3f}, c = {res['c']:.4f}, c_cold = {res['c_cold']:.4f} "
          f"(contiguous: v = {res['v_contiguous']:.3f}, c = {res['c_contiguous']:.4f})")
    print(f"  predicted: E/(1 + kappa c) = {res['predicted_chapter2']:.2f}x, E/(v + kappa c) = "
          f"{res['predicted_measured_v']:.2f}x, E/(v + kappa c_cold) = {res['predicted_measured_v_cold_c']:.2f}x; "
          f"measured {res['measured_speedup_vs_engine_plain']:.2f}x over the plain engine "
          f"({res['measured_over_predicted']:.2f} of E/(v + kappa c)), {res['measured_speedup_vs_generate']:.2f}x "
          "over generate")
    s = res["engine_split"]
    print(f"  engine, per speculative step: draft {s['draft_ms_per_step']:.2f} ms ({s['draft_in_target_steps']:.2f} "
          f"target steps), target {s['target_ms_per_step']:.2f} ms ({s['target_in_target_steps']:.2f}), the rest "
          f"{s['other_ms_per_step']:.2f} ms ({s['other_in_target_steps']:.2f})")
    p = res["engine_plain_split"]
    print(f"  plain engine, per step: target {p['target_ms_per_step']:.2f} ms ({p['target_in_target_steps']:.2f} "
          f"target steps), the rest {p['other_ms_per_step']:.2f} ms ({p['other_in_target_steps']:.2f})")
    if "speclab_vs_transformers_assisted" in res:
        print(f"  speclab (draft model) vs transformers assisted generation: "
              f"{res['speclab_vs_transformers_assisted']:.2f}x; plain generate vs transformers plain: "
              f"{res['plain_generate_vs_transformers_plain']:.2f}x")
    if "measured_speedup_compiled_vs_engine_plain_compiled" in res:
        print(f"  compiled: draft model {res['measured_speedup_compiled_vs_engine_plain_compiled']:.2f}x the compiled "
              f"plain engine; warm-up (compilation) seconds: "
              f"{ {r: s for r, s in res['warmup_s'].items() if 'compiled' in r} }; graphs compiled "
              f"{res['compiled_graphs']}")


if __name__ == "__main__":
    main()
