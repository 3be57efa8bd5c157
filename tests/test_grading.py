"""Chapter 10, the course autograder (`speclab.grading`): scores, feedback, and what a hostile notebook cannot do.

Most hostile submissions are graded against a tiny lab built under `tmp_path` (fast, and every expectation exact);
the ones about reading the lab's own files are graded against the real Lab 08. A hostile submission always answers a
few questions correctly as well, and the test asserts the exact score those answers are worth: every trick must add
nothing, and the honest part must still be graded. Tests that need the sandbox (root, unshare, setpriv) skip with
the reason `sandbox_problem()` gives. After a sandboxed grading no process of the sandbox's uid, and none carrying
the submission's marker (a name written to /proc/self/comm), may remain.

A few tests carry a clearly marked DEMONSTRATION: the same attack graded in practice mode (no sandbox), where it
works, which proves the test is able to see the attack succeed.
"""
import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from labkit import notebook, ok_file

from speclab import grading
from speclab.grading import Limits, grade, load_lab, read_submission, sandbox_problem

pytestmark = pytest.mark.xdist_group("grading")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
LAB08 = ROOT / "labs" / "08_acceptance"
LAB08_NAME = "lab08-acceptance"
PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(PROBLEM is not None, reason=f"no sandbox here: {PROBLEM}")

FAST = Limits(cell_seconds=10, test_seconds=10, total_seconds=120, memory_bytes=3 << 30)


# ----------------------------------------------------------------------------------------------------- helpers
def write_nb(folder, filename, cells, **kw) -> Path:
    path = Path(folder) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook(cells, **kw)), encoding="utf-8")
    return path


# The tiny lab: q1 (public `answer`, hidden `double`), q2 (public `status`: a hostile cell reports there what its
# attempts achieved, 'blocked' when nothing worked), q3 (hidden exactness case, judged in the parent from draws).
TINY_TESTS = {
    "q1.py": ok_file("q1", [(">>> answer\n42", False), (">>> double(-3.5)\n-7.0", True)]),
    "q2.py": ok_file("q2", [(">>> status\n'blocked'", False)]),
    "q3.py": ok_file("q3", [(">>> exactness_verdict(sampler, [0.2, 0.3, 0.5], [0.5, 0.25, 0.25], n=3000, seed=7)\n"
                             "'PASS'", True)]),
}
ANSWER = "answer = 42"
DOUBLE = "def double(x):\n    return 2 * x"
SAMPLER = "import numpy as np\ndef sampler(p, q, rng):\n    return int(rng.choice(len(p), p=p))"
GOOD = [ANSWER, DOUBLE, SAMPLER]          # 3 points (q1 both cases, q3); q2 is worth 1 more when status == 'blocked'
Q1_Q3 = 3.0


def make_lab(root, tests=TINY_TESTS, name="tiny-lab"):
    root = Path(root)
    (root / "autograder" / "tests").mkdir(parents=True, exist_ok=True)
    (root / "autograder" / "tiny.ipynb").write_text(json.dumps(notebook(["x = 1"], name)), encoding="utf-8")
    for fname, text in tests.items():
        (root / "autograder" / "tests" / fname).write_text(text, encoding="utf-8")
    return load_lab(root)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    "The tiny lab (4 points)."
    return make_lab(tmp_path_factory.mktemp("tinylab") / "lab")


@pytest.fixture
def sandboxes(monkeypatch):
    "Every Sandbox that grading creates during the test (to know the sandbox uids and processes afterwards)."
    made = []
    init = grading.Sandbox.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(grading.Sandbox, "__init__", spy)
    return made


def marker() -> str:
    "A process name (at most 15 characters) that a hostile submission gives its processes."
    return "slg" + uuid.uuid4().hex[:10]


def processes(uids=(), mark=None) -> list:
    "(pid, uid, comm) of live processes whose real uid is in `uids` or whose name starts with `mark`."
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            status = (d / "status").read_text()
        except OSError:
            continue
        uid = int(status.split("\nUid:")[1].split()[0])
        state = status.split("\nState:")[1].split()[0]
        if state == "Z":                      # a zombie is not running (and only its parent can reap it)
            continue
        if uid in uids or (mark and comm.startswith(mark)):
            found.append((int(d.name), uid, comm))
    return found


def assert_no_leftovers(boxes, mark=None):
    "No process of any sandbox uid, none named with the marker, and every sandbox's own process has exited."
    uids = {b.uid for b in boxes if b.uid is not None}
    assert boxes, "grading created no sandbox"
    assert all(b.proc.returncode is not None for b in boxes), "a sandbox process is still running"
    left = processes(uids, mark)
    assert not left, f"processes left behind after grading: {left[:10]}"


def assert_grader_works(lab, tmp_path):
    "A clean submission graded right after: the grader is still working."
    path = write_nb(tmp_path / "after", "clean.ipynb", [*GOOD, "status = 'blocked'"])
    report = grade(path, lab, limits=FAST)
    assert report.score == lab.max_score == 4, report.summary()


def public_feedback(report, question):
    return [r.feedback for r in report.results if r.case.question == question and not r.case.hidden]


# Lab 08: its code cells, found by content.
def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


AUTOGRADER_NB = json.loads((LAB08 / "autograder" / "acceptance.ipynb").read_text(encoding="utf-8"))
STUDENT_NB = LAB08 / "student" / "acceptance.ipynb"


