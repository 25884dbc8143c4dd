// The Backend interface: every op the two model families need, forward and backward.
// The CPU reference (fp32, or f64 for the tests' reference runs) and the CUDA backend
// implement the same ops; one table (LLMTRAIN_BACKEND_OPS) drives the op enum and the
// profiler's names.
//
// Conventions, for every op:
//  - Tensors are views; outputs come first. Shapes are checked and a mismatch is a shape
//    error naming the op and the tensor.
//  - Activation gradients (dx, dqkv, dlogits) are overwritten; parameter gradients (dw, db,
//    dwte, dwpe) are accumulated (+=), so micro-batches add into the same gradient buffer.
//  - An optional tensor is passed as an empty Tensor() when absent.
//  - Every tensor lives in the backend's memory (device()): allocate() gives it, and
//    copy_from_host / copy_to_host move data across. Ops are enqueued in order on one stream;
//    copy_to_host and sum_squares wait for what they read, synchronize() for everything;
//    each such wait counts in profile().host_syncs.
//  - Mixed precision (CUDA): activations and the weights used for compute are 16-bit, while
//    parameter gradients, norm statistics, attention's saved values, losses and AdamW's
//    master weights and moments are f32. The CPU computes everything in one dtype (f32/f64).
//  - Rows of 2-D activations are tokens, ordered batch-major: row n is sequence n / T,
//    position n % T.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace llmtrain {

#define LLMTRAIN_BACKEND_OPS(X)                                                      \
    X(embedding_fwd) X(embedding_bwd) X(layernorm_fwd) X(layernorm_bwd)              \
    X(rmsnorm_fwd) X(rmsnorm_bwd) X(matmul_fwd) X(matmul_bwd) X(attention_fwd)       \
    X(attention_bwd) X(rope_fwd) X(rope_bwd) X(gelu_fwd) X(gelu_bwd) X(swiglu_fwd)   \
    X(swiglu_bwd) X(add) X(xent_fwd) X(xent_bwd) X(logits_row_max) X(xent_partial)   \
    X(xent_combine) X(adamw) X(sum_squares) X(fill_zero) X(copy) X(matmul_gelu_fwd)        \
    X(gelu_matmul_bwd) X(accumulate_sum) X(accumulate_sum_squares) X(xent_fwd_bwd) X(add_norm_fwd) \
    X(attention_block_fwd) X(attention_block_bwd) X(copy_columns) X(moe_route_fwd) X(moe_route_bwd)     \
    X(moe_load_stats) X(moe_aux_loss_fwd) X(moe_aux_loss_bwd) X(moe_z_loss_fwd) X(moe_z_loss_bwd)  \
    X(moe_permute_plan) X(moe_permute_fwd) X(moe_permute_bwd) X(moe_combine_fwd) X(moe_combine_bwd)  \
    X(fp8_amax) X(fp8_update_scale) X(fp8_cast) X(matmul_fp8)

enum class Op {
#define LLMTRAIN_OP_ENUM(name) name,
    LLMTRAIN_BACKEND_OPS(LLMTRAIN_OP_ENUM)
#undef LLMTRAIN_OP_ENUM
};
constexpr int op_count = 0
#define LLMTRAIN_OP_COUNT(name) +1
    LLMTRAIN_BACKEND_OPS(LLMTRAIN_OP_COUNT)
#undef LLMTRAIN_OP_COUNT
    ;
const char* op_name(Op op);
// The matrix multiplications (GEMMs): the ops a profile reports as "time in GEMMs".
bool op_is_gemm(Op op);

// Causal self-attention over a packed QKV activation [B*T, (H + 2*Hkv) * D]: columns
// [0, H*D) are the query heads, then Hkv key heads, then Hkv value heads. Query head h
// attends with key/value head h / (H / Hkv) (grouped-query attention; Hkv = H is MHA).
struct AttentionShape {
    int64_t batch = 0;
    int64_t seq_len = 0;
    int64_t n_heads = 0;
    int64_t n_kv_heads = 0;
    int64_t head_dim = 0;
    int64_t rows() const { return batch * seq_len; }
    int64_t qkv_width() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
    int64_t out_width() const { return n_heads * head_dim; }
};

// Which rows of the full vocabulary a table (embedding) or a logits block holds: rows
// [begin, begin + local rows) of `total`. Tensor parallelism splits the vocabulary across
// ranks this way (Megatron's vocab-parallel embedding and cross-entropy); total = 0 means
// the tensor holds the whole vocabulary.
// The vocabulary may be padded (model.pad_vocab_to, so that tp divides it): classes
// [real, total) are padding, never a token or a target. The cross-entropy masks them out
// of the softmax (probability 0, gradient 0), so the loss and every other gradient are those
// of the unpadded vocabulary. real = 0 means no padding.
struct VocabShard {
    int64_t begin = 0;
    int64_t total = 0;
    int64_t real = 0;
};

// One AdamW update with decoupled weight decay (Loshchilov & Hutter):
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p )
struct AdamWStep {
    double lr = 0;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0;
    double grad_scale = 1;  // gradient clipping folds in here
    int64_t step = 1;       // t, 1-based
};

// The arguments of every op taking more than three tensors, by name: designated initializers
// at the call (`{.dx = dx, .dw = dw, ...}`) keep a swap of two same-shaped tensors (dw, db;
// mean, rstd) from passing every shape check. Outputs come first; an absent optional tensor
// is Tensor().

// Document starts (data.attention_mask = "document", data.reset_position_ids): an optional
// i32 [B*T] tensor, doc_starts[b*T + t] the position in sequence b where the document of
// token t begins (0 <= doc_starts <= t). Empty: one document per sequence (all zeros), and
// every op computes bitwise what it computes without the argument.

