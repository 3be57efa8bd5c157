"""Packaging: `pip install speclab` takes ranges, so it installs into a user's environment and keeps the torch and
transformers already there; the exact versions CI runs live in constraints.txt (written by tools/pins.py), which the
README's set-up command passes to pip, and which must resolve with PyPI alone on every Python speclab claims.

The tests marked `network` ask PyPI (the set-up a stranger's machine sees); everything else reads files.
"""
import json
import os
import re
import subprocess
import sys
from configparser import ConfigParser
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import pins  # noqa: E402  (tools/pins.py: writes constraints.txt; its stranger's environment for pip)

CONSTRAINTS = ROOT / "constraints.txt"
MATRIX = ROOT / "benchmarks" / "setup" / "install_matrix.json"
# newer releases break nbdev 2 (design.md): these stay exact in settings.ini's dev extra as well
NBDEV_PINS = {"nbdev": "2.4.14", "fastcore": "1.14.5", "execnb": "0.1.18", "ghapi": "2.0.3"}
# The platforms speclab claims, as environment markers see them (PEP 508), for every claimed Python below.
PLATFORMS = {
    "linux-x86_64": dict(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix"),
    "macos-arm64": dict(sys_platform="darwin", platform_system="Darwin", platform_machine="arm64", os_name="posix"),
    "windows-amd64": dict(sys_platform="win32", platform_system="Windows", platform_machine="AMD64", os_name="nt"),
}
# uv's names for the two platforms CI cannot run on (`uv pip compile --python-platform`)
UV_PLATFORMS = {"macos-arm64": "aarch64-apple-darwin", "windows-amd64": "x86_64-pc-windows-msvc"}
# Distributions only PyPI's CUDA build of torch pulls in: pinned (PyPI's torch pins them), absent beside a CPU torch.
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-)")


def settings() -> dict:
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]


def requirements(key: str = "requirements") -> list[Requirement]:
    return [Requirement(r) for r in settings().get(key, "").split()]


def public(version: str) -> str:
    "2.13.0+cpu -> 2.13.0: a constraint with a local label would match only one build."
    return Version(version).public


def marker_env(python: str, platform: str = "linux-x86_64") -> dict:
    "The marker environment of CPython `python` (3.10, or 3.11.4: uv may fork at a patch) on PLATFORMS[platform]."
    full = python if python.count(".") == 2 else f"{python}.0"
    return {**default_environment(), **PLATFORMS[platform], "python_version": ".".join(full.split(".")[:2]),
            "python_full_version": full, "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def patch_releases(python: str) -> list[str]:
    "The first and a late patch release of `python` (3.11 -> 3.11.0, 3.11.99): the pins must serve both."
    return [f"{python}.0", f"{python}.99"]


def closure(name: str = "speclab", extras: tuple = ("dev",)) -> dict:
    "{canonical name: installed public version} of every distribution `name[extras]` needs here, `name` left out."
    env = default_environment()
    found, todo = {}, [(name, set(extras))]
    seen = set()
    while todo:
        dist, want = todo.pop()
        key = (canonicalize_name(dist), frozenset(want))
        if key in seen:
            continue
        seen.add(key)
        for text in distribution(dist).requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in {"", *want}):
                continue
            try:
                found[canonicalize_name(req.name)] = public(distribution(req.name).version)
            except PackageNotFoundError:
                raise RuntimeError(f"{dist} needs {req}, which is not installed in this venv") from None
            todo.append((req.name, set(req.extras)))
    found.pop(canonicalize_name(name), None)
    return dict(sorted(found.items()))


def constraint_lines(path: Path = CONSTRAINTS) -> list[Requirement]:
    "constraints.txt's lines: each an exact `name==version`, with or without an environment marker."
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            ops = [(s.operator, s.version) for s in req.specifier]
            assert len(ops) == 1 and ops[0][0] == "==" and not req.extras, f"not an exact pin: {line!r}"
            out.append(req)
    return out


def read_constraints(path: Path = CONSTRAINTS, env: dict | None = None) -> dict:
    "{canonical name: version} of the pins that apply in `env` (default: this interpreter); each name at most once."
    env = default_environment() if env is None else env
    pins_here = {}
    for req in constraint_lines(path):
        if req.marker is None or req.marker.evaluate(env):
            name = canonicalize_name(req.name)
            assert name not in pins_here, f"constraints.txt pins {req.name} twice where {env['python_version']} runs"
            pins_here[name] = next(iter(req.specifier)).version
    return pins_here


