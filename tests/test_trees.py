"""Chapter 14 (speclab.trees): token-tree verifiers, exact laws, law tests with stated power, planted biases.

Two kinds of evidence, kept apart:
* exact: `tree_law` (enumeration of every tree a scheme can draw) equals Chapter 1's `target_law` for every exact
  verifier, on many shapes and vocabularies; hypothesis draws the one-node cases;
* statistical: the tree step itself, run through `check_chain_exactness` (chi-square at level 1e-3; each report
  states the smallest TV it flags with probability 0.999). Exact verifiers get the draws that flag TV >= 0.03; the
  grid makes 14 such checks, so a correct set fails it with probability at most 1.4% (seeds are fixed, so a run is
  reproducible). Every planted verifier's exact bias is computed first and sets its draws, so the check's detectable
  TV is below the bias: it is rejected with probability >= 0.999 per check, and the test asserts it was.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from speclab.proof import (acceptance_rate, check_chain_exactness, draws_for_law, greedy_fn, target_law,
                           toy_next_token_fn, tv_distance)
from speclab.trees import (PLANTED, SCHEMES, TokenTree, children_law, draft_tree, dynamic_tree,
                           expected_tokens_per_step, node_acceptance, node_law, reach_probs, recursive_rule, tree_law,
                           tree_stepper, trial_drafts, verify_tree)
from speclab.sampling import tree_children

LAW_TV = 0.03           # every exact-verifier check flags a TV bias >= 0.03 with probability >= 0.999
MAX_N = 20_000          # the most draws a planted-bug check may need (its exact bias sets how many)
GRID = [                # (vocabulary, widths, kappa, n_tokens, seeds of target and draft)
    (4, (3, 2), 2, 2, (21, 22)),
    (3, (2, 2, 2), 3, 3, (31, 32)),
    (6, (2,), 3, 2, (51, 52)),          # widths repeat: a 2-wide tree of depth 3
    (4, (1,), 3, 3, (61, 62)),          # the chain as a special case
    (8, (3, 1), 2, 2, (71, 72)),
]


def case_setup(case):
    "The case's toy target and draft, its full tree shape and the target's law of its first tokens."
    V, widths, kappa, n_tokens, (ts, ds) = case
    tf, df = toy_next_token_fn(V, seed=ts), toy_next_token_fn(V, seed=ds)
    return tf, df, (widths + widths[-1:] * kappa)[:kappa], target_law((1,), tf, n_tokens)


def grid_id(case):
    V, widths, kappa, n_tokens, _ = case
    return f"V{V}-w{'x'.join(map(str, widths))}-k{kappa}-n{n_tokens}"


@st.composite
def node_cases(draw):
    "A target row, a draft row (zeros, near-ties and point masses among them), a width."
    V = draw(st.integers(2, 5))
    def row():
        w = np.array(draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=V, max_size=V)))
        if w.sum() == 0:
            w[draw(st.integers(0, V - 1))] = 1.0
        return w / w.sum()
    return row(), row(), draw(st.integers(1, 3))


@settings(max_examples=300, deadline=None)
@given(node_cases())
def test_every_scheme_emits_p_at_one_node(case):
    "The recursive rule emits exactly p at a node for every scheme, width and pair (exact enumeration)."
    p, q, width = case
    for scheme in SCHEMES:
        assert np.allclose(node_law(p, q, width, scheme), p, atol=1e-9), scheme
        assert np.allclose(node_law(p, q, width, scheme, verify_as="topk"), p, atol=1e-9), scheme   # target-only
    assert abs(node_acceptance(p, q, 1, "iid") - acceptance_rate(p, q)) < 1e-9


@settings(max_examples=100, deadline=None)
@given(node_cases())
def test_children_law_is_a_law(case):
    "children_law's weights sum to 1 and every list has distinct tokens except under i.i.d. draws."
    _, q, width = case
    for scheme in SCHEMES:
        law = children_law(q, width, scheme)
        assert abs(sum(w for w, _ in law) - 1) < 1e-9
        if scheme != "iid":
            assert all(len(set(kids)) == len(kids) for _, kids in law)


@pytest.mark.parametrize("case", GRID, ids=grid_id)
def test_exact_tree_law_equals_target_law(case):
    tf, df, shape, want = case_setup(case)
    for scheme in SCHEMES:
        assert tv_distance(tree_law((1,), tf, df, shape, scheme, case[3]), want) < 1e-9, scheme


@pytest.mark.parametrize("case", GRID[:4], ids=grid_id)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_law_of_exact_verifiers(case, scheme):
    """Each exact verifier's step, sampled: its first tokens follow the target's law (chi-square at level 1e-3, with
    the draws that flag a TV bias of LAW_TV with probability 0.999). 12 checks: a correct set fails w.p. <= 1.2%."""
    V, widths, kappa, n_tokens, (ts, _) = case
    tf, df, _, law = case_setup(case)
    n = draws_for_law(list(law.values()), LAW_TV)
    report = check_chain_exactness(tree_stepper(scheme, widths), tf, df, (1,), kappa, n_tokens, n=n, seed=ts)
    assert np.isfinite(report.p_value) and report.df > 0, report       # a check that could not be computed fails
    assert report.detectable_tv <= LAW_TV + 1e-9, report
    assert report.passed, report


def planted_cases():
    "(case, bug, exact bias, draws) for every grid case with branching where the bug's bias is catchable in MAX_N."
    out = []
    for case in GRID:
        tf, df, shape, law = case_setup(case)
        for bug, (scheme, verify_as, rule) in PLANTED.items():
            bias = tv_distance(tree_law((1,), tf, df, shape, scheme, case[3], verify_as, rule), law)
            n = draws_for_law(list(law.values()), bias) if bias > 1e-3 else None
            if max(case[1]) > 1 and n is not None and n <= MAX_N:
                out.append(pytest.param(case, bug, bias, max(n, 2_000), id=f"{bug}-{grid_id(case)}"))
    return out


PLANTED_CASES = planted_cases()


def test_every_planted_bug_has_cases():
    "Each planted verifier is checked on at least three grid cases (the grid is not allowed to dodge a bug)."
    for bug in PLANTED:
        assert sum(p.values[1] == bug for p in PLANTED_CASES) >= 3, bug


@pytest.mark.parametrize("case,bug,bias,n", PLANTED_CASES)
def test_planted_verifiers_are_rejected(case, bug, bias, n):
    """Every planted verifier, sampled with the draws its exact bias needs: the check's detectable TV is below the
    bias (so it is rejected with probability >= 0.999), and it is rejected."""
    V, widths, kappa, n_tokens, (ts, _) = case
    tf, df, _, _ = case_setup(case)
    scheme, verify_as, rule = PLANTED[bug]
    step = tree_stepper(scheme, widths, verify_as, rule, name=bug)
    report = check_chain_exactness(step, tf, df, (1,), kappa, n_tokens, n=n, seed=ts)
    assert bias > report.detectable_tv, (bias, report)
    assert not report.passed, report


def dynamic_step(num_nodes, topk, depth):
    "A step with an EAGLE-2 dynamic tree (top-k children: the target-only rule)."
    def step(prefix, target_fn, draft_fn, kappa, rng):
        tree = dynamic_tree(prefix, draft_fn, num_nodes, topk, depth)
        return verify_tree(tree, [target_fn(tuple(prefix) + p) for p in tree.paths()], rng)[1]
    step.__name__ = f"dynamic_{num_nodes}_top{topk}_d{depth}"
    return step


@pytest.mark.parametrize("num_nodes,topk,depth", [(5, 2, 3), (8, 3, 4)])
def test_law_of_dynamic_trees(num_nodes, topk, depth):
    tf, df = toy_next_token_fn(5, seed=81), toy_next_token_fn(5, seed=82, concentration=0.3)
    n = draws_for_law(list(target_law((2,), tf, 2).values()), LAW_TV)
    report = check_chain_exactness(dynamic_step(num_nodes, topk, depth), tf, df, (2,), depth, 2, n=n, seed=83)
    assert report.df > 0 and report.passed, report


def test_dynamic_tree_shape():
    "Ancestor-closed, parents first, the node budget kept, siblings distinct and tried in the draft's order."
    df = toy_next_token_fn(7, seed=9, concentration=0.4)
    for prefix in [(0,), (3, 1), (6, 6, 2)]:
        for num_nodes, topk, depth in [(1, 1, 1), (6, 2, 3), (10, 3, 5), (40, 2, 4)]:
            tree = dynamic_tree(prefix, df, num_nodes, topk, depth)
            assert len(tree) - 1 == min(num_nodes, sum(topk * min(topk, topk ** d) for d in range(depth)))
            assert all(0 <= tree.parents[i] < i for i in range(1, len(tree)))
            for node, kids in enumerate(tree_children(tree.parents)):
                if kids:
                    q = tree.draft_probs[node]
                    probs = [q[tree.tokens[c]] for c in kids]
                    assert probs == sorted(probs, reverse=True) and len({tree.tokens[c] for c in kids}) == len(kids)


def test_greedy_is_the_collapse_of_every_scheme():
    "With a one-hot target every verifier emits the target's greedy continuation, whatever the draft."
    tf, df = greedy_fn(toy_next_token_fn(6, seed=3)), toy_next_token_fn(6, seed=4)
    want = list(max(target_law((2,), tf, 4), key=target_law((2,), tf, 4).get))
    rng = np.random.default_rng(0)
    for scheme in SCHEMES:
        step = tree_stepper(scheme, (3, 2))
        for _ in range(50):
            out = []
            while len(out) < 4:
                out += step((2,) + tuple(out), tf, df, 2, rng)
            assert out[:4] == want, scheme


def test_reach_probs_is_E():
    "reach_probs sums to the exact E of a top-k step (its exact law), for fixed and dynamic trees."
    tf, df = toy_next_token_fn(5, seed=5), toy_next_token_fn(5, seed=6)
    for widths in [(1, 1, 1), (2, 2), (3, 1)]:
        tree = draft_tree((1,), df, widths, "topk", None)
        E = reach_probs(tree, [tf((1,) + p) for p in tree.paths()]).sum()
        assert abs(E - expected_tokens_per_step((1,), tf, df, widths, "topk")) < 1e-12


def test_bad_input_names_the_argument():
    df = toy_next_token_fn(4)
    rng = np.random.default_rng(0)
    cases = [
        (lambda: draft_tree((1,), df, (0,), "iid", rng), "widths"),
        (lambda: draft_tree((1,), df, "22", "iid", rng), "widths"),
        (lambda: draft_tree((1,), df, (2,), "sample", rng), "scheme"),
        (lambda: tree_stepper("iid", (2,), verify_as="x"), "verify_as"),
        (lambda: TokenTree([0, 1, 2], [-1, 0], [None] * 3, "iid"), "one entry per node"),
        (lambda: TokenTree([0, 1, 2], [-1, 2, 0], [None] * 3, "iid"), "parents"),
        (lambda: dynamic_tree((1,), df, 0, 2, 2), "num_nodes"),
        (lambda: trial_drafts([0.5, 0.6], [0], "iid"), "q"),
    ]
    for fn, word in cases:
        with pytest.raises(ValueError, match=word):
            fn()
    tree = draft_tree((1,), df, (2,), "iid", rng)
    with pytest.raises(ValueError, match="target_probs"):
        verify_tree(tree, [df(())], rng)
    with pytest.raises(ValueError, match="target_probs"):
        reach_probs(tree, [df(())])


def test_recursive_rule_stops_at_a_certain_accept():
    "Once a trial accepts for certain, no later child is tried (its acceptance would be meaningless)."
    p = np.array([0.7, 0.2, 0.1])
    accepts, _ = recursive_rule(p, trial_drafts(p, [0, 1], "iid"), [0, 1])    # q = p: the first child is kept
    assert accepts == [1.0]
