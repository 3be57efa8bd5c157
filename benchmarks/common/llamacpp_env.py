"""llama.cpp as speclab's second peer engine on a CPU machine: built from PyPI's source, the pair in GGUF, servers.

llama.cpp is what CPU users pick first. Its source reaches this machine the way vLLM's wheels do, from PyPI: the
`llama-cpp-python` sdist vendors llama.cpp, and its own `llama-server` (an OpenAI-compatible server with draft-model
speculation) is built from that tree with CMake. Everything lives outside the repository, in `llamacpp_dir()`
(`SPECLAB_LLAMACPP_DIR`, default `/root/.cache/speclab/llamacpp`):

* `llama_server_binary(create=False)`: the built `llama-server`; with `create`, the sdist is downloaded
  (`pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36`), unpacked, configured and built (minutes
  on 2 cores; only the server target).
* `gguf_pair(create=False)`: the shipped pair as f32 GGUF files, converted by llama.cpp's own
  `convert_hf_to_gguf.py` from the same tree (run by this Python, with the tree's `gguf-py` on the path: the
  converter needs torch, which the project's venv has; nothing is installed into it). Two facts about the shipped
  pair the converter cannot guess are given to it, each checked first: the tokenizer is a `tokenizer.json` only (no
  sentencepiece model to try), and its pre-tokenizer is GPT-2's (byte-level BPE with GPT-2's split regex), which the
  converter identifies by hashing known tokenizers' outputs and does not know for a tokenizer trained here.
* `llamacpp_server(model, draft=None, ...)`: a context manager that starts `llama-server` on a free port of
  127.0.0.1 and yields its URL once `/health` answers (plain, or speculative with `--spec-draft-model`), stopped on
  leaving the block whatever happens (`vllm_env.serve`).

Only the standard library is imported here (and `vllm_env` beside it).
"""
import contextlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_env import DRAFT, TARGET, free_port, serve  # noqa: E402

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
DEFAULT_DIR = Path("/root/.cache/speclab/llamacpp")
CONTEXT = 512                     # the shipped pair's max_position_embeddings
# OpenAI's sampling semantics, which speclab and vLLM serve: no truncation or penalty unless a request asks, and
# temperature before top-k/top-p (llama.cpp's defaults are top-k 40, min-p 0.05, and temperature last).
NEUTRAL_SAMPLING = ("--top-k", "0", "--top-p", "1.0", "--min-p", "0.0", "--typical", "1.0", "--repeat-penalty", "1.0",
                    "--presence-penalty", "0.0", "--frequency-penalty", "0.0", "--dry-multiplier", "0.0",
                    "--xtc-probability", "0.0", "--top-nsigma", "-1", "--samplers",
                    "penalties;temperature;top_k;top_p;min_p")


def llamacpp_dir() -> Path:
    "Where the source, the build and the GGUF files live: `SPECLAB_LLAMACPP_DIR`, or /root/.cache/speclab/llamacpp."
    return Path(os.environ.get("SPECLAB_LLAMACPP_DIR") or DEFAULT_DIR)


def source_dir() -> Path:
    "llama.cpp's tree as vendored by the llama-cpp-python sdist."
    return llamacpp_dir() / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def binary_path() -> Path:
    "Where the built llama-server is."
    return source_dir() / "build" / "bin" / "llama-server"


def build(folder: Path) -> Path:
    "Download the sdist into `folder`, unpack it, build llama-server (Release, this CPU's instructions); its path."
    folder.mkdir(parents=True, exist_ok=True)
    sdist = folder / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"{PACKAGE}=={VERSION}", "-d", str(folder)], check=True)
    if not source_dir().is_dir():
        with tarfile.open(sdist) as tar:
            tar.extractall(folder, filter="data")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_UI=OFF",
             "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON"]
    subprocess.run(["cmake", "-S", str(source_dir()), "-B", str(source_dir() / "build"), *flags], check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", str(source_dir() / "build"), "--target", "llama-server", "-j", jobs],
                   check=True)
    return binary_path()


def llama_server_binary(create: bool = False) -> Path:
    """The built llama-server. Without `create`, a missing one raises RuntimeError saying how to build it."""
    if binary_path().is_file():
        return binary_path()
    if not create:
        raise RuntimeError(f"no llama-server under {llamacpp_dir()}: call llama_server_binary(create=True)")
    return build(llamacpp_dir())


def server_version(binary: Path) -> str:
    "`llama-server --version`'s first line naming the build (e.g. 'version: 1 (0c1e570)')."
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version")]
    return lines[0] if lines else "unknown"


def check_gpt2_pretokenizer(model: Path) -> None:
    "ValueError unless `model`'s tokenizer.json is byte-level BPE split by GPT-2's regex (what the converter is told)."
    tok = json.loads((model / "tokenizer.json").read_text())
    pre = tok.get("pre_tokenizer") or {}
    if tok["model"]["type"] != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex"):
        raise ValueError(f"{model}: not a byte-level BPE tokenizer with GPT-2's split; the converter's 'gpt-2' "
                         f"pre-tokenizer would not match it (model {tok['model']['type']}, pre_tokenizer {pre})")
    if (model / "tokenizer.model").exists():
        raise ValueError(f"{model} has a sentencepiece model: convert it without the tokenizer.json-only patch")


