"""Speculative decoding measured end to end on one GPU: Chapter 2's roofline step by step, then speclab's own engine.

A random-initialised Llama-3-8B (target) and Llama-3.2-1B (draft) in bf16, next to the predictions of Chapter 2
(speclab.roofline). Timing needs no real weights; --target DIR --draft DIR time local checkpoints instead.

    python benchmarks/gpu/h100_e2e.py --out benchmarks/gpu/results/$(date +%Y-%m-%d)-h100          # H100/H200; --budget-s 540
    python benchmarks/gpu/h100_e2e.py --compile --out benchmarks/gpu/results/$(date +%Y-%m-%d)-h100-compile   # engine compiled
    python benchmarks/gpu/h100_e2e.py --target DIR --draft DIR --out benchmarks/gpu/results/ckpt   # real weights, real E
    python benchmarks/gpu/h100_e2e.py --target DIR --draft DIR --eagle DIR3 --out ...          # + an EAGLE-3 head
    python benchmarks/gpu/h100_e2e.py --dry-run --out /tmp/h100_smoke                         # CPU smoke test, < 1 minute
    python benchmarks/gpu/h100_e2e.py --dry-run --eagle DIR3 --out /tmp/h100_smoke            # parse DIR3 on the CPU first

Sections, each a list of records in results.json and a table in results.md (both in --out, rewritten after each):
 1. bandwidth: a 1 GiB device-to-device copy, (read + write bytes) / time;
 2. decode: one target step at B = 1 over --context cached tokens vs its floor, (weight + KV bytes) / measured copy
    bandwidth, and vs decode_floor_s (spec-sheet bandwidth); eager time beside it to show the launch overhead;
 3. draft: the same step of the draft; measured c = t_draft / t_target next to cost_ratio;
 4. verify: ms per target forward of T positions at B = 1; measured knee vs ridge(gpu); v = cost of T = kappa + 1;
 5. batch: synthetic-acceptance speedup E(alpha, kappa) t_plain / (kappa t_draft + t_verify(kappa + 1)) at batch B;
    the measured crossing batch (speedup = 1, interpolated in log2 B) vs crossing_batch;
 6. engine: speclab.engine.SpecDecoder, library code unchanged, greedy, per B in --engine-batch-sizes: B prompts of
    --context random token ids, --engine-tokens new tokens each (ignore_eos). Plain decoding (the same engine with no
    drafter) and speculative decoding (ModelDrafter) timed in the same run: tokens/s of each and their ratio, E, the
    engine's draft / target / other time split, and the prediction E / (v + kappa c) with v and c from sections 3-4.
    With --eagle DIR the same engine also drafts with an EAGLE-3 head (below). Each record names its method in vLLM's
    --speculative-config vocabulary: "draft_model" (a separate model) or "eagle3".

Sections 2-5 time a static-shape step: speclab.model.decoder_layer (the library's layer math, one copy) with an
attend of this script's own (every request holds the same context, so no host syncs), checked against
speclab.model.forward at start-up (meta.step_parity), captured in a CUDA graph and timed with CUDA events: warmup,
then the median of repeats. A failed capture falls back to eager and the record says so.

Section 6 and acceptance. Random weights make the draft's acceptance meaningless (E ~ 1), so with random weights the
batch sweep (run "synthetic") uses speclab.sweep.SyntheticSampler at --alpha: the real engine, the real drafter,
its real forwards, but acceptance coins at fixed rates instead of the target's law (NOT exact: timing only). Two exact
runs (speclab.sampling.rejection_sampler) stand beside it: "draft" (the draft model at every B: its outputs must equal
plain decoding's, its E is what random weights give) and "self" at the smallest B (the target drafts for itself: a
100% acceptance sanity line, E = kappa + 1). With --target/--draft the sweep is exact. In bf16 an argmax near-tie can
flip between a one-token decode and a (kappa + 1)-token verify (other GEMM shapes, other rounding), and random weights
make near-ties common: on a GPU, outputs_match (requests equal to plain decoding's), prefix_match (the share of leading
tokens that agree) and the self run's E may fall below 1, 1 and kappa + 1 for numerics, not for a sampler bug; the
fp32 --dry-run shows them exact.

EAGLE-3. --eagle DIR is a head folder in the layout vLLM loads with {"method": "eagle3", "model": DIR}: config.json
(architectures LlamaForCausalLMEagle3, eagle_aux_hidden_state_layer_ids, draft_vocab_size) and model.safetensors or
pytorch_model.bin (fc, midlayer.*, norm, lm_head, d2t, t2d). speclab.eagle.load_eagle3 checks it against the target
(a ValueError names the file and key) and speclab.eagle.EagleDrafter drafts with it: run "eagle" (exact, at every B)
and, with random weights, "eagle-synthetic" (SyntheticSampler at --alpha: timing only). Its verify forward is
speclab.eagle.capture_paged (the target's forward that also keeps the fused features), eager even with --compile.
Its c is the engine's own: c_engine = (draft seconds per drafted position) / (plain seconds per step), recorded for
every run and used in the eagle runs' prediction. --dry-run without --eagle writes a random tiny EAGLE-3 folder into
--out/eagle3-synthetic, so the smoke test always runs the loader. --dry-run --eagle DIR checks DIR against the dry
run's target; when that is the tiny random one and DIR does not fit it, DIR is checked against Llama-3-8B, the target
of a GPU run without --target (speclab.eagle.check_eagle3: config and tensor shapes, d2t and t2d, the weights
unread), and the CPU path drafts with a random tiny head of the same layout and draft-vocabulary share. meta.eagle
says which head drafted and what DIR was checked against.

Each engine runs once on a few tokens (warmup), then once timed; prefix caching is off so that the timed pass
recomputes its prompts. The sampler is wrapped in a device sync so that the engine's target time holds the verify
forward; the rest of a step (scheduling, metadata, commit) is "other". --compile wraps the paged forward the engine
calls in torch.compile (--compile-mode; reduce-overhead captures CUDA graphs) without editing the library; a failure is
recorded in meta.compile and the engine falls back to eager. --budget-s skips what is left (recorded as skipped), so
results are always written.
"""
import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import speclab  # noqa: E402
import speclab.engine  # noqa: E402
from speclab.eagle import EagleDrafter, check_eagle3, eagle3_default_layers, load_eagle3, write_eagle3  # noqa: E402
from speclab.sweep import SyntheticSampler  # noqa: E402
from speclab.request import SamplingParams  # noqa: E402
from speclab.drafters import ModelDrafter
from speclab.engine import SpecDecoder
from speclab.sampling import rejection_sampler  # noqa: E402
from speclab.model import (KVCache, Llama, LlamaArgs, decoder_layer, forward, forward_paged,  # noqa: E402
                           load_model, rope_cos_sin, rope_inv_freq)
