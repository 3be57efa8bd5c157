"""The engine's layout as Chapter 8 teaches it: one module per concern, each small; drafters and policies seen only
through their contracts; one chain loop for every chain drafter; the old import path kept."""
import ast
from pathlib import Path

import speclab

PKG = Path(speclab.__file__).parent
ENGINE_PATH = ("config", "request", "processors", "drafters", "scheduler", "runner", "engine", "policy", "tree_verify")


def test_each_engine_module_is_small():
    sizes = {m: len((PKG / f"{m}.py").read_text().splitlines()) for m in ENGINE_PATH}
    assert all(n <= 700 for n in sizes.values()), sizes


def _probes(module: str) -> list[str]:
    "getattr/hasattr/isinstance calls in a module whose first argument mentions a drafter."
    tree = ast.parse((PKG / f"{module}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            if node.func.id in ("getattr", "hasattr", "isinstance") and "drafter" in ast.unparse(node.args[0]):
                found.append(f"{module}.py:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_sees_drafters_only_through_the_contract():
    "No module the engine runs probes a drafter for optional hooks or checks its class (the contract declares all)."
    probes = [p for m in ("config", "request", "processors", "scheduler", "runner", "engine", "policy", "tree_verify")
              for p in _probes(m)]
    assert probes == [], probes


def test_one_chain_loop_and_the_contract():
    from speclab.drafters import ChainDrafter, Drafter, ModelDrafter, NgramDrafter, Proposal, check_drafter
    from speclab.eagle import EagleDrafter
    from speclab.trees import EagleTreeDrafter, TreeDrafter
    assert ModelDrafter.propose is ChainDrafter.propose and EagleDrafter.propose is ChainDrafter.propose
    for cls in (NgramDrafter, ModelDrafter, EagleDrafter, TreeDrafter, EagleTreeDrafter):
        assert issubclass(cls, Drafter), cls
    assert TreeDrafter.proposes_trees and EagleTreeDrafter.proposes_trees and not ModelDrafter.proposes_trees
    check_drafter(NgramDrafter())
    assert Proposal([[1]]).num_draft_computed is None


def test_the_old_import_path_keeps_working():
    from speclab.engine import SamplingParams, SpecDecoder
    from speclab.request import SamplingParams as Params
    assert SamplingParams is Params and SpecDecoder.__module__ == "speclab.engine"


def test_no_production_module_imports_the_lab():
    "Chapter 6b's fuzzing lab is teaching code: nothing the engine or the server runs imports it."
    lab_users = [p.name for p in PKG.glob("*.py") if p.name not in ("kvlab.py", "_modidx.py")
                 and "kvlab" in p.read_text()]
    assert lab_users == [], lab_users
