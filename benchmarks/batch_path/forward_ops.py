"""Where a decode step's target forward goes, speclab against vLLM-CPU, part by part, in one interleaved run.

    python benchmarks/batch_path/forward_ops.py                         # C = 1 and 16, 3 rounds, one thread a side
    python benchmarks/batch_path/forward_ops.py --out FILE              # also the JSON

The batch-path section of benchmarks/RESULTS.md measured speclab's target forward at 1.40-1.48 times vLLM-CPU's at one
thread, and `linear_paths.py` showed that oneDNN's prepacked matrix products are not what vLLM gains there. This splits
the forward of plain decode steps (the shipped target, fp32, greedy, `sweep_prompts(16, 64)`, 64 new tokens each,
`max_num_seqs` = C) into the same parts on both sides and prints each part's milliseconds per decode step:

- speclab: an instrumented copy of `speclab.model.paged_logits` (the same calls in the same order; the outputs are
  checked identical to the library's) times the embedding, RoPE (`rope_cos_sin`, `apply_rope`), each RMSNorm, the
  residual adds, the four fused projections, attention (the K/V write and `_attend_group`), SiLU-and-mul and the LM
  head;
- vLLM-CPU: each leaf layer class's `forward` wrapped by a timer (`batch_path_vllm.py`'s `PART_CLASSES`): its fused
  linears, `RMSNorm` (which adds the residual too), the rotary embedding, `Attention`, `SiluAndMul`, the logits
  processor (the LM head) and the embedding.

A step counts if its linears saw at most C rows (a decode step). "rest" is the forward's time outside the named parts
(reshapes, the per-layer loop, the modules' own calls). Both sides pay a timer around
each part (about a microsecond a call): read small parts as upper bounds. Rounds alternate which side runs first;
medians over rounds. No timing is asserted.
"""
import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "common"))
from batch_path import VllmWorker  # noqa: E402
from batch_path_vllm import LeafParts  # noqa: E402
from bench_env import load_average, machine, utc_now  # noqa: E402
from vllm_env import has_vllm, vllm_python, vllm_version  # noqa: E402

