"""Host time of one verify step's sampling, validated every call vs trusted, side by side in one run.

One verify step at the shipped pair's vocabulary (V = 4,096, speclab/data/tiny-pair), kappa = 3 drafts per request,
batch 1 and 16, random logits and q rows. What is timed is what the engine does per step around its target forward:
build the step's `SpecDecodeMetadata`, build its `SamplingMetadata` from per-request lists, call `rejection_sampler`.
Variants, interleaved round-robin so that a change of machine load hits all of them alike:

* "checked": speclab now, every constructor and the sampler with check=True (a caller outside the engine);
* "trusted": speclab now, check=False everywhere (the engine: SamplingParams validated the settings once);
* "before" (with --before REV): the code at git revision REV, which validated the settings in every
  SamplingMetadata, the logits in the sampler, and again the probability rows inside rejection_sample.

Two settings: "sampled" (temperature 0.8, q rows, the long path) and "greedy" (temperature 0, the early return). The
figure is the fastest of --reps timed calls per variant (the machine is shared: the best call is the one no other
job interrupted); the sampler-only columns time `rejection_sampler` alone on prebuilt inputs. CPU only, torch threads as given (1 by default: the CPU does the arithmetic too, so "host time"
here is the whole call; on a GPU only the Python and the device syncs would remain on the host).
"""
import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from speclab.metadata import SpecDecodeMetadata  # noqa: E402
from speclab.sampling import SamplingMetadata, rejection_sampler  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

KAPPA, VOCAB = 3, 4096


def load_before(rev: str):
    "speclab's sampling and metadata modules at git revision `rev`, as a package `speclab_before` (ops shared)."
    folder = Path(tempfile.mkdtemp()) / "speclab_before"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name in ("sampling", "metadata"):
        text = subprocess.run(["git", "show", f"{rev}:speclab/{name}.py"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout
        (folder / f"{name}.py").write_text(text)
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("speclab_before.metadata")


def inputs(batch: int, greedy: bool, seed: int) -> dict:
    "One step's raw inputs: drafts, scheduled prefix sum, logits [N + B, V], q [N, V], per-request lists."
    g = torch.Generator().manual_seed(seed)
    drafts = [torch.randint(0, VOCAB, (KAPPA,), generator=g).tolist() for _ in range(batch)]
    return dict(drafts=drafts, cu=torch.tensor([KAPPA + 1] * batch).cumsum(0),
                logits=torch.randn(batch * (KAPPA + 1), VOCAB, generator=g) * 2,
                q=torch.softmax(torch.randn(batch * KAPPA, VOCAB, generator=g), -1),
                temperature=[0.0 if greedy else 0.8] * batch, top_k=[0] * batch, top_p=[1.0] * batch,
                gens=[torch.Generator().manual_seed(b) for b in range(batch)])


def step_now(x: dict, check: bool):
    "The engine's per-step sampling with today's code, every piece with `check`."
    md = SpecDecodeMetadata.from_drafts(x["drafts"], x["cu"], check=check)
    sm = SamplingMetadata.from_lists(x["temperature"], x["top_k"], x["top_p"], x["gens"], check=check)
    return rejection_sampler(md, x["logits"], x["q"], sm, check=check)


def step_before(old, x: dict):
    "The same step with the code at --before (it validated everything at every call)."
    md = old.SpecDecodeMetadata.from_drafts(x["drafts"], x["cu"])
    sm = old.SamplingMetadata.from_lists(x["temperature"], x["top_k"], x["top_p"], x["gens"])
    return old.rejection_sampler(md, x["logits"], x["q"], sm)


def variants(old) -> dict:
    "name -> (whole step fn, sampler-only fn), each taking the inputs."
    out = {}
    if old is not None:
        def before_sampler(x):
            return old.rejection_sampler(x["md_old"], x["logits"], x["q"], x["sm_old"])
        out["before"] = (lambda x: step_before(old, x), before_sampler)
    for name, check in (("checked", True), ("trusted", False)):
        def sampler_only(x, check=check):
            return rejection_sampler(x["md"], x["logits"], x["q"], x["sm"], check=check)
        out[name] = (lambda x, check=check: step_now(x, check), sampler_only)
    return out


def measure(batch: int, greedy: bool, reps: int, old) -> dict:
    "Fastest microseconds per call of each variant, whole step and sampler only, interleaved round-robin."
    x = inputs(batch, greedy, seed=batch)
    x["md"] = SpecDecodeMetadata.from_drafts(x["drafts"], x["cu"])
    x["sm"] = SamplingMetadata.from_lists(x["temperature"], x["top_k"], x["top_p"], x["gens"])
    if old is not None:
        x["md_old"] = old.SpecDecodeMetadata.from_drafts(x["drafts"], x["cu"])
        x["sm_old"] = old.SamplingMetadata.from_lists(x["temperature"], x["top_k"], x["top_p"], x["gens"])
    fns = variants(old)
    outs = {name: step(x) for name, (step, _) in fns.items()}          # warm-up, and a sanity check of shapes
    assert len({tuple(o.shape) for o in outs.values()}) == 1
    times = {(name, part): [] for name in fns for part in (0, 1)}
    for _ in range(reps):
        for name, pair in fns.items():
            for part in (0, 1):
                t0 = time.perf_counter_ns()
                pair[part](x)
                times[(name, part)].append(time.perf_counter_ns() - t0)
    return {key: min(v) / 1e3 for key, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--before", default=None, help="a git revision whose sampler validated at every call")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    old = load_before(args.before) if args.before else None
    print(f"{utc_now()}; {machine()}; load {load_average()} before")
    print(f"V = {VOCAB}, kappa = {KAPPA}, best of {args.reps} interleaved calls per variant"
          + (f"; before = {args.before}" if old else ""))
    names = list(variants(old))
    head = " | ".join(f"{n} step (us)" for n in names) + " | " + " | ".join(f"{n} sampler (us)" for n in names)
    print(f"| batch | path | {head} | step {'before' if old else 'checked'} / trusted | sampler checked / trusted |")
    print("|---|---|" + "---|" * (2 * len(names) + 2))
    for batch in (1, 16):
        for greedy in (False, True):
            t = measure(batch, greedy, args.reps, old)
            cells = [f"{t[(n, 0)]:.0f}" for n in names] + [f"{t[(n, 1)]:.0f}" for n in names]
            base = "before" if old else "checked"
            ratio = t[(base, 0)] / t[("trusted", 0)]
            sampler_ratio = t[("checked", 1)] / t[("trusted", 1)]
            path = "greedy" if greedy else "sampled"
            print(f"| {batch} | {path} | {' | '.join(cells)} | {ratio:.2f} | {sampler_ratio:.2f} |", flush=True)
    print(f"load {load_average()} after")


if __name__ == "__main__":
    main()
