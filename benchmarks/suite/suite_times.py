"""The test suite's time per file, and a cost model of its law tests.

Run the suite with its clock writing per-test figures (tests/suite_clock.py), then this script on the result:

    SPECLAB_TEST_TIMES=/tmp/times.json .venv/bin/python -m pytest
    .venv/bin/python benchmarks/suite/suite_times.py /tmp/times.json [--slowdown 2.0]

It prints markdown for benchmarks/RESULTS.md: each file's wall and CPU seconds (summed over its tests; under
pytest-xdist the files run on every core at once, so the sums exceed the suite's wall time), and for each law test its
draws (from the same sizing functions the tests call), its CPU seconds, draws per CPU second, and what it would cost
on a machine `--slowdown` times slower. CPU seconds are the model's unit: they hardly move when another job shares the
machine, where wall seconds do. The suite's predicted wall time on the slower machine is its measured wall time times
the slowdown (every part of the suite is CPU-bound and scales alike).
"""
import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TRITON_INTERPRET", "1")


def law_tests() -> list[tuple[str, str, int]]:
    "(label, nodeid prefix, draws) of every law test, sized by the functions the tests themselves call."
    import numpy as np
    import test_engine as eng
    import test_metadata as meta
    import test_sampling as samp
    import test_sampling_fields as fields
    import test_scheduler as sched
    from speclab.proof import draws_for_law, draws_for_tv
    narrow = samp.trials_for(samp.markov(16, 1, 1.5), 4, samp.TV_TOKEN, pairs=True)
    wide = samp.trials_for(samp.wide_pair()[0], 3, samp.TV_WIDE)
    p8 = samp.torch.softmax(samp.torch.randn(8, generator=samp.torch.Generator().manual_seed(4)), 0).double().numpy()
    rows = [("sampler law, V = 16, kappa 3 (trials)", "tests/test_sampling.py::test_distribution_narrow_vocab", narrow),
            ("sampler law, V = 4096, kappa 2 (trials)", "tests/test_sampling.py::test_distribution_wide_vocab", wide),
            ("planted sampler bugs (trials)", "tests/test_sampling.py::test_planted_bugs_are_caught", narrow),
            ("Triton = torch text (trials)", "tests/test_sampling.py::test_triton_emits_the_torch_text",
             samp.TRITON_TRIALS),
            ("draw_tokens law (rows)", "tests/test_sampling.py::test_draw_tokens_law", draws_for_law(p8, samp.TV_TOKEN)),
            ("rejection_sampler law (requests of 5)", "tests/test_metadata.py::test_sampler_emits_the_target_law",
             draws_for_tv(0.02, 8)),
            ("scheduler law under events (requests)", "tests/test_scheduler.py::test_law_under_engine_events",
             sum(sched.law_sizes())),
            ("Triton engine = torch counts (requests)", "tests/test_engine.py::test_triton_counts_equal_torch",
             2 * eng.N_TRITON),
            ("sampling fields, each in one batch (requests)",
             "tests/test_sampling_fields.py::test_each_field_and_mixed_in_one_batch",
             sum(fields.draws(fields.TV_FIELDS))),
            ("sampling fields, all at once at TV 0.03 (requests)",
             "tests/test_sampling_fields.py::test_every_field_at_once_at_the_grids_power",
             fields.draw_size("mixed", eng.TV_JOINT)),
            ("sampling fields, prefix hits and preemption (requests)",
             "tests/test_sampling_fields.py::test_fields_through_prefix_hits_and_preemption",
             sum(fields.draws(fields.TV_FIELDS_EVENTS)))]
    per_cell = int(sum(eng.law_sizes()) * (1 + 1 / eng.GREEDY_EVERY))
    for kappa in eng.KAPPAS:
        for drafter in eng.DRAFTERS:
            rows.append((f"engine law grid, kappa {kappa}, {drafter} (requests)",
                         f"tests/test_engine.py::test_law_of_first_three_tokens[kappa{kappa}-{drafter}-", per_cell))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("times", help="the JSON file SPECLAB_TEST_TIMES named")
    ap.add_argument("--slowdown", type=float, default=2.0, help="how many times slower the other machine is")
    args = ap.parse_args()
    data = json.loads(Path(args.times).read_text())
    tests, k = data["tests"], args.slowdown
    files = defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, t in tests.items():
        row = files[nodeid.split("::")[0]]
        row[0] += t["wall_s"]
        row[1] += t["cpu_s"]
        row[2] += 1
    print(f"Suite wall time {data['elapsed_s']:.0f} s; predicted on a machine {k:g}x slower: "
          f"{k * data['elapsed_s']:.0f} s.\n")
    print("| file | tests | wall s | CPU s |\n|---|---|---|---|")
    for name, (wall, cpu, n) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{name}` | {n} | {wall:.1f} | {cpu:.1f} |")
    tot_wall, tot_cpu = sum(v[0] for v in files.values()), sum(v[1] for v in files.values())
    print(f"| all | {sum(v[2] for v in files.values())} | {tot_wall:.1f} | {tot_cpu:.1f} |\n")
    print(f"| law test | tests | draws each | CPU s | draws / CPU s | CPU s at {k:g}x slower |\n|---|---|---|---|---|---|")
    for label, prefix, draws in law_tests():
        hit = [t for nodeid, t in tests.items() if nodeid.startswith(prefix)]
        if not hit:
            continue
        cpu = sum(t["cpu_s"] for t in hit)
        rate = draws * len(hit) / cpu if "grid" not in label else draws / cpu
        print(f"| {label} | {len(hit)} | {draws:,} | {cpu:.1f} | {rate:,.0f} | {k * cpu:.0f} |")


if __name__ == "__main__":
    main()
