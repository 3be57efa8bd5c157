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
    # issue 41: --kappa auto|N and the draft's stopping rule, every bad value named by its flag
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


def test_empty_prompt_goes_to_stderr_and_json():
    "An empty prompt: one line on stderr, exit 1; with --json, an error entry beside the other prompt's output."
    (status, out, err), json_run = speclab_runs(
        ["generate", "--target", "tiny", "--ngram", "2", "--kappa", "3", "--prompt", ""],
        ["generate", "--target", "tiny", "--draft", "tiny", "--kappa", "3", "--temperature", "0", "--json",
         "--max-tokens", "8", "--prompt", "", "--prompt", "def f(x):"])
    assert_one_line(status, out, err, "speclab generate: error: prompt 1: ValueError: prompt must hold",
                    "at least one token", code=1)
    assert "SpecDecoding" not in out and "tokens/s" not in out, out
    status, out, err = json_run
    assert status == 1 and len(err.splitlines()) == 1, err
    res = json.loads(out)
    assert [o["error"] is None for o in res["outputs"]] == [False, True]
    assert res["outputs"][0]["error"].endswith("prompt must hold at least one token") and res["tokens"] == 8


def test_shipped_pair_by_name():
    "The shipped pair by name, at the default --kappa auto: its calibration is one line on stderr, stdout as before."
    status, out, err = speclab("generate", "--target", "tiny", "--draft", "tiny", "--temperature", "0",
                               "--max-tokens", "12", "--prompt", "def add(a, b):\\n    return")
    assert status == 0 and "SpecDecoding metrics" in out and "[12 tokens, length]" in out, (out, err)
    assert err.startswith("speclab generate: calibrated on this machine in ") and "(--kappa auto)" in err, err
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
    from speclab.engine import SamplingParams
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
