#include "model/transformer.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace llmtrain {

namespace {
std::string layer_name(const char* prefix, int64_t layer, const char* suffix) { return cat(prefix, layer, '.', suffix); }

double sum_as_double(const Tensor& t) {
    double total = 0;
    if (t.dtype() == DType::f32)
        for (int64_t i = 0; i < t.numel(); ++i) total += t.data<float>()[i];
    else
        for (int64_t i = 0; i < t.numel(); ++i) total += t.data<double>()[i];
    return total;
}
}  // namespace

Transformer::Transformer(const ModelConfig& config, Backend& backend, DType dtype, int64_t max_batch, int64_t max_seq_len)
    : config_(config), backend_(backend), dtype_(dtype), max_batch_(max_batch), max_seq_len_(max_seq_len) {
    if (max_seq_len > config.max_seq_len)
        fail(ErrorKind::config, "sequence length ", max_seq_len, " exceeds model.max_seq_len = ", config.max_seq_len);
    if (is_llama()) register_llama_params();
    else register_gpt2_params();
    params_.allocate(dtype);
    plan_activations();
    arena_.allocate();
    if (is_llama()) fill_rope_table(arena_.tensor(rope_table_), config_.rope_theta);
}

Transformer::ParamSpan Transformer::add(const std::string& name, Shape shape, ParamInit init, bool decay) {
    const size_t index = params_.add(name, shape, init, decay);
    return {index, index, true};
}

// Names follow Hugging Face GPT-2. Note: HF stores these Linear weights as Conv1D [in, out];
// ours are [out, in] like torch.nn.Linear, so an export transposes them.
void Transformer::register_gpt2_params() {
    const int64_t C = config_.d_model, F = config_.d_ff, V = config_.vocab_size;
    wte_ = add("transformer.wte.weight", {V, C}, ParamInit::normal, true);
    wpe_ = add("transformer.wpe.weight", {config_.max_seq_len, C}, ParamInit::normal, true);
    const char* h = "transformer.h.";
    for (int64_t l = 0; l < config_.n_layers; ++l) {
        LayerParams p;
        p.norm1_w = add(layer_name(h, l, "ln_1.weight"), {C}, ParamInit::ones, false);
        p.norm1_b = add(layer_name(h, l, "ln_1.bias"), {C}, ParamInit::zeros, false);
        p.qkv_w = add(layer_name(h, l, "attn.c_attn.weight"), {3 * C, C}, ParamInit::normal, true);
        p.qkv_b = add(layer_name(h, l, "attn.c_attn.bias"), {3 * C}, ParamInit::zeros, false);
        p.attn_out_w = add(layer_name(h, l, "attn.c_proj.weight"), {C, C}, ParamInit::normal_residual, true);
        p.attn_out_b = add(layer_name(h, l, "attn.c_proj.bias"), {C}, ParamInit::zeros, false);
        p.norm2_w = add(layer_name(h, l, "ln_2.weight"), {C}, ParamInit::ones, false);
        p.norm2_b = add(layer_name(h, l, "ln_2.bias"), {C}, ParamInit::zeros, false);
        p.mlp_up_w = add(layer_name(h, l, "mlp.c_fc.weight"), {F, C}, ParamInit::normal, true);
        p.mlp_up_b = add(layer_name(h, l, "mlp.c_fc.bias"), {F}, ParamInit::zeros, false);
        p.mlp_down_w = add(layer_name(h, l, "mlp.c_proj.weight"), {C, F}, ParamInit::normal_residual, true);
        p.mlp_down_b = add(layer_name(h, l, "mlp.c_proj.bias"), {C}, ParamInit::zeros, false);
        layer_params_.push_back(p);
    }
    norm_f_w_ = add("transformer.ln_f.weight", {C}, ParamInit::ones, false);
    norm_f_b_ = add("transformer.ln_f.bias", {C}, ParamInit::zeros, false);
    head_w_ = config_.tied_embeddings ? wte_ : add("lm_head.weight", {V, C}, ParamInit::normal, true);
}

