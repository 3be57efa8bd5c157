"""Chapter 10's Gradescope bundle (`speclab grade --gradescope DIR`), for every lab in labs/*/ with autograder/tests.

The quick tests read the bundle: what the zip holds, what setup.sh and run_autograder say, the frozen versions, and
the wheel (the checkout's own code, importable). The slow tests run it as Gradescope does. In a private mount
namespace a temporary folder is bound over /autograder, and setup.sh builds the image's virtual environment there,
once per test session whatever the xdist workers (a lock in the session's temporary folder): pip reaches the package
index, this machine's pip finds the local CPU torch wheel through its find-links, and an `apt-get` that fails is first
on PATH, so the host is never changed. Then each submission gets a fresh /autograder of its own (the bundle in
source/, the notebook in submission/, the image's environment bound in) and run_autograder grades it with no network
at all: the lab's solution must earn every point, its blank student notebook none, and a hostile one none (the blank
notebook plus a cell that patches doctest's checker, forges results.json at once and from a detached process, and
tries to rewrite the grader's code), with the grader's results.json still in place 5 s later.

What the slow tests leave: an empty /autograder directory on the host (the mount point), and the image (about 2.4 GB)
under pytest's temporary folder, which pytest removes with its old runs. They skip without root or the sandbox, and
where /autograder already holds something (a real Gradescope container).
"""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
import urllib.request
from configparser import ConfigParser
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from speclab.grading import (RUN_AUTOGRADER, build_wheel, frozen_requirements, load_lab, sandbox_problem,
                             secret_seed, write_gradescope)

pytestmark = pytest.mark.xdist_group("gradescope")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted(p for p in (ROOT / "labs").glob("*/") if (p / "autograder" / "tests").is_dir())
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VENV = "/autograder/speclab-venv"


def course_requirements() -> list:
    "settings.ini's requirements of the library (exact pins or ranges), parsed."
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return [Requirement(r) for r in cfg["DEFAULT"]["requirements"].split()]


def course_pins() -> dict:
    "settings.ini's exact pins (`name==X`), if it still has any: {name: version}."
    pins = {}
    for req in course_requirements():
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            pins[canonicalize_name(req.name)] = specs[0].version
    return pins


TORCH = version("torch").split("+")[0]          # the torch speclab runs with here, less its +cpu label


def cpu_torch_source() -> str | None:
    """Where setup.sh would find PyTorch's CPU build of TORCH for this Python: a find-links folder of pip's
    configuration (or PIP_FIND_LINKS) holding its wheel, or PyTorch's CPU index if it answers; None if neither, as on
    a machine that reaches PyPI alone (PyPI's Linux torch is the CUDA build, which setup.sh never installs)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    folders = " ".join(re.findall(r"find-links='([^']*)'", listed) + [os.environ.get("PIP_FIND_LINKS", "")])
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders.split():
        if any(Path(folder).glob(f"torch-{TORCH}+cpu-{tag}-*.whl")):
            return folder
    try:
        urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=15).close()
        return CPU_INDEX
    except OSError:
        return None


def files_under(folder: Path) -> list:
    "Relative posix paths of the files under `folder`, sorted."
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    "speclab's wheel, built once from this checkout."
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def bundles(wheel, tmp_path_factory):
    "{lab folder name: its autograder.zip}, every lab bundled with the same wheel."
    out = tmp_path_factory.mktemp("bundles")
    return {lab.name: write_gradescope(load_lab(lab), out / lab.name, wheel=wheel) for lab in LABS}


# ------------------------------------------------------------------------------------------------ quick tests
def test_there_is_a_lab():
    "The bundle tests cover every lab; Lab 08 at least is there."
    assert "08_acceptance" in [lab.name for lab in LABS]


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_bundle_holds_scripts_wheel_pins_and_the_lab(lab, bundles):
    """The zip holds exactly the unpacked folder (less itself): the two scripts (executable), constraints.txt, one
    speclab wheel and the lab's autograder/ folder, every test included; nothing of student/ or the master."""
    bundle = bundles[lab.name]
    z = zipfile.ZipFile(bundle)
    names = sorted(z.namelist())
    assert names == [n for n in files_under(bundle.parent) if n != "autograder.zip"]
    for name in names:
        assert z.read(name) == (bundle.parent / name).read_bytes(), name
    lab_files = [f"lab/autograder/{n}" for n in files_under(lab / "autograder") if "__pycache__" not in n]
    wheels = [n for n in names if n.startswith("wheels/")]
    assert names == sorted(["constraints.txt", "run_autograder", "setup.sh", *wheels, *lab_files])
    assert len(wheels) == 1 and wheels[0].startswith(f"wheels/speclab-{version('speclab')}-")
    assert any(n.startswith("lab/autograder/tests/") for n in names)
    modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert modes["setup.sh"] == modes["run_autograder"] == 0o100755
    assert all(m == 0o100644 for n, m in modes.items() if n not in ("setup.sh", "run_autograder"))


