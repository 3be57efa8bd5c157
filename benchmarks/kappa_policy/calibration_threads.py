"""`--kappa auto`'s start-up calibration at two torch thread counts, beside busy processes: how long it takes and
what it prices a step at.

    python benchmarks/kappa_policy/calibration_threads.py [--busy 1] [--threads 2 1] [--repeats 2] [--out FILE]

Starts `--busy` processes that spin a core each, waits a second, then calibrates the shipped pair with the draft model
(`speclab.cli.load_decoder("tiny", "tiny", kappa="auto")`, kappa 0..4, the same call `speclab demo` makes) at each
thread count in turn, `--repeats` times, and stops the busy processes. Per calibration: the thread count, its
seconds, whether the costs were refused (and why), a step's fixed cost, a target position's and a draft forward's.
`speclab demo` decodes with the idle cores' worth of threads (one, beside one busy process on 2 cores): a calibration
at another count prices steps the demo never runs. No timing is asserted.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def calibrate_once(threads: int) -> dict:
    "One calibration of the shipped pair at `threads` torch threads."
    from speclab.cli import load_decoder
    from speclab.sweep import torch_threads
    cals = []
    with torch_threads(threads):
        load_decoder("tiny", "tiny", None, kappa="auto", prefix_caching=False, kappa_max=4, on_calibration=cals.append)
    c = cals[0].costs
    return {"threads": threads, "seconds": round(cals[0].seconds, 2), "problem": cals[0].problem,
            "verify_ms": round(1e3 * c.verify_s, 2), "position_ms": round(1e3 * c.verify_token_s, 3),
            "draft_forward_ms": round(1e3 * (c.draft_s + c.draft_request_s), 2)}


def main(argv: list[str] | None = None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=1, help="busy processes beside the calibrations (default 1)")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="torch thread counts (default 2 1)")
    ap.add_argument("--repeats", type=int, default=2, help="calibrations per thread count (default 2)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.busy < 0 or a.repeats < 1 or min(a.threads) < 1:
        ap.error("--busy must be >= 0, --repeats and --threads >= 1")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    rows = []
    try:
        time.sleep(1)
        for r in range(a.repeats):
            for threads in a.threads:
                row = calibrate_once(threads) | {"repeat": r + 1, "load": round(os.getloadavg()[0], 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for p in spinners:
            p.kill()
    if a.out:
        record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
                  platform.machine(), "cpus": os.cpu_count(), "busy": a.busy, "rows": rows}
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
