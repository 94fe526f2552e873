"""The DSpine draft model: a DFlash-style block drafter with adjacent causal injection in every
layer and a transition-cache head. With injection and transition off it is a DFlash drafter.

Inference (`ingest_context`, `propose`) runs on our kernels and the paged draft cache; training
(`dspine_engine.train.forward`) runs the same weights through differentiable torch ops. Both read
the parameters defined here, and tests check that the two paths agree.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from .attention_meta import AttnMeta
from .config import ModelConfigError
from .dense import Dense
from .draft_config import DraftConfig
from .quant_dense import embedding_rows, table_times
from .weights import WeightStore, checkpoint_files, save_checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # training path (differentiable)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def _linear(i, o):
    return nn.Linear(i, o, bias=False)


class Attention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.q_proj = _linear(c.hidden_size, c.num_heads * c.head_dim)
        self.k_proj = _linear(c.hidden_size, c.num_kv_heads * c.head_dim)
        self.v_proj = _linear(c.hidden_size, c.num_kv_heads * c.head_dim)
        self.o_proj = _linear(c.num_heads * c.head_dim, c.hidden_size)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size)


class Injection(nn.Module):
    """Predicts the layer's feature f_j in the target's output-embedding space and passes the
    predecessor's feature into each position through a receiver-side gate."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        h = c.hidden_size
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.predictor = _linear(h, h)  # P_l: norm(h_j) -> f_j
        self.gate = _linear(2 * h, h)  # W_g [norm(h_j); f_{j-1}]
        self.inject = _linear(h, h)  # W_i f_{j-1}


class DraftLayer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        self.injection = Injection(c) if c.injection else None


