"""Repository-level checks: the notebooks run, the exported package and the README match their sources,
the two README commands are what CI runs, and the wheel installs and works without the dev tools.

The notebooks run with their `#| slow` cells (what a student skips with a plain `nbdev_test --path`); set
SPECLAB_NBDEV_FLAGS="slow cuda" to add the `#| cuda` cells, or SPECLAB_NBDEV_FLAGS="" to skip the slow ones.
"""
import ast
import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from configparser import ConfigParser
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NOTEBOOKS = sorted(
    p.relative_to(ROOT) for p in (ROOT / "nbs").glob("**/*.ipynb")
    if not any(part.startswith(("_", ".")) for part in p.relative_to(ROOT / "nbs").parts)
)
DEV_ONLY = {"nbdev", "jupyter", "fastcore", "execnb", "ghapi"}  # must appear only under extra == "dev"


def run(cmd, cwd, timeout=600, env=None):
    "Run `cmd` (no shell), capturing text output. IN_TEST is dropped: it turns nbdev_export into a no-op."
    env = {k: v for k, v in (env or os.environ).items() if k != "IN_TEST"}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def output(r):
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-20000:]}\n--- stderr\n{r.stderr[-20000:]}"


def copy_repo(dest: Path, files) -> Path:
    "Copy the files git would commit into `dest` (symlinks stay symlinks)."
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f, follow_symlinks=False)
    return dest


def snapshot(d: Path) -> dict:
    "relative path -> bytes (or link target) of every file under `d`, skipping caches."
    snap = {}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d)
        if {"__pycache__", ".ipynb_checkpoints"} & set(rel.parts) or (p.is_dir() and not p.is_symlink()):
            continue
        snap[str(rel)] = f"-> {os.readlink(p)}".encode() if p.is_symlink() else p.read_bytes()
    return snap


def describe_changes(before: dict, after: dict, limit=60) -> str:
    "Name each changed file and show the start of the first few diffs."
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    lines = [f"  {k} ({'new' if k not in before else 'deleted' if k not in after else 'modified'})"
             for k in changed]
    for k in changed[:3]:  # a taste of the diff
        a, b = (before.get(k, b"").decode(errors="replace"), after.get(k, b"").decode(errors="replace"))
        diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), k, k + " (regenerated)", lineterm=""))
        lines += diff[:limit] + (["  ..."] if len(diff) > limit else [])
    return "\n".join(lines)