// Names follow Hugging Face Llama / Qwen2. q, k, v (and gate, up) are registered back to
// back so that each group is also one fused matrix for a single GEMM.
void Transformer::register_llama_params() {
    const int64_t C = config_.d_model, F = config_.d_ff, V = config_.vocab_size, D = config_.head_dim();
    const int64_t q_width = config_.n_heads * D, kv_width = config_.n_kv_heads * D;
    wte_ = add("model.embed_tokens.weight", {V, C}, ParamInit::normal, true);
    const char* m = "model.layers.";
    for (int64_t l = 0; l < config_.n_layers; ++l) {
        LayerParams p;
        p.norm1_w = add(layer_name(m, l, "input_layernorm.weight"), {C}, ParamInit::ones, false);
        const ParamSpan q = add(layer_name(m, l, "self_attn.q_proj.weight"), {q_width, C}, ParamInit::normal, true);
        add(layer_name(m, l, "self_attn.k_proj.weight"), {kv_width, C}, ParamInit::normal, true);
        const ParamSpan v = add(layer_name(m, l, "self_attn.v_proj.weight"), {kv_width, C}, ParamInit::normal, true);
        p.qkv_w = join(q, v);
        if (config_.qkv_bias) {
            const ParamSpan qb = add(layer_name(m, l, "self_attn.q_proj.bias"), {q_width}, ParamInit::zeros, false);
            add(layer_name(m, l, "self_attn.k_proj.bias"), {kv_width}, ParamInit::zeros, false);
            const ParamSpan vb = add(layer_name(m, l, "self_attn.v_proj.bias"), {kv_width}, ParamInit::zeros, false);
            p.qkv_b = join(qb, vb);
        }
        p.attn_out_w = add(layer_name(m, l, "self_attn.o_proj.weight"), {C, q_width}, ParamInit::normal_residual, true);
        p.norm2_w = add(layer_name(m, l, "post_attention_layernorm.weight"), {C}, ParamInit::ones, false);
        const ParamSpan gate = add(layer_name(m, l, "mlp.gate_proj.weight"), {F, C}, ParamInit::normal, true);
        const ParamSpan up = add(layer_name(m, l, "mlp.up_proj.weight"), {F, C}, ParamInit::normal, true);
        p.mlp_up_w = join(gate, up);
        p.mlp_down_w = add(layer_name(m, l, "mlp.down_proj.weight"), {C, F}, ParamInit::normal_residual, true);
        layer_params_.push_back(p);
    }
    norm_f_w_ = add("model.norm.weight", {C}, ParamInit::ones, false);
    head_w_ = config_.tied_embeddings ? wte_ : add("lm_head.weight", {V, C}, ParamInit::normal, true);
}

Transformer::NormSlots Transformer::reserve_norm(const std::string& prefix) {
    const int64_t N = max_batch_ * max_seq_len_;
    NormSlots s;
    s.out = arena_.reserve(prefix + ".out", dtype_, {N, config_.d_model});
    // RMSNorm has no mean; the slot is reserved anyway (one row of N values) to keep one layout.
    s.mean = arena_.reserve(prefix + ".mean", dtype_, {N});
    s.rstd = arena_.reserve(prefix + ".rstd", dtype_, {N});
    return s;
}

void Transformer::plan_activations() {
    const int64_t N = max_batch_ * max_seq_len_, C = config_.d_model, F = config_.d_ff;
    const int64_t up_width = is_llama() ? 2 * F : F;
    AttentionShape full{max_batch_, max_seq_len_, config_.n_heads, config_.n_kv_heads, config_.head_dim()};
    tokens_ = arena_.reserve("tokens", DType::i32, {N});
    targets_ = arena_.reserve("targets", DType::i32, {N});
    rope_table_ = arena_.reserve("rope_table", dtype_, {config_.max_seq_len, config_.head_dim()});
    for (int64_t l = 0; l <= config_.n_layers; ++l) residual_.push_back(arena_.reserve(cat("residual.", l), dtype_, {N, C}));
    for (int64_t l = 0; l < config_.n_layers; ++l) {
        const std::string p = cat("layer.", l);
        LayerSlots s;
        s.norm1 = reserve_norm(p + ".norm1");
        s.qkv = arena_.reserve(p + ".qkv", dtype_, {N, full.qkv_width()});
        s.att_saved = arena_.reserve(p + ".att_saved", dtype_, backend_.attention_saved_shape(full));
        s.att_out = arena_.reserve(p + ".att_out", dtype_, {N, full.out_width()});
        s.resid_mid = arena_.reserve(p + ".resid_mid", dtype_, {N, C});
        s.norm2 = reserve_norm(p + ".norm2");
        s.mlp_up = arena_.reserve(p + ".mlp_up", dtype_, {N, up_width});
        s.mlp_act = arena_.reserve(p + ".mlp_act", dtype_, {N, F});
        layer_slots_.push_back(s);
    }
    norm_f_ = reserve_norm("norm_f");
    logits_ = arena_.reserve("logits", dtype_, {N, config_.vocab_size});
    losses_ = arena_.reserve("losses", dtype_, {N});
    proj_out_ = arena_.reserve("proj_out", dtype_, {N, C});
    d_resid_ = arena_.reserve("grad.resid", dtype_, {N, C});
    d_tmp_ = arena_.reserve("grad.tmp", dtype_, {N, C});
    d_norm_ = arena_.reserve("grad.norm", dtype_, {N, C});
    d_att_out_ = arena_.reserve("grad.att_out", dtype_, {N, full.out_width()});
    d_qkv_ = arena_.reserve("grad.qkv", dtype_, {N, full.qkv_width()});
    d_mlp_act_ = arena_.reserve("grad.mlp_act", dtype_, {N, F});
    d_mlp_up_ = arena_.reserve("grad.mlp_up", dtype_, {N, up_width});
}

