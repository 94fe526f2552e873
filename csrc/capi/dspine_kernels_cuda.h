/* dspine_kernels_cuda.h: the CUDA twins of the fp32 entry points of dspine_kernels.h.
 *
 * Present only in libraries built with CUDA (CMake option DSPINE_WITH_CUDA; the installed
 * package sets dspine_kernels_WITH_CUDA). Same arguments, shapes and semantics as the
 * dspine_cpu_* function of the same name, with these differences:
 * - Every array argument is device memory; the `stream` argument orders the work (NULL: the
 *   legacy default stream). Calls are asynchronous: outputs are ready when the stream is.
 * - Only sizes and pointers are checked. Index arrays live on the device and are not read by the
 *   host (so every call can be captured in a CUDA graph): out-of-range positions, slots, pages or
 *   token ids are the caller's responsibility (write_kv skips slots past num_slots).
 * - Scratch space (split-KV partials, per-sequence counters) is taken with cudaMallocAsync on
 *   `stream` and returned the same way: use a device whose default memory pool is enabled.
 * - CUDA limits: paged_attention head_dim <= 256; transition_walk top_k <= 32 and
 *   positions * top_k^2 floats within the device's shared memory per block.
 * - Failures to launch return DSPINE_CUDA_ERROR; errors of the kernels themselves surface at the
 *   next synchronisation, as usual in CUDA.
 */
#ifndef DSPINE_KERNELS_CUDA_H_
#define DSPINE_KERNELS_CUDA_H_

#include "dspine_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Layout-compatible with cudaStream_t, without including the CUDA headers. */
typedef struct CUstream_st* dspine_cuda_stream;

DSPINE_API dspine_status dspine_cuda_rms_norm_f32(const float* x, const float* weight, float* out,
                                                  int64_t rows, int64_t dim, float eps,
                                                  dspine_cuda_stream stream);

DSPINE_API dspine_status dspine_cuda_add_rms_norm_f32(const float* x, const float* residual,
                                                      const float* weight, float* out,
                                                      float* residual_out, int64_t rows,
                                                      int64_t dim, float eps,
                                                      dspine_cuda_stream stream);

/* RoPE and the KV write: the CPU functions' contracts. Positions live on the device, so a
 * position outside cos_sin (in a row that is rotated) is not reported here: the kernel stops
 * with a device-side assert, which the next synchronisation on the stream reports. */
DSPINE_API dspine_status dspine_cuda_rope_f32(const float* x, int64_t x_token_stride, float* out,
                                              const int32_t* positions, const float* cos_sin,
                                              int64_t cos_sin_rows, int64_t tokens,
                                              int64_t heads, int64_t head_dim,
                                              dspine_cuda_stream stream);

DSPINE_API dspine_status dspine_cuda_write_kv_f32(const float* k, int64_t k_token_stride,
                                                  const float* v, int64_t v_token_stride,
                                                  const int32_t* positions, const float* cos_sin,
                                                  int64_t cos_sin_rows, float* k_cache,
                                                  float* v_cache, int64_t num_slots,
                                                  const int32_t* slots, int64_t tokens,
                                                  int64_t kv_heads, int64_t head_dim,
                                                  dspine_cuda_stream stream);

/* max_q_len bounds every cu_q[b+1] - cu_q[b] (the launch is sized from it, not from cu_q). */
DSPINE_API dspine_status dspine_cuda_paged_attention_f32(
    const float* q, const float* k_cache, const float* v_cache, float* out,
    const int32_t* block_tables, const int32_t* kv_lens, const int32_t* cu_q, int64_t num_q_tokens,
    int64_t max_q_len, const dspine_attention_args* args, dspine_cuda_stream stream);

DSPINE_API dspine_status dspine_cuda_fused_injection_f32(const float* h, const float* gate_h,
                                                         const float* fproj, float* out,
                                                         int64_t n, int64_t block,
                                                         int64_t hidden,
                                                         dspine_cuda_stream stream);

DSPINE_API dspine_status dspine_cuda_transition_walk_f32(
    const float* logits, const float* g, const float* pred_table, const float* succ_table,
    const int64_t* anchor, const float* temperature, const float* uniforms, int64_t* tokens,
    int64_t* cand_ids, float* cand_probs, int64_t batch, int64_t positions, int64_t vocab,
    int64_t rank, int64_t top_k, dspine_cuda_stream stream);

DSPINE_API dspine_status dspine_cuda_block_verify_f32(
    const float* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
    const float* cand_probs, const float* temperature, const int32_t* top_k, const float* top_p,
    const float* uniforms, int32_t* accept_len, int64_t* out_tokens, int64_t batch, int64_t block,
    int64_t vocab, int64_t cand, dspine_cuda_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DSPINE_KERNELS_CUDA_H_ */
