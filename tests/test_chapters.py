"""The chapters teach: no exported cell is a module listing. A long class or function is built over several short
cells (a method at a time with `@patch`), each followed by the prose and the examples that explain it."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_EXPORTED_LINES = 80
EXPORT = re.compile(r"^\s*#\|\s*export", re.M)  # #| export and #| exporti, with or without the space


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def long_exported_cells(path: Path) -> list[str]:
    "One line per exported code cell of the notebook at `path` that is over MAX_EXPORTED_LINES lines."
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out = []
    for i, cell in enumerate(cells):
        src = _source(cell)
        n = len(src.splitlines())
        if cell["cell_type"] == "code" and EXPORT.search(src) and n > MAX_EXPORTED_LINES:
            out.append(f"{path.name}: cell {i} is an exported cell of {n} lines (at most {MAX_EXPORTED_LINES})")
    return out


def test_the_check_sees_every_spelling():
    "#| export, #|export and #| exporti all count; a cell that only mentions exporting does not."
    assert EXPORT.search("#| export\nx = 1") and EXPORT.search("#|export\nx = 1") and EXPORT.search("#| exporti")
    assert not EXPORT.search("x = 1  # nbdev_export writes this")


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "nbs").glob("*.ipynb")))
def test_exported_cells_are_short(notebook):
    "Every exported code cell of every chapter has at most 80 lines."
    bad = long_exported_cells(ROOT / "nbs" / notebook)
    assert not bad, "\n".join(bad)
