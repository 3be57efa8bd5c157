"""Lab 06 (labs/06_kv, KV rollback): each planted mistake of tests/lab06_mistakes.py, in place of the master's answer to
one question, must fail a hidden test of that question; a correct answer written differently (it gives blocks back at
once after a rollback or a cancel) must pass every test. All of them run in one self-check child (a fresh namespace
each), so the lab's imports are paid once. The checks every lab shares are in tests/test_labs.py; the runner and paths
in tests/labkit.py; benchmarks/grading/lab06_corpus.py measures how often fresh fuzzer seeds catch each mistake.
"""
import json

import pytest

from lab06_mistakes import BUGS, CORRECT_TRIM, planted, with_answers
from labkit import LAB06

pytestmark = pytest.mark.xdist_group("lab06")   # beside test_labs.py's Lab 06 runs, in one worker


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{answer name: its self-check results, every test}: each planted mistake and the correct variant written into a
    folder of its own and run in one self-check child, one after another."""
    answers = {**{bug: planted(bug) for bug in BUGS}, "correct, gives blocks back at once": with_answers(CORRECT_TRIM)}
    base = tmp_path_factory.mktemp("lab06")
    paths = []
    for k, nb in enumerate(answers.values()):
        (base / f"answer{k}").mkdir()
        paths.append(base / f"answer{k}" / LAB06.notebook)
        paths[-1].write_text(json.dumps(nb))
    return {name: report for name, report in zip(answers, LAB06.check_many(paths, timeout=1800))}


def test_each_expected_output_is_one_line():
    "The grader compares repr(value) with the expected text: a display IPython wrapped over lines would never match."
    wants = [c["code"].rsplit("\n", 1)[-1] for cases in LAB06.tests().values() for c in cases]
    assert wants and all(w and not w.startswith(">>> ") for w in wants), wants
    for name, cases in LAB06.tests().items():
        for c in cases:
            lines = c["code"].splitlines()
            shown = [ln for ln in lines if not ln.startswith((">>> ", "... "))]
            assert len(shown) == 1 and len(shown[0]) < 80, (name, shown)


def test_the_corpus_covers_every_question_and_applies():
    "At least two planted mistakes per question, each an edit the master's answer holds exactly once."
    for q in ("q1", "q2", "q3", "q4"):
        assert sum(v[0] == q for v in BUGS.values()) >= 2, q
    for bug in BUGS:
        assert planted(bug) != with_answers({}), bug


def test_hidden_fuzz_seeds_are_not_the_public_ones():
    "The hidden fuzz cases draw other workloads than the public ones (seeds 0 to 9)."
    tests = LAB06.tests()
    public = " ".join(c["code"] for cases in tests.values() for c in cases if not c["hidden"])
    hidden = " ".join(c["code"] for cases in tests.values() for c in cases if c["hidden"])
    assert "fuzz(" in public and "range(10)" in public
    assert hidden.count("fuzz(") >= 8 and "range(10)" not in hidden and "range(0" not in hidden


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_mistake_fails_a_hidden_test_of_its_question(bug, reports):
    question = BUGS[bug][0]
    report = reports[bug]
    mine = [r for r in report["results"] if r["question"].startswith(question + "_")]
    assert mine and [r for r in mine if r["hidden"] and not r["passed"]], f"{bug!r} passes every hidden test"
    others = [(r["question"], r["case"]) for r in report["results"] if not r["passed"] and r not in mine]
    assert not others, f"{bug!r} costs points outside {question}: {others}"


@pytest.mark.slow
def test_correct_answer_written_differently_passes_every_test(reports):
    report = reports["correct, gives blocks back at once"]
    failed = [(r["question"], r["case"], r["output"][-400:]) for r in report["results"] if not r["passed"]]
    assert report["results"] and not report["cell_errors"] and not failed, (report["cell_errors"], failed)
