"""The differentiable training forward of a DSpine draft.

Same math as `DSpineDraft.forward` (the inference path on our kernels and the paged cache), from
the draft's differentiable building blocks (its norms, `MLP`, `Injection`, `ops.trainable_rope`:
the RoPE kernel with a backward) and torch's SDPA over an explicit mask in place of the paged
attention. A training batch holds many blocks per sequence; every block is drafted as if it were
an inference round anchored at its position:

- the block anchored at position a holds ``[x_a, MASK x (B-1)]`` at positions a..a+B-1;
- its queries see the context keys c_t for t < a only (the draft cache at that round holds
  exactly the committed positions before the anchor), subject to the sliding-window rule
  ``query_pos - key_pos < window``, plus every key of their own block (bidirectional);
- blocks never see each other, so packing many per sequence changes nothing.

tests/test_train.py checks this forward against the inference forward to fp32 precision.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops
from ..models.dspine import DSpineDraft


@dataclass
class Blocks:
    """The training blocks of a batch of ``b`` sequences, ``n`` blocks each, block size B.

    ``anchors [b, n]`` anchor positions; ``keep [b, n]`` False for padding blocks (a sequence
    with fewer anchor candidates than n); ``positions [b, n, B]`` = a + j; ``tokens [b, n, B]``
    the true tokens x_{a+j} (0 past the end); ``valid [b, n, B-1]`` whether target j = 1..B-1
    counts in the loss (kept block and a + j inside the sequence); ``teacher [b, n, B-1, H]``
    (soft labels only) the target's final-normed state at a+j-1, whose logits are its
    distribution of x_{a+j}."""

    anchors: torch.Tensor
    keep: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    teacher: torch.Tensor | None = None

    @property
    def targets(self) -> torch.Tensor:
        """y_j = x_{a+j} for j = 1..B-1."""
        return self.tokens[..., 1:]

    @property
    def previous(self) -> torch.Tensor:
        """y_{j-1} for j = 1..B-1 (y_0 = the anchor token): the transition's teacher forcing."""
        return self.tokens[..., :-1]


def sample_anchors(lengths: torch.Tensor, starts: torch.Tensor, num_blocks: int,
                   seq_len: int, generator: torch.Generator | None = None):
    """Draws up to ``num_blocks`` distinct anchors per sequence, uniformly among the positions
    a with ``starts <= a <= length - 2``: the anchor is a response token (at inference the first
    round anchors on the first generated token) and at least one target follows it.

    Returns ``(anchors [b, n], keep [b, n])``; n = min(num_blocks, most candidates in the batch)."""
    pos = torch.arange(seq_len)[None, :]
    ok = (pos >= starts[:, None]) & (pos <= lengths[:, None] - 2)
    n = max(1, min(num_blocks, int(ok.sum(1).max())))
    # Random keys for the candidates, +inf elsewhere: the n smallest are a uniform sample.
    keys = torch.rand(lengths.shape[0], seq_len, generator=generator).masked_fill(~ok, 2.0)
    chosen, anchors = torch.topk(keys, n, dim=1, largest=False)
    return anchors, chosen < 2.0


def make_blocks(tokens: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
                keep: torch.Tensor, block_size: int) -> Blocks:
    """Lays out the blocks of ``anchors`` over the padded ``tokens [b, S]``."""
    b, s = tokens.shape
    positions = anchors[..., None] + torch.arange(block_size, device=anchors.device)
    inside = positions < lengths[:, None, None]
    block_tokens = torch.gather(tokens, 1, positions.clamp(max=s - 1).view(b, -1)).view(
        positions.shape).masked_fill(~inside, 0)
    valid = (inside & keep[..., None])[..., 1:]
    return Blocks(anchors, keep, positions, block_tokens, valid)


def teacher_states(final: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """The target's final-normed states ``final [b, S, H]`` at positions a+j-1, j = 1..B-1 (the
    states whose logits predict the block's targets) -> ``[b, n, B-1, H]``."""
    b, s, h = final.shape
    before = blocks.positions[..., :-1].clamp(max=s - 1).reshape(b, -1)
    return torch.gather(final, 1, before[..., None].expand(-1, -1, h)).view(
        *blocks.valid.shape, h)


def block_attention_mask(blocks: Blocks, ctx_len: int, window: int | None) -> torch.Tensor:
    """Boolean mask ``[b, 1, n*B, ctx_len + n*B]`` (True = may attend): queries of the block at
    a see context keys t < a and the keys of their own block, all within the sliding window."""
    b, n, blk = blocks.positions.shape
    dev = blocks.positions.device
    qpos = blocks.positions.reshape(b, n * blk)
    q_anchor = blocks.anchors.repeat_interleave(blk, dim=1)
    ctx_pos = torch.arange(ctx_len, device=dev)
    sees_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]
    block_id = torch.arange(n, device=dev).repeat_interleave(blk)
    sees_block = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
    if window:
        sees_ctx = sees_ctx & (qpos[:, :, None] - ctx_pos[None, None, :] < window)
        sees_block = sees_block & (qpos[:, :, None] - qpos[:, None, :] < window)
    return torch.cat([sees_ctx, sees_block], dim=2)[:, None]


