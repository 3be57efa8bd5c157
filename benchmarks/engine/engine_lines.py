"""Lines of speclab's serving path next to nano-vllm's, like for like: non-blank, non-comment lines,
docstrings included, component by component, and the lines of each module of the engine.

    git clone https://github.com/GeeeekExplorer/nano-vllm /tmp/nano-git && git -C /tmp/nano-git archive bb823b3 \
        | (mkdir -p /tmp/nano && tar -x -C /tmp/nano)                  # nano-vllm's snapshot, once
    python benchmarks/engine/engine_lines.py                           # the table (nano-vllm read from /tmp/nano)
    python benchmarks/engine/engine_lines.py --nano-commit bb823b3 --json > benchmarks/engine/engine_lines_after.json
    python benchmarks/engine/engine_lines.py --root /tmp/speclab_at_sha --speclab-commit SHA   # another speclab tree
    python benchmarks/engine/engine_lines.py --modules request.py,scheduler.py,runner.py,engine.py   # name them

Both sides count the whole serving path: engine, KV bookkeeping, model forward, sampler and weight loading.
nano-vllm: its engine/, layers/, models/, utils/ (the forward's context and the weight loader), config.py,
sampling_params.py and llm.py: every file of its package but `__init__.py`. speclab: all of the engine's modules,
counted whole, and from the other modules the top-level definitions the engine runs, selected with `ast`: the
ROWS below name the roots, and every top-level name of the same module that a selected definition mentions is
selected too (its closure), so a helper split out by a refactor is still counted. A name counted in one row is not
counted again in a later one. The JSON lists every name counted, the roots a refactor moved away (`missing_names`)
and the speclab names a counted definition uses that no row counts (`referenced_not_counted`).

The engine's modules, by default (`engine_modules`): `speclab/engine.py` and every speclab module it imports,
directly or through another engine module, that is exported from the engine's chapter (the notebook named in
engine.py's "File to edit" header, by chapter number: 08, 08a, 08_scheduler ... alike) or is named in ENGINE_PATH
(request, processors, config, drafters, scheduler, runner, policy); plus any ENGINE_PATH module of the engine's
chapter that nothing imports. One file before the engine is split into one module per concern, all of them after.
Chapter 14's tree drafters (`speclab/trees.py`) are not counted, before or after: the engine does not import them.
The tree walk the runner calls (ENGINE_MOVED) is counted in the engine row wherever it is defined: in engine.py
before the split, in `tree_verify.py` (Chapter 14b) after, so that the row compares like with like.

Symmetry: weight loading is counted on both sides (nano's `utils/loader.py`, speclab's `load_model` and what it
calls); tokenizer loading on neither (nano's is one `AutoTokenizer` line inside its engine, counted there; speclab's
`load_tokenizer` lives outside the engine). The contiguous `KVCache`/`forward` of Chapter 7, which the engine's
prompt-logprobs path uses, is left out: it is the teaching forward, not the paged one (listed as not counted).
Rows are approximate (nano's model runner builds its batches, speclab's `paged_batch` does); the totals are the
like-for-like figure.
"""
import argparse
import ast
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]     # benchmarks/engine/ -> the checkout
NANO = Path("/tmp/nano")                       # `git archive` of github.com/GeeeekExplorer/nano-vllm
ENGINE_FILES = ("engine.py",)                  # the engine before its split into one module per concern
ENGINE_PATH = ("request", "processors", "config", "drafters", "scheduler", "runner", "policy", "engine")
ENGINE_MOVED = ("fed_parents", "tree_node_probs", "root_paths", "walk_tree", "walk_trees")   # the tree walk the runner
# calls: in engine.py before the split, in Chapter 14b's tree_verify.py after; counted in the engine row either way
KV_PRODUCTION = ("Request", "Step", "_check_tokens", "ROOT_HASH", "block_hash", "hash_chain", "FreeBlockQueue",
                 "BlockManager", "PagedKV", "FREED")     # kv.py without Chapter 6's teaching code (until kvlab.py)
MODEL_FORWARD = ("LlamaArgs", "Llama", "decoder_layer", "paged_batch", "paged_cache", "paged_attend", "paged_logits",
                 "forward_paged", "compile_paged", "long_tensor")
