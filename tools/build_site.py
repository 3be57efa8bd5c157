#!/usr/bin/env python
"""Build the course website into a static folder: `python tools/build_site.py [--out _docs]`.

Where Quarto is installed this runs nbdev's own `nbdev_docs` (driven by `nbs/_quarto.yml` and `nbs/sidebar.yml`).
Elsewhere (the default on a machine without Quarto, or with `--offline`) it renders offline, without any network:

1. nbdev's notebook processing, as `nbdev.serve.proc_nbs()` does it (same files, same cache, same
   `nbdev.processors.FilterDefaults`: export cells hidden, `show_doc` cells inserted and executed, directives
   applied), writing the processed notebooks to `_proc/`. One difference unless `--strict`: a cell that mixes
   imports with other code (nbdev's FAQ says not to; nbdev warns and then runs it outside its notebook, where it
   usually fails) is skipped with a warning instead of failing the build; a failing `show_doc` still fails it.
2. Each processed notebook becomes a page of a Sphinx + myst-nb site (`website/conf.py`, Furo theme, MathJax 3 from
   the sphinx-mathjax-offline package, Sphinx's own search): the front matter becomes the page title and lead,
   `#|` directives become myst-nb cell tags, `show_doc` outputs become headings with nbdev's anchors, and links to
   the doc host become relative links. Navigation comes from `nbs/sidebar.yml` and the title from settings.ini.
   The lab (labs/08_acceptance: README and student notebook), an API index and benchmarks/RESULTS.md are added.

Outputs saved in the notebooks are shown as saved; nothing is executed except what nbdev executes for `show_doc`.
The site is the student's side of the course: the exercises' answer cells (`#| code-fold: true`, then `# Answer`)
are left out, as the student release (labs/release.py) leaves them out.
The result is a static folder (any static server, or GitHub Pages) with no CDN: every script, style, font and
the math renderer load from the folder itself.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "website"  # Sphinx configuration, templates and static files of the offline renderer

# Extra pages added to the sidebar after the notebooks of nbs/sidebar.yml: each lab (labs/NN_name/README.md and its
# student notebook) and the benchmark results.
LABS_DIR = ROOT / "labs"
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"


# ---------------------------------------------------------------------------------------------------------------
# settings and sidebar
# ---------------------------------------------------------------------------------------------------------------
def settings() -> dict:
    cfg = ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return dict(cfg["DEFAULT"])


def doc_url(cfg: dict) -> str:
    "The URL nbdev's links point at (doc_host + doc_baseurl), with a trailing slash."
    return cfg.get("doc_host", "").rstrip("/") + "/" + cfg.get("doc_baseurl", "").strip("/") + "/"


def read_sidebar(path: Path) -> list[tuple[str | None, list[str]]]:
    """nbs/sidebar.yml as [(section title or None, [notebook file, ...])], in order.

    Accepts Quarto's forms: a bare path, `- href: path` / `- file: path`, and `- section: T` with `contents:`."""
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    contents = ((data.get("website") or {}).get("sidebar") or {}).get("contents") or []
    if isinstance(contents, dict):
        contents = [contents]
    out: list[tuple[str | None, list[str]]] = []

    def item_path(it):
        if isinstance(it, str):
            return it
        if isinstance(it, dict):
            return it.get("href") or it.get("file")
        return None

    def flatten(items):
        res = []
        for it in items or []:
            if isinstance(it, dict) and "section" in it:
                res += flatten(it.get("contents"))
            elif (p := item_path(it)):
                res.append(p)
        return res

    for it in contents:
        if isinstance(it, dict) and "section" in it:
            title = it["section"] if isinstance(it["section"], str) else str(it["section"])
            out.append((title, flatten(it.get("contents"))))
        elif (p := item_path(it)):
            if out and out[-1][0] is None:
                out[-1][1].append(p)
            else:
                out.append((None, [p]))
    return out


# ---------------------------------------------------------------------------------------------------------------
# step 1: nbdev's processing (what nbdev.serve.proc_nbs does, with a choice of FilterDefaults)
# ---------------------------------------------------------------------------------------------------------------
def _mixed_imports(source: str) -> bool:
    "True for a cell nbdev warns about: it contains an import *and* other statements (nbdev FAQ)."
    from nbdev.processors import _ast_contains

    try:
        trees = ast.parse(source).body
    except SyntaxError:
        return False
    return bool(_ast_contains(trees, (ast.Import, ast.ImportFrom)) and _ast_contains(trees, (ast.Expr, ast.Assign)))


