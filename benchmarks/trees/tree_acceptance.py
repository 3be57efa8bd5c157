"""Acceptance length E of a chain vs a token tree on the shipped tiny pair, and a CPU cost model.

What it measures, on P held-out prefixes (non-overlapping 64-token windows of `shipped_heldout_ids()`, seeded choice):

* exact E (no sampling noise): for budgets N = 1..16 drafted nodes, the mean over prefixes of `reach_probs(...).sum()`
  for the top-1 chain (`draft_tree(prefix, draft_fn, (1,) * N, "topk", None)`) and the EAGLE-2 dynamic tree
  (`dynamic_tree(prefix, draft_fn, N, topk, min(N, 6))`, topk 2 and 4), with the target at temperature 1 and greedy
  (one-hot rows). The draft builds the trees at temperature 1 (its top-k order is the same at any temperature).
* sampled E at temperature 1 (draft and target): the mean tokens `verify_tree` emits for i.i.d. and
  without-replacement trees of shapes (2,), (2, 1), (4, 1) vs the i.i.d. chain with the same node count (N = 2, 4, 8),
  over trees drawn per prefix x verify walks per tree (seeded), with its standard error.
* cost: the median wall time of one target `forward_paged` (its `paged_batch` included) feeding n = N + 1 positions
  after a 64-token context, for N = 0..16, and of one draft forward feeding 1, 2 and 4 positions; then the MODELED
  tokens/s = E / (verify_s(N) + drafts * draft_s), chain: drafts = N one-token draft forwards; dynamic tree: one
  one-token forward then depth - 1 forwards of topk tokens; sampled trees: one forward per level feeding its nodes.
  This is a model from measured forward times, not an engine measurement.

Target rows: ONE forward per tree (`tree_rows`: the prefix as a chain plus the tree's nodes, `tree_parents` masking
each node to its ancestors, positions start + depth); the first prefix checks it against one chain forward per path.
Draft rows: one forward per expanded node (prefix + path as a chain; the draft has 2 layers). All rows are memoised per
token path, as logits, so both temperatures share them.

    .venv/bin/python benchmarks/trees/tree_acceptance.py                  # defaults: P = 48, about 2-4 minutes on 2 cores
    .venv/bin/python benchmarks/trees/tree_acceptance.py --prefixes 8 --trees 2 --repeats 5   # a quick look

Writes benchmarks/trees/tree_acceptance.json and benchmarks/trees/tree_acceptance.md (--out) and prints the tables.
"""
import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from speclab.model import forward_paged, load_model, paged_batch, paged_cache
from speclab.train import shipped_heldout_ids, tiny_pair_path
from speclab.trees import TokenTree, draft_tree, dynamic_tree, reach_probs, verify_tree

HERE = Path(__file__).resolve().parent
BLOCK_SIZE = 16
SAMPLED_SHAPES = {2: (2,), 4: (2, 1), 8: (4, 1)}     # N -> tree widths with N nodes (the chain: (1,) * N)


def pick_prefixes(num, length, seed):
    "num non-overlapping held-out windows of `length` tokens, chosen with a seeded generator."
    ids = shipped_heldout_ids().numpy()
    windows = len(ids) // length
    starts = np.sort(np.random.default_rng(seed).choice(windows, size=num, replace=False)) * length
    return [tuple(int(t) for t in ids[s:s + length]) for s in starts]


