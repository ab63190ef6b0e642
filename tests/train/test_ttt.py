"""Training-time test feeds the draft exactly what the engine's chain feeds it, and scores the right labels."""

from __future__ import annotations

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.models.config import ModelConfig
from eaglet.train.ttt import TTTLoss, predicted_accept_length, shift_left, ttt_mask

TARGET = ModelConfig("llama", vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=128)


def _draft(vocab: int = 50, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    d = Eagle3Draft(DraftConfig.for_target(TARGET, CaptureSpec((1, 2, 3), 4), vocab))
    d.set_vocab(torch.arange(0, 2 * vocab, 2)[:vocab] if vocab < 50 else torch.arange(50))
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.1 * torch.randn_like(p))  # non-trivial norms too
    return d.eval()


def _batch(b: int, t_len: int, seed: int, ids_below: int = 50, answer_share: float = 0.7) -> tuple[torch.Tensor, ...]:
    """TTTLoss's inputs at random for the 20-token draft vocabulary: (aux, emb, ids, mask, target_logp, target_top)."""
    torch.manual_seed(seed)
    ids = torch.randint(0, ids_below, (b, t_len))
    mask = torch.rand(b, t_len) > 1 - answer_share
    aux, emb = torch.randn(b, t_len, 96), torch.randn(b, t_len, 32)
    return aux, emb, ids, mask, torch.randn(b, t_len, 20).log_softmax(-1), torch.randint(0, 50, (b, t_len))


def test_accept_length_formula():
    assert predicted_accept_length([]) == 1
    assert predicted_accept_length([1.0, 1.0, 1.0]) == 4
    assert predicted_accept_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert predicted_accept_length([0.8, 0.0, 1.0]) == pytest.approx(1.8)


def test_mask_layout():
    m = ttt_mask(3, 3, "cpu")[0, 0].int()
    assert m.tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                          [1, 1, 0, 0, 1, 0, 0, 1, 0],
                          [1, 1, 1, 0, 0, 1, 0, 0, 1]]
    x = torch.arange(5).view(1, 5)
    assert shift_left(x, 2).tolist() == [[2, 3, 4, 0, 0]] and shift_left(x, 7).tolist() == [[0] * 5]


@torch.no_grad()
def test_unroll_equals_the_inference_chain():
    """Step j at anchor t == the engine's chain: prefill anchors 0..t, then one token per step via the KV cache."""
    steps, t_len = 4, 12
    d = _draft()
    aux, emb = torch.randn(1, t_len, 3 * 32), torch.randn(1, t_len, 32)
    outs = TTTLoss(d, steps).unroll(aux, emb)
    for t in (0, 3, 7):
        cache = d.new_cache(1, 64)
        meta = cache.append_meta(t + 1)  # step 0 over anchors 0..t at positions 0..t
        out = d(d.fuse(aux[:, : t + 1]), emb[:, 1: t + 2], meta, cache=cache)
        cache.advance(t + 1)
        torch.testing.assert_close(out[:, t], outs[0][:, t])
        hidden = out[:, t:]
        for j in range(1, steps):
            meta = cache.append_meta(1)  # position t + j; sees step-0 keys 0..t and its own chain
            assert int(meta.positions) == t + j
            hidden = d(hidden, emb[:, t + j + 1: t + j + 2], meta, cache=cache)
            cache.advance(1)
            torch.testing.assert_close(hidden[:, 0], outs[j][:, t], msg=f"step {j} anchor {t}")


def test_labels_masks_and_accuracy(monkeypatch):
    import eaglet.train.ttt as ttt_module

    monkeypatch.setattr(ttt_module, "SERVE_WINDOW", 2)  # the first 2 tokens of each assistant run
    steps, b, t_len = 3, 2, 10
    d = _draft(vocab=20)  # draft vocabulary: even target ids 0..38
    aux, emb, ids, mask, target_logp, target_top = _batch(b, t_len, seed=1)
    ttt = TTTLoss(d, steps, decay=0.5)
    loss, stats = ttt(aux, emb, ids, mask, target_logp, target_top)
    loss.backward()
    assert all(p.grad is not None for p in d.parameters())
    with torch.no_grad():
        outs = ttt.unroll(aux, emb)
    def index_in_turn(bi, p):  # how many assistant tokens directly precede p in its run
        k = 0
        while p - k - 1 >= 0 and mask[bi, p - k - 1]:
            k += 1
        return k

    want_loss = 0.0
    for j in range(steps):
        ce, hit, n, n_all, hit_win, n_win = 0.0, 0, 0, 0, 0, 0
        for bi in range(b):
            for t in range(t_len - j - 2):
                x = int(ids[bi, t + j + 2])  # the token step j predicts at anchor t
                n_all += bool(mask[bi, t + j + 2])  # an assistant label, in the draft vocabulary or not
                in_win = bool(mask[bi, t + j + 2]) and index_in_turn(bi, t + j + 2) < 2
                n_win += in_win
                if not (mask[bi, t + j + 2] and x % 2 == 0 and x < 40):
                    continue
                logits = d.logits(outs[j][bi, t]).detach()
                ce += float(-(target_logp[bi, t + j + 1].exp() * logits.log_softmax(-1)).sum())
                ok = 2 * int(logits.argmax()) == int(target_top[bi, t + j + 1])
                hit += ok
                hit_win += ok and in_win
                n += 1
        assert int(stats[j, 2]) == n and int(stats[j, 1]) == hit and int(stats[j, 3]) == n_all > n
        assert (int(stats[j, 4]), int(stats[j, 5])) == (hit_win, n_win) and 0 < n_win < n_all
        assert float(stats[j, 0]) == pytest.approx(ce, rel=1e-4)
        want_loss += 0.5**j * ce / max(n, 1)
    assert loss.item() == pytest.approx(want_loss, rel=1e-4)


