"""The student release (`labs/release.py`): what students clone holds no master, no autograder, no hidden test or
recording, no solution line and no chapter answer, the chapters still read (and run) without their answers, and the
release's own README commands run in it."""
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_release():
    spec = importlib.util.spec_from_file_location("speclab_release", ROOT / "labs" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = load_release()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    "(release folder, summary): the release, written once for the module."
    out = tmp_path_factory.mktemp("release") / "course"
    return out, release.build_release(out)


def chapter_cells(path: Path) -> list:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def sh_blocks(readme: Path) -> list[str]:
    "The one-line ```sh blocks of a README, in order."
    return [b.strip() for b in re.findall(r"^```sh\n(.*?)^```", readme.read_text(encoding="utf-8"), re.S | re.M)]


def test_release_holds_the_students_side_only(built):
    out, summary = built
    assert release.check_release(out) == []
    assert not list(out.glob("labs/*/autograder")), "an autograder folder reached the release"
    assert not list(out.glob("labs/*/*.ipynb")), "a lab's master reached the release"
    assert not list(out.rglob("hidden_*")), "hidden material reached the release"
    for student in ROOT.glob("labs/*/student"):
        for path in (p for p in student.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            copy = out / path.relative_to(ROOT)
            assert copy.read_bytes() == path.read_bytes(), f"{copy} is not the student's file"
    hidden = re.compile(r"""['"]hidden['"]\s*:\s*True""")
    assert not [p for p in out.rglob("*.py") if hidden.search(p.read_text(encoding="utf-8"))], "a hidden test case"
    for path in ("speclab/__init__.py", "nbs/01_proof.ipynb", "labs/lab_selfcheck.py", "constraints.txt"):
        assert (out / path).is_file(), f"the release lacks {path}"


def test_every_answer_is_stripped_and_nothing_else(built):
    out, summary = built
    answers = {}
    for path in sorted(ROOT.glob("nbs/*.ipynb")):
        cells = chapter_cells(path)
        kept = chapter_cells(out / "nbs" / path.name)
        answers[path.name] = [c for c in cells if release.is_answer(c)]
        assert [c["id"] for c in kept] == [c["id"] for c in cells if not release.is_answer(c)], path.name
        assert [c["source"] for c in kept] == [c["source"] for c in cells if not release.is_answer(c)], path.name
    total = sum(map(len, answers.values()))
    assert total >= 20, f"expected the chapters' folded answers, found {total}"
    assert sum(summary["answers_stripped"].values()) == total
    text = "\n".join(release.release_text(out).values())
    firsts = [release.cell_source(c).splitlines()[1] for cs in answers.values() for c in cs]
    assert not [f for f in firsts if f in text], "an answer's first line is in the release"


def bound_names(source: str) -> set[str]:
    "Names a cell binds at its top level and below: assignments, functions, classes, imports, loop targets."
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def loaded_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def test_chapters_do_not_need_their_answers():
    "A name that only an answer cell binds is never read by a later cell: the stripped chapter still runs."
    needs = {}
    for path in sorted(ROOT.glob("nbs/*.ipynb")):
        code = [(release.is_answer(c), release.cell_source(c)) for c in chapter_cells(path) if c["cell_type"] == "code"]
        public = set().union(*(bound_names(s) for answer, s in code if not answer))
        only_answers = set()
        for answer, source in code:
            if answer:
                only_answers |= bound_names(source) - public
            elif only_answers & loaded_names(source):
                needs[path.name] = sorted(only_answers & loaded_names(source))
    assert not needs, f"cells read names that only answers bind: {needs}"


def test_the_check_finds_each_kind_of_leak(built, tmp_path):
    "Plant one leak of each kind in a copy of the release: the check names every one."
    out, _ = built
    leaky = tmp_path / "leaky"
    shutil.copytree(out, leaky)
    master = next(ROOT.glob("labs/09_audit/*.ipynb"))
    shutil.copy2(master, leaky / "labs" / "09_audit" / master.name)
    secret = sorted(release.solution_lines(chapter_cells(next(ROOT.glob("labs/08_acceptance/*.ipynb")))))[-1]
    hidden = sorted(release.hidden_lines()["09_audit"])[0]
    (leaky / "labs" / "08_acceptance" / "student" / "notes.py").write_text(f"{secret}\n", encoding="utf-8")
    (leaky / "labs" / "09_audit" / "student" / "tests" / "q9_extra.py").write_text(f"# {hidden}\n", encoding="utf-8")
    chapter = leaky / "nbs" / "01_proof.ipynb"
    nb = json.loads(chapter.read_text(encoding="utf-8"))
    answer = next(c for c in chapter_cells(ROOT / "nbs" / "01_proof.ipynb") if release.is_answer(c))
    release.write_notebook({**nb, "cells": nb["cells"] + [answer]}, chapter)
    problems = release.check_release(leaky)
    assert any(master.name in p and "instructor's side" in p for p in problems), problems
    assert any("notes.py" in p and "solution line" in p for p in problems), problems
    assert any("q9_extra.py" in p and "hidden test line" in p for p in problems), problems
    assert any("01_proof.ipynb holds 1 answer cell" in p for p in problems), problems
    assert release.check_release(out) == [], "the copy's leaks must not be the release's"


def test_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "something").write_text("x")
    with pytest.raises(ValueError, match="out must be an empty or missing folder"):
        release.build_release(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["something"]


def test_student_branch(built, tmp_path):
    "`--branch student` commits the release as one commit on that branch, every file tracked."
    out = tmp_path / "course"
    assert release.main([str(out), "--branch", "student"]) == 0
    git = lambda *a: subprocess.run(["git", *a], cwd=out, capture_output=True, text=True, check=True).stdout
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "student"
    assert len(git("log", "--oneline").splitlines()) == 1
    tracked = set(git("ls-files").splitlines())
    assert tracked == {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert tracked == {str(p.relative_to(built[0])) for p in built[0].rglob("*") if p.is_file()}


def test_release_readme_commands_run_in_it(built):
    """The release's README: its set-up is the course's (which tests/test_packaging.py resolves against PyPI for every
    Python it names), and every other command runs in the release as written, with the set-up's venv standing for
    .venv and the release's own package imported."""
    out, _ = built
    setup, *commands = sh_blocks(out / "README.md")
    course_setup = sh_blocks(ROOT / "README.md")[0]
    assert course_setup.startswith(setup + " && "), (setup, course_setup)
    assert len(commands) >= 3, commands
    venv = out / ".venv"
    venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(out))
    try:
        for cmd in commands:
            run = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=out, env=env, capture_output=True,
                                 text=True, timeout=600)
            assert run.returncode == 0, f"{cmd}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            if "selfcheck.py" in cmd:
                rows = re.findall(r"^(q\d\w*)\s+(\d+) / (\d+)", run.stdout, re.M)
                assert rows and all(int(passed) == 0 and int(n) > 0 for _, passed, n in rows), run.stdout
            if "speclab proof" in cmd:
                assert "all verdicts as expected" in run.stdout, run.stdout[-2000:]
    finally:
        venv.unlink()
