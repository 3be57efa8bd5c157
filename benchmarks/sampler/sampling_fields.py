"""The cost of the logits-processor stage per verify step, side by side with the stage off.

One verify step of `speclab.sampling.rejection_sampler` at a Llama-3 vocabulary (V = 128,256), kappa = 3 drafts per
request, batch 1 and 16, random logits, sampled rows (temperature 0.8). "off": every request at the default fields;
"on": every request with presence, frequency and repetition penalties, a logit bias, min_p and min_tokens, and a
history of PROMPT prompt tokens and OUTPUT generated tokens. The "on" time includes building the per-request
`ProcessorRows` from Python lists (what the engine does every step: `processor_rows`), so it is the whole cost of the
feature per step. Both are timed alternately in one run (best of REPS after a warm-up) so that load on a shared
machine hits both alike.

    python benchmarks/sampler/sampling_fields.py [--threads 1] [--reps 5] [--vocab 128256]
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from speclab.request import SamplingParams
from speclab.processors import processor_rows
from speclab.metadata import SpecDecodeMetadata
from speclab.sampling import SamplingMetadata, rejection_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

KAPPA, PROMPT, OUTPUT = 3, 512, 256
ON = dict(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1,
          logit_bias={11: 2.0, 13: -2.0}, min_p=0.05, min_tokens=300, stop_token_ids=(2,))


def step(batch: int, vocab: int, fields_on: bool, g: torch.Generator) -> float:
    "Seconds for one verify step of `batch` requests (processors built from lists included when on)."
    params = [SamplingParams(**(ON if fields_on else dict(temperature=0.8)), max_tokens=512)] * batch
    prompts = [torch.randint(0, vocab, (PROMPT,), generator=g).tolist() for _ in range(batch)]
    outputs = [torch.randint(0, vocab, (OUTPUT,), generator=g).tolist() for _ in range(batch)]
    drafts = [torch.randint(0, vocab, (KAPPA,), generator=g).tolist() for _ in range(batch)]
    md = SpecDecodeMetadata.from_drafts(drafts)
    logits = torch.randn(batch * (KAPPA + 1), vocab, generator=g)
    q = torch.softmax(torch.randn(batch * KAPPA, vocab, generator=g), -1)
    gens = [torch.Generator().manual_seed(i) for i in range(batch)]
    t0 = time.perf_counter()
    procs = processor_rows(params, prompts, outputs, [frozenset(p.stop_token_ids) for p in params], vocab)
    sampling = SamplingMetadata.from_lists([p.temperature for p in params], [0] * batch, [1.0] * batch, gens,
                                           processors=procs)
    rejection_sampler(md, logits, q, sampling)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=128_256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"{utc_now()}; {machine()}; load {load_average()} before")
    print(f"V = {args.vocab}, kappa = {KAPPA}, history {PROMPT} prompt + {OUTPUT} generated tokens; best of {args.reps}")
    print("| batch | rows | stage off (ms) | stage on (ms) | on / off |")
    print("|---|---|---|---|---|")
    for batch in (1, 16):
        times = {False: [], True: []}
        for rep in range(args.reps + 1):                      # the first round is a warm-up
            for on in (False, True):
                t = step(batch, args.vocab, on, g)
                if rep:
                    times[on].append(t)
        off, on = min(times[False]) * 1e3, min(times[True]) * 1e3
        print(f"| {batch} | {batch * (KAPPA + 1)} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")
    print(f"load {load_average()} after")


if __name__ == "__main__":
    main()
