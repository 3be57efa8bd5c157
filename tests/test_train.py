"""speclab.train and the shipped tiny pair: the training script end to end (tiny run, resume), the shipped files
(size, format, parity with transformers, tokenizer), held-out acceptance, and bad input.

Nothing here depends on the running interpreter's standard library except where it says so: the held-out prompts come
from the evaluation set shipped with the pair, and the corpus digest is compared only on the Python whose library
trained it (tests/test_portable.py runs this file against a substituted standard library)."""
import json
import math
import shutil
import sysconfig

import pytest
import torch

from speclab.model import forward, generate, KVCache, load_model, load_tokenizer
from speclab.testing import parity_error
from speclab.train import (corpus_files, encode_texts, eval_loss, eval_prompts, greedy_acceptance, is_heldout, main,
                           read_corpus, shipped_heldout_ids, tiny_pair_path)

pytestmark = pytest.mark.xdist_group("train")   # one worker: its module fixtures are built once

PAIR = tiny_pair_path("target").parent


@pytest.fixture(scope="module")
def corpus():
    return read_corpus()


@pytest.fixture(scope="module")
def pair():
    return load_model(tiny_pair_path("target")), load_model(tiny_pair_path("draft")), load_tokenizer(tiny_pair_path("target"))


def test_shipped_files_and_size():
    files = [p for p in PAIR.rglob("*") if p.is_file()]
    names = {p.relative_to(PAIR).as_posix() for p in files}
    for m in ("target", "draft"):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"): assert f"{m}/{f}" in names
    assert "train_log.json" in names and "heldout_ids.npy" in names
    assert sum(p.stat().st_size for p in files) <= 40e6


def test_training_log():
    "The log describes the shipped files: its step counts and token count match, and its held-out losses recompute."
    log = json.loads((PAIR / "train_log.json").read_text())
    held = shipped_heldout_ids()
    assert len(held) == log["heldout_tokens"]
    assert log["target"][-1]["step"] == log["args"]["target_steps"]
    assert log["draft"][-1]["step"] == log["args"]["draft_steps"]
    losses = {m: eval_loss(load_model(tiny_pair_path(m)), held, log["args"]["seq_len"]) for m in ("target", "draft")}
    for m, loss in losses.items():  # a property of the weights, so recomputed, not read back
        assert abs(loss - log[f"{m}_heldout_loss"]) < 1e-3, (m, loss, log[f"{m}_heldout_loss"])
    assert losses["target"] < losses["draft"] < math.log(4096)  # both far below a uniform guess over the vocabulary


def test_corpus_is_the_training_corpus_where_it_can_be(corpus, pair):
    "On the Python that trained the pair, this library is the corpus, and the shipped held-out stream re-encodes."
    log = json.loads((PAIR / "train_log.json").read_text())
    if corpus[1] != log["corpus_digest"]:
        pytest.skip(f"this standard library (corpus {corpus[1]}) is not the one that trained the pair "
                    f"({log['corpus_digest']}, Python {log['python']}); the shipped evaluation set stands in for it")
    assert torch.equal(shipped_heldout_ids(), encode_texts(pair[2].backend_tokenizer, corpus[0]["heldout"]))


def test_shipped_pair_matches_transformers(pair):
    from transformers import AutoModelForCausalLM
    target, draft, tok = pair
    ids = eval_prompts(n=1, prompt_len=40, seed=5)[0]
    for name, model in (("target", target), ("draft", draft)):
        hf = AutoModelForCausalLM.from_pretrained(str(tiny_pair_path(name)), dtype=torch.float32).eval()
        assert parity_error(hf, model, torch.tensor(ids), prefill=30) < 1e-4, name


def test_shared_tokenizer_round_trips(pair):
    target, draft, tok = pair
    assert load_tokenizer(tiny_pair_path("draft")).get_vocab() == tok.get_vocab()
    assert target.args.vocab_size == draft.args.vocab_size == len(tok)
    text = "class Foo(Bar):\n    def __init__(self, x=1):\n        self.x = x  # é\n"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_heldout_greedy_acceptance_at_least_half(pair):
    """Deterministic (greedy, fixed prompts): the pair's per-token greedy acceptance on held-out files is >= 0.5."""
    target, draft, tok = pair
    prompts = eval_prompts(n=12, prompt_len=48, seed=1)
    assert greedy_acceptance(target, draft, prompts, new_tokens=24) >= 0.5


def test_context_limit(pair):
    target, _, tok = pair
    ctx = target.args.max_position_embeddings
    assert ctx == 512
    with pytest.raises(ValueError, match="context of 512"): generate(target, None, [1] * 500, max_new_tokens=20)
    with pytest.raises(ValueError, match="max_position_embeddings=512"):
        forward(target, torch.ones(1, 513, dtype=torch.long), KVCache(target.args, 1, 600))


@pytest.mark.parametrize("edit,match", [
    (lambda cfg: {**cfg, "model_type": "gpt2"}, "model_type"),
    (lambda cfg: {**cfg, "intermediate_size": 700}, "tensor model.layers.0.mlp.gate_proj.weight has shape"),
])
def test_bad_checkpoint_copies(tmp_path, edit, match):
    d = tmp_path / "t"
    shutil.copytree(tiny_pair_path("draft"), d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(edit(cfg)))
    with pytest.raises(ValueError, match=match): load_model(d)
    (d / "model.safetensors").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="model.safetensors"): load_model(d)


