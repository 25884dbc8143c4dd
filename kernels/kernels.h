// CUDA kernels of the Backend ops: one .cu file per op family, each exposing host launchers
// (launch_<op>) that take a cudaStream_t and enqueue work on it (no synchronization, no allocation).
// src/backend/cuda/ checks shapes and dtypes and calls these; the launchers trust them.
//
// Types, for every launcher:
//  - Activations and the weight copies used for compute are 16-bit (`Half`: bf16, or f16
//    with loss scaling), passed as void*; every sum is accumulated in fp32.
//  - Parameter gradients, AdamW master weights and moments, norm statistics, attention
//    log-sum-exps, losses and the rotary table are fp32.
//  - Gradients are overwritten for activations and accumulated (+=) for parameters, as in
//    the Backend interface (src/backend/backend.h), which also gives each op's math.
//  - Every launcher is deterministic: no floating-point atomics; a sum over rows goes
//    through per-block partials in scratch memory, added in a fixed order.
//  - Rows are tokens, row-major, batch-major (row n is sequence n / T, position n % T).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace llmtrain::kernels {

enum class Half { bf16, f16 };

// embedding.cu
// doc_starts (here and below): i32 [N], the start of each token's document in its sequence,
// non-decreasing within a sequence (backend.h); null: one document per sequence.
// positions (here and below): i32 [N], explicit positions (context parallelism), replacing
// n % seq_len - doc_starts[n]; null: none. A position outside [0, table rows) takes nothing
// from the table and adds nothing to its gradient (the callers' positions are in range).
// out[n] = wte[tokens[n] - vocab_begin] (zero if outside [vocab_begin, vocab_begin + vocab_rows))
//          + wpe[n % seq_len - doc_starts[n]] (wpe [wpe_rows, C], may be null).
void launch_embedding_fwd(Half t, void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t N, int64_t C, int64_t seq_len,
                   int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions, int64_t wpe_rows, cudaStream_t stream);
// dwte[tok - vocab_begin] += sum of dout rows with that token; dwpe[p] += sum over sequences
// of dout rows at position p (dwte or dwpe may be null). Deterministic: rows are grouped by
// token (and, with explicit positions, by position) with a stable radix sort, each group
// summed in row order.
size_t embedding_bwd_scratch_bytes(int64_t N);
void launch_embedding_bwd(Half t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int64_t N, int64_t C, int64_t seq_len,
                   int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions, int64_t dwpe_rows, void* scratch,
                   size_t scratch_bytes, cudaStream_t stream);

// norm.cu. mean may be null for RMSNorm; b may be null for LayerNorm without bias.
void launch_layernorm_fwd(Half t, void* out, float* mean, float* rstd, const void* x, const void* w, const void* b, int64_t N, int64_t C, float eps,
                   cudaStream_t stream);
void launch_rmsnorm_fwd(Half t, void* out, float* rstd, const void* x, const void* w, int64_t N, int64_t C, float eps, cudaStream_t stream);
// sum = a + b (rounded to t), then out = LayerNorm (or, rms, RMSNorm) of sum with its
// statistics: one pass for the residual add and the norm after it. mean and bias may be null.
void launch_add_norm_fwd(Half t, bool rms, void* sum, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w, const void* bias,
                        int64_t N, int64_t C, float eps, cudaStream_t stream);
// dx overwritten (or accumulated into when accumulate_dx: a residual gradient), dw and db
// accumulated. scratch: norm_bwd_scratch_bytes(N, C) bytes for the per-block partial sums.
size_t norm_bwd_scratch_bytes(int64_t N, int64_t C);
void launch_layernorm_bwd(Half t, void* dx, float* dw, float* db, const void* dout, const void* x, const void* w, const float* mean, const float* rstd,
                   int64_t N, int64_t C, bool accumulate_dx, void* scratch, cudaStream_t stream);
void launch_rmsnorm_bwd(Half t, void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd, int64_t N, int64_t C,
                 bool accumulate_dx, void* scratch, cudaStream_t stream);

// bias.cu: dbias[c] += sum over rows of dout[n, c]. scratch: bias_grad_scratch_bytes(N, C).
size_t bias_grad_scratch_bytes(int64_t N, int64_t C);
void launch_bias_grad(Half t, float* dbias, const void* dout, int64_t N, int64_t C, void* scratch, cudaStream_t stream);

// bias.cu: acc[i] += x[i] (fp32), e.g. a bias gradient a GEMM epilogue wrote into scratch.
void launch_accumulate(float* acc, const float* x, int64_t n, cudaStream_t stream);

