"""Module boundaries one streamed request crosses in the engine, counted with sys.setprofile.

    python benchmarks/engine/engine_walk.py          # a table: chain, tree, auto; the engine alone, then serve's loop
    python benchmarks/engine/engine_walk.py --json > benchmarks/engine/engine_walk_after.json
    python benchmarks/engine/engine_walk.py --modes engine --drafting chain   # the engine alone, chain drafting
    PYTHONPATH=/tmp/speclab_at_sha python benchmarks/engine/engine_walk.py --speclab-commit SHA   # another tree

A crossing is a Python call whose callee lives in one speclab module and whose caller, the nearest speclab frame on
the stack, in another: speclab.A -> torch -> speclab.B counts as A -> B; calls into torch or the standard library
are not crossings, nor are calls inside one module. An edge is (caller module, callee module, callee function).
Per request: from add_request (serve: the Add command) to the step that finishes it; per step: each engine step
(serve: the loop's step, its delivery and publishing), the steady state being the steps after the first (prefill).

The request: the shipped tiny pair, greedy, one short prompt, max_tokens 24 (EOS ignored), streamed, on an engine
built as `speclab serve` builds it (`speclab.serve.load_engine`) and warmed by one request with another prompt. Three
ways of drafting (DRAFTINGS): `chain`, the draft model proposing kappa 3 tokens a step; `tree`, Chapter 14's
TreeDrafter on the same draft model (an EAGLE-2 tree: top-2, 3 levels, 5 nodes verified a step); `auto`, the draft
model with `--kappa auto`: the KappaPolicy plans each step's kappa, on FIXED_COSTS (a calibration of this machine,
rounded, given instead of measured so that its kappas and counts repeat; `--measured-calibration` calibrates the machine
as `speclab serve` does, and its counts can then differ between runs).
A refactored engine: adapt the three small functions under "The engine" (build, step function, serve's loop).
"""
import argparse
import contextlib
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PROMPT = "def add(a, b):\n"
WARM_PROMPT = "import os\n"
MAX_TOKENS = 24
KAPPA = 3
TREE = {"topk": 2, "num_steps": 3, "num_draft_tokens": 6}     # SGLang's words: 5 nodes verified a step
DRAFTINGS = {"chain": {"kappa": KAPPA}, "tree": {"tree": TREE}, "auto": {"kappa": "auto"}}   # load_engine's arguments
PREFIX = "speclab"


# kappa "auto" with fixed step costs, so that its kappas do not follow one process's calibration.
FIXED_COSTS = {"verify_s": 0.0058, "verify_token_s": 0.0004, "draft_s": 0.001, "draft_request_s": 0.0,
               "spec_s": 0.0026}              # a calibration of the shipped pair on the 2-core AMD EPYC, rounded
fixed_calls = [0]


def fix_calibration() -> bool:
    """Make `--kappa auto`'s calibration return StepCosts(**FIXED_COSTS) instead of measuring: `measure_step_costs`
    replaced in every loaded speclab module that holds it (wherever a split puts it). Whether it could."""
    import speclab.engine
    import speclab.serve  # noqa: F401  (load_engine's module, and what it imports)
    mods = [m for n, m in sorted(sys.modules.items()) if n == "speclab" or n.startswith("speclab.")]
    cls = next((m.StepCosts for m in mods if isinstance(getattr(m, "StepCosts", None), type)), None)
    if cls is None:
        return False

    def measure_step_costs(*args, **kwargs):
        fixed_calls[0] += 1
        return cls(**FIXED_COSTS)
    hits = [m for m in mods if callable(getattr(m, "measure_step_costs", None))]
    for m in hits:
        m.measure_step_costs = measure_step_costs
    return bool(hits)


# The engine: what a refactor may change.
def build_engine(drafting: str = "chain", fixed: bool = True) -> Any:
    """A fresh engine on the shipped tiny pair drafting by DRAFTINGS[drafting], as `speclab serve` builds it; auto's
    calibration fixed to FIXED_COSTS unless `fixed` is False."""
    from speclab.serve import load_engine
    from speclab.train import tiny_pair_path
    if drafting == "auto" and fixed and not fix_calibration():
        raise SystemExit("found no StepCosts / measure_step_costs in speclab: run with --measured-calibration")
    calls = fixed_calls[0]
    engine = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), seed=0, **DRAFTINGS[drafting])
    if drafting == "auto" and fixed and fixed_calls[0] == calls:
        raise SystemExit("load_engine did not call measure_step_costs: run with --measured-calibration")
    return engine


def request_params() -> Any:
    "The request's sampling parameters: greedy, MAX_TOKENS new tokens (speclab.engine re-exports them after a split)."
    from speclab.engine import SamplingParams
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def step_function(engine: Any) -> Any:
    "The code object of one engine step: each call to it starts a new step in the counts."
    return type(engine).step.__code__