// Explicit positions (context parallelism: each rank holds two chunks of every sequence): an
// optional i32 [N] tensor, positions[n] the position of row n in its sequence (restarts
// applied), 0 <= positions[n] < the table's rows. Given, it replaces n % seq_len - doc_starts[n]
// (doc_starts must then be absent).

// out[n] = wte[tokens[n]] + wpe[pos(n)], pos(n) = n % seq_len - doc_starts[n] (or positions[n]). With a vocabulary shard, wte holds rows
// [vocab.begin, vocab.begin + rows) and tokens outside them give zero rows: the sum over the
// shards' outputs is the full embedding. Every token must be below the full vocabulary size
// (a data error otherwise).
struct EmbeddingFwd {
    Tensor out;     // [N, C], overwritten
    Tensor tokens;  // [N] i32
    Tensor wte;     // [V, C] (this shard's rows)
    Tensor wpe;     // [max_seq_len, C], optional
    int64_t seq_len = 0;
    VocabShard vocab;
    Tensor doc_starts;  // [N] i32, optional: positions restart at each document
    Tensor positions;   // [N] i32, optional: explicit positions (see above)
};
// dwte[tokens[n]] += dout[n] (the rows this shard holds); dwpe[pos(n)] += dout[n].
struct EmbeddingBwd {
    Tensor dwte;  // [V, C]
    Tensor dwpe;  // [max_seq_len, C], optional
    Tensor dout;  // [N, C]
    Tensor tokens;
    int64_t seq_len = 0;
    VocabShard vocab;
    Tensor doc_starts;  // [N] i32, optional, as in forward
    Tensor positions;   // [N] i32, optional, as in forward
};

// out = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps), per row; saves mean, rstd [N].
struct LayerNormFwd {
    Tensor out;   // [N, C], overwritten
    Tensor mean;  // [N], overwritten
    Tensor rstd;  // [N], overwritten
    Tensor x;     // [N, C]
    Tensor w;     // [C]
    Tensor b;     // [C], optional
    double eps = 0;
};
// The norm backwards overwrite dx, or add into it when accumulate_dx (the residual stream's
// gradient: the residual add is fused into the norm's backward); dw, db accumulate.
struct LayerNormBwd {
    Tensor dx;    // [N, C]
    Tensor dw;    // [C]
    Tensor db;    // [C], optional
    Tensor dout;  // [N, C]
    Tensor x;     // [N, C]
    Tensor w;     // [C]
    Tensor mean;  // [N], as forward saved it
    Tensor rstd;  // [N], as forward saved it
    bool accumulate_dx = false;
};
// out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), per row; saves rstd [N].
struct RmsNormFwd {
    Tensor out;   // [N, C], overwritten
    Tensor rstd;  // [N], overwritten
    Tensor x;     // [N, C]
    Tensor w;     // [C]
    double eps = 0;
};
struct RmsNormBwd {
    Tensor dx;    // [N, C]
    Tensor dw;    // [C]
    Tensor dout;  // [N, C]
    Tensor x;     // [N, C]
    Tensor w;     // [C]
    Tensor rstd;  // [N], as forward saved it
    bool accumulate_dx = false;
};

// out[N, OC] = x[N, IC] w[OC, IC]^T + bias[OC] (the weight layout of torch.nn.Linear).
struct MatmulFwd {
    Tensor out;   // [N, OC], overwritten; x's dtype, or f32 (16-bit x on CUDA, no bias: the fp32 accumulator as it is)
    Tensor x;     // [N, IC]
    Tensor w;     // [OC, IC]
    Tensor bias;  // [OC], optional
    // > 0: on a backend that keeps_row_blocks(), rows computed in blocks of this many from
    // row 0, each by itself; 0 (or another backend): as the backend sees fit.
    int64_t row_block = 0;
};
// dx = dout w (overwritten; skipped if dx is empty); dw += dout^T x; dbias += column sums of dout.
struct MatmulBwd {
    Tensor dx;     // [N, IC], optional
    Tensor dw;     // [OC, IC], optional
    Tensor dbias;  // [OC], optional
    Tensor dout;   // [N, OC]
    Tensor x;      // [N, IC]
    Tensor w;      // [OC, IC]
};

// out[B*T, H*D] = softmax(q k^T / sqrt(D) + mask) v over the packed qkv (AttentionShape). The
// mask lets query t of sequence b see keys s in [doc_starts[b*T + t], t]: causal (from 0)
// without doc_starts, and no key of an earlier document with them.
struct AttentionFwd {
    Tensor out;    // [B*T, H*D], overwritten
    Tensor saved;  // attention_saved_shape(), statistics_dtype()
    Tensor qkv;    // [B*T, (H + 2*Hkv) * D]
    AttentionShape shape;
    Tensor doc_starts;  // [B*T] i32, optional
};
// Backward of attention_fwd: dqkv overwritten from dout, the forward's inputs, its output
// (flash attention's rowsum(dout * out)) and what it saved.
struct AttentionBwd {
    Tensor dqkv;   // [B*T, (H + 2*Hkv) * D]
    Tensor dout;   // [B*T, H*D]
    Tensor qkv;    // [B*T, (H + 2*Hkv) * D]
    Tensor out;    // [B*T, H*D]
    Tensor saved;  // attention_saved_shape(), statistics_dtype()
    AttentionShape shape;
    Tensor doc_starts;  // [B*T] i32, optional: the forward's document mask
};

