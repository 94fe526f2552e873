"""The Python face of the `torch.ops.dspine.*` kernels and the pure-PyTorch reference of each.

Every op exists three times: a C++ CPU kernel (csrc/cpu), a CUDA kernel (csrc/cuda) and the
reference below. The references are the specification: tests compare the kernels with them on
random inputs, and the docstrings state the exact semantics (masks, tie-breaking, sampling rules).

Conventions shared by all ops
- Index tensors (positions, slots, block tables, lengths, cu_q) are int32; token ids are int64.
- Paged KV cache of one layer: ``[num_pages, page_size, num_kv_heads, head_dim]``.
  ``block_tables[b, i]`` is the page holding positions ``i*page_size .. (i+1)*page_size-1`` of
  sequence b. ``slots[t] = page * page_size + offset`` addresses one position; ``slot < 0`` means
  "do not write" (padding).
- RoPE is the rotate-half (GPT-NeoX) form; ``cos_sin[pos] = [cos(pos*f_0..f_{D/2-1}),
  sin(...)]`` in fp32, so scaling schemes (llama3, linear, ...) live only in the table.
- Sampling: probabilities are ``softmax(logits / T)`` after top-k, then top-p; both filters are
  tie-inclusive (``keep p >= threshold``). Randomness enters only through ``uniforms`` inputs, so
  the three implementations make the same choices from the same numbers.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from . import _C  # noqa: F401  (loads the extension and registers torch.ops.dspine)

_ops = torch.ops.dspine


# --------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim (computed in fp32)."""
    return _ops.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    """Returns ``(rms_norm(x + residual), x + residual)``: the pre-norm residual update."""
    return _ops.add_rms_norm(x, residual, weight, eps)


def rms_norm_ref(x, weight, eps):
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def add_rms_norm_ref(x, residual, weight, eps):
    s = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(s, weight, eps), s


# --------------------------------------------------------------------------------------------
# RoPE and the paged KV write
# --------------------------------------------------------------------------------------------

def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, norm=None,
         eps: float = 0.0) -> torch.Tensor:
    """Rotates ``x [N, H, D]`` by the angles of ``positions [N]`` (rotate-half form). ``norm``
    (a ``[D]`` weight, optional): each head row is first ``rms_norm``-ed with it and ``eps``
    (a per-head q norm), rounded to x's dtype as that op stores it; on CUDA in the same launch."""
    return _ops.rope(x, positions, cos_sin, norm, eps)


def trainable_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
    """`rope` with a backward (the draft's training forward runs it). Kept off the op itself:
    an autograd kernel registered on it costs every inference call a few microseconds."""
    return _TrainableRope.apply(x, positions, cos_sin)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([x[..., half:], x[..., :half]], dim=-1)


class _TrainableRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, cos_sin):
        ctx.save_for_backward(positions, cos_sin)
        return _ops.rope(x, positions, cos_sin)

    @staticmethod
    def backward(ctx, grad):
        """The gradient of a rotation is the inverse rotation. Swapping the halves before and
        after a rotation by +angle rotates by -angle, so the same kernel and table serve."""
        positions, cos_sin = ctx.saved_tensors
        return _swap_halves(_ops.rope(_swap_halves(grad), positions, cos_sin)), None, None


def write_kv(k, v, positions, cos_sin, k_cache, v_cache, slots, k_norm=None,
             eps: float = 0.0) -> None:
    """Writes ``rope(k)`` and ``v`` (``[N, Hkv, D]``) into the pages at ``slots [N]``.

    Rows whose slot is negative are skipped (padding). ``cos_sin`` may be an empty tensor: then
    k is written without rotation (used by models whose keys carry no position). The caches
    have k's dtype, or (CPU only) are fp16 under fp32 k/v: each value is then computed in fp32
    (a key after its rotation) and rounded once to nearest even, as torch's ``.half()``.
    ``k_norm`` (a ``[D]`` weight, optional): each key head row is first ``rms_norm``-ed with it
    and ``eps``, as `rope`'s ``norm``."""
    _ops.write_kv(k, v, positions, cos_sin, k_cache, v_cache, slots, k_norm, eps)


def rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_norm=None,
                  k_norm=None, eps: float = 0.0) -> torch.Tensor:
    """``rope(q)`` returned and ``write_kv(k, v, ...)`` done, in one CUDA launch instead of two (a
    target layer's query rotation and KV write; the CPU runs the ops in turn). ``q [N, Hq, D]``
    shares k's tokens, positions and table, which must be given (not empty). ``q_norm`` /
    ``k_norm`` (``[D]`` weights, optional): each head row of q / k is first ``rms_norm``-ed with
    them and ``eps`` (Qwen3's per-head norms), rounded to q's dtype as that op stores it; on CUDA
    inside the same launch (no norm launches, no copies of the strided q/k views)."""
    return _ops.rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_norm,
                              k_norm, eps)


def rope_write_kv_ref(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_norm=None,
                      k_norm=None, eps: float = 0.0) -> torch.Tensor:
    out = rope_ref(q, positions, cos_sin, q_norm, eps)
    write_kv_ref(k, v, positions, cos_sin, k_cache, v_cache, slots, k_norm, eps)
    return out