@pytest.mark.parametrize("k", [1, 3])
def test_reach_counts_only_anchors_a_k_way_tree_holds(k):
    """--ttt-reach K: step j counts an anchor only if every earlier step i had a label and ranked the token it
    predicts (x_{t+i+2}) among its top K; the loss averages over those anchors. Validation (no autograd) counts every
    anchor as before."""
    steps, b, t_len = 3, 2, 12
    d = _draft(vocab=20)
    aux, emb, ids, mask, target_logp, target_top = _batch(b, t_len, seed=3, ids_below=40, answer_share=0.8)
    loss, stats = TTTLoss(d, steps, decay=0.5, reach=k)(aux, emb, ids, mask, target_logp, target_top)
    with torch.no_grad():
        outs = TTTLoss(d, steps).unroll(aux, emb)
        _, every = TTTLoss(d, steps, decay=0.5, reach=k)(aux, emb, ids, mask, target_logp, target_top)
        _, plain = TTTLoss(d, steps, decay=0.5)(aux, emb, ids, mask, target_logp, target_top)
    torch.testing.assert_close(every, plain)

    def label(bi, p):  # step's label at position p exists: an assistant token in the draft vocabulary
        return p < t_len and bool(mask[bi, p]) and int(ids[bi, p]) % 2 == 0

    want_loss, dropped = 0.0, 0
    for j in range(steps):
        ce, n, n_all = 0.0, 0, 0
        for bi in range(b):
            for t in range(t_len - j - 2):
                held = all(label(bi, t + i + 2) and int((d.logits(outs[i][bi, t]) > d.logits(outs[i][bi, t])[
                    int(ids[bi, t + i + 2]) // 2]).sum()) < k for i in range(j))  # draft id i is target id 2i
                n_all += held and bool(mask[bi, t + j + 2])  # acc_all's denominator: the held anchors too
                if not label(bi, t + j + 2):
                    continue
                dropped += not held
                if held:
                    logits = d.logits(outs[j][bi, t]).detach()
                    ce += float(-(target_logp[bi, t + j + 1].exp() * logits.log_softmax(-1)).sum())
                    n += 1
        assert int(stats[j, 2]) == n and int(stats[j, 3]) == n_all and float(stats[j, 0]) == pytest.approx(ce, rel=1e-4)
        want_loss += 0.5**j * ce / max(n, 1)
    assert dropped > 0  # the mask took anchors out
    assert loss.item() == pytest.approx(want_loss, rel=1e-4)


def test_accuracy_over_all_answer_tokens_counts_labels_outside_the_draft_vocabulary_as_misses():
    from eaglet.train.report import summarize

    # CE, hits, counted, all assistant labels, hits and labels within the serving window
    stats = torch.tensor([[8.0, 6.0, 8.0, 10.0, 2.0, 4.0], [6.0, 3.0, 6.0, 9.0, 1.0, 4.0]])
    row = summarize(stats, decay=0.8)
    assert (row["acc_0"], row["acc_1"]) == (0.75, 0.5) and (row["acc_all_0"], row["acc_all_1"]) == (0.6, 0.33333)
    assert row["tau_pred"] == pytest.approx(1 + 0.75 + 0.375) and row["tau_all"] == pytest.approx(1 + 0.6 + 0.2)
    assert (row["acc_serve_0"], row["acc_serve_1"]) == (0.5, 0.25) and row["tau_serve"] == pytest.approx(1.625)


def test_answer_index_counts_within_each_assistant_turn():
    from eaglet.train.ttt import answer_index

    mask = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1], [1, 1, 0, 1, 0, 1, 1, 1]], dtype=torch.bool)
    assert answer_index(mask).tolist() == [[-1, 0, 1, 2, -1, -1, 0, 1], [0, 1, -1, 0, -1, 0, 1, 2]]


@pytest.mark.parametrize("variant", ["compile_loss", "fused_attention"])
def test_loss_variants_equal_the_default(variant):
    """--compile-loss (from a compiled graph) and --fused-ttt-attention: the default loss's value, statistics
    and gradients (float32, CPU)."""
    from torch._dynamo.utils import counters

    steps, b, t_len = 3, 2, 10
    aux, emb, ids, mask, target_logp, target_top = _batch(b, t_len, seed=2)
    results = []
    for on in (False, True):
        d = _draft(vocab=20)
        frames = counters["stats"]["unique_graphs"]
        loss, stats = TTTLoss(d, steps, 0.5, **{variant: on})(aux, emb, ids, mask, target_logp, target_top)
        loss.backward()
        assert (counters["stats"]["unique_graphs"] > frames) == (on and variant == "compile_loss")
        results.append((loss.detach(), stats, [p.grad for p in d.parameters()]))
    (loss0, stats0, grads0), (loss1, stats1, grads1) = results
    torch.testing.assert_close(loss1, loss0)
    torch.testing.assert_close(stats1, stats0)
    for g0, g1 in zip(grads0, grads1):
        torch.testing.assert_close(g1, g0, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("step", [0, 1, 3])
def test_fused_ttt_attention_equals_the_masked_attention(step):
    """Flash over the causal step-0 keys plus the chain's keys, merged by log-sum-exp: the masked dense
    attention's output and gradients (GQA, float32, CPU)."""
    from eaglet.draft.ttt_attention import ttt_attention

    b, nq, nkv, t, d = 2, 4, 2, 12, 8
    torch.manual_seed(step)
    q = torch.randn(b, nq, t, d, requires_grad=True)
    past = [tuple(torch.randn(b, nkv, t, d, requires_grad=True) for _ in range(2)) for _ in range(step + 1)]
    keys, vals = (torch.cat([p[i] for p in past], dim=2).repeat_interleave(nq // nkv, dim=1) for i in (0, 1))
    mask = ttt_mask(t, step + 1, "cpu")
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
    got = ttt_attention(q, past)
    torch.testing.assert_close(got, want)
    leaves = [q, *(x for p in past for x in p)]
    dout = torch.randn_like(want)
    for g_got, g_want in zip(torch.autograd.grad(got, leaves, dout), torch.autograd.grad(want, leaves, dout)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_ttt_attention_on_cuda_in_bfloat16():
    """The flash kernels of CUDA (their saved state passed to the backward) against the masked attention."""
    from eaglet.draft.ttt_attention import ttt_attention

    b, nq, nkv, t, d, step = 2, 9, 3, 128, 64, 4
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, nq, t, d, device="cuda", generator=g).bfloat16().requires_grad_()
    past = [tuple(torch.randn(b, nkv, t, d, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(2))
            for _ in range(step + 1)]
    keys, vals = (torch.cat([p[i] for p in past], dim=2).repeat_interleave(nq // nkv, dim=1) for i in (0, 1))
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=ttt_mask(t, step + 1, "cuda"))
    got = ttt_attention(q, past)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    leaves = [q, *(x for p in past for x in p)]
    dout = torch.randn_like(want)
    for g_got, g_want in zip(torch.autograd.grad(got, leaves, dout), torch.autograd.grad(want, leaves, dout)):
        torch.testing.assert_close(g_got.float(), g_want.float(), rtol=5e-2, atol=5e-2)


def _loss_inputs(seed: int, device: str = "cpu"):
    b, t_len = 2, 10
    g = torch.Generator().manual_seed(seed)
    ids, mask = torch.randint(0, 50, (b, t_len), generator=g), torch.rand(b, t_len, generator=g) > 0.3
    aux, emb = torch.randn(b, t_len, 96, generator=g), torch.randn(b, t_len, 32, generator=g)
    logp, top = torch.randn(b, t_len, 20, generator=g).log_softmax(-1), torch.randint(0, 50, (b, t_len), generator=g)
    return [x.to(device) for x in (aux, emb, ids, mask, logp, top)]


def test_ttt_attention_takes_the_layout_cuda_kernels_return(monkeypatch):
    """CUDA's SDPA kernels return [B, H, T, D] stored as [B, T, H, D] (not viewable as [B, nq, T, D]): the
    loss and its gradients are those of a contiguous result (session 17's H200 run failed on a view here)."""
    from eaglet.draft import model

    def strided(*args, **kw):
        out = torch.nn.functional.scaled_dot_product_attention(*args, **kw)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    results = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(model, "sdpa", strided)
        d = _draft(vocab=20)
        loss, _ = TTTLoss(d, 3, 0.5)(*_loss_inputs(3))
        loss.backward()
        results.append((loss.detach(), [p.grad for p in d.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for g0, g1 in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(g1, g0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fused", [False, True])
def test_ttt_loss_on_cuda_in_bfloat16_matches_the_cpu(fused):
    """The training step as `eaglet train` runs it on a GPU (bf16 autocast, CUDA's attention kernels):
    forward and backward run, and the loss is the float32 CPU loss's within bf16's rounding."""
    want, _ = TTTLoss(_draft(vocab=20), 3, 0.5, fused_attention=fused)(*_loss_inputs(4))
    d = _draft(vocab=20).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, _ = TTTLoss(d, 3, 0.5, fused_attention=fused)(*_loss_inputs(4, "cuda"))
    got.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in d.parameters() if p.requires_grad)
    torch.testing.assert_close(got.float().cpu(), want, rtol=3e-2, atol=3e-2)
