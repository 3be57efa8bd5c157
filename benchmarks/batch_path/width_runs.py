"""Decode steps whose requests' contexts differ in width: attention in one group a step (every request padded to the
widest) against runs of similar width (`speclab.model._width_runs`), at several costs of a run, side by side.

    python benchmarks/batch_path/width_runs.py                    # the table
    python benchmarks/batch_path/width_runs.py --out FILE         # also one JSON file

For each batch size B and context span [lo, hi]: B prompts of random token ids, their lengths drawn uniformly from
the span (seeded, the same for every setting), prefilled in one engine per setting (`SpecDecoder` without a drafter,
the shipped target, fp32); then `--steps` decode steps of every engine in turn, the order reversed every other step,
the whole repeated `--repeats` times with new lengths. `speclab.model.GROUP_KEYS` is set to each setting's run cost
before each engine's step (inf: one group a step, the layout before runs). Reported: each setting's median step, and
its ratio to one group's. One torch thread by default. No timing is asserted.
"""
import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import speclab.model as model_module  # noqa: E402
from speclab.config import EngineConfig  # noqa: E402
from speclab.engine import SpecDecoder  # noqa: E402
from speclab.model import load_model  # noqa: E402
from speclab.request import SamplingParams  # noqa: E402
from speclab.train import tiny_pair_path  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16], help="batch sizes (default 4 8 16)")
    ap.add_argument("--spans", nargs="+", default=["16:200", "16:400"], help="context spans lo:hi (default "
                    "16:200 16:400)")
    ap.add_argument("--group-keys", type=float, nargs="+", default=[0, 128, 256, 512, 1024],
                    help="run costs to compare with one group (inf), in keys (default 0 128 256 512 1024)")
    ap.add_argument("--steps", type=int, default=50, help="decode steps per repeat (default 50)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats, each with new lengths (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--out", default=None, help="also write the JSON object to this file")
    a = ap.parse_args(argv)
    for name in ("steps", "repeats", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if any(b < 1 for b in a.batch):
        ap.error(f"--batch sizes must be >= 1, got {a.batch}")
    if any(not (k >= 0) for k in a.group_keys):
        ap.error(f"--group-keys must be >= 0, got {a.group_keys}")
    a.spans = [parse_span(ap, s) for s in a.spans]
    return a


def parse_span(ap: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    "lo:hi, two ints with 1 <= lo <= hi."
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        ap.error(f"--spans takes lo:hi pairs of ints, got {text!r}")
    if not 1 <= lo <= hi:
        ap.error(f"--spans needs 1 <= lo <= hi, got {text!r}")
    return lo, hi


def engines(target, prompts: list, settings: list[float], steps: int) -> dict:
    "One prefilled engine per run cost, the same prompts in each."
    out = {}
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for keys in settings:
        model_module.GROUP_KEYS = keys
        eng = SpecDecoder(target, None, config=EngineConfig(kappa=0, max_num_seqs=len(prompts),
                                                             enable_prefix_caching=False))
        for p in prompts:
            eng.add_request(p, params)
        eng.step()
        out[keys] = eng
    return out


def measure(target, batch: int, span: tuple[int, int], settings: list[float], steps: int, repeats: int) -> dict:
    "Seconds of every decode step per run cost, the engines interleaved."
    times = {keys: [] for keys in settings}
    context = target.args.max_position_embeddings or 2 ** 20
    gen = torch.Generator().manual_seed(batch)
    for rep in range(repeats):
        rng = random.Random(1000 * batch + rep)
        lengths = [min(rng.randint(*span), context - steps - 2) for _ in range(batch)]
        prompts = [torch.randint(0, target.args.vocab_size, (n,), generator=gen).tolist() for n in lengths]
        engs = engines(target, prompts, settings, steps)
        for s in range(steps):
            for keys in settings if s % 2 else settings[::-1]:
                model_module.GROUP_KEYS = keys
                t0 = time.perf_counter()
                engs[keys].step()
                times[keys].append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    saved = model_module.GROUP_KEYS
    settings = [math.inf] + [k for k in a.group_keys if not math.isinf(k)]
    target = load_model(tiny_pair_path("target"))
    rows = []
    print(f"{'B':>3} {'span':>8} " + " ".join(f"{'one' if math.isinf(k) else int(k):>7}" for k in settings)
          + "   (median ms per decode step; ratio to one group below)", flush=True)
    try:
        for batch in a.batch:
            for span in a.spans:
                times = measure(target, batch, span, settings, a.steps, a.repeats)
                ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                row = {"batch": batch, "span": list(span), "steps": len(times[math.inf]),
                       "median_ms": {str(k): ms[k] for k in settings},
                       "ratio": {str(k): ms[k] / ms[math.inf] for k in settings}}
                rows.append(row)
                print(f"{batch:>3} {span[0]:>3}-{span[1]:<4} " + " ".join(f"{ms[k]:>7.2f}" for k in settings))
                print(f"{'':>12} " + " ".join(f"{ms[k] / ms[math.inf]:>7.3f}" for k in settings), flush=True)
    finally:
        model_module.GROUP_KEYS = saved
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
              "torch": torch.__version__, "default_group_keys": saved,
              "command": " ".join(["benchmarks/batch_path/width_runs.py", *(argv if argv is not None else sys.argv[1:])]),
              "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {a.out}")
    return record


if __name__ == "__main__":
    main()
