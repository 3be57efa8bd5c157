"""The speculative-decoding roofline measured end to end on one GPU: a random-initialised Llama-3-8B (target) and
Llama-3.2-1B (draft) in bf16, next to the predictions of Chapter 2 (speclab.roofline). Timing needs no real weights.

    python benchmarks/h100_e2e.py --out benchmarks/results/$(date +%Y-%m-%d)-h100   # on an H100/H200, < 8 minutes
    python benchmarks/h100_e2e.py --dry-run --out /tmp/h100_smoke                  # CPU smoke test: tiny shapes, fp32, < 1 minute

Sections, each a list of records in results.json and a table in results.md (both in --out, rewritten after each):
 1. bandwidth: a 1 GiB device-to-device copy, (read + write bytes) / time;
 2. decode: one target step at B = 1 over --context cached tokens vs its floor, (weight + KV bytes) / measured copy
    bandwidth, and vs decode_floor_s (spec-sheet bandwidth); eager time beside it to show the launch overhead;
 3. draft: the same step of the draft; measured c = t_draft / t_target vs cost_ratio;
 4. verify: ms per target forward of T positions at B = 1; measured knee vs ridge(gpu);
 5. batch: synthetic-acceptance speedup E(alpha, kappa) t_plain / (kappa t_draft + t_verify(kappa + 1)) at batch B;
    the measured crossing batch (speedup = 1, interpolated in log2 B) vs crossing_batch.
--target DIR --draft DIR time local checkpoints instead. A step is a static-shape forward (the math of
speclab.model.forward, checked against it; no host syncs) captured in a CUDA graph, timed with CUDA events: warmup,
then the median of repeats. A failed capture falls back to eager and the record says so. --budget-s skips what is
left (recorded as skipped), so results are always written.
"""
import argparse
import json
import math
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import speclab  # noqa: E402
from speclab.model import KVCache, Llama, LlamaArgs, apply_rope, forward, load_model, mlp, rope_cos_sin, rope_inv_freq  # noqa: E402
from speclab.roofline import ModelSpec, batch_speedup, cost_ratio, crossing_batch, decode_floor_s, get_gpu, ridge, step_cost  # noqa: E402

CONFIGS = Path(speclab.__file__).parent / "data" / "configs"
TINY = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)
log = lambda *a: print(*a, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Results: see benchmarks/README.md; record runs in benchmarks/RESULTS.md.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for results.json and results.md")
    ap.add_argument("--target", type=Path, help="local HF checkpoint folder of the target (default: random Llama-3-8B)")
    ap.add_argument("--draft", type=Path, help="local HF checkpoint folder of the draft (default: random Llama-3.2-1B)")
    ap.add_argument("--kappa", type=int, default=3, help="draft tokens per speculative step")
    ap.add_argument("--alpha", type=float, default=0.7, help="synthetic per-token acceptance rate, in [0, 1)")
    ap.add_argument("--context", type=int, default=256, help="cached tokens per request")
    ap.add_argument("--positions", type=int, nargs="+", default=[2 ** i for i in range(10)], metavar="T", help="verify grid")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[2 ** i for i in range(9)], metavar="B")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=420, help="skip the remaining work after this many seconds")
    ap.add_argument("--no-graphs", action="store_true", help="time eager steps (no CUDA graphs)")
    ap.add_argument("--dry-run", action="store_true", help="smoke test: tiny fp32 models, T <= 8, B <= 4, 2 repeats")
    a = ap.parse_args(argv)
    if a.kappa < 1: ap.error(f"--kappa must be >= 1, got {a.kappa}")
    if not 0 <= a.alpha < 1: ap.error(f"--alpha must lie in [0, 1), got {a.alpha}")
    for flag, grid in (("--positions", a.positions), ("--batch-sizes", a.batch_sizes)):
        if not grid or min(grid) < 1: ap.error(f"{flag} needs at least one integer >= 1, got {grid}")
    for flag, v, lo in (("--context", a.context, 0), ("--warmup", a.warmup, 0), ("--repeats", a.repeats, 1), ("--budget-s", a.budget_s, 1)):
        if v < lo: ap.error(f"{flag} must be >= {lo}, got {v}")
    if (a.target is None) != (a.draft is None): ap.error("--target and --draft must be given together")
    for flag, d in (("--target", a.target), ("--draft", a.draft)):
        if d is not None and not (d / "config.json").is_file(): ap.error(f"{flag} {d} holds no config.json")
    if a.dry_run: a.positions, a.batch_sizes, a.context, a.warmup, a.repeats = [1, 2, 4, 8], [1, 2, 4], 16, 1, 2
    a.positions, a.batch_sizes = sorted(set(a.positions)), sorted(set(a.batch_sizes))
    return a