@dataclass
class DraftOutputs:
    """``hidden [b, n, B-1, H]``: final-normed states of positions 1..B-1 (what U and G read);
    ``features``: per layer, the predicted features f^l_j of positions 1..B-1 (empty without
    injection) for the layer-wise output-embedding supervision."""

    hidden: torch.Tensor
    features: list[torch.Tensor]


class TrainingForward:
    """Binds a draft to the target's frozen embeddings / lm_head for differentiable forwards."""

    def __init__(self, draft: DSpineDraft, embed: torch.Tensor, lm_head: torch.Tensor):
        c = draft.config
        self.draft, self.embed, self.lm_head = draft, embed, lm_head
        self.cos_sin = ops.rope_cos_sin(c.head_dim, c.max_position_embeddings, c.rope_theta,
                                        device=lm_head.device)

    def __call__(self, taps: torch.Tensor, blocks: Blocks) -> DraftOutputs:
        """``taps [b, S, T*H]`` the target's tapped states of the padded batch."""
        d, c = self.draft, self.draft.config
        b, n, blk = blocks.positions.shape
        ctx = d.hidden_norm(d.fc(taps))  # c_t for every position; the mask picks t < a
        ctx_pos = torch.arange(taps.shape[1], device=taps.device).expand(b, -1)
        mask = block_attention_mask(blocks, taps.shape[1], c.sliding_window)
        hidden = self._block_input(blocks)
        anchor_feature = F.embedding(blocks.tokens[..., 0], self.lm_head)  # f_0 = E_out[anchor]
        qpos = blocks.positions.reshape(b, n * blk)
        features = []
        for layer in d.layers:
            h = hidden.view(b, n * blk, -1)
            h = h + self._attention(layer, layer.input_layernorm(h), ctx, qpos, ctx_pos, mask)
            x = layer.post_attention_layernorm(h)
            h = h + layer.mlp(x)
            hidden = h.view(b, n, blk, -1)
            if layer.injection is not None:
                hidden, f = layer.injection(hidden, anchor_feature)
                features.append(f[:, :, 1:])
        return DraftOutputs(d.norm(hidden)[:, :, 1:], features)

    def _block_input(self, blocks: Blocks) -> torch.Tensor:
        """``[anchor embedding, mask row x (B-1)]`` per block: ``[b, n, B, H]``, in the master
        weights' dtype so the residual stream stays fp32 under bf16 autocast."""
        d = self.draft
        anchor = F.embedding(blocks.tokens[..., :1], self.embed).to(d.norm.weight.dtype)
        mask_row = (d.mask_embedding if d.mask_embedding is not None
                    else self.embed[d.config.mask_token_id])
        rest = mask_row.to(anchor.dtype).expand(*anchor.shape[:2], blocks.positions.shape[2] - 1,
                                                anchor.shape[-1])
        return torch.cat([anchor, rest], dim=2)

    def _attention(self, layer, x, ctx, qpos, ctx_pos, mask) -> torch.Tensor:
        c, attn = self.draft.config, layer.self_attn
        b, m, _ = x.shape
        q = self._rope(attn.q_norm(attn.q_proj(x).view(b, m, c.num_heads, c.head_dim)), qpos)
        k_ctx, v_ctx = self._key_value(attn, ctx, ctx_pos)
        k_blk, v_blk = self._key_value(attn, x, qpos)
        group = c.num_heads // c.num_kv_heads
        k = torch.cat([k_ctx, k_blk], 1).repeat_interleave(group, dim=2)
        v = torch.cat([v_ctx, v_blk], 1).repeat_interleave(group, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).to(q.dtype),
                                             v.transpose(1, 2).to(q.dtype), attn_mask=mask,
                                             scale=self.draft.scale)
        return attn.o_proj(out.transpose(1, 2).reshape(b, m, -1))

    def _key_value(self, attn, x, positions):
        """K (k_norm, RoPE at ``positions``) and V of ``x [b, m, H]``, as `DSpineDraft._kv` +
        `write_kv` compute them."""
        c = self.draft.config
        b, m, _ = x.shape
        k = attn.k_norm(attn.k_proj(x).view(b, m, c.num_kv_heads, c.head_dim))
        return self._rope(k, positions), attn.v_proj(x).view(b, m, c.num_kv_heads, c.head_dim)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, m, h, dim = x.shape
        flat = ops.trainable_rope(x.reshape(b * m, h, dim), positions.reshape(-1).to(torch.int32),
                                  self.cos_sin)
        return flat.view(b, m, h, dim)