def readme_commands(text: str) -> list[list[str]]:
    "The ```sh blocks (as lists of lines) of README's '## Two commands' section."
    m = re.search(r"^## Two commands[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "README.md has no '## Two commands' section"
    return [b.splitlines() for b in re.findall(r"^```sh[ \t]*\n(.*?)^```", m.group(1), re.M | re.S)]


# --- notebooks ----------------------------------------------------------------------------------------------

def test_notebooks_found():
    assert Path("nbs/index.ipynb") in NOTEBOOKS, NOTEBOOKS


# Notebooks that share one nbdev_test process, as `nbdev_test --n_workers 0` runs several: each process pays about
# 3 CPU s of imports (nbdev, execnb, torch, matplotlib, the engine) before its first cell, and most notebooks run for
# under 20 s. The two heaviest (08, 09c) run alone. Each notebook still runs in a fresh namespace and is its own test;
# a group's notebooks go to one xdist worker (xdist_group), so the group runs once.
NOTEBOOK_GROUPS = (
    ("nbs/07b_train.ipynb", "nbs/04_kernels.ipynb", "nbs/90_cli.ipynb"),
    ("nbs/03_sampling.ipynb", "nbs/09_acceptance.ipynb", "nbs/01_proof.ipynb", "nbs/14_trees.ipynb"),
    ("nbs/10_grading.ipynb", "nbs/07_model.ipynb", "nbs/index.ipynb", "nbs/12_eagle.ipynb"),
    ("nbs/11_serve.ipynb", "nbs/95_testing.ipynb", "nbs/06_kv.ipynb", "nbs/06b_kvlab.ipynb", "nbs/02_roofline.ipynb",
     "nbs/09d_remote.ipynb", "nbs/05_metadata.ipynb", "nbs/13_audit.ipynb", "nbs/09b_vllm_io.ipynb"),
    ("nbs/08a_config.ipynb", "nbs/08b_request.ipynb", "nbs/08c_processors.ipynb", "nbs/08d_drafters.ipynb",
     "nbs/08e_scheduler.ipynb", "nbs/08f_runner.ipynb", "nbs/08g_policy.ipynb", "nbs/14b_tree_verify.ipynb",
     "nbs/00_patching.ipynb"),
)
GROUP_OF = {Path(nb): group for group in NOTEBOOK_GROUPS for nb in group}
RUN_GROUP = """
import json, os, sys
from pathlib import Path
from nbdev.config import get_config
from nbdev.test import test_nb
cfg = get_config()
os.chdir(cfg.nbs_path)                                    # where nbdev_test runs notebooks from
passed = {}
for nb in sys.argv[2:]:
    print(f"=== {nb}", flush=True)
    passed[nb] = test_nb(Path(cfg.config_path) / nb, skip_flags=cfg.tst_flags.split(), force_flags=sys.argv[1].split(),
                         basepath=cfg.config_path, do_print=True)[0]
print("RESULT " + json.dumps(passed))
"""


def notebook_flags() -> str:
    "The flags test_notebook_runs passes (SPECLAB_NBDEV_FLAGS, default 'slow': `#| cuda` cells only when asked for)."
    return os.environ.get("SPECLAB_NBDEV_FLAGS", "slow")


@lru_cache(maxsize=None)
def run_notebook_group(group: tuple[str, ...]) -> tuple[dict, str]:
    "Run a group's notebooks one after another in one process: ({notebook: passed}, the process's output)."
    r = run([BIN / "python", "-c", RUN_GROUP, notebook_flags(), *group], cwd=ROOT, timeout=3600)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    return (json.loads(line[len("RESULT "):]) if line else {}), output(r)


def notebook_param(nb):
    group = GROUP_OF.get(nb)
    marks = [pytest.mark.xdist_group("notebooks-" + Path(group[0]).stem)] if group else []
    return pytest.param(nb, marks=marks, id=str(nb))


@pytest.mark.parametrize("nb", [notebook_param(nb) for nb in NOTEBOOKS])
def test_notebook_runs(nb):
    "Every notebook executes under nbdev_test, its `#| slow` cells included (`#| cuda` cells only when asked for)."
    group = GROUP_OF.get(nb)
    if group is not None:
        passed, out = run_notebook_group(group)
        assert passed.get(str(nb)) is True, f"nbdev_test failed on {nb} (run with {', '.join(group)})\n{out}"
        return
    cmd = [BIN / "nbdev_test", "--path", nb, "--do_print"]
    if notebook_flags().strip():
        cmd += ["--flags", notebook_flags()]
    r = run(cmd, cwd=ROOT, timeout=3600)
    assert r.returncode == 0, f"nbdev_test failed on {nb}\n{output(r)}"


def test_every_notebook_runs_alone_or_in_one_group():
    "A notebook in two groups would run twice; a group naming a notebook that is gone would hide a typo."
    grouped = [Path(nb) for group in NOTEBOOK_GROUPS for nb in group]
    assert len(grouped) == len(set(grouped)), grouped
    assert set(grouped) <= set(NOTEBOOKS), set(grouped) - set(NOTEBOOKS)


@pytest.mark.parametrize("tool", ["nbdev_export", "nbdev_clean"])
def test_sources_are_in_sync(tool, tmp_path, repo_files):
    """Running `tool` on a copy of the committed files changes nothing: speclab/ is what the notebooks export
    (and pyproject.toml what nbdev writes), and every notebook is already clean."""
    work = copy_repo(tmp_path / "repo", repo_files)
    before = snapshot(work)
    r = run([BIN / tool], cwd=work, timeout=600)
    assert r.returncode == 0, f"{tool} failed\n{output(r)}"
    after = snapshot(work)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, (f"{tool} would change these files; run .venv/bin/{tool} and commit the result:\n"
                         + describe_changes(before, after))


# --- README and CI ---------------------------------------------------------------------------------------------

def test_readme_up_to_date():
    r = run([sys.executable, ROOT / "tools" / "make_readme.py", "--check"], cwd=ROOT)
    assert r.returncode == 0, f"README.md is stale; run `python tools/make_readme.py`\n{output(r)}"


def test_readme_two_commands():
    "Exactly two one-line ```sh blocks: set up + main job, then the tests; .ci/run extracts the same two."
    blocks = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert [len(b) for b in blocks] == [1, 1], f"want two one-line ```sh blocks, got {blocks}"
    setup, tests = blocks[0][0].strip(), blocks[1][0].strip()
    assert "pip install" in setup and re.search(r"\bspeclab demo$", setup), setup
    assert re.search(r"\bpytest\b", tests), tests
    r = run(["bash", ROOT / ".ci" / "run", "--dry-run"], cwd=ROOT)
    assert r.returncode == 0, output(r)
    assert f"setup command: {blocks[0][0]}" in r.stdout.splitlines(), r.stdout
    assert f"test command:  {blocks[1][0]}" in r.stdout.splitlines(), r.stdout


def test_make_readme_renders_code_cells(tmp_path):
    "Code cells: directives stripped, `#| hide` cells dropped, text outputs kept, images dropped."
    spec = importlib.util.spec_from_file_location("make_readme", ROOT / "tools" / "make_readme.py")
    mr = importlib.util.module_from_spec(spec); spec.loader.exec_module(mr)
    cells = [
        {"cell_type": "markdown", "source": ["# t\n", "text"]},
        {"cell_type": "code", "source": "#| hide\nfrom secret import *", "outputs": []},
        {"cell_type": "code", "source": ["#| echo: true\n", "1+1"], "outputs": [
            {"output_type": "execute_result", "data": {"text/plain": ["2"], "image/png": "AAA"}}]},
        {"cell_type": "code", "source": "print('hi')", "outputs": [{"output_type": "stream", "text": "hi\n"}]},
    ]
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": cells}))
    body = mr.render(nb).split("\n", 2)[2]
    assert body == "# t\ntext\n\n```python\n1+1\n```\n\n```\n2\n```\n\n```python\nprint('hi')\n```\n\n```\nhi\n```\n"


# --- CLI and packaging -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arg", ["--help", "--version"])
def test_cli(arg, tmp_path, settings):
    exe = BIN / "speclab"
    assert exe.exists(), f"{exe} missing: install the package with `pip install -e '.[dev]'`"
    r = run([exe, arg], cwd=tmp_path)
    assert r.returncode == 0, output(r)
    assert (settings["version"] if arg == "--version" else "proof") in r.stdout, output(r)


def _dist_info(z: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in z.namelist() if re.fullmatch(rf"speclab-[^/]+\.dist-info/{name}", n)]
    return z.read(path).decode()


@pytest.mark.slow
def test_wheel_builds_and_installs_without_dev_tools(tmp_path, repo_files, settings):
    from packaging.requirements import Requirement
    src, dist = copy_repo(tmp_path / "src", repo_files), tmp_path / "dist"
    r = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist], cwd=src, timeout=900)
    assert r.returncode == 0, f"wheel build failed\n{output(r)}"
    (wheel,) = dist.glob("speclab-*.whl")

    with zipfile.ZipFile(wheel) as z:
        names, meta, eps = set(z.namelist()), _dist_info(z, "METADATA"), _dist_info(z, "entry_points.txt")
    assert {"speclab/__init__.py", "speclab/proof.py", "speclab/roofline.py",
            "speclab/data/configs/llama-3-8b.json", "speclab/data/configs/llama-3.2-1b.json",
            "speclab/data/tiny-pair/train_log.json"} <= names, sorted(names)
    for m in ("target", "draft"):
        assert {f"speclab/data/tiny-pair/{m}/{f}" for f in ("config.json", "model.safetensors", "tokenizer.json")} <= names
    ep = ConfigParser(delimiters=["="]); ep.read_string(eps)
    assert "speclab" in ep["console_scripts"], eps
    target = ep["console_scripts"]["speclab"].split(":")[0]
    assert target.replace(".", "/") + ".py" in names, f"entry point {target} is not in the wheel"
    leaked = [line for line in re.findall(r"^Requires-Dist: (.*)$", meta, re.M)
              if Requirement(line).name.lower() in DEV_ONLY and 'extra == "dev"' not in str(Requirement(line).marker)]
    assert not leaked, f"dev tools are runtime requirements of the wheel: {leaked}"

    venv, cwd = tmp_path / "venv", tmp_path / "elsewhere"  # cwd without speclab/ so the source tree can't leak in
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # a bare venv (no pip, no setuptools: only what the wheel brings), which the pip running this test installs into
    # (`--python`): ensurepip's copy of pip there would cost about 6 CPU-s and is not what the test is about
    r = run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=cwd, env=env)
    assert r.returncode == 0, output(r)
    # --no-compile: no bytecode for every installed file up front (torch alone has thousands); what runs compiles its
    # own, as it imports. -c constraints.txt: the versions CI runs (the wheel itself asks for ranges, under which pip
    # would take the newest torch: on Linux, the CUDA build and its gigabytes of nvidia-* wheels)
    r = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet", "--no-compile",
             "-c", ROOT / "constraints.txt", wheel], cwd=cwd, env=env, timeout=1800)
    assert r.returncode == 0, f"pip install of the wheel failed\n{output(r)}"

    r = run([venv / "bin" / "python", "-c", "import speclab, speclab.proof; print(speclab.__file__)\n"
             "from speclab.roofline import ModelSpec; assert ModelSpec.load('llama-3-8b').streamed_params > 7e9"], cwd=cwd, env=env)
    assert r.returncode == 0, output(r)
    assert str(venv) in r.stdout, f"imported speclab from outside the fresh venv: {r.stdout}"
    for mod in ["nbdev", "fastcore", "execnb", "jupyter_core", "notebook"]:
        r = run([venv / "bin" / "python", "-c", f"import {mod}"], cwd=cwd, env=env)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, f"{mod} is installed with the wheel"
    r = run([venv / "bin" / "speclab", "--version"], cwd=cwd, env=env)
    assert r.returncode == 0 and settings["version"] in r.stdout, output(r)
    r = run([venv / "bin" / "speclab", "demo", "--max-tokens", "12"], cwd=cwd, env=env, timeout=600)  # the shipped pair, installed
    assert r.returncode == 0 and "greedy outputs identical to plain decoding: yes" in r.stdout, output(r)


