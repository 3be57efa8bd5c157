"""Lab 09 (labs/09_audit): the master's answers replaced one at a time by plausible mistakes, each of which a hidden
test must catch. All of them run in one self-check child (a fresh namespace each), so the lab's imports are paid once.
The checks every lab shares are in tests/test_labs.py; the runner and paths in tests/labkit.py.
"""
import json

import pytest

from labkit import LAB09, src

pytestmark = pytest.mark.xdist_group("lab09")   # beside test_labs.py's Lab 09 runs, in one worker


# A student's answer replaced by a plausible mistake: the hidden tests must catch each one.
BUGS = {
    "q2: rare texts pooled into one 'other' bin": ("def two_sample(", """def two_sample(a, b, min_count=10):
    counts = Counter(a) + Counter(b)
    bin_of = {t: t if counts[t] >= min_count else '' for t in counts}
    keys = sorted(set(bin_of.values()))
    table = np.zeros((2, len(keys)))
    for row, sample in enumerate((a, b)):
        for t, c in sample.items():
            table[row, keys.index(bin_of[t])] += c
    if len(keys) < 2:
        return 0.0, 0, 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic, len(keys) - 1, float(stats.chi2.sf(statistic, len(keys) - 1))
"""),
    "q2: k degrees of freedom": ("def two_sample(", """def two_sample(a, b, min_count=10):
    bins = pool(a, b, min_count)
    keys = sorted(set(bins.values()))
    table = np.zeros((2, len(keys)))
    for row, sample in enumerate((a, b)):
        for t, c in sample.items():
            table[row, keys.index(bins[t])] += c
    if len(keys) < 2:
        return 0.0, 0, 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic, len(keys), float(stats.chi2.sf(statistic, len(keys)))
"""),
    "q3: Bonferroni instead of Holm": ("def holm(", """def holm(p_values):
    return [min(1.0, len(p_values) * p) for p in p_values]
"""),
    "q3: Holm without the running maximum": ("def holm(", """def holm(p_values):
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    for rank, i in enumerate(order):
        adjusted[i] = min(1.0, (m - rank) * p_values[i])
    return adjusted
"""),
    "q5: only the first cell": ("def audit_recording(", """def audit_recording(recording, level=0.01):
    c = recording["cells"][0]
    if two_sample(c["audited"], c["reference"])[2] < level:
        return "broken", (c["prompt"], c["setting"])
    return "exact", None
"""),
}


def answer_notebook(marker, answer, folder):
    "The master's solutions with the cell defining `marker` replaced by `answer`, written into `folder`."
    nb = json.loads((LAB09.autograder / LAB09.notebook).read_text(encoding="utf-8"))
    (i,) = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and marker in src(c)]
    lines = src(nb["cells"][i]).splitlines(keepends=True)
    keep = "".join(ln for ln in lines if ln.startswith(("pair_1_tests", "verdicts", "bound_", "n_for", "example")))
    nb["cells"][i]["source"] = answer + "\n\n" + keep
    folder.mkdir(parents=True)
    path = folder / "audit.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(scope="module")
def mistake_results(tmp_path_factory):
    """{mistake: every test's results} for each planted mistake in place of the master's answer: the notebooks run in
    one self-check child, one after another, each in a fresh namespace."""
    base = tmp_path_factory.mktemp("mistakes")
    paths = [answer_notebook(*BUGS[bug], base / f"mistake{k}") for k, bug in enumerate(BUGS)]
    return {bug: report["results"] for bug, report in zip(BUGS, LAB09.check_many(paths, timeout=900))}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_mistake_fails_a_hidden_test(bug, mistake_results):
    results = mistake_results[bug]
    assert results and [r for r in results if r["hidden"] and not r["passed"]], f"{bug!r} passes every hidden test"
