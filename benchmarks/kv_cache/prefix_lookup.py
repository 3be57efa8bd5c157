"""Chapter 6's block manager at `--old-rev` and today's, side by side in one run: prefix-cache lookup and the reuse of
a freed cached block.

    python benchmarks/kv_cache/prefix_lookup.py                 # the old manager from git (--old-rev), the new from speclab
    python benchmarks/kv_cache/prefix_lookup.py --repeats 50

Lookup: a prompt of 256, 2,048 or 8,192 random token ids, blocks of 16, whose full blocks are all in the prefix cache
(a request with the same prompt ran and finished first); the timed call is `add_request` of that prompt plus one new
token, which looks the prompt up and claims every block. The old manager keys each block by the tuple of the whole
prefix up to it (quadratic in the prompt); the new one by a chain of BLAKE2b digests (linear). Reported: the time per
call and per prompt token; flat per token means linear.

Reuse: a pool of 1,000, 10,000 or 100,000 blocks of 4, all free, half of them holding a cached one-block prefix; the
timed call is `add_request` of a prompt whose first block is one of those, at a random place in the free blocks, so
the manager takes it out of the middle of its free blocks (old: `list.remove`, a scan; new: an O(1) unlink). Each
block goes back (`finish`, untimed) before the next call.

The old manager is `speclab/kv.py` at `--old-rev` (default f81bdbf, before the production manager), loaded from git
into a temporary module; the two alternate call by call, so a busy machine slows both alike. Each figure is the least of
`--repeats` calls: on a shared machine a call of a millisecond or more is often descheduled for a time slice (tens of
ms) that has nothing to do with the code, and the least time is the one without that.
"""
import argparse
import importlib.util
import inspect
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import speclab.kv as new_kv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402

OLD_REV = "f81bdbf"  # the commit before Chapter 6's production manager
ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-rev", default=OLD_REV, help=f"git revision of the old speclab/kv.py (default {OLD_REV})")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per size and manager (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and the reuse order (default 0)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    return a


def load_old(rev: str):
    "speclab/kv.py as it was at `rev`, imported as a module of its own."
    src = subprocess.run(["git", "show", f"{rev}:speclab/kv.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_kv.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("speclab._old_kv", path)  # in speclab: `from .sampling` resolves
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _timed(call) -> int:
    t0 = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - t0


def allocate_slots(m):
    "The manager's slot allocation: `allocate_slots` today, `schedule` in the manager at f81bdbf."
    return getattr(m, "allocate_slots", None) or m.schedule


def adder(mod, m):
    """`add(req_id, prompt)` for manager `m` of module `mod`, on either API: a `Request` record (today's manager
    takes nothing else; making the record is part of an engine's cost), or the req_id and prompt of the managers
    before it. Resolved once, outside the timed calls; it returns the tokens the prefix cache covered."""
    if len(inspect.signature(m.add_request).parameters) == 1:
        return lambda req_id, prompt: m.add_request(mod.Request(req_id, prompt))
    return m.add_request


def commit_one(m, req_id, token: int) -> int:
    "Commit a step without drafts that emits `token` (today: commit(req_id, num_drafted, num_accepted, emitted))."
    if len(inspect.signature(m.commit).parameters) == 4:
        return m.commit(req_id, 0, 0, [token])
    return m.commit(req_id, 0, [token])


def lookup_managers(mods: dict, prompt: list[int], block_size: int = 16) -> dict:
    "One manager per module, each with every full block of `prompt` cached and free."
    out = {}
    for name, mod in mods.items():
        m = mod.BlockManager(len(prompt) // block_size + 4, block_size)
        adder(mod, m)("warm", prompt + [1])
        allocate_slots(m)("warm")
        commit_one(m, "warm", 2)
        m.finish("warm")
        out[name] = m
    return out


def time_lookup(mods: dict, num_tokens: int, repeats: int, rng: random.Random) -> dict:
    "Least ns of add_request for a fully cached prompt of `num_tokens`, per manager."
    prompt = [rng.randrange(32000) for _ in range(num_tokens)]
    managers, times = lookup_managers(mods, prompt), {name: [] for name in mods}
    adders = {name: adder(mods[name], m) for name, m in managers.items()}
    for i in range(repeats):
        for name, m in managers.items():
            times[name].append(_timed(lambda: adders[name](i, prompt + [7])))
            assert m.requests[i].num_computed_tokens == num_tokens, name  # every full block was a hit
            m.finish(i)
    return {name: min(t) for name, t in times.items()}


def reuse_managers(mods: dict, num_blocks: int) -> dict:
    "One manager per module: a pool of `num_blocks` blocks of 4, all free, half of them a cached one-block prefix."
    out = {}
    for name, mod in mods.items():
        m = mod.BlockManager(num_blocks, 4)
        for n in range(num_blocks // 2):
            adder(mod, m)(n, [n, 0, 0, 0, 1])  # one full block (cached by its first step) and one partial
            allocate_slots(m)(n)
            commit_one(m, n, 2)
        for n in range(num_blocks // 2):
            m.finish(n)
        out[name] = m
    return out


def time_reuse(mods: dict, num_blocks: int, repeats: int, rng: random.Random) -> dict:
    "Least ns of add_request whose first block is a free cached block at a random place in the free blocks."
    managers, times = reuse_managers(mods, num_blocks), {name: [] for name in mods}
    adders = {name: adder(mods[name], m) for name, m in managers.items()}
    for i in range(repeats):
        n = rng.randrange(num_blocks // 2)
        for name, m in managers.items():
            times[name].append(_timed(lambda: adders[name](("hit", i), [n, 0, 0, 0, 9])))
            assert m.requests[("hit", i)].num_computed_tokens == 4, name  # the cached block was found
            m.finish(("hit", i))
    return {name: min(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    mods = {"old": load_old(a.old_rev), "new": new_kv}
    rng = random.Random(a.seed)
    print(f"{utc_now()}; {machine()}; load average {load_average()} at start; Python {sys.version.split()[0]}")
    print(f"old: speclab/kv.py at {a.old_rev}; new: speclab.kv of this tree; the least of {a.repeats} timed calls\n")
    print("| prompt tokens (blocks of 16, all cached) | old µs per lookup | new µs per lookup "
          "| old ns per token | new ns per token | old / new |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (256, 2048, 8192):
        t = time_lookup(mods, n, a.repeats, rng)
        print(f"| {n:,} | {t['old'] / 1e3:,.1f} | {t['new'] / 1e3:,.1f} | {t['old'] / n:,.0f} | {t['new'] / n:,.0f} "
              f"| {t['old'] / t['new']:,.1f} |")
    print("\n| pool (blocks of 4; half cached, all free) | old µs per reuse | new µs per reuse | old / new |")
    print("|---:|---:|---:|---:|")
    for num_blocks in (1_000, 10_000, 100_000):
        t = time_reuse(mods, num_blocks, a.repeats, rng)
        print(f"| {num_blocks:,} | {t['old'] / 1e3:,.1f} | {t['new'] / 1e3:,.1f} | {t['old'] / t['new']:,.1f} |")
    print(f"\nload average {load_average()} at the end")


if __name__ == "__main__":
    main()
