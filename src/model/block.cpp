// The parts of a transformer layer (block.h): their parameters, activations, forward and backward.
#include "model/block.h"

#include <numeric>

namespace llmtrain {

namespace {
constexpr TensorSplit kCols{TpSplit::cols, 1};

// Hugging Face GPT-2: LayerNorm, learned positions, biases everywhere, a GELU MLP. HF stores
// its Linear weights as Conv1D [in, out]; ours are [out, in] like torch.nn.Linear, so an
// export transposes them.
BlockSpec gpt2_block() {
    BlockSpec b;
    b.names = {.embedding = "transformer.wte", .positions = "transformer.wpe", .layers = "transformer.h.", .final_norm = "transformer.ln_f",
               .head = "lm_head", .norm1 = "ln_1", .norm2 = "ln_2", .attention_out = "attn.c_proj", .mlp_down = "mlp.c_proj",
               .qkv = {"attn.c_attn"}, .mlp_up = {"mlp.c_fc"}};
    return b;
}

// Hugging Face Llama / Qwen2: RMSNorm, RoPE, no biases but Qwen2's on q, k and v, SwiGLU. q, k,
// v (and gate, up) are registered back to back so that each group is also one fused matrix
// for a single GEMM.
BlockSpec llama_block(const ModelConfig& config) {
    BlockSpec b;
    b.norm = NormKind::rms_norm;
    b.positions = PositionScheme::rotary;
    b.qkv_bias = config.qkv_bias;
    b.out_bias = b.mlp_bias = false;
    b.mlp = MlpKind::swiglu;
    b.names = {.embedding = "model.embed_tokens", .positions = "", .layers = "model.layers.", .final_norm = "model.norm", .head = "lm_head",
               .norm1 = "input_layernorm", .norm2 = "post_attention_layernorm", .attention_out = "self_attn.o_proj", .mlp_down = "mlp.down_proj",
               .qkv = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, .mlp_up = {"mlp.gate_proj", "mlp.up_proj"}};
    return b;
}

std::vector<std::string> in_layer(const ParamNames& names, int64_t layer, const std::vector<std::string>& parts) {
    std::vector<std::string> out;
    for (const std::string& part : parts) out.push_back(names.in_layer(layer, part));
    return out;
}
}  // namespace

BlockSpec block_spec(const ModelConfig& config) { return config.family == ModelFamily::llama ? llama_block(config) : gpt2_block(); }

ParamSpan ParamAdder::add(const std::string& name, Shape shape, ParamInit init, bool decay, TensorSplit split) {
    const size_t index = params_.add(name, shape, init, decay, split);
    return {index, index, true};
}

ParamSpan ParamAdder::add_norm(const std::string& name, int64_t width, ParamInit init) { return add_per_token(name, {width}, init, false); }

ParamSpan ParamAdder::add_per_token(const std::string& name, Shape shape, ParamInit init, bool decay) {
    const ParamSpan p = add(name, std::move(shape), init, decay);
    if (sp_) params_.mark_grad_partial_over_tp(p.first);
    return p;
}

ParamSpan ParamAdder::add_row_blocks(const std::vector<std::string>& names, const std::string& suffix, const std::vector<int64_t>& block_rows,
                                     int64_t cols, ParamInit init) {
    const bool decay = cols > 0;
    const auto shape = [cols](int64_t rows) { return cols > 0 ? Shape{rows, cols} : Shape{rows}; };
    if (names.size() == 1) {
        const int64_t rows = std::accumulate(block_rows.begin(), block_rows.end(), int64_t{0});
        return add(names.front() + suffix, shape(rows), init, decay, {TpSplit::rows, static_cast<int64_t>(block_rows.size())});
    }
    if (names.empty() || names.size() != block_rows.size())
        fail(ErrorKind::runtime, names.size(), " parameter names for ", block_rows.size(), " blocks of rows");
    ParamSpan span;
    for (size_t i = 0; i < names.size(); ++i) {
        const ParamSpan p = add(names[i] + suffix, shape(block_rows[i]), init, decay, {TpSplit::rows, 1});
        span = {i == 0 ? p.first : span.first, p.last, true};
    }
    return span;
}

// ---- Norm ----

void Norm::register_params(ParamAdder& params, const std::string& name, int64_t width) {
    weight_ = params.add_norm(name + ".weight", width, ParamInit::ones);
    if (!rms()) bias_ = params.add_norm(name + ".bias", width, ParamInit::zeros);
}

NormSlots Norm::reserve(const SlotPlanner& plan, const std::string& prefix, int64_t width) const {
    NormSlots s;
    s.out = plan.arena.reserve(prefix + ".out", plan.dtype, {plan.local_rows, width});
    // RMSNorm has no mean; the slot is reserved anyway (one row of N values) to keep one layout.
    s.mean = plan.arena.reserve(prefix + ".mean", plan.stat_dtype, {plan.local_rows});
    s.rstd = plan.arena.reserve(prefix + ".rstd", plan.stat_dtype, {plan.local_rows});
    return s;
}

void Norm::forward(LayerOps& ops, const NormSlots& s, const Tensor& x) const {
    if (rms()) return ops.backend().rmsnorm_fwd({.out = ops.local_rows(s.out), .rstd = ops.local_rows(s.rstd), .x = x, .w = ops.value(weight_), .eps = eps_});
    ops.backend().layernorm_fwd({.out = ops.local_rows(s.out), .mean = ops.local_rows(s.mean), .rstd = ops.local_rows(s.rstd), .x = x,
                                 .w = ops.value(weight_), .b = ops.value(bias_), .eps = eps_});
}

void Norm::add_forward(LayerOps& ops, const NormSlots& s, const AddFwd& args) const {
    ops.backend().add_norm_fwd({.sum = args.sum, .out = ops.local_rows(s.out), .mean = rms() ? Tensor() : ops.local_rows(s.mean),
                                .rstd = ops.local_rows(s.rstd), .a = args.a, .b = args.b, .w = ops.value(weight_), .bias = ops.value(bias_),
                                .eps = eps_, .rms = rms()});
}

void Norm::backward(LayerOps& ops, const NormSlots& s, const Grad& args) const {
    if (rms())
        return ops.backend().rmsnorm_bwd({.dx = args.dx, .dw = ops.grad(weight_), .dout = args.dout, .x = args.x, .w = ops.value(weight_),
                                          .rstd = ops.local_rows(s.rstd), .accumulate_dx = args.accumulate_dx});
    ops.backend().layernorm_bwd({.dx = args.dx, .dw = ops.grad(weight_), .db = ops.grad(bias_), .dout = args.dout, .x = args.x, .w = ops.value(weight_),
                                 .mean = ops.local_rows(s.mean), .rstd = ops.local_rows(s.rstd), .accumulate_dx = args.accumulate_dx});
}

// ---- Attention ----

// q, k and v are blocks of rows split by heads across tp (GPT-2's one c_attn tensor of three
// blocks, or Llama's three tensors); the output projection is split by its columns.
void Attention::register_params(ParamAdder& params, const ParamNames& names, int64_t layer) {
    const int64_t C = shape_.d_model;
    const std::vector<std::string> qkv = in_layer(names, layer, names.qkv);
    const std::vector<int64_t> blocks{q_width(), kv_width(), kv_width()};
    qkv_w_ = params.add_row_blocks(qkv, ".weight", blocks, C, ParamInit::normal);
    if (qkv_bias_) qkv_b_ = params.add_row_blocks(qkv, ".bias", blocks, 0, ParamInit::zeros);
    const std::string out = names.in_layer(layer, names.attention_out);
    out_w_ = params.add(out + ".weight", {C, q_width()}, ParamInit::normal_residual, true, kCols);
    if (out_bias_) out_b_ = params.add(out + ".bias", {C}, ParamInit::zeros, false);
}

AttentionSlots Attention::reserve(const SlotPlanner& plan, const std::string& prefix, Shape saved) const {
    AttentionSlots s;
    s.qkv = plan.arena.reserve(prefix + ".qkv", plan.dtype, {plan.rows, local_qkv_width()});
    s.saved = plan.arena.reserve(prefix + ".att_saved", plan.stat_dtype, saved);
    s.out = plan.arena.reserve(prefix + ".att_out", plan.dtype, {plan.rows, local_out_width()});
    return s;
}

AttentionScratch Attention::reserve_scratch(const SlotPlanner& plan) const {
    AttentionScratch g;
    g.d_out = plan.arena.reserve("grad.att_out", plan.dtype, {plan.rows, local_out_width()});
    g.d_qkv = plan.arena.reserve("grad.qkv", plan.dtype, {plan.rows, local_qkv_width()});
    return g;
}

void Attention::project_qkv(LayerOps& ops, const AttentionSlots& s, const Tensor& x_local) const {
    const Tensor qkv = ops.rows(s.qkv);
    ops.column_parallel(x_local, [&](const Tensor& in, int64_t first, int64_t row_block) {
        ops.linear_fwd(qkv_w_, {.out = qkv.slice_rows(first, in.dim(0)), .x = in, .w = ops.value(qkv_w_), .bias = ops.value(qkv_b_), .row_block = row_block});
    });
}

// q and k heads are adjacent in the packed QKV rows (or their gradient): one rotation covers both.
Rope Attention::rotation(Rope rope, const Tensor& rows) const {
    rope.x = rows;
    rope.n_heads = shape_.local_heads + shape_.local_kv_heads;
    rope.head_dim = shape_.head_dim;
    return rope;
}

void Attention::rotate(LayerOps& ops, const AttentionSlots& s, const Rope& positions) const {
    if (rotary_) ops.backend().rope_fwd(rotation(positions, ops.rows(s.qkv)));
}

Tensor Attention::project_out(LayerOps& ops, const AttentionSlots& s) const {
    const Tensor att = ops.rows(s.out);
    return ops.row_parallel([&](const Tensor& out, int64_t first, int64_t row_block) {
        ops.linear_fwd(out_w_, {.out = out, .x = att.slice_rows(first, out.dim(0)), .w = ops.value(out_w_), .bias = ops.row_parallel_bias(out_b_),
                                .row_block = row_block});
    });
}

void Attention::project_out_bwd(LayerOps& ops, const AttentionSlots& s, const AttentionScratch& g, const Tensor& d_local) const {
    ops.linear_bwd(out_w_, {.dx = ops.rows(g.d_out), .dw = ops.grad(out_w_), .dbias = ops.grad(out_b_), .dout = ops.gather_output_grad(d_local),
                            .x = ops.rows(s.out), .w = ops.value(out_w_)});
}

void Attention::rotate_bwd(LayerOps& ops, const AttentionScratch& g, const Rope& positions) const {
    if (rotary_) ops.backend().rope_bwd(rotation(positions, ops.rows(g.d_qkv)));
}

Tensor Attention::project_qkv_bwd(LayerOps& ops, const AttentionScratch& g, const Tensor& x_local, const Tensor& d_in) const {
    return ops.column_parallel_bwd({.dx = d_in, .dw = ops.grad(qkv_w_), .dbias = ops.grad(qkv_b_), .dout = ops.rows(g.d_qkv), .x = Tensor(),
                                    .w = ops.value(qkv_w_)},
                                   x_local, qkv_w_);
}

// ---- Dense MLPs ----

namespace {

// out = down(act(up(x))): up column-parallel (each tp rank its d_ff / tp hidden units), down
// row-parallel. The activation and how up's output feeds it are the subclass's.
class DenseMlp : public MlpPart {
public:
    // up_blocks: the up projection's blocks of d_ff rows (GELU: one; SwiGLU: gate and up).
    DenseMlp(Widths shape, bool bias, int64_t up_blocks) : shape_(shape), bias_(bias), up_blocks_(up_blocks) {}

