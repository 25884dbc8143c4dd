// A transformer layer as a composition of parts chosen by the config: two norms, attention
// and an MLP, each registering its own parameters, planning its own activations and running
// its own forward and backward; the Transformer's layer loop calls the parts in order:
//
//   h = x + Attention(Norm1(x));   out = h + Mlp(Norm2(h))
//
// BlockSpec (block_spec(ModelConfig)) says which part of each kind a model takes:
//   Norm       LayerNorm (weight and bias) or RMSNorm (weight).
//   positions  learned (a table added at the embedding) or rotary (RoPE on q and k inside
//              attention).
//   Attention  packed q, k, v of grouped-query heads, with or without their bias; the
//              output projection with or without its bias.
//   MlpPart    GeluMlp (up, GELU, down, with biases: GPT-2) or SwigluMlp (gate and up,
//              silu(gate) * up, down, without biases: Llama, Qwen2); each layer holds
//              its own, so a layer of experts can be another MlpPart beside dense ones.
//   ParamNames Hugging Face's names: GPT-2's or Llama / Qwen2's.
// GPT-2 = LayerNorm + learned positions + biased attention + GeluMlp; Llama = RMSNorm + rotary
// + unbiased attention (Qwen2: QKV bias) + SwigluMlp. The family is read only in block_spec.
//
// Tensor parallelism (Megatron-LM): the projections into a part (QKV, MLP up) are
// column-parallel, those out of it (attention out, MLP down) row-parallel; the parts run them
// through LayerOps, which the Transformer provides (sequence_parallel.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/arena.h"
#include "parallel/comm.h"
#include "model/parameters.h"

