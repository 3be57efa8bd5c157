#!/usr/bin/env python3
"""Install matrix: does `pip install speclab` work where users are?

Builds speclab's wheel once (`python -m build --wheel`, as a user or a release would), then for each row makes a
fresh virtual environment with one Python, installs the wheel into it with plain pip (no constraints file: the
ranges of settings.ini decide), and runs `speclab demo` from a folder outside the repository, so the source tree
cannot be imported. Each row records the install's wall time, what it installed (every distribution's wheel, its
size from pip's log or the local file, and whether it came over the network or from this machine's disk: pip's
configuration here adds local indexes), the venv's size on disk, the torch that came with it (version, CUDA or CPU
build), the demo's verdict and speeds, Chapter 4's Triton kernels in the interpreter (`speclab generate --backend
triton` must give the torch backend's greedy tokens), and Chapter 11's server (`speclab serve`: a completion over
HTTP with the same greedy text, /metrics read by `speclab.remote` through httpx). Rows:

- `fresh`: an empty venv, `pip install speclab-*.whl`.
- `torch-kept`: a venv that already holds torch (the CPU wheel on this machine's disk) before the wheel goes in:
  pip must keep that torch (same version, same file, nothing of torch downloaded).
- `floor`: the lower bounds: every library requirement held to the minor release of its lower bound (`numpy>=1.26`
  becomes `numpy==1.26.*`, the newest 1.26.x), so the bounds settings.ini claims are the ones that run. torch is
  the exception (FLOOR_OVERRIDES): on Linux every torch before 2.13 pins a triton older than 3.7 (PyPI's builds of
  2.10 and 2.11 pin 3.6.0, 2.9 pins 3.5), so 2.13 is the oldest torch that installs beside the triton speclab needs
  there; its CPU build lies on this machine's disk, and no older CPU build can be had here.
- every row also dry-runs `pip install -c constraints.txt speclab-*.whl` (the pins CI runs), to see on which
  Pythons the pinned set resolves.

Each row runs pip with a fresh, private cache directory, so nothing carries over between rows; on the machine this
was measured on, pip's HTTP cache stays empty anyway (its package mirror sends no caching headers), so every row
fetches its wheels anew. Standard library only; it runs for a long time (gigabytes of CUDA wheels): run it in the
background and read the table at the end.

    .venv/bin/python benchmarks/setup/install_matrix.py                  # every row; writes benchmarks/setup/install_matrix.json
    .venv/bin/python benchmarks/setup/install_matrix.py --rows 3.12:fresh --keep --out /tmp/one.json
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path.home() / ".pyenv" / "versions"
DEFAULT_ROWS = ["3.11:floor", "3.11:torch-kept", "3.12:fresh", "3.13:fresh", "3.10:fresh", "3.11:fresh"]
LOCAL_TORCH = sorted(Path("/opt/wheels").glob("torch-*+cpu-cp311-*.whl"))  # this machine's CPU wheel, if any
PROMPT = "def add(a, b):"
FLOOR_OVERRIDES = {"torch": "2.13"}  # see the module doc: the oldest torch that installs beside triton>=3.7 on Linux
UNITS = {"bytes": 1, "B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def log(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", flush=True)


def run(cmd, cwd=None, env=None, timeout=7200) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tail(r: subprocess.CompletedProcess, n=1500) -> str:
    return (r.stdout + r.stderr)[-n:]


def tree_bytes(path: Path) -> int:
    "Bytes of the files under `path` (links not followed)."
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def find_python(version: str) -> Path:
    "The newest pyenv Python `version` (e.g. 3.12) on this machine."
    found = sorted((p for p in PYENV.glob(f"{version}.*") if (p / "bin" / "python").exists()),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)])
    if not found:
        raise SystemExit(f"no pyenv Python {version} under {PYENV}")
    return found[-1] / "bin" / "python"


def clean_env(**extra) -> dict:
    "This environment without anything that would let a venv see the repository or another venv."
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "IN_TEST")}
    env.update(extra)
    return env


def build_wheel(work: Path) -> Path:
    "speclab's wheel, built from a copy of the committed tree with `python -m build --wheel` (isolated build)."
    files = run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    src = work / "src"
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    t0 = time.monotonic()
    r = run([sys.executable, "-m", "build", "--wheel", "--outdir", work / "dist", src], env=clean_env())
    if r.returncode != 0:
        raise SystemExit(f"python -m build failed:\n{tail(r, 4000)}")
    (wheel,) = (work / "dist").glob("speclab-*.whl")
    log(f"built {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - t0:.0f} s")
    return wheel


def pip(venv: Path, *args) -> list:
    "pip (this interpreter's) acting on `venv` (`--python`), so every row uses one pip version."
    return [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", *args]


def parse_sizes(text: str) -> dict:
    "{file name: bytes} from pip's 'Downloading X (size)' and 'Using cached X (size)' lines (metadata files left out)."
    sizes = {}
    for verb, name, num, unit in re.findall(r"(Downloading|Using cached) (\S+) \(([\d.]+) (bytes|B|kB|KB|MB|GB)\)",
                                            text):
        if not name.endswith(".metadata"):
            sizes[Path(name).name] = int(float(num) * UNITS[unit])
    return sizes


def floor_constraints(path: Path) -> Path:
    "settings.ini's library requirements held to the minor release of each lower bound, as a constraints file."
    text = (ROOT / "settings.ini").read_text(encoding="utf-8")
    value = re.search(r"^requirements\s*=\s*(.*?)(?=^\S)", text, re.M | re.S)[1]
    lines = []
    for req in value.split():
        m = re.match(r"([A-Za-z0-9._-]+)[^;]*?>=\s*(\d+(?:\.\d+)?)", req)
        if not m:
            raise SystemExit(f"settings.ini: {req} has no lower bound")
        low = FLOOR_OVERRIDES.get(m[1], m[2] if "." in m[2] else m[2] + ".0")
        lines.append(f"{m[1]}=={low}.*")
    path.write_text("\n".join(lines) + "\n")
    return path


def installed(report: dict, sizes: dict) -> list:
    "One entry per distribution pip installed: name, version, where it came from, its size in bytes."
    out = []
    for item in report.get("install", []):
        url = urllib.parse.unquote(item["download_info"]["url"])
        name = url.rsplit("/", 1)[-1].split("#")[0]
        local = url.startswith("file://")
        size = (os.path.getsize(url[len("file://"):]) if local and os.path.isfile(url[len("file://"):])
                else sizes.get(name))
        out.append({"name": item["metadata"]["name"], "version": item["metadata"]["version"], "file": name,
                    "source": "local disk" if local else url.split("/")[2], "bytes": size})
    return out


def torch_facts(venv: Path, cwd: Path) -> dict:
    "torch's version, CUDA version (None: a CPU build), file and its mtime; triton, transformers, numpy (or None)."
    code = ("import json, os, torch, importlib.metadata as m\n"
            "def v(name):\n"
            "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, 'file': torch.__file__,"
            " 'mtime_ns': os.stat(torch.__file__).st_mtime_ns,"
            " 'triton': v('triton'), 'transformers': v('transformers'), 'numpy': v('numpy')}))")
    r = run([venv / "bin" / "python", "-W", "ignore", "-c", code], cwd=cwd, env=clean_env())
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": tail(r)}


def same_torch(before: dict, after: dict) -> bool:
    "The same torch: version, CUDA, file and modification time."
    keys = ("version", "cuda", "file", "mtime_ns")
    return "error" not in before and all(before.get(k) == after.get(k) for k in keys)


def run_demo(venv: Path, cwd: Path) -> dict:
    "`speclab demo --repeats 1` from outside the repository: its exit status, verdict line and speeds."
    t0 = time.monotonic()
    r = run([venv / "bin" / "speclab", "demo", "--repeats", "1"], cwd=cwd, env=clean_env(), timeout=1800)
    out = r.stdout + r.stderr
    speed = re.search(r"speculative: ([\d.]+) tokens/s\s+plain: ([\d.]+) tokens/s\s+speedup ([\d.]+)x", out)
    return {"rc": r.returncode, "seconds": round(time.monotonic() - t0, 1),
            "identical": "greedy outputs identical to plain decoding: yes" in out,
            "speculative_tok_s": float(speed[1]) if speed else None, "plain_tok_s": float(speed[2]) if speed else None,
            "speedup": float(speed[3]) if speed else None, "tail": out[-800:] if r.returncode else ""}


def generate(venv: Path, cwd: Path, backend: str) -> dict:
    "`speclab generate --json` on the shipped pair, greedy: its first output ({text, token_ids, ...})."
    cmd = [venv / "bin" / "speclab", "generate", "--target", "tiny", "--draft", "tiny", "--temperature", "0",
           "--max-tokens", "24", "--prompt", PROMPT, "--backend", backend, "--json"]
    r = run(cmd, cwd=cwd, env=clean_env(TRITON_INTERPRET="1"), timeout=900)
    if r.returncode != 0:
        return {"failed": tail(r, 800)}
    out = json.loads(r.stdout)["outputs"][0]
    return {"failed": out["error"]} if out.get("error") else out


def run_triton(venv: Path, cwd: Path) -> dict:
    "Chapter 4's kernels in Triton's interpreter emit the torch backend's greedy tokens."
    out = {b: generate(venv, cwd, b) for b in ("torch", "triton")}
    if any("failed" in o for o in out.values()):
        return {"ok": False, **{b: o["failed"] for b, o in out.items() if "failed" in o}}
    return {"ok": out["torch"]["token_ids"] == out["triton"]["token_ids"], "text": out["torch"]["text"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def run_serve(venv: Path, cwd: Path, text: str | None) -> dict:
    """`speclab serve` on the shipped pair (loopback only): a greedy completion over HTTP must give `text` (what
    `speclab generate` printed), and speclab.remote (httpx) must read the model and the spec-decode counters."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = cwd / f"serve-{venv.name}.log"
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([str(venv / "bin" / "speclab"), "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--threads", "1"], cwd=cwd, env=clean_env(), stdout=logf, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                status, body = http(f"{url}/v1/models", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    return {"ok": False, "error": "server did not start: " + log_path.read_text()[-800:]}
                time.sleep(1)
        model = json.loads(body)["data"][0]["id"]
        status, body = http(f"{url}/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 24,
                                                       "temperature": 0})
        served = json.loads(body)["choices"][0]["text"]
        code = ("import sys, httpx, speclab.remote as r\n"
                "c = httpx.Client(timeout=60)\n"
                "m = r.scrape(c, sys.argv[1])\n"
                "print(r.served_model(c, sys.argv[1]), m.num_drafts, m.num_accepted_tokens)")
        r = run([venv / "bin" / "python", "-c", code, url], cwd=cwd, env=clean_env(), timeout=120)
        scraped = r.stdout.split()
        ok = (status == 200 and r.returncode == 0 and scraped[:1] == [model] and served == text
              and int(scraped[1]) > 0)
        return {"ok": ok, "same_text": served == text, "scrape": r.stdout.strip() or tail(r, 600)}
    except Exception as e:  # the row records it; the server is stopped below either way
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def constraints_dry_run(venv: Path, wheel: Path, cache: Path, cwd: Path) -> dict:
    "Does `pip install -c constraints.txt WHEEL` resolve for this Python? (metadata only: --dry-run)"
    r = run(pip(venv, "install", "--dry-run", "--cache-dir", cache, "--progress-bar", "off",
                "-c", ROOT / "constraints.txt", wheel), cwd=cwd, env=clean_env())
    out = (r.stdout + r.stderr).splitlines()
    errors = [line for line in out if line.startswith("ERROR")]
    # pip's explanation: the lines after "The conflict is caused by:", or the "Requires-Python" refusals
    cause = [line.strip() for i, line in enumerate(out) if line.startswith("    ") and
             any(x.startswith("The conflict is caused by") for x in out[max(0, i - 8):i])]
    cause += [line.strip() for line in out if "Requires-Python" in line and not line.startswith("  ")]
    return {"ok": r.returncode == 0, "error": errors[0][:300] if errors else None, "cause": cause[:6]}


def recheck_constraints(result: dict, work: Path) -> None:
    "Rerun each fresh row's constraints dry-run (in a bare venv of its Python) and store it in the row."
    result["constraints_date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    wheel = work / "dist" / result["wheel"]
    if not wheel.exists():
        wheel = build_wheel(work)
    for row in result["rows"]:
        if row.get("kind") != "fresh" or "python" not in row:
            continue
        venv, cwd = work / f"recheck-{row['python']}", work / "elsewhere"
        cwd.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(venv, ignore_errors=True)
        run([find_python(row["python"].rsplit(".", 1)[0]), "-m", "venv", "--without-pip", venv])
        log(f"{row['row']}: pip install --dry-run -c constraints.txt")
        row["constraints"] = constraints_dry_run(venv, wheel, work / "pip-cache-recheck", cwd)
        shutil.rmtree(venv, ignore_errors=True)


def one_row(spec: str, wheel: Path, work: Path, keep: bool) -> dict:
    version, kind = spec.split(":")
    if kind not in ("fresh", "torch-kept", "floor"):
        raise SystemExit(f"unknown row kind {kind!r} in {spec!r}")
    python = find_python(version)
    venv, cwd, cache = work / f"venv-{version}-{kind}", work / "elsewhere", work / f"pip-cache-{version}-{kind}"
    cwd.mkdir(exist_ok=True)
    for d in (venv, cache):
        shutil.rmtree(d, ignore_errors=True)
    version_of = run([python, "-c", "import platform; print(platform.python_version())"]).stdout.strip()
    row = {"row": spec, "python": version_of, "kind": kind}
    r = run([python, "-m", "venv", "--without-pip", venv])
    if r.returncode != 0:
        return {**row, "error": f"venv: {tail(r)}"}
    before_torch = None
    if kind == "torch-kept":
        if not LOCAL_TORCH:
            return {**row, "error": "no local CPU torch wheel in /opt/wheels"}
        r = run(pip(venv, "install", "--cache-dir", cache, "--progress-bar", "off", LOCAL_TORCH[-1]), cwd=cwd,
                env=clean_env())
        if r.returncode != 0:
            return {**row, "error": f"installing the local torch: {tail(r)}"}
        before_torch = torch_facts(venv, cwd)
        row["torch_before"] = before_torch
    report_path = work / f"report-{version}-{kind}.json"
    extra = ["-c", floor_constraints(work / "floor.txt")] if kind == "floor" else []
    log(f"{spec}: pip install {wheel.name} with Python {row['python']}")
    t0 = time.monotonic()
    r = run(pip(venv, "install", "--cache-dir", cache, "--progress-bar", "off", "--report", report_path, *extra,
                wheel), cwd=cwd, env=clean_env())
    row["install_s"] = round(time.monotonic() - t0, 1)
    row["install_rc"] = r.returncode
    (work / f"pip-{version}-{kind}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        log(f"{spec}: pip failed after {row['install_s']} s")
        return {**row, "error": f"pip install: {tail(r)}"}
    dists = installed(json.loads(report_path.read_text()), parse_sizes(r.stdout + r.stderr))
    row["installed"] = dists
    row["wheels_bytes"] = sum(d["bytes"] or 0 for d in dists)
    row["wheels_unknown_size"] = [d["file"] for d in dists if d["bytes"] is None]
    row["local_disk_bytes"] = sum(d["bytes"] or 0 for d in dists if d["source"] == "local disk")
    row["network_bytes"] = row["wheels_bytes"] - row["local_disk_bytes"]
    row["pip_cache_bytes"] = tree_bytes(cache) if cache.exists() else 0
    row["venv_bytes"] = tree_bytes(venv)
    row["pip_downloaded_torch"] = bool(re.search(r"^\s*(Downloading|Using cached) torch-", r.stdout, re.M))
    row["torch"] = torch_facts(venv, cwd)
    if before_torch is not None:
        row["torch_kept"] = (same_torch(before_torch, row["torch"]) and not row["pip_downloaded_torch"]
                             and not any(d["name"] == "torch" for d in dists))
    log(f"{spec}: installed in {row['install_s']} s, {row['network_bytes'] / 1e6:.0f} MB over the network, "
        f"torch {row['torch'].get('version')}; running speclab demo")
    row["demo"] = run_demo(venv, cwd)
    log(f"{spec}: demo exit {row['demo']['rc']}, identical {row['demo']['identical']}; triton backend")
    row["triton_backend"] = run_triton(venv, cwd)
    log(f"{spec}: triton {row['triton_backend'].get('ok')}; speclab serve")
    row["serve"] = run_serve(venv, cwd, row["triton_backend"].get("text"))
    row["constraints"] = constraints_dry_run(venv, wheel, cache, cwd)
    log(f"{spec}: serve {row['serve'].get('ok')}, constraints resolve {row['constraints']['ok']}")
    if not keep:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return row


def mb(n) -> str:
    return "?" if n is None else f"{n / 1e6:,.0f}"


def table(rows: list) -> str:
    head = ("| Python | row | pip install (s) | wheels installed (MB) | over the network (MB) | from local disk (MB) "
            "| venv on disk (MB) | torch | triton | speclab demo | Triton kernels | speclab serve "
            "| -c constraints.txt |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r and "torch" not in r:
            lines.append(f"| {r.get('python')} | {r['kind']} | {r.get('install_s', '')} | | | | | | | "
                         f"failed: {r['error'][:200].replace('|', '/')} | | | |")
            continue
        t = r["torch"]
        build = "CPU" if t.get("cuda") is None else f"CUDA {t['cuda']}"
        torch = f"{t.get('version')} ({build})" + (", kept" if r.get("torch_kept") else "")
        if r.get("torch_kept") is False:
            torch += ", NOT kept"
        d = r["demo"]
        demo = (f"exit {d['rc']}, identical: {'yes' if d['identical'] else 'no'}, {d['speedup']}x"
                if d["rc"] == 0 else f"exit {d['rc']}")
        c = r["constraints"]
        cons = "resolves" if c["ok"] else "fails (why: below)"
        tri = "same tokens" if r["triton_backend"].get("ok") else "FAILED"
        srv = "same text, /metrics read" if r["serve"].get("ok") else "FAILED"
        lines.append(f"| {r['python']} | {r['kind']} | {r['install_s']} | {mb(r['wheels_bytes'])} | "
                     f"{mb(r['network_bytes'])} | {mb(r['local_disk_bytes'])} | {mb(r['venv_bytes'])} | {torch} | "
                     f"{t.get('triton')} | {demo} | {tri} | {srv} | {cons} |")
    return "\n".join(lines)


def triton_versions(versions: list, work: Path) -> list:
    """tests/test_kernels.py (Chapter 4's kernels against the torch reference, in Triton's interpreter) with each
    Triton version in turn, put in front of this venv's own (`pip install --target`, PYTHONPATH): which versions
    the kernels need, so the range in settings.ini starts at one that passes."""
    out = []
    for v in versions:
        target = work / f"triton-{v}"
        if not (target / "triton").is_dir():
            r = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target,
                     f"triton=={v}"], env=clean_env())
            if r.returncode != 0:
                out.append({"triton": v, "error": tail(r, 400)})
                continue
        log(f"tests/test_kernels.py with triton {v}")
        t0 = time.monotonic()
        r = run([sys.executable, "-m", "pytest", "tests/test_kernels.py", "-q", "-x", "-n", "0", "-p",
                 "no:cacheprovider"], cwd=ROOT, env=clean_env(PYTHONPATH=str(target), TRITON_INTERPRET="1"),
                timeout=1800)
        text = r.stdout + r.stderr
        passed = re.search(r"(\d+) passed", text)
        failed = re.search(r"(\d+) failed", text)
        first = next((line[2:].strip() for line in text.splitlines() if line.startswith("E ")), None)
        out.append({"triton": v, "rc": r.returncode, "passed": int(passed[1]) if passed else 0,
                    "failed": int(failed[1]) if failed else 0, "first_error": first,
                    "seconds": round(time.monotonic() - t0, 1)})
    return out


def lscpu() -> str:
    "The lines of `lscpu` that say what machine this is (of its flags, only whether it has AVX-512)."
    keep = ("Architecture", "CPU(s)", "Model name", "Thread(s) per core", "Core(s) per socket")
    out = run(["lscpu"]).stdout.splitlines()
    lines = [line for line in out if line.split(":")[0].strip() in keep]
    flags = next((line for line in out if line.startswith("Flags:")), "")
    return "\n".join(lines + [f"AVX-512 (avx512f flag): {'yes' if ' avx512f' in flags else 'no'}"])


def pip_caps(config: list) -> str:
    "What the constraint files of pip's configuration hold (they cap what every row could get), as a Markdown line."
    caps = []
    for line in config:
        m = re.match(r"\S*constraint='([^']+)'", line)
        if m and Path(m[1]).is_file():
            pins = [x.strip() for x in Path(m[1]).read_text().splitlines() if x.strip() and not x.startswith("#")]
            caps.append(f"`{m[1]}` holds {', '.join(f'`{x}`' for x in pins)}")
    line = "- Every row ran under this machine's pip constraints: " + "; ".join(sorted(set(caps)))
    if not caps:
        return ""
    return textwrap.fill(line + ": they cap what a row can install", 118, subsequent_indent="  ") + "\n"


def render(result: dict, out: Path) -> None:
    "benchmarks/setup/install_matrix.md: date, machine, pip, the command, the table, and what each column means."
    rows = result["rows"]
    checked = ""
    if "constraints_date" in result:
        checked = f", rerun on {result['constraints_date']} (`--recheck-constraints`)"
    body = f"""# Install matrix

Written by `benchmarks/setup/install_matrix.py` from `benchmarks/setup/install_matrix.json`; rerun it to refresh.

- Date: {result["date"]} (UTC)
- Machine (`lscpu`, `free -g`): {run(["nproc"]).stdout.strip()} cores, \
{run(["free", "-g"]).stdout.splitlines()[1].split()[1]} GiB of memory

```
{lscpu()}
```

- Command: `.venv/bin/python benchmarks/setup/install_matrix.py` (in the background, `nohup ... &`: 20 minutes here)
- Wheel: `{result["wheel"]}`, built with `python -m build --wheel` from the committed tree
- pip: {result["pip"]} (one pip for every row: `pip --python VENV/bin/python install`); its configuration here:
{chr(10).join("  - `" + line + "`" for line in result["pip_config"])}
{pip_caps(result["pip_config"])}
{table(rows)}

- *pip install (s)*: the wall time of `pip install` of the wheel, downloads included, on a machine other work shared.
  pip's HTTP cache stays empty here (the package mirror sends no caching headers), so every row fetched anew.
- *wheels installed*: every distribution pip installed, at its wheel's size; *over the network*: the part fetched
  from the package index; *from local disk*: the part found in this machine's local indexes and find-links folder
  (pip's configuration above). A user without those fetches all of it.
- *venv on disk*: the virtual environment's size after the install.
- *speclab demo*: `speclab demo --repeats 1` from a folder outside the repository; its greedy verdict and speedup
  (speeds depend on the machine and its load: not a benchmark).
- *Triton kernels*: `speclab generate --backend triton` in Triton's interpreter (`TRITON_INTERPRET=1`) gives the
  same greedy tokens as `--backend torch`.
- *speclab serve*: a greedy completion over HTTP gives `speclab generate`'s text, and `speclab.remote` (httpx)
  reads the model and the spec-decode counters from /metrics.
- *-c constraints.txt*: `pip install --dry-run -c constraints.txt` of the wheel (the pins CI runs){checked}.
- Rows: `fresh` is an empty venv; `torch-kept` a venv that held torch 2.13.0+cpu before the wheel went in (kept:
  same version and file, nothing of torch fetched); `floor` holds every requirement to the minor release of its
  lower bound (torch to 2.13: see the script's doc).
"""
    for r in rows:
        if r.get("constraints") and not r["constraints"]["ok"]:
            why = "; ".join(r["constraints"].get("cause") or []) or r["constraints"]["error"]
            body += "\n" + textwrap.fill(f"`-c constraints.txt` on Python {r['python']} fails: {why}", 118) + "\n"
        if r.get("kind") == "floor" and "installed" in r:
            names = ("numpy", "scipy", "matplotlib", "tqdm", "torch", "triton", "transformers", "pydantic", "fastapi",
                     "uvicorn", "prometheus_client", "prometheus-client", "httpx")
            got = ", ".join(f"{d['name']} {d['version']}" for d in r["installed"] if d["name"] in names)
            body += "\n" + textwrap.fill(f"The floor row installed: {got}.", 118) + "\n"
        if "error" in r:
            body += f"\nRow {r['row']} failed: `{r['error'][:400]}`\n"
    if result.get("triton_versions"):
        body += ("\n## Triton versions and Chapter 4's kernels\n\n`tests/test_kernels.py` in Triton's interpreter, "
                 "each Triton in front of the CI venv's own\n(`--triton-versions`; torch 2.13.0+cpu, numpy of "
                 "constraints.txt; `-x`: it stops at the first failure):\n\n"
                 "| triton | passed | failed | first error |\n|---|---|---|---|\n")
        for x in result["triton_versions"]:
            err = (x.get("first_error") or x.get("error") or "").replace("|", "/")[:110]
            body += f"| {x['triton']} | {x.get('passed', '')} | {x.get('failed', '')} | {err} |\n"
    out.write_text(body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="comma-separated PYTHON:KIND (fresh, torch-kept)")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    ap.add_argument("--wheel", type=Path, default=None, help="a built speclab wheel (default: build one)")
    ap.add_argument("--keep", action="store_true", help="keep each row's venv")
    ap.add_argument("--merge", action="store_true", help="keep --out's other rows; replace those run again")
    ap.add_argument("--triton-versions", default=None,
                    help="only run tests/test_kernels.py with each of these Triton versions (e.g. 3.6.0,3.7.1), "
                         "into --out's JSON and .md (stop at the first failure: -x)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "setup" / "install_matrix.json")
    ap.add_argument("--render", action="store_true", help="only write the .md beside --out from its JSON")
    ap.add_argument("--recheck-constraints", action="store_true",
                    help="only rerun the fresh rows' `-c constraints.txt` dry-runs, into --out's JSON and .md")
    args = ap.parse_args()
    if args.triton_versions:
        result = json.loads(args.out.read_text())
        work = args.work or Path(tempfile.mkdtemp(prefix="speclab-install-matrix-"))
        result["triton_versions"] = triton_versions(args.triton_versions.split(","), work)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.render = True
    if args.recheck_constraints:
        result = json.loads(args.out.read_text())
        recheck_constraints(result, args.work or Path(tempfile.mkdtemp(prefix="speclab-install-matrix-")))
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.render = True
    if args.render:
        render(json.loads(args.out.read_text()), args.out.with_suffix(".md"))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="speclab-install-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work folder {work}")
    wheel = args.wheel or build_wheel(work)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": platform.machine(),
              "pip": run([sys.executable, "-m", "pip", "--version"]).stdout.split(" from ")[0],
              "pip_config": run([sys.executable, "-m", "pip", "config", "list"]).stdout.splitlines(),
              "wheel": wheel.name, "rows": []}
    earlier = json.loads(args.out.read_text())["rows"] if args.merge and args.out.exists() else []
    for spec in args.rows.split(","):
        try:
            row = one_row(spec.strip(), wheel, work, args.keep)
        except Exception as e:  # one broken row must not lose the others
            row = {"row": spec, "kind": spec.split(":")[-1], "python": spec.split(":")[0],
                   "error": f"{type(e).__name__}: {e}"}
        result["rows"].append(row)
        done = {r["row"] for r in result["rows"]}
        merged = {**result, "rows": [r for r in earlier if r["row"] not in done] + result["rows"]}
        args.out.write_text(json.dumps(merged, indent=1) + "\n")   # after every row: a killed run keeps what it had
    result = merged
    render(result, args.out.with_suffix(".md"))
    print(table(result["rows"]))
    return 0 if all("error" not in r for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