def timer(fn, warmup, repeats, device):
    "Median milliseconds per call of fn(): CUDA events on a GPU, perf_counter on the CPU."
    for _ in range(warmup): fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(); end.record(); end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def random_model(cfg, dtype, device):
    "A Llama of config dict cfg with N(0, 0.02) weights and unit norms, allocated straight on the device."
    args = LlamaArgs.from_config(cfg)
    with torch.device("meta"): model = Llama(args)
    model = model.to(dtype).to_empty(device=device)
    for name, p in model.named_parameters():
        p.requires_grad_(False)
        p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
    model.inv_freq = rope_inv_freq(args).to(device)
    return model.eval()


def static_attention(layer, x, cos, sin, k_cache, v_cache, ctx, mask, a):
    "speclab.model.attention when every request holds ctx cached tokens: K/V into slots ctx.., no boolean indexing."
    B, T, _ = x.shape
    at, hd, rep = layer.self_attn, a.head_dim, a.num_heads // a.num_kv_heads
    q = at.q_proj(x).view(B, T, a.num_heads, hd).transpose(1, 2)
    k = at.k_proj(x).view(B, T, a.num_kv_heads, hd).transpose(1, 2)
    v = at.v_proj(x).view(B, T, a.num_kv_heads, hd).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache[:, :, ctx:ctx + T], v_cache[:, :, ctx:ctx + T] = k, v
    K, V = (c[:, :, None].expand(-1, -1, rep, -1, -1).reshape(B, a.num_heads, -1, hd) for c in (k_cache, v_cache))
    o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)   # K, V: repeat_interleave(rep, 1) without a sync
    return at.o_proj(o.transpose(1, 2).reshape(B, T, -1))


def make_step(model, cache, T, ctx):
    "(step, tokens): logits of T new tokens for the cache's B requests after ctx cached ones; static, capturable."
    a, dev, B, span = model.args, cache.lengths.device, cache.batch_size, ctx + T
    tokens = torch.randint(0, a.vocab_size, (B, T), device=dev)
    pos = (ctx + torch.arange(T, device=dev)).expand(B, T)
    ks, vs = [k[:, :, :span] for k in cache.k], [v[:, :, :span] for v in cache.v]   # attend over ctx + T slots only

    def step():
        mask = (torch.arange(span, device=dev)[None, None] <= pos[..., None])[:, None]   # [B, 1, T, span]
        x = model.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(model.inv_freq, pos, x.dtype)
        for i, layer in enumerate(model.model.layers):
            x = x + static_attention(layer, layer.input_layernorm(x), cos, sin, ks[i], vs[i], ctx, mask, a)
            x = x + mlp(layer, layer.post_attention_layernorm(x))
        return model.model.norm(x) @ model.head_weight.T
    return step, tokens


def step_parity(device):
    "Max |logit difference| of make_step vs speclab.model.forward on a tiny fp32 model (B = 2, 5 cached, 3 new)."
    model, (B, ctx, T) = random_model(dict(TINY, num_hidden_layers=2), torch.float32, device), (2, 5, 3)
    prefix, new = torch.randint(0, 256, (B, ctx)), torch.randint(0, 256, (B, T))
    caches = [KVCache(model.args, B, ctx + T, torch.float32, device) for _ in range(2)]
    for c in caches: forward(model, prefix, c)
    step, tokens = make_step(model, caches[1], T, ctx)
    tokens.copy_(new)
    return float((step() - forward(model, new, caches[0])).abs().max())


def timed(run, step, label):
    "(ms, mode, graph-vs-eager max |diff|): CUDA-graph replay when possible, else eager; a failed capture disables graphs."
    if run["graphs"]:
        try:
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2): step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g): out = step()
            ms = timer(g.replay, run["warmup"], run["repeats"], "cuda")
            diff = float((out.float() - step().float()).abs().max())
            del g, out
            return ms, "graph", diff
        except Exception as e:  # noqa: BLE001 -- any capture failure: record it, fall back to eager
            log(f"  warning: CUDA graph capture failed at {label} ({type(e).__name__}: {str(e)[:200]}); eager from now on")
            run["graphs"], run["capture_error"] = False, f"{label}: {type(e).__name__}: {str(e)[:300]}"
            try: torch.cuda.synchronize()
            except Exception: pass  # noqa: BLE001 -- the eager timing below will raise if the device is really broken
    return timer(step, run["warmup"], run["repeats"], run["device"]), "eager", None


