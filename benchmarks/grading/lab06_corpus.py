"""Lab 06 (KV rollback): how often the hidden tests catch each planted mistake, how often they fail a correct answer,
and how long grading the master takes.

    .venv/bin/python benchmarks/grading/lab06_corpus.py --seeds 100 --traces 1900 --grade-runs 3   # everything
    .venv/bin/python benchmarks/grading/lab06_corpus.py --seeds 20 --parts catch                    # a quick look
    .venv/bin/python benchmarks/grading/lab06_corpus.py --parts false_fail --extend --traces 700    # more of one part

Each part is saved as it finishes; `--parts` measures some and keeps the others (lab06_corpus.md names the command
behind each figure).

The hidden tests of each question are of two kinds: scenarios (fixed operations, judged exactly) and fuzz cases, each
running Chapter 6b's fuzzer (`fuzz(alone(q), range(a, a + n), **config)`: n seeded random workloads, the invariant
checker after every operation). A fuzz case's verdict depends on its seeds, so this script measures it over fresh
seeds, one workload at a time, disjoint from the seeds of the lab's own tests:

* catch rate: for each mistake (tests/lab06_mistakes.py, each in place of the master's answer) and each fuzz
  configuration of its question's hidden tests, the share of fresh workloads that expose it (a violation, a crash,
  or a different number of published blocks than Chapter 6's own manager on the same workload), with a
  Clopper-Pearson interval. The probability that a fresh draw of the hidden fuzz cases (n seeds per configuration)
  catches the mistake is 1 - prod_c (1 - p_c) ** n_c, computed at the interval's lower ends too; a mistake a hidden
  scenario catches is caught whatever the seeds.
* false fails: the correct master and a correct answer written differently (it gives blocks back at once after a
  rollback or a cancel) on `--traces` fresh workloads per configuration of every question: a whole fresh draw of
  the hidden fuzz cases is a set of disjoint workloads, so k of them with no failure are k independent draws of the
  suite, and the Clopper-Pearson interval of 0 failures in k bounds the false-fail rate.
* grading time: `speclab grade` of the autograder notebook (the master's solutions), sandboxed when root can.

It writes lab06_corpus.json and lab06_corpus.md next to itself. The grader runs the student's notebook with
`python -I`, so `--python` must name an interpreter that imports this checkout's speclab that way (in a git worktree
whose virtual environment belongs to another checkout: a scratch venv whose .pth lists the worktree first).
"""
import argparse
import ast
import datetime
import doctest
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy.stats import beta
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from lab06_mistakes import BUGS, CORRECT_TRIM, LAB, MASTER, planted, src, with_answers  # noqa: E402

from speclab.grading import read_tests  # noqa: E402

LEVEL = 0.05            # two-sided Clopper-Pearson intervals at 95%
FRESH = 100_000         # fresh seeds start here: the lab's own tests use seeds below 5,000


def cpu_model() -> str:
    "The processor's name (Linux), or the machine type."
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
    return names[0] if names else platform.machine()


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    "Two-sided interval for a binomial rate: k successes in n trials."
    lo = 0.0 if k == 0 else float(beta.ppf(level / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - level / 2, k + 1, n - k))
    return lo, hi


def namespace(nb: dict) -> dict:
    "A Lab 06 notebook's setup and answer cells run in a fresh namespace (not otter's cells, not the demos)."
    ns = {"__name__": "__main__"}
    for c in nb["cells"]:
        s = src(c)
        if c["cell_type"] != "code" or "grader" in s or s.startswith(("print(", "fuzz(")):
            continue
        exec(compile(s, "<cell>", "exec"), ns)
    return ns


def reference_namespace() -> dict:
    "The master's namespace with Chapter 6's BlockManager methods in place of every answer: the judge of counts."
    ns = namespace(json.loads(MASTER.read_text(encoding="utf-8")))
    for names in ns["LAB_METHODS"].values():
        for name in names:
            setattr(ns["KVManager"], name, getattr(ns["BlockManager"], name))
    return ns


