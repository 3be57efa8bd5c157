"""Tests of speclab.roofline (Chapter 2): parameter counts against transformers, the speedup model's regimes,
the optimisers, the loaders and the CLI, and bad input."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from speclab.proof import expected_tokens
from speclab.roofline import (GPUS, GPUSpec, ModelSpec, batch_speedup, break_even_alpha, compaction_bytes,
                              compute_bound_speedup, context_crossing_batch, context_speedup, cost_ratio,
                              crossing_batch, decode_floor, dtype_bytes, expected_tokens_from_rates,
                              exponential_bytes, get_gpu, known_models, kv_slots_per_step, max_concurrency,
                              naive_speedup, optimal_kappa, reserved_kv_bytes, ridge, roofline_summary, step_cost,
                              SPEEDUP_TIE)

TARGET, DRAFT = ModelSpec.load("llama-3-8b"), ModelSpec.load("llama-3.2-1b")


# --- parameter counts ------------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6).map(lambda h: h * 2), st.sampled_from([1, 2]), st.integers(4, 12).map(lambda x: 2 * x), st.integers(1, 3),
       st.booleans(), st.booleans(), st.integers(17, 300))
def test_total_params_match_transformers(heads, kv_div, head_dim, layers, tied, explicit_head_dim, vocab):
    "total_params equals the element count of a real LlamaForCausalLM for random small shapes."
    from transformers import LlamaConfig, LlamaForCausalLM
    hidden = heads * 8
    kw = dict(head_dim=head_dim) if explicit_head_dim else {}
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // kv_div, tie_word_embeddings=tied, **kw)
    model = LlamaForCausalLM(cfg)
    spec = ModelSpec.from_config(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    # streamed = everything but the input embedding (the head is streamed even when tied)
    assert spec.streamed_params == spec.total_params - (0 if tied else vocab * hidden)


def test_shipped_configs_load():
    assert {"llama-3-8b", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"} <= set(known_models())
    big = ModelSpec.load("llama-3.1-70b")
    assert 70.0e9 < big.total_params < 71.0e9
    assert ModelSpec.load("llama-3.1-8b").streamed_params == TARGET.streamed_params  # same architecture as 3-8B


def test_load_from_path_and_folder(tmp_path):
    cfg = json.loads((Path(__file__).parent.parent / "speclab/data/configs/llama-3.2-1b.json").read_text())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    assert ModelSpec.load(tmp_path / "ckpt").streamed_params == DRAFT.streamed_params
    assert ModelSpec.load(str(tmp_path / "ckpt" / "config.json")).head_dim == 64


# --- the speedup model ---------------------------------------------------------------------------------------------------

alphas, kappas, cs = st.floats(0.0, 1.0), st.integers(1, 12), st.floats(0.0, 0.9)


@settings(max_examples=200, deadline=None)
@given(alphas, kappas, cs, st.floats(50, 1000))
def test_batch_speedup_regimes(alpha, kappa, c, t_star):
    Bs = np.logspace(0, 4, 200)
    S = batch_speedup(alpha, kappa, c, Bs, t_star)
    assert np.all(np.diff(S) <= 1e-12)                                            # never rises with the batch
    small = Bs <= t_star / (kappa + 1)
    np.testing.assert_allclose(S[small], naive_speedup(alpha, kappa, c), rtol=1e-12)  # regime 1: textbook
    np.testing.assert_allclose(S[Bs >= t_star], compute_bound_speedup(alpha, kappa, c), rtol=1e-12)  # regime 3
    assert compute_bound_speedup(alpha, kappa, c) <= 1 + 1e-12


@settings(max_examples=200, deadline=None)
@given(alphas, kappas, cs, st.floats(50, 1000))
@example(alpha=1.0, kappa=2, c=0.0, t_star=341.98)   # the tie found by an unseeded run: S = 1 exactly beyond T*
@example(alpha=1.0, kappa=12, c=0.0, t_star=50.0)
@example(alpha=1e-12, kappa=1, c=0.0, t_star=50.0)   # S(1) - 1 = 1.00009e-12: a tie by naive_speedup's rounding only
def test_crossing_batch(alpha, kappa, c, t_star):
    B = crossing_batch(alpha, kappa, c, t_star)
    if alpha == 1.0 and c == 0.0:
        assert B == t_star                            # Chapter 2's rule for the tie: it stops paying at T*
    if float(batch_speedup(alpha, kappa, c, 1.0, t_star)) - 1 <= SPEEDUP_TIE:   # S never rises with B: never pays
        assert B == 0.0
        return
    assert 1 <= B <= t_star
    assert abs(float(batch_speedup(alpha, kappa, c, B, t_star)) - 1) < 1e-6
    E = float(expected_tokens(alpha, kappa))
    closed = t_star * (E - kappa * c) / (kappa + 1)
    if t_star / (kappa + 1) <= closed <= t_star: assert abs(B - closed) < 1e-5 * t_star  # regime-2 closed form


@settings(max_examples=200, deadline=None)
@given(kappas, st.floats(0.0, 0.99))
def test_break_even_alpha(kappa, c):
    a = break_even_alpha(kappa, c)
    assert 0 <= a <= 1
    assert abs(naive_speedup(a, kappa, c) - 1) < 1e-9
    if a > 0.01: assert naive_speedup(a - 0.01, kappa, c) < 1 < naive_speedup(min(1, a + 0.01), kappa, c) + 1e-12


def test_break_even_alpha_never():
    assert math.isnan(break_even_alpha(3, 1.0))


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 0.99), st.floats(0.01, 0.9))
def test_optimal_kappa_is_argmax(alpha, c):
    k = optimal_kappa(alpha, c, max_kappa=20)
    best = max(naive_speedup(alpha, j, c) for j in range(1, 21))
    assert naive_speedup(alpha, k, c) == best


def test_optimal_kappa_moves_right_with_alpha():
    c = cost_ratio(DRAFT, TARGET)
    ks = [optimal_kappa(a, c) for a in np.linspace(0.3, 0.95, 30)]
    assert ks == sorted(ks) and ks[-1] > ks[0]


@settings(max_examples=100, deadline=None)
@given(alphas, kappas)
def test_expected_tokens_from_rates_iid(alpha, kappa):
    assert abs(expected_tokens_from_rates(alpha ** np.arange(1, kappa + 1)) - float(expected_tokens(alpha, kappa))) < 1e-12


def test_context_model_reduces_to_roofline():
    c, t_star = cost_ratio(DRAFT, TARGET), ridge("h100")
    b0 = context_crossing_batch(TARGET, DRAFT, "h100", 0.7, 3, 0)
    assert abs(b0 - crossing_batch(0.7, 3, c, t_star)) < 0.01 * b0
    # separate KV reads: long contexts make speculation lose at smaller batches
    assert context_crossing_batch(TARGET, DRAFT, "h100", 0.7, 3, 4096, kv_shared=False) < b0
    assert context_speedup(TARGET, DRAFT, "h100", 0.7, 3, 1000, 8192) > 1  # shared reads: still pays at B = 1000


# --- memory -------------------------------------------------------------------------------------------------------------

def test_reservations_and_traffic():
    assert [kv_slots_per_step("plain"), kv_slots_per_step("vllm", 3), kv_slots_per_step("vllm", 3, draft_slots=2)] == [1, 4, 6]
    assert kv_slots_per_step("sglang", 3) == 8 and kv_slots_per_step("sglang", 3, topk=4, draft_tokens=8) == 24
    assert reserved_kv_bytes(TARGET, 64, 8) == 64 * 2**20
    assert max_concurrency(TARGET, 40e9, 0, 8) == int(40e9 // (8 * 2**17))
    assert compaction_bytes(TARGET, 64, 2.5) == 40 * 2**20
    assert exponential_bytes(64, 128_256) == 64 * 128_256 * 4


def test_step_cost_and_floor():
    assert step_cost(10, 100) == 1.0 and step_cost(200, 100) == 2.0
    ms, tok_s = decode_floor(TARGET, GPUSpec("half", GPUS["h100"].bandwidth / 2, GPUS["h100"].flops))
    assert abs(ms - 2 * decode_floor(TARGET, "h100")[0]) < 1e-9 and abs(tok_s * ms / 1e3 - 1) < 1e-12


# --- bad input ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: naive_speedup(1.5, 3, 0.1), "alpha"),
    (lambda: naive_speedup(0.5, 0, 0.1), "kappa"),
    (lambda: naive_speedup(0.5, 3, -0.1), "c must be"),
    (lambda: batch_speedup(0.5, 3, 0.1, 0, 295), "batch"),
    (lambda: roofline_summary("llama-3-8b", "llama-3.2-1b", batch=0), "batch"),
    (lambda: get_gpu("tpu-v5"), "h100"),
    (lambda: ModelSpec.load("mystery-7b"), "llama-3-8b"),
    (lambda: ModelSpec.from_config({"model_type": "gpt_neox", "vocab_size": 10}), "Llama-family"),
    (lambda: ModelSpec.from_config({"model_type": "llama", "vocab_size": 10}), "missing"),
    (lambda: dtype_bytes("fp64x"), "dtype"),
    (lambda: GPUSpec("x", 1e12, float("nan")), "flops"),
    (lambda: kv_slots_per_step("eagle", 3), "method"),
    (lambda: expected_tokens_from_rates([0.5, 1.2]), "rates"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_cli_json_and_errors():
    exe = Path(sys.executable).parent / "speclab"
    r = subprocess.run([exe, "roofline", "--target", "llama-3-8b", "--draft", "llama-3.2-1b", "--gpu", "h200",
                        "--kappa", "3", "--alpha", "0.7", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert abs(s["ridge"] - 206.1) < 0.1 and 100 < s["crossing_batch"] < 110
    r = subprocess.run([exe, "roofline", "--gpu", "v100"], capture_output=True, text=True)
    assert r.returncode == 2 and "h100" in r.stderr
