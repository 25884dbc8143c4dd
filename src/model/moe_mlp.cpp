// The mixture-of-experts MLP (moe_mlp.h): routing, the experts' GEMMs and the balancing losses.
#include "model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"

namespace llmtrain {

int64_t moe_capacity(const MoeConfig& config, int64_t tokens) {
    if (config.capacity_factor <= 0) return 0;
    const double assignments = config.capacity_factor * static_cast<double>(tokens * config.top_k) / static_cast<double>(config.n_experts);
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(assignments - 1e-9)));
}

int64_t moe_permuted_rows(const MoeConfig& config, int64_t tokens) {
    const int64_t capacity = moe_capacity(config, tokens);
    return capacity > 0 ? config.n_experts * capacity : tokens * config.top_k;
}

namespace {

MoeScore score_of(MoeRouter router) { return router == MoeRouter::sigmoid ? MoeScore::sigmoid : MoeScore::softmax; }

class MoeMlp final : public MlpPart {
public:
    MoeMlp(const MoeConfig& config, MoeShape shape, std::unique_ptr<MlpPart> shared) : config_(config), shape_(shape), shared_(std::move(shared)) {}

    void register_params(ParamAdder& params, const ParamNames& names, int64_t layer) override {
        const int64_t C = shape_.d_model, F = shape_.d_ff;
        const std::string mlp = names.in_layer(layer, "mlp.");
        router_ = params.add_per_token(mlp + "gate.weight", {shape_.n_experts, C}, ParamInit::normal, true);
        for (int64_t e = shape_.first_expert(); e < shape_.first_expert() + shape_.local_experts(); ++e) {
            const std::string expert = cat(mlp, "experts.", e, '.');
            const ParamSpan gate = params.add_per_token(expert + "gate_proj.weight", {F, C}, ParamInit::normal, true);
            const ParamSpan up = params.add_per_token(expert + "up_proj.weight", {F, C}, ParamInit::normal, true);
            up_.push_back({gate.first, up.last, true});
            down_.push_back(params.add_per_token(expert + "down_proj.weight", {C, F}, ParamInit::normal_residual, true));
        }
        if (!shared_) return;
        shared_->register_params(params, shared_names(names), layer);
        if (config_.shared_expert_gate) gate_ = params.add_per_token(mlp + "shared_expert_gate.weight", {1, C}, ParamInit::normal, true);
    }

    MlpSlots reserve(const SlotPlanner& plan, const std::string& prefix, const MlpSlots* shared) const override {
        const int64_t n = plan.local_rows, R = rows_for(n), X = expert_rows_for(n), E = shape_.n_experts, k = shape_.top_k, C = shape_.d_model,
                      F = shape_.d_ff;
        const DType router = plan.stat_dtype;
        const std::string p = prefix + ".moe.";
        MlpSlots s;
        MoeSlots& m = s.moe;
        m.logits = plan.arena.reserve(p + "logits", router, {n, E});
        m.scores = plan.arena.reserve(p + "scores", router, {n, E});
        m.gates = plan.arena.reserve(p + "gates", router, {n, k});
        m.experts = plan.arena.reserve(p + "experts", DType::i32, {n, k});
        m.rows = plan.arena.reserve(p + "rows", DType::i32, {n, k});
        m.sources = plan.arena.reserve(p + "sources", DType::i32, {R});
        m.counts = plan.arena.reserve(p + "counts", DType::i32, {2, E});
        m.x_perm = plan.arena.reserve(p + "x_perm", plan.dtype, {R, C});
        if (dispatched()) {
            m.x_recv = plan.arena.reserve(p + "x_recv", plan.dtype, {X, C});
            m.y_recv = plan.arena.reserve(p + "y_recv", plan.dtype, {X, C});
            m.all_counts = plan.arena.reserve(p + "all_counts", DType::i32, {shape_.ep_size, 2 * E});
        }
        m.up = plan.arena.reserve(p + "up", plan.dtype, {X, 2 * F});
        m.act = shared ? shared->moe.act : plan.arena.reserve(p + "act", plan.dtype, {X, F});
        m.y_perm = plan.arena.reserve(p + "y_perm", plan.dtype, {R, C});
        const int64_t groups = config_.load_balancing == MoeBalancing::seq_aux_loss ? std::max<int64_t>(1, n / shape_.seq_len) : 1;
        m.load_counts = plan.arena.reserve(p + "load_counts", DType::i32, {groups, E});
        m.score_sums = plan.arena.reserve(p + "score_sums", router, {groups, E});
        m.losses = plan.arena.reserve(p + "losses", router, {2});
        if (shared_) reserve_shared(plan, p, shared, m);
        return s;
    }
    MlpSlots reserve_recomputed(const SlotPlanner& plan, const std::string& prefix) const override {
        MlpSlots s;
        s.moe.act = plan.arena.reserve(prefix + ".moe.act", plan.dtype, {expert_rows_for(plan.local_rows), shape_.d_ff});
        if (shared_) s.moe.shared_act = shared_->reserve_recomputed(plan, prefix + ".moe.shared").act;
        return s;
    }
    MlpScratch reserve_scratch(const SlotPlanner& plan) const override {
        const int64_t n = plan.local_rows, R = rows_for(n), X = expert_rows_for(n), E = shape_.n_experts, k = shape_.top_k, C = shape_.d_model,
                      F = shape_.d_ff;
        const DType router = plan.stat_dtype;
        MlpScratch g;
        MoeScratch& m = g.moe;
        m.d_y_perm = plan.arena.reserve("grad.moe.y_perm", plan.dtype, {R, C});
        m.d_act = plan.arena.reserve("grad.moe.act", plan.dtype, {X, F});
        m.d_up = plan.arena.reserve("grad.moe.up", plan.dtype, {X, 2 * F});
        m.d_x_perm = plan.arena.reserve("grad.moe.x_perm", plan.dtype, {R, C});
        if (dispatched()) {
            m.d_y_recv = plan.arena.reserve("grad.moe.y_recv", plan.dtype, {X, C});
            m.d_x_recv = plan.arena.reserve("grad.moe.x_recv", plan.dtype, {X, C});
        }
        m.d_gates = plan.arena.reserve("grad.moe.gates", router, {n, k});
        m.d_logits = plan.arena.reserve("grad.moe.logits", router, {n, E});
        m.d_logits_compute = plan.arena.reserve("grad.moe.logits_compute", plan.dtype, {router == plan.dtype ? 0 : n, E});
        m.d_x_router = plan.arena.reserve("grad.moe.x_router", plan.dtype, {n, C});
        if (shared_) reserve_shared_scratch(plan, m);
        return g;
    }