def lab08_cell(text):
    "The one code cell of the autograder (solution) notebook containing `text`."
    found = [_src(c) for c in AUTOGRADER_NB["cells"] if c["cell_type"] == "code" and text in _src(c)]
    assert len(found) == 1, f"{len(found)} code cells contain {text!r}"
    return found[0]


# The cheap start of Lab 08: otter's cell, the imports, the data, and the solutions of Q1 and Q2.
LAB08_BASE = ["import otter", "import numpy as np", "ACCEPTED_AT = [", "def unconditional_rates", "def mean_length"]


@pytest.fixture(scope="module")
def lab08():
    return load_lab(LAB08)


@pytest.fixture(scope="module")
def points(lab08):
    "{question prefix ('q1'...): points}."
    out = {}
    for c in lab08.cases:
        out[c.question.split("_")[0]] = out.get(c.question.split("_")[0], 0) + c.points
    return out


def lab08_nb(folder, name, extra):
    "Lab 08's cheap start (Q1 and Q2 answered, 11 points) and then the `extra` cells."
    return write_nb(folder, name, [lab08_cell(t) for t in LAB08_BASE] + list(extra), name=LAB08_NAME)


# ------------------------------------------------------------------------------------------- Lab 08: scores
@pytest.fixture(scope="module")
def solution_report(lab08, tmp_path_factory):
    "The autograder (solution) notebook, graded once (it runs Chapter 9's sweep on 4 prompts, one pass per point: about 15 s)."
    folder = tmp_path_factory.mktemp("solution")
    path = folder / "acceptance.ipynb"
    shutil.copy(LAB08 / "autograder" / "acceptance.ipynb", path)
    return grade(path, lab08, limits=Limits(total_seconds=900))


@pytest.mark.slow
def test_solution_scores_full_marks(solution_report, lab08):
    "The autograder notebook (the solution) earns every point of Lab 08 (49), with no message."
    report = solution_report
    assert lab08.max_score == 49
    assert report.score == report.max_score == lab08.max_score, report.summary()
    assert all(r.passed for r in report.results)
    assert report.messages == []
    assert report.practice == (PROBLEM is not None)


@pytest.mark.slow
def test_gradescope_json_shape(solution_report, lab08):
    """The report's results.json is what Gradescope reads: score, execution_time, output and tests[] (name, score,
    max_score, visibility, output); hidden entries are 'after_published' and never hold a hidden case's expected text
    or its expression; the whole dict round-trips through JSON."""
    gs = solution_report.gradescope()
    assert json.loads(json.dumps(gs)) == gs
    assert gs["score"] == 49 and isinstance(gs["execution_time"], (int, float)) and gs["execution_time"] > 0
    assert isinstance(gs["output"], str) and gs["output"]
    assert gs["practice"] is solution_report.practice
    questions = list(dict.fromkeys(c.question for c in lab08.cases))
    assert len(gs["tests"]) == 2 * len(questions)        # a public and a hidden entry per question
    for t in gs["tests"]:
        assert set(t) >= {"name", "score", "max_score", "visibility", "output"}
        assert t["visibility"] in {"visible", "after_published"}
        assert t["score"] == t["max_score"]
    assert sum(t["max_score"] for t in gs["tests"]) == 49
    hidden_text = "\n".join(t["name"] + "\n" + t["output"] for t in gs["tests"] if t["visibility"] == "after_published")
    for case in (c for c in lab08.cases if c.hidden):
        assert case.expr not in hidden_text, case.name
        for line in case.setup:
            assert line.strip() not in hidden_text, case.name
        if len(case.want) >= 5:                            # short wants ('3', "'B'") are just too common as text
            assert case.want not in hidden_text, case.name
        assert case.want not in gs["output"] or len(case.want) < 5
    # public entries show each case's feedback
    first = next(t for t in gs["tests"] if t["visibility"] == "visible")
    assert "case 1: passed" in first["output"]


def test_student_notebook_scores_zero(lab08, tmp_path):
    "The untouched student notebook (every answer `...`) earns nothing, and every public case says why."
    path = tmp_path / "acceptance.ipynb"
    shutil.copy(STUDENT_NB, path)
    report = grade(path, lab08, limits=Limits(cell_seconds=60, test_seconds=30, total_seconds=300))
    assert report.score == 0 and report.max_score == 49, report.summary()
    assert all(not r.passed for r in report.results)
    assert all(r.feedback.startswith("expected ") for r in report.results if not r.case.hidden)
    assert all(r.feedback == "failed" for r in report.results if r.case.hidden)


def _without_sweep(tmp_path, name, replace=None):
    "The solution notebook minus Q5's sweep and the plots (Q5 then earns 0); `replace` maps a cell to new source."
    nb = copy.deepcopy(AUTOGRADER_NB)
    drop = ("sweep_tiny_pair", "plt.subplots")
    nb["cells"] = [c for c in nb["cells"] if not (c["cell_type"] == "code" and any(d in _src(c) for d in drop))]
    for cell in nb["cells"]:
        for old, new in (replace or {}).items():
            if cell["cell_type"] == "code" and old in _src(cell):
                cell["source"] = new
    path = tmp_path / name
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_solution_without_sweep_loses_only_q5(lab08, points, tmp_path):
    "The solution without Q5's cells earns everything but Q5 (the baseline of the wrong-answer tests below)."
    report = grade(_without_sweep(tmp_path, "nosweep.ipynb"), lab08, limits=Limits(total_seconds=300))
    assert report.score == 49 - points["q5"] == 43, report.summary()
    assert all(r.passed == (not r.case.question.startswith("q5")) for r in report.results)


