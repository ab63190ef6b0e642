"""A SpecForge/SGLang EAGLE-3 draft written for Kimi-K2 or DeepSeek-V3, imported for a DeepSeek-V3 target.

Their ``eagle_aux_hidden_state_layer_ids`` name "the output of layer i" (SGLang's convention):
our point i + 1. The conversion is the explicit code in capture.py, applied at import.
"""

from __future__ import annotations

import json

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.cli import main
from eaglet.draft.checkpoint import read_capture, save_draft
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.errors import EagletError

# The capture ids of SpecForge's configs/kimi-k2-eagle3.json and configs/deepseek-v3-671b-eagle3.json (61 layers).
KIMI_IDS, DSV3_IDS = [2, 30, 58], [1, 29, 57]


def test_specforge_ids_for_61_layers_are_outputs_of_layers():
    assert read_capture({"eagle_config": {"eagle_aux_hidden_state_layer_ids": KIMI_IDS}}, 61).points == (3, 31, 59)
    dsv3 = read_capture({"eagle_config": {"eagle_aux_hidden_state_layer_ids": DSV3_IDS}}, 61)
    assert dsv3 == CaptureSpec.eagle3_default(61)  # SpecForge's [1, N//2-1, N-4] is EAGLE-3's [2, N//2, N-3]
    with pytest.raises(EagletError, match="outside 0..60"):
        read_capture({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 61]}}, 61)


def _kimi_style_draft(path, vocab: int):
    """A random draft saved, then its config.json rewritten the way SpecForge's Kimi-K2 config reads:
    no eaglet block, model_type kimi_k2, MHA heads of 32, ids [0, 1, 3] (= our points [1, 2, 4])."""
    torch.manual_seed(3)
    c = DraftConfig(hidden_size=64, intermediate_size=96, num_heads=2, num_kv_heads=2, head_dim=32,
                    vocab_size=vocab, draft_vocab_size=vocab, capture=CaptureSpec((1, 2, 4), 4), rope_theta=50000.0)
    save_draft(Eagle3Draft(c), path, dtype=torch.float32)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("eaglet")
    cfg.update(model_type="kimi_k2", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 3],
                                                   "use_aux_hidden_state": True})
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_import_then_generate_equals_plain(ds_target_dir, tmp_path, capsys):
    src = _kimi_style_draft(tmp_path / "kimi-draft", vocab=260)
    target = ["--target", str(ds_target_dir), "--device", "cpu"]
    assert main(["draft", "import", str(src), str(tmp_path / "a"), *target]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["capture_points"] == [1, 2, 4]
    # The same ids given explicitly in SpecForge's convention convert the same way.
    assert main(["draft", "import", str(src), str(tmp_path / "b"), *target, "--capture-ids", "0,1,3",
                 "--convention", "specforge"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["capture_points"] == [1, 2, 4]
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["eaglet"]["target"]["model_type"] == "deepseek_v3" and cfg["head_dim"] == 32
    common = [*target, "--prompt", "a red fox", "--max-new-tokens", "10", "--json"]
    assert main(["generate", *common, "--draft", str(tmp_path / "a"), "--num-steps", "3", "--topk", "2",
                 "--num-draft-tokens", "6"]) == 0
    spec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["generate", *common, "--draft", "none"]) == 0
    assert spec["text"] == json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