    // The layer's output: this rank's rows, in the scratch (the caller adds it to the residual).
    Tensor forward(LayerOps& ops, const MlpSlots& s, const Tensor& x_local) const override {
        if (shared_) shared_forward(ops, s.moe, x_local);
        const Routed r = route(ops, s.moe, x_local);
        Backend& b = ops.backend();
        b.moe_permute_fwd({.x_perm = r.x_perm, .x = x_local, .sources = r.sources, .top_k = shape_.top_k});
        const Tensor x_in = expert_side(ops, s.moe.x_recv, s.moe.x_perm, r), y_out = expert_side(ops, s.moe.y_recv, s.moe.y_perm, r);
        if (dispatched()) to_experts(ops, r, x_in, r.x_perm);
        const Tensor up = expert_side(ops, s.moe.up, r), act = expert_side(ops, s.moe.act, r), y = used(ops, s.moe.y_perm, r);
        for_each_expert(r, [&](int64_t j, int64_t first, int64_t count) {
            b.matmul_fwd({.out = up.slice_rows(first, count), .x = x_in.slice_rows(first, count), .w = ops.value(up_[idx(j)]), .bias = Tensor(), .row_block = 0});
        });
        b.swiglu_fwd(act, up);
        for_each_expert(r, [&](int64_t j, int64_t first, int64_t count) {
            b.matmul_fwd({.out = y_out.slice_rows(first, count), .x = act.slice_rows(first, count), .w = ops.value(down_[idx(j)]), .bias = Tensor(), .row_block = 0});
        });
        if (dispatched()) to_tokens(ops, r, y, y_out);
        const Tensor out = ops.part_output(r.n);
        b.moe_combine_fwd({.out = out, .y_perm = y, .gates = r.gates, .rows = r.rows_of});
        if (shared_) b.add(out, out, ops.planned(config_.shared_expert_gate ? s.moe.gated : s.moe.shared_y).slice_rows(0, r.n));
        return out;
    }

