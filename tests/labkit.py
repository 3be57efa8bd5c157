"""What the lab tests share (tests/test_labs.py and each lab's own tests/test_labNN.py): a lab's paths, its own
self-check runner (labs/<lab>/selfcheck.py: cells exec'd in one fresh Python process, then each OK-format test case as
a doctest, one JSON report back), and readers of notebooks and test files. A self-check of the labs' content, not the
course autograder."""
import importlib.util
import json
import textwrap
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lab:
    "One lab: its folder under labs/, its notebook's name, its question count and what its checks expect."
    folder: str                    # e.g. "08_acceptance"
    notebook: str                  # the master's (and the student's) notebook name
    num_questions: int
    min_solution_lines: int        # the master marks at least this many solution lines
    master_timeout: int            # seconds for the master's run

    @property
    def path(self) -> Path:
        return ROOT / "labs" / self.folder

    @property
    def master(self) -> Path:
        return self.path / self.notebook

    @property
    def student(self) -> Path:
        return self.path / "student"

    @property
    def autograder(self) -> Path:
        return self.path / "autograder"

    @cached_property
    def selfcheck(self):
        "The lab's labs/<lab>/selfcheck.py, imported from its file."
        return load_module(self.path / "selfcheck.py", f"lab{self.folder[:2]}_selfcheck")

    def tests(self, where: str = "autograder") -> dict:
        "{question name: [cases]} from otter's OK-format files in student/ or autograder/."
        return {name: cases for name, _, cases in self.selfcheck.load_tests(self.path / where / "tests")}

    def check(self, notebook: Path, timeout: int = 600, only: list | None = None) -> dict:
        "The self-check report of `notebook` run with the autograder's tests (all of them, or `only`)."
        kwargs = {} if only is None else {"only": only}
        return self.selfcheck.check_notebook(notebook, self.autograder / "tests", timeout=timeout, **kwargs)

    def check_many(self, notebooks: list, timeout: int = 600, only: list | None = None) -> list:
        """A self-check report per notebook, all run in one child process (each in a fresh namespace): variants of
        the lab pay its imports once. `timeout` is for them all."""
        kwargs = {} if only is None else {"only": only}
        return self.selfcheck.check_notebooks(notebooks, self.autograder / "tests", timeout=timeout, **kwargs)


LAB06 = Lab("06_kv", "kv_rollback.ipynb", 4, 30, 600)
LAB08 = Lab("08_acceptance", "acceptance.ipynb", 8, 40, 1200)
LAB09 = Lab("09_audit", "audit.ipynb", 5, 25, 600)


def load_module(path: Path, name: str):
    "A Python file imported as module `name`."
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cells(path) -> list:
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def src(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def by_question(report) -> dict:
    out = {}
    for res in report["results"]:
        out.setdefault(res["question"], []).append(res)
    return out


def solution_lines(master_cells) -> list:
    "Non-trivial lines the master marks as solution (labs/release.py's reader, which the student release checks with)."
    return load_module(ROOT / "labs" / "release.py", "speclab_release").solution_lines(master_cells)


def student_text(lab: Lab) -> str:
    "The student's notebook and public test files as one text."
    nb = "\n".join(src(c) for c in cells(lab.student / lab.notebook))
    return nb + "\n" + "\n".join(p.read_text() for p in sorted((lab.student / "tests").glob("*.py")))


def notebook(cells, name="tiny-lab", language="python") -> dict:
    "A minimal nbformat-4 notebook with these code cells (test_grading.py, test_grade_paths.py)."
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": language},
                         "language_info": {"name": language}, "otter": {"assignment_name": name}},
            "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": textwrap.dedent(c)} for c in cells]}


def ok_file(name, cases) -> str:
    "An OK-format test file: cases are (code, hidden); one point each."
    test = {"name": name, "points": [1] * len(cases),
            "suites": [{"cases": [{"code": c, "hidden": h, "locked": False} for c, h in cases],
                        "scored": True, "setup": "", "teardown": "", "type": "doctest"}]}
    return "OK_FORMAT = True\n\ntest = " + repr(test) + "\n"