def _tolerant_filter():
    "nbdev's FilterDefaults with exec_show_docs swapped for a version that skips mixed import cells."
    from nbdev import processors as P

    class exec_show_docs_tolerant(P.exec_show_docs):
        "Like nbdev's exec_show_docs, but mixed import cells are skipped and only show_doc failures are fatal."

        def __call__(self, cell):
            if not self.nb.has_docs_ or not hasattr(self, "k"):
                return
            fm = getattr(self.nb, "frontmatter_", {})
            if P.str2bool(fm.get("skip_showdoc", False)) or not P._do_eval(cell):
                return
            is_doc = bool(P._is_showdoc(cell))
            exported = bool(cell.directives_.keys() & {"export", "exports", "exporti", "exec_doc"})
            if not (is_doc or exported) and _mixed_imports(cell.source):
                warnings.warn(f"cell {cell.idx_} mixes "
                              "imports with other code; not executed for the docs (nbdev FAQ: put imports in a "
                              "cell of their own)")
                return
            self.k.cell(cell)
            if self.k.exc:
                exc, self.k.exc = self.k.exc, None
                if is_doc:
                    raise Exception(f"Error in cell {cell.idx_}:\n{cell.source}") from exc
                warnings.warn(f"cell {cell.idx_} failed while preparing show_doc ({exc!r}); continuing")

    class FilterTolerant(P.FilterDefaults):
        def base_procs(self):
            return [exec_show_docs_tolerant if p is P.exec_show_docs else p for p in super().base_procs()]

    return FilterTolerant


def _proc_one(job):
    "Worker (a fresh process, like nbdev's): process one notebook src into dst."
    src, dst, strict = job
    os.chdir(ROOT)
    os.environ["IN_TEST"] = "1"
    os.environ.setdefault("TRITON_INTERPRET", "1")  # docs only define kernels; no GPU needed to build them
    from execnb.nbio import read_nb, write_nb
    from nbdev.processors import FilterDefaults

    flt = FilterDefaults if strict else _tolerant_filter()
    main_mod = sys.modules["__main__"]  # IPython's shell (nbdev's CaptureShell) replaces it; this worker is reused
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nb = read_nb(src)
        try:
            flt()(nb)
        except Exception as e:  # name the notebook: nbdev's message only has the title
            cause = f" ({e.__cause__!r})" if e.__cause__ else ""
            raise RuntimeError(f"nbdev could not process {Path(src).name}: {e}{cause}") from None
        finally:
            sys.modules["__main__"] = main_mod
        write_nb(nb, dst)
    msgs = [str(w.message).splitlines()[0] for w in caught]
    mixed = [m.split()[1] for m in msgs if "mixes imports" in m]
    notes = [m for m in msgs if "failed while preparing" in m]
    if mixed:
        notes.insert(0, f"cells {', '.join(mixed)} mix imports with other code: not run for show_doc "
                        "(nbdev FAQ: imports in a cell of their own; nbdev_docs would fail on them)")
    return Path(src).name, notes


def process_notebooks(proc: Path, strict: bool = False, workers: int | None = None, force: bool = False) -> Path:
    "Write nbdev-processed notebooks of nbs/ to `proc` (cached by modification time, as proc_nbs does)."
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    os.chdir(ROOT)
    from nbdev.config import get_config
    from nbdev.doclinks import nbglob
    from nbdev import serve

    cfg = get_config()
    nbs = Path(cfg.nbs_path)
    files = nbglob(nbs, func=Path, file_glob="", file_re="")
    for extra in ("_quarto.yml", "_brand.yml"):
        if (nbs / extra).exists():
            files.append(nbs / extra)
    # like proc_nbs: settings.ini, nbdev or this script newer than the cache empties it
    chk = max(cfg.config_file.stat().st_mtime, Path(serve.__file__).stat().st_mtime, Path(__file__).stat().st_mtime)
    if force or (proc.exists() and proc.stat().st_mtime < chk):
        shutil.rmtree(proc)
    proc.mkdir(parents=True, exist_ok=True)
    mtime = proc.stat().st_mtime
    jobs = [j for f in files if (j := serve._proc_file(f, cache=proc, path=nbs, mtime=mtime))]
    jobs = [(str(s), str(d), strict) for s, d, _ in jobs]
    # sidebar.yml and friends are copied by _proc_file; notebooks go to workers
    if jobs:
        n = workers or min(len(jobs), os.cpu_count() or 1)
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
            for name, notes in ex.map(_proc_one, jobs):
                for note in notes:
                    print(f"  note: {name}: {note}", file=sys.stderr)
    proc.touch()
    return proc