    Tensor backward(LayerOps& ops, const MlpSlots& s, const MlpScratch& g, const Tensor& d_local, const Tensor& x_local,
                    const Tensor& d_in) const override {
        const Routed r = routed(ops, s.moe, x_local.dim(0));
        const MoeScratch& m = g.moe;
        Backend& b = ops.backend();
        // The shared experts' first: their input gradient lands outside d_in (see shared_backward).
        const Tensor d_shared_x = shared_ ? shared_backward(ops, s.moe, m, d_local, x_local) : Tensor();
        const Tensor up = expert_side(ops, s.moe.up, r), act = expert_side(ops, s.moe.act, r), y = used(ops, s.moe.y_perm, r);
        const Tensor x_in = expert_side(ops, s.moe.x_recv, s.moe.x_perm, r);
        const Tensor d_y = used(ops, m.d_y_perm, r), d_x_perm = used(ops, m.d_x_perm, r);
        const Tensor d_act = expert_side(ops, m.d_act, r), d_up = expert_side(ops, m.d_up, r);
        const Tensor d_y_in = expert_side(ops, m.d_y_recv, m.d_y_perm, r), d_x_in = expert_side(ops, m.d_x_recv, m.d_x_perm, r);
        const Tensor d_gates = ops.planned(m.d_gates).slice_rows(0, r.n);
        b.moe_combine_bwd({.d_y_perm = d_y, .d_gates = d_gates, .d_out = d_local, .y_perm = y, .gates = r.gates, .rows = r.rows_of, .sources = r.sources});
        if (dispatched()) to_experts(ops, r, d_y_in, d_y);
        for_each_expert(r, [&](int64_t j, int64_t first, int64_t count) {
            b.matmul_bwd({.dx = d_act.slice_rows(first, count), .dw = ops.grad(down_[idx(j)]), .dbias = Tensor(), .dout = d_y_in.slice_rows(first, count),
                          .x = act.slice_rows(first, count), .w = ops.value(down_[idx(j)])});
        });
        b.swiglu_bwd(d_up, d_act, up);
        for_each_expert(r, [&](int64_t j, int64_t first, int64_t count) {
            b.matmul_bwd({.dx = d_x_in.slice_rows(first, count), .dw = ops.grad(up_[idx(j)]), .dbias = Tensor(), .dout = d_up.slice_rows(first, count),
                          .x = x_in.slice_rows(first, count), .w = ops.value(up_[idx(j)])});
        });
        if (dispatched()) to_tokens(ops, r, d_x_perm, d_x_in);
        // Padding rows (capacity) are never combined: their input gradient is left as is,
        // and the permutation's backward reads kept rows only.
        const Tensor dx = d_in.slice_rows(0, r.n);
        b.moe_permute_bwd({.dx = dx, .d_x_perm = d_x_perm, .rows = r.rows_of});
        router_backward(ops, s.moe, m, r, d_gates, x_local, dx);
        if (shared_) b.add(dx, dx, d_shared_x);
        return dx;
    }

    void reserve_state(Arena& arena, DType router, const std::string& prefix) override {
        if (biased()) bias_ = arena.reserve(prefix + ".moe.expert_bias", router, {shape_.n_experts});
    }
    std::optional<Arena::Slot> expert_bias() const override { return biased() ? std::optional(bias_) : std::nullopt; }
    const ExpertLoad* load() const override { return &load_; }
    void reset_load() override { load_ = ExpertLoad{std::vector<int64_t>(static_cast<size_t>(shape_.n_experts), 0), 0}; }

    void recompute(LayerOps& ops, const MlpSlots& s) const override {
        const auto it = counts_.find(s.moe.counts);
        if (it == counts_.end()) fail(ErrorKind::runtime, "MoE recompute before the layer's forward");
        const int64_t X = it->second.expert_rows;
        ops.backend().swiglu_fwd(ops.planned(s.moe.act).slice_rows(0, X), ops.planned(s.moe.up).slice_rows(0, X));
        if (shared_) shared_->recompute(ops, shared_slots(s.moe));
    }

private:
    // Rows [first, first + count) of the expert side's buffers that local expert `expert` runs.
    struct Chunk {
        int64_t expert = 0, first = 0, count = 0;
    };
    // Where each expert's rows are: on this rank's side (the permuted buffer, by expert) and
    // on the experts' side (the same buffer with ep = 1; else the rows received, by source).
    struct ExpertRows {
        int64_t rows = 0;          // the permuted buffer's rows in use
        int64_t expert_rows = 0;   // the rows the local experts run
        std::vector<Chunk> chunks;  // in the order the experts' GEMMs run: by expert, then by source
        std::vector<int64_t> send, recv;  // ep > 1: elements to and from each ep rank
        std::vector<int32_t> host_counts;  // dropless: this rank's counts [2, E] as read
    };
    // A forward's routing, as its backward reads it again.
    struct Routed : ExpertRows {
        int64_t n = 0;             // tokens
        int64_t capacity = 0;      // 0: dropless
        Tensor gates, rows_of, experts, scores, logits, sources, x_perm;
    };

