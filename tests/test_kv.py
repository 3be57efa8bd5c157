"""Fuzz tests of speclab.kv: random workloads over several requests (add with shared prompt prefixes, speculative
steps with kappa 0..4 and any accepted count, preempt, finish), with every invariant checked after every operation.
speclab's policy must never violate one; the two buggy policies must be caught by the same checks. The chapter's own
seeded fuzzer (`fuzz_invariants`, `shrink_ops`) is tested at the end, on the chapter's bugs and one planted here."""
import re

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, strategies as st

from speclab.kv import (FREED, BlockManager, PagedKV, check_invariants, committed_attention, fuzz_invariants,
                        random_ops, replay, scratch_attention, shrink_ops, toy_kv, toy_step, window)
from speclab.sampling import PLACEHOLDER_TOKEN_ID

PREFIX = list(range(1, 13))  # prompts start with a piece of this, so the prefix cache gets hits
EXAMPLES = 200

op = st.tuples(st.sampled_from(["add", "step", "step", "step", "step", "finish", "preempt"]),
               st.integers(0, 3),                             # which live request
               st.integers(0, 4),                             # kappa
               st.integers(0, 4),                             # accepted (clipped to kappa)
               st.sampled_from([5, 8, 9, 12]) | st.integers(0, len(PREFIX)),  # shared prefix length of a new prompt
               st.lists(st.integers(0, 5), max_size=4),       # prompt suffix / draft tokens
               st.integers(0, 5))                             # recovered or bonus token
ops_strategy = st.lists(op, min_size=10, max_size=40)


def run(ops, policy="speclab", sliding_window=None, num_blocks=24, block_size=4):
    "Play `ops`; return the first list of violations found (empty if none). Asserts what must hold for any policy."
    m, kv = BlockManager(num_blocks, block_size, sliding_window, policy), PagedKV(num_blocks, block_size)
    history, finalized, q = {}, [], torch.linspace(-1, 1, 16, dtype=torch.float64).view(2, 8)
    stepped = None
    for n, (kind, i, kappa, acc, plen, toks, nxt) in enumerate(ops):
        live = sorted(m.requests)
        if kind == "add" or not live:
            prompt = PREFIX[:plen] + toks or [nxt]
            hit = m.add_request(n, prompt)
            assert hit % block_size == 0 and hit <= len(prompt) - 1
            history[n] = list(prompt); finalized.append(history[n])
        else:
            rid = live[i % len(live)]
            if kind == "step":
                drafts, acc = (toks + [5, 4, 3, 2])[:kappa], min(acc, kappa)
                before = m.state()
                try: toy_step(m, kv, rid, drafts, acc, nxt)
                except ValueError as e:  # a refused step (no room) must leave everything as it was
                    assert "out of KV blocks" in str(e) or (policy != "speclab" and "freed" in str(e)), e
                    assert m.state() == before
                    continue
                history[rid] += drafts[:acc] + [nxt]
                stepped = rid
            elif kind == "finish": m.finish(rid)
            else: m.preempt(rid)
        for rid, r in m.requests.items(): assert r.tokens == history[rid]  # committed tokens == accepted history
        bad = check_invariants(m, kv, finalized)
        if bad: return bad
        if kind == "step" and stepped in m.requests:  # attention after rollback == from scratch on the accepted prefix
            r, pos = m.requests[stepped], window(m, stepped)
            assert torch.equal(committed_attention(m, kv, stepped, q),
                               scratch_attention([r.tokens[p] for p in pos], q, lo=pos[0] if pos else 0))
    return []


@pytest.mark.parametrize("sliding_window", [None, 6])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_speclab_keeps_every_invariant(ops, sliding_window):
    assert run(ops, sliding_window=sliding_window) == []


@pytest.mark.parametrize("sliding_window", [None, 5])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_small_blocks_and_tight_pool(ops, sliding_window):
    "Blocks of 2 in a pool of 12: refused steps (state must be unchanged), more evictions, more sharing."
    assert run(ops, sliding_window=sliding_window, num_blocks=12, block_size=2) == []


@pytest.mark.parametrize("policy, sliding_window, expected", [
    ("buggy_prefix", None, "prefix cache"),
    ("buggy_window", 6, "stale read"),
])
def test_buggy_policies_are_caught(policy, sliding_window, expected):
    "The same workload generator and the same checks find each buggy policy's hazard."
    ops = find(ops_strategy, lambda ops: bool(run(ops, policy, sliding_window)),
               settings=settings(max_examples=2000, database=None, deadline=None, phases=[Phase.generate]))
    assert any(e.startswith(expected) for e in run(ops, policy, sliding_window)), run(ops, policy, sliding_window)
    assert run(ops, "speclab", sliding_window) == []  # the same ops are fine under speclab