def fresh_cache(model, positions):
    "A paged cache with one request's worth of blocks and its block table (blocks 0, 1, ...)."
    num_blocks = -(-positions // BLOCK_SIZE)
    return paged_cache(model.args, num_blocks, BLOCK_SIZE), [list(range(num_blocks))]


def tree_rows(model, prefix, tree):
    """Logits [len(tree), V] at the root (the prefix's last token) and every node, from ONE forward: the prefix fed as
    a chain and the nodes as a tree below its last token (tree_parents: a node sees the prefix and its ancestors)."""
    n = len(prefix)
    parents = [-1] + list(range(n - 1)) + [n - 1 + int(p) for p in tree.parents[1:]]
    block = list(prefix) + [int(t) for t in tree.tokens[1:]]
    cache, table = fresh_cache(model, len(block))
    batch = paged_batch([block], [0], table, BLOCK_SIZE, tree_parents=[parents])
    rows = torch.arange(n - 1, len(block))
    return forward_paged(model, cache, batch, rows).double().numpy()


def chain_row(model, tokens):
    "Logits [V] after a chain of tokens (one forward, no tree)."
    cache, table = fresh_cache(model, len(tokens))
    batch = paged_batch([list(tokens)], [0], table, BLOCK_SIZE)
    return forward_paged(model, cache, batch, torch.tensor([len(tokens) - 1]))[0].double().numpy()


def probs_at(logits, temperature):
    "A probability row from logits: softmax(logits / T), or the argmax one-hot at T = 0."
    if temperature == 0:
        row = np.zeros(len(logits))
        row[int(np.argmax(logits))] = 1.0
        return row
    z = logits / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def draft_fn_for(model, memo, temperature, counts):
    "A memoised NextTokenFn of the draft: one forward of the whole path per new path."
    def fn(path):
        path = tuple(path)
        if path not in memo:
            memo[path] = chain_row(model, path)
            counts["draft_forwards"] += 1
        return probs_at(memo[path], temperature)
    return fn


def target_rows(model, memo, prefix, tree, temperature, counts):
    "The target's rows at every node of `tree`: one forward of the whole tree unless every path is memoised."
    paths = [prefix + p for p in tree.paths()]
    if any(p not in memo for p in paths):
        for path, row in zip(paths, tree_rows(model, prefix, tree)):
            memo[path] = row
        counts["target_forwards"] += 1
    return [probs_at(memo[p], temperature) for p in paths]


def check_tree_rows(target, prefix, tree):
    "Largest |logit| gap between tree_rows and one chain forward per path (the one-forward path's correctness)."
    rows = tree_rows(target, prefix, tree)
    return max(float(np.abs(rows[i] - chain_row(target, prefix + p)).max()) for i, p in enumerate(tree.paths()))


def exact_e(prefixes, draft_fn, target, tmemo, budgets, topks, counts):
    "Mean exact E per (kind, temperature, N): reach_probs(...).sum() of chains and dynamic trees."
    kinds = ["chain"] + [f"dynamic_top{k}" for k in topks]
    out = {(kind, t): np.zeros(len(budgets)) for kind in kinds for t in (1.0, 0.0)}
    for prefix in prefixes:
        for j, n in enumerate(sorted(budgets, reverse=True)):   # the largest tree first: it memoises the others' rows
            trees = {"chain": draft_tree(prefix, draft_fn, (1,) * n, "topk", None)}
            for k in topks:
                trees[f"dynamic_top{k}"] = dynamic_tree(prefix, draft_fn, n, topk=k, depth=min(n, 6))
            for kind, tree in trees.items():
                for t in (1.0, 0.0):
                    rows = target_rows(target, tmemo, prefix, tree, t, counts)
                    out[kind, t][budgets.index(n)] += reach_probs(tree, rows).sum() / len(prefixes)
    return {f"{kind}@T={t:g}": [round(float(x), 4) for x in v] for (kind, t), v in out.items()}


def sampled_e(prefixes, draft_fn, target, tmemo, num_trees, num_walks, seed, counts):
    "Sampled E at T = 1: mean tokens verify_tree emits for iid/wor trees vs the iid chain, with its standard error."
    rng = np.random.default_rng(seed)
    out = {}
    for n, shape in SAMPLED_SHAPES.items():
        for name, widths, scheme in (("chain_iid", (1,) * n, "iid"), (f"tree_iid{shape}", shape, "iid"),
                                     (f"tree_wor{shape}", shape, "wor")):
            emitted = []
            for prefix in prefixes:
                for _ in range(num_trees):
                    tree = draft_tree(prefix, draft_fn, widths, scheme, rng)
                    rows = target_rows(target, tmemo, prefix, tree, 1.0, counts)
                    emitted += [len(verify_tree(tree, rows, rng)[1]) for _ in range(num_walks)]
            e = np.asarray(emitted, float)
            out[f"N={n} {name}"] = {"N": n, "widths": list(widths), "scheme": scheme, "E": round(float(e.mean()), 4),
                                    "stderr": round(float(e.std(ddof=1) / np.sqrt(len(e))), 4), "draws": len(e)}
    return out


def median_forward_s(model, context, n, repeats):
    "Median seconds of one forward_paged (its paged_batch included) feeding n tokens after `context` cached tokens."
    cache, table = fresh_cache(model, context + n)
    forward_paged(model, cache, paged_batch([[1] * context], [0], table, BLOCK_SIZE))
    times = []
    for _ in range(repeats + 2):                               # two warm-ups
        t0 = time.perf_counter()
        forward_paged(model, cache, paged_batch([[1] * n], [context], table, BLOCK_SIZE))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:]))


