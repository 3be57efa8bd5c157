"""Every lab's generated student/autograder folders, checked by running them (labs/06_kv, labs/08_acceptance,
labs/09_audit).

The same checks for each lab: the layout otter assign writes, tests that display values, per-case points, outputs in
the master's test cells only, no solution and no hidden test in the student's files, the master passing every test,
the untouched student notebook passing none (both run in one self-check child per lab), and regeneration byte for
byte. Each lab's own planted mistakes live in tests/test_lab06.py, tests/test_lab08.py and tests/test_lab09.py.
"""
import json
import subprocess
import sys

import pytest

from labkit import LAB06, LAB08, LAB09, by_question, cells, load_module, solution_lines, src, student_text

LABS = [pytest.param(lab, id=lab.folder[:5], marks=pytest.mark.xdist_group(f"lab{lab.folder[:2]}"))
        for lab in (LAB06, LAB08, LAB09)]


# ---------------------------------------------------------------------------------------------- layout (fast)
@pytest.mark.parametrize("lab", LABS)
def test_generated_layout(lab):
    assert (lab.student / lab.notebook).is_file() and (lab.autograder / lab.notebook).is_file()
    full, public = lab.tests(), lab.tests("student")
    assert [n.split("_")[0] for n in full] == [f"q{i}" for i in range(1, lab.num_questions + 1)], sorted(full)
    assert list(public) == list(full)
    for name, cases in full.items():
        hidden = [c for c in cases if c["hidden"]]
        assert hidden and len(hidden) < len(cases), f"{name} needs public and hidden cases"
        assert public[name] == [c for c in cases if not c["hidden"]], f"student/tests/{name}.py is not the public part"
    assert not {p.name for p in lab.student.rglob("*")} - {lab.notebook, "tests"} - {f"{n}.py" for n in full}


@pytest.mark.parametrize("lab", LABS)
def test_tests_show_values_not_booleans(lab):
    "A test that displays True/False passes whenever a patched comparison says so; ours display values."
    for name, cases in lab.tests().items():
        for c in cases:
            expected = [ln for ln in c["code"].splitlines() if not ln.startswith((">>> ", "... "))]
            assert expected and not any(ln.strip() in ("True", "False") for ln in expected), (name, c["code"])


@pytest.mark.parametrize("lab", LABS)
def test_points_are_per_test_case(lab):
    for path in sorted((lab.autograder / "tests").glob("*.py")):
        env = {}
        exec(path.read_text(), env)
        cases = [c for s in env["test"]["suites"] for c in s["cases"]]
        assert isinstance(env["test"]["points"], list) and len(env["test"]["points"]) == len(cases), path.name


@pytest.mark.parametrize("lab", LABS)
def test_master_holds_outputs_only_in_test_cells(lab):
    "`assign.py --execute` stores expected outputs in test cells only (text, no counters, no widget state)."
    assign = load_module(lab.path / "assign.py", f"lab{lab.folder[:2]}_assign")
    master = json.loads(lab.master.read_text(encoding="utf-8"))
    assert assign.normalise_master(json.loads(lab.master.read_text(encoding="utf-8"))) == master
    tests = assign.test_cell_indices(master)
    assert len(tests) == sum(len(v) for v in lab.tests().values())
    assert all(master["cells"][i]["outputs"] for i in tests), "a test cell has no expected output: rerun with --execute"


# ---------------------------------------------------------------------------------------------- leaks (fast)
@pytest.mark.parametrize("lab", LABS)
def test_no_solution_reaches_the_student(lab):
    sol = solution_lines(cells(lab.master))
    assert len(sol) > lab.min_solution_lines, "expected the master's solutions to be found"
    student_code = "\n".join(src(c) for c in cells(lab.student / lab.notebook) if c["cell_type"] == "code")
    leaked = [ln for ln in sol if ln in student_code]
    assert not leaked, f"solution lines in the student notebook: {leaked}"
    text = student_text(lab)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "# SOLUTION", "BEGIN PROMPT", "END PROMPT", "HIDDEN",
                   "BEGIN TESTS", "BEGIN QUESTION", "ASSIGNMENT CONFIG", "otter_assign_solution_cell"):
        assert marker not in text, f"{marker!r} in the student files"


@pytest.mark.parametrize("lab", LABS)
def test_no_hidden_test_reaches_the_student(lab):
    full, student = lab.tests(), lab.tests("student")
    hidden = [(name, c["code"]) for name, cases in full.items() for c in cases if c["hidden"]]
    assert not [c for cases in student.values() for c in cases if c["hidden"] or (c["code"] in dict(hidden).values())]
    public = [ln for cases in full.values() for c in cases if not c["hidden"] for ln in c["code"].splitlines()]
    text, checked = student_text(lab), 0
    for name, code in hidden:
        # a hidden case's own lines: not part of a public case (those are the student's anyway)
        own = [ln[4:] for ln in code.splitlines() if ln.startswith(">>> ") and not any(ln[4:] in p for p in public)]
        assert not [ln for ln in own if ln in text], f"hidden test of {name} in the student files"
        checked += bool(own)
    assert checked >= len(hidden) - 3, "most hidden cases should have lines of their own to look for"


# ---------------------------------------------------------------------------------------------- runs (slow)
@pytest.fixture(scope="module")
def runs():
    """runs(lab): the self-check reports of its autograder (master) notebook and of its untouched student notebook,
    both run with every test in one child (a fresh namespace each, the master first), once per lab."""
    done = {}

    def get(lab):
        if lab.folder not in done:
            notebooks = [lab.autograder / lab.notebook, lab.student / lab.notebook]
            done[lab.folder] = lab.check_many(notebooks, timeout=lab.master_timeout + 900)
        return done[lab.folder]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_master_passes_every_test(lab, runs):
    "The autograder notebook (the master's solutions) run with every test, public and hidden."
    report = runs(lab)[0]
    failed = [(r["question"], r["case"], r["output"]) for r in report["results"] if not r["passed"]]
    assert not report["cell_errors"], report["cell_errors"]
    assert not failed, failed
    assert set(by_question(report)) == set(lab.tests())
    print(f"\n{lab.folder}: master solution ran in {report['run_seconds']:.1f} s; {len(report['results'])} test "
          f"cases in {sum(r['seconds'] for r in report['results']):.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_untouched_student_notebook_passes_nothing(lab, runs):
    report = runs(lab)[1]
    assert report["results"], "no tests ran"
    passed = [(r["question"], r["case"]) for r in report["results"] if r["passed"]]
    assert not passed, f"the blank notebook passes {passed}"


# ---------------------------------------------------------------------------------------------- regeneration
@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_regeneration_is_byte_identical(lab, tmp_path):
    pytest.importorskip("otter", reason="otter-grader (the instructor extra) is not installed: cannot regenerate")
    r = subprocess.run([sys.executable, str(lab.path / "assign.py"), "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("student", "autograder"):
        here = lab.path / name
        ours = sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        fresh = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*") if p.is_file())
        assert ours == fresh, (name, ours, fresh)
        changed = [str(p) for p in ours if (here / p).read_bytes() != (tmp_path / name / p).read_bytes()]
        assert not changed, f"{name}/ differs from a fresh `python labs/{lab.folder}/assign.py`: {changed}"