    static size_t idx(int64_t j) { return static_cast<size_t>(j); }
    int64_t rows_for(int64_t tokens) const { return moe_permuted_rows(config_, tokens); }
    // The planned rows of the experts' side: the permuted buffer's, or with ep > 1 and no
    // capacity the worst case: a token's top_k experts are distinct, so it sends a rank at
    // most min(top_k, E / P) rows, and every one of the P ranks' tokens may do so (a capacity
    // receives E / P x capacity rows from each rank: the permuted buffer's E x capacity).
    int64_t expert_rows_for(int64_t tokens) const {
        if (!dispatched() || config_.capacity_factor > 0) return rows_for(tokens);
        return shape_.ep_size * tokens * std::min(shape_.top_k, shape_.local_experts());
    }
    bool dispatched() const { return shape_.ep_size > 1; }
    Tensor used(const LayerOps& ops, Arena::Slot slot, const Routed& r) const { return ops.planned(slot).slice_rows(0, r.rows); }
    Tensor expert_side(const LayerOps& ops, Arena::Slot slot, const Routed& r) const { return ops.planned(slot).slice_rows(0, r.expert_rows); }
    // The experts' side of a buffer: its own slot with ep > 1, else the permuted one's.
    Tensor expert_side(const LayerOps& ops, Arena::Slot received, Arena::Slot permuted, const Routed& r) const {
        return expert_side(ops, dispatched() ? received : permuted, r);
    }
    // The permuted rows to the ranks holding their experts, and back (ep > 1).
    static void to_experts(const LayerOps& ops, const Routed& r, const Tensor& expert_rows, const Tensor& permuted) {
        ops.expert_group()->all_to_all_v(expert_rows, r.recv, permuted, r.send);
    }
    static void to_tokens(const LayerOps& ops, const Routed& r, const Tensor& permuted, const Tensor& expert_rows) {
        ops.expert_group()->all_to_all_v(permuted, r.send, expert_rows, r.recv);
    }

    template <class F>
    static void for_each_expert(const Routed& r, F&& f) {
        for (const Chunk& c : r.chunks)
            if (c.count > 0) f(c.expert, c.first, c.count);
    }

    // ---- Shared experts ----
    // The dense MLP's names inside this layer's: mlp.gate_proj -> mlp.shared_expert.gate_proj.
    static ParamNames shared_names(const ParamNames& names) {
        ParamNames shared = names;
        const auto inside = [](const std::string& name) { return name.starts_with("mlp.") ? "mlp.shared_expert." + name.substr(4) : name; };
        for (std::string& up : shared.mlp_up) up = inside(up);
        shared.mlp_down = inside(shared.mlp_down);
        return shared;
    }
    static MlpSlots shared_slots(const MoeSlots& m) { return {.up = m.shared_up, .act = m.shared_act, .moe = {}}; }

    // recomputed: the slots selective recomputation rebuilds the activation into (or null).
    void reserve_shared(const SlotPlanner& plan, const std::string& p, const MlpSlots* recomputed, MoeSlots& m) const {
        const int64_t n = plan.local_rows, C = shape_.d_model;
        MlpSlots kept;
        if (recomputed) kept.act = recomputed->moe.shared_act;
        const MlpSlots dense = shared_->reserve(plan, p + "shared", recomputed ? &kept : nullptr);
        m.shared_up = dense.up, m.shared_act = dense.act;
        m.shared_y = plan.arena.reserve(p + "shared_y", plan.dtype, {n, C});
        if (!config_.shared_expert_gate) return;
        const DType router = plan.stat_dtype;
        m.gate_logits = plan.arena.reserve(p + "gate_logits", router, {n, 1});
        m.gate_scores = plan.arena.reserve(p + "gate_scores", router, {n, 1});
        m.gate = plan.arena.reserve(p + "gate", router, {n, 1});
        m.gate_experts = plan.arena.reserve(p + "gate_experts", DType::i32, {n, 1});
        m.gate_rows = plan.arena.reserve(p + "gate_rows", DType::i32, {n, 1});
        m.gate_sources = plan.arena.reserve(p + "gate_sources", DType::i32, {n});
        m.gate_counts = plan.arena.reserve(p + "gate_counts", DType::i32, {1});
        m.gated = plan.arena.reserve(p + "gated", plan.dtype, {n, C});
    }
    void reserve_shared_scratch(const SlotPlanner& plan, MoeScratch& m) const {
        const int64_t n = plan.local_rows, C = shape_.d_model;
        const MlpScratch dense = shared_->reserve_scratch(plan);
        m.shared_d_act = dense.d_act, m.shared_d_up = dense.d_up;
        m.shared_dx = plan.arena.reserve("grad.moe.shared_dx", plan.dtype, {plan.rows, C});
        if (!config_.shared_expert_gate) return;
        const DType router = plan.stat_dtype;
        m.d_shared_y = plan.arena.reserve("grad.moe.shared_y", plan.dtype, {n, C});
        m.d_gate = plan.arena.reserve("grad.moe.gate", router, {n, 1});
        m.d_gate_logits = plan.arena.reserve("grad.moe.gate_logits", router, {n, 1});
        m.d_gate_logits_compute = plan.arena.reserve("grad.moe.gate_logits_compute", plan.dtype, {router == plan.dtype ? 0 : n, 1});
    }