from speclab.roofline import (ModelSpec, batch_speedup, cost_ratio, crossing_batch, decode_floor_s,  # noqa: E402
                              get_gpu, ridge, step_cost)

CONFIGS = Path(speclab.__file__).parent / "data" / "configs"
TINY = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)
BLOCK_SIZE = 16      # the engine's KV block size (SpecDecoder's default)
WARMUP_TOKENS = 8    # new tokens per request of an engine's warmup pass


def log(*parts: object) -> None:
    "Print at once (a long run shows its progress)."
    print(*parts, flush=True)


# ---------------------------------------------------------------------------------------------------- command line
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line, checked; --dry-run swaps in tiny grids."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Results: see benchmarks/README.md; record runs in benchmarks/RESULTS.md.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/gpu/results"),
                    help="directory for results.json and results.md")
    ap.add_argument("--target", type=Path, help="HF checkpoint folder of the target (default: random Llama-3-8B)")
    ap.add_argument("--draft", type=Path, help="HF checkpoint folder of the draft (default: random Llama-3.2-1B)")
    ap.add_argument("--eagle", type=Path, metavar="DIR",
                    help="an EAGLE-3 head folder in vLLM's layout: adds the 'eagle' runs to section 6")
    ap.add_argument("--kappa", type=int, default=3, help="draft tokens per speculative step")
    ap.add_argument("--alpha", type=float, default=0.7, help="synthetic per-token acceptance rate, in [0, 1)")
    ap.add_argument("--context", type=int, default=256, help="cached tokens per request (the engine's prompt length)")
    ap.add_argument("--positions", type=int, nargs="+", default=[2 ** i for i in range(10)], metavar="T",
                    help="verify grid (1 and kappa + 1 are always added)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[2 ** i for i in range(9)], metavar="B",
                    help="batch grid of the static steps (section 5)")
    ap.add_argument("--engine-batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64], metavar="B",
                    help="batch grid of the engine (section 6)")
    ap.add_argument("--engine-tokens", type=int, default=128, help="new tokens per request in the engine runs")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=540, help="skip the remaining work after this many seconds")
    ap.add_argument("--no-graphs", action="store_true", help="time eager static steps (no CUDA graphs)")
    ap.add_argument("--compile", action="store_true",
                    help="engine: torch.compile the paged forward it calls (eager fallback on failure)")
    ap.add_argument("--compile-mode", default="reduce-overhead",
                    help="torch.compile mode for --compile on a GPU (reduce-overhead = CUDA graphs)")
    ap.add_argument("--dry-run", action="store_true",
                    help="smoke test: tiny fp32 models on the CPU, T <= 8, B <= 4, 2 repeats")
    a = ap.parse_args(argv)
    if a.kappa < 1:
        ap.error(f"--kappa must be >= 1, got {a.kappa}")
    if not 0 <= a.alpha < 1:
        ap.error(f"--alpha must lie in [0, 1), got {a.alpha}")
    grids = (("--positions", a.positions), ("--batch-sizes", a.batch_sizes),
             ("--engine-batch-sizes", a.engine_batch_sizes))
    for flag, grid in grids:
        if not grid or min(grid) < 1:
            ap.error(f"{flag} needs at least one integer >= 1, got {grid}")
    bounds = (("--context", a.context, 1), ("--engine-tokens", a.engine_tokens, 1), ("--warmup", a.warmup, 0),
              ("--repeats", a.repeats, 1), ("--budget-s", a.budget_s, 1))
    for flag, v, lo in bounds:
        if v < lo:
            ap.error(f"{flag} must be >= {lo}, got {v}")
    if (a.target is None) != (a.draft is None):
        ap.error("--target and --draft must be given together")
    for flag, d in (("--target", a.target), ("--draft", a.draft), ("--eagle", a.eagle)):
        if d is not None and not (d / "config.json").is_file():
            ap.error(f"{flag} {d} holds no config.json")
    if a.dry_run:
        a.positions = [1, 2, 4, 8]
        a.batch_sizes = [1, 2, 4]
        a.engine_batch_sizes = [1, 4]
        a.context = 16
        a.engine_tokens = 24
        a.warmup = 1
        a.repeats = 2
    a.positions = sorted(set(a.positions) | {1, a.kappa + 1})
    a.batch_sizes = sorted(set(a.batch_sizes))
    a.engine_batch_sizes = sorted(set(a.engine_batch_sizes))
    return a


# ---------------------------------------------------------------------------------------------------- timing tools
def sync(device: str) -> None:
    "Wait for the device's queued work (nothing to wait for on the CPU)."
    if device == "cuda":
        torch.cuda.synchronize()


def timer(fn: Callable[[], object], warmup: int, repeats: int, device: str) -> float:
    "Median milliseconds per call of fn(): CUDA events on a GPU, perf_counter on the CPU."
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def over_budget(run: dict) -> bool:
    "Whether the run has spent its --budget-s."
    return time.time() - run["t0"] > run["budget_s"]


def free(run: dict) -> None:
    "Return cached device memory between measurements."
    if run["device"] == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- models
def random_model(cfg: dict, dtype: torch.dtype, device: str) -> Llama:
    "A Llama of config dict cfg with N(0, 0.02) weights and unit norms, allocated straight on the device."
    args = LlamaArgs.from_config(cfg)
    with torch.device("meta"):
        model = Llama(args)
    model = model.to(dtype).to_empty(device=device)
    for name, p in model.named_parameters():
        p.requires_grad_(False)
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)
    model.inv_freq = rope_inv_freq(args).to(device)
    return model.eval()