def fuzz_configs(cases) -> dict:
    """{question: [(config, number of seeds)]}: every fuzz call of the hidden cases, as
    `fuzz(alone(q), range(a, b), **config)`."""
    out = {}
    for case in cases:
        if not case.hidden:
            continue
        for node in ast.walk(ast.parse(case.expr, mode="eval")):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fuzz":
                question = ast.literal_eval(node.args[0].args[0])
                seeds = range(*[ast.literal_eval(a) for a in node.args[1].args])
                config = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                out.setdefault(question, []).append((config, len(seeds)))
    return out


def scenario_failures(ns: dict, cases, question: str) -> list[int]:
    "Numbers of the hidden scenario (non-fuzz) cases of `question` that `ns` fails."
    failed = []
    for case in cases:
        if not case.hidden or case.question.split("_")[0] != question or "fuzz(" in case.expr:
            continue
        env = dict(ns)
        try:
            for statement in case.setup:
                exec(compile(statement, "<test>", "exec"), env)
            value = eval(compile(case.expr, "<test>", "eval"), env)
            got = "" if value is None else repr(value)
        except Exception as e:  # a mistake may raise anything
            got = f"raised {type(e).__name__}"
        if not doctest.OutputChecker().check_output(case.want + "\n", got + "\n", 0):
            failed.append(case.number)
    return failed


def exposed(ns: dict, ref: dict, question: str, config: dict, seed: int) -> bool:
    "Whether one fresh workload exposes `ns`'s answer to `question`: a violation, a crash, or other published keys."
    violations, cached = ns["fuzz"](ns["alone"](question), [seed], **config)
    if violations:
        return True
    return question == "q2" and cached != ref["fuzz"](ref["alone"](question), [seed], **config)[1]


def catch_rates(cases, configs, ref, seeds: int) -> dict:
    "Per planted mistake: its scenario failures, and per fuzz configuration the share of fresh workloads exposing it."
    out = {}
    for k, bug in enumerate(tqdm(BUGS, desc="planted mistakes")):
        question = BUGS[bug][0]
        ns = namespace(planted(bug))
        rows = []
        for c, (config, n) in enumerate(configs[question]):
            start = FRESH + 1000 * (100 * k + c)
            caught = sum(exposed(ns, ref, question, config, s) for s in range(start, start + seeds))
            lo, hi = clopper_pearson(caught, seeds)
            rows.append({"config": config, "hidden_seeds": n, "caught": caught, "workloads": seeds,
                         "rate": caught / seeds, "ci": [lo, hi]})
        power = 1 - math.prod((1 - r["rate"]) ** r["hidden_seeds"] for r in rows)
        power_lo = 1 - math.prod((1 - r["ci"][0]) ** r["hidden_seeds"] for r in rows)
        scenarios = scenario_failures(ns, cases, question)
        out[bug] = {"question": question, "hidden_scenarios_failed": scenarios, "fuzz": rows,
                    "fuzz_power": power, "fuzz_power_ci_low": power_lo,
                    "catch_rate": 1.0 if scenarios else power, "catch_rate_ci_low": 1.0 if scenarios else power_lo}
    return out


