"""How long a student waits for each chapter: `nbdev_test --path` on every notebook, one at a time, wall seconds.

    .venv/bin/python benchmarks/suite/chapter_times.py                 # as a student runs a chapter (slow cells skipped)
    .venv/bin/python benchmarks/suite/chapter_times.py --flags slow    # as CI runs it (slow cells included)

Prints one row per notebook and the machine's load average before each run, so a busy machine shows in the table.
A measurement, not a test: nothing here passes or fails on time.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flags", default="", help="nbdev_test --flags (e.g. 'slow'); empty: what a student runs")
    p.add_argument("notebooks", nargs="*", help="notebooks to time (default: every notebook in nbs/)")
    a = p.parse_args()
    nbs = a.notebooks or sorted(str(q.relative_to(ROOT)) for q in (ROOT / "nbs").glob("*.ipynb"))
    print(f"nbdev_test --path NB {('--flags ' + repr(a.flags)) if a.flags else ''} on {os.cpu_count()} cores")
    print(f"{'notebook':<26} {'load':>5} {'seconds':>8}  result")
    for nb in nbs:
        cmd = [str(BIN / "nbdev_test"), "--path", nb] + (["--flags", a.flags] if a.flags else [])
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        secs = time.perf_counter() - t0
        print(f"{nb:<26} {load:5.1f} {secs:8.1f}  {'ok' if r.returncode == 0 else 'FAILED'}", flush=True)


if __name__ == "__main__":
    main()