def serve_loop(engine: Any, prompt: str, params: Any, on_event: Callable[[Any, Any], None]) -> Any:
    """serve's EngineLoop on `engine`, the request queued as a streamed completion; on_event(loop, event) sees each
    event it delivers. Returns the loop: its run() serves in the calling thread until a Stop command."""
    from speclab.serve import EngineLoop, Stream

    @dataclass(eq=False)
    class Collect(Stream):
        "A stream that hands each event to on_event rather than to an asyncio queue (no handler waits here)."
        def put(self, event: Any) -> None:
            on_event(lp, event)

    lp = EngineLoop(engine)
    lp.add(prompt, params, Collect(deltas=True, loop=None, queue=None))
    return lp


def finished(event: Any) -> bool:
    "Whether a serve event ends its request (Done or Failed)."
    return type(event).__name__ in ("Done", "Failed")


def stop_command() -> Any:
    "The command that ends serve's loop after the request."
    from speclab.serve import Stop
    return Stop()


# The counting.
def in_package(module: str, prefix: str = PREFIX) -> bool:
    "Whether a module name belongs to the package `prefix`."
    return module == prefix or module.startswith(prefix + ".")


def function_name(frame: Any) -> str:
    "The called function's qualified name; a dataclass's generated method named after its class, not __create_fn__."
    name = frame.f_code.co_qualname
    if name.startswith("__create_fn__.") and "self" in frame.f_locals:
        return f"{type(frame.f_locals['self']).__qualname__}.{frame.f_code.co_name}"
    return name


class CrossingCounter:
    """A sys.setprofile hook counting crossings into `prefix`'s modules, per phase: phase 0 runs until the first
    call of `step_code`, phase i is the i-th step. `with counter:` installs it for the calling thread."""
    def __init__(self, prefix: str = PREFIX, step_code: Any = None):
        self.prefix = prefix
        self.step_code = step_code
        self.phase = 0
        self.active = True
        self.edges = defaultdict(Counter)   # phase -> Counter of (caller module, callee module, callee function)
        self.touched = defaultdict(set)     # phase -> the package's modules whose functions ran
        self.previous = None

    def module(self, frame: Any) -> str | None:
        "The frame's module if it is one of the package's, else None."
        name = frame.f_globals.get("__name__", "")
        return name if in_package(name, self.prefix) else None

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        "setprofile's callback: on each Python call, count an edge if the callee's module differs from the caller's."
        if event != "call" or not self.active:
            return
        if frame.f_code is self.step_code:
            self.phase += 1
        callee = self.module(frame)
        if callee is None:
            return
        self.touched[self.phase].add(callee)
        caller = frame.f_back
        while caller is not None and self.module(caller) is None:
            caller = caller.f_back
        if caller is not None and self.module(caller) != callee:
            self.edges[self.phase][(self.module(caller), callee, function_name(frame))] += 1

    def __enter__(self) -> "CrossingCounter":
        self.previous = sys.getprofile()
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self.previous)


def edge_name(edge: tuple[str, str, str], prefix: str = PREFIX) -> str:
    "An edge as 'engine -> model.forward_paged' (the package prefix dropped)."
    short = [m.removeprefix(prefix + ".") for m in edge[:2]]
    return f"{short[0]} -> {short[1]}.{edge[2]}"


def summarize(counter: CrossingCounter) -> dict:
    """Per request (every phase) and per steady step (the steps after the first): crossings, distinct edges, the
    modules touched; the edges of every steady step, and the mean count of each edge per steady step."""
    phases = sorted(set(counter.edges) | set(counter.touched))
    request = sum((counter.edges[p] for p in phases), Counter())
    steps = [p for p in phases if p >= 1]
    steady = steps[1:]
    per_step = [{"step": p, "crossings": sum(counter.edges[p].values()), "distinct": len(counter.edges[p])}
                for p in steps]
    union = sum((counter.edges[p] for p in steady), Counter())
    every = set.intersection(*(set(counter.edges[p]) for p in steady)) if steady else set()
    n = max(len(steady), 1)
    return {
        "request": {"crossings": sum(request.values()), "distinct": len(request),
                    "modules": sorted(set().union(*(counter.touched[p] for p in phases))),
                    "edges": {edge_name(e, counter.prefix): c for e, c in request.most_common()}},
        "steps": len(steps), "per_step": per_step,
        "steady_step": {"steps": len(steady), "crossings_mean": round(sum(union.values()) / n, 2),
                        "distinct_mean": round(sum(len(counter.edges[p]) for p in steady) / n, 2),
                        "distinct_every_step": len(every), "distinct_any_step": len(union),
                        "modules": sorted(set().union(*(counter.touched[p] for p in steady))),
                        "edges_per_step": {edge_name(e, counter.prefix): round(c / n, 2)
                                           for e, c in union.most_common()}},
    }


# The two walks.
def counting(counter: CrossingCounter | None) -> Any:
    "The counter, installed for the block; nothing when it is None (an uncounted warm-up)."
    return contextlib.nullcontext() if counter is None else counter


