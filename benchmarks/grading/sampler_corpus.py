"""Lab 08's accept/reject question graded against a corpus of samplers: how often grading catches a wrong one, and how
often it fails a correct one.

The corpus is `sampler_corpus/`: one file per implementation of `accept_reject(p, q, rng)`, written as a student's
answer cell would be (numpy imported, nothing else assumed). `wrong/` holds the mistakes students and engines make
(most modelled on `speclab.proof`'s planted bugs and `speclab.testing.FAULTS`), `correct/` the same law written in
other ways. Each file's docstring says what it does.

Each implementation is graded `--gradings` times with fresh seeds, the way the autograder grades Question 8: every
Q8 case of the lab's autograder tests (`speclab.grading.load_lab`), the exactness cases through the grader's own
child code (`_child_run`'s "draws": n calls of the sampler with `numpy.random.default_rng(seed)`) and its own judge
(`_check`, which applies Chapter 1's `verdict_from_draws`), with the case's seed replaced by a fresh one; the other
cases as written. A grading *catches* an implementation when any Q8 case fails. Reported per implementation:

- the gradings that caught it (and the Clopper-Pearson 95% interval of the catch rate);
- its bias: the total variation distance between its emitted law and p, on the Q8 pair where it is largest,
  estimated from all its draws (every grading's draws pooled; a file's `law(p, q)` gives it exactly instead);
- the catch rate at that law: `--model` simulated gradings, each case's n tokens drawn from the estimated (or exact)
  law and judged by the same chi-square (the per-grading catch probability, without re-running the sampler);
- over the correct implementations, the false-fail rate (gradings that failed a correct sampler) with its
  Clopper-Pearson 95% interval.

`--timing` also grades each correct implementation once in a child process inside a memory cgroup and a CPU quota
(Gradescope's defaults: 768 MB, 0.5 CPU; needs root and cgroups, the pieces of gradescope_limits.py): the seconds
one grading of Q8 takes there.

    .venv/bin/python benchmarks/grading/sampler_corpus.py [--gradings 20] [--correct-gradings 80] [--model 2000]
        [--only NAME,...] [--timing] [--out benchmarks/grading/sampler_corpus.json]

Writes sampler_corpus.json (every figure, the machine, the command) and sampler_corpus.md next to this file.
"""
import argparse
import ast
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats

from speclab.grading import TestCase, _check, _child_run, load_lab
from speclab.proof import LEVEL, chi_square_gof

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "sampler_corpus"
LAB = ROOT / "labs" / "08_acceptance"
QUESTION = "q8_sampler"
GOALS = dict(catch_rate=0.95, false_fail_rate=0.01, seconds=60.0)


@dataclass
class Implementation:
    "One corpus member: its file's name, 'wrong' or 'correct', its docstring, its sampler and its exact law if given."
    name: str
    kind: str
    doc: str
    sampler: object
    law: object = None


def load_implementation(path: Path) -> Implementation:
    "Run one corpus file in a fresh namespace (as the grader runs a student's cell) and take its accept_reject."
    text = path.read_text(encoding="utf-8")
    namespace = {"__name__": f"corpus_{path.stem}"}
    exec(compile(text, str(path), "exec"), namespace)
    if not callable(namespace.get("accept_reject")):
        raise ValueError(f"{path} defines no accept_reject(p, q, rng)")
    doc = ast.get_docstring(ast.parse(text)) or ""
    return Implementation(path.stem, path.parent.name, " ".join(doc.split()), namespace["accept_reject"],
                          namespace.get("law"))


def load_corpus(only: list | None = None) -> list[Implementation]:
    "Every corpus member (wrong ones first), or those named in `only`."
    paths = sorted(CORPUS.glob("wrong/*.py")) + sorted(CORPUS.glob("correct/*.py"))
    found = [load_implementation(path) for path in paths if only is None or path.stem in only]
    missing = set(only or ()) - {imp.name for imp in found}
    if missing:
        raise ValueError(f"no corpus member named {sorted(missing)}")
    return found


def q8_cases(lab: Path = LAB) -> list[TestCase]:
    "Question 8's cases, public and hidden, as the autograder reads them."
    cases = [case for case in load_lab(lab).cases if case.question == QUESTION]
    if not any(case.draws for case in cases):
        raise ValueError(f"{lab}: {QUESTION} has no exactness case")
    return cases


