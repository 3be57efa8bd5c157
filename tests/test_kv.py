"""Fuzz tests of speclab.kv: random workloads over several requests (add with shared prompt prefixes, speculative
steps with kappa 0..4 and any accepted count, reservations of lookahead slots, preempt, finish), with every invariant
checked after every operation. The production BlockManager must never violate one; the two planted subclasses
(BuggyPrefixManager, BuggyWindowManager) must be caught by the same checks. The chapter's own seeded fuzzer
(`fuzz_invariants`, `shrink_ops`) is tested on the chapter's bugs and two planted here. The reservation API
(`blocks_needed`, `reserve`), the prefix-cache switch and an engine-style scheduler loop (admit only if the
reservation fits, preempt when it does not) are tested next; last, the production structures by behaviour: chained
block keys, a lookup linear in the prompt, the LRU free queue and the constant work of its operations."""
import dataclasses
import random
import re
from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, strategies as st

from speclab.kv import (FREED, ROOT_HASH, BlockManager, BuggyPrefixManager, BuggyWindowManager, FreeBlockQueue,
                        PagedKV, Request, block_hash, check_invariants, committed_attention, fuzz_invariants,
                        hash_chain, random_ops, replay, scratch_attention, shrink_ops, toy_kv, toy_step, window)
import speclab.kv as kv_module
from speclab.sampling import PLACEHOLDER_TOKEN_ID

PREFIX = list(range(1, 13))  # prompts start with a piece of this, so the prefix cache gets hits
EXAMPLES = 200

op = st.tuples(st.sampled_from(["add", "step", "step", "step", "step", "reserve", "finish", "preempt"]),
               st.integers(0, 3),                             # which live request
               st.integers(0, 4),                             # kappa
               st.integers(0, 4),                             # accepted (clipped to kappa)
               st.sampled_from([5, 8, 9, 12]) | st.integers(0, len(PREFIX)),  # shared prefix length of a new prompt
               st.lists(st.integers(0, 5), max_size=4),       # prompt suffix / draft tokens
               st.integers(0, 5),                             # recovered or bonus token
               st.none() | st.integers(0, 6))                 # a reserve's lookahead; a step's extra (None: none)
ops_strategy = st.lists(op, min_size=10, max_size=40)


def try_reserve(m, rid, num_lookahead):
    "Reserve and return True, or check that a refusal was for room, predicted by blocks_needed, and changed nothing."
    need, free, held, before = m.blocks_needed(rid, num_lookahead), m.free_blocks, m.block_table(rid), m.state()
    try:
        computed = m.reserve(rid, num_lookahead)
    except ValueError as e:
        assert "out of KV blocks" in str(e) and need > free, (e, need, free)
        assert m.state() == before
        return False
    assert need <= free and m.free_blocks == free - need  # blocks_needed is exactly what reserve took
    r = m.requests[rid]
    assert computed == r.num_computed_tokens and len(r.block_ids) * m.block_size >= r.num_tokens + num_lookahead
    assert not held or r.block_ids[:len(held)] == held    # a table only grows
    return True