def test_prefix_hit_serves_only_finalized_content():
    "A rejected draft inside a full block: speclab never publishes it; buggy_prefix serves it to the next request."
    for policy, expect_hit in (("speclab", 4), ("buggy_prefix", 8)):
        m, kv = BlockManager(8, 4, policy=policy), PagedKV(8, 4)
        m.add_request("a", [1, 2, 3, 4, 5])
        toy_step(m, kv, "a", [], 0, 6); toy_step(m, kv, "a", [7, 8], 1, 9); toy_step(m, kv, "a", [4], 0, 2)
        prompt = [1, 2, 3, 4, 5, 6, 7, 8, 0]
        hit = m.add_request("b", prompt)
        assert hit == expect_hit
        k, _ = kv.read(m.block_table("b"), range(hit))
        assert torch.equal(k, toy_kv(prompt[:hit], range(hit))[0]) == (policy == "speclab")


def test_window_boundary_comes_from_processed_tokens():
    for policy in ("speclab", "buggy_window"):
        m, kv = BlockManager(16, 2, sliding_window=4, policy=policy), PagedKV(16, 2)
        m.add_request("a", [1, 2, 3, 4, 5, 6])
        toy_step(m, kv, "a", [], 0, 7); toy_step(m, kv, "a", [8, 9, 10, 11], 0, 12)
        needed_blocks = {p // 2 for p in window(m, "a")}
        assert all(m.block_table("a")[b] != FREED for b in needed_blocks) == (policy == "speclab")


def _manager():
    m, kv = BlockManager(6, 4), PagedKV(6, 4)
    m.add_request("a", range(6)); toy_step(m, kv, "a", [], 0, 6)
    m.schedule("a", [7, 8]); m.add_request("b", [9])
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
    (lambda m: m.schedule("x"), "unknown request id 'x'"),
    (lambda m: m.finish("x"), "unknown request id 'x'"),
    (lambda m: m.preempt("x"), "unknown request id 'x'"),
    (lambda m: m.schedule("a", [1]), "in flight"),
    (lambda m: m.schedule("b", [1] * 20), "out of KV blocks"),
    (lambda m: m.schedule("b", "12"), "draft_tokens"),
    (lambda m: m.add_request("a", [1]), "already exists"),
    (lambda m: m.add_request("c", []), "prompt_tokens"),
    (lambda m: m.tree_path_moves("a", [1, 0]), "increasing"),
    (lambda m: m.tree_path_moves("a", [0, 2]), "increasing"),
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
    assert {op[0] for op in ops} <= {"add", "step", "finish", "preempt"} and ops[0][0] == "add"
    for op in ops:
        if op[0] == "step":
            _, _, drafts, num_accepted, _ = op
            assert len(drafts) <= 4 and 0 <= num_accepted <= len(drafts)


@pytest.mark.parametrize("kwargs", [{}, dict(sliding_window=6), dict(num_blocks=12, block_size=2, sliding_window=5)])
def test_fuzzer_passes_speclab_and_a_correct_subclass(kwargs):
    for policy in ("speclab", _EagerTrimFixed):
        assert [s for s in range(40) if fuzz_invariants(policy, 40, s, **kwargs)] == []


@pytest.mark.parametrize("policy, kwargs, expected", [
    ("buggy_prefix", {}, "prefix cache"),
    ("buggy_window", dict(sliding_window=6), "stale read"),
    (_EagerTrim, {}, "block table shorter"),
])
def test_fuzzer_catches_and_shrinks_each_planted_bug(policy, kwargs, expected):
    "Each bug is found on most seeds, and shrinking leaves at most three operations that still show it."
    failing = [s for s in range(10) if fuzz_invariants(policy, 40, s, **kwargs)]
    assert len(failing) >= 5, failing
    trace = min((shrink_ops(policy, random_ops(40, s), **kwargs) for s in failing), key=len)
    assert len(trace) <= 3, trace
    bad = replay(policy, trace, **kwargs)
    assert any(expected in e for e in bad), bad
    assert replay("speclab", trace, **kwargs) == []


def test_shrink_needs_a_failing_trace_and_replay_skips_lost_requests():
    with pytest.raises(ValueError, match="failing trace"):
        shrink_ops("speclab", random_ops(10, seed=0))
    assert replay("speclab", [("step", 7, [1], 1, 2), ("finish", 7), ("add", 1, [3, 4]), ("step", 1, [], 0, 5)]) == []
