"""speclab.model.Detokenizer against full decodes: the shipped byte-level BPE tokenizer over random ids (pieces of
multi-byte characters, the end-of-text token), a SentencePiece-style tokenizer (leading space stripped, byte fallback)
built here offline, and a tokenizer that changes text already read; special tokens skipped (vLLM's default) or kept;
the window each decode sees, and bad input."""
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from speclab.model import Detokenizer, load_tokenizer
from speclab.train import tiny_pair_path

TOK = load_tokenizer(tiny_pair_path("target"))
EOS = TOK.eos_token_id
SPLIT = [i for i in range(len(TOK)) if "\ufffd" in TOK.decode([i])]   # ids holding part of a multi-byte character


def sentencepiece_style() -> PreTrainedTokenizerFast:
    "A Llama-2-style tokenizer: '▁' for spaces, byte tokens for what the vocabulary lacks, the first space stripped."
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab", ".", "日", "é"]
    merges = [("▁", "a"), ("▁", "b"), ("a", "b"), ("▁a", "b")]
    t = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges, unk_token="<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


SP = sentencepiece_style()


class CleanUp:
    "A tokenizer whose decode changes text already read: ' .' becomes '.' once the '.' arrives."
    def __init__(self, tok):
        self.tok = tok
        self.all_special_ids = tok.all_special_ids

    def decode(self, ids):
        return self.tok.decode(ids).replace(" .", ".")


class Recording:
    "A tokenizer that remembers how many ids each decode call was given."
    def __init__(self, tok):
        self.tok = tok
        self.sizes = []
        self.all_special_ids = tok.all_special_ids

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self.tok.decode(ids)


def full_text(tok, ids, stop, skip_ids) -> str:
    "The reference: every kept id decoded at once, cut before the first stop string."
    text = tok.decode([t for t in ids if t not in skip_ids])
    cuts = [text.find(s) for s in stop if s in text]
    return text[:min(cuts)] if cuts else text


@st.composite
def cases(draw, tok, vocab, split, eos):
    """Random ids (a third of them pieces of characters), stop strings cut from their own text or made up, skip_ids,
    and whether special tokens are skipped (the ids the text drops are then skip_ids and the special ids)."""
    ids = draw(st.lists(st.one_of(st.sampled_from(split), st.sampled_from(split), st.integers(0, vocab - 1),
                                  st.just(eos)), max_size=40))
    skip = draw(st.sampled_from([(), (eos,)]))
    skip_special = draw(st.booleans())
    dropped = set(skip) | (set(tok.all_special_ids) if skip_special else set())
    text = tok.decode([t for t in ids if t not in dropped])
    made_up = st.text(alphabet="ab .日é\ufffd<", min_size=1, max_size=3)
    if text:
        cut = st.tuples(st.integers(0, len(text) - 1), st.integers(1, 4)).map(lambda a: text[a[0]:a[0] + a[1]])
        made_up = st.one_of(cut, cut, made_up)
    stop = draw(st.lists(made_up, max_size=3))
    return ids, stop, skip, skip_special


def check_law(tok, ids, stop, skip, stable=True, skip_special=True):
    """push says True at the first token whose full decode holds a stop; text is the cut decode; the stream never
    retracts. stable: the tokenizer's decode never changes text that ended in a whole character (byte-level BPE)."""
    d = Detokenizer(tok, stop, skip, skip_special_tokens=skip_special)
    skip = set(skip) | (set(tok.all_special_ids) if skip_special else set())   # what the reference decode drops
    shown = ""
    taken = ""
    n = len(ids)
    for j, t in enumerate(ids):
        stopped = d.push(t)
        assert stopped == any(s in tok.decode([x for x in ids[:j + 1] if x not in skip]) for s in stop), (j, t)
        assert d.text == full_text(tok, ids[:j + 1], stop, skip)
        if stable:
            assert d.override is None
        if d.override is None:
            assert d.text.startswith(d.visible())
        assert d.visible().startswith(shown) or d.override is not None or not stable
        shown = d.visible()
        taken += d.take()
        assert taken == shown or not stable
        if stopped:
            n = j + 1
            assert d.visible() == d.text
            break
    d.finish()
    assert d.text == full_text(tok, ids[:n], stop, skip)
    assert d.visible() == d.text
    taken += d.take()
    if d.override is None and stable:
        assert taken == d.text
    return d


@given(cases(TOK, len(TOK), SPLIT, EOS))
def test_shipped_tokenizer_matches_full_decode(case):
    ids, stop, skip, skip_special = case
    check_law(TOK, ids, stop, skip, skip_special=skip_special)


SP_SPLIT = [SP.convert_tokens_to_ids(f"<0x{b:02X}>") for b in (0xE6, 0x97, 0xA5, 0xC3, 0xA9, 0x80)]