WRONG_Q1 = '''
def unconditional_rates(accepted_at, num_drafts):
    return [a / (num_drafts + 1) for a in accepted_at]

def conditional_from_unconditional(r):
    return list(r)

r = unconditional_rates(ACCEPTED_AT, NUM_DRAFTS)
c = conditional_from_unconditional(r)
'''

NAIVE_Q1 = '''
def unconditional_rates(accepted_at, num_drafts):
    return [a / num_drafts for a in accepted_at]

def conditional_from_unconditional(r):
    previous = [1.0] + list(r[:-1])
    return [ri / prev for ri, prev in zip(r, previous)]     # no care for r_(i-1) = 0

r = unconditional_rates(ACCEPTED_AT, NUM_DRAFTS)
c = conditional_from_unconditional(r)
'''


def test_one_wrong_answer_loses_exactly_its_points(lab08, points, tmp_path):
    """Q1 answered wrongly (both functions, so `r` and `c` too) loses Q1's 5 points, public and hidden, plus exactly
    the two later cases computed from `r` (Q2's E_rates = 1 + sum(r), Q6's residuals r_i - alpha^i): nothing else."""
    path = _without_sweep(tmp_path, "wrong_q1.ipynb", {"def unconditional_rates": WRONG_Q1})
    report = grade(path, lab08, limits=Limits(total_seconds=300))
    failed = [r.case.name for r in report.results if not r.passed and not r.case.question.startswith("q5")]
    assert failed == [f"q1_rates {'hidden' if n > 2 else 'public'} case {n}" for n in range(1, 6)] + [
        "q2_mean_length public case 2", "q6_iid hidden case 5"], report.summary()
    assert report.score == 49 - points["q5"] - points["q1"] - 2 == 36
    assert public_feedback(report, "q1_rates") == [
        "expected [0.7744, 0.5608, 0.3728, 0.2264], got [0.7738, 0.5604, 0.3725, 0.2262]",
        "expected [0.7744, 0.7242, 0.6648, 0.6073], got [0.7738, 0.5604, 0.3725, 0.2262]"]


WRONG_Q4 = ("E_iid = float(expected_tokens(alpha_hat, KAPPA + 1))\nkappa_opt = KAPPA\n"
            "speedup_opt = speedup_now = 1.0\nE_gap = 0.0")


def test_one_wrong_independent_answer_loses_exactly_its_question(lab08, points, tmp_path):
    """Q4 answered wrongly (no later cell uses its names) loses exactly Q4's points, public and hidden, and nothing
    else; its public feedback shows the expected value and what came back."""
    path = _without_sweep(tmp_path, "wrong_q4.ipynb", {"E_iid = float(expected_tokens(alpha_hat, KAPPA))": WRONG_Q4})
    report = grade(path, lab08, limits=Limits(total_seconds=300))
    failed = {r.case.question for r in report.results if not r.passed and not r.case.question.startswith("q5")}
    assert failed == {"q4_kappa"}, report.summary()
    assert report.score == 49 - points["q5"] - points["q4"], report.summary()
    assert public_feedback(report, "q4_kappa")[0].startswith("expected 2.8495, got ")


def test_wrong_only_on_a_hidden_input_loses_one_point(lab08, points, tmp_path):
    """A c_i that divides by r_(i-1) without care is right on the public data but raises on the hidden case with
    zeros: exactly that one hidden point is lost, and its feedback says only 'failed'."""
    path = _without_sweep(tmp_path, "naive_q1.ipynb", {"def unconditional_rates": NAIVE_Q1})
    report = grade(path, lab08, limits=Limits(total_seconds=300))
    assert report.score == 49 - points["q5"] - 1, report.summary()
    failed = [r for r in report.results if not r.passed and not r.case.question.startswith("q5")]
    assert [(r.case.name, r.feedback) for r in failed] == [("q1_rates hidden case 4", "failed")]
    assert "ZeroDivisionError" not in report.summary() and "ZeroDivisionError" not in json.dumps(report.gradescope())


# ---------------------------------------------------------------------------------------- bad input: score 0
@pytest.mark.parametrize("kind", ["txt", "invalid_json", "other_lab", "r_kernel", "no_cells", "only_markdown"])
def test_bad_input_is_not_graded_with_a_clear_message(kind, lab08, tmp_path):
    "A file that is not a Lab 08 Python notebook gets 0 points and a message saying why; nothing crashes, nothing runs."
    good = json.loads(STUDENT_NB.read_text(encoding="utf-8"))
    if kind == "txt":
        path = tmp_path / "answers.txt"
        path.write_text("r = [0.7744, 0.5608]\n")
        why = "not a readable notebook"
    elif kind == "invalid_json":
        path = tmp_path / "broken.ipynb"
        path.write_text(json.dumps(good)[:-200])
        why = "not a readable notebook"
    elif kind == "other_lab":
        good["metadata"]["otter"]["assignment_name"] = "lab07-something"
        path = tmp_path / "other.ipynb"
        path.write_text(json.dumps(good))
        why = "'lab07-something', not for 'lab08-acceptance'"
    elif kind == "r_kernel":
        good["metadata"]["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R".lower()}
        good["metadata"]["language_info"] = {"name": "R"}
        path = tmp_path / "r.ipynb"
        path.write_text(json.dumps(good))
        why = "'r' kernel"
    elif kind == "no_cells":
        good["cells"] = []
        path = tmp_path / "empty.ipynb"
        path.write_text(json.dumps(good))
        why = "no code to run"
    else:
        good["cells"] = [c for c in good["cells"] if c["cell_type"] == "markdown"]
        path = tmp_path / "prose.ipynb"
        path.write_text(json.dumps(good))
        why = "no code to run"
    with pytest.raises(ValueError, match="."):
        read_submission(path, lab08)
    report = grade(path, lab08, limits=FAST)
    assert report.score == 0 and report.max_score == 49
    assert len(report.messages) == 1 and report.messages[0].startswith("not graded: ")
    assert why in report.messages[0], report.messages
    assert all(not r.passed for r in report.results)
    assert all(r.feedback == "not graded" for r in report.results if r.case.hidden)
    assert why in report.summary() and why in report.gradescope()["output"]
    assert report.gradescope()["score"] == 0