// fp8.cu: casts to FP8 with per-tensor scales (core/fp8.h). Scales and amaxes are device fp32
// scalars; an amax is overwritten (zeroed, then the maximum taken).
enum class Fp8Source { bf16, f16, f32 };
void launch_fp8_amax(float* amax, const void* x, Fp8Source type, int64_t n, cudaStream_t stream);
// scale = format_max / amax / 2^margin (kept when amax is 0 or not finite); scale_inv = 1 / scale.
void launch_fp8_update_scale(float* scale, float* scale_inv, const float* amax, float format_max, int margin, cudaStream_t stream);
// out[rows, cols] = fp8(x * scale) (e4m3 or e5m2, nearest even, saturating); out_t (may be
// null) the same transposed, [cols, rows]; amax (may be null) = max |x|.
struct Fp8CastArgs {
    uint8_t* out = nullptr;
    uint8_t* out_t = nullptr;
    float* amax = nullptr;
    double* counts = nullptr;  // [2], added to: saturated, flushed (backend.h, Fp8Cast)
    const void* x = nullptr;
    Fp8Source source = Fp8Source::bf16;
    const float* scale = nullptr;
    int64_t rows = 0, cols = 0;
    bool e4m3 = true;
};
void launch_fp8_cast(const Fp8CastArgs& args, cudaStream_t stream);
// FP8 bytes x[rows, cols] into out (skipped when out is x) and transposed into out_t (may be null).
void launch_fp8_relayout(uint8_t* out, uint8_t* out_t, const uint8_t* x, int64_t rows, int64_t cols, cudaStream_t stream);

// gemm_fallback.cu: one GEMM as cuBLASLt would compute it (column-major; see the file's
// header), for the shapes cuBLASLt cannot take.
struct FallbackGemm {
    int64_t m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false;
    const void* a = nullptr;  // ab_type
    const void* b = nullptr;  // ab_type
    void* d = nullptr;        // fp32 when d_f32, else ab_type
    int64_t lda = 0, ldb = 0, ldd = 0;
    Half ab_type = Half::bf16;
    bool d_f32 = false;
    bool accumulate = false;      // beta = 1
    const void* bias = nullptr;   // [m], ab_type; null: none
    enum class Gelu { none, forward_aux, backward } gelu = Gelu::none;
    void* aux = nullptr;          // [m, n] of ab_type, leading dimension ld_aux: the pre-activation
    int64_t ld_aux = 0;
    float* bias_grad = nullptr;   // [m], += sums of D's rows; null: none
};
void launch_gemm_fallback(const FallbackGemm& gemm, cudaStream_t stream);

// rope.cu: rotary embedding in place on heads [0, n_heads) of each row of x [N, width];
// table [max_seq_len, D] fp32 (cos in [0, D/2), sin in [D/2, D)); inverse: the backward.
// Row n takes position n % seq_len - doc_starts[n] (doc_starts may be null), or positions[n]
// (explicit, see embedding.cu; a row outside the table's table_rows positions is left as it is).
void launch_rope(Half t, void* x, const float* table, int64_t N, int64_t width, int64_t seq_len, int64_t n_heads, int64_t head_dim, bool inverse,
          const int32_t* doc_starts, const int32_t* positions, int64_t table_rows, cudaStream_t stream);