// Rotary position embedding, in place, on the first n_heads heads of each row of x [B*T, W]
// (heads at columns [h*D, (h+1)*D)). Pairs are (i, i + D/2) as in Hugging Face Llama:
// x_i' = x_i cos - x_{i+D/2} sin, x_{i+D/2}' = x_{i+D/2} cos + x_i sin, with angle
// pos * theta^(-2i/D) read from table [max_seq_len, D] (cos in [0, D/2), sin in [D/2, D)),
// pos = n % seq_len - doc_starts[n] for row n (doc_starts optional: positions restart at each
// document), or positions[n] (explicit positions, see above).
struct Rope {
    Tensor x;           // [B*T, W]: the rows (forward) or their gradient (backward), in place
    Tensor table;       // [positions, D]
    int64_t seq_len = 0;
    int64_t n_heads = 0;
    int64_t head_dim = 0;
    Tensor doc_starts;  // [B*T] i32, optional
    Tensor positions;   // [B*T] i32, optional: explicit positions
};

// Context parallelism's ring attention (model/context_parallel.cpp) runs attention block by
// block: the queries of this rank's tokens (Tq per sequence) against the keys and values of
// one rank's tokens (Tk per sequence) at a time, merged by log-sum-exp (Liu et al. 2023, Ring
// Attention; Megatron-Core's context parallelism). Positions are explicit: query row t of a
// sequence sits at q_positions[t] in it, key row s at kv_positions[s], and query n = b*Tq + t
// sees key s of the same sequence iff q_first[n] <= kv_positions[s] <= q_positions[t]
// (q_first: the first position of n's document; absent: 0, causal).
// One block's own result, with S = q k^T / sqrt(D) over the keys a query sees:
//   lse_b = log sum_s exp(S_s),  o_b = sum_s exp(S_s - lse_b) v_s   (lse_b = -inf, o_b = 0: none seen)
// merged into the running (acc, lse):
//   lse' = log(exp(lse) + exp(lse_b)),  acc' = acc exp(lse - lse') + o_b exp(lse_b - lse').
// After the last block, acc is softmax(S) v over every key seen and lse its log-sum-exp.
struct AttentionBlockFwd {
    Tensor acc;           // [B*Tq, H*D] statistics dtype: merged output of the blocks so far
    Tensor lse;           // [B, H, Tq] statistics dtype: their merged log-sum-exp
    Tensor qkv;           // [B*Tq, (H + 2*Hkv) * D]: the queries (each row's first H*D columns)
    Tensor kv;            // [B*Tk, 2*Hkv*D]: the block's keys, then its values
    AttentionShape shape;  // batch B, seq_len Tq, the heads
    int64_t kv_len = 0;    // Tk
    Tensor q_positions;   // [Tq] i32
    Tensor kv_positions;  // [Tk] i32
    Tensor q_first;       // [B*Tq] i32, optional
    bool first = false;   // the first block: acc and lse are overwritten instead of merged
};
// Backward of one block, from the merged forward (out, lse): with P = exp(S - lse),
// delta = rowsum(dout * out), dP = dout v^T and dS = P (dP - delta):
//   dq += dS k / sqrt(D),  dk += dS^T q / sqrt(D),  dv += P^T dout,
// dk and dv of a key/value head summed over its group of query heads.
struct AttentionBlockBwd {
    Tensor dq;            // [B*Tq, H*D] statistics dtype: accumulates
    Tensor dkv;           // [B*Tk, 2*Hkv*D] statistics dtype: accumulates (keys, then values)
    Tensor dout;          // [B*Tq, H*D]
    Tensor out;           // [B*Tq, H*D]: the merged forward output
    Tensor lse;           // [B, H, Tq] statistics dtype: the merged log-sum-exp
    Tensor qkv;           // as in forward
    Tensor kv;            // as in forward
    AttentionShape shape;
    int64_t kv_len = 0;
    Tensor q_positions;
    Tensor kv_positions;
    Tensor q_first;
};
// dst[n, dst_col + c] = src[n, src_col + c] for c < cols and every row n, converting between
// float dtypes (rounding to nearest even into 16 bits).
struct CopyColumns {
    Tensor dst;  // [N, *]
    int64_t dst_col = 0;
    Tensor src;  // [N, *]
    int64_t src_col = 0;
    int64_t cols = 0;
};

// Every cross-entropy op runs over the real classes only (v < vocab.real, see VocabShard):
// padded classes enter no max, no sum and get a zero gradient.
// losses[n] = logsumexp(logits[n]) - logits[n, targets[n]], over whole rows
// (vocab.begin = 0; vocab.total = 0 or the row width).
struct XentFwd {
    Tensor losses;   // [N], overwritten
    Tensor lse;      // [N], optional: each row's logsumexp, so that xent_bwd need not reduce again
    Tensor logits;   // [N, V]
    Tensor targets;  // [N] i32
    VocabShard vocab;
};
// dlogits[n] = (softmax(logits[n]) - onehot(targets[n])) * dloss; dlogits may alias logits.
// With lse [N] given (the full rows' logsumexp) the rows may be a vocabulary shard:
// softmax_v = exp(logits[n, v] - lse[n]) and the one-hot is 1 only where this shard holds the
// target. With lse empty the rows are whole and lse is computed here.
struct XentBwd {
    Tensor dlogits;  // [N, V]
    Tensor logits;   // [N, V]
    Tensor targets;  // [N] i32
    Tensor lse;      // [N], optional
    VocabShard vocab;
    double dloss = 0;
};
// Vocabulary-parallel cross-entropy, forward, in three local steps around two reductions
// across the shards: m = max over shards of logits_row_max; partial = xent_partial(m), summed
// over shards; xent_combine gives lse = m + log(sum exp) and loss = lse - target logit. A
// shard holding padding only has row_max -inf and sum 0.
// partial[n] = (sum_v exp(logits[n, v] - row_max[n]), logits[n, target - vocab.begin] if this
// shard holds the target, else 0).
struct XentPartial {
    Tensor partial;  // [N, 2], overwritten
    Tensor logits;   // [N, V_shard]
    Tensor targets;  // [N] i32
    Tensor row_max;  // [N], the max over every shard
    VocabShard vocab;
};
struct XentCombine {
    Tensor losses;   // [N], overwritten
    Tensor lse;      // [N], overwritten
    Tensor partial;  // [N, 2], summed over the shards
    Tensor row_max;  // [N]
};
// The fused classifier of a training step (whole rows): XentFwd's losses and lse, then the
// logits overwritten by XentBwd's gradient with dloss.
struct XentFwdBwd {
    Tensor losses;   // [N], overwritten
    Tensor lse;      // [N], overwritten
    Tensor logits;   // [N, V], overwritten by the gradient
    Tensor targets;  // [N] i32
    VocabShard vocab;
    double dloss = 0;
};

