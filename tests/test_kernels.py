"""Chapter 4: every Triton kernel equals the torch reference (speclab.sampling) bit for bit, and compiles for sm_90.

The kernels run in Triton's interpreter here (conftest sets TRITON_INTERPRET=1). The compile tests run in a subprocess
without the interpreter, because the interpreter replaces the JIT that `triton.compile` needs.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import speclab.sampling as ref
from speclab import kernels as K

pytestmark = pytest.mark.xdist_group("kernels")   # one worker: its module fixtures are built once

RANDOM_OPS = ["random_sample", "chain_sample", "block_sample"]


def ragged_batch(seed, B=8, V=37, kmax=4, draft_probs=True, greedy="mixed", pad=0.1, sharp=3.0, counts=None):
    """A random ragged batch with every shape the kernels must handle: requests with 0 drafts, -1 padding, a request
    whose drafts are all the target's argmax with zero coins (fully accepted), one whose first draft is padded (first
    position rejected), greedy and random requests mixed, and float64 coins / float32 noise as the reference draws them."""
    g = torch.Generator().manual_seed(seed)
    B = B if counts is None else len(counts)
    n = torch.randint(0, kmax + 1, (B,), generator=g) if counts is None else torch.tensor(counts)
    if counts is None and B >= 3: n[0], n[1], n[2] = 0, kmax, kmax   # empty, all-accepted, first-rejected
    N, cu = int(n.sum()), ref.cu_num_draft_tokens(n)
    target = torch.softmax(torch.randn(N, V, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(N, V, generator=g) * sharp, -1) if draft_probs else None
    draft = torch.where(torch.rand(N, generator=g) < 0.6, target.argmax(-1), torch.randint(0, V, (N,), generator=g))
    draft[torch.rand(N, generator=g) < pad] = -1
    u = torch.rand(N, dtype=torch.float64, generator=g)
    starts = cu - n
    if counts is None and B >= 3:
        rows1 = torch.arange(int(starts[1]), int(cu[1]))
        draft[rows1], u[rows1] = target[rows1].argmax(-1), 0.0             # accepted whatever q is (p > 0)
        draft[int(starts[2])] = -1                                         # rejected at position 0
    is_greedy = {"mixed": torch.rand(B, generator=g) < 0.4, "none": None, "all": torch.ones(B, dtype=torch.bool)}[greedy]
    if greedy == "mixed" and B >= 3: is_greedy[1], is_greedy[2] = False, False
    gens = [torch.Generator().manual_seed(seed * 1000 + b) for b in range(B)]
    return dict(n=n, cu=cu, draft=draft, draft_probs=q, target_probs=target, argmax=target.argmax(-1),
                bonus=torch.randint(0, V, (B,), generator=g), is_greedy=is_greedy, uniform=u,
                exponentials=ref.generate_exponentials(n, V, gens, is_greedy), coins=ref.generate_residual_coins(n, gens, is_greedy))


def fresh(x):
    "The output a caller allocates: [B, S+1] of -1."
    return torch.full((len(x["n"]), int(x["n"].max()) + 1 if len(x["n"]) else 1), -1, dtype=torch.int64)


def run_op(mod, op, x, **kw):
    "Call op `op` of module `mod` (speclab.sampling or speclab.kernels) on batch `x`."
    cu, d, q, p = x["cu"], x["draft"], x["draft_probs"], x["target_probs"]
    if op == "greedy_sample": return mod.greedy_sample(fresh(x), cu, d, x["argmax"], x["bonus"], x["is_greedy"])
    if op == "recovered_exponential": return mod.recovered_exponential(cu, d, q, p, x["exponentials"], **kw)
    if op == "recovered_inverse_cdf": return mod.recovered_inverse_cdf(cu, d, q, p, x["coins"], **kw)
    if op == "random_sample":
        rec = ref.recovered_exponential(cu, d, q, p, x["exponentials"])
        return mod.random_sample(fresh(x), cu, d, q, p, x["bonus"], rec, x["uniform"], x["is_greedy"])
    if op == "chain_sample":
        return mod.chain_sample(fresh(x), cu, d, q, p, x["bonus"], x["uniform"], x["coins"], x["is_greedy"], **kw)
    if op == "block_sample":
        return mod.block_sample(fresh(x), cu, d, q, p, x["bonus"], x["uniform"], x["exponentials"], x["is_greedy"], **kw)
    raise ValueError(op)


def assert_parity(op, x, block_v=None):
    kw = {} if block_v is None or op in ("greedy_sample", "random_sample") else dict(block_v=block_v)
    mine, theirs = run_op(K, op, x, **kw), run_op(ref, op, x)
    assert torch.equal(mine, theirs), f"{op}: triton\n{mine}\nreference\n{theirs}\nn = {x['n'].tolist()}"


ALL_OPS = ["greedy_sample", "random_sample", "recovered_exponential", "recovered_inverse_cdf", "chain_sample", "block_sample"]


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["q", "no-q"])
@pytest.mark.parametrize("greedy", ["mixed", "none"])
def test_parity_random_batches(op, draft_probs, greedy):
    "Seeded random ragged batches, V = 37 with 16-wide tiles (the last tile is masked)."
    for seed in range(6):
        assert_parity(op, ragged_batch(seed, draft_probs=draft_probs, greedy=greedy), block_v=16)


@pytest.mark.parametrize("op", ALL_OPS)
def test_parity_default_tile(op):
    "The default BLOCK_V on a vocabulary one tile plus a bit wide, and sharp rows (many near-zero probabilities)."
    assert_parity(op, ragged_batch(11, B=4, V=K.BLOCK_V + 5, kmax=3, sharp=8.0))


@pytest.mark.parametrize("op", ALL_OPS)
def test_parity_ties(op):
    "Flat, quantised rows and unit noise: every race is a tie that only the lowest index may win, across tiles."
    x = ragged_batch(5, B=6, V=24, kmax=3)
    levels = torch.randint(0, 3, x["target_probs"].shape, generator=torch.Generator().manual_seed(0)).float()
    x["target_probs"] = levels / levels.sum(-1, keepdim=True)
    x["draft_probs"] = torch.full_like(x["target_probs"], 1 / 24)
    x["exponentials"] = torch.ones_like(x["exponentials"])
    assert_parity(op, x, block_v=8)


@pytest.mark.parametrize("op", ALL_OPS)
def test_parity_edge_batches(op):
    "A batch with no drafts at all, a single request, and random ops on an all-greedy batch (nothing written)."
    for x in (ragged_batch(1, counts=[0, 0, 0]), ragged_batch(2, counts=[5]), ragged_batch(3, counts=[2, 0, 1], greedy="all")):
        assert_parity(op, x, block_v=16)


def test_coin_endpoints():
    "u = 0 and the largest float64 below 1 pick the first and last tokens of positive width, as the reference does."
    x = ragged_batch(4, B=5, V=40, kmax=3)
    for c in (0.0, 1 - 2**-53):
        x["coins"] = torch.full_like(x["coins"], c)
        assert_parity("recovered_inverse_cdf", x, block_v=16)
        assert_parity("chain_sample", x, block_v=16)


def test_mixed_batch_two_launches():
    "Greedy then random kernels over the whole batch write disjoint rows; together they equal the reference."
    x = ragged_batch(9, B=10, greedy="mixed")
    rec = ref.recovered_exponential(x["cu"], x["draft"], x["draft_probs"], x["target_probs"], x["exponentials"])
    def both(mod):
        out = mod.greedy_sample(fresh(x), x["cu"], x["draft"], x["argmax"], x["bonus"], x["is_greedy"])
        return mod.random_sample(out, x["cu"], x["draft"], x["draft_probs"], x["target_probs"], x["bonus"], rec,
                                 x["uniform"], x["is_greedy"])
    mine = both(K)
    assert torch.equal(mine, both(ref))
    assert (mine[:, 0] >= 0).all()  # every request, greedy or not, emitted at least one token


@pytest.mark.parametrize("kw", [dict(), dict(recovery="inverse_cdf"), dict(method="block")], ids=["exp", "icdf", "block"])
def test_rejection_sample_backend(kw):
    "Chapter 3's entry point with backend='triton' gives the torch backend's tokens."
    x = ragged_batch(21, B=8, greedy="mixed")
    args = (x["draft"], x["n"], x["draft_probs"], x["target_probs"], x["bonus"])
    outs = [ref.rejection_sample(*args, is_greedy=x["is_greedy"], backend=b, **kw,
                                 generators=[torch.Generator().manual_seed(b_) for b_ in range(8)]) for b in ("triton", "torch")]
    assert torch.equal(*outs)


def test_llama3_vocabulary():
    "V = 128,256 (int64 offsets, 126 tiles of 1024 with a masked tail), few rows to keep the interpreter quick."
    x = ragged_batch(17, B=3, V=128_256, counts=[1, 3, 0], sharp=8.0)
    for op in ALL_OPS:
        assert_parity(op, x)


def test_bad_inputs_name_the_argument():
    x = ragged_batch(0, B=4)
    cu, d = x["cu"], x["draft"]
    with pytest.raises(TypeError, match="target_probs must have dtype torch.float32"):
        K.recovered_exponential(cu, d, None, x["target_probs"].double(), x["exponentials"])
    with pytest.raises(ValueError, match="exponentials must have shape"):
        K.recovered_exponential(cu, d, None, x["target_probs"], x["exponentials"][:, :5].contiguous())
    with pytest.raises(ValueError, match="output_token_ids needs at least"):
        K.greedy_sample(fresh(x)[:, :1].contiguous(), cu, d, x["argmax"], x["bonus"])
    with pytest.raises(ValueError, match="draft_token_ids has"):
        K.greedy_sample(fresh(x), cu, d[:-1].contiguous(), x["argmax"][:-1].contiguous(), x["bonus"])
    with pytest.raises(ValueError, match="threshold_acc"):
        K.random_sample(fresh(x), cu, d, None, x["target_probs"], x["bonus"], d, x["uniform"], threshold_acc=0.5)



# ---------------------------------------------------------------- tree attention masks

def random_tree(g, n, shape):
    "A random parent array of n nodes: 'bushy' (uniform parents), 'deep' (mostly the previous node), 'star', 'chain'."
    pick = {"bushy": lambda i: int(torch.randint(0, i, (1,), generator=g)), "star": lambda i: 0,
            "chain": lambda i: i - 1,
            "deep": lambda i: i - 1 if torch.rand(1, generator=g) < 0.8 else int(torch.randint(0, i, (1,), generator=g))}
    return [-1] + [pick[shape](i) for i in range(1, n)]


def padded_reference(trees):
    "Chapter 3's ancestor_mask per tree, padded with False to [B, T, T]."
    T = max((len(t) for t in trees), default=0)
    want = torch.zeros(len(trees), T, T, dtype=torch.bool)
    for b, t in enumerate(trees):
        want[b, :len(t), :len(t)] = ref.ancestor_mask(t)
    return want


@pytest.mark.parametrize("shape", ["bushy", "deep", "star", "chain", "mixed"])
def test_ancestor_mask_parity_random_trees(shape):
    "Random ragged batches of trees (1 to 40 nodes, up to 7 requests) equal the padded torch reference exactly."
    g = torch.Generator().manual_seed(len(shape))
    shapes = ["bushy", "deep", "star", "chain"]
    for trial in range(8):
        B = int(torch.randint(1, 8, (1,), generator=g))
        trees = [random_tree(g, int(torch.randint(1, 41, (1,), generator=g)),
                             shapes[int(torch.randint(0, 4, (1,), generator=g))] if shape == "mixed" else shape)
                 for _ in range(B)]
        got = K.ancestor_mask_triton(trees)
        assert got.dtype == torch.bool
        assert torch.equal(got, padded_reference(trees)), trees


def test_ancestor_mask_edge_batches():
    "A single node, a lone chain (the causal triangle), a tree wider than one 16-column tile, an empty batch."
    assert torch.equal(K.ancestor_mask_triton([[-1]]), torch.ones(1, 1, 1, dtype=torch.bool))
    assert torch.equal(K.ancestor_mask_triton([list(range(-1, 9))])[0], torch.ones(10, 10, dtype=torch.bool).tril())
    deep = list(range(-1, 69))                                     # depth 69: 70 walk steps, 128 columns
    trees = [deep, [-1, 0, 0], [-1]]
    assert torch.equal(K.ancestor_mask_triton(trees), padded_reference(trees))
    assert K.ancestor_mask_triton([]).shape == (0, 0, 0)


def test_ancestor_mask_bad_parents_name_the_request():
    with pytest.raises(ValueError, match=r"parents_list\[1\]\[2\] must be an int in \[0, 2\)"):
        K.ancestor_mask_triton([[-1, 0], [-1, 0, 2]])
    with pytest.raises(ValueError, match=r"parents_list\[0\] must be a non-empty list"):
        K.ancestor_mask_triton([[]])
    with pytest.raises(ValueError, match=r"parents_list\[0\]\[1\]"):
        K.ancestor_mask_triton([[-1, True]])
    with pytest.raises(TypeError, match="parents_list must be a list"):
        K.ancestor_mask_triton("-1 0")


# ---------------------------------------------------------------- sm_90 compilation (no GPU, no interpreter)

COMPILE_SCRIPT = r"""
import json, sys
from speclab import kernels as K

