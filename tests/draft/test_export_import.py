"""Draft export and import: weights and capture points survive, conventions convert both ways, mismatches fail."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.checkpoint import load_draft, save_draft
from eaglet.draft.compat import check_draft_target, import_draft, load_draft_for, target_identity
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.draft.vocab import coverage, default_draft_vocab_size, select_vocab, token_counts
from eaglet.errors import EagletError
from eaglet.speculative.load import load_engine_draft
from tests.train.helpers import load_tiny, make_tiny_target_dir, tiny_tokenizer


def _draft(target, points=(1, 2, 3), vocab=200, seed=0) -> Eagle3Draft:
    torch.manual_seed(seed)
    d = Eagle3Draft(DraftConfig.for_target(target.config, CaptureSpec(points, 3), vocab))
    d.set_vocab(torch.randperm(target.config.vocab_size)[:vocab])
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn_like(p).to(torch.bfloat16).float())  # exactly representable in bf16
    return d


def _foreign(tmp_path, d, ids=None, drop_ours=True):
    """Save ``d``, then rewrite its config.json the way another tool would have written it."""
    save_draft(d, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if drop_ours:
        cfg.pop("eaglet")
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_export_then_import_preserves_weights_and_points(tiny_target, tmp_path):
    d = _draft(tiny_target)
    save_draft(d, tmp_path / "a", target=target_identity(tiny_target))
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["eaglet"]["capture"]["points"] == [1, 2, 3]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang: output of layer i
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 200
    spec = import_draft(tmp_path / "a", tmp_path / "b", tiny_target)
    assert spec.points == (1, 2, 3)
    back, _ = load_draft_for(tmp_path / "b", tiny_target)
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


@pytest.mark.parametrize("convention,ids,points", [
    ("sglang", [0, 1, 2], (1, 2, 3)), ("specforge", [1, 2], (2, 3)), ("vllm", [0, 2, 3], (0, 2, 3)),
    ("eaglet", [1, 3], (1, 3)),
])
def test_foreign_ids_in_each_convention(tiny_target, tmp_path, convention, ids, points):
    d = _draft(tiny_target, points=points)
    src = _foreign(tmp_path / "src", d, ids=None)
    with pytest.raises(EagletError, match="carries no capture layer ids"):
        load_draft(src, 3)  # no ids anywhere: refused, never a default
    spec = import_draft(src, tmp_path / "out", tiny_target, ids=ids, convention=convention)
    assert spec.points == points
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert CaptureSpec.from_json(cfg["eaglet"]["capture"]).points == points
    if 0 not in points:  # written back in SGLang/SpecForge's form too
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [p - 1 for p in points]
        assert CaptureSpec.from_ids(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"], "specforge", 3) == spec


def test_sglang_ids_from_the_config_are_read_as_output_of_layer(tiny_target, tmp_path):
    d = _draft(tiny_target, points=(1, 2, 3))
    src = _foreign(tmp_path / "src", d, ids=[0, 1, 2])
    assert import_draft(src, tmp_path / "out", tiny_target).points == (1, 2, 3)
    with pytest.raises(EagletError, match="without their convention"):
        import_draft(src, tmp_path / "out2", tiny_target, ids=[0, 1, 2])


def test_mismatched_target_is_one_clear_error(tiny_target, tmp_path):
    d = _draft(tiny_target)
    save_draft(d, tmp_path / "d", target=target_identity(tiny_target))
    other = load_tiny(make_tiny_target_dir(tmp_path / "wide", hidden_size=32, num_attention_heads=2,
                                           num_key_value_heads=1))
    with pytest.raises(EagletError) as e:
        load_draft_for(tmp_path / "d", other)
    assert "hidden size 64 vs 32" in str(e.value) and "\n" not in str(e.value)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    bigger = dict(cfg, vocab_size=512)
    bigger["eaglet"] = dict(cfg["eaglet"], target=dict(cfg["eaglet"]["target"], vocab_size=512))
    with pytest.raises(EagletError, match="vocabulary size 512 vs 260"):
        check_draft_target(bigger, tiny_target)
    tok = tiny_tokenizer()
    tok.chat_template = tok.chat_template + "{# another template #}"
    swapped = type(tiny_target)(tiny_target.model, tok, tiny_target.config, "tiny", tiny_target.path)
    with pytest.raises(EagletError, match="tokenizer"):
        check_draft_target(cfg, swapped)
    with pytest.raises(EagletError, match="tokenizer"):  # serving (generate, bench) refuses it too
        load_engine_draft(tmp_path / "d", swapped)


def test_draft_vocabulary():
    assert default_draft_vocab_size(49152) == 24576  # SmolLM2: half, measured over 12288 (docs/training.md)
    assert default_draft_vocab_size(260) == 260 and default_draft_vocab_size(6000) == 4096
    assert default_draft_vocab_size(128256) == 32768  # Llama 3: EAGLE-3's size
    ids = torch.tensor([5, 5, 5, 3, 3, 9, 1])
    counts = token_counts(ids, torch.tensor([1, 1, 1, 1, 1, 1, 0], dtype=torch.bool), 12)
    assert counts.tolist() == [0, 0, 0, 2, 0, 3, 0, 0, 0, 1, 0, 0]
    assert select_vocab(counts, 2).tolist() == [5, 3]  # most frequent first
    assert select_vocab(counts, 5).tolist() == [5, 3, 9, 0, 1]  # unseen fillers: lowest ids
    assert coverage(counts, torch.tensor([3, 5])) == pytest.approx(5 / 6)


def test_a_tensor_over_the_shard_limit_travels_in_row_blocks(tiny_target, tmp_path):
    """SmolLM2's 24,576-token LM head takes 27 MiB in bf16: split into row blocks, every shard stays within
    the limit and the draft loads the same; refused without ``split_rows`` (engines that read whole tensors)."""
    d = _draft(tiny_target)
    head = d.lm_head.weight.numel() * 2  # bf16 bytes
    limit = head // 3 + 7  # 66 of the 200 rows a block: four blocks, the last one short
    with pytest.raises(EagletError, match="over the 0 MiB shard limit"):
        save_draft(d, tmp_path / "whole", max_shard_bytes=limit)
    save_draft(d, tmp_path / "a", max_shard_bytes=limit, split_rows=True)
    names = json.loads((tmp_path / "a" / "model.safetensors.index.json").read_text())["weight_map"]
    assert [k for k in names if k.startswith("lm_head")] == [f"lm_head.weight@rows{i}" for i in range(4)]
    assert all(f.stat().st_size <= limit + 4096 for f in (tmp_path / "a").glob("*.safetensors"))  # + header
    back, _ = load_draft(tmp_path / "a", 3)
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    (tmp_path / "a" / names["lm_head.weight@rows1"]).unlink()
    names.pop("lm_head.weight@rows1")
    (tmp_path / "a" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    with pytest.raises(EagletError, match=r"row blocks \[0, 2, 3\] of lm_head.weight; some are missing"):
        load_draft(tmp_path / "a", 3)


def test_a_frequency_ordered_vocabulary_round_trips_and_serves_a_prefix(tiny_target, tmp_path):
    """The trainer lists the draft vocabulary most frequent first and says so in config.json; ``keep_vocab(n)``
    then serves the first n rows of the head. A draft listed by token id refuses the cut."""
    d = _draft(tiny_target)
    with pytest.raises(EagletError, match="by token id, not by frequency"):
        d.keep_vocab(50)
    d.config = dataclasses.replace(d.config, vocab_by_frequency=True)
    save_draft(d, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "config.json").read_text())["eaglet"]["vocab_order"] == "frequency"
    back, _ = load_draft(tmp_path / "a", 3)
    assert back.config.vocab_by_frequency and torch.equal(back.vocab_ids(), d.vocab_ids())
    h = torch.randn(2, 5, d.config.hidden_size)
    whole = back.logits(h)
    back.keep_vocab(50)
    assert torch.equal(back.logits(h), whole[..., :50]) and torch.equal(back.vocab_ids(), d.vocab_ids()[:50])
    assert back.t2d.sum() == 50 and back.t2d[d.vocab_ids()[:50]].all()


def test_save_draft_never_replaces_a_folder_that_is_not_a_draft_unasked(tiny_target, tmp_path):
    d = _draft(tiny_target)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(EagletError, match="exists and is not a draft"):
        save_draft(d, mine)
    assert (mine / "notes.txt").read_text() == "keep me" and not list(tmp_path.glob(".mine-*"))
    save_draft(d, tmp_path / "a")
    save_draft(d, tmp_path / "a")  # a re-export replaces the earlier draft
    save_draft(d, mine, overwrite=True)
    assert not (mine / "notes.txt").exists() and (mine / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "mine"]  # no temporaries left beside


def test_cli_import_replaces_a_non_empty_out_only_with_overwrite(tiny_target_dir, tiny_target, tmp_path, capsys):
    from eaglet.cli import main

    save_draft(_draft(tiny_target), tmp_path / "src", target=target_identity(tiny_target))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    argv = ["draft", "import", str(tmp_path / "src"), str(out), "--target", str(tiny_target_dir), "--device", "cpu"]
    assert main(argv) == 2 and (out / "notes.txt").read_text() == "keep me"
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "src").iterdir())