// One AdamW step (AdamWStep) on param, grad, m, v, all in one dtype (the master weights');
// param_copy (optional) receives the updated values in the compute dtype (bf16/f16 weights
// for the next forward).
struct AdamWUpdate {
    Tensor param;
    Tensor grad;
    Tensor m;
    Tensor v;
    Tensor param_copy;
    AdamWStep step;
};

// The GPT-2 MLP's GELU fused with the GEMMs around it (CUDA: cuBLASLt's GELU epilogues).
// Forward: pre = x w^T + bias (kept for the backward), act = gelu(pre).
struct MatmulGeluFwd {
    Tensor act;   // [N, OC], overwritten
    Tensor pre;   // [N, OC], overwritten
    Tensor x;     // [N, IC]
    Tensor w;     // [OC, IC]
    Tensor bias;  // [OC], optional
    int64_t row_block = 0;  // as MatmulFwd's
};
// Backward of out = act w^T + bias with act = gelu(pre), through to pre:
//   d_pre = (dout w) * gelu'(pre)  (overwritten)
//   d_pre_bias += column sums of d_pre  (optional: the bias gradient of the layer that made pre)
//   dw += dout^T act,  dbias += column sums of dout  (each optional)
struct GeluMatmulBwd {
    Tensor d_pre;       // [N, IC]
    Tensor d_pre_bias;  // [IC]
    Tensor dw;          // [OC, IC]
    Tensor dbias;       // [OC]
    Tensor dout;        // [N, OC]
    Tensor act;         // [N, IC]
    Tensor pre;         // [N, IC]
    Tensor w;           // [OC, IC]
};

// The residual add fused into the norm after it: sum = a + b (the residual stream, kept),
// then out = norm(sum) as layernorm_fwd (bias optional) or, with rms, rmsnorm_fwd (mean and
// bias empty). The norm reads sum as stored (rounded to the activation dtype), so the result
// is bitwise the two ops'.
struct AddNormFwd {
    Tensor sum;   // [N, C], overwritten (may alias a or b)
    Tensor out;   // [N, C], overwritten
    Tensor mean;  // [N], LayerNorm only
    Tensor rstd;  // [N]
    Tensor a, b;  // [N, C]
    Tensor w;     // [C]
    Tensor bias;  // [C], optional
    double eps = 1e-5;
    bool rms = false;
};

// ---- Mixture of Experts: routing, load balancing, permutation (Megatron-Core's MoE) ----
// N tokens (rows), E experts, top_k = k chosen per token. The router GEMM (logits [N, E]) is
// the caller's. Router-side tensors (logits, scores, gates, expert bias, losses) are fp32 on
// CUDA and the CPU's f32 path, f64 on the CPU's f64 path; activations (x, y, out) are in the
// compute dtype (CUDA bf16/f16, CPU f32/f64). Expert indices and rows are i32. No op reads a
// value back to the host, and none adds floats in an order that depends on scheduling.

// The router's score function over a token's E logits.
enum class MoeScore {
    softmax,  // s_e = exp(l_e) / sum_e' exp(l_e')  (Mixtral, Qwen2/3-MoE)
    sigmoid,  // s_e = 1 / (1 + exp(-l_e))          (DeepSeek-V3)
};

