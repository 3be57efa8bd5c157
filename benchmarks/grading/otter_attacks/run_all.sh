#!/usr/bin/env bash
# Regenerate the tiny assignment + attack submissions and grade each with `otter run` (offline).
# Prints one line per case:  case, score/max, works(yes/no)   (details in runs/<case>/)
set -u
ROOT=${OTTER_ATTACKS_DIR:-/tmp/otter_attacks}   # work dir (venv, runs); the scripts live beside this file
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$ROOT/assignment" "$ROOT/attacks"
cp "$HERE/assignment/make_master.py" "$ROOT/assignment/" && cp "$HERE/attacks/make_attacks.py" "$ROOT/attacks/"
export OTTER_ATTACKS_DIR=$ROOT
cd "$ROOT"
LOOP_TIMEOUT=${LOOP_TIMEOUT:-120}

# 0. venv (created once; no torch)
if [ ! -x venv/bin/otter ]; then
  python3 -m venv venv
  venv/bin/pip install -q otter-grader==7.0.0 ipykernel nbconvert
fi
PY=$ROOT/venv/bin/python; OTTER=$ROOT/venv/bin/otter

# 1. assignment: master -> otter assign -> autograder.zip
( cd assignment && $PY make_master.py >/dev/null && rm -rf dist &&
  $OTTER assign tiny.ipynb dist >assign.log 2>&1 && cp dist/autograder/tiny-autograder_*.zip autograder.zip ) \
  || { echo "otter assign failed, see assignment/assign.log"; exit 1; }

# 2. attack submissions
$PY attacks/make_attacks.py >/dev/null || exit 1

rm -rf runs markers; mkdir -p runs markers
echo "otter-grader $($PY -c 'import otter; print(otter.__version__)'), python $($PY -c 'import sys; print(sys.version.split()[0])')"
echo "case, score/max (results.json), stdout 'Total Score', works"

grade() {   # grade <case> <submission path> <timeout>
  local c=$1 sub=$2 to=$3
  mkdir -p runs/$c
  local t0=$(date +%s.%N)
  ls -d /tmp/tmp*/autograder /tmp/tmp*.pkl 2>/dev/null > runs/$c/.pre_dirs.txt
  ( cd runs/$c && timeout "$to" $OTTER run -a $ROOT/assignment/autograder.zip "$sub" >stdout.txt 2>&1; echo $? > rc.txt )
  local t1=$(date +%s.%N); echo "$t1" > runs/$c/end_time.txt
  echo "$t1 - $t0" | bc > runs/$c/elapsed.txt
  # grading dirs (with hidden tests) that otter left behind in /tmp for this case
  ls -d /tmp/tmp*/autograder /tmp/tmp*.pkl 2>/dev/null | grep -vxF -f runs/$c/.pre_dirs.txt > runs/$c/leftover_grading_dirs.txt
}

for sub in assignment/dist/autograder/tiny.ipynb:baseline_solution assignment/dist/student/tiny.ipynb:baseline_student \
           attacks/1a_patch_run_doctest.ipynb attacks/1b_rewrite_test_files.ipynb \
           attacks/2a_results_pickle.ipynb attacks/2b_logging_socket_pickle.ipynb attacks/2c_otter_log_zip.zip \
           attacks/3_detached_rewriter.ipynb attacks/4a_hidden_tests_readable.ipynb \
           attacks/4b_exception_plain.ipynb attacks/4b_exception_exfil.ipynb attacks/4c_infinite_loop.ipynb; do
  path=${sub%%:*}; c=${sub#*:}; [ "$c" = "$sub" ] && c=$(basename "${path%.*}")
  to=120; [ "$c" = 4c_infinite_loop ] && to=$LOOP_TIMEOUT
  grade "$c" "$ROOT/$path" "$to"
  [ "$c" = 3_detached_rewriter ] && for i in $(seq 50); do [ -f markers/3_detached.txt ] && break; sleep 0.1; done
  if [ "$c" = 4c_infinite_loop ]; then   # is the kernel orphaned / still alive after otter is killed?
    kp=$(sed -n 's/kernel pid=\([0-9]*\).*/\1/p' markers/4c_kernel_pid.txt 2>/dev/null)
    { echo "kernel_pid=$kp"; sleep 1; echo "alive_1s_after: $(ps -o pid=,ppid=,pcpu= -p "$kp" 2>/dev/null || echo no)";
      sleep 4; echo "alive_5s_after: $(ps -o pid=,ppid=,pcpu= -p "$kp" 2>/dev/null || echo no)"; } > runs/$c/orphan.txt
    [ -n "$kp" ] && kill "$kp" 2>/dev/null   # only the kernel this script started
    while read -r left; do case "$left" in *.pkl) rm -f "$left";; *) rm -rf "$(dirname "$left")";; esac; done \
      < runs/$c/leftover_grading_dirs.txt   # clean up what this (killed) run left in /tmp
  fi
  $PY - "$c" <<'PYEOF'
