"""The default `speclab audit` of the shipped pair, as a user runs it: two `speclab serve` processes, one command.

    python benchmarks/audit/audit_default.py [--budget 12000] [--out /tmp/audit.json --html /tmp/audit.html]
                                             [--record benchmarks/audit/exact_pair_12000.json]

Prints the audit's own output, its exit status and its wall time (the goal is under 5 minutes on this CPU). With
--record, also writes a summary (date, machine, command, exit status, tests, requests, seconds, the pilot's
replacements, the logprobs check's largest difference) and the report itself to that JSON file.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.testing import serve_process  # noqa: E402


def summary(report: dict) -> dict:
    "The figures RESULTS.md quotes, from an audit's JSON report."
    logprobs = [t for t in report["tests"] if t["check"] == "logprobs" and not t["reason"]]
    return dict(exit_code=report["exit_code"], line=report["line"], requests_sent=report["requests_sent"],
                elapsed_s=report["elapsed_s"], tests=len(report["tests"]),
                tested=sum(c["tested"] for c in report["checks"]),
                checks={c["check"]: c["status"] for c in report["checks"]}, replaced=report.get("replaced", []),
                logprobs_max_abs_diff=logprobs[0]["statistic"] if logprobs else None,
                logprobs_compared=logprobs[0]["n"] if logprobs else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=12_000)
    ap.add_argument("--out", default="/tmp/speclab-audit.json")
    ap.add_argument("--html", default="/tmp/speclab-audit.html")
    ap.add_argument("--record", default=None, help="write the summary and the report to this JSON file")
    a = ap.parse_args(argv)
    started = utc_now()
    print(f"# {started}; {machine()}; load average {load_average()} at start", flush=True)
    exe = str(Path(sys.executable).parent / "speclab")
    with serve_process("--threads", "1", "--seed", "1") as url, \
            serve_process("--draft", "none", "--threads", "1", "--seed", "2") as reference_url:
        t0 = time.perf_counter()
        cmd = [exe, "audit", "--url", url, "--reference-url", reference_url, "--budget", str(a.budget), "--out", a.out,
               "--html", a.html, "--quiet"]
        done = subprocess.run(cmd, text=True)
        seconds = time.perf_counter() - t0
    end_load = load_average()
    print(f"# exit status {done.returncode}; {seconds:.0f} s wall for the audit; load average {end_load} "
          "at the end", flush=True)
    if a.record:
        report = json.loads(Path(a.out).read_text())
        record = dict(date=started, machine=machine(), load_at_end=end_load, budget=a.budget,
                      command=f"python benchmarks/audit/audit_default.py --budget {a.budget}",
                      servers="speclab serve --threads 1 --seed 1 (speculative, default) against speclab serve "
                              "--draft none --threads 1 --seed 2 (plain)",
                      exit_status=done.returncode, wall_s=round(seconds, 1), **summary(report), report=report)
        Path(a.record).write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