    // The gate's views: a router of one expert.
    struct Gate {
        Tensor logits, scores, gate, experts, rows, sources, counts;
    };
    static Gate gate_views(const LayerOps& ops, const MoeSlots& s, int64_t n) {
        return {ops.planned(s.gate_logits).slice_rows(0, n), ops.planned(s.gate_scores).slice_rows(0, n), ops.planned(s.gate).slice_rows(0, n),
                ops.planned(s.gate_experts).slice_rows(0, n), ops.planned(s.gate_rows).slice_rows(0, n), ops.planned(s.gate_sources).slice_rows(0, n),
                ops.planned(s.gate_counts)};
    }

    // shared_y = shared(x) (the dense MLP writes the part's output: copied out before the
    // routed experts write theirs there); gated = sigmoid(x . w_g) shared_y with the gate.
    void shared_forward(LayerOps& ops, const MoeSlots& s, const Tensor& x) const {
        Backend& b = ops.backend();
        const int64_t n = x.dim(0);
        const Tensor y = ops.planned(s.shared_y).slice_rows(0, n);
        b.copy(y, shared_->forward(ops, shared_slots(s), x));
        if (!config_.shared_expert_gate) return;
        const Gate g = gate_views(ops, s, n);
        b.matmul_fwd({.out = g.logits, .x = x, .w = ops.value(gate_), .bias = Tensor(), .row_block = 0});
        b.moe_route_fwd({.experts = g.experts, .gates = g.gate, .scores = g.scores, .logits = g.logits, .expert_bias = Tensor(),
                         .score = MoeScore::sigmoid, .normalize_top_k = false});
        b.moe_permute_plan({.rows = g.rows, .sources = g.sources, .counts = g.counts, .dropped = Tensor(), .experts = g.experts, .capacity = 0});
        b.moe_combine_fwd({.out = ops.planned(s.gated).slice_rows(0, n), .y_perm = y, .gates = g.gate, .rows = g.rows});
    }

    // d(loss)/dx of this rank's rows through the shared experts and their gate, from d_out:
    // in the dense MLP's own scratch (whole rows, or reduced to this rank's under sequence
    // parallelism), with the gate's input gradient added.
    Tensor shared_backward(LayerOps& ops, const MoeSlots& s, const MoeScratch& m, const Tensor& d_out, const Tensor& x) const {
        Backend& b = ops.backend();
        const int64_t n = x.dim(0);
        Tensor d_y = d_out;
        Tensor d_gate_x;
        if (config_.shared_expert_gate) {
            const Gate g = gate_views(ops, s, n);
            d_y = ops.planned(m.d_shared_y).slice_rows(0, n);
            const Tensor d_gate = ops.planned(m.d_gate).slice_rows(0, n), d_logits = ops.planned(m.d_gate_logits).slice_rows(0, n);
            b.moe_combine_bwd({.d_y_perm = d_y, .d_gates = d_gate, .d_out = d_out, .y_perm = ops.planned(s.shared_y).slice_rows(0, n), .gates = g.gate,
                               .rows = g.rows, .sources = g.sources});
            b.moe_route_bwd({.d_logits = d_logits, .d_gates = d_gate, .gates = g.gate, .scores = g.scores, .experts = g.experts,
                             .score = MoeScore::sigmoid, .normalize_top_k = false, .accumulate = false});
            d_gate_x = ops.planned(m.d_x_router).slice_rows(0, n);
            b.matmul_bwd({.dx = d_gate_x, .dw = ops.grad(gate_), .dbias = Tensor(), .dout = in_dtype(ops, d_logits, m.d_gate_logits_compute, x), .x = x,
                          .w = ops.value(gate_)});
        }
        const MlpScratch dense{.d_act = m.shared_d_act, .d_up = m.shared_d_up, .moe = {}};
        const Tensor dx = shared_->backward(ops, shared_slots(s), dense, d_y, x, ops.rows(m.shared_dx));
        if (!d_gate_x.empty()) b.add(dx, dx, d_gate_x);
        return dx;
    }

