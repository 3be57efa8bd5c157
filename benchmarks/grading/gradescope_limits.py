"""Gradescope's limits, measured: each lab's master notebook graded as Gradescope grades it, under its default limits.

Gradescope's documented defaults for an autograder container: 768 MB of memory, half a virtual CPU, a 10-minute
timeout (40 minutes at most). This script builds each lab's Gradescope bundle (`write_gradescope`, as `speclab grade
--gradescope` does), lays it out as Gradescope does (a fresh /autograder: the bundle in source/, the master notebook in
submission/, an empty results/, the environment at /autograder/speclab-venv), and runs the bundle's own
`run_autograder` in a private mount namespace, inside a memory cgroup and a CPU quota, once per setting:

- the memory limits of `--memories` (MB; 768 is Gradescope's default) with the CPU quota of `--cpus`;
- no memory limit with the same CPU quota: the true peak;
- no limit at all: the time on this machine's free cores, for comparison.

For each run: the score (a pass is every point), the wall time, the peak of the cgroup's anonymous memory (sampled
every 0.1 s: the memory no limit can reclaim; it is the processes' resident memory less their files), the kernel's
peak of the cgroup's usage (page cache included, which a limit reclaims), OOM kills, and CPU seconds.

    .venv/bin/python benchmarks/grading/gradescope_limits.py [--labs 06_kv,08_acceptance,09_audit] [--memories 768,1024,1536]
        [--cpus 0.5] [--timeout 600] [--venv DIR | --image DIR]

`--venv` is the environment bound at /autograder/speclab-venv: by default this Python's (the project's .venv);
`--image DIR` builds the one Gradescope would (the bundle's setup.sh, run once in DIR) and uses it. Needs root, the
grader's sandbox (unshare, setpriv) and a writable cgroup file system (v2, or v1's memory and cpu controllers). It
prints a table and writes gradescope_limits.json next to this file. Standard library and speclab only.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from speclab.grading import load_lab, sandbox_problem, write_gradescope

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CGROUP = Path("/sys/fs/cgroup")
GRADESCOPE = dict(memory_mb=768, cpus=0.5, timeout_s=600, max_timeout_s=2400)   # its documented defaults
PERIOD_US = 100_000


# ------------------------------------------------------------------------------------------------ cgroups
def cgroup_version() -> str:
    "'v2' (a unified hierarchy with memory and cpu), 'v1' (memory and cpu controllers), else a ValueError why not."
    controllers = CGROUP / "cgroup.controllers"
    if controllers.is_file() and {"memory", "cpu"} <= set(controllers.read_text().split()):
        return "v2"
    if (CGROUP / "memory" / "cgroup.procs").is_file() and (CGROUP / "cpu" / "cpu.cfs_quota_us").is_file():
        return "v1"
    raise ValueError(f"no cgroup with memory and cpu controllers under {CGROUP} (mount: "
                     f"{Path('/proc/mounts').read_text().count('cgroup')} cgroup entries)")


def make_cgroup(version: str, name: str, memory_mb: int | None, cpus: float | None) -> list:
    "Create the cgroup(s) `name` with these limits (None: unlimited); the folders whose cgroup.procs take a pid."
    if version == "v2":
        (CGROUP / "cgroup.subtree_control").write_text("+memory +cpu")
        folder = CGROUP / name
        folder.mkdir()
        (folder / "memory.max").write_text(f"{memory_mb}M" if memory_mb else "max")
        if (folder / "memory.swap.max").exists():                             # no swap beyond the limit either
            (folder / "memory.swap.max").write_text("0")
        (folder / "cpu.max").write_text(f"{int(cpus * PERIOD_US)} {PERIOD_US}" if cpus else f"max {PERIOD_US}")
        return [folder]
    memory, cpu = CGROUP / "memory" / name, CGROUP / "cpu" / name
    memory.mkdir()
    cpu.mkdir()
    if memory_mb:
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
        if (memory / "memory.memsw.limit_in_bytes").exists():                # no swap beyond the limit either
            (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_mb << 20))
    (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * PERIOD_US)) if cpus else "-1")
    return [memory, cpu]


def memory_stat(version: str, folder: Path) -> dict:
    "{key: int} of the memory cgroup's memory.stat."
    lines = (folder / "memory.stat").read_text().split("\n")
    return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}


def anon_bytes(version: str, folder: Path) -> int:
    "The cgroup's anonymous memory now (resident memory that is not a file's): v2 'anon', v1 'total_rss'."
    stat = memory_stat(version, folder)
    return stat["anon"] if version == "v2" else stat["total_rss"]


def kernel_peak(version: str, folder: Path) -> int | None:
    "The kernel's peak of the cgroup's memory usage (page cache included): v2 memory.peak, v1 max_usage_in_bytes."
    path = folder / ("memory.peak" if version == "v2" else "memory.max_usage_in_bytes")
    return int(path.read_text()) if path.exists() else None


def oom_kills(version: str, folder: Path) -> int:
    "Processes the kernel's OOM killer ended in the cgroup."
    name = "memory.events" if version == "v2" else "memory.oom_control"
    for line in (folder / name).read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def throttled(version: str, folders: list) -> int:
    "Periods in which the CPU quota stopped the cgroup."
    for line in (folders[-1] / "cpu.stat").read_text().splitlines():
        if line.startswith("nr_throttled "):
            return int(line.split()[1])
    return 0


def remove_cgroup(folders: list) -> None:
    "Remove the cgroup folders (empty by now), retrying while the kernel lets go of the last processes."
    for folder in folders:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


# ------------------------------------------------------------------------------------------------ one run
def build_image(bundle: Path, base: Path) -> Path:
    """The environment the bundle's setup.sh builds, as on Gradescope (base/autograder bound over /autograder in a
    private mount namespace; pip's own configuration is passed on): base/autograder/speclab-venv, built once."""
    root = base / "autograder"
    venv = root / "speclab-venv"
    if (venv / "bin" / "speclab").is_file():
        return venv
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(bundle, root / "source", ignore=shutil.ignore_patterns("autograder.zip"))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    script = f"set -e; mount --bind {root} /autograder; cd /autograder/source; bash ./setup.sh"
    log = base / "setup.log"
    t0 = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script],
                              env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3600).returncode
    if code != 0 or not (venv / "bin" / "speclab").is_file():
        sys.exit(f"setup.sh failed (exit status {code}); its log: {log}")
    print(f"setup.sh built {venv} in {time.monotonic() - t0:.0f} s", flush=True)
    return venv


