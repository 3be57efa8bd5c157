"""Shared test setup. Runs before any test module imports speclab (and so before anything imports triton)."""
import ctypes
import os

# Triton kernels (chapter 04) run in the interpreter on machines without a GPU; this must be set before
# the first `@triton.jit` is created. Subprocesses (nbdev_test, the CLI) inherit it.
os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist runs the suite's files on every core (pyproject.toml: -n auto). Each worker keeps one torch thread, and
# so do the notebooks and commands it starts, so that workers do not fight over cores; a test that times something
# sets its own thread count. This must happen before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# glibc's malloc gives every allocation over 32 MB a fresh mmap and unmaps it when it is freed, so the engine's large
# per-step tensors (a 25,000-request law batch) fault in fresh zeroed pages at every step: up to a third of a law
# test's CPU time here, as system time. Freed memory stays in the heap instead, in this process (mallopt) and in every
# process it starts (GLIBC_TUNABLES: xdist workers, notebooks, servers, CLI children). Nothing computed changes; a
# process keeps its peak memory. Measured: benchmarks/RESULTS.md, "The test suite's time".
MALLOC_KEEP = 2 ** 31 - 1                 # bytes: mallopt's largest threshold (an int)
MALLOC_TUNABLES = f"glibc.malloc.mmap_threshold={MALLOC_KEEP}:glibc.malloc.trim_threshold={MALLOC_KEEP}"


def keep_freed_memory() -> None:
    "Raise glibc's mmap and trim thresholds here and for child processes (a no-op without glibc)."
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-1, ctypes.c_int(MALLOC_KEEP))       # M_TRIM_THRESHOLD
    libc.mallopt(-3, ctypes.c_int(MALLOC_KEEP))       # M_MMAP_THRESHOLD
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if MALLOC_TUNABLES not in tunables:
        os.environ["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_TUNABLES}" if tunables else MALLOC_TUNABLES


keep_freed_memory()

import re
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

import suite_clock

# Property tests: the same examples on every CI run (derandomized, no example database), random exploration on a
# developer's machine. .ci/run sets CI=true; SPECLAB_HYPOTHESIS_PROFILE picks a profile by name.
hypothesis_settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
hypothesis_settings.register_profile("dev", derandomize=False, deadline=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("SPECLAB_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv running the tests: nbdev_test, nbdev_export, speclab live here


@pytest.fixture(scope="session")
def root() -> Path:
    "The repository root."
    return ROOT


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    "The bin/ directory of the venv running pytest (console scripts)."
    return BIN


@pytest.fixture(scope="session")
def settings() -> dict:
    "settings.ini's [DEFAULT] section as a dict."
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return dict(cfg["DEFAULT"])


@pytest.fixture(scope="session")
def repo_files() -> list[str]:
    "Paths git would commit: tracked plus untracked-but-not-ignored files (relative, existing on disk)."
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in set(out.split("\0")) if p and os.path.lexists(ROOT / p))


def readme_blocks(text: str) -> list[tuple[str, str, str]]:
    "Every fenced block of a README as (its `## ` section heading, its language, its code); one parser for the tests."
    blocks, section = [], ""
    for m in re.finditer(r"^(## [^\n]*)$|^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S):
        if m.group(1):
            section = m.group(1).strip()
        else:
            blocks.append((section, m.group(2), m.group(3)))
    return blocks


@pytest.fixture(scope="session")
def readme() -> list[tuple[str, str, str]]:
    "README.md's fenced blocks, as `readme_blocks` returns them."
    return readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))


def pytest_configure(config):
    "The suite's clock (tests/suite_clock.py): time per file in every run, and a failure past the budget."
    suite_clock.pytest_configure(config)


# The longest tests and groups first (measured: benchmarks/RESULTS.md, "The test suite's time"), so that no
# worker starts a long one while the other is about to run dry; the rest keep their order.
HEAVY_FIRST = ("tests/test_gradescope.py", "tests/test_site.py", "tests/test_engine.py::test_law_of",
               "tests/test_eagle.py", "tests/test_sampling_fields.py", "tests/test_repo.py::test_notebook_runs",
               "tests/test_audit.py", "tests/test_scheduler.py", "tests/test_sampling.py::test_distribution",
               "tests/test_labs.py", "tests/test_grading.py", "tests/test_openai_client.py",
               "tests/test_repo.py::test_wheel")


def pytest_collection_modifyitems(session, config, items):
    "Put the tests of HEAVY_FIRST first, in its order (a stable sort: the others keep theirs)."
    def rank(item):
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if item.nodeid.startswith(prefix)), len(HEAVY_FIRST))
    items.sort(key=rank)