@given(cases(SP, len(SP), SP_SPLIT, SP.eos_token_id))
def test_sentencepiece_style_tokenizer_matches_full_decode(case):
    ids, stop, skip, skip_special = case
    check_law(SP, ids, stop, skip, stable=False, skip_special=skip_special)


@given(cases(TOK, len(TOK), SPLIT + TOK(" . .")["input_ids"], EOS))
def test_text_stays_exact_when_decode_changes_text_already_read(case):
    ids, stop, skip, skip_special = case
    check_law(CleanUp(TOK), ids, stop, skip, stable=False, skip_special=skip_special)


LETTERS = [TOK.convert_tokens_to_ids(c) for c in "ab"]   # one-character tokens: stops span many tokens


@given(st.lists(st.sampled_from(LETTERS), max_size=30), st.lists(st.text("ab", min_size=1, max_size=5), max_size=3))
def test_stop_strings_spanning_tokens(ids, stop):
    "Stops over a two-letter alphabet, one letter a token: every hold and every cut falls between tokens."
    check_law(TOK, ids, stop, ())


def test_special_tokens_are_skipped_by_default():
    """An EOS that does not end the request (ignore_eos, a logit_bias forcing it) is not in the text unless
    skip_special_tokens is False (vLLM's default is True); a stop string is found across a skipped token, and the
    streamed pieces add up to the text either way."""
    ab = TOK("ab")["input_ids"]
    assert len(ab) == 1
    for skip_special, want in [(True, "ab" * 20), (False, ("ab" + TOK.eos_token) * 20)]:
        d = Detokenizer(TOK, skip_special_tokens=skip_special)
        taken = ""
        for t in (ab + [EOS]) * 20:
            assert d.push(t) is False
            taken += d.take()
        d.finish()
        taken += d.take()
        assert (d.text, taken) == (want, want)
    assert Detokenizer(TOK).skip_ids == {EOS}                            # the tokenizer's all_special_ids
    for skip_special, pushed in [(True, [False, False, True]), (False, [False, False, False])]:   # "ab" is a token
        d = Detokenizer(TOK, stop=["ba"], skip_special_tokens=skip_special)
        assert [d.push(t) for t in ab + [EOS] + ab] == pushed
        assert d.text == ("a" if skip_special else "ab" + TOK.eos_token + "ab")        # cut before "ba"


def test_sentencepiece_leading_space_and_bytes():
    ids = SP("ab ab 日é")["input_ids"]
    d = Detokenizer(SP)
    for t in ids:
        d.push(t)
    assert d.text == SP.decode(ids) == "ab ab 日é"


@pytest.mark.parametrize("n", [100, 3000])
def test_each_decode_sees_a_window(n):
    "At the 3,000th token as at the 100th, a decode is given a few ids (the lookback and the new token), never all."
    ids = (TOK("The quick brown fox jumps over the lazy dog, héllo € 日本. ")["input_ids"] * 200)[:n]
    rec = Recording(TOK)
    d = Detokenizer(rec, stop=["never said"])
    for t in ids:
        d.push(t)
    assert d.text == TOK.decode(ids)
    assert len(rec.sizes) <= 2 * n
    assert max(rec.sizes) <= 6


def test_stop_string_across_tokens_and_hold():
    ids = TOK("héllo € 日本")["input_ids"]
    d = Detokenizer(TOK, stop=["€ 日"], skip_ids=[EOS])
    out = [d.push(t) for t in ids[:13]]
    assert out == [False] * 12 + [True]                  # the 13th token completes "日"
    assert d.text == "héllo "
    with pytest.raises(ValueError, match="push after the text ended"):
        d.push(ids[13])


def test_bad_input():
    with pytest.raises(TypeError, match="stop must be a sequence of strings"):
        Detokenizer(TOK, stop="a")
    with pytest.raises(TypeError, match="stop must be a sequence of strings"):
        Detokenizer(TOK, stop=[1])
    with pytest.raises(ValueError, match="stop strings must not be empty"):
        Detokenizer(TOK, stop=["a", ""])
    with pytest.raises(TypeError, match="skip_ids must be token ids"):
        Detokenizer(TOK, skip_ids=[True])
    with pytest.raises(TypeError, match="skip_special_tokens must be True or False"):
        Detokenizer(TOK, skip_special_tokens=1)
    d = Detokenizer(TOK)
    with pytest.raises(TypeError, match="token_id must be an int"):
        d.push("1")
    with pytest.raises(ValueError, match="token_id must be >= 0"):
        d.push(-3)
    assert d.ids == [] and d.text == ""
    d.finish()
    with pytest.raises(ValueError, match="push after the text ended"):
        d.push(5)