// Forward routing. scores = score(logits); the chosen experts of token t are the k largest
// values of scores[t, e] + expert_bias[e] (the bias is DeepSeek-V3's aux-loss-free balancing:
// it changes which experts are chosen, never a gate), ties to the lower expert index, written
// in descending order of that value. gates[t, j] = scores[t, experts[t, j]], divided by their
// sum over j when normalize_top_k (DeepSeek-V3, Qwen3, Mixtral's softmax-then-renormalize),
// as they are otherwise (Qwen2-MoE's norm_topk_prob = false). scores are kept for backward
// and for the load statistics.
struct MoeRouteFwd {
    Tensor experts;      // [N, k] i32, overwritten
    Tensor gates;        // [N, k], overwritten
    Tensor scores;       // [N, E], overwritten
    Tensor logits;       // [N, E]
    Tensor expert_bias;  // [E], optional
    MoeScore score = MoeScore::softmax;
    bool normalize_top_k = true;
};
// Backward of the gates to the logits, through the chosen experts' gate paths. With
// S = sum_j s_j over the chosen scores s_j = scores[t, experts[t, j]]:
//   normalized: ds_j = (d_gates[t, j] - sum_i d_gates[t, i] gates[t, i]) / S;  else ds_j = d_gates[t, j]
//   softmax:    d_logits[t, e] = s_e (ds_e - sum_j s_j ds_j)   (ds_e = 0 for an expert not chosen)
//   sigmoid:    d_logits[t, e] = ds_e s_e (1 - s_e)
// d_logits is overwritten, or added into when accumulate (the aux and z losses add theirs).
struct MoeRouteBwd {
    Tensor d_logits;  // [N, E]
    Tensor d_gates;   // [N, k]
    Tensor gates;     // [N, k], as forward wrote them
    Tensor scores;    // [N, E], as forward wrote them
    Tensor experts;   // [N, k] i32
    MoeScore score = MoeScore::softmax;
    bool normalize_top_k = true;
    bool accumulate = false;
};
// Load statistics per group of seq_len consecutive tokens (G = N / seq_len groups; seq_len 0
// means N, one group): counts[g, e] = the (token, slot) assignments of group g's tokens to e
// (before any capacity drop), score_sums[g, e] = the sum over its tokens of scores[t, e]. A
// caller reduces them over the ranks holding the rest of a batch or a sequence before
// forming the aux loss. Both overwritten.
struct MoeLoadStats {
    Tensor counts;      // [G, E] i32 (a group's N k assignments fit: at most 2^31 - 1)
    Tensor score_sums;  // [G, E], the scores' dtype
    Tensor experts;     // [N, k] i32
    Tensor scores;      // [N, E]
    int64_t seq_len = 0;
};
// The load-balancing loss of Switch/GShard (Megatron's aux loss), per group and averaged over
// the G groups: one group is the batch-level loss, one group per sequence DeepSeek-V3's
// sequence-level loss. With T = tokens_per_group (the tokens the statistics were summed over,
// all ranks included), f_ge = counts[g, e] / (T k) and P_ge = score_sums[g, e] / T:
//   loss = coeff E / G sum_g sum_e f_ge P_ge   (overwritten; f carries no gradient)
struct MoeAuxLossFwd {
    Tensor loss;        // [1], the scores' dtype
    Tensor counts;      // [G, E] i32
    Tensor score_sums;  // [G, E]
    int64_t tokens_per_group = 0;
    int64_t top_k = 0;
    double coeff = 0;
};
// Its gradient times dloss, added into d_logits through the score function: token t of
// group g = t / seq_len (seq_len 0: N) gets d_scores[t, e] = dloss coeff E f_ge / (G T), then
//   softmax: d_logits[t, e] += s_e (d_scores[t, e] - sum_e' s_e' d_scores[t, e'])
//   sigmoid: d_logits[t, e] += d_scores[t, e] s_e (1 - s_e)
struct MoeAuxLossBwd {
    Tensor d_logits;  // [N, E], accumulated
    Tensor scores;    // [N, E]
    Tensor counts;    // [G, E] i32, as given to the forward
    int64_t seq_len = 0;
    int64_t tokens_per_group = 0;
    int64_t top_k = 0;
    double coeff = 0;
    double dloss = 1;
    MoeScore score = MoeScore::softmax;
};
// ST-MoE's router z-loss: loss = coeff mean_t (logsumexp_e logits[t, e])^2 (overwritten);
// backward: d_logits[t, e] += dloss coeff 2 lse_t softmax(logits[t])_e / N.
struct MoeZLossFwd {
    Tensor loss;    // [1], the logits' dtype
    Tensor logits;  // [N, E]
    double coeff = 0;
};
struct MoeZLossBwd {
    Tensor d_logits;  // [N, E], accumulated
    Tensor logits;    // [N, E]
    double coeff = 0;
    double dloss = 1;
};

// The permutation of tokens by expert. Assignment (t, j) is token t's slot j; the permuted
// buffer holds expert 0's rows, then expert 1's, ..., and within an expert its assignments
// ordered by token, then slot (a stable order, the same on every run and backend).
//  - capacity 0 (dropless): every assignment is kept; expert e's rows start at the sum of the
//    earlier experts' counts, and the buffer has N k rows.
//  - capacity c > 0: expert e's rows are [e c, e c + counts[e]) of a buffer of E c rows; its
//    assignments beyond the first c in the stable order are dropped (rows[t, j] = -1, counted
//    in dropped[e]) and the rows it leaves empty are padding (sources = -1).
// rows[t, j] is the assignment's row in the buffer; sources[r] = t k + j of the assignment in
// row r (-1: padding). counts[e] = the rows expert e holds (after drops).
struct MoePermutePlan {
    Tensor rows;     // [N, k] i32, overwritten
    Tensor sources;  // [R] i32, overwritten: R = N k (dropless) or E capacity
    Tensor counts;   // [E] i32, overwritten
    Tensor dropped;  // [E] i32, optional, overwritten
    Tensor experts;  // [N, k] i32, each in [0, E)
    int64_t capacity = 0;
};
// x_perm[r] = x[sources[r] / k] (a gather; padding rows are zero).
struct MoePermuteFwd {
    Tensor x_perm;   // [R, C], overwritten
    Tensor x;        // [N, C]
    Tensor sources;  // [R] i32
    int64_t top_k = 0;
};
// dx[t] = sum over token t's kept slots j, in slot order, of d_x_perm[rows[t, j]] (a gather;
// zero for a token whose every slot was dropped). Overwritten.
struct MoePermuteBwd {
    Tensor dx;        // [N, C]
    Tensor d_x_perm;  // [R, C]
    Tensor rows;      // [N, k] i32
};
// out[t] = sum over kept slots j, in slot order, of gates[t, j] y_perm[rows[t, j]] (a dropped
// slot contributes nothing). Overwritten.
struct MoeCombineFwd {
    Tensor out;     // [N, C]
    Tensor y_perm;  // [R, C]
    Tensor gates;   // [N, k]
    Tensor rows;    // [N, k] i32
};
// d_y_perm[r] = gates[t, j] d_out[t] for the assignment (t, j) in row r (zero for padding);
// d_gates[t, j] = dot(d_out[t], y_perm[rows[t, j]]) (zero for a dropped slot). Both overwritten.
struct MoeCombineBwd {
    Tensor d_y_perm;  // [R, C]
    Tensor d_gates;   // [N, k]
    Tensor d_out;     // [N, C]
    Tensor y_perm;    // [R, C]
    Tensor gates;     // [N, k]
    Tensor rows;      // [N, k] i32
    Tensor sources;   // [R] i32
};