def modeled_tps(exact, budgets, verify_s, draft1_s, draftk_s, topks):
    "Modeled tokens/s = E / (verify_s(N) + drafts * draft_s) per kind and temperature (plus N = 0: plain decoding)."
    out = {"plain@N=0": round(1 / verify_s[0], 1)}
    for key, es in exact.items():
        kind = key.split("@")[0]
        row = []
        for n, e in zip(budgets, es):
            if kind == "chain":
                cost = verify_s[n] + n * draft1_s
            else:
                k = int(kind.removeprefix("dynamic_top"))
                cost = verify_s[n] + draft1_s + (min(n, 6) - 1) * draftk_s[k]   # the root, then topk per level
            row.append(round(e / cost, 1))
        out[key] = row
    return out


def machine():
    "lscpu's model name (or the platform's processor string)."
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def table(header, rows):
    "A markdown table."
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def report(res, command):
    "The markdown report: date, machine, command, tables and a reading."
    b, ex, tps, cost = res["budgets"], res["exact_E"], res["modeled_tokens_per_s"], res["forward_s"]
    show = [n for n in (1, 2, 4, 6, 8, 12, 16) if n in b]
    cols = list(ex)
    e_rows = [[n] + [ex[c][b.index(n)] for c in cols] for n in show]
    s_rows = [[v["N"], k.split(" ", 1)[1], v["E"], v["stderr"], v["draws"], v["modeled_tokens_per_s"]]
              for k, v in res["sampled_E"].items()]
    f_rows = [[n, n + 1, f"{cost['target_verify'][str(n)] * 1e3:.2f}"] for n in (0, 4, 8, 16) if str(n) in
              cost["target_verify"]]
    d_rows = [[k, f"{v * 1e3:.2f}"] for k, v in cost["draft"].items()]
    t_rows = [[n] + [tps[c][b.index(n)] for c in cols] for n in show]
    a = res["args"]
    return "\n\n".join([
        "# Acceptance length E: chain vs token tree on the shipped tiny pair (measured)",
        f"Date: {res['date']}  \nMachine: {res['machine']} ({res['threads']} torch threads), torch {res['torch']}  \n"
        f"Command: `{command}`  \nPrefixes: {a['prefixes']} held-out windows of {a['prefix_len']} tokens "
        f"(seed {a['seed']}); target rows: one forward per tree (tree_parents), max |logit| gap vs per-path chain "
        f"forwards on prefix 0: {res['tree_rows_check_max_abs']:.2e}",
        "## Exact E (reach_probs sum, mean over prefixes; T=0 is greedy)",
        table(["N"] + cols, e_rows),
        "## Sampled E at T=1 (draft and target), verify_tree walks",
        table(["N", "drafter", "E", "stderr", "draws", "MODELED tokens/s"], s_rows),
        f"## Measured forward cost on this CPU (median of {a['repeats']}, after a {a['prefix_len']}-token context)",
        table(["N verified", "positions fed", "target forward ms"], f_rows),
        table(["draft forward", "ms"], d_rows),
        f"## MODELED tokens/s = E / (verify_s(N) + drafts * draft_s) from the measured forward times (not an engine "
        f"measurement); plain decoding (N = 0): {tps['plain@N=0']} tokens/s",
        table(["N"] + cols, t_rows),
        "## Reading",
        res["reading"]])


