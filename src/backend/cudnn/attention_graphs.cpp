#include "backend/cudnn/attention_graphs.h"

#include <limits>

#include "core/error.h"

namespace llmtrain::cudnn {

namespace {

using Dims = std::array<int64_t, 4>;

// The strides of the tensors every graph reads (see the header).
struct Layout {
    int64_t B, T, H, Hkv, D, W;
    explicit Layout(const AttentionShape& s)
        : B(s.batch), T(s.seq_len), H(s.n_heads), Hkv(s.n_kv_heads), D(s.head_dim), W(s.qkv_width()) {}
    Dims heads(int64_t n) const { return {B, n, T, D}; }
    Dims packed() const { return {T * W, D, W, 1}; }                 // Q, K, V and their gradients
    Dims packed_transposed() const { return {T * W, D, 1, W}; }      // K^T, V^T: [B, heads, D, T]
    Dims transposed_heads(int64_t n) const { return {B, n, D, T}; }
    Dims out() const { return {T * H * D, D, H * D, 1}; }            // O, dO
    Dims scores() const { return {B, H, T, T}; }
    Dims score_strides() const { return {H * T * T, T * T, T, 1}; }
    Dims score_strides_transposed() const { return {H * T * T, T * T, 1, T}; }
    Dims rows() const { return {B, H, T, 1}; }
    Dims row_strides() const { return {H * T, T, 1, 1}; }
};

// S with the causal mask applied: score[r, c] kept where r >= c, else the fill value.
GraphTensor causal_mask(Graph& g, const Layout& l, const GraphTensor& scores, const GraphTensor& fill, MaskForm form) {
    const Enum index = form == MaskForm::int32_indices ? kInt32 : kFloat;
    const GraphTensor row = g.virtual_tensor(index, l.scores(), l.score_strides());
    const GraphTensor col = g.virtual_tensor(index, l.scores(), l.score_strides());
    const GraphTensor keep = g.virtual_tensor(kBoolean, l.scores(), l.score_strides());
    const GraphTensor masked = g.virtual_tensor(kFloat, l.scores(), l.score_strides());
    g.pointwise(kGenIndex, index, scores, nullptr, nullptr, row, 2);
    g.pointwise(kGenIndex, index, scores, nullptr, nullptr, col, 3);
    g.pointwise(kCmpGe, kBoolean, row, &col, nullptr, keep);
    g.pointwise(kBinarySelect, kFloat, scores, &fill, &keep, masked);
    return masked;
}

// y = op(a, b) in fp32 into a new virtual tensor of the given shape.
GraphTensor binary(Graph& g, Enum op, const GraphTensor& a, const GraphTensor& b, Dims dims, Dims strides, Enum dtype = kFloat) {
    const GraphTensor y = g.virtual_tensor(dtype, dims, strides);
    g.pointwise(op, kFloat, a, &b, nullptr, y);
    return y;
}

GraphTensor unary(Graph& g, Enum op, const GraphTensor& x, Dims dims, Dims strides) {
    const GraphTensor y = g.virtual_tensor(kFloat, dims, strides);
    g.pointwise(op, kFloat, x, nullptr, nullptr, y);
    return y;
}

// Scores scale Q K^T as fp32.
GraphTensor scaled_scores(Graph& g, const Layout& l, const GraphTensor& q, const GraphTensor& kt, const GraphTensor& scale) {
    const GraphTensor s = g.virtual_tensor(kFloat, l.scores(), l.score_strides());
    g.matmul(q, kt, s);
    return binary(g, kMul, s, scale, l.scores(), l.score_strides());
}

// dst = src^T A over the H query heads; with fewer kv heads the H-head product is summed
// over each group of H / Hkv heads into dst.
void head_grouped_matmul(Graph& g, const Layout& l, const GraphTensor& a_transposed, const GraphTensor& b, const GraphTensor& dst, Enum io) {
    if (l.H == l.Hkv) return g.matmul(a_transposed, b, dst);
    const GraphTensor full = g.virtual_tensor(io, l.heads(l.H), {l.H * l.T * l.D, l.T * l.D, l.D, 1});
    g.matmul(a_transposed, b, full);
    g.reduction(kReduceAdd, full, dst);
}

}  // namespace

const char* mask_form_name(MaskForm form) { return form == MaskForm::int32_indices ? "int32 indices" : "fp32 indices"; }

float mask_fill_value(MaskForm form) { return form == MaskForm::int32_indices ? std::numeric_limits<float>::lowest() : -1.0e10f; }

std::unique_ptr<Graph> forward_graph(const Library& library, Handle handle, const AttentionShape& shape, Enum io, MaskForm form) {
    const Layout l(shape);
    auto g = std::make_unique<Graph>(library, cat("cuDNN attention forward (", mask_form_name(form), ")"));
    const GraphTensor q = g->tensor(kUidQ, io, l.heads(l.H), l.packed());
    const GraphTensor kt = g->tensor(kUidK, io, l.transposed_heads(l.Hkv), l.packed_transposed());
    const GraphTensor v = g->tensor(kUidV, io, l.heads(l.Hkv), l.packed());
    const GraphTensor o = g->tensor(kUidO, io, l.heads(l.H), l.out());
    const GraphTensor stats = g->tensor(kUidStats, kFloat, l.rows(), l.row_strides());
    const GraphTensor scale = g->scalar(kUidScale, kFloat);
    const GraphTensor fill = g->scalar(kUidMaskFill, kFloat);

    const GraphTensor s = causal_mask(*g, l, scaled_scores(*g, l, q, kt, scale), fill, form);
    // The softmax and its statistics: stats = m + log(sum exp(S - m)).
    const GraphTensor m = g->virtual_tensor(kFloat, l.rows(), l.row_strides());
    g->reduction(kReduceMax, s, m);
    const GraphTensor e = unary(*g, kExp, binary(*g, kSub, s, m, l.scores(), l.score_strides()), l.scores(), l.score_strides());
    const GraphTensor sum = g->virtual_tensor(kFloat, l.rows(), l.row_strides());
    g->reduction(kReduceAdd, e, sum);
    const GraphTensor log_sum = unary(*g, kLog, sum, l.rows(), l.row_strides());
    g->pointwise(kAdd, kFloat, m, &log_sum, nullptr, stats);
    // The probabilities enter the second matmul in the io type, as the engines require.
    const GraphTensor p = binary(*g, kDiv, e, sum, l.scores(), l.score_strides(), io);
    g->matmul(p, v, o);
    g->finalize(handle);
    return g;
}

std::unique_ptr<Graph> backward_graph(const Library& library, Handle handle, const AttentionShape& shape, Enum io, MaskForm form) {
    const Layout l(shape);
    auto g = std::make_unique<Graph>(library, cat("cuDNN attention backward (", mask_form_name(form), ")"));
    const GraphTensor q = g->tensor(kUidQ, io, l.heads(l.H), l.packed());
    const GraphTensor kt = g->tensor(kUidK, io, l.transposed_heads(l.Hkv), l.packed_transposed());
    const GraphTensor vt = g->tensor(kUidV, io, l.transposed_heads(l.Hkv), l.packed_transposed());
    const GraphTensor o = g->tensor(kUidO, io, l.heads(l.H), l.out());
    const GraphTensor d_o = g->tensor(kUidDO, io, l.heads(l.H), l.out());
    const GraphTensor stats = g->tensor(kUidStats, kFloat, l.rows(), l.row_strides());
    const GraphTensor dq = g->tensor(kUidDQ, io, l.heads(l.H), l.packed());
    const GraphTensor dk = g->tensor(kUidDK, io, l.heads(l.Hkv), l.packed());
    const GraphTensor dv = g->tensor(kUidDV, io, l.heads(l.Hkv), l.packed());
    // Delta = rowsum(dO * O), kept in the workspace (the engine reads it per query tile).
    const GraphTensor delta = g->tensor(kUidSoftmaxSum, kFloat, l.rows(), l.row_strides());
    const GraphTensor scale = g->scalar(kUidScale, kFloat);
    const GraphTensor fill = g->scalar(kUidMaskFill, kFloat);
    const GraphTensor one = g->scalar(kUidOne, kFloat);

    const GraphTensor product = binary(*g, kMul, d_o, o, l.heads(l.H), {l.H * l.T * l.D, l.T * l.D, l.H * l.D, 1});
    const GraphTensor row_sum = g->virtual_tensor(kFloat, l.rows(), l.row_strides());
    g->reduction(kReduceAdd, product, row_sum);
    g->pointwise(kMul, kFloat, row_sum, &one, nullptr, delta);

    // P = exp(S - stats) with the mask, recomputed from Q and K.
    const GraphTensor s = scaled_scores(*g, l, q, kt, scale);
    GraphTensor shifted;
    if (form == MaskForm::int32_indices) {
        shifted = causal_mask(*g, l, binary(*g, kSub, s, stats, l.scores(), l.score_strides()), fill, form);
    } else {
        shifted = binary(*g, kSub, causal_mask(*g, l, s, fill, form), stats, l.scores(), l.score_strides());
    }
    const GraphTensor p = unary(*g, kExp, shifted, l.scores(), l.score_strides());

    // dV = P^T dO
    const GraphTensor pt = g->virtual_tensor(io, l.scores(), l.score_strides_transposed());
    g->reshape(p, pt);
    head_grouped_matmul(*g, l, pt, d_o, dv, io);

    // dS = scale P (dO V^T - Delta)
    const GraphTensor dp = g->virtual_tensor(kFloat, l.scores(), l.score_strides());
    g->matmul(d_o, vt, dp);
    const GraphTensor centered = binary(*g, kSub, dp, delta, l.scores(), l.score_strides());
    const GraphTensor weighted = binary(*g, kMul, centered, p, l.scores(), l.score_strides());
    const GraphTensor ds = binary(*g, kMul, weighted, scale, l.scores(), l.score_strides());

    // dK = dS^T Q
    const GraphTensor dst = g->virtual_tensor(io, l.scores(), l.score_strides_transposed());
    g->reshape(ds, dst);
    head_grouped_matmul(*g, l, dst, q, dk, io);

    // dQ = dS K, written directly in the io type.
    const GraphTensor k = g->virtual_tensor(io, l.heads(l.Hkv), l.packed());
    g->reshape(kt, k);
    g->matmul(ds, k, dq);
    g->finalize(handle);
    return g;
}

}  // namespace llmtrain::cudnn