res = {}
for op, (name, variants) in K.KERNELS.items():
    res[op] = []
    for cx in variants:
        try:
            c = K.compile_kernel(getattr(K, name), 90, **cx)
            res[op].append(dict(constexprs=cx, ok=True, cubin=len(c.asm["cubin"]), hazards=K.ptx_hazards(c),
                                stages=sorted(c.asm)))
        except Exception as e:
            res[op].append(dict(constexprs=cx, ok=False, error=f"{type(e).__name__}: {e}"[-2000:]))
json.dump(res, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    "Compile every variant of every kernel for sm_90 in one subprocess without TRITON_INTERPRET."
    d = tmp_path_factory.mktemp("sm90")
    (d / "compile.py").write_text(COMPILE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "0"}
    r = subprocess.run([sys.executable, str(d / "compile.py"), str(d / "out.json")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-5000:]
    return json.loads((d / "out.json").read_text())


@pytest.mark.parametrize("op", ALL_OPS + ["ancestor_mask_triton"])
def test_compiles_for_sm90(sm90, op):
    "Each launchable variant compiles to an sm_90 cubin, with no approximate division or fused FMA in its PTX."
    assert len(sm90[op]) == len(K.KERNELS[op][1])
    for v in sm90[op]:
        assert v["ok"], f"{op} {v['constexprs']}: {v['error']}"
        assert v["cubin"] > 0 and {"ttir", "ttgir", "llir", "ptx", "cubin"} <= set(v["stages"])
        assert v["hazards"] == [], f"{op} {v['constexprs']}: {v['hazards']} would break bit parity on the GPU"


def test_compile_needs_no_interpreter():
    "In the interpreter, compile_kernel explains why it cannot work instead of failing obscurely."
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        K.compile_kernel(K._greedy_kernel, HAS_IS_GREEDY=True)
