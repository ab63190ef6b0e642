"""Acceptance: which path of the draft tree the target keeps, and the token after it.

Vocabulary (vLLM's rejection sampler uses the same words):

- accepted tokens: draft tokens on the kept path, root excluded;
- recovered token: after every child of the last accepted node was rejected, a token
  drawn from the residual distribution left by those rejections;
- bonus token: when the last accepted node has no children (a leaf, or greedy), a token
  drawn from the target's distribution there (greedy: its argmax).

A verify emits the accepted tokens plus one recovered-or-bonus token, so the accept
length ``n_path`` (root + accepted) equals the number of tokens emitted, at least 1.

Greedy: the longest path whose every token is the target's argmax at its parent.
Equal to plain greedy decoding token for token, whatever the draft.

Sampling (temperature > 0, with top-k/top-p): recursive rejection sampling over the
tree (SpecInfer, Miao et al., arXiv 2305.09781; Recursive Speculative Decoding, Jeon et
al., arXiv 2402.14160). At a node with target distribution ``p`` whose children
c_1, c_2, ... were drawn without replacement from the draft's ``q`` (tree.py): accept
c_i with probability min(1, p(c_i)/q(c_i)); on rejection p <- norm(max(p - q, 0)),
q(c_i) <- 0 and q is renormalised (the next child was drawn from exactly that q); if
every child is rejected, draw the recovered token from the residual p. Each step
leaves the emitted token distributed as the original p, so the output distribution
equals plain sampling from ``probs(target logits, params)``. Rows of a batch are
independent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.sampling import SamplingParams, probs
from eaglet.speculative.tree import Tree, gumbel


@dataclass
class Acceptance:
    path: torch.Tensor  # [B, S+1] accepted nodes, root first, padded with the last one
    n_path: torch.Tensor  # [B] root + accepted draft tokens = tokens emitted (accept length)
    next_token: torch.Tensor  # [B] the recovered or bonus token (the next tree's root)

    def emitted(self, tree: Tree) -> torch.Tensor:
        """[B, S+1]: accepted tokens then the next token; entries past n_path are filler."""
        toks = tree.tokens.gather(1, self.path)  # [B, S+1], root first
        shifted = torch.cat([toks[:, 1:], toks[:, -1:]], dim=1)
        return shifted.scatter(1, (self.n_path - 1).unsqueeze(1), self.next_token.unsqueeze(1))


def path_to(tree: Tree, node: torch.Tensor, length: int) -> torch.Tensor:
    """Ancestors of ``node`` [B] (itself included) in depth order, padded with ``node`` -> [B, length]."""
    n = tree.tokens.shape[1]
    anc = tree.mask[torch.arange(node.shape[0], device=node.device), node]  # [B, N]
    order = torch.where(anc, torch.arange(n, device=node.device), n).sort(dim=1).values[:, :length]
    return torch.where(order < n, order, node.unsqueeze(1))


def greedy_accept(tree: Tree, target_ids: torch.Tensor, path_len: int) -> Acceptance:
    """target_ids [B, N]: the target's argmax at every node."""
    accept = chain_accept if tree.children.shape[-1] == 1 else tree_accept  # topk 1: a chain (``TreeConfig``)
    return accept(tree, target_ids, path_len)


def chain_accept(tree: Tree, target_ids: torch.Tensor, path_len: int) -> Acceptance:
    """``tree_accept`` for a chain (node i's parent is i - 1): the longest prefix whose tokens are the target's
    argmax at the node before, with no masks or sort."""
    match = (tree.tokens[:, 1:] == target_ids[:, :-1]) & tree.valid[:, 1:]  # [B, N-1]
    n_path = 1 + match.long().cumprod(1).sum(1)  # [B]
    path = torch.arange(path_len, device=match.device).expand(match.shape[0], path_len)
    return Acceptance(torch.minimum(path, (n_path - 1).unsqueeze(1)), n_path,
                      target_ids.gather(1, (n_path - 1).unsqueeze(1)).squeeze(1))


def tree_accept(tree: Tree, target_ids: torch.Tensor, path_len: int) -> Acceptance:
    """The deepest node whose every ancestor's token is the target's argmax at its parent."""
    match = (tree.tokens == target_ids.gather(1, tree.parents)) & tree.valid  # [B, N]
    match[:, 0] = True
    on_path = ~(tree.mask & ~match.unsqueeze(1)).any(-1)  # [B, N]: every ancestor matches
    best = (on_path * (tree.depth + 1)).argmax(-1)  # [B] the deepest (siblings are distinct: unique)
    rows = torch.arange(best.shape[0], device=best.device)
    return Acceptance(path_to(tree, best, path_len), tree.depth[rows, best] + 1, target_ids[rows, best])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) over the last dim; p where the difference vanishes (float underflow)."""
    r = (p - q).clamp(min=0)
    z = r.sum(-1, keepdim=True)
    return torch.where(z > 0, r / z.clamp(min=1e-30), p)


def without(q: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """q [B, V] with the tokens ``tok`` [B, 1] removed and renormalised: the law of the next sibling."""
    left = q.scatter(1, tok, 0.0)
    return left / left.sum(-1, keepdim=True).clamp(min=1e-30)


def sample_accept(tree: Tree, target_logits: torch.Tensor, params: SamplingParams, draft_to_target: torch.Tensor,
                  path_len: int, u_accept: torch.Tensor, u_final: torch.Tensor) -> Acceptance:
    """Recursive rejection sampling. target_logits [B, N, V]; draft_to_target [Vd]: target id of each draft id.

    The randomness is drawn by the caller (so one iteration can be one CUDA graph):
    u_accept [B, path_len - 1, topk] uniforms for the accept tests, u_final [B, V] for the
    recovered or bonus token (Gumbel-max, an exact draw from its distribution).
    """
    p_all = probs(target_logits, params)  # [B, N, V]
    b, _, v = p_all.shape
    k = tree.children.shape[-1]
    dev = p_all.device
    rows = torch.arange(b, device=dev)
    index = draft_to_target.expand(b, -1)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    path = torch.zeros(b, path_len, dtype=torch.long, device=dev)
    final = torch.zeros(b, v, device=dev)
    for d in range(1, path_len):
        p = p_all[rows, cur]  # [B, V]
        q = torch.zeros(b, v, device=dev).scatter_(1, index, tree.q[rows, cur])  # [B, V]
        moved = torch.zeros(b, dtype=torch.bool, device=dev)
        for c in range(k):
            child = tree.children[rows, cur, c]
            node = child.clamp(min=0)
            live = alive & ~moved & (child >= 0) & tree.valid[rows, node]
            tok = tree.tokens[rows, node].unsqueeze(1)  # [B, 1]
            pt, qt = p.gather(1, tok).squeeze(1), q.gather(1, tok).squeeze(1)
            u = u_accept[:, d - 1, c]
            ok = live & (u * qt < pt)  # probability min(1, p/q)
            rejected = (live & ~ok).unsqueeze(1)
            p = torch.where(rejected, residual(p, q), p)
            q = torch.where(rejected, without(q, tok), q)
            moved |= ok
            cur = torch.where(ok, node, cur)
        path[:, d] = torch.where(moved, cur, path[:, d - 1])
        final = torch.where((alive & ~moved).unsqueeze(1), p, final)  # stopped here: the residual
        alive &= moved
    final = torch.where(alive.unsqueeze(1), p_all[rows, cur], final)  # reached depth S: bonus
    nxt = (torch.log(final) + gumbel(u_final)).argmax(-1)  # [B]
    return Acceptance(path, tree.depth[rows, cur] + 1, nxt)