MODEL_SHAPE = ("ModelSpec", "LLAMA_MODEL_TYPES", "REQUIRED_CONFIG_KEYS")   # roofline.py: what LlamaArgs inherits
SAMPLER = ("rejection_sampler", "SamplingMetadata", "ProcessorRows", "process_logits", "sampling_probs",
           "draw_tokens", "no_valid_rows", "neutralize", "token_counts", "NO_VALID_TOKEN_ID", "PLACEHOLDER_TOKEN_ID",
           "greedy_sample", "random_sample", "recovered_exponential")  # the last three: reached as `ops.<name>`
LOADER = ("load_model", "load_state_dict", "checkpoint_folder", "hf_state_dict", "pack_state_dict")
NANO_ENGINE = ("engine/llm_engine.py", "engine/scheduler.py", "engine/sequence.py", "engine/model_runner.py",
               "config.py", "sampling_params.py", "llm.py")
NANO_MODEL = ("models/qwen3.py", "layers/activation.py", "layers/attention.py", "layers/embed_head.py",
              "layers/layernorm.py", "layers/linear.py", "layers/rotary_embedding.py", "utils/context.py")
NANO_NOT_COUNTED = ("__init__.py",)
SPECLAB_ONLY = ["speculation: drafters (draft model, n-gram, EAGLE hook), kappa schedules, draft KV catch-up",
                "the rejection sampler (exact verification of a ragged batch of drafts) and SpecDecodeMetadata",
                "sampling: top-k, top-p, min-p, seeds; logits processors (penalties, bad words, min_tokens, "
                "logit bias, allowed ids)",
                "an incremental detokenizer with stop strings (nano decodes once, at the end)",
                "SpecMetrics (vLLM's speculation counters), per-request fault isolation, prompt and output logprobs",
                "argument checks with named errors on every public entry (nano asserts a few)"]
NANO_ONLY = ["CUDA graphs captured per batch size (model_runner.capture_cudagraph)",
             "tensor parallelism: NCCL process group, column/row/QKV/merged parallel linears, vocab-parallel "
             "embedding and head, a shared-memory RPC loop",
             "flash-attn varlen/kvcache kernels and a Triton kernel that stores K/V",
             "Qwen3's q/k norms; torch.compile on its norms, rotary embedding, activation and sampler"]


def code_lines(lines: list[str]) -> int:
    "Lines that are neither blank nor a comment."
    return sum(1 for ln in lines if ln.strip() and not ln.strip().startswith("#"))


def file_lines(path: Path) -> int:
    "code_lines of a whole file."
    return code_lines(path.read_text().splitlines())


def patched_class(node: ast.stmt) -> str | None:
    "The class a `@patch`ed function joins (the annotation of its first argument, `self: Cls`), or None."
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.args.args:
        return None
    if not any(ast.unparse(d) == "patch" for d in node.decorator_list):
        return None
    ann = node.args.args[0].annotation
    return None if ann is None else ast.unparse(ann).strip("'\"")


def node_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines: a def's or class's name (`Cls.name` for a method added with
    `@patch`, so that it counts with its class), an assignment's plain targets."""
    if patched_class(node) is not None:
        return [f"{patched_class(node)}.{node.name}"]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def top_level(path: Path) -> dict[str, ast.stmt]:
    "Each top-level name of a module -> the statement that defines it (the last one, as Python would)."
    return {name: node for node in ast.parse(path.read_text()).body for name in node_names(node)}


def mentioned(node: ast.AST) -> set[str]:
    "Every plain name a statement mentions (calls, annotations, decorators, base classes, defaults)."
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def closure(defs: dict[str, ast.stmt], roots: tuple[str, ...], done: set[str] = frozenset(),
            follow: bool = True) -> list[str]:
    """The roots found in `defs` and, with `follow`, every top-level name their definitions mention, transitively;
    names in `done` (counted by an earlier row, their closure with them) are neither taken nor followed."""
    taken, todo = [], list(roots)
    while todo:
        name = todo.pop(0)
        if name in taken or name in done or name not in defs:
            continue
        taken.append(name)
        if follow:                                     # what it mentions, and a class's methods added by @patch
            todo += sorted(mentioned(defs[name])) + sorted(k for k in defs if k.startswith(name + "."))
    return taken