def measured_crossing(Bs, speedups):
    "First B where the speedup falls to 1, linear in log2 B (0.0: never above 1; inf: above 1 on the whole grid)."
    if speedups[0] <= 1: return 0.0
    for b0, s0, b1, s1 in zip(Bs, speedups, Bs[1:], speedups[1:]):
        if s1 <= 1: return 2 ** (math.log2(b0) + (s0 - 1) / (s0 - s1) * (math.log2(b1) - math.log2(b0)))
    return math.inf


def measured_knee(Ts, ms):
    """T where the flat cost at the smallest T meets the line through the two largest T; None when the grid shows no
    compute-bound tail (the largest T costs under 1.5x the smallest, or the line does not rise)."""
    if len(Ts) < 3 or ms[-1] < 1.5 * ms[0] or ms[-1] <= ms[-2]: return None
    slope = (ms[-1] - ms[-2]) / (Ts[-1] - Ts[-2])
    return max(1.0, Ts[-1] - (ms[-1] - ms[0]) / slope)


def over_budget(run): return time.time() - run["t0"] > run["budget_s"]
def free(run): torch.cuda.empty_cache() if run["device"] == "cuda" else None
def clean(x):
    "JSON-safe: inf/nan become strings."
    if isinstance(x, dict): return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list): return [clean(v) for v in x]
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


def table(recs, cols):
    if not recs: return []
    return ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)] + ["| " + " | ".join(str(r.get(k)) for k in cols) + " |" for r in recs]


def markdown(meta, sections):
    lines = [f"# Speculative decoding end to end: {meta['target']} / {meta['draft']} on {meta['gpu']}", "",
             f"{meta['date']} · torch {meta['torch']} · CUDA {meta['cuda']} · {meta['dtype']} · {meta['weights']} weights · "
             f"roofline spec {meta['gpu_spec']} · copy bandwidth {meta.get('copy_bandwidth_GBps')} GB/s · "
             f"step parity vs forward {meta['step_parity']:.2e} · `{meta['command']}` · {meta.get('wall_s')} s", "",
             "ms per step, median of repeats; mode `graph` = CUDA-graph replay. floor = (weight + KV bytes) / measured copy "
             "bandwidth; spec floor = decode_floor_s (spec-sheet bandwidth).", ""]
    cols = dict(bandwidth=["bytes", "ms", "GBps"],
                decode=["model", "B", "context", "mode", "ms", "eager_ms", "floor_ms", "spec_floor_ms", "ms_over_floor", "achieved_GBps",
                        "graph_vs_eager"],
                verify=["T", "mode", "ms", "ms_per_position", "cost", "predicted_cost"],
                batch=["B", "mode", "plain_ms", "draft_ms", "verify_ms", "spec_ms", "speedup", "predicted"])
    for name, s in sections.items():
        summary = "; ".join(f"{k} = {v}" for k, v in s.get("summary", {}).items())
        lines += [f"## {name}: {s['status']}", ""] + table(s["records"], cols[name]) + (["", summary] if summary else []) + [""]
    return "\n".join(lines) + "\n"


def sec_bandwidth(run, meta, s, m):
    "Copy bandwidth: (read + write bytes) / time of a 1 GiB device-to-device copy (16 MiB on the CPU)."
    n, dev = (1 << 30) if run["device"] == "cuda" else (1 << 24), run["device"]
    src, dst = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    ms = timer(lambda: dst.copy_(src), 3, 10 if dev == "cuda" else 3, dev)
    run["bw"], meta["copy_bandwidth_GBps"] = 2 * n / (ms * 1e-3), round(2 * n / ms * 1e-6, 1)
    s.update(status="ok", records=[dict(bytes=2 * n, ms=round(ms, 4), GBps=meta["copy_bandwidth_GBps"])])
    log(f"  copy bandwidth {meta['copy_bandwidth_GBps']} GB/s")