    void register_params(ParamAdder& params, const ParamNames& names, int64_t layer) override {
        const int64_t C = shape_.d_model, F = shape_.d_ff;
        const std::vector<std::string> up = in_layer(names, layer, names.mlp_up);
        const std::vector<int64_t> blocks(static_cast<size_t>(up_blocks_), F);
        up_w_ = params.add_row_blocks(up, ".weight", blocks, C, ParamInit::normal);
        if (bias_) up_b_ = params.add_row_blocks(up, ".bias", blocks, 0, ParamInit::zeros);
        const std::string down = names.in_layer(layer, names.mlp_down);
        down_w_ = params.add(down + ".weight", {C, F}, ParamInit::normal_residual, true, kCols);
        if (bias_) down_b_ = params.add(down + ".bias", {C}, ParamInit::zeros, false);
    }
    MlpSlots reserve(const SlotPlanner& plan, const std::string& prefix, const MlpSlots* shared) const override {
        MlpSlots s;
        s.up = plan.arena.reserve(prefix + ".mlp_up", plan.dtype, {plan.rows, up_width()});
        s.act = shared ? shared->act : plan.arena.reserve(prefix + ".mlp_act", plan.dtype, {plan.rows, shape_.local_ff()});
        return s;
    }
    MlpSlots reserve_recomputed(const SlotPlanner& plan, const std::string& prefix) const override {
        return {.up = {}, .act = plan.arena.reserve(prefix + ".mlp_act", plan.dtype, {plan.rows, shape_.local_ff()})};
    }
    MlpScratch reserve_scratch(const SlotPlanner& plan) const override {
        MlpScratch g;
        g.d_act = plan.arena.reserve("grad.mlp_act", plan.dtype, {plan.rows, shape_.local_ff()});
        g.d_up = plan.arena.reserve("grad.mlp_up", plan.dtype, {plan.rows, up_width()});
        return g;
    }