# ------------------------------------------------------------------------------------- hostile submissions
@needs_sandbox
def test_clean_tiny_submission(tiny, tmp_path, sandboxes):
    "The tiny lab's clean submission earns all 4 points in the sandbox, and leaves no process."
    path = write_nb(tmp_path, "clean.ipynb", [*GOOD, "status = 'blocked'"])
    report = grade(path, tiny, limits=FAST)
    assert report.score == 4 and not report.practice and report.messages == [], report.summary()
    assert_no_leftovers(sandboxes)


@needs_sandbox
def test_infinite_loop_cell_is_skipped(tiny, tmp_path, sandboxes):
    "`while True: pass` is stopped after cell_seconds, skipped, and every other cell still runs and is graded."
    path = write_nb(tmp_path, "loop.ipynb", [ANSWER, "while True:\n    pass", DOUBLE, SAMPLER])
    report = grade(path, tiny, limits=Limits(cell_seconds=3, test_seconds=10, total_seconds=120))
    assert report.score == Q1_Q3, report.summary()
    assert "code cell 2 ran past its time limit" in report.messages
    assert "code cell 2 is skipped and the notebook run again without it" in report.messages
    assert_no_leftovers(sandboxes)
    assert_grader_works(tiny, tmp_path)


@needs_sandbox
def test_infinite_loop_in_a_test_expression(tiny, tmp_path, sandboxes):
    "A function that hangs when a (hidden) test calls it costs that case only; the next cases are still graded."
    hang = "def double(x):\n    while True:\n        pass"
    path = write_nb(tmp_path, "hang.ipynb", [ANSWER, hang, SAMPLER, "status = 'blocked'"])
    report = grade(path, tiny, limits=Limits(cell_seconds=10, test_seconds=3, total_seconds=120))
    assert report.score == 3, report.summary()
    assert [r.case.name for r in report.results if not r.passed] == ["q1 hidden case 2"]
    assert_no_leftovers(sandboxes)


@needs_sandbox
@pytest.mark.parametrize("how", ["sys.exit(0)", "os._exit(0)", "raise SystemExit(3)", "os.abort()",
                                 "import ctypes; ctypes.string_at(0)"])
def test_exiting_cell(how, tiny, tmp_path, sandboxes):
    """A cell that exits the process (or crashes it: abort, segfault) is reported and skipped; the other cells are
    graded. (SIGKILL to itself is no test: in its pid namespace the notebook's process is init, which ignores it.)"""
    path = write_nb(tmp_path, "exit.ipynb", [ANSWER, f"import os, sys\n{how}", DOUBLE, SAMPLER])
    report = grade(path, tiny, limits=FAST)
    assert report.score == Q1_Q3, report.summary()
    assert any(m.startswith("code cell 2 ") for m in report.messages), report.messages
    assert_no_leftovers(sandboxes)


@needs_sandbox
def test_raise_in_every_cell(tiny, tmp_path, sandboxes):
    "A notebook whose every cell raises (after defining its answers) is graded on what it defined; each error shown."
    cells = [f"{c}\nraise ValueError('boom {i}')" for i, c in enumerate(GOOD, 1)] + ["raise KeyboardInterrupt"]
    report = grade(write_nb(tmp_path, "raise.ipynb", cells), tiny, limits=FAST)
    assert report.score == Q1_Q3, report.summary()
    assert report.messages == ["code cell 1 raised ValueError: boom 1", "code cell 2 raised ValueError: boom 2",
                               "code cell 3 raised ValueError: boom 3", "code cell 4 raised KeyboardInterrupt: "]
    assert_no_leftovers(sandboxes)


READ_LAB08 = '''
import os, subprocess
found = []
try:
    found.append("READ " + open({path!r}).read()[:60])
except Exception as e:
    found.append(type(e).__name__)
for d in [{lab!r}, {lab!r} + "/autograder", {lab!r} + "/autograder/tests"]:
    try:
        found.append("LISTED " + ",".join(sorted(os.listdir(d))))
    except Exception as e:
        found.append(type(e).__name__)
r = [" ".join(found)]               # Q1's public case shows it: float() of it fails
'''