class Transition(nn.Module):
    """s_j(b | a) = U_j(b) + sum_r P[a, r] G_j[r] Q[b, r], with P = E_out W_a, Q = E_out W_b and
    G_j = W_h norm(h_j). P and Q (V x r) are the transition cache, computed once at bind time."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.hidden_proj = _linear(c.hidden_size, c.transition_rank)  # W_h
        self.pred = _linear(c.hidden_size, c.transition_rank)  # W_a
        self.succ = _linear(c.hidden_size, c.transition_rank)  # W_b


class DSpineDraft(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        c = self.config = config
        self.fc = _linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.transition = Transition(c) if c.transition else None
        self.mask_embedding = (nn.Parameter(torch.zeros(c.hidden_size))
                               if c.mask_token_id is None else None)
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self._bound = None  # set by bind(): shared target tensors + inference caches

    # ------------------------------------------------------------------ construction / io
    def init_weights(self, seed: int = 0, std: float = 0.02) -> "DSpineDraft":
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        # Start injection gates mostly closed so a fresh DSpine draft begins as its DFlash twin.
        for layer in self.layers:
            if layer.injection is not None:
                with torch.no_grad():
                    layer.injection.gate.weight.mul_(0.1)
        return self

    @classmethod
    def load(cls, path: Path, device="cpu", dtype=torch.float32, progress=True) -> "DSpineDraft":
        path = Path(path)
        config = DraftConfig.from_dir(path)
        model = cls(config)
        store = WeightStore(checkpoint_files(path), desc="loading draft", progress=progress)
        expected = dict(model.named_parameters())
        missing = [n for n in expected if not store.has(n)]
        if missing:
            raise ModelConfigError(f"draft checkpoint {path} lacks {len(missing)} tensors, "
                                   f"e.g. {missing[:3]}")
        with torch.no_grad():
            for name, p in expected.items():
                p.copy_(store.get(name, tuple(p.shape)))
        return model.to(device=device, dtype=dtype).eval()

    def save(self, path: Path, dtype=torch.bfloat16, max_shard_bytes: int | None = None) -> None:
        """Writes config.json and the weights (sharded when larger than ``max_shard_bytes``)."""
        import json

        path = Path(path)
        tensors = {n: p.detach().to("cpu", dtype).contiguous()
                   for n, p in self.named_parameters()}
        save_checkpoint(tensors, path, max_shard_bytes)
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    # ------------------------------------------------------------------ binding to a target
    def bind(self, embed: torch.Tensor, lm_head: torch.Tensor, target_config,
             lm_head_dense: Dense | None = None, max_positions: int | None = None) -> None:
        """Attaches the target's embeddings and lm_head (shared, never copied; pass the target's
        `Dense` of it too) and builds the inference caches: the projections laid out for the
        device (fused where they share an input), the RoPE table (at least ``max_positions``
        rows: the engine's padding positions past the context) and the transition tables."""
        c = self.config
        c.check_target(target_config)
        dtype, device = lm_head.dtype, lm_head.device  # (a QuantWeight table computes in fp32)
        cast = lambda *ws: torch.cat([w.to(dtype) for w in ws]).contiguous()  # noqa: E731
        with torch.no_grad():
            b = {"embed": embed, "lm_head": lm_head,
                 "lm_head_dense": lm_head_dense or Dense(lm_head),
                 "cos_sin": ops.rope_cos_sin(c.head_dim,
                                             max(c.max_position_embeddings, max_positions or 0),
                                             c.rope_theta, device=device),
                 "fc": Dense(cast(self.fc.weight))}
            b["q"] = [Dense(cast(l.self_attn.q_proj.weight)) for l in self.layers]
            b["kv"] = [Dense(cast(l.self_attn.k_proj.weight, l.self_attn.v_proj.weight))
                       for l in self.layers]
            b["o"] = [Dense(cast(l.self_attn.o_proj.weight)) for l in self.layers]
            b["gate_up"] = [Dense(cast(l.mlp.gate_proj.weight, l.mlp.up_proj.weight))
                            for l in self.layers]
            b["down"] = [Dense(cast(l.mlp.down_proj.weight)) for l in self.layers]
            if c.injection:
                h = c.hidden_size
                b["inj_pred"] = [Dense(cast(l.injection.predictor.weight)) for l in self.layers]
                b["inj_gate_h"] = [Dense(cast(l.injection.gate.weight[:, :h])) for l in self.layers]
                b["inj_f"] = [Dense(cast(l.injection.gate.weight[:, h:], l.injection.inject.weight))
                              for l in self.layers]
            if c.transition:
                b["g"] = Dense(cast(self.transition.hidden_proj.weight))
                b["pred_table"] = table_times(lm_head, self.transition.pred.weight.to(dtype).T)
                b["succ_table"] = table_times(lm_head, self.transition.succ.weight.to(dtype).T)
            b["mask_row"] = (self.mask_embedding.to(dtype) if self.mask_embedding is not None
                             else embedding_rows(embed, torch.tensor([c.mask_token_id]))[0])
        self._bound = b

    @property
    def bound(self) -> dict:
        if self._bound is None:
            raise RuntimeError("draft is not bound to a target: call bind() first")
        return self._bound

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """c_t = RMSNorm(fc(concat of tapped target states))."""
        return ops.rms_norm(self.bound["fc"](taps), self.hidden_norm.weight,
                            self.config.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor):
        c, layer = self.config, self.layers[i]
        n, kv = x.shape[0], c.num_kv_heads * c.head_dim
        kvx = self.bound["kv"][i](x)
        k = ops.rms_norm(kvx[:, :kv].view(n, c.num_kv_heads, c.head_dim),
                         layer.self_attn.k_norm.weight, c.rms_norm_eps)
        v = kvx[:, kv:].view(n, c.num_kv_heads, c.head_dim)
        return k, v

    @torch.inference_mode()
    def ingest_context(self, taps, positions, slots, k_caches, v_caches) -> None:
        """Writes the K/V of committed positions (all layers) into the draft cache."""
        ctx = self.context(taps)
        for i in range(self.config.num_layers):
            k, v = self._kv(i, ctx)
            ops.write_kv(k, v, positions, self.bound["cos_sin"], k_caches[i], v_caches[i], slots)

    @torch.inference_mode()
    def propose(self, anchors, ctx_taps, ctx_positions, ctx_slots, meta: AttnMeta, k_caches,
                v_caches, temperature, uniforms, top_k: int | None = None):
        """One draft forward for a batch of blocks; returns (tokens, cand_ids, cand_probs).

        ``anchors [b]``; ``ctx_taps [b*B, taps]`` the pending context rows (padding rows have
        slot -1); ``meta`` describes the blocks (positions p..p+B-1, kv_lens p+B, bidirectional)."""
        hn = self.block_hidden(anchors, ctx_taps, ctx_positions, ctx_slots, meta, k_caches,
                               v_caches)
        logits, g = self.heads(hn)
        bd = self.bound
        return ops.transition_walk(logits, g, bd.get("pred_table", g), bd.get("succ_table", g),
                                   anchors, top_k or self.config.transition_top_k, temperature,
                                   uniforms)

    def heads(self, hn: torch.Tensor):
        """U_j = lm_head(hn_j) and G_j = W_h hn_j (empty without the transition head)."""
        logits = self.bound["lm_head_dense"](hn)
        g = self.bound["g"](hn) if self.config.transition else logits.new_empty(0)
        return logits, g

    @torch.inference_mode()
    def block_hidden(self, anchors, ctx_taps, ctx_positions, ctx_slots, meta: AttnMeta, k_caches,
                     v_caches) -> torch.Tensor:
        """The draft layers over the blocks; returns the final-normed states of positions
        1..B-1, ``[b, B-1, H]`` (what both heads read)."""
        c, bd = self.config, self.bound
        bsz, blk, h = anchors.shape[0], c.block_size, c.hidden_size
        hidden = bd["mask_row"].expand(bsz, blk, h).clone()
        hidden[:, 0] = embedding_rows(bd["embed"], anchors)
        hidden = hidden.view(bsz * blk, h)
        ctx = self.context(ctx_taps)
        kv_positions = torch.cat([ctx_positions, meta.positions])
        kv_slots = torch.cat([ctx_slots, meta.slots])
        window = c.sliding_window or 0
        for i, layer in enumerate(self.layers):
            x = ops.rms_norm(hidden, layer.input_layernorm.weight, c.rms_norm_eps)
            q = bd["q"][i](x).view(-1, c.num_heads, c.head_dim)
            q = ops.rope(ops.rms_norm(q, layer.self_attn.q_norm.weight, c.rms_norm_eps),
                         meta.positions, bd["cos_sin"])
            k, v = self._kv(i, torch.cat([ctx, x]))
            ops.write_kv(k, v, kv_positions, bd["cos_sin"], k_caches[i], v_caches[i], kv_slots)
            attn = ops.paged_attention(q, k_caches[i], v_caches[i], meta.block_tables,
                                       meta.kv_lens, meta.cu_q, blk, False, window, self.scale)
            hidden = hidden + bd["o"][i](attn.view(bsz * blk, -1))
            x = ops.rms_norm(hidden, layer.post_attention_layernorm.weight, c.rms_norm_eps)
            gu = bd["gate_up"][i](x)
            inter = c.intermediate_size
            hidden = hidden + bd["down"][i](F.silu(gu[:, :inter]) * gu[:, inter:])
            if layer.injection is not None:
                hidden = self._inject(i, hidden, anchors)
        return ops.rms_norm(hidden, self.norm.weight, c.rms_norm_eps).view(bsz, blk, h)[:, 1:]

    def _inject(self, i: int, hidden: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        c, bd, inj = self.config, self.bound, self.layers[i].injection
        bsz, blk, h = anchors.shape[0], c.block_size, c.hidden_size
        hn = ops.rms_norm(hidden, inj.norm.weight, c.rms_norm_eps)
        f = bd["inj_pred"][i](hn).view(bsz, blk, h)
        f[:, 0] = embedding_rows(bd["lm_head"], anchors)  # the anchor's feature is exact
        gate_h = bd["inj_gate_h"][i](hn).view(bsz, blk, h)
        fproj = bd["inj_f"][i](f)
        return ops.fused_injection(hidden.view(bsz, blk, h), gate_h, fproj).view(bsz * blk, h)