// elementwise.cu
void launch_gelu_fwd(Half t, void* out, const void* x, int64_t n, cudaStream_t stream);
void launch_gelu_bwd(Half t, void* dx, const void* dout, const void* x, int64_t n, cudaStream_t stream);
// x [N, 2F] (gate, up) -> out [N, F] = silu(gate) * up.
void launch_swiglu_fwd(Half t, void* out, const void* x, int64_t N, int64_t F, cudaStream_t stream);
void launch_swiglu_bwd(Half t, void* dx, const void* dout, const void* x, int64_t N, int64_t F, cudaStream_t stream);
void launch_add(Half t, void* out, const void* a, const void* b, int64_t n, cudaStream_t stream);
// The same in f32: sharded gradients summed over micro-batches (ZeRO-2).
void launch_add_f32(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
// out (Half) = in (fp32), rounded to nearest even; and back.
void launch_cast_from_f32(Half t, void* out, const float* in, int64_t n, cudaStream_t stream);
void launch_cast_to_f32(Half t, float* out, const void* in, int64_t n, cudaStream_t stream);
// *count += the 16-bit words in which a and b ([bytes], even) differ: bitwise comparison of two
// results on the device (the GEMM candidates' outputs).
void launch_count_differences(unsigned long long* count, const void* a, const void* b, size_t bytes, cudaStream_t stream);

// loss.cu: softmax cross-entropy over rows of logits [N, V], one block per row, in chunks
// of the row (never a second full-size fp32 copy of the logits). Only the first V_real
// columns of a row are real classes: the columns [V_real, V) are vocabulary padding, left
// out of every max and sum and given a zero gradient.
// losses[n] = logsumexp(logits[n]) - logits[n, targets[n]]; lse[n] = logsumexp(logits[n]) (lse may be null).
void launch_xent_fwd(Half t, float* losses, float* lse, const void* logits, const int32_t* targets, int64_t N, int64_t V, int64_t V_real, cudaStream_t stream);
// dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v + vocab_begin == targets[n]]) * dloss;
// lse null: computed from the row (then vocab_begin is 0). dlogits may alias logits.
void launch_xent_bwd(Half t, void* dlogits, const void* logits, const int32_t* targets, const float* lse, int64_t N, int64_t V, int64_t V_real,
              int64_t vocab_begin, float dloss, cudaStream_t stream);
// Both in one pass: losses and lse (may be null) as launch_xent_fwd, then logits overwritten
// by their gradient with dloss (whole rows: vocab_begin 0).
void launch_xent_fwd_bwd(Half t, float* losses, float* lse, void* logits, const int32_t* targets, int64_t N, int64_t V, int64_t V_real, float dloss,
                         cudaStream_t stream);
void launch_logits_row_max(Half t, float* row_max, const void* logits, int64_t N, int64_t V, int64_t V_real, cudaStream_t stream);
// partial [N, 2]: (sum_v exp(logits[n, v] - row_max[n]), the target's logit if in this shard else 0).
void launch_xent_partial(Half t, float* partial, const void* logits, const int32_t* targets, const float* row_max, int64_t N, int64_t V,
                  int64_t V_real, int64_t vocab_begin, cudaStream_t stream);
// lse[n] = row_max[n] + log(partial[n, 0]); losses[n] = lse[n] - partial[n, 1].
void launch_xent_combine(float* losses, float* lse, const float* partial, const float* row_max, int64_t N, cudaStream_t stream);

// optim.cu
struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    float bias_correction1, bias_correction2;  // 1 - beta1^t, 1 - beta2^t
};
// Updates the fp32 master param in place from grad; writes the Half copy too when copy is not null.
void launch_adamw(float* param, const float* grad, float* m, float* v, void* copy, Half copy_type, int64_t n, const AdamWArgs& args,
           cudaStream_t stream);
// *result (device, double) = sum of x[i]^2, in a fixed order. scratch: sum_squares_scratch_bytes(n).
size_t sum_squares_scratch_bytes(int64_t n);
void launch_sum_squares(double* result, const float* x, int64_t n, void* scratch, cudaStream_t stream);

// *total (device, double) += scale * sum over the ranges of x_i^2 (squares) or x_i, in a fixed
// order: the gradient norm over many parameter runs, or a micro-batch's loss, without a host
// read. At most max_pieces ranges per launch; first_block is the launcher's to fill.
// scratch: reduce_into_scratch_bytes(pieces).
struct ReducePieces {
    static constexpr int max_pieces = 48;
    const float* x[max_pieces];
    int64_t n[max_pieces];
    int64_t first_block[max_pieces + 1];
    int count;
};
size_t reduce_into_scratch_bytes(const ReducePieces& pieces);
void launch_reduce_into(double* total, ReducePieces pieces, bool squares, double scale, void* scratch, cudaStream_t stream);

// attention.cu: causal flash attention (tensor cores, online softmax, no T x T matrix in
// memory) on packed qkv [B*T, (H + 2*Hkv) * D], out [B*T, H*D], lse [B, H, T] fp32 (natural
// log of the softmax denominator of each query row, scores scaled by 1/sqrt(D)). D is one of
// native_attention_head_dims (core/attention_head_dims.h). With doc_starts (null: causal),
// query t of sequence b sees keys [doc_starts[b*T + t], t]; key tiles wholly before a query
// tile's first start are skipped.
void launch_attention_fwd(Half t, void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                          const int32_t* doc_starts, cudaStream_t stream);
// dqkv overwritten (the q, k and v parts); dk and dv of a kv head sum over its query heads.
// scratch: attention_bwd_scratch_bytes(B, T, H) bytes (rowsum(dout * out) per query row).
size_t attention_bwd_scratch_bytes(int64_t B, int64_t T, int64_t H);
void launch_attention_bwd(Half t, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, int64_t B, int64_t T, int64_t H,
                   int64_t Hkv, int64_t D, const int32_t* doc_starts, void* scratch, cudaStream_t stream);