def definitions_lines(path: Path, names: list[str] | tuple[str, ...]) -> int:
    "code_lines of the top-level statements defining `names` (decorators included; each statement once)."
    text = path.read_text().splitlines()
    nodes = {id(node): node for node in ast.parse("\n".join(text)).body if set(node_names(node)) & set(names)}
    total = 0
    for node in nodes.values():
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        total += code_lines(text[start - 1:node.end_lineno])
    return total


def imported_modules(path: Path, pkg: Path) -> list[str]:
    """The files of `pkg` a module imports (top level or inside functions), in any form: `from .x import a`,
    `from speclab.x import a`, `from . import x`, `from speclab import x`, `import speclab.x`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith(pkg.name)):
            module = node.module if node.level == 1 else (node.module or "").removeprefix(pkg.name).lstrip(".")
            names = [module.split(".")[0]] if module else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith(pkg.name + ".")]
        out += [f"{n}.py" for n in names if (pkg / f"{n}.py").is_file() and f"{n}.py" not in out]
    return out


def chapter(path: Path) -> str | None:
    "The chapter number of the notebook a module is exported from (nbdev's 'File to edit' header), e.g. '08'."
    m = re.search(r"File to edit: \S*?nbs/(\d+)", "\n".join(path.read_text().splitlines()[:6]))
    return m.group(1) if m else None


def engine_modules(pkg: Path) -> list[str]:
    """The engine's modules: engine.py and the speclab modules it imports, transitively through engine modules, that
    come from the engine's chapter or are named in ENGINE_PATH; then ENGINE_PATH modules of that chapter nothing
    imports. In data-flow order (ENGINE_PATH's), any other after them by name."""
    start = pkg / "engine.py"
    if not start.is_file():
        raise SystemExit(f"{start} not found: name the engine's modules with --modules")
    home = chapter(start)

    def of_engine(file: str) -> bool:
        return file[:-3] in ENGINE_PATH or (home is not None and chapter(pkg / file) == home)

    found, todo = ["engine.py"], ["engine.py"]
    while todo:
        for file in imported_modules(pkg / todo.pop(), pkg):
            if file not in found and of_engine(file):
                found.append(file)
                todo.append(file)
    found += [f"{n}.py" for n in ENGINE_PATH if (pkg / f"{n}.py").is_file() and f"{n}.py" not in found
              and (home is None or chapter(pkg / f"{n}.py") == home)]
    order = {f"{n}.py": i for i, n in enumerate(ENGINE_PATH)}
    return sorted(found, key=lambda f: (order.get(f, len(order) - 0.5), f))


def module_lines(pkg: Path, files: list[str]) -> list[dict]:
    "Each engine module's code lines (non-blank, non-comment, docstrings included) and physical lines."
    return [{"module": f, "lines": file_lines(pkg / f), "physical": len((pkg / f).read_text().splitlines())}
            for f in files]


def speclab_imports(path: Path) -> dict[str, str]:
    "Names a module imports from other speclab modules (top level or inside functions) -> that module's file name."
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.level == 1 or node.module.startswith("speclab."):
            for alias in node.names:
                out[alias.asname or alias.name] = node.module.split(".")[-1] + ".py"
    return out


def moved_parts(pkg: Path, engine_files: list[str] | tuple[str, ...]) -> list[tuple[str, tuple, bool]]:
    "The engine row's parts outside the engine's modules: each other module defining ENGINE_MOVED names, those names."
    return [(p.name, ENGINE_MOVED, True) for p in sorted(pkg.glob("*.py"))
            if p.name not in engine_files and set(top_level(p)) & set(ENGINE_MOVED)]


def rows_spec(pkg: Path, engine_files: list[str] | tuple[str, ...] = ENGINE_FILES) -> list[dict]:
    "speclab's rows: component, parts (file, roots or None for the whole file, follow) and nano's counterpart."
    kv = ("kvlab.py exists: all of kv.py", [("kv.py", None, True)])
    if not (pkg / "kvlab.py").exists():
        kv = ("kv.py's production names", [("kv.py", KV_PRODUCTION, True)])
    return [
        dict(component="engine", note="requests, params, scheduler, runner, drafters, engine loop",
             parts=[(f, None, True) for f in engine_files] + moved_parts(pkg, engine_files), nano=NANO_ENGINE),
        dict(component="kv bookkeeping", note=kv[0], parts=kv[1], nano=("engine/block_manager.py",)),
        dict(component="model forward", note="paged Llama forward; nano: Qwen3, layers, context",
             parts=[("model.py", MODEL_FORWARD, True), ("roofline.py", MODEL_SHAPE, False)], nano=NANO_MODEL),
        dict(component="sampler", note="rejection sampler, processors; nano: temperature + Gumbel argmax",
             parts=[("sampling.py", SAMPLER, True)], nano=("layers/sampler.py",)),
        dict(component="spec metadata", note="SpecDecodeMetadata", parts=[("metadata.py", ("SpecDecodeMetadata",),
                                                                              True)], nano=None),
        dict(component="detokenizer", note="incremental, stop strings", parts=[("model.py", ("Detokenizer",), True)],
             nano=None),
        dict(component="spec metrics", note="SpecMetrics", parts=[("roofline.py", ("SpecMetrics",), True)],
             nano=None),
        dict(component="weight loader", note="safetensors -> fused modules", parts=[("model.py", LOADER, True)],
             nano=("utils/loader.py",)),
    ]


def count_speclab(pkg: Path, engine_files: list[str] | tuple[str, ...] = ENGINE_FILES
                  ) -> tuple[list[dict], dict[str, set[str]], list[str]]:
    "Each row's lines and names; the names counted per file; the roots not found in their file."
    rows, counted, missing = [], {}, []
    for spec in rows_spec(pkg, engine_files):
        lines, names = 0, {}
        for file, roots, follow in spec["parts"]:
            path = pkg / file
            defs = top_level(path)
            done = counted.setdefault(file, set())
            if roots is None:                       # the whole file
                lines += file_lines(path) if not done else definitions_lines(path, sorted(set(defs) - done))
                taken = sorted(set(defs) - done)
            else:
                missing += [f"{file}:{r}" for r in roots if r not in defs]
                taken = closure(defs, roots, done, follow)
                lines += definitions_lines(path, taken)
            done.update(taken)
            names[file] = taken
        rows.append(dict(component=spec["component"], note=spec["note"], speclab=lines, names=names,
                         nano_files=spec["nano"]))
    return rows, counted, missing


def referenced_not_counted(pkg: Path, counted: dict[str, set[str]],
                           engine_files: list[str] | tuple[str, ...] = ENGINE_FILES) -> list[str]:
    "speclab names that a counted definition mentions, imported from a module where no row counts them."
    out = set()
    for file, names in counted.items():
        path = pkg / file
        defs, imports = top_level(path), speclab_imports(path)
        used = set().union(*(mentioned(defs[n]) for n in names if n in defs))
        if file in engine_files:                    # counted whole: its imports at any depth count as used
            used |= set(imports)
        for name in sorted(used & set(imports)):
            source = imports[name]
            if name not in counted.get(source, set()) and source not in engine_files:
                out.add(f"{file} uses {source}:{name}")
    return sorted(out)


def git_commit(path: Path, given: str | None) -> str | None:
    """A tree's commit: as given, else the checkout's HEAD (with '+dirty' when its files differ), else None (an
    archive does not know its commit)."""
    if given or not (path / ".git").exists():
        return given
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def count_nano(rows: list[dict], pkg: Path) -> list[str]:
    "Fill each row's nano lines (None where nano has no counterpart); the package's files that no row counts."
    listed = set(NANO_NOT_COUNTED)
    for row in rows:
        files = row["nano_files"]
        row["nano"] = None if files is None else sum(file_lines(pkg / f) for f in files)
        listed |= set(files or ())
    return sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if str(p.relative_to(pkg)) not in listed)


