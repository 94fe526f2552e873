/* dspine_kernels.h: the plain C API of the dspine_engine CPU kernels (fp32).
 *
 * For serving stacks that do not use Python/torch: every function takes raw pointers and sizes,
 * checks its arguments (sizes, and every index it will dereference), runs the kernel of
 * csrc/cpu/<family>.h and returns DSPINE_OK or an error code; dspine_last_error() then says why.
 * Nothing is allocated for the caller and no function throws. The header is valid C99 and C++.
 * Semantics are exactly those of the Python references in dspine_engine/ops.py.
 *
 * Conventions (as in dspine_engine/ops.py)
 * - Arrays are dense and row-major; shapes below are written [outer, ..., inner].
 * - Index arrays (positions, slots, block tables, lengths, cu_q) are int32; token ids are int64.
 * - Paged KV cache of one layer: [num_pages, page_size, kv_heads, head_dim]; a slot is
 *   page * page_size + offset. block_tables[b * max_pages + i] is the page that holds positions
 *   i*page_size .. (i+1)*page_size-1 of sequence b.
 * - RoPE is the rotate-half (GPT-NeoX) form; cos_sin is an fp32 [cos_sin_rows, head_dim] table
 *   whose row p is [cos(p*f_0 .. p*f_{D/2-1}), sin(...)].
 * - Randomness enters only through `uniforms` in [0, 1).
 * - Thread-safety: functions are reentrant; the kernels use OpenMP threads when built with it.
 */
#ifndef DSPINE_KERNELS_H_
#define DSPINE_KERNELS_H_

#include <stdint.h>

#if defined(_WIN32) && defined(DSPINE_KERNELS_SHARED)
#if defined(DSPINE_KERNELS_BUILDING)
#define DSPINE_API __declspec(dllexport)
#else
#define DSPINE_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define DSPINE_API __attribute__((visibility("default")))
#else
#define DSPINE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dspine_status {
  DSPINE_OK = 0,
  DSPINE_INVALID_ARGUMENT = 1, /* a size, pointer or index is out of its documented range */
  DSPINE_INTERNAL_ERROR = 2,   /* e.g. out of memory for the kernel's scratch space */
  DSPINE_CUDA_ERROR = 3        /* a CUDA runtime call or launch failed (dspine_kernels_cuda.h) */
} dspine_status;

/* Why the last failing call on this thread failed ("" after a success). Valid until the next
 * call on the same thread. */
DSPINE_API const char* dspine_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH". */
DSPINE_API const char* dspine_version(void);

/* The kernels' threads, for the whole process: n in 1..4096 fixes them, 0 (the default) follows
 * OpenMP's count (omp_set_num_threads, OMP_NUM_THREADS; one thread without OpenMP). Outputs do
 * not depend on it: each output is reduced in the same order whatever thread computes it. */
DSPINE_API dspine_status dspine_set_cpu_threads(int64_t n);

/* The count dspine_set_cpu_threads set (0: following OpenMP). */
DSPINE_API int64_t dspine_cpu_threads(void);

/* ---- RMSNorm ------------------------------------------------------------------------------ */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for `rows` rows of `dim` values.
 * out may alias x. */
DSPINE_API dspine_status dspine_cpu_rms_norm_f32(const float* x, const float* weight, float* out,
                                                 int64_t rows, int64_t dim, float eps);

/* residual_out = x + residual; out = rms_norm(residual_out): the pre-norm residual update.
 * out and residual_out must differ from each other; each may alias x or residual (every row is
 * summed element-wise before it is normalised), e.g. out over x and residual_out over residual. */
DSPINE_API dspine_status dspine_cpu_add_rms_norm_f32(const float* x, const float* residual,
                                                     const float* weight, float* out,
                                                     float* residual_out, int64_t rows,
                                                     int64_t dim, float eps);

/* ---- RoPE and the paged KV write ---------------------------------------------------------- */

/* out [tokens, heads, head_dim] = x rotated by the angles of positions[t].
 * x is [tokens, heads, head_dim] with x_token_stride elements between tokens (>= heads *
 * head_dim, e.g. a row view of a fused QKV projection). head_dim must be even; every position
 * must be a row of cos_sin. out may alias x when x_token_stride == heads * head_dim. */
DSPINE_API dspine_status dspine_cpu_rope_f32(const float* x, int64_t x_token_stride, float* out,
                                             const int32_t* positions, const float* cos_sin,
                                             int64_t cos_sin_rows, int64_t tokens, int64_t heads,
                                             int64_t head_dim);

/* Writes rope(k) and v ([tokens, kv_heads, head_dim], token strides k/v_token_stride) into the
 * caches at slots[t]; a negative slot skips the token (padding). cos_sin == NULL writes k
 * unrotated (positions and cos_sin_rows are then ignored). Slots must be < num_slots
 * (= num_pages * page_size of the caches). */
DSPINE_API dspine_status dspine_cpu_write_kv_f32(const float* k, int64_t k_token_stride,
                                                 const float* v, int64_t v_token_stride,
                                                 const int32_t* positions, const float* cos_sin,
                                                 int64_t cos_sin_rows, float* k_cache,
                                                 float* v_cache, int64_t num_slots,
                                                 const int32_t* slots, int64_t tokens,
                                                 int64_t kv_heads, int64_t head_dim);

/* ---- Paged sliding-window attention (GQA) -------------------------------------------------- */

