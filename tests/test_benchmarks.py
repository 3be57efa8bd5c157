"""The GPU benchmarks' CPU smoke tests: each script's --dry-run runs every section and writes sane records."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_h100_e2e_dry_run(tmp_path: Path) -> None:
    "h100_e2e.py --dry-run: every section ok, the static step equals forward, the engine's greedy runs are exact."
    out = tmp_path / "h100"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "h100_e2e.py"), "--dry-run", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    meta, sections = res["meta"], res["sections"]
    names = ["bandwidth", "decode", "draft", "verify", "batch", "engine"]
    assert list(sections) == names
    assert all(sections[n]["status"] == "ok" and sections[n]["records"] for n in names), \
        {n: sections[n]["status"] for n in names}
    md = (out / "results.md").read_text()
    assert all(f"## {n}: ok" in md for n in names)
    assert meta["dry_run"] and meta["dtype"] == "fp32" and meta["weights"] == "random"
    assert meta["step_parity"] < 1e-4                       # the static step's math is speclab.model's

    assert sections["bandwidth"]["records"][0]["GBps"] > 0
    decode, draft = sections["decode"]["records"][0], sections["draft"]["records"][0]
    assert (decode["model"], draft["model"]) == ("tiny-2l", "tiny-1l")
    assert all(x["ms"] > 0 and x["floor_ms"] > 0 and x["mode"] == "eager" for x in (decode, draft))
    assert meta["c_measured"] == round(draft["ms"] / decode["ms"], 4)

    kappa = meta["kappa"]
    verify = sections["verify"]["records"]
    Ts = [x["T"] for x in verify]
    assert Ts == sorted(Ts) and 1 in Ts and kappa + 1 in Ts and verify[0]["cost"] == 1.0
    assert meta["v_measured"] == next(x["cost"] for x in verify if x["T"] == kappa + 1)

    batch = sections["batch"]["records"]
    assert [x["B"] for x in batch] == [1, 2, 4]
    E_model = (1 - meta["alpha"] ** (kappa + 1)) / (1 - meta["alpha"])
    for x in batch:
        assert abs(x["spec_ms"] - (kappa * x["draft_ms"] + x["verify_ms"])) < 1e-3
        assert abs(x["speedup"] - E_model * x["plain_ms"] / x["spec_ms"]) < 1e-2

    engine = sections["engine"]["records"]
    runs = ("synthetic", "draft", "eagle-synthetic", "eagle")
    assert {(x["B"], x["run"]) for x in engine} == {(B, r) for B in (1, 4) for r in runs} | {(1, "self")}
    assert all(x["method"] == ("eagle3" if x["run"].startswith("eagle") else "draft_model") for x in engine)
    eagle = meta["eagle"]      # no --eagle: a random tiny EAGLE-3 folder written into --out, through the loader
    assert eagle["folder"] is None and eagle["used"] == str(out / "eagle3-synthetic")
    assert all((out / "eagle3-synthetic" / f).is_file() for f in ("config.json", "model.safetensors"))
    assert eagle["architecture"] == "LlamaForCausalLMEagle3" and eagle["draft_vocab_size_used"] == 192
    for x in engine:
        assert x["forward"] == "eager" and x["new_tokens"] == meta["engine_tokens"]
        assert x["plain_tok_s"] > 0 and x["spec_tok_s"] > 0
        assert abs(x["speedup"] - x["spec_tok_s"] / x["plain_tok_s"]) < 1e-2
        assert 1 <= x["E"] <= kappa + 1
        assert x["spec_steps"] < x["plain_steps"] or x["E"] < 1.5   # E > 1 means fewer steps than one per token
        assert abs(x["draft_share"] + x["target_share"] + x["other_share"] - 1) < 1e-2
        assert x["draft_share"] > 0 and x["target_share"] > 0
        c = 1.0 if x["run"] == "self" else x["c_engine"] if x["method"] == "eagle3" else meta["c_measured"]
        assert abs(x["predicted"] - x["E"] / (meta["v_measured"] + kappa * c)) < 1e-2
    exact = [x for x in engine if x["sampler"] == "rejection_sampler"]
    assert len(exact) == 5                                    # draft and eagle at B = 1 and 4, self at 1
    assert all(x["outputs_match"] == 1.0 and x["prefix_match"] == 1.0 for x in exact)   # = plain decoding
    assert all(x["sampler"].startswith("SyntheticSampler") and x["outputs_match"] is None
               for x in engine if x["run"] == "synthetic")
    self_draft = next(x for x in engine if x["run"] == "self")
    assert self_draft["acceptance_rate"] > 0.9 and self_draft["E"] > 1 + 0.9 * kappa   # the target agrees with itself
    assert next(x for x in engine if x["run"] == "draft" and x["B"] == 4)["predicted_at_B"] is not None
    assert meta["compile"] == dict(requested=False, mode=None, status="not requested")


# vLLM's EAGLE-3 head for Llama-3.1-8B (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): its config and its tensors' shapes,
# written out here rather than derived from speclab.eagle, so that the loader is checked against the published layout.
EAGLE3_8B_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
                    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                    "max_position_embeddings": 2048, "vocab_size": 128256, "draft_vocab_size": 32000,
                    "tie_word_embeddings": False, "torch_dtype": "float16"}
EAGLE3_8B_TENSORS = {"d2t": ("I64", [32000]), "t2d": ("BOOL", [128256]), "fc.weight": ("F16", [4096, 12288]),
                     "midlayer.input_layernorm.weight": ("F16", [4096]),
                     "midlayer.hidden_norm.weight": ("F16", [4096]),
                     "midlayer.self_attn.q_proj.weight": ("F16", [4096, 8192]),
                     "midlayer.self_attn.k_proj.weight": ("F16", [1024, 8192]),
                     "midlayer.self_attn.v_proj.weight": ("F16", [1024, 8192]),
                     "midlayer.self_attn.o_proj.weight": ("F16", [4096, 4096]),
                     "midlayer.post_attention_layernorm.weight": ("F16", [4096]),
                     "midlayer.mlp.gate_proj.weight": ("F16", [14336, 4096]),
                     "midlayer.mlp.up_proj.weight": ("F16", [14336, 4096]),
                     "midlayer.mlp.down_proj.weight": ("F16", [4096, 14336]),
                     "norm.weight": ("F16", [4096]), "lm_head.weight": ("F16", [32000, 4096])}


def sparse_eagle3_8b(folder: Path) -> Path:
    """An EAGLE-3 folder for Llama-3-8B in the published layout: config.json and a model.safetensors whose d2t / t2d
    are real (every 4th target id) and whose 0.85 GB of weights are a sparse hole of zeros (no disk, nothing read)."""
    import struct
    import numpy as np
    size = {"I64": 8, "BOOL": 1, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in EAGLE3_8B_TENSORS.items():
        n = size[dtype] * int(np.prod(shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    ids = np.arange(0, 128256, 4)[:32000]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(EAGLE3_8B_CONFIG))
    t2d = np.zeros(128256, dtype=np.uint8)
    t2d[ids] = 1
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.write((ids - np.arange(32000)).astype("<i8").tobytes() + t2d.tobytes())
        f.truncate(8 + len(raw) + offset)
    return folder


def test_h100_e2e_dry_run_parses_an_8b_eagle3_folder(tmp_path: Path) -> None:
    """--dry-run --eagle DIR with a head for Llama-3-8B (the GPU run's target): DIR is checked against that target's
    config without reading its weights, and the tiny CPU path drafts with a random tiny head in the same layout (a
    quarter of the vocabulary, as the 8B head's 32,000 of 128,256); its exact runs equal plain decoding."""
    out = tmp_path / "h100"
    folder = sparse_eagle3_8b(tmp_path / "eagle3-8b")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "h100_e2e.py"), "--dry-run", "--eagle", str(folder),
           "--engine-tokens", "8", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    eagle = res["meta"]["eagle"]
    assert eagle["folder"] == str(folder) and eagle["fits"] == "llama-3-8b, the GPU run's target"
    assert eagle["feature_layers"] == [2, 16, 29] and eagle["draft_vocab_size"] == 32000   # vLLM's default layers
    assert eagle["used"] == str(out / "eagle3-synthetic") and eagle["draft_vocab_size_used"] == 64    # 256 / 4
    runs = [x for x in res["sections"]["engine"]["records"] if x["run"] == "eagle"]
    assert len(runs) == 2 and all(x["outputs_match"] == 1.0 and x["method"] == "eagle3" for x in runs)


def test_h100_e2e_eagle_folder_errors_are_named(tmp_path: Path) -> None:
    "A folder that fits no target, or has a misshapen tensor, stops the run at start-up with the file and key named."
    folder = sparse_eagle3_8b(tmp_path / "e3")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, hidden_size=2048)))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "h100_e2e.py"), "--dry-run", "--eagle", str(folder),
           "--out", str(tmp_path / "out")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "config.json: hidden_size is 2048, the target's is 4096" in r.stderr
    (folder / "config.json").write_text(json.dumps(dict(cfg, draft_vocab_size=16000)))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "model.safetensors: " in r.stderr
    assert "has shape (32000" in r.stderr and "the config and target imply (16000" in r.stderr   # d2t or lm_head
    r = subprocess.run(cmd[:-4] + ["--eagle", str(tmp_path), "--out", str(tmp_path / "out")], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "--eagle" in r.stderr and "config.json" in r.stderr


def test_serve_load_smoke() -> None:
    "serve_load.py at a small size: 8 streamed requests against a running limit of 2 all complete, nothing lost."
    cmd = [sys.executable, str(ROOT / "benchmarks" / "serving" / "serve_load.py"), "--requests", "8", "--max-num-seqs", "2",
           "--min-tokens", "9", "--max-tokens", "16", "--json", "--timeout", "300"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    report = json.loads(r.stdout)
    assert all(report["checks"].values()) and report["checks"], report["checks"]
    assert report["output_tokens"] == sum(range(9, 17)) and report["most_waiting_seen"] > 0
    assert report["ttft_s_p50"] <= report["latency_s_p99"] and report["E"] >= 1


def script(name: str):
    """A benchmark script of benchmarks/ (or of one of its topic folders) imported as a module (its pure functions;
    main() is not run)."""
    import importlib.util
    bench = ROOT / "benchmarks"
    path = next(p for p in (bench / f"{name}.py", *sorted(bench.glob(f"*/{name}.py"))) if p.is_file())
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_lines_counts_a_definition_and_its_closure(tmp_path: Path) -> None:
    """engine_lines.py: blank and comment lines do not count, docstrings do; a root brings the top-level names its
    definition mentions, transitively, but not those an earlier row counted; a used import no row counts is named."""
    lines = script("engine_lines")
    src = tmp_path / "model.py"
    src.write_text('"""A module."""\nimport os\n\nA = 1  # one\nB = A + 1\n\n\ndef helper(x):\n    "Its docstring."\n'
                   '    # a comment\n    return x + B\n\n\n@staticmethod\ndef root():\n\n    return helper(1)\n\n\n'
                   'def unused():\n    return os.sep\n')
    assert lines.code_lines(["", "   # c", "x = 1", '"""doc"""']) == 2
    defs = lines.top_level(src)
    assert lines.closure(defs, ("root",)) == ["root", "helper", "B", "A"]
    assert lines.closure(defs, ("root", "gone"), done={"helper"}) == ["root"]
    assert lines.closure(defs, ("root",), follow=False) == ["root"]
    assert lines.definitions_lines(src, ["root", "helper", "B", "A"]) == 8     # 1 + 1 + 3 + 3 (the decorator)
    assert lines.file_lines(src) == 12
    (tmp_path / "engine.py").write_text("from .model import helper, root\n\n\ndef f():\n    return helper(root())\n")
    counted = {"engine.py": {"f"}, "model.py": {"root"}}
    assert lines.referenced_not_counted(tmp_path, counted) == ["engine.py uses model.py:helper"]


def test_engine_lines_finds_the_engine_modules(tmp_path: Path) -> None:
    """engine_lines.py: the engine's modules are engine.py alone before the split; after, the modules it imports
    (in any import form, transitively) that come from the engine's chapter or bear an engine-path name."""
    lines = script("engine_lines")
    pkg = tmp_path / "speclab"
    pkg.mkdir()
    head = "# AUTOGENERATED! DO NOT EDIT! File to edit: ../nbs/{}.ipynb.\n"
    (pkg / "kv.py").write_text(head.format("06_kv") + "X = 1\n")
    (pkg / "engine.py").write_text(head.format("08_engine") + "from .kv import X\n")
    assert lines.engine_modules(pkg) == ["engine.py"]
    (pkg / "engine.py").write_text(head.format("08_engine") + "from .kv import X\nfrom .scheduler import S\n"
                                   "from speclab import runner\n")
    (pkg / "scheduler.py").write_text(head.format("08b_scheduler") + "from .request import R\nS = 1\n")
    (pkg / "request.py").write_text(head.format("08a_request") + "import speclab.kv\nR = 1\n")
    (pkg / "runner.py").write_text(head.format("08c_runner") + "def run():\n    from .stepplan import P\n")
    (pkg / "stepplan.py").write_text(head.format("08d_plan") + "P = 1\n")
    (pkg / "policy.py").write_text(head.format("08e_policy") + "K = 1\n")       # imported by no one: still counted
    (pkg / "config.py").write_text(head.format("03_other") + "C = 1\n")         # another chapter's: not counted
    assert lines.engine_modules(pkg) == ["request.py", "scheduler.py", "runner.py", "policy.py", "engine.py",
                                         "stepplan.py"]
    assert lines.imported_modules(pkg / "engine.py", pkg) == ["kv.py", "scheduler.py", "runner.py"]
    assert lines.chapter(pkg / "runner.py") == "08" and lines.chapter(pkg / "kv.py") == "06"
    assert [m["lines"] for m in lines.module_lines(pkg, ["engine.py", "runner.py"])] == [3, 2]
    (pkg / "tree_verify.py").write_text(head.format("14b_tree_verify") + "def walk_trees():\n    return 1\n")
    assert lines.moved_parts(pkg, lines.engine_modules(pkg)) == [("tree_verify.py", lines.ENGINE_MOVED, True)]
    assert lines.moved_parts(pkg, ["tree_verify.py"]) == []                # an engine module: counted whole


def test_engine_walk_counts_crossings_per_step(tmp_path: Path, monkeypatch) -> None:
    """engine_walk.py: a call into another module of the package is a crossing, through a module outside it too
    (a -> outside -> b is a -> b); a call inside a module is not; each call of the step function starts a step."""
    walk = script("engine_walk")
    pkg = tmp_path / "walkpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (tmp_path / "walk_outside.py").write_text("def apply(fn, x):\n    return fn(x)\n")
    (pkg / "b.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass P:\n    x: int\n\n\n"
                              "def g(x):\n    return x + 1\n\n\ndef step():\n    return g(1)\n")
    (pkg / "a.py").write_text("import walk_outside\nfrom . import b\n\n\ndef local(x):\n    return x\n\n\n"
                              "def run():\n    b.P(local(0))\n    walk_outside.apply(b.g, b.g(1))\n"
                              "    b.step()\n    b.step()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from walkpkg import a, b
    counter = walk.CrossingCounter("walkpkg", step_code=b.step.__code__)
    with counter:
        a.run()
    res = walk.summarize(counter)
    assert res["request"]["edges"] == {"a -> b.g": 2, "a -> b.P.__init__": 1, "a -> b.step": 2}
    assert (res["request"]["crossings"], res["request"]["distinct"]) == (5, 3)
    assert res["request"]["modules"] == ["walkpkg.a", "walkpkg.b"]
    assert res["steps"] == 2 and [s["crossings"] for s in res["per_step"]] == [1, 1]
    steady = res["steady_step"]                                   # the steps after the first: step 2
    assert steady["steps"] == 1 and steady["crossings_mean"] == 1 and steady["distinct_every_step"] == 1
    assert steady["edges_per_step"] == {"a -> b.step": 1.0}
    assert walk.in_package("speclab.kv") and walk.in_package("walkpkg", "walkpkg")
    assert not walk.in_package("walkpkgs.a", "walkpkg")


def test_engine_host_times_outermost_calls_and_compares_medians(tmp_path: Path) -> None:
    """engine_host.py: a timed function calling another timed one counts once; a side is a folder holding speclab/;
    the summary holds each side's medians over rounds and after / before of the medians."""
    host = script("engine_host")
    timer = host.Timer()
    inner = timer.wrap(lambda: sum(range(1000)))
    outer = timer.wrap(lambda: inner() + inner())
    outer()
    assert timer.depth == 0 and 0 < timer.seconds < 1
    (tmp_path / "speclab").mkdir()
    (tmp_path / "speclab" / "__init__.py").write_text("")
    assert host.tree_of(str(tmp_path)) == tmp_path.resolve()
    one = {"total": 10.0, "forwards": 8.0, "verify": 0.5, "rest": 1.5, "steps": 9}
    runs = {"before": [{"chain/b1": one}, {"chain/b1": {**one, "total": 12.0, "rest": 3.5}},
                       {"chain/b1": {**one, "total": 11.0, "rest": 2.5}}],
            "after": [{"chain/b1": {**one, "rest": 1.25}}] * 3}
    row = host.summarize(runs, ["chain/b1"])["chain/b1"]
    assert (row["before_total"], row["before_rest"], row["after_rest"]) == (11.0, 2.5, 1.25)
    assert row["rest_after_over_before"] == 0.5 and row["forwards_after_over_before"] == 1.0
    assert row["before_rest_rounds"] == [1.5, 3.5, 2.5] and row["before_rest_spread"] == 0.8
    assert row["after_rest_spread"] == 0.0
    assert host.spread([0.0, 0.0]) == 0.0


def test_open_loop_dataset_is_vllms_custom_format(tmp_path: Path) -> None:
    """open_loop.py's traffic: held-out code cut into prompts of 16..192 tokens with completions of 8..160, as the
    JSONL vLLM's `--dataset-name custom` reads (a prompt string and an int output_tokens per line), seeded."""
    ol = script("open_loop")
    stats = ol.write_dataset(tmp_path / "a.jsonl", n=50, seed=3)
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(rows) == 50 == stats["requests"]
    assert all(isinstance(r["prompt"], str) and r["prompt"] and isinstance(r["output_tokens"], int) for r in rows)
    assert all(8 <= r["output_tokens"] <= 160 for r in rows) and len({r["output_tokens"] for r in rows}) > 5
    ol.write_dataset(tmp_path / "b.jsonl", n=50, seed=3)
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_open_loop_goals_are_checked_rate_by_rate() -> None:
    """The goals: auto's goodput >= 0.97 x max(plain, fixed) and >= 0.97 x vLLM's best at each rate; auto's p99 TPOT
    <= plain's where plain keeps up (its median TTFT within twice the lightest rate's), not judged where it does not."""
    ol = script("open_loop")
    def res(goodput, tpot, ttft):
        return {"rates": {f"{r:.4f}": {"request_goodput": g, "p99_tpot_ms": t, "median_ttft_ms": x}
                          for r, g, t, x in zip((1.0, 4.0), goodput, tpot, ttft)}}
    results = {"speclab-plain": res((1.0, 2.0), (10.0, 30.0), (40.0, 900.0)),
               "speclab-fixed": res((1.0, 1.5), (8.0, 40.0), (40.0, 900.0)),
               "speclab-auto": res((0.98, 1.9), (9.0, 45.0), (40.0, 900.0)),
               "vllm-ngram": res((1.2, 1.0), (7.0, 50.0), (40.0, 900.0))}
    rows = ol.goals(results, [1.0, 4.0])
    assert [r["goodput_ok"] for r in rows] == [True, False]           # 0.98 >= 0.97; 1.9 < 0.97 x 2.0
    assert [r["vs_vllm_ok"] for r in rows] == [False, True]           # 0.98 < 0.97 x 1.2; 1.9 >= 0.97 x 1.0
    assert [r["plain_keeps_up"] for r in rows] == [True, False]       # TTFT 40 -> 900 ms: a queue built up
    assert [r["tpot_ok"] for r in rows] == [True, None]
    assert ol.goals({}, [1.0])[0]["goodput_ok"] is None               # a missing server is not a pass


def test_open_loop_quick_keeps_the_servers_asked_for() -> None:
    "--quick shortens the traffic; it does not replace the servers named with --servers, and a wrong name is refused."
    ol = script("open_loop")
    assert ol.parse_args(["--quick", "--servers", "speclab-plain", "speclab-fixed"]).servers == ["speclab-plain",
                                                                                                  "speclab-fixed"]
    assert ol.parse_args(["--quick"]).servers == ["speclab-plain", "speclab-auto"]
    assert ol.parse_args([]).servers == list(ol.SERVERS)
    with pytest.raises(SystemExit):
        ol.parse_args(["--servers", "speclab-plainn"])
    assert ol.parse_args(["--quick"]).rounds == 1 and ol.parse_args([]).rounds == 3
    for wrong in (["--rounds", "0"], ["--servers", "speclab-plain", "speclab-plain"]):
        with pytest.raises(SystemExit):
            ol.parse_args(wrong)


def test_open_loop_summarizes_rounds_by_their_medians() -> None:
    """A server's figure at a rate is the median over its rounds, goodput's min and max are kept with every round;
    no round is refused by name; the round-by-round goals count met over judged."""
    ol = script("open_loop")
    runs = [dict.fromkeys(ol.FIGURES, 1.0) | {"request_goodput": g, "p99_tpot_ms": t} for g, t in
            ((2.0, 30.0), (1.0, 10.0), (4.0, 20.0))]
    med = ol.summarize(runs)
    assert (med["request_goodput"], med["p99_tpot_ms"]) == (2.0, 20.0)
    assert (med["goodput_min"], med["goodput_max"]) == (1.0, 4.0)
    assert med["rounds"] == runs and med["duration"] == 1.0
    assert ol.summarize([{"request_goodput": None}])["request_goodput"] is None    # never a made-up figure
    assert ol.summarize([{"request_goodput": 1.0}])["pooled_p99_tpot_ms"] is None
    pooled = ol.summarize([{"tpots": [0.001 * t for t in range(1, 51)]}, {"tpots": [0.001 * t for t in range(51, 101)]
                                                                          + [None]}])
    assert pooled["pooled_p99_tpot_ms"] == pytest.approx(99.01)       # numpy's linear p99 of 1..100 ms
    with pytest.raises(ValueError, match="rounds"):
        ol.summarize([])
    def res(goodputs):
        return {"rates": {"1.0000": ol.summarize([{"request_goodput": g, "p99_tpot_ms": 10.0, "median_ttft_ms": 40.0}
                                                  for g in goodputs])}}
    results = {"speclab-plain": res((1.0, 1.0, 1.0)), "speclab-fixed": res((2.0, 2.0, 2.0)),
               "speclab-auto": res((2.0, 1.0, 1.95))}
    count = ol.rounds_met(results, [1.0])[0]
    assert count["goodput_ok"] == [2, 3]              # 2.0 and 1.95 >= 0.97 x 2.0; 1.0 is not
    assert count["vs_vllm_ok"] == [0, 0]              # no vLLM server: judged in no round
    assert ol.goals(results, [1.0])[0]["goodput_ok"] is True      # the medians: 1.95 >= 0.97 x 2.0
    results["speclab-auto"]["rates"]["1.0000"]["pooled_p99_tpot_ms"] = 12.0     # the pooled p99 judges, not 10.0
    assert ol.goals(results, [1.0])[0]["auto_p99_tpot"] == 12.0 and ol.goals(results, [1.0])[0]["tpot_ok"] is False


def test_open_loop_reads_what_each_run_added_to_the_spec_counters(monkeypatch) -> None:
    """Each run keeps its acceptance and speclab's request-steps by kappa: /metrics read before and after (Prometheus'
    text, parsed by prometheus_client), the cumulative kappa buckets turned into counts; a plain server gives zeros."""
    ol = script("open_loop")
    def page(draft, accepted, cumulative):
        lines = [f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft}',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}']
        lines += [f'speclab:spec_decode_kappa_bucket{{engine="0",le="{k}",model_name="m"}} {n}'
                  for k, n in enumerate(cumulative)]
        lines += [f'speclab:spec_decode_kappa_bucket{{engine="0",le="+Inf",model_name="m"}} {cumulative[-1]}']
        return "\n".join(["# TYPE vllm:spec_decode_num_draft_tokens counter",
                          "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                          "# TYPE speclab:spec_decode_kappa histogram"] + lines) + "\n"
    pages = iter([page(100, 60, [5, 10, 40]), page(300, 160, [7, 20, 80]), "# nothing\n"])
    class Reply:
        def __init__(self, text):
            self.text = text
        def read(self):
            return self.text.encode()
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(ol.urllib.request, "urlopen", lambda url, timeout: Reply(next(pages)))
    before, after = ol.spec_counters("http://x"), ol.spec_counters("http://x")
    assert before == {"draft": 100.0, "accepted": 60.0, "kappa_cumulative": {0: 5.0, 1: 10.0, 2: 40.0}}
    delta = ol.spec_delta(before, after)
    assert delta == {"draft_tokens": 200, "acceptance": 0.5, "kappa_steps": [2, 8, 30]}
    plain = ol.spec_counters("http://x")
    assert ol.spec_delta(plain, plain) == {"draft_tokens": 0, "acceptance": None, "kappa_steps": []}


def test_open_loop_interleaves_every_server_at_each_rate(tmp_path: Path, monkeypatch) -> None:
    """open_loop.py with its servers and load tool faked: all servers up at once, each round runs every rate in turn
    and every server at a rate (in a seeded shuffled order) before the next rate, round r with seed r; the record
    holds every round; the bursty trace runs once per server; the outputs are written."""
    ol = script("open_loop")
    calls, up = [], []
    @__import__("contextlib").contextmanager
    def server(name, kappa, log_dir, python):
        up.append(name)
        yield f"http://{name}"
    class Proc:
        def __init__(self, label):
            self.label = label
    def bench(python, url, model, dataset, num, rate, seed, slo_ms, out_dir, label, delay=0.0):
        calls.append((url.removeprefix("http://"), rate, seed, label))
        return Proc(label)
    def finish(proc, out_dir, label):
        goodput = 2.0 if "auto" in label else 1.0
        return dict.fromkeys(ol.FIGURES, 10.0) | {"request_goodput": goodput, "request_throughput": 4.0}
    monkeypatch.setattr(ol.vllm_env, "vllm_python", lambda: Path("python"))
    monkeypatch.setattr(ol.vllm_env, "vllm_version", lambda python: "0.0")
    monkeypatch.setattr(ol, "check_tool", lambda python: None)
    monkeypatch.setattr(ol, "write_dataset", lambda path: {"requests": 0})
    monkeypatch.setattr(ol, "server", server)
    monkeypatch.setattr(ol, "model_id", lambda url: "m")
    monkeypatch.setattr(ol, "bench", bench)
    monkeypatch.setattr(ol, "finish", finish)
    monkeypatch.setattr(ol, "spec_counters", lambda url: {"draft": 0.0, "accepted": 0.0, "kappa_cumulative": {}})
    record = ol.main(["--rounds", "2", "--fractions", "0.5", "1.0", "--out", str(tmp_path / "ol")])
    assert up == list(ol.SERVERS)                                   # all up before any traffic
    rate_calls = [c for c in calls if "-round" in c[3]]
    assert len(rate_calls) == 2 * 2 * len(ol.SERVERS)
    for k, (rnd, rate) in enumerate([(0, 2.0), (0, 4.0), (1, 2.0), (1, 4.0)]):
        block = rate_calls[k * 5:(k + 1) * 5]                        # one rate of one round: every server once
        assert sorted(c[0] for c in block) == sorted(ol.SERVERS)
        assert [c[0] for c in block] == ol.shuffled(list(ol.SERVERS), rnd, k % 2)
        assert {(c[1], c[2]) for c in block} == {(rate, rnd)}
    assert record["capacity"] == 4.0 and record["rates"] == [2.0, 4.0] and record["rounds"] == 2
    assert all(len(v["rounds"]) == 2 for res in record["results"].values() for v in res["rates"].values())
    assert sorted(c[0] for c in calls if c[3].endswith("-burst")) == sorted(ol.SERVERS)
    assert record["rounds_met"][0]["goodput_ok"] == [2, 2]
    assert (tmp_path / "ol.md").exists() and (tmp_path / "ol.png").exists()
    assert json.loads((tmp_path / "ol.json").read_text())["results"]["speclab-auto"]["burst"] is not None


def test_adaptive_kappa_pairs_each_round_with_the_best_configuration() -> None:
    """adaptive_kappa.py: the best configuration is the one with the highest median among plain and the drafter's
    fixed kappas (never auto, never another drafter's); the paired ratios divide round by round."""
    ak = script("adaptive_kappa")
    med = {"plain": 100.0, "model/kappa1": 120.0, "model/kappa2": 110.0, "model/kappa3": 90.0, "model/auto": 150.0,
           "ngram/kappa1": 200.0}
    assert ak.best_name(med, "model") == "model/kappa1"
    runs = {"model/auto": [(110.0, 0.5, []), (130.0, 0.5, []), (99.0, 0.5, [])],
            "model/kappa1": [(100.0, 0.5, []), (130.0, 0.5, []), (110.0, 0.5, [])]}
    r = ak.paired_ratios(runs, "model/auto", "model/kappa1")
    assert r["rounds"] == [1.1, 1.0, 0.9]
    assert (r["median"], r["min"], r["max"]) == (1.0, 0.9, 1.1)


def test_adaptive_kappa_steady_window_ends_when_fewer_than_c_requests_remain(monkeypatch) -> None:
    """adaptive_kappa.py: the steady window counts the tokens and seconds of the steps an engine began with at least C
    unfinished requests, and the whole run counts every step. A fake engine (two in flight, request i needing i + 1
    steps, one token a step) on a clock that moves 0.5 s per reading: 8 tokens in 4 full steps, 10 in all 6; the phases
    split the same steps by whether they computed a prompt, began full, or drained."""
    from types import SimpleNamespace
    ak = script("adaptive_kappa")

    @dataclasses.dataclass
    class Metrics:
        num_draft_tokens: int = 0
        num_accepted_tokens: int = 0
        kappa_counts: list = dataclasses.field(default_factory=list)

    class Fake:
        def __init__(self):
            self.requests, self.left, self.metrics = {}, {}, Metrics()

        def add_request(self, prompt, params):
            i = len(self.left)
            self.requests[i], self.left[i] = prompt, i + 1

        def has_unfinished(self):
            return bool(self.requests)

        def step(self):
            outs = []
            running = sorted(self.requests)[:2]
            fresh = [i for i in running if self.left[i] == i + 1]      # a request's first step computes its prompt
            self.last_step = SimpleNamespace(num_positions=len(running) + 3 * len(fresh), num_requests=len(running),
                                             kappa=0)
            for i in running:
                self.left[i] -= 1
                outs.append(SimpleNamespace(new_token_ids=[7]))
                if not self.left[i]:
                    del self.requests[i]
            return outs

    clock = iter(0.5 * i for i in range(1000))
    monkeypatch.setattr(ak, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    r = ak.run_together({"fake": Fake()}, ["fake"], [[1], [2], [3], [4]], [None] * 4, 2)["fake"]
    assert r[0] == pytest.approx(10 / 3.0)
    assert r[3] == pytest.approx(8 / 2.0)
    # steps 1, 2, 3 admit (requests 0 and 1, then 2, then 3), step 4 decodes a full batch, steps 5 and 6 drain
    assert r[4] == {"admit": [3, 1.5, 6], "decode": [1, 0.5, 2], "drain": [2, 1.0, 2]}
    assert ak.sum_phases([r[4], {"drain": [1, 0.5, 1]}])["drain"] == [3, 1.5, 3]


def test_adaptive_kappa_spread_draws_the_same_lengths_for_every_engine() -> None:
    """adaptive_kappa.py --spread: without it every request asks for --tokens; with it the lengths spread uniformly
    over tokens x [1 - spread, 1 + spread] (ends included), the same draws for the same seed, greedy and ignoring EOS."""
    ak = script("adaptive_kappa")
    assert {p.max_tokens for p in ak.lengths_params(48, 0.0, 64, 7)} == {48}
    spread = ak.lengths_params(48, 0.5, 400, 7)
    lengths = [p.max_tokens for p in spread]
    assert min(lengths) == 24 and max(lengths) == 72 and len(set(lengths)) > 30
    assert lengths == [p.max_tokens for p in ak.lengths_params(48, 0.5, 400, 7)]
    assert lengths != [p.max_tokens for p in ak.lengths_params(48, 0.5, 400, 8)]
    assert all(p.temperature == 0 and p.ignore_eos for p in spread)
    for bad in (["--spread", "1.0"], ["--spread", "-0.1"], ["--tokens", "4", "--spread", "0.9"]):
        with pytest.raises(SystemExit):
            ak.parse_args(bad)


def test_split_steps_draws_once_a_step_or_once_a_request() -> None:
    """split_steps.py: the per-step mix gives every request of a step the same kappa, the per-request mix splits
    almost every step of 16; both draw 0, 1 and 2 and keep each request's cap."""
    from types import SimpleNamespace
    ss = script("split_steps")
    view = SimpleNamespace(caps=(4,) * 16)
    per_step = [ss.MixPolicy(per_request=False).choose(view)] + [ss.MixPolicy(False, seed=s).choose(view)
                                                                  for s in range(1, 200)]
    assert all(len(set(plan)) == 1 for plan in per_step)
    assert {plan[0] for plan in per_step} == {0, 1, 2}
    mixer = ss.MixPolicy(per_request=True)
    per_request = [mixer.choose(view) for _ in range(200)]
    assert sum(len(set(plan)) > 1 for plan in per_request) >= 195
    assert {k for plan in per_request for k in plan} == {0, 1, 2}
    capped = ss.MixPolicy(per_request=True)
    assert all(k <= c for _ in range(100) for k, c in zip(capped.choose(SimpleNamespace(caps=(1, 0, 2))), (1, 0, 2)))


def test_step_miss_times_only_steady_steps_of_the_whole_batch() -> None:
    """step_miss.py: the timed steps are decode steps of the whole batch with every request drafting kappa (no prompt
    in them, no request capped near its end); a cell's prediction is the costs' time for those very steps, its E is
    1 + kappa alpha, and the engine gets its own step back."""
    from speclab.drafters import ModelDrafter
    from speclab.engine import SpecDecoder
    from speclab.policy import StepCosts
    from speclab.request import SamplingParams
    from speclab.testing import tiny_random_pair
    sm = script("step_miss")
    target, draft = tiny_random_pair()
    eng = SpecDecoder(target, ModelDrafter(draft), kappa=2, max_num_seqs=3, seed=0)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 1], [2, 3, 4, 5]] * 2
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    steps = sm.steady_steps(eng, prompts, params, 3, 2)
    assert steps and all((s.num_positions, s.num_drafting, s.kappa) == (9, 3, 2) for s in steps)
    assert "step" not in vars(eng)
    c = sm.cell(eng, StepCosts(verify_s=1e-3, verify_token_s=1e-4), prompts, params, 3, 2)
    assert c["steps"] == len(steps) and c["predicted_s"] == pytest.approx(1e-3 + 9e-4)
    assert 0 <= c["alpha"] <= 1 and c["E"] == pytest.approx(1 + 2 * c["alpha"])
    assert c["measured_over_predicted"] == pytest.approx(c["measured_s"] / c["predicted_s"])


def test_forward_ops_copy_of_the_forward_matches_the_library() -> None:
    """forward_ops.py: the instrumented copy of `paged_logits` decodes exactly what the library decodes (a change to
    the library's forward that the copy misses fails here), clocks every part it names, and counts decode steps only
    (the prefill's rows exceed the concurrency)."""
    fo = script("forward_ops")
    from speclab.engine import SpecDecoder
    from speclab.model import load_model
    from speclab.sweep import sweep_prompts
    from speclab.train import tiny_pair_path
    eng = SpecDecoder(load_model(tiny_pair_path("target")), None, kappa=0, max_num_seqs=2, enable_prefix_caching=False)
    prompts = [list(map(int, p)) for p in sweep_prompts(2, 16)]
    plain = fo.run_speclab(eng, prompts, 6, 2, parts=False)
    timed = fo.run_speclab(eng, prompts, 6, 2, parts=True)
    assert timed["digest"] == plain["digest"]
    assert plain["decode_steps"] == 0 and timed["decode_steps"] == 5, timed["decode_steps"]   # 6 tokens: 1 prefill
    clocked = {n for names, _ in fo.PARTS.values() for n in names}
    assert clocked == set(timed["parts"]), (clocked, set(timed["parts"]))
    row = fo.split_rows(fo.per_step_ms(timed, 0))
    assert row["forward"] > sum(v for k, v in row.items() if k not in ("forward", "rest", "decode_steps")) > 0
    leaves = fo.LeafParts(concurrency=2)
    leaves.add("x", 1.0)
    leaves.see_rows(32)                                                   # a prefill: dropped
    assert not leaves.end_step() and leaves.parts == {}
    leaves.add("x", 0.5)
    leaves.see_rows(2)
    assert leaves.end_step() and leaves.parts == {"x": 0.5} and leaves.decode_steps == 1


def test_ngram_lookup_rules_differ_only_where_a_run_reaches_the_end() -> None:
    lookup = script("ngram_lookup")
    run = [4, 8] * 10                                          # a period-2 run up to the end of every context
    copied = lookup.tokens_per_step(lookup.RULES["copy"], run, 4, 3)
    cut = lookup.tokens_per_step(lookup.RULES["stop"], run, 4, 3)
    assert copied == (16, 4) and cut[1] == 6, (copied, cut)    # 3 drafts accepted a step; cut: 1 or 2 drafted
    assert lookup.earliest([1, 2, 9, 1, 2, 7, 1, 2], 2) == [9, 1] and lookup.stop([1, 2, 9, 1, 2, 7, 1, 2], 2) == [7, 1]
    prose = [5, 1, 3, 6, 2, 0, 4]                              # nothing repeats: no rule drafts, one token a step
    assert all(lookup.measure([(2, prose)], 3)[r] == 1.0 for r in lookup.RULES)


def test_switch_cost_places_each_step_in_its_run_and_keeps_full_decode_steps() -> None:
    """switch_cost.py: the pattern policy takes its depths in turn (each request's cap kept); a step's place counts the
    steps of its kind before it since the last switch; the table keeps decode steps of the whole batch only (a step
    with a prompt, or fewer requests, is left out) and gives each (kappa, place) its median miss."""
    from types import SimpleNamespace
    sc = script("switch_cost")
    policy = sc.PatternPolicy([0, 2, 2])
    view = SimpleNamespace(caps=(4, 1, 0))
    assert [policy.choose(view) for _ in range(4)] == [[0, 0, 0], [2, 1, 0], [2, 1, 0], [0, 0, 0]]

    def step(kappa, seconds, positions=None, requests=2):
        return SimpleNamespace(kappa=kappa, seconds=seconds, num_requests=requests, num_drafting=requests * (kappa > 0),
                               num_positions=requests * (1 + kappa) if positions is None else positions, num_kv=0)
    steps = [step(0, 1.0), step(0, 2.0), step(2, 3.0), step(2, 1.0), step(2, 1.0, positions=40), step(0, 5.0),
             step(1, 2.0, requests=1)]
    assert sc.places(steps) == [0, 1, 0, 1, 2, 0, 0]
    costs = SimpleNamespace(step_s=lambda positions, drafting, kappa, _, kv: 1.0 + kappa / 2)
    rows = sc.table(steps, costs, 2)
    assert rows == {(0, 0): [2, 3.0], (0, 1): [1, 2.0], (2, 0): [1, 1.5], (2, 1): [1, 0.5]}
    with pytest.raises(SystemExit):
        sc.parse_args(["--pattern", "2222"])


def test_width_runs_compares_every_run_cost_with_one_group(tmp_path: Path, capsys) -> None:
    """width_runs.py: a tiny run writes one row per batch size and span, each run cost's median beside one group's
    (the ratio of one group to itself 1), every engine stepped the same number of times, GROUP_KEYS restored after;
    bad arguments are refused by name."""
    import math

    import speclab.model
    runs = script("width_runs")
    before = speclab.model.GROUP_KEYS
    out = tmp_path / "w.json"
    record = runs.main(["--batch", "1", "3", "--spans", "4:40", "--group-keys", "0", "64", "--steps", "3",
                        "--repeats", "2", "--out", str(out)])
    assert speclab.model.GROUP_KEYS == before
    assert json.loads(out.read_text()) == record
    assert [(r["batch"], r["span"], r["steps"]) for r in record["rows"]] == [(1, [4, 40], 6), (3, [4, 40], 6)]
    for row in record["rows"]:
        assert set(row["median_ms"]) == {str(math.inf), "0.0", "64.0"}
        assert row["ratio"][str(math.inf)] == 1.0 and all(v > 0 for v in row["median_ms"].values())
    for bad, name in ((["--steps", "0"], "--steps"), (["--spans", "9:3"], "--spans"), (["--spans", "x"], "--spans"),
                      (["--group-keys", "-1"], "--group-keys"), (["--batch", "0"], "--batch")):
        with pytest.raises(SystemExit):
            runs.parse_args(bad)
        assert name in capsys.readouterr().err