@needs_sandbox
def test_hidden_tests_cannot_be_read(lab08, tmp_path, sandboxes):
    """A cell opening Lab 08's hidden tests by absolute path, or listing the lab's folders, fails (the lab folder is
    hidden, and the checkout around it covered): the value a public test shows says so. (It overwrites `r`, so Q1's first case is lost.)"""
    cell = READ_LAB08.format(path=str(LAB08 / "autograder" / "tests" / "q1_rates.py"), lab=str(LAB08))
    report = grade(lab08_nb(tmp_path, "read.ipynb", [cell]), lab08, limits=FAST)
    assert report.score == 11 - 1, report.summary()
    feedback = public_feedback(report, "q1_rates")[0]           # hidden (PermissionError) or covered (not found)
    assert "READ " not in feedback and "LISTED " not in feedback, feedback
    assert re.search(r"float: '((PermissionError|FileNotFoundError) ?){4}'$", feedback), feedback
    assert_no_leftovers(sandboxes)


def test_hidden_tests_read_in_practice_mode_demonstration(lab08, tmp_path):
    "DEMONSTRATION (practice mode, no sandbox): the same cell does read the hidden tests, so the test above can see it."
    cell = READ_LAB08.format(path=str(LAB08 / "autograder" / "tests" / "q1_rates.py"), lab=str(LAB08))
    report = grade(lab08_nb(tmp_path, "read.ipynb", [cell]), lab08, limits=FAST, practice=True)
    assert "READ OK_FORMAT" in public_feedback(report, "q1_rates")[0]


GIT_LEAK = '''
import subprocess
try:
    out = subprocess.run(["git", "-c", "safe.directory=*", "-C", {root!r}, "show",
                          "HEAD:labs/08_acceptance/autograder/tests/q2_mean_length.py"],
                         capture_output=True, text=True, timeout=20).stdout
except Exception as e:
    out = type(e).__name__
leaked = "'hidden': True" in out
r = ["LEAKED" if leaked else "blocked"]
'''


def _committed(relpath):
    if shutil.which("git") is None:
        return False
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"HEAD:{relpath}"],
                          capture_output=True).returncode == 0


@needs_sandbox
@pytest.mark.skipif(not _committed("labs/08_acceptance/autograder/tests/q2_mean_length.py"),
                    reason="needs git and Lab 08's hidden tests committed")
def test_hidden_tests_cannot_be_read_from_git(lab08, tmp_path, sandboxes):
    """Lab 08 graded from the repository: a cell asking git for the committed hidden tests must get nothing
    (the public test then shows 'blocked')."""
    report = grade(lab08_nb(tmp_path, "git.ipynb", [GIT_LEAK.format(root=str(ROOT))]), lab08, limits=FAST)
    assert public_feedback(report, "q1_rates")[0].endswith("float: 'blocked'"), report.summary()


RESULTS_WRITER = '''
import os, subprocess, sys
target = {target!r}
try:
    open(target, "w").write('{{"score": 999}}')        # at once, from the cell
    attempts = ["cell wrote"]
except Exception as e:
    attempts = [type(e).__name__]
# later (after {delay} s, then every 0.25 s for 20 s), from a process in a new session, and from a double fork
LATER = ("import os, time\\nopen('/proc/self/comm', 'w').write({mark!r})\\ntime.sleep({delay})\\n"
         "for _ in range(80):\\n"
         "    try:\\n        open({target!r}, 'w').write('{{\\"score\\": %d}}' % os.getpid())\\n"
         "    except OSError:\\n        pass\\n"
         "    time.sleep(0.25)\\n")
subprocess.Popen([sys.executable, "-c", LATER], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        try:
            exec(LATER)
        finally:
            os._exit(0)
    os._exit(0)
os.wait()
status = "blocked" if attempts == [{expect!r}] else " ".join(attempts)
'''


@pytest.fixture
def results_dir():
    """A results folder outside /tmp and /var/tmp (the sandbox gets its own, which would hide the file for free), holding a
    results.json that anyone may write: only the sandbox stands between the student and it."""
    d = Path(tempfile.mkdtemp(prefix="speclab-gradetest-", dir="/srv"))    # /var/tmp is fresh in the sandbox too
    d.chmod(0o755)
    results = d / "results.json"
    results.write_text('{"score": 0}')
    results.chmod(0o666)
    yield results
    shutil.rmtree(d, ignore_errors=True)


@needs_sandbox
def test_results_json_cannot_be_overwritten(tiny, tmp_path, sandboxes, results_dir):
    """results.json's folder is passed in `hide`: the cell's write fails at once, the detached writers (a new session,
    a double fork) are gone when grading ends, and 5 s later the parent's file is unchanged."""
    mark = marker()
    cell = RESULTS_WRITER.format(target=str(results_dir), mark=mark, expect="PermissionError", delay=3)
    report = grade(write_nb(tmp_path, "rj.ipynb", [*GOOD, cell]), tiny, limits=FAST, hide=[results_dir.parent])
    assert report.score == 4, report.summary()
    assert_no_leftovers(sandboxes, mark)
    time.sleep(5)
    assert results_dir.read_text() == '{"score": 0}'
    assert not processes(mark=mark)
    assert_grader_works(tiny, tmp_path)


@needs_sandbox
def test_detached_writer_dies_with_the_sandbox(tiny, tmp_path, sandboxes, results_dir):
    """Not hidden this time (a world-writable file the cell may write at once): what must stop the writers that
    would overwrite it 3 s later is that no process outlives the grading."""
    mark = marker()
    cell = RESULTS_WRITER.format(target=str(results_dir), mark=mark, expect="cell wrote", delay=3)
    report = grade(write_nb(tmp_path, "rj.ipynb", [*GOOD, cell]), tiny, limits=FAST)
    assert report.score == 4, report.summary()
    assert results_dir.read_text() == '{"score": 999}'         # the cell's own write, during grading
    results_dir.write_text('{"score": 0}')                     # the parent writes its results after grading
    assert_no_leftovers(sandboxes, mark)
    time.sleep(5)
    assert results_dir.read_text() == '{"score": 0}'


