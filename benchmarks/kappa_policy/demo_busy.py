"""`speclab demo` beside one busy process: `--kappa auto` (the default) against a fixed kappa 3, run after run.

    .venv/bin/python benchmarks/kappa_policy/demo_busy.py [--runs 3] [--busy 1] [--out FILE]

Each run starts `--busy` processes that spin a core each (`python3 -c "while True: pass"`), waits 2 s, then runs
`speclab demo` and `speclab demo --kappa 3` one after the other (the order alternating from run to run), and stops
the busy processes. From each demo's own last lines it keeps the speculative and plain tokens/s, the speedup, the
calibration line and whether greedy output matched plain decoding. Prints one row per demo and, per run, auto's
speculative tokens/s over kappa 3's; writes the rows to `--out` as JSON. No timing is asserted.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

SPEED = re.compile(r"speculative: ([\d.]+) tokens/s\s+plain: ([\d.]+) tokens/s\s+speedup ([\d.]+)x")


def speclab() -> str:
    "The `speclab` console script of this Python's environment."
    return str(Path(sys.executable).with_name("speclab"))


def demo(flags: list[str]) -> dict:
    "One `speclab demo` run: its speeds, calibration line, exactness and wall time."
    t0 = time.perf_counter()
    p = subprocess.run([speclab(), "demo", *flags], capture_output=True, text=True, timeout=900)
    m = SPEED.search(p.stdout)
    if p.returncode != 0 or m is None:
        raise RuntimeError(f"speclab demo {' '.join(flags)} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    calibration = next((line for line in p.stdout.splitlines() if line.startswith("speclab demo: calibrated")), None)
    planned = next((line for line in p.stdout.splitlines() if line.startswith("The policy planned")), None)
    return {"flags": flags, "speculative_tok_s": float(m[1]), "plain_tok_s": float(m[2]), "speedup": float(m[3]),
            "identical": "greedy outputs identical to plain decoding: yes" in p.stdout,
            "calibration": calibration, "planned": planned, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="busy processes beside the demo (default 1)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.runs < 1 or a.busy < 0:
        ap.error("--runs must be >= 1 and --busy >= 0")
    rows = []
    for run in range(1, a.runs + 1):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            time.sleep(2)
            order = [[], ["--kappa", "3"]] if run % 2 else [["--kappa", "3"], []]
            for flags in order:
                row = demo(flags) | {"run": run, "load": os.getloadavg()[0]}
                rows.append(row)
                print(f"run {run} {'auto' if not flags else 'kappa 3':>7}: {row['speculative_tok_s']:.1f} tokens/s "
                      f"(plain {row['plain_tok_s']:.1f}, {row['speedup']:.2f}x), identical {row['identical']}",
                      flush=True)
        finally:
            for s in spinners:
                s.kill()
        auto, fixed = (next(r for r in rows if r["run"] == run and (r["flags"] == f)) for f in ([], ["--kappa", "3"]))
        print(f"run {run}: auto / kappa 3 = {auto['speculative_tok_s'] / fixed['speculative_tok_s']:.3f}"
              f"  ({auto['calibration']})", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                           "machine": platform.processor(), "cpus": os.cpu_count(), "busy": a.busy,
                                           "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