    // t in x's dtype: itself, or copied into `slot` (an fp32 logit gradient for a bf16 GEMM).
    static Tensor in_dtype(const LayerOps& ops, const Tensor& t, Arena::Slot slot, const Tensor& x) {
        if (t.dtype() == x.dtype()) return t;
        const Tensor c = ops.planned(slot).slice_rows(0, t.dim(0));
        ops.backend().copy(c, t);
        return c;
    }

    // Router, top-k and the permutation plan for x's tokens; the expert rows on the host.
    Routed route(LayerOps& ops, const MoeSlots& s, const Tensor& x) const {
        Backend& b = ops.backend();
        const int64_t n = x.dim(0);
        Routed r = views(ops, s, n);
        b.matmul_fwd({.out = r.logits, .x = x, .w = ops.value(router_), .bias = Tensor(), .row_block = 0});
        b.moe_route_fwd({.experts = r.experts, .gates = r.gates, .scores = r.scores, .logits = r.logits,
                         .expert_bias = biased() ? ops.planned(bias_) : Tensor(),
                         .score = score_of(config_.router), .normalize_top_k = config_.normalize_top_k});
        // With ep > 1 the counts go straight to this rank's row of the group's (gathered dropless).
        const Tensor counts = dispatched() ? ops.planned(s.all_counts).slice_rows(shape_.ep_rank, 1).reshape({2, shape_.n_experts}) : ops.planned(s.counts);
        b.moe_permute_plan({.rows = r.rows_of, .sources = r.sources, .counts = counts.slice_rows(0, 1).reshape({shape_.n_experts}),
                            .dropped = counts.slice_rows(1, 1).reshape({shape_.n_experts}), .experts = r.experts, .capacity = r.capacity});
        ExpertRows& rows = counts_[s.counts];
        rows = expert_rows(ops, s, counts, r.capacity);
        if (!ops.recomputing()) tally(b, counts, rows);
        balance_losses(ops, s, r);
        return with_rows(r, rows);
    }

    // The forward's routing added to the load: the dropless path has the counts on the host
    // already; a capacity reads its kept and dropped counts (one synchronization on a device).
    void tally(Backend& b, const Tensor& counts, const ExpertRows& rows) const {
        const size_t E = static_cast<size_t>(shape_.n_experts);
        std::vector<int32_t> host(2 * E, 0);
        if (rows.host_counts.empty()) b.copy_to_host(host.data(), counts);
        else std::copy(rows.host_counts.begin(), rows.host_counts.end(), host.begin());
        load_.routed.resize(E, 0);
        for (size_t e = 0; e < E; ++e) {
            load_.routed[e] += host[e] + host[E + e];
            load_.dropped += host[E + e];
        }
    }

    // The load statistics (per micro-batch, or per sequence for seq_aux_loss), summed over the
    // ranks holding the micro-batch's other tokens, and the balancing losses of this forward,
    // added to the model's. Full recomputation's re-run measures the statistics again (the
    // backward reads them, and under full recomputation every layer shares their slots) but
    // adds no loss.
    void balance_losses(LayerOps& ops, const MoeSlots& s, const Routed& r) const {
        Backend& b = ops.backend();
        const Balance bal = balance(ops, s, r.n);
        if (aux_loss_on()) {
            b.moe_load_stats({.counts = bal.counts, .score_sums = bal.score_sums, .experts = r.experts, .scores = r.scores, .seq_len = bal.group});
            ops.sum_over_token_shards({bal.counts, bal.score_sums});
        }
        if (ops.recomputing()) return;
        const Tensor losses = ops.planned(s.losses);
        if (aux_loss_on()) {
            b.moe_aux_loss_fwd({.loss = losses.slice_rows(0, 1), .counts = bal.counts, .score_sums = bal.score_sums, .tokens_per_group = bal.tokens,
                                .top_k = shape_.top_k, .coeff = config_.aux_loss_coeff});
            // Every token shard forms the same aux loss (from the summed statistics): each adds its share.
            ops.add_balance_loss(losses.slice_rows(0, 1), 1.0 / static_cast<double>(ops.token_shards()));
        }
        if (config_.z_loss_coeff > 0) {
            b.moe_z_loss_fwd({.loss = losses.slice_rows(1, 1), .logits = r.logits, .coeff = z_loss_coeff(ops)});
            ops.add_balance_loss(losses.slice_rows(1, 1), 1.0);
        }
    }