def run(ops, manager=BlockManager, sliding_window=None, num_blocks=24, block_size=4, enable_prefix_caching=True):
    "Play `ops`; return the first list of violations found (empty if none). Asserts what must hold for any manager."
    m = manager(num_blocks, block_size, sliding_window, enable_prefix_caching=enable_prefix_caching)
    kv = PagedKV(num_blocks, block_size)
    history, q = {}, torch.linspace(-1, 1, 16, dtype=torch.float64).view(2, 8)  # history: the engine's token record
    stepped = None
    for n, (kind, i, kappa, acc, plen, toks, nxt, lookahead) in enumerate(ops):
        live = sorted(m.requests)
        if kind == "add" or not live:
            prompt = PREFIX[:plen] + toks or [nxt]
            hit = m.add_request(n, prompt)
            assert hit % block_size == 0 and hit <= len(prompt) - 1
            assert enable_prefix_caching or hit == 0
            history[n] = list(prompt)
        else:
            rid = live[i % len(live)]
            if kind == "reserve":
                try_reserve(m, rid, lookahead or 0)
            elif kind == "step":
                drafts, acc = (toks + [5, 4, 3, 2])[:kappa], min(acc, kappa)
                reserved = lookahead is not None and try_reserve(m, rid, kappa + lookahead)  # the engine's order
                if lookahead is not None and not reserved:
                    continue  # an engine would preempt someone and try again; here the step waits
                held, free, before = len(m.block_table(rid)), m.free_blocks, m.state()
                try:
                    toy_step(m, kv, rid, history[rid], drafts, acc, nxt)
                except ValueError as e:  # a refused step (no room) must leave everything as it was
                    assert "out of KV blocks" in str(e) or (manager is not BlockManager and "freed" in str(e)), e
                    assert not reserved or "freed" in str(e), e  # a reserved step always has its blocks
                    assert m.state() == before
                    continue
                if reserved:  # schedule allocated nothing (a sliding window may have freed some since)
                    assert len(m.block_table(rid)) == held and m.free_blocks >= free
                stepped = rid
            elif kind == "finish":
                m.finish(rid)
            else:
                m.preempt(rid)
        assert enable_prefix_caching or (m.cached == {} and max(m.ref_cnt) <= 1)  # off: nothing cached or shared
        bad = check_invariants(m, kv, history)  # includes: each record's count and hash chain match its history
        if bad: return bad
        if kind == "step" and stepped in m.requests:  # attention after rollback == from scratch on the accepted prefix
            tokens, pos = history[stepped], window(m, stepped)
            assert torch.equal(committed_attention(m, kv, stepped, q),
                               scratch_attention([tokens[p] for p in pos], q, lo=pos[0] if pos else 0))
    return []


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


def test_prefix_hit_serves_only_finalized_content():
    "A rejected draft inside a full block: speclab never publishes it; buggy_prefix serves it to the next request."
    for manager, expect_hit in ((BlockManager, 4), (BuggyPrefixManager, 8)):
        m, kv, a = manager(8, 4), PagedKV(8, 4), [1, 2, 3, 4, 5]
        m.add_request("a", a)
        toy_step(m, kv, "a", a, [], 0, 6); toy_step(m, kv, "a", a, [7, 8], 1, 9); toy_step(m, kv, "a", a, [4], 0, 2)
        prompt = [1, 2, 3, 4, 5, 6, 7, 8, 0]
        hit = m.add_request("b", prompt)
        assert hit == expect_hit
        k, _ = kv.read(m.block_table("b"), range(hit))
        assert torch.equal(k, toy_kv(prompt[:hit], range(hit))[0]) == (manager is BlockManager)


