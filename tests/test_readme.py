"""Every code block of the README is run by some test, so the README cannot drift from what the code does.

- `## Two commands`: CI runs them verbatim (`.ci/run`; `tests/test_repo.py::test_readme_two_commands`).
- python blocks: they are code cells of `nbs/index.ipynb`, which `tests/test_repo.py` runs with `nbdev_test`.
- `## The commands`: each line runs here, in the repository, and must exit 0 without a traceback.
- `## The website`: `tests/test_site.py` builds the site with the block's first line and serves it with its second.
- `## The real pair on an H100`: needs a CUDA GPU and two checkpoints; here each line is parsed by speclab's own
  argument parser, so a renamed or removed flag fails.
"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import readme_blocks

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BLOCKS = readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
RUN_HERE = "## The commands"
ELSEWHERE = {"## Two commands", "## The website", "## The real pair on an H100"}


def sh_lines(section: str) -> list[str]:
    "The command lines of the ```sh blocks of one section."
    return [line for sec, lang, code in BLOCKS if sec == section and lang == "sh"
            for line in code.splitlines() if line.strip()]


def test_every_block_is_run_somewhere():
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text(encoding="utf-8"))
    cells = ["\n".join(l for l in "".join(c["source"]).splitlines() if not re.match(r"\s*#\s*\|", l)).strip()
             for c in nb["cells"] if c["cell_type"] == "code"]
    orphans = []
    for section, lang, code in BLOCKS:
        if lang == "python" and code.strip() not in cells:
            orphans.append(f"{section}: a python block that is not a code cell of nbs/index.ipynb")
        if lang == "sh" and section not in ELSEWHERE | {RUN_HERE}:
            orphans.append(f"{section}: a sh block no test runs (move it, or teach tests/test_readme.py)")
        if lang not in ("", "python", "sh"):
            orphans.append(f"{section}: a ```{lang} block")
    assert not orphans, "\n".join(orphans)
    assert len(sh_lines(RUN_HERE)) >= 4, "the README lost its runnable command examples"


@pytest.mark.parametrize("line", sh_lines(RUN_HERE))
def test_readme_command_runs(line):
    "Run the line as the README shows it, with this test's venv standing in for `.venv`."
    cmd = line.replace(".venv/bin/", f"{BIN}/")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{line}\nexit {r.returncode}\n{out[-6000:]}"
    assert "Traceback" not in out, out[-6000:]
    assert r.stdout.strip(), "the command printed nothing"


@pytest.mark.parametrize("line", sh_lines("## The real pair on an H100"))
def test_gpu_commands_parse(line):
    "The H100 lines cannot run here; speclab's own parser must still accept every flag they use."
    from speclab.cli import build_parser

    argv = shlex.split(line)
    assert argv[0] in ("speclab", "python"), line
    if argv[0] == "python":
        assert (ROOT / argv[1]).exists(), f"{argv[1]} does not exist"
        return
    args = build_parser().parse_args(argv[1:])
    assert args.device == "cuda" and args.draft, args


# What holds only on the machine a course was built on: its folders, its pip set-up, "this machine".
BUILD_MACHINE = re.compile(r"(/opt/|/root/|/etc/|/work/|/tmp/|\.pyenv|find-links|pip\.conf|this machine|"
                           r"course's (faster |slower )?[\w-]* ?machine)", re.I)


def test_readme_speaks_of_no_build_machine():
    """A newcomer's README: no local path, pip configuration or "this machine" in its prose (program output, which
    speaks of the machine it runs on, is left alone); that detail lives on the maintainers' page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    found = sorted({m.group(0) for m in BUILD_MACHINE.finditer(prose)})
    assert not found, f"the README speaks of the machine it was built on: {found}"


def test_readme_first_screen():
    """The first sections are what a newcomer needs, in order: what speclab is, the two commands (Python 3.10 to
    3.13, and the CPU-only path), what the demo prints, where to go next."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    heads = re.findall(r"^#{2,3} (.*)$", text, re.M)
    assert heads[:3] == ["Two commands", "What the main job prints", "Where to go next"], heads[:4]
    two = text.split("## Two commands", 1)[1].split("### ", 1)[0]
    assert "3.10, 3.11, 3.12 or 3.13" in two and "download.pytorch.org/whl/cpu" in two, two


def test_chapter_table_matches_the_notebooks():
    "Each chapter's README row is its notebook's title and one-line description (the module docstring too)."
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {m[0]: m[1:] for m in re.findall(r"^\| (\w+) \| ([^|]+) \| ([^|]+) \| `([\w.]+)` \|$", text, re.M)}
    nbs = sorted((ROOT / "nbs").glob("[0-9]*.ipynb"))
    assert len(rows) == len(nbs) >= 12, sorted(rows)
    for nb in nbs:
        cells = ["".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]]
        head = next(c for c in cells if c.startswith("# "))
        quote = [line for line in head.splitlines() if line.startswith(">")]
        assert len(quote) == 1, f"{nb.name}: the description must be one line (Quarto keeps only the first)"
        module = re.search(r"#\|\s*default_exp\s+(\S+)", "\n".join(cells)).group(1)
        want = (head.splitlines()[0][2:], quote[0][2:], f"speclab.{module}")
        assert tuple(x.strip() for x in rows[nb.stem.split("_")[0]]) == want, nb.name
        doc = (ROOT / "speclab" / f"{module}.py").read_text(encoding="utf-8").splitlines()[0]
        assert doc == f'"""{want[1]}"""' and len(doc) < 120, doc