def wheel_requirements() -> list[str]:
    "The Requires-Dist lines setup.py gives the wheel, without building it (setup.py run with setup() captured)."
    code = ("import json, setuptools, sys\n"
            "setuptools.setup = lambda **kw: print(json.dumps({k: kw[k] for k in "
            "('install_requires', 'extras_require', 'python_requires', 'classifiers')}))\n"
            "sys.argv = ['setup.py']\n"
            "exec(compile(open('setup.py').read(), 'setup.py', 'exec'),\n"
            "     {'__file__': 'setup.py', '__name__': '__main__'})")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


SETUP = wheel_requirements()


# ------------------------------------------------------------------------------------------------ the ranges
def test_library_requirements_are_ranges():
    """No exact pin among the library's requirements: each has a lower and an upper bound, so pip neither downgrades
    a user's newer torch within the major nor lets the next major in; setup.py hands them to the wheel unchanged."""
    reqs = requirements()
    assert [str(r) for r in map(Requirement, SETUP["install_requires"])] == [str(r) for r in reqs]
    names = {canonicalize_name(r.name) for r in reqs}
    assert {"torch", "transformers", "numpy", "fastapi", "uvicorn", "httpx"} <= names, names
    for r in reqs:
        ops = {s.operator for s in r.specifier}
        assert not ops & {"==", "===", "~="}, f"{r}: an exact pin in the library's requirements"
        assert ">=" in ops and "<" in ops, f"{r}: wants a lower (>=) and an upper (<) bound"


def test_ranges_admit_what_users_have():
    """A user's newer torch 2.x and transformers 5.x are accepted; the next majors, and a transformers 4 (whose
    tokenizers lack TokenizersBackend), are not."""
    spec = {canonicalize_name(r.name): r.specifier for r in requirements()}
    assert "2.15.0" in spec["torch"] and "2.5.0" in spec["torch"] and "3.0.0" not in spec["torch"]
    assert "2.4.1" not in spec["torch"]
    assert "5.25.0" in spec["transformers"] and "5.0.0" in spec["transformers"]
    assert "4.57.6" not in spec["transformers"] and "6.0" not in spec["transformers"]


def test_triton_is_for_linux_only():
    "Triton has wheels for Linux only (speclab imports it only for --backend triton): elsewhere pip must skip it."
    (triton,) = [r for r in requirements() if r.name == "triton"]
    assert triton.marker is not None
    assert triton.marker.evaluate({**default_environment(), "platform_system": "Linux"})
    for system in ("Darwin", "Windows"):
        assert not triton.marker.evaluate({**default_environment(), "platform_system": system}), system


def test_speclab_imports_triton_only_for_the_kernels():
    "The marker above is safe only while no module but speclab.kernels imports triton at import time."
    bad = [p.name for p in (ROOT / "speclab").glob("*.py") if p.name != "kernels.py"
           and re.search(r"^(import triton|from triton)", p.read_text(encoding="utf-8"), re.M)]
    assert not bad, f"these modules import triton at the top: {bad}"


def third_party_imports() -> dict:
    "{top-level module: [speclab files]} of every import in speclab/*.py that is neither stdlib nor speclab."
    import ast
    found = {}
    for path in sorted((ROOT / "speclab").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"speclab"}:
                found.setdefault(top, []).append(path.name)
    return found


def test_every_import_comes_with_the_library():
    """Every third-party module speclab's code imports is installed by `pip install speclab` alone (a requirement, or
    one of theirs), never only by an extra: pydantic, used directly by Chapter 11, was once missing."""
    from importlib.metadata import packages_distributions
    owners, runtime = packages_distributions(), set(closure(extras=()))
    direct = {canonicalize_name(r.name) for r in requirements()}
    missing = {m: files for m, files in third_party_imports().items()
               if not {canonicalize_name(d) for d in owners.get(m, [m])} & (runtime | direct)}
    assert not missing, f"imported by speclab, not installed with it (add to settings.ini's requirements): {missing}"
    assert "pydantic" in direct, "speclab.serve uses pydantic 2's API (model_dump, ConfigDict): declare pydantic>=2"


def claimed_pythons() -> list[str]:
    "The Python versions the wheel's classifiers claim (3.10, 3.11, ...)."
    return [c.rsplit(" ", 1)[1] for c in SETUP["classifiers"]
            if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]