def test_detached_writer_survives_practice_mode_demonstration(tiny, tmp_path, results_dir):
    "DEMONSTRATION (practice mode, no sandbox): the double-forked writer survives grading and overwrites the file."
    mark = marker()
    cell = RESULTS_WRITER.format(target=str(results_dir), mark=mark, expect="cell wrote", delay=3)
    try:
        report = grade(write_nb(tmp_path, "rj.ipynb", [*GOOD, cell]), tiny, limits=FAST, practice=True)
        assert report.practice and report.score == 4, report.summary()
        survivors = processes(mark=mark)
        assert survivors, "no writer outlived the practice grading"
        results_dir.write_text('{"score": 0}')                 # the parent writes its results after grading
        time.sleep(5)
        assert results_dir.read_text() in {'{"score": %d}' % pid for pid, _, _ in survivors}   # overwritten
    finally:
        for pid, _, _ in processes(mark=mark):                 # our own leftovers: end them
            os.kill(pid, 9)


@needs_sandbox
def test_hide_may_name_a_file(tiny, tmp_path, sandboxes, results_dir):
    "`hide=[results.json]` (a file, the grader's output path) hides it, and the clean submission still earns 4."
    mark = marker()
    cell = RESULTS_WRITER.format(target=str(results_dir), mark=mark, expect="PermissionError", delay=3)
    report = grade(write_nb(tmp_path, "rj.ipynb", [*GOOD, cell]), tiny, limits=FAST, hide=[results_dir])
    assert report.score == 4, report.summary()
    assert results_dir.read_text() == '{"score": 0}'


PATCH_GRADER = '''
import doctest, types
import numpy as np
import speclab.grading, speclab.proof
speclab.grading._check = lambda case, *a: speclab.grading.CaseResult(case, True, "passed")
speclab.grading.verdict_from_draws = lambda *a, **k: "PASS"
speclab.grading.chi_square_gof = speclab.proof.chi_square_gof = lambda *a, **k: (0.0, 1.0, 1)
speclab.proof.check_exactness = check_exactness = lambda *a, **k: types.SimpleNamespace(passed=True)
np.allclose = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
doctest.OutputChecker.check_output = lambda *a, **k: True
'''
WRONG_SAMPLER = "def sampler(p, q, rng):\n    return int(rng.choice(len(q), p=q))       # draws from q: not exact"
WRONG_ACCEPT_REJECT = "def accept_reject(p, q, rng):\n    return int(rng.choice(len(q), p=q))"


@needs_sandbox
def test_monkeypatching_the_checkers_changes_nothing(tiny, tmp_path, sandboxes):
    """Patching the grader, Chapter 1's checker, numpy's comparisons and doctest's OutputChecker inside the notebook
    changes nothing: every judgment is made in the parent. Wrong answers stay wrong (only q1's public case passes)."""
    cells = [ANSWER, "def double(x):\n    return x", WRONG_SAMPLER, PATCH_GRADER, "status = 'patched'"]
    report = grade(write_nb(tmp_path, "patch.ipynb", cells), tiny, limits=FAST)
    assert report.score == 1, report.summary()
    assert [r.case.name for r in report.results if r.passed] == ["q1 public case 1"]
    assert_no_leftovers(sandboxes)


@needs_sandbox
def test_monkeypatching_checkers_in_lab08(lab08, tmp_path, sandboxes):
    "Lab 08 with a sampler that draws from q and every checker patched: Q8 earns 0, the score stays Q1 + Q2 (11)."
    report = grade(lab08_nb(tmp_path, "patch08.ipynb", [WRONG_ACCEPT_REJECT, PATCH_GRADER]), lab08, limits=FAST)
    assert report.score == 11, report.summary()
    assert not any(r.passed for r in report.results if r.case.question.startswith("q8"))
    assert_no_leftovers(sandboxes)


FORGE = '''
import json, os
forged = [json.dumps({{"id": i, "ok": True, "value": v}}).encode() + b"\\n"
          for i in list(range(0, 200)) + [2**62 - 1] for v in ("42", "-7.0", "'blocked'", "'PASS'", "7")]
written = 0
for fd in [1, 2] + [int(f) for f in os.listdir("/proc/self/fd")]:
    try:
        for line in forged:
            os.write(fd, line)
        written += 1
    except OSError:
        pass
try:
    with open("/proc/self/fd/3", "wb") as f:
        f.write(b"".join(forged))
except OSError:
    pass
import pickle
class Boom:
    def __reduce__(self):
        return (os.system, ("touch {flag}",))
for where in (".", os.environ.get("TMPDIR", "."), "/tmp"):
    try:
        open(os.path.join(where, "results.pickle"), "wb").write(pickle.dumps(Boom()))
    except OSError:
        pass
'''

HIJACK = '''
import speclab.grading as g
def fake(request, namespace):                 # the child's own loop now answers whatever the student likes
    if request["op"] == "draws":
        return [0] * request["n"]
    return "'blocked'" if "status" in request["expr"] else "42"
g._child_run = fake
'''


