"""The suite's guards (tests/suite_clock.py, tests/conftest.py): its clock fails a run past the budget, naming the
slowest tests; property tests are derandomized under CI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import hypothesis

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import time

def test_slow():
    time.sleep(0.6)

def test_medium():
    time.sleep(0.3)

def test_fast():
    pass
'''


def run_sample(tmp_path: Path, budget_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    "Run a three-test sample suite with the clock loaded as a plugin and the given budget."
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    times = tmp_path / "times.json"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SPECLAB_SUITE_BUDGET_S": str(budget_s),
           "SPECLAB_TEST_TIMES": str(times)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_clock", "-p", "no:cacheprovider", "-q",
                        "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return r, json.loads(times.read_text())


def test_over_budget_fails_and_names_the_slowest(tmp_path):
    r, times = run_sample(tmp_path, budget_s=0.5)
    assert r.returncode == 1, r.stdout
    assert "3 passed" in r.stdout and "SUITE OVER BUDGET" in r.stdout
    named = r.stdout.split("SUITE OVER BUDGET")[1]
    assert named.index("test_sample.py::test_slow") < named.index("test_sample.py::test_medium")
    assert times["elapsed_s"] > 0.5 and times["budget_s"] == 0.5


def test_within_budget_passes_with_times_per_file(tmp_path):
    r, times = run_sample(tmp_path, budget_s=600)
    assert r.returncode == 0, r.stdout
    assert "SUITE OVER BUDGET" not in r.stdout
    assert "time per test file" in r.stdout and "test_sample.py" in r.stdout
    slow = times["tests"]["test_sample.py::test_slow"]
    assert slow["wall_s"] >= 0.6 and 0 <= slow["cpu_s"] < slow["wall_s"]   # sleeping costs wall time, not CPU


def test_ci_profile_is_derandomized():
    "The CI profile replays the same examples on every run; .ci/run selects it by setting CI."
    ci = hypothesis.settings.get_profile("ci")
    assert ci.derandomize and ci.database is None
    assert not hypothesis.settings.get_profile("dev").derandomize
    if os.environ.get("CI") and not os.environ.get("SPECLAB_HYPOTHESIS_PROFILE"):
        assert hypothesis.settings.default.derandomize
    assert "export CI=true" in (TESTS.parent / ".ci" / "run").read_text()


GROUPED = '''
import os, pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.environ["WORKERS_LOG"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
'''


def test_xdist_groups_share_a_worker(tmp_path):
    """--dist loadgroup sends an xdist_group to one worker: the engine's law cells and the modules with costly
    fixtures rely on it (pytest 9 with pytest-xdist 3.8 silently groups nothing, hence the pin pytest<9)."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    log = tmp_path / "workers.log"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                        "loadgroup", "test_grouped.py"], cwd=tmp_path, env={**os.environ, "WORKERS_LOG": str(log)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    workers = log.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
