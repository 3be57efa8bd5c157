"""speclab.model: parity with transformers.LlamaForCausalLM over many tiny configs, batching, sharded loading, errors;
the fused projections and their Hugging Face names; the paged forward against the contiguous one and a windowed
reference (block sizes, head layouts, freed blocks, slot writes, bad input); token trees in the paged forward (every
node against a chain over its root path, chains as trees, tree_parents errors)."""
import json
from dataclasses import fields

import pytest
import torch

from speclab.kv import FREED
from speclab.model import (KVCache, Llama, LlamaArgs, PagedBatch, forward, forward_paged, hf_state_dict, load_model,
                           load_state_dict, pack_state_dict, paged_batch, paged_cache)
from speclab.roofline import ModelSpec
from speclab.sampling import tree_depths
from speclab.testing import (cached_walk, paged_walk, parity_error, ragged_feeds, reference_logits,
                             tiny_hf_checkpoint)

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}
CONFIGS = [  # (heads, kv_heads, head_dim or None, tied, rope_scaling, layers)
    (4, 4, None, False, None, 2),     # MHA
    (4, 2, None, False, None, 2),     # GQA
    (4, 1, None, True, None, 1),      # MQA, tied
    (8, 2, 16, True, LLAMA3, 2),      # explicit head_dim != hidden/heads, llama3 rope
    (4, 2, None, False, LLAMA3, 3),
]


@pytest.mark.parametrize("heads,kv,head_dim,tied,rope,layers", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_transformers(tmp_path, heads, kv, head_dim, tied, rope, layers, seed):
    extra = dict(num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied, num_hidden_layers=layers)
    if head_dim: extra["head_dim"] = head_dim
    if rope: extra["rope_scaling"] = rope
    hf = tiny_hf_checkpoint(tmp_path, seed=seed, **extra)
    model = load_model(tmp_path)
    g = torch.Generator().manual_seed(seed)
    for prefill in (1, 5, 11):
        seq = torch.randint(0, 64, (prefill + 6,), generator=g)
        assert parity_error(hf, model, seq, prefill=prefill, kappa=4, reject=3) < 1e-4


def test_ragged_batch_matches_hf(tmp_path):
    hf = tiny_hf_checkpoint(tmp_path, seed=3)
    model = load_model(tmp_path)
    seqs = [torch.randint(0, 64, (n,)) for n in (9, 4, 7)]
    cache = KVCache(model.args, 3, 16)
    block = torch.zeros(3, 9, dtype=torch.int64)
    for b, s in enumerate(seqs): block[b, :len(s)] = s
    out = forward(model, block, cache, num_new=[9, 4, 7])
    for b, s in enumerate(seqs):
        ref = hf(s[None]).logits[0]
        assert (out[b, :len(s)] - ref).abs().max() < 1e-4
    # a verify block of 3 on every request, then a per-request rollback and re-verify
    nxt = torch.randint(0, 64, (3, 3))
    forward(model, nxt, cache)
    for b, n in enumerate((3, 0, 2)): cache.rollback(b, n)
    again = torch.randint(0, 64, (3, 2))
    out = forward(model, again, cache)
    keep = (0, 3, 1)
    for b, s in enumerate(seqs):
        full = torch.cat([s, nxt[b, :keep[b]], again[b]])
        ref = hf(full[None]).logits[0, -2:]
        assert (out[b] - ref).abs().max() < 1e-4
    assert cache.lengths.tolist() == [11, 9, 10]


def test_sharded_checkpoint(tmp_path):
    hf = tiny_hf_checkpoint(tmp_path, seed=4, vocab_size=512, hidden_size=64)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    (tmp_path / "model.safetensors").unlink(missing_ok=True)
    model = load_model(tmp_path)
    seq = torch.randint(0, 512, (10,))
    assert parity_error(hf, model, seq, prefill=4) < 1e-4
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_model(tmp_path)


def test_errors(tmp_path):
    tiny_hf_checkpoint(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="model_type"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"missing \['model.layers.2"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 60}))
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight has shape \(64, 32\).*\(60, 32\)"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path)
    with pytest.raises(ValueError, match="max_len=4"):
        forward(model, torch.zeros(1, 5, dtype=torch.int64), KVCache(model.args, 1, 4))
    with pytest.raises(TypeError, match="tokens"):
        forward(model, torch.zeros(5, dtype=torch.int64), KVCache(model.args, 1, 8))
    with pytest.raises(ValueError, match="num_new"):
        forward(model, torch.zeros(1, 2, dtype=torch.int64), KVCache(model.args, 1, 8), num_new=[3])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtypes(tmp_path, dtype):
    hf = tiny_hf_checkpoint(tmp_path, seed=5)
    model = load_model(tmp_path, dtype=dtype)
    seq = torch.randint(0, 64, (8,))
    out = forward(model, seq[None], KVCache(model.args, 1, 8, dtype=dtype))
    assert out.dtype == dtype
    tol = 1e-4 if dtype == torch.float64 else 0.1
    assert (out[0].float() - hf(seq[None]).logits[0]).abs().max() < tol