@needs_sandbox
def test_forged_answers_on_the_response_channel(tiny, tmp_path, sandboxes):
    """Lines written to the parent's answer pipe (found through /proc/self/fd) claiming {"id": N, "ok": true,
    "value": ...}, and a pickle dropped where the notebook runs, earn nothing: ids are unknown in advance and the
    parent never unpickles. The honest cells (q1) still earn their 2 points; the wrong sampler stays wrong."""
    flag = tmp_path / "unpickled"
    cells = [ANSWER, DOUBLE, WRONG_SAMPLER, FORGE.format(flag=str(flag))]
    report = grade(write_nb(tmp_path, "forge.ipynb", cells), tiny, limits=FAST)
    assert report.score == 2, report.summary()
    assert not flag.exists()
    assert_no_leftovers(sandboxes)
    assert_grader_works(tiny, tmp_path)


@needs_sandbox
def test_hijacked_child_cannot_pass_hidden_cases(tiny, tmp_path, sandboxes):
    """A notebook that replaces the child's request handler answers every test as it likes; it can only echo what it
    already knows (the public wants), never a hidden case's expected text, and draws are judged in the parent."""
    report = grade(write_nb(tmp_path, "hijack.ipynb", [HIJACK]), tiny, limits=FAST)
    assert [r.case.name for r in report.results if r.passed] == ["q1 public case 1", "q2 public case 1"]
    assert report.score == 2, report.summary()
    assert_no_leftovers(sandboxes)


ECHO_HIDDEN = '''
import speclab.grading as g
seen = []
def echo(request, namespace):                 # remember every expression asked; show them in a later public case
    if request["op"] == "test":
        seen.append(request["expr"])
        if "status" in request["expr"]:
            return repr(" | ".join(seen))
    return None
g._child_run = echo
'''


@needs_sandbox
def test_hidden_sources_never_reach_visible_feedback(tiny, tmp_path, sandboxes):
    "No visible output (public feedback, messages, Gradescope's visible entries) ever holds a hidden case's source."
    report = grade(write_nb(tmp_path, "echo.ipynb", [ECHO_HIDDEN]), tiny, limits=FAST)
    visible = report.summary() + json.dumps([t for t in report.gradescope()["tests"] if t["visibility"] == "visible"])
    visible += report.gradescope()["output"]
    for case in (c for c in tiny.cases if c.hidden):
        assert case.expr not in visible, f"{case.name}'s source is visible: {public_feedback(report, 'q2')}"


@needs_sandbox
def test_deeply_nested_json_on_the_channel(tiny, tmp_path, sandboxes):
    "A line the parent cannot parse (here: JSON nested 100000 deep) is ignored like any other junk: no crash."
    cell = "import os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, b'[' * 100000 + b'\\n')\n" \
           "    except OSError:\n        pass"
    report = grade(write_nb(tmp_path, "deep.ipynb", [*GOOD, cell]), tiny, limits=FAST)
    assert report.score == Q1_Q3, report.summary()


@needs_sandbox
def test_memory_beyond_the_limit(tiny, tmp_path, sandboxes):
    "bytearray(10 GiB) with a 2 GiB limit raises MemoryError in that cell; the rest is graded."
    path = write_nb(tmp_path, "mem.ipynb", [ANSWER, "x = bytearray(10 << 30)", DOUBLE, SAMPLER])
    report = grade(path, tiny, limits=Limits(cell_seconds=20, test_seconds=10, total_seconds=120, memory_bytes=2 << 30))
    assert report.score == Q1_Q3, report.summary()
    assert report.messages == ["code cell 2 raised MemoryError: "]
    assert_no_leftovers(sandboxes)


FORK_BOMB = '''
import os, time
children = 0
for i in range(500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            open("/proc/self/comm", "w").write({mark!r})
            time.sleep(120)
        finally:
            os._exit(0)
    children += 1
status = "blocked" if children < 500 else f"forked {{children}}"
'''


@needs_sandbox
def test_fork_bomb_is_bounded_and_cleaned_up(tiny, tmp_path, sandboxes):
    "500 fork attempts stop at the process limit; grading completes; no child survives it."
    mark = marker()
    cells = [*GOOD, FORK_BOMB.format(mark=mark)]
    report = grade(write_nb(tmp_path, "fork.ipynb", cells), tiny,
                   limits=Limits(cell_seconds=30, test_seconds=10, total_seconds=120, processes=48))
    assert report.score == 4, report.summary()
    assert_no_leftovers(sandboxes, mark)
    assert_grader_works(tiny, tmp_path)


WRITE_OUTSIDE = '''
found = []
for path in {paths!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        found.append("WROTE " + path)
    except OSError as e:
        found.append(type(e).__name__)
status = "blocked" if all(not f.startswith("WROTE") for f in found) else " ".join(found)
'''


@needs_sandbox
def test_writing_outside_is_refused(tiny, lab08, tmp_path, sandboxes):
    "Writing into the repository, /root, the lab's folder or next to the submission fails; nothing appears on the host."
    name = "pwned-" + uuid.uuid4().hex[:8]
    sub_dir = tmp_path / "subs"
    paths = [str(ROOT / name), f"/root/{name}", str(LAB08 / name), str(tiny.path / name), str(sub_dir / name),
             str(ROOT / "speclab" / name), str(Path(sys.prefix) / name)]
    try:
        path = write_nb(sub_dir, "write.ipynb", [*GOOD, WRITE_OUTSIDE.format(paths=paths)])
        report = grade(path, tiny, limits=FAST)
        assert report.score == 4, report.summary()
        assert [p for p in paths if os.path.exists(p)] == []
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
    assert_no_leftovers(sandboxes)


