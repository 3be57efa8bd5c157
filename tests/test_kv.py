"""Fuzz tests of speclab.kv's BlockManager with the KV lab's tools (speclab.kvlab): random workloads over several
requests (add with shared prompt prefixes; steps with any lookahead, drafted and accepted counts; steps left in flight
while other requests step, finish or get preempted, and their stale commits), with every invariant checked after every
operation. The production BlockManager must never violate one; the planted subclasses (BuggyPrefixManager,
BuggyWindowManager) must be caught by the same checks. The lab's own seeded fuzzer (`fuzz_invariants`, `shrink_ops`)
is tested on the lab's bugs and two planted here. The step protocol (`blocks_needed`, `allocate_slots` with a
lookahead, `commit`), the prefix-cache switch and an engine-style scheduler loop (admit only if the step fits, preempt
when it does not) are tested next; last, the production structures by behaviour: chained block keys, a lookup linear
in the prompt, the LRU free queue and the constant work of its operations."""
import dataclasses
import random
import re
from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, strategies as st

import speclab.kv as kv_module
from speclab.kv import FREED, ROOT_HASH, BlockManager, FreeBlockQueue, PagedKV, Request, block_hash, hash_chain
from speclab.kvlab import (BuggyPrefixManager, BuggyWindowManager, add_prompt, check_invariants, committed_attention,
                           fuzz_invariants, manager_state, random_ops, replay, scratch_attention, shrink_ops, slot,
                           toy_forward, toy_kv, toy_step, tree_path_moves, window)

PREFIX = list(range(1, 13))  # prompts start with a piece of this, so the prefix cache gets hits
EXAMPLES = 200

op = st.tuples(st.sampled_from(["add", "step", "step", "step", "step", "allocate", "finish", "preempt"]),
               st.integers(0, 3),                             # which live request
               st.integers(0, 4),                             # kappa: drafts proposed
               st.integers(0, 4),                             # accepted (clipped to kappa)
               st.sampled_from([5, 8, 9, 12]) | st.integers(0, len(PREFIX)),  # shared prefix length of a new prompt
               st.lists(st.integers(0, 5), max_size=4),       # prompt suffix / draft tokens
               st.integers(0, 5),                             # recovered or bonus token
               st.none() | st.integers(0, 6))                 # an allocate's lookahead; a step's undrafted slots
ops_strategy = st.lists(op, min_size=10, max_size=40)


def try_allocate(m, rid, num_lookahead):
    """allocate_slots: the Step, or None after checking that the refusal was for room, predicted by blocks_needed, and
    changed nothing."""
    need, free, held, before = m.blocks_needed(rid, num_lookahead), m.free_blocks, m.block_table(rid), manager_state(m)
    try:
        s = m.allocate_slots(rid, num_lookahead)
    except ValueError as e:
        assert "out of KV blocks" in str(e) and need > free, (e, need, free)
        assert manager_state(m) == before
        return None
    assert need <= free and m.free_blocks == free - need  # blocks_needed is exactly what allocate_slots took
    r = m.requests[rid]
    assert r.num_lookahead_tokens == num_lookahead and r.num_computed_tokens == r.num_tokens + num_lookahead
    assert len(r.block_ids) * m.block_size >= r.num_tokens + num_lookahead
    assert s.positions == list(range(s.positions[0], r.num_computed_tokens))
    assert s.slot_mapping == [slot(m, rid, p) for p in s.positions]
    assert not held or r.block_ids[:len(held)] == held    # a table only grows
    return s


def run(ops, manager=BlockManager, sliding_window=None, num_blocks=24, block_size=4, enable_prefix_caching=True):
    "Play `ops`; return the first list of violations found (empty if none). Asserts what must hold for any manager."
    m = manager(num_blocks, block_size, sliding_window, enable_prefix_caching=enable_prefix_caching)
    kv = PagedKV(num_blocks, block_size)
    history, q = {}, torch.linspace(-1, 1, 16, dtype=torch.float64).view(2, 8)  # history: the engine's token record
    in_flight = {}  # req_id -> the Step of an allocation left in flight
    for n, (kind, i, kappa, acc, plen, toks, nxt, extra) in enumerate(ops):
        live, stepped = sorted(m.requests), None
        if kind == "add" or not live:
            prompt = PREFIX[:plen] + toks or [nxt]
            hit = add_prompt(m, n, prompt).num_computed_tokens
            assert hit % block_size == 0 and hit <= len(prompt) - 1
            assert enable_prefix_caching or hit == 0
            history[n] = list(prompt)
        else:
            rid = live[i % len(live)]
            r = m.requests[rid]
            drafts, acc = (toks + [5, 4, 3, 2])[:kappa], min(acc, kappa)
            if kind in ("step", "allocate") and rid in in_flight:  # the output of the step it left in flight
                s = in_flight.pop(rid)
                if r.num_lookahead_tokens is None:  # preempted since: a stale output is refused, nothing changes
                    before = manager_state(m)
                    with pytest.raises(ValueError, match="no step in flight"):
                        m.commit(rid, len(drafts), acc, drafts[:acc] + [nxt])
                    assert manager_state(m) == before
                else:
                    drafts = drafts[:r.num_lookahead_tokens]
                    acc = min(acc, len(drafts))
                    stepped = _commit(m, kv, history, rid, s, drafts, acc, nxt)
            elif kind == "allocate":  # a step left in flight while other requests move
                s = try_allocate(m, rid, extra or 0)
                if s is not None:
                    in_flight[rid] = s
                    with pytest.raises(ValueError, match="in flight"):
                        m.allocate_slots(rid, 0)  # one step at a time
            elif kind == "step":
                s = try_allocate(m, rid, kappa + (extra or 0))
                if s is not None:
                    stepped = _commit(m, kv, history, rid, s, drafts, acc, nxt)
            elif kind == "finish":
                m.finish(rid)
                in_flight.pop(rid, None)
            else:
                m.preempt(rid)  # its allocation, if any, stays in in_flight: its output arrives stale
        assert enable_prefix_caching or (m.cached == {} and max(m.ref_cnt) <= 1)  # off: nothing cached or shared
        bad = check_invariants(m, kv, history)  # includes: each record's count and hash chain match its history
        if bad: return bad
        if stepped is not None:  # attention after rollback == from scratch on the accepted prefix
            tokens, pos = history[stepped], window(m, stepped)
            assert torch.equal(committed_attention(m, kv, stepped, q),
                               scratch_attention([tokens[p] for p in pos], q, lo=pos[0] if pos else 0))
    return []


