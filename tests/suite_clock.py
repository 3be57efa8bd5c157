"""A pytest plugin that keeps the suite's time in view (loaded by conftest.py; also usable as `-p suite_clock`).

* Every run ends with the time of each test file: the sum of its tests' wall time (setup, call and teardown) and of
  their CPU time (this process and the subprocesses it waited for). CPU seconds hardly move when another job shares
  the machine, so they are what `benchmarks/suite/suite_times.py` turns into a cost model.
* The suite has a budget, SPECLAB_SUITE_BUDGET_S seconds of wall time (default 2,700: 45 minutes). A run that passes
  it fails, naming its ten slowest tests, so growth is caught while it is still cheap to fix.
* With SPECLAB_TEST_TIMES=path the per-test figures are also written there as JSON.

Under pytest-xdist the workers measure and the controller (the only process with a terminal) adds up and judges.
"""
from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict

import pytest

DEFAULT_BUDGET_S = 45 * 60
SLOWEST = 10


def cpu_seconds() -> float:
    "User + system CPU time of this process and of the children it has waited for."
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuMeter:
    "Runs in every process that runs tests: adds ('cpu_s', seconds) to each test's teardown report."

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        item.stash[CPU_START] = cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        yield
        item.user_properties.append(("cpu_s", cpu_seconds() - item.stash[CPU_START]))


class SuiteClock:
    "Runs in the process that reports: per-file times in the summary, and the budget."

    def __init__(self, budget_s: float, times_path: str | None):
        self.budget_s, self.times_path = budget_s, times_path
        self.start = time.monotonic()
        self.wall = defaultdict(float)   # nodeid -> wall seconds over its phases
        self.cpu = {}                    # nodeid -> CPU seconds
        self.elapsed = 0.0

    def pytest_runtest_logreport(self, report):
        self.wall[report.nodeid] += report.duration
        for key, value in report.user_properties:
            if key == "cpu_s":
                self.cpu[report.nodeid] = value

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.elapsed = time.monotonic() - self.start
        if self.over_budget() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.times_path:
            tests = {k: {"wall_s": round(w, 3), "cpu_s": round(self.cpu.get(k, 0.0), 3)} for k, w in self.wall.items()}
            data = {"elapsed_s": round(self.elapsed, 1), "budget_s": self.budget_s, "tests": tests}
            with open(self.times_path, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)

    def over_budget(self) -> bool:
        return self.elapsed > self.budget_s

    def per_file(self) -> list[tuple[str, float, float, int]]:
        "(file, wall seconds, CPU seconds, tests), slowest first."
        files = defaultdict(lambda: [0.0, 0.0, 0])
        for nodeid, wall in self.wall.items():
            row = files[nodeid.split("::")[0]]
            row[0] += wall
            row[1] += self.cpu.get(nodeid, 0.0)
            row[2] += 1
        return sorted(((f, w, c, n) for f, (w, c, n) in files.items()), key=lambda r: -r[1])

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        tr = terminalreporter
        tr.write_sep("=", "time per test file (sum over its tests)")
        tr.write_line(f"{'file':<44} {'wall s':>9} {'cpu s':>9} {'tests':>6}")
        for name, wall, cpu, n in self.per_file():
            tr.write_line(f"{name:<44} {wall:9.1f} {cpu:9.1f} {n:6d}")
        tr.write_line(f"suite wall time {self.elapsed:.0f} s (budget {self.budget_s:.0f} s)")
        if self.over_budget():
            tr.write_sep("=", "SUITE OVER BUDGET", red=True, bold=True)
            tr.write_line(f"the suite took {self.elapsed:.0f} s of wall time, over its budget of {self.budget_s:.0f} s "
                          "(SPECLAB_SUITE_BUDGET_S); make these cheaper, or size their samples by power:")
            for nodeid, wall in sorted(self.wall.items(), key=lambda kv: -kv[1])[:SLOWEST]:
                tr.write_line(f"  {wall:8.1f} s  {nodeid}")


CPU_START = pytest.StashKey[float]()


def pytest_configure(config):
    "Register the CPU meter everywhere, and the clock where results are reported (not in xdist workers)."
    config.pluginmanager.register(CpuMeter(), "speclab-test-cpu")
    if not hasattr(config, "workerinput"):
        budget = float(os.environ.get("SPECLAB_SUITE_BUDGET_S", DEFAULT_BUDGET_S))
        config.pluginmanager.register(SuiteClock(budget, os.environ.get("SPECLAB_TEST_TIMES")), "speclab-suite-clock")
