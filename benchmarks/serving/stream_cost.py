"""The cost of streaming text, per token, at 100 and at 3,000 output tokens: decoding a request's whole
output again at every step (the engine's stop_cut and the server's visible_text at f81bdbf, copied below and
marked) against Chapter 7's Detokenizer, side by side in one run.

    python benchmarks/serving/stream_cost.py                  # both parts
    python benchmarks/serving/stream_cost.py --part text      # one part only (text | server)
    python benchmarks/serving/stream_cost.py --json           # one JSON object

(a) Text. The shipped tokenizer; a request's output is n held-out tokens (n = 100 and 3,000) emitted --per-step (4:
kappa 3, every draft accepted) a step, with one stop string that never appears (so stops are checked and the stream
holds back what could begin one). Per step the old way runs stop_cut (one decode of the whole output per new token)
and visible_text (one more decode of it); the new way pushes each token into a Detokenizer and take()s the text
that became visible; a third column slices visible() instead of take() (a join of the whole text per step). Reported:
microseconds per token over the last --window (100) tokens before n, the least over --repeats (7) interleaved runs (a
shared machine deschedules a run for whole time slices; the least time is the one without that), and the ratio of
the figure at 3,000 to the one at 100: flat is 1.

(b) Server. A random Llama (speclab.testing.tiny_random_pair's target: vocab 4,096 so that the shipped tokenizer fits
it, context 4,096, float32) drafting for itself through ModelDrafter at kappa 3 (every draft is accepted: 4 tokens a
step, so the model's share of a token is small and the text path shows), behind the OpenAI server in one process
(ServerThread); one streamed request at a time, max_tokens 100 and 3,000, sampled (temperature 1, seed 0),
ignore_eos, one stop string that never appears. The old server and engine are the tree at --old-rev (git archive into
a temporary folder, run in a subprocess with that tree first on PYTHONPATH), the new one this tree, in alternating
subprocesses. Reported: milliseconds per streamed token over about the last --window tokens before n (from the
chunks' arrival times) and over the whole request (wall time to [DONE] over completion tokens), the least over
--server-repeats (3), and the ratio at 3,000 over 100. The model's attention also grows with the context, a little.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from bench_env import load_average, machine, utc_now  # noqa: E402


OLD_REV = "f81bdbf"   # the engine and server before the Detokenizer
ROOT = Path(__file__).resolve().parents[2]
STOP = "\n\n\n\n\n\n"  # a stop string the held-out text never holds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["text", "server", "all"], default="all")
    ap.add_argument("--per-step", type=int, default=4, help="tokens a step emits (default 4)")
    ap.add_argument("--window", type=int, default=100, help="tokens before n over which a token is timed (100)")
    ap.add_argument("--repeats", type=int, default=7, help="runs per method and length, text part (default 7)")
    ap.add_argument("--server-repeats", type=int, default=3, help="requests per tree and length (default 3)")
    ap.add_argument("--old-rev", default=OLD_REV, help=f"the tree of the old server (default {OLD_REV})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", help=argparse.SUPPRESS)          # internal: one tree's server measurements
    a = ap.parse_args(argv)
    if a.per_step < 1 or a.window < 1 or a.repeats < 1 or a.server_repeats < 1:
        ap.error("--per-step, --window, --repeats and --server-repeats must be >= 1")
    return a


# ---- the old way, copied from speclab at f81bdbf (engine.stop_cut, serve.visible_text): OLD CODE, for comparison ----
def old_stop_cut(new, generated, stop, stop_ids, max_tokens, tokenizer):
    "OLD (engine.stop_cut at f81bdbf): keep, reason; one decode of the whole output per candidate cut."
    keep = min(len(new), max_tokens - len(generated))
    reason = "length" if len(generated) + keep == max_tokens else None
    for i, t in enumerate(new[:keep]):
        if t in stop_ids:
            keep = i + 1
            reason = "stop"
            break
    if stop:
        for j in range(1, keep + 1):
            text = tokenizer.decode(generated + new[:j])
            if any(s in text for s in stop):
                return j, "stop"
    return keep, reason


def old_visible_text(token_ids, stop, stop_ids, tokenizer):
    "OLD (serve.visible_text at f81bdbf): the whole output decoded again, minus what must be held back."
    text = tokenizer.decode([t for t in token_ids if t not in stop_ids]).rstrip("\ufffd")
    hold = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[:len(text) - hold]
# ---- end of the old code ----


def stream_old(tok, ids, per_step, stop_ids):
    "The old per-step text work; the time at which each token's step ended (ns)."
    out, sent, ends = [], "", []
    for i in range(0, len(ids), per_step):
        new = ids[i:i + per_step]
        keep, _ = old_stop_cut(new, out, (STOP,), stop_ids, 10 ** 9, tok)
        out += new[:keep]
        text = old_visible_text(out, (STOP,), stop_ids, tok)
        sent += text[len(sent):]
        ends += [time.perf_counter_ns()] * len(new)
    return sent, ends


def stream_take(tok, ids, per_step, stop_ids):
    "Chapter 7's Detokenizer: push each token, take() what became visible."
    from speclab.model import Detokenizer
    d, sent, ends = Detokenizer(tok, (STOP,), stop_ids), [], []
    for i in range(0, len(ids), per_step):
        new = ids[i:i + per_step]
        for t in new:
            d.push(t)
        sent.append(d.take())
        ends += [time.perf_counter_ns()] * len(new)
    return "".join(sent), ends


def stream_visible(tok, ids, per_step, stop_ids):
    "The Detokenizer with visible() sliced per step (what a caller that keeps a count of characters sent does)."
    from speclab.model import Detokenizer
    d, sent, ends = Detokenizer(tok, (STOP,), stop_ids), "", []
    for i in range(0, len(ids), per_step):
        new = ids[i:i + per_step]
        for t in new:
            d.push(t)
        text = d.visible()
        sent += text[len(sent):]
        ends += [time.perf_counter_ns()] * len(new)
    return sent, ends


METHODS = {"old: decode all per step": stream_old, "Detokenizer take()": stream_take,
           "Detokenizer visible()": stream_visible}


def text_part(a: argparse.Namespace) -> dict:
    "Microseconds per token over the window before n, per method; least over repeats, methods interleaved."
    from speclab.model import load_tokenizer
    from speclab.train import tiny_pair_path
    tok = load_tokenizer(tiny_pair_path("target"))
    held = np.load(tiny_pair_path("target").parent / "heldout_ids.npy").tolist()
    stop_ids = {tok.eos_token_id}
    best = {}
    for n in (100, 3000):
        ids = [t for t in held[1000:1000 + n]]
        want = tok.decode(ids).rstrip("\ufffd")
        for r in range(a.repeats):
            for name, fn in METHODS.items():
                t0 = time.perf_counter_ns()
                text, ends = fn(tok, ids, a.per_step, stop_ids)
                assert want.startswith(text) and len(want) - len(text) < len(STOP), name   # the same stream
                lo = max(n - a.window, 0)
                start = ends[lo - 1] if lo else t0
                us = (ends[-1] - start) / 1000 / (n - lo)
                best[(name, n)] = min(best.get((name, n), float("inf")), us)
    rows = [{"method": name, "us_per_token_at_100": best[(name, 100)], "us_per_token_at_3000": best[(name, 3000)],
             "ratio": best[(name, 3000)] / best[(name, 100)]} for name in METHODS]
    return {"rows": rows, "per_step": a.per_step, "window": a.window, "repeats": a.repeats}


def server_worker(a: argparse.Namespace) -> dict:
    "In a subprocess, with one tree first on sys.path: seconds and tokens of streamed requests (run as --worker)."
    import httpx
    import torch
    from speclab.drafters import ModelDrafter
    from speclab.engine import SpecDecoder
    from speclab.model import load_tokenizer
    from speclab.serve import EngineLoop, ServerThread, build_app
    from speclab.testing import tiny_random_pair
    from speclab.train import tiny_pair_path
    torch.set_num_threads(1)
    tok = load_tokenizer(tiny_pair_path("target"))
    target, _ = tiny_random_pair(vocab_size=len(tok), context=4096, dtype=torch.float32)
    draft = copy.deepcopy(target)              # the target drafting for itself: every draft accepted, 4 tokens a step
    engine = SpecDecoder(target, ModelDrafter(draft, tokenizer=tok), tok, kappa=3, seed=0, max_num_seqs=4)
    prompt = np.load(tiny_pair_path("target").parent / "heldout_ids.npy")[:64].tolist()
    lengths = [int(x) for x in a.worker.split(",")]
    out = []
    with ServerThread(build_app(EngineLoop(engine), "random")) as srv, httpx.Client(base_url=srv.url,
                                                                                    timeout=600) as c:
        for n in [16] + lengths:                 # a warm-up request first
            body = {"prompt": prompt, "max_tokens": n, "seed": 0, "ignore_eos": True, "stop": [STOP], "stream": True,
                    "stream_options": {"include_usage": True}}
            t0, lines, times = time.perf_counter(), [], []
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        times.append(time.perf_counter())
            assert lines[-1] == "data: [DONE]", lines[-3:]
            tokens = json.loads(lines[-2][len("data: "):])["usage"]["completion_tokens"]
            chunks = len(lines) - 2                # text chunks: the usage chunk and [DONE] are not text
            last = max(1, min(chunks - 1, round(a.window * chunks / tokens)))   # about --window tokens
            tail = (times[chunks - 1] - times[chunks - 1 - last]) / (last * tokens / chunks)
            out.append({"n": n, "seconds": times[-1] - t0, "tokens": tokens, "chunks": chunks, "tail_seconds": tail})
    return {"runs": out[1:], "root": str(Path(sys.modules["speclab"].__file__).parent.parent)}


def run_worker(tree: Path, lengths: list[int], window: int) -> dict:
    "One server measurement in a subprocess whose speclab is the one in `tree`."
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(map(str, lengths)),
                        "--window", str(window)],
                       env=env, capture_output=True, text=True, cwd=tree, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"the server worker in {tree} failed:\n{r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(got["root"]).resolve() == tree.resolve(), (got["root"], tree)
    return got


def server_part(a: argparse.Namespace) -> dict:
    "Milliseconds per streamed token, old tree against this one, alternating; least over repeats."
    old = Path(tempfile.mkdtemp(prefix="stream_cost_old_"))
    archive = subprocess.run(["git", "archive", a.old_rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    trees = {f"old ({a.old_rev})": old, "new (this tree)": ROOT}
    best = {}
    for _ in range(a.server_repeats):
        for name, tree in trees.items():
            for run in run_worker(tree, [100, 3000], a.window)["runs"]:
                per_token = {"mean": 1000 * run["seconds"] / run["tokens"], "tail": 1000 * run["tail_seconds"]}
                for what, ms in per_token.items():
                    key = (name, what, run["n"])
                    best[key] = min(best.get(key, float("inf")), ms)
    rows = [{"server": name, "what": what, "ms_per_token_at_100": best[(name, what, 100)],
             "ms_per_token_at_3000": best[(name, what, 3000)],
             "ratio": best[(name, what, 3000)] / best[(name, what, 100)]}
            for what in ("tail", "mean") for name in trees]
    return {"rows": rows, "repeats": a.server_repeats, "old_rev": a.old_rev}


def main(argv: list[str] | None = None) -> int:
    "Run the parts asked for; print a table (or JSON)."
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(server_worker(a)))
        return 0
    res = {"date": utc_now(), "machine": machine(), "load_before": load_average(),
           "command": "python benchmarks/serving/" + " ".join([Path(__file__).name] + (argv or sys.argv[1:]))}
    if a.part in ("text", "all"):
        res["text"] = text_part(a)
    if a.part in ("server", "all"):
        res["server"] = server_part(a)
    res["load_after"] = load_average()
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{res['date']}, {res['machine']}; load {res['load_before']} before, {res['load_after']} after")
    if "text" in res:
        t = res["text"]
        print(f"\n(a) text, shipped tokenizer, {t['per_step']} tokens a step: us per token over the last "
              f"{t['window']} tokens before n (least of {t['repeats']})")
        print(f"{'method':<28}{'n = 100':>10}{'n = 3,000':>12}{'3,000 / 100':>13}")
        for r in t["rows"]:
            print(f"{r['method']:<28}{r['us_per_token_at_100']:>10.1f}{r['us_per_token_at_3000']:>12.1f}"
                  f"{r['ratio']:>13.2f}")
    if "server" in res:
        s = res["server"]
        print(f"\n(b) server, random pair (vocab 4,096, context 4,096), kappa 3, one streamed request: ms per token "
              f"(least of {s['repeats']})")
        print(f"{'server':<22}{'tokens timed':<22}{'n = 100':>10}{'n = 3,000':>12}{'3,000 / 100':>13}")
        for r in s["rows"]:
            what = f"last ~{a.window} before n" if r["what"] == "tail" else "all of the request"
            print(f"{r['server']:<22}{what:<22}{r['ms_per_token_at_100']:>10.3f}{r['ms_per_token_at_3000']:>12.3f}"
                  f"{r['ratio']:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
