"""Lab 08 (labs/08_acceptance): the student's Q8 answer (the accept/reject step) replaced by the classic planted bugs,
each of which a hidden test must catch, and by correct samplers, which must pass. All of them run in one self-check
child (a fresh namespace each), so the lab's imports are paid once. The checks every lab shares are in
tests/test_labs.py; the runner and paths in tests/labkit.py.
"""
import json

import pytest

from labkit import LAB08, src

pytestmark = pytest.mark.xdist_group("lab08")   # beside test_labs.py's Lab 08 runs, in one worker


# The student's answer to Q8 replaced by the classic planted bugs (speclab.proof) and a few more.
_DRAW = "    x = int(rng.choice(len(q), p=q))\n"
BUGS = {
    "threshold on p": "from speclab.proof import threshold_on_p_sampler as accept_reject",
    "top-k membership": "from speclab.proof import topk_membership_sampler as accept_reject",
    "resample from p": "from speclab.proof import resample_from_p_sampler as accept_reject",
    "accept with p[x] alone": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < p[x]: return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "inverted ratio q/p": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if p[x] > 0 and rng.random() < min(1.0, q[x] / p[x]): return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "residual max(0, q - p)": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < min(1.0, p[x] / q[x]): return x\n    res = np.maximum(q - p, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
    "never accepts": "def accept_reject(p, q, rng):\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum())) if res.sum() > 0 else int(rng.choice(len(p), p=p))",
}
CORRECT = {
    "speclab.proof.speculative_sample": "from speclab.proof import speculative_sample as accept_reject",
    "ratio without the min (same law)": "def accept_reject(p, q, rng):\n" + _DRAW +
        "    if rng.random() < p[x] / q[x]: return x\n    res = np.maximum(p - q, 0.0)\n"
        "    return int(rng.choice(len(p), p=res / res.sum()))",
}


def q8_notebook(answer, folder):
    "The student notebook with `answer` in place of Q8's answer cell, written into `folder`."
    nb = json.loads((LAB08.student / LAB08.notebook).read_text(encoding="utf-8"))
    (i,) = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and "def accept_reject(" in src(c)]
    nb["cells"][i]["source"] = answer
    folder.mkdir(parents=True)
    path = folder / "acceptance.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(scope="module")
def q8_results(tmp_path_factory):
    """{answer name: Q8's results (public and hidden)} for every planted bug and correct sampler, each in place of the
    student's Q8 answer: the notebooks run in one self-check child, one after another, each in a fresh namespace."""
    answers = {**BUGS, **CORRECT}
    base = tmp_path_factory.mktemp("q8")
    paths = [q8_notebook(answer, base / f"answer{k}") for k, answer in enumerate(answers.values())]
    (q8,) = [n for n in LAB08.tests() if n.startswith("q8")]
    reports = LAB08.check_many(paths, timeout=900, only=[q8])
    return {name: report["results"] for name, report in zip(answers, reports)}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_fails_q8_hidden_tests(bug, q8_results):
    results = q8_results[bug]
    assert results and [r for r in results if r["hidden"] and not r["passed"]], f"{bug!r} passes every hidden Q8 test"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_sampler_passes_q8(name, q8_results):
    results = q8_results[name]
    assert results and all(r["passed"] for r in results), [(r["case"], r["output"]) for r in results if not r["passed"]]