# Run by this Python: llama.cpp's converter, told the two facts above. argv: converter, tree, model, outfile.
CONVERT = """
import runpy, sys
converter, tree, model, outfile = sys.argv[1:5]
sys.path[:0] = [tree, tree + "/gguf-py"]
from conversion import base
def no_sentencepiece(self):
    raise FileNotFoundError("tokenizer.json only")
def gpt2(self, tokenizer):
    return "gpt-2"
base.TextModel._create_vocab_sentencepiece = no_sentencepiece
base.TextModel.get_vocab_base_pre = gpt2
sys.argv = [converter, model, "--outtype", "f32", "--outfile", outfile]
runpy.run_path(converter, run_name="__main__")
"""


def convert(model: Path, out: Path) -> Path:
    "`model` (an HF Llama folder) to f32 GGUF at `out` by llama.cpp's converter; `out`."
    check_gpt2_pretokenizer(model)
    tree = source_dir()
    converter = tree / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise RuntimeError(f"no converter at {converter}: build llama.cpp first (llama_server_binary(create=True))")
    subprocess.run([sys.executable, "-c", CONVERT, str(converter), str(tree), str(model), str(out)], check=True)
    return out


def gguf_pair(create: bool = False) -> tuple[Path, Path]:
    "(target, draft) of the shipped pair as f32 GGUF in llamacpp_dir(); converted on request when missing."
    paths = llamacpp_dir() / "tiny-target-f32.gguf", llamacpp_dir() / "tiny-draft-f32.gguf"
    for model, path in zip((TARGET, DRAFT), paths):
        if path.is_file():
            continue
        if not create:
            raise RuntimeError(f"no {path.name} in {llamacpp_dir()}: call gguf_pair(create=True)")
        convert(model, path)
    return paths


def llamacpp_command(binary: Path, model: Path, port: int, draft: Path | None = None, num_draft: int = 3,
                     parallel: int = 16, threads: int | None = None, seed: int | None = None,
                     extra_args: Sequence[str] = (), sampling: Sequence[str] = NEUTRAL_SAMPLING) -> list[str]:
    """llama-server for `model` on 127.0.0.1:`port`: `parallel` slots of CONTEXT positions each (one unified KV
    cache of parallel x CONTEXT cells), `threads` (default: every core), OpenAI's sampling semantics
    (`sampling`, NEUTRAL_SAMPLING; () keeps llama.cpp's own defaults), and with `draft` its draft model proposing
    up to `num_draft` tokens a step (at least 1, any draft probability). `seed` is the server's default for
    requests without one: None keeps llama.cpp's (a fresh random seed per request; a fixed one would give every
    unseeded request the same draws)."""
    threads = threads or os.cpu_count() or 1
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(CONTEXT * parallel),
           "--parallel", str(parallel), "--kv-unified", "-t", str(threads), "-tb", str(threads), "--no-webui",
           "--metrics", *sampling]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if draft is not None:
        cmd += ["--spec-type", "draft-simple", "--spec-draft-model", str(draft), "--spec-draft-n-max", str(num_draft),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads), "-tbd", str(threads)]
    return cmd + list(extra_args)


@contextlib.contextmanager
def llamacpp_server(model: Path, draft: Path | None = None, *, num_draft: int = 3, parallel: int = 16,
                    threads: int | None = None, seed: int | None = None, extra_args: Sequence[str] = (),
                    sampling: Sequence[str] = NEUTRAL_SAMPLING, timeout: float = 300.0,
                    log: str | Path | None = None) -> Iterator[str]:
    """llama.cpp's server for a GGUF `model` (with `draft`: speculative decoding by that draft model) on a free port
    of 127.0.0.1; yields its URL once /health answers and stops it on leaving the block."""
    for name, path in (("model", model), ("draft", draft)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{name} must be a GGUF file, got {path!r}")
    if isinstance(num_draft, bool) or not isinstance(num_draft, int) or num_draft < 1:
        raise ValueError(f"num_draft must be an int >= 1, got {num_draft!r}")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be an int >= 1, got {parallel!r}")
    port = free_port()
    cmd = llamacpp_command(llama_server_binary(), Path(model), port, draft and Path(draft), num_draft, parallel,
                           threads, seed, extra_args, sampling)
    with serve(cmd, f"http://127.0.0.1:{port}", "llama-server", dict(os.environ), timeout, log=log,
               min_free_gib=1.0) as url:
        yield url


def main() -> int:
    "`python benchmarks/common/llamacpp_env.py`: build or reuse llama-server, convert or reuse the pair; print them."
    binary = llama_server_binary(create=True)
    target, draft = gguf_pair(create=True)
    print(f"llama-server: {binary} ({server_version(binary)})")
    print(f"gguf: {target}, {draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
