"""Lab 09 (labs/09_audit): the generated student/autograder folders, checked by running them.

The notebooks run in a fresh Python process through the lab's own self-check runner (labs/09_audit/selfcheck.py:
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

pytestmark = pytest.mark.xdist_group("lab09")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "09_audit"
MASTER, STUDENT, AUTOGRADER = LAB / "audit.ipynb", LAB / "student", LAB / "autograder"
QUESTIONS = [f"q{i}" for i in range(1, 6)]

_spec = importlib.util.spec_from_file_location("lab09_selfcheck", LAB / "selfcheck.py")
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
    assert (STUDENT / "audit.ipynb").is_file() and (AUTOGRADER / "audit.ipynb").is_file()
    full, public = load(AUTOGRADER / "tests"), load(STUDENT / "tests")
    assert [n.split("_")[0] for n in full] == QUESTIONS, sorted(full)
    assert list(public) == list(full)
    for name, cases in full.items():
        hidden = [c for c in cases if c["hidden"]]
        assert hidden and len(hidden) < len(cases), f"{name} needs public and hidden cases"
        assert public[name] == [c for c in cases if not c["hidden"]], f"student/tests/{name}.py is not the public part"
    assert not {p.name for p in STUDENT.rglob("*")} - {"audit.ipynb", "tests"} - {f"{n}.py" for n in full}


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
    spec = importlib.util.spec_from_file_location("lab09_assign", LAB / "assign.py")
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
    nb = "\n".join(src(c) for c in cells(STUDENT / "audit.ipynb"))
    return nb + "\n" + "\n".join(p.read_text() for p in sorted((STUDENT / "tests").glob("*.py")))


def test_no_solution_reaches_the_student():
    sol = solution_lines(cells(MASTER))
    assert len(sol) > 25, "expected the master's solutions to be found"
    student_code = "\n".join(src(c) for c in cells(STUDENT / "audit.ipynb") if c["cell_type"] == "code")
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
    return selfcheck.check_notebook(AUTOGRADER / "audit.ipynb", AUTOGRADER / "tests", timeout=600)


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
    report = selfcheck.check_notebook(STUDENT / "audit.ipynb", AUTOGRADER / "tests", timeout=600)
    assert report["results"], "no tests ran"
    passed = [(r["question"], r["case"]) for r in report["results"] if r["passed"]]
    assert not passed, f"the blank notebook passes {passed}"


# A student's answer replaced by a plausible mistake: the hidden tests must catch each one.
BUGS = {
    "q2: rare texts pooled into one 'other' bin": ("def two_sample(", """def two_sample(a, b, min_count=10):
    counts = Counter(a) + Counter(b)
    bin_of = {t: t if counts[t] >= min_count else '' for t in counts}
    keys = sorted(set(bin_of.values()))
    table = np.zeros((2, len(keys)))
    for row, sample in enumerate((a, b)):
        for t, c in sample.items():
            table[row, keys.index(bin_of[t])] += c
    if len(keys) < 2:
        return 0.0, 0, 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic, len(keys) - 1, float(stats.chi2.sf(statistic, len(keys) - 1))
"""),
    "q2: k degrees of freedom": ("def two_sample(", """def two_sample(a, b, min_count=10):
    bins = pool(a, b, min_count)
    keys = sorted(set(bins.values()))
    table = np.zeros((2, len(keys)))
    for row, sample in enumerate((a, b)):
        for t, c in sample.items():
            table[row, keys.index(bins[t])] += c
    if len(keys) < 2:
        return 0.0, 0, 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic, len(keys), float(stats.chi2.sf(statistic, len(keys)))
"""),
    "q3: Bonferroni instead of Holm": ("def holm(", """def holm(p_values):
    return [min(1.0, len(p_values) * p) for p in p_values]
"""),
    "q3: Holm without the running maximum": ("def holm(", """def holm(p_values):
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    for rank, i in enumerate(order):
        adjusted[i] = min(1.0, (m - rank) * p_values[i])
    return adjusted
"""),
    "q5: only the first cell": ("def audit_recording(", """def audit_recording(recording, level=0.01):
    c = recording["cells"][0]
    if two_sample(c["audited"], c["reference"])[2] < level:
        return "broken", (c["prompt"], c["setting"])
    return "exact", None
"""),
}


def answer_report(marker, answer, tmp_path):
    "The master's solutions with the cell defining `marker` replaced by `answer`, run with every test."
    nb = json.loads((AUTOGRADER / "audit.ipynb").read_text(encoding="utf-8"))
    (i,) = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and marker in src(c)]
    lines = src(nb["cells"][i]).splitlines(keepends=True)
    keep = "".join(ln for ln in lines if ln.startswith(("pair_1_tests", "verdicts", "bound_", "n_for", "example")))
    nb["cells"][i]["source"] = answer + "\n\n" + keep
    path = tmp_path / "audit.ipynb"
    path.write_text(json.dumps(nb))
    return selfcheck.check_notebook(path, AUTOGRADER / "tests", timeout=600)["results"]


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_mistake_fails_a_hidden_test(bug, tmp_path):
    results = answer_report(*BUGS[bug], tmp_path)
    assert results and [r for r in results if r["hidden"] and not r["passed"]], f"{bug!r} passes every hidden test"


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
        assert not changed, f"{name}/ differs from a fresh `python labs/09_audit/assign.py`: {changed}"