def _commit(m, kv, history, rid, s, drafts, acc, nxt):
    "Write the step's toy K/V (context and drafts) and commit it; a commit takes no block. Returns rid."
    free, r = m.free_blocks, m.requests[rid]
    lookahead, computed = r.num_lookahead_tokens, r.num_computed_tokens
    toy_forward(m, kv, rid, s, drafts)
    emitted = drafts[:acc] + [nxt]
    assert m.commit(rid, len(drafts), acc, emitted) == computed - (lookahead - acc)  # the rollback
    history[rid] += emitted
    assert m.free_blocks >= free and r.num_lookahead_tokens is None  # a sliding window may free, nothing allocates
    return rid


@pytest.mark.parametrize("sliding_window", [None, 6])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_speclab_keeps_every_invariant(ops, sliding_window):
    assert run(ops, sliding_window=sliding_window) == []


@pytest.mark.parametrize("manager, sliding_window", [(BlockManager, None), (BlockManager, 5),
                                                     (BuggyPrefixManager, None)])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_prefix_caching_off(ops, manager, sliding_window):
    "With the cache off nothing is hashed, looked up, cached or shared, so even BuggyPrefixManager is safe."
    assert run(ops, manager, sliding_window, num_blocks=12, block_size=2, enable_prefix_caching=False) == []


@pytest.mark.parametrize("sliding_window", [None, 5])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_small_blocks_and_tight_pool(ops, sliding_window):
    "Blocks of 2 in a pool of 12: refused steps (state must be unchanged), more evictions, more sharing."
    assert run(ops, sliding_window=sliding_window, num_blocks=12, block_size=2) == []


@pytest.mark.parametrize("manager, sliding_window, expected", [
    (BuggyPrefixManager, None, "prefix cache"),
    (BuggyWindowManager, 6, "stale read"),
])
def test_planted_bugs_are_caught(manager, sliding_window, expected):
    "The same workload generator and the same checks find each planted subclass's hazard."
    ops = find(ops_strategy, lambda ops: bool(run(ops, manager, sliding_window)),
               settings=settings(max_examples=2000, database=None, deadline=None, phases=[Phase.generate]))
    assert any(e.startswith(expected) for e in run(ops, manager, sliding_window)), run(ops, manager, sliding_window)
    assert run(ops, BlockManager, sliding_window) == []  # the same ops are fine under the production class


def test_prefix_hit_serves_only_written_content():
    """A recovered token completes a block whose last slot holds the rejected draft's K/V: speclab never publishes it;
    BuggyPrefixManager serves it to the next request with that prefix."""
    for manager, expect_hit in ((BlockManager, 4), (BuggyPrefixManager, 8)):
        m, kv, a = manager(8, 4), PagedKV(8, 4), [1, 2, 3, 4, 5]
        add_prompt(m, "a", a)
        toy_step(m, kv, "a", a, [], 0, 6); toy_step(m, kv, "a", a, [7, 8], 1, 9)   # 8 rejected, 9 at position 7
        m.finish("a")
        prompt = [1, 2, 3, 4, 5, 6, 7, 9, 0]
        hit = add_prompt(m, "b", prompt).num_computed_tokens
        assert hit == expect_hit
        k, _ = kv.read(m.block_table("b"), range(hit))
        assert torch.equal(k, toy_kv(prompt[:hit], range(hit))[0]) == (manager is BlockManager)
        if manager is BuggyPrefixManager:
            assert torch.equal(k[7], toy_kv([8], [7])[0][0])  # the row b reads at position 7 is the draft 8's