# --- LlamaArgs is a ModelSpec; fused projections; the paged forward --------------------------------------------

def test_llama_args_is_a_model_spec(tmp_path):
    tiny_hf_checkpoint(tmp_path, seed=0)
    model = load_model(tmp_path)
    spec = ModelSpec.load(tmp_path)
    assert isinstance(model.args, ModelSpec) and model.args.name == tmp_path.name
    assert model.args.bytes_per_step("bf16") == spec.bytes_per_step("bf16")
    assert model.args.kv_bytes_per_token("fp32") == spec.kv_bytes_per_token("fp32")
    assert LlamaArgs.load(tmp_path).max_position_embeddings == 128       # ModelSpec.load builds the subclass too


def test_hf_state_dict_gives_back_the_checkpoint(tmp_path):
    tiny_hf_checkpoint(tmp_path, seed=2, num_key_value_heads=1, attention_bias=True, mlp_bias=True)
    model = load_model(tmp_path)
    ours, stored = hf_state_dict(model), load_state_dict(tmp_path)
    assert set(ours) == set(stored)
    assert all(torch.equal(ours[k], stored[k]) for k in ours)
    assert "model.layers.0.self_attn.qkv_proj.bias" in model.state_dict()
    packed = pack_state_dict(stored)
    assert all(torch.equal(packed[k], v) for k, v in model.state_dict().items())


def _random_llama(kv_heads, tied, seed, heads=4, layers=2, context=None):
    torch.manual_seed(seed)
    args = LlamaArgs(name="t", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=8, tied_embeddings=tied,
                     max_position_embeddings=context)
    model = Llama(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)   # larger than the default init: attention far from uniform, so masks matter
    return model.double().eval()


@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, True), (2, False), (1, True)])   # MHA, GQA, MQA
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_forward_matches_contiguous(kv_heads, tied, block_size):
    model = _random_llama(kv_heads, tied, seed=kv_heads + 10 * block_size)
    g = torch.Generator().manual_seed(block_size)
    seqs = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (17, 5, 11, 1)]
    for seed in range(2):
        feeds = ragged_feeds([len(s) for s in seqs], seed=seed)
        ref = cached_walk(model, seqs, feeds)
        got, tables = paged_walk(model, seqs, feeds, block_size=block_size, seed=seed)
        assert max(float((a - b).abs().max()) for a, b in zip(got, ref)) < 1e-10
        flat = [b for t in tables for b in t]
        assert sorted(flat) == list(range(len(flat)))                  # every block handed out once, shuffled


