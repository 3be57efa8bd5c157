"""Write Lab 09's master notebook (audit.ipynb, otter assign format) from the recordings record.py made.

    python labs/09_audit/build_master.py      # then: python labs/09_audit/assign.py --execute

The hidden tests call the student's functions on recordings the student never sees (hidden_recordings.json, written
into the hidden test cells as literals). Run this only when the recordings change; afterwards the master is the
source and `assign.py` regenerates student/ and autograder/ from it.
"""
import hashlib
import json
from pathlib import Path

LAB = Path(__file__).resolve().parent
HIDDEN = json.loads((LAB / "hidden_recordings.json").read_text(encoding="utf-8"))
cells = []


def add(kind, text):
    cells.append((kind, text.strip("\n")))


def question(name, points, prose, solution, tests):
    "One otter question: its prose, the solution cell, then public tests and hidden ones (prefixed '# HIDDEN')."
    add("raw", f"# BEGIN QUESTION\nname: {name}\npoints: {json.dumps(points)}")
    add("markdown", prose)
    add("raw", "# BEGIN SOLUTION")
    add("code", solution)
    add("raw", "# END SOLUTION")
    add("raw", "# BEGIN TESTS")
    for t in tests:
        add("code", t)
    add("raw", "# END TESTS")
    add("raw", "# END QUESTION")


add("raw", """# ASSIGNMENT CONFIG
name: lab09-audit
init_cell: true
check_all_cell: false
export_cell: false
generate: false
run_tests: false
solutions_pdf: false
template_pdf: false
save_environment: false
show_question_points: true
tests:
  files: true
  ok_format: true""")
add("markdown", r"""
# Lab 09: is this server exact?

Chapter 13 built `speclab audit`: send the same requests to a server with speculation on and to the same model
without it, and ask whether the two samples of completions could come from one law. In this lab you build the
statistics of that audit yourself, from recorded samples, and use them to say which servers are broken and where.

Seven pairs of servers were recorded (the shipped tiny pair, `speclab serve` with speculation on and off). Each
recording holds three cells: a prompt and a sampling setting, sent 300 times to each server, with the first two
tokens' text counted per server. Some audited servers had a bug planted in their sampler; some did not. The bugs of
the later pairs (`pair_5` on) come from the audit's fault corpus (`speclab.testing.FAULTS`): bugs modeled on real
engines' bug reports (vLLM, SGLang, ...), or on a bug of the same kind where no public report was found. The
recordings come with speclab (`speclab.audit.lab09_recording`), so this notebook runs anywhere speclab is installed.

You will write: the prefix pooling of rare outcomes (Q1), the pooled two-sample chi-square test (Q2), Holm's
correction (Q3), the power statement (Q4), and an audit of a whole recording with its verdict (Q5). The hidden tests
run your functions on recordings you have not seen. Use `numpy` and `scipy.stats`; `speclab.audit` has its own
versions of these functions, and using them is not the point (the hidden tests check your functions on cases where
a slightly different rule gives a different number).
""")
add("code", """
import json
from collections import Counter

import numpy as np
from scipy import stats

from speclab.audit import lab09_recording
from speclab.proof import detectable_tv
""")
add("markdown", """
## The data

`lab09_recording(name)` returns a dict: `{"pair": name, "cells": [...]}`, each cell with its `prompt`, `setting`
(a short name), the request `fields`, `n` (requests per server) and two dicts `audited` and `reference` mapping each
completion text to how many times that server returned it.
""")
add("code", """
PAIRS = [f"pair_{k}" for k in range(1, 8)]
RECORDINGS = {name: lab09_recording(name) for name in PAIRS}
cell = RECORDINGS["pair_1"]["cells"][0]
print(cell["prompt"], cell["setting"], cell["n"], len(cell["audited"]), "distinct texts from the audited server")
sorted(cell["audited"].items(), key=lambda kv: -kv[1])[:5]
""")