def test_nbdev_trio_stays_exact():
    "nbdev 2.4.14 works only with these exact versions (design.md): the dev extra pins them, and so does CI."
    dev = {canonicalize_name(r.name): str(r.specifier) for r in requirements("dev_requirements")}
    for python in [p for v in claimed_pythons() for p in patch_releases(v)]:
        pinned = read_constraints(env=marker_env(python))
        for name, version in NBDEV_PINS.items():
            assert dev[name] == f"=={version}" and pinned[name] == version, (python, name)


# ------------------------------------------------------------------------------------------------ constraints.txt
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_constraints_cover_every_requirement_inside_its_range(platform):
    """On every claimed Python and platform, every requirement of settings.ini (library and every extra) that
    applies there is pinned exactly once, at a version its range allows: pip has nothing left to choose."""
    for python in [p for v in claimed_pythons() for p in patch_releases(v)]:
        env = marker_env(python, platform)
        pinned = read_constraints(env=env)
        for key in ("requirements", "dev_requirements", "docs_requirements", "instructor_requirements"):
            for r in requirements(key):
                if r.marker is not None and not r.marker.evaluate(env):
                    continue
                name = canonicalize_name(r.name)
                assert name in pinned, f"{python} {platform}: {key}: {r} has no pin in constraints.txt"
                assert r.specifier.contains(pinned[name], prereleases=True), (
                    f"{python} {platform}: {key}: {r} excludes its pin {pinned[name]}")


def test_constraints_are_what_this_venv_runs():
    """constraints.txt pins exactly the distributions speclab[dev] pulls into this venv, at the installed versions:
    CI installs with it, so a drift means CI tests versions nobody recorded. The only pins this venv may lack are
    the CUDA libraries that PyPI's torch needs and a CPU build of torch does not."""
    pinned, here = read_constraints(), closure()
    missing = sorted(here.keys() - pinned.keys())
    extra = sorted(k for k in pinned.keys() - here.keys() if not CUDA_ONLY.match(k))
    differ = {k: (pinned[k], here[k]) for k in pinned.keys() & here.keys() if pinned[k] != here[k]}
    assert not missing and not extra and not differ, (
        f"constraints.txt is out of step with this venv: not pinned {missing}; pinned but not needed {extra}; "
        f"pinned != installed {differ}. Reinstall with the README's set-up command, or run tools/pins.py")


def test_constraints_header_says_how_to_regenerate():
    "The file says what it is and how it is written; tools/pins.py writes the same header."
    text = CONSTRAINTS.read_text(encoding="utf-8")
    assert text.startswith(pins.HEADER.format(min_python=settings()["min_python"])), text[:400]
    assert "tools/pins.py" in text.split("\n\n")[0]