def versus(a, b):
    "'beats' / 'trails' / 'ties' for a vs b."
    return "ties" if abs(a - b) < 0.005 else ("beats" if a > b else "trails")


def reading(res):
    "3-5 sentences from the numbers (the verbs follow the data)."
    b, ex, tps, s = res["budgets"], res["exact_E"], res["modeled_tokens_per_s"], res["sampled_E"]
    at = lambda key, n: ex[key][b.index(n)]                                   # noqa: E731
    pairs = lambda t: ", ".join(f"{at(f'dynamic_top4@T={t}', n):.2f} vs {at(f'chain@T={t}', n):.2f} at N = {n}"
                                for n in (4, 8, 16))                          # noqa: E731
    best = max((k for k in tps if k.endswith("T=1")), key=lambda k: max(tps[k]))
    bn = b[int(np.argmax(tps[best]))]
    sbest = max(s, key=lambda k: s[k]["modeled_tokens_per_s"])
    where = "N = 1 (every top-k drafter is the same there)" if bn == 1 else f"{best.split('@')[0]} at N = {bn}"
    wor, iid, chain = (s[f"N=8 {k}"]["E"] for k in ("tree_wor(4, 1)", "tree_iid(4, 1)", "chain_iid"))
    verb1, verb0 = (versus(at(f"dynamic_top4@T={t}", 16), at(f"chain@T={t}", 16)) for t in (1, 0))
    return (f"With the target-only rule the top-4 dynamic tree {verb1}"
            f" the top-1 chain at T = 1 (E {pairs(1)}) and {verb0} "
            f"it greedy ({pairs(0)}); past a few levels the chain's reach (a product of p(top-1)) is small, while "
            f"the tree spends the same nodes on siblings. Sampled at T = 1 with the recursive rule, without "
            f"replacement {versus(wor, iid)} i.i.d. at shape (4, 1) (E {wor:.2f} vs {iid:.2f} +- "
            f"{s['N=8 tree_iid(4, 1)']['stderr']:.2f}), and the i.i.d. chain of 8 reaches E {chain:.2f}, "
            f"{'more' if chain > at('chain@T=1', 8) else 'less'} than the deterministic top-1 chain's exact "
            f"{at('chain@T=1', 8):.2f} at N = 8 (the rejection rule accepts a sampled draft with probability "
            f"min(1, p/q), the target-only rule a fixed top-k token with p(x)). On this CPU one target forward costs "
            f"{res['forward_s']['target_verify']['0'] * 1e3:.1f} ms for 1 position and "
            f"{res['forward_s']['target_verify']['16'] * 1e3:.1f} ms for 17, a draft forward "
            f"{res['forward_s']['draft']['1 token(s)'] * 1e3:.1f} ms, so in the cost model (not an engine "
            f"measurement) "
            f"the best top-k setting at T = 1 is {where} with {max(tps[best])} tokens/s, the best sampled one "
            f"{sbest.split(' ', 1)[1]} at N = {s[sbest]['N']} with {s[sbest]['modeled_tokens_per_s']}, vs "
            f"{tps['plain@N=0']} for plain decoding.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefixes", type=int, default=48, help="held-out prefixes P")
    p.add_argument("--prefix-len", type=int, default=64)
    p.add_argument("--max-nodes", type=int, default=16, help="budgets N = 1..max-nodes")
    p.add_argument("--topks", type=int, nargs="+", default=[2, 4], help="dynamic-tree top-k values")
    p.add_argument("--trees", type=int, default=8, help="sampled trees per prefix and shape")
    p.add_argument("--walks", type=int, default=4, help="verify_tree walks per sampled tree")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats per forward size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier times on a shared machine)")
    p.add_argument("--out", default=str(HERE / "tree_acceptance"), help="output path without .json/.md")
    a = p.parse_args(argv)
    if a.max_nodes < 1 or a.prefixes < 1:
        raise ValueError(f"--max-nodes and --prefixes must be >= 1, got {a.max_nodes} and {a.prefixes}")
    t_start = time.perf_counter()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    target, draft = load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft"))
    prefixes = pick_prefixes(a.prefixes, a.prefix_len, a.seed)
    budgets = list(range(1, a.max_nodes + 1))
    counts = {"draft_forwards": 0, "target_forwards": 0}
    dmemo, tmemo = {}, {}
    draft_fn = draft_fn_for(draft, dmemo, 1.0, counts)

    check_tree = dynamic_tree(prefixes[0], draft_fn, 8, topk=4, depth=4)
    gap = check_tree_rows(target, prefixes[0], check_tree)
    print(f"tree_rows vs per-path chain forwards: max |logit| gap {gap:.2e}", flush=True)
    t0 = time.perf_counter()
    exact = exact_e(prefixes, draft_fn, target, tmemo, budgets, a.topks, counts)
    t_exact = time.perf_counter() - t0
    print(f"exact E: {t_exact:.0f} s, {counts}", flush=True)
    t0 = time.perf_counter()
    sampled = sampled_e(prefixes, draft_fn, target, tmemo, a.trees, a.walks, a.seed + 1, counts)
    t_sampled = time.perf_counter() - t0
    print(f"sampled E: {t_sampled:.0f} s, {counts}", flush=True)

    verify_s = {n: median_forward_s(target, a.prefix_len, n + 1, a.repeats) for n in [0] + budgets}
    draft_s = {1: median_forward_s(draft, a.prefix_len, 1, a.repeats)}
    draft_s.update({k: median_forward_s(draft, a.prefix_len, k, a.repeats) for k in a.topks})
    tps = modeled_tps(exact, budgets, verify_s, draft_s[1], draft_s, a.topks)
    for v in sampled.values():                 # drafts: one forward per level, feeding that level's nodes
        level_nodes = np.cumprod([1] + v["widths"][:-1]).tolist()
        for k in level_nodes:
            draft_s.setdefault(k, median_forward_s(draft, a.prefix_len, k, a.repeats))
        v["modeled_tokens_per_s"] = round(v["E"] / (verify_s[v["N"]] + sum(draft_s[k] for k in level_nodes)), 1)
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(a), "budgets": budgets,
           "tree_rows_check_max_abs": gap, "forwards": counts,
           "one_forward_per_tree": "target: yes (tree_parents); draft: one forward per expanded node",
           "exact_E": exact, "sampled_E": sampled,
           "forward_s": {"target_verify": {str(n): s for n, s in verify_s.items()},
                         "draft": {f"{k} token(s)": s for k, s in draft_s.items()}},
           "modeled_tokens_per_s": tps,
           "modeled_note": ("E / (verify_s(N) + drafts * draft_s): chain drafts = N one-token draft forwards; "
                            "dynamic tree drafts = 1 one-token forward then min(N, 6) - 1 forwards of topk tokens; "
                            "sampled trees: one forward per level feeding that level's nodes; a model, not an engine "
                            "measurement"),
           "seconds": {"exact": round(t_exact, 1), "sampled": round(t_sampled, 1),
                       "total": round(time.perf_counter() - t_start, 1)}}
    res["reading"] = reading(res) if a.max_nodes == 16 and 4 in a.topks else "(quick look: no reading)"
    command = "python benchmarks/trees/tree_acceptance.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = report(res, command.strip())
    Path(a.out + ".json").write_text(json.dumps(res, indent=1) + "\n")
    Path(a.out + ".md").write_text(md + "\n")
    print(md)
    return res


if __name__ == "__main__":
    main()
