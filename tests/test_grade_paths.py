"""Chapter 10's grader run from wherever an instructor stands.

The sandbox covers the folders the student must not read: the lab's, the submission's, the output's. Those folders
may hold what the student's Python itself must read: the project root holds the virtual environment and the
editable speclab, `--out results.json` names the current folder, a submission may sit beside the environment, and
an environment may live under /tmp. Each test here grades from such a place, with a real command line where it can,
and the submission tries to read what must stay hidden (the lab's hidden tests, the other submissions, the grades
file, the folder around the environment): the tiny lab's public case `status == 'blocked'` passes only if every one
of those reads failed, so a full score says both that the grader ran and that nothing leaked.

Environments other than this one are made cheaply: `python -m venv --without-pip` and a .pth file that adds this
environment's site-packages (and so the editable speclab) with `site.addsitedir`.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from labkit import notebook, ok_file

from speclab import grading
from speclab.grading import Limits, grade, load_lab, sandbox_problem

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = sandbox_problem()
pytestmark = [pytest.mark.xdist_group("grade_paths"),
              pytest.mark.skipif(PROBLEM is not None, reason=f"no sandbox here: {PROBLEM}")]
FAST = Limits(cell_seconds=20, test_seconds=20, total_seconds=120, memory_bytes=3 << 30)
CLI = "import sys; from speclab.cli import main; sys.exit(main())"
SITE_PACKAGES = Path(np.__file__).resolve().parent.parent          # this environment's (numpy, the editable speclab)


def write_nb(path: Path, cells) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook(cells, "paths-lab")), encoding="utf-8")
    return path


def make_lab(root: Path):
    "Three points: `answer` (public), `status == 'blocked'` (public), `double` (hidden)."
    tests = root / "autograder" / "tests"
    tests.mkdir(parents=True)
    (root / "autograder" / "paths.ipynb").write_text(json.dumps(notebook(["x = 1"], "paths-lab")), encoding="utf-8")
    (tests / "q1.py").write_text(ok_file("q1", [(">>> answer\n42", False)]))
    (tests / "q2.py").write_text(ok_file("q2", [(">>> status\n'blocked'", False)]))
    (tests / "q3.py").write_text(ok_file("q3", [(">>> double(3)\n6", True)]))
    return load_lab(root)


# Every path must fail to open or list; otherwise `status` names what was read and q2's public case fails.
PROBE = '''
import os
found = []
for path in {paths!r}:
    try:
        if os.path.isdir(path):
            found.append(f"LISTED {{path}}: {{sorted(os.listdir(path))[:4]}}")
        else:
            found.append(f"READ {{path}}: {{open(path).read(40)!r}}")
    except OSError as e:
        found.append(type(e).__name__)
status = "blocked" if not any(f.startswith(("READ", "LISTED")) for f in found) else " | ".join(found)
'''
ANSWERS = ["answer = 42", "def double(x):\n    return 2 * x"]


def submission(path: Path, secrets) -> Path:
    "A notebook that answers q1 and q3 and earns q2 only if none of `secrets` (which must exist) can be read."
    missing = [str(s) for s in secrets if not Path(s).exists()]
    assert not missing, f"the test's secrets must exist on the host: {missing}"
    return write_nb(path, [*ANSWERS, PROBE.format(paths=[str(s) for s in secrets])])


def make_env(folder: Path) -> Path:
    "A virtual environment at `folder` that imports this environment's packages; its python."
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    site = next((folder / "lib").glob("python3*")) / "site-packages"
    (site / "speclab-from-project.pth").write_text(f"import site; site.addsitedir({str(SITE_PACKAGES)!r})\n")
    python = folder / "bin" / "python"
    probe = subprocess.run([str(python), "-I", "-c", "import speclab.grading, sys; print(sys.prefix)"],
                           capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == str(folder), probe.stderr
    return python


def speclab_grade(python, *args, cwd) -> subprocess.CompletedProcess:
    "`speclab grade ARGS` run by `python`'s environment in the folder `cwd`, as an instructor types it."
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "HOME": "/root"}
    return subprocess.run([str(python), "-c", CLI, "grade", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def graded(done: subprocess.CompletedProcess, results: Path) -> dict:
    "results.json that `speclab grade` wrote, after checking it ran and reported no grader error."
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "GRADER ERROR" not in out and "PRACTICE" not in out, out[-3000:]
    return json.loads(results.read_text())


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return make_lab(tmp_path_factory.mktemp("pathslab") / "lab")


@pytest.fixture(scope="module")
def srv_env():
    """(folder, python): an environment at folder/venv, outside /tmp, /root and any checkout (so that no fresh file
    system covers the folder around it), and a file beside it that a submission must not read."""
    folder = Path(tempfile.mkdtemp(prefix="speclab-env-", dir="/srv"))
    folder.chmod(0o755)
    try:
        python = make_env(folder / "venv")
        (folder / "beside-the-env.txt").write_text("another course's grades")
        yield folder, python
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def lab_secrets(lab):
    "The lab's hidden test file and its folder."
    return [lab.path / "autograder" / "tests" / "q3.py", lab.path]


# ------------------------------------------------------------------------------------------ from the project root
def test_out_in_the_project_root(lab, tmp_path):
    """`speclab grade SUB --lab LAB --out NAME.json` from the project root (the README's command): the output's folder
    is the one holding .venv and the editable speclab, and it was covered whole, so the child could not start and the
    solution scored 0. Now it earns every point, and the project root's own files stay unreadable."""
    out = ROOT / f"speclab-test-{uuid.uuid4().hex[:8]}.json"
    sub = submission(tmp_path / "sub.ipynb", [ROOT / "settings.ini", ROOT / "labs", ROOT, *lab_secrets(lab)])
    try:
        results = graded(speclab_grade(sys.executable, sub, "--lab", lab.path, "--out", out.name, cwd=ROOT), out)
    finally:
        out.unlink(missing_ok=True)
    assert results["score"] == lab.max_score == 3, [t["output"] for t in results["tests"]]


@pytest.mark.slow
def test_readme_command_grades_the_master_notebook():
    """The README's command exactly, from the project root: Lab 08's master notebook, which sits in the lab's own
    folder inside the checkout, earns all 49 points (it scored 0: 'the grading sandbox did not start')."""
    out = ROOT / f"speclab-test-{uuid.uuid4().hex[:8]}.json"
    try:
        done = speclab_grade(sys.executable, "labs/08_acceptance/acceptance.ipynb", "--lab", "labs/08_acceptance",
                             "--out", out.name, cwd=ROOT)
        results = graded(done, out)
    finally:
        out.unlink(missing_ok=True)
    assert results["score"] == load_lab(ROOT / "labs" / "08_acceptance").max_score == 49, results["output"]


# ---------------------------------------------------------------------------------- beside the environment
def test_submission_beside_the_environment(lab, srv_env):
    """The submission, another student's notebook and the output in the folder that holds the environment, graded
    from there: that folder is hidden but the environment inside it is bound back; the other notebook, the file
    beside the environment and the lab stay unreadable."""
    folder, python = srv_env
    tag = uuid.uuid4().hex[:8]
    other = write_nb(folder / f"other-{tag}.ipynb", ["answer = 41"])
    sub = submission(folder / f"sub-{tag}.ipynb", [other, folder / "beside-the-env.txt", folder, *lab_secrets(lab)])
    out = folder / f"results-{tag}.json"
    results = graded(speclab_grade(python, sub.name, "--lab", lab.path, "--out", out.name, cwd=folder), out)
    assert results["score"] == 3, [t["output"] for t in results["tests"]]


def test_folder_mode_default_out_beside_the_environment(lab, srv_env):
    """`speclab grade SUBS/ --lab LAB` in the folder holding the environment: grades.csv goes there by default and
    that folder is hidden. Both submissions earn 3; the second cannot read the first, nor the grades file that
    already holds the first's row."""
    folder, python = srv_env
    subs = folder / f"subs-{uuid.uuid4().hex[:8]}"
    first = write_nb(subs / "a_clean.ipynb", [*ANSWERS, "status = 'blocked'"])
    grades = folder / "grades.csv"
    grades.write_text("submission,score\n")                      # exists from the start, as the grader opens it
    submission(subs / "b_probe.ipynb", [first, grades, subs, folder / "beside-the-env.txt", *lab_secrets(lab)])
    try:
        done = speclab_grade(python, subs.name, "--lab", lab.path, cwd=folder)
        assert done.returncode == 0 and "GRADER ERROR" not in done.stdout, (done.stdout + done.stderr)[-3000:]
        rows = grades.read_text().splitlines()
    finally:
        grades.unlink(missing_ok=True)
    scores = {row.split(",")[0]: float(row.split(",")[1]) for row in rows[1:]}
    assert scores == {"a_clean.ipynb": 3.0, "b_probe.ipynb": 3.0}, rows


def test_hidden_file_inside_the_environment_stays_hidden(lab, srv_env, tmp_path):
    """A hidden path inside a path the child needs (a file in the environment's folder) is covered after the
    environment is bound back, so it stays unreadable while the environment works."""
    folder, python = srv_env
    secret = folder / "venv" / f"secret-{uuid.uuid4().hex[:8]}.txt"
    secret.write_text("hidden inside the environment")
    try:
        sub = submission(tmp_path / "sub.ipynb", [secret, *lab_secrets(lab)])
        code = ("import json, sys; from speclab.grading import grade, load_lab; "
                "r = grade(sys.argv[1], load_lab(sys.argv[2]), hide=[sys.argv[3]]); "
                "print(json.dumps([r.score, r.messages]))")
        done = subprocess.run([str(python), "-c", code, str(sub), str(lab.path), str(secret)],
                              capture_output=True, text=True, timeout=300)
    finally:
        secret.unlink()
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [3.0, []], done.stdout


# ----------------------------------------------------------------------------------------- under /tmp
def test_environment_under_tmp_and_out_in_tmp(lab, tmp_path):
    """An environment under /tmp (pytest's folders are there) and `--out /tmp/NAME.json`: /tmp itself is hidden, and
    the sandbox gives the child a fresh /tmp; the environment is bound back into it, a file beside it is not."""
    python = make_env(tmp_path / "venv")
    secret = tmp_path / "beside-the-env.txt"
    secret.write_text("not for the student")
    sub = submission(tmp_path / "sub.ipynb", [secret, tmp_path, *lab_secrets(lab)])
    out = Path("/tmp") / f"speclab-test-{uuid.uuid4().hex[:8]}.json"
    try:
        results = graded(speclab_grade(python, sub, "--lab", lab.path, "--out", out, cwd=tmp_path), out)
    finally:
        out.unlink(missing_ok=True)
    assert results["score"] == 3, [t["output"] for t in results["tests"]]


# ------------------------------------------------------------------------------------------ refusals, errors
@pytest.mark.parametrize("what", ["prefix", "package", "root", "usr"])
def test_hiding_what_the_child_needs_is_refused(what, lab, tmp_path):
    """Hiding the environment itself, the speclab package, / or /usr cannot work (the child would not start, or
    would see nothing): a ValueError naming `hide` says so before anything runs."""
    import speclab
    path = {"prefix": Path(sys.prefix), "package": Path(speclab.__file__).parent, "root": Path("/"),
            "usr": Path("/usr")}[what]
    sub = write_nb(tmp_path / "sub.ipynb", ANSWERS)
    with pytest.raises(ValueError, match="hide"):
        grade(sub, lab, limits=FAST, hide=[path])


def test_a_sandbox_that_cannot_start_says_why_in_one_line(lab, tmp_path, monkeypatch):
    """The grader's own fault, reported as such in one line that names the cause: a Python that is not there
    (setpriv's error), then a kept path that is not there (mount's error)."""
    sub = write_nb(tmp_path / "sub.ipynb", ANSWERS)
    monkeypatch.setattr(sys, "executable", "/nonexistent-speclab/python3")
    report = grade(sub, lab, limits=FAST)
    assert report.score == 0 and len(report.messages) == 1, report.messages
    line = report.messages[0]
    assert "GRADER ERROR" in line and "\n" not in line and len(line) < 600, line
    assert "/nonexistent-speclab/python3" in line and "No such file" in line, line
    monkeypatch.undo()
    keep = grading._keep_paths()
    monkeypatch.setattr(grading, "_keep_paths", lambda: [*keep, Path("/nonexistent-speclab-keep")])
    report = grade(sub, lab, limits=FAST)
    line = report.messages[0]
    assert report.score == 0 and "GRADER ERROR" in line and "\n" not in line, report.messages
    assert "mount" in line and "/nonexistent-speclab-keep" in line, line


# ------------------------------------------------------------------------------------------ out of memory
def memory_cgroup(limit_mb: int):
    "A new memory cgroup limited to `limit_mb` (v2, or v1's memory controller): (its cgroup.procs, its folder)."
    v2 = Path("/sys/fs/cgroup")
    name = f"speclab-test-{uuid.uuid4().hex[:8]}"
    controllers = (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").is_file() else []
    if "memory" in controllers:
        (v2 / "cgroup.subtree_control").write_text("+memory")
        folder = v2 / name
        folder.mkdir()
        (folder / "memory.max").write_text(f"{limit_mb}M")
    elif (v2 / "memory" / "cgroup.procs").is_file():
        folder = v2 / "memory" / name
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
    else:
        pytest.skip("no writable memory cgroup here")
    return folder / "cgroup.procs", folder


def test_out_of_memory_is_named(lab, tmp_path):
    """Under a memory cgroup (Gradescope's container has one: 768 MB by default) a cell that outgrows it is killed
    by the kernel's OOM killer; the report says so and names the limit, instead of 'the notebook's process ended'.
    The rest of the notebook is graded (q1 and q3 pass; the killed cell's q2 fails)."""
    try:
        procs, folder = memory_cgroup(400)
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup here: {e}")
    sub = write_nb(tmp_path / "sub.ipynb", [*ANSWERS, "b = bytearray(1 << 30)\nb[::4096] = b'x' * len(b[::4096])\n"
                                                     "status = 'blocked'"])
    code = ("import json, sys; from speclab.grading import grade, load_lab, Limits; "
            "limits = Limits(cell_seconds=60, test_seconds=20, total_seconds=300); "
            "r = grade(sys.argv[1], load_lab(sys.argv[2]), limits); print(json.dumps([r.score, r.messages]))")

    def join():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    try:
        done = subprocess.run([sys.executable, "-c", code, str(sub), str(lab.path)], capture_output=True, text=True,
                              timeout=300, preexec_fn=join, env={"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"})
    finally:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert done.returncode == 0, done.stderr[-3000:]
    score, messages = json.loads(done.stdout.splitlines()[-1])
    assert score == 2.0, messages
    assert any("code cell 3 was killed by the kernel's out-of-memory killer" in m and "400 MB" in m
               for m in messages), messages


def test_folder_mode_refuses_an_out_inside_the_environment_in_one_line(tmp_path):
    "`speclab grade FOLDER --out .venv/grades.csv` would hide the environment: one line on stderr, status 2."
    venv = Path(sys.prefix)
    write_nb(tmp_path / "subs" / "a.ipynb", ["x = 1"])
    run = subprocess.run([sys.executable, "-c", CLI, "grade", str(tmp_path / "subs"), "--lab",
                          str(ROOT / "labs" / "08_acceptance"), "--out", str(venv / "grades.csv")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("speclab grade: error: hide must not be a folder the student's Python runs from")
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    assert not (venv / "grades.csv").exists()