    Tensor forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const final {
        up_forward(ops, s, x_local);
        const Tensor act = ops.rows(s.act);
        return ops.row_parallel([&](const Tensor& out, int64_t first, int64_t row_block) {
            ops.linear_fwd(down_w_, {.out = out, .x = act.slice_rows(first, out.dim(0)), .w = ops.value(down_w_), .bias = ops.row_parallel_bias(down_b_),
                                     .row_block = row_block});
        });
    }
    Tensor backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_local, const Tensor& x_local,
                    const Tensor& d_in) const final {
        const Tensor up_dbias = down_backward(ops, s, g, ops.gather_output_grad(d_local));
        return ops.column_parallel_bwd({.dx = d_in, .dw = ops.grad(up_w_), .dbias = up_dbias, .dout = ops.rows(g.d_up), .x = Tensor(),
                                        .w = ops.value(up_w_)},
                                       x_local, up_w_);
    }
    std::vector<LinearWeight> linears() const final { return {{up_w_, true}, {down_w_, false}}; }

protected:
    int64_t up_width() const { return up_blocks_ * shape_.local_ff(); }
    // s.up and s.act from this rank's rows of x (the up projection is column-parallel).
    virtual void up_forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const = 0;
    // The down projection's and the activation's backward, from d(down's output) (whole rows),
    // into d(up's output) in g.d_up; returns where up's bias gradient goes (empty: done here).
    virtual Tensor down_backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_down) const = 0;
    Widths shape_;
    bool bias_;
    int64_t up_blocks_;
    ParamSpan up_w_, up_b_, down_w_, down_b_;
};