def totals(rows: list[dict]) -> dict:
    "Totals of every row and of the rows with a nano counterpart, with their ratios."
    res = {"speclab_total": sum(r["speclab"] for r in rows)}
    shared = [r for r in rows if r.get("nano") is not None]
    if shared:
        res["nano_total"] = sum(r["nano"] for r in shared)
        res["ratio"] = round(res["speclab_total"] / res["nano_total"], 3)
        res["speclab_with_counterpart"] = sum(r["speclab"] for r in shared)
        res["ratio_with_counterpart"] = round(res["speclab_with_counterpart"] / res["nano_total"], 3)
    return res


def table(res: dict) -> str:
    "The rows and totals as a plain-text table, with what each side has that the other lacks."
    out = [f"engine modules ({res['engine_modules_from']}):",
           f"  {'module':<18}{'lines':>7}{'physical':>10}"]
    out += [f"  {m['module']:<18}{m['lines']:>7}{m['physical']:>10}" for m in res["engine_modules"]]
    out += [f"  {'total':<18}{sum(m['lines'] for m in res['engine_modules']):>7}"
            f"{sum(m['physical'] for m in res['engine_modules']):>10}"]
    out += [f"  and in the engine row, from {m['module']}: {', '.join(m['names'])} ({m['lines']} lines)"
            for m in res.get("engine_row_elsewhere", [])]
    out += [""]
    out += [f"{'component':<16}{'speclab':>8}{'nano':>7}  what", "-" * 78]
    for r in res["rows"]:
        nano = "-" if r.get("nano") is None else r["nano"]
        out.append(f"{r['component']:<16}{r['speclab']:>8}{nano:>7}  {r['note']}")
    out.append("-" * 78)
    t = res["totals"]
    out.append(f"{'total':<16}{t['speclab_total']:>8}{t.get('nano_total', '-'):>7}  ratio {t.get('ratio', '-')}")
    if "nano_total" in t:
        out.append(f"{'with counterpart':<16}{t['speclab_with_counterpart']:>8}{t['nano_total']:>7}  "
                   f"ratio {t['ratio_with_counterpart']} (rows nano also has)")
    out += ["", f"speclab commit: {res['speclab_commit']}; nano-vllm commit: {res.get('nano_commit')}",
            "speclab only:"] + [f"  - {s}" for s in SPECLAB_ONLY]
    out += ["nano-vllm only:"] + [f"  - {s}" for s in NANO_ONLY]
    for key in ("missing_names", "referenced_not_counted", "nano_uncounted"):
        if res.get(key):
            out += [f"{key}:"] + [f"  - {s}" for s in res[key]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    "Count both sides and print the table (or one JSON object)."
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nano", type=Path, default=NANO, help="a nano-vllm checkout or archive (default /tmp/nano)")
    ap.add_argument("--nano-commit", help="the commit the archive was made from (recorded in the output)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the speclab tree to count (default this checkout)")
    ap.add_argument("--speclab-commit", help="that tree's commit, when it is an archive (recorded in the output)")
    ap.add_argument("--modules", help="the engine's modules, comma-separated file names of speclab/ (default: "
                    "engine.py and the engine-path modules it imports, see engine_modules)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    pkg = a.root / "speclab"
    if a.modules:
        files = [f.strip() if f.strip().endswith(".py") else f.strip() + ".py" for f in a.modules.split(",")
                 if f.strip()]
        absent = [f for f in files if not (pkg / f).is_file()]
        if not files or absent:
            ap.error(f"--modules must name files of {pkg}, comma-separated (not found: {', '.join(absent)})")
        source = "--modules"
    else:
        files, source = engine_modules(pkg), "default: engine.py and the engine-path modules it imports"
    rows, counted, missing = count_speclab(pkg, files)
    elsewhere = [{"module": f, "names": names, "lines": definitions_lines(pkg / f, names)}
                 for f, names in rows[0]["names"].items() if f not in files and names]
    res = {"speclab_commit": git_commit(a.root, a.speclab_commit), "engine_modules_from": source,
           "engine_modules": module_lines(pkg, files), "engine_row_elsewhere": elsewhere, "rows": rows,
           "missing_names": missing,
           "referenced_not_counted": referenced_not_counted(pkg, counted, files), "speclab_only": SPECLAB_ONLY,
           "nano_only": NANO_ONLY}
    nano_pkg = a.nano / "nanovllm"
    if nano_pkg.is_dir():
        res["nano_commit"] = git_commit(a.nano, a.nano_commit)
        res["nano_uncounted"] = count_nano(rows, nano_pkg)
    res["totals"] = totals(rows)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return res


if __name__ == "__main__":
    main()