// ---- FP8 (core/fp8.h): per-tensor scaled casts and GEMMs of FP8 operands ----
// A tensor in FP8 is its bytes (dtype e4m3 or e5m2) and a scale: q = fp8(x scale), read as
// q / scale. Scales, their inverses and amaxes are [1] f32 tensors on the device, so a step
// computes an amax, a scale, the cast and the GEMM without the host waiting. The CPU backend
// computes the same: its casts round exactly as the CUDA kernels (core/fp8.h), its GEMMs
// multiply the decoded values in f32 (or f64) and scale the sums.

// amax[0] = max |x| over the tensor (NaN when an element is NaN), overwritten.
struct Fp8Amax {
    Tensor amax;  // [1] f32
    Tensor x;     // any shape, the compute dtype
};
// scale[0] = format's max / amax[0] / 2^margin, kept when amax[0] is zero or not finite
// (fp8_scale_for_amax); scale_inv[0] = 1 / scale[0]. Current scaling runs it on this step's
// amax; delayed scaling on its history's.
struct Fp8UpdateScale {
    Tensor scale;      // [1] f32, updated
    Tensor scale_inv;  // [1] f32, overwritten
    Tensor amax;       // [1] f32
    DType format = DType::e4m3;
    int margin = 0;
};
// out = fp8(x scale[0]) in out's format (round to nearest even, saturating at the format's
// max; NaN stays NaN), x viewed as [rows, cols] (cols its last dimension). out_t, when given,
// holds the same bytes transposed, [cols, rows] (Hopper's FP8 GEMMs take both operands with
// the reduced dimension contiguous, so a backward GEMM needs the other layout); amax, when
// given, receives max |x| from the same pass (what a delayed-scaling history records);
// counts, when given, has added to it (+=) the elements this cast saturated (|x scale| where
// rounding to nearest even leaves the format's finite range, clamped to its largest value:
// e4m3 above 464, e5m2 from 61440 on; infinities included, NaN not; a value that rounds to
// the largest is no overflow) and those it flushed (x not 0, out +-0): f64 integers, exact
// whatever order a device adds them in, to 2^53.
// x may instead hold FP8 bytes of out's format (scale, amax and counts then absent): out =
// those bytes as they are, out_t their transpose, and out may be x itself (then only out_t is
// written). A weight gathered in FP8 (fp8.param_gather) gets its transposed copy so.
struct Fp8Cast {
    Tensor out;    // [rows, cols] e4m3 / e5m2, overwritten
    Tensor out_t;  // [cols, rows], the same format, optional
    Tensor x;      // [rows, cols] (or more dimensions, cols last), the compute dtype or out's FP8 format
    Tensor scale;  // [1] f32 (absent when x is FP8)
    Tensor amax;   // [1] f32, optional
    Tensor counts; // [2] f64, optional: saturated, flushed
};
// out[M, N] = a_scale_inv[0] b_scale_inv[0] sum_k a[M, k] b[N, k] (+ out when accumulate)
// (+ bias[N] on every row, cuBLASLt's BIAS epilogue: a linear layer's bias): both
// operands FP8 with k contiguous (a linear layer's forward: a = the input [tokens, in], b =
// the weight [out, in]) and not both e5m2; out in the compute dtype or f32. fast_accumulate:
// cuBLASLt's FAST_ACCUM (no periodic promotion of the partial sums; the CPU sums as always).
struct MatmulFp8 {
    Tensor out;          // [M, N]
    Tensor a;            // [M, K] e4m3 / e5m2
    Tensor a_scale_inv;  // [1] f32
    Tensor b;            // [N, K] e4m3 / e5m2
    Tensor b_scale_inv;  // [1] f32
    Tensor bias;         // [N], out's dtype, optional
    bool accumulate = false;
    bool fast_accumulate = false;
};

// Seconds and calls per op, accumulated since the last reset, and the host synchronizations:
// every time the host waited for the device (copy_to_host, synchronize, a workspace that had
// to grow), counted whether or not per-op timing is on.
struct OpProfile {
    std::array<double, op_count> seconds{};
    std::array<int64_t, op_count> calls{};
    int64_t host_syncs = 0;
    double total_seconds() const;
    double gemm_seconds() const;
    void reset() { *this = OpProfile{}; }
};

// A backend's memory layout, known before one is made: the memory plan sizes a run from
// these before allocating anything, and each backend sizes its tensors with the same
// functions (through the members of the same names below), so plan and allocation agree.
// The dtype of statistics and saved values for activations of dtype `activation` (norm
// mean/rstd, attention's saved tensor, losses): f32 for 16-bit and f32 activations.
DType statistics_dtype(DType activation);
// Attention's saved tensor: the CPU keeps the probabilities [B, H, T, T]; CUDA's flash
// attention only the log-sum-exp of each row [B, H, T].
Shape attention_saved_shape(Device device, const AttentionShape& shape);
// Scratch a backend allocates when it is made (CUDA: cuBLASLt's workspace); the ops' own
// scratch grows on top of it during the first step.
size_t reserved_workspace_bytes(Device device);
// The scratch attention adds to that at most for `shape`: on CUDA the native backward's
// Delta rows [B, H, T] fp32, and unless impl is native the bound of cuDNN's (its Delta rows
// and the deterministic backward's dP tiles, B H T_64 T_128 16-bit, with T rounded up to 64
// and 128 as its tiles), which the memory plan counts whether or not cuDNN loads.
size_t attention_workspace_bytes(Device device, AttentionImpl impl, const AttentionShape& shape);