// GPT-2: act = gelu(up(x)), the GELU fused into up's matmul in forward and into down's
// backward (which also gives up's bias gradient).
class GeluMlp final : public DenseMlp {
public:
    GeluMlp(Widths shape, bool bias) : DenseMlp(shape, bias, 1) {}
    void recompute(LayerOps& ops, const MlpSlots& s) const override { ops.backend().gelu_fwd(ops.rows(s.act), ops.rows(s.up)); }

private:
    void up_forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const override {
        const Tensor up = ops.rows(s.up), act = ops.rows(s.act);
        ops.column_parallel(x_local, [&](const Tensor& in, int64_t first, int64_t row_block) {
            const int64_t count = in.dim(0);
            ops.linear_gelu_fwd(up_w_, {.act = act.slice_rows(first, count), .pre = up.slice_rows(first, count), .x = in, .w = ops.value(up_w_),
                                        .bias = ops.value(up_b_), .row_block = row_block});
        });
    }
    Tensor down_backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_down) const override {
        ops.gelu_linear_bwd(down_w_, {.d_pre = ops.rows(g.d_up), .d_pre_bias = ops.grad(up_b_), .dw = ops.grad(down_w_), .dbias = ops.grad(down_b_),
                                       .dout = d_down, .act = ops.rows(s.act), .pre = ops.rows(s.up), .w = ops.value(down_w_)});
        return Tensor();
    }
};

// Llama: up's output is [gate | up] (2 d_ff / tp columns), act = silu(gate) * up.
class SwigluMlp final : public DenseMlp {
public:
    SwigluMlp(Widths shape, bool bias) : DenseMlp(shape, bias, 2) {}
    void recompute(LayerOps& ops, const MlpSlots& s) const override { ops.backend().swiglu_fwd(ops.rows(s.act), ops.rows(s.up)); }

private:
    void up_forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const override {
        const Tensor up = ops.rows(s.up);
        ops.column_parallel(x_local, [&](const Tensor& in, int64_t first, int64_t row_block) {
            ops.linear_fwd(up_w_, {.out = up.slice_rows(first, in.dim(0)), .x = in, .w = ops.value(up_w_), .bias = ops.value(up_b_), .row_block = row_block});
        });
        ops.backend().swiglu_fwd(ops.rows(s.act), up);
    }
    Tensor down_backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_down) const override {
        ops.linear_bwd(down_w_, {.dx = ops.rows(g.d_act), .dw = ops.grad(down_w_), .dbias = ops.grad(down_b_), .dout = d_down, .x = ops.rows(s.act),
                                 .w = ops.value(down_w_)});
        ops.backend().swiglu_bwd(ops.rows(g.d_up), ops.rows(g.d_act), ops.rows(s.up));
        return ops.grad(up_b_);
    }
};

}  // namespace

std::unique_ptr<MlpPart> make_mlp(const BlockSpec& spec, MlpPart::Widths shape) {
    if (spec.mlp == MlpKind::swiglu) return std::make_unique<SwigluMlp>(shape, spec.mlp_bias);
    return std::make_unique<GeluMlp>(shape, spec.mlp_bias);
}

}  // namespace llmtrain