import json, os, re, sys
c = sys.argv[1]; d = f"runs/{c}"; M = "markers"
rd = lambda p: open(p).read() if os.path.exists(p) else ""
out, rc = rd(f"{d}/stdout.txt"), rd(f"{d}/rc.txt").strip()
m = re.search(r"Total Score: ([\d.]+) / ([\d.]+)", out)
stdout_score = f"{float(m[1]):g}/{float(m[2]):g}" if m else f"none(rc={rc})"
score = "none"; full = False; visible = ""
if os.path.exists(f"{d}/results.json"):
    r = json.load(open(f"{d}/results.json"))
    got = sum(t.get("score", 0) for t in r["tests"] if "max_score" in t)
    mx = sum(t["max_score"] for t in r["tests"] if "max_score" in t)
    got = r.get("score", got)
    score, full = f"{got:g}/{mx:g}", (mx > 0 and got == mx)
    visible = "\n".join(t.get("output", "") for t in r["tests"] if t.get("visibility") == "visible")
def parent_rce(tag):
    p = rd(f"{M}/{tag}_parent_rce.txt")
    return "otter run" in p and (p.startswith("pid=%s " % rd(f"{M}/{tag}_kernel_pid.txt").split("ppid=")[-1]) if tag != "2c" else True)
works = {
    "baseline_solution": "n/a (expect full)" + ("" if full else " UNEXPECTED"),
    "baseline_student": "n/a (expect 0)" + ("" if score.startswith("0/") else " UNEXPECTED"),
    "1a_patch_run_doctest": full, "1b_rewrite_test_files": full,
    "2a_results_pickle": full and parent_rce("2a"), "2b_logging_socket_pickle": full and parent_rce("2b"),
    "2c_otter_log_zip": full and parent_rce("2c"),
    "3_detached_rewriter": full and os.path.exists(f"{M}/3_detached.txt"),
    "4a_hidden_tests_readable": "HIDDEN_Q1_SECRET" in rd(f"{M}/4a_hidden_tests.txt"),
    "4b_exception_plain": "HIDDEN_Q1_SECRET" in visible, "4b_exception_exfil": "HIDDEN_Q1_SECRET" in visible,
    "4c_infinite_loop": rc in ("124", "137"),
}[c]
note = {"4a_hidden_tests_readable": "(yes = hidden test source readable)",
        "4b_exception_plain": "(yes = hidden source in VISIBLE feedback)",
        "4b_exception_exfil": "(yes = hidden source in VISIBLE feedback)",
        "4c_infinite_loop": f"(yes = hung until timeout; rc={rc}, {float(rd(f'{d}/elapsed.txt') or 0):.0f}s)"}.get(c, "")
if isinstance(works, bool): works = "yes" if works else "no"
print(f"{c}, {score}, stdout={stdout_score}, works={works} {note}".rstrip())
PYEOF
done
