"""Matrix-multiply FLOPs of one training micro-batch, counted from the shapes (for the achieved
TFLOP/s the trainer reports). Counted: every GEMM of the target capture (forward only) and of
each draft (forward + backward = 3x forward), attention score/value products, and the
vocabulary projections of the loss (logits + their gradient = 2 GEMMs per CE term, see
`losses._RowCrossEntropy`). Not counted: norms, activations, softmax, the optimizer."""
from __future__ import annotations


def _attention(q_tokens: float, keys_per_query: float, heads: int, head_dim: int) -> float:
    return 4.0 * q_tokens * keys_per_query * heads * head_dim  # QK^T and PV


def target_capture_flops(cfg, lengths: list[int]) -> float:
    tokens = float(sum(lengths))
    h, hd = cfg.hidden_size, cfg.head_dim
    per_token = (h * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * h
                 + 3 * h * cfg.intermediate_size)
    causal_keys = sum(n * (n + 1) / 2 for n in lengths)
    return cfg.num_layers * (2.0 * tokens * per_token
                             + _attention(1.0, causal_keys, cfg.num_heads, hd))


def draft_step_flops(draft_cfg, lengths: list[int], blocks: int, valid_rows: int,
                     ce_terms: int) -> float:
    """``blocks`` kept blocks of B positions over sequences of ``lengths`` (their context);
    ``valid_rows`` supervised positions; ``ce_terms`` vocabulary CE terms in the loss."""
    c = draft_cfg
    h, hd, blk = c.hidden_size, c.head_dim, c.block_size
    ctx_tokens = float(sum(lengths))
    block_tokens = float(blocks * blk)
    kv = 2 * c.num_kv_heads * hd * h
    layer_block = (c.num_heads * hd * h + kv + c.num_heads * hd * h + 3 * h * c.intermediate_size)
    if c.injection:
        layer_block += 4 * h * h  # predictor, gate (2h -> h), inject
    fwd = 2.0 * (ctx_tokens * len(c.target_layer_ids) * h * h  # fc over the context
                 + c.num_layers * (ctx_tokens * kv + block_tokens * layer_block))
    mean_ctx = ctx_tokens / max(1, len(lengths)) / 2 + blk  # a block sees about half on average
    fwd += c.num_layers * _attention(block_tokens, mean_ctx, c.num_heads, hd)
    ce = ce_terms * 4.0 * valid_rows * h * c.vocab_size
    return 3.0 * fwd + ce


def ce_terms(draft_cfg, layer_weight: float, soft_labels: bool = False) -> float:
    """Vocabulary CE terms of the loss, each two GEMMs (logits, their gradient); a soft label
    adds a forward-only GEMM (its logits) to the final and transition terms: half a term."""
    c = draft_cfg
    outputs = 1 + int(c.transition)
    return (outputs + (c.num_layers if c.injection and layer_weight > 0 else 0)
            + (0.5 * outputs if soft_labels else 0.0))
