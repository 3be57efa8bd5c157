#!/usr/bin/env python3
"""Write constraints.txt: the exact versions CI runs, for every Python speclab claims, resolved against PyPI alone.

settings.ini holds ranges (what `pip install speclab` accepts); constraints.txt holds one exact version of every
distribution that `pip install -e ".[dev]"` can pull in, on Linux, macOS and Windows and on every Python from
settings.ini's min_python up. Where one version cannot serve every Python (numpy 2.4 needs Python 3.11, say), the file
has one line per version with an environment marker, so one file serves every claimed Python. The pins agree with
what PyPI's own wheels pin: torch's CUDA build pins its triton and its nvidia-* libraries exactly, and those pins are
here too.

It runs `uv pip compile --universal` against PyPI with no configuration of this machine (no local wheels, no extra
index, no pip or uv configuration files). The current constraints.txt is uv's preference: every pin that still
resolves is kept, so a regeneration changes only what must change. To move to newer versions on purpose, pass
`--upgrade` (everything) or `--upgrade-package NAME` (one).

    python tools/pins.py                           # rewrite constraints.txt
    python tools/pins.py --check                   # exit 1, with the difference, if constraints.txt is out of date
    python tools/pins.py --upgrade-package torch   # move one package to its newest version that resolves

It needs uv (the dev extra installs it: `.venv/bin/python tools/pins.py`) and PyPI.
"""
import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
PYPI = "https://pypi.org/simple"
HEADER = """\
# The exact versions CI runs: `pip install -c constraints.txt -e ".[dev]"` (the README's set-up command) on Linux,
# macOS or Windows, on Python {min_python} or newer, with PyPI as the only index. One line per distribution, or one
# line per version with an environment marker where one version cannot serve every Python. torch==X is PyPI's torch
# X (on Linux, its CUDA build with the triton and nvidia-* libraries pinned below) or, where it is installed first,
# PyTorch's CPU build X+cpu, which these pins accept as well. settings.ini holds the ranges `pip install speclab`
# accepts. Written by tools/pins.py (uv pip compile --universal); do not edit by hand:
#     .venv/bin/python tools/pins.py             (keeps every pin that still resolves)
#     .venv/bin/python tools/pins.py --upgrade   (newest versions of everything)
"""


def min_python() -> str:
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]["min_python"]


def uv_command() -> list[str]:
    "uv from this venv (the dev extra) or from PATH."
    try:
        from uv import find_uv_bin
        return [find_uv_bin()]
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            sys.exit("tools/pins.py needs uv: pip install uv (the dev extra has it)")
        return [found]


def clean_env() -> dict:
    "This process's environment without pip's or uv's settings, so no machine's configuration steers the resolver."
    return {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}


def pypi_only_env(base: dict | None = None) -> dict:
    """An environment in which pip sees what it sees on a stranger's machine: PyPI alone, no configuration file
    (PIP_CONFIG_FILE=/dev/null skips every one, the global and site files that `--isolated` still reads), no PIP_ or
    UV_ variable. Only the transport is kept: where this machine's pip names a CA bundle (PIP_CERT), requests inside
    pip and inside its build subprocesses trust it through REQUESTS_CA_BUNDLE; resolution does not change."""
    env = clean_env() if base is None else {k: v for k, v in base.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    cert = (base or os.environ).get("PIP_CERT")
    if cert and "REQUESTS_CA_BUNDLE" not in env:
        env["REQUESTS_CA_BUNDLE"] = cert
    return env


def find_python(version: str) -> str | None:
    "An interpreter of `version` (such as 3.12) here: on PATH or in pyenv's versions folder; None if none runs."
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in pyenv.glob(f"{version}.*/bin/python{version}"))
    want = str(tuple(map(int, version.split("."))))
    for exe in filter(None, candidates):
        code = "import sys, venv; print(sys.version_info[:2])"
        r = subprocess.run([exe, "-c", code], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == want:
            return exe
    return None


def compile_pins(out: Path, upgrade: list[str] | None = None) -> str:
    """Resolve speclab[dev] for every platform and Python >= min_python into `out` (whose pins uv prefers);
    returns the file's new text, header included. `upgrade`: [] for everything, or package names."""
    cmd = uv_command() + ["pip", "compile", "--universal", "--python-version", min_python(), "--no-config",
                          "--no-python-downloads", "--index-url", PYPI, "--no-annotate", "--no-header",
                          "--extra", "dev", "-o", str(out), "pyproject.toml"]
    if upgrade == []:
        cmd.append("--upgrade")
    for name in upgrade or []:
        cmd += ["--upgrade-package", name]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"uv pip compile failed ({r.returncode}):\n{r.stderr}")
    text = HEADER.format(min_python=min_python()) + out.read_text(encoding="utf-8")
    out.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="re-resolve into a temporary file; exit 1 if they differ")
    ap.add_argument("--upgrade", action="store_true", help="newest versions of everything")
    ap.add_argument("--upgrade-package", action="append", default=[], metavar="NAME", help="newest NAME (repeat)")
    args = ap.parse_args(argv)
    upgrade = [] if args.upgrade else args.upgrade_package or None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "constraints.txt"
        shutil.copyfile(CONSTRAINTS, out)
        new = compile_pins(out, upgrade)
    old = CONSTRAINTS.read_text(encoding="utf-8")
    if args.check:
        if new == old:
            print(f"constraints.txt is what tools/pins.py writes ({len(new.splitlines())} lines)")
            return 0
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "constraints.txt", "tools/pins.py",
                                    lineterm="")
        print("constraints.txt is out of date; run `python tools/pins.py`:", *diff, sep="\n")
        return 1
    CONSTRAINTS.write_text(new, encoding="utf-8")
    pins = [line for line in new.splitlines() if line and not line.startswith("#")]
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}: {len(pins)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