question("q1_pool", [1, 1, 1, 1], r"""
## Question 1: pooling rare outcomes into their prefixes

A chi-square test wants a handful of expected counts in every bin, but most two-token completions appear once or
twice. Pool them, keeping as much of the first token as possible: a text whose **pooled count** (audited plus
reference) is below `min_count` moves to its prefix one character shorter; texts that land on the same prefix share a
bin, and their counts add up. Repeat until every non-empty bin has a pooled count of at least `min_count`. Whatever
reaches the empty string `""` stays there (it is the last bin, however small).

Write `pool(a, b, min_count=10)`: given two dicts text -> count, return a dict mapping **every** text of `a` or `b`
to its bin (a string). In each round, shorten every bin that is too small at the same time, then recount.
""", '''
def pool(a, b, min_count=10):
    "Each text's bin: rare texts (pooled count < min_count) move to shorter prefixes until their bin is big enough."
    # BEGIN SOLUTION
    counts = Counter(a) + Counter(b)
    bins = {t: t for t in counts}
    while True:
        sizes = Counter()
        for t, c in counts.items():
            sizes[bins[t]] += c
        rare = {k for k, c in sizes.items() if c < min_count and k}
        if not rare:
            return bins
        for t in counts:
            if bins[t] in rare:
                bins[t] = bins[t][:-1]
    # END SOLUTION


example = pool({"ab": 6, "ac": 3, "x": 12}, {"ab": 2, "ad": 1, "y": 4})
''', ["sorted(example.items())",
      "[len(set(b)), sorted(set(b))[:4]] if (b := pool(RECORDINGS['pair_1']['cells'][1]['audited'], RECORDINGS['pair_1']['cells'][1]['reference']).values()) else None",
      "# HIDDEN\nsorted(pool({'abc': 4, 'abd': 4, 'b': 30}, {'abc': 1, 'ab': 2, 'c': 2}, min_count=5).items())",
      "# HIDDEN\nsorted(Counter(pool({'hello': 9, 'help': 9, 'hex': 3}, {'hello': 2, 'heap': 1}, min_count=10).values()).items())"])

question("q2_two_sample", [1, 1, 1, 1], r"""
## Question 2: the pooled two-sample test

Bin both samples with your `pool`, form the $2 \times k$ table of counts (row 0 audited, row 1 reference), and compute
Pearson's statistic $\sum (O - E)^2 / E$ with $E$ from the row and column totals, its degrees of freedom $k - 1$, and
the p-value from the chi-square distribution (`stats.chi2.sf`). With fewer than two bins there is nothing to
compare: return `(0.0, 0, 1.0)`.

Write `two_sample(a, b, min_count=10)` returning `(statistic, df, p_value)`, and run it on every cell of `pair_1`.
""", '''
def two_sample(a, b, min_count=10):
    "(statistic, df, p_value) of Pearson's chi-square on the 2 x k table of pooled bins."
    # BEGIN SOLUTION
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
    return statistic, len(keys) - 1, float(stats.chi2.sf(statistic, len(keys) - 1))
    # END SOLUTION


pair_1_tests = [two_sample(c["audited"], c["reference"]) for c in RECORDINGS["pair_1"]["cells"]]  # SOLUTION
''', ["[(round(s, 3), df, round(p, 4)) for s, df, p in pair_1_tests]",
      "[round(x, 4) for x in two_sample({'a': 30, 'b': 10}, {'a': 10, 'b': 30})]",
      "# HIDDEN\n[round(x, 4) for x in two_sample({'aa': 20, 'ab': 5, 'b': 15, 'c': 3}, {'aa': 12, 'ac': 6, 'b': 22, 'd': 4})]",
      "# HIDDEN\n[round(x, 4) for x in two_sample({'a': 3}, {'a': 4, 'b': 2})]"])

question("q3_holm", [1, 1, 1], r"""
## Question 3: many cells, one level

An audit runs many tests. Holm's step-down procedure keeps the probability that *any* of them fires on an exact pair
below the level: sort the $m$ p-values, multiply the $i$-th smallest ($i = 1..m$) by $m - i + 1$, make the sequence
non-decreasing (each adjusted value is the largest so far), and cap at 1. Test $j$ is rejected at level $L$ when its
adjusted p-value is below $L$.

Write `holm(p_values)` returning the adjusted p-values **in the original order**.
""", '''
def holm(p_values):
    "Holm-adjusted p-values, in the order given."
    # BEGIN SOLUTION
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
    # END SOLUTION
''', ["[round(x, 4) for x in holm([0.01, 0.04, 0.03, 0.5])]",
      "# HIDDEN\n[round(x, 4) for x in holm([0.2, 0.001, 0.02, 0.019, 0.9])]",
      "# HIDDEN\n[round(x, 4) for x in holm([0.6, 0.5])]"])