def test_window_boundary_comes_from_processed_tokens():
    for manager in (BlockManager, BuggyWindowManager):
        m, kv, a = manager(16, 2, sliding_window=4), PagedKV(16, 2), [1, 2, 3, 4, 5, 6]
        add_prompt(m, "a", a)
        toy_step(m, kv, "a", a, [], 0, 7); toy_step(m, kv, "a", a, [8, 9, 10, 11], 0, 12)
        needed_blocks = {p // 2 for p in window(m, "a")}
        assert all(m.block_table("a")[b] != FREED for b in needed_blocks) == (manager is BlockManager)


def _manager():
    m, kv = BlockManager(6, 4), PagedKV(6, 4)
    add_prompt(m, "a", range(6)); toy_step(m, kv, "a", list(range(6)), [], 0, 6)
    m.allocate_slots("a", 2); add_prompt(m, "b", [9])
    return m


@pytest.mark.parametrize("call, message", [
    (lambda m: m.commit("a", 2, 3, [7, 8, 1, 2]), "num_accepted must be an int in [0, 2]"),
    (lambda m: m.commit("a", 3, 0, [1]), "num_drafted must be an int in [0, 2]"),
    (lambda m: m.commit("a", -1, 0, [1]), "num_drafted must be an int"),
    (lambda m: m.commit("a", 2, -1, []), "num_accepted must be an int"),
    (lambda m: m.commit("a", 2, True, [7, 1]), "num_accepted must be an int"),
    (lambda m: m.commit("a", 1.0, 0, [7]), "num_drafted must be an int"),
    (lambda m: m.commit("a", 2, 1, [7]), "num_accepted + 1"),
    (lambda m: m.commit("a", 2, 1, (7, 1)), "emitted_tokens must be a list"),
    (lambda m: m.commit("b", 0, 0, [1]), "no step in flight"),
    (lambda m: m.commit("x", 0, 0, [1]), "unknown request id 'x'"),
    (lambda m: m.allocate_slots("x"), "unknown request id 'x'"),
    (lambda m: m.finish("x"), "unknown request id 'x'"),
    (lambda m: m.preempt("x"), "unknown request id 'x'"),
    (lambda m: m.cancel("x", 0), "unknown request id 'x'"),
    (lambda m: m.cancel("b", 0), "no step in flight"),
    (lambda m: m.cancel("a", 10), "num_computed_tokens must be an int in [0, 6]"),   # before its last token
    (lambda m: m.cancel("a", 1.0), "num_computed_tokens"),
    (lambda m: m.allocate_slots("a", 1), "in flight"),
    (lambda m: m.allocate_slots("a"), "in flight"),
    (lambda m: m.blocks_needed("a"), "in flight"),
    (lambda m: m.allocate_slots("b", 20), "out of KV blocks"),
    (lambda m: m.allocate_slots("b", -1), "num_lookahead_tokens must be an int >= 0"),
    (lambda m: m.allocate_slots("b", True), "num_lookahead_tokens"),
    (lambda m: m.allocate_slots("b", 1.0), "num_lookahead_tokens"),
    (lambda m: m.allocate_slots("b", "12"), "num_lookahead_tokens"),
    (lambda m: m.blocks_needed("b", "2"), "num_lookahead_tokens"),
    (lambda m: m.blocks_needed("x", 1), "unknown request id 'x'"),
    (lambda m: m.allocate_slots("b", 12), "out of KV blocks: request 'b' needs 4 more, 3 free"),
    (lambda m: m.add_request(Request("a", [1])), "already exists"),
    (lambda m: m.add_request(Request("c", [])), "non-empty list"),
    (lambda m: add_prompt(m, "c", []), "prompt_tokens"),
    (lambda m: add_prompt(m, "c", [1, -1]), "prompt_tokens"),
    (lambda m: tree_path_moves(m, "a", [1, 0]), "increasing"),
    (lambda m: tree_path_moves(m, "a", [0, 2]), "increasing"),
    (lambda m: tree_path_moves(m, "b", [0]), "no step in flight"),
    (lambda m: BlockManager(4, 4, enable_prefix_caching=1), "enable_prefix_caching"),
])
def test_bad_input_raises_and_changes_nothing(call, message):
    m = _manager()
    before = manager_state(m)
    with pytest.raises(ValueError, match=re.escape(message)): call(m)
    assert manager_state(m) == before
    assert check_invariants(m) == []


def test_add_request_takes_a_record_only():
    m = _manager()
    before = manager_state(m)
    with pytest.raises(TypeError, match="must be a Request"):
        m.add_request("c")
    assert manager_state(m) == before


def test_stale_commit_after_preemption_is_refused():
    m = _manager()
    m.preempt("a")
    before = manager_state(m)
    with pytest.raises(ValueError, match="no step in flight"): m.commit("a", 2, 2, [7, 8, 0])
    assert manager_state(m) == before and m.requests["a"].num_computed_tokens == 0


def test_commit_rolls_back_rejected_and_undrafted_lookahead():
    "The rollback gives back lookahead - accepted slots: the rejected drafts and the slots nothing was drafted into."
    for lookahead in range(6):
        for drafted in range(lookahead + 1):
            for accepted in range(drafted + 1):
                m, kv = BlockManager(16, 4), PagedKV(16, 4)
                tokens = [3, 1, 4, 1, 5]
                add_prompt(m, "a", tokens)
                toy_step(m, kv, "a", tokens, [], 0, 9)
                s = toy_step(m, kv, "a", tokens, list(range(drafted)), accepted, 7, num_lookahead_tokens=lookahead)
                assert s.positions == list(range(5, 6 + lookahead))
                r = m.requests["a"]
                assert (r.num_computed_tokens, r.num_tokens) == (6 + accepted, 7 + accepted)
                assert check_invariants(m, kv, {"a": tokens}) == []


class _EagerTrim(BlockManager):
    "After each commit, release the blocks past the committed positions; `off_by_one` keeps ceil((c - 1) / b)."
    off_by_one = True

    def commit(self, req_id, num_drafted, num_accepted, emitted_tokens):
        c = super().commit(req_id, num_drafted, num_accepted, emitted_tokens)
        r = self.requests[req_id]
        keep = -(-(c - 1) // self.block_size) if self.off_by_one else -(-c // self.block_size)
        for b in reversed(r.block_ids[keep:]):
            self._release(b)
        del r.block_ids[keep:]
        return c


class _EagerTrimFixed(_EagerTrim):
    off_by_one = False


def test_random_ops_are_seeded_and_well_formed():
    ops = random_ops(60, seed=3)
    assert ops == random_ops(60, seed=3) and ops != random_ops(60, seed=4)
    assert {op[0] for op in ops} <= {"add", "step", "allocate", "commit", "finish", "preempt"} and ops[0][0] == "add"
    traces = [random_ops(40, seed) for seed in range(20)]
    assert all(len(ops) == 40 for ops in traces)
    interleaved = stale = 0
    for ops in traces:
        allocated = {}  # req_id -> (index, lookahead) of its allocation awaiting a commit
        for n, op in enumerate(ops):
            if op[0] == "step":
                _, _, lookahead, drafts, num_accepted, _ = op
                assert len(drafts) <= min(4, lookahead) <= lookahead <= len(drafts) + 2
                assert 0 <= num_accepted <= len(drafts)
            elif op[0] == "allocate":
                assert 0 <= op[2] <= 6 and op[1] not in allocated
                allocated[op[1]] = (n, op[2])
            elif op[0] == "commit":
                _, rid, drafts, num_accepted, _ = op
                start, lookahead = allocated.pop(rid)   # every commit answers its request's allocation
                assert len(drafts) <= lookahead and 0 <= num_accepted <= len(drafts)
                interleaved += any(o[1] != rid for o in ops[start + 1:n])
                stale += any(o == ("preempt", rid) for o in ops[start + 1:n])
            elif op[0] == "finish":
                allocated.pop(op[1], None)
    assert sum(op[0] == "allocate" for ops in traces for op in ops) > 50  # steps left in flight are common ...
    assert interleaved > 15 and stale > 3  # ... other requests move before their commits, some of which are stale


@pytest.mark.parametrize("kwargs", [{}, dict(sliding_window=6), dict(num_blocks=12, block_size=2, sliding_window=5)])
def test_fuzzer_passes_speclab_and_a_correct_subclass(kwargs):
    for policy in (BlockManager, _EagerTrimFixed):
        assert [s for s in range(40) if fuzz_invariants(policy, 40, s, **kwargs)] == []


@pytest.mark.parametrize("policy, kwargs, expected", [
    (BuggyPrefixManager, {}, "prefix cache"),
    (BuggyWindowManager, dict(sliding_window=6), "stale read"),
    (_EagerTrim, {}, "block table shorter"),
    (_EagerTrim, dict(enable_prefix_caching=False), "block table shorter"),
])
def test_fuzzer_catches_and_shrinks_each_planted_bug(policy, kwargs, expected):
    "Each bug is found on most seeds, and shrinking leaves at most three operations that still show it."
    failing = [s for s in range(10) if fuzz_invariants(policy, 40, s, **kwargs)]
    assert len(failing) >= 5, failing
    trace = min((shrink_ops(policy, random_ops(40, s), **kwargs) for s in failing), key=len)
    assert len(trace) <= 3, trace
    bad = replay(policy, trace, **kwargs)
    assert any(expected in e for e in bad), bad
    assert replay(BlockManager, trace, **kwargs) == []


def test_shrink_needs_a_failing_trace_and_replay_skips_lost_requests():
    with pytest.raises(ValueError, match="failing trace"):
        shrink_ops(BlockManager, random_ops(10, seed=0))
    lost_add = [("step", 7, 1, [1], 1, 2), ("commit", 7, [1], 0, 2), ("finish", 7), ("add", 1, [3, 4]),
                ("step", 1, 0, [], 0, 5)]
    assert replay(BlockManager, lost_add) == []
    lost_allocate = [("add", 1, [3, 4]), ("commit", 1, [2], 1, 5), ("allocate", 1, 1), ("commit", 1, [2, 3], 2, 5)]
    assert replay(BlockManager, lost_allocate) == []  # a commit with nothing in flight is refused; extra drafts clipped


class _AcceptsStale(BlockManager):
    "A planted bug: a commit with no step in flight (a preempted request's stale output) appends its last token."

    def commit(self, req_id, num_drafted, num_accepted, emitted_tokens):
        r = self._get(req_id)
        if r.num_lookahead_tokens is None:
            self._append_tokens(r, emitted_tokens[-1:])
            return r.num_computed_tokens
        return super().commit(req_id, num_drafted, num_accepted, emitted_tokens)


def test_fuzzer_refuses_stale_commits():
    "The fuzzer's protocol checks: a manager that takes a preempted request's stale output is caught."
    failing = [s for s in range(40) if fuzz_invariants(_AcceptsStale, 40, s)]
    assert len(failing) >= 3, failing
    assert any("not refused" in e for e in replay(_AcceptsStale, random_ops(40, failing[0])))


# -- the step protocol and the prefix-cache switch -------------------------------------------------------------------

def test_allocate_slots_covers_the_lookahead_and_commit_allocates_nothing():
    """Any block size, context and kappa: allocate_slots takes ceil((T + k) / b) blocks; the forward writes <= k drafts
    in the first lookahead slots; commit takes none."""
    for b in (1, 2, 4, 16):
        for num_tokens in range(1, 2 * b + 3):
            for kappa in range(6):
                m, kv, tokens = BlockManager(64, b), PagedKV(64, b), list(range(100, 100 + num_tokens))
                add_prompt(m, 0, tokens)
                need = m.blocks_needed(0, kappa)
                assert need == -(-(num_tokens + kappa) // b)
                s = m.allocate_slots(0, kappa)
                assert (m.used_blocks, len(m.block_table(0))) == (need, need)
                assert s.positions == list(range(num_tokens + kappa))
                assert s.slot_mapping == [slot(m, 0, p) for p in s.positions]
                toy_forward(m, kv, 0, s, [7] * kappa)
                m.commit(0, kappa, kappa, [7] * kappa + [8]); tokens += [7] * kappa + [8]
                assert m.used_blocks == need and check_invariants(m, kv, {0: tokens}) == []
                for num_drafts in (kappa, 0):  # the full lookahead, then a step that drafts nothing into it
                    held = m.used_blocks
                    need = m.blocks_needed(0, kappa)
                    s = toy_step(m, kv, 0, tokens, [7] * num_drafts, num_drafts, 8, num_lookahead_tokens=kappa)
                    assert m.used_blocks == held + need and s.positions[0] == len(tokens) - num_drafts - 2
                    assert check_invariants(m, kv, {0: tokens}) == []


def test_blocks_needed_counts_prefix_hits_that_sit_in_the_free_list():
    "A preempted request's hits cost a block each while free, nothing while another request uses them."
    m = BlockManager(8, 4)
    add_prompt(m, "a", range(10, 19))
    m.allocate_slots("a")
    m.commit("a", 0, 0, [7])  # 10 tokens; blocks 0 and 1 are cached
    m.preempt("a")
    assert (m.free_blocks, m.blocks_needed("a", 2)) == (8, 3)
    assert add_prompt(m, "c", [*range(10, 18), 99]).num_computed_tokens == 8
    assert m.blocks_needed("a", 2) == 1
    free = m.free_blocks
    s = m.allocate_slots("a", 2)
    assert s.positions == [8, 9, 10, 11] and m.free_blocks == free - 1  # computes tokens[8:], then the lookahead
    assert m.block_table("a")[:2] == m.block_table("c")
    assert check_invariants(m) == []
    off = BlockManager(8, 4, enable_prefix_caching=False)  # the same story with the cache off: all recomputed
    add_prompt(off, "a", range(10, 19))
    off.allocate_slots("a")
    off.commit("a", 0, 0, [7])
    off.preempt("a")
    assert add_prompt(off, "c", [*range(10, 18), 99]).num_computed_tokens == 0
    assert off.blocks_needed("a", 2) == 3 and off.allocate_slots("a", 2).positions[0] == 0 and off.cached == {}


def test_a_refused_allocation_changes_nothing():
    "Refused for room, allocate_slots claims no prefix hit and moves no block, even for a preempted request."
    m = BlockManager(6, 4)
    add_prompt(m, "a", range(10, 19))
    m.allocate_slots("a")
    m.commit("a", 0, 0, [7])
    m.preempt("a")                      # blocks 0 and 1 cached, all 6 free
    add_prompt(m, "b", range(50, 59))   # 9 tokens: b takes 3 blocks; the 3 left are 2 and the cached 1, 0
    m.allocate_slots("b")
    assert m.blocks_needed("a", 3) == 4 and m.free_blocks == 3
    before = manager_state(m)
    with pytest.raises(ValueError, match=re.escape("out of KV blocks: request 'a' needs 2 more, 1 free")):
        m.allocate_slots("a", 3)
    assert manager_state(m) == before
    s = m.allocate_slots("a", 2)         # 12 positions: the two hits and one fresh block
    assert s.positions[0] == 8 and m.free_blocks == 0


def test_check_invariants_accepts_tables_past_the_computed_length():
    m, kv = BlockManager(16, 4), PagedKV(16, 4)
    tokens = list(range(5))
    add_prompt(m, "a", tokens)
    s = m.allocate_slots("a", 20)       # 7 blocks, 25 positions counted as computed
    assert check_invariants(m, kv, [list(range(5))]) == []
    toy_forward(m, kv, "a", s, [1, 2])
    m.commit("a", 2, 1, [1, 3]); tokens += [1, 3]   # 20 - 1 slots rolled back; the table keeps its 7 blocks
    assert len(m.block_table("a")) == 7 and check_invariants(m, kv, {"a": tokens}) == []
    m.requests["a"].num_computed_tokens = 29  # but a table shorter than the computed length is still flagged
    assert any("shorter" in e for e in check_invariants(m))
    m.requests["a"].num_computed_tokens = 6
    m.allocate_slots("a", 2)
    m.requests["a"].num_computed_tokens -= 1  # a step in flight must count its whole lookahead
    assert any("num_tokens + num_lookahead_tokens" in e for e in check_invariants(m))


class _NoEvict(BlockManager):
    "A planted bug: hands out free blocks without evicting their prefix-cache keys, so a reserved block stays cached."

    def _allocate(self, n):
        out = [self.free_queue.popleft() for _ in range(n)]
        for b in out:
            self.ref_cnt[b] = 1
        return out


def test_reserved_blocks_must_be_private():
    "Invariant 6 flags a block the step in flight will write that is cached or shared, before any K/V is written."
    for manager in (BlockManager, _NoEvict):
        m = manager(3, 4)
        add_prompt(m, "a", range(9))
        m.allocate_slots("a")
        m.commit("a", 0, 0, [9])
        m.finish("a")
        add_prompt(m, "b", [50])
        m.allocate_slots("b", 7)
        bad = check_invariants(m)
        assert (bad == []) == (manager is BlockManager), bad
        if manager is _NoEvict:
            assert bad == ["prefix cache: block 1 is cached, but 'b' will write it (it lies past the computed length)"]
            assert add_prompt(m, "c", [*range(8), 5]).num_computed_tokens == 8  # the key hands b's block to c
            assert any(e.startswith("reserved block: block 1 is shared by 2") for e in check_invariants(m))
    failing = [s for s in range(10) if fuzz_invariants(_NoEvict, 40, s)]
    assert len(failing) >= 5, failing
    ops = random_ops(40, failing[0])
    trace = shrink_ops(_NoEvict, ops)
    assert len(trace) < len(ops)
    assert any("prefix cache" in e for e in replay(_NoEvict, trace)), replay(_NoEvict, trace)
    assert replay(BlockManager, trace) == []


class _Counting(BlockManager):
    """Counts successful allocations, the lookahead slots left undrafted at commit, and commits of a step another
    request moved during. It only counts: every method returns and changes what BlockManager's does."""
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = self.undrafted = self.interleaved = 0
        self.last = None  # the request of the last allocate_slots
        _Counting.made.append(self)

    def allocate_slots(self, req_id, num_lookahead_tokens=0):
        out = super().allocate_slots(req_id, num_lookahead_tokens)
        self.allocations += 1
        self.last = req_id
        return out

    def commit(self, req_id, num_drafted, num_accepted, emitted_tokens):
        lookahead = self._get(req_id).num_lookahead_tokens
        out = super().commit(req_id, num_drafted, num_accepted, emitted_tokens)  # a stale commit raises here
        undrafted = lookahead - num_drafted
        self.undrafted += undrafted > 0
        self.interleaved += self.last != req_id
        return out


@pytest.mark.parametrize("kwargs", [{}, dict(sliding_window=6), dict(num_blocks=12, block_size=2, sliding_window=5),
                                    dict(enable_prefix_caching=False)])
def test_fuzzer_with_steps_in_flight_stays_clean_over_200_seeds(kwargs):
    """200 seeded workloads keep every invariant, each played once on `_Counting`, the production class with
    counters: they did allocate, left lookahead undrafted, and committed steps other requests moved during."""
    _Counting.made.clear()
    assert [s for s in range(200) if fuzz_invariants(_Counting, 40, s, **kwargs)] == []
    assert len(_Counting.made) == 200
    assert sum(m.allocations for m in _Counting.made) > 2000
    assert sum(m.undrafted for m in _Counting.made) > 500
    assert sum(m.interleaved for m in _Counting.made) > 50


class _CountingLookups(BlockManager):
    lookups = 0

    def _lookup(self, r):
        self.lookups += 1
        return super()._lookup(r)


def test_steady_state_steps_do_not_look_up_the_prefix_cache():
    "allocate_slots / commit consult the prefix cache only for a request with no blocks (new or preempted)."
    m = _CountingLookups(64, 4)
    add_prompt(m, "a", range(30))
    m.blocks_needed("a", 3)  # the cache was empty, so `a` still has no blocks: a second lookup ...
    m.allocate_slots("a", 3)  # ... and a third
    m.commit("a", 3, 0, [9])
    assert m.lookups == 3
    for n in range(40):
        m.allocate_slots("a", 3)
        m.commit("a", 3, n % 4, [1, 2, 3][:n % 4] + [9])
    assert m.lookups == 3
    m.preempt("a")
    assert m.blocks_needed("a", 3) > 0 and m.allocate_slots("a", 3).positions[0] > 0 and m.lookups == 5
    m.commit("a", 1, 0, [2])
    assert m.lookups == 5


def test_engine_style_scheduler_admits_allocates_and_preempts():
    """Each step allocates kappa lookahead slots for every running request (oldest first), preempting the newest when
    the pool is short; a waiting request is admitted only if its step fits; then every request drafts, verifies and
    commits, and no commit allocates."""
    rng, kappa, target_len = random.Random(0), 3, 30
    m, kv = BlockManager(20, 4), PagedKV(20, 4)
    prompts = {n: [*PREFIX[:rng.choice((0, 4, 8))], *(rng.randrange(6) for _ in range(rng.randint(1, 6)))]
               for n in range(12)}
    waiting, running, history, preemptions, steps = deque(prompts), [], {}, 0, 0
    while waiting or running:
        plan, i = {}, 0
        while i < len(running):  # (1) the running requests' steps, oldest first
            if m.blocks_needed(running[i], kappa) <= m.free_blocks:
                plan[running[i]] = m.allocate_slots(running[i], kappa)
                i += 1
                continue
            victim = running.pop()  # the newest running request gives its blocks back and waits again
            m.preempt(victim)
            plan.pop(victim, None)
            waiting.appendleft(victim)
            preemptions += 1
        while waiting:  # (2) admission, in arrival order, only when the step fits
            head = waiting[0]
            if head not in m.requests:
                add_prompt(m, head, prompts[head])
                history[head] = list(prompts[head])
            if m.blocks_needed(head, kappa) > m.free_blocks:
                m.preempt(head)  # waiting holds no blocks: drop the prefix hits add_request may have claimed
                break
            plan[head] = m.allocate_slots(head, kappa)
            running.append(waiting.popleft())
        assert running and set(plan) == set(running), "no request fits an empty pool"
        for rid in running:  # (3) draft, verify, commit: no allocation
            free = m.free_blocks
            drafts = [rng.randrange(6) for _ in range(rng.randint(0, kappa))]
            toy_forward(m, kv, rid, plan[rid], drafts)
            num_accepted = rng.randint(0, len(drafts))
            emitted = drafts[:num_accepted] + [rng.randrange(6)]
            m.commit(rid, len(drafts), num_accepted, emitted)
            assert m.free_blocks == free
            history[rid] += emitted
            steps += 1
        assert check_invariants(m, kv, history) == []  # includes: each record matches its history
        for rid in [r for r in running if m.requests[r].num_tokens >= target_len]:
            assert m.requests[rid].num_tokens == len(history[rid])
            m.finish(rid)
            running.remove(rid)
    assert m.free_blocks == 20 and m.requests == {}
    assert preemptions > 0 and steps > 12  # the pool was tight enough to preempt


# -- the production structures: chained keys, the LRU free queue, no teaching code ----------------------------------

def test_the_production_class_holds_only_what_the_engine_runs():
    """The planted bugs are subclasses in speclab.kvlab; the class the engine runs takes no policy or check flag, has
    no teaching method, and speclab.kv does not import the lab."""
    with pytest.raises(TypeError, match="policy"):
        BlockManager(8, 4, policy="buggy_prefix")
    with pytest.raises(TypeError, match="check"):
        BlockManager(8, 4, check=False)
    assert not hasattr(BlockManager(8, 4), "policy")
    for name in ("reserve", "slot", "state", "tree_path_moves", "schedule"):
        assert not hasattr(BlockManager, name), name
    assert BuggyPrefixManager.__mro__[1] is BlockManager and BuggyWindowManager.__mro__[1] is BlockManager
    assert set(vars(BuggyPrefixManager)) & set(vars(BlockManager)) == {"commit", "__doc__", "__module__"}
    assert set(vars(BuggyWindowManager)) & set(vars(BlockManager)) == {"commit", "__doc__", "__module__"}
    assert "kvlab" not in open(kv_module.__file__).read()
    assert not {"check_invariants", "toy_step", "BuggyPrefixManager"} & set(vars(kv_module))


def test_a_block_key_includes_its_parent():
    "Two prompts that share block 1's tokens but not block 0's share no block: block 1's K/V differ, so do the keys."
    m, kv, q = BlockManager(16, 4), PagedKV(16, 4), torch.linspace(-1, 1, 16, dtype=torch.float64).view(2, 8)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 3, 4, 5, 6, 7, 8, 9]
    add_prompt(m, "a", a)
    toy_step(m, kv, "a", a, [], 0, 1)
    assert len(m.cached) == 2
    assert add_prompt(m, "b", b).num_computed_tokens == 0   # block 1 has a's tokens, but not a's prefix: no hit
    toy_step(m, kv, "b", b, [], 0, 1)
    assert m.block_table("a")[1] != m.block_table("b")[1] and len(m.cached) == 4
    assert m.requests["a"].block_hashes[1] != m.requests["b"].block_hashes[1]
    assert torch.equal(committed_attention(m, kv, "b", q), scratch_attention(b[:9], q))  # b's own K/V
    assert check_invariants(m, kv, {"a": a, "b": b}) == []
    assert add_prompt(m, "c", a[:8] + [0]).num_computed_tokens == 8   # the same prefix as a: both blocks are hits
    assert m.block_table("c") == m.block_table("a")[:2]


def test_block_keys_are_a_chain_of_blake2b_digests():
    tokens = list(range(1000, 1037))
    keys = hash_chain(tokens, 8)
    assert len(keys) == 4 and all(len(k) == 16 for k in keys)
    parent = ROOT_HASH
    for i, key in enumerate(keys):
        parent = block_hash(parent, tokens[8 * i:8 * i + 8])
        assert key == parent
    assert hash_chain(tokens[:16], 8) == keys[:2]         # a prefix's keys are a prefix of the keys
    assert block_hash(ROOT_HASH, [0, 5]) != block_hash(ROOT_HASH, [2**61 - 1, 5])  # Python's hash equates these
    assert block_hash(ROOT_HASH, [1, 2]) != block_hash(ROOT_HASH, [2, 1]) != block_hash(ROOT_HASH, [1, 2, 0])


def test_the_record_holds_the_tokens_once_and_the_keys_of_its_full_blocks():
    """Per request one record: its token ids (no count, no partial-block tail, no second list beside them, no drafts),
    the keys of its full blocks, and the lookahead of the step in flight. A caller's record is the manager's."""
    m, kv, a = BlockManager(64, 4), PagedKV(64, 4), list(range(30))
    r = Request("a", list(a))
    m.add_request(r)
    assert m.requests["a"] is r
    fields = {f.name for f in dataclasses.fields(Request)}
    assert fields == {"req_id", "token_ids", "num_lookahead_tokens", "num_computed_tokens", "block_ids",
                      "block_hashes", "num_cached_blocks"}
    rng = random.Random(0)
    for n in range(30):
        lookahead = rng.randint(0, 5)
        drafts = [rng.randrange(6) for _ in range(rng.randint(0, lookahead))]
        s = m.allocate_slots("a", lookahead)
        assert r.num_lookahead_tokens == lookahead and r.num_computed_tokens == len(a) + lookahead
        toy_forward(m, kv, "a", s, drafts)
        num_accepted, ids = rng.randint(0, len(drafts)), r.token_ids
        emitted = drafts[:num_accepted] + [rng.randrange(6)]
        m.commit("a", len(drafts), num_accepted, emitted)
        a += emitted
        assert r.token_ids is ids and r.token_ids == a       # appended once, in place: the caller sees it
        assert r.num_tokens == len(a) and r.block_hashes == hash_chain(a, 4) and r.num_lookahead_tokens is None
        assert check_invariants(m, kv, {"a": a}) == []
    for name in ("tail", "tokens", "spec_tokens"):
        assert not hasattr(r, name)
    m.finish("a")
    assert (r.token_ids, r.block_ids, r.num_computed_tokens) == (a, [], 0)   # the tokens stay for their reader


def test_a_record_is_registered_as_is_and_a_refused_one_is_untouched():
    "add_request(record) keeps the object; a record without a non-empty list of tokens is refused, nothing changed."
    m = BlockManager(8, 4)
    mine = Request("mine", [1, 2, 3, 4, 5])
    assert m.add_request(mine) == 0 and m.requests["mine"] is mine and mine.block_hashes == hash_chain([1, 2, 3, 4], 4)
    before = manager_state(m)
    for bad, message in ((Request("x", []), "non-empty list"), (Request("x", (1, 2)), "non-empty list"),
                         (Request("mine", [1]), "already exists")):
        with pytest.raises(ValueError, match=message):
            m.add_request(bad)
        assert manager_state(m) == before and bad.block_ids == []
    with pytest.raises(ValueError, match="prompt_tokens"):
        add_prompt(m, "y", [1, 2**64])   # the lab's helper checks token ids; the manager trusts its records
    assert manager_state(m) == before and "y" not in m.requests


def _calls(monkeypatch):
    "Count the block hashes computed and the prefix-cache probes made from here on."
    counts = {"hashed_tokens": 0, "probes": 0}
    original = kv_module.block_hash

    def counting(parent, tokens):
        counts["hashed_tokens"] += len(tokens)
        return original(parent, tokens)
    monkeypatch.setattr(kv_module, "block_hash", counting)
    return counts


class _ProbeCounter(dict):
    probes = 0

    def get(self, key, default=None):
        _ProbeCounter.probes += 1
        return super().get(key, default)


@pytest.mark.parametrize("num_tokens", [256, 2048, 8192])
def test_prefix_lookup_is_linear_in_the_prompt(num_tokens, monkeypatch):
    "A prompt whose blocks are all cached: add_request hashes each token once and probes the cache once per block."
    size = 16
    m = BlockManager(num_tokens // size + 2, size)
    prompt = [random.Random(num_tokens).randrange(32000) for _ in range(num_tokens)]
    m.add_request(Request("warm", prompt + [1]))
    m.allocate_slots("warm")
    m.commit("warm", 0, 0, [2])
    m.finish("warm")
    m.cached = _ProbeCounter(m.cached)
    _ProbeCounter.probes = 0
    counts = _calls(monkeypatch)
    assert m.add_request(Request("hit", prompt + [3])) == num_tokens   # every full block is a hit
    assert counts["hashed_tokens"] == num_tokens                # each token hashed once: no prefix rebuilt per block
    assert _ProbeCounter.probes == num_tokens // size


def test_free_queue_is_lru_and_a_hit_leaves_the_middle():
    "Freed blocks go to the tail; allocation takes the head and evicts its key; a hit takes a free block in place."
    m = BlockManager(8, 2)
    for rid in "abc":                                      # three one-block prompts, each cached, then freed
        m.add_request(Request(rid, [ord(rid), 0, 1]))
        m.allocate_slots(rid)
        m.commit(rid, 0, 0, [5])
    tables = {rid: m.block_table(rid) for rid in "abc"}
    for rid in "bac":
        m.finish(rid)                                      # freed in the order b, a, c, each last block first
    order = [blk for rid in "bac" for blk in reversed(tables[rid])]
    assert list(m.free_queue) == [6, 7] + order
    assert m.add_request(Request("a2", [ord("a"), 0, 9])) == 2   # a's first block is a hit: out of the middle
    assert list(m.free_queue) == [6, 7] + [blk for blk in order if blk != tables["a"][0]]
    got = m._allocate(4)                                   # the least recently freed: never used, then b's blocks
    assert got == [6, 7] + tables["b"][::-1]
    assert tables["b"][0] not in m.block_hash              # b's cached block was evicted when handed out again
    assert tables["c"][0] in m.block_hash                  # c, freed last, is still findable
    assert m.add_request(Request("c2", [ord("c"), 0, 9])) == 2


class _CountingList(list):
    "A list that counts item reads and writes: the work a free-queue operation does."
    ops = 0

    def __getitem__(self, i):
        _CountingList.ops += 1
        return super().__getitem__(i)

    def __setitem__(self, i, v):
        _CountingList.ops += 1
        super().__setitem__(i, v)


def _work(num_blocks):
    "Array accesses of remove-from-the-middle, append and popleft on a queue of num_blocks."
    fq = FreeBlockQueue(num_blocks)
    fq.nxt, fq.prv, fq.queued = _CountingList(fq.nxt), _CountingList(fq.prv), _CountingList(fq.queued)
    out = []
    for op in (lambda: fq.remove(num_blocks // 2), lambda: fq.append(num_blocks // 2), fq.popleft):
        _CountingList.ops = 0
        op()
        out.append(_CountingList.ops)
    return out


def test_free_queue_operations_do_constant_work():
    "The same number of array accesses at 10 blocks and at 100,000: nothing scans the pool (list.remove did)."
    assert _work(10) == _work(100_000)
    assert max(_work(10)) <= 12


def test_free_queue_matches_a_list_model():
    rng = random.Random(0)
    for n in (1, 2, 7, 50):
        fq, model = FreeBlockQueue(n), list(range(n))
        for _ in range(2000):
            kind = rng.choice(("pop", "remove", "append"))
            if kind == "pop" and model:
                assert fq.popleft() == model.pop(0)
            elif kind == "remove" and model:
                b = rng.choice(model)
                fq.remove(b)
                model.remove(b)
            elif kind == "append" and len(model) < n:
                b = rng.choice([x for x in range(n) if x not in model])
                fq.append(b)
                model.append(b)
            assert list(fq) == model and len(fq) == len(model)
            assert all((b in fq) == (b in model) for b in range(n))
        with pytest.raises((ValueError, IndexError)):
            (fq.append(model[0]) if model else fq.popleft())
