"""speclab.model: parity with transformers.LlamaForCausalLM over many tiny configs, batching, sharded loading, errors."""
import json

import pytest
import torch

from speclab.model import KVCache, forward, load_model
from speclab.testing import parity_error, tiny_hf_checkpoint

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
