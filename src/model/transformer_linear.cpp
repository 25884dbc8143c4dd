// The seam every linear layer of the blocks goes through (LayerOps::linear_fwd and its kin):
// an FP8 linear (model/fp8_linear.h) where train.precision = "fp8" casts the layer, the
// backend's matmul otherwise. Without FP8 each call is the backend's op with the same
// arguments as before the seam: dense runs are bitwise unchanged.
#include "model/transformer.h"

namespace llmtrain {

// The layers [bf16_first_layers, n_layers - bf16_last_layers) run their linears in FP8
// (Megatron's first_last_layers_bf16): the first and last layers are the most sensitive to
// the rounding. A layer of experts lists no linears and stays in the compute dtype.
std::vector<LinearWeight> TransformerLayout::fp8_linears() const {
    std::vector<LinearWeight> linears;
    if (!part_.fp8) return linears;
    const std::vector<int64_t> held = global_layers();
    const int64_t first = part_.fp8->bf16_first_layers, end = config_.n_layers - part_.fp8->bf16_last_layers;
    for (size_t i = 0; i < layers_.size(); ++i) {
        if (held[i] < first || held[i] >= end) continue;
        for (const LinearWeight& l : layers_[i].attention.linears()) linears.push_back(l);
        for (const LinearWeight& l : layers_[i].mlp->linears()) linears.push_back(l);
    }
    return linears;
}

// A linear's weight parameters lie one after the other in the flat buffer (the fused QKV).
std::vector<FlatRange> TransformerLayout::fp8_weight_ranges() const {
    std::vector<FlatRange> ranges;
    for (const LinearWeight& l : fp8_linears()) {
        const ParamInfo& last = params_.info(l.w.last);
        ranges.push_back({params_.info(l.w.first).offset, last.offset + last.shape.numel()});
    }
    return ranges;
}

std::vector<Fp8LinearShape> TransformerLayout::fp8_linear_shapes() const {
    std::vector<Fp8LinearShape> shapes;
    for (const LinearWeight& l : fp8_linears()) {
        int64_t rows = 0;
        for (size_t p = l.w.first; p <= l.w.last; ++p) rows += params_.info(p).shape.dims[0];
        shapes.push_back({rows, params_.info(l.w.first).shape.dims[1]});
    }
    return shapes;
}

size_t TransformerLayout::fp8_bytes() const {
    return part_.fp8 ? fp8_buffers(fp8_linear_shapes(), max_batch_ * max_seq_len_, fp8_weights_gathered()).total() : 0;
}

void Transformer::plan_fp8() {
    if (!part_.fp8) return;
    fp8_ = std::make_unique<Fp8Linears>(*part_.fp8, backend_, dtype_, Fp8Linears::Groups{.tp = tp_, .cp = cp_});
    const std::vector<LinearWeight> linears = fp8_linears();
    const std::vector<Fp8LinearShape> shapes = fp8_linear_shapes();
    for (size_t i = 0; i < linears.size(); ++i) {
        const LinearWeight& l = linears[i];
        fp8_ids_[l.w.first] = fp8_->add(shapes[i].out_features, shapes[i].in_features, l.column_parallel ? LinearSplit::column_parallel : LinearSplit::row_parallel,
                                        params_.info(l.w.first).name);
    }
    // fp8.param_gather where ZeRO-3 binds the values per group (parallel/fully_sharded.h).
    if (fp8_weights_gathered()) fp8_->gather_weights_in_fp8();
    fp8_->allocate(max_batch_ * max_seq_len_);
}

int Transformer::fp8_linear(ParamSpan w) const {
    if (!w.present) return -1;
    const auto it = fp8_ids_.find(w.first);
    return it == fp8_ids_.end() ? -1 : it->second;
}

void Transformer::linear_fwd(ParamSpan w, const MatmulFwd& args) {
    const int id = fp8_linear(w);
    if (id < 0) return backend_.matmul_fwd(args);
    fp8_->forward(id, args);
}

void Transformer::linear_bwd(ParamSpan w, const MatmulBwd& args) {
    const int id = fp8_linear(w);
    if (id < 0) return backend_.matmul_bwd(args);
    fp8_->backward(id, args);
}

// The GELU MLP's fused forms, composed as Backend's defaults compose them around an FP8 GEMM.
void Transformer::linear_gelu_fwd(ParamSpan w, const MatmulGeluFwd& args) {
    const int id = fp8_linear(w);
    if (id < 0) return backend_.matmul_gelu_fwd(args);
    fp8_->forward(id, {.out = args.pre, .x = args.x, .w = args.w, .bias = args.bias, .row_block = args.row_block});
    backend_.gelu_fwd(args.act, args.pre);
}

void Transformer::gelu_linear_bwd(ParamSpan w, const GeluMatmulBwd& args) {
    const int id = fp8_linear(w);
    if (id < 0) return backend_.gelu_matmul_bwd(args);
    fp8_->backward(id, {.dx = args.d_pre, .dw = args.dw, .dbias = args.dbias, .dout = args.dout, .x = args.act, .w = args.w});
    backend_.gelu_bwd(args.d_pre, args.d_pre, args.pre);
    if (!args.d_pre_bias.empty()) add_column_sums(backend_, args.d_pre_bias, args.d_pre);
}

}  // namespace llmtrain