# ------------------------------------------------------------------------------------------------ one grading
def grade_case(sampler, case: TestCase, seed: int) -> tuple[bool, list | None]:
    "One case as the autograder runs it, a draws case on `seed`: (passed, the draws or None)."
    namespace = {"np": np, "accept_reject": sampler}
    if case.draws:
        request = {"op": "draws", **case.draws, "seed": seed}
        case = replace(case, draws=request)
    else:
        request = {"op": "test", "setup": list(case.setup), "expr": case.expr}
    try:
        value = _child_run(request, namespace)
        reply = {"ok": True, "value": value}
    except Exception as e:                                   # the child reports an error: the case fails
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    draws = reply.get("value") if case.draws and reply["ok"] else None
    return _check(case, reply, None).passed, draws


def grade_once(sampler, cases: list, seed: int) -> tuple[dict, dict]:
    "Every Q8 case once, each draws case on its own fresh seed: ({case: passed}, {case: draws})."
    passed, draws = {}, {}
    for k, case in enumerate(cases):
        passed[case.name], got = grade_case(sampler, case, seed * 1000 + k)
        if got is not None:
            draws[case.name] = got
    return passed, draws


# ------------------------------------------------------------------------------------------------ figures
def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    "Exact two-sided interval of a binomial rate from k successes in n trials."
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum())


def laws(imp: Implementation, cases: list, pooled: dict) -> dict:
    "{case: the implementation's law on the case's pair}: exact from `law`, else the pooled draws' frequencies."
    out = {}
    for case in cases:
        if not case.draws:
            continue
        p, q = np.asarray(case.draws["p"]), np.asarray(case.draws["q"])
        if imp.law is not None:
            out[case.name] = np.asarray(imp.law(p, q), np.float64)
        elif pooled.get(case.name):
            counts = np.bincount(np.concatenate(pooled[case.name]), minlength=len(p))
            out[case.name] = counts / counts.sum()
    return out


def modelled_catch(law: dict, cases: list, fixed_fail: bool, trials: int, seed: int) -> float:
    """The chance one grading catches a sampler with these laws: `trials` gradings simulated, each draws case's n
    tokens drawn from the law and judged by the same chi-square at the same level. A non-draws case that failed in
    every real grading (`fixed_fail`) catches it every time."""
    if fixed_fail:
        return 1.0
    draws = [case for case in cases if case.draws]
    if any(case.name not in law for case in draws):
        return 1.0                                           # no draws: it raised in every grading, a failed case
    rng = np.random.default_rng(seed)
    caught = 0
    for _ in range(trials):
        for case in draws:
            counts = rng.multinomial(case.draws["n"], law[case.name] / law[case.name].sum())
            if chi_square_gof(counts, case.draws["p"])[1] < LEVEL:
                caught += 1
                break
    return caught / trials


def measure(imp: Implementation, cases: list, gradings: int, trials: int, seed: int) -> dict:
    "Grade one implementation `gradings` times; its catches, bias and modelled catch rate."
    t0 = time.monotonic()
    fails, per_case, pooled = 0, {case.name: 0 for case in cases}, {}
    for g in range(gradings):
        passed, draws = grade_once(imp.sampler, cases, seed + g)
        fails += not all(passed.values())
        for name, ok in passed.items():
            per_case[name] += not ok
        for name, got in draws.items():
            pooled.setdefault(name, []).append(np.asarray(got))
    seconds = time.monotonic() - t0
    law = laws(imp, cases, pooled)
    bias = {name: total_variation(law[name], case.draws["p"]) for case in cases for name in [case.name]
            if case.draws and name in law}
    always = any(per_case[case.name] == gradings for case in cases if not case.draws)
    low, high = clopper_pearson(fails, gradings)
    return dict(name=imp.name, kind=imp.kind, doc=imp.doc, gradings=gradings, failed=fails, fail_rate=fails / gradings,
                fail_rate_ci95=[low, high], failed_per_case=per_case, bias_tv=max(bias.values(), default=None),
                bias_per_case=bias, bias_exact=imp.law is not None,
                modelled_catch=modelled_catch(law, cases, always, trials, seed) if imp.kind == "wrong" else None,
                seconds_per_grading=seconds / gradings)