@pytest.mark.slow
@pytest.mark.network
def test_pins_script_writes_this_file():
    """tools/pins.py, re-run against PyPI with the committed file as its preference, writes constraints.txt
    unchanged: the file is the script's output, not a hand edit, and every pin in it still resolves."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "pins.py"), "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


def readme_setup_pip_args() -> list[str]:
    "The arguments of the README's set-up command's `pip install` (which .ci/run runs verbatim)."
    import shlex
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Two commands[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S).group(1)
    setup = re.findall(r"^```sh[ \t]*\n(.*?)^```", section, re.M | re.S)[0].strip()
    install = next(part for part in setup.split("&&") if "pip install" in part)
    words = shlex.split(install)
    return words[words.index("install") + 1:]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_setup_resolves_with_pypi_alone(python, tmp_path):
    """The README's set-up command, as a stranger's machine runs it: a fresh venv of this Python, its own pip,
    `--isolated`, no configuration file and PyPI as the only index, resolved with `--dry-run`. A resolver error
    fails the test with pip's own message. Everything pip would install comes from PyPI, and torch is PyPI's."""
    if python not in claimed_pythons():
        pytest.skip(f"speclab does not claim Python {python}")
    exe = pins.find_python(python)
    if exe is None:
        pytest.skip(f"no Python {python} on this machine")
    venv = tmp_path / "venv"
    subprocess.run([exe, "-m", "venv", str(venv)], check=True, timeout=300)
    report = tmp_path / "report.json"
    cmd = [str(venv / "bin" / "pip"), "install", "--isolated", "--dry-run", "--quiet", "--report", str(report),
           *readme_setup_pip_args()]
    r = subprocess.run(cmd, cwd=ROOT, env=pins.pypi_only_env(), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"Python {python}: the README's set-up does not resolve with PyPI alone:\n{r.stderr}"
    data = json.loads(report.read_text())
    got = {canonicalize_name(i["metadata"]["name"]): i for i in data["install"]}
    local = [n for n, i in got.items() if n != "speclab" and not i["download_info"]["url"].startswith("https://")]
    assert not local, f"Python {python}: from outside PyPI: {local}"
    pinned = read_constraints(env=data["environment"])
    assert got["torch"]["metadata"]["version"] == pinned["torch"], got["torch"]["metadata"]["version"]
    differ = {n: (i["metadata"]["version"], pinned.get(n)) for n, i in got.items()
              if n != "speclab" and public(i["metadata"]["version"]) != pinned.get(n)}
    assert not differ, f"Python {python}: pip would install versions constraints.txt does not pin: {differ}"


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("platform", sorted(UV_PLATFORMS))
def test_setup_resolves_for_macos_and_windows(platform, tmp_path):
    """macOS on Apple silicon and Windows cannot run here, but their resolution can: uv resolves speclab[dev] with
    the constraints for each claimed Python on that platform, wheels only, markers evaluated for that platform
    (pip's `--platform` evaluates markers for the machine it runs on). The result must be the pins themselves."""
    for python in claimed_pythons():
        out = tmp_path / f"{python}.txt"
        cmd = pins.uv_command() + ["pip", "compile", "pyproject.toml", "--extra", "dev", "-c", str(CONSTRAINTS),
                                   "--python-platform", UV_PLATFORMS[platform], "--python-version", python,
                                   "--only-binary", ":all:", "--no-config", "--no-python-downloads", "--index-url",
                                   pins.PYPI, "--no-annotate", "--no-header", "-o", str(out)]
        env = {**pins.clean_env(), "MACOSX_DEPLOYMENT_TARGET": "14.0"}   # Apple silicon's torch wheels: macOS 14
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{platform}, Python {python}: does not resolve:\n{r.stderr[-4000:]}"
        pinned = read_constraints(env=marker_env(python, platform))
        got = {canonicalize_name(q.name): next(iter(q.specifier)).version for q in constraint_lines(out)}
        differ = {n: (v, pinned.get(n)) for n, v in got.items() if pinned.get(n) != v}
        assert not differ, f"{platform}, Python {python}: resolved outside the pins: {differ}"


# ------------------------------------------------------------------------------------------------ Python versions
def test_python_requires_is_min_python():
    "The wheel's Requires-Python, its classifiers and pyproject.toml all say settings.ini's min_python."
    low = settings()["min_python"]
    assert SETUP["python_requires"] == f">={low}"
    versions = [c.rsplit(" ", 1)[1] for c in SETUP["classifiers"] if c.startswith("Programming Language :: Python ::")
                and re.fullmatch(r"3\.\d+", c.rsplit(" ", 1)[1])]
    assert versions and versions[0] == low, versions
    assert f'requires-python=">={low}"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def passed(row: dict) -> bool:
    "A matrix row whose install, demo (greedy outputs identical), Triton kernels and server all passed."
    return ("error" not in row and row["install_rc"] == 0 and row["demo"]["rc"] == 0 and row["demo"]["identical"]
            and row["triton_backend"]["ok"] and row["serve"]["ok"])


def matrix_rows() -> list:
    if not MATRIX.exists():
        pytest.fail(f"{MATRIX.relative_to(ROOT)} is missing: run benchmarks/setup/install_matrix.py")
    return json.loads(MATRIX.read_text(encoding="utf-8"))["rows"]


def test_claimed_pythons_were_measured():
    """Every Python the classifiers claim has a `fresh` row in the install matrix where the wheel installed and
    `speclab demo` passed, and min_python is the oldest such Python: no claim without a measurement."""
    rows = matrix_rows()
    ok = {".".join(r["python"].split(".")[:2]) for r in rows if r.get("kind") == "fresh" and passed(r)}
    claimed = [c.rsplit(" ", 1)[1] for c in SETUP["classifiers"]
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert set(claimed) <= ok, f"claimed but not measured to work: {sorted(set(claimed) - ok)}"
    assert min(ok, key=lambda v: tuple(map(int, v.split(".")))) == settings()["min_python"], ok


def test_matrix_kept_a_users_torch():
    """The matrix's torch-kept row: a venv that already had torch kept it (same version, build, file and mtime;
    pip neither installed nor downloaded a torch), and speclab worked beside it."""
    rows = [r for r in matrix_rows() if r.get("kind") == "torch-kept"]
    assert len(rows) == 1, f"want one torch-kept row in {MATRIX.name}, found {len(rows)}"
    row = rows[0]
    assert row.get("torch_kept") is True and passed(row), row.get("error", row.get("torch"))
    before, after = row["torch_before"], row["torch"]
    assert all(before[k] == after[k] for k in ("version", "cuda", "file", "mtime_ns")), (before, after)
    assert "torch" not in {d["name"] for d in row["installed"]} and not row["pip_downloaded_torch"]


def test_matrix_ran_the_lower_bounds():
    """The matrix's floor row installed, for every library requirement, the minor release of settings.ini's lower
    bound (torch: the script's stated exception), and passed: a bound moved without a new measurement fails here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("install_matrix", ROOT / "benchmarks" / "setup" / "install_matrix.py")
    im = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(im)
    rows = [r for r in matrix_rows() if r.get("kind") == "floor"]
    assert len(rows) == 1 and passed(rows[0]), rows and {k: rows[0].get(k) for k in ("error", "demo", "serve")}
    got = {canonicalize_name(d["name"]): d["version"] for d in rows[0]["installed"]}
    for r in requirements():
        low = next(s.version for s in r.specifier if s.operator == ">=")
        series = im.FLOOR_OVERRIDES.get(r.name, low if "." in low else low + ".0")
        name = canonicalize_name(r.name)
        assert name in got and Version(got[name]).release[:2] == Version(series).release[:2], (r, got.get(name))


FRESH = ROOT / "benchmarks" / "setup" / "fresh_setup.json"


def fresh_rows() -> dict:
    if not FRESH.exists():
        pytest.fail(f"{FRESH.relative_to(ROOT)} is missing: run benchmarks/setup/fresh_setup.py")
    return {r["row"]: r for r in json.loads(FRESH.read_text(encoding="utf-8"))["rows"]}


def test_two_commands_ran_end_to_end_with_pypi_alone():
    """The README's claim, measured (benchmarks/setup/fresh_setup.py): on Python 3.12, a fresh clone, PyPI alone, the
    set-up command installed PyPI's CUDA torch and the demo printed its speedup with greedy outputs identical, and
    the test command passed, skipping only what it names (and failing only the tests that read this very record,
    which did not exist yet when it ran)."""
    row = fresh_rows().get("3.12:pypi")
    assert row is not None and "error" not in row, row
    assert row["phases"]["setup"]["rc"] == 0 and row["phases"]["tests"]["rc"] in (0, 1), row["phases"]   # 1: failures
    assert row["torch"]["cuda"] is not None and row["phases"]["setup"]["downloaded_bytes"] > 1e9, row["torch"]
    assert row["demo_line"] and "speedup" in row["demo_line"], row.get("demo_line")
    assert re.search(r"\d+ passed", row["pytest"]), row["pytest"]
    # the run that writes the record cannot pass the tests that read it: those two alone may have failed there
    readers = (test_two_commands_ran_end_to_end_with_pypi_alone, test_cpu_build_first_is_kept)
    self_reading = {f"tests/test_packaging.py::{f.__name__}" for f in readers}
    assert set(row["not_passed"]) <= self_reading, row["not_passed"]


def test_cpu_build_first_is_kept():
    """The README's CPU-only path, measured: with PyTorch's CPU build in the venv first, the set-up command kept it
    (the same version, no CUDA) and fetched no torch, and the demo ran."""
    row = fresh_rows().get("3.11:cpu-first")
    assert row is not None and "error" not in row, row
    assert row["phases"]["setup"]["rc"] == 0 and row["demo_line"], row["phases"]["setup"]["tail"]
    assert row["torch_before"] == row["torch"] and row["torch"]["cuda"] is None, (row["torch_before"], row["torch"])
    assert row["phases"]["setup"]["downloaded_bytes"] < 1e9, row["phases"]["setup"]["downloaded_bytes"]


# ------------------------------------------------------------------------------------------------ the README
def test_readme_setup_command_uses_the_constraints():
    "The README's set-up command (which .ci/run runs verbatim) installs with `-c constraints.txt`."
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Two commands[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S).group(1)
    setup = re.findall(r"^```sh[ \t]*\n(.*?)^```", section, re.M | re.S)[0].strip()
    assert re.search(r"pip install (.* )?(-c|--constraint) constraints\.txt (.* )?-e \"\.\[dev\]\"", setup), setup


if __name__ == "__main__":
    CONSTRAINTS.write_text(render_constraints(), encoding="utf-8")
    print(f"wrote {CONSTRAINTS} ({len(closure())} pins)")