def _style_violations(path: Path) -> list[str]:
    "Lines of an exported module over 120 characters, or holding more than one statement."
    text = path.read_text()
    bad = []
    in_all = False
    for i, line in enumerate(text.splitlines(), 1):
        in_all = line.startswith("__all__ = [") or (in_all and line.startswith(" "))
        if len(line) > 120 and not in_all:  # nbdev wraps __all__ at 120 and then prefixes it: not ours to fix
            bad.append(f"{path.name}:{i}: {len(line)} characters")
    seen, headers = {}, set()
    for node in ast.walk(ast.parse(text)):  # parents come before their children
        if not isinstance(node, ast.stmt):
            continue
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(body, list) and body and body[0].lineno == node.lineno:
                bad.append(f"{path.name}:{node.lineno}: a body on its header's line")
                headers.add(node.lineno)
        if node.lineno in seen and node.lineno not in headers:
            bad.append(f"{path.name}:{node.lineno}: two statements on one line")
        seen.setdefault(node.lineno, node)
    return sorted(set(bad))


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "speclab").glob("*.py") if p.name != "_modidx.py"))
def test_exported_code_style(module):
    "One statement a line, lines under 120 characters, in every module the notebooks export."
    bad = _style_violations(ROOT / "speclab" / module)
    assert not bad, "\n".join(bad[:40]) + (f"\n... and {len(bad) - 40} more" if len(bad) > 40 else "")


def _untyped(path: Path) -> list[str]:
    "Public functions of a module (its __all__) and public methods of its public classes that lack type hints."
    tree = ast.parse(path.read_text())
    public = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            public = {e.value for e in node.value.elts}
    bad = []

    def check(fn, owner=""):
        if fn.name.startswith("_") and fn.name != "__init__":
            return
        args = [a for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
        missing = [a.arg for a in args if a.annotation is None]
        if fn.returns is None and fn.name != "__init__":
            missing.append("return")
        if missing:
            bad.append(f"{path.name}: {owner}{fn.name} lacks hints for {', '.join(missing)}")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in public:
            check(node)
        if isinstance(node, ast.ClassDef) and node.name in public:
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    check(f, node.name + ".")
    return bad


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "speclab").glob("*.py") if p.name != "_modidx.py"))
def test_public_api_is_typed(module):
    "Every public function and method the notebooks export has type hints on its arguments and its return."
    bad = _untyped(ROOT / "speclab" / module)
    assert not bad, "\n".join(bad)
