"""Regenerate a lab's student/ and autograder/ folders from its master notebook (every lab's assign.py runs this).

    python labs/08_acceptance/assign.py              # otter assign, then make the output deterministic
    python labs/08_acceptance/assign.py --execute    # first re-run the master to refresh its test cells' outputs
    python labs/09_audit/assign.py --out DIR         # write DIR/student and DIR/autograder instead (used by the tests)

otter assign (otter-grader 7.0.0, the `instructor` extra) reads each test's expected output from the output the
master holds in that test cell, so the master is committed with outputs in its test cells only; `--execute`
refreshes them (it runs the whole lab: Lab 08's sweep takes a few minutes). The master's config turns off everything
that needs a network, LaTeX or a clock (no PDF, no Gradescope zip, no export cell, no test run), and this script
then rewrites what otter leaves random: the ids of the cells it adds (init and check cells) become hashes of their
neighbours, so a rerun gives no diff.
"""
import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUTPUTS = ("student", "autograder")


def test_cell_indices(nb) -> set:
    "Indices of the code cells between `# BEGIN TESTS` and `# END TESTS` raw cells (their outputs are the expected values)."
    inside, idx = False, set()
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"]).strip().upper()
        if c["cell_type"] == "raw" and src.startswith("# BEGIN TESTS"): inside = True
        elif c["cell_type"] == "raw" and src.startswith("# END TESTS"): inside = False
        elif inside and c["cell_type"] == "code": idx.add(i)
    return idx


def _plain(output):
    "Keep only what a doctest compares: stream text and the text/plain repr (no counters, no images)."
    if output["output_type"] == "stream": return {"name": output["name"], "output_type": "stream", "text": output["text"]}
    if output["output_type"] in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
        return {"data": {"text/plain": output["data"]["text/plain"]}, "execution_count": None, "metadata": {},
                "output_type": "execute_result"}
    if output["output_type"] == "error": raise RuntimeError(f"a test cell raised: {output['ename']}: {output['evalue']}")
    return None


def normalise_master(nb):
    "Outputs only in test cells (text only), no execution counts, no timing or widget metadata, no Python version."
    tests = test_cell_indices(nb)
    nb["metadata"] = {"kernelspec": nb["metadata"].get("kernelspec", {}), "language_info": {"name": "python"}}
    for i, c in enumerate(nb["cells"]):
        c["metadata"].pop("execution", None)
        if c["cell_type"] != "code": continue
        c["execution_count"] = None
        c["outputs"] = [o for o in map(_plain, c["outputs"]) if o is not None] if i in tests else []
    return nb


def write_nb(nb, path: Path):
    "nbformat's own layout (indent 1, sorted keys, trailing newline), so Jupyter and nbdev_clean leave it alone."
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def execute_master(master: Path, timeout=1800):
    "Run the master top to bottom in a Jupyter kernel (working directory: the lab folder), then normalise it."
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(master, as_version=4)
    resources = {"metadata": {"path": str(master.parent)}}
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=resources).execute()
    write_nb(normalise_master(json.loads(nbformat.writes(nb))), master)


def stable_ids(nb, master_ids):
    "Cells otter adds get random ids; give each a hash of the previous cell's id and its own source instead."
    prev = "start"
    for c in nb["cells"]:
        if c.get("id") not in master_ids:
            c["id"] = hashlib.sha1(f"{prev}\n{''.join(c['source'])}".encode()).hexdigest()[:8]
        prev = c["id"]
    return nb


def assign(master_path: Path, out: Path):
    "otter assign the master into a scratch folder, make it deterministic, then replace out/student and out/autograder."
    master = json.loads(master_path.read_text(encoding="utf-8"))
    master_ids = {c.get("id") for c in master["cells"]}
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "result"
        r = subprocess.run([sys.executable, "-m", "otter", "assign", str(master_path), str(res)],
                           capture_output=True, text=True, cwd=master_path.parent)
        if r.returncode != 0: sys.exit(f"otter assign failed:\n{r.stdout}\n{r.stderr}")
        for nb_path in res.glob("*/*.ipynb"):
            nb = stable_ids(json.loads(nb_path.read_text(encoding="utf-8")), master_ids)
            if nb_path.parent.name == "student":
                for c in nb["cells"]:
                    if c["cell_type"] == "code": c["outputs"], c["execution_count"] = [], None
            write_nb(nb, nb_path)
        out.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            if (out / name).exists(): shutil.rmtree(out / name)
            shutil.copytree(res / name, out / name)
    return [out / name for name in OUTPUTS]


def main(master: Path, argv=None):
    "The command line of a lab's assign.py, for its master notebook `master`."
    about = f"Regenerate {master.parent.name}/student and autograder from {master.name}."
    ap = argparse.ArgumentParser(description=about)
    ap.add_argument("--execute", action="store_true", help="re-run the master first (refreshes the expected outputs)")
    ap.add_argument("--out", type=Path, default=master.parent,
                    help="where student/ and autograder/ go (default: the lab folder)")
    a = ap.parse_args(argv)
    if a.execute: execute_master(master)
    for d in assign(master, a.out.resolve()):
        print(f"wrote {d}: " + ", ".join(sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())))


if __name__ == "__main__":
    sys.exit("run a lab's own assign.py, e.g. python labs/08_acceptance/assign.py")