def load_models(args: argparse.Namespace, dtype: torch.dtype, device: str) -> dict:
    "Target, draft and their ModelSpecs: local checkpoints, or random Llama-3-8B / 3.2-1B (tiny ones in --dry-run)."
    if args.target:
        log(f"loading {args.target} and {args.draft}")
        return dict(target=load_model(args.target, dtype=dtype, device=device),
                    draft=load_model(args.draft, dtype=dtype, device=device),
                    target_spec=ModelSpec.load(args.target), draft_spec=ModelSpec.load(args.draft))
    if args.dry_run:
        names = ["tiny-2l", "tiny-1l"]
        cfgs = [dict(TINY, num_hidden_layers=2), dict(TINY, num_hidden_layers=1, tie_word_embeddings=True)]
    else:
        names = ["llama-3-8b", "llama-3.2-1b"]
        cfgs = [json.loads((CONFIGS / f"{n}.json").read_text()) for n in names]
    return dict(target=random_model(cfgs[0], dtype, device), draft=random_model(cfgs[1], dtype, device),
                target_spec=ModelSpec.from_config(cfgs[0], names[0]),
                draft_spec=ModelSpec.from_config(cfgs[1], names[1]))


def gpu_target_args() -> LlamaArgs:
    "The target a GPU run loads without --target: Llama-3-8B (random weights)."
    return LlamaArgs.from_config(json.loads((CONFIGS / "llama-3-8b.json").read_text()), "llama-3-8b")


def load_eagle(args: argparse.Namespace, m: dict) -> dict:
    """meta.eagle, and m["eagle"]: the head of section 6's eagle runs (None without one). --eagle DIR is checked
    against the run's target and loaded; a dry run uses a random tiny head in vLLM's layout when there is no DIR, or
    when DIR fits only the GPU run's target (checked against it, weights unread)."""
    target = m["target"]
    m["eagle"] = None
    if args.eagle is None and not args.dry_run:
        return dict(folder=None)
    info = dict(folder=None if args.eagle is None else str(args.eagle), method="eagle3", used=str(args.eagle))
    if args.eagle is not None:
        try:
            check_eagle3(args.eagle, target.args)
            info["fits"] = "the run's target"
        except ValueError:
            if not args.dry_run or args.target:
                raise
            parsed = check_eagle3(args.eagle, gpu_target_args())          # a misfit here raises, naming the key
            info.update(fits="llama-3-8b, the GPU run's target", draft_vocab_size=parsed["draft_vocab_size"],
                        feature_layers=list(parsed["feature_layers"]))
    if info.get("fits") != "the run's target":                            # the dry run drafts with a stand-in
        n, V = target.args.num_layers, target.args.vocab_size
        layers = eagle3_default_layers(n) if n >= 4 else tuple(range(min(n + 1, 3)))
        share = info["draft_vocab_size"] / gpu_target_args().vocab_size if args.eagle else 0.75
        folder = write_eagle3(args.out / "eagle3-synthetic", target, layers, max(1, round(V * share)), std=0.5)
        info.update(used=str(folder), note="a random tiny EAGLE-3 head in vLLM's layout for the dry run's target")
    m["eagle"] = load_eagle3(info["used"], target)
    info.update(architecture=json.loads((Path(info["used"]) / "config.json").read_text())["architectures"][0],
                feature_layers_used=list(m["eagle"].feature_layers),
                draft_vocab_size_used=m["eagle"].draft_vocab_size, vocab_size=m["eagle"].args.vocab_size)
    return info


