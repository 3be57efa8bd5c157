"""Write the student release of the course: what students clone, without answers or hidden tests.

    python labs/release.py OUT                    # the release as a folder
    python labs/release.py OUT --branch student   # the same folder as a git repository with one commit on `student`
    python labs/release.py --check OUT            # prove an existing release (exit 1 and the problems if any)

This repository is the instructor's source: each lab's master notebook holds its solutions, `labs/*/autograder/`
holds every test with the hidden ones, Lab 09's `hidden_recordings.json` holds recordings the student never sees,
and the chapters' exercises have their answers in folded cells. The release copies every tracked file (as it is in
the working tree) except the instructor's side (`INSTRUCTOR_ONLY`, and the tests in `tests/` that read it), strips
the answer cells from the chapters (a code cell whose first line is `#| code-fold: true` and whose second starts with
`# Answer`), and writes `labs/STUDENT_README.md` as its README. Then it checks what it wrote (`check_release`): no
instructor-only path, no answer cell, no line of any master's solution and no line of any hidden test case. The
hidden material goes to students' graders only inside the Gradescope bundle (`speclab grade --lab LAB --gradescope
DIR`, Chapter 10), which is built from this repository, not from the release.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDENT_README = "labs/STUDENT_README.md"
# (glob over repository paths, why a student must not have it). `*` matches within one folder, `**` any depth.
INSTRUCTOR_ONLY = [
    ("labs/*/autograder/**", "the autograder's copy: every test case, the hidden ones included, and the solutions"),
    ("labs/*/*.ipynb", "a lab's master notebook: prose, prompts, solutions and every test"),
    ("labs/*/hidden_*", "material the hidden tests embed (Lab 09's recordings from prompts the student never sees)"),
    ("labs/*/assign.py", "regenerates student/ and autograder/ from the master"),
    ("labs/lab_assign.py", "regenerates student/ and autograder/ from the master"),
    ("labs/*/build_master.py", "writes the master notebook, solutions included"),
    ("labs/*/record.py", "records Lab 09's samples and names which servers are broken"),
    ("labs/*/corpus/**", "a lab's bug corpus: correct implementations of its questions among the wrong ones"),
    ("benchmarks/grading/*_corpus/**", "a grading bug corpus: correct implementations among the wrong ones"),
    ("benchmarks/grading/*_corpus*", "measures a lab's grading against its bug corpus (correct implementations in it)"),
    (STUDENT_README, "becomes the release's README.md"),
]
# A file of tests/ that names any of these, or a lab master's file name, reads the instructor's side (a master, the
# autograder's tests, a corpus with correct answers in it).
INSTRUCTOR_MARKERS = ("autograder", "hidden_recordings", "labkit", "build_master", "record.py", "assign.py",
                      "sampler_corpus", "lab06_corpus", "lab06_mistakes")
ANSWER = re.compile(r"\A#\|\s*code-fold:\s*true\s*\n#\s*Answer")


def _match(path: str, pattern: str) -> bool:
    "Whether repository path `path` matches `pattern` (`*`: within one folder; `**`: any depth below)."
    if pattern.endswith("/**"):
        base = pattern[:-3]
        parts = path.split("/")
        depth = base.count("/") + 1
        return len(parts) > depth and fnmatch.fnmatchcase("/".join(parts[:depth]), base)
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def instructor_reason(path: str, root: Path = ROOT) -> str | None:
    "Why repository path `path` stays on the instructor's side, or None when students get it."
    for pattern, why in INSTRUCTOR_ONLY:
        if _match(path, pattern):
            return why
    if path.startswith("tests/") and path.endswith(".py"):
        text = (root / path).read_text(encoding="utf-8")
        masters = sorted({p.name for p in root.glob("labs/*/*.ipynb")})
        named = [m for m in (*INSTRUCTOR_MARKERS, *masters) if m in text]
        if named:
            return f"a test that reads the instructor's side ({', '.join(named)})"
    return None


def tracked_files(root: Path = ROOT) -> list[str]:
    "The repository's tracked files that exist in the working tree, as paths relative to `root`."
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def cell_source(cell: dict) -> str:
    "A notebook cell's source as one string."
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def is_answer(cell: dict) -> bool:
    "Whether a notebook cell is an exercise's folded answer: `#| code-fold: true`, then a `# Answer` line."
    return cell["cell_type"] == "code" and bool(ANSWER.match(cell_source(cell)))


def strip_answers(nb: dict) -> tuple[dict, int]:
    "The notebook without its answer cells, and how many were removed."
    kept = [c for c in nb["cells"] if not is_answer(c)]
    return {**nb, "cells": kept}, len(nb["cells"]) - len(kept)


def write_notebook(nb: dict, path: Path) -> None:
    "nbformat's own layout (indent 1, sorted keys, trailing newline), as nbdev_clean writes it."
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def build_release(out: Path, root: Path = ROOT) -> dict:
    """Write the release into the empty (or missing) folder `out`; a summary: what was copied, what was left out and
    why, how many answer cells were stripped from which chapter."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"out must be an empty or missing folder, got {str(out)!r} with files in it")
    if not (root / STUDENT_README).is_file():
        raise ValueError(f"root must be the course repository (no {STUDENT_README} in {str(root)!r})")
    copied, left_out, stripped = [], {}, {}
    for path in tracked_files(root):
        why = instructor_reason(path, root)
        if why:
            left_out[path] = why
            continue
        dest = out / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.startswith("nbs/") and path.endswith(".ipynb"):
            nb, n = strip_answers(json.loads((root / path).read_text(encoding="utf-8")))
            write_notebook(nb, dest)
            if n:
                stripped[path] = n
        else:
            shutil.copy2(root / path, dest)
        copied.append(path)
    shutil.copy2(root / STUDENT_README, out / "README.md")
    return dict(copied=copied, left_out=left_out, answers_stripped=stripped)