@pytest.mark.parametrize("block_size", [1, 3, 4])
@pytest.mark.parametrize("window", [1, 2, 5, 8])
def test_paged_sliding_window_never_reads_freed_blocks(block_size, window):
    model = _random_llama(2, False, seed=window)
    g = torch.Generator().manual_seed(window * block_size)
    seqs = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (23, 12, 6)]
    feeds = ragged_feeds([len(s) for s in seqs], seed=block_size)
    got, tables = paged_walk(model, seqs, feeds, block_size=block_size, sliding_window=window, seed=1)
    if (len(seqs[0]) - window + 1) // block_size > 0:
        assert FREED in tables[0]
    for logits, s in zip(got, seqs):
        assert torch.isfinite(logits).all()
        assert (logits - reference_logits(model, s, sliding_window=window)).abs().max() < 1e-10
    if window < len(seqs[0]):
        unwindowed = reference_logits(model, seqs[0])
        assert (unwindowed[window:] - got[0][window:]).abs().max() > 1e-3   # the window changed the answer


def test_reference_logits_match_transformers(tmp_path):
    hf = tiny_hf_checkpoint(tmp_path, seed=6)
    model = load_model(tmp_path)
    seq = torch.randint(0, 64, (14,))
    assert (reference_logits(model, seq) - hf(seq[None]).logits[0]).abs().max() < 1e-4


def test_paged_forward_matches_transformers_on_a_checkpoint(tmp_path):
    hf = tiny_hf_checkpoint(tmp_path, seed=7, tie_word_embeddings=True)
    model = load_model(tmp_path)
    seqs = [torch.randint(0, 64, (n,)).tolist() for n in (12, 7)]
    refs = [hf(torch.tensor([s])).logits[0] for s in seqs]
    cache = paged_cache(model.args, num_blocks=8, block_size=4)
    tables = [[7, 2, 5], [0, 6]]
    first = paged_batch([seqs[0][:9], seqs[1][:2]], [0, 0], tables, 4)
    out = forward_paged(model, cache, first).split(first.query_lens)
    assert (out[0] - refs[0][:9]).abs().max() < 1e-4 and (out[1] - refs[1][:2]).abs().max() < 1e-4
    second = paged_batch([seqs[0][9:], seqs[1][2:]], [9, 2], tables, 4)
    last = forward_paged(model, cache, second, logits_indices=second.last_token_indices)
    assert (last - torch.stack([refs[0][-1], refs[1][-1]])).abs().max() < 1e-4


def test_paged_writes_land_in_their_slots_only():
    model = _random_llama(2, False, seed=3)
    cache = paged_cache(model.args, num_blocks=10, block_size=3, dtype=torch.float64)
    for kv in cache:
        kv.k.normal_()
        kv.v.normal_()
    steps = [([[1, 2, 3, 4], [5]], [0, 0]), ([[6], [7, 8, 9]], [4, 1]), ([[10, 11]], [5])]
    tables = [[8, 3, 4], [1, 9]]
    for blocks, starts in steps:
        live = [0, 1] if len(blocks) == 2 else [0]
        batch = paged_batch(blocks, starts, [tables[b] for b in live], 3)
        before = [(kv.k.clone(), kv.v.clone()) for kv in cache]
        forward_paged(model, cache, batch)
        for kv, (k0, v0) in zip(cache, before):
            for new, old in ((kv.k, k0), (kv.v, v0)):
                rows, old_rows = new.reshape(30, -1), old.reshape(30, -1)
                changed = (rows != old_rows).any(-1).nonzero().flatten().tolist()
                assert changed == sorted(batch.slot_mapping.tolist())


def test_paged_logits_indices_pick_rows():
    model = _random_llama(2, True, seed=4)
    batch = paged_batch([[3, 4, 5], [6], [7, 8]], [0, 0, 0], [[0], [1], [2]], 4)

    def run(rows=None):
        "A fresh pool each time: the same step, asked for different rows."
        return forward_paged(model, paged_cache(model.args, 3, 4, torch.float64), batch, logits_indices=rows)

    every, rows = run(), torch.tensor([5, 0, 2, 2])
    assert (run(rows) - every[rows]).abs().max() < 1e-12   # the same rows (the head's matmul may round differently)
    empty = run(torch.zeros(0, dtype=torch.int64))
    assert empty.shape == (0, 64)