    // seq_aux_loss: groups of one sequence's tokens; else the micro-batch's as one group. The
    // statistics are the whole group's (all token shards): tokens counts them all.
    struct Balance {
        int64_t group = 0, tokens = 0;
        Tensor counts, score_sums;
    };
    Balance balance(const LayerOps& ops, const MoeSlots& s, int64_t n) const {
        Balance bal;
        bal.group = config_.load_balancing == MoeBalancing::seq_aux_loss ? ops.sequence_tokens() : 0;
        bal.tokens = (bal.group > 0 ? bal.group : n) * ops.token_shards();
        const int64_t groups = bal.group > 0 ? n / bal.group : 1;
        bal.counts = ops.planned(s.load_counts).slice_rows(0, groups);
        bal.score_sums = ops.planned(s.score_sums).slice_rows(0, groups);
        return bal;
    }
    // The z-loss is a mean over the micro-batch's tokens: each token shard adds its own tokens'
    // part (the op means over this rank's n = N / shards), and the parts sum to the mean.
    double z_loss_coeff(const LayerOps& ops) const { return config_.z_loss_coeff / static_cast<double>(ops.token_shards()); }
    bool aux_loss_on() const {
        const MoeBalancing b = config_.load_balancing;
        return (b == MoeBalancing::aux_loss || b == MoeBalancing::seq_aux_loss) && config_.aux_loss_coeff > 0;
    }
    bool biased() const { return config_.load_balancing == MoeBalancing::expert_bias; }

    Routed routed(const LayerOps& ops, const MoeSlots& s, int64_t n) const {
        const auto it = counts_.find(s.counts);
        if (it == counts_.end()) fail(ErrorKind::runtime, "MoE backward without the layer's forward");
        return with_rows(views(ops, s, n), it->second);
    }

    Routed views(const LayerOps& ops, const MoeSlots& s, int64_t n) const {
        Routed r;
        r.n = n;
        r.capacity = moe_capacity(config_, n);
        r.logits = ops.planned(s.logits).slice_rows(0, n);
        r.scores = ops.planned(s.scores).slice_rows(0, n);
        r.gates = ops.planned(s.gates).slice_rows(0, n);
        r.experts = ops.planned(s.experts).slice_rows(0, n);
        r.rows_of = ops.planned(s.rows).slice_rows(0, n);
        const int64_t R = rows_for(n);
        r.sources = ops.planned(s.sources).slice_rows(0, R);
        r.x_perm = ops.planned(s.x_perm).slice_rows(0, R);
        return r;
    }

    static Routed with_rows(Routed r, const ExpertRows& rows) {
        static_cast<ExpertRows&>(r) = rows;
        return r;
    }

    // Each expert's run of the permuted buffer, and the chunks the local experts run: from the
    // counts when dropless (read to the host: a synchronization on a device), else capacity
    // rows for each expert from each rank.
    ExpertRows expert_rows(const LayerOps& ops, const MoeSlots& s, const Tensor& counts, int64_t capacity) const {
        const size_t E = static_cast<size_t>(shape_.n_experts), P = static_cast<size_t>(shape_.ep_size);
        // sent[q][e]: the rows ep rank q sends expert e (q is this rank alone with ep = 1).
        std::vector<std::vector<int64_t>> sent(P, std::vector<int64_t>(E, capacity));
        ExpertRows rows;
        if (capacity == 0) rows.host_counts = read_counts(ops, s, counts, sent);
        const std::vector<int64_t>& mine = sent[static_cast<size_t>(shape_.ep_rank)];
        for (const int64_t c : mine) rows.rows += c;
        if (!dispatched()) {
            for (size_t e = 0, first = 0; e < E; first += static_cast<size_t>(mine[e]), ++e)
                rows.chunks.push_back({static_cast<int64_t>(e), static_cast<int64_t>(first), mine[e]});
            rows.expert_rows = rows.rows;
            return rows;
        }
        // Rank q's experts are [q L, (q + 1) L): one run of every rank's permuted buffer. What
        // arrives here is source 0's rows for my experts, then source 1's, ..., each by expert.
        const size_t L = static_cast<size_t>(shape_.local_experts()), mine_first = static_cast<size_t>(shape_.first_expert());
        rows.send.assign(P, 0);
        rows.recv.assign(P, 0);
        std::vector<int64_t> next(P, 0);  // where source q's block starts, then its next chunk
        for (size_t q = 0; q < P; ++q) {
            next[q] = rows.expert_rows;
            for (size_t j = 0; j < L; ++j) {
                rows.recv[q] += sent[q][mine_first + j];
                rows.send[q] += mine[q * L + j];
            }
            rows.expert_rows += rows.recv[q];
        }
        for (size_t j = 0; j < L; ++j)
            for (size_t q = 0; q < P; ++q) {
                rows.chunks.push_back({static_cast<int64_t>(j), next[q], sent[q][mine_first + j]});
                next[q] += sent[q][mine_first + j];
            }
        for (size_t q = 0; q < P; ++q) rows.send[q] *= shape_.d_model, rows.recv[q] *= shape_.d_model;
        return rows;
    }

