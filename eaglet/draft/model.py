"""The EAGLE-3 draft model (Li et al., "EAGLE-3", arXiv 2503.01840).

One decoder layer over a fused target feature. For anchor position ``t`` the first
draft step reads ``g_t = fc(cat(points of the target at t))`` [k*H -> H] and the
embedding of the next token ``x_{t+1}``; its attention input is
``cat(input_norm(emb), hidden_norm(g))`` (2H wide), and it predicts ``x_{t+2}``
over a reduced draft vocabulary. Each later step reads the draft's own pre-norm
output hidden state in place of ``g``, at position ``t + step``.

Token embeddings are the target's (frozen, passed in, never stored with the draft).

Optionally (``aux_norm``, an eaglet extension) each captured point is RMS-normalised with
a learned weight of its own before ``fc``: the points of a small target carry massive
activations (SmolLM2: one channel near 25,000 against a median of 4-11), which otherwise
go into ``fc`` as they are. The norm is part of ``fuse``, so training and serving apply
the same one, and the checkpoint declares it (``eaglet.aux_norm``).
Attention sees the draft's KV either through a KVCache (inference: chains and trees)
or through ``past`` lists of earlier steps' K/V (training-time test, differentiable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from eaglet.capture import CaptureSpec
from eaglet.draft import ttt_attention
from eaglet.errors import EagletError
from eaglet.kv_cache import AttnMeta, KVCache
from eaglet.models.attention import cached_attention, sdpa
from eaglet.models.config import ModelConfig
from eaglet.models.layers import Linear, RMSNorm, Rotary, apply_rotary, dense, rms_norm

# ``extend_vocab``'s least R^2 of the map from the target's LM-head rows to the draft's (SmolLM2's shipped draft fits
# at 0.89; a head unrelated to the target's would take rows that mean nothing to it), and the least trained rows a
# hidden dimension to fit it on (with few rows any head fits: a random one at R^2 ~ H / rows).
MIN_FIT = 0.5
MIN_ROWS = 4


class ServingLinear(nn.Module):
    """``x @ weight.T`` through ``dense`` for a serving copy (the fused q/k/v or gate/up): its weight a
    non-persistent buffer, so checkpoints keep the separate projections, and a module, so that
    ``Eagle3Draft.int8_projections`` can swap it for an int8 one like any other projection."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight)


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    capture: CaptureSpec
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    target_hidden_size: int | None = None  # defaults to hidden_size
    aux_norm: bool = False  # RMS-normalise each captured point before fc (PointNorm)
    # The draft vocabulary lies most frequent first (eaglet's trainer since session 12), so serving may keep a
    # prefix of it (``keep_vocab``); other drafts list it by target id.
    vocab_by_frequency: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise EagletError(f"draft heads {self.num_heads} not a multiple of kv heads {self.num_kv_heads}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise EagletError(f"draft_vocab_size={self.draft_vocab_size} must be in 1..{self.vocab_size}")

    @property
    def target_hidden(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @classmethod
    def for_target(cls, t: ModelConfig, capture: CaptureSpec, draft_vocab_size: int,
                   aux_norm: bool = False, intermediate_size: int | None = None) -> DraftConfig:
        """A draft shaped like one layer of the target (EAGLE-3's choice; see ``draft_shape``), its MLP
        ``intermediate_size`` wide if given (a draft of more capacity at the same hidden size)."""
        inter, heads, kv_heads, head_dim = t.draft_shape()
        return cls(hidden_size=t.hidden_size, intermediate_size=intermediate_size or inter, num_heads=heads,
                   num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=t.vocab_size,
                   draft_vocab_size=min(draft_vocab_size, t.vocab_size), capture=capture,
                   rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta,
                   max_position_embeddings=t.max_position_embeddings, aux_norm=aux_norm)

    def rope_config(self) -> ModelConfig:
        return ModelConfig("llama", self.vocab_size, self.hidden_size, self.intermediate_size, 1,
                           self.num_heads, self.num_kv_heads, self.head_dim, self.rms_norm_eps,
                           self.rope_theta, max_position_embeddings=self.max_position_embeddings)


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.n_q, self.n_kv, self.d = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.qkv: nn.Module | None = None  # [2H -> (nq+2nkv)*D], set by fuse_projections
        self.ttt_fused = False  # training-time test through ttt_attention (TTTLoss sets it; --fused-ttt-attention)

    def forward(self, x, cos, sin, meta: AttnMeta, cache: KVCache | None, past: list | None, fused: bool = False):
        b, t, _ = x.shape
        if fused and self.qkv is not None:
            q, k, v = self.qkv(x).split([self.n_q * self.d, self.n_kv * self.d, self.n_kv * self.d], -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = apply_rotary(q.view(b, t, self.n_q, self.d), cos, sin)  # [B, T, nq, D]
        k = apply_rotary(k.view(b, t, self.n_kv, self.d), cos, sin)  # [B, T, nkv, D]
        v = v.view(b, t, self.n_kv, self.d)
        if cache is not None:
            kv = cache.layer(0)
            kv.write(k, v, meta.slots)
            out = cached_attention(q, kv, meta)  # [B, T, nq, D]
            return self.o_proj(out.reshape(b, t, self.n_q * self.d))
        # Training-time test: keys are every earlier step's K/V plus this step's.
        past.append((k.transpose(1, 2), v.transpose(1, 2)))
        if self.ttt_fused and ttt_attention.applies(q):
            out = ttt_attention.ttt_attention(q.transpose(1, 2), past)  # [B, nq, T, D]
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_q * self.d))
        keys = torch.cat([p[0] for p in past], dim=2)  # [B, nkv, steps*T, D]
        vals = torch.cat([p[1] for p in past], dim=2)
        # The g query heads of each KV head stacked along the query axis (row h*T + t: head h of the group,
        # token t), the mask tiled to match: one attention per KV head, no GQA inside SDPA (with a mask it
        # falls back to float32 math: ~60% of an H200 training step, measured) and no copy of K/V per query
        # head (what this did before: the copies and their backward's sums, in every one of the 7 steps).
        g = self.n_q // self.n_kv
        qg = q.transpose(1, 2).reshape(b, self.n_kv, g * t, self.d)  # [B, nkv, g*T, D]
        out = sdpa(qg, keys, vals, attn_mask=meta.mask.repeat(1, 1, g, 1))  # [B, nkv, g*T, D]
        # reshape, not view: CUDA's kernels return [B, nkv, g*T, D] in a [B, g*T, nkv, D] layout.
        return self.o_proj(out.reshape(b, self.n_q, t, self.d).transpose(1, 2).reshape(b, t, self.n_q * self.d))


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.gate_up: nn.Module | None = None  # [H -> 2I], set by fuse_projections

    def forward(self, x, fused: bool = False):
        if fused and self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class PointNorm(nn.Module):
    """RMSNorm of each of the k captured points separately: [..., k*H] -> [..., k*H]."""

    def __init__(self, k: int, hidden: int, eps: float):
        super().__init__()
        self.k, self.eps = k, eps
        self.weight = nn.Parameter(torch.ones(k * hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pts = rms_norm(x.float().unflatten(-1, (self.k, -1)), self.eps)  # [..., k, H]
        return (pts.flatten(-2) * self.weight.float()).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = DraftMLP(c)


class Eagle3Draft(nn.Module):
    # Parameter names follow SGLang/SpecForge's LlamaForCausalLMEagle3 so checkpoints interchange.
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.config = c
        self.aux_norm = PointNorm(c.capture.k, c.target_hidden, c.rms_norm_eps) if c.aux_norm else None
        self.fc = Linear(c.capture.k * c.target_hidden, c.hidden_size, bias=False)
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # d2t[i]: offset so that target id = i + d2t[i]; t2d[v]: target token v is in the draft vocab.
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(c.rope_config(), c.max_position_embeddings)
        for p in self.parameters():  # RMSNorm creates frozen weights for targets; a draft trains
            p.requires_grad_(True)
        with torch.no_grad():
            for n in (self.midlayer.input_layernorm, self.midlayer.hidden_norm,
                      self.midlayer.post_attention_layernorm, self.norm):
                n.weight.fill_(1.0)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        if self.aux_norm is not None:
            aux = self.aux_norm(aux)
        return self.fc(aux)  # [B, T, k*H] -> [B, T, H]

    def forward(self, hidden: torch.Tensor, emb: torch.Tensor, meta: AttnMeta,
                cache: KVCache | None = None, past: list | None = None) -> torch.Tensor:
        """hidden [B, T, H] (fused feature or previous step's output), emb [B, T, H] -> pre-norm out [B, T, H]."""
        layer = self.midlayer
        cos, sin = self.rotary(meta.positions)
        # The serving copies (fuse_projections) serve every forward autograd does not record: the engine's, and the
        # doctor's unroll of a served draft (check 5); training reads the separate projections.
        serving = cache is not None or not torch.is_grad_enabled()
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        h = hidden + layer.self_attn(x, cos, sin, meta, cache, past, fused=serving)
        return h + layer.mlp(layer.post_attention_layernorm(h), fused=serving)

    def fuse_projections(self) -> Eagle3Draft:
        """For serving: q/k/v and gate/up as one matrix each, so a draft step runs two GEMMs where it
        ran five (at decode sizes each is a kernel launch, and the draft's steps are launch-bound).

        The fused weights are copies, read only on the cache (inference) path; training reads the
        separate parameters. Call it on a draft whose weights no longer change (a loaded one).
        """
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        with torch.no_grad():
            attn.qkv = ServingLinear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
            mlp.gate_up = ServingLinear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        return self

    def int8_projections(self, make: Callable[[torch.Tensor], nn.Module]) -> Eagle3Draft:
        """For serving, after ``fuse_projections``: ``fc``, the fused q/k/v, ``o_proj``, the fused gate/up and
        ``down_proj`` replaced by ``make(weight)``, an int8 copy (``Int8Linear``, ``CudaInt8Linear``). On a
        bandwidth-bound GPU a draft step's cost is reading these weights (and the head's): a 6,8,48 iteration of
        a Llama-3.1-8B-shaped draft reads its 243M-parameter layer six times. Serving copies only: a draft so
        served is never trained (a forward with gradients would still read the int8 fc, o_proj and down_proj)."""
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        if attn.qkv is None or mlp.gate_up is None:
            raise EagletError("int8 projections serve the fused draft: call fuse_projections first")
        with torch.no_grad():
            self.fc = make(self.fc.weight)
            attn.qkv, attn.o_proj = make(attn.qkv.weight), make(attn.o_proj.weight)
            mlp.gate_up, mlp.down_proj = make(mlp.gate_up.weight), make(mlp.down_proj.weight)
        return self

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))  # [..., draft_vocab]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """The draft id of each target id in the draft vocabulary (``t2d``; 0 for the others)."""
        index = torch.zeros_like(self.t2d, dtype=torch.long)  # [V]
        index[self.vocab_ids()] = torch.arange(self.config.draft_vocab_size, device=index.device)
        return index[target_ids]

    def vocab_ids(self) -> torch.Tensor:
        """[Vd] the target id of each draft id, in the draft's order."""
        return self.to_target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """Define the draft vocabulary as these target ids, in this order (draft id i is ``target_ids[i]``)."""
        ids = target_ids.to(torch.long)
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise EagletError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct target ids")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def keep_vocab(self, n: int) -> Eagle3Draft:
        """Serve with the ``n`` most frequent tokens of a frequency-ordered vocabulary: the first ``n`` rows of
        the LM head (FR-Spec's cut: a smaller head where it is a large part of a draft step, as on a CPU).
        Proposals stay within the target's vocabulary, so outputs are what the target decides, as before."""
        if not self.config.vocab_by_frequency:
            raise EagletError("this draft's vocabulary is listed by token id, not by frequency: a prefix of it "
                              "would keep arbitrary tokens; serve it whole")
        if n >= self.config.draft_vocab_size:
            return self
        ids = self.vocab_ids()[:n]
        head = self.lm_head.weight[:n].detach().clone()
        self.config = replace(self.config, draft_vocab_size=n)
        self.lm_head = Linear(self.config.hidden_size, n, bias=False).to(head)
        with torch.no_grad():
            self.lm_head.weight.copy_(head)
        self.d2t = self.d2t[:n].clone()
        self.set_vocab(ids)
        return self

    def extend_vocab(self, target_head: torch.Tensor) -> float:
        """Serve over the target's whole vocabulary: a row for each token the draft was not trained on, taken from
        the target's LM head ``target_head`` [V, H] through the least-squares map [H, H] from the target's rows of
        the draft's tokens to the draft's trained rows (training starts a draft's head from the target's rows, and
        the shipped SmolLM2 draft's lie at cosine ~0.87 from them; taken as they are, the target's rows outbid the
        trained ones and the accept length fell from 2.9 to 2.1). The trained rows and their order stay first, so
        a prefix is still the most frequent tokens. Returns the map's R^2 over the trained rows; refuses (one
        sentence, nothing changed) a draft whose vocabulary is whole already, a head of another shape (a shard:
        pass whole rows, ``head_rows``), fewer than ``MIN_ROWS`` trained rows a hidden dimension (too few to fit
        the map) or a fit below ``MIN_FIT`` (a head unrelated to the target's). Outputs stay the target's: only
        proposals change."""
        ids = self.vocab_ids()  # [Vd]
        vocab, h = self.config.vocab_size, self.config.hidden_size
        if ids.numel() == vocab:
            raise EagletError("the draft's vocabulary is the target's whole one already")
        if tuple(target_head.shape) != (vocab, h):
            raise EagletError(f"the target's LM head given is {tuple(target_head.shape)}, not [{vocab}, {h}]")
        if ids.numel() < MIN_ROWS * h:
            raise EagletError(f"the draft's {ids.numel()} tokens are too few to fit a map of {h} dimensions "
                              f"(at least {MIN_ROWS * h})")
        theirs = target_head.detach().float()
        mine, known = self.lm_head.weight.detach().float(), theirs[ids]  # [Vd, H] each
        # QR without pivoting (the target's rows are full rank), which also returns each column's squared residual:
        # R^2 without a second [Vd, H] product (on the 2-core CPU the fit and its check took ~3 s of every start-up).
        sol = torch.linalg.lstsq(known, mine, driver="gels")
        fit = sol.solution  # [H, H]
        sse = sol.residuals.sum() if sol.residuals.numel() else torch.addmm(mine, known, fit, alpha=-1).pow(2).sum()
        r2 = 1.0 - float(sse / (mine.var(0, correction=0).sum() * mine.shape[0]))
        if r2 < MIN_FIT:
            raise EagletError(f"the draft's head is unrelated to the target's (the map between them fits at R^2 "
                              f"{r2:.2f}, below {MIN_FIT})")
        rest = (~self.t2d).nonzero().squeeze(1)  # [V - Vd] the target ids the draft lacks
        rows = mine.new_empty(vocab, h)  # [V, H]: the trained rows, then the mapped ones written in place
        rows[: ids.numel()] = mine
        torch.mm(theirs[rest], fit, out=rows[ids.numel():])
        dtype = self.lm_head.weight.dtype
        self.config = replace(self.config, draft_vocab_size=vocab)
        self.lm_head = Linear(h, vocab, bias=False, device="meta")  # no initialisation of rows replaced at once
        self.lm_head.weight = nn.Parameter(rows.to(dtype))
        self.d2t = torch.zeros(vocab, dtype=torch.long, device=ids.device)
        self.set_vocab(torch.cat([ids, rest]))
        return r2

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        w = self.norm.weight  # the draft's dtype and device (``fc`` may be served in int8)
        c = self.config
        return KVCache(1, batch, capacity, c.num_kv_heads, c.head_dim, w.dtype, w.device)
