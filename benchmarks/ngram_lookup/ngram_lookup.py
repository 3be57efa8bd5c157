"""Prompt lookup's tokens per step under three rules for where the guess comes from, on the shipped target's greedy
text and on human-written code.

    python benchmarks/ngram_lookup/ngram_lookup.py [--prompts 64] [--max-tokens 128] [--kappa 1 2 3 4] [--out FILE]

The rules, all on the last m tokens for m = 3 down to 1 (the longest suffix that occurred before wins):

- `copy`: speclab's `ngram_propose`, the latest earlier match, its continuation read on past the end of the context
  as an LZ77 copy (a run up to the end repeats its period);
- `stop`: the latest earlier match, its continuation cut at the end of the context (speclab's rule before the copy);
- `earliest`: the earliest match, cut at the end (vLLM v1's `NgramProposer`).

A greedy target accepts a draft up to its first token that differs from the text, so tokens per step follow from
the text alone: the shipped target's greedy continuations of `--prompts` held-out prompts (`--max-tokens` each,
generated once), and windows of the held-out code itself (human-written, 64 tokens of context first). Prints, per
kappa and text, the mean tokens per step of each rule and its ratio to `stop`, side by side; writes them as JSON.
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from speclab.drafters import ngram_propose  # noqa: E402


def latest_match(tokens: list[int], n: int = 3) -> int | None:
    "Where the continuation of the latest earlier match of the longest suffix (m = n..1) starts, or None."
    for m in range(min(n, len(tokens) - 1), 0, -1):
        for i in range(len(tokens) - m - 1, -1, -1):
            if tokens[i:i + m] == tokens[-m:]:
                return i + m
    return None


def earliest_match(tokens: list[int], n: int = 3) -> int | None:
    "The same with the earliest earlier match of the longest suffix (vLLM's rule)."
    for m in range(min(n, len(tokens) - 1), 0, -1):
        for i in range(len(tokens) - m):
            if tokens[i:i + m] == tokens[-m:]:
                return i + m
    return None


def stop(tokens: list[int], kappa: int) -> list[int]:
    "The latest match, cut at the end of the context."
    start = latest_match(tokens)
    return [] if start is None else tokens[start:start + kappa]


def earliest(tokens: list[int], kappa: int) -> list[int]:
    "The earliest match, cut at the end of the context."
    start = earliest_match(tokens)
    return [] if start is None else tokens[start:start + kappa]


RULES = {"copy": ngram_propose, "stop": stop, "earliest": earliest}


def tokens_per_step(rule, text: list[int], start: int, kappa: int) -> tuple[int, int]:
    "Tokens emitted and steps taken to decode text[start:] greedily with `rule`'s drafts."
    pos, steps = start, 0
    while pos < len(text):
        draft = rule(text[:pos], kappa)
        accepted = 0
        while accepted < len(draft) and pos + accepted < len(text) and draft[accepted] == text[pos + accepted]:
            accepted += 1
        pos += accepted + 1
        steps += 1
    return pos - start, steps


def greedy_texts(num_prompts: int, max_tokens: int) -> list[tuple[int, list[int]]]:
    "The shipped target's greedy continuations of held-out prompts: (prompt length, prompt + continuation)."
    import torch
    from speclab.model import generate, load_model
    from speclab.sweep import sweep_prompts
    from speclab.train import tiny_pair_path
    torch.set_num_threads(1)
    target = load_model(tiny_pair_path("target"))
    texts = []
    for j, prompt in enumerate(sweep_prompts(num_prompts)):
        texts.append((len(prompt), list(prompt) + generate(target, None, list(prompt), max_tokens, temperature=0)))
        print(f"\rgreedy text {j + 1}/{num_prompts}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return texts


def code_windows(num: int, length: int, seed: int = 0) -> list[tuple[int, list[int]]]:
    "Windows of the held-out code itself: 64 tokens of context, then `length - 64` to decode."
    from speclab.train import shipped_heldout_ids
    ids = shipped_heldout_ids().tolist()
    starts = np.random.default_rng(seed).integers(0, len(ids) - length, num)
    return [(64, ids[s:s + length]) for s in starts]


def measure(texts: list, kappa: int) -> dict:
    "Per rule: the mean tokens per step over all texts (tokens over steps, pooled)."
    out = {}
    for name, rule in RULES.items():
        tokens = steps = 0
        for start, text in texts:
            t, s = tokens_per_step(rule, text, start, kappa)
            tokens += t
            steps += s
        out[name] = round(tokens / steps, 4)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts to continue greedily (default 64)")
    ap.add_argument("--max-tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    ap.add_argument("--kappa", type=int, nargs="+", default=[1, 2, 3, 4], help="kappas (default 1 2 3 4)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    for name in ("prompts", "max_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(k < 1 for k in args.kappa):
        raise SystemExit(f"--kappa values must be >= 1, got {args.kappa}")
    t0 = time.time()
    texts = {"greedy": greedy_texts(args.prompts, args.max_tokens),
             "code": code_windows(args.prompts, 64 + args.max_tokens)}
    rows = []
    for kappa in args.kappa:
        for name, group in texts.items():
            per_rule = measure(group, kappa)
            ratios = {rule: round(per_rule[rule] / per_rule["stop"], 4) for rule in RULES}
            rows.append({"kappa": kappa, "text": name, "tokens_per_step": per_rule, "over_stop": ratios})
            print(f"kappa {kappa} {name:6s} tokens/step " + "  ".join(f"{r} {v:.3f}" for r, v in per_rule.items())
                  + "   over stop: " + "  ".join(f"{r} {v:.3f}" for r, v in ratios.items()), flush=True)
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor()
              or platform.machine(), "python": platform.python_version(), "seconds": round(time.time() - t0, 1),
              "command": " ".join(["python", "benchmarks/ngram_lookup/ngram_lookup.py", *(argv or sys.argv[1:])]),
              "prompts": args.prompts, "max_tokens": args.max_tokens, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