def solution_lines(cells: list) -> list[str]:
    "Non-trivial lines a master's cells mark as solution: inside `# BEGIN/END SOLUTION`, or ending in `# SOLUTION`."
    lines = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        inside = False
        for line in cell_source(cell).splitlines():
            s = line.strip()
            if re.match(r"#\s*BEGIN SOLUTION", s):
                inside = True
            elif re.match(r"#\s*END SOLUTION", s):
                inside = False
            elif inside:
                lines.append(s)
            elif re.search(r"#\s*SOLUTION\s*$", s):
                lines.append(re.sub(r"#\s*SOLUTION\s*$", "", s).strip())
    return [s for s in lines if len(s) >= 12 and not s.startswith("#")]


def master_cells(master: Path) -> list:
    "A master notebook's cells."
    return json.loads(master.read_text(encoding="utf-8"))["cells"]


def test_cases(tests_dir: Path) -> list[dict]:
    "Every case of the OK-format test files in `tests_dir` (dicts with `code` and `hidden`)."
    cases = []
    for path in sorted(tests_dir.glob("*.py")):
        env: dict = {}
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), env)
        cases += [c for suite in env["test"]["suites"] for c in suite["cases"]]
    return cases


def doctest_lines(code: str) -> set[str]:
    "The non-trivial lines of a doctest case, prompts (`>>>`, `...`) removed."
    lines = {re.sub(r"^(>>>|\.\.\.)\s?", "", ln.strip()).strip() for ln in code.splitlines()}
    return {ln for ln in lines if len(ln) >= 12}


def hidden_lines(root: Path = ROOT) -> dict[str, set[str]]:
    "{lab: lines of its hidden test cases that no public case has}: what must not leave the instructor's side."
    out = {}
    for tests_dir in sorted(root.glob("labs/*/autograder/tests")):
        cases = test_cases(tests_dir)
        public = set().union(*(doctest_lines(c["code"]) for c in cases if not c["hidden"]))
        hidden = set().union(*(doctest_lines(c["code"]) for c in cases if c["hidden"]))
        out[tests_dir.parent.parent.name] = hidden - public
    return out


def release_text(out: Path) -> dict[str, str]:
    "{path: text} of every text file in the release; a notebook as its cells' sources and outputs."
    texts = {}
    for path in sorted(p for p in Path(out).rglob("*") if p.is_file() and ".git" not in p.parts):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb":
            nb = json.loads(text)
            parts = [cell_source(c) for c in nb["cells"]]
            parts += [json.dumps(o, ensure_ascii=False) for c in nb["cells"] for o in c.get("outputs", [])]
            text = "\n".join(parts)
        texts[str(path.relative_to(out))] = text
    return texts


