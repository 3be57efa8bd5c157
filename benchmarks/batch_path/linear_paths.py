"""The shipped target's matrix products through torch's two CPU paths: `F.linear` (MKL's sgemm) and oneDNN with the
weight prepacked for the batch (`torch.ops.mkldnn._linear_pointwise` on `_reorder_linear_weight`, what vLLM-CPU and
torch.compile's CPU backend use), per weight shape and rows M, one thread by default.

    python benchmarks/batch_path/linear_paths.py                 # table
    python benchmarks/batch_path/linear_paths.py --out FILE      # also one JSON file

The batch-path section of benchmarks/RESULTS.md names the matrix products as where speclab's target forward loses to
vLLM-CPU's; this measures whether prepacking alone would win them back on this machine. Also prints the largest
difference between the two paths' outputs.
"""
import argparse
import json
import platform
import time

import torch
import torch.nn.functional as F

from speclab.model import load_model
from speclab.train import tiny_pair_path


def shapes() -> list[tuple[str, int, int]]:
    "(name, in, out) of every distinct product of the shipped target's forward: the fused projections and the head."
    a = load_model(tiny_pair_path("target")).args
    qkv = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
    return [("qkv_proj", a.hidden_size, qkv), ("o_proj", a.num_heads * a.head_dim, a.hidden_size),
            ("gate_up_proj", a.hidden_size, 2 * a.intermediate_size), ("down_proj", a.intermediate_size, a.hidden_size),
            ("lm_head", a.hidden_size, a.vocab_size)]


def per_call_us(fn, repeats: int) -> float:
    "Median of 5 timings of `repeats` calls, in microseconds per call, after a warm-up."
    for _ in range(20):
        fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - t0) / repeats * 1e6)
    return sorted(times)[2]


def main(argv: list[str] | None = None) -> dict:
    "Time both paths at every shape and M; print the table."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64], help="M: rows of the input")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the servers were compared)")
    ap.add_argument("--repeats", type=int, default=200, help="calls per timing (default 200)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'product':>12} {'M':>4} {'F.linear us':>12} {'packed us':>10} {'packed / linear':>16} {'max |diff|':>11}")
    for name, n_in, n_out in shapes():
        w = torch.randn(n_out, n_in, generator=gen)
        for m in a.rows:
            x = torch.randn(m, n_in, generator=gen)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            dense = per_call_us(lambda: F.linear(x, w), a.repeats)
            onednn = per_call_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), a.repeats)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            diff = float((F.linear(x, w) - y).abs().max())
            rows.append({"product": name, "in": n_in, "out": n_out, "M": m, "linear_us": dense, "packed_us": onednn,
                         "ratio": onednn / dense, "max_abs_diff": diff})
            print(f"{name:>12} {m:>4} {dense:12.1f} {onednn:10.1f} {onednn / dense:16.2f} {diff:11.1e}")
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