@needs_sandbox
def test_no_file_survives_in_shared_folders(tiny, tmp_path, sandboxes):
    """Files a submission writes to /dev/shm or /var/tmp must not appear on the host: inside the sandbox both are
    fresh, private file systems (so the writes succeed there, and q2's public case, which wants 'blocked', fails)."""
    name = "pwned-" + uuid.uuid4().hex[:8]
    paths = [f"/dev/shm/{name}", f"/var/tmp/{name}"]
    try:
        report = grade(write_nb(tmp_path, "shm.ipynb", [*GOOD, WRITE_OUTSIDE.format(paths=paths)]), tiny, limits=FAST)
        assert report.score == Q1_Q3, report.summary()
        assert [p for p in paths if os.path.exists(p)] == []
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


NETWORK = '''
import socket

found = []
for host, port in [("1.1.1.1", 80), ("127.0.0.1", {port})]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        found.append(f"CONNECTED {{host}}:{{port}}")
    except OSError as e:
        found.append(type(e).__name__)
status = "blocked" if not any(f.startswith("CONNECTED") for f in found) else " ".join(found)
'''


@pytest.fixture
def host_server():
    "A TCP server on the host's loopback; yields (port, whether anything connected)."
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)

    def connected():
        try:
            conn, _ = srv.accept()
            conn.close()
            return True
        except OSError:
            return False
    yield srv.getsockname()[1], connected
    srv.close()


@needs_sandbox
def test_network_is_unreachable(tiny, tmp_path, sandboxes, host_server):
    "Connecting to 1.1.1.1:80 or to a server on the host's 127.0.0.1 fails: the sandbox has only its own loopback."
    port, connected = host_server
    report = grade(write_nb(tmp_path, "net.ipynb", [*GOOD, NETWORK.format(port=port)]), tiny, limits=FAST)
    assert report.score == 4, report.summary()
    assert not connected()
    assert_no_leftovers(sandboxes)


def test_network_in_practice_mode_demonstration(tiny, tmp_path, host_server):
    "DEMONSTRATION (practice mode, no sandbox): the same cell reaches the host's server, so the test above can see it."
    port, connected = host_server
    report = grade(write_nb(tmp_path, "net.ipynb", [*GOOD, NETWORK.format(port=port)]), tiny, limits=FAST,
                   practice=True)
    assert f"CONNECTED 127.0.0.1:{port}" in public_feedback(report, "q2")[0]
    assert report.score == Q1_Q3
    assert connected()


# ------------------------------------------------------------------------------------------------- practice
def test_practice_mode_is_labelled_everywhere(tiny, tmp_path):
    "Practice mode grades the tiny lab's solution right, and every line of summary() and of Gradescope's output says so."
    path = write_nb(tmp_path, "practice.ipynb", [ANSWER, "def double(x):\n    return x", SAMPLER, "status = 'no'"])
    report = grade(path, tiny, limits=FAST, practice=True)
    assert report.practice and report.score == 2, report.summary()
    for line in report.summary().splitlines():
        assert "PRACTICE MODE" in line, line
    gs = report.gradescope()
    assert gs["practice"] is True
    assert gs["output"].startswith("PRACTICE MODE")
    for t in gs["tests"]:
        assert t["output"].startswith("[PRACTICE MODE"), t
    full = grade(write_nb(tmp_path, "full.ipynb", [*GOOD, "status = 'blocked'"]), tiny, limits=FAST, practice=True)
    assert full.score == 4 and full.gradescope()["practice"] is True


@needs_sandbox
def test_sandboxed_report_is_not_practice(tiny, tmp_path):
    "A sandboxed grading says so, and never mentions practice mode."
    report = grade(write_nb(tmp_path, "s.ipynb", GOOD), tiny, limits=FAST, practice=False)
    assert not report.practice and report.gradescope()["practice"] is False
    assert "PRACTICE" not in report.summary() and "PRACTICE" not in json.dumps(report.gradescope())


# --------------------------------------------------------------------------------------------------- timing
def test_timing_twenty_submissions(tiny, tmp_path):
    "20 tiny submissions graded as a folder; each gets its right score (the wall time is printed, not asserted)."
    folder = tmp_path / "class"
    expected = {}
    for i in range(20):
        cells = [ANSWER if i % 2 == 0 else "answer = 41", DOUBLE if i % 3 else "def double(x):\n    return x",
                 SAMPLER if i % 4 else WRONG_SAMPLER, "status = 'blocked'" if i % 5 else "status = 'open'"]
        write_nb(folder, f"student{i:02d}.ipynb", cells)
        expected[f"student{i:02d}.ipynb"] = (i % 2 == 0) + bool(i % 3) + bool(i % 4) + bool(i % 5)
    out = tmp_path / "out" / "grades.csv"
    out.parent.mkdir()
    t0 = time.monotonic()
    reports = grading.grade_folder(folder, tiny, out, limits=FAST, progress=False)
    wall = time.monotonic() - t0
    mode = "practice" if reports[0].practice else "sandboxed"
    print(f"\n[timing] {len(reports)} tiny submissions graded ({mode}) in {wall:.1f} s, {wall / len(reports):.2f} s each")
    assert {Path(r.submission).name: r.score for r in reports} == expected
    import csv
    rows = list(csv.DictReader(out.open()))
    assert {row["submission"]: float(row["score"]) for row in rows} == expected
