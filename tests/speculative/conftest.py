"""Tiny random targets wrapped as ``Target`` and random EAGLE-3 drafts for them (CPU, float32)."""

from __future__ import annotations

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.loading.target import Target
from tests.conftest import make_hf_model, save_and_load


class CharTokenizer:
    """Token i decodes to one letter, enough for StopChecker's stop strings."""

    eos_token_id = None

    def decode(self, ids, **_):
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


def tiny_target(path, vocab: int = 64, layers: int = 3, seed: int = 0, **overrides) -> Target:
    hf = make_hf_model("llama", seed=seed, vocab_size=vocab, num_hidden_layers=layers, **overrides)
    model, cfg = save_and_load(hf, path)
    return Target(model, CharTokenizer(), cfg, "tiny", path)


def random_draft(target: Target, seed: int = 0, draft_vocab: int | None = None, scale: float = 1.0) -> Eagle3Draft:
    """A randomly initialised draft; ``scale`` sharpens (>1) or flattens its distributions."""
    cfg = target.config
    spec = CaptureSpec(tuple(sorted({1, cfg.num_layers // 2, cfg.num_layers})), cfg.num_layers)
    dv = draft_vocab or cfg.vocab_size
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig.for_target(cfg, spec, dv)).eval()
    with torch.no_grad():
        draft.lm_head.weight.mul_(scale)
        ids = torch.randperm(cfg.vocab_size)[:dv]
        draft.set_vocab(ids)
    for p in draft.parameters():
        p.requires_grad_(False)
    return draft


@pytest.fixture(autouse=True, scope="module")
def one_thread(one_thread):
    """Every test here runs on one thread: the root conftest's fixture, made automatic."""
    yield


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Target:
    return tiny_target(tmp_path_factory.mktemp("tiny-target"))


def echo_draft(target: Target) -> Eagle3Draft:
    """A draft that proposes, at every depth, the target's own distribution at the anchor.

    fc passes the last capture point (the target's pre-norm output) through, attention and
    MLP add nothing, and norm/head are the target's. It agrees with the target wherever the
    target repeats itself, which ``repeat_prone`` makes common: acceptance is partial.
    """
    draft = random_draft(target, seed=1)
    h, k = target.config.hidden_size, draft.config.capture.k
    assert draft.config.capture.points[-1] == target.config.num_layers
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, (k - 1) * h:] = torch.eye(h)
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.lm_head.weight.copy_(target.model.lm_head.weight)
        draft.norm.weight.copy_(target.model.norm.weight)
        draft.set_vocab(torch.arange(target.config.vocab_size))
    return draft


def repeat_prone(target: Target, beta: float = 1.5) -> Target:
    """Tilt the head toward the current token's embedding so the target often repeats itself."""
    with torch.no_grad():
        target.model.lm_head.weight.add_(beta * target.model.embed.weight)
    return target


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory) -> tuple[Target, Eagle3Draft]:
    """A repeat-prone tiny target and its echo draft: accept lengths 1..num_steps+1 all occur."""
    target = repeat_prone(tiny_target(tmp_path_factory.mktemp("agreeing")))
    return target, echo_draft(target)