    // Dropless: the kept counts of every ep rank into sent, in one host read; with ep > 1 the
    // group's [2, E] counts are gathered on the device first. Returns this rank's [2, E].
    std::vector<int32_t> read_counts(const LayerOps& ops, const MoeSlots& s, const Tensor& counts, std::vector<std::vector<int64_t>>& sent) const {
        Backend& b = ops.backend();
        const size_t E = static_cast<size_t>(shape_.n_experts), P = static_cast<size_t>(shape_.ep_size), me = static_cast<size_t>(shape_.ep_rank);
        std::vector<int32_t> host(P * 2 * E);
        if (dispatched()) {
            const Tensor all = ops.planned(s.all_counts);  // counts is this rank's row of it
            ops.expert_group()->all_gather(all);
            b.copy_to_host(host.data(), all);
        } else {
            b.copy_to_host(host.data(), counts);
        }
        for (size_t q = 0; q < P; ++q)
            for (size_t e = 0; e < E; ++e) sent[q][e] = host[q * 2 * E + e];
        return {host.begin() + static_cast<std::ptrdiff_t>(me * 2 * E), host.begin() + static_cast<std::ptrdiff_t>((me + 1) * 2 * E)};
    }

    // d(loss)/d(logits) from the gates' gradient and the balancing losses, then the router
    // GEMM's backward: dx += d_logits Wr, dWr += d_logits^T x.
    void router_backward(LayerOps& ops, const MoeSlots& s, const MoeScratch& m, const Routed& r, const Tensor& d_gates, const Tensor& x,
                         const Tensor& dx) const {
        Backend& b = ops.backend();
        const MoeScore score = score_of(config_.router);
        const Tensor d_logits = ops.planned(m.d_logits).slice_rows(0, r.n);
        b.moe_route_bwd({.d_logits = d_logits, .d_gates = d_gates, .gates = r.gates, .scores = r.scores, .experts = r.experts, .score = score,
                         .normalize_top_k = config_.normalize_top_k, .accumulate = false});
        const double dloss = ops.backward_loss_scale();
        if (aux_loss_on()) {
            const Balance bal = balance(ops, s, r.n);
            b.moe_aux_loss_bwd({.d_logits = d_logits, .scores = r.scores, .counts = bal.counts, .seq_len = bal.group, .tokens_per_group = bal.tokens,
                                .top_k = shape_.top_k, .coeff = config_.aux_loss_coeff, .dloss = dloss, .score = score});
        }
        if (config_.z_loss_coeff > 0)
            b.moe_z_loss_bwd({.d_logits = d_logits, .logits = r.logits, .coeff = z_loss_coeff(ops), .dloss = dloss});
        const Tensor d_router_x = ops.planned(m.d_x_router).slice_rows(0, r.n);
        b.matmul_bwd({.dx = d_router_x, .dw = ops.grad(router_), .dbias = Tensor(), .dout = in_dtype(ops, d_logits, m.d_logits_compute, x), .x = x,
                      .w = ops.value(router_)});
        b.add(dx, dx, d_router_x);
    }

    MoeConfig config_;
    MoeShape shape_;
    std::unique_ptr<MlpPart> shared_;  // the shared experts' dense MLP, or null
    ParamSpan router_, gate_;          // gate_: the shared experts' (shared_expert_gate)
    Arena::Slot bias_ = 0;  // expert_bias: [E], the router's dtype, kept across steps
    std::vector<ParamSpan> up_, down_;  // per expert: [gate | up] fused, down
    // Each activation set's expert rows (keyed by its counts slot), from its forward.
    mutable std::unordered_map<Arena::Slot, ExpertRows> counts_;
    mutable ExpertLoad load_;  // since reset_load()
};

}  // namespace

std::unique_ptr<MlpPart> make_moe_mlp(const MoeConfig& config, MoeShape shape, std::unique_ptr<MlpPart> shared_experts) {
    return std::make_unique<MoeMlp>(config, shape, std::move(shared_experts));
}

}  // namespace llmtrain
