"""The DSpine draft model: a DFlash-style block drafter with adjacent causal injection in every
layer and a transition-cache head. With injection and transition off it is a DFlash drafter.

Inference (`ingest_context`, `forward`, `propose`) runs on our kernels and the paged draft cache,
from the tables `bind` lays out (`BoundTables`); training (`dspine_engine.train.forward`) runs the
same weights through the differentiable pieces defined here (`RMSNorm`, `MLP`, `Injection`, the RoPE
kernel with a backward, `ops.trainable_rope`). Tests check that the two paths agree.

DSpine or DFlash is a fact of the config (`DraftConfig.injection`, `.transition`): a layer without
injection has no `Injection` module and no injection tables, a drafter without the transition head
has neither `Transition` nor `TransitionTables`, and `choose_drafts` walks without a pair term.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from .attention_meta import AttnMeta
from .config import ModelConfigError
from .dense import Dense
from .draft_config import DraftConfig
from .quant_dense import QuantWeight, embedding_rows, in_format, quantize_weight, table_times
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

    def forward(self, x):  # training path; inference runs the fused `LayerTables.gate_up`
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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

    def forward(self, hidden: torch.Tensor, anchor_feature: torch.Tensor):
        """Training path over blocks ``hidden [b, n, B, H]`` (inference: `ops._inject`,
        one `ops.fused_injection`). Returns the updated states and the predicted features
        ``f = P(norm(h))`` of every position; f_0 is replaced by ``anchor_feature`` (E_out of
        the anchor) only as the input of position 1."""
        hn = self.norm(hidden)
        f = self.predictor(hn)
        prev = torch.cat([anchor_feature[:, :, None].to(f.dtype), f[:, :, 1:-1]], dim=2)
        gate = torch.sigmoid(self.gate(torch.cat([hn[:, :, 1:], prev], dim=-1)))
        updated = hidden[:, :, 1:] + gate * self.inject(prev)
        return torch.cat([hidden[:, :, :1], updated.to(hidden.dtype)], dim=2), f


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


# A draft projection at inference: fp32 (`Dense`) or, beside a quantised CPU target, Q4_1
# blocks on the quantised kernels (`QuantWeight`; `DSpineDraft.bind`, ``weight_format``).
Projection = Dense | QuantWeight


@dataclass
class InjectionTables:
    """One layer's injection weights laid out for inference."""

    predictor_gate_h: Projection  # [P_l; the norm(h_j) half of W_g]: one GEMM reads norm(h_j)
    gate_f_inject: Projection  # [the f_{j-1} half of W_g; W_i]: one GEMM for both readers of f_{j-1}


@dataclass
class LayerTables:
    q: Projection
    kv: Projection  # [k_proj; v_proj]
    o: Projection
    gate_up: Projection  # [gate_proj; up_proj]
    down: Projection
    injection: InjectionTables | None  # None: a DFlash layer
    norms: tuple  # the norm weights (input, q, k, post-attention[, injection]): the module's

    def loop_entry(self) -> tuple:
        """This layer as `ops.draft_layers_loop` takes it: (projections, norm weights)."""
        proj = (self.q, self.kv, self.o, self.gate_up, self.down)
        inj = self.injection
        return (proj if inj is None else proj + (inj.predictor_gate_h, inj.gate_f_inject),
                self.norms)


@dataclass
class TransitionTables:
    """The transition head at inference: G_j = W_h norm(h_j) and the V x r cache P, Q."""

    hidden_proj: Projection  # W_h
    pred: torch.Tensor  # P = E_out W_a [V, r]
    succ: torch.Tensor  # Q = E_out W_b [V, r]


@dataclass
class BoundTables:
    """What `DSpineDraft.bind` attaches: the target's shared tensors (never copied) and the
    draft's weights laid out for the device."""

    embed: torch.Tensor
    lm_head: torch.Tensor
    lm_head_dense: Projection  # the heads' lm_head: the target's, or a copy in weight_format
    cos_sin: torch.Tensor  # RoPE table, at least as long as the engine's reach
    fc: Projection
    mask_row: torch.Tensor  # the block's MASK input row
    layers: list[LayerTables]
    transition: TransitionTables | None  # None: a DFlash drafter
    # The layers as `ops.draft_layers_loop` takes them (`LayerTables.loop_entry`), laid out once
    # here rather than every forward.
    loop: list | None = None
    # `ops.draft_layers`' weight and norm lists when the projections are quantised (the layer
    # loop is then one op); None: the loop runs op by op (`ops.draft_layers_loop`).
    layer_lists: tuple[list, list] | None = None


