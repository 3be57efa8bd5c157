"""The `speclab` command as a new user meets it: every mistake answered with one line on stderr, no traceback,
nothing fetched from the network; the shipped pair by name; the help text says the defaults.

Each case runs the installed console script in a subprocess, or, where several commands each load torch and the
tokenizer, the console script's `main` for each of them in one child process (`speclab_runs`). Where this machine
allows it (root and util-linux's `unshare`), the process runs in a fresh network namespace with no interfaces, so any
attempt to reach the Hugging Face Hub fails at once and shows up as a wrong message; elsewhere the Hub's offline
variables are cleared (speclab sets its own) and the output is checked for the retry lines a network attempt prints.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("cli")   # one worker: its module fixtures are built once

ROOT = Path(__file__).resolve().parent.parent
SPECLAB = Path(sys.executable).parent / "speclab"
NO_NET = ["unshare", "--net", "--"] if shutil.which("unshare") and subprocess.run(
    ["unshare", "--net", "--", "true"], capture_output=True).returncode == 0 else []
NETWORK_WORDS = ("Retrying", "huggingface.co", "HTTPSConnection", "Max retries", "couldn't connect")


def speclab(*argv, env=None, timeout=300):
    "Run the console script (network closed where possible): (status, stdout, stderr)."
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    r = subprocess.run([*NO_NET, str(SPECLAB), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**base, **(env or {})})
    return r.returncode, r.stdout, r.stderr


# One child process for several commands: each runs as the console script runs it (`sys.exit(main(argv))`, an uncaught
# exception printed as a traceback), its stdout and stderr caught at the file descriptors, so whatever writes to them
# (print, warnings, a logging handler made in an earlier run) lands in the run that wrote it.
RUNS = r"""
import json, os, sys, tempfile, traceback
from speclab.cli import main
fds, results = (os.dup(1), os.dup(2)), []
for argv in json.loads(sys.argv[1]):
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        out.seek(0)
        err.seek(0)
        results.append((status, out.read(), err.read()))
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def speclab_runs(*argvs, env=None, timeout=600):
    """Run several commands in one child process (network closed where possible): [(status, stdout, stderr)]. The
    child pays torch's and transformers' imports once, not once per command (a demo costs about 3 CPU s after the
    first one in a process, 11 as the first)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))} | (env or {})
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "runs.json"
        r = subprocess.run([*NO_NET, sys.executable, "-c", RUNS, json.dumps(argvs), str(results)], capture_output=True,
                           text=True, timeout=timeout, cwd=ROOT, env=base)
        assert r.returncode == 0 and results.exists(), (r.stdout[-2000:], r.stderr[-4000:])
        return [tuple(run) for run in json.loads(results.read_text())]


def assert_one_line(status, out, err, *words, code=2):
    "Exit `code`, exactly one line on stderr holding every word, no traceback, no trace of a network attempt."
    assert status == code, (status, out[-2000:], err[-4000:])
    assert len(err.strip().splitlines()) == 1, err[-4000:]
    assert "Traceback" not in out + err
    assert not [w for w in NETWORK_WORDS if w in out + err], err
    for w in words:
        assert w in err, err


@pytest.fixture(scope="module")
def broken_checkpoints(tmp_path_factory):
    "Three folders that are not checkpoints: empty, a damaged tokenizer, a tokenizer without config.json."
    from speclab.train import tiny_pair_path

    empty, damaged, no_config = (tmp_path_factory.mktemp(name) for name in ("empty", "damaged", "no_config"))
    (damaged / "tokenizer.json").write_text("{}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_pair_path("target") / name, no_config / name)
    return empty, damaged, no_config


GEN = ["generate", "--target", "tiny", "--prompt", "x"]
MISTAKES = [
    (["generate", "--target", "/no/such/dir", "--ngram", "2", "--prompt", "x"],
     ["speclab generate: error: checkpoint folder not found: /no/such/dir", "local folders only"]),
    (["generate", "--target", "typo/dir", "--ngram", "2", "--prompt", "x"], ["checkpoint folder not found: typo/dir"]),
    (["generate", "--target", "meta-llama/Meta-Llama-3-8B", "--draft", "tiny", "--prompt", "x"],
     ["checkpoint folder not found: meta-llama/Meta-Llama-3-8B"]),
    (["generate", "--target", "tiny", "--draft", "/no/draft", "--prompt", "x"],
     ["checkpoint folder not found: /no/draft"]),
    (["generate", "--target", "tiny", "--ngram", "2", "--prompts", "/no/such/file"], ["--prompts file not found"]),
    (["generate", "--target", "tiny", "--ngram", "2", "--prompt", "x", "--kappa", "-1"],
     ["argument --kappa: expected auto or an integer >= 0, got -1"]),
    # --kappa auto|N and the draft's stopping rule, every bad value named by its flag
    ([*GEN, "--draft", "tiny", "--kappa", "abc"], ["speclab generate: error: argument --kappa: expected auto or an "
                                                    "integer >= 0, got 'abc'"]),
    ([*GEN, "--draft", "tiny", "--min-confidence", "1.5"], ["--min-confidence must lie in [0, 1), got 1.5"]),
    ([*GEN, "--draft", "tiny", "--min-confidence", "nan"], ["--min-confidence must lie in [0, 1), got nan"]),
    ([*GEN, "--ngram", "2", "--min-confidence", "0.5"], ["--min-confidence: n-gram lookup gives no draft"]),
    ([*GEN, "--kappa", "2", "--speculative-config", '{"kappa": "auto"}'],
     ["--kappa 2 and 'kappa' 'auto' in --speculative-config disagree"]),
    ([*GEN, "--speculative-config", '{"min_confidence": 1.5}'], ["min_confidence must be a number in [0, 1)"]),
    (["demo", "--kappa", "0"], ["speclab demo: error: --kappa must be >= 1, got 0"]),
    (["serve", "--kappa", "2", "--num-spec-tokens", "3"], ["speclab serve: error: --kappa 2 and --num-spec-tokens 3"]),
    (["serve", "--kappa", "1.5"], ["speclab serve: error: argument --kappa: expected auto or an integer >= 0"]),
    (["generate", "--target", "tiny", "--ngram", "2", "--prompt", "x", "--top-p", "2"], ["--top-p must lie in (0, 1]"]),
    (["generate", "--target", "tiny", "--ngram", "2", "--prompt", "x", "--dtype", "int3"], ["argument --dtype"]),
    (["demo", "--temperature", "-1"], ["speclab demo: error: --temperature must be a finite number >= 0"]),
    (["demo", "--max-tokens", "1000", "--kappa", "3"], ["speclab demo: error:", "exceeds the context of 512"]),
    (["demo", "--max-tokens", "0"], ["speclab demo: error: --max-tokens must be >= 1"]),
    (["demo", "--top-k", "-1"], ["speclab demo: error: --top-k must be an int >= 0"]),
    (["roofline", "--kappa", "0"], ["speclab roofline: error: --kappa must be >= 1, got 0"]),
    (["roofline", "--kappa", "-2"], ["speclab roofline: error: --kappa must be >= 1, got -2"]),
    (["roofline", "--alpha", "2"], ["speclab roofline: error:", "alpha"]),
    (["roofline", "--bogus"], ["speclab roofline: error: unrecognized arguments: --bogus"]),
    (["sweep", "--batch-sizes", "0"], ["speclab sweep: error: argument --batch-sizes"]),
    (["grade", "--lab", "labs/08_acceptance"], ["speclab grade: error: give a submission"]),
    (["grade", "missing.ipynb", "--lab", "labs/08_acceptance"], ["speclab grade: error: submission not found"]),
    (["grade", "x.ipynb", "--lab", "/no/lab"], ["speclab grade: error:"]),
    (["frobnicate"], ["speclab: error: argument COMMAND: invalid choice"]),
    # how to draft: vLLM's --method and --speculative-config beside speclab's --draft and --ngram (`drafting`)
    ([*GEN, "--speculative-config", '{"method": "eagle3", "draft_tensor_parallel_size": 1}'],
     ["speclab generate: error: argument --speculative-config:", "does not implement draft_tensor_parallel_size"]),
    ([*GEN, "--speculative-config", '{"method": "medusa"}'], ["method must be one of draft_model, ngram, eagle"]),
    ([*GEN, "--speculative-config", "[1]"], ["expected a JSON object"]),
    ([*GEN, "--speculative-config", "{method: eagle3}"], ["expected JSON"]),
    ([*GEN, "--speculative-config", '{"num_speculative_tokens": 0}'], ["num_speculative_tokens must be an int >= 1"]),
    ([*GEN, "--speculative-config", '{"method": "eagle3"}', "--draft", "tiny"],
     ["--speculative-config already says how to draft: drop --draft"]),
    ([*GEN, "--speculative-config", '{"method": "ngram"}'], ["method ngram needs 'prompt_lookup_max' in"]),
    ([*GEN, "--speculative-config", '{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3}'],
     ["prompt_lookup_min must be 1: speclab looks n-grams up from prompt_lookup_max down to 1, got 3"]),
    ([*GEN, "--speculative-config", '{"method": "ngram", "prompt_lookup_max": 2, "model": "tiny"}'],
     ["method ngram drafts by prompt lookup: drop 'model' in --speculative-config"]),
    ([*GEN, "--kappa", "2", "--speculative-config", '{"num_speculative_tokens": 3}'],
     ["--kappa 2 and num_speculative_tokens 3 disagree"]),
    ([*GEN, "--method", "ngram", "--draft", "tiny"], ["method ngram drafts by prompt lookup: drop --draft"]),
    ([*GEN, "--method", "eagle", "--draft", "tiny"], ["method eagle drafts with an EAGLE head, and tiny is not one"]),
    ([*GEN, "--method", "draft_model", "--draft", "eagle"], ["eagle is an EAGLE head, not a draft model"]),
    ([*GEN, "--method", "draft_model", "--ngram", "2"], ["method draft_model drafts with a model: drop --ngram"]),
    (GEN, ["speclab generate: error: give --draft, --ngram, --method or --speculative-config"]),
    (["generate", "--target", "speclab/data/tiny-pair/target", "--method", "eagle3", "--prompt", "x"],
     ["the shipped EAGLE head drafts for the shipped target only"]),
    (["demo", "--method", "ngram"], ["speclab demo: error: method ngram needs --ngram"]),
    (["serve", "--method", "eagle", "--draft", "tiny"], ["speclab serve: error: method eagle drafts with an EAGLE"]),
]


@pytest.fixture(scope="module")
def mistake_runs():
    """Every mistake above in one child process ({argv: result}). Most are refused before torch loads, but four
    (--top-p, the demo's --temperature, --top-k and a --max-tokens past the context) are refused after it: as four
    console scripts they cost 16.6 CPU s, torch imported four times."""
    return dict(zip(map(tuple, (argv for argv, _ in MISTAKES)), speclab_runs(*(argv for argv, _ in MISTAKES))))


@pytest.mark.parametrize("argv, words", MISTAKES)
def test_mistake_is_one_line(argv, words, mistake_runs):
    assert_one_line(*mistake_runs[tuple(argv)], *words)


def test_folder_that_is_not_a_checkpoint_names_the_file(broken_checkpoints):
    "An empty folder, a damaged tokenizer, a tokenizer without config.json: each named, in one line (one child)."
    empty, damaged, no_config = broken_checkpoints
    argv = lambda folder: ["generate", "--target", str(folder), "--ngram", "2", "--prompt", "x"]
    runs = speclab_runs(argv(empty), argv(damaged), argv(no_config))
    assert_one_line(*runs[0], f"no tokenizer in {empty}: expected tokenizer.json or tokenizer.model")
    assert_one_line(*runs[1], f"could not read the tokenizer in {damaged}")
    assert_one_line(*runs[2], "checkpoint file not found", "config.json")


NO_GPU = (("generate", "--target", "tiny", "--ngram", "2", "--prompt", "x", "--device", "cuda"),
          ("demo", "--device", "cuda"), ("demo", "--backend", "triton"))


@pytest.fixture(scope="module")
def no_gpu_runs():
    """The three refusals of a GPU this machine lacks, in one child (each imports torch to ask): {argv: result}.
    TRITON_INTERPRET=0 for all three; only the Triton refusal reads it."""
    return dict(zip(NO_GPU, speclab_runs(*map(list, NO_GPU), env={"TRITON_INTERPRET": "0"})))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("command", NO_GPU[:2], ids=["generate", "demo"])
def test_cuda_without_a_gpu(command, no_gpu_runs):
    assert_one_line(*no_gpu_runs[command], "--device cuda", "use --device cpu")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
def test_triton_without_a_gpu(no_gpu_runs):
    assert_one_line(*no_gpu_runs[NO_GPU[2]], "--backend triton needs a CUDA GPU", "TRITON_INTERPRET=1")


def test_a_request_the_engine_rejects_goes_to_stderr_and_json(monkeypatch, capsys):
    """What only the engine finds while it decodes (every check of the command line passed) is reported per prompt:
    one line on stderr, exit 1; with --json, an error entry beside the other prompt's output. The decoder is a stand-in
    whose first request fails (a real one's prompts are all checked before it loads: see `EARLY`)."""
    from types import SimpleNamespace
    import speclab.cli as cli
    bad = SimpleNamespace(text="", token_ids=[], finish_reason="error", error="ValueError: the pool ran dry")
    ok = SimpleNamespace(text=" a + b", token_ids=[1, 2, 3], finish_reason="length", error=None)
    metrics = SimpleNamespace(num_drafts=1, num_draft_tokens=3, num_accepted_tokens=2, mean_acceptance_length=3.0,
                              per_position=[1.0, 1.0, 0.0], kappa_counts=[0, 0, 0, 1], log_line=lambda: "SpecDecoding")
    outputs = [[bad, ok], [bad]]
    eng = SimpleNamespace(generate=lambda prompts, params: outputs.pop(0), metrics=metrics)
    monkeypatch.setattr(cli, "load_decoder", lambda *args, **kwargs: (eng, None))
    argv = ["generate", "--target", "tiny", "--draft", "tiny", "--kappa", "3", "--prompt", "x"]
    status = cli.main([*argv, "--json", "--prompt", "def add(a, b):"])
    out, err = capsys.readouterr()
    assert status == 1 and err.splitlines() == ["speclab generate: error: prompt 1: ValueError: the pool ran dry"], err
    res = json.loads(out)
    assert [o["error"] is None for o in res["outputs"]] == [False, True] and res["tokens"] == 3, res
    status = cli.main(argv)                                       # nothing decoded: no metrics line, no throughput
    out, err = capsys.readouterr()
    assert status == 1 and len(err.splitlines()) == 1 and "SpecDecoding" not in out and "tokens/s" not in out, out



def test_demo_calibrates_with_the_threads_it_decodes_with(monkeypatch):
    """`speclab demo` decodes with `--threads` (or the idle cores) torch threads: its `--kappa auto` calibration must
    measure the steps at that count too. Calibrated at torch's default beside a busy process, a 2-core machine's steps
    measured 2-3 times their cost at one thread, and the costs priced a decode the demo never ran."""
    import torch
    import speclab.cli as cli
    seen = []
    def loads(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop after the load")
    monkeypatch.setattr(cli, "load_decoder", loads)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="stop after the load"):
            cli.main(["demo", "--threads", "1", "--max-tokens", "12"])
        assert seen == [1] and torch.get_num_threads() == 2, (seen, torch.get_num_threads())
    finally:
        torch.set_num_threads(before)

# Every argument found refused only after the models loaded (or --kappa auto calibrated, or a sweep ran), now refused
# before, in one line that names the flag; and a few that always were, to keep them so. {tmp}: `early_files`.
G = ["generate", "--target", "tiny", "--draft", "tiny"]
TREE = ["--speculative-eagle-topk", "2", "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "4"]
TOO_MANY = str((os.cpu_count() or 1) + 1)
EARLY = [
    ([*G, "--prompt", ""], ["speclab generate: error: --prompt 1 is empty: a prompt must hold at least one token"]),
    ([*G, "--prompt", "def f():", "--prompt", ""], ["--prompt 2 is empty: a prompt must hold at least one token"]),
    (["generate", "--target", "tiny", "--ngram", "2", "--prompt", ""], ["--prompt 1 is empty"]),
    ([*G, "--prompt", "x = 1\\n" * 400], ["--prompt 1 (1600 tokens) + --max-tokens 64 exceeds the context of 512"]),
    ([*G, "--prompt", "x", "--max-tokens", "1000"], ["--max-tokens 1000 exceeds the context of 512 positions"]),
    ([*G, "--prompt", "x", "--max-tokens", "512"], ["--max-tokens 512 exceeds the context of 512 positions"]),
    ([*G, "--prompts", "{tmp}/long.txt"], ["--prompts", "long.txt line 3 (1600 tokens) + --max-tokens 64 exceeds"]),
    ([*G, "--prompts", "{tmp}/blank.txt"], ["blank.txt: the file holds no prompt"]),
    ([*G, "--prompts", "{tmp}/latin1.txt"], ["latin1.txt is not UTF-8 text"]),
    (["generate", "--target", "tiny", "--draft", "{tmp}/empty", "--prompt", "x"], ["checkpoint file not found",
                                                                                   "config.json"]),
    (["generate", "--target", "tiny", "--draft", "{tmp}/small-vocab", "--prompt", "x"],
     ["the draft's vocabulary (100) differs from the target's (4096)"]),
    (["generate", "--target", "tiny", "--draft", "", "--prompt", "x"], ["--draft must name a checkpoint folder"]),
    (["generate", "--target", "", "--draft", "tiny", "--prompt", "x"], ["--target must name a checkpoint folder"]),
    (["generate", "--target", "tiny", "--speculative-config", '{"model": ""}', "--prompt", "x"],
     ["--speculative-config: model must be a folder or a shipped name, got ''"]),
    (["generate", "--target", "tiny", "--speculative-config", '{"topk": 2, "num_steps": 2, "num_draft_tokens": 4}',
      "--prompt", "x"], ["topk, num_steps, num_draft_tokens in --speculative-config: generate drafts chains"]),
    (["generate", "--target", "tiny", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 200}',
      "--prompt", "x"], ["--kappa auto up to 200 speculative tokens", "context of 512 positions"]),
    ([*G, "--prompt", "x", "--top-p", "1.5"], ["--top-p must lie in (0, 1], got 1.5"]),
    ([*G, "--prompt", "x", "--top-p", "0"], ["--top-p must lie in (0, 1], got 0.0"]),
    ([*G, "--prompt", "x", "--top-k", "-2"], ["--top-k must be an int >= 0, got -2"]),
    ([*G, "--prompt", "x", "--temperature", "nan"], ["--temperature must be a finite number >= 0, got nan"]),
    ([*G, "--prompt", "x", "--seed", "-1"], ["--seed must lie in [0, 2**63), got -1"]),
    ([*G, "--prompt", "x", "--device", "gpu"], ["--device 'gpu' is not a device"]),
    (["demo", "--max-tokens", "1000"], ["speclab demo: error: --max-tokens 1000 exceeds the context of 512"]),
    (["demo", "--max-tokens", "511"], ["the demo's prompt 1 (15 tokens) + --max-tokens 511 exceeds the context"]),
    (["demo", "--threads", TOO_MANY], [f"--threads {TOO_MANY}: this machine has"]),
    (["demo", "--seed", "-1"], ["--seed must lie in [0, 2**63), got -1"]),
    (["serve", "--seed", "-1"], ["speclab serve: error: --seed must lie in [0, 2**63), got -1"]),
    (["serve", "--seed", str(2 ** 64)], ["--seed must lie in [0, 2**63)"]),
    (["serve", "--threads", TOO_MANY], [f"--threads {TOO_MANY}: this machine has"]),
    (["serve", "--host", "192.0.2.1", "--port", "0"], ["cannot listen on 192.0.2.1:0"]),   # TEST-NET: no such interface
    (["serve", "--num-spec-tokens", "200"], ["--kappa auto up to 200 speculative tokens: its calibration decodes 804"]),
    (["serve", "--target", "{tmp}/empty"], ["no tokenizer in"]),
    (["serve", "--draft", "{tmp}/empty"], ["checkpoint file not found", "config.json"]),
    (["serve", "--draft", "none", *TREE], ["a tree needs a drafter, and --draft none"]),
    (["serve", "--speculative-eagle-topk", "5000", *TREE[2:]], ["--speculative-eagle-topk 5000: more children"]),
    (["serve", "--speculative-config", '{"speculative_token_tree": [[0], [0, 0]], "method": "eagle"}'],
     ["an EAGLE head drafts EAGLE-2 trees", "not a fixed speculative_token_tree"]),
    (["sweep", "--output-len", "1000"], ["--output-len 1000 and --num-spec-tokens 3 do not fit", "context of 512"]),
    (["sweep", "--num-spec-tokens", "600"], ["--output-len 32 and --num-spec-tokens 600 do not fit"]),
    (["sweep", "--seed", "-1"], ["speclab sweep: error: --seed must lie in [0, 2**63), got -1"]),
    (["sweep", "--threads", TOO_MANY], [f"--threads {TOO_MANY}: this machine has"]),
    (["sweep", "--out", "/no/such/dir/sweep.csv"], ["--out /no/such/dir/sweep.csv: the folder /no/such/dir does not"]),
    (["audit", "--url", "http://a", "--reference-url", "http://b", "--out", "/no/such/dir/r.json"],
     ["speclab audit: error: --out /no/such/dir/r.json: the folder /no/such/dir does not exist"]),
    (["proof", "--seed", "-1"], ["speclab proof: error: --seed must lie in [0, 2**63), got -1"]),
]


@pytest.fixture(scope="module")
def early_files(tmp_path_factory):
    "A folder with no checkpoint, a draft whose vocabulary is not the target's, and three --prompts files."
    import json as _json
    from speclab.train import tiny_pair_path
    tmp = tmp_path_factory.mktemp("early")
    (tmp / "empty").mkdir()
    (tmp / "small-vocab").mkdir()
    config = _json.loads((tiny_pair_path("draft") / "config.json").read_text()) | {"vocab_size": 100}
    (tmp / "small-vocab" / "config.json").write_text(_json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_pair_path("draft") / name, tmp / "small-vocab" / name)
    (tmp / "long.txt").write_text("def f():\n\n" + "x = 1\\n" * 400 + "\n")
    (tmp / "blank.txt").write_text("\n   \n\n")
    (tmp / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    return tmp


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every way a command loads weights, calibrates --kappa auto, sweeps, serves or audits, replaced by a failure:
    a command line refused before any work never reaches one."""
    import importlib
    def never(what):
        def refuse(*args, **kwargs):
            raise AssertionError(f"{what} ran before the command line was refused")
        return refuse
    names = ("speclab.model", "speclab.eagle", "speclab.serve", "speclab.sweep", "speclab.trees", "speclab.audit",
             "speclab.proof", "speclab.cli")
    modules = [importlib.import_module(name) for name in names]   # all first: an import under the patch would keep it
    for module in modules:
        if hasattr(module, "load_model"):
            monkeypatch.setattr(module, "load_model", never("load_model"))
    for target in ("speclab.cli.load_decoder", "speclab.serve.load_engine", "speclab.serve.calibrate",
                   "speclab.serve.run_server", "speclab.sweep.sweep_tiny_pair", "speclab.eagle.sweep_eagle",
                   "speclab.audit.run_audit", "speclab.proof.proof_checks"):
        monkeypatch.setattr(target, never(target.rsplit(".", 1)[1]))


@pytest.mark.parametrize("argv, words", EARLY, ids=[" ".join(argv)[:60] for argv, _ in EARLY])
def test_refused_before_any_model_loads(argv, words, early_files, nothing_loads, capsys):
    "Exit 2, one line on stderr naming the flag, nothing on stdout, and no model loaded, calibrated, swept or served."
    from speclab.cli import main
    status = main([a.replace("{tmp}", str(early_files)) for a in argv])
    out, err = capsys.readouterr()
    assert_one_line(status, out, err, *words)
    assert out == "", out


def test_port_in_use_is_refused_before_loading(nothing_loads, capsys):
    "A port another server listens on: refused before the models load (and --kappa auto calibrates), not after."
    import socket
    from speclab.cli import main
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        status = main(["serve", "--port", str(port)])
    out, err = capsys.readouterr()
    assert_one_line(status, out, err, f"speclab serve: error: cannot listen on 127.0.0.1:{port}")


def test_shipped_pair_by_name():
    "The shipped pair by name, at the default --kappa auto: its calibration is one line on stderr, stdout as before."
    status, out, err = speclab("generate", "--target", "tiny", "--draft", "tiny", "--temperature", "0",
                               "--max-tokens", "12", "--prompt", "def add(a, b):\\n    return")
    assert status == 0 and "SpecDecoding metrics" in out and "[12 tokens, length]" in out, (out, err)
    assert err.startswith("speclab generate: calibrated in ") and "(--kappa auto)" in err, err
    assert len(err.strip().splitlines()) == 1 and "calibrated" not in out, err
    status, out, _ = speclab("generate", "--help")
    flat = " ".join(out.split())
    assert status == 0 and "`tiny` for the shipped pair's 12-layer target" in flat and "(default 1)" in flat, out
    assert "sampling temperature, 0 = greedy (default 1)" in flat
    status, out, _ = speclab("demo", "--help")
    assert "sampling temperature, 0 = greedy (default 0)" in " ".join(out.split())


def test_every_way_to_ask_for_a_drafter_means_the_same_one():
    """vLLM's words and speclab's for the same drafter give the same engine: greedy through the shipped EAGLE head by
    --draft eagle, --method eagle and --speculative-config (method eagle3) emits the same tokens with the same
    acceptance, and they are plain greedy decoding's (the draft model's run); --method ngram and vLLM's whole n-gram
    JSON (prompt_lookup_min 1) are --ngram. The demo runs with the head (its greedy check holds). One child process
    for all eight, at a fixed kappa (--kappa auto's choices follow each run's own timing, so its counters would not
    repeat)."""
    short = ["generate", "--target", "tiny", "--temperature", "0", "--max-tokens", "16", "--json", "--kappa", "3",
             "--prompt", "def add(a, b):\\n    return", "--prompt", "class Stack:\\n    def push(self"]
    runs = speclab_runs([*short, "--draft", "eagle"], [*short, "--method", "eagle"],
                        [*short, "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'],
                        [*short, "--draft", "tiny"], [*short, "--ngram", "2"],
                        [*short, "--method", "ngram", "--ngram", "2"],
                        ["demo", "--method", "eagle", "--repeats", "1", "--max-tokens", "12", "--threads", "1",
                         "--kappa", "3"],
                        [*short, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, '
                         '"prompt_lookup_min": 1, "prompt_lookup_max": 2}'])          # vLLM's whole n-gram JSON
    assert all(status == 0 for status, _, _ in runs), [err[-2000:] for _, _, err in runs]
    got = [json.loads(out) for _, out, _ in runs[:6]] + [json.loads(runs[7][1])]
    tokens = [[o["token_ids"] for o in g["outputs"]] for g in got]
    assert tokens[0] == tokens[1] == tokens[2] == tokens[3] == tokens[4] == tokens[5] == tokens[6]
    assert got[0]["metrics"] == got[1]["metrics"] == got[2]["metrics"]
    assert got[4]["metrics"] == got[5]["metrics"] == got[6]["metrics"]
    assert got[0]["metrics"] != got[3]["metrics"]           # the head, not the draft model, drafted
    assert "EAGLE head" in runs[6][1] and "greedy outputs identical to plain decoding: yes" in runs[6][1]


def test_serve_drafts_with_the_eagle_head():
    "speclab serve --method eagle: the command line resolves to the shipped head's folder; the engine drafts with it."
    from speclab.cli import build_parser, drafting, resolve_checkpoint
    from speclab.eagle import EagleDrafter, eagle_path
    from speclab.request import SamplingParams
    from speclab.serve import load_engine
    from speclab.train import tiny_pair_path
    for argv, want in ((["serve", "--method", "eagle"], None),      # no number given: --kappa auto's cap is 4
                       (["serve", "--draft", "eagle", "--num-spec-tokens", "2"], 2),
                       (["serve", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 2}'], 2)):
        draft, ngram, kappa = drafting(build_parser().parse_args(argv))
        assert (resolve_checkpoint(draft, "draft"), ngram, kappa) == (eagle_path(), None, want), argv
    eng = load_engine(tiny_pair_path("target"), eagle_path(), kappa=2)
    assert isinstance(eng.drafter, EagleDrafter) and eng.config.kappa == 2
    out = eng.generate(["def add(a, b):\n    return"], None)[0]
    assert out.error is None and eng.metrics.num_draft_tokens > 0


def test_roofline_says_never_and_na():
    status, out, err = speclab("roofline", "--alpha", "0.1")
    assert status == 0 and "never pays" in out and "falls to 1                0.0" not in out, out
    status, out, err = speclab("roofline", "--draft", "llama-3-8b")
    assert status == 0 and "n/a (c >= 1)" in out and "nan" not in out, out


def test_demo_honours_top_k():
    """top-k = 1 at temperature 1 leaves one token to sample: the demo must then write exactly its greedy text. Twelve
    tokens per prompt (six prompts) show it as well as the default 64, for a fifth of the decoding. The three demos
    run in one child (`speclab_runs`: 21 CPU s as three console scripts, most of it imports)."""
    def text(out):
        return out[out.index("\n\n"):out.index("SpecDecoding")]
    short = ["demo", "--repeats", "1", "--max-tokens", "12", "--threads", "1", "--kappa", "3"]
    greedy, top1, top2 = speclab_runs(short, [*short, "--temperature", "1", "--top-k", "1"],
                                      [*short, "--temperature", "1", "--top-k", "50", "--seed", "3"])
    assert greedy[0] == top1[0] == top2[0] == 0, (greedy[2], top1[2], top2[2])
    assert text(top1[1]) == text(greedy[1])
    assert text(top2[1]) != text(greedy[1])  # the flag reaches the sampler: a wider top-k samples something else


def test_paths_are_checked_before_torch_and_files_still_pass():
    """check_args refuses a missing path before torch loads, but a path that exists passes through, a file included:
    `roofline` takes a config.json as well as a folder."""
    from speclab.cli import UsageError, build_parser, check_args
    from speclab.train import tiny_pair_path
    parse = lambda *argv: build_parser().parse_args(list(argv))
    config = str(tiny_pair_path("target") / "config.json")
    check_args(parse("roofline", "--target", config, "--draft", str(tiny_pair_path("draft"))))
    with pytest.raises(UsageError, match="checkpoint folder not found: /no/such/dir"):
        check_args(parse("generate", "--target", "/no/such/dir", "--ngram", "2", "--prompt", "x"))
    with pytest.raises(UsageError, match="--prompts file not found: /no/file"):
        check_args(parse("audit", "--url", "http://x", "--reference-url", "http://y", "--prompts", "/no/file"))
    status, _, err = speclab("roofline", "--target", config, "--draft", str(tiny_pair_path("draft")))
    assert status == 0, err
