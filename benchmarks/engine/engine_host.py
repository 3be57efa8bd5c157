"""The engine's host time per step, two speclab trees side by side in one run.

    git worktree add --detach /work/wt-before a05f9d2           # the engine before its split, once
    python benchmarks/engine/engine_host.py --before /work/wt-before --after .          # before vs this checkout
    python benchmarks/engine/engine_host.py --before /work/wt-before --after . --rounds 5 --json \\
        > benchmarks/engine/engine_host.json
    python benchmarks/engine/engine_host.py --before a05f9d2 --after HEAD   # git revisions: worktrees under /tmp
    python benchmarks/engine/engine_host.py --before . --after . --rounds 5 # the same tree twice: the noise

Each side is a speclab tree (a folder holding the `speclab` package, or a git revision of this checkout, made into a
detached worktree under /tmp once). Each measurement runs in its own process with PYTHONPATH=<tree> (the process
checks that it imported that tree's speclab), one torch thread, alternating before, after, before, after ... for
`--rounds` rounds, so that a machine that gets busier slows both sides alike.

One process measures every configuration on the shipped tiny pair (fp32, greedy, `--tokens` new tokens per request,
EOS ignored), each engine built by `speclab.serve.load_engine`, which works before and after the split:

- plain: no drafter (kappa 0);
- chain: the draft model, kappa 3;
- tree: Chapter 14's TreeDrafter on the draft model, an EAGLE-2 tree (top-2, 3 levels, 5 nodes verified a step);
- auto: the draft model with kappa "auto": the KappaPolicy plans each step's kappa, on FIXED_COSTS (a calibration of
  this machine, rounded, the same on both sides and in every process; `--measured-calibration`: each process
  calibrates itself, outside the timing, and its kappas follow that calibration).

At batch 1 and at `--batch` (default 8): one warm-up generate, then `--reps` timed generates on fresh prompts (no
prefix-cache hits; the same prompts on both sides), their times summed over their steps. Times are the CPU time of
the worker's one thread by default (`--clock cpu`: other work on a shared machine delays a process but adds little
to its CPU time), elapsed time with `--clock wall`. Per step: the total, the forwards (every `forward_paged` call,
target and draft), the verification (the rejection sampler, or the tree's `tree_verify`), and the rest = total -
forwards - verification: scheduling, KV bookkeeping, metadata, logits processors, the policy, the update, text. The
rest is the host time a refactor of the engine can change; the forwards are the same code on both sides, so their
ratio shows the noise.
Reported: medians over rounds per side, the ratio after / before of each median, and the spread of the rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]     # benchmarks/engine/ -> the checkout
HERE = Path(__file__).resolve().parent
TREE = {"topk": 2, "num_steps": 3, "num_draft_tokens": 6}
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}   # cpu: this thread's CPU seconds (one torch thread)
clock = time.thread_time
CONFIGS = {"plain": {"kappa": 0}, "chain": {"kappa": 3}, "tree": {"tree": TREE}, "auto": {"kappa": "auto"}}
PARTS = ("total", "forwards", "verify", "rest")


sys.path.insert(0, str(Path(__file__).resolve().parent))   # the walk's fixed calibration, shared
from engine_walk import FIXED_COSTS, fix_calibration, fixed_calls  # noqa: E402


def bench_env():
    "benchmarks/bench_env.py, wherever it lives: benchmarks/common/, benchmarks/ or beside this script."
    for folder in (HERE.parent / "common", HERE.parent, HERE):
        if (folder / "bench_env.py").is_file():
            sys.path.insert(0, str(folder))
            break
    import bench_env as env
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="the 'before' speclab tree: a folder holding speclab/, or a git revision")
    ap.add_argument("--after", default=str(ROOT), help="the 'after' tree, the same forms (default: this checkout)")
    ap.add_argument("--rounds", type=int, default=3, help="before/after alternations (default 3)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (default 48)")
    ap.add_argument("--batch", type=int, default=8, help="the larger batch, beside batch 1 (default 8)")
    ap.add_argument("--reps", type=int, default=2, help="timed generates per configuration and batch, on fresh "
                    "prompts, summed (default 2)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="cpu", help="cpu (default): the CPU time of the "
                    "process's one thread, which other work on the machine disturbs less; wall: elapsed time")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                    help="what to measure (default: all)")
    ap.add_argument("--measured-calibration", action="store_true", help="auto: each process calibrates this machine "
                    "(default: FIXED_COSTS, the same kappas on both sides)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tokens < 8 or a.batch < 1 or a.reps < 1:
        ap.error("--rounds, --batch and --reps must be >= 1 and --tokens >= 8")
    if not a.worker and not a.before:
        ap.error("--before is required: a folder holding speclab/, or a git revision")
    return a


# One side, in its own process.
class Timer:
    "Seconds spent in the outermost calls of the wrapped functions (a wrapped function calling another: once)."
    def __init__(self):
        self.seconds, self.depth = 0.0, 0

    def wrap(self, fn):
        "fn, timed into this timer."
        def timed(*args, **kwargs):
            self.depth += 1
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds += clock() - t0
        timed.__wrapped__ = fn
        return timed


def patch_everywhere(name: str, timer: Timer) -> int:
    """Replace the function `name` of speclab.model / speclab.sampling by its timed wrapper in every loaded speclab
    module that holds it (whatever module the engine's code calls it from, before or after a split). How many."""
    import speclab.model
    import speclab.sampling
    original = getattr(speclab.model, name, None) or getattr(speclab.sampling, name)
    wrapped, n = timer.wrap(original), 0
    for mod_name, mod in list(sys.modules.items()):
        if (mod_name == "speclab" or mod_name.startswith("speclab.")) and getattr(mod, name, None) is original:
            setattr(mod, name, wrapped)
            n += 1
    return n


def count_steps(engine) -> list:
    "A counter of the engine's step() calls, through an instance attribute that generate() reaches as self.step."
    calls, step = [0], engine.step

    def counted(*args, **kwargs):
        calls[0] += 1
        return step(*args, **kwargs)
    engine.step = counted
    return calls


def measure(config: str, batch: int, tokens: int, reps: int, prompts: list, timers: dict) -> dict:
    """ms per step (total, forwards, verify, rest) over `reps` generates on fresh prompts, after one warm-up: their
    seconds summed over their steps summed (each side runs the same prompts, so greedy runs the same steps)."""
    from speclab.engine import SamplingParams
    from speclab.serve import load_engine
    from speclab.train import tiny_pair_path
    args = CONFIGS[config]
    draft = None if config == "plain" else tiny_pair_path("draft")
    t0 = time.perf_counter()
    engine = load_engine(tiny_pair_path("target"), draft, seed=0, max_num_seqs=max(batch, 1), **args)
    build_s = time.perf_counter() - t0
    steps = count_steps(engine)
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    sums = dict.fromkeys(("total", "forwards", "verify", "steps"), 0.0)
    for rep in range(reps + 1):
        batch_prompts = prompts[rep * batch:(rep + 1) * batch]
        for t in timers.values():
            t.seconds = 0.0
        steps[0] = 0
        t0 = clock()
        engine.generate(batch_prompts, greedy)
        total = clock() - t0
        if rep == 0:                                  # the warm-up
            continue
        sums["total"] += total
        sums["forwards"] += timers["forwards"].seconds
        sums["verify"] += timers["verify"].seconds
        sums["steps"] += steps[0]
    ms = {k: round(1e3 * sums[k] / sums["steps"], 4) for k in ("total", "forwards", "verify")}
    ms["rest"] = round(ms["total"] - ms["forwards"] - ms["verify"], 4)
    return {**ms, "steps": int(sums["steps"]), "build_s": round(build_s, 3)}


def worker(a: argparse.Namespace) -> dict:
    "Every configuration of one side: the speclab first on sys.path (PYTHONPATH)."
    global clock
    clock = CLOCKS[a.clock]
    import torch
    import speclab
    import speclab.engine
    import speclab.serve
    import speclab.trees
    import speclab.eagle                                # load_engine's lazy imports, loaded before patching
    from speclab.train import eval_prompts
    torch.set_num_threads(1)
    timers = {"forwards": Timer(), "verify": Timer()}
    patched = {"forward_paged": patch_everywhere("forward_paged", timers["forwards"]),
               "rejection_sampler": patch_everywhere("rejection_sampler", timers["verify"]),
               "tree_verify": patch_everywhere("tree_verify", timers["verify"])}
    need = (a.reps + 1) * max(a.batch, 1)
    prompts = eval_prompts(n=need, prompt_len=48, seed=5)
    fixed = not a.measured_calibration and "auto" in a.configs and fix_calibration()
    if not a.measured_calibration and "auto" in a.configs and not fixed:
        raise SystemExit("found no StepCosts / measure_step_costs in speclab to fix auto's calibration: "
                         "run with --measured-calibration")
    out = {"speclab": str(Path(speclab.__file__).resolve().parent.parent), "patched": patched}
    with torch.no_grad():
        for config in a.configs:
            for batch in sorted({1, a.batch}):
                out[f"{config}/b{batch}"] = measure(config, batch, a.tokens, a.reps, prompts, timers)
    if fixed and not fixed_calls[0]:
        raise SystemExit("auto's engine did not call measure_step_costs: its calibration was not fixed; "
                         "run with --measured-calibration")
    out["calibration"] = "fixed" if fixed else "measured"
    return out


# Both sides, alternating.
def tree_of(spec: str) -> Path:
    "A side's tree: a folder holding speclab/ as given, else a git revision of this checkout as a worktree in /tmp."
    path = Path(spec).expanduser()
    if (path / "speclab" / "__init__.py").is_file():
        return path.resolve()
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", f"{spec}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise SystemExit(f"{spec!r} is neither a folder holding speclab/ nor a git revision of {ROOT}")
    wt = Path("/tmp") / f"speclab-engine-host-{sha.stdout.strip()}"
    if not (wt / "speclab" / "__init__.py").is_file():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), sha.stdout.strip()],
                       check=True, capture_output=True)
    return wt