# ---------------------------------------------------------------------------------------------------- static steps
def static_attend(k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: int, mask: torch.Tensor) -> Callable:
    """A `speclab.model.Attend` for B requests that all hold ctx cached tokens: the T new K/V go to slots ctx..ctx+T-1
    of the layer's cache views [B, kv_heads, ctx + T, hd]; fixed shapes, no host sync: a CUDA graph can hold it."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, T, H, hd = q.shape
        rep = H // k.shape[2]
        k_cache[:, :, ctx:ctx + T] = k.transpose(1, 2)
        v_cache[:, :, ctx:ctx + T] = v.transpose(1, 2)
        # GQA by a broadcast view then a copy: repeat_interleave over heads with no data-dependent shape
        keys = k_cache[:, :, None].expand(-1, -1, rep, -1, -1).reshape(B, H, -1, hd)
        values = v_cache[:, :, None].expand(-1, -1, rep, -1, -1).reshape(B, H, -1, hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        return o.transpose(1, 2)                                                      # [B, T, heads, hd]
    return attend


def make_step(model: Llama, cache: KVCache, T: int, ctx: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    "(step, tokens): logits of T new tokens for the cache's B requests after ctx cached ones; static, capturable."
    a, dev, B, span = model.args, cache.lengths.device, cache.batch_size, ctx + T
    tokens = torch.randint(0, a.vocab_size, (B, T), device=dev)
    pos = (ctx + torch.arange(T, device=dev)).expand(B, T)
    ks = [k[:, :, :span] for k in cache.k]                      # attend over ctx + T slots only
    vs = [v[:, :, :span] for v in cache.v]

    def step() -> torch.Tensor:
        mask = (torch.arange(span, device=dev)[None, None] <= pos[..., None])[:, None]   # [B, 1, T, span]
        x = model.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(model.inv_freq, pos, x.dtype)                           # [B, T, 1, hd]
        for layer, k_cache, v_cache in zip(model.model.layers, ks, vs):
            x = decoder_layer(layer, x, cos, sin, static_attend(k_cache, v_cache, ctx, mask), a)
        return model.model.norm(x) @ model.head_weight.T
    return step, tokens


def step_parity(device: str) -> float:
    "Max |logit difference| of make_step vs speclab.model.forward on a tiny fp32 model (B = 2, 5 cached, 3 new)."
    model = random_model(dict(TINY, num_hidden_layers=2), torch.float32, device)
    B, ctx, T = 2, 5, 3
    prefix = torch.randint(0, 256, (B, ctx))
    new = torch.randint(0, 256, (B, T))
    caches = [KVCache(model.args, B, ctx + T, torch.float32, device) for _ in range(2)]
    for c in caches:
        forward(model, prefix, c)
    step, tokens = make_step(model, caches[1], T, ctx)
    tokens.copy_(new)
    return float((step() - forward(model, new, caches[0])).abs().max())


def timed(run: dict, step: Callable[[], torch.Tensor], label: str) -> tuple[float, str, float | None]:
    "(ms, mode, graph-vs-eager max |diff|): CUDA-graph replay when possible, else eager; a failed capture ends graphs."
    if run["graphs"]:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = step()
            ms = timer(g.replay, run["warmup"], run["repeats"], "cuda")
            diff = float((out.float() - step().float()).abs().max())
            del g, out
            return ms, "graph", diff
        except Exception as e:  # noqa: BLE001 -- any capture failure: record it, fall back to eager
            log(f"  warning: CUDA graph capture failed at {label} ({type(e).__name__}: {str(e)[:200]}); eager now")
            run["graphs"] = False
            run["capture_error"] = f"{label}: {type(e).__name__}: {str(e)[:300]}"
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 -- the eager timing below raises if the device is really broken
                pass
    return timer(step, run["warmup"], run["repeats"], run["device"]), "eager", None


def measured_crossing(Bs: list[int], speedups: list[float]) -> float:
    "First B where the speedup falls to 1, linear in log2 B (0.0: never above 1; inf: above 1 on the whole grid)."
    if speedups[0] <= 1:
        return 0.0
    for b0, s0, b1, s1 in zip(Bs, speedups, Bs[1:], speedups[1:]):
        if s1 <= 1:
            return 2 ** (math.log2(b0) + (s0 - 1) / (s0 - s1) * (math.log2(b1) - math.log2(b0)))
    return math.inf


def measured_knee(Ts: list[int], ms: list[float]) -> float | None:
    """T where the flat cost at the smallest T meets the line through the two largest T; None when the grid shows no
    compute-bound tail (the largest T costs under 1.5x the smallest, or the line does not rise)."""
    if len(Ts) < 3 or ms[-1] < 1.5 * ms[0] or ms[-1] <= ms[-2]:
        return None
    slope = (ms[-1] - ms[-2]) / (Ts[-1] - Ts[-2])
    return max(1.0, Ts[-1] - (ms[-1] - ms[0]) / slope)


# ---------------------------------------------------------------------------------------------------- the engine
def synced(sampler: Callable[..., torch.Tensor], device: str) -> Callable[..., torch.Tensor]:
    "The sampler followed by a device sync on a GPU, so that the engine's target_s holds its verify forward."
    if device != "cuda":
        return sampler

    def sample(*args: object, **kwargs: object) -> torch.Tensor:
        out = sampler(*args, **kwargs)
        torch.cuda.synchronize()
        return out
    return sample


def compiled_forward(run: dict) -> Callable[..., torch.Tensor]:
    """speclab.model.forward_paged under torch.compile: --compile-mode on a GPU, the graph-capturing 'eager' backend
    on a CPU (a smoke test of the wrapping; inductor would need minutes there). Each call begins a CUDA-graph step and
    returns a copy, so that no logits the engine still holds live in memory a later replay overwrites. dynamic=True:
    the engine's shapes change every step (tokens fed, keys attended), so one graph per shape would never end."""
    if run["device"] == "cuda":
        fn = torch.compile(forward_paged, mode=run["compile_mode"], dynamic=True)
    else:
        fn = torch.compile(forward_paged, backend="eager", dynamic=True)

    def forward_compiled(*args: object, **kwargs: object) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return fn(*args, **kwargs).clone()
    return forward_compiled


def dynamo_counts() -> dict:
    "What torch.compile did so far: graphs compiled, graph breaks, frames left eager at the recompile limit."
    try:
        from torch._dynamo.utils import counters
        limit_hits = sum(v for k, v in counters["unimplemented"].items() if "recompile limit" in k.lower())
        breaks = sum(counters["graph_break"].values())
        return dict(unique_graphs=counters["stats"]["unique_graphs"], graph_breaks=breaks,
                    recompile_limit_hits=limit_hits)
    except Exception as e:  # noqa: BLE001 -- private counters: their layout may change between torch versions
        return dict(error=f"{type(e).__name__}: {e}")


def use_forward(fn: Callable[..., torch.Tensor]) -> None:
    "Make the engine (its target verify and ModelDrafter alike) call fn as its paged forward; the library is unedited."
    speclab.engine.forward_paged = fn


def random_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    "n prompts of `length` uniformly random token ids."
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n, length), generator=g).tolist()


def engine_pass(engine: SpecDecoder, prompts: list[list[int]], params: SamplingParams, device: str) -> dict:
    "One timed engine.generate: seconds, tokens, outputs, and the engine's counters over this call alone."
    stats = dict(engine.stats)
    drafts = engine.metrics.num_drafts
    drafted = engine.metrics.num_draft_tokens
    accepted = engine.metrics.num_accepted_tokens
    sync(device)
    t0 = time.perf_counter()
    outputs = engine.generate(prompts, params)
    sync(device)
    seconds = time.perf_counter() - t0
    errors = [o.error for o in outputs if o.error]
    if errors:
        raise RuntimeError(f"a request failed in the engine: {errors[0]}")
    d = {k: engine.stats[k] - stats[k] for k in ("steps", "draft_s", "target_s")}
    num_drafts = engine.metrics.num_drafts - drafts
    num_accepted = engine.metrics.num_accepted_tokens - accepted
    num_draft_tokens = engine.metrics.num_draft_tokens - drafted
    return dict(seconds=seconds, tokens=sum(len(o.token_ids) for o in outputs), outputs=[o.token_ids for o in outputs],
                steps=d["steps"], draft_s=d["draft_s"], target_s=d["target_s"],
                E=1 + num_accepted / num_drafts if num_drafts else 1.0,
                acceptance_rate=num_accepted / num_draft_tokens if num_draft_tokens else 0.0)


