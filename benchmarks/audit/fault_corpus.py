"""The audit's fault corpus: every planted fault's exact bias on the default law cells, its verdict, its power.

    python benchmarks/audit/fault_corpus.py                                  # every fault, the default budget 12,000
    python benchmarks/audit/fault_corpus.py --budget 3000 --faults bonus_from_draft,expand_misaligned
    python benchmarks/audit/fault_corpus.py --exact-only                     # the biases and predictions, no audits

For each fault of `speclab.testing.FAULTS`:
- the exact total-variation distance between the laws of the first two tokens (the default law cells' outcome:
  max_tokens 2) under the faulty and the correct engine, on each default law cell (3 prompts x 3 settings), computed
  from the shipped pair's probabilities. With max_tokens 2 the scheduler gives the first step one draft (the
  lookahead leaves room for one draft and its bonus); a rejection leaves the second token to a plain step, which no
  sampler fault touches. So the first two tokens' law is A(y1) B(y2|y1) + R(y1) p(y2|y1), with A the accepted
  draft's mass, R the recovered token's, B the bonus row; each fault changes A, R or B as its code does. Faults that
  leave this law alone (seeds, concurrency, logprobs, penalties, block verification with one draft) get 0 and the
  quantity their check tests is measured instead, where this script can: logprobs' offset exactly, greedy
  mismatches on the 24 default prompts, the seeds check's same-seed agreement from the audit's own counts.
- the predicted budget at which the audit's law cells reach power 0.95 against that bias (two_sample_bound at the
  plan's Holm level, inverted over budgets): a prediction for token laws; the audit tests binned texts, whose TV is
  at most the tokens' (two token pairs may print the same text).
- the default plan's verdict at --budget on an in-process pair (speclab.testing.audit_pair), the failing checks.
Writes --json (default benchmarks/audit/fault_corpus.json) and prints a markdown table.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

from speclab.audit import MAX_BINS, SETTINGS, plan_audit, rate_bound, run_audit, two_sample_bound  # noqa: E402
from speclab.model import KVCache, forward  # noqa: E402
from speclab.sampling import sampling_probs, top_p_mask_sort  # noqa: E402
from speclab.testing import FAULTS, audit_pair, plant_fault  # noqa: E402

POWER = 0.95
SHOWS_ELSEWHERE = {      # faults whose default two-token law is the correct one, and the check that can see them
    "batch_dependent": "seeds (same-seed agreement; laws only when other prompts share the step)",
    "penalties_per_step": "repeats (penalty cells)",
    "shared_rng": "concurrency (duplicates at concurrency 1)",
    "seed_ignored": "seeds (same-seed agreement)",
    "seed_skips_drafts": "seeds (same-seed agreement)",
    "block_residual_weight": "penalty cells' four-token law (kappa 3 there); the two-token cells draft one token",
    "logprobs_from_draft": "logprobs (returned log-probs of accepted drafts)",
}


@torch.no_grad()
def logits_two(model, ids: list[int], chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    "The model's logits after the prompt [V], and after the prompt and each token y [V, V] (float32)."
    args = model.args
    first = forward(model, torch.tensor([ids]), KVCache(args, 1, len(ids)))[0, -1].float()
    rows = []
    for start in range(0, args.vocab_size, chunk):
        ys = torch.arange(start, min(start + chunk, args.vocab_size))
        seqs = torch.cat([torch.tensor(ids).expand(len(ys), -1), ys[:, None]], 1)
        rows.append(forward(model, seqs, KVCache(args, len(ys), seqs.shape[1]))[:, -1].float())
    return first, torch.cat(rows)


def probs(logits: torch.Tensor, setting: dict, top_p: float | None = None) -> torch.Tensor:
    "Rows of probabilities under a setting (temperature, top_k, top_p), float64; top_p overrides the setting's."
    t, k = setting.get("temperature", 1.0), setting.get("top_k", 0)
    tp = setting.get("top_p", 1.0) if top_p is None else top_p
    rows = logits[None] if logits.dim() == 1 else logits
    out = sampling_probs(rows, t, k, tp, top_p_method="sort").double()
    return out[0] if logits.dim() == 1 else out


def norm(x: torch.Tensor) -> torch.Tensor:
    "x scaled to sum to 1."
    return x / x.sum()


def two_token_law(fault: str | None, c: dict) -> torch.Tensor:
    "The exact law [V, V] of the first two tokens from one drafted step (one draft) and a plain step, with `fault`."
    p1, q1, P2 = c["p1"], c["q1"], c["P2"]
    if fault == "argmax_always":
        a = int(c["l1"].argmax())
        law = torch.zeros_like(P2)
        law[a] = (1 - q1[a]) * P2[a]
        law[a, int(c["L2"][a].argmax())] += q1[a]
        return law
    accept_rows, q_seen, bonus = p1, q1, P2
    if fault == "top_p_target_only":
        accept_rows, bonus = c["p1_unfiltered"], c["P2_unfiltered"]
    elif fault == "temperature_target_only" and c["T"] > 0:
        q_seen = norm(q1 ** c["T"])
    elif fault == "top_p_after_residual":
        accept_rows = c["p1_unfiltered"]
    elif fault == "bonus_from_draft":
        bonus = q1[None].expand_as(P2)
    elif fault == "expand_misaligned":
        bonus = c["P2_default"]
    elif fault == "verify_numerics":
        accept_rows, bonus = c["p1_bf16"], c["P2_bf16"]
    ratio = torch.where(q_seen > 0, accept_rows / q_seen.clamp(min=1e-300), 1.0).clamp(max=1.0)
    A = q1 * ratio
    rejected = float(1 - A.sum())
    r = (accept_rows - q_seen).clamp(min=0)
    r = accept_rows if float(r.sum()) <= 0 else norm(r)
    if fault == "recovered_from_p":
        r = accept_rows
    elif fault == "top_p_after_residual":
        r = norm(r * top_p_mask_sort(r[None], c["top_p"])[0])
    law = A[:, None] * bonus
    if fault == "bonus_after_reject":          # the recovered token, then a token from the rejected draft's row
        return law + r[:, None] * ((q1 * (1 - ratio)) @ P2)[None, :]
    return law + rejected * r[:, None] * P2


def cell_inputs(target, draft, ids: list[int], setting: dict) -> dict:
    "Everything two_token_law needs for one prompt and setting."
    l1, L2 = logits_two(target, ids)
    d1 = forward(draft, torch.tensor([ids]), KVCache(draft.args, 1, len(ids)))[0, -1].float()
    b1, B2 = l1.to(torch.bfloat16).float(), L2.to(torch.bfloat16).float()
    return dict(l1=l1, L2=L2, T=setting.get("temperature", 1.0), top_p=setting.get("top_p", 1.0),
                p1=probs(l1, setting), q1=probs(d1, setting), P2=probs(L2, setting),
                p1_unfiltered=probs(l1, setting, 1.0), P2_unfiltered=probs(L2, setting, 1.0),
                P2_default=probs(L2, {}), p1_bf16=probs(b1, setting), P2_bf16=probs(B2, setting))


def logprob_offset(c: dict) -> float:
    "Mean |log q(x) - log p_raw(x)| over accepted drafts at the first position (what logprobs_from_draft returns)."
    p1, q1 = c["p1"], c["q1"]
    A = q1 * torch.where(q1 > 0, p1 / q1.clamp(min=1e-300), 1.0).clamp(max=1.0)
    raw = torch.log_softmax(c["l1"].double(), -1)
    gap = (torch.log(q1.clamp(min=1e-300)) - raw).abs()
    return float((A * torch.where(A > 0, gap, 0.0)).sum() / A.sum())


def exact_biases(faults: list[str], tokenizer, target, draft) -> dict:
    "{fault: {cell: TV}} on the default law cells, and the logprob offsets per cell."
    plan = plan_audit()
    cells = [(c.prompt, c.setting) for c in plan.cells if c.check == "laws"]
    out = {f: {} for f in faults}
    offsets = {}
    for prompt, setting in cells:
        t0 = time.perf_counter()
        c = cell_inputs(target, draft, tokenizer.encode(prompt), SETTINGS[setting])
        ref = c["p1"][:, None] * c["P2"]                 # the target's own law of two tokens
        name = f"{prompt!r} {setting}"
        check = 0.5 * float((two_token_law(None, c) - ref).abs().sum())
        if check > 1e-6:
            raise RuntimeError(f"the correct step's law is off the target's by TV {check} at {name}")
        for f in faults:
            tv = 0.5 * float((two_token_law(f, c) - ref).abs().sum())
            out[f][name] = round(tv, 4)
        offsets[name] = round(logprob_offset(c), 3)
        print(f"# exact laws: {name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out, offsets


def budget_for_power(tv: float, power: float = POWER) -> int | None:
    "The smallest default-plan budget (1.1x ladder up to 10^6) whose law cells catch `tv` w.p. `power` (None: none)."
    if tv <= 0:
        return None
    budget = 1500
    while budget <= 1_000_000:
        plan = plan_audit(budget=budget)
        n = next(c.n for c in plan.cells if c.check == "laws")
        if two_sample_bound(n, n, MAX_BINS, plan.test_level, power) <= tv:
            return budget
        budget = int(budget * 1.1)
    return None


@torch.no_grad()
def greedy_mismatches(fault: str, prompts: list[str], tokens: int = 16) -> int:
    "Prompts (of `prompts`) whose greedy text differs between the planted speculative engine and plain decoding."
    from speclab.request import SamplingParams
    from speclab.serve import load_engine
    from speclab.train import tiny_pair_path
    spec = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3)
    plain = load_engine(tiny_pair_path("target"), None, kappa=0)
    plant_fault(spec, fault)
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    a = [o.token_ids for o in spec.generate(list(prompts), params)]
    b = [o.token_ids for o in plain.generate(list(prompts), params)]
    return sum(x != y for x, y in zip(a, b))


def seed_agreement(report: dict) -> str:
    "The seeds check's same-seed agreement, audited vs reference, from a report's tests."
    for t in report.get("tests", []):
        if t.get("check") == "seeds" and t.get("name", "").startswith("same seed"):
            rows = {r[0]: r[1:] for r in t["table"]}
            if "same text" in rows and "different text" in rows:
                (sa, sb), (da, db) = rows["same text"], rows["different text"]
                return f"{sa}/{sa + da} vs {sb}/{sb + db}"
    return ""


def audit(urls, set_fault, fault: str, budget: int) -> dict:
    "The default plan at `budget` with `fault` planted: exit code, failed checks, seconds."
    set_fault(fault)
    t0 = time.perf_counter()
    try:
        report = run_audit(*urls, plan_audit(budget=budget), progress=False)
    finally:
        set_fault(None)
    failed = {c["check"]: c["worst"] for c in report["checks"] if c["status"] == "FAIL"}
    return dict(exit_code=report["exit_code"], failed=failed, requests=report["requests_sent"],
                seconds=round(time.perf_counter() - t0, 1), line=report["line"], seeds=seed_agreement(report))


def split_report(text: str) -> tuple[str, str]:
    "A FAULTS description -> (mechanism, the report it cites: the last parenthesis naming an engine, or '')."
    start = text.rfind(" (")
    cited = text[start + 2:-1] if start > 0 and text.endswith(")") else ""
    if not any(w in cited for w in ("vLLM", "SGLang", "TensorRT", "vllm", "#")):
        return text, ""
    return text[:start], cited


def quantity(r: dict) -> str:
    "What the fault moves, in the units of the check that can see it."
    if r["tv_max"] > 0:
        return f"TV {r['tv_max']:.3f} (first two tokens, worst default cell)"
    if r["fault"] == "logprobs_from_draft":
        offsets = r["logprob_offset_per_cell"].values()
        low, high = min(offsets), max(offsets)
        return f"law TV 0; accepted drafts' log-probs off by {low:.1f}-{high:.1f} nats (mean per cell)"
    seeds = r.get("audit", {}).get("seeds", "")
    if r["shows_in"].startswith("seeds") and seeds:
        return f"law TV 0; same-seed agreement {seeds} (audited vs reference)"
    return "law TV 0 on the default cells"


def markdown_table(rows: list[dict]) -> str:
    "The corpus as a markdown table: fault, report, mechanism, bias, verdict at the audited budget, budget for 0.95."
    lines = ["| fault | report | mechanism | bias | verdict | budget for power 0.95 (predicted) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        mechanism, cited = split_report(FAULTS.get(r["fault"], r["report"]))     # this checkout's wording
        audit_row = r.get("audit")
        verdict = "not run" if audit_row is None else (
            f"{'FAIL' if audit_row['exit_code'] == 1 else 'exit %d' % audit_row['exit_code']} at "
            f"{audit_row['budget']:,}: " + ("; ".join(f"{k} ({v})" for k, v in audit_row["failed"].items())
                                             or "nothing failed"))
        extra = f"; greedy {r['greedy_mismatches']} prompts differ" if r["fault"] == "verify_numerics" else ""
        need = f"{r['budget_power_095']:,}" if r["budget_power_095"] else f"none from the laws; {r['shows_in']}"
        lines.append(f"| {r['fault']} | {cited or '-'} | {mechanism} | {quantity(r)}{extra} | {verdict} | {need} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=12_000, help="the default plan's budget for each fault's audit")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated fault names")
    ap.add_argument("--exact-only", action="store_true", help="biases and predictions only, no audits")
    ap.add_argument("--table", help="print the markdown table of this JSON (a run's output) and stop")
    ap.add_argument("--json", default=str(Path(__file__).with_name("fault_corpus.json")))
    a = ap.parse_args(argv)
    if a.table:
        print(markdown_table(json.loads(Path(a.table).read_text())["faults"]))
        return
    faults = a.faults.split(",")
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"--faults must name faults of speclab.testing.FAULTS, got {unknown}")
    torch.set_num_threads(1)
    print(f"# {utc_now()}; {machine()}; load average {load_average()} at start", flush=True)
    from speclab.serve import load_engine
    from speclab.train import tiny_pair_path
    eng = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3)
    biases, offsets = exact_biases(faults, eng.tokenizer, eng.target, eng.drafter.model)
    plan = plan_audit(budget=a.budget)
    rows = []
    for f in faults:
        worst = max(biases[f].values())
        row = dict(fault=f, report=FAULTS[f], tv_per_cell=biases[f], tv_max=worst,
                   budget_power_095=budget_for_power(worst), shows_in=SHOWS_ELSEWHERE.get(f, "laws"))
        if f == "logprobs_from_draft":
            row["logprob_offset_per_cell"] = offsets
        if f in ("verify_numerics", "argmax_always"):
            row["greedy_mismatches"] = f"{greedy_mismatches(f, plan.greedy_prompts, plan.greedy_tokens)}/" \
                                       f"{len(plan.greedy_prompts)}"
            row["greedy_rate_bound_095"] = rate_bound(len(plan.greedy_prompts), plan.test_level, POWER)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not a.exact_only:
        with audit_pair() as (url, reference_url, set_fault):
            for row in rows:
                row["audit"] = dict(budget=a.budget, **audit((url, reference_url), set_fault, row["fault"],
                                                              a.budget))
                print(json.dumps({"fault": row["fault"], **row["audit"]}), flush=True)
    print(f"# load average {load_average()} at the end", flush=True)
    meta = dict(date=utc_now(), machine=machine(), budget=a.budget, command=" ".join(sys.argv))
    Path(a.json).write_text(json.dumps(dict(meta=meta, faults=rows), indent=1) + "\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