def test_setup_sh_installs_the_bundled_wheel_with_cpu_torch(bundles):
    """setup.sh installs torch alone at the installed version (no index first, then PyTorch's CPU index), then the
    bundled wheel under constraints.txt, into /autograder/speclab-venv; never `pip install speclab` from an index; it
    is valid bash, and the same for every lab (so one environment stands for all)."""
    texts = {name: (b.parent / "setup.sh").read_text() for name, b in bundles.items()}
    text = texts["08_acceptance"]
    assert set(texts.values()) == {text}
    assert f"torch_pin='torch=={TORCH}'" in text
    assert f"frozen_on='{sys.version_info.major}.{sys.version_info.minor}'" in text
    assert f"venv={VENV}\n" in text
    assert '--no-deps --no-index --find-links "$here/wheels" "$torch_pin"' in text
    assert f"cpu_index={CPU_INDEX}\n" in text and '--no-deps --index-url "$cpu_index" "$torch_pin"' in text
    assert '--constraint "$here/constraints.txt" "$here"/wheels/speclab-*.whl' in text
    assert "install speclab" not in text and "@TORCH_PIN@" not in text and "@PYTHON@" not in text
    for b in bundles.values():
        assert subprocess.run(["bash", "-n", str(b.parent / "setup.sh")]).returncode == 0
        assert subprocess.run(["bash", "-n", str(b.parent / "run_autograder")]).returncode == 0


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_run_autograder_grades_with_the_venv(lab, bundles):
    "run_autograder runs the venv's `speclab grade` on the lab's notebook name, into /autograder/results/results.json."
    text = (bundles[lab.name].parent / "run_autograder").read_text()
    notebook = next((lab / "autograder").glob("*.ipynb")).name
    assert f"submission=/autograder/submission/'{notebook}'\n" in text
    assert f"{VENV}/bin/speclab grade \"$submission\" --lab /autograder/source/lab" in text
    assert "--out /autograder/results/results.json" in text
    assert RUN_AUTOGRADER.replace("@NOTEBOOK@", notebook) == text


def test_constraints_pin_what_speclab_runs_with(bundles):
    """constraints.txt pins every installed distribution speclab needs (torch aside: setup.sh pins it) at the version
    installed here (the header names this Python); the course's own pins agree with it."""
    lines = (bundles["08_acceptance"].parent / "constraints.txt").read_text().splitlines()
    assert lines[0].startswith("#") and f"(Python {sys.version_info.major}.{sys.version_info.minor})" in lines[0]
    pins = lines[1:]
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==[^ ;]+", line) for line in pins), pins
    frozen = dict(line.split("==") for line in pins)
    assert "torch" not in frozen and "speclab" not in frozen
    assert frozen == {k: v for k, v in (r.split("==") for r in frozen_requirements()) if k != "torch"}
    for name in ("numpy", "scipy", "triton", "transformers", "matplotlib", "tqdm", "filelock"):
        assert frozen[name] == version(name), name
    for name, pinned in course_pins().items():
        if name != "torch":
            assert frozen[name] == pinned, name


@pytest.mark.skipif(not (ROOT / "constraints.txt").is_file(), reason="no constraints.txt at the project root")
def test_bundle_pins_agree_with_the_project_constraints(bundles):
    """The project's constraints.txt (the exact versions CI runs) pins each of speclab's run-time dependencies, torch
    included, at the version the bundle freezes: the bundle grades with CI's versions."""
    project = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].split(";")[0].strip()
        if "==" in line:
            name, pinned = line.split("==")
            project[canonicalize_name(name)] = pinned.strip()
    text = (bundles["08_acceptance"].parent / "constraints.txt").read_text().splitlines()
    bundle = dict(line.split("==") for line in text if not line.startswith("#"))
    bundle["torch"] = re.search(r"torch_pin='torch==([^']+)'",
                                (bundles["08_acceptance"].parent / "setup.sh").read_text()).group(1)
    differ = {name: (pinned, project.get(name)) for name, pinned in bundle.items() if project.get(name) != pinned}
    assert not differ, f"bundle's version vs constraints.txt's (None: not pinned there): {differ}"