def sec_decode(run, meta, s, m):
    "One step (T = 1, B = 1) of target and draft over the context vs the floors; c = t_draft / t_target."
    for name in ("target", "draft"):
        model, spec = m[name], m[name + "_spec"]
        cache = KVCache(model.args, 1, run["context"] + 1, run["dtype"], run["device"])
        step, _ = make_step(model, cache, 1, run["context"])
        ms, mode, diff = timed(run, step, f"{name} decode")
        eager = ms if mode == "eager" else timer(step, run["warmup"], run["repeats"], run["device"])
        w, kv = spec.bytes_per_step(run["dt"]), run["context"] * spec.kv_bytes_per_token(run["dt"])
        floor = (w + kv) / run["bw"] * 1e3
        s["records"].append(r := dict(
            model=spec.name, B=1, context=run["context"], mode=mode, ms=round(ms, 4), eager_ms=round(eager, 4),
            graph_vs_eager=diff, weight_bytes=w, kv_bytes=kv, floor_ms=round(floor, 4),
            spec_floor_ms=round(decode_floor_s(spec, run["gpu"], run["dt"]) * 1e3, 4),
            ms_over_floor=round(ms / floor, 3), achieved_GBps=round((w + kv) / ms * 1e-6, 1)))
        log(f"  {spec.name}: {ms:.3f} ms ({mode}; eager {eager:.3f} ms), floor {floor:.3f} ms, spec floor {r['spec_floor_ms']:.3f} ms")
    meta["c_measured"] = c = s["records"][1]["ms"] / s["records"][0]["ms"]
    s.update(status="ok", summary=dict(c_measured=round(c, 4), c_derived=round(meta["c_derived"], 4)))
    log(f"  c measured {c:.4f}, derived (cost_ratio) {meta['c_derived']:.4f}")


def sec_verify(run, meta, s, m):
    "ms per target forward of T positions at B = 1; cost in units of the smallest T next to max(1, T/T*); the knee."
    target, ctx, s["status"] = m["target"], run["context"], "ok"
    cache = KVCache(target.args, 1, ctx + max(run["positions"]), run["dtype"], run["device"])
    for T in run["positions"]:
        if over_budget(run): s["status"] = "partial (budget)"; break
        ms, mode, diff = timed(run, make_step(target, cache, T, ctx)[0], f"verify T={T}")
        recs = s["records"]
        recs.append(dict(T=T, mode=mode, ms=round(ms, 4), ms_per_position=round(ms / T, 5), graph_vs_eager=diff,
                         cost=round(ms / recs[0]["ms"] if recs else 1.0, 3), predicted_cost=float(step_cost(T, meta["ridge"]))))
        log(f"  T={T:4d} {ms:9.3f} ms  cost {recs[-1]['cost']:6.2f}  predicted {recs[-1]['predicted_cost']:6.2f}  ({mode})")
        free(run)
    meta["knee"] = knee = measured_knee([r["T"] for r in s["records"]], [r["ms"] for r in s["records"]])
    s["summary"] = dict(ridge_T_star=round(meta["ridge"], 1), measured_knee=None if knee is None else round(knee, 1))
    log(f"  ridge T* {meta['ridge']:.1f}, measured knee {s['summary']['measured_knee']}")


def sec_batch(run, meta, s, m):
    "Per B: plain step, draft step, verify of kappa + 1 positions; E t_plain / t_spec next to batch_speedup; crossings."
    kappa, alpha, ctx, c, s["status"] = run["kappa"], run["alpha"], run["context"], meta["c_derived"], "ok"
    E = (1 - alpha ** (kappa + 1)) / (1 - alpha)
    for B in run["batch_sizes"]:
        if over_budget(run): s["status"] = "partial (budget)"; break
        tc, dc = (KVCache(m[k].args, B, ctx + n, run["dtype"], run["device"]) for k, n in (("target", kappa + 1), ("draft", 1)))
        (plain, m1, _), (t_draft, m2, _), (verify, m3, _) = (
            timed(run, make_step(m[k], cache, T, ctx)[0], f"{what} B={B}")
            for what, k, cache, T in (("plain", "target", tc, 1), ("draft", "draft", dc, 1), ("verify", "target", tc, kappa + 1)))
        mode = m1 if m1 == m2 == m3 else "mixed"
        spec_ms = kappa * t_draft + verify
        s["records"].append(r := dict(
            B=B, kappa=kappa, alpha=alpha, E=round(E, 4), mode=mode, plain_ms=round(plain, 4), draft_ms=round(t_draft, 4),
            verify_ms=round(verify, 4), spec_ms=round(spec_ms, 4), speedup=round(E * plain / spec_ms, 3),
            predicted=round(float(batch_speedup(alpha, kappa, c, B, meta["ridge"])), 3)))
        log(f"  B={B:4d} plain {plain:8.3f} ms  spec {spec_ms:8.3f} ms  speedup {r['speedup']:5.2f}  predicted {r['predicted']:5.2f}  ({mode})")
        del tc, dc
        free(run)
    if not s["records"]: return
    summ = dict(E=round(E, 4), measured_crossing=measured_crossing([r["B"] for r in s["records"]], [r["speedup"] for r in s["records"]]),
                predicted_crossing=crossing_batch(alpha, kappa, c, meta["ridge"]))
    if meta.get("c_measured") and (meta.get("knee") or 0) > 1:   # Chapter 2's model fed the measured c and knee
        summ["calibrated_crossing"] = crossing_batch(alpha, kappa, meta["c_measured"], meta["knee"])
    s["summary"] = {k: round(v, 2) if math.isfinite(v) else v for k, v in summ.items()}
    log("  " + ", ".join(f"{k} {v}" for k, v in s["summary"].items()))