def walk_engine(engine: Any, prompt: str, counter: CrossingCounter | None) -> dict:
    "Serve one streamed request with the engine alone (add_request, then step until it finishes), counted."
    streamed, outputs = [], []
    with counting(counter):
        req_id = engine.add_request(prompt, request_params(), on_tokens=streamed.extend)
        for _ in range(10 * MAX_TOKENS):
            outs = [o for o in engine.step() if o.req_id == req_id]
            outputs += outs
            if any(o.finished is not None for o in outs):
                break
    return {"tokens": len(streamed), "text": "".join(o.new_text or "" for o in outputs)}


def walk_serve(engine: Any, prompt: str, counter: CrossingCounter | None) -> dict:
    "Serve one streamed request through serve's EngineLoop, run in this thread until the request's Done, counted."
    events = []

    def on_event(lp: Any, event: Any) -> None:
        events.append(event)
        if finished(event):
            if counter is not None:
                counter.active = False           # what follows (the Stop, the loop's close) is not the request's
            lp.send(stop_command())

    lp = serve_loop(engine, prompt, request_params(), on_event)
    with counting(counter):
        lp.run()
    done = events[-1]
    return {"tokens": len(getattr(getattr(done, "output", None), "token_ids", []) or []),
            "text": "".join(getattr(e, "text", "") for e in events), "last_event": type(done).__name__}


WALKS = {"engine": walk_engine, "serve": walk_serve}


def measure(mode: str, drafting: str = "chain", fixed: bool = True) -> dict:
    "A fresh engine drafting by `drafting`, one warm-up request (another prompt), then the counted request."
    engine = build_engine(drafting, fixed)
    WALKS[mode](engine, WARM_PROMPT, None)
    counter = CrossingCounter(step_code=step_function(engine))
    served = WALKS[mode](engine, PROMPT, counter)
    m = getattr(engine, "metrics", None)
    spec = {k: round(getattr(m, k), 3) for k in ("acceptance_rate", "mean_acceptance_length") if hasattr(m, k)}
    drafter = getattr(engine, "drafter", None)
    return {"drafting": drafting, "mode": mode, "engine_args": DRAFTINGS[drafting],
            "drafter": type(drafter).__name__ if drafter is not None else None, **served,
            "spec_metrics_both_requests": spec, **summarize(counter)}


def table(results: list[dict]) -> str:
    "The counts as plain text: one line per walk, then each walk's edges of a steady step."
    out = [f"{'drafting':<9}{'walk':<8}{'req cross':>10}{'req edges':>10}{'modules':>8}{'steps':>6}"
           f"{'step cross':>11}{'step edges':>11}{'every step':>11}", "-" * 84]
    for r in results:
        q, s = r["request"], r["steady_step"]
        out.append(f"{r['drafting']:<9}{r['mode']:<8}{q['crossings']:>10}{q['distinct']:>10}{len(q['modules']):>8}"
                   f"{r['steps']:>6}{s['crossings_mean']:>11}{s['distinct_mean']:>11}{s['distinct_every_step']:>11}")
    for r in results:
        short = [m.removeprefix(PREFIX + ".") for m in r["request"]["modules"]]
        out += ["", f"{r['drafting']}, {r['mode']}: {r['tokens']} tokens in {r['steps']} steps; modules per request: "
                    f"{', '.join(short)}",
                f"  crossings per step: {', '.join(str(x['crossings']) for x in r['per_step'])} (the first: prefill)",
                "  edges of a steady step (mean calls per step):"]
        out += [f"  {c:>8}  {e}" for e, c in r["steady_step"]["edges_per_step"].items()]
        once = [e for e in r["request"]["edges"] if e not in r["steady_step"]["edges_per_step"]]
        out += ["  edges outside the steady steps (admission, prefill, finish):"] + [f"            {e}" for e in once]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict]:
    "Walk the request in each mode and print the table (or one JSON object)."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", choices=list(WALKS), default=list(WALKS), help="the walks to run")
    ap.add_argument("--drafting", nargs="+", choices=list(DRAFTINGS), default=list(DRAFTINGS),
                    help="how the engine drafts: chain (kappa 3), tree (TREE), auto (--kappa auto); default all")
    ap.add_argument("--measured-calibration", action="store_true", help="auto: calibrate this machine as `speclab "
                    "serve` does (default: FIXED_COSTS, counts that repeat)")
    ap.add_argument("--speclab-commit", help="the commit of the speclab tree imported (recorded in the output)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    import torch
    import speclab
    torch.set_num_threads(1)
    results = [measure(mode, drafting, not a.measured_calibration) for drafting in a.drafting for mode in a.modes]
    meta = {"speclab": str(Path(speclab.__file__).parent), "speclab_commit": a.speclab_commit, "prompt": PROMPT,
            "max_tokens": MAX_TOKENS, "draftings": {d: DRAFTINGS[d] for d in a.drafting},
            "draft": "the shipped tiny pair's draft model", "greedy": True, "warm_prompt": WARM_PROMPT,
            "python": sys.version.split()[0], "torch": torch.__version__,
            "auto_costs": "measured" if a.measured_calibration else FIXED_COSTS}
    print(json.dumps({"meta": meta, "walks": results}, indent=1) if a.json else table(results))
    return results


if __name__ == "__main__":
    main()