# each part's name on both sides: (speclab's clock names, vLLM's leaf module class names)
PARTS = {
    "qkv_proj": (("qkv_proj",), ("QKVParallelLinear",)),
    "o_proj": (("o_proj",), ("RowParallelLinear",)),   # vLLM's down_proj is a RowParallelLinear too: see `split_rows`
    "gate_up_proj": (("gate_up_proj",), ("MergedColumnParallelLinear",)),
    "down_proj": (("down_proj",), ()),
    "LM head": (("head",), ("LogitsProcessor",)),
    "RMSNorm (+ residual add)": (("norm", "residual"), ("RMSNorm",)),
    "rotary": (("rotary",), ("RotaryEmbedding",)),
    "attention (K/V write + attend)": (("attention",), ("Attention",)),
    "SiLU and mul": (("silu_mul",), ("SiluAndMul",)),
    "embedding": (("embed",), ("VocabParallelEmbedding",)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="max_num_seqs values (default 1 16)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per run (default 16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads on both sides (default 1)")
    ap.add_argument("--vllm-timeout", type=float, default=600.0, help="seconds for vLLM's start and each run")
    ap.add_argument("--out", default=None, help="also write the JSON object to this file")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.prompts < 1 or a.max_tokens < 2 or min(a.concurrency) < 1 or a.threads < 1:
        ap.error("--rounds, --prompts, --threads and --concurrency must be >= 1, --max-tokens >= 2")
    return a


def clock(leaves: LeafParts, name: str, fn, *args):
    "fn(*args), its seconds added to part `name` of the current step."
    t0 = time.perf_counter()
    out = fn(*args)
    leaves.add(name, time.perf_counter() - t0)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    "SwiGLU's middle, as `speclab.model.mlp` computes it."
    return F.silu(gate) * up


def timed_paged_logits(leaves: LeafParts):
    "`speclab.model.paged_logits`, the same calls in the same order, each part clocked into `leaves`."
    import speclab.model as M

    def paged_logits(model, cache, batch, logits_indices=None):
        t0 = time.perf_counter()
        leaves.see_rows(batch.num_tokens)
        a = model.args
        hd, heads, kv_heads = a.head_dim, a.num_heads, a.num_kv_heads
        x = clock(leaves, "embed", model.model.embed_tokens, batch.token_ids)
        cos, sin = clock(leaves, "rotary", M.rope_cos_sin, model.inv_freq, batch.positions, x.dtype)
        for layer, kv in zip(model.model.layers, cache):
            at = layer.self_attn
            h = clock(leaves, "norm", layer.input_layernorm, x)
            qkv = clock(leaves, "qkv_proj", at.qkv_proj, h).unflatten(-1, (heads + 2 * kv_heads, hd))
            qk = clock(leaves, "rotary", M.apply_rope, qkv[..., :heads + kv_heads, :], cos, sin)
            q, k = qk.split([heads, kv_heads], -2)
            o = clock(leaves, "attention", M.paged_attend(kv, batch), q, k, qkv[..., heads + kv_heads:, :])
            x = clock(leaves, "residual", torch.add, x, clock(leaves, "o_proj", at.o_proj, o.flatten(-2)))
            h = clock(leaves, "norm", layer.post_attention_layernorm, x)
            gate, up = clock(leaves, "gate_up_proj", layer.mlp.gate_up_proj, h).chunk(2, -1)
            m = clock(leaves, "silu_mul", silu_mul, gate, up)
            x = clock(leaves, "residual", torch.add, x, clock(leaves, "down_proj", layer.mlp.down_proj, m))
        if logits_indices is not None:
            x = x[logits_indices]
        logits = clock(leaves, "head", torch.matmul, clock(leaves, "norm", model.model.norm, x), model.head_weight.T)
        leaves.add("forward", time.perf_counter() - t0)
        leaves.end_step()
        return logits
    return paged_logits


def run_speclab(eng, prompts: list, max_tokens: int, concurrency: int, parts: bool) -> dict:
    "One generate on speclab's plain engine (with `parts`: through the instrumented forward); its digest and parts."
    import speclab.model as M
    from speclab.request import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    leaves = LeafParts(concurrency)
    original = M.paged_logits
    if parts:
        M.paged_logits = timed_paged_logits(leaves)     # forward_paged looks the name up at each call
    try:
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
    finally:
        M.paged_logits = original
    tokens = [list(o.token_ids) for o in outs]
    return {"wall_s": wall, "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
            "parts": leaves.parts, "decode_steps": leaves.decode_steps,
            "decode_forward_s": leaves.parts.pop("forward", 0.0)}


def per_step_ms(run: dict, side: int) -> dict:
    "A run's milliseconds per decode step, part by part (PARTS' names), the forward and the rest."
    steps = max(1, run["decode_steps"])
    out = {name: 1e3 * sum(run["parts"].get(n, 0.0) for n in names[side]) / steps for name, names in PARTS.items()}
    out["forward"] = 1e3 * run["decode_forward_s"] / steps
    out["rest"] = out["forward"] - sum(out[name] for name in PARTS)
    named = {n for names in PARTS.values() for n in names[side]}
    out |= {f"unnamed {n}": 1e3 * t / steps for n, t in run["parts"].items() if n not in named}   # counted in rest
    return out


def split_rows(row: dict) -> dict:
    "vLLM's o_proj and down_proj are both RowParallelLinear: one part there, the sum of both here (named so)."
    row = dict(row)
    row["o_proj + down_proj"] = row.pop("o_proj") + row.pop("down_proj")
    return row


def measure(a: argparse.Namespace) -> dict:
    "Build both sides, warm them, run the interleaved rounds; per concurrency, each side's rows per round."
    from speclab.engine import SpecDecoder
    from speclab.model import load_model
    from speclab.sweep import sweep_prompts
    from speclab.train import tiny_pair_path
    torch.set_num_threads(a.threads)
    python = vllm_python()
    if not has_vllm(python):
        raise SystemExit(f"no vLLM in {python}: `python benchmarks/common/vllm_env.py` creates its venv")
    target = load_model(tiny_pair_path("target"))
    prompts = [list(map(int, p)) for p in sweep_prompts(a.prompts, 64)]
    print(f"starting vLLM-CPU ({python}) ...", file=sys.stderr, flush=True)
    worker = VllmWorker(python, max(a.concurrency), a.vllm_timeout, a.threads)
    rows = {c: {"speclab": [], "vllm": []} for c in a.concurrency}
    digests = {}
    try:
        engines = {c: SpecDecoder(target, None, kappa=0, max_num_seqs=c) for c in a.concurrency}
        for c, eng in engines.items():                              # warm-ups, untimed; the library's own outputs
            digests[c] = run_speclab(eng, prompts, a.max_tokens, c, parts=False)["digest"]
            worker.run(prompts, a.max_tokens, c)
        for rnd in range(a.rounds):
            for c in a.concurrency:
                for side in (("speclab", "vllm") if rnd % 2 == 0 else ("vllm", "speclab")):
                    if side == "speclab":
                        run = run_speclab(engines[c], prompts, a.max_tokens, c, parts=True)
                        if run["digest"] != digests[c]:
                            raise RuntimeError("the instrumented forward changed speclab's outputs")
                        rows[c]["speclab"].append(per_step_ms(run, 0) | {"decode_steps": run["decode_steps"]})
                    else:
                        run = worker.run(prompts, a.max_tokens, c, parts=True)
                        rows[c]["vllm"].append(per_step_ms(run, 1) | {"decode_steps": run["decode_steps"]})
                print(f"round {rnd + 1}/{a.rounds}, concurrency {c} done", file=sys.stderr, flush=True)
    finally:
        worker.close()
    return {"rows": rows, "vllm_python": str(python), "vllm_version": vllm_version(python),
            "speclab_digests_checked": True}


def medians(runs: list) -> dict:
    "Part by part medians over rounds (a part missing from a round counts 0 there)."
    keys = dict.fromkeys(k for r in runs for k in r)
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}