def lay_out(bundle: Path, notebook: Path, base: Path) -> Path:
    "A fresh /autograder in base/autograder: source/ (the bundle), submission/ (the notebook), results/."
    root = base / "autograder"
    shutil.copytree(bundle, root / "source", ignore=shutil.ignore_patterns("autograder.zip"))
    (root / "submission").mkdir()
    (root / "results").mkdir()
    (root / "speclab-venv").mkdir()
    shutil.copy2(notebook, root / "submission" / notebook.name)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")      # Gradescope copies it there
    return root


def run_once(version: str, lab: Path, bundle: Path, venv: Path, memory_mb, cpus, timeout: float, base: Path) -> dict:
    "run_autograder on the lab's master notebook in a fresh /autograder, inside a cgroup with these limits."
    notebook = next((lab / "autograder").glob("*.ipynb"))
    root = lay_out(bundle, notebook, base)
    name = f"speclab-gradescope-{os.getpid()}-{int(time.time() * 1000)}"
    folders = make_cgroup(version, name, memory_mb, cpus)
    procs = [str(f / "cgroup.procs") for f in folders]

    def join():                                          # in the child, before exec: it and all it starts are in
        for path in procs:
            with open(path, "w") as f:
                f.write(str(os.getpid()))

    script = (f"set -e; mount --bind {root} /autograder; mount --bind {venv} /autograder/speclab-venv; "
              "cd /autograder; exec ./run_autograder")
    argv = ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], anon_bytes(version, folders[0]))
            except (OSError, KeyError, ValueError):
                pass
            done.wait(0.1)
    sampler = threading.Thread(target=sample, daemon=True)
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    t0 = time.monotonic()
    sampler.start()
    log = base / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=join,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)                       # its session: unshare, bash, the grader and its sandbox
            code, timed_out = proc.wait(), True
    wall = time.monotonic() - t0
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    results = root / "results" / "results.json"
    graded = json.loads(results.read_text()) if results.is_file() else {}
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    row = dict(lab=lab.name, memory_mb=memory_mb, cpus=cpus, returncode=code, timed_out=timed_out,
               wall_s=round(wall, 1), cpu_s=round(cpu, 1),
               anon_peak_mb=round(peak[0] / 2**20), usage_peak_mb=None, oom_kills=oom_kills(version, folders[0]),
               throttled_periods=throttled(version, folders), load_before=round(load, 2),
               load_after=round(os.getloadavg()[0], 2), score=graded.get("score"),
               max_score=load_lab(lab).max_score, practice=graded.get("practice"))
    usage = kernel_peak(version, folders[0])
    row["usage_peak_mb"] = None if usage is None else round(usage / 2**20)
    row["passed"] = (not timed_out and code == 0 and row["practice"] is False and row["score"] == row["max_score"])
    if not row["passed"]:
        row["log_tail"] = log.read_text(errors="replace")[-1500:]
    remove_cgroup(folders)
    return row