SAMPLE_EVERY = 8   # the end-to-end run trains on every held-out file and one training file in 8


@pytest.fixture
def sampled_stdlib(tmp_path, monkeypatch):
    """The standard library as the script sees it, cut to a sample (every held-out file, one training file in
    SAMPLE_EVERY, same relative paths): the script does the same work on a sixth of the text, whose encoding is
    most of its cost. Sampled from the library `sysconfig` names, so tests/test_portable.py's substitute is used."""
    root, files = corpus_files()
    lib = tmp_path / "stdlib-sample"
    train = [f for f in files if not is_heldout(f.relative_to(root))]
    kept = [f for f in files if is_heldout(f.relative_to(root))] + train[::SAMPLE_EVERY]
    for f in kept:
        dest = lib / f.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    get_paths = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**get_paths(*a, **k), "stdlib": str(lib)})
    split, _ = read_corpus()
    assert split["heldout"] and len(split["train"]) == len(train[::SAMPLE_EVERY]), "the sample is not the corpus read"
    return lib


def test_train_script_end_to_end_and_resume(tmp_path, sampled_stdlib):
    """A tiny run of the real script (a sample of the stdlib corpus, BPE, 12-layer target, distilled draft), then a
    rerun that resumes."""
    out = tmp_path / "pair"
    argv = ["--out", str(out), "--target-steps", "2", "--draft-steps", "2", "--seq-len", "32", "--batch-size", "2",
            "--vocab-size", "512", "--no-progress"]
    log = main(argv)
    assert [e["step"] for e in log["target"]] == [1, 2] and [e["step"] for e in log["draft"]] == [1, 2]
    target, draft, tok = load_model(out / "target"), load_model(out / "draft"), load_tokenizer(out / "draft")
    assert target.args.num_layers == 12 and draft.args.num_layers == 2 and len(tok) == 512
    before = {k: v.clone() for k, v in target.state_dict().items()}
    log2 = main(argv)                                         # resumes: both checkpoints are complete, nothing retrains
    assert log2["target"] == log["target"] and log2["draft"] == log["draft"]
    after = load_model(out / "target").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_train_script_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e: main(["--target-steps", "0"])
    assert e.value.code == 2 and "--target-steps must be >= 1" in capsys.readouterr().err


def _unfused_init(args, seed):
    """The recipe the shipped pair was trained from, written out with Hugging Face's separate matrices: build the
    modules in a checkpoint's order (each nn.Linear's own init draws from the generator), then draw every matrix."""
    from torch import nn
    torch.manual_seed(seed)
    d, hd = args.hidden_size, args.head_dim
    mods = {"model.embed_tokens": nn.Embedding(args.vocab_size, d)}
    for i in range(args.num_layers):
        shapes = {"self_attn.q_proj": (d, args.num_heads * hd), "self_attn.k_proj": (d, args.num_kv_heads * hd),
                  "self_attn.v_proj": (d, args.num_kv_heads * hd), "self_attn.o_proj": (args.num_heads * hd, d),
                  "mlp.gate_proj": (d, args.intermediate_size), "mlp.up_proj": (d, args.intermediate_size),
                  "mlp.down_proj": (args.intermediate_size, d)}
        for name, (n_in, n_out) in shapes.items():
            mods[f"model.layers.{i}.{name}"] = nn.Linear(n_in, n_out, bias=False)
    if not args.tied_embeddings:
        mods["lm_head"] = nn.Linear(d, args.vocab_size, bias=False)
    out = {}
    for name, mod in mods.items():
        residual_out = name.endswith(("o_proj", "down_proj"))
        std = 0.02 / math.sqrt(2 * args.num_layers) if residual_out else 0.02
        out[name + ".weight"] = torch.nn.init.normal_(mod.weight.detach(), std=std)
    return out


@pytest.mark.parametrize("which", ["target", "draft", "toy-untied"])
def test_init_model_draws_what_the_unfused_recipe_drew(which):
    "Fusing q/k/v and gate/up changed no initial weight: the shipped pair's training recipe is the same."
    from speclab.model import LlamaArgs, hf_state_dict
    from speclab.train import init_model, pair_args
    target, draft = pair_args()
    toy = LlamaArgs(name="toy", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=8, tied_embeddings=False)
    args, seed = {"target": (target, 0), "draft": (draft, 1), "toy-untied": (toy, 5)}[which]
    ours = hf_state_dict(init_model(args, seed))
    ref = _unfused_init(args, seed)
    matrices = [k for k, v in ours.items() if v.dim() == 2]
    assert matrices == list(ref)                                       # the same matrices, in the same order
    assert all(torch.equal(ours[k], ref[k]) for k in matrices)


def test_save_hf_writes_hugging_face_tensors(tmp_path):
    "save_hf splits the fused projections: the folder opens in transformers and computes what the model does."
    from transformers import AutoModelForCausalLM
    from speclab.model import LlamaArgs
    from speclab.train import init_model, save_hf
    args = LlamaArgs(name="toy", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=1, head_dim=8, tied_embeddings=False)
    model = init_model(args, 3).eval()
    save_hf(model, tmp_path, max_len=64, dtype=torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert "model.layers.0.self_attn.q_proj.weight" in hf.state_dict()
    assert parity_error(hf, model, torch.randint(0, 300, (20,)), prefill=9) < 1e-4