# ---------------------------------------------------------------------------------------------------------------
# step 2: processed notebooks -> myst-nb pages
# ---------------------------------------------------------------------------------------------------------------
_re_directive = re.compile(r"^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$")
_re_attrs = re.compile(r'(\]\([^)\s]*\))\{[^}\n]*\}')            # [text](url){target="_blank" ...}
_re_heading = re.compile(r"^(#{1,6})\s+(.+?)\s*$", re.MULTILINE)


def quarto_id(text: str) -> str:
    "The id Quarto (pandoc) gives a heading, which nbdev's doc links use: `SpecEngine.run` -> `specengine.run`."
    t = re.sub(r"<[^>]+>|[`*\\]", "", text).strip().lower()
    t = re.sub(r"[^\w\s.\-]", "", t)
    return re.sub(r"\s+", "-", t)


class Linker:
    "Rewrites links to the doc host (nbdev's add_links) and to known repository files into site-relative links."

    def __init__(self, base: str, pages: dict[str, str], git_url: str, here: Path | None):
        self.base, self.pages, self.git_url, self.here = base, pages, git_url.rstrip("/"), here

    def __call__(self, md: str) -> str:
        md = _re_attrs.sub(r"\1", md)
        if self.base:
            md = re.sub(re.escape(self.base) + r"([\w\-./]*)(#[^)\s]*)?", self._host, md)
        if self.here is not None:  # relative links in a markdown file of the repository
            md = re.sub(r"\]\((?!\w+:|#|/)([^)\s#]+)(#[^)\s]*)?\)", self._rel, md)
        return md

    def _target(self, page: str, frag: str | None) -> str:
        return f"sitefrag:{page}{frag}" if frag else f"site:{page}"

    def _host(self, m):
        path, frag = m.group(1) or "index.html", m.group(2)
        return self._target(path, frag)

    def _rel(self, m):
        path, frag = m.group(1), m.group(2)
        target = (self.here / path).resolve()
        try:
            rel = target.relative_to(ROOT).as_posix()
        except ValueError:
            return m.group(0)
        if rel in self.pages:
            return "](" + self._target(self.pages[rel] + ".html", frag) + ")"
        return f"]({self.git_url}/blob/main/{rel}{frag or ''})"


def split_directives(src: str) -> tuple[dict, str]:
    "Leading `#|` lines of a code cell as {name: value}, and the source without any `#|` line."
    dirs, keep = {}, []
    for line in src.splitlines():
        m = _re_directive.match(line)
        if m:
            dirs[m.group(1).lower()] = m.group(2).strip().strip("'\"").lower()
        else:
            keep.append(line)
    return dirs, "\n".join(keep).strip("\n")


def showdoc_md(md: str, page: str = "", api: list | None = None) -> str:
    """nbdev's show_doc markdown as page markdown: the heading first (with the anchor nbdev links to), then the
    source link, the signature and the docstring; Quarto attributes and the leading rule dropped."""
    md = md.strip()
    if md.startswith("---"):
        md = md[3:].lstrip("\n")
    src = ""
    m = re.match(r"\[source\]\(([^)\s]+)\)(\{[^}\n]*\})?\s*", md)
    if m:
        src, md = m.group(1), md[m.end():]
    h = _re_heading.search(md)
    if not h:
        return md
    title = h.group(2)
    anchor = quarto_id(title)
    name_md = title if "`" in title else f"`{title}`"
    parts = [md[:h.start()].strip(), f'<span id="{anchor}" class="nbdev-anchor"></span>\n',
             f"{h.group(1)} {name_md}"]
    if src:
        parts.append(f'<p class="nbdev-source"><a href="{src}" target="_blank" rel="noopener">source</a></p>')
    rest = md[h.end():].strip()
    parts.append(rest)
    if api is not None:
        doc = re.sub(r"```.*?```", "", rest, flags=re.S).strip()
        first = doc.split("\n\n", 1)[0].strip() if doc else ""
        if first.startswith("*") and first.endswith("*") and not first.startswith("**"):
            first = first[1:-1]
        api.append({"name": re.sub(r"[`\\]", "", title), "anchor": anchor, "page": page,
                    "summary": first if not first.startswith("|") else ""})
    return "\n\n".join(p for p in parts if p) + "\n"