def choose_drafts(logits, pair, anchors, top_k: int, temperature, uniforms):
    """The draft tokens (and their sparse q) of ``logits [b, J, V]`` by the transition walk;
    ``pair = (G [b, J, r], P, Q)`` or None for a drafter without the transition head (DFlash:
    the walk is then the chain of per-position choices). The kernel's way of saying "no pair
    term" (empty tensors) stays in this one place."""
    if pair is None:
        empty = logits.new_empty(0)
        pair = (empty, empty, empty)
    return ops.transition_walk(logits, *pair, anchors, top_k, temperature, uniforms)


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
        self._projections_dropped = False  # drop_training_projections() was called

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
             lm_head_dense: Projection | None = None, max_positions: int | None = None,
             weight_format: str | None = None) -> None:
        """Attaches the target's embeddings and lm_head (shared, never copied; pass the target's
        `Dense` of it too) and builds the inference caches: the projections laid out for the
        device (fused where they share an input), the RoPE table (at least ``max_positions``
        rows: the engine's padding positions past the context) and the transition tables.

        ``weight_format`` ("q4_1" or "q8_0") holds the projections in those blocks and runs
        them on the quantised CPU kernels, and the heads' lm_head too (a copy when the target's
        table is in another format): the engine asks for Q4_1 beside a quantised target (those
        kernels run on our chunk pool, not on OpenMP, and a CPU draft forward is bound by the
        bytes it reads; docs/DECISIONS.md). Drafts change by the rounding only; output stays
        the target's."""
        c = self.config
        if self._projections_dropped:
            raise RuntimeError("this draft's projection weights were dropped after its first "
                               "bind (drop_training_projections): load it again to bind it anew")
        c.check_target(target_config)
        dtype, device = lm_head.dtype, lm_head.device  # (a QuantWeight table computes in fp32)

        def dense(*ws) -> Projection:
            w = torch.cat([w.to(dtype) for w in ws]).contiguous()
            return Dense(w) if weight_format is None else quantize_weight(w, weight_format)

        heads = lm_head_dense or Dense(lm_head, vocabulary=True)
        if weight_format is not None:
            heads = in_format(heads, weight_format)
        with torch.no_grad():
            transition = None
            if c.transition:
                tr = self.transition
                # A quantised CPU draft keeps P and Q in bf16 (the CPU walk reads bf16 tables
                # beside fp32 logits): they are V x r each (96 MB of fp32 for the default
                # drafter) and the walk reads K rows of them a step.
                table_dtype = (torch.bfloat16 if weight_format is not None
                               and device.type == "cpu" else dtype)
                transition = TransitionTables(
                    dense(tr.hidden_proj.weight),
                    table_times(lm_head, tr.pred.weight.to(dtype).T, dtype=table_dtype),
                    table_times(lm_head, tr.succ.weight.to(dtype).T, dtype=table_dtype))
            mask_row = (self.mask_embedding.to(dtype) if self.mask_embedding is not None
                        else embedding_rows(embed, torch.tensor([c.mask_token_id]))[0])
            self._bound = BoundTables(
                embed=embed, lm_head=lm_head, lm_head_dense=heads,
                cos_sin=ops.rope_cos_sin(c.head_dim,
                                         max(c.max_position_embeddings, max_positions or 0),
                                         c.rope_theta, device=device),
                fc=dense(self.fc.weight), mask_row=mask_row,
                layers=[self._layer_tables(layer, dense) for layer in self.layers],
                transition=transition)
            self._bound.loop = [t.loop_entry() for t in self._bound.layers]
            if weight_format is not None:
                self._bound.layer_lists = ops.draft_layer_lists(self._bound.loop)

    def _layer_tables(self, layer: DraftLayer, dense) -> LayerTables:
        attn, mlp, inj, h = layer.self_attn, layer.mlp, layer.injection, self.config.hidden_size
        norms = (layer.input_layernorm.weight, attn.q_norm.weight, attn.k_norm.weight,
                 layer.post_attention_layernorm.weight) + (() if inj is None else
                                                           (inj.norm.weight,))
        return LayerTables(norms=norms,
            q=dense(attn.q_proj.weight), kv=dense(attn.k_proj.weight, attn.v_proj.weight),
            o=dense(attn.o_proj.weight), gate_up=dense(mlp.gate_proj.weight, mlp.up_proj.weight),
            down=dense(mlp.down_proj.weight),
            injection=None if inj is None else InjectionTables(
                dense(inj.predictor.weight, inj.gate.weight[:, :h]),
                dense(inj.gate.weight[:, h:], inj.inject.weight)))

    def drop_training_projections(self) -> None:
        """Frees the module's projection weights (every ``nn.Linear``) once `bind` has laid them
        out for inference, which reads only the norms and the mask embedding of the module
        afterwards. Why: `bind` copies the projections (fused, and quantised beside a GGUF
        target), so an engine's draft held them twice: on the CPU the fp32 module was 76 MB of
        the drafted engine's ~290 MB over the target alone. The training forward and a second
        bind are then impossible (bind says so)."""
        self.bound  # noqa: B018 (raises when not bound: nothing else would hold the weights)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)
        self._projections_dropped = True

    @property
    def bound(self) -> BoundTables:
        if self._bound is None:
            raise RuntimeError("draft is not bound to a target: call bind() first")
        return self._bound

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """c_t = RMSNorm(fc(concat of tapped target states))."""
        return ops.rms_norm(self.bound.fc(taps), self.hidden_norm.weight,
                            self.config.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor):
        c = self.config
        return ops.draft_kv(self.bound.layers[i].kv(x), c.num_kv_heads, c.head_dim)

    @torch.inference_mode()
    def ingest_context(self, taps, positions, slots, k_caches, v_caches) -> None:
        """Writes the K/V of committed positions (all layers) into the draft cache."""
        ctx = self.context(taps)
        for i in range(self.config.num_layers):
            k, v = self._kv(i, ctx)
            ops.write_kv(k, v, positions, self.bound.cos_sin, k_caches[i], v_caches[i], slots,
                         self.layers[i].self_attn.k_norm.weight, self.config.rms_norm_eps)

    @torch.inference_mode()
    def propose(self, anchors, ctx_taps, ctx_positions, ctx_slots, meta: AttnMeta, k_caches,
                v_caches, temperature, uniforms, top_k: int | None = None,
                drafts: int | None = None):
        """One draft round for a batch of blocks: `forward`, the heads, the transition walk.
        Returns (tokens, cand_ids, cand_probs) for the first ``drafts`` positions (default all
        the block's); arguments as `forward`, plus the walk's ``temperature [b]`` and
        ``uniforms [b, >= drafts]``.

        The layers run over the block ``meta`` describes: the whole block, or (the engine's
        ``draft_block``) only the anchor and the drafts the round verifies, which changes the
        proposals a little (the block's attention is bidirectional). The heads and the walk
        run only over the drafts the round verifies: the walk chooses d_j from d_{j-1} alone,
        so the first J drafts are the same whether or not the later ones are chosen (on the
        CPU the lm_head over 15 rows is a third of a whole-block draft forward)."""
        hn = self(anchors, ctx_taps, ctx_positions, ctx_slots, meta, k_caches, v_caches)
        if drafts is not None and drafts < hn.shape[1]:
            hn = hn[:, :drafts]
        uniforms = uniforms[:, :hn.shape[1]]
        logits, g = self.heads(hn)
        tables = self.bound.transition
        pair = None if tables is None else (g, tables.pred, tables.succ)
        return choose_drafts(logits, pair, anchors, top_k or self.config.transition_top_k,
                             temperature, uniforms.contiguous())

    def heads(self, hn: torch.Tensor):
        """U_j = lm_head(hn_j) and G_j = W_h hn_j (None without the transition head)."""
        logits = self.bound.lm_head_dense(hn)
        tables = self.bound.transition
        return logits, None if tables is None else tables.hidden_proj(hn)

    @torch.inference_mode()
    def forward(self, anchors, ctx_taps, ctx_positions, ctx_slots, meta: AttnMeta, k_caches,
                v_caches) -> torch.Tensor:
        """The draft layers over a batch of blocks on the paged draft cache; returns the
        final-normed states of positions 1..L-1, ``[b, L-1, H]`` (what both heads read), for
        blocks of L = ``meta.max_q_len`` positions (B, or fewer: `propose`).

        ``anchors [b]``; ``ctx_taps [b*R, taps]`` the pending context rows at ``ctx_positions``
        (written to ``ctx_slots`` first; padding rows have slot -1); ``meta`` describes the
        blocks (positions p..p+L-1, kv_lens p+L, bidirectional)."""
        c, bd = self.config, self.bound
        bsz, blk, h = anchors.shape[0], meta.max_q_len, c.hidden_size
        hidden = bd.mask_row.expand(bsz, blk, h).clone()
        hidden[:, 0] = embedding_rows(bd.embed, anchors)
        hidden = hidden.view(bsz * blk, h)
        ctx = self.context(ctx_taps)
        kv_positions = torch.cat([ctx_positions, meta.positions])
        kv_slots = torch.cat([ctx_slots, meta.slots])
        # The anchors' features (E_out rows) are the same in every injecting layer: one lookup.
        anchor_f = (embedding_rows(bd.lm_head, anchors) if c.injection
                    else hidden.new_empty(0))
        args = (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
                meta.positions, kv_positions, kv_slots, bd.cos_sin, k_caches, v_caches,
                meta.block_tables, meta.kv_lens, meta.cu_q, blk, c.sliding_window or 0,
                self.scale, meta.max_kv_len)
        if bd.layer_lists is not None:  # quantised: the loop in one op (no dispatch a step)
            weights, norms = bd.layer_lists
            fmt = bd.fc.format
            hidden = ops.draft_layers(hidden, ctx, anchor_f, weights, norms, fmt, *args)
        else:
            hidden = ops.draft_layers_loop(hidden, ctx, anchor_f, bd.loop, *args)
        return ops.rms_norm(hidden, self.norm.weight, c.rms_norm_eps).view(bsz, blk, h)[:, 1:]