typedef struct dspine_attention_args {
  int64_t batch;          /* sequences */
  int64_t q_heads;        /* a multiple of kv_heads; head h reads kv head h / (q_heads/kv_heads) */
  int64_t kv_heads;
  int64_t head_dim;
  int64_t q_token_stride; /* elements between query rows; 0 means q_heads * head_dim */
  int64_t num_pages;      /* pages in each cache */
  int64_t page_size;      /* positions per page */
  int64_t max_pages;      /* columns of block_tables */
  int32_t causal;         /* 1: query p sees keys k <= p; 0: the whole sequence (draft block) */
  int64_t window;         /* <= 0: none; else query p sees key k only if p - k < window */
  float scale;            /* softmax scale, usually 1/sqrt(head_dim) */
} dspine_attention_args;

/* Varlen queries against a paged KV cache. Sequence b owns query rows cu_q[b] .. cu_q[b+1]-1
 * (n_b rows, 0 <= n_b <= kv_lens[b]) and keys 0 .. kv_lens[b]-1, which already include the K/V
 * of its n_b new tokens, so its query i sits at position kv_lens[b] - n_b + i.
 * q: [cu_q[batch], q_heads, head_dim] rows of stride q_token_stride; out: dense
 * [cu_q[batch], q_heads, head_dim] (every row is written). Only the pages holding a visible key
 * are read, so entries of block_tables for pages wholly outside the window may be anything
 * (e.g. -1 for freed pages). */
DSPINE_API dspine_status dspine_cpu_paged_attention_f32(const float* q, const float* k_cache,
                                                        const float* v_cache, float* out,
                                                        const int32_t* block_tables,
                                                        const int32_t* kv_lens,
                                                        const int32_t* cu_q,
                                                        const dspine_attention_args* args);

/* ---- Fused adjacent causal injection (DSpine) ---------------------------------------------- */

/* h, gate_h, out: [n, block, hidden]; fproj: [n, block, 2*hidden] = [W_gf f | W_i f].
 * out[:, 0] = h[:, 0]; for j >= 1
 * out[:, j] = h[:, j] + sigmoid(gate_h[:, j] + fproj[:, j-1, :hidden]) * fproj[:, j-1, hidden:].
 * out may alias h. */
DSPINE_API dspine_status dspine_cpu_fused_injection_f32(const float* h, const float* gate_h,
                                                        const float* fproj, float* out, int64_t n,
                                                        int64_t block, int64_t hidden);

/* ---- Transition-cache scoring + chain walk (DSpine) ---------------------------------------- */

/* Chooses the draft chain of every block. logits [batch, positions, vocab] (U_1..U_J);
 * g [batch, positions, rank]; pred_table, succ_table [vocab, rank]; anchor [batch] (ids in
 * [0, vocab)); temperature [batch] (<= 0: greedy); uniforms [batch, positions].
 * Candidates: the top_k ids of each logits row, best first, ties to the lower id. Pair score
 * s_j(c | a) = U_j(c) + sum_r pred[a, r] g_j[r] succ[c, r], a = the previous chosen token.
 * Greedy picks the first candidate of maximal score; sampling draws from
 * q_j = softmax(s_j / T) over the candidates by inverse CDF with uniforms[b, j].
 * rank == 0 (g, pred_table, succ_table may be NULL) scores by U alone: a DFlash drafter.
 * Outputs: tokens [batch, positions], cand_ids [batch, positions, top_k],
 * cand_probs [batch, positions, top_k] (q_j; one-hot on the pick for greedy rows). */
DSPINE_API dspine_status dspine_cpu_transition_walk_f32(
    const float* logits, const float* g, const float* pred_table, const float* succ_table,
    const int64_t* anchor, const float* temperature, const float* uniforms, int64_t* tokens,
    int64_t* cand_ids, float* cand_probs, int64_t batch, int64_t positions, int64_t vocab,
    int64_t rank, int64_t top_k);

/* ---- Block verify with first-mismatch truncation ------------------------------------------- */

/* Verifies every block and picks the bonus token. logits [batch, block, vocab] (row j predicts
 * the token after block token j); draft_tokens [batch, block-1]; the draft distribution is
 * sparse: cand_ids / cand_probs [batch, block-1, cand] (a point-mass draft is cand = 1, prob 1).
 * temperature, top_k (<= 0: off) and top_p (>= 1: off) are per sequence [batch];
 * uniforms [batch, block].
 * Greedy rows (temperature <= 0): accept d_j while d_j == argmax (first maximal id); the bonus
 * is the argmax at the first rejected row. Sampled rows: p_j = softmax(logits/T) filtered by
 * tie-inclusive top-k then top-p; accept d_j iff uniforms[j] * q_j(d_j) < p_j(d_j); at the first
 * rejection sample max(0, p_j - q_j) (p_j if that is all zero), else p_{block-1}, by inverse
 * CDF with uniforms[block-1]. For sampled rows every draft and candidate id must be in
 * [0, vocab); greedy rows never index with them.
 * Outputs: accept_len [batch]; out_tokens [batch, block] (accepted drafts, the bonus at index
 * accept_len, then -1). A sequence's new length is its old one + accept_len + 1. */
DSPINE_API dspine_status dspine_cpu_block_verify_f32(
    const float* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
    const float* cand_probs, const float* temperature, const int32_t* top_k, const float* top_p,
    const float* uniforms, int32_t* accept_len, int64_t* out_tokens, int64_t batch, int64_t block,
    int64_t vocab, int64_t cand);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DSPINE_KERNELS_H_ */
