"""Tokens per second of plain decoding, chain speculation and EAGLE-2 token trees in speclab's engine.

    python benchmarks/trees/tree_engine.py                      # writes benchmarks/trees/tree_engine.json and .md
    python benchmarks/trees/tree_engine.py --rounds 3 --out-json FILE --out-md FILE

On the shipped tiny pair (fp32; two torch threads), the 16 held-out prompts of 64 tokens (`eval_prompts(16, 64,
seed=0)`) are served with `max_num_seqs` = concurrency (continuous batching), `--tokens` new tokens each (EOS
ignored, so every engine does the same work), at temperature 0 and 1. Per concurrency the engines are: plain;
chain speculation from the draft model (`ModelDrafter`, kappa 2 and 3); trees from the draft model
(`TreeDrafter(topk, depth)` with kappa = node budget, target-only verification), (topk, depth, nodes) in
(2, 3, 4) and (2, 4, 8). Each engine is built once and warmed on 2 prompts; each round runs every engine at every
concurrency and temperature in one interleaved order, so a busy machine slows them alike. Recorded per cell:
tokens/s (output tokens / wall seconds of `generate`), E = (accepted + drafts) / drafts (tokens per drafting
step), acceptance = accepted / drafted tokens (nodes, for trees), each engine's tokens/s over plain's in the same
round (median over rounds), and at temperature 0 whether every engine's tokens equal plain's (they must).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
from bench_env import load_average, utc_now  # noqa: E402

from speclab.request import SamplingParams  # noqa: E402
from speclab.drafters import ModelDrafter
from speclab.engine import SpecDecoder
from speclab.model import load_model  # noqa: E402
from speclab.train import eval_prompts, tiny_pair_path  # noqa: E402
from speclab.trees import TreeDrafter  # noqa: E402

CHAINS = (2, 3)
TREES = ((2, 3, 4), (2, 4, 8))   # (topk, depth, nodes)
HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="max_num_seqs values (default 1 8)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="default 0 1")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (default 48)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    ap.add_argument("--out-json", default=os.path.join(HERE, "tree_engine.json"), help="JSON output path")
    ap.add_argument("--out-md", default=os.path.join(HERE, "tree_engine.md"), help="markdown output path")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tokens < 4 or min(a.concurrency) < 1 or a.prompts < 2:
        ap.error("--rounds and --concurrency must be >= 1, --tokens >= 4, --prompts >= 2")
    return a


def cpu_model() -> str:
    "The CPU's model name as lscpu reports it."
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown"


def engines(target, draft, concurrency: int) -> dict:
    "Every engine of one concurrency: plain, chains at kappa 2 and 3, the trees."
    common = dict(block_size=16, max_num_seqs=concurrency, seed=0, num_blocks=16 * concurrency + 64)
    out = {"plain": SpecDecoder(target, None, kappa=0, **common)}
    for k in CHAINS:
        out[f"chain k={k}"] = SpecDecoder(target, ModelDrafter(draft), kappa=k, **common)
    for topk, depth, nodes in TREES:
        out[f"tree {topk}x{depth} n={nodes}"] = SpecDecoder(target, TreeDrafter(draft, topk=topk, depth=depth),
                                                            kappa=nodes, **common)
    return out


def run(eng: SpecDecoder, prompts: list, params: SamplingParams) -> dict:
    "Tokens/s, E, acceptance and the token ids of one generate call over the prompts."
    m = eng.metrics
    before = (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    seconds = time.perf_counter() - t0
    m = eng.metrics
    drafts, drafted, accepted = (m.num_drafts - before[0], m.num_draft_tokens - before[1],
                                 m.num_accepted_tokens - before[2])
    tokens = [list(o.token_ids) for o in outs]
    return {"tokens_per_s": sum(map(len, tokens)) / seconds, "seconds": seconds,
            "E": (accepted + drafts) / drafts if drafts else None,
            "acceptance": accepted / drafted if drafted else None, "ids": tokens}


def median(xs: list) -> float | None:
    "Median of the non-None values (None if none)."
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict) -> dict:
    "Per cell and engine: medians of tokens/s, E, acceptance, ratio to plain in the same round; greedy exactness."
    cells = {}
    for cell, by_engine in runs.items():
        plain = by_engine["plain"]
        row = {}
        for name, rs in by_engine.items():
            ratios = [r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(rs, plain)]
            row[name] = {"tokens_per_s": median([r["tokens_per_s"] for r in rs]),
                         "tokens_per_s_rounds": [r["tokens_per_s"] for r in rs],
                         "ratio_to_plain": median(ratios), "ratio_to_plain_rounds": ratios,
                         "E": median([r["E"] for r in rs]), "acceptance": median([r["acceptance"] for r in rs]),
                         "output_tokens": sum(map(len, rs[0]["ids"]))}
            if cell[1] == 0:
                row[name]["equals_plain"] = all(r["ids"] == p["ids"] for r, p in zip(rs, plain))
        cells[f"C={cell[0]} T={cell[1]:g}"] = row
    return cells


def fmt(x: float | None, spec: str) -> str:
    "A number or a dash."
    return "-" if x is None else format(x, spec)


def markdown(out: dict) -> str:
    "The report: date, machine, command, the table (the reading is written by hand below it)."
    lines = ["# Chain vs token-tree speculation in speclab's engine (measured)", "",
             f"- date: {out['date']}", f"- machine: {out['machine']} ({out['cpus']} cores, {out['torch_threads']} "
             f"torch threads), torch {out['torch']}", f"- load average (1 min) before / after: "
             f"{out['load_before']} / {out['load_after']}", f"- command: `{out['command']}`",
             f"- {out['args']['prompts']} held-out prompts x {out['args']['prompt_len']} tokens, "
             f"{out['args']['tokens']} new tokens each (EOS ignored), {out['args']['rounds']} interleaved rounds, "
             "medians; ratio = tokens/s over plain's in the same round (median)", "",
             "| cell | engine | tokens/s | x plain | E | acceptance | = plain (greedy) |",
             "|---|---|---:|---:|---:|---:|:---:|"]
    for cell, row in out["cells"].items():
        for name, r in row.items():
            eq = {True: "yes", False: "NO", None: ""}[r.get("equals_plain")]
            lines.append(f"| {cell} | {name} | {r['tokens_per_s']:.1f} | {r['ratio_to_plain']:.2f} | "
                         f"{fmt(r['E'], '.2f')} | {fmt(r['acceptance'], '.2f')} | {eq} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    "Build, warm, run the interleaved grid, write the JSON and the markdown table."
    a = parse_args(argv)
    torch.set_num_threads(2)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    prompts = eval_prompts(a.prompts, a.prompt_len, seed=0)
    grid = {c: engines(target, draft, c) for c in a.concurrency}
    for engs in grid.values():
        for eng in engs.values():
            for t in a.temperatures:
                eng.generate(prompts[:2], SamplingParams(temperature=t, max_tokens=8, ignore_eos=True))   # warm
    cells = [(c, t) for c in a.concurrency for t in a.temperatures]
    runs = {cell: {name: [] for name in grid[cell[0]]} for cell in cells}
    load_before, t0 = load_average(), time.perf_counter()
    for _ in range(a.rounds):
        for c, t in cells:
            params = SamplingParams(temperature=t, max_tokens=a.tokens, ignore_eos=True)
            for name, eng in grid[c].items():
                runs[(c, t)][name].append(run(eng, prompts, params))
    cmd = ["python benchmarks/trees/tree_engine.py"] + list(argv if argv is not None else sys.argv[1:])
    out = {"date": utc_now(), "machine": cpu_model(), "cpus": os.cpu_count(),
           "torch_threads": torch.get_num_threads(),
           "torch": torch.__version__, "load_before": load_before, "load_after": load_average(),
           "timed_s": time.perf_counter() - t0, "args": vars(a),
           "command": " ".join(cmd),
           "chains": list(CHAINS), "trees_topk_depth_nodes": [list(x) for x in TREES], "cells": summarize(runs)}
    with open(a.out_json, "w") as f:
        json.dump(out, f, indent=1)
    md = markdown(out)
    with open(a.out_md, "w") as f:
        f.write(md)
    print(md)
    return out


if __name__ == "__main__":
    main()
