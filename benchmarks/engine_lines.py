"""Lines of speclab's engine path next to nano-vllm's (issue 26): non-blank, non-comment lines, docstrings included.

    python benchmarks/engine_lines.py                          # nano-vllm read from NANO (below) if it is there
    python benchmarks/engine_lines.py --nano /path/to/nano-vllm --json

speclab's engine path: all of `speclab/engine.py` (requests, sampling parameters, drafters, processors, scheduler,
runner, engine), its counters (`SpecMetrics`, in `speclab/roofline.py`) and the production block manager of
`speclab/kv.py` (its record, keys, free queue and the
`BlockManager` class), without Chapter 6's teaching code (the toy K/V, the wrong managers, the invariant checker and
its fuzzer). nano-vllm: its whole package (1,195 lines at commit bb823b3, model and layers included) and its
`engine/` folder with config, sampling parameters and sampler (the part that does what speclab's path does).
"""
import argparse
import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NANO = Path("/tmp/nano")                       # `git archive` of github.com/GeeeekExplorer/nano-vllm
KV_PRODUCTION = ("Request", "Step", "_check_tokens", "ROOT_HASH", "block_hash", "hash_chain", "FreeBlockQueue",
                 "BlockManager", "FREED")
NANO_ENGINE = ("engine/block_manager.py", "engine/llm_engine.py", "engine/model_runner.py", "engine/scheduler.py",
               "engine/sequence.py", "config.py", "sampling_params.py", "layers/sampler.py")


def code_lines(lines: list[str]) -> int:
    "Lines that are neither blank nor a comment."
    return sum(1 for ln in lines if ln.strip() and not ln.strip().startswith("#"))


def file_lines(path: Path) -> int:
    "code_lines of a whole file."
    return code_lines(path.read_text().splitlines())


def definitions_lines(path: Path, names: tuple[str, ...]) -> int:
    "code_lines of the top-level definitions and assignments of `names` in a module."
    text = path.read_text().splitlines()
    total = 0
    for node in ast.parse("\n".join(text)).body:
        targets = [getattr(node, "name", None)]
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if any(t in names for t in targets):
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            total += code_lines(text[start - 1:node.end_lineno])
    return total


def main(argv: list[str] | None = None) -> dict:
    "Count both and print the ratios."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nano", type=Path, default=NANO, help="a nano-vllm checkout (default /tmp/nano)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    res = {"speclab_engine_py": file_lines(ROOT / "speclab" / "engine.py"),
           "speclab_spec_metrics": definitions_lines(ROOT / "speclab" / "roofline.py", ("SpecMetrics",)),
           "speclab_kv_production": definitions_lines(ROOT / "speclab" / "kv.py", KV_PRODUCTION)}
    res["speclab_engine_path"] = sum(res.values())
    pkg = a.nano / "nanovllm"
    if pkg.is_dir():
        res["nano_vllm_package"] = sum(file_lines(p) for p in pkg.rglob("*.py"))
        res["nano_vllm_engine_path"] = sum(file_lines(pkg / p) for p in NANO_ENGINE)
        res["ratio_to_nano_package"] = round(res["speclab_engine_path"] / res["nano_vllm_package"], 3)
        res["ratio_to_nano_engine_path"] = round(res["speclab_engine_path"] / res["nano_vllm_engine_path"], 3)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k:<28}{v:>8}")
    return res


if __name__ == "__main__":
    main()
