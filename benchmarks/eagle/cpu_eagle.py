"""Chapter 12 on a CPU: the shipped EAGLE head against the 2-layer draft model, n-gram lookup and plain decoding.

    python benchmarks/eagle/cpu_eagle.py bench              # batch 1, greedy and T = 1, kappa 1..6, then the batch sweep
    python benchmarks/eagle/cpu_eagle.py ablation           # what EAGLE-3's fused features and training-time test each add

bench: on the shipped tiny target, held-out prompts, each (temperature, kappa) point runs plain decoding and every
drafter side by side in one process: one engine each, passes interleaved (the order reversed every other round), the
fastest pass of each kept, and every drafter's speedup taken against the same plain passes, so that the head and the
draft model are compared in one time window with one denominator. Drafters: the EAGLE head as the engine runs it
(`eagle`: float16 on a CPU, Chapter 12's `draft_dtype`), the same head in float32 (`eagle_fp32`, what it drafted in
before; absent when the installed speclab predates the option), the 2-layer draft model and n-gram lookup. Per point:
per-position acceptance, E, alpha-hat (Chapter 9's fit) and the i.i.d. test's p-value, tokens/s of both, the speedup.
c (draft step / target step at batch 1) is measured in the same run for the draft model and the head (in float32 and
in its drafting dtype), and predicted from Chapter 2's byte count. Then the batch sweep (greedy, kappa 3) for the head
and the draft model (speclab.sweep.measure_point): the measured crossing against Chapter 2's prediction from
alpha-hat, c and this machine's ridge T*.

ablation: the target's features computed once on training windows and held-out windows, then four heads trained with
the same small budget: {last layer only, low+mid+high fused} x {no training-time test, 2 levels of it}; held-out
top-1 agreement with the target per level (level k: the head's k-th draft, fed its own states k times).

Writes JSON next to this file (cpu_eagle.json, cpu_eagle_ablation.json) that Chapter 12 plots.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402


HERE = Path(__file__).parent


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["bench", "ablation"])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    ap.add_argument("--output-len", type=int, default=32, help="new tokens per request (default 32)")
    ap.add_argument("--kappas", default="1,2,3,4,5,6")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150, help="ablation: training steps per head (default 150)")
    ap.add_argument("--windows", type=int, default=96, help="ablation: training windows of 512 tokens (default 96)")
    ap.add_argument("--features-cache", default=None, help="ablation: a features .pt from `speclab train-eagle`")
    ap.add_argument("--out", default=None, help="JSON output (default: benchmarks/eagle/cpu_eagle[_ablation].json)")
    return ap.parse_args(argv)


def head_c(head, target, draft, dtype=None):
    """c measured (fastest step at batch 1, context 64) for the draft model and the head (float32, and in `dtype`,
    the dtype it drafts in, when given), and Chapter 2's byte ratio."""
    from speclab.sweep import step_seconds
    from speclab.eagle import head_step_seconds
    t = step_seconds(target, 1, repeats=20)
    d = step_seconds(draft, 1, repeats=20)
    h = head_step_seconds(head, target, repeats=20)
    t_params = target.args.streamed_params
    h_params = sum(p.numel() for p in head.parameters()) + target.head_weight.numel() + target.args.hidden_size
    out = {"target_step_s": t, "draft_step_s": d, "head_step_s": h, "c_draft": d / t, "c_head": h / t,
           "c_draft_predicted": draft.args.streamed_params / t_params, "c_head_predicted": h_params / t_params}
    if dtype is not None and dtype != torch.float32:
        h2 = head_step_seconds(head, target, repeats=20, dtype=dtype)
        out.update(head_dtype=str(dtype), head_step_s_dtype=h2, c_head_dtype=h2 / t)
    return out


def measure_drafters(target, drafters, prompts, params, kappa, repeats):
    """One (temperature, kappa) point: plain decoding and one engine per drafter, batch 1, passes interleaved (order
    reversed every other round), the fastest pass of each kept; each drafter's speedup against the same plain passes."""
    from speclab.acceptance import fit_alpha
    from speclab.engine import SpecDecoder
    sizes = dict(max_num_seqs=1, enable_prefix_caching=False, seed=0)
    engines = {"plain": SpecDecoder(target, None, kappa=0, **sizes)}
    for name, drafter in drafters.items():
        engines[name] = SpecDecoder(target, drafter, kappa=kappa, **sizes)
    best = {name: (math.inf, 0) for name in engines}
    for r in range(repeats):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            t0 = time.perf_counter()
            tokens = sum(len(engines[name].generate([p], params)[0].token_ids) for p in prompts)
            best[name] = min(best[name], (time.perf_counter() - t0, tokens))
    plain_tok_s = best["plain"][1] / best["plain"][0]
    rows = []
    for name in drafters:
        m = engines[name].metrics
        spec_tok_s = best[name][1] / best[name][0]
        rows.append(dict(drafter=name, batch=1, kappa=kappa, temperature=params.temperature,
                         output_len=params.max_tokens, synthetic=False, requests=len(prompts), spec_tok_s=spec_tok_s,
                         plain_tok_s=plain_tok_s, speedup=spec_tok_s / plain_tok_s, E=m.mean_acceptance_length,
                         alpha_hat=fit_alpha(m).alpha if m.num_drafts else math.nan, r=m.per_position, metrics=m))
    return rows


