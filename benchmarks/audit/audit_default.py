"""The default `speclab audit` of the shipped pair, as a user runs it: two `speclab serve` processes, one command.

    python benchmarks/audit/audit_default.py [--budget 12000] [--out /tmp/audit.json --html /tmp/audit.html]

Prints the audit's own output, its exit status and its wall time (the goal is under 5 minutes on this CPU).
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.testing import serve_process  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=12_000)
    ap.add_argument("--out", default="/tmp/speclab-audit.json")
    ap.add_argument("--html", default="/tmp/speclab-audit.html")
    a = ap.parse_args(argv)
    print(f"# {utc_now()}; {machine()}; load average {load_average()} at start", flush=True)
    exe = str(Path(sys.executable).parent / "speclab")
    with serve_process("--threads", "1", "--seed", "1") as url, \
            serve_process("--draft", "none", "--threads", "1", "--seed", "2") as reference_url:
        t0 = time.perf_counter()
        done = subprocess.run([exe, "audit", "--url", url, "--reference-url", reference_url, "--budget",
                               str(a.budget), "--out", a.out, "--html", a.html, "--quiet"], text=True)
        seconds = time.perf_counter() - t0
    print(f"# exit status {done.returncode}; {seconds:.0f} s wall for the audit; load average {load_average()} "
          "at the end", flush=True)


if __name__ == "__main__":
    main()
