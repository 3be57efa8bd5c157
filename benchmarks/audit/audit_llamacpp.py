"""`speclab audit` of llama.cpp's speculative decoding (Chapter 13), the engine CPU users pick first.

    .venv/bin/python benchmarks/audit/audit_llamacpp.py [--budget 3000] [--out benchmarks/audit/llamacpp_audit]

llama.cpp's own `llama-server`, built from PyPI's `llama-cpp-python` source with the shipped pair converted to f32
GGUF by llama.cpp's converter (see benchmarks/common/llamacpp_env.py; built on first use, minutes), serves the pair
plain and with the draft model drafting 3 tokens a step (`--spec-type draft-simple`). Both run with OpenAI's
sampling semantics (no default top-k/min-p, temperature before top-k/top-p: `llamacpp_env.NEUTRAL_SAMPLING`). Three
audits at `--budget` each, so that a failure can be placed:

1. `spec_vs_plain`: llama.cpp speculative against llama.cpp plain: does its speculation keep its own law?
2. `plain_vs_speclab`: llama.cpp plain against `speclab serve --draft none`: does llama.cpp sample the same law as
   the course's engine at all (the fields and their semantics: penalties, seeds, top-k)?
3. `spec_vs_speclab`: llama.cpp speculative against speclab's plain server, as a user would audit a deployment
   against a trusted reference.
4. `defaults_vs_speclab`: llama.cpp plain with its own sampling defaults (top-k 40, min-p 0.05, temperature applied
   after top-p) against speclab's plain server: what the audit says of a deployment configured differently.

Each audit writes `<name>.json` and `<name>.html` into `--out`; `summary.json` lists the verdicts with the date, the
machine, llama.cpp's version and the load. Every server is bounded in time and stopped. `--only` runs a subset.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from llamacpp_env import gguf_pair, llama_server_binary, llamacpp_server, server_version  # noqa: E402
from vllm_env import speclab_server  # noqa: E402
from audit_vllm import machine  # noqa: E402

from speclab.audit import format_report, plan_audit, run_audit, write_report  # noqa: E402

AUDITS = ("spec_vs_plain", "plain_vs_speclab", "spec_vs_speclab", "defaults_vs_speclab")
SPECLAB_MODEL = "speclab-tiny"           # what `speclab serve` calls the shipped pair
NUM_DRAFT = 3


def audit(name: str, url: str, reference_url: str, plan, out: Path, model: str | None = None) -> dict:
    """Run one audit, print its plan, power and report, write its JSON and HTML; the report. `model`: the name sent
    to both servers (llama-server answers to any; speclab serve to its own, SPECLAB_MODEL)."""
    print(f"\n=== {name}: {url} against {reference_url}", flush=True)
    t0 = time.time()
    report = run_audit(url, reference_url, plan, model=model, progress=False,
                       on_power=lambda text: print(text, flush=True))
    write_report(report, out / f"{name}.json", out / f"{name}.html")
    print(format_report(report), flush=True)
    print(f"({time.time() - t0:.0f} s)", flush=True)
    return report


def parse_args(argv: list | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=3000, help="requests per audit (default 3,000)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "llamacpp_audit"), help="output folder")
    ap.add_argument("--only", nargs="+", choices=AUDITS, default=list(AUDITS), help="audits to run")
    ap.add_argument("--parallel", type=int, default=16, help="llama-server slots (default 16)")
    args = ap.parse_args(argv)
    if args.budget < 100 or args.parallel < 1:
        ap.error("--budget must be >= 100 and --parallel >= 1")
    return args


def main(argv: list | None = None) -> int:
    "Build what is missing, run the audits, write the summary; exit 0 when every audit ran."
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    binary = llama_server_binary(create=True)
    target, draft = gguf_pair(create=True)
    plan = plan_audit(budget=args.budget)
    load = [os.getloadavg()[0]]
    reports = {}
    kw = dict(parallel=args.parallel)
    with llamacpp_server(target, draft, num_draft=NUM_DRAFT, log=out / "llamacpp_spec.log", **kw) as spec_url:
        if "spec_vs_plain" in args.only:
            with llamacpp_server(target, log=out / "llamacpp_plain.log", **kw) as plain_url:
                reports["spec_vs_plain"] = audit("spec_vs_plain", spec_url, plain_url, plan, out)
        if {"plain_vs_speclab", "spec_vs_speclab", "defaults_vs_speclab"} & set(args.only):
            with speclab_server("--draft", "none", "--max-num-seqs", "16", log=out / "speclab_plain.log") as ref:
                if "plain_vs_speclab" in args.only:
                    with llamacpp_server(target, log=out / "llamacpp_plain2.log", **kw) as plain_url:
                        reports["plain_vs_speclab"] = audit("plain_vs_speclab", plain_url, ref, plan, out,
                                                             SPECLAB_MODEL)
                if "spec_vs_speclab" in args.only:
                    reports["spec_vs_speclab"] = audit("spec_vs_speclab", spec_url, ref, plan, out, SPECLAB_MODEL)
                if "defaults_vs_speclab" in args.only:
                    with llamacpp_server(target, sampling=(), log=out / "llamacpp_defaults.log", **kw) as own_url:
                        reports["defaults_vs_speclab"] = audit("defaults_vs_speclab", own_url, ref, plan, out,
                                                               SPECLAB_MODEL)
    load.append(os.getloadavg()[0])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), machine=machine(),
                   llamacpp=f"llama-server {server_version(binary)} (llama-cpp-python 0.3.36's vendored tree)",
                   speculative=f"--spec-type draft-simple, the shipped draft, up to {NUM_DRAFT} tokens a step",
                   command=" ".join(["python", "benchmarks/audit/audit_llamacpp.py", *(argv or sys.argv[1:])]),
                   load_before_after=load, commit=commit,
                   audits={k: dict(exit_code=r["exit_code"], line=r["line"], requests_sent=r["requests_sent"],
                                   elapsed_s=r["elapsed_s"], down=r["down"],
                                   checks={c["check"]: c["status"] for c in r["checks"]},
                                   failed={c["check"]: c["worst"] for c in r["checks"] if c["status"] == "FAIL"})
                           for k, r in reports.items()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for log in out.glob("*.log"):
        if log.stat().st_size > 40_000:                        # keep the logs small enough to commit: their ends
            log.write_text(log.read_text(errors="replace")[-40_000:])
    print(json.dumps(summary["audits"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