def public_text(root: Path = ROOT) -> str:
    """What students are meant to read, from the instructor's repository: the chapters without their answers, the
    package, the student folders, and every other file they get outside `labs/`. A master's solution line or a hidden
    test line found here is the chapter's own (a formula the lab asks for, a docstring's example), not a leak."""
    parts = []
    for path in tracked_files(root):
        if instructor_reason(path, root) or (path.startswith("labs/") and "/student/" not in path):
            continue
        if path.endswith(".ipynb"):
            nb, _ = strip_answers(json.loads((root / path).read_text(encoding="utf-8")))
            parts += [cell_source(c) for c in nb["cells"]]
        else:
            parts.append((root / path).read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def secret_lines(root: Path = ROOT) -> dict[str, set[str]]:
    "{what: lines}: each master's solution lines and each lab's hidden test lines that students are not meant to read."
    public = public_text(root)
    secrets = {f"solution line of {m.relative_to(root)}": set(solution_lines(master_cells(m)))
               for m in root.glob("labs/*/*.ipynb")}
    secrets |= {f"hidden test line of {lab}": lines for lab, lines in hidden_lines(root).items()}
    return {what: {ln for ln in lines if ln not in public} for what, lines in sorted(secrets.items())}


def check_release(out: Path, root: Path = ROOT) -> list[str]:
    "What is wrong with the release in `out`, as sentences (an empty list: nothing found)."
    out = Path(out)
    problems = []
    files = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts]
    for path in files:
        for pattern, why in INSTRUCTOR_ONLY:
            if path != "README.md" and _match(path, pattern):
                problems.append(f"{path} is on the instructor's side: {why}")
    texts = release_text(out)
    for path in files:
        if path.endswith(".ipynb") and path.startswith("nbs/"):
            answers = [c for c in json.loads((out / path).read_text(encoding="utf-8"))["cells"] if is_answer(c)]
            if answers:
                problems.append(f"{path} holds {len(answers)} answer cell(s)")
    for what, lines in secret_lines(root).items():
        for path, text in texts.items():
            found = sorted(ln for ln in lines if ln in text)
            if found:
                problems.append(f"{path} holds a {what}: {found[0]!r}" + (f" (+{len(found) - 1})" if found[1:] else ""))
    return problems


def commit_branch(out: Path, branch: str) -> str:
    "Make `out` a git repository with one commit of everything on `branch`; the commit's hash."
    def git(*args):
        return subprocess.run(["git", *args], cwd=out, capture_output=True, text=True, check=True).stdout.strip()
    git("init", "-q", "-b", branch)
    git("add", "-A")
    git("-c", "user.name=speclab release", "-c", "user.email=release@speclab.invalid", "commit", "-q", "-m",
        "The course, student release: chapters, package, student notebooks and public tests")
    return git("rev-parse", "HEAD")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="an empty or missing folder to write the release into (with --check: a release)")
    ap.add_argument("--branch", help="also make OUT a git repository with the release committed on this branch")
    ap.add_argument("--check", action="store_true", help="only check an existing release in OUT")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.check and args.branch:
        ap.error("--check takes no --branch")
    if not args.check:
        try:
            summary = build_release(out)
        except ValueError as e:
            ap.error(str(e))
        print(f"release written to {out}: {len(summary['copied'])} files, {len(summary['left_out'])} left on the "
              f"instructor's side, {sum(summary['answers_stripped'].values())} answer cells stripped from "
              f"{len(summary['answers_stripped'])} chapters")
        for path, why in summary["left_out"].items():
            print(f"  left out {path}: {why}")
        if args.branch:
            print(f"committed on branch {args.branch}: {commit_branch(out, args.branch)}")
    elif not out.is_dir():
        ap.error(f"OUT must be a release folder, got {str(out)!r}")
    problems = check_release(out)
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    print("check: " + ("no answer, no solution line, no hidden test found" if not problems else
                       f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