def engine_kwargs(run: dict, B: int) -> dict:
    "SpecDecoder sizes for B requests: B sequences at once, a pool that holds them all, no prefix cache."
    per_request = -(-(run["context"] + run["engine_tokens"] + run["kappa"] + 1) // BLOCK_SIZE)
    return dict(max_num_seqs=B, block_size=BLOCK_SIZE, num_blocks=B * per_request, enable_prefix_caching=False)


def warm_and_time(run: dict, make_engine: Callable[[], SpecDecoder], prompts: list[list[int]]) -> dict:
    "A fresh engine, warmed up on the prompts (a few tokens each), then one timed pass of --engine-tokens each."
    engine = make_engine()
    warm = SamplingParams(temperature=0, max_tokens=min(WARMUP_TOKENS, run["engine_tokens"]), ignore_eos=True)
    engine.generate(prompts, warm)
    params = SamplingParams(temperature=0, max_tokens=run["engine_tokens"], ignore_eos=True)
    result = engine_pass(engine, prompts, params, run["device"])
    result["forward"] = "compiled" if run["compiled"] else "eager"
    del engine
    free(run)
    return result


def give_up_compile(run: dict, meta: dict, where: str, e: Exception) -> None:
    "Record why the compiled forward failed and put the eager one back."
    log(f"  warning: compiled forward failed at {where} ({type(e).__name__}: {str(e)[:200]}); eager from now on")
    meta["compile"]["status"] = f"error at {where}: {type(e).__name__}: {str(e)[:300]}"
    use_forward(forward_paged)
    run["compiled"] = False
    free(run)


def measure(run: dict, meta: dict, make_engine: Callable[[], SpecDecoder], prompts: list[list[int]],
            where: str) -> dict:
    "warm_and_time; when the compiled forward fails, record it, fall back to eager and measure again."
    try:
        return warm_and_time(run, make_engine, prompts)
    except Exception as e:  # noqa: BLE001 -- a compile failure: recorded, then the eager engine
        if not run["compiled"]:
            raise
        give_up_compile(run, meta, where, e)
        return warm_and_time(run, make_engine, prompts)


def prediction(E: float, v: float | None, c: float | None, kappa: int) -> float | None:
    "Chapter 2's speedup E / (v + kappa c) (None when v or c was not measured)."
    if v is None or c is None:
        return None
    return round(E / (v + kappa * c), 3)


def common_prefix(a: list[int], b: list[int]) -> int:
    "How many leading tokens a and b share."
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def engine_record(run: dict, meta: dict, B: int, name: str, plain: dict, spec: dict, sampler: str) -> dict:
    "One row of section 6: plain and speculative side by side, E, the time split and Chapter 2's prediction."
    kappa = run["kappa"]
    plain_tok_s = plain["tokens"] / plain["seconds"]
    spec_tok_s = spec["tokens"] / spec["seconds"]
    other_s = spec["seconds"] - spec["draft_s"] - spec["target_s"]
    c_engine = spec["draft_s"] / (spec["steps"] * kappa) / (plain["seconds"] / plain["steps"])
    eagle = name.startswith("eagle")
    c = 1.0 if name == "self" else c_engine if eagle else meta.get("c_measured")   # self: one target step a draft
    static = run["static_batch"].get(B)                               # section 5's steps at this batch size
    c_B = 1.0 if name == "self" else c_engine if eagle else None if static is None else \
        static["draft_ms"] / static["plain_ms"]
    v_B = None if static is None else static["verify_ms"] / static["plain_ms"]
    exact = sampler == "rejection_sampler"
    same = sum(a == b for a, b in zip(plain["outputs"], spec["outputs"])) / len(plain["outputs"])
    agree = statistics.mean(common_prefix(a, b) / len(a) for a, b in zip(plain["outputs"], spec["outputs"]))
    forwards = {plain["forward"], spec["forward"]}
    return dict(
        B=B, run=name, method="eagle3" if eagle else "draft_model", sampler=sampler,
        drafter="eagle3 head" if eagle else "target" if name == "self" else "draft",
        forward=forwards.pop() if len(forwards) == 1 else "mixed", prompt_len=run["context"],
        new_tokens=run["engine_tokens"], plain_tok_s=round(plain_tok_s, 2), spec_tok_s=round(spec_tok_s, 2),
        speedup=round(spec_tok_s / plain_tok_s, 3), plain_steps=plain["steps"], spec_steps=spec["steps"],
        plain_ms_per_step=round(plain["seconds"] / plain["steps"] * 1e3, 3),
        spec_ms_per_step=round(spec["seconds"] / spec["steps"] * 1e3, 3),
        E=round(spec["E"], 4), acceptance_rate=round(spec["acceptance_rate"], 4),
        E_model=round((1 - run["alpha"] ** (kappa + 1)) / (1 - run["alpha"]), 4) if not exact else None,
        draft_s=round(spec["draft_s"], 4), target_s=round(spec["target_s"], 4), other_s=round(other_s, 4),
        draft_share=round(spec["draft_s"] / spec["seconds"], 3),
        target_share=round(spec["target_s"] / spec["seconds"], 3),
        other_share=round(other_s / spec["seconds"], 3), c_engine=round(c_engine, 4),
        predicted=prediction(spec["E"], meta.get("v_measured"), c, kappa),
        predicted_at_B=prediction(spec["E"], v_B, c_B, kappa),
        outputs_match=round(same, 4) if exact else None, prefix_match=round(agree, 4) if exact else None)


def engine_runs(run: dict, m: dict, synthetic: bool, B: int, smallest: bool) -> list[tuple]:
    "(name, a fresh drafter per call, sampler, sampler label) of the speculative runs at batch size B."
    kappa, alpha = run["kappa"], run["alpha"]
    rates = [alpha ** i for i in range(1, kappa + 1)]                # i.i.d.: draft i is accepted with alpha^i
    coins = f"SyntheticSampler(alpha={alpha})"
    draft = lambda: ModelDrafter(m["draft"])                           # noqa: E731
    eagle = lambda: EagleDrafter(m["eagle"], m["target"])             # noqa: E731
    runs = [("synthetic", draft, SyntheticSampler(rates), coins)] if synthetic else []
    runs.append(("draft", draft, rejection_sampler, "rejection_sampler"))
    if m.get("eagle") is not None:
        runs += [("eagle-synthetic", eagle, SyntheticSampler(rates), coins)] if synthetic else []
        runs.append(("eagle", eagle, rejection_sampler, "rejection_sampler"))
    if smallest:
        runs.append(("self", lambda: ModelDrafter(m["target"]), rejection_sampler, "rejection_sampler"))
    return runs


def probe_compile(run: dict, meta: dict, m: dict) -> None:
    "With --compile: swap in the compiled forward and try it on a short plain and speculative generate."
    meta["compile"] = dict(requested=run["compile"], mode=None, status="not requested")
    if not run["compile"]:
        return
    meta["compile"]["mode"] = run["compile_mode"] if run["device"] == "cuda" else "backend=eager (CPU)"
    try:
        use_forward(compiled_forward(run))
        run["compiled"] = True
        prompts = random_prompts(1, run["context"], m["target"].args.vocab_size, seed=12345)
        params = SamplingParams(temperature=0, max_tokens=min(WARMUP_TOKENS, run["engine_tokens"]), ignore_eos=True)
        for drafter in (None, ModelDrafter(m["draft"])):
            engine = SpecDecoder(m["target"], drafter, kappa=run["kappa"], **engine_kwargs(run, 1))
            engine.generate(prompts, params)
        meta["compile"]["status"] = "ok"
        log(f"  compiled forward ({meta['compile']['mode']}) works")
    except Exception as e:  # noqa: BLE001 -- any failure: recorded, eager from here on
        give_up_compile(run, meta, "probe", e)


def sec_engine(run: dict, meta: dict, s: dict, m: dict) -> None:
    "speclab.engine.SpecDecoder end to end: plain vs speculative tokens/s per batch size, E, time split, prediction."
    synthetic = meta["weights"] == "random"
    s["status"] = "ok"
    s["summary"] = dict(v=meta.get("v_measured"), c=meta.get("c_measured"), kappa=run["kappa"],
                        acceptance="synthetic (SyntheticSampler at --alpha, NOT exact, timing only) in runs "
                                   "'synthetic' and 'eagle-synthetic'; exact rejection_sampler in runs 'draft', "
                                   "'eagle' and 'self'" if synthetic
                        else "exact rejection_sampler (checkpoint weights)",
                        eagle=meta.get("eagle", {}).get("used"))
    probe_compile(run, meta, m)
    s["summary"]["forward"] = "compiled" if run["compiled"] else "eager"
    dev = run["device"]
    try:
        for B in run["engine_batch_sizes"]:
            prompts = random_prompts(B, run["context"], m["target"].args.vocab_size, seed=B)
            if over_budget(run):
                s["status"] = "partial (budget)"
                return
            plain = measure(run, meta, lambda: SpecDecoder(m["target"], None, kappa=0,
                                                           sampler=synced(rejection_sampler, dev),
                                                           **engine_kwargs(run, B)), prompts, f"plain B={B}")
            for name, drafter, sampler, label in engine_runs(run, m, synthetic, B, B == run["engine_batch_sizes"][0]):
                if over_budget(run):
                    s["status"] = "partial (budget)"
                    return
                spec = measure(run, meta, lambda: SpecDecoder(m["target"], drafter(), kappa=run["kappa"],
                                                              sampler=synced(sampler, dev),
                                                              **engine_kwargs(run, B)), prompts, f"{name} B={B}")
                if name.startswith("eagle"):
                    spec["forward"] = "eager"                         # capture_paged: never the compiled forward
                s["records"].append(r := engine_record(run, meta, B, name, plain, spec, label))
                log(f"  B={B:4d} {name:15s} plain {r['plain_tok_s']:9.1f} tok/s  spec {r['spec_tok_s']:9.1f} tok/s  "
                    f"x{r['speedup']:5.2f}  E {r['E']:5.2f}  predicted {r['predicted']}  ({r['forward']})")
    finally:
        if run["compile"]:
            meta["compile"]["dynamo"] = dynamo_counts()
        use_forward(forward_paged)                                    # the library as it was, whatever happened
        run["compiled"] = False


# ---------------------------------------------------------------------------------------------------- sections 1-5
def sec_bandwidth(run: dict, meta: dict, s: dict, m: dict) -> None:
    "Copy bandwidth: (read + write bytes) / time of a 1 GiB device-to-device copy (16 MiB on the CPU)."
    dev = run["device"]
    n = (1 << 30) if dev == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    ms = timer(lambda: dst.copy_(src), 3, 10 if dev == "cuda" else 3, dev)
    run["bw"] = 2 * n / (ms * 1e-3)
    meta["copy_bandwidth_GBps"] = round(2 * n / ms * 1e-6, 1)
    s.update(status="ok", records=[dict(bytes=2 * n, ms=round(ms, 4), GBps=meta["copy_bandwidth_GBps"])])
    log(f"  copy bandwidth {meta['copy_bandwidth_GBps']} GB/s")


def step_record(run: dict, model: Llama, spec: ModelSpec, label: str) -> dict:
    "One step (T = 1, B = 1) of `model` over the context: graph and eager ms next to the floors."
    cache = KVCache(model.args, 1, run["context"] + 1, run["dtype"], run["device"])
    step, _ = make_step(model, cache, 1, run["context"])
    ms, mode, diff = timed(run, step, label)
    eager = ms if mode == "eager" else timer(step, run["warmup"], run["repeats"], run["device"])
    w = spec.bytes_per_step(run["dt"])
    kv = run["context"] * spec.kv_bytes_per_token(run["dt"])
    floor = (w + kv) / run["bw"] * 1e3
    r = dict(model=spec.name, B=1, context=run["context"], mode=mode, ms=round(ms, 4), eager_ms=round(eager, 4),
             graph_vs_eager=diff, weight_bytes=w, kv_bytes=kv, floor_ms=round(floor, 4),
             spec_floor_ms=round(decode_floor_s(spec, run["gpu"], run["dt"]) * 1e3, 4),
             ms_over_floor=round(ms / floor, 3), achieved_GBps=round((w + kv) / ms * 1e-6, 1))
    log(f"  {spec.name}: {ms:.3f} ms ({mode}; eager {eager:.3f} ms), floor {floor:.3f} ms, "
        f"spec floor {r['spec_floor_ms']:.3f} ms")
    return r


def sec_decode(run: dict, meta: dict, s: dict, m: dict) -> None:
    "The target's decode step (T = 1, B = 1) over the context vs its floors."
    s["records"].append(step_record(run, m["target"], m["target_spec"], "target decode"))
    meta["t_target_ms"] = s["records"][0]["ms"]
    s["status"] = "ok"


def sec_draft(run: dict, meta: dict, s: dict, m: dict) -> None:
    "The draft's decode step; c = t_draft / t_target (the target's from section 2) next to cost_ratio."
    s["records"].append(r := step_record(run, m["draft"], m["draft_spec"], "draft decode"))
    s["status"] = "ok"
    if meta.get("t_target_ms"):
        meta["c_measured"] = round(r["ms"] / meta["t_target_ms"], 4)
    s["summary"] = dict(c_measured=meta.get("c_measured"), c_derived=round(meta["c_derived"], 4))
    log(f"  c measured {meta.get('c_measured')}, derived (cost_ratio) {meta['c_derived']:.4f}")


def sec_verify(run: dict, meta: dict, s: dict, m: dict) -> None:
    "ms per target forward of T positions at B = 1; cost in units of T = 1 next to max(1, T/T*); knee; v."
    target, ctx = m["target"], run["context"]
    s["status"] = "ok"
    cache = KVCache(target.args, 1, ctx + max(run["positions"]), run["dtype"], run["device"])
    for T in run["positions"]:
        if over_budget(run):
            s["status"] = "partial (budget)"
            break
        ms, mode, diff = timed(run, make_step(target, cache, T, ctx)[0], f"verify T={T}")
        recs = s["records"]
        recs.append(dict(T=T, mode=mode, ms=round(ms, 4), ms_per_position=round(ms / T, 5), graph_vs_eager=diff,
                         cost=round(ms / recs[0]["ms"] if recs else 1.0, 3),
                         predicted_cost=float(step_cost(T, meta["ridge"]))))
        log(f"  T={T:4d} {ms:9.3f} ms  cost {recs[-1]['cost']:6.2f}  predicted {recs[-1]['predicted_cost']:6.2f}"
            f"  ({mode})")
        free(run)
    meta["knee"] = knee = measured_knee([r["T"] for r in s["records"]], [r["ms"] for r in s["records"]])
    v = [r["cost"] for r in s["records"] if r["T"] == run["kappa"] + 1]
    meta["v_measured"] = v[0] if v else None
    s["summary"] = dict(ridge_T_star=round(meta["ridge"], 1), measured_knee=None if knee is None else round(knee, 1),
                        v_measured=meta["v_measured"])
    log(f"  ridge T* {meta['ridge']:.1f}, measured knee {s['summary']['measured_knee']}, "
        f"v (T = kappa + 1) {meta['v_measured']}")


def sec_batch(run: dict, meta: dict, s: dict, m: dict) -> None:
    "Per B: plain step, draft step, verify of kappa + 1 positions; E t_plain / t_spec next to batch_speedup."
    kappa, alpha, ctx, c = run["kappa"], run["alpha"], run["context"], meta["c_derived"]
    s["status"] = "ok"
    E = (1 - alpha ** (kappa + 1)) / (1 - alpha)
    for B in run["batch_sizes"]:
        if over_budget(run):
            s["status"] = "partial (budget)"
            break
        tc = KVCache(m["target"].args, B, ctx + kappa + 1, run["dtype"], run["device"])
        dc = KVCache(m["draft"].args, B, ctx + 1, run["dtype"], run["device"])
        plain, m1, _ = timed(run, make_step(m["target"], tc, 1, ctx)[0], f"plain B={B}")
        t_draft, m2, _ = timed(run, make_step(m["draft"], dc, 1, ctx)[0], f"draft B={B}")
        verify, m3, _ = timed(run, make_step(m["target"], tc, kappa + 1, ctx)[0], f"verify B={B}")
        mode = m1 if m1 == m2 == m3 else "mixed"
        spec_ms = kappa * t_draft + verify
        run["static_batch"][B] = dict(plain_ms=plain, draft_ms=t_draft, verify_ms=verify)
        s["records"].append(r := dict(
            B=B, kappa=kappa, alpha=alpha, E=round(E, 4), mode=mode, plain_ms=round(plain, 4),
            draft_ms=round(t_draft, 4), verify_ms=round(verify, 4), spec_ms=round(spec_ms, 4),
            speedup=round(E * plain / spec_ms, 3),
            predicted=round(float(batch_speedup(alpha, kappa, c, B, meta["ridge"])), 3)))
        log(f"  B={B:4d} plain {plain:8.3f} ms  spec {spec_ms:8.3f} ms  speedup {r['speedup']:5.2f}  "
            f"predicted {r['predicted']:5.2f}  ({mode})")
        del tc, dc
        free(run)
    if not s["records"]:
        return
    summ = dict(E=E, measured_crossing=measured_crossing([r["B"] for r in s["records"]],
                                                         [r["speedup"] for r in s["records"]]),
                predicted_crossing=crossing_batch(alpha, kappa, c, meta["ridge"]))
    if meta.get("c_measured") and (meta.get("knee") or 0) > 1:   # Chapter 2's model fed the measured c and knee
        summ["calibrated_crossing"] = crossing_batch(alpha, kappa, meta["c_measured"], meta["knee"])
    s["summary"] = {k: round(v, 2) if math.isfinite(v) else v for k, v in summ.items()}
    log("  " + ", ".join(f"{k} {v}" for k, v in s["summary"].items()))


SECTIONS = dict(bandwidth=sec_bandwidth, decode=sec_decode, draft=sec_draft, verify=sec_verify, batch=sec_batch,
                engine=sec_engine)
COLUMNS = dict(
    bandwidth=["bytes", "ms", "GBps"],
    decode=["model", "B", "context", "mode", "ms", "eager_ms", "floor_ms", "spec_floor_ms", "ms_over_floor",
            "achieved_GBps", "graph_vs_eager"],
    verify=["T", "mode", "ms", "ms_per_position", "cost", "predicted_cost"],
    batch=["B", "mode", "plain_ms", "draft_ms", "verify_ms", "spec_ms", "speedup", "predicted"],
    engine=["B", "run", "method", "sampler", "forward", "plain_tok_s", "spec_tok_s", "speedup", "E", "predicted",
            "predicted_at_B", "c_engine", "draft_share", "target_share", "other_share", "outputs_match",
            "prefix_match"])
COLUMNS["draft"] = COLUMNS["decode"]


# ---------------------------------------------------------------------------------------------------- results
def clean(x: object) -> object:
    "JSON-safe: inf/nan become strings."
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def table(recs: list[dict], cols: list[str]) -> list[str]:
    "A markdown table of the records' columns."
    if not recs:
        return []
    head = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    return head + ["| " + " | ".join(str(r.get(k)) for k in cols) + " |" for r in recs]


def markdown(meta: dict, sections: dict) -> str:
    "results.md: the run's facts, then one table (and summary line) per section."
    lines = [f"# Speculative decoding end to end: {meta['target']} / {meta['draft']} on {meta['gpu']}", "",
             f"{meta['date']} · torch {meta['torch']} · CUDA {meta['cuda']} · {meta['dtype']} · {meta['weights']} "
             f"weights · roofline spec {meta['gpu_spec']} · "
             f"copy bandwidth {meta.get('copy_bandwidth_GBps')} GB/s · "
             f"step parity vs forward {meta['step_parity']:.2e} · compile {meta.get('compile')} · "
             f"`{meta['command']}` · {meta.get('wall_s')} s", "",
             "Sections 2-5: ms per static step, median of repeats; mode `graph` = CUDA-graph replay. floor = (weight "
             "+ KV bytes) / measured copy bandwidth; spec floor = decode_floor_s (spec-sheet bandwidth).", "",
             "Section 6: speclab.engine.SpecDecoder, greedy, tokens/s of whole generate calls (prefill included); "
             "runs `synthetic` and `eagle-synthetic` draw acceptance at --alpha (NOT exact, timing only), runs "
             "`draft`, `eagle` and `self` are exact (outputs_match = share of requests whose tokens equal plain "
             "decoding's, prefix_match = mean share of leading tokens that do; in bf16 argmax near-ties flip). "
             "method: vLLM's --speculative-config name (`draft_model`, `eagle3`). predicted = E / (v + kappa c) with "
             "v, c from sections 3-4 (B = 1; the eagle runs' c is c_engine, the engine's draft seconds per drafted "
             "position over its plain seconds per step); predicted_at_B with section 5's steps at B.", "",
             f"EAGLE-3 head: {meta.get('eagle')}", ""]
    for name, s in sections.items():
        summary = "; ".join(f"{k} = {v}" for k, v in s.get("summary", {}).items())
        lines += [f"## {name}: {s['status']}", ""] + table(s["records"], COLUMNS[name])
        lines += (["", summary] if summary else []) + [""]
    return "\n".join(lines) + "\n"


def write(out: Path, meta: dict, sections: dict) -> None:
    "results.json and results.md into out (rewritten after every section: a killed run still leaves results)."
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(clean(dict(meta=meta, sections=sections)), indent=1) + "\n")
    (out / "results.md").write_text(markdown(meta, sections))


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    "Run every section in order within the budget; write results after each."
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.dry_run:
        sys.exit("h100_e2e.py needs a CUDA GPU; use --dry-run for the CPU smoke test")
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    if args.dry_run:
        torch.set_num_threads(1)                                      # a smoke test: stay light on a shared CPU
    t0 = time.time()
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    dt = "fp32" if args.dry_run else "bf16"
    if device == "cuda":
        gpu_name = torch.cuda.get_device_name()
    else:
        gpu_name = f"CPU ({platform.processor() or platform.machine()})"
    key = "h200" if "h200" in gpu_name.lower() else "h100"   # the roofline GPUSpec; any other GPU: an H100's
    graphs = device == "cuda" and not args.dry_run and not args.no_graphs
    run = dict(vars(args), t0=t0, device=device, dtype=dtype, dt=dt, gpu=get_gpu(key), graphs=graphs,
               bw=get_gpu(key).bandwidth, compiled=False, static_batch={})
    meta = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), gpu=gpu_name, gpu_spec=key,
                gpu_spec_matched=key in gpu_name.lower(), torch=torch.__version__, cuda=torch.version.cuda,
                python=platform.python_version(), device=device, dtype=dt, kappa=args.kappa, alpha=args.alpha,
                context=args.context, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget_s,
                graphs_requested=graphs, engine_batch_sizes=args.engine_batch_sizes,
                engine_tokens=args.engine_tokens, command="python " + " ".join(sys.argv), dry_run=args.dry_run,
                weights="checkpoint" if args.target else "random")
    meta["step_parity"] = step_parity(device)
    log(f"{gpu_name}: roofline spec {key}; static step vs speclab.model.forward max |diff| {meta['step_parity']:.2e}")
    m = load_models(args, dtype, device)
    meta["eagle"] = load_eagle(args, m)
    if m["eagle"] is not None:
        log(f"EAGLE-3 head {meta['eagle']['used']}: layers {meta['eagle']['feature_layers_used']}, draft vocabulary "
            f"{meta['eagle']['draft_vocab_size_used']} of {meta['eagle']['vocab_size']}")
    meta.update(target=m["target_spec"].name, draft=m["draft_spec"].name, ridge=ridge(run["gpu"], dt),
                c_derived=cost_ratio(m["draft_spec"], m["target_spec"], dt))
    log(f"target {meta['target']}, draft {meta['draft']}: models ready at {time.time() - t0:.1f} s")
    sections = {name: dict(status="not run", records=[]) for name in SECTIONS}
    for name, body in SECTIONS.items():
        if over_budget(run):
            sections[name]["status"] = "skipped (budget)"
            log(f"[{name}] skipped: budget of {args.budget_s} s spent")
        else:
            log(f"[{name}] at {time.time() - t0:.1f} s")
            try:
                body(run, meta, sections[name], m)
            except Exception as e:  # noqa: BLE001 -- record (e.g. out of memory) and go on to the next section
                sections[name]["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"
                log(f"  {sections[name]['status']}")
                free(run)
        meta.update(capture_error=run.get("capture_error"), wall_s=round(time.time() - t0, 1))
        write(args.out, meta, sections)
    log(f"wrote {args.out}/results.json and results.md in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
