"""Run a lab notebook and its OK-format tests in a fresh Python process; report each test case.

Every lab's `selfcheck.py` runs this shared runner:

    python labs/08_acceptance/selfcheck.py labs/08_acceptance/student/acceptance.ipynb
    python labs/09_audit/selfcheck.py NOTEBOOK --tests DIR --only q2,q5 --json
    python labs/08_acceptance/selfcheck.py A.ipynb B.ipynb --tests DIR    # several notebooks, one process

This is a self-check, not the course autograder (that is `speclab.grading`, Chapter 10): it trusts the notebook. The
notebook's code cells run one after another in one namespace, in a child process whose working directory is the
notebook's folder. `check_notebooks` runs several notebooks (variants of one lab, say) in one child, one after
another, each in a fresh namespace and its own folder: the imports they share (torch, scipy) are paid once. A cell
that raises is reported and the run goes on (later cells may still work). IPython magics and shell escapes (`%...`,
`!...`) are skipped, and `otter` is replaced by a stub, so the `grader.check(...)` cells otter adds are no-ops. Then
every case of every test file (`tests/q*.py`, otter's OK format: doctests) runs against a shallow copy of that
namespace, exactly as text: a case passes when its doctest has no failures.
"""
import argparse
import doctest
import io
import json
import os
import subprocess
import sys
import time
import traceback
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

MARK = "@@SELFCHECK-JSON@@"


def _otter_stub():
    "A stand-in for the `otter` package: `otter.Notebook(...)` whose methods do nothing."
    mod = types.ModuleType("otter")

    class Notebook:
        def __init__(self, *args, **kwargs): pass
        def __getattr__(self, name): return lambda *args, **kwargs: None

    mod.Notebook = Notebook
    return mod


def _strip_magics(source: str) -> str:
    "Drop IPython magic and shell-escape lines (`%...`, `!...`); keep everything else as written."
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _names(question: str, name: str) -> bool:
    "Whether `name` (from --only) names `question`: its whole name (q3_alpha) or its number (q3)."
    return question == name or question.startswith(name + "_")


def load_tests(tests_dir, only=None):
    "Parse OK-format test files: a list of (question, points per case, cases)."
    out = []
    for path in sorted(Path(tests_dir).glob("*.py")):
        env = {}
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), env)
        test = env["test"]
        if only and not any(_names(test["name"], q) for q in only): continue
        cases = [c for suite in test["suites"] for c in suite["cases"]]
        pts = test.get("points")
        if isinstance(pts, list): per = [float(p) for p in pts]
        else: per = [float(pts if pts is not None else 1) / max(len(cases), 1)] * len(cases)
        out.append((test["name"], per, cases))
    if only:
        names = [path.stem for path in sorted(Path(tests_dir).glob("*.py"))]
        unknown = sorted(q for q in only if not any(_names(name, q) for name, _, _ in out))
        if unknown:
            raise ValueError(f"only names no question of {tests_dir}: {', '.join(unknown)} (its questions: "
                             f"{', '.join(names)})")
    return out


def run_case(code: str, name: str, globs: dict):
    "Run one doctest string against `globs`; (passed, transcript of the failures)."
    examples = [e for e in doctest.DocTestParser().parse(code, name) if isinstance(e, doctest.Example)]
    test = doctest.DocTest(examples, globs, name, None, None, code)
    runner, buf = doctest.DocTestRunner(verbose=False), io.StringIO()
    with redirect_stdout(buf), redirect_stderr(buf):
        runner.run(test, out=buf.write, clear_globs=False)
    return runner.failures == 0 and runner.tries > 0, buf.getvalue()


def _child(nb_paths: list, tests_dir: Path, only):
    "Execute each notebook, then its tests, in a fresh namespace; print the JSON list of reports after MARK."
    import matplotlib
    matplotlib.use("Agg")
    sys.modules["otter"] = _otter_stub()
    reports = [_run_notebook(nb_path, tests_dir, only) for nb_path in nb_paths]
    sys.__stdout__.write("\n" + MARK + json.dumps(reports) + "\n")
    sys.__stdout__.flush()