@pytest.mark.parametrize("window", [None, 3])
def test_unchecked_paged_step_is_the_checked_one(window, monkeypatch):
    """The engine's path (`check=False`: its block manager keeps the tables right) builds the same batch tensors and
    the same logits as the checked path, with a ragged step and a freed block, and runs none of the walks that check."""
    import speclab.model as model_mod
    model = _random_llama(2, False, seed=5)
    blocks, starts = [[1, 2, 3], [4], [5, 6]], [7, 2, 0]
    tables = [[FREED if window else 6, 2, 0], [1], [5, 4]]
    checked = paged_batch(blocks, starts, tables, 4, sliding_window=window)
    logits = forward_paged(model, paged_cache(model.args, 8, 4, torch.float64), checked, checked.last_token_indices)
    for name in ("_check_paged_batch", "_touched_blocks", "_check_paged_forward"):
        monkeypatch.setattr(model_mod, name, lambda *a, name=name: pytest.fail(f"{name} ran on the trusted path"))
    trusted = paged_batch(blocks, starts, tables, 4, sliding_window=window, check=False)
    for field in ("token_ids", "positions", "slot_mapping", "last_token_indices", "key_slots", "attn_mask"):
        assert torch.equal(getattr(trusted, field), getattr(checked, field)), field
    assert trusted.query_lens == checked.query_lens and trusted.max_block >= checked.max_block
    pool = paged_cache(model.args, 8, 4, torch.float64)
    assert torch.equal(forward_paged(model, pool, trusted, trusted.last_token_indices, check=False), logits)



# --- token trees in the paged forward -------------------------------------------------------------------------

def _random_tree(g, n):
    "A parent array of n nodes: each parent the previous node or a uniform earlier one, so trees are deep and bushy."
    return [-1] + [i - 1 if torch.rand(1, generator=g) < 0.5 else int(torch.randint(0, i, (1,), generator=g))
                   for i in range(1, n)]