# ------------------------------------------------------------------------------------------------ timing
def time_in_cgroup(names: list, memory_mb: int, cpus: float) -> dict:
    "{name: seconds of one Q8 grading} in a child process inside a memory cgroup and a CPU quota."
    sys.path.insert(0, str(HERE))
    from gradescope_limits import cgroup_version, make_cgroup, remove_cgroup
    version = cgroup_version()
    folders = make_cgroup(version, f"speclab-corpus-{os.getpid()}", memory_mb, cpus)
    procs = [str(folder / "cgroup.procs") for folder in folders]

    def join():
        for path in procs:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
    argv = [sys.executable, str(Path(__file__).resolve()), "--time-child", ",".join(names)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}             # as run_autograder sets it
    try:
        done = subprocess.run(argv, capture_output=True, text=True, preexec_fn=join, env=env, timeout=3600)
    finally:
        remove_cgroup(folders)
    if done.returncode != 0:
        raise RuntimeError(f"the timing child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_child(names: list) -> None:
    "In the cgroup: grade each named implementation once (imports paid first) and print {name: seconds}."
    cases = q8_cases()
    seconds = {}
    for imp in load_corpus(names):
        t0 = time.monotonic()
        grade_once(imp.sampler, cases, 0)
        seconds[imp.name] = round(time.monotonic() - t0, 2)
    print(json.dumps(seconds))


# ------------------------------------------------------------------------------------------------ report
def machine() -> dict:
    "The CPU, cores, memory, Python, numpy and torch of this machine."
    import torch
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "unknown")
    total = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal"))
    return dict(cpu=model, cores=os.cpu_count(), memory_gib=round(total / 2**20, 1), python=platform.python_version(),
                numpy=np.__version__, torch=torch.__version__)


def exact_false_fail(cases: list, trials: int, seed: int) -> dict:
    "The false-fail rate at the exact law p: `trials` simulated gradings of an exact sampler, with its 95% interval."
    exact = {case.name: np.asarray(case.draws["p"], np.float64) for case in cases if case.draws}
    rate = modelled_catch(exact, cases, False, trials, seed)
    return dict(trials=trials, rate=rate, ci95=list(clopper_pearson(round(rate * trials), trials)))


def summary(rows: list, cases: list, timing: dict | None, exact: dict) -> dict:
    "The figures the goals are about."
    wrong = [r for r in rows if r["kind"] == "wrong"]
    correct = [r for r in rows if r["kind"] == "correct"]
    gradings = sum(r["gradings"] for r in correct)
    fails = sum(r["failed"] for r in correct)
    missed = [r["name"] for r in wrong if r["fail_rate"] < GOALS["catch_rate"]]
    draws_cases = [case for case in cases if case.draws]
    return dict(wrong=len(wrong), correct=len(correct), caught_every_grading=sum(r["failed"] == r["gradings"]
                                                                                  for r in wrong),
                below_goal=missed, correct_gradings=gradings, correct_failed=fails,
                false_fail_rate=fails / gradings if gradings else None,
                false_fail_ci95=list(clopper_pearson(fails, gradings)) if gradings else None,
                exactness_cases=len(draws_cases), draws_per_grading=sum(case.draws["n"] for case in draws_cases),
                level_per_case=LEVEL, false_fail_bound=1 - (1 - LEVEL) ** len(draws_cases), false_fail_exact_law=exact,
                timing_s=timing, slowest_s=max(timing.values()) if timing else None)