// attention_block.cu: context parallelism's attention blocks (backend.h, AttentionBlockFwd):
// queries of qkv [B*Tq, (H + 2*Hkv) * D] (first H*D columns) against keys and values kv
// [B*Tk, 2*Hkv*D]; query t of sequence b sees key s iff q_first[b*Tq + t] (0 when null) <=
// kv_positions[s] <= q_positions[t]. The forward merges the block into acc [B*Tq, H*D] and lse
// [B, H, Tq] (fp32; first: overwritten); the backward, from the merged out and lse, adds into
// dq [B*Tq, H*D] and dkv [B*Tk, 2*Hkv*D] (fp32). D is 32, 64 or 128.
struct AttentionBlockDims {
    int64_t B = 0, Tq = 0, Tk = 0, H = 0, Hkv = 0, D = 0;
};
void launch_attention_block_fwd(Half t, float* acc, float* lse, const void* qkv, const void* kv, const AttentionBlockDims& dims, const int32_t* q_positions,
                                const int32_t* kv_positions, const int32_t* q_first, bool first, cudaStream_t stream);
// scratch: attention_block_bwd_scratch_bytes(dims) bytes (rowsum(dout * out) per query row).
size_t attention_block_bwd_scratch_bytes(const AttentionBlockDims& dims);
void launch_attention_block_bwd(Half t, float* dq, float* dkv, const void* dout, const void* out, const float* lse, const void* qkv, const void* kv,
                                const AttentionBlockDims& dims, const int32_t* q_positions, const int32_t* kv_positions, const int32_t* q_first,
                                void* scratch, cudaStream_t stream);

// attention_block.cu: dst[n * dst_width + c] = src[n * src_width + c] for n < rows, c < cols,
// converted between the element types (rounded to nearest even into 16 bits). dst and src
// point at the first copied column of row 0; widths are in elements.
enum class Element { f32, bf16, f16 };
void launch_copy_columns(Element dst_type, void* dst, int64_t dst_width, Element src_type, const void* src, int64_t src_width, int64_t rows, int64_t cols,
                         cudaStream_t stream);

// moe.cu: Mixture-of-Experts routing (backend.h's MoeRouteFwd ... MoeCombineBwd state the
// math). Router tensors fp32, expert indices, rows and counts i32, activations Half.
// An expert index outside [0, E) or a row or source outside its buffer is skipped, never
// followed (the ops that produce them never write one).
void launch_moe_route_fwd(int32_t* experts, float* gates, float* scores, const float* logits, const float* expert_bias, int64_t N, int64_t E, int64_t k,
                          bool sigmoid, bool normalize, cudaStream_t stream);
void launch_moe_route_bwd(float* d_logits, const float* d_gates, const float* gates, const float* scores, const int32_t* experts, int64_t N, int64_t E,
                          int64_t k, bool sigmoid, bool normalize, bool accumulate, cudaStream_t stream);
// G groups of S tokens.
void launch_moe_load_stats(int32_t* counts, float* score_sums, const int32_t* experts, const float* scores, int64_t G, int64_t S, int64_t E, int64_t k,
                           cudaStream_t stream);
void launch_moe_aux_loss_fwd(float* loss, const int32_t* counts, const float* score_sums, int64_t G, int64_t E, int64_t tokens_per_group, int64_t top_k,
                             double coeff, cudaStream_t stream);
// d_logits += through the score function of d_scores[t, e] = scale counts[t / S, e].
void launch_moe_aux_loss_bwd(float* d_logits, const float* scores, const int32_t* counts, int64_t N, int64_t E, int64_t S, float scale, bool sigmoid,
                             cudaStream_t stream);
void launch_moe_z_loss_fwd(float* loss, const float* logits, int64_t N, int64_t E, double coeff, cudaStream_t stream);
// d_logits[t, e] += scale lse_t softmax(logits[t])_e.
void launch_moe_z_loss_bwd(float* d_logits, const float* logits, int64_t N, int64_t E, float scale, cudaStream_t stream);
// scratch: moe_permute_plan_scratch_bytes(N k, E) bytes. dropped may be null.
size_t moe_permute_plan_scratch_bytes(int64_t assignments, int64_t E);
void launch_moe_permute_plan(int32_t* rows, int32_t* sources, int32_t* counts, int32_t* dropped, const int32_t* experts, int64_t N, int64_t E, int64_t k,
                             int64_t capacity, int64_t R, void* scratch, cudaStream_t stream);
// A copy of 16-bit rows, whichever the type.
void launch_moe_permute_fwd(void* x_perm, const void* x, const int32_t* sources, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream);
void launch_moe_permute_bwd(Half t, void* dx, const void* d_x_perm, const int32_t* rows, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream);
void launch_moe_combine_fwd(Half t, void* out, const void* y_perm, const float* gates, const int32_t* rows, int64_t N, int64_t C, int64_t R, int64_t k,
                            cudaStream_t stream);
void launch_moe_combine_bwd(Half t, void* d_y_perm, float* d_gates, const void* d_out, const void* y_perm, const float* gates, const int32_t* rows,
                            const int32_t* sources, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream);

}  // namespace llmtrain::kernels
