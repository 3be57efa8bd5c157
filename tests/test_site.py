"""The course website, built offline by README's build line (tools/build_site.py), served by its serve line,
and checked page by page in headless Chromium.

Builds the site once into a temporary folder, serves it on localhost, and visits every page with Debian's
`chromium` (driven by the `playwright` package through the DevTools protocol; playwright's own browsers are not
used). Every request that leaves localhost is blocked and counted as an error, so a CDN reference fails the test.
Screenshots of the index, a chapter with math and a plot, the API reference and the lab pages are written to a
folder printed by the test (SPECLAB_SITE_SHOTS=DIR chooses it).
"""
import html
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import readme_blocks

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SHOTS = {"index": "index", "roofline": "chapter_math_plot", "api": "api_reference", "proof": "show_doc_entries",
         "lab08": "lab", "lab08_student": "lab_student_notebook"}

# How long a page may take to go network-idle after its math is typeset (favicon, fonts, images). Idle, a page settles
# within a second or two; one CI run on a loaded 2-core machine missed playwright's default of 30 s.
IDLE_TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser test of the website skipped: /usr/bin/chromium is absent (apt-get install -y chromium)"),
    pytest.mark.xdist_group("site")]   # one worker builds the site and drives one browser


def website_commands() -> tuple[str, str]:
    "README's two website lines (build, serve), with this test's interpreter standing in for `.venv/bin/python`."
    lines = [line.replace(".venv/bin/python", sys.executable) for sec, lang, code in
             readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
             if sec == "## The website" and lang == "sh" for line in code.splitlines() if line.strip()]
    assert len(lines) == 2, f"README's '## The website' should show a build and a serve line: {lines}"
    return lines[0], lines[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(folder, site.json) of a fresh offline build by README's build line, into its own `_docs` and `_proc`.

    The working directory is a temporary folder holding only those two, so README's serve line (`-d _docs`)
    serves this build."""
    for mod in ("sphinx", "myst_nb", "furo", "playwright"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("site")
    out = tmp / "_docs"
    build, _ = website_commands()
    cmd = shlex.split(build.replace("tools/build_site.py", str(ROOT / "tools" / "build_site.py")))
    cmd += ["--offline", "--out", str(out), "--proc", str(tmp / "_proc")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"build failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    return out, json.loads((out / "site.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def server(site):
    "README's serve line, run next to the built `_docs` on a free port (0 for README's 8000); yields its base URL."
    _, serve = website_commands()
    assert re.search(r"\b8000$", serve), serve
    cmd = shlex.split(re.sub(r"\b8000$", "0", serve))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=site[0].parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        first = proc.stdout.readline()
        m = re.search(r"port (\d+)", first)
        assert m, f"README's serve line did not start a server: {first!r} (exit {proc.poll()})"
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
        base = f"http://127.0.0.1:{m.group(1)}/"
        with urllib.request.urlopen(base + "index.html", timeout=10) as resp:
            assert resp.status == 200
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# Runs in the page once MathJax is done: what a reader sees, reduced to what the tests check.
PAGE_REPORT = r"""() => {
  const art = document.querySelector('article') || document.body;
  const prose = art.cloneNode(true);
  prose.querySelectorAll('pre, code, mjx-container, script, style, .highlight').forEach(e => e.remove());
  const codeCells = [...art.querySelectorAll('.cell_input pre, div.highlight pre')].map(e => e.textContent);
  return {
    title: document.title,
    images: [...document.images].map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    sidebar: [...document.querySelectorAll('.sidebar-tree a.reference')].map(
                 a => ({href: a.getAttribute('href'), text: a.textContent.trim()})),
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('.math mjx-container').length,
    mathErrors: [...document.querySelectorAll('mjx-merror')].map(e => e.textContent),
    prose: prose.textContent,
    code: codeCells,
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  };
}"""


@pytest.fixture(scope="module")
def shots_dir(tmp_path_factory):
    d = Path(os.environ["SPECLAB_SITE_SHOTS"]) if os.environ.get("SPECLAB_SITE_SHOTS") else \
        tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def visits(site, server, shots_dir, tmp_path_factory):
    "Visit every page of the site in Chromium: {page: report}, console errors and blocked requests included."
    from playwright.sync_api import sync_playwright

    out, _ = site
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    reports = {}
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=[f for f in FLAGS if f != "--headless"], viewport={"width": 1280, "height": 1000},
            service_workers="block")
        try:
            page = ctx.new_page()
            events: list[str] = []
            page.on("console", lambda m: events.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "assert") else None)
            page.on("pageerror", lambda e: events.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: events.append(f"request failed: {r.url} ({r.failure})"))
            inflight: set[str] = set()                      # what a page that never goes idle is waiting for
            page.on("request", lambda r: inflight.add(r.url))
            page.on("requestfinished", lambda r: inflight.discard(r.url))
            page.on("requestfailed", lambda r: inflight.discard(r.url))
            page.on("response", lambda r: events.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

            def route(r):
                if r.request.url.startswith(server):
                    return r.continue_()
                events.append(f"blocked request off the site: {r.request.url}")
                return r.abort()

            page.route("**/*", route)
            for name in pages:
                events.clear()
                page.goto(server + name, wait_until="load")
                page.wait_for_function(
                    "() => document.querySelectorAll('.math').length === "
                    "document.querySelectorAll('.math mjx-container').length", timeout=60_000)
                wait_idle(page, name, inflight)      # the favicon and fonts too, before the next page
                rep = page.evaluate(PAGE_REPORT)
                rep["events"] = list(events)
                reports[name] = rep
                stem = name[:-5]
                if stem in SHOTS:
                    # a plot and the math above it (roofline), the show_doc entries (proof), else the top
                    sel, above = {"roofline": (".cell_output img", 560), "proof": ("#accepted_mass", 40)}.get(
                        stem, (None, 0))
                    top = page.evaluate("s => { const e = s && document.querySelector(s); "
                                        "return e ? e.getBoundingClientRect().top + scrollY : 0; }", sel)
                    y = max(0, top - above)
                    page.screenshot(path=str(shots_dir / f"{SHOTS[stem]}.png"), full_page=True,
                                    clip={"x": 0, "y": y, "width": 1280, "height": 1000})
        finally:
            ctx.close()
    print(f"\nscreenshots of the website: {shots_dir}")
    return reports


def wait_idle(page, name: str, inflight: set[str]) -> None:
    "Wait until the page's network is idle, or fail naming the requests still in flight."
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_load_state("networkidle", timeout=IDLE_TIMEOUT_MS)
    except PlaywrightTimeout:
        pytest.fail(f"{name}: the network was not idle after {IDLE_TIMEOUT_MS / 1000:.0f} s; "
                    f"requests in flight: {sorted(inflight) or 'none'}")


def _fail(problems: dict) -> str:
    return "\n".join(f"{page}: {p}" for page, ps in problems.items() for p in ps[:8])


def test_site_has_every_page(site):
    out, meta = site
    chapters = meta["chapters"]
    assert len(chapters) >= 10, chapters
    labs = [p for lab in meta["labs"] for p in (lab, f"{lab}_student")]
    assert {"lab08", "lab09"} <= set(meta["labs"]), meta["labs"]
    want = ["index", *chapters, *labs, "api", "benchmarks"]
    assert not [p for p in want if not (out / f"{p}.html").exists()], sorted(p.name for p in out.glob("*.html"))
    assert (out / ".nojekyll").exists() and (out / "search.html").exists() and (out / "searchindex.js").exists()
    assert (out / "_static" / "mathjax" / "tex-chtml.js").exists()


ANSWER = re.compile(r"\A#\|\s*code-fold:\s*true\s*\n#\s*Answer")     # labs/release.py's form of an answer cell


def test_the_site_leaves_the_answers_out(site):
    """The site is the student's side: no exercise's answer cell (`#| code-fold: true`, then `# Answer`) is on a page,
    while the exercises themselves are."""
    out, meta = site
    answers, shown, exercises = 0, [], 0
    for doc, nb_file in meta["notebooks"].items():
        page = html.unescape(re.sub(r"<[^>]+>", "", (out / f"{doc}.html").read_text(encoding="utf-8")))
        for cell in json.loads((ROOT / "nbs" / nb_file).read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and ANSWER.match(source):
                answers += 1
                first = source.splitlines()[1].strip()
                shown += [f"{doc}: {first[:80]}"] if first in page else []
        exercises += "Exercises" in page
    assert answers >= 20 and exercises >= 10, (answers, exercises)
    assert not shown, shown


STREAM_BLOCK = re.compile(r'<div class="output stream[^"]*">\s*<div class="highlight[^"]*">\s*<pre>(.*?)</pre>', re.S)


def notebook_streams(path: Path) -> set[str]:
    "Every code cell's stream outputs, consecutive chunks of one stream joined exactly as printed."
    blocks = set()
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        text, name = "", None
        for o in cell.get("outputs", []) + [{}]:
            if o.get("output_type") == "stream" and o.get("name") == name:
                text += "".join(o["text"])
                continue
            if text:
                blocks.add(text.strip("\n"))
            text, name = ("".join(o["text"]), o["name"]) if o.get("output_type") == "stream" else ("", None)
    return blocks


def test_streams_are_shown_as_printed(site):
    """Each streamed output on a chapter's page is the notebook's text as printed: consecutive chunks joined, not one
    line per chunk (a notebook that streams tokens saves dozens of chunks). The index page's demo must be among them."""
    out, meta = site
    bad, matched = {}, {}
    for doc, nb_file in meta["notebooks"].items():
        page = (out / f"{doc}.html").read_text(encoding="utf-8")
        shown = [html.unescape(re.sub(r"<[^>]+>", "", b)).strip("\n") for b in STREAM_BLOCK.findall(page)]
        printed = notebook_streams(ROOT / "nbs" / nb_file)
        bad[doc] = [b[:200] for b in shown if b not in printed]
        matched[doc] = len(shown) - len(bad[doc])
    assert not any(bad.values()), {d: b for d, b in bad.items() if b}
    assert matched["index"] >= 1, "the index page shows no streamed output"


def test_no_cdn(site):
    "Every script, style sheet, font and image loads from the site itself."
    out, _ = site
    bad = {}
    for f in out.rglob("*.html"):
        text = f.read_text(encoding="utf-8")
        hits = re.findall(r'<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)="((?:https?:)?//[^"]+)"', text)
        hits += re.findall(r"@import\s+url\(['\"]?((?:https?:)?//[^)'\"]+)", text)
        if hits:
            bad[f.name] = hits
    for f in out.rglob("*.css"):
        hits = re.findall(r"url\(['\"]?((?:https?:)?//[^)'\"]+)", f.read_text(encoding="utf-8", errors="replace"))
        if hits:
            bad[f.name] = hits
    assert not bad, bad


def test_no_console_errors_and_nothing_off_the_site(visits):
    problems = {p: r["events"] for p, r in visits.items() if r["events"]}
    assert not problems, _fail(problems)


def test_every_image_loads(visits):
    problems = {p: [i["src"] for i in r["images"] if not i["ok"]] for p, r in visits.items()}
    problems = {p: v for p, v in problems.items() if v}
    assert not problems, _fail(problems)
    assert sum(len(r["images"]) for r in visits.values()) >= 10, "the chapters' saved plots are missing"


def test_internal_links_resolve(visits, server):
    "Every link to the site answers 200, and a link to an anchor finds an element with that id."
    ids = {server + p: set(r["ids"]) for p, r in visits.items()}
    status, problems = {}, {}
    for p, r in visits.items():
        for href in set(r["links"]):
            if not href.startswith(server):
                continue
            url, _, frag = href.partition("#")
            if url not in status:
                try:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        status[url] = resp.status
                except urllib.error.HTTPError as e:
                    status[url] = e.code
            if status[url] != 200:
                problems.setdefault(p, []).append(f"{href}: HTTP {status[url]}")
            elif frag and url.endswith(".html"):
                target = ids.get(url if not url.endswith("/") else url + "index.html")
                if target is not None and urllib.parse.unquote(frag) not in target:
                    problems.setdefault(p, []).append(f"{href}: no element with id {frag!r}")
    assert not problems, _fail(problems)


def test_repository_links_name_real_files(visits, settings):
    """A link the site cannot serve points into the repository on GitHub; the file it names must exist here (a link
    resolved from the wrong folder, such as the home page's from nbs/ instead of the root, names nothing)."""
    prefix = settings["git_url"].rstrip("/") + "/blob/main/"
    problems = {}
    for p, r in visits.items():
        for href in set(r["links"]):
            if href.startswith(prefix):
                path = urllib.parse.unquote(href[len(prefix):].partition("#")[0])
                if not (ROOT / path).exists():
                    problems.setdefault(p, []).append(f"{href}: no {path} in the repository")
    assert not problems, _fail(problems)


def test_math_is_typeset(visits):
    problems = {}
    for p, r in visits.items():
        if r["typeset"] != r["math"]:
            problems.setdefault(p, []).append(f"{r['math'] - r['typeset']} of {r['math']} formulas not typeset")
        if r["mathErrors"]:
            problems.setdefault(p, []).append(f"TeX errors: {r['mathErrors'][:5]}")
        raw = re.findall(r"\$\$.+?\$\$|(?<![\\\w$])\$[^$\s][^$\n]{0,200}?(?<!\s)\$(?![\w$])", r["prose"], flags=re.S)
        if raw:
            problems.setdefault(p, []).append(f"raw TeX left in the text: {raw[:5]}")
    assert not problems, _fail(problems)
    assert sum(r["typeset"] for r in visits.values()) > 100
    assert visits["proof.html"]["typeset"] > 20 and visits["roofline.html"]["typeset"] > 20


def test_sidebar_lists_every_chapter(visits, site):
    _, meta = site
    want = {"index", *meta["chapters"], *(p for lab in meta["labs"] for p in (lab, f"{lab}_student")), "api",
            "benchmarks"}
    problems = {}
    for p, r in visits.items():
        here = p[:-5]  # Furo links the current page as "#"
        listed = {here if a["href"].startswith("#") else re.sub(r"\.html(#.*)?$", "", a["href"]).split("/")[-1]
                  for a in r["sidebar"]}
        listed |= {"index"}  # the site title links home; the root page is not repeated in the tree
        if want - listed:
            problems[p] = [f"sidebar lacks {sorted(want - listed)}"]
    assert not problems, _fail(problems)
    # sidebar.yml's order and sections
    first = visits["index.html"]["sidebar"]
    order = [re.sub(r"\.html.*$", "", a["href"]) for a in first]
    assert order[:len(meta["chapters"])] == meta["chapters"], order


def test_nothing_of_nbdev_leaks(visits):
    "No directive, Quarto attribute, front matter or show_doc call reaches a reader."
    problems = {}
    for p, r in visits.items():
        found = []
        for pat, what in [(r"\{target=", "Quarto link attributes"), (r"\bshow_doc\(", "a show_doc call"),
                          (r"^\s*output-file:|^\s*title:\s", "front matter"), (r"default_exp", "#| default_exp"),
                          (r"AUTOGENERATED! DO NOT EDIT", "nbdev's warning")]:
            if re.search(pat, r["prose"], flags=re.M):
                found.append(f"{what} in the text")
        for src in r["code"]:
            if re.search(r"^\s*#\|", src, flags=re.M):
                found.append(f"a #| directive in a code cell: {src[:80]!r}")
            if re.search(r"^\s*show_doc\(", src, flags=re.M):
                found.append(f"a show_doc cell: {src[:80]!r}")
            if re.search(r"^\s*#\|\s*export|nbdev_export\(\)", src, flags=re.M):
                found.append("an export cell")
        if found:
            problems[p] = found
    assert not problems, _fail(problems)


def test_api_reference_covers_every_public_name(visits, site):
    "Every public name of the library has a show_doc entry (its class's, for a method) that the API page links to."
    _, meta = site
    assert not meta["undocumented"], meta["undocumented"]
    api_links = {urllib.parse.urlsplit(h).path.split("/")[-1] + "#" + urllib.parse.urlsplit(h).fragment
                 for h in visits["api.html"]["links"] if "#" in h}
    missing = []
    for sym in meta["api"]:
        ids = set(visits.get(f"{sym['page']}.html", {}).get("ids", []))
        if sym["anchor"] in ids:
            ok = f"{sym['page']}.html#{sym['anchor']}" in api_links
        else:  # a method: documented with its class
            cls = sym["name"].rsplit(".", 1)[0].split(".")[-1].lower()
            ok = cls in ids and f"{sym['page']}.html#{cls}" in api_links
        if not ok:
            missing.append(sym["name"])
    assert not missing, missing
    # show_doc renders as a signature and a docstring, not as raw markdown
    proof = visits["proof.html"]
    assert any(src.lstrip().startswith("def spec_step(") for src in proof["code"]), proof["code"][:5]
    assert "One speculative step: draft" in proof["prose"]


@pytest.mark.parametrize("lab,notebook", [("lab08", "acceptance.ipynb"), ("lab09", "audit.ipynb")])
def test_lab_pages(visits, lab, notebook):
    page, student = visits[f"{lab}.html"], visits[f"{lab}_student.html"]
    assert "speclab grade" in " ".join(page["code"]) + page["prose"]  # how to grade
    assert "For students" in page["prose"] and "For instructors" in page["prose"]
    assert any("grader.check(" in c for c in student["code"]), student["code"][:5]
    assert any(h.endswith(notebook) for h in student["links"]), "no download link to the notebook"


def test_screenshots_written(visits, shots_dir):
    for name in SHOTS.values():
        f = shots_dir / f"{name}.png"
        assert f.exists() and f.stat().st_size > 10_000, f