Tensor Transformer::rows(Arena::Slot slot) const { return arena_.tensor(slot).slice_rows(0, batch_ * seq_len_); }

Tensor Transformer::att_saved(Arena::Slot slot) const {
    // The saved shape for a smaller batch or sequence is a prefix of the planned one.
    const Tensor full = arena_.tensor(slot);
    const Shape shape = backend_.attention_saved_shape(attention_shape());
    return Tensor(full.raw(), full.dtype(), shape);
}

AttentionShape Transformer::attention_shape() const {
    return {batch_, seq_len_, config_.n_heads, config_.n_kv_heads, config_.head_dim()};
}

Tensor Transformer::logits() const { return rows(logits_); }

void Transformer::norm_fwd(const NormSlots& s, const Tensor& x, ParamSpan w, ParamSpan b) {
    if (is_llama()) backend_.rmsnorm_fwd(rows(s.out), rows(s.rstd), x, value(w), config_.norm_eps);
    else backend_.layernorm_fwd(rows(s.out), rows(s.mean), rows(s.rstd), x, value(w), value(b), config_.norm_eps);
}

void Transformer::norm_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x, const NormSlots& s, ParamSpan w, ParamSpan b) {
    if (is_llama()) backend_.rmsnorm_bwd(dx, grad(w), dout, x, value(w), rows(s.rstd));
    else backend_.layernorm_bwd(dx, grad(w), grad(b), dout, x, value(w), rows(s.mean), rows(s.rstd));
}

double Transformer::forward(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len) {
    if (batch < 1 || batch > max_batch_ || seq_len < 1 || seq_len > max_seq_len_)
        fail(ErrorKind::shape, "forward: batch ", batch, " x seq_len ", seq_len, " outside the planned ", max_batch_, " x ", max_seq_len_);
    batch_ = batch;
    seq_len_ = seq_len;
    const int64_t N = batch * seq_len;
    expect_shape("forward", "tokens", tokens, {N});
    expect_dtype("forward", "tokens", tokens, DType::i32);
    std::memcpy(rows(tokens_).raw(), tokens.raw(), tokens.bytes());
    has_targets_ = !targets.empty();
    if (has_targets_) {
        expect_shape("forward", "targets", targets, {N});
        expect_dtype("forward", "targets", targets, DType::i32);
        std::memcpy(rows(targets_).raw(), targets.raw(), targets.bytes());
    }

    backend_.embedding_fwd(rows(residual_[0]), rows(tokens_), value(wte_), value(wpe_), seq_len);
    for (int64_t l = 0; l < config_.n_layers; ++l) layer_fwd(l);
    norm_fwd(norm_f_, rows(residual_.back()), norm_f_w_, norm_f_b_);
    backend_.matmul_fwd(rows(logits_), rows(norm_f_.out), value(head_w_), Tensor());
    if (!has_targets_) return std::numeric_limits<double>::quiet_NaN();
    backend_.xent_fwd(rows(losses_), rows(logits_), rows(targets_));
    return sum_as_double(rows(losses_)) / static_cast<double>(N);
}