def test_window_boundary_comes_from_processed_tokens():
    for manager in (BlockManager, BuggyWindowManager):
        m, kv, a = manager(16, 2, sliding_window=4), PagedKV(16, 2), [1, 2, 3, 4, 5, 6]
        m.add_request("a", a)
        toy_step(m, kv, "a", a, [], 0, 7); toy_step(m, kv, "a", a, [8, 9, 10, 11], 0, 12)
        needed_blocks = {p // 2 for p in window(m, "a")}
        assert all(m.block_table("a")[b] != FREED for b in needed_blocks) == (manager is BlockManager)


def _manager():
    m, kv = BlockManager(6, 4), PagedKV(6, 4)
    m.add_request("a", range(6)); toy_step(m, kv, "a", list(range(6)), [], 0, 6)
    m.allocate_slots("a", [7, 8]); m.add_request("b", [9])
    return m


@pytest.mark.parametrize("call, message", [
    (lambda m: m.commit("a", 3, [7, 8, 1, 2]), "drafted only 2"),
    (lambda m: m.commit("a", -1, []), "num_accepted must be >= 0"),
    (lambda m: m.commit("a", True, [7, 1]), "must be an int"),
    (lambda m: m.commit("a", 1, [7]), "num_accepted + 1"),
    (lambda m: m.commit("a", 1, [8, 1]), "accepted drafts"),
    (lambda m: m.commit("a", 0, [PLACEHOLDER_TOKEN_ID]), "emitted_tokens"),
    (lambda m: m.commit("b", 0, [1]), "no step in flight"),
    (lambda m: m.commit("x", 0, [1]), "unknown request id 'x'"),
    (lambda m: m.allocate_slots("x"), "unknown request id 'x'"),
    (lambda m: m.finish("x"), "unknown request id 'x'"),
    (lambda m: m.preempt("x"), "unknown request id 'x'"),
    (lambda m: m.allocate_slots("a", [1]), "in flight"),
    (lambda m: m.allocate_slots("b", [1] * 20), "out of KV blocks"),
    (lambda m: m.allocate_slots("b", "12"), "draft_tokens"),
    (lambda m: m.add_request("a", [1]), "already exists"),
    (lambda m: m.add_request("c", []), "prompt_tokens"),
    (lambda m: m.tree_path_moves("a", [1, 0]), "increasing"),
    (lambda m: m.tree_path_moves("a", [0, 2]), "increasing"),
    (lambda m: m.reserve("a", 1), "in flight"),
    (lambda m: m.blocks_needed("a"), "in flight"),
    (lambda m: m.reserve("b", -1), "num_lookahead must be an int >= 0"),
    (lambda m: m.reserve("b", True), "num_lookahead"),
    (lambda m: m.reserve("b", 1.0), "num_lookahead"),
    (lambda m: m.blocks_needed("b", "2"), "num_lookahead"),
    (lambda m: m.reserve("x"), "unknown request id 'x'"),
    (lambda m: m.blocks_needed("x", 1), "unknown request id 'x'"),
    (lambda m: m.reserve("b", 12), "out of KV blocks: request 'b' needs 4 more, 3 free"),
    (lambda m: BlockManager(4, 4, enable_prefix_caching=1), "enable_prefix_caching"),
])
def test_bad_input_raises_and_changes_nothing(call, message):
    m = _manager()
    before = m.state()
    with pytest.raises(ValueError, match=re.escape(message)): call(m)
    assert m.state() == before
    assert check_invariants(m) == []


def test_stale_commit_after_preemption_is_refused():
    m = _manager()
    m.preempt("a")
    before = m.state()
    with pytest.raises(ValueError, match="no step in flight"): m.commit("a", 2, [7, 8, 0])
    assert m.state() == before and m.requests["a"].num_computed_tokens == 0


class _EagerTrim(BlockManager):
    "After each commit, release the blocks past the committed positions; `off_by_one` keeps ceil((c - 1) / b)."
    off_by_one = True

    def commit(self, req_id, num_accepted, emitted_tokens):
        c = super().commit(req_id, num_accepted, emitted_tokens)
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
    assert {op[0] for op in ops} <= {"add", "step", "reserve", "finish", "preempt"} and ops[0][0] == "add"
    for op in ops:
        if op[0] == "step":
            _, _, drafts, num_accepted, _ = op
            assert len(drafts) <= 4 and 0 <= num_accepted <= len(drafts)
        if op[0] == "reserve":
            assert 0 <= op[2] <= 6
    traces = [random_ops(40, seed) for seed in range(20)]
    assert all(len(ops) == 40 for ops in traces)
    pairs = [(a, b) for ops in traces for a, b in zip(ops, ops[1:]) if a[0] == "reserve" and b[0] == "step"]
    assert sum(a[1] == b[1] and a[2] >= len(b[2]) for a, b in pairs) > 100  # steps right after their own reservation
    assert sum(op[0] == "reserve" for ops in traces for op in ops) > 150  # and reservations are common


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
    lost_add = [("step", 7, [1], 1, 2), ("finish", 7), ("add", 1, [3, 4]), ("step", 1, [], 0, 5)]
    assert replay(BlockManager, lost_add) == []


# -- reservations and the prefix-cache switch ------------------------------------------------------------------------

def test_reserve_covers_the_lookahead_and_schedule_then_allocates_nothing():
    "Any block size, context and kappa: reserve takes ceil((T + k) / b) blocks; schedule of <= k drafts takes none."
    for b in (1, 2, 4, 16):
        for num_tokens in range(1, 2 * b + 3):
            for kappa in range(6):
                m, kv, tokens = BlockManager(64, b), PagedKV(64, b), list(range(100, 100 + num_tokens))
                m.add_request(0, tokens)
                need = m.blocks_needed(0, kappa)
                assert need == -(-(num_tokens + kappa) // b)
                assert m.reserve(0, kappa) == 0
                assert (m.used_blocks, len(m.block_table(0))) == (need, need)
                assert m.blocks_needed(0, kappa) == 0 and m.reserve(0, kappa) == 0 and m.used_blocks == need
                for num_drafts in (kappa, 0):  # the full reservation, then a step that drafts nothing
                    computed = m.reserve(0, kappa)
                    slots = [m.slot(0, p) for p in range(m.requests[0].num_tokens + num_drafts)]
                    held = m.used_blocks
                    s = toy_step(m, kv, 0, tokens, [7] * num_drafts, num_drafts, 8)
                    assert m.used_blocks == held and s.slot_mapping == slots[computed:]
                    assert check_invariants(m, kv, {0: tokens}) == []


def test_blocks_needed_counts_prefix_hits_that_sit_in_the_free_list():
    "A preempted request's hits cost a block each while free, nothing while another request uses them."
    m = BlockManager(8, 4)
    m.add_request("a", range(10, 19))
    m.allocate_slots("a")
    m.commit("a", 0, [7])  # 10 tokens; blocks 0 and 1 are cached
    m.preempt("a")
    assert (m.free_blocks, m.blocks_needed("a", 2)) == (8, 3)
    assert m.add_request("c", [*range(10, 18), 99]) == 8
    assert m.blocks_needed("a", 2) == 1
    free = m.free_blocks
    assert m.reserve("a", 2) == 8 and m.free_blocks == free - 1
    assert m.block_table("a")[:2] == m.block_table("c")
    s = m.allocate_slots("a", [1, 2])
    assert s.positions == [8, 9, 10, 11] and m.free_blocks == free - 1  # computes tokens[8:] + drafts
    assert check_invariants(m) == []
    off = BlockManager(8, 4, enable_prefix_caching=False)  # the same story with the cache off: all recomputed
    off.add_request("a", range(10, 19))
    off.allocate_slots("a")
    off.commit("a", 0, [7])
    off.preempt("a")
    assert off.add_request("c", [*range(10, 18), 99]) == 0
    assert off.blocks_needed("a", 2) == 3 and off.reserve("a", 2) == 0 and off.cached == {}


def test_a_refused_reservation_changes_nothing():
    "Refused for room, a reservation claims no prefix hit and moves no block, even for a preempted request."
    m = BlockManager(6, 4)
    m.add_request("a", range(10, 19))
    m.allocate_slots("a")
    m.commit("a", 0, [7])
    m.preempt("a")                      # blocks 0 and 1 cached, all 6 free
    m.add_request("b", range(50, 59))   # 9 tokens: b takes 3 blocks; the 3 left are 2 and the cached 1, 0
    m.reserve("b")
    assert m.blocks_needed("a", 3) == 4 and m.free_blocks == 3
    before = m.state()
    with pytest.raises(ValueError, match=re.escape("out of KV blocks: request 'a' needs 2 more, 1 free")):
        m.reserve("a", 3)
    assert m.state() == before
    with pytest.raises(ValueError, match="out of KV blocks"):
        m.allocate_slots("a", [1, 2, 3])
    assert m.state() == before
    assert m.reserve("a", 2) == 8 and m.free_blocks == 0  # 12 positions: the two hits and one fresh block


def test_check_invariants_accepts_reserved_tables():
    m, kv = BlockManager(16, 4), PagedKV(16, 4)
    m.add_request("a", range(5))
    m.reserve("a", 20)                  # 7 blocks, nothing computed
    assert check_invariants(m, kv, [list(range(5))]) == []
    tokens = list(range(5))
    toy_step(m, kv, "a", tokens, [1, 2], 1, 3)
    m.reserve("a", 9)
    assert len(m.block_table("a")) == 7 and check_invariants(m, kv, {"a": tokens}) == []
    m.requests["a"].num_computed_tokens = 29  # but a table shorter than the computed length is still flagged
    assert any("shorter" in e for e in check_invariants(m))


class _NoEvict(BlockManager):
    "A planted bug: hands out free blocks without evicting their prefix-cache keys, so a reserved block stays cached."

    def _allocate(self, n):
        out = [self.free_queue.popleft() for _ in range(n)]
        for b in out:
            self.ref_cnt[b] = 1
        return out


def test_reserved_blocks_must_be_private():
    "Invariant 6 flags a reserved block that is cached or shared at once, before any K/V is written into it."
    for manager in (BlockManager, _NoEvict):
        m = manager(3, 4)
        m.add_request("a", range(9))
        m.allocate_slots("a")
        m.commit("a", 0, [9])
        m.finish("a")
        m.add_request("b", [50])
        m.reserve("b", 7)
        bad = check_invariants(m)
        assert (bad == []) == (manager is BlockManager), bad
        if manager is _NoEvict:
            assert bad == ["prefix cache: block 1 is cached, but 'b' will write it (it lies past the computed length)"]
            assert m.add_request("c", [*range(8), 5]) == 8  # the cached key hands b's reserved block to c
            assert any(e.startswith("reserved block: block 1 is shared by 2") for e in check_invariants(m))
    failing = [s for s in range(10) if fuzz_invariants(_NoEvict, 40, s)]
    assert len(failing) >= 5, failing
    ops = random_ops(40, failing[0])
    trace = shrink_ops(_NoEvict, ops)
    assert len(trace) < len(ops)
    assert any("will write it" in e for e in replay(_NoEvict, trace)), replay(_NoEvict, trace)
    assert replay(BlockManager, trace) == []


class _Counting(BlockManager):
    """Counts successful reservations and the steps that found all their blocks reserved. It only counts: every
    method returns and changes what BlockManager's does, so a workload played on it is played on BlockManager."""
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reservations = 0
        self.reserved_steps = 0
        _Counting.made.append(self)

    def reserve(self, req_id, num_lookahead=0):
        out = super().reserve(req_id, num_lookahead)
        self.reservations += 1
        return out

    def allocate_slots(self, req_id, draft_tokens=()):
        r = self.requests[req_id]
        covered = r.block_ids and len(r.block_ids) * self.block_size >= r.num_tokens + len(draft_tokens)
        out = super().allocate_slots(req_id, draft_tokens)
        self.reserved_steps += bool(covered)
        return out


@pytest.mark.parametrize("kwargs", [{}, dict(sliding_window=6), dict(num_blocks=12, block_size=2, sliding_window=5),
                                    dict(enable_prefix_caching=False)])
def test_fuzzer_with_reservations_stays_clean_over_200_seeds(kwargs):
    """200 seeded workloads keep every invariant, each played once: on `_Counting`, the production class with counters
    (an earlier version replayed all 200 on BlockManager too, the same operations on the same code a second time)."""
    _Counting.made.clear()
    assert [s for s in range(200) if fuzz_invariants(_Counting, 40, s, **kwargs)] == []
    assert len(_Counting.made) == 200
    assert sum(m.reservations for m in _Counting.made) > 1000  # the workloads did reserve ...
    assert sum(m.reserved_steps for m in _Counting.made) > 500  # ... and stepped into reservations


class _CountingLookups(BlockManager):
    lookups = 0

    def _lookup(self, r):
        self.lookups += 1
        return super()._lookup(r)


def test_steady_state_steps_do_not_look_up_the_prefix_cache():
    "reserve / schedule / commit consult the prefix cache only for a request with no blocks (new or preempted)."
    m = _CountingLookups(64, 4)
    m.add_request("a", range(30))
    m.reserve("a", 3)  # the cache was empty, so `a` still had no blocks: a second lookup
    assert m.lookups == 2
    for n in range(40):
        m.reserve("a", 3)
        m.allocate_slots("a", [1, 2, 3])
        m.commit("a", n % 4, [1, 2, 3][:n % 4] + [9])
    assert m.lookups == 2
    m.preempt("a")
    assert m.blocks_needed("a", 3) > 0 and m.reserve("a", 3) > 0 and m.lookups == 4
    m.allocate_slots("a", [1])
    m.commit("a", 0, [2])
    assert m.lookups == 4


def test_engine_style_scheduler_admits_reserves_and_preempts():
    """Admit a waiting request only if its reservation fits; each step, reserve kappa slots for every running request
    (oldest first), preempting the newest when the pool is short; then every step finds its blocks in place."""
    rng, kappa, target_len = random.Random(0), 3, 30
    m, kv = BlockManager(20, 4), PagedKV(20, 4)
    prompts = {n: [*PREFIX[:rng.choice((0, 4, 8))], *(rng.randrange(6) for _ in range(rng.randint(1, 6)))]
               for n in range(12)}
    waiting, running, history, preemptions, steps = deque(prompts), [], {}, 0, 0
    while waiting or running:
        i = 0
        while i < len(running):  # (1) the reservations
            if m.blocks_needed(running[i], kappa) <= m.free_blocks:
                m.reserve(running[i], kappa)
                i += 1
                continue
            victim = running.pop()  # the newest running request gives its blocks back and waits again
            m.preempt(victim)
            waiting.appendleft(victim)
            preemptions += 1
        while waiting:  # (2) admission, in arrival order, only when the reservation fits
            head = waiting[0]
            if head not in m.requests:
                m.add_request(head, prompts[head])
                history[head] = list(prompts[head])
            if m.blocks_needed(head, kappa) > m.free_blocks:
                m.preempt(head)  # waiting holds no blocks: drop the prefix hits add_request may have claimed
                break
            m.reserve(head, kappa)
            running.append(waiting.popleft())
        assert running, "no request fits an empty pool"
        for rid in running:  # (3) draft, verify, commit: no allocation
            free = m.free_blocks
            drafts = [rng.randrange(6) for _ in range(kappa)]
            s = m.allocate_slots(rid, drafts)
            assert m.free_blocks == free
            kv.write(s.slot_mapping, *toy_kv(history[rid][s.positions[0]:] + drafts, s.positions))
            num_accepted = rng.randint(0, kappa)
            emitted = drafts[:num_accepted] + [rng.randrange(6)]
            m.commit(rid, num_accepted, emitted)
            history[rid] += emitted
            steps += 1
        assert check_invariants(m, kv, history) == []  # includes: each record matches its history
        for rid in [r for r in running if m.requests[r].num_tokens >= target_len]:
            assert m.requests[rid].num_tokens == len(history[rid])
            m.finish(rid)
            running.remove(rid)
    assert m.free_blocks == 20 and m.requests == {}
    assert preemptions > 0 and steps > 12  # the pool was tight enough to preempt


# -- the production structures: chained keys, the LRU free queue, no teaching policy --------------------------------

def test_no_teaching_policy_in_the_production_class():
    "The planted bugs are subclasses; the class the engine runs takes no policy and has no branch for one."
    with pytest.raises(TypeError, match="policy"):
        BlockManager(8, 4, policy="buggy_prefix")
    assert not hasattr(BlockManager(8, 4), "policy")
    assert BuggyPrefixManager.__mro__[1] is BlockManager and BuggyWindowManager.__mro__[1] is BlockManager
    assert set(vars(BuggyPrefixManager)) & set(vars(BlockManager)) == {"allocate_slots", "__doc__", "__module__"}
    assert set(vars(BuggyWindowManager)) & set(vars(BlockManager)) == {"commit", "__doc__", "__module__"}


def test_a_block_key_includes_its_parent():
    "Two prompts that share block 1's tokens but not block 0's share no block: block 1's K/V differ, so do the keys."
    m, kv, q = BlockManager(16, 4), PagedKV(16, 4), torch.linspace(-1, 1, 16, dtype=torch.float64).view(2, 8)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 3, 4, 5, 6, 7, 8, 9]
    m.add_request("a", a)
    toy_step(m, kv, "a", a, [], 0, 1)
    assert len(m.cached) == 2
    assert m.add_request("b", b) == 0                     # block 1 has a's tokens, but not a's prefix: no hit
    toy_step(m, kv, "b", b, [], 0, 1)
    assert m.block_table("a")[1] != m.block_table("b")[1] and len(m.cached) == 4
    assert m.requests["a"].block_hashes[1] != m.requests["b"].block_hashes[1]
    assert torch.equal(committed_attention(m, kv, "b", q), scratch_attention(b[:9], q))  # b's own K/V
    assert check_invariants(m, kv, {"a": a, "b": b}) == []
    assert m.add_request("c", a[:8] + [0]) == 8           # the same prefix as a: both blocks are hits
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
    """Per request one record: its token ids (no count, no partial-block tail, no second list beside them), the keys
    of its full blocks, and the drafts in flight in one place. A caller's record is the manager's, not a copy."""
    m, kv, a = BlockManager(64, 4), PagedKV(64, 4), list(range(30))
    r = Request("a", list(a))
    m.add_request(r)
    assert m.requests["a"] is r
    fields = {f.name for f in dataclasses.fields(Request)}
    assert fields == {"req_id", "token_ids", "spec_tokens", "num_computed_tokens", "block_ids", "block_hashes",
                      "num_cached_blocks"}
    rng = random.Random(0)
    for n in range(30):
        drafts = [rng.randrange(6) for _ in range(rng.randint(0, 4))]
        s = m.allocate_slots("a", drafts)
        assert r.spec_tokens == drafts and m.requests["a"].spec_tokens is r.spec_tokens
        kv.write(s.slot_mapping, *toy_kv(r.token_ids[s.positions[0]:] + drafts, s.positions))
        num_accepted, ids = rng.randint(0, len(drafts)), r.token_ids
        emitted = drafts[:num_accepted] + [rng.randrange(6)]
        m.commit("a", num_accepted, emitted)
        a += emitted
        assert r.token_ids is ids and r.token_ids == a       # appended once, in place: the caller sees it
        assert r.num_tokens == len(a) and r.block_hashes == hash_chain(a, 4) and r.spec_tokens is None
        assert check_invariants(m, kv, {"a": a}) == []
    for name in ("tail", "tokens"):
        assert not hasattr(r, name)
    m.finish("a")
    assert (r.token_ids, r.block_ids, r.num_computed_tokens) == (a, [], 0)   # the tokens stay for their reader


def test_a_record_is_registered_as_is_and_a_refused_one_is_untouched():
    "add_request(record) keeps the object; a bad record or a record with prompt_tokens is refused, nothing changed."
    m = BlockManager(8, 4)
    mine = Request("mine", [1, 2, 3, 4, 5])
    assert m.add_request(mine) == 0 and m.requests["mine"] is mine and mine.block_hashes == hash_chain([1, 2, 3, 4], 4)
    before = m.state()
    for bad, message in ((Request("x", []), "prompt_tokens"), (Request("x", [1, -1]), "prompt_tokens"),
                         (Request("x", (1, 2)), "must be a list"), (Request("mine", [1]), "already exists")):
        with pytest.raises(ValueError, match=message):
            m.add_request(bad)
        assert m.state() == before and bad.block_ids == []
    with pytest.raises(ValueError, match="prompt_tokens must be None"):
        m.add_request(Request("y", [1]), [1])
    assert m.state() == before and "y" not in m.requests


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
    m.add_request("warm", prompt + [1])
    m.allocate_slots("warm")
    m.commit("warm", 0, [2])
    m.finish("warm")
    m.cached = _ProbeCounter(m.cached)
    _ProbeCounter.probes = 0
    counts = _calls(monkeypatch)
    assert m.add_request("hit", prompt + [3]) == num_tokens     # every full block is a hit
    assert counts["hashed_tokens"] == num_tokens                # each token hashed once: no prefix rebuilt per block
    assert _ProbeCounter.probes == num_tokens // size


def test_free_queue_is_lru_and_a_hit_leaves_the_middle():
    "Freed blocks go to the tail; allocation takes the head and evicts its key; a hit takes a free block in place."
    m = BlockManager(8, 2)
    for rid in "abc":                                      # three one-block prompts, each cached, then freed
        m.add_request(rid, [ord(rid), 0, 1])
        m.allocate_slots(rid)
        m.commit(rid, 0, [5])
    tables = {rid: m.block_table(rid) for rid in "abc"}
    for rid in "bac":
        m.finish(rid)                                      # freed in the order b, a, c, each last block first
    order = [blk for rid in "bac" for blk in reversed(tables[rid])]
    assert list(m.free_queue) == [6, 7] + order
    assert m.add_request("a2", [ord("a"), 0, 9]) == 2       # a's first block is a hit: out of the middle
    assert list(m.free_queue) == [6, 7] + [blk for blk in order if blk != tables["a"][0]]
    got = m._allocate(4)                                   # the least recently freed: never used, then b's blocks
    assert got == [6, 7] + tables["b"][::-1]
    assert tables["b"][0] not in m.block_hash              # b's cached block was evicted when handed out again
    assert tables["c"][0] in m.block_hash                  # c, freed last, is still findable
    assert m.add_request("c2", [ord("c"), 0, 9]) == 2


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