question("q4_power", [1, 1, 1], r"""
## Question 4: how much can the audit see?

Two samples of $n_a$ and $n_b$ draws behave like one sample of $n_{\rm eff} = n_a n_b / (n_a + n_b)$ draws against a
known law: the noncentrality of the two-sample statistic is at least $4\, n_{\rm eff}\, TV^2$. So Chapter 1's
`detectable_tv(n, num_bins, level, power)` gives the smallest total-variation distance between the binned laws that
the test flags with probability `power`.

1. Write `tv_bound(n_a, n_b, num_bins, level, power=0.99)`.
2. A recording has 3 cells of 300 requests per server; with Holm over the 3 cells, state the power as the bound at the
   Bonferroni level `0.01 / 3` and 12 bins: `bound_300`.
3. `n_for_010`: the smallest number of requests per server (the same for both, a multiple of 100) for which that
   bound is at most 0.10.
""", '''
def tv_bound(n_a, n_b, num_bins, level, power=0.99):
    "Smallest TV between binned laws flagged with probability >= power by the two-sample chi-square at `level`."
    # BEGIN SOLUTION
    return detectable_tv(n_a * n_b / (n_a + n_b), num_bins, level, power)
    # END SOLUTION


bound_300 = tv_bound(300, 300, 12, 0.01 / 3)  # SOLUTION
n_for_010 = next(n for n in range(100, 100_000, 100) if tv_bound(n, n, 12, 0.01 / 3) <= 0.10)  # SOLUTION
''', ["round(float(bound_300), 3)",
      "# HIDDEN\nint(n_for_010)",
      "# HIDDEN\nround(float(tv_bound(1000, 250, 6, 0.001)), 4)"])

question("q5_verdict", [1] * (4 + len(HIDDEN)), r"""
## Question 5: which servers are broken, and where?

Write `audit_recording(recording, level=0.01)`: run `two_sample` on every cell, adjust the p-values with `holm`, and
return `("broken", (prompt, setting))` naming the cell with the smallest adjusted p-value when that value is below
`level`, else `("exact", None)`.

Then fill in `verdicts`: a dict from each of the seven pair names to what `audit_recording` says about it. Look at
the worst cell of a broken pair (the counts side by side): can you tell which kind of bug it is? (Not graded: compare
with the bugs listed in Chapter 13 and in `speclab.testing.FAULTS`, most of which name the engine report they are
modeled on.)
""", '''
def audit_recording(recording, level=0.01):
    "('broken', (prompt, setting)) of the worst cell if any Holm-adjusted p-value is below level, else ('exact', None)."
    # BEGIN SOLUTION
    cells = recording["cells"]
    adjusted = holm([two_sample(c["audited"], c["reference"])[2] for c in cells])
    worst = min(range(len(cells)), key=lambda i: adjusted[i])
    if adjusted[worst] < level:
        return "broken", (cells[worst]["prompt"], cells[worst]["setting"])
    return "exact", None
    # END SOLUTION


verdicts = {name: audit_recording(RECORDINGS[name]) for name in PAIRS}  # SOLUTION
''', ["sorted(verdicts)",
      "[verdicts[name][0] for name in PAIRS]",
      "# HIDDEN\n[verdicts[name][1] for name in PAIRS[:4]]",   # two tests: a list of all seven wraps its display
      "# HIDDEN\n[verdicts[name][1] for name in PAIRS[4:]]",
      *[f"# HIDDEN\naudit_recording({json.dumps(HIDDEN[k], ensure_ascii=False)})" for k in sorted(HIDDEN)]])

nb = {"cells": [], "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                                "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
prev = "lab09"
for kind, text in cells:
    cid = hashlib.sha1(f"{prev}\n{text}".encode()).hexdigest()[:8]
    prev = cid
    cell = {"cell_type": kind, "id": cid, "metadata": {}, "source": text.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    nb["cells"].append(cell)
(LAB / "audit.ipynb").write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"wrote {LAB / 'audit.ipynb'}: {len(cells)} cells")
