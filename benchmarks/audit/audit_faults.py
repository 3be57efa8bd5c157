"""speclab audit (Chapter 13) against the shipped pair and every planted fault: what caught each, at what budget.

    python benchmarks/audit/audit_faults.py                      # the default plan (budget 12,000) per fault, and a ladder
    python benchmarks/audit/audit_faults.py --ladder 1500,3000,6000,12000 --faults top_p_target_only,seed_ignored
    python benchmarks/audit/audit_faults.py --json out.json

One in-process pair of servers (speclab.testing.audit_pair: the tiny target with its draft, kappa 3, and the target
alone); each fault is planted in the speculative engine between audits. For each fault the ladder's budgets are run
in order until one catches it (exit status 1); that budget, its requests and wall time, the check that failed and its
worst cell are recorded. The correct pair runs the full default plan once (its time is the "default audit" figure).
With --corpus (fault_corpus.py's JSON, the default when it exists) each row also gets the fault's exact
first-two-token TV on the default law cells and the budget predicted to catch it with probability 0.95.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.audit import plan_audit, run_audit  # noqa: E402
from speclab.testing import FAULTS, audit_pair  # noqa: E402


def one(urls, set_fault, fault, budget, seed):
    "Audit with `fault` planted at `budget`: a result row."
    set_fault(fault)
    t0 = time.perf_counter()
    report = run_audit(*urls, plan_audit(budget=budget, seed=seed), progress=False)
    set_fault(None)
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    return dict(fault=fault or "none (exact pair)", budget=budget, exit_code=report["exit_code"],
                requests=report["requests_sent"], seconds=round(time.perf_counter() - t0, 1),
                failed={c["check"]: c["worst"] for c in failed}, line=report["line"])


def corpus_rows(path: str) -> dict:
    "{fault: (exact first-two-token TV, predicted budget for power 0.95)} from fault_corpus.py's JSON, if present."
    if not Path(path).exists():
        return {}
    rows = json.loads(Path(path).read_text())["faults"]
    return {r["fault"]: (f"{r['tv_max']:.3f}", f"{r['budget_power_095']:,}" if r["budget_power_095"] else "-")
            for r in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", default="1500,3000,6000,12000", help="budgets tried in order per fault")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated fault names")
    ap.add_argument("--skip-exact", action="store_true", help="do not run the default plan on the correct pair")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--corpus", default=str(Path(__file__).with_name("fault_corpus.json")),
                    help="fault_corpus.py's JSON: each fault's exact bias and predicted budget (skipped if absent)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ladder = [int(b) for b in a.ladder.split(",")]
    rows = []
    print(f"# {utc_now()}; {machine()}; load average {load_average()} at start", flush=True)
    with audit_pair() as (url, reference_url, set_fault):
        urls = (url, reference_url)
        if not a.skip_exact:
            rows.append(one(urls, set_fault, None, 12_000, 0))
            print(json.dumps(rows[-1]), flush=True)
        for fault in a.faults.split(","):
            for budget in ladder:
                rows.append(one(urls, set_fault, fault, budget, len(rows)))
                print(json.dumps(rows[-1]), flush=True)
                if rows[-1]["exit_code"] == 1:
                    break
    print(f"# load average {load_average()} at the end", flush=True)
    corpus = corpus_rows(a.corpus)
    print("| fault | exact TV | predicted budget (0.95) | caught at budget | requests | wall s | check failed: worst "
          "cell |\n|---|---|---|---|---|---|---|")
    for r in rows:
        caught = "; ".join(f"{k}: {v}" for k, v in r["failed"].items()) or "nothing (exit %d)" % r["exit_code"]
        tv, need = corpus.get(r["fault"], ("", ""))
        print(f"| {r['fault']} | {tv} | {need} | {r['budget']:,} | {r['requests']:,} | {r['seconds']} | {caught} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
