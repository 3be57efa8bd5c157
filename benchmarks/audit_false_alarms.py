"""How often speclab audit (Chapter 13) fails an exact pair: repeated audits with fresh engine and request seeds.

    python benchmarks/audit_false_alarms.py --audits 30 --budget 1500 --level 0.1

Each audit restarts the in-process pair (speclab.testing.audit_pair) with new engine seeds and shuffles its requests
with a new seed, so the audits are independent. The audit promises a failure probability of at most `level` for an
exact pair (Holm over all its tests); the printed rate comes with its exact binomial 95% interval. A level of 0.1
rather than 0.01 makes a few dozen audits informative: at 0.01 they would almost all pass whether or not the
correction worked.
"""
import argparse
import sys
import time
from pathlib import Path

import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.audit import DEFAULT_PROMPTS, plan_audit, run_audit  # noqa: E402
from speclab.testing import audit_pair  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audits", type=int, default=30)
    ap.add_argument("--budget", type=int, default=1500)
    ap.add_argument("--level", type=float, default=0.1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {utc_now()}; {machine()}; load average {load_average()} at start", flush=True)
    failures, t0 = 0, time.perf_counter()
    for k in range(a.audits):
        plan = plan_audit(DEFAULT_PROMPTS[:6], budget=a.budget, level=a.level, num_law_prompts=2, concurrency=8,
                          concurrency_n=40, num_seeds=4, seed=1000 + k)
        with audit_pair(seed=100 + 2 * k) as (url, reference_url, _):
            report = run_audit(url, reference_url, plan, progress=False)
        failures += report["exit_code"] == 1
        print(f"audit {k}: exit {report['exit_code']}: {report['line']}", flush=True)
    ci = stats.binomtest(failures, a.audits).proportion_ci(0.95, method="exact")
    print(f"# {failures} of {a.audits} audits of an exact pair failed at level {a.level} (rate "
          f"{failures / a.audits:.3f}, 95% CI [{ci.low:.3f}, {ci.high:.3f}]); {plan.num_tests} tests per audit, "
          f"{time.perf_counter() - t0:.0f} s; load average {load_average()} at the end")


if __name__ == "__main__":
    main()
