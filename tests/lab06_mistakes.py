"""Lab 06 (labs/06_kv, KV rollback): the planted mistakes the grading must catch, and correct answers written
differently that it must pass. tests/test_lab06.py runs them through the lab's hidden tests;
benchmarks/grading/lab06_corpus.py measures how often fresh fuzzer seeds catch each one.

A mistake is one edit of the master's answer to one question: `(question, old, new)` replaces the text `old` of that
answer cell by `new`, so the rest of the solution stays the master's. The first mistakes of Questions 2 and 3 are
Chapter 6b's planted bugs (`BuggyPrefixManager`, `BuggyWindowManager`) and its exercise (`EagerTrimManager`), written
as a student would write them into the method itself.
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "06_kv"
MASTER = LAB / "autograder" / "kv_rollback.ipynb"

# the line of each question's answer cell that names it
ANSWER = {"q1": "def allocate_slots(", "q2": "def _cache_blocks(", "q3": "def commit(", "q4": "def cancel("}

_NEEDED = "    needed = -(-(r.num_tokens + num_lookahead_tokens) // self.block_size)"
_START = "    start = len(hits) * self.block_size if not r.block_ids else r.num_computed_tokens\n"
_END = "    end = min(num_tokens_to_cache // self.block_size, len(r.block_hashes))\n"
_OFFER = "        if r.block_ids[i] != FREED and r.block_hashes[i] not in self.cached:\n"
_PUBLISH = "    self._cache_blocks(r, num_tokens if num_cacheable is None else min(num_tokens, num_cacheable))\n"
_ROLLBACK = "    r.num_computed_tokens -= r.num_lookahead_tokens - num_accepted  # the rollback\n"
_RETURN_C = "    return r.num_computed_tokens\n"
_CANCEL_SET = "    r.num_lookahead_tokens = None\n    r.num_computed_tokens = num_computed_tokens\n"


def _trim(keep: str, forget_tail: bool = False) -> str:
    "Lines that release the blocks past `keep` blocks (and drop them from the table unless `forget_tail`)."
    lines = f"    keep = {keep}\n    for b in reversed(r.block_ids[keep:]):\n        self._release(b)\n"
    return lines if forget_tail else lines + "    del r.block_ids[keep:]\n"


BUGS = {
    # Question 1: the reservation
    "q1: lookahead off by one (the table covers num_tokens + kappa - 1)":
        ("q1", _NEEDED, "    needed = -(-(r.num_tokens + num_lookahead_tokens - 1) // self.block_size)"),
    "q1: blocks rounded down (floor instead of ceil)":
        ("q1", _NEEDED, "    needed = (r.num_tokens + num_lookahead_tokens) // self.block_size"),
    "q1: a request with blocks looks the prefix cache up again":
        ("q1", "    hits = self._lookup(r) if not r.block_ids else []\n", "    hits = self._lookup(r)\n"),
    "q1: no optimism (the lookahead is not counted as computed)":
        ("q1", "    r.num_computed_tokens = end  #", "    r.num_computed_tokens = r.num_tokens  #"),
    "q1: the lookahead is not recorded on the request":
        ("q1", "    r.num_lookahead_tokens = num_lookahead_tokens\n", ""),
    "q1: first position off by one":
        ("q1", "else r.num_computed_tokens\n", "else r.num_computed_tokens + 1\n"),
    "q1: prefix hits ignored after a preemption (positions from 0)":
        ("q1", _START, "    start = r.num_computed_tokens\n"),
    "q1: slot = block id + offset (block size forgotten)":
        ("q1", "[table[p // b] * b + p % b for p", "[table[p // b] + p % b for p"),
    # Question 2: publication
    "q2: every full block of the record published (BuggyPrefixManager)":
        ("q2", _END, "    end = len(r.block_hashes)\n"),
    "q2: the partial last block counted (ceil instead of floor)":
        ("q2", _END, "    end = min(-(-num_tokens_to_cache // self.block_size), len(r.block_hashes))\n"),
    "q2: the first writer loses its key":
        ("q2", _OFFER, "        if r.block_ids[i] != FREED:\n"),
    "q2: a block the window freed is published":
        ("q2", _OFFER, "        if r.block_hashes[i] not in self.cached:\n"),
    "q2: a published block is freed (handed to the cache)":
        ("q2", "            self._cache_block(r.block_ids[i], r.block_hashes[i])\n",
         "            self._cache_block(r.block_ids[i], r.block_hashes[i])\n"
         "            self._release(r.block_ids[i])\n"),
    # Question 3: the commit
    "q3: the emitted tokens published too (BuggyPrefixManager)":
        ("q3", _PUBLISH, "    self._cache_blocks(r, r.num_tokens if num_cacheable is None "
                         "else min(r.num_tokens, num_cacheable))\n"),
    "q3: the window slid at the optimistic length (BuggyWindowManager)":
        ("q3", _ROLLBACK, "    if self.sliding_window is not None:\n"
                          "        self._free_outside_window(r, r.num_computed_tokens)\n" + _ROLLBACK),
    "q3: only the rejected drafts rolled back, not the undrafted slots":
        ("q3", _ROLLBACK, "    r.num_computed_tokens -= num_drafted - num_accepted\n"),
    "q3: the bonus token not appended":
        ("q3", "    self._append_tokens(r, emitted_tokens)\n",
         "    self._append_tokens(r, emitted_tokens[:num_accepted])\n"),
    "q3: num_cacheable ignored (a lagging draft model's blocks published)":
        ("q3", _PUBLISH, "    self._cache_blocks(r, num_tokens)\n"),
    "q3: a stale commit taken as a step with no lookahead":
        ("q3", "    if r.num_lookahead_tokens is None:\n        raise ValueError(",
         "    if r.num_lookahead_tokens is None:\n        r.num_lookahead_tokens = 0\n"
         "    if False:\n        raise ValueError("),
    "q3: eager trim keeps ceil((c - 1) / b) blocks (EagerTrimManager)":
        ("q3", _RETURN_C, _trim("-(-(r.num_computed_tokens - 1) // self.block_size)") + _RETURN_C),
    "q3: rollback releases the tail's blocks but forgets the block table tail":
        ("q3", _RETURN_C, _trim("-(-r.num_computed_tokens // self.block_size)", forget_tail=True) + _RETURN_C),
    # Question 4: cancel
    "q4: the step stays in flight":
        ("q4", _CANCEL_SET, "    r.num_computed_tokens = num_computed_tokens\n"),
    "q4: only the lookahead given back":
        ("q4", _CANCEL_SET, "    r.num_computed_tokens -= r.num_lookahead_tokens\n    r.num_lookahead_tokens = None\n"),
    "q4: assumes the step held only its input token":
        ("q4", _CANCEL_SET, "    r.num_lookahead_tokens = None\n    r.num_computed_tokens = r.num_tokens - 1\n"),
    "q4: the failed step's blocks published":
        ("q4", _CANCEL_SET, _CANCEL_SET + "    self._cache_blocks(r, r.num_tokens)\n"),
    "q4: blocks released but left in the block table":
        ("q4", _CANCEL_SET, _CANCEL_SET + _trim("-(-num_computed_tokens // self.block_size)", forget_tail=True)),
    "q4: table trimmed to floor(c / b) blocks":
        ("q4", _CANCEL_SET, _CANCEL_SET + _trim("num_computed_tokens // self.block_size")),
    "q4: any count accepted":
        ("q4", "    if not 0 <= num_computed_tokens <= most:\n        raise", "    if False:\n        raise"),
    "q4: a cancel with nothing in flight accepted":
        ("q4", "    if r.num_lookahead_tokens is None:\n        raise", "    if False:\n        raise"),
}

# Correct answers written differently: other arithmetic, other loops, and a manager that gives back the blocks a
# rollback or a cancel leaves empty at once (Chapter 6b's fixed EagerTrimManager), so its block ids differ from the
# master's after a rollback.
CORRECT_TRIM = {
    "q1": '''
@patch
def _plan(self: KVManager, r: Request, num_lookahead_tokens: int) -> tuple[list[int], int]:
    if r.block_ids:
        return [], max(math.ceil((len(r.token_ids) + num_lookahead_tokens) / self.block_size) - len(r.block_ids), 0)
    hits = self._lookup(r)
    return hits, max(math.ceil((len(r.token_ids) + num_lookahead_tokens) / self.block_size) - len(hits), 0)


@patch
def allocate_slots(self: KVManager, req_id: Hashable, num_lookahead_tokens: int = 0) -> Step:
    r = self._get(req_id)
    self._check_lookahead(r, num_lookahead_tokens)
    hits, fresh = self._plan(r, num_lookahead_tokens)
    first = r.num_computed_tokens if r.block_ids else len(hits) * self.block_size
    if any(b == FREED for b in r.block_ids[first // self.block_size:]):
        raise ValueError(f"request {req_id!r}: position {first} lies in a freed block")
    self._grow(r, hits, fresh)
    last = len(r.token_ids) + num_lookahead_tokens
    positions, slots = [], []
    for p in range(first, last):
        block, offset = divmod(p, self.block_size)
        positions.append(p)
        slots.append(r.block_ids[block] * self.block_size + offset)
    r.num_computed_tokens, r.num_lookahead_tokens = last, num_lookahead_tokens
    return Step(positions, slots)
''',
    "q2": '''
@patch
def _cache_blocks(self: KVManager, r: Request, num_tokens_to_cache: int) -> None:
    full = min(num_tokens_to_cache // self.block_size, len(r.block_hashes))
    pairs = list(zip(r.block_ids, r.block_hashes))[r.num_cached_blocks:full]
    for block, key in pairs:
        if block == FREED or key in self.cached:
            continue
        self._cache_block(block, key)
    if full > r.num_cached_blocks:
        r.num_cached_blocks = full
''',
    "q3": '''
def _give_back_tail(manager, r):
    "Release the blocks past the computed positions' own blocks (private: no other request holds them)."
    keep = -(-r.num_computed_tokens // manager.block_size)
    for b in reversed(r.block_ids[keep:]):
        manager._release(b)
    del r.block_ids[keep:]


@patch
def commit(self: KVManager, req_id: Hashable, num_drafted: int, num_accepted: int, emitted_tokens: list[int],
           num_cacheable: int | None = None) -> int:
    r = self._get(req_id)
    lookahead = r.num_lookahead_tokens
    if lookahead is None:
        raise ValueError(f"no step in flight for {req_id!r}")
    self._check_commit(r, num_drafted, num_accepted, emitted_tokens)
    before = len(r.token_ids)
    rejected = lookahead - num_accepted
    r.num_lookahead_tokens = None
    r.num_computed_tokens = r.num_computed_tokens - rejected
    self._append_tokens(r, list(emitted_tokens))
    self._cache_blocks(r, before if num_cacheable is None else min(before, num_cacheable))
    if self.sliding_window is not None:
        self._free_outside_window(r, r.num_computed_tokens)
    _give_back_tail(self, r)
    return r.num_computed_tokens
''',
    "q4": '''
@patch
def cancel(self: KVManager, req_id: Hashable, num_computed_tokens: int) -> None:
    r = self._get(req_id)
    if r.num_lookahead_tokens is None:
        raise ValueError(f"nothing to cancel: request {req_id!r} has no step in flight")
    most = min(r.num_computed_tokens, len(r.token_ids) - 1)
    if type(num_computed_tokens) is not int or num_computed_tokens < 0 or num_computed_tokens > most:
        raise ValueError(f"num_computed_tokens must be an int in [0, {most}], got {num_computed_tokens!r}")
    r.num_computed_tokens, r.num_lookahead_tokens = num_computed_tokens, None
    keep = -(-num_computed_tokens // self.block_size)
    for b in reversed(r.block_ids[keep:]):
        self._release(b)
    del r.block_ids[keep:]
''',
}


def cells(path: Path = MASTER) -> list:
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def src(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def answer_index(nb_cells: list, question: str) -> int:
    "Index of the code cell that answers `question` (the one defining its method)."
    (i,) = [k for k, c in enumerate(nb_cells) if c["cell_type"] == "code" and ANSWER[question] in src(c)]
    return i


def with_answers(answers: dict, path: Path = MASTER) -> dict:
    "The autograder notebook (the master's solutions) with the answer cell of each question in `answers` replaced."
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for question, answer in answers.items():
        nb["cells"][answer_index(nb["cells"], question)]["source"] = answer
    return nb


def planted(bug: str, path: Path = MASTER) -> dict:
    "The autograder notebook with the one edit of `bug` in its question's answer (the edit must apply exactly once)."
    question, old, new = BUGS[bug]
    answer = src(cells(path)[answer_index(cells(path), question)])
    if answer.count(old) != 1:
        raise ValueError(f"{bug!r}: its text occurs {answer.count(old)} times in the {question} answer")
    return with_answers({question: answer.replace(old, new)}, path)