def test_wheel_is_this_checkout_and_importable(wheel, tmp_path):
    """The wheel holds this checkout's speclab byte for byte (every module, the shipped model pair's files), requires
    settings.ini's requirements, and imports from where it is unpacked, in an isolated interpreter."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path)
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    checkout = [n for n in files_under(ROOT / "speclab") if "__pycache__" not in n]
    assert files_under(tmp_path / "speclab") == checkout
    for name in checkout:
        assert (tmp_path / "speclab" / name).read_bytes() == (ROOT / "speclab" / name).read_bytes(), name
    listed = [Requirement(line.split(":", 1)[1]) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    for req in course_requirements():
        assert req in listed, req
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import speclab, speclab.grading; "
            "print(speclab.__file__, speclab.__version__, speclab.grading.write_gradescope.__name__)")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path / "speclab" / "__init__.py"), version("speclab"), "write_gradescope"]


def test_bad_input_changes_nothing(wheel, tmp_path):
    "A folder holding other files, or a wheel that is not speclab's, is refused by name before anything is written."
    lab = load_lab(ROOT / "labs" / "08_acceptance")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="out must be"):
        write_gradescope(lab, tmp_path / "mine", wheel=wheel)
    assert files_under(tmp_path / "mine") == ["notes.txt"]
    (tmp_path / "other.whl").write_bytes(b"PK")
    for bad in (tmp_path / "other.whl", tmp_path / "missing" / "speclab-0.1.0-py3-none-any.whl"):
        with pytest.raises(ValueError, match="wheel must be"):
            write_gradescope(lab, tmp_path / "new", wheel=bad)
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="source must be a speclab checkout"):
        build_wheel(tmp_path / "w", source=tmp_path)


def test_rewriting_a_bundle_replaces_it(wheel, tmp_path):
    "Writing a bundle over an earlier one gives the same zip, byte for byte (sorted, fixed timestamps)."
    lab = load_lab(ROOT / "labs" / "08_acceptance")
    first = write_gradescope(lab, tmp_path / "gs", wheel=wheel).read_bytes()
    (tmp_path / "gs" / "lab" / "autograder" / "stale.txt").write_text("from an older bundle")
    assert write_gradescope(lab, tmp_path / "gs", wheel=wheel).read_bytes() == first


def test_a_secret_reseeds_the_hidden_exactness_cases_of_the_bundle_only(wheel, tmp_path):
    """With the instructor's secret, the bundle's hidden exactness cases take seeds derived from it (the same secret,
    the same seeds), every other case is unchanged, the lab in the repository is untouched, and a secret inside the
    repository is refused before anything is written."""
    folder = ROOT / "labs" / "08_acceptance"
    before = {p.name: p.read_bytes() for p in (folder / "autograder" / "tests").glob("*.py")}
    lab = load_lab(folder)
    secret = tmp_path / "secret"
    secret.write_bytes(b"an instructor's words")
    seeds = []
    for k in range(2):
        bundled = load_lab(write_gradescope(lab, tmp_path / f"gs{k}", wheel=wheel, secret=secret).parent / "lab")
        seeds.append({c.name: c.draws["seed"] for c in bundled.cases if c.draws and c.hidden})
        assert [c for c in bundled.cases if not (c.draws and c.hidden)] == [c for c in lab.cases
                                                                            if not (c.draws and c.hidden)]
    original = {c.name: c.draws["seed"] for c in lab.cases if c.draws and c.hidden}
    assert len(original) >= 4 and seeds[0] == seeds[1] and seeds[0].keys() == original.keys()
    assert all(seeds[0][name] == secret_seed(secret.read_bytes(), name.split()[0], int(name.split()[-1]))
               for name in original)
    assert not set(seeds[0].values()) & set(original.values())
    assert {p.name: p.read_bytes() for p in (folder / "autograder" / "tests").glob("*.py")} == before
    inside = folder / "secret.txt"
    inside.write_text("published with the repository")
    try:
        with pytest.raises(ValueError, match="secret must lie outside the repository"):
            write_gradescope(lab, tmp_path / "refused", wheel=wheel, secret=inside)
    finally:
        inside.unlink()
    assert not (tmp_path / "refused").exists()


# ---------------------------------------------------------------------------------- Gradescope, as it runs it
PROBLEM = sandbox_problem()
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"     # the image's own python3, as Gradescope


def in_autograder(root: Path, script: str, venv: Path | None, timeout: float, log: Path) -> int:
    """Run `script` (bash) with `root` bound over /autograder in a private mount namespace; with `venv` (the image's
    environment, bound over /autograder/speclab-venv) also without network, as a submission is graded."""
    fake = root.parent / "no-apt"
    fake.mkdir(exist_ok=True)
    (fake / "apt-get").write_text('#!/bin/sh\necho "apt-get is not allowed in this test: $*" >&2\nexit 1\n')
    (fake / "apt-get").chmod(0o755)
    env = {"PATH": f"{fake}:{HOST_PATH}", "HOME": "/root", "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    mounts = f"mount --bind {root} /autograder"
    if venv is not None:
        (root / "speclab-venv").mkdir(exist_ok=True)
        mounts += f"; mount --bind {venv} /autograder/speclab-venv; ip link set lo up"
    argv = ["unshare", "--mount", "--propagation", "private", *(["--net"] if venv is not None else []), "--",
            "bash", "-c", f"set -e; {mounts}; {script}"]
    with log.open("w") as f:
        return subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode


def build_image(bundle: Path, base: Path) -> dict:
    "Unpack `bundle` in base/autograder/source and run its setup.sh there: {seconds, returncode, log}."
    root = base / "autograder"
    shutil.rmtree(base, ignore_errors=True)
    (root / "source").mkdir(parents=True)
    subprocess.run(["unzip", "-q", str(bundle), "-d", str(root / "source")], check=True)
    t0 = time.monotonic()
    code = in_autograder(root, "cd /autograder/source && bash ./setup.sh", None, 1800, base / "setup.log")
    return dict(seconds=time.monotonic() - t0, returncode=code, log=(base / "setup.log").read_text())


@pytest.fixture(scope="module")
def image(bundles, tmp_path_factory):
    """setup.sh run once per test session, whatever the workers (a lock in the session's shared temporary folder):
    (the image's /autograder folder, {seconds, returncode, log}). Each grading then gets a fresh layout of its own."""
    if os.geteuid() != 0 or PROBLEM is not None:
        pytest.skip(f"needs root and the sandbox: {PROBLEM or 'not root'}")
    if Path("/autograder").exists() and any(Path("/autograder").iterdir()):
        pytest.skip("/autograder exists and is not empty (a real Gradescope container?)")
    if cpu_torch_source() is None:
        pytest.skip(f"setup.sh installs PyTorch's CPU build of torch {TORCH}: {CPU_INDEX} cannot be reached from here "
                    "and pip's configuration names no folder that holds its wheel")
    Path("/autograder").mkdir(exist_ok=True)                 # an empty mount point; the bundles go in namespaces
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    base, done = shared / "gradescope-image", shared / "gradescope-image.json"
    with (shared / "gradescope-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(json.dumps(build_image(bundles["08_acceptance"], base)))
    built = json.loads(done.read_text())
    assert built["returncode"] == 0, built["log"][-4000:]
    print(f"\nsetup.sh built the image in {built['seconds']:.0f} s")
    return base / "autograder", built


def grade_in_image(image, bundle: Path, notebook: Path, name: str, folder: Path) -> tuple:
    """Gradescope's run for one submission, in a fresh /autograder (the bundle in source/, the notebook in
    submission/, an empty results/, the image's venv): (results.json as a dict, seconds, the log, that folder)."""
    image_root, _ = image
    root = folder / "autograder"
    for name_ in ("source", "submission", "results"):
        (root / name_).mkdir(parents=True)
    subprocess.run(["unzip", "-q", str(bundle), "-d", str(root / "source")], check=True)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")     # Gradescope copies it there
    shutil.copy2(notebook, root / "submission" / name)
    log = folder / "run.log"
    t0 = time.monotonic()
    code = in_autograder(root, "cd /autograder && /autograder/run_autograder", image_root / "speclab-venv", 1500, log)
    seconds = time.monotonic() - t0
    assert code == 0, log.read_text()[-4000:]
    return json.loads((root / "results" / "results.json").read_text()), seconds, log.read_text(), root


def wheel_files(root: Path) -> dict:
    "{path under speclab/: bytes} of the package in the wheel that the image at `root` was built from."
    with zipfile.ZipFile(next((root / "source" / "wheels").glob("speclab-*.whl"))) as z:
        return {n[len("speclab/"):]: z.read(n) for n in z.namelist() if n.startswith("speclab/")}


@pytest.mark.slow
def test_image_holds_the_course_code(image):
    """After setup.sh: the venv's speclab is the bundled wheel's, byte for byte; torch is the CPU build at the course's
    pin; every frozen version is the one installed; no apt-get was needed."""
    root, built = image
    site = next((root / "speclab-venv" / "lib").glob("python3.*/site-packages"))
    packed = wheel_files(root)
    assert [n for n in files_under(site / "speclab") if "__pycache__" not in n] == sorted(packed)
    for name, data in packed.items():
        assert (site / "speclab" / name).read_bytes() == data, name
    assert f"torch {TORCH}+cpu" in built["log"] and "apt-get is not allowed" not in built["log"]
    installed = dict(p.name[:-len(".dist-info")].split("-") for p in site.glob("*.dist-info"))
    installed = {canonicalize_name(name): v for name, v in installed.items()}
    lines = (root / "source" / "constraints.txt").read_text().splitlines()
    pins = [line.split(" ; ")[0] for line in lines if not line.startswith("#")]
    for line in [*pins, f"torch=={TORCH}+cpu"]:
        name, pinned = line.split("==")
        assert installed.get(name) == pinned, line


CASES = ("solution", "blank", "hostile")

HOSTILE = '''
import doctest, glob, json, os, subprocess, sys
doctest.OutputChecker.check_output = lambda *a, **k: True       # every answer "right", in this process
FORGED = json.dumps({"score": 999, "output": "forged", "tests": []})
tried = []
for path in ["/autograder/results/results.json", "/autograder/run_autograder",
             *glob.glob("/autograder/speclab-venv/lib/python3*/site-packages/speclab/grading.py")]:
    try:
        open(path, "a").write("\\n# forged " + FORGED)
        tried.append("WROTE " + path)
    except OSError as e:
        tried.append(type(e).__name__)
LATER = ("import time\\nopen('/proc/self/comm', 'w').write(%r)\\n"
         "for _ in range(160):\\n"
         "    try:\\n        open('/autograder/results/results.json', 'w').write(%r)\\n"
         "    except OSError:\\n        pass\\n"
         "    time.sleep(0.25)\\n") % ("@MARK@", FORGED)
subprocess.Popen([sys.executable, "-c", LATER], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''


def alive(mark: str) -> list:
    "Pids of live (not zombie) processes named `mark`."
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "comm").read_text().strip() == mark and "\nState:\tZ" not in (d / "status").read_text():
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def submission(lab: Path, case: str, folder: Path) -> Path:
    "The notebook for `case`: the lab's solution, its blank student notebook, or that plus the hostile cell."
    if case == "solution":
        return next((lab / "autograder").glob("*.ipynb"))
    blank = next((lab / "student").glob("*.ipynb"))
    if case == "blank":
        return blank
    nb = json.loads(blank.read_text(encoding="utf-8"))
    mark = "slg" + uuid.uuid4().hex[:10]
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "hostile0", "metadata": {}, "outputs": [],
                        "source": HOSTILE.replace("@MARK@", mark)})
    path = folder / f"{mark}.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_gradescope_scores(lab, case, image, bundles, tmp_path):
    """run_autograder, with no network, in the sandbox: the solution earns every point, the blank notebook none, the
    hostile one none, and the results.json it leaves is the grader's (5 s later too, with the forger gone); the
    venv's grader and run_autograder are unchanged."""
    max_score = load_lab(lab).max_score
    path = submission(lab, case, tmp_path)
    name = next((lab / "autograder").glob("*.ipynb")).name
    results, seconds, log, root = grade_in_image(image, bundles[lab.name], path, name, tmp_path / "run")
    print(f"\n{lab.name} {case}: {results['score']} / {max_score} in {seconds:.0f} s")
    assert results.get("practice") is False and "sandboxed" in str(results.get("output")), (results, log[-3000:])
    assert sum(t["max_score"] for t in results["tests"]) == max_score
    if case == "solution":
        assert results["score"] == max_score, log[-3000:]
        assert all(t["score"] == t["max_score"] for t in results["tests"])
        return
    assert results["score"] == 0, log[-3000:]
    assert all(t["score"] == 0 for t in results["tests"])
    if case == "hostile":
        time.sleep(5)
        assert json.loads((root / "results" / "results.json").read_text()) == results
        assert alive(path.stem) == []
        site = next((image[0] / "speclab-venv" / "lib").glob("python3.*/site-packages"))
        assert (site / "speclab" / "grading.py").read_bytes() == wheel_files(image[0])["grading.py"]
        assert "forged" not in (root / "run_autograder").read_text()
