"""Token ids back to text through the fast tokenizer's Rust decoder, where transformers adds nothing to it.

transformers' ``decode`` wraps the Rust call in Python work (converting the ids, checking types) that
costs as much again as the decode itself, and it may clean up spaces before punctuation
(``clean_up_tokenization_spaces``), which edits across tokens. Whether it does depends on the
tokenizer's kind and on the transformers version (5.17 keeps the flag set for SmolLM2's BPE tokenizer
and then skips the clean-up; 5.25 clears it), so the flag alone does not tell: one probe text with
every pattern the clean-up edits is decoded both ways, once per tokenizer.
"""

from __future__ import annotations

from functools import lru_cache

_PROBE = "a . b ? c ! d , e ' f n't g 'm h 's i 've j 're k"  # what clean_up_tokenization rewrites


@lru_cache(maxsize=16)
def rust_decoder(tokenizer):
    """The tokenizer's Rust ``tokenizers.Tokenizer`` when its ``decode`` returns the same text as
    transformers' ``decode`` (special tokens skipped), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    ids = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    same = backend.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids, skip_special_tokens=True)
    return backend if same else None


def decode_many(tokenizer, seqs: list[list[int]]) -> list[str]:
    """The text of each sequence, special tokens skipped: one batched Rust call (it decodes on several
    threads) where that gives transformers' text, else transformers' ``decode`` one by one."""
    backend = rust_decoder(tokenizer)
    if backend is None:
        return [tokenizer.decode(s, skip_special_tokens=True) for s in seqs]
    return backend.decode_batch(seqs, skip_special_tokens=True)