def commit_of(tree: Path) -> dict:
    """A tree's HEAD commit and the git hash of its speclab/ folder at HEAD (equal hashes: the same package), with
    '+dirty' when speclab/'s files differ from HEAD (what is measured; other files do not matter); None outside git."""
    def git(*args: str) -> str | None:
        r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    head, package = git("rev-parse", "HEAD"), git("rev-parse", "HEAD:speclab")
    if head is None:
        return {"commit": None, "speclab_tree": None}
    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", "speclab") else ""
    return {"commit": head[:12] + dirty, "speclab_tree": (package or "")[:12] + dirty}


def ratio_range(results: dict) -> dict:
    """The lowest and highest after / before over the configurations, per part: for the same package on both sides
    (an A/A run), how far apart two sides measure by chance."""
    out = {}
    for part in PARTS:
        vals = [r[f"{part}_after_over_before"] for r in results.values() if r[f"{part}_after_over_before"]]
        out[part] = [min(vals), max(vals)] if vals else None
    return out


def run_side(tree: Path, a: argparse.Namespace) -> dict:
    "One worker process with `tree` first on sys.path; it must import that tree's speclab."
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--tokens", str(a.tokens), "--batch",
           str(a.batch), "--reps", str(a.reps), "--clock", a.clock, "--configs", *a.configs]
    cmd += ["--measured-calibration"] if a.measured_calibration else []
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=tree)
    if r.returncode != 0:
        raise SystemExit(f"the worker for {tree} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if Path(out["speclab"]) != tree:
        raise SystemExit(f"the worker for {tree} imported the speclab of {out['speclab']}: is it installed "
                         "non-editable somewhere ahead of PYTHONPATH?")
    return out


def spread(values: list[float]) -> float:
    "(max - min) / median of the rounds: how far apart the rounds of one side are."
    med = statistics.median(values)
    return round((max(values) - min(values)) / med, 3) if med else 0.0


def summarize(runs: dict, keys: list[str]) -> dict:
    "Per configuration/batch: each side's medians over rounds and the rounds themselves, and after / before."
    out = {}
    for key in keys:
        row = {}
        for side in ("before", "after"):
            for part in PARTS + ("steps",):
                vals = [r[key][part] for r in runs[side]]
                row[f"{side}_{part}"] = round(statistics.median(vals), 3)
                if part in ("total", "rest"):
                    row[f"{side}_{part}_rounds"] = [round(v, 3) for v in vals]
                    row[f"{side}_{part}_spread"] = spread(vals)
        for part in PARTS:
            b = row[f"before_{part}"]
            row[f"{part}_after_over_before"] = round(row[f"after_{part}"] / b, 3) if b > 0 else None
        out[key] = row
    return out


def table(res: dict) -> str:
    "The medians per side and the ratios, as plain text."
    out = [f"{res['date']}  {res['machine']}  load {res['load_before']} -> {res['load_after']}",
           f"before: {res['before']} (commit {res['before_commit']['commit']}, speclab/ "
           f"{res['before_commit']['speclab_tree']})",
           f"after:  {res['after']} (commit {res['after_commit']['commit']}, speclab/ "
           f"{res['after_commit']['speclab_tree']})" + ("  -- the same package: an A/A run" if res["same_package"]
                                                          else ""),
           f"{res['rounds']} rounds, {res['tokens']} tokens per request, {res['reps']} generates per configuration "
           f"and round; ms per step ({res.get('clock', 'wall')} time), medians over rounds", "",
           f"{'config/batch':<14}{'steps':>6}" + "".join(f"{p + ' b':>12}{p + ' a':>12}{'a/b':>7}" for p in PARTS),
           "-" * (20 + 31 * len(PARTS))]
    for key, row in res["results"].items():
        ratio = {p: "-" if row[f"{p}_after_over_before"] is None else f"{row[f'{p}_after_over_before']:.3f}"
                 for p in PARTS}
        cells = "".join(f"{row[f'before_{p}']:>12.2f}{row[f'after_{p}']:>12.2f}{ratio[p]:>7}" for p in PARTS)
        out.append(f"{key:<14}{row['before_steps']:>6.0f}{cells}")
    out += ["", "after / before, lowest and highest over the configurations: "
            + ", ".join(f"{p} {r[0]}-{r[1]}" for p, r in res["ratio_range"].items() if r)]
    out += ["spread of the rounds ((max - min) / median), rest: "
            + ", ".join(f"{k} {r['before_rest_spread']}/{r['after_rest_spread']}" for k, r in res["results"].items())]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    "Both sides, alternating; the table and the ratios."
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return {}
    env = bench_env()
    before, after = tree_of(a.before), tree_of(a.after)
    runs, load0, t0 = {"before": [], "after": []}, env.load_average(), time.perf_counter()
    for i in range(a.rounds):
        for side, tree in (("before", before), ("after", after)):
            runs[side].append(run_side(tree, a))
            print(f"round {i + 1}/{a.rounds} {side} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    keys = [k for k in runs["before"][0] if "/" in k]
    res = {"date": env.utc_now(), "machine": env.machine().replace("threads", "threads (workers: 1)"),
           "before": str(before), "before_commit": commit_of(before), "after": str(after),
           "after_commit": commit_of(after), "load_before": load0,
           "load_after": env.load_average(), "wall_s": round(time.perf_counter() - t0, 1), "rounds": a.rounds,
           "tokens": a.tokens, "batch": a.batch, "reps": a.reps, "clock": a.clock,
           "auto_costs": "measured by each process" if a.measured_calibration else FIXED_COSTS,
           "configs": {c: CONFIGS[c] for c in a.configs},
           "python": sys.version.split()[0], "results": summarize(runs, keys), "raw": runs}
    res["same_package"] = (before == after or res["before_commit"]["speclab_tree"] is not None and "dirty" not in
                           res["before_commit"]["speclab_tree"] and res["before_commit"]["speclab_tree"]
                           == res["after_commit"]["speclab_tree"])
    res["ratio_range"] = ratio_range(res["results"])
    print(json.dumps(res, indent=1) if a.json else table(res))
    return res


if __name__ == "__main__":
    main()
