"""Run a Lab 06 notebook and its OK-format tests in a fresh Python process; report each test case.

    python labs/06_kv/selfcheck.py labs/06_kv/student/kv_rollback.ipynb
    python labs/06_kv/selfcheck.py NOTEBOOK --tests DIR --only q1,q3 --json

The runner is the same for every lab: labs/lab_selfcheck.py (what it runs, and how, is described there).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab_selfcheck import check_notebook, check_notebooks, load_tests, main, run_case, summary  # noqa: E402,F401

if __name__ == "__main__":
    main()