void Transformer::layer_fwd(int64_t l) {
    const LayerParams& p = layer_params_[static_cast<size_t>(l)];
    const LayerSlots& s = layer_slots_[static_cast<size_t>(l)];
    const AttentionShape shape = attention_shape();
    const Tensor x = rows(residual_[static_cast<size_t>(l)]);
    const Tensor proj = rows(proj_out_);

    norm_fwd(s.norm1, x, p.norm1_w, p.norm1_b);
    backend_.matmul_fwd(rows(s.qkv), rows(s.norm1.out), value(p.qkv_w), value(p.qkv_b));
    // q and k heads are adjacent in the packed QKV rows: one rotation covers both.
    if (is_llama()) backend_.rope_fwd(rows(s.qkv), arena_.tensor(rope_table_), seq_len_, shape.n_heads + shape.n_kv_heads, shape.head_dim);
    backend_.attention_fwd(rows(s.att_out), att_saved(s.att_saved), rows(s.qkv), shape);
    backend_.matmul_fwd(proj, rows(s.att_out), value(p.attn_out_w), value(p.attn_out_b));
    backend_.add(rows(s.resid_mid), x, proj);

    norm_fwd(s.norm2, rows(s.resid_mid), p.norm2_w, p.norm2_b);
    backend_.matmul_fwd(rows(s.mlp_up), rows(s.norm2.out), value(p.mlp_up_w), value(p.mlp_up_b));
    if (is_llama()) backend_.swiglu_fwd(rows(s.mlp_act), rows(s.mlp_up));
    else backend_.gelu_fwd(rows(s.mlp_act), rows(s.mlp_up));
    backend_.matmul_fwd(proj, rows(s.mlp_act), value(p.mlp_down_w), value(p.mlp_down_b));
    backend_.add(rows(residual_[static_cast<size_t>(l + 1)]), rows(s.resid_mid), proj);
}

void Transformer::backward(double loss_scale) {
    if (!has_targets_) fail(ErrorKind::runtime, "backward called after a forward without targets");
    const Tensor d_resid = rows(d_resid_), d_norm = rows(d_norm_);
    // d(mean loss)/d(loss_n) = 1 / N for every token.
    const double dloss = loss_scale / static_cast<double>(batch_ * seq_len_);
    backend_.xent_bwd(rows(logits_), rows(logits_), rows(targets_), dloss);
    backend_.matmul_bwd(d_norm, grad(head_w_), Tensor(), rows(logits_), rows(norm_f_.out), value(head_w_));
    norm_bwd(d_resid, d_norm, rows(residual_.back()), norm_f_, norm_f_w_, norm_f_b_);
    for (int64_t l = config_.n_layers - 1; l >= 0; --l) layer_bwd(l, d_resid);
    backend_.embedding_bwd(grad(wte_), grad(wpe_), d_resid, rows(tokens_), seq_len_);
}

void Transformer::layer_bwd(int64_t l, const Tensor& d_resid) {
    const LayerParams& p = layer_params_[static_cast<size_t>(l)];
    const LayerSlots& s = layer_slots_[static_cast<size_t>(l)];
    const AttentionShape shape = attention_shape();
    const Tensor d_tmp = rows(d_tmp_), d_norm = rows(d_norm_);

    // MLP block: out = resid_mid + down(act(up(norm2(resid_mid)))).
    backend_.matmul_bwd(rows(d_mlp_act_), grad(p.mlp_down_w), grad(p.mlp_down_b), d_resid, rows(s.mlp_act), value(p.mlp_down_w));
    if (is_llama()) backend_.swiglu_bwd(rows(d_mlp_up_), rows(d_mlp_act_), rows(s.mlp_up));
    else backend_.gelu_bwd(rows(d_mlp_up_), rows(d_mlp_act_), rows(s.mlp_up));
    backend_.matmul_bwd(d_norm, grad(p.mlp_up_w), grad(p.mlp_up_b), rows(d_mlp_up_), rows(s.norm2.out), value(p.mlp_up_w));
    norm_bwd(d_tmp, d_norm, rows(s.resid_mid), s.norm2, p.norm2_w, p.norm2_b);
    backend_.add(d_resid, d_resid, d_tmp);

    // Attention block: resid_mid = x + o(attn(rope(qkv(norm1(x))))).
    backend_.matmul_bwd(rows(d_att_out_), grad(p.attn_out_w), grad(p.attn_out_b), d_resid, rows(s.att_out), value(p.attn_out_w));
    backend_.attention_bwd(rows(d_qkv_), rows(d_att_out_), rows(s.qkv), att_saved(s.att_saved), shape);
    if (is_llama()) backend_.rope_bwd(rows(d_qkv_), arena_.tensor(rope_table_), seq_len_, shape.n_heads + shape.n_kv_heads, shape.head_dim);
    backend_.matmul_bwd(d_norm, grad(p.qkv_w), grad(p.qkv_b), rows(d_qkv_), rows(s.norm1.out), value(p.qkv_w));
    norm_bwd(d_tmp, d_norm, rows(residual_[static_cast<size_t>(l)]), s.norm1, p.norm1_w, p.norm1_b);
    backend_.add(d_resid, d_resid, d_tmp);
}

}  // namespace llmtrain
