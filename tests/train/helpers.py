"""A tiny target with a real tokenizer and chat template, loaded through eaglet's own load path.

The tokenizer is byte-level BPE with no merges (256 byte tokens) plus four special
tokens, and a Zephyr-like template (``<|user|>\\n...<|end|>\\n``) unlike SmolLM2's ChatML,
so loss-mask code is tested on two template styles.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from eaglet.data.dataset import TokenData
from eaglet.data.prompts import Conversation
from eaglet.data.template import Tokenized
from eaglet.loading.target import Target, load_target
from tests.conftest import make_hf_model

SPECIALS = ["<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
WORDS = "the a cat dog sat on mat ran to big red blue fox jumps over lazy and or if then".split()


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    fast.chat_template = TEMPLATE
    return fast


def make_tiny_target_dir(path: Path, seed: int = 0, head_scale: float = 4.0, **overrides) -> Path:
    """An HF directory (config, safetensors, tokenizer) of a 3-layer random Llama, vocab 260.

    ``head_scale`` sharpens the LM head so next-token distributions are peaked: the
    target's greedy choices are then a learnable function, as a trained model's are.
    """
    path.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    end = tok.convert_tokens_to_ids("<|end|>")
    overrides = {"vocab_size": len(tok), **overrides}
    hf = make_hf_model("llama", seed=seed, randomize=False, eos_token_id=end, **overrides)
    with torch.no_grad():
        hf.lm_head.weight.mul_(head_scale)
    hf.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    return path


def load_tiny(path: Path) -> Target:
    return load_target(str(path), dtype=torch.float32, device="cpu")


def prompts(n: int, seed: int = 0, split: str | None = None) -> list[Conversation]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        out.append(Conversation(f"p{seed}-{i}", ({"role": "user", "content": text},), split=split))
    return out


def token_data(target: Target, n: int, seed: int) -> TokenData:
    """Random prompts with made-up answers (the trainer's labels come from the target anyway)."""
    from eaglet.chat import encode_chat

    items = []
    for p in prompts(n, seed=seed):
        ids = encode_chat(target.tokenizer, list(p.messages))
        ans = target.tokenizer(" the cat sat on the mat", add_special_tokens=False)["input_ids"]
        items.append(Tokenized(ids + ans, [False] * len(ids) + [True] * len(ans)))
    return TokenData.from_tokenized(items)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture(autouse=True, scope="module")
def one_thread(one_thread):
    """Every test here runs on one thread: the root conftest's fixture, made automatic."""
    yield


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """Session-wide tiny target directory (conftest files of tests/data, train, draft import this)."""
    return make_tiny_target_dir(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir) -> Target:
    return load_tiny(tiny_target_dir)


def interrupt_on_call(monkeypatch, owner, name: str, call: int, times: int = 1, sig=signal.SIGINT) -> None:
    """Send ``sig`` ``times`` times to this process at the end of the ``call``-th call of ``owner.name``."""
    original, calls = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == call:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(owner, name, wrapped)


def answers_end_after(monkeypatch, n: int) -> None:
    """Every generated answer ends (finish_reason "stop") after ``n`` tokens: the tiny random target
    seldom writes its end-of-turn token, and some stages only continue answers that ended."""
    from eaglet.generate import StopChecker

    original = StopChecker.check

    def check(self, tokens, n_new=1):
        keep = original(self, tokens, n_new)
        return keep if keep is not None or len(tokens) < n else len(tokens)

    monkeypatch.setattr(StopChecker, "check", check)


def count_generators(monkeypatch, where: str = "eaglet.data.refill") -> tuple[list, list[int]]:
    """Record each generator the module ``where`` builds (regeneration's answers by default; the turn writer's
    with ``eaglet.data.self_prompts``) and each session batch it opens: (generators, batches)."""
    from eaglet.generate import PlainGenerator

    built, batches = [], []

    class Counted(PlainGenerator):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

        def session(self, batch, *args, **kwargs):
            batches.append(batch)
            return super().session(batch, *args, **kwargs)

    monkeypatch.setattr(f"{where}.PlainGenerator", Counted)
    return built, batches


def stages_apart(monkeypatch) -> None:
    """Every stage of ``answer_sources`` builds its own generator, as before runs shared one."""
    import eaglet.data.sources as sources

    apart = sources.regenerate
    monkeypatch.setattr(sources, "regenerate", lambda *args, refill=None, **kwargs: apart(*args, **kwargs))
