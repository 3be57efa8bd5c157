#!/usr/bin/env python3
"""Render nbs/index.ipynb to README.md without Quarto.

Markdown cells are copied verbatim; code cells become ```python blocks followed by their text outputs.
Cells with a `#| hide` directive are skipped and other `#|` directive lines are dropped.
`--check` writes nothing: it prints a unified diff and exits 1 when README.md is out of date.
"""
import argparse, difflib, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NB, README = ROOT / "nbs" / "index.ipynb", ROOT / "README.md"
HEADER = "<!-- WARNING: generated from nbs/index.ipynb by tools/make_readme.py; do not edit by hand. -->\n"
DIRECTIVE = re.compile(r"^\s*#\s*\|")

def text(x): return "".join(x) if isinstance(x, list) else x

def outputs(cell):
    "The text outputs of a code cell: streams (consecutive chunks joined), and text/plain of results (no images, no html)."
    stream = ""
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            stream += text(o["text"])
            continue
        if stream: yield stream
        stream = ""
        if o["output_type"] in ("execute_result", "display_data") and "text/plain" in o.get("data", {}):
            yield text(o["data"]["text/plain"])
    if stream: yield stream

def render_cell(cell):
    src = text(cell["source"])
    if cell["cell_type"] == "markdown": return src.strip()
    if cell["cell_type"] != "code": return ""
    lines = src.splitlines()
    if any(DIRECTIVE.match(l) and re.match(r"^\s*#\s*\|\s*hide\s*$", l) for l in lines): return ""
    code = "\n".join(l for l in lines if not DIRECTIVE.match(l)).strip()
    if not code: return ""
    parts = [f"```python\n{code}\n```"]
    parts += [f"```\n{out.rstrip()}\n```" for out in outputs(cell) if out.strip()]
    return "\n\n".join(parts)

def render(nb_path=NB):
    cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
    return HEADER + "\n" + "\n\n".join(b for b in map(render_cell, cells) if b) + "\n"

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 with a diff if README.md is out of date")
    args = ap.parse_args()
    new = render()
    if not args.check:
        README.write_text(new, encoding="utf-8")
        return 0
    old = README.read_text(encoding="utf-8") if README.exists() else ""
    if old == new: return 0
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                               "README.md", "README.md (from nbs/index.ipynb)"))
    print("\nREADME.md is out of date: run `python tools/make_readme.py`.")
    return 1

if __name__ == "__main__": sys.exit(main())
