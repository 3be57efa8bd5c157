"""Lab 08 (labs/08_acceptance): the generated student/autograder folders, checked by running them.

The notebooks run in a fresh Python process through the lab's own self-check runner (labs/08_acceptance/selfcheck.py:
cells exec'd in one namespace, then each OK-format test case as a doctest, one JSON report back). This is a
self-check of the lab's content, not the course autograder.
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("lab08")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "08_acceptance"
MASTER, STUDENT, AUTOGRADER = LAB / "acceptance.ipynb", LAB / "student", LAB / "autograder"
QUESTIONS = [f"q{i}" for i in range(1, 9)]

_spec = importlib.util.spec_from_file_location("lab08_selfcheck", LAB / "selfcheck.py")
selfcheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(selfcheck)


def cells(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def src(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def load(tests_dir):
    "{question name: [cases]} from otter's OK-format files."
    return {name: cases for name, _, cases in selfcheck.load_tests(tests_dir)}


def by_question(report):
    out = {}
    for res in report["results"]: out.setdefault(res["question"], []).append(res)
    return out


# ---------------------------------------------------------------------------------------------- layout (fast)
def test_generated_layout():
    assert (STUDENT / "acceptance.ipynb").is_file() and (AUTOGRADER / "acceptance.ipynb").is_file()
    full, public = load(AUTOGRADER / "tests"), load(STUDENT / "tests")
    assert [n.split("_")[0] for n in full] == QUESTIONS, sorted(full)
    assert list(public) == list(full)
    for name, cases in full.items():
        hidden = [c for c in cases if c["hidden"]]
        assert hidden and len(hidden) < len(cases), f"{name} needs public and hidden cases"
        assert public[name] == [c for c in cases if not c["hidden"]], f"student/tests/{name}.py is not the public part"
    assert not {p.name for p in STUDENT.rglob("*")} - {"acceptance.ipynb", "tests"} - {f"{n}.py" for n in full}


def test_tests_show_values_not_booleans():
    "A test that displays True/False passes whenever a patched comparison says so; ours display values."
    for name, cases in load(AUTOGRADER / "tests").items():
        for c in cases:
            expected = [ln for ln in c["code"].splitlines() if not ln.startswith((">>> ", "... "))]
            assert expected and not any(ln.strip() in ("True", "False") for ln in expected), (name, c["code"])


def test_points_are_per_test_case():
    for path in sorted((AUTOGRADER / "tests").glob("*.py")):
        env = {}
        exec(path.read_text(), env)
        cases = [c for s in env["test"]["suites"] for c in s["cases"]]
        assert isinstance(env["test"]["points"], list) and len(env["test"]["points"]) == len(cases), path.name


def test_master_holds_outputs_only_in_test_cells():
    "`assign.py --execute` stores expected outputs in test cells only (text, no counters, no widget state)."
    spec = importlib.util.spec_from_file_location("lab08_assign", LAB / "assign.py")
    assign = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assign)
    master = json.loads(MASTER.read_text(encoding="utf-8"))
    assert assign.normalise_master(json.loads(MASTER.read_text(encoding="utf-8"))) == master
    tests = assign.test_cell_indices(master)
    assert len(tests) == sum(len(v) for v in load(AUTOGRADER / "tests").values())
    assert all(master["cells"][i]["outputs"] for i in tests), "a test cell has no expected output: rerun with --execute"


# ---------------------------------------------------------------------------------------------- leaks (fast)
def solution_lines(master_cells):
    "Non-trivial lines the master marks as solution: inside # BEGIN/END SOLUTION blocks, or ending in # SOLUTION."
    lines = []
    for c in master_cells:
        if c["cell_type"] != "code": continue
        inside = False
        for ln in src(c).splitlines():
            s = ln.strip()
            if re.match(r"#\s*BEGIN SOLUTION", s): inside = True; continue
            if re.match(r"#\s*END SOLUTION", s): inside = False; continue
            if inside: lines.append(s)
            elif re.search(r"#\s*SOLUTION\s*$", s): lines.append(re.sub(r"#\s*SOLUTION\s*$", "", s).strip())
    return [ln for ln in lines if len(ln) >= 12 and not ln.startswith("#")]


def student_text():
    nb = "\n".join(src(c) for c in cells(STUDENT / "acceptance.ipynb"))
    return nb + "\n" + "\n".join(p.read_text() for p in sorted((STUDENT / "tests").glob("*.py")))


def test_no_solution_reaches_the_student():
    sol = solution_lines(cells(MASTER))
    assert len(sol) > 40, "expected the master's solutions to be found"
    student_code = "\n".join(src(c) for c in cells(STUDENT / "acceptance.ipynb") if c["cell_type"] == "code")
    leaked = [ln for ln in sol if ln in student_code]
    assert not leaked, f"solution lines in the student notebook: {leaked}"
    text = student_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "# SOLUTION", "BEGIN PROMPT", "END PROMPT", "HIDDEN",
                   "BEGIN TESTS", "BEGIN QUESTION", "ASSIGNMENT CONFIG", "otter_assign_solution_cell"):
        assert marker not in text, f"{marker!r} in the student files"


def test_no_hidden_test_reaches_the_student():
    full, student = load(AUTOGRADER / "tests"), load(STUDENT / "tests")
    hidden = [(name, c["code"]) for name, cases in full.items() for c in cases if c["hidden"]]
    assert not [c for cases in student.values() for c in cases if c["hidden"] or (c["code"] in dict(hidden).values())]
    public = [ln for cases in full.values() for c in cases if not c["hidden"] for ln in c["code"].splitlines()]
    text, checked = student_text(), 0
    for name, code in hidden:
        # a hidden case's own lines: not part of a public case (those are the student's anyway)
        own = [ln[4:] for ln in code.splitlines() if ln.startswith(">>> ") and not any(ln[4:] in p for p in public)]
        assert not [ln for ln in own if ln in text], f"hidden test of {name} in the student files"
        checked += bool(own)
    assert checked >= len(hidden) - 3, "most hidden cases should have lines of their own to look for"


# ---------------------------------------------------------------------------------------------- runs (slow)
@pytest.fixture(scope="module")
def master_report():
    "The autograder notebook (the master's solutions) run with every test, public and hidden."
    return selfcheck.check_notebook(AUTOGRADER / "acceptance.ipynb", AUTOGRADER / "tests", timeout=1200)


@pytest.mark.slow
def test_master_passes_every_test(master_report):
    failed = [(r["question"], r["case"], r["output"]) for r in master_report["results"] if not r["passed"]]
    assert not master_report["cell_errors"], master_report["cell_errors"]
    assert not failed, failed
    assert set(by_question(master_report)) == set(load(AUTOGRADER / "tests"))
    print(f"\nmaster solution ran in {master_report['run_seconds']:.1f} s; "
          f"{len(master_report['results'])} test cases in {sum(r['seconds'] for r in master_report['results']):.1f} s")


@pytest.mark.slow
def test_untouched_student_notebook_passes_nothing():
    report = selfcheck.check_notebook(STUDENT / "acceptance.ipynb", AUTOGRADER / "tests", timeout=900)
    assert report["results"], "no tests ran"
    passed = [(r["question"], r["case"]) for r in report["results"] if r["passed"]]
    assert not passed, f"the blank notebook passes {passed}"


# The student's answer to Q8 replaced by the classic planted bugs (speclab.proof) and a few more.
_DRAW = "    x = int(rng.choice(len(q), p=q))\n"
BUGS = {
    "threshold on p": "from speclab.proof import threshold_on_p_sampler as accept_reject",
    "top-k membership": "from speclab.proof import topk_membership_sampler as accept_reject",
    "resample from p": "from speclab.proof import resample_from_p_sampler as accept_reject",
    "accept with p[x] alone": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < p[x]: return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "inverted ratio q/p": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if p[x] > 0 and rng.random() < min(1.0, q[x] / p[x]): return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "residual max(0, q - p)": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < min(1.0, p[x] / q[x]): return x\n    res = np.maximum(q - p, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "never accepts": "def accept_reject(p, q, rng):\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum())) if res.sum() > 0 else int(rng.choice(len(p), p=p))",
}
CORRECT = {
    "speclab.proof.speculative_sample": "from speclab.proof import speculative_sample as accept_reject",
    "ratio without the min (same law)": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < p[x] / q[x]: return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
}


def q8_report(answer, tmp_path):
    "The student notebook with `answer` in place of Q8's answer cell, run with Q8's tests (public and hidden)."
    nb = json.loads((STUDENT / "acceptance.ipynb").read_text(encoding="utf-8"))
    (i,) = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and "def accept_reject(" in src(c)]
    nb["cells"][i]["source"] = answer
    path = tmp_path / "acceptance.ipynb"
    path.write_text(json.dumps(nb))
    (q8,) = [n for n in load(AUTOGRADER / "tests") if n.startswith("q8")]
    return selfcheck.check_notebook(path, AUTOGRADER / "tests", only=[q8], timeout=600)["results"]


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_fails_q8_hidden_tests(bug, tmp_path):
    results = q8_report(BUGS[bug], tmp_path)
    assert results and [r for r in results if r["hidden"] and not r["passed"]], f"{bug!r} passes every hidden Q8 test"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_sampler_passes_q8(name, tmp_path):
    results = q8_report(CORRECT[name], tmp_path)
    assert results and all(r["passed"] for r in results), [(r["case"], r["output"]) for r in results if not r["passed"]]


# ---------------------------------------------------------------------------------------------- regeneration
@pytest.mark.slow
def test_regeneration_is_byte_identical(tmp_path):
    pytest.importorskip("otter", reason="otter-grader (the instructor extra) is not installed: cannot regenerate")
    r = subprocess.run([sys.executable, str(LAB / "assign.py"), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("student", "autograder"):
        ours = sorted(p.relative_to(LAB / name) for p in (LAB / name).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        fresh = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*") if p.is_file())
        assert ours == fresh, (name, ours, fresh)
        changed = [str(p) for p in ours if (LAB / name / p).read_bytes() != (tmp_path / name / p).read_bytes()]
        assert not changed, f"{name}/ differs from a fresh `python labs/08_acceptance/assign.py`: {changed}"