def false_fails(cases, configs, ref, answers: dict, traces: int, before: dict | None = None) -> dict:
    """Per correct answer: failed hidden scenarios, and failures over `traces` fresh workloads per fuzz configuration;
    the number of disjoint fresh draws of the whole hidden fuzz suite they hold, and the interval of its false-fail
    rate. `before`: an earlier run's results, extended with the next `traces` workloads per configuration."""
    out = {}
    for name, nb in answers.items():
        done = (before or {}).get(name, {"workloads_per_config": 0, "failed_workloads": 0})
        ns, failures, draws = namespace(nb), done["failed_workloads"], math.inf
        for question, rows in tqdm(list(configs.items()), desc=name):
            for c, (config, n) in enumerate(rows):
                start = FRESH + 10_000_000 + 100_000 * c + 1_000_000 * int(question[1]) + done["workloads_per_config"]
                failures += sum(exposed(ns, ref, question, config, s) for s in range(start, start + traces))
                draws = min(draws, (done["workloads_per_config"] + traces) // n)
        scenarios = {q: scenario_failures(ns, cases, q) for q in configs}
        lo, hi = clopper_pearson(0 if failures == 0 else 1, draws)
        out[name] = {"hidden_scenarios_failed": {q: v for q, v in scenarios.items() if v},
                     "workloads_per_config": done["workloads_per_config"] + traces, "failed_workloads": failures,
                     "suite_draws": draws,
                     "failed_suite_draws": 0 if failures == 0 else "at least 1", "ci": [lo, hi]}
    return out


def grading_time(runs: int, python: str) -> dict:
    "Seconds `speclab grade` (run by `python`) takes on the autograder notebook (the master's solutions); its report."
    seconds, head = [], None
    grade = "import sys; from speclab.cli import main; sys.exit(main())"
    for _ in range(runs):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:  # the grader hides the folder of its output: one of its own
            r = subprocess.run([python, "-c", grade, "grade", str(LAB / "autograder" / "kv_rollback.ipynb"), "--lab",
                                str(LAB), "--out", str(Path(out) / "results.json")], capture_output=True, text=True)
        seconds.append(time.perf_counter() - t0)
        head = " / ".join((r.stdout.strip().splitlines() or [r.stderr.strip()[-300:]])[:2])
    return {"runs": runs, "python": python, "seconds": [round(s, 1) for s in seconds], "report": head}


def seeds_needed(rows: list, target: float = 0.95) -> int | None:
    "Fewest workloads per configuration whose fresh draw catches a mistake with probability >= target, at CI lows."
    miss = math.prod(1 - r["ci"][0] for r in rows)
    if miss >= 1:
        return None
    return max(1, math.ceil(math.log(1 - target) / math.log(miss))) if miss > 0 else 1


def sizing(result: dict) -> list[str]:
    "What the hidden fuzz cases' size buys: the mistakes only the fuzzer catches, and the workloads each one needs."
    fuzz_only = {b: r for b, r in result["catch"].items() if not r["hidden_scenarios_failed"]}
    hidden = sorted({c["seeds"] for rows in result["hidden_fuzz"].values() for c in rows})
    need = {b: seeds_needed(r["fuzz"]) for b, r in fuzz_only.items()}
    worst = min(r["fuzz_power_ci_low"] for r in fuzz_only.values()) if fuzz_only else None
    lines = ["", f"Sizing: the hidden fuzz cases run {hidden} workloads of 40 operations per configuration. "
             f"{len(result['catch']) - len(fuzz_only)} of the {len(result['catch'])} mistakes fail a hidden scenario "
             f"whatever the seeds; for the other {len(fuzz_only)} a fresh draw of the hidden fuzz cases catches each "
             f"with probability at least {worst:.5f} (at the intervals' lower ends), and 95% would need at most "
             f"{max(need.values())} workloads per configuration ({', '.join(f'{b}: {n}' for b, n in need.items())})."]
    return lines


def markdown(result: dict) -> str:
    "The short report."
    runs = result["runs"]
    lines = ["# Lab 06 grading: catch rates, false fails, time", ""]
    if "catch" in result:
        run = runs["catch"]
        lines += [f"Catch rates: {run['date']}, {run['machine']}; `{run['command']}`. Fresh workloads per mistake and "
                  f"fuzz configuration: {run['seeds']}. Intervals: Clopper-Pearson, {100 * (1 - LEVEL):.0f}%.", "",
                  "| mistake | hidden scenarios failed | fuzz: workloads exposing it, per configuration | "
                  "fuzz power (CI low) | catch rate |", "|---|---|---|---|---|"]
        for bug, r in result["catch"].items():
            per = ", ".join(f"{x['caught']}/{x['workloads']}" for x in r["fuzz"])
            lines.append(f"| {bug} | {r['hidden_scenarios_failed'] or '-'} | {per} | {r['fuzz_power']:.4f} "
                         f"({r['fuzz_power_ci_low']:.4f}) | {r['catch_rate']:.4f} |")
        lines += sizing(result)
    if "false_fail" in result:
        done = runs["false_fail"] if isinstance(runs["false_fail"], list) else [runs["false_fail"]]
        said = "; then ".join(f"{r['date']}, {r['machine']}; `{r['command']}`" for r in done)
        lines += ["", f"False fails: {said}.", "",
                  "| correct answer | hidden scenarios failed | failed workloads | fresh suite draws | "
                  "false-fail rate, 95% CI |", "|---|---|---|---|---|"]
        for name, r in result["false_fail"].items():
            lines.append(f"| {name} | {r['hidden_scenarios_failed'] or '-'} | {r['failed_workloads']} of "
                         f"{r['workloads_per_config']} per configuration | {r['suite_draws']} | "
                         f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] |")
        r = result["false_fail_pooled"]
        lines.append(f"| both, pooled | - | - | {r['suite_draws']} | [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] |")
        configs = sum(len(rows) for rows in result["hidden_fuzz"].values())
        workloads = sum(x["workloads_per_config"] * configs for x in result["false_fail"].values())
        failed = sum(x["failed_workloads"] for x in result["false_fail"].values())
        hi = clopper_pearson(failed, workloads)[1]
        lines += ["", f"Per fresh workload ({configs} configurations, {workloads} workloads in all, {failed} failed): "
                  f"a correct answer fails one with probability below {hi:.2g} (95% upper end)."]
    if result.get("grading"):
        run, g = runs["grading"], result["grading"]
        lines += ["", f"Grading time: {run['date']}, {run['machine']}; `{run['command']}`. `speclab grade` of the "
                  f"master, wall seconds per run: {g['seconds']} ({g['report']})."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="fresh workloads per mistake and fuzz configuration")
    ap.add_argument("--traces", type=int, default=200, help="fresh workloads per configuration, correct answers")
    ap.add_argument("--grade-runs", type=int, default=1, help="timed `speclab grade` runs of the master")
    ap.add_argument("--parts", default="catch,false_fail,grading",
                    help="what to measure (comma-separated); the other parts of lab06_corpus.json are kept")
    ap.add_argument("--extend", action="store_true",
                    help="false fails: add --traces fresh workloads per configuration to those already measured")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose speclab grades (one whose `python -I` imports this checkout's speclab)")
    ap.add_argument("--only", help="comma-separated substrings: measure only the mistakes whose name has one")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    unknown = set(parts) - {"catch", "false_fail", "grading"}
    if unknown:
        ap.error(f"--parts must name catch, false_fail or grading, got {sorted(unknown)}")
    path = HERE / "lab06_corpus.json"
    result = json.loads(path.read_text()) if path.exists() and len(parts) < 3 else {"runs": {}}
    run = {"date": datetime.date.today().isoformat(),
           "machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
           "command": "python benchmarks/grading/lab06_corpus.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    cases = read_tests(LAB / "autograder" / "tests")
    configs = fuzz_configs(cases)
    ref = reference_namespace()
    result["level"] = LEVEL
    result["hidden_fuzz"] = {q: [{"config": c, "seeds": n} for c, n in rows] for q, rows in configs.items()}
    if a.only:
        keep = a.only.split(",")
        for bug in [b for b in BUGS if not any(k in b for k in keep)]:
            del BUGS[bug]
    if "catch" in parts:
        result["runs"]["catch"] = {**run, "seeds": a.seeds}
        result["catch"] = catch_rates(cases, configs, ref, a.seeds)
        write(result)
    if "false_fail" in parts:
        master = json.loads(MASTER.read_text(encoding="utf-8"))
        answers = {"master": master, "correct, gives blocks back at once": with_answers(CORRECT_TRIM)}
        before = result.get("false_fail") if a.extend else None
        runs = result["runs"].get("false_fail", []) if a.extend else []
        result["runs"]["false_fail"] = [*(runs if isinstance(runs, list) else [runs]), {**run, "traces": a.traces}]
        result["false_fail"] = false_fails(cases, configs, ref, answers, a.traces, before)
        rows = result["false_fail"].values()
        draws, failed = sum(r["suite_draws"] for r in rows), sum(r["failed_workloads"] > 0 for r in rows)
        result["false_fail_pooled"] = {"suite_draws": draws, "failed_suite_draws": 0 if not failed else "at least 1",
                                       "ci": list(clopper_pearson(failed, draws))}
        write(result)
    if "grading" in parts:
        result["runs"]["grading"] = run
        result["grading"] = grading_time(a.grade_runs, a.python)
        write(result)
    print(markdown(result))


def write(result: dict) -> None:
    "Save what is measured so far (each part takes minutes: an interrupted run keeps the parts it finished)."
    (HERE / "lab06_corpus.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "lab06_corpus.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
