"""How far each planted fault's case in tests/test_audit.py lies below the level: the case's own audit, run N times.

    python benchmarks/audit/audit_test_cases.py 5                      # every case, five audits each
    python benchmarks/audit/audit_test_cases.py 12 batch_dependent     # one case

Each trial runs the case exactly as the test does (its plan, one pair of in-process servers, the fault planted), with
the plan's shuffle seed set to the trial's number, so batches mix differently from trial to trial as they do from
one CI run to the next. Prints, per fault, each trial's exit code and the Holm-adjusted p-value of the check the case
names (the seeds check where it names none). A measurement, not a test.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_audit  # noqa: E402  (the cases and the audit helper of the test itself)
from speclab.testing import audit_pair  # noqa: E402


def main() -> None:
    trials, only = int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2:]
    with audit_pair(max_num_seqs=16) as pair:
        for fault, plan, check, _ in test_audit.CASES:
            if only and fault not in only:
                continue
            rows = []
            for t in range(trials):
                report = test_audit.audit(pair, fault, **{**plan, "seed": t})
                c = next(c for c in report["checks"] if c["check"] == (check or "seeds"))
                rows.append((report["exit_code"], float(f"{c.get('adjusted_p', 1.0):.2g}")))
            print(f"{fault}: worst adjusted p {max(p for _, p in rows):.2g}; (exit, p) per trial {rows}", flush=True)


if __name__ == "__main__":
    main()
