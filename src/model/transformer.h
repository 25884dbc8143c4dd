// A decoder-only transformer in two families, with explicit forward and backward passes
// over activations planned up front in an Arena.
//
//   gpt2:  x = wte[tok] + wpe[pos];  per layer: x += proj(attn(LN(x)));  x += proj(gelu(fc(LN(x))))
//          LayerNorm, biases everywhere, learned positions, tied embeddings by default.
//   llama: x = embed[tok];           per layer: x += o(attn(rope(qkv(RMS(x)))));  x += down(swiglu(gate_up(RMS(x))))
//          RMSNorm, RoPE, SwiGLU, grouped-query attention, optional QKV bias (Qwen2), no other biases.
//   both:  logits = head(norm(x)), head = wte when embeddings are tied; loss = mean cross-entropy.
//
// The model knows nothing of ranks or communication; it owns its parameters and activations.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/arena.h"
#include "model/parameters.h"

namespace llmtrain {

class Transformer {
public:
    // Activations are planned for micro-batches of up to max_batch sequences of up to
    // max_seq_len tokens (<= config.max_seq_len).
    Transformer(const ModelConfig& config, Backend& backend, DType dtype, int64_t max_batch, int64_t max_seq_len);

    const ModelConfig& config() const { return config_; }
    Parameters& parameters() { return params_; }
    const Parameters& parameters() const { return params_; }
    void initialize(uint64_t seed) { params_.initialize(seed, config_.init_std, config_.n_layers); }

    // tokens and targets: i32 [batch * seq_len], sequences back to back. targets may be an
    // empty Tensor (inference: logits only). Returns the mean loss over all tokens, or NaN.
    double forward(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq_len);
    // Accumulates d(loss_scale * mean loss)/d(parameters) of the last forward into the
    // parameter gradients. Overwrites the logits.
    void backward(double loss_scale);
    // Logits [batch * seq_len, vocab] of the last forward.
    Tensor logits() const;

    size_t activation_bytes() const { return arena_.total_bytes(); }
    int64_t max_batch() const { return max_batch_; }
    int64_t max_seq_len() const { return max_seq_len_; }

private:
    // A parameter, or several registered back to back and used as one (fused QKV, gate+up).
    struct ParamSpan {
        size_t first = 0, last = 0;
        bool present = false;
    };
    struct LayerParams {
        ParamSpan norm1_w, norm1_b, qkv_w, qkv_b, attn_out_w, attn_out_b;
        ParamSpan norm2_w, norm2_b, mlp_up_w, mlp_up_b, mlp_down_w, mlp_down_b;
    };
    struct NormSlots {
        Arena::Slot out, mean, rstd;
    };
    struct LayerSlots {
        NormSlots norm1, norm2;
        Arena::Slot qkv, att_saved, att_out, resid_mid, mlp_up, mlp_act;
    };

    void register_gpt2_params();
    void register_llama_params();
    ParamSpan add(const std::string& name, Shape shape, ParamInit init, bool decay);
    ParamSpan join(ParamSpan first, ParamSpan last) const { return {first.first, last.last, true}; }
    Tensor value(ParamSpan p) const { return p.present ? params_.value_span(p.first, p.last) : Tensor(); }
    Tensor grad(ParamSpan p) const { return p.present ? params_.grad_span(p.first, p.last) : Tensor(); }

    void plan_activations();
    NormSlots reserve_norm(const std::string& prefix);
    Tensor rows(Arena::Slot slot) const;  // the first batch * seq_len rows of a slot
    Tensor att_saved(Arena::Slot slot) const;
    AttentionShape attention_shape() const;
    bool is_llama() const { return config_.family == ModelFamily::llama; }

    void norm_fwd(const NormSlots& slots, const Tensor& x, ParamSpan w, ParamSpan b);
    // dx = d(norm)/dx^T dout; accumulates the norm's parameter gradients.
    void norm_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x, const NormSlots& slots, ParamSpan w, ParamSpan b);
    void layer_fwd(int64_t layer);
    // d_resid: on entry the gradient w.r.t. the layer's output, on exit w.r.t. its input.
    void layer_bwd(int64_t layer, const Tensor& d_resid);

    ModelConfig config_;
    Backend& backend_;
    DType dtype_;
    int64_t max_batch_, max_seq_len_;
    int64_t batch_ = 0, seq_len_ = 0;
    bool has_targets_ = false;

    Parameters params_;
    ParamSpan wte_, wpe_, norm_f_w_, norm_f_b_, head_w_;
    std::vector<LayerParams> layer_params_;

    Arena arena_;
    Arena::Slot tokens_, targets_, rope_table_, logits_, losses_;
    std::vector<Arena::Slot> residual_;  // residual stream entering layer l; [n_layers] is the last output
    std::vector<LayerSlots> layer_slots_;
    NormSlots norm_f_;
    Arena::Slot proj_out_, d_resid_, d_tmp_, d_norm_, d_att_out_, d_qkv_, d_mlp_act_, d_mlp_up_;
};

}  // namespace llmtrain