// Memory free for a run on this machine: the host's MemAvailable (/proc/meminfo), and the
// free memory of CUDA device `device_index` modulo the devices seen. The CUDA functions
// throw an unsupported error naming the cause when this build has no CUDA, or the machine
// no driver or GPU.
size_t host_available_memory_bytes();
int cuda_device_count();
size_t cuda_free_memory_bytes(int device_index);

// A GPU as CUDA reports it: its name and compute capability (sm_80 the A100, sm_90 the H100).
struct GpuDevice {
    std::string name;
    int sm_major = 0;
    int sm_minor = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual Device device() const = 0;
    // The layout functions above, for this backend's device.
    DType statistics_dtype(DType activation) const { return llmtrain::statistics_dtype(activation); }
    Shape attention_saved_shape(const AttentionShape& shape) const { return llmtrain::attention_saved_shape(device(), shape); }

    // Memory management. allocate() is for set-up (parameters, optimizer state, the
    // activation arena): nothing is allocated in the step loop.
    virtual Memory allocate(size_t bytes) = 0;  // zeroed, 256-byte aligned
    virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
    virtual void copy_to_host(void* dst, const Tensor& src) = 0;
    // Page-locks [p, p + bytes) of host memory for copy_to_host into it (a device copies into
    // pinned memory at its link's rate, into pageable memory at a fraction of it) until the
    // handle returned is released; release it before the memory is freed. Null: nothing to
    // pin on this backend, or the pinning failed (said once; the copies still work, slower).
    virtual std::shared_ptr<void> pin_host_memory(void* p, size_t bytes) {
        (void)p;
        (void)bytes;
        return nullptr;
    }
    // Waits for every op enqueued so far (timing, host reads); a no-op on the CPU.
    virtual void synchronize() {}
    // The native stream every op is enqueued on (cudaStream_t), for ordering communication
    // against it with events; null on a backend without one.
    virtual void* device_stream() const { return nullptr; }
    // Bytes the backend itself holds for scratch (workspaces), for the memory report: at
    // least reserved_workspace_bytes(device()).
    virtual size_t workspace_bytes() const { return 0; }
    // Device memory this backend has allocated at most (0: host memory, not tracked).
    virtual size_t peak_memory_bytes() const { return 0; }
    // At most `bytes` held through allocate() at once from now on (train.memory_limit_gb): an
    // allocation beyond it is a config error naming the key. 0: no limit.
    void set_memory_limit(size_t bytes) { memory_limit_bytes_ = bytes; }
    // Whether matmul_fwd (and matmul_gelu_fwd) given a row_block R computes each block of R
    // rows by itself: then a matmul over rows [b, e) of x, b and e multiples of R (or e x's
    // last row), gives bitwise those rows of the matmul over all of x. Without it a GEMM
    // library may pick another algorithm, and another order of addition, for another number
    // of rows. What lets parallel.tp_overlap split a matmul into pieces with the losses unchanged.
    virtual bool keeps_row_blocks() const { return false; }
    // The device's dense bf16 peak in TFLOP/s from its data sheet (0: unknown), for MFU.
    virtual double peak_bf16_tflops() const { return 0; }
    // The GPU this backend computes on; none on a backend that is not a GPU's.
    virtual std::optional<GpuDevice> gpu_device() const { return std::nullopt; }
    // Which kernels run attention at this shape, and how ("native flash kernels", or cuDNN's
    // engines with their notes and workspace), planning it if it was not yet.
    virtual std::string describe_attention(const AttentionShape& /*shape*/, DType /*dtype*/) { return "native"; }
    // Per-op timing in profile(): always on for the CPU (wall clock); on CUDA, event pairs
    // recorded only while profiling is on (off by default: a training step records no event
    // per op; bench turns it on for its time breakdown).
    virtual void set_profiling(bool /*on*/) {}

    // The ops taking an argument struct: each struct above states the op's math.
    virtual void embedding_fwd(const EmbeddingFwd& args) = 0;
    virtual void embedding_bwd(const EmbeddingBwd& args) = 0;

    virtual void layernorm_fwd(const LayerNormFwd& args) = 0;
    virtual void layernorm_bwd(const LayerNormBwd& args) = 0;
    virtual void rmsnorm_fwd(const RmsNormFwd& args) = 0;
    virtual void rmsnorm_bwd(const RmsNormBwd& args) = 0;

    virtual void matmul_fwd(const MatmulFwd& args) = 0;
    virtual void matmul_bwd(const MatmulBwd& args) = 0;

    // out[B*T, H*D] = softmax(q k^T / sqrt(D) + mask) v. `saved` holds what backward
    // needs; its shape is the device's choice (attention_saved_shape), its dtype
    // statistics_dtype(). Backward (AttentionBwd) also reads the forward's output.
    // (AttentionFwd states the mask.)
    virtual void attention_fwd(const AttentionFwd& args) = 0;
    virtual void attention_bwd(const AttentionBwd& args) = 0;
    // Context parallelism's blocks (AttentionBlockFwd states the math).
    virtual void attention_block_fwd(const AttentionBlockFwd& args) = 0;
    virtual void attention_block_bwd(const AttentionBlockBwd& args) = 0;
    virtual void copy_columns(const CopyColumns& args) = 0;

    // Rotary position embedding (Rope states the math), in place; backward applies the
    // inverse rotation to the gradient.
    virtual void rope_fwd(const Rope& args) = 0;
    virtual void rope_bwd(const Rope& args) = 0;

    // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    virtual void gelu_fwd(const Tensor& out, const Tensor& x) = 0;
    virtual void gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) = 0;
    // out[N, F] = silu(x[:, :F]) * x[:, F:], x is [N, 2F] (gate, then up).
    virtual void swiglu_fwd(const Tensor& out, const Tensor& x) = 0;
    virtual void swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) = 0;

    // out = a + b (out may alias a or b).
    virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;

    // The cross-entropy (XentFwd, XentBwd; vocabulary-parallel: XentPartial, XentCombine).
    virtual void xent_fwd(const XentFwd& args) = 0;
    virtual void xent_bwd(const XentBwd& args) = 0;
    // row_max[n] = the max of this shard's real classes of row n (-inf for padding only): the
    // first step of the vocabulary-parallel cross-entropy (see XentPartial).
    virtual void logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) = 0;
    virtual void xent_partial(const XentPartial& args) = 0;
    virtual void xent_combine(const XentCombine& args) = 0;

    virtual void adamw(const AdamWUpdate& args) = 0;
    // Sum of squares of every element, accumulated in double (a host read: a synchronization).
    virtual double sum_squares(const Tensor& x) = 0;
    // total (f64 [1], in this backend's memory) += scale * the sum of x's elements, in a fixed
    // order: a micro-batch's mean loss added on the device, read once per step.
    virtual void accumulate_sum(const Tensor& total, const Tensor& x, double scale) = 0;
    // total (f64 [1]) += the sum of squares of every element of every piece, pieces in order,
    // in one pass where the device can: the gradient norm of many parameter runs.
    virtual void accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) = 0;
    virtual void fill_zero(const Tensor& x) = 0;
    // out = in, same element count (they must not overlap); a dtype change converts (f32 to
    // bf16/f16 rounds to nearest even); FP8 bytes copy as they are (same format only).
    virtual void copy(const Tensor& out, const Tensor& in) = 0;

    // The fused MLP steps (MatmulGeluFwd, GeluMatmulBwd above). The defaults compose the ops
    // above (matmul_fwd, gelu_fwd; matmul_bwd, gelu_bwd in place), so a backend without a
    // fused form computes bitwise what the separate ops compute.
    virtual void matmul_gelu_fwd(const MatmulGeluFwd& args);
    virtual void gelu_matmul_bwd(const GeluMatmulBwd& args);
    // XentFwdBwd above, in one pass over the logits where the backend can (the default is the
    // two ops).
    virtual void xent_fwd_bwd(const XentFwdBwd& args);
    // AddNormFwd above, in one pass where the backend can (the default is the two ops).
    virtual void add_norm_fwd(const AddNormFwd& args);

    // Mixture of Experts (MoeRouteFwd ... MoeCombineBwd above state the math).
    virtual void moe_route_fwd(const MoeRouteFwd& args) = 0;
    virtual void moe_route_bwd(const MoeRouteBwd& args) = 0;
    virtual void moe_load_stats(const MoeLoadStats& args) = 0;
    virtual void moe_aux_loss_fwd(const MoeAuxLossFwd& args) = 0;
    virtual void moe_aux_loss_bwd(const MoeAuxLossBwd& args) = 0;
    virtual void moe_z_loss_fwd(const MoeZLossFwd& args) = 0;
    virtual void moe_z_loss_bwd(const MoeZLossBwd& args) = 0;
    virtual void moe_permute_plan(const MoePermutePlan& args) = 0;
    virtual void moe_permute_fwd(const MoePermuteFwd& args) = 0;
    virtual void moe_permute_bwd(const MoePermuteBwd& args) = 0;
    virtual void moe_combine_fwd(const MoeCombineFwd& args) = 0;
    virtual void moe_combine_bwd(const MoeCombineBwd& args) = 0;

    // FP8 (Fp8Amax ... MatmulFp8 above state the math).
    virtual void fp8_amax(const Fp8Amax& args) = 0;
    virtual void fp8_update_scale(const Fp8UpdateScale& args) = 0;
    virtual void fp8_cast(const Fp8Cast& args) = 0;
    virtual void matmul_fp8(const MatmulFp8& args) = 0;

    OpProfile& profile() { return profile_; }

protected:
    // Throws the error above when `bytes` more would take `held` beyond the limit.
    void check_memory_limit(size_t held, size_t bytes) const;
    OpProfile profile_;
    size_t memory_limit_bytes_ = 0;
};

// sums[C] += the column sums of rows[N, C] (a bias gradient), by the backend's matmul_bwd.
void add_column_sums(Backend& backend, const Tensor& sums, const Tensor& rows);

// The rotary table [max_seq_len, head_dim] for base theta (computed in double).
void fill_rope_table(const Tensor& table, double theta);

// The CPU reference backend: f32 and f64, BLAS GEMMs, OpenMP over rows. threads <= 0
// means every core.
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The CUDA backend on GPU `device_index` (the node-local rank picks it under mpirun), its
// attention by `attention` (config.h's model.attention). Throws an unsupported error naming
// the cause when this build has no CUDA, the machine no driver or GPU, or attention is
// cudnn and libcudnn cannot be loaded.
std::unique_ptr<Backend> make_cuda_backend(int device_index, AttentionImpl attention = AttentionImpl::automatic);
bool cuda_backend_built();

// The libraries under the backends, for `--version`: "CUDA runtime 12.4 (driver 12.6)" or
// "not built"; "OpenBLAS 0.3.21 DYNAMIC_ARCH ... MAX_THREADS=64" (its build configuration).
std::string cuda_runtime_version();
std::string blas_library_version();
// The CUDA runtime this binary was built with and the CUDA version the installed driver
// supports, both as 1000 * major + 10 * minor; 0 where not built / no driver.
struct CudaVersions {
    int runtime = 0, driver = 0;
};
CudaVersions cuda_versions();

}  // namespace llmtrain