def _run_notebook(nb_path: Path, tests_dir: Path, only) -> dict:
    "One notebook's cells in a fresh namespace (working directory: its folder), then every test case: its report."
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    os.chdir(nb_path.parent)
    sys.path.insert(0, str(nb_path.parent))
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_errors, t0 = [], time.perf_counter()
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code": continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        try:
            exec(compile(_strip_magics(src), f"<cell {i}>", "exec"), ns)
        except BaseException as e:  # a student's cell may raise anything; report it and keep going
            if isinstance(e, KeyboardInterrupt): raise
            cell_errors.append({"cell": i, "error": "".join(traceback.format_exception_only(type(e), e)).strip()})
    run_s = time.perf_counter() - t0
    results = []
    for question, per, cases in load_tests(tests_dir, only):
        for k, (case, pts) in enumerate(zip(cases, per)):
            t1 = time.perf_counter()
            try: passed, transcript = run_case(case["code"], f"{question}[{k}]", dict(ns))
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt): raise
                passed, transcript = False, f"{type(e).__name__}: {e}"
            results.append({"question": question, "case": k, "hidden": bool(case.get("hidden")), "points": pts,
                            "passed": bool(passed), "seconds": round(time.perf_counter() - t1, 3),
                            "output": transcript[-2000:]})
    if str(nb_path.parent) in sys.path: sys.path.remove(str(nb_path.parent))
    if "matplotlib.pyplot" in sys.modules: sys.modules["matplotlib.pyplot"].close("all")   # no figure to the next one
    return {"notebook": str(nb_path), "run_seconds": round(run_s, 2), "cell_errors": cell_errors, "results": results}


def check_notebook(notebook, tests_dir=None, only=None, timeout=1200, python=sys.executable):
    "Run `notebook` and its tests in a fresh `python` process; the child's report as a dict."
    return check_notebooks([notebook], tests_dir, only, timeout, python)[0]


def check_notebooks(notebooks, tests_dir=None, only=None, timeout=1200, python=sys.executable):
    """Run each of `notebooks` and its tests in one fresh `python` process, one after another, each in a fresh
    namespace; a report per notebook, in order (`timeout` is for them all)."""
    notebooks = [Path(nb).resolve() for nb in notebooks]
    if not notebooks:
        raise ValueError("notebooks must name at least one notebook")
    tests_dir = Path(tests_dir).resolve() if tests_dir else notebooks[0].parent / "tests"
    cmd = [str(python), str(Path(__file__).resolve()), "--child", *map(str, notebooks), "--tests", str(tests_dir)]
    if only: cmd += ["--only", ",".join(only)]
    env = {**os.environ, "MPLBACKEND": "Agg", "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        raise RuntimeError(f"selfcheck child gave no report (exit {r.returncode})\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(line[len(MARK):])


def summary(report) -> str:
    "A per-question table: passed cases / cases, points."
    rows, lines = {}, []
    for res in report["results"]:
        q = rows.setdefault(res["question"], [0, 0, 0.0, 0.0])
        q[0] += res["passed"]; q[1] += 1; q[2] += res["points"] * res["passed"]; q[3] += res["points"]
    lines.append(f"{'question':<20} {'cases':>9} {'points':>13}")
    for name, (ok, n, got, tot) in rows.items():
        lines.append(f"{name:<20} {ok:>4} / {n:<3} {got:>6.2f} / {tot:<5.2f}")
    for e in report["cell_errors"]: lines.append(f"cell {e['cell']} raised: {e['error'].splitlines()[-1]}")
    lines.append(f"notebook ran in {report['run_seconds']:.1f} s")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", nargs="+", help="one notebook (or several, run one after another in one process)")
    ap.add_argument("--tests", help="folder of OK-format test files (default: tests/ next to the notebook)")
    ap.add_argument("--only", help="comma-separated questions, by name or number, e.g. q3,q8_sampler")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    only = a.only.split(",") if a.only else None
    if a.child:
        return _child([Path(nb).resolve() for nb in a.notebook], Path(a.tests).resolve(), only)
    try:
        load_tests(a.tests or Path(a.notebook[0]).resolve().parent / "tests", only)
    except ValueError as e:
        ap.error(f"--only: {e}")
    reports = check_notebooks(a.notebook, a.tests, only)
    if a.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=1))
        return
    for report in reports:
        print(("" if len(reports) == 1 else f"{report['notebook']}\n") + summary(report))
        for res in report["results"]:
            if not res["passed"] and not res["hidden"]:
                print(f"\n--- {res['question']} case {res['case']} failed:\n{res['output']}")


if __name__ == "__main__":
    main()