def table(summary: dict) -> str:
    "Per concurrency: each part's ms per decode step on both sides and their ratio."
    lines = []
    for c, sides in summary["medians"].items():
        s, v = split_rows(sides["speclab"]), split_rows(sides["vllm"])
        lines.append(f"concurrency {c} ({s['decode_steps']:.0f} and {v['decode_steps']:.0f} decode steps), "
                     "ms per decode step, medians of rounds")
        lines.append(f"{'part':34} {'speclab':>9} {'vLLM-CPU':>9} {'ratio':>7}")
        for name in [n for n in s if n != "decode_steps" and not n.startswith("unnamed")]:
            ratio = s[name] / v[name] if v[name] > 1e-6 else float("nan")
            lines.append(f"{name:34} {s[name]:9.3f} {v[name]:9.3f} {ratio:7.2f}")
        for side, row in (("speclab", s), ("vLLM-CPU", v)):
            others = {n[len("unnamed "):]: round(t, 3) for n, t in row.items() if n.startswith("unnamed")}
            if others:
                lines.append(f"{side}'s leaf modules in no part (counted in rest), ms per step: {others}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    loads = [load_average()]
    started = utc_now()
    measured = measure(a)
    loads.append(load_average())
    med = {c: {side: medians(runs) for side, runs in sides.items()} for c, sides in measured["rows"].items()}
    summary = {"date": started, "machine": machine(), "threads": a.threads, "load": loads, "rounds": a.rounds,
               "prompts": a.prompts, "max_tokens": a.max_tokens, "vllm_version": measured["vllm_version"],
               "medians": med, "rounds_rows": measured["rows"]}
    print(table(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
