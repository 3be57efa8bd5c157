"""Time the rejection sampler's ops on a GPU: the torch reference (speclab.sampling) against the Triton kernels
(speclab.kernels), next to the memory floor of each op. Also checks, on the GPU, that both give the same tokens.

    python benchmarks/gpu/sampler_gpu.py --out benchmarks/gpu/results/h100      # on a CUDA machine, < 5 minutes on an H100
    python benchmarks/gpu/sampler_gpu.py --dry-run --out /tmp/smoke         # CPU smoke test: tiny sizes, Triton interpreter

Writes results.json (date, GPU, versions, copy bandwidth, one record per op/implementation/B/kappa) and results.md
(a table) into --out. Times are microseconds per call: CUDA events around each call, after warmup, median of repeats.

The memory floor of an op is the bytes it must move (inputs read once, outputs written once; see FLOOR below) divided
by the copy bandwidth this script measures with a large device-to-device copy. Greedy and the accept test move a few
bytes per row, so their floor is far below launch latency; the vocabulary-wide ops are the ones the floor describes.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

OPS = ["greedy_sample", "random_sample", "recovered_exponential", "recovered_inverse_cdf", "chain_sample", "block_sample"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Results: see benchmarks/README.md; record runs in benchmarks/RESULTS.md.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/gpu/results"), help="directory for results.json and results.md")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256], metavar="B")
    ap.add_argument("--kappas", type=int, nargs="+", default=[1, 3, 7], metavar="K", help="drafts per request")
    ap.add_argument("--vocab", type=int, default=128_256, help="vocabulary size V (default: Llama 3)")
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-draft-probs", action="store_true", help="deterministic draft (draft_probs=None)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU smoke test: Triton interpreter, B in {1, 3}, kappa in {1, 2}, V = 300, 2 repeats")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.batch_sizes, args.kappas, args.vocab, args.warmup, args.repeats = [1, 3], [1, 2], 300, 1, 2
    return args


ARGS = parse_args()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported (speclab.kernels imports it)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import triton  # noqa: E402

import speclab.kernels as K  # noqa: E402
import speclab.sampling as ref  # noqa: E402

DEVICE = "cpu" if ARGS.dry_run else "cuda"


def timer(fn, warmup, repeats):
    "Median microseconds per call of fn(): CUDA events on a GPU, perf_counter on the CPU smoke path."
    for _ in range(warmup): fn()
    times = []
    for _ in range(repeats):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(); end.record(); torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def copy_bandwidth():
    "Bytes per second of a large device-to-device copy (read + write counted), median of repeats."
    n = (1 << 30) if DEVICE == "cuda" else (1 << 24)   # 1 GiB on the GPU, 16 MiB on the CPU
    src, dst = torch.empty(n, dtype=torch.uint8, device=DEVICE), torch.empty(n, dtype=torch.uint8, device=DEVICE)
    us = timer(lambda: dst.copy_(src), 3, 10 if DEVICE == "cuda" else 3)
    return 2 * n / (us * 1e-6)


def make_batch(B, kappa, V, draft_probs, seed):
    "B requests with kappa drafts each, drafted from q, with the random inputs drawn as the reference draws them."
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    N = B * kappa
    logits = torch.randn(N, V, device=DEVICE, generator=g) * 4
    target = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(N, V, device=DEVICE, generator=g) * 2, -1)   # a draft that often agrees
    draft = torch.multinomial(q, 1, generator=g).squeeze(1)
    n = torch.full((B,), kappa, dtype=torch.int64)
    return dict(n=n, cu=ref.cu_num_draft_tokens(n).to(DEVICE), draft=draft, draft_probs=q if draft_probs else None,
                target_probs=target, argmax=target.argmax(-1), bonus=torch.randint(0, V, (B,), device=DEVICE, generator=g),
                uniform=torch.rand(N, dtype=torch.float64, device=DEVICE, generator=g),
                exponentials=torch.empty(B, V, device=DEVICE).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny),
                coins=torch.rand(B, dtype=torch.float64, device=DEVICE, generator=g))


def call(mod, op, x, out):
    "A closure running op `op` of module `mod` on batch `x`, writing into `out` where the op is in place."
    cu, d, q, p, rec = x["cu"], x["draft"], x["draft_probs"], x["target_probs"], x["recovered"]
    return {
        "greedy_sample": lambda: mod.greedy_sample(out, cu, d, x["argmax"], x["bonus"]),
        "random_sample": lambda: mod.random_sample(out, cu, d, q, p, x["bonus"], rec, x["uniform"]),
        "recovered_exponential": lambda: mod.recovered_exponential(cu, d, q, p, x["exponentials"]),
        "recovered_inverse_cdf": lambda: mod.recovered_inverse_cdf(cu, d, q, p, x["coins"]),
        "chain_sample": lambda: mod.chain_sample(out, cu, d, q, p, x["bonus"], x["uniform"], x["coins"]),
        "block_sample": lambda: mod.block_sample(out, cu, d, q, p, x["bonus"], x["uniform"], x["exponentials"]),
    }[op]


def floor_bytes(op, x, out):
    """Bytes an op must move at least. Row-wise ops read each probability row once (p, and q when given) plus the noise
    row of each request; the chain kernel only reads the row of each request's first rejection; block verification
    needs every row (each h_i reads the next position's row); scalar traffic is 8 bytes per id or coin."""
    B, N, V = len(x["n"]), len(x["draft"]), x["target_probs"].shape[1]
    rows = 2 if x["draft_probs"] is not None else 1
    ids = 8 * (3 * N + 3 * B)                                   # drafts, coins/argmax/recovered, cu, bonus, outputs
    if op in ("greedy_sample", "random_sample"): return ids
    if op == "recovered_exponential": return N * V * 4 * rows + B * V * 4 + 8 * N
    if op == "recovered_inverse_cdf": return N * V * 4 * rows + 8 * (N + B)
    emitted = (out >= 0).sum(1).cpu()
    rejected = int((emitted < x["n"] + 1).sum())
    if op == "chain_sample": return ids + rejected * V * 4 * rows
    if op == "block_sample": return ids + N * V * 4 * rows + rejected * V * 4
    raise ValueError(op)


def run(args):
    bw = copy_bandwidth()
    records = []
    K.CHECKS = False   # time the launches, not argument validation (the reference validates nothing either)
    for B in args.batch_sizes:
        for kappa in args.kappas:
            x = make_batch(B, kappa, args.vocab, not args.no_draft_probs, args.seed)
            x["recovered"] = ref.recovered_exponential(x["cu"], x["draft"], x["draft_probs"], x["target_probs"], x["exponentials"])
            for op in args.ops:
                fresh = lambda: torch.full((B, kappa + 1), -1, dtype=torch.int64, device=DEVICE)
                results = {impl: call(mod, op, x, fresh())() for impl, mod in (("torch", ref), ("triton", K))}
                parity = bool(torch.equal(results["torch"], results["triton"]))
                fb = floor_bytes(op, x, results["torch"] if results["torch"].dim() == 2 else fresh())
                for impl, mod in (("torch", ref), ("triton", K)):
                    us = timer(call(mod, op, x, fresh()), args.warmup, args.repeats)
                    records.append(dict(op=op, impl=impl, B=B, kappa=kappa, V=args.vocab, N=B * kappa, us=round(us, 2),
                                        floor_bytes=fb, floor_us=round(fb / bw * 1e6, 3), parity=parity))
                print(f"B={B:4d} kappa={kappa} {op:22s} torch {records[-2]['us']:10.1f} us  triton {records[-1]['us']:10.1f} us"
                      f"  floor {records[-1]['floor_us']:8.2f} us  parity {parity}", flush=True)
            del x
            if DEVICE == "cuda": torch.cuda.empty_cache()
    return bw, records


def markdown(meta, records):
    lines = [f"# Rejection sampler: torch reference vs Triton ({meta['gpu']})", "",
             f"{meta['date']} · torch {meta['torch']} · triton {meta['triton']} · V = {meta['vocab']} · "
             f"draft probs: {meta['draft_probs']} · copy bandwidth {meta['copy_bandwidth_GBps']:.0f} GB/s · "
             f"`{meta['command']}`", "",
             "µs per call, median of repeats. floor = bytes the op must move / measured copy bandwidth.", "",
             "| op | B | κ | torch µs | triton µs | speedup | floor µs | triton / floor | bit parity |",
             "|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    by = {(r["op"], r["B"], r["kappa"], r["impl"]): r for r in records}
    for op in dict.fromkeys(r["op"] for r in records):
        for (o, B, k, impl), r in by.items():
            if o != op or impl != "triton": continue
            t = by[(op, B, k, "torch")]
            lines.append(f"| {op} | {B} | {k} | {t['us']:.1f} | {r['us']:.1f} | {t['us'] / r['us']:.1f}× | "
                         f"{r['floor_us']:.2f} | {r['us'] / max(r['floor_us'], 1e-9):.1f}× | {'yes' if r['parity'] else '**NO**'} |")
    return "\n".join(lines) + "\n"


def main(args=ARGS):
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("sampler_gpu.py needs a CUDA GPU; use --dry-run for the CPU smoke test")
    t0 = time.time()
    bw, records = run(args)
    meta = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                gpu=torch.cuda.get_device_name() if DEVICE == "cuda" else f"CPU ({platform.processor() or platform.machine()}), interpreter",
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                vocab=args.vocab, draft_probs=not args.no_draft_probs, warmup=args.warmup, repeats=args.repeats,
                copy_bandwidth_GBps=bw / 1e9, command="python " + " ".join(sys.argv), dry_run=args.dry_run,
                wall_s=round(time.time() - t0, 1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(dict(meta=meta, results=records), indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(meta, records))
    bad = [r for r in records if not r["parity"]]
    print(f"wrote {args.out}/results.json and results.md in {meta['wall_s']} s; parity failures: {len(bad) // 2}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
