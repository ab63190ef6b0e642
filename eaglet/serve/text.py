"""Streamed text: what each step's new tokens add to an answer's text, stop strings left out.

Decoding the whole answer at every step costs O(length) each time (~50 us at 256 tokens,
paid per row and step on the thread that also serves HTTP). ``StreamText`` decodes only
the tokens after its last checkpoint, plus a few before it as context: a checkpoint is set
where the text so far ends in a whole character, so tokens that follow cannot change it.
Tokenizers whose transformers ``decode`` is not the Rust decoder's text (a clean-up of
spaces that edits across tokens, where it applies: ``detokenize.rust_decoder``) decode the
whole answer, as does any step whose window does not decode to a prefix of its extension.
A windowed decoder without checkpoints (session 8) differed from the whole decode on bytes
that never complete a character.
"""

from __future__ import annotations

from eaglet.detokenize import rust_decoder

WINDOW = 4  # tokens decoded again before a checkpoint: a decoder strips a slice's leading space, say


class StreamText:
    """What new tokens add to the text; stop strings left out.

    The engine stops at the token that completes a stop string; as OpenAI does, the text
    ends before the stop string. While streaming, the last ``len(stop) - 1`` characters
    wait (they may begin a stop string), as does a multi-byte character still being written.
    """

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.stops, self.ids, self.sent = stops, [], 0
        self.hold = max((len(x) for x in stops), default=1) - 1
        # A fast tokenizer's Rust decoder, called directly where it gives transformers' text: what
        # transformers adds around it cost as much again as decoding a window. Otherwise transformers'
        # decode may clean up spaces across tokens, so the whole answer is decoded each time.
        backend = rust_decoder(tokenizer)
        self.local = backend is not None
        self._decoder = backend.decode if backend is not None else tokenizer.decode
        # ids[:mark] decode to ``marked`` whatever follows; ids[mark - WINDOW:mark] decode to ``window``.
        self.mark, self.marked, self.window = 0, "", ""

    def _decode(self, ids: list[int]) -> str:
        return self._decoder(ids, skip_special_tokens=True)

    def _text(self) -> str:
        """The text of every token so far."""
        if not self.local:
            return self._decode(self.ids)
        after = self._decode(self.ids[max(0, self.mark - WINDOW):])
        if after.startswith(self.window):
            text = self.marked + after[len(self.window):]
        else:  # not a local decoder after all: decode everything
            text = self._decode(self.ids)
        if not text.endswith("\ufffd"):  # a whole character last: later tokens cannot change this text
            self.mark, self.marked = len(self.ids), text
            self.window = self._decode(self.ids[max(0, self.mark - WINDOW):])
        return text

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids += ids
        text = self._text()
        cut = min((i for i in (text.find(x) for x in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        elif not final:
            text = text[: len(text) - self.hold]
            if text.endswith("\ufffd"):
                return ""
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return new