def rope_ref(x, positions, cos_sin, norm=None, eps: float = 0.0):
    x = x if norm is None else rms_norm_ref(x, norm, eps)
    half = x.shape[-1] // 2
    pos = positions.long()
    if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= cos_sin.shape[0]):
        raise IndexError(f"rope: positions outside the cos/sin table ({cos_sin.shape[0]} rows)")
    cs = cos_sin[pos].float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def write_kv_ref(k, v, positions, cos_sin, k_cache, v_cache, slots, k_norm=None,
                 eps: float = 0.0) -> None:
    # Padding rows (slot < 0) are neither written nor rotated; a slot past the cache is skipped
    # as the CUDA op skips it (it cannot refuse one without a host sync; the CPU op refuses).
    keep = (slots >= 0) & (slots < k_cache.shape[0] * k_cache.shape[1])
    k, v = k[keep], v[keep]
    if k_norm is not None:
        k = rms_norm_ref(k, k_norm, eps)
    if cos_sin.numel() > 0:
        k = rope_ref(k, positions[keep], cos_sin)
    s = slots[keep].long()
    page_size = k_cache.shape[1]
    k_cache[s // page_size, s % page_size] = k.to(k_cache.dtype)
    v_cache[s // page_size, s % page_size] = v.to(v_cache.dtype)


def rope_cos_sin(head_dim: int, max_positions: int, theta: float, scaling: dict | None = None,
                 device=None, rotary_dim: int | None = None) -> torch.Tensor:
    """The ``[max_positions, head_dim]`` fp32 table every RoPE op reads.

    ``scaling`` takes the HF ``rope_scaling`` / ``rope_parameters`` dict: "default", "linear",
    "dynamic" (treated as its static form at max_positions), and "llama3". ``rotary_dim <
    head_dim`` (partial RoPE): the frequencies are those of a rotary_dim-wide RoPE, and the pairs
    past rotary_dim/2 get frequency 0 (cos 1, sin 0: they pass through unchanged). A model using
    it orders its head dims so the rotated pairs are (i, i + head_dim/2) (models/hybrid.py)."""
    rot = rotary_dim or head_dim
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        scaled = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
        inv = scaled
    elif kind not in ("default", "dynamic"):
        raise ValueError(f"unsupported rope scaling type {kind!r}")
    inv = torch.cat([inv, torch.zeros(head_dim // 2 - inv.numel(), dtype=torch.float64)])
    t = torch.arange(max_positions, dtype=torch.float64)
    freqs = torch.outer(t, inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float().to(device)


# --------------------------------------------------------------------------------------------
# Paged sliding-window attention
# --------------------------------------------------------------------------------------------

def paged_attention(q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len: int,
                    causal: bool, window: int, scale: float, max_kv_len: int = 0,
                    exact: bool = False, prefill: bool = False) -> torch.Tensor:
    """Attention of varlen queries against a paged KV cache (GQA).

    ``q [Nq, Hq, D]``; sequence b owns query rows ``cu_q[b]:cu_q[b+1]`` (n_b rows) and keys
    ``0 .. kv_lens[b]-1``, which already include the K/V of its n_b new tokens, so query i of b
    sits at position ``p = kv_lens[b] - n_b + i``. Query p sees key k iff
    ``k <= p`` (causal) or ``k < kv_lens[b]`` (bidirectional block), and, when ``window > 0``,
    ``p - k < window``. Head h reads KV head ``h // (Hq / Hkv)``. ``max_q_len`` bounds n_b (the
    CUDA launch uses it, so no host sync is needed). A query that sees no key outputs zeros.
    ``block_tables [B, max_pages]`` must give every key a query sees a page (so ``max_pages >=
    ceil(kv_lens[b] / page_size)``); -1 is allowed only for pages no query sees (outside the
    window). ``max_kv_len`` (a host int, 0 = not given) bounds every ``kv_lens[b]``; CUDA plans
    its split-KV grid from it (else from the table width) and both backends refuse a table
    narrower than it. The CPU checks every length and visible page (its lengths and table are on
    the host). CUDA cannot check the device ``kv_lens`` themselves without a sync: a key past the
    table or on a -1 page reads as a zero key, which still takes softmax weight, so an understated
    ``max_kv_len`` (or none, with a too-narrow table) gives a wrong output without an error.
    ``exact`` (CUDA; the CPU always is) sums every row the same way whatever the call's other
    rows, so a row verified in a 16-token block is bitwise the row decoded alone: greedy
    speculative output then equals autoregressive output token for token (docs/DECISIONS.md,
    "Row-exact attention by default"). ``DSPINE_ATTN_EXACT=1`` turns it on for every call.
    ``prefill`` says the call is a prompt's prefill, whose rows no other call computes: on Hopper
    the wgmma kernel takes every such call it supports (bf16/fp16, head dim 64/128, no window),
    exact or not, since it sums each row over fixed key tiles whatever the call's other rows
    (``DSPINE_ATTN_SM90=0`` keeps it off). The result is the same attention either way.
    The caches have q's dtype, or (CPU only) are fp16 under fp32 q: their rows are widened to
    fp32 exactly and the output is fp32 (the GGUF path's fp16 cache); CUDA refuses the mix."""
    return _ops.paged_attention(q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len,
                                causal, window, scale, max_kv_len, exact, prefill)


def paged_attention_ref(q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len,
                        causal, window, scale, max_kv_len=0, exact=False, prefill=False):
    out = torch.zeros_like(q)
    page_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    for b in range(kv_lens.shape[0]):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        n, kv_len = q1 - q0, int(kv_lens[b])
        if n == 0:
            continue
        qpos = torch.arange(kv_len - n, kv_len)
        kpos = torch.arange(kv_len)
        rel = qpos[:, None] - kpos[None, :]  # query position minus key position
        visible = rel >= 0 if causal else torch.ones_like(rel, dtype=torch.bool)
        if window > 0:
            visible = visible & (rel < window)
        # Gather only pages that hold a visible key: pages outside the window may be freed.
        need = visible.any(0)
        pages = block_tables[b, (kpos // page_size)].long()
        pages = torch.where(need, pages, torch.zeros_like(pages))
        k = k_cache[pages, kpos % page_size].float().repeat_interleave(group, dim=1)
        v = v_cache[pages, kpos % page_size].float().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k) * scale
        s = s.masked_fill(~visible[None], float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v).to(q.dtype)
    return out


# --------------------------------------------------------------------------------------------
# The gated MLP's activation
# --------------------------------------------------------------------------------------------

def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x [N, 2I]`` (the gate_up projection's output): the
    gated MLP's activation in one kernel, fp32 math, rounded once to x's dtype."""
    return _ops.silu_mul(x)


def silu_mul_ref(x):
    inter = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[:, :inter]) * xf[:, inter:]).to(x.dtype)


# --------------------------------------------------------------------------------------------
# Fused adjacent causal injection (DSpine)
# --------------------------------------------------------------------------------------------

def fused_injection(h: torch.Tensor, gate_h: torch.Tensor, fproj: torch.Tensor) -> torch.Tensor:
    """Receiver-side gated injection of the predecessor's feature, for blocks ``[N, B, H]``.

    ``fproj [N, B, 2H]`` holds ``[W_gf f_j, W_i f_j]`` for every position j; ``gate_h [N, B, H]``
    holds ``W_gh norm(h_j)``. Position 0 (the anchor) is unchanged; for j >= 1
    ``out_j = h_j + sigmoid(gate_h_j + fproj_{j-1}[:H]) * fproj_{j-1}[H:]``."""
    return _ops.fused_injection(h, gate_h, fproj)


def fused_injection_ref(h, gate_h, fproj):
    hidden = h.shape[-1]
    gate = torch.sigmoid(gate_h[:, 1:].float() + fproj[:, :-1, :hidden].float())
    out = h.clone()
    out[:, 1:] = (h[:, 1:].float() + gate * fproj[:, :-1, hidden:].float()).to(h.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Sampling distribution shared by the walk and the verifier
# --------------------------------------------------------------------------------------------

def sampling_probs_ref(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    """fp32 target distribution of one row: softmax(logits / T) with tie-inclusive top-k, then
    tie-inclusive top-p (keep ``p >= tau`` with tau the smallest kept value of the sorted
    cumulative scan), renormalised. ``temperature`` must be > 0."""
    x = logits.float() / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sp = torch.sort(p, descending=True).values
        cut = int(torch.searchsorted(torch.cumsum(sp, 0), torch.tensor([top_p]))[0].clamp(max=sp.numel() - 1))
        p = torch.where(p >= sp[cut], p, torch.zeros_like(p))
        p = p / p.sum()
    return p


def _sample_index(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF sample: first index whose cumulative mass exceeds ``u * total``."""
    c = torch.cumsum(p.double(), 0)
    idx = int(torch.searchsorted(c, torch.tensor([u * float(c[-1])], dtype=torch.float64),
                                 right=True)[0])
    idx = min(idx, p.numel() - 1)
    while p[idx] <= 0:  # u*total landed exactly on a boundary; step to the next positive mass
        idx -= 1
    return idx


# --------------------------------------------------------------------------------------------
# Transition-cache scoring + chain walk (DSpine); DFlash drafting when the tables are absent
# --------------------------------------------------------------------------------------------

def transition_walk(logits, g, pred_table, succ_table, anchor, top_k: int, temperature,
                    uniforms):
    """Chooses the draft chain of every block in one launch.

    ``logits [b, J, V]`` are U_1..U_J; ``g [b, J, r]``; ``pred_table, succ_table [V, r]``
    (P = E_out W_a, Q = E_out W_b); ``anchor [b]`` int64; ``temperature [b]`` (0 = greedy);
    ``uniforms [b, J]``. Candidates C_j = top-k of U_j, sorted by score, ties to the lower id.
    Pair score ``s_j(c | a) = U_j(c) + sum_r P[a, r] g_j[r] Q[c, r]`` with a the chosen token
    at j-1 (the anchor for j = 1). Greedy: a_j = the first candidate of maximal score; sampled:
    q_j = softmax(s_j(.|a_{j-1}) / T) over the candidates and a_j its inverse-CDF sample.
    ``g``, ``pred_table``, ``succ_table`` empty: scores are U alone (a DFlash drafter).
    Returns ``tokens [b, J]`` int64, ``cand_ids [b, J, K]`` int64 and ``cand_probs [b, J, K]``
    fp32 (q_j; one-hot on the chosen candidate for greedy rows)."""
    return _ops.transition_walk(logits, g, pred_table, succ_table, anchor, top_k, temperature,
                                uniforms)


def _topk_sorted(x: torch.Tensor, k: int):
    """The first k of a stable sort on -x: higher first, the lower id first on ties, NaN after
    every number (-inf included). Sorts only the entries at or above the k-th largest (NaN
    counted as -inf), a set that holds those first k: the same ids and order as sorting the
    whole row, ~100x faster on a 152K vocabulary, which the GPU tests' references sort 480 rows of."""
    xs = x.float()
    if k < xs.numel():
        key = xs.masked_fill(xs.isnan(), -math.inf)
        kth = torch.topk(key, k).values[-1]
        if kth > -math.inf:  # else NaN and -inf entries compete: sort them all
            held = torch.nonzero(key >= kth).flatten()  # ascending ids: the stable order of ties
            order = held[torch.sort(-xs[held], stable=True).indices[:k]]
            return xs[order], order
    order = torch.sort(-xs, stable=True).indices[:k]
    return xs[order], order


def transition_walk_ref(logits, g, pred_table, succ_table, anchor, top_k, temperature, uniforms):
    b, j_len, _ = logits.shape
    tokens = torch.zeros(b, j_len, dtype=torch.long)
    cand_ids = torch.zeros(b, j_len, top_k, dtype=torch.long)
    cand_probs = torch.zeros(b, j_len, top_k, dtype=torch.float32)
    use_transition = g.numel() > 0
    for i in range(b):
        prev = int(anchor[i])
        t = float(temperature[i])
        for j in range(j_len):
            u_vals, ids = _topk_sorted(logits[i, j], top_k)
            scores = u_vals.clone()
            if use_transition:
                w = pred_table[prev].float() * g[i, j].float()
                scores = scores + succ_table[ids].float() @ w
            if t > 0:
                q = torch.softmax(scores / t, dim=-1)
                pick = _sample_index(q, float(uniforms[i, j]))
            else:
                pick = int(torch.argmax(scores))  # first maximal index
                q = torch.zeros(top_k)
                q[pick] = 1.0
            cand_ids[i, j] = ids
            cand_probs[i, j] = q
            prev = int(ids[pick])
            tokens[i, j] = prev
    return tokens.to(logits.device), cand_ids.to(logits.device), cand_probs.to(logits.device)


# --------------------------------------------------------------------------------------------
# Block verify with first-mismatch truncation
# --------------------------------------------------------------------------------------------

def block_verify(logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p,
                 uniforms):
    """Verifies every block of the batch and picks the bonus token, in one launch.

    ``logits [b, T, V]``: target logits at the block's positions (row j predicts the token
    after block token j). ``draft_tokens [b, T-1]``; the draft distribution q_j is sparse:
    ``cand_ids / cand_probs [b, T-1, K]`` (a point-mass draft is K = 1, prob 1).
    Per row with ``temperature == 0`` (greedy): accept d_j while ``d_j == argmax p_j`` (first
    maximal id); the bonus is ``argmax`` at the first rejected row (or row T-1).
    Sampled rows: p_j = sampling distribution (see sampling_probs_ref); accept d_j iff
    ``uniforms[j] * q_j(d_j) < p_j(d_j)``; at the first rejection sample the residual
    ``max(0, p_j - q_j)`` (p_j if the residual is all zero) and stop; if all are accepted sample
    p_{T-1}. The final sample uses ``uniforms[T-1]`` by inverse CDF.
    Returns ``accept_len [b]`` int32 (drafts accepted) and ``out_tokens [b, T]`` int64
    (accepted drafts, then the bonus at index accept_len, then -1)."""
    return _ops.block_verify(logits, draft_tokens, cand_ids, cand_probs, temperature, top_k,
                             top_p, uniforms)


def block_verify_ref(logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p,
                     uniforms):
    b, t_len, _ = logits.shape
    accept = torch.zeros(b, dtype=torch.int32)
    out = torch.full((b, t_len), -1, dtype=torch.long)
    for i in range(b):
        t = float(temperature[i])
        n = 0
        bonus = None
        for j in range(t_len):
            if t <= 0:
                target = int(torch.argmax(logits[i, j].float()))
                if j < t_len - 1 and int(draft_tokens[i, j]) == target:
                    out[i, j] = target
                    n += 1
                    continue
                bonus = target
                break
            p = sampling_probs_ref(logits[i, j], t, int(top_k[i]), float(top_p[i]))
            if j < t_len - 1:
                d = int(draft_tokens[i, j])
                match = cand_ids[i, j] == d
                q_d = float(cand_probs[i, j][match].sum())
                if float(uniforms[i, j]) * q_d < float(p[d]):
                    out[i, j] = d
                    n += 1
                    continue
                resid = p.clone()
                resid.index_add_(0, cand_ids[i, j].long(), -cand_probs[i, j].float())
                resid = resid.clamp_min(0)
                p = resid if float(resid.sum()) > 0 else p
            bonus = _sample_index(p, float(uniforms[i, t_len - 1]))
            break
        out[i, n] = bonus
        accept[i] = n
    dev = logits.device
    return accept.to(dev), out.to(dev)


# --------------------------------------------------------------------------------------------
# Dense GEMM with one reduction order per output
# --------------------------------------------------------------------------------------------

DENSE_PANEL = 64  # output columns of one packed panel (csrc/cpu/dense_gemm.h)
DENSE_CUDA_CHUNK = 32  # k a CUDA warp takes a step (csrc/cuda/dense_gemm.cuh): k must be a multiple
DENSE_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what each backend computes in
DENSE_CUDA_DTYPES = (torch.bfloat16, torch.float16)


def dense_packed_shape(out_features: int, in_features: int,
                       device: torch.device | str = "cpu") -> tuple[int, ...]:
    """The shape `dense_pack` gives a ``[out_features, in_features]`` weight on ``device``."""
    if torch.device(device).type != "cpu":
        return out_features, in_features
    return -(-out_features // DENSE_PANEL), in_features, DENSE_PANEL


def dense_pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A checkpoint weight ``W [N, K]`` laid out for `dense_matmul` on its device. CPU:
    ``[ceil(N/64), K, 64]`` with ``packed[p, k, c] = W[64p + c, k]`` and zeros past N (one panel
    of 64 outputs is one contiguous stream). CUDA: ``W`` itself, contiguous (the kernel reads
    rows of W). ``out``: a contiguous tensor of that shape and dtype to pack into."""
    if weight.device.type != "cpu":
        return weight.contiguous() if out is None else out.copy_(weight)
    n, k = weight.shape
    panels = dense_packed_shape(n, k)[0]
    if panels * DENSE_PANEL != n:
        weight = torch.cat([weight, weight.new_zeros(panels * DENSE_PANEL - n, k)])
    packed = weight.view(panels, DENSE_PANEL, k).transpose(1, 2)
    return packed.contiguous() if out is None else out.copy_(packed)


def dense_unpack(weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """The ``[out_features, K]`` weight a `dense_pack` table holds (a copy on the CPU, the
    table itself on CUDA)."""
    if weight.dim() == 2:
        return weight[:out_features]
    panels, k, width = weight.shape
    return weight.transpose(1, 2).reshape(panels * width, k)[:out_features]


def dense_matmul(x: torch.Tensor, weight: torch.Tensor, out_features: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ W^T`` for a weight laid out by `dense_pack`; x, the weight and the result
    of one dtype. On either device a row's result is bitwise independent of the other rows of
    the call (and of threads, tiles and grids): a position's decode step and its verify or
    prefill row agree, which lossless speculation needs.

    CPU (float32, bfloat16, float16): each output is, in fp32, one chain of fused
    multiply-adds over k in order: ``acc = 0; for k: acc = fma(x[k], W[n, k], acc)``, then
    rounded to the dtype (nearest even); `dense_matmul_ref` is that, exactly.
    CUDA (bfloat16, float16; K a multiple of 32): fp32 tensor-core sums in one fixed order (k
    in chunks of 32 dealt to four warps, the warps' sums added in order), rounded once; it
    agrees with `dense_matmul_ref` to fp32 rounding.
    ``out``: a contiguous ``[..., out_features]`` tensor of x's dtype to write into (returned)."""
    if out is not None:
        return _ops.dense_matmul.out(x, weight, out_features, out=out)
    return _ops.dense_matmul(x, weight, out_features)


def dense_matmul_supports(x_dtype: torch.dtype, weight: torch.Tensor) -> bool:
    """Whether `dense_matmul` runs rows of ``x_dtype`` against this packed weight (the CUDA
    kernel takes bfloat16 / float16 and K a multiple of 32; the CPU one every float dtype)."""
    if weight.device.type == "cpu":
        return x_dtype == weight.dtype and x_dtype in DENSE_CPU_DTYPES
    return (x_dtype == weight.dtype and x_dtype in DENSE_CUDA_DTYPES
            and weight.dim() == 2 and weight.shape[1] % DENSE_CUDA_CHUNK == 0)


def fma_ref(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a * b + c`` rounded once, as a fused multiply-add (broadcasting). In float64 the
    product is exact; the sum is rounded to odd (TwoSum gives its exact error; an inexact sum
    with an even last bit steps one ulp towards the exact value), and a sum rounded to odd with
    at least 2 bits more than fp32 (53 >= 24 + 2) rounds to fp32 as the exact value would."""
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    even = (s.view(torch.int64) & 1) == 0
    step = (err != 0) & even & torch.isfinite(s)
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    return torch.where(step, torch.nextafter(s, toward), s).float()


def dense_matmul_ref(x, weight, out_features):
    w = dense_unpack(weight, out_features).float()
    x2 = x.reshape(-1, x.shape[-1]).float()
    acc = torch.zeros(x2.shape[0], out_features)
    for k in range(x2.shape[1]):
        acc = fma_ref(x2[:, k, None], w[None, :, k], acc)
    return acc.to(x.dtype).reshape(*x.shape[:-1], out_features)


# --------------------------------------------------------------------------------------------
# Quantised GEMV / small-M GEMM on GGUF blocks (CPU only)
# --------------------------------------------------------------------------------------------

QUANT_TILE_ROWS = 16  # weight rows interleaved in one tile
QUANT_BLOCK = 32  # GGUF block length along k
QUANT_TILE_BLOCK_BYTES = {"q8_0": 544, "q4_1": 320}
_QUANT_ISAS = ("scalar", "avx2", "avx512")


def quant_matmul(x: torch.Tensor, weight: torch.Tensor, format: str,
                 out_features: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ W^T`` for fp32 x and a packed quantised weight ``W [out_features, K]``.

    ``weight`` is uint8 ``[ceil(out_features/16), K/32, tile_bytes]``: GGUF blocks (q8_0:
    ``d*q``; q4_1: ``d*q + m``; fp16 d, m) of 16 rows interleaved per tile (csrc/cpu/
    quant_gemm.h gives the byte layout; ``quant_unpack_ref`` reads it). x is quantised per row
    and block of 32 as ``quantize_acts_ref`` says; then, per output, with exact integer block
    sums ``isum`` and fp32 multiplies and adds in exactly this order (no FMA):
    ``acc = 0; for each block b: acc = acc + ((d_w * d_x) * isum + m_w * s_x)`` (q8_0 without
    the ``m_w`` term). Every row's result is therefore bitwise independent of the other rows and
    of the instruction set. CPU only. ``out``: a contiguous fp32 ``[..., out_features]`` tensor
    to write into (returned) instead of a new one."""
    if out is not None:
        return _ops.quant_matmul.out(x, weight, format, out_features, out=out)
    return _ops.quant_matmul(x, weight, format, out_features)


def quant_embedding(ids: torch.Tensor, weight: torch.Tensor, format: str,
                    num_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantised rows ``ids`` (int64, any shape) of a packed table of ``num_rows`` rows:
    ``[*ids.shape, K]`` fp32 with ``d*q`` (q8_0) or ``d*q + m`` (q4_1, rounded after the
    multiply). CPU only. ``out``: a contiguous fp32 tensor of that shape to write into."""
    if out is not None:
        return _ops.quant_embedding.out(ids, weight, format, num_rows, out=out)
    return _ops.quant_embedding(ids, weight, format, num_rows)


def quant_isa() -> str:
    """The instruction set the quantised kernels use now: "avx512" (with VNNI), "avx2" or
    "scalar"; the best the CPU has, lowered by ``DSPINE_CPU_ISA`` (read at every call)."""
    return _QUANT_ISAS[_ops.quant_isa()]


def set_cpu_threads(n: int) -> None:
    """Runs the CPU kernels on ``n`` threads (every quantised GEMM and every kernel's parallel
    loop), apart from torch's intra-op threads; 0 makes them follow ``torch.set_num_threads``
    again (the default). Process-wide. What a kernel computes does not depend on it."""
    _ops.set_cpu_threads(n)


def cpu_threads() -> int:
    """The CPU kernels' thread count set by `set_cpu_threads` (0: following torch's)."""
    return _ops.cpu_threads()


def quant_unpack_ref(weight: torch.Tensor, format: str, rows: int):
    """The integer values ``q [rows, K]`` (int32), scales ``d [rows, K/32]`` and, for q4_1, mins
    ``m [rows, K/32]`` (fp32; None for q8_0) held by a packed table."""
    tiles, nb, _ = weight.shape
    t = QUANT_TILE_ROWS

    def halves(lo, hi):  # fp16 [tiles, nb, 16] -> fp32 [rows, nb]
        h = weight[..., lo:hi].contiguous().view(torch.float16).float()
        return h.permute(0, 2, 1).reshape(tiles * t, nb)[:rows]

    if format == "q4_1":
        nibbles = weight[..., 64:320].reshape(tiles, nb, 4, t, 4).permute(0, 3, 1, 2, 4)
        nibbles = nibbles.reshape(tiles, t, nb, 16).int()
        q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)  # elements 0..15, then 16..31
        return q.reshape(tiles * t, nb * QUANT_BLOCK)[:rows], halves(0, 32), halves(32, 64)
    if format == "q8_0":
        q = weight[..., 32:544].contiguous().view(torch.int8).reshape(tiles, nb, 8, t, 4)
        q = q.permute(0, 3, 1, 2, 4).reshape(tiles * t, nb * QUANT_BLOCK).int()
        return q[:rows], halves(0, 32), None
    raise ValueError(f"unknown quantised format {format!r}")


def quantize_acts_ref(x: torch.Tensor):
    """Per-row, per-block int8 quantisation of fp32 ``x [M, K]``: ``d = amax/127`` (NaN for a
    block holding a non-finite value, so it poisons every output), ``q = round_half_even(x *
    (1/d))`` (0 when d = 0), ``s = d * sum(q)``. Returns ``q [M, K]`` int32, ``d, s [M, K/32]``."""
    m, k = x.shape
    xb = x.float().reshape(m, k // QUANT_BLOCK, QUANT_BLOCK)
    finite = torch.isfinite(xb).all(-1)
    d = torch.where(finite, xb.abs().amax(-1) / 127.0, torch.full_like(xb[..., 0], float("nan")))
    inv = torch.where(finite & (d != 0), 1.0 / d, torch.zeros_like(d))
    q = torch.where(finite[..., None], torch.round(xb * inv[..., None]), torch.zeros_like(xb))
    s = d * q.sum(-1)
    return q.int().reshape(m, k), d, s


def quant_matmul_ref(x, weight, format, out_features):
    q_w, d_w, m_w = quant_unpack_ref(weight, format, out_features)
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    q_x, d_x, s_x = quantize_acts_ref(x2)
    nb = k // QUANT_BLOCK
    # Block sums of int8 x int4/int8 products are exact in float64 (|isum| < 2^24 as well).
    isum = torch.einsum("mbk,nbk->mnb", q_x.reshape(-1, nb, QUANT_BLOCK).double(),
                        q_w.reshape(-1, nb, QUANT_BLOCK).double()).float()
    acc = torch.zeros(x2.shape[0], out_features)
    for b in range(nb):
        part = (d_w[None, :, b] * d_x[:, None, b]) * isum[:, :, b]
        if m_w is not None:
            part = part + m_w[None, :, b] * s_x[:, None, b]
        acc = acc + part
    return acc.reshape(*x.shape[:-1], out_features)


def quant_embedding_ref(ids, weight, format, num_rows):
    q, d, m = quant_unpack_ref(weight, format, num_rows)
    rows = q[ids.reshape(-1)].float().reshape(-1, d.shape[1], QUANT_BLOCK)
    values = d[ids.reshape(-1)][..., None] * rows
    if m is not None:
        values = values + m[ids.reshape(-1)][..., None]
    return values.reshape(*ids.shape, -1)


# --------------------------------------------------------------------------------------------
# The draft's layer loop (DSpine / DFlash drafters; dspine_engine/models/dspine.py)
# --------------------------------------------------------------------------------------------
#
# One layer over ``hidden [b*L, H]`` (b blocks of L = max_q_len rows) beside the context rows
# ``ctx [R, H]``, with projections q, kv = [k; v], o, gate_up = [gate; up], down and, in an
# injecting layer, pred_gate = [P; W_g's norm(h) half] and gate_f_inject = [W_g's f half; W_i],
# norms in, q, k, post (and inj):
#     x = rms_norm(h, in);  q = rope(rms_norm(q(x), q_norm), positions)  (per head)
#     kv = kv(cat[ctx; x]);  write rope(rms_norm(k, k_norm)), v at kv_slots (kv_positions)
#     x, h = add_rms_norm(o(attention(q, bidirectional)), h, post)
#     mlp = down(silu(gate) * up)  (gate_up(x) = [gate, up])
#     DFlash layer: h = h + mlp
#     injecting layer: hn, h = add_rms_norm(mlp, h, inj);  [f, g] = pred_gate(hn);
#         f[:, 0] = anchor_f;  h = fused_injection(h, g, gate_f_inject(f))

DraftLayer = tuple  # (projections (q, kv, o, gate_up, down[, pred_gate, gate_f_inject]) as
#                      callables x -> x @ W^T, norm weights (in, q, k, post[, inj]))
KERNELS = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "rope": rope,
           "write_kv": write_kv, "paged_attention": paged_attention, "silu_mul": silu_mul,
           "fused_injection": fused_injection}
REFERENCES = {"rms_norm": rms_norm_ref, "add_rms_norm": add_rms_norm_ref, "rope": rope_ref,
              "write_kv": write_kv_ref, "paged_attention": paged_attention_ref,
              "silu_mul": silu_mul_ref, "fused_injection": fused_injection_ref}


def draft_layers_loop(hidden, ctx, anchor_f, layers: list[DraftLayer], heads: int,
                      kv_heads: int, head_dim: int, inter: int, eps: float, positions,
                      kv_positions, kv_slots, cos_sin, k_caches, v_caches, block_tables, kv_lens,
                      cu_q, max_q_len: int, window: int, scale: float, max_kv_len: int,
                      kernels: dict = KERNELS) -> torch.Tensor:
    """The layer loop above in PyTorch, one op a step: with `KERNELS` what a draft with fp32
    projections runs, with `REFERENCES` (and reference projections) the specification of
    `draft_layers`. Returns the last layer's states ``[b*L, H]`` (before the final norm)."""
    k = kernels
    for (proj, norms), k_cache, v_cache in zip(layers, k_caches, v_caches):
        x = k["rms_norm"](hidden, norms[0], eps)
        # The q / k norms ride on the rotation and the KV write (one launch each on CUDA).
        q = k["rope"](proj[0](x).view(-1, heads, head_dim), positions, cos_sin, norms[1], eps)
        key, value = draft_kv(proj[1](torch.cat([ctx, x])), kv_heads, head_dim)
        k["write_kv"](key, value, kv_positions, cos_sin, k_cache, v_cache, kv_slots, norms[2], eps)
        attn = k["paged_attention"](q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len,
                                    False, window, scale, max_kv_len)
        # Residual adds ride on the next norm (add_rms_norm): one kernel instead of two ops.
        x, hidden = k["add_rms_norm"](proj[2](attn.view(x.shape[0], -1)), hidden, norms[3], eps)
        gu = proj[3](x)
        mlp = proj[4](k["silu_mul"](gu))  # one launch for silu(gate) * up
        hidden = hidden + mlp if len(proj) == 5 else _inject(proj, norms, mlp, hidden, anchor_f,
                                                             eps, k)
    return hidden


def draft_kv(kvx, kv_heads: int, head_dim: int):
    """A draft layer's keys (before their k norm and RoPE, which `write_kv` applies) and values,
    row views of its ``[k; v]`` projection ``kvx [n, 2 * kv_heads * head_dim]``: the loop's and
    the context ingest's (`DSpineDraft`)."""
    n, kvd = kvx.shape[0], kv_heads * head_dim
    return kvx[:, :kvd].view(n, kv_heads, head_dim), kvx[:, kvd:].view(n, kv_heads, head_dim)


def _inject(proj, norms, mlp, hidden, anchor_f, eps: float, k: dict) -> torch.Tensor:
    """The injection of a layer whose states are ``hidden + mlp`` (its MLP's residual add rides
    on the injection's norm); ``anchor_f [b, H]`` the anchors' exact features (E_out rows)."""
    bsz, h = anchor_f.shape
    blk = hidden.shape[0] // bsz
    hn, hidden = k["add_rms_norm"](mlp, hidden, norms[4], eps)
    fg = proj[5](hn).view(bsz, blk, 2 * h)
    f = fg[..., :h]  # a strided view: the GEMM reads it as is (no copy launch), and fg is ours
    f[:, 0] = anchor_f
    fproj = proj[6](f)
    return k["fused_injection"](hidden.view(bsz, blk, h), fg[..., h:], fproj).view(bsz * blk, h)


def draft_layers(hidden, ctx, anchor_f, weights: list, norms: list, format: str, heads: int,
                 kv_heads: int, head_dim: int, inter: int, eps: float, positions, kv_positions,
                 kv_slots, cos_sin, k_caches, v_caches, block_tables, kv_lens, cu_q,
                 max_q_len: int, window: int, scale: float, max_kv_len: int) -> torch.Tensor:
    """`draft_layers_loop` with `KERNELS` on quantised projections, in one op (CPU only):
    ``weights`` the packed tables (`quant_matmul`) of every layer in a row, 7 a layer (5 in a
    DFlash drafter), ``norms`` their norm weights, 5 a layer (4). ``anchor_f`` an empty tensor
    for a DFlash drafter. Bitwise the loop's result: the same kernels, in the same order."""
    return _ops.draft_layers(hidden, ctx, anchor_f, weights, norms, format, heads, kv_heads,
                             head_dim, inter, eps, positions, kv_positions, kv_slots, cos_sin,
                             k_caches, v_caches, block_tables, kv_lens, cu_q, max_q_len, window,
                             scale, max_kv_len)


def draft_layer_lists(layers: list[DraftLayer]) -> tuple[list, list]:
    """The flat ``weights`` and ``norms`` lists `draft_layers` reads, from layers whose
    projections are quantised tables (their ``.data``)."""
    return ([p.data for proj, _ in layers for p in proj],
            [w for _, norms in layers for w in norms])


def draft_layers_ref(hidden, ctx, anchor_f, weights, norms, format, heads, kv_heads, head_dim,
                     inter, eps, *rest):
    h = hidden.shape[1]
    outs = [heads * head_dim, 2 * kv_heads * head_dim, h, 2 * inter, h, 2 * h, 2 * h]
    nw, nn = (7, 5) if anchor_f.numel() else (5, 4)  # tables and norms a layer
    layers = [(tuple(partial(quant_matmul_ref, weight=w, format=format, out_features=o)
                     for w, o in zip(weights[i * nw:(i + 1) * nw], outs)),
               norms[i * nn:(i + 1) * nn]) for i in range(len(weights) // nw)]
    return draft_layers_loop(hidden, ctx, anchor_f, layers, heads, kv_heads, head_dim, inter,
                             eps, *rest, kernels=REFERENCES)


def target_layers(hidden, weights: list, formats: list[str], norms: list, windows: list[int],
                  heads: int, kv_heads: int, head_dim: int, inter: int, eps: float, positions,
                  slots, cos_sin, k_caches, v_caches, block_tables, kv_lens, cu_q,
                  max_q_len: int, causal: bool, scale: float, max_kv_len: int,
                  tap_layers: list[int]):
    """The target's decoder layers on quantised weights in one op (CPU only): TargetModel.
    forward's loop (models/target.py) for layers with fused q|k|v (no bias, no q/k norms, no
    output gate) and a gated MLP, the same kernels in the same order, so bitwise the loop.
    ``weights`` the packed tables, 4 a layer (qkv, o, gate_up, down), ``formats`` their
    formats (as `quant_matmul`'s), ``norms`` 2 a layer (in, post), ``windows`` one a layer;
    ``tap_layers`` ascending. Returns ``(hidden, residual, taps)``: the last layer's MLP output
    and residual (the final norm adds them) and ``hidden + residual`` after each tap layer."""
    return _ops.target_layers(hidden, weights, formats, norms, windows, heads, kv_heads,
                              head_dim, inter, eps, positions, slots, cos_sin, k_caches,
                              v_caches, block_tables, kv_lens, cu_q, max_q_len, causal, scale,
                              max_kv_len, tap_layers)


# --------------------------------------------------------------------------------------------
# Gated DeltaNet (hybrid targets): causal conv1d and the gated delta rule
# --------------------------------------------------------------------------------------------
#
# A Gated DeltaNet layer keeps, per sequence, a convolution window and a recurrent state. Both
# live in slots of per-layer tensors (``state_slots[b]`` is sequence b's slot; a negative slot
# means "padding": the sequence is skipped, its output rows are zero and nothing is written).
# Per token t of a sequence, with q, k [Hk, dk], v [Hv, dv], a, b [Hv] and v-head h reading
# k-head h // (Hv / Hk):
#     q^ = l2norm(q) / sqrt(dk),  k^ = l2norm(k)      (l2norm(x) = x / sqrt(sum x^2 + 1e-6))
#     g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)
#     S = exp(g) S;  u = beta (v - S^T k^);  S = S + k^ u^T;  o = S^T q^
# S [Hv, dk, dv] is fp32. ReplaySSM: a verify block leaves S untouched (the round's checkpoint)
# and records (k^, u, g) per token in a ring; after acceptance the accepted prefix is replayed
# onto the checkpoint with the same two state operations, so the result equals a plain decode.

GDN_L2_EPS = 1e-6


def causal_conv1d(x, weight, conv_state, state_slots, cu_q, max_q_len: int,
                  checkpoint: bool) -> torch.Tensor:
    """Depthwise causal convolution + SiLU over varlen sequences, continuing each one's window.

    ``x [N, C]`` (rows may be strided views), ``weight [C, K]`` (K >= 2), ``conv_state [S, W,
    C]`` in x's dtype with ``W >= K - 1``: rows ``0..K-2`` of a slot are the K-1 inputs before the
    sequence's first new token, oldest first (zeros for a fresh sequence). Sequence b owns rows
    ``cu_q[b]:cu_q[b+1]`` (n_b rows) and slot ``state_slots[b]``. With ``xx = window ++ x_b``,
    ``out[t, c] = silu(sum_i weight[c, i] * xx[t + i, c])`` (fp32 math, x's dtype out).
    ``checkpoint=False`` (prefill, decode): the window becomes the last K-1 rows of xx.
    ``checkpoint=True`` (a verify block): the window is kept and x_b is stored after it, in rows
    ``K-1 .. K-2+n_b`` (needs ``n_b <= W - K + 1``), for ``conv_state_commit``."""
    return _ops.causal_conv1d(x, weight, conv_state, state_slots, cu_q, max_q_len, checkpoint)


def conv_state_commit(conv_state, state_slots, num_accepted, kernel_size: int) -> None:
    """After a verify block: the window of each slot moves past the ``num_accepted[b]`` (int32)
    committed tokens, ``rows[0:K-1] = rows[m:m+K-1]``. ``conv_state [..., S, W, C]`` (any leading
    dims, e.g. every layer at once); ``0 <= m <= W - K + 1``."""
    _ops.conv_state_commit(conv_state, state_slots, num_accepted, kernel_size)


def gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q,
                          max_q_len: int, ring_k, ring_u, ring_g,
                          states_out) -> torch.Tensor:
    """The gated delta rule token by token (decode: 1 token; verify: a block per sequence).

    Shapes: ``q, k [N, Hk, dk]``, ``v [N, Hv, dv]``, ``a, b [N, Hv]`` (rows may be strided),
    ``A_log, dt_bias [Hv]`` fp32, ``state [S, Hv, dk, dv]`` fp32. Returns ``o [N, Hv, dv]`` in
    q's dtype. Without a ring (empty ``ring_k``) the final state is written back to the slot.
    With a ring (``ring_k [S, R, Hk, dk]``, ``ring_u [S, R, Hv, dv]``, ``ring_g [S, R, Hv]``,
    fp32, ``n_b <= R``) the state is left as it was (the round's checkpoint) and token t of the
    block records ``ring_k[s, t] = k^``, ``ring_u[s, t] = u``, ``ring_g[s, t] = g``.
    ``states_out [N, Hv, dk, dv]`` (fp32, or empty) receives the state after every token: the
    "store every state" alternative to replay, kept for measuring it."""
    return _ops.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q,
                                      max_q_len, ring_k, ring_u, ring_g, states_out)


def gated_delta_replay(state, ring_k, ring_u, ring_g, state_slots, num_accepted) -> None:
    """ReplaySSM rollback: for each sequence, replays the first ``num_accepted[b]`` (int32)
    recorded tokens onto its checkpoint, ``S = exp(g_t) S; S = S + k^_t u_t^T`` in order.
    ``state [..., S, Hv, dk, dv]`` with the rings' matching leading dims (every layer in one
    call); ``0 <= m <= R``."""
    _ops.gated_delta_replay(state, ring_k, ring_u, ring_g, state_slots, num_accepted)


def gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q,
                      max_q_len: int) -> torch.Tensor:
    """The gated delta rule over whole prompts (prefill), computed chunk by chunk: within a chunk
    the delta-rule updates are solved at once (a unit lower-triangular system), between chunks
    the state is carried. Same inputs and result as ``gated_delta_recurrent`` without a ring
    (reads the slot's state, writes the final one back); the order of the arithmetic differs."""
    return _ops.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q,
                                  max_q_len)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + GDN_L2_EPS)


def gdn_token_inputs(q, k, a, b, A_log, dt_bias):
    """fp32 ``(q^, k^, g, beta)`` of some token rows (see the section comment)."""
    qn = _l2norm(q.float()) * q.shape[-1] ** -0.5
    kn = _l2norm(k.float())
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return qn, kn, g, torch.sigmoid(b.float())


def _sequences(state_slots, cu_q):
    """(b, slot, first row, last row + 1) of every sequence with a real slot."""
    for i in range(state_slots.shape[0]):
        s, t0, t1 = int(state_slots[i]), int(cu_q[i]), int(cu_q[i + 1])
        if s >= 0:
            yield i, s, t0, t1


def causal_conv1d_ref(x, weight, conv_state, state_slots, cu_q, max_q_len, checkpoint):
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    k = weight.shape[1]
    for _, s, t0, t1 in _sequences(state_slots, cu_q):
        n = t1 - t0
        if n == 0:
            continue
        xx = torch.cat([conv_state[s, :k - 1].float(), x[t0:t1].float()])
        y = (xx.unfold(0, k, 1) * weight.float()).sum(-1)  # windows [n, C, K]
        out[t0:t1] = torch.nn.functional.silu(y).to(x.dtype)
        if checkpoint:
            conv_state[s, k - 1:k - 1 + n] = x[t0:t1].to(conv_state.dtype)
        else:
            conv_state[s, :k - 1] = xx[n:].to(conv_state.dtype)
    return out


def conv_state_commit_ref(conv_state, state_slots, num_accepted, kernel_size):
    flat = conv_state.view(-1, *conv_state.shape[-3:])
    for i in range(state_slots.shape[0]):
        s, m = int(state_slots[i]), int(num_accepted[i])
        if s >= 0:
            flat[:, s, :kernel_size - 1] = flat[:, s, m:m + kernel_size - 1].clone()


def _expand_k_heads(x, hv):
    """[..., Hk, d] -> [..., Hv, d]: v-head h reads k-head h // (Hv / Hk)."""
    return x.repeat_interleave(hv // x.shape[-2], dim=-2)


def gated_delta_recurrent_ref(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q,
                              max_q_len, ring_k, ring_u, ring_g, states_out):
    hv = v.shape[1]
    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    qn, kn, g, beta = gdn_token_inputs(q, k, a, b, A_log, dt_bias)
    use_ring = ring_k.numel() > 0
    for _, s, t0, t1 in _sequences(state_slots, cu_q):
        st = state[s].clone()
        for t in range(t0, t1):
            kt, qt = _expand_k_heads(kn[t], hv), _expand_k_heads(qn[t], hv)
            st = st * g[t].exp()[:, None, None]
            u = beta[t][:, None] * (v[t].float() - torch.einsum("hkv,hk->hv", st, kt))
            st = st + kt[:, :, None] * u[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", st, qt).to(q.dtype)
            if use_ring:
                ring_k[s, t - t0], ring_u[s, t - t0], ring_g[s, t - t0] = kn[t], u, g[t]
            if states_out.numel() > 0:
                states_out[t] = st
        if not use_ring:
            state[s] = st
    return out


def gated_delta_replay_ref(state, ring_k, ring_u, ring_g, state_slots, num_accepted):
    st, rk = state.view(-1, *state.shape[-4:]), ring_k.view(-1, *ring_k.shape[-4:])
    ru, rg = ring_u.view(-1, *ring_u.shape[-4:]), ring_g.view(-1, *ring_g.shape[-3:])
    hv = st.shape[-3]
    for i in range(state_slots.shape[0]):
        s, m = int(state_slots[i]), int(num_accepted[i])
        if s < 0:
            continue
        for layer in range(st.shape[0]):
            x = st[layer, s]
            for t in range(m):
                kt = _expand_k_heads(rk[layer, s, t], hv)
                x = x * rg[layer, s, t].exp()[:, None, None]
                x = x + kt[:, :, None] * ru[layer, s, t][:, None, :]
            st[layer, s] = x


GDN_CHUNK = 64  # tokens solved together by the chunked prefill reference and CPU kernel


def gated_delta_chunk_ref(q, k, v, a, b, A_log, dt_bias, state, state_slots, cu_q, max_q_len,
                          chunk: int = GDN_CHUNK):
    hv = v.shape[1]
    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    qn, kn, g, beta = gdn_token_inputs(q, k, a, b, A_log, dt_bias)
    for _, s, t0, t1 in _sequences(state_slots, cu_q):
        st = state[s].clone()  # [Hv, dk, dv]
        for c0 in range(t0, t1, chunk):
            c1 = min(c0 + chunk, t1)
            out[c0:c1], st = _gdn_chunk_step(
                _expand_k_heads(qn[c0:c1], hv).transpose(0, 1),
                _expand_k_heads(kn[c0:c1], hv).transpose(0, 1),
                v[c0:c1].float().transpose(0, 1), g[c0:c1].t(), beta[c0:c1].t(), st)
        state[s] = st
    return out


def _gdn_chunk_step(qc, kc, vc, gc, bc, st):
    """One chunk, every v-head at once: ``qc, kc [Hv, L, dk]``, ``vc [Hv, L, dv]``, ``gc, bc
    [Hv, L]``, ``st [Hv, dk, dv]``. Returns (o [L, Hv, dv], the state after the chunk).

    With G the in-chunk cumulative log decay, the updates u_i solve
    ``u_i + sum_{j<i} beta_i e^{G_i-G_j} (k_i.k_j) u_j = beta_i (v_i - e^{G_i} S_0^T k_i)``."""
    n = qc.shape[1]
    G = gc.cumsum(-1)
    lower = torch.ones(n, n, dtype=torch.bool, device=qc.device).tril()
    decay = (G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")).exp()
    system = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * decay).tril(-1)
    eye = torch.eye(n, device=qc.device).expand_as(system)
    rhs = bc[:, :, None] * (vc - G.exp()[:, :, None] * (kc @ st))
    u = torch.linalg.solve_triangular(eye + system, rhs, upper=False, unitriangular=True)
    o = G.exp()[:, :, None] * (qc @ st) + ((qc @ kc.transpose(1, 2)) * decay) @ u
    tail = (G[:, -1:] - G).exp()[:, :, None]
    st = G[:, -1].exp()[:, None, None] * st + (kc * tail).transpose(1, 2) @ u
    return o.transpose(0, 1), st


# --------------------------------------------------------------------------------------------
# Fake (meta) kernels so the ops trace under torch.compile
# --------------------------------------------------------------------------------------------

def _register_fakes() -> None:
    lib = "dspine::"
    reg = torch.library.register_fake

    @reg(lib + "rms_norm")
    def _(x, w, eps):
        return torch.empty_like(x)

    @reg(lib + "add_rms_norm")
    def _(x, r, w, eps):
        return torch.empty_like(x), torch.empty_like(x)

    @reg(lib + "rope")
    def _(x, pos, cs, norm=None, eps=0.0):
        return torch.empty_like(x)

    @reg(lib + "write_kv")
    def _(k, v, pos, cs, kc, vc, slots, kn=None, eps=0.0):
        return None

    @reg(lib + "rope_write_kv")
    def _(q, k, v, pos, cs, kc, vc, slots, qn=None, kn=None, eps=0.0):
        return q.new_empty(q.shape)

    @reg(lib + "paged_attention")
    def _(q, kc, vc, bt, kl, cu, mq, causal, window, scale, max_kv_len=0, exact=False, prefill=False):
        return torch.empty_like(q)

    @reg(lib + "silu_mul")
    def _(x):
        return x.new_empty((x.shape[0], x.shape[1] // 2))

    @reg(lib + "fused_injection")
    def _(h, gh, fp):
        return torch.empty_like(h)

    @reg(lib + "transition_walk")
    def _(logits, g, pt, st, anchor, top_k, temp, u):
        b, j = logits.shape[:2]
        return (logits.new_empty(b, j, dtype=torch.long),
                logits.new_empty(b, j, top_k, dtype=torch.long),
                logits.new_empty(b, j, top_k, dtype=torch.float32))

    @reg(lib + "block_verify")
    def _(logits, d, ci, cp, temp, tk, tp, u):
        b, t = logits.shape[:2]
        return logits.new_empty(b, dtype=torch.int32), logits.new_empty(b, t, dtype=torch.long)

    @reg(lib + "dense_matmul")
    def _(x, weight, out_features):
        return x.new_empty(*x.shape[:-1], out_features)

    @reg(lib + "quant_matmul")
    def _(x, weight, format, out_features):
        return x.new_empty(*x.shape[:-1], out_features)

    @reg(lib + "quant_embedding")
    def _(ids, weight, format, num_rows):
        return ids.new_empty(*ids.shape, weight.shape[1] * QUANT_BLOCK, dtype=torch.float32)

    @reg(lib + "draft_layers")
    def _(hidden, ctx, anchor_f, *rest):
        return torch.empty_like(hidden)

    @reg(lib + "target_layers")
    def _(hidden, *rest):
        taps = rest[-1]
        return (torch.empty_like(hidden), torch.empty_like(hidden),
                [torch.empty_like(hidden) for _ in taps])

    @reg(lib + "causal_conv1d")
    def _(x, w, cs, slots, cu, mq, ckpt):
        return x.new_empty(x.shape)

    @reg(lib + "conv_state_commit")
    def _(cs, slots, m, k):
        return None

    @reg(lib + "gated_delta_recurrent")
    def _(q, k, v, a, b, al, dt, st, slots, cu, mq, rk, ru, rg, so):
        return v.new_empty(v.shape, dtype=q.dtype)

    @reg(lib + "gated_delta_replay")
    def _(st, rk, ru, rg, slots, m):
        return None

    @reg(lib + "gated_delta_chunk")
    def _(q, k, v, a, b, al, dt, st, slots, cu, mq):
        return v.new_empty(v.shape, dtype=q.dtype)


_register_fakes()