def _root_path(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def _chain_reference(model, context, tokens, block_size, window):
    "Logits of the last token and K/V at its slot (per layer) of a plain chain: context, then tokens, fresh cache."
    n_blocks = (len(context) + len(tokens)) // block_size + 1
    pool = paged_cache(model.args, n_blocks, block_size)
    table = list(range(n_blocks))[::-1]
    forward_paged(model, pool, paged_batch([context], [0], [table], block_size, sliding_window=window))
    step = paged_batch([tokens], [len(context)], [table], block_size, sliding_window=window)
    logits = forward_paged(model, pool, step)[-1]
    slot = int(step.slot_mapping[-1])
    return logits, [(kv.k.flatten(0, 1)[slot], kv.v.flatten(0, 1)[slot]) for kv in pool]


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("block_size", [1, 3, 4])
@pytest.mark.parametrize("window", [None, 4])
def test_paged_tree_step_matches_root_path_chains(kv_heads, block_size, window):
    """One step mixing chains and trees (random deep and bushy trees, a star, a chain given as parents, a lone root):
    every node's logits and the K/V in its slot equal a plain chain forward of its root path from the same context,
    float32; with a sliding window, the chain runs with the same window."""
    model = _random_llama(kv_heads, False, seed=kv_heads + block_size).float()
    g = torch.Generator().manual_seed(7 * block_size + kv_heads)
    trees = [None, _random_tree(g, 12), [-1, 0, 0, 0, 0], [-1], list(range(-1, 5)), _random_tree(g, 9), None]
    depths = [tree_depths(t) for t in trees if t]
    assert max(max(d) for d in depths) >= 3
    assert any(len(set(p)) < len(p) - 1 for p in trees if p and len(p) > 2)          # some node has two children
    sizes = [len(t) if t else n for t, n in zip(trees, (4, 0, 0, 0, 0, 0, 1))]
    contexts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (6, 13, 2, 9, 4, 7, 5)]
    feeds = [torch.randint(0, 64, (n,), generator=g).tolist() for n in sizes]
    need = [-(-(len(c) + n) // block_size) for c, n in zip(contexts, sizes)]
    pool_ids = torch.randperm(sum(need), generator=g).tolist()
    tables = [pool_ids[sum(need[:b]):sum(need[:b + 1])] for b in range(len(need))]
    cache = paged_cache(model.args, sum(need), block_size)
    forward_paged(model, cache, paged_batch(contexts, [0] * len(contexts), tables, block_size, sliding_window=window))
    step = paged_batch(feeds, [len(c) for c in contexts], tables, block_size, sliding_window=window,
                       tree_parents=trees)
    logits = forward_paged(model, cache, step)
    assert step.max_position == max(len(c) + (max(tree_depths(t)) if t else len(f) - 1)
                                    for c, f, t in zip(contexts, feeds, trees))
    row = 0
    for context, feed, parents in zip(contexts, feeds, trees):
        parents = parents or list(range(-1, len(feed) - 1))
        for i in range(len(feed)):
            want, kv_want = _chain_reference(model, context, [feed[j] for j in _root_path(parents, i)], block_size,
                                             window)
            torch.testing.assert_close(logits[row], want, rtol=1e-5, atol=1e-5)
            slot = int(step.slot_mapping[row])
            for kv, (k, v) in zip(cache, kv_want):
                torch.testing.assert_close(kv.k.flatten(0, 1)[slot], k, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(kv.v.flatten(0, 1)[slot], v, rtol=1e-5, atol=1e-5)
            row += 1


def _same_batch(x, y):
    for f in fields(PagedBatch):
        u, v = getattr(x, f.name), getattr(y, f.name)
        if f.name == "groups":
            assert len(u) == len(v)
            for gu, gv in zip(u, v):
                assert all((s is None and t is None) or torch.equal(s, t) for s, t in zip(gu, gv))
        elif isinstance(u, torch.Tensor):
            assert torch.equal(u, v), f.name
        else:
            assert u == v, f.name


@pytest.mark.parametrize("window", [None, 3])
def test_chains_as_trees_build_todays_batch(window):
    "tree_parents None, all None, or chains written as parent arrays (and lone roots): the very batch of today."
    blocks, starts = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]], [7, 2, 0, 3]
    tables = [[6, 2, 0], [1], [5, 4], [3, 7]]
    plain = paged_batch(blocks, starts, tables, 4, sliding_window=window)
    for parents in ([None] * 4, [[-1, 0, 1], [-1], None, [-1, 0]], [None, None, list(range(-1, 4)), None]):
        _same_batch(paged_batch(blocks, starts, tables, 4, sliding_window=window, tree_parents=parents), plain)
    tree = paged_batch(blocks, starts, tables, 4, sliding_window=window, tree_parents=[None, None, [-1, 0, 0, 1, 2],
                                                                                          None])
    trusted = paged_batch(blocks, starts, tables, 4, sliding_window=window, check=False,
                          tree_parents=[None, None, [-1, 0, 0, 1, 2], None])
    _same_batch(trusted, tree)
    assert tree.positions.tolist() == plain.positions.tolist()[:4] + [0, 1, 1, 2, 2] + [3, 4]
    assert torch.equal(tree.slot_mapping, plain.slot_mapping)
    assert not torch.equal(tree.attn_mask, plain.attn_mask)


def test_lone_tree_reads_consecutive_keys_in_place():
    "One tree request whose blocks are consecutive takes the key_start path, and its nodes still see their paths."
    model = _random_llama(2, False, seed=3).float()
    context, feed, parents = [5, 9, 2, 7, 1, 8], [3, 4, 5, 6, 7, 8, 9], [-1, 0, 0, 1, 2, 2, 4]
    cache = paged_cache(model.args, 8, 4)
    forward_paged(model, cache, paged_batch([context], [0], [[2, 3, 4, 5]], 4))
    step = paged_batch([feed], [6], [[2, 3, 4, 5]], 4, tree_parents=[parents])
    assert step.key_start == 8
    logits = forward_paged(model, cache, step)
    for i in range(len(feed)):
        want, _ = _chain_reference(model, context, [feed[j] for j in _root_path(parents, i)], 4, None)
        torch.testing.assert_close(logits[i], want, rtol=1e-5, atol=1e-5)


PAGED_ERRORS = [  # (what is called with the model and its cache, the error, what its message says)
    (lambda m, c: paged_batch([[1], []], [0, 0], [[0], [1]], 4), ValueError, r"blocks\[1\] is empty"),
    (lambda m, c: paged_batch([], [], [], 4), ValueError, "at least one request"),
    (lambda m, c: paged_batch([[1, 2, 3]], [2], [[0]], 4), ValueError, r"block_tables\[0\] holds 1 block"),
    (lambda m, c: paged_batch([[1]], [0], [[0], [1]], 4), ValueError, "one entry per request"),
    (lambda m, c: paged_batch([[-1]], [0], [[0]], 4), ValueError, "token ids"),
    (lambda m, c: paged_batch([[1]], [-2], [[0]], 4), ValueError, r"starts\[0\]"),
    (lambda m, c: paged_batch([[1]], [0], [[-5]], 4), ValueError, "block ids"),
    (lambda m, c: paged_batch("ab", [0], [[0]], 4), TypeError, "blocks must be"),
    (lambda m, c: paged_batch([[1]], [0], [[0]], 4, sliding_window=0), ValueError, "sliding_window"),
    (lambda m, c: paged_batch([[1]], [5], [[FREED, 0]], 4, sliding_window=3), ValueError, "freed"),
    (lambda m, c: paged_batch([[1]], [0], [[FREED]], 4), ValueError, "writes position 0"),
    (lambda m, c: forward_paged(m, c, paged_batch([[64]], [0], [[0]], 4)), ValueError, "token ids"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1]], [16], [[0, 1, 2, 3, 0]], 4)), ValueError,
     "max_position_embeddings=16"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1]], [0], [[6]], 4)), ValueError, "holds 6 blocks"),
    (lambda m, c: forward_paged(m, c[:1], paged_batch([[1]], [0], [[0]], 4)), ValueError, "list of 2"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1]], [0], [[0]], 2)), ValueError, "block_size=2"),
    (lambda m, c: forward_paged(m, c, "batch"), TypeError, "PagedBatch"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1, 2]], [0], [[0]], 4), logits_indices=torch.tensor([0.0])),
     TypeError, "logits_indices"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1, 2]], [0], [[0]], 4), logits_indices=torch.tensor([-1])),
     ValueError, "logits_indices"),
    (lambda m, c: paged_cache(m.args, 0, 4), ValueError, "num_blocks"),
    (lambda m, c: paged_batch([[1, 2]], [0], [[0]], 4, tree_parents=[[-1, 0]] * 2), ValueError,
     "tree_parents must have one entry per request"),
    (lambda m, c: paged_batch([[1], [2]], [0, 0], [[0], [1]], 4, tree_parents=(-1, 0)), ValueError,
     r"tree_parents\[0\] must be a non-empty list"),
    (lambda m, c: paged_batch([[1, 2]], [0], [[0]], 4, tree_parents="-1 0"), TypeError, "tree_parents must be None"),
    (lambda m, c: paged_batch([[1, 2], [3]], [0, 0], [[0], [1]], 4, tree_parents=[None, [-1, 0]]), ValueError,
     r"tree_parents\[1\] must hold one parent per token of blocks\[1\] \(1\)"),
    (lambda m, c: paged_batch([[1, 2, 3]], [0], [[0]], 4, tree_parents=[[-1, 0, 2]]), ValueError,
     r"tree_parents\[0\]\[2\] must be an int in \[0, 2\)"),
    (lambda m, c: paged_batch([[1, 2]], [0], [[0]], 4, tree_parents=[[0, 0]]), ValueError,
     r"tree_parents\[0\] must be a non-empty list"),
    (lambda m, c: forward_paged(m, c, paged_batch([[1, 2, 3, 4, 5]], [14], [[0, 1, 2, 3, 4]], 4,
                                                  tree_parents=[[-1, 0, 0, 1, 1]])), ValueError,
     "feeds position 16"),
]


