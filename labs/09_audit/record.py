"""Record Lab 09's samples: the shipped tiny pair served twice in-process (speculation on and off), some pairs with a
planted fault (speclab.testing.plant_fault), each cell's completions counted per server.

    python labs/09_audit/record.py   # writes speclab/data/lab09/pair_*.json and labs/09_audit/hidden_recordings.json
    python labs/09_audit/record.py --only pair_5,hidden_4   # (re-)records these; every other recording is kept

The pair files ship with speclab (`speclab.audit.lab09_recording`, so a notebook finds them wherever it is graded);
hidden_recordings.json is what the hidden tests embed (assign.py reads it), from
prompts the student never sees. Which pair is broken, and how, is in KEY (never shipped in the student folder: this
script is not copied by otter assign).

pair_5 on and hidden_4 on come from the audit's fault corpus (benchmarks/audit/fault_corpus.md), each chosen because
its exact bias on the recorded cells (the corpus's `two_token_law`: two-token laws, one draft in the first step) is
above the lab's own bound, q4's TV 0.276 at 300 completions per server and cell (0.271 for the two hidden cells):
bonus_from_draft TV 0.575 / 0.456 / 0.411 on CELLS and 0.497 / 0.435 on HIDDEN_CELLS at max_tokens 2; argmax_always
0.889 / 0.716 / 0.699. The corpus's other new faults stay below it on these cells (expand_misaligned 0.154,
top_p_after_residual 0.181 at most) and are left out. With max_tokens 1 the scheduler drafts nothing (its lookahead
is max_tokens - 1), and argmax_always recorded there on HIDDEN_CELLS came out exact: hidden_4 records two tokens.
`--only` records some pairs and keeps the others' counts (the older pairs' answers depend on them).
"""
import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from speclab.audit import Cell, Collected, Sender, collect, AuditPlan
from speclab.testing import audit_pair

LAB = Path(__file__).resolve().parent
DATA = LAB.parent.parent / "speclab" / "data" / "lab09"
CELLS = [("with open(", "t1.0", {"temperature": 1.0}), ("with open(", "t0.8,p0.6", {"temperature": 0.8, "top_p": 0.6}),
         ("raise ValueError(", "t0.8,p0.6", {"temperature": 0.8, "top_p": 0.6})]
HIDDEN_CELLS = [("In 1492,", "t0.8,p0.6", {"temperature": 0.8, "top_p": 0.6}),
                ("    return self.", "t0.8,p0.6", {"temperature": 0.8, "top_p": 0.6})]
KEY = {"pair_1": None, "pair_2": "top_p_target_only", "pair_3": None, "pair_4": "recovered_from_p",
       "pair_5": "bonus_from_draft", "pair_6": None, "pair_7": "argmax_always"}
HIDDEN_KEY = {"hidden_1": "top_p_target_only", "hidden_2": None, "hidden_3": "recovered_from_p",
              "hidden_4": "bonus_from_draft"}
HIDDEN_TOKENS = {"hidden_4": 2}   # the hidden cells' max_tokens (default 1): bonus_from_draft moves the second token


def record(urls, cells, n, max_tokens, seed):
    "Counts of each completion text per server and cell: [{prompt, setting, audited: {...}, reference: {...}}]."
    plan = AuditPlan(0.01, 10 ** 6, 16, [Cell("laws", p, s, f, max_tokens, n, 16) for p, s, f in cells], [], 0, [],
                     1, seed)
    col = Collected()

    class Quiet:
        def update(self, k): pass
    asyncio.run(collect(urls, plan, None, Sender(10 ** 6), col, Quiet()))
    return [dict(prompt=c.prompt, setting=c.setting, fields=c.fields, max_tokens=max_tokens, n=n,
                 **{s: dict(Counter(col.outcomes[i, s]).most_common()) for s in ("audited", "reference")})
            for i, c in enumerate(plan.cells)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated names of KEY / HIDDEN_KEY to record (default: all)")
    only = set(filter(None, p.parse_args(argv).only.split(","))) or set(KEY) | set(HIDDEN_KEY)
    if only - set(KEY) - set(HIDDEN_KEY):
        raise SystemExit(f"unknown recordings: {sorted(only - set(KEY) - set(HIDDEN_KEY))}")
    torch.set_num_threads(1)
    path = LAB / "hidden_recordings.json"
    hidden = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    with audit_pair(max_num_seqs=16, seed=7) as (url, reference_url, set_fault):
        urls = {"audited": url, "reference": reference_url}
        for k, (name, fault) in enumerate(KEY.items()):
            if name not in only:
                continue
            set_fault(fault)
            cells = record(urls, CELLS, 300, 2, k)
            DATA.mkdir(parents=True, exist_ok=True)
            (DATA / f"{name}.json").write_text(json.dumps({"pair": name, "cells": cells}, indent=1,
                                                                  ensure_ascii=False) + "\n")
            print(name, fault, file=sys.stderr)
        for k, (name, fault) in enumerate(HIDDEN_KEY.items()):
            if name not in only:
                continue
            set_fault(fault)
            hidden[name] = {"pair": name, "cells": record(urls, HIDDEN_CELLS, 300, HIDDEN_TOKENS.get(name, 1), 10 + k)}
            print(name, fault, file=sys.stderr)
        set_fault(None)
    hidden = {name: hidden[name] for name in HIDDEN_KEY if name in hidden}
    path.write_text(json.dumps(hidden, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