namespace llmtrain {

// A parameter, or several registered back to back and used as one (fused QKV, gate+up).
struct ParamSpan {
    size_t first = 0, last = 0;
    bool present = false;
};

enum class NormKind { layer_norm, rms_norm };
enum class PositionScheme { learned, rotary };
enum class MlpKind { gelu, swiglu };

// Hugging Face's names. A part with several names (q, k, v; gate, up) registers one tensor per
// name, back to back, used as one matrix; a part whose one name stands for several blocks
// (GPT-2's c_attn: q, k and v) registers one tensor of those blocks.
struct ParamNames {
    std::string embedding, positions, layers, final_norm, head;
    std::string norm1, norm2, attention_out, mlp_down;  // within a layer, before ".weight" / ".bias"
    std::vector<std::string> qkv, mlp_up;
    std::string in_layer(int64_t layer, const std::string& part) const { return cat(layers, layer, '.', part); }
};

struct BlockSpec {
    NormKind norm = NormKind::layer_norm;
    PositionScheme positions = PositionScheme::learned;
    bool qkv_bias = true, out_bias = true;  // attention's
    MlpKind mlp = MlpKind::gelu;
    bool mlp_bias = true;
    ParamNames names;
};
BlockSpec block_spec(const ModelConfig& config);

// Registers parameters in the model's registry (parameters.h), as the parts need them.
class ParamAdder {
public:
    ParamAdder(Parameters& params, bool sequence_parallel) : params_(params), sp_(sequence_parallel) {}
    ParamSpan add(const std::string& name, Shape shape, ParamInit init, bool decay, TensorSplit split = {});
    // A norm's weight or bias [width]: replicated, no decay; its gradient a partial sum over
    // the tp ranks under sequence parallelism (each rank normalizes its own tokens).
    ParamSpan add_norm(const std::string& name, int64_t width, ParamInit init);
    // A replicated parameter that acts on each rank's own tokens (a norm, a MoE layer's router
    // and experts): under sequence parallelism its gradient is a partial sum over the tp ranks.
    ParamSpan add_per_token(const std::string& name, Shape shape, ParamInit init, bool decay);
    // Blocks of block_rows[i] rows each (of `cols` columns; vectors when cols is 0), split by
    // rows across tp block by block and used as one tensor: one parameter per name, or all
    // blocks in one parameter when there is one name. Weights decay; biases (cols 0) do not.
    ParamSpan add_row_blocks(const std::vector<std::string>& names, const std::string& suffix, const std::vector<int64_t>& block_rows,
                             int64_t cols, ParamInit init);
    size_t count() const { return params_.count(); }

private:
    Parameters& params_;
    bool sp_;
};

// Where the parts plan their activations (core/arena.h).
struct SlotPlanner {
    Arena& arena;
    DType dtype;       // activations
    DType stat_dtype;  // norm statistics, attention's saved values
    int64_t rows;        // a micro-batch's token rows: max_batch * max_seq_len
    int64_t local_rows;  // this rank's rows of them (rows / tp under sequence parallelism)
};

// What the parts compute with; the Transformer provides it.
class LayerOps {
public:
    // A matmul over some of a micro-batch's token rows: `rows` holds rows [first, first +
    // rows.dim(0)) of its input (column-parallel) or of its partial output (row-parallel);
    // row_block goes to the backend's forward matmul (MatmulFwd::row_block).
    using RowsMatmul = std::function<void(const Tensor& rows, int64_t first, int64_t row_block)>;
    virtual Backend& backend() const = 0;
    virtual Tensor rows(Arena::Slot slot) const = 0;        // the micro-batch's rows of a slot
    virtual Tensor local_rows(Arena::Slot slot) const = 0;  // this rank's rows of them
    virtual Tensor value(ParamSpan p) const = 0;            // empty when absent
    virtual Tensor grad(ParamSpan p) const = 0;
    virtual Tensor row_parallel_bias(ParamSpan p) const = 0;  // added by one tp rank only
    // A column-parallel matmul of this rank's rows `local` (whole rows under sequence parallelism).
    virtual void column_parallel(const Tensor& local, const RowsMatmul& matmul) = 0;
    // A row-parallel matmul; returns this rank's rows of its output summed over tp.
    virtual Tensor row_parallel(const RowsMatmul& matmul) = 0;
    // A linear layer's GEMMs (MatmulFwd, MatmulBwd and the GELU MLP's fused forms): `w` names
    // the weight, one of a part's linears(); in FP8 where the run's recipe casts that layer
    // (model/fp8_linear.h), else the backend's matmul. The parts call these, never the
    // backend's matmuls, for a linear: they hold no FP8 branch.
    virtual void linear_fwd(ParamSpan w, const MatmulFwd& args) = 0;
    virtual void linear_bwd(ParamSpan w, const MatmulBwd& args) = 0;
    virtual void linear_gelu_fwd(ParamSpan w, const MatmulGeluFwd& args) = 0;
    virtual void gelu_linear_bwd(ParamSpan w, const GeluMatmulBwd& args) = 0;
    // The backward of a column-parallel matmul whose input is this rank's rows `local_x`:
    // args.dx (whole rows) reduced to this rank's rows, which it returns. w: the linear's
    // weight, as linear_bwd's (absent: the backend's matmul).
    virtual Tensor column_parallel_bwd(MatmulBwd args, const Tensor& local_x, ParamSpan w = {}) = 0;
    // The whole rows of a row-parallel output's gradient from this rank's rows.
    virtual Tensor gather_output_grad(const Tensor& d_local) = 0;
    virtual Tensor planned(Arena::Slot slot) const = 0;  // a slot as planned (all its rows)
    // Where a part that computes on this rank's rows alone writes its n rows of output (the
    // layer adds it to the residual stream before the next part runs).
    virtual Tensor part_output(int64_t n) const = 0;
    // This rank's tokens of each sequence of the micro-batch (seq_len / cp).
    virtual int64_t sequence_tokens() const = 0;
    // d(loss) of a loss term of the whole micro-batch (a MoE layer's balancing losses) in the
    // backward running now: the loss scale it was given, times cp (that scale divides by the
    // cp ranks, each of which takes the mean cross-entropy of its own tokens).
    virtual double backward_loss_scale() const = 0;
    // The ranks holding the micro-batch's tokens between them: the tp ranks under sequence
    // parallelism, times the cp ranks (1: this rank holds every token). A MoE layer sums its
    // load statistics over them before forming the aux loss (sum_over_token_shards, in place;
    // every one of those ranks calls it with the same tensors).
    virtual int64_t token_shards() const = 0;
    virtual void sum_over_token_shards(std::initializer_list<Tensor> tensors) = 0;
    // The expert group (parallel.ep > 1): the ranks among which a MoE layer's experts are
    // shared out and its routed rows travel by all-to-all; null when every expert is here.
    virtual Comm* expert_group() const = 0;
    // Adds scale times a loss term (a [1] tensor) to the model's balancing losses: summed over
    // the token shards, a micro-batch's terms are added once.
    virtual void add_balance_loss(const Tensor& loss, double scale) = 0;
    // Whether the forward running is full recomputation's re-run of a layer (inside a
    // backward): what it measures was measured already.
    virtual bool recomputing() const = 0;

protected:
    ~LayerOps() = default;
};

// A part's linear layer: its weight and how tensor parallelism splits it (what FP8 scaling
// needs to know of it, model/fp8_linear.h).
struct LinearWeight {
    ParamSpan w;
    bool column_parallel = true;  // the weight's rows split over tp; else its columns (row-parallel)
};

struct NormSlots {
    Arena::Slot out, mean, rstd;
};

// LayerNorm: out = (x - mean) rstd w + b; RMSNorm: out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps).
class Norm {
public:
    struct Grad {
        Tensor dx;  // d(loss)/dx, this rank's rows: overwritten, or added to when accumulate_dx
        bool accumulate_dx = false;
        Tensor dout, x;  // d(loss)/d(out) and the forward's input
    };
    // The residual add before a norm, fused into one pass: sum = a + b, out = norm(sum).
    struct AddFwd {
        Tensor sum, a, b;
    };
    Norm() = default;
    Norm(NormKind kind, double eps) : kind_(kind), eps_(eps) {}
    void register_params(ParamAdder& params, const std::string& name, int64_t width);
    NormSlots reserve(const SlotPlanner& plan, const std::string& prefix, int64_t width) const;
    void forward(LayerOps& ops, const NormSlots& s, const Tensor& x) const;
    void add_forward(LayerOps& ops, const NormSlots& s, const AddFwd& args) const;
    void backward(LayerOps& ops, const NormSlots& s, const Grad& args) const;  // also accumulates dw, db

private:
    bool rms() const { return kind_ == NormKind::rms_norm; }
    NormKind kind_ = NormKind::layer_norm;
    double eps_ = 0;
    ParamSpan weight_, bias_;
};

struct AttentionSlots {
    Arena::Slot qkv, saved, out;  // packed q, k, v; what attention's backward reads; its output
};
struct AttentionScratch {
    Arena::Slot d_out, d_qkv;  // gradients, shared by every layer
};

// The attention part's projections around the attention proper (which has no parameters and
// the Transformer runs: over the micro-batch, around the cp ring, or against a KV cache):
//   qkv = x Wqkv^T (+ b)   column-parallel: each tp rank computes its heads' q, k and v;
//   q, k rotated by their positions (PositionScheme::rotary);
//   out = att Wo^T (+ b)   row-parallel, summed over tp.
class Attention {
public:
    struct Heads {
        int64_t d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;  // the whole model's heads
        int64_t local_heads = 0, local_kv_heads = 0;                     // this tp rank's
    };
    Attention() = default;
    Attention(const BlockSpec& spec, Heads shape)
        : shape_(shape), qkv_bias_(spec.qkv_bias), out_bias_(spec.out_bias), rotary_(spec.positions == PositionScheme::rotary) {}
    void register_params(ParamAdder& params, const ParamNames& names, int64_t layer);
    // saved: the shape of what attention's backward reads (the device's, or the ring's).
    AttentionSlots reserve(const SlotPlanner& plan, const std::string& prefix, Shape saved) const;
    AttentionScratch reserve_scratch(const SlotPlanner& plan) const;
    void project_qkv(LayerOps& ops, const AttentionSlots& s, const Tensor& x_local) const;
    // positions: the rotation's table, seq_len, doc_starts and positions for the rows.
    void rotate(LayerOps& ops, const AttentionSlots& s, const Rope& positions) const;
    Tensor project_out(LayerOps& ops, const AttentionSlots& s) const;  // this rank's rows
    // d_local: d(loss)/d(out) of this rank's rows; d(att) into the scratch.
    void project_out_bwd(LayerOps& ops, const AttentionSlots& s, const AttentionScratch& g, const Tensor& d_local) const;
    void rotate_bwd(LayerOps& ops, const AttentionScratch& g, const Rope& positions) const;
    // d(loss)/dx of this rank's rows from the scratch's d(qkv); d_in: whole rows' scratch.
    Tensor project_qkv_bwd(LayerOps& ops, const AttentionScratch& g, const Tensor& x_local, const Tensor& d_in) const;
    std::vector<LinearWeight> linears() const { return {{qkv_w_, true}, {out_w_, false}}; }

private:
    int64_t q_width() const { return shape_.n_heads * shape_.head_dim; }
    int64_t kv_width() const { return shape_.n_kv_heads * shape_.head_dim; }
    int64_t local_qkv_width() const { return (shape_.local_heads + 2 * shape_.local_kv_heads) * shape_.head_dim; }
    int64_t local_out_width() const { return shape_.local_heads * shape_.head_dim; }
    Rope rotation(Rope positions, const Tensor& rows) const;  // positions applied to `rows`
    Heads shape_;
    bool qkv_bias_ = false, out_bias_ = false, rotary_ = false;
    ParamSpan qkv_w_, qkv_b_, out_w_, out_b_;
};

// A mixture-of-experts layer's (moe_mlp.h): the router's logits, scores [n, E] and choices
// [n, k] (experts, gates, their rows in the permuted buffer), the plan (sources [R], kept and
// dropped assignments per expert), the permuted input [R, C], the experts' up projections [R, 2F] and
// activations [R, F] and outputs [R, C].
// The load statistics per group of tokens (load_counts, score_sums [G, E]) and the balancing
// losses [2] (aux, z) are the layer's too.
// Shared experts (model.moe.n_shared_experts): the dense MLP's up projection and activation,
// its output y [n, C]; with the gate, its logit, score, choice and the identity plan [n, 1]
// of a one-expert sigmoid router, and the gated output [n, C].
struct MoeSlots {
    Arena::Slot logits, scores, experts, gates, rows, sources, counts;  // counts [2, E]: kept, then dropped
    Arena::Slot x_perm, up, act, y_perm;
    // Expert parallelism (ep > 1) only: the rows the ep group sent this rank's experts and
    // their outputs, source by source, and every ep rank's counts [ep, 2 E] (this rank's row in
    // place of counts).
    Arena::Slot x_recv, y_recv, all_counts;
    Arena::Slot load_counts, score_sums, losses;
    Arena::Slot shared_up, shared_act, shared_y;
    Arena::Slot gate_logits, gate_scores, gate_experts, gate, gate_rows, gate_sources, gate_counts, gated;
};
struct MoeScratch {
    Arena::Slot d_y_perm, d_act, d_up, d_x_perm, d_gates, d_logits, d_logits_compute, d_x_router;
    Arena::Slot d_y_recv, d_x_recv;  // ep > 1: the received rows' gradients
    Arena::Slot shared_d_act, shared_d_up, shared_dx, d_shared_y, d_gate, d_gate_logits, d_gate_logits_compute;
};

struct MlpSlots {
    Arena::Slot up, act;  // the up projection's output (pre-activation) and the activation
    MoeSlots moe;         // a mixture-of-experts layer's instead
};
struct MlpScratch {
    Arena::Slot d_act, d_up;  // gradients, shared by every layer
    MoeScratch moe;
};

// A mixture-of-experts layer's routing since its last reset: assignments per expert (before
// any capacity drop) and those dropped, over this rank's tokens.
struct ExpertLoad {
    std::vector<int64_t> routed;
    int64_t dropped = 0;
};

// A layer's MLP: this rank's rows of x to this rank's rows of the output (summed over tp).
class MlpPart {
public:
    struct Widths {
        int64_t d_model = 0, d_ff = 0, tp_size = 1;
        int64_t local_ff() const { return d_ff / tp_size; }
    };
    virtual ~MlpPart() = default;
    virtual void register_params(ParamAdder& params, const ParamNames& names, int64_t layer) = 0;
    // shared: the slots that selective recomputation rebuilds into (one set for every layer),
    // or null when the layer keeps its own.
    virtual MlpSlots reserve(const SlotPlanner& plan, const std::string& prefix, const MlpSlots* shared) const = 0;
    virtual MlpSlots reserve_recomputed(const SlotPlanner& plan, const std::string& prefix) const = 0;
    virtual MlpScratch reserve_scratch(const SlotPlanner& plan) const = 0;
    virtual Tensor forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const = 0;
    // d_local: d(loss)/d(output) of this rank's rows; returns d(loss)/dx of this rank's rows,
    // d_in: the whole rows' scratch for it.
    virtual Tensor backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_local, const Tensor& x_local,
                            const Tensor& d_in) const = 0;
    // Selective recomputation: the activation again from the kept up projection.
    virtual void recompute(LayerOps& ops, const MlpSlots& s) const = 0;
    // State kept across steps, planned once per layer (a MoE layer's expert bias, in the
    // router's dtype); and where it is, if the part has one.
    virtual void reserve_state(Arena& /*arena*/, DType /*router*/, const std::string& /*prefix*/) {}
    virtual std::optional<Arena::Slot> expert_bias() const { return std::nullopt; }
    // The routing of the forwards since reset_load() (a layer of experts); null for a dense MLP.
    virtual const ExpertLoad* load() const { return nullptr; }
    virtual void reset_load() {}
    // The linear layers FP8 may run (model/fp8_linear.h); none: the part stays out of FP8
    // (a layer of experts).
    virtual std::vector<LinearWeight> linears() const { return {}; }
};

// A dense MLP of the spec's kind. Each layer holds its own MlpPart, made where the layer is
// registered (TransformerLayout::register_layer): a layer of experts is chosen there
// (moe_mlp.h).
std::unique_ptr<MlpPart> make_mlp(const BlockSpec& spec, MlpPart::Widths shape);

}  // namespace llmtrain