def markdown(report: dict) -> str:
    "The report as a Markdown page."
    s = report["summary"]
    lines = ["# Lab 08's accept/reject question against a corpus of samplers", "",
             f"**Date:** {report['date']}. **Machine:** {report['machine']['cpu']}, "
             f"{report['machine']['cores']} cores, "
             f"{report['machine']['memory_gib']} GiB, Python {report['machine']['python']}, numpy "
             f"{report['machine']['numpy']}, torch {report['machine']['torch']}. **Load** (1-minute average): "
             f"{report['load'][0]} before, {report['load'][1]} after.", "",
             "```sh", report["command"], "```", "",
             f"Question 8 as graded: {s['exactness_cases']} exactness cases ({s['draws_per_grading']:,} draws of the "
             f"student's sampler per grading), each a chi-square at level {s['level_per_case']:g}, so a correct "
             f"sampler fails a grading with probability at most {s['false_fail_bound']:.4f}.", "",
             f"- wrong implementations: {s['wrong']}; caught by every grading: {s['caught_every_grading']}; "
             f"caught less than {GOALS['catch_rate']:.0%} of the time: {', '.join(s['below_goal']) or 'none'}",
             f"- correct implementations: {s['correct']}; gradings {s['correct_gradings']}, failed "
             f"{s['correct_failed']}: false-fail rate {s['false_fail_rate']:.4f}, Clopper-Pearson 95% "
             f"[{s['false_fail_ci95'][0]:.4f}, {s['false_fail_ci95'][1]:.4f}]",
             f"- the same grading simulated at the exact law p ({s['false_fail_exact_law']['trials']:,} gradings): "
             f"false-fail rate {s['false_fail_exact_law']['rate']:.4f}, Clopper-Pearson 95% "
             f"[{s['false_fail_exact_law']['ci95'][0]:.4f}, {s['false_fail_exact_law']['ci95'][1]:.4f}]"]
    if s["timing_s"]:
        lines.append(f"- one grading of Q8 at {report['timing_limits']['memory_mb']} MB and "
                     f"{report['timing_limits']['cpus']} CPU: {min(s['timing_s'].values()):.1f} to "
                     f"{s['slowest_s']:.1f} s over the correct implementations")
    lines += ["", "| implementation | kind | caught / gradings | 95% interval | bias (TV) | modelled catch "
              "| s per grading |",
              "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        bias = "raises" if r["bias_tv"] is None else f"{r['bias_tv']:.2g}" + (" (exact)" if r["bias_exact"] else "")
        model = "" if r["modelled_catch"] is None else f"{r['modelled_catch']:.4f}"
        lines.append(f"| {r['name']} | {r['kind']} | {r['failed']} / {r['gradings']} | "
                     f"[{r['fail_rate_ci95'][0]:.3f}, {r['fail_rate_ci95'][1]:.3f}] | {bias} | {model} | "
                     f"{r['seconds_per_grading']:.2f} |")
    lines += ["", "For a correct implementation *caught* counts gradings that failed it (false fails). *bias* is the "
              "total variation distance from p on the Q8 pair where it is largest, from the pooled draws of every "
              "grading (sampling noise alone gives about 0.002 to 0.004 there) or exact where the file gives its "
              "law. *modelled catch* is the catch probability of one grading at that law (simulated gradings).", ""]
    lines += ["## What each implementation does", ""]
    lines += [f"- **{r['name']}** ({r['kind']}): {r['doc']}" for r in report["rows"]]
    return "\n".join(lines) + "\n"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gradings", type=int, default=20, help="gradings of each wrong implementation")
    p.add_argument("--correct-gradings", type=int, default=80, help="gradings of each correct implementation")
    p.add_argument("--model", type=int, default=2000, help="simulated gradings for each modelled catch rate")
    p.add_argument("--seed", type=int, default=20261206, help="the first grading's seed (fresh ones follow)")
    p.add_argument("--only", help="corpus members to grade, comma-separated (default: all)")
    p.add_argument("--timing", action="store_true", help="also time one grading in a cgroup (root)")
    p.add_argument("--memory-mb", type=int, default=768, help="the timing cgroup's memory (Gradescope: 768)")
    p.add_argument("--cpus", type=float, default=0.5, help="the timing cgroup's CPU quota (Gradescope: 0.5)")
    p.add_argument("--out", default=str(HERE / "sampler_corpus.json"), help="where the JSON goes (.md beside it)")
    p.add_argument("--time-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.gradings < 1 or args.correct_gradings < 1 or args.model < 1:
        p.error("--gradings, --correct-gradings and --model must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.time_child:
        time_child(args.time_child.split(","))
        return 0
    cases = q8_cases()
    corpus = load_corpus(args.only.split(",") if args.only else None)
    load = [round(os.getloadavg()[0], 2)]
    rows = []
    for i, imp in enumerate(corpus):
        n = args.gradings if imp.kind == "wrong" else args.correct_gradings
        row = measure(imp, cases, n, args.model, args.seed + 100_000 * i)
        rows.append(row)
        print(f"{imp.kind:7} {imp.name:32} caught {row['failed']:4} / {n:<4} bias {row['bias_tv']} "
              f"model {row['modelled_catch']}  {row['seconds_per_grading']:.2f} s/grading", flush=True)
    timing = None
    if args.timing:
        timing = time_in_cgroup([r["name"] for r in rows if r["kind"] == "correct"], args.memory_mb, args.cpus)
    load.append(round(os.getloadavg()[0], 2))
    report = dict(date=datetime.date.today().isoformat(), machine=machine(), load=load,
                  command=" ".join([Path(sys.executable).name, *sys.argv]), lab=str(LAB.relative_to(ROOT)),
                  question=QUESTION, goals=GOALS,
                  cases=[dict(case=c.name, hidden=c.hidden, draws=c.draws, expr=None if c.draws else c.expr)
                         for c in cases],
                  timing_limits=dict(memory_mb=args.memory_mb, cpus=args.cpus) if args.timing else None,
                  rows=rows, summary=summary(rows, cases, timing, exact_false_fail(cases, 10 * args.model, args.seed)))
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(json.dumps(report["summary"], indent=1))
    print(f"written to {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