# ------------------------------------------------------------------------------------------------ report
def machine() -> dict:
    "The CPU model, cores and memory of this machine, the kernel and Python."
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "unknown")
    total = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal"))
    return dict(cpu=model, cores=os.cpu_count(), memory_gib=round(total / 2**20, 1), kernel=platform.release(),
                python=platform.python_version())


def advice(rows: list, cpus: float) -> dict:
    """What to set on Gradescope, with margin: memory at least 1.5x the largest anonymous peak (and never under the
    default), the timeout at least twice the slowest run under the CPU quota, rounded up to minutes (a run's time is
    at least its CPU seconds over the quota, whatever else this machine ran meanwhile)."""
    quota = [r for r in rows if r["cpus"] == cpus and r["memory_mb"] is None]
    anon = max(r["anon_peak_mb"] for r in quota)
    wall = max(max(r["wall_s"], r["cpu_s"] / cpus) for r in quota)
    memory = max(GRADESCOPE["memory_mb"], -(-int(anon * 1.5) // 64) * 64)
    timeout_min = max(GRADESCOPE["timeout_s"] // 60, -(-int(2 * wall) // 60))
    default = [r for r in rows if r["memory_mb"] == GRADESCOPE["memory_mb"] and r["cpus"] == GRADESCOPE["cpus"]]
    limits = sorted({r["memory_mb"] for r in rows if r["memory_mb"]})
    passing = [m for m in limits if all(r["passed"] for r in rows if r["memory_mb"] == m)]   # every lab passed
    return dict(memory_mb=memory, cpus=cpus, timeout_min=timeout_min, largest_anon_peak_mb=anon,
                slowest_s=round(wall, 1), defaults_pass=bool(default) and all(r["passed"] for r in default),
                smallest_passing_limit_mb=passing[0] if passing else None,
                rule="memory >= 1.5 x the largest anonymous peak (at least the 768 MB default); timeout >= 2 x the "
                     "slowest run at the CPU quota, or its CPU seconds over the quota (at least 10 minutes)")


def table(rows: list) -> str:
    "The runs as a fixed-width table."
    head = ["lab", "memory", "cpus", "passed", "score", "wall s", "cpu s", "anon peak MB", "usage peak MB", "oom"]
    lines = [head]
    for r in rows:
        lines.append([r["lab"], f"{r['memory_mb']} MB" if r["memory_mb"] else "none", str(r["cpus"] or "all"),
                      "yes" if r["passed"] else "NO", f"{r['score']}/{r['max_score']:g}", f"{r['wall_s']:.1f}",
                      f"{r['cpu_s']:.1f}", str(r["anon_peak_mb"]), str(r["usage_peak_mb"]), str(r["oom_kills"])])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--labs", default="06_kv,08_acceptance,09_audit", help="lab folders under labs/, comma-separated")
    p.add_argument("--memories", default="768,1024,1536", help="memory limits in MB, comma-separated")
    p.add_argument("--cpus", type=float, default=GRADESCOPE["cpus"], help="CPU quota in CPUs (Gradescope: 0.5)")
    p.add_argument("--timeout", type=float, default=GRADESCOPE["timeout_s"], help="seconds per run (Gradescope: 600)")
    p.add_argument("--venv", default=sys.prefix, help="the environment bound at /autograder/speclab-venv")
    p.add_argument("--image", help="build the environment with the bundle's setup.sh in this folder (once) and use it")
    p.add_argument("--out", default=str(HERE / "gradescope_limits.json"), help="where the JSON goes")
    args = p.parse_args(argv)
    args.labs = [ROOT / "labs" / name for name in args.labs.split(",") if name]
    args.memories = [int(m) for m in args.memories.split(",") if m]
    bad = [str(lab) for lab in args.labs if not (lab / "autograder" / "tests").is_dir()]
    if bad:
        p.error(f"--labs must name folders under labs/ with autograder/tests, got {bad}")
    if not (0 < args.cpus <= (os.cpu_count() or 1)) or any(m < 64 for m in args.memories) or args.timeout <= 0:
        p.error("--cpus must be in (0, cores], --memories at least 64 MB each, --timeout positive")
    if args.image is None and not (Path(args.venv) / "bin" / "speclab").is_file():
        p.error(f"--venv must be an environment with bin/speclab, got {args.venv!r}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if os.geteuid() != 0 or sandbox_problem() is not None:
        sys.exit(f"needs root and the grader's sandbox: {sandbox_problem() or 'not root'}")
    version = cgroup_version()
    autograder = Path("/autograder")
    if autograder.exists() and any(autograder.iterdir()):
        sys.exit("/autograder exists and is not empty (a real Gradescope container?): nothing is bound over it")
    autograder.mkdir(exist_ok=True)                      # an empty mount point; each run binds its own layout there
    settings = [(m, args.cpus) for m in args.memories] + [(None, args.cpus), (None, None)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="speclab-gradescope-limits-", dir="/var/tmp") as tmp:
        tmp = Path(tmp)
        bundles = {lab: write_gradescope(load_lab(lab), tmp / "bundles" / lab.name).parent for lab in args.labs}
        if args.image:                                   # setup.sh is the same for every lab (a test checks it)
            args.venv = str(build_image(bundles[args.labs[0]], Path(args.image).resolve()))
        for lab, bundle in bundles.items():
            for i, (memory_mb, cpus) in enumerate(settings):
                row = run_once(version, lab, bundle, Path(args.venv), memory_mb, cpus, args.timeout,
                               tmp / f"{lab.name}-{i}")
                print(f"{lab.name}: memory {memory_mb or 'unlimited'} MB, cpus {cpus or 'all'}: "
                      f"{'passed' if row['passed'] else 'FAILED'} in {row['wall_s']} s, "
                      f"anon peak {row['anon_peak_mb']} MB", flush=True)
                rows.append(row)
    report = dict(date=datetime.date.today().isoformat(), machine=machine(), cgroup=version,
                  command=" ".join([Path(sys.executable).name, *sys.argv]), gradescope_defaults=GRADESCOPE,
                  venv=args.venv, runs=rows, advice=advice(rows, args.cpus))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(rows))
    print(json.dumps(report["advice"], indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
