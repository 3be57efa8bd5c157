"""Regenerate Lab 06's student/ and autograder/ folders from the master notebook kv_rollback.ipynb.

    python labs/06_kv/assign.py              # otter assign, then make the output deterministic
    python labs/06_kv/assign.py --execute    # first re-run the master to refresh its test cells' outputs
    python labs/06_kv/assign.py --out DIR    # write DIR/student and DIR/autograder instead (used by the tests)

The work is the same for every lab: labs/lab_assign.py (what otter assign needs, and what is made deterministic).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab_assign import assign, execute_master, main, normalise_master, test_cell_indices  # noqa: E402,F401

MASTER = Path(__file__).resolve().parent / "kv_rollback.ipynb"

if __name__ == "__main__":
    main(MASTER)
