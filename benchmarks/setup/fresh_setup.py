#!/usr/bin/env python3
"""The README's set-up on a fresh machine, measured: what a stranger who clones speclab meets.

Each row makes a fresh clone of the committed tree and runs the README's two commands verbatim (read from README.md
the way .ci/run reads them), with pip seeing PyPI alone: no configuration file (PIP_CONFIG_FILE=/dev/null, which
skips the global files that `--isolated` still reads), no PIP_ variable, and a private, empty cache, so every wheel
is downloaded. `python3` is the row's Python (its own bin folder first on PATH). Rows, as PYTHON:KIND:

- `3.12:pypi`: nothing installed first. On Linux, PyPI's torch is its CUDA build, with its nvidia-* libraries.
- `3.11:cpu-first`: PyTorch's CPU build first, as the README says for machines without a GPU (`pip install torch
  --index-url https://download.pytorch.org/whl/cpu`). That index cannot be reached where this was measured, so the
  CPU wheel named by --cpu-wheel stands in for it; the set-up command must then keep that torch.

Each row records the wall time of each phase, the bytes of the wheels pip downloaded (from its own log), the size of
the virtual environment, the torch that came with it, the demo's speed line and, with --tests, the test command's
wall time and pytest's closing line. Standard library only. A row with --tests runs for most of an hour:

    python3 benchmarks/setup/fresh_setup.py --rows 3.12:pypi --tests          # the two commands, end to end
    python3 benchmarks/setup/fresh_setup.py --rows 3.11:cpu-first --cpu-wheel torch-2.13.0+cpu-cp311-...whl
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks" / "setup"))
import pins  # noqa: E402  (the stranger's environment for pip; find_python)
from install_matrix import tree_bytes  # noqa: E402

UNITS = {"bytes": 1, "B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def log(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", flush=True)


def readme_commands() -> list[str]:
    "The README's two commands, as .ci/run extracts them (`bash .ci/run --dry-run`)."
    r = subprocess.run(["bash", ".ci/run", "--dry-run"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [line.split(":", 1)[1].strip() for line in r.stdout.splitlines() if line.startswith(("setup", "test"))]


def downloaded_bytes(text: str) -> int:
    "Bytes of the files pip's log says it downloaded ('Downloading NAME (SIZE)'), metadata files left out."
    sizes = {}
    for name, num, unit in re.findall(r"Downloading (\S+) \(([\d.]+) (bytes|B|kB|KB|MB|GB)\)", text):
        if not name.endswith(".metadata"):
            sizes[Path(name).name] = int(float(num) * UNITS[unit])
    return sum(sizes.values())


def phase(name: str, cmd: str, cwd: Path, env: dict, logs: Path) -> dict:
    "Run one shell command as the README shows it; its exit status, wall time and the tail of its output."
    log(f"{name}: {cmd}")
    t0 = time.monotonic()
    with open(logs / f"{name}.log", "w") as f:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=env, stdout=f,
                           stderr=subprocess.STDOUT)
    text = (logs / f"{name}.log").read_text(errors="replace")
    out = {"command": cmd, "rc": r.returncode, "seconds": round(time.monotonic() - t0, 1),
           "downloaded_bytes": downloaded_bytes(text), "tail": text[-1500:]}
    log(f"{name}: exit {r.returncode} after {out['seconds']} s")
    return out


def torch_facts(venv: Path) -> dict:
    code = "import torch, json; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda}))"
    r = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-500:]}


def one_row(spec: str, work: Path, cpu_wheel: Path | None, tests: bool) -> dict:
    version, kind = spec.split(":")
    exe = pins.find_python(version)
    if exe is None:
        return {"row": spec, "error": f"no Python {version} here"}
    bin_dir = Path(exe).resolve().parent        # a real folder: the venv's `home` must outlive this run's files
    if not (bin_dir / "python3").exists():
        return {"row": spec, "error": f"no python3 beside {exe}"}
    row_dir = work / spec.replace(":", "-")
    shutil.rmtree(row_dir, ignore_errors=True)
    clone, logs = row_dir / "speclab", row_dir / "logs"
    logs.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = pins.pypi_only_env()
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PIP_CACHE_DIR=str(row_dir / "pip-cache"))
    setup, test = readme_commands()
    row = {"row": spec, "python": subprocess.run([exe, "-V"], capture_output=True, text=True).stdout.split()[1],
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                                    text=True).stdout.strip(), "phases": {}}
    if kind == "cpu-first":
        if cpu_wheel is None:
            return {**row, "error": "cpu-first needs --cpu-wheel (PyTorch's CPU build of the pinned torch)"}
        first = f"python3 -m venv .venv && .venv/bin/pip install {cpu_wheel}"
        row["phases"]["torch-cpu"] = phase("torch-cpu", first, clone, env, logs)
        row["phases"]["torch-cpu"]["downloaded_bytes"] = cpu_wheel.stat().st_size   # what the CPU index would send
        row["torch_before"] = torch_facts(clone / ".venv")
    elif kind != "pypi":
        return {**row, "error": f"unknown kind {kind!r}: pypi or cpu-first"}
    row["phases"]["setup"] = phase("setup", setup, clone, env, logs)
    row["venv_bytes"] = tree_bytes(clone / ".venv")
    row["torch"] = torch_facts(clone / ".venv")
    speed = re.search(r"speculative: [\d.]+ tokens/s\s+plain: [\d.]+ tokens/s\s+speedup [\d.]+x",
                      (logs / "setup.log").read_text(errors="replace"))
    row["demo_line"] = speed[0] if speed else None
    if tests and row["phases"]["setup"]["rc"] == 0:
        row["phases"]["tests"] = phase("tests", test, clone, env, logs)
        text = (logs / "tests.log").read_text(errors="replace")
        closing = re.findall(r"^=+ (.*\d+ (?:passed|failed).*) =+$", text, re.M)
        row["pytest"] = closing[-1] if closing else None
        row["not_passed"] = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
        row["skipped"] = re.findall(r"^SKIPPED \[(\d+)\] (.*)$", text, re.M)     # pytest -rs: [count, where: why]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="3.12:pypi", help="comma-separated PYTHON:KIND (pypi, cpu-first)")
    ap.add_argument("--cpu-wheel", type=Path, default=None, help="PyTorch's CPU wheel of the pinned torch")
    ap.add_argument("--tests", action="store_true", help="also run the README's test command")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "setup" / "fresh_setup.json")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="speclab-fresh-setup-"))
    log(f"work folder {work}")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.*)", lscpu)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": platform.machine(),
              "cpu": model[1].strip() if model else None, "cores": os.cpu_count(), "rows": []}
    earlier = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    for spec in args.rows.split(","):
        result["rows"].append(one_row(spec.strip(), work, args.cpu_wheel, args.tests))
        done = {r["row"] for r in result["rows"]}
        merged = {**result, "rows": [r for r in earlier if r["row"] not in done] + result["rows"]}
        args.out.write_text(json.dumps(merged, indent=1) + "\n")   # after every row: a killed run keeps what it had
    for r in result["rows"]:
        phases = ", ".join(f"{k} exit {p['rc']} in {p['seconds']} s ({p['downloaded_bytes'] / 1e6:,.0f} MB fetched)"
                           for k, p in r.get("phases", {}).items())
        print(f"{r['row']}: Python {r.get('python')}, torch {r.get('torch')}, venv "
              f"{r.get('venv_bytes', 0) / 1e6:,.0f} MB; {phases}; demo: {r.get('demo_line')}; pytest: "
              f"{r.get('pytest')}{'; error: ' + r['error'] if 'error' in r else ''}")
    ok = all("error" not in r and all(p["rc"] == 0 for p in r["phases"].values()) for r in result["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