@pytest.mark.parametrize("call,error,match", PAGED_ERRORS)
def test_paged_errors_change_nothing(call, error, match):
    model = _random_llama(2, False, seed=0, context=16)
    cache = paged_cache(model.args, num_blocks=6, block_size=4, dtype=torch.float64)
    for kv in cache:
        kv.k.normal_()
    before = [kv.k.clone() for kv in cache]
    with pytest.raises(error, match=match):
        call(model, cache)
    assert all(torch.equal(kv.k, k0) for kv, k0 in zip(cache, before))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paged_forward_on_cuda_matches_cpu():
    model = _random_llama(2, False, seed=9)
    seqs = [torch.randint(0, 64, (n,)).tolist() for n in (19, 6, 12)]
    feeds = ragged_feeds([len(s) for s in seqs], seed=0)
    ref = cached_walk(model, seqs, feeds)
    got, _ = paged_walk(model.cuda(), seqs, feeds, block_size=4, sliding_window=None)
    assert max(float((a.cpu() - b).abs().max()) for a, b in zip(got, ref)) < 1e-8


def test_load_tokenizer_builds_what_autotokenizer_builds(tmp_path):
    """The shipped pair's tokenizer (a Llama checkpoint naming the fast class) is built without the Auto classes, and
    is the tokenizer AutoTokenizer builds: same class, ids, text and special tokens. A folder naming another class, or
    with another model type, still goes through AutoTokenizer."""
    from transformers import AutoTokenizer

    from speclab.model import _tokenizer_class, load_tokenizer
    from speclab.train import tiny_pair_path
    folder = tiny_pair_path("target")
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(ours) is type(auto) and type(ours).__name__ == "TokenizersBackend"
    text = "def add(a, b):\n    return a + b  # héllo € 日本"
    assert ours(text)["input_ids"] == auto(text)["input_ids"]
    ids = auto(text)["input_ids"]
    assert ours.decode(ids) == auto.decode(ids) == text
    assert (ours.eos_token_id, ours.bos_token_id, ours.chat_template) == (auto.eos_token_id, auto.bos_token_id,
                                                                         auto.chat_template)
    assert ours.get_vocab() == auto.get_vocab()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    assert _tokenizer_class(tmp_path) is type(auto)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert _tokenizer_class(tmp_path) is AutoTokenizer


def test_loading_the_shipped_pair_imports_nothing_heavy():
    """What every CLI command, server and chapter pays before its first token: loading a checkpoint and its tokenizer
    and importing the sweep must not import torch._dynamo (meta-device decompositions did, 1.6 CPU s), transformers'
    Auto registry (1.4 CPU s) or scipy (0.7 CPU s; the statistics import it where they use it). A fresh process."""
    import subprocess
    import sys
    code = ("import sys; from speclab.model import load_model, load_tokenizer; from speclab.train import tiny_pair_path;"
            " import speclab.sweep, speclab.serve, speclab.cli;"
            " load_model(tiny_pair_path('target')); load_tokenizer(tiny_pair_path('target'));"
            " print(sorted(m for m in ('torch._dynamo', 'transformers.models.auto', 'scipy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
