// The operation graphs of causal scaled-dot-product attention that cuDNN's fused flash
// attention engines take (the runtime-compiled "fused attention" of cuDNN 9 on Ampere and
// Hopper), over the packed QKV activation of backend.h's AttentionShape, read in place:
//
//   qkv [B*T, W], W = (H + 2 Hkv) D: Q (b, h, t, d) at row b T + t, column h D + d;
//   K and V the Hkv heads after it. As 4-D [B, heads, T, D] tensors their strides are
//   (T W, D, W, 1): no copy, no transpose. out / dout [B*T, H D]: strides (T H D, D, H D, 1).
//   stats [B, H, T] fp32 = log-sum-exp of each query row's scaled scores, the native
//   kernels' saved tensor too, so either implementation's forward serves the other's backward.
//
// Forward, scale = 1/sqrt(D):
//   S = scale Q K^T;  S[r, c] = lowest for c > r (causal, by generated row / column indices);
//   m = rowmax S;  E = exp(S - m);  l = rowsum E;  stats = m + log l;  O = (E / l) V
// Backward (dP-workspace form: dQ written by its matmul directly, no fp32 accumulator with
// atomics, so the engines that take it are the deterministic ones):
//   Delta = rowsum(dO * O);  P = exp(scale Q K^T - stats) masked;  dV = P^T dO
//   dS = scale P (dO V^T - Delta);  dK = dS^T Q;  dQ = dS K
// Grouped-query attention: K and V have Hkv heads and the matmuls broadcast them over the H
// query heads; dK and dV are the H-head products summed over each group (a reduction).
//
// Two forms of the mask, tried in order where a cuDNN build refuses one: generated indices
// as int32 and the stats subtracted before the mask (cuDNN's front end since 1.x), or as
// fp32 with the mask first (its 8.9 samples).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "backend/cudnn/cudnn_graph.h"

namespace llmtrain::cudnn {

enum class MaskForm { int32_indices, float_indices };
inline constexpr MaskForm kMaskForms[] = {MaskForm::int32_indices, MaskForm::float_indices};
const char* mask_form_name(MaskForm form);

// The unique ids the graphs bind (the variant packs of attention_forward / _backward).
enum AttentionUid : int64_t {
    kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidMaskFill, kUidDO, kUidDQ, kUidDK, kUidDV, kUidSoftmaxSum, kUidOne
};

// The graphs, finalized on `handle`; io is kBFloat16 or kHalf.
std::unique_ptr<Graph> forward_graph(const Library& library, Handle handle, const AttentionShape& shape, Enum io, MaskForm form);
std::unique_ptr<Graph> backward_graph(const Library& library, Handle handle, const AttentionShape& shape, Enum io, MaskForm form);

// The value the mask writes into masked scores (by value, as the graph's kUidMaskFill).
float mask_fill_value(MaskForm form);

}  // namespace llmtrain::cudnn