def bench(a):
    from speclab.acceptance import fit_alpha, iid_test
    from speclab.sweep import measure_point, measure_roofline, measured_crossing, sweep_prompts
    import speclab.eagle
    from speclab.eagle import eagle_drafter
    from speclab.request import SamplingParams
    from speclab.drafters import ModelDrafter, NgramDrafter
    from speclab.model import load_model
    from speclab.roofline import crossing_batch
    from speclab.train import tiny_pair_path
    target = load_model(tiny_pair_path("target"))
    draft = load_model(tiny_pair_path("draft"))
    eagle = eagle_drafter(target)
    drafters = {"eagle": eagle}
    if hasattr(speclab.eagle, "draft_dtype"):                       # the float32 head, next to the engine's
        drafters["eagle_fp32"] = eagle_drafter(target, dtype=torch.float32)
    drafters.update(draft_model=ModelDrafter(draft), ngram=NgramDrafter(3))
    prompts = sweep_prompts(a.prompts)
    out = {"date": utc_now(), "machine": machine(), "load_before": load_average(), "command": " ".join(sys.argv),
           "speclab": str(Path(speclab.eagle.__file__).parent), "drafters": list(drafters),
           "c": head_c(eagle.head, target, draft, getattr(eagle, "dtype", None)), "rows": [], "sweep": []}
    print(json.dumps(out["c"]), flush=True)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=a.output_len, ignore_eos=True)
        for kappa in [int(k) for k in a.kappas.split(",")]:
            for row in measure_drafters(target, drafters, prompts, params, kappa, a.repeats):
                m = row.pop("metrics")
                name = row["drafter"]
                row.update(alpha_ci=[fit_alpha(m).low, fit_alpha(m).high] if m.num_drafts else None,
                           iid_p=iid_test(m).p_value if m.num_drafts else None)
                out["rows"].append(row)
                print(f"T={temperature} kappa={kappa} {name:12s} E={row['E']:.2f} alpha={row['alpha_hat']:.3f} "
                      f"r={[round(x, 3) for x in row['r']]} spec={row['spec_tok_s']:.1f} "
                      f"plain={row['plain_tok_s']:.1f} tok/s x{row['speedup']:.2f}", flush=True)
    fit = measure_roofline(target)
    out["t_star"] = fit.t_star
    params = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True)
    for name in ("eagle", "draft_model"):
        rows = []
        for batch in [int(b) for b in a.batch_sizes.split(",")]:
            row = measure_point(target, drafters[name], prompts, batch, params, 3, repeats=a.repeats)
            row.pop("metrics")
            row.pop("sample")
            rows.append(row)
            print(f"sweep {name:12s} batch={batch} x{row['speedup']:.2f}", flush=True)
        c = out["c"].get("c_head_dtype", out["c"]["c_head"]) if name == "eagle" else out["c"]["c_draft"]
        out["sweep"].append({"drafter": name, "rows": rows, "c": c,
                             "measured_crossing": measured_crossing([r["batch"] for r in rows],
                                                                    [r["speedup"] for r in rows]),
                             "predicted_crossing": crossing_batch(rows[0]["alpha_hat"], 3, c, fit.t_star)})
        print(f"crossing {name}: measured {out['sweep'][-1]['measured_crossing']:.1f}, "
              f"predicted {out['sweep'][-1]['predicted_crossing']:.1f} (T* = {fit.t_star:.1f})", flush=True)
    out["load_after"] = load_average()
    return out


def ablation(a):
    from tokenizers import Tokenizer
    from speclab.eagle import eagle3_layers, extract_features, heldout_agreement, init_head, last_layer, train_head
    from speclab.model import load_model
    from speclab.train import encode_texts, read_corpus, shipped_heldout_ids, tiny_pair_path
    target = load_model(tiny_pair_path("target"))
    t0 = time.perf_counter()
    if a.features_cache and Path(a.features_cache).is_file():      # the store `speclab train-eagle` saved
        store, held = torch.load(a.features_cache, weights_only=False)
        store = {**store, "tokens": store["tokens"][:a.windows], "hidden": store["hidden"][:a.windows]}
    else:
        split, _ = read_corpus()
        data = encode_texts(Tokenizer.from_file(str(tiny_pair_path("target") / "tokenizer.json")), split["train"])
        store = extract_features(target, data, a.windows, 512, seed=0)
        held = extract_features(target, shipped_heldout_ids(), 24, 512, seed=1)
    out = {"date": utc_now(), "machine": machine(), "load_before": load_average(), "command": " ".join(sys.argv),
           "feature_seconds": time.perf_counter() - t0, "steps": a.steps, "windows": a.windows, "runs": []}
    n = target.args.num_layers
    for features, layers in (("last", last_layer(n)), ("eagle3", eagle3_layers(n))):
        for ttt in (0, 2):
            head = init_head(target, layers, seed=0)
            log = train_head(head, target, store, a.steps, ttt_steps=ttt, batch_size=4, seq_len=192)
            agree = heldout_agreement(head, target, held, 2)
            out["runs"].append({"features": features, "layers": list(layers), "ttt_steps": ttt,
                                "train_seconds": log[-1]["seconds"], "heldout_top1": agree})
            print(f"{features:7s} ttt={ttt}: held-out top-1 per level {[round(x, 3) for x in agree]} "
                  f"({log[-1]['seconds']:.0f} s)", flush=True)
    out["load_after"] = load_average()
    return out


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    out = bench(a) if a.what == "bench" else ablation(a)
    path = Path(a.out) if a.out else HERE / ("cpu_eagle.json" if a.what == "bench" else "cpu_eagle_ablation.json")
    path.write_text(json.dumps(out, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
                    + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