def main(argv=None):
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.dry_run: sys.exit("h100_e2e.py needs a CUDA GPU; use --dry-run for the CPU smoke test")
    torch.set_grad_enabled(False); torch.manual_seed(0)
    if args.dry_run: torch.set_num_threads(1)   # a smoke test: stay light on a shared CPU
    t0, dtype, dt = time.time(), torch.float32 if args.dry_run else torch.bfloat16, "fp32" if args.dry_run else "bf16"
    gpu_name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    key = "h200" if "h200" in gpu_name.lower() else "h100"   # the roofline GPUSpec; any other GPU is compared to an H100
    graphs = device == "cuda" and not args.dry_run and not args.no_graphs
    run = dict(vars(args), t0=t0, device=device, dtype=dtype, dt=dt, gpu=get_gpu(key), graphs=graphs, bw=get_gpu(key).bandwidth)
    meta = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), gpu=gpu_name, gpu_spec=key,
                gpu_spec_matched=key in gpu_name.lower(), torch=torch.__version__, cuda=torch.version.cuda,
                python=platform.python_version(), device=device, dtype=dt, kappa=args.kappa, alpha=args.alpha,
                context=args.context, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget_s, graphs_requested=graphs,
                command="python " + " ".join(sys.argv), dry_run=args.dry_run, weights="checkpoint" if args.target else "random")
    meta["step_parity"] = step_parity(device)
    log(f"{gpu_name}: roofline spec {key}; static step vs speclab.model.forward max |diff| {meta['step_parity']:.2e}")
    if args.target:
        log(f"loading {args.target} and {args.draft}")
        m = dict(target=load_model(args.target, dtype=dtype, device=device), draft=load_model(args.draft, dtype=dtype, device=device),
                 target_spec=ModelSpec.load(args.target), draft_spec=ModelSpec.load(args.draft))
    else:
        names = ["tiny-2l", "tiny-1l"] if args.dry_run else ["llama-3-8b", "llama-3.2-1b"]
        cfgs = ([dict(TINY, num_hidden_layers=2), dict(TINY, num_hidden_layers=1, tie_word_embeddings=True)] if args.dry_run
                else [json.loads((CONFIGS / f"{n}.json").read_text()) for n in names])
        m = dict(target=random_model(cfgs[0], dtype, device), draft=random_model(cfgs[1], dtype, device),
                 target_spec=ModelSpec.from_config(cfgs[0], names[0]), draft_spec=ModelSpec.from_config(cfgs[1], names[1]))
    meta.update(target=m["target_spec"].name, draft=m["draft_spec"].name, ridge=ridge(run["gpu"], dt),
                c_derived=cost_ratio(m["draft_spec"], m["target_spec"], dt))
    log(f"target {meta['target']}, draft {meta['draft']}: models ready at {time.time() - t0:.1f} s")
    sections = {n: dict(status="not run", records=[]) for n in ("bandwidth", "decode", "verify", "batch")}
    for name, body in (("bandwidth", sec_bandwidth), ("decode", sec_decode), ("verify", sec_verify), ("batch", sec_batch)):
        if over_budget(run):
            sections[name]["status"] = "skipped (budget)"; log(f"[{name}] skipped: budget of {args.budget_s} s spent")
        else:
            log(f"[{name}] at {time.time() - t0:.1f} s")
            try: body(run, meta, sections[name], m)
            except Exception as e:  # noqa: BLE001 -- record (e.g. out of memory) and go on to the next section
                sections[name]["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"; log(f"  {sections[name]['status']}")
                free(run)
        meta.update(capture_error=run.get("capture_error"), wall_s=round(time.time() - t0, 1))
        args.out.mkdir(parents=True, exist_ok=True)   # rewritten after every section: a killed run still leaves results
        (args.out / "results.json").write_text(json.dumps(clean(dict(meta=meta, sections=sections)), indent=1) + "\n")
        (args.out / "results.md").write_text(markdown(meta, sections))
    log(f"wrote {args.out}/results.json and results.md in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
