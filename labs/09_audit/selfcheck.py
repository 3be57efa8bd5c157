"""Run a Lab 09 notebook and its OK-format tests in a fresh Python process; report each test case.

    python labs/09_audit/selfcheck.py labs/09_audit/student/audit.ipynb
    python labs/09_audit/selfcheck.py NOTEBOOK --tests DIR --only q2,q5 --json

The runner is the same for every lab: labs/lab_selfcheck.py (what it runs, and how, is described there).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab_selfcheck import check_notebook, check_notebooks, load_tests, main, run_case, summary  # noqa: E402,F401

if __name__ == "__main__":
    main()