def output_markdown(cell) -> str | None:
    for o in cell.get("outputs", []):
        data = o.get("data") or {}
        if "text/markdown" in data:
            t = data["text/markdown"]
            return "".join(t) if isinstance(t, list) else t
    return None


def md_cell(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def front_matter(cells) -> tuple[dict, list]:
    "Pop nbdev's front matter raw cell (YAML between --- lines) and return it as a dict."
    import yaml

    if cells and cells[0]["cell_type"] == "raw":
        src = "".join(cells[0]["source"]).strip()
        if src.startswith("---"):
            body = src.strip("-\n")
            try:
                return yaml.safe_load(body) or {}, cells[1:]
            except yaml.YAMLError:
                pass
    return {}, cells


def full_description(nb_path: Path | None, short: str) -> str:
    """nbdev keeps only the first line of a `> description` that spans several lines; take all of it from the
    notebook itself when the front matter's is its beginning."""
    if not nb_path or not nb_path.exists():
        return short
    cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
    first = next((c for c in cells if c["cell_type"] == "markdown"), None)
    if first is None:
        return short
    src = "".join(first["source"])
    quote = re.search(r"^>.*(?:\n>.*)*", src, re.M)
    if not quote:
        return short
    full = " ".join(l[1:].strip() for l in quote.group(0).splitlines())
    return full if full.startswith(short.strip()) else short


def convert_nb(nb: dict, link: Linker, title_fallback: str = "", source: Path | None = None,
               page: str = "", api: list | None = None) -> tuple[dict, dict]:
    "A processed notebook as a myst-nb page; returns (notebook, front matter)."
    fm, cells = front_matter(list(nb["cells"]))
    if fm.get("description"):
        fm["description"] = full_description(source, str(fm["description"]))
    out = []
    title = fm.get("title") or title_fallback
    if title:
        head = f"# {title}\n"
        if fm.get("description"):
            head += "\n{.lead}\n" + link(str(fm["description"]).strip()) + "\n"
        out.append(md_cell(head))
    for c in cells:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "raw":
            continue
        if c["cell_type"] == "markdown":
            if src.lstrip().startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"):
                continue
            out.append(md_cell(link(src)))
            continue
        dirs, body = split_directives(src)
        if dirs.get("include") == "false":
            continue
        asis = dirs.get("output") == "asis"
        if asis or re.match(r"^show_doc\(", body):
            md = output_markdown(c)
            if md is not None:
                out.append(md_cell(link(showdoc_md(md, page, api) if "show_doc" in body else md)))
            continue
        tags = list((c.get("metadata") or {}).get("tags") or [])
        if dirs.get("echo") == "false":
            tags.append("remove-input")
        if dirs.get("output") == "false":
            tags.append("remove-output")
        if "code-fold" in dirs and body.lstrip().startswith("# Answer"):
            continue        # an exercise's answer: the site is the student's side (labs/release.py strips them too)
        if "code-fold" in dirs:
            tags.append("hide-input")
        if not body.strip() and not c.get("outputs"):
            continue
        if not body.strip():
            tags.append("remove-input")
        meta = {k: v for k, v in (c.get("metadata") or {}).items() if k in ("tags",)}
        if tags:
            meta["tags"] = sorted(set(tags))
        outputs = []
        for o in c.get("outputs", []):
            o = dict(o)
            if o.get("output_type") == "error":  # a traceback saved in a chapter still shows, without ANSI codes
                o["traceback"] = [re.sub(r"\x1b\[[0-9;]*m", "", t) for t in o.get("traceback", [])]
            outputs.append(o)
        out.append({"cell_type": "code", "metadata": meta, "source": body, "outputs": join_streams(outputs),
                    "execution_count": c.get("execution_count")})
    nb = dict(nb)
    nb["cells"] = out
    nb.setdefault("metadata", {})
    nb["metadata"].pop("widgets", None)
    nb["nbformat"], nb["nbformat_minor"] = 4, max(nb.get("nbformat_minor", 5), 5) if nb.get("nbformat") == 4 else 5
    for i, c in enumerate(nb["cells"]):
        c["id"] = f"c{i}"
    return nb, fm


def join_streams(outputs: list[dict]) -> list[dict]:
    """Consecutive chunks of one stream joined into one output, exactly as printed (as tools/make_readme.py does).

    A notebook that streams text token by token saves dozens of chunks; myst-nb's own merging (nb_merge_streams)
    strips each chunk and adds a line break, cutting lines mid-expression, so website/conf.py leaves it off."""
    joined: list[dict] = []
    for o in outputs:
        last = joined[-1] if joined else None
        same = last is not None and last.get("output_type") == "stream" == o.get("output_type")
        if same and last.get("name") == o.get("name"):
            joined[-1] = {**last, "text": stream_text(last) + stream_text(o)}
        else:
            joined.append(o)
    return joined


def stream_text(output: dict) -> str:
    "A stream output's text (nbformat allows a string or a list of strings)."
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def labs() -> list[tuple[Path, str, Path]]:
    "(folder, page name, student notebook) of each lab: labs/NN_name/ with a README.md and one student/*.ipynb."
    found = []
    for lab_dir in sorted(p for p in LABS_DIR.glob("[0-9][0-9]_*") if (p / "README.md").exists()):
        notebooks = sorted((lab_dir / "student").glob("*.ipynb"))
        if len(notebooks) == 1:
            found.append((lab_dir, f"lab{lab_dir.name[:2]}", notebooks[0]))
    return found


def write_lab(src: Path, lab_dir: Path, doc: str, student_nb: Path, base: str, repo_pages: dict,
              cfg: dict) -> dict[str, str]:
    "Write a lab's two pages (its README, and its student notebook with a download link); return their titles."
    readme = lab_dir.joinpath("README.md").read_text(encoding="utf-8")
    (src / f"{doc}.md").write_text(Linker(base, repo_pages, cfg["git_url"], lab_dir)(readme), encoding="utf-8")
    title = re.search(r"^#\s+(.+)$", readme, re.M).group(1).strip()
    name = title.split(":")[0]                                      # "Lab 08"
    snb = json.loads(student_nb.read_text(encoding="utf-8"))
    cells = snb["cells"]
    first_md = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"), None)
    if first_md is not None:  # its title line becomes the lead of a page with a title of its own
        c = cells[first_md]
        c["source"] = re.sub(r"^#\s+(.+)$", r"{.lead}\n\1", "".join(c["source"]), count=1, flags=re.M)
        cells.insert(0, cells.pop(first_md))
    rel = student_nb.relative_to(ROOT).as_posix()
    download = f"{doc}_student_download"
    intro = (f"# {name}: the student notebook\n\n:::{{note}}\nThis is the notebook students get "
             f"(`{rel}`), as handed out: every answer is a `...` to replace, "
             "and each question ends in a `grader.check` cell that runs its public tests. How to work on it, and "
             f"how it is graded: [{name}](site:{doc}.html). "
             f"{{download}}`Download the notebook <{download}/{student_nb.name}>`.\n:::\n")
    cells.insert(0, md_cell(intro))
    (src / download).mkdir(exist_ok=True)
    shutil.copy2(student_nb, src / download / student_nb.name)
    student, _ = convert_nb(snb, Linker(base, repo_pages, cfg["git_url"], student_nb.parent))
    (src / f"{doc}_student.ipynb").write_text(json.dumps(student, indent=1), encoding="utf-8")
    return {doc: title, f"{doc}_student": f"{name}: the student notebook"}


def page_name(fm: dict, nb_file: str) -> str:
    "The page's name: nbdev's output-file (so nbdev's own links keep working), else the notebook's stem."
    of = fm.get("output-file")
    if of:
        return Path(of).with_suffix("").as_posix()
    stem = Path(nb_file).stem
    return re.sub(r"^\d+[a-z]?_", "", stem) if stem != "index" else "index"


def toctree(caption: str | None, docs: list[str]) -> str:
    cap = f":caption: {caption}\n" if caption else ""
    return "```{toctree}\n:hidden:\n" + cap + "\n" + "\n".join(docs) + "\n```\n"


def public_symbols(cfg: dict) -> dict[str, list[tuple[str, str, str]]]:
    "nbdev's index of the library: {module: [(name, page, anchor)]} for every public name (no `_` part)."
    import importlib

    modidx = importlib.import_module(f"{cfg['lib_name']}._modidx").d
    out = {}
    for mod, syms in sorted(modidx["syms"].items()):
        rows = []
        for sym, (url, _src) in syms.items():
            short = sym[len(mod) + 1:] if sym.startswith(mod + ".") else sym
            if any(part.startswith("_") for part in short.split(".")):
                continue
            page, _, frag = url.partition("#")
            rows.append((short, Path(page).stem, frag))
        if rows:
            out[mod] = sorted(rows, key=lambda r: r[0].lower())
    return out


def _docline(mod: str, name: str) -> str:
    "The first paragraph of the docstring of `mod.name` (imports the module), as one line of markdown."
    import importlib
    import inspect

    try:
        obj = importlib.import_module(mod)
        for part in name.split("."):
            obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
        obj = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
        doc = inspect.getdoc(obj) or ""
    except Exception:
        return ""
    if not doc or doc == inspect.getdoc(type(obj)):
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def api_page(cfg: dict, pages_of_module: dict[str, dict], api: list[dict]) -> tuple[str, list[str]]:
    "An index of every public name, by module, linking to its show_doc entry; returns (markdown, undocumented)."
    docs = {(r["page"], r["anchor"]): r for r in api}
    lines = ["# API reference\n",
             "{.lead}\nEvery public function and class of the library, by module. Each name links to its "
             "documentation (signature, docstring, link to the source) in the chapter that builds it.\n"]
    missing = []
    for mod, rows in public_symbols(cfg).items():
        page = pages_of_module.get(mod)
        lines.append(f"## `{mod}`\n")
        if page:
            lines.append(f"Built in [{page['title']}](site:{page['doc']}.html).\n")
        lines.append("| name | what it does |\n|---|---|")
        for short, target_page, frag in rows:
            rec = docs.get((target_page, frag))
            if rec is None and "." in short:  # a method: nbdev documents its class; link there, with its docstring
                cls = docs.get((target_page, quarto_id(short.rsplit(".", 1)[0])))
                if cls is not None:
                    rec = {"anchor": cls["anchor"], "summary": _docline(mod, short)}
            if rec is None:
                missing.append(f"{mod}.{short}")
                lines.append(f"| `{short}` | {_docline(mod, short) or '(no documentation on the site)'} |")
                continue
            summary = rec["summary"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| [`{short}`](sitefrag:{target_page}.html#{rec['anchor']}) | {summary} |")
        lines.append("")
    return "\n".join(lines), missing


_re_sitefrag = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(sitefrag:([\w\-./]+?)\.html#([^)\s]+)\)")


def relink(src: Path, api: list[dict]) -> None:
    """nbdev links every backticked name of the library to its anchor, private helpers and methods included, but
    only documented names have one: point a method at its class's entry, and unlink a name that has none."""
    anchors = {(r["page"], r["anchor"]) for r in api}

    def fix(m):
        text, page, frag = m.groups()
        if (page, frag) in anchors:
            return m.group(0)
        parts = frag.split(".")
        for i in range(len(parts) - 1, 0, -1):
            if (page, ".".join(parts[:i])) in anchors:
                return f"[{text}](sitefrag:{page}.html#{'.'.join(parts[:i])})"
        return text

    for f in src.glob("*.ipynb"):
        nb = json.loads(f.read_text(encoding="utf-8"))
        for c in nb["cells"]:
            if c["cell_type"] == "markdown":
                c["source"] = _re_sitefrag.sub(fix, "".join(c["source"]))
        f.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    for f in src.glob("*.md"):
        f.write_text(_re_sitefrag.sub(fix, f.read_text(encoding="utf-8")), encoding="utf-8")


def write_sources(src: Path, proc: Path, cfg: dict) -> dict:
    "Write the Sphinx source tree into `src`; returns {docname: title} in sidebar order (for the tests)."
    nbs = ROOT / cfg.get("nbs_path", "nbs")
    sidebar = read_sidebar(nbs / "sidebar.yml")
    listed = [f for _, fs in sidebar for f in fs]
    # every processed notebook: name its page first (links between pages need every name)
    fms, docs = {}, {}
    for f in sorted(proc.glob("*.ipynb")):
        nb = json.loads(f.read_text(encoding="utf-8"))
        fm, _ = front_matter(list(nb["cells"]))
        fms[f.name] = fm
        docs[f.name] = page_name(fm, f.name)
    missing = [f for f in listed if f not in docs]
    if missing:
        raise SystemExit(f"error: nbs/sidebar.yml lists {missing}, which nbdev did not process (see {proc})")
    repo_pages = {f"{cfg.get('nbs_path', 'nbs')}/{k}": v for k, v in docs.items()}
    repo_pages.update({"benchmarks/RESULTS.md": "benchmarks", "README.md": "index"})
    for lab_dir, doc, student_nb in labs():
        repo_pages[f"labs/{lab_dir.name}/README.md"] = doc
        repo_pages[f"labs/{lab_dir.name}/student/{student_nb.name}"] = f"{doc}_student"
    base = doc_url(cfg)
    titles, api = {}, []
    for f, doc in docs.items():
        nb = json.loads((proc / f).read_text(encoding="utf-8"))
        here = ROOT if doc == "index" else nbs     # the home page is the README's source: its links start at the root
        page, fm = convert_nb(nb, Linker(base, repo_pages, cfg["git_url"], here), source=nbs / f, page=doc, api=api)
        titles[doc] = fm.get("title") or doc
        if doc == "index":
            continue  # written below, with the navigation
        (src / f"{doc}.ipynb").write_text(json.dumps(page, indent=1), encoding="utf-8")

    # the labs: README (students and instructors, grading) and the student notebook of each
    for lab_dir, doc, student_nb in labs():
        titles.update(write_lab(src, lab_dir, doc, student_nb, base, repo_pages, cfg))

    # benchmark results
    res_link = Linker(base, repo_pages, cfg["git_url"], RESULTS_MD.parent)
    (src / "benchmarks.md").write_text(res_link(RESULTS_MD.read_text(encoding="utf-8")), encoding="utf-8")
    titles["benchmarks"] = "Benchmark results"

    # API index: module -> chapter page that exports it (from `#| default_exp` in nbs/)
    pages_of_module = {}
    for f, doc in docs.items():
        raw = (nbs / f).read_text(encoding="utf-8") if (nbs / f).exists() else ""
        m = re.search(r"#\|\s*default_exp\s+([\w.]+)", raw)
        if m:
            pages_of_module[f"{cfg['lib_name']}.{m.group(1)}"] = {"doc": doc, "title": titles[doc]}
    api_md, undocumented = api_page(cfg, pages_of_module, api)
    if undocumented:
        print(f"  note: public names without a show_doc entry: {undocumented}", file=sys.stderr)
    (src / "api.md").write_text(api_md, encoding="utf-8")
    titles["api"] = "API reference"

    # navigation: nbs/sidebar.yml, then the lab and the reference pages this renderer adds
    nav: list[tuple[str | None, list[str]]] = []
    for sec, files in sidebar:
        ds = [docs[f] for f in files if docs[f] != "index"]
        if ds:
            nav.append((sec, ds))
    nav.append(("Labs", [d for _, doc, _ in labs() for d in (doc, f"{doc}_student")]))
    ref = next((n for n in nav if n[0] == "Reference"), None)
    if ref is None:
        nav.append(ref := ("Reference", []))
    ref[1].extend(["api", "benchmarks"])
    unlisted = [d for f, d in docs.items() if f not in listed and d != "index"]
    if unlisted:
        print(f"  note: not in nbs/sidebar.yml, so not in the navigation: {unlisted}", file=sys.stderr)
        nav.append(("Other", unlisted))

    index_nb = json.loads((proc / next(f for f, d in docs.items() if d == "index")).read_text(encoding="utf-8"))
    page, fm = convert_nb(index_nb, Linker(base, repo_pages, cfg["git_url"], ROOT), source=nbs / "index.ipynb",
                          page="index", api=api)
    page["cells"].append(md_cell("\n".join(toctree(sec, ds) for sec, ds in nav)))
    for i, c in enumerate(page["cells"]):
        c["id"] = f"c{i}"
    (src / "index.ipynb").write_text(json.dumps(page, indent=1), encoding="utf-8")
    titles["index"] = fm.get("title") or cfg["title"]
    relink(src, api)
    order = ["index"] + [d for _, ds in nav for d in ds]
    return {"pages": {d: titles.get(d, d) for d in order},
            "sections": [{"caption": sec, "pages": ds} for sec, ds in nav],
            "chapters": [docs[f] for f in listed if docs[f] != "index"],
            "notebooks": {d: f for f, d in docs.items()},
            "labs": [doc for _, doc, _ in labs()],
            "api": [{"name": f"{m}.{n}", "page": p, "anchor": a} for m, rows in public_symbols(cfg).items()
                    for n, p, a in rows],
            "undocumented": undocumented}


def build_offline(out: Path, proc: Path, strict: bool, force: bool, jobs: int | None) -> dict:
    cfg = settings()
    t0 = time.time()
    print(f"[1/3] nbdev processing of {cfg.get('nbs_path', 'nbs')}/ into {proc}", flush=True)
    process_notebooks(proc, strict=strict, workers=jobs, force=force)
    t1 = time.time()
    print(f"      {t1 - t0:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="speclab-site-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        print("[2/3] pages from the processed notebooks, the lab and the benchmark results", flush=True)
        meta = write_sources(src, proc, cfg)
        print(f"[3/3] Sphinx + myst-nb into {out}", flush=True)
        html = Path(tmp) / "html"  # myst-nb writes jupyter_execute/ beside the output folder: keep it in tmp
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", str(jobs or "auto"), "-c", str(SITE),
               "-d", str(Path(tmp) / "doctrees"), "-D", f"project={cfg['title']}",
               "-D", f"html_title={cfg['title']}", "-D", f"copyright={cfg.get('copyright', '')}",
               str(src), str(html)]
        env = dict(os.environ, SPECLAB_SITE_REPO=cfg.get("git_url", ""))
        r = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
        log = (r.stdout + r.stderr).strip()
        if log:
            print("\n".join("  sphinx: " + l for l in log.splitlines()), file=sys.stderr)
        if r.returncode:
            raise SystemExit(f"error: sphinx-build failed (exit {r.returncode})")
        shutil.rmtree(html / "_sources", ignore_errors=True)  # html_copy_source = False leaves it empty
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(html), str(out))
    (out / "site.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    print(f"      {time.time() - t1:.1f} s; site in {out} ({time.time() - t0:.1f} s in all)", flush=True)
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=None, help="output folder (default: settings.ini doc_path, i.e. _docs)")
    p.add_argument("--proc", default=None, help="nbdev's processed notebooks (default: _proc, nbdev's cache)")
    p.add_argument("--offline", action="store_true", help="use the offline renderer even where Quarto exists")
    p.add_argument("--strict", action="store_true", help="nbdev's processing exactly: a failing cell fails")
    p.add_argument("--force", action="store_true", help="ignore the _proc cache")
    p.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: all cores)")
    a = p.parse_args(argv)
    cfg = settings()
    out = Path(a.out or (ROOT / cfg.get("doc_path", "_docs"))).resolve()
    if shutil.which("quarto") and not a.offline:
        print("quarto found: running nbdev_docs", flush=True)
        subprocess.run([str(Path(sys.executable).parent / "nbdev_docs")], cwd=ROOT, check=True)
        built = ROOT / cfg.get("doc_path", "_docs")
        if built.resolve() != out:
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(built, out)
        return 0
    proc = Path(a.proc).resolve() if a.proc else ROOT / "_proc"
    build_offline(out, proc, a.strict, a.force, a.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
