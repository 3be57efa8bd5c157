"""The shipped target's projections with their weights stored row by row (a checkpoint's layout) and input-major
(`speclab.model.input_major`, what `load_model` does on the CPU): per product and rows M, and the whole engine's plain
decoding, side by side in one run.

    python benchmarks/batch_path/weight_layout.py                 # tables
    python benchmarks/batch_path/weight_layout.py --out FILE      # also one JSON file

Products: `F.linear(x, W)` for every distinct weight shape of the shipped target (the fused projections and the tied
head), each timed over `--copies` different weights in turn so that, as in a decode step, the weight comes from
memory and not from the caches; the median of `--repeats` passes, per call; and the largest difference between the
two layouts' outputs. Engine: `SpecDecoder` without a drafter (plain decoding, greedy, `sweep_prompts(16)`, 64 new
tokens each, `max_num_seqs` = C), the two layouts alternating over `--rounds` rounds, the best round's tokens/s each,
and whether their greedy tokens agree. One torch thread by default. No timing is asserted.
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from speclab.config import EngineConfig  # noqa: E402
from speclab.engine import SpecDecoder  # noqa: E402
from speclab.model import input_major, load_model  # noqa: E402
from speclab.request import SamplingParams  # noqa: E402
from speclab.sweep import sweep_prompts  # noqa: E402
from speclab.train import tiny_pair_path  # noqa: E402


def row_major(model: nn.Module) -> nn.Module:
    "Every nn.Linear weight back to a checkpoint's layout: [out, in], row by row."
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.contiguous()
    return model


def shapes(model: nn.Module) -> list[tuple[str, int, int]]:
    "(name, in, out) of every distinct product of the target's forward: the fused projections and the head."
    layer = model.model.layers[0]
    named = [("qkv_proj", layer.self_attn.qkv_proj), ("o_proj", layer.self_attn.o_proj),
             ("gate_up_proj", layer.mlp.gate_up_proj), ("down_proj", layer.mlp.down_proj)]
    out = [(name, m.in_features, m.out_features) for name, m in named]
    return out + [("lm_head", model.args.hidden_size, model.args.vocab_size)]


def time_product(weights: list[torch.Tensor], x: torch.Tensor, repeats: int) -> float:
    "Median seconds per call of F.linear over the weights in turn."
    for w in weights:
        F.linear(x, w)
    passes = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in weights:
            F.linear(x, w)
        passes.append((time.perf_counter() - t0) / len(weights))
    return sorted(passes)[len(passes) // 2]


def products(model: nn.Module, rows: list[int], copies: int, repeats: int) -> list[dict]:
    """Per shape and M: microseconds per call in each layout, their ratio and the largest output difference (every
    shape is timed both ways, also those `input_major` leaves row by row)."""
    out = []
    for name, n_in, n_out in shapes(model):
        stored = [torch.randn(n_out, n_in) for _ in range(copies)]
        turned = [w.t().contiguous().t() for w in stored]
        for m in rows:
            x = torch.randn(m, n_in)
            first, second = time_product(stored, x, repeats), time_product(turned, x, repeats)
            diff = max(float((F.linear(x, a) - F.linear(x, b)).abs().max()) for a, b in zip(stored[:4], turned[:4]))
            out.append({"product": name, "rows": m, "row_major_us": round(1e6 * first, 1),
                        "input_major_us": round(1e6 * second, 1), "ratio": round(second / first, 3),
                        "max_abs_diff": diff})
            print(f"{name:>12s} M={m:3d}  row-major {1e6 * first:7.1f} us  input-major {1e6 * second:7.1f} us  "
                  f"ratio {second / first:.2f}  max|diff| {diff:.1e}", flush=True)
    return out


def decode(model: nn.Module, c: int, prompts: list, max_tokens: int) -> tuple[float, list]:
    "Tokens/s and greedy tokens of plain decoding at max_num_seqs = c."
    eng = SpecDecoder(model, None, config=EngineConfig(kappa=0, max_num_seqs=c, enable_prefix_caching=False))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    seconds = time.perf_counter() - t0
    return sum(len(o.token_ids) for o in outs) / seconds, [list(o.token_ids) for o in outs]


def engine(concurrency: list[int], rounds: int, max_tokens: int) -> list[dict]:
    "Per C: the best round's tokens/s of each layout, alternating which runs first, and whether the tokens agree."
    models = {"row_major": row_major(load_model(tiny_pair_path("target"))),
              "input_major": load_model(tiny_pair_path("target"))}
    prompts = [list(p) for p in sweep_prompts(16)]
    out = []
    for c in concurrency:
        rates, tokens = {name: [] for name in models}, {}
        for r in range(rounds):
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
                rate, tokens[name] = decode(models[name], c, prompts, max_tokens)
                rates[name].append(rate)
        best = {name: max(v) for name, v in rates.items()}
        same = tokens["row_major"] == tokens["input_major"]
        out.append({"concurrency": c, "tokens_per_s": {k: round(v, 1) for k, v in best.items()},
                    "ratio": round(best["input_major"] / best["row_major"], 3), "same_tokens": same,
                    "rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()}})
        print(f"engine C={c:2d}  row-major {best['row_major']:6.1f} tok/s  input-major {best['input_major']:6.1f} "
              f"tok/s  ratio {best['input_major'] / best['row_major']:.3f}  same tokens {same}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="M: rows of the input")
    ap.add_argument("--copies", type=int, default=48, help="weights timed in turn per product (default 48)")
    ap.add_argument("--repeats", type=int, default=15, help="passes per timing (default 15)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="engine max_num_seqs values")
    ap.add_argument("--rounds", type=int, default=4, help="engine rounds, layouts alternating (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    for name in ("copies", "repeats", "rounds", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    t0 = time.time()
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor()
              or platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
              "threads": args.threads, "command": " ".join(["python", "benchmarks/batch_path/weight_layout.py",
                                                            *(argv if argv is not None else sys.argv[1:])])}
    record["products"] = products(load_model(tiny_pair_path("target")), args.rows, args.copies, args.repeats)
    record["engine"] = engine(args.concurrency, args.rounds, args.max_tokens)
    record["seconds"] = round(time.time() - t0, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
