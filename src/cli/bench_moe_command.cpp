// `llmtrain bench moe`: one mixture-of-experts layer's forward and backward (model/moe_mlp.h)
// timed by part, with each part's share and the experts' TFLOP/s:
//   router    the router GEMM (logits [n, E] in fp32) and moe_route_fwd; backward
//             moe_route_bwd, the router GEMM's backward and its dx added in
//   dispatch  moe_permute_plan, the host read of the counts (dropless: the experts' rows),
//             moe_permute_fwd; backward moe_permute_bwd
//   experts   per expert the fused gate|up GEMM, SwiGLU over all rows, per expert the down
//             GEMM; backward the same in reverse
//   combine   moe_combine_fwd; backward moe_combine_bwd
// The balancing losses (aux, z) are left out: a few element-wise passes over [n, E].
//
// Each part is timed by the wall clock with the device synchronized before and after it (on
// the CPU the ops are synchronous), so the parts add up to the layer's time, host read
// included. Expert FLOPs are the active ones: 2 * 3 * d_model * d_ff_expert * tokens * top_k
// forward, twice that backward (dx and dw); with a capacity the GEMMs also run the padding
// rows, which these FLOPs do not count.
//
// Routing is realistic by default: random tokens and random router weights, so the load is
// somewhat uneven (its max / mean is printed); --balanced sends assignment (t, j) to expert
// (t k + j) mod E instead (every expert the same rows), the router still running.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/bench_support.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/moe_mlp.h"

namespace llmtrain {

namespace {

struct BenchMoeArgs {
    std::string device = "cuda";
    // 0: the device's default shape (kCudaShape, kCpuShape)
    int64_t tokens = 0, d_model = 0, n_experts = 0, top_k = 0, d_ff_expert = 0;
    double capacity_factor = 0;
    bool balanced = false;
    int iterations = 10;
    int warmup = 2;
};

struct MoeBenchShape {
    int64_t tokens, d_model, n_experts, top_k, d_ff_expert;
};
// Qwen3-30B-A3B's MoE layer (d_model 2048, 128 experts of 768, top 8) at 4,096 tokens; on the
// CPU a small layer that runs in a moment.
constexpr MoeBenchShape kCudaShape{4096, 2048, 128, 8, 768};
constexpr MoeBenchShape kCpuShape{512, 256, 16, 2, 256};

MoeBenchShape shape_of(const BenchMoeArgs& args, Device device) {
    MoeBenchShape s = device == Device::cuda ? kCudaShape : kCpuShape;
    const auto take = [](int64_t given, int64_t& into) { into = given > 0 ? given : into; };
    take(args.tokens, s.tokens), take(args.d_model, s.d_model), take(args.n_experts, s.n_experts);
    take(args.top_k, s.top_k), take(args.d_ff_expert, s.d_ff_expert);
    if (s.top_k > s.n_experts) fail(ErrorKind::config, "--top-k ", s.top_k, ": at most --experts (", s.n_experts, ")");
    return s;
}

OwnedTensor make(Backend& be, DType dtype, Shape shape) {
    OwnedTensor t(dtype, shape, be.device(), [&be](size_t bytes) { return be.allocate(bytes); });
    if (t.view().dtype() != DType::i32) be.fill_zero(t);  // gradients accumulate; indices are written before they are read
    return t;
}

// The layer's tensors: weights (experts stacked by rows), activations and gradients.
struct MoeBenchTensors {
    OwnedTensor x, router_w, up_w, down_w, router_dw, up_dw, down_dw;
    OwnedTensor logits, scores, gates, experts, balanced_experts, rows, sources, counts, x_perm, up, act, y, out;
    OwnedTensor d_out, d_y, d_gates, d_act, d_up, d_x_perm, dx, d_logits, d_logits_c, d_router_x;
};

MoeBenchTensors make_tensors(Backend& be, const MoeBenchShape& s, int64_t R, DType compute) {
    const int64_t n = s.tokens, C = s.d_model, E = s.n_experts, k = s.top_k, F = s.d_ff_expert;
    const DType router = DType::f32, grad = DType::f32;
    MoeBenchTensors t{make(be, compute, {n, C}), make(be, compute, {E, C}), make(be, compute, {E * 2 * F, C}), make(be, compute, {E * C, F}),
                      make(be, grad, {E, C}), make(be, grad, {E * 2 * F, C}), make(be, grad, {E * C, F}),
                      make(be, router, {n, E}), make(be, router, {n, E}), make(be, router, {n, k}), make(be, DType::i32, {n, k}),
                      make(be, DType::i32, {n, k}), make(be, DType::i32, {n, k}), make(be, DType::i32, {R}), make(be, DType::i32, {2, E}),
                      make(be, compute, {R, C}), make(be, compute, {R, 2 * F}), make(be, compute, {R, F}), make(be, compute, {R, C}),
                      make(be, compute, {n, C}),
                      make(be, compute, {n, C}), make(be, compute, {R, C}), make(be, router, {n, k}), make(be, compute, {R, F}),
                      make(be, compute, {R, 2 * F}), make(be, compute, {R, C}), make(be, compute, {n, C}), make(be, router, {n, E}),
                      make(be, compute, {n, E}), make(be, compute, {n, C})};
    fill_uniform(be, t.x, 1.0, 1);
    fill_uniform(be, t.router_w, 1.0 / std::sqrt(static_cast<double>(C)), 2);
    fill_uniform(be, t.d_out, 1e-3, 3);
    // The experts' values do not change their time: one expert's, copied to every expert.
    fill_uniform(be, t.up_w.view().slice_rows(0, 2 * F), 1.0 / std::sqrt(static_cast<double>(C)), 4);
    fill_uniform(be, t.down_w.view().slice_rows(0, C), 1.0 / std::sqrt(static_cast<double>(F)), 5);
    for (int64_t e = 1; e < E; ++e) {
        be.copy(t.up_w.view().slice_rows(e * 2 * F, 2 * F), t.up_w.view().slice_rows(0, 2 * F));
        be.copy(t.down_w.view().slice_rows(e * C, C), t.down_w.view().slice_rows(0, C));
    }
    std::vector<int32_t> round_robin(static_cast<size_t>(n * k));
    for (size_t i = 0; i < round_robin.size(); ++i) round_robin[i] = static_cast<int32_t>(static_cast<int64_t>(i) % E);
    be.copy_from_host(t.balanced_experts, round_robin.data());
    return t;
}

enum Part { router, dispatch, experts, combine, part_count };
constexpr const char* kPartNames[part_count] = {"router", "dispatch", "experts", "combine"};

// The layer's ops called directly, in MoeMlp's order (model/moe_mlp.cpp: route, forward,
// backward, router_backward), without its balancing losses and load tally; a change of the
// layer's op sequence must be made here too.
class MoeLayerRun {
public:
    MoeLayerRun(Backend& be, const MoeBenchShape& s, const MoeConfig& config, bool balanced)
        : be_(be), s_(s), capacity_(moe_capacity(config, s.tokens)), R_(moe_permuted_rows(config, s.tokens)),
          t_(make_tensors(be, s, R_, be.device() == Device::cuda ? DType::bf16 : DType::f32)), balanced_(balanced) {}

    // The parts of one forward and backward, each timed by `time(part, backward, run)`.
    template <class Time>
    void step(Time&& time) {
        time(router, false, [&] { route(); });
        time(dispatch, false, [&] { dispatch_fwd(); });
        time(experts, false, [&] { experts_fwd(); });
        time(combine, false, [&] { be_.moe_combine_fwd({.out = t_.out, .y_perm = t_.y, .gates = t_.gates, .rows = t_.rows}); });
        time(combine, true, [&] {
            be_.moe_combine_bwd({.d_y_perm = t_.d_y, .d_gates = t_.d_gates, .d_out = t_.d_out, .y_perm = t_.y, .gates = t_.gates, .rows = t_.rows,
                                 .sources = t_.sources});
        });
        time(experts, true, [&] { experts_bwd(); });
        time(dispatch, true, [&] { be_.moe_permute_bwd({.dx = t_.dx, .d_x_perm = t_.d_x_perm, .rows = t_.rows}); });
        time(router, true, [&] { route_bwd(); });
    }

    // The last forward's routing, read after the timing: max / mean of the assignments each
    // expert was given (before a capacity's drops), and how many were dropped.
    struct Load {
        double max_over_mean = 0;
        int64_t dropped = 0;
    };
    Load load() const {
        const auto E = static_cast<size_t>(s_.n_experts);
        std::vector<int32_t> host(2 * E);
        be_.copy_to_host(host.data(), t_.counts);
        Load load;
        int64_t most = 0, routed = 0;
        for (size_t e = 0; e < E; ++e) {
            most = std::max<int64_t>(most, host[e] + host[E + e]);
            routed += host[e] + host[E + e];
            load.dropped += host[E + e];
        }
        load.max_over_mean = routed > 0 ? static_cast<double>(most) * static_cast<double>(E) / static_cast<double>(routed) : 0.0;
        return load;
    }
    int64_t capacity() const { return capacity_; }
    int64_t permuted_rows() const { return R_; }

private:
    void route() {
        be_.matmul_fwd({.out = t_.logits, .x = t_.x, .w = t_.router_w, .bias = Tensor(), .row_block = 0});
        be_.moe_route_fwd({.experts = t_.experts, .gates = t_.gates, .scores = t_.scores, .logits = t_.logits, .expert_bias = Tensor(),
                           .score = MoeScore::softmax, .normalize_top_k = true});
    }

    void dispatch_fwd() {
        const int64_t E = s_.n_experts;
        const Tensor counts = t_.counts;
        be_.moe_permute_plan({.rows = t_.rows, .sources = t_.sources, .counts = counts.slice_rows(0, 1).reshape({E}),
                              .dropped = counts.slice_rows(1, 1).reshape({E}), .experts = balanced_ ? t_.balanced_experts : t_.experts,
                              .capacity = capacity_});
        first_.assign(static_cast<size_t>(E), 0);
        count_.assign(static_cast<size_t>(E), capacity_);
        for (size_t e = 0; e < first_.size(); ++e) first_[e] = static_cast<int64_t>(e) * capacity_;
        if (capacity_ == 0) {
            std::vector<int32_t> host(static_cast<size_t>(2 * E));
            be_.copy_to_host(host.data(), counts);
            for (size_t e = 0, first = 0; e < first_.size(); first += static_cast<size_t>(host[e]), ++e)
                first_[e] = static_cast<int64_t>(first), count_[e] = host[e];
        }
        be_.moe_permute_fwd({.x_perm = t_.x_perm, .x = t_.x, .sources = t_.sources, .top_k = s_.top_k});
    }

    template <class F>
    void for_each_expert(F&& f) const {
        for (size_t e = 0; e < first_.size(); ++e)
            if (count_[e] > 0) f(static_cast<int64_t>(e), first_[e], count_[e]);
    }
    Tensor up_w(int64_t e, const Tensor& w) const { return w.slice_rows(e * 2 * s_.d_ff_expert, 2 * s_.d_ff_expert); }
    Tensor down_w(int64_t e, const Tensor& w) const { return w.slice_rows(e * s_.d_model, s_.d_model); }

    void experts_fwd() {
        for_each_expert([&](int64_t e, int64_t first, int64_t count) {
            be_.matmul_fwd({.out = t_.up.view().slice_rows(first, count), .x = t_.x_perm.view().slice_rows(first, count), .w = up_w(e, t_.up_w),
                            .bias = Tensor(), .row_block = 0});
        });
        be_.swiglu_fwd(t_.act, t_.up);
        for_each_expert([&](int64_t e, int64_t first, int64_t count) {
            be_.matmul_fwd({.out = t_.y.view().slice_rows(first, count), .x = t_.act.view().slice_rows(first, count), .w = down_w(e, t_.down_w),
                            .bias = Tensor(), .row_block = 0});
        });
    }

    void experts_bwd() {
        for_each_expert([&](int64_t e, int64_t first, int64_t count) {
            be_.matmul_bwd({.dx = t_.d_act.view().slice_rows(first, count), .dw = down_w(e, t_.down_dw), .dbias = Tensor(),
                            .dout = t_.d_y.view().slice_rows(first, count), .x = t_.act.view().slice_rows(first, count), .w = down_w(e, t_.down_w)});
        });
        be_.swiglu_bwd(t_.d_up, t_.d_act, t_.up);
        for_each_expert([&](int64_t e, int64_t first, int64_t count) {
            be_.matmul_bwd({.dx = t_.d_x_perm.view().slice_rows(first, count), .dw = up_w(e, t_.up_dw), .dbias = Tensor(),
                            .dout = t_.d_up.view().slice_rows(first, count), .x = t_.x_perm.view().slice_rows(first, count), .w = up_w(e, t_.up_w)});
        });
    }

    void route_bwd() {
        be_.moe_route_bwd({.d_logits = t_.d_logits, .d_gates = t_.d_gates, .gates = t_.gates, .scores = t_.scores, .experts = t_.experts,
                           .score = MoeScore::softmax, .normalize_top_k = true, .accumulate = false});
        Tensor d_logits = t_.d_logits;
        if (t_.d_logits.view().dtype() != t_.x.view().dtype()) {
            be_.copy(t_.d_logits_c, t_.d_logits);
            d_logits = t_.d_logits_c;
        }
        be_.matmul_bwd({.dx = t_.d_router_x, .dw = t_.router_dw, .dbias = Tensor(), .dout = d_logits, .x = t_.x, .w = t_.router_w});
        be_.add(t_.dx, t_.dx, t_.d_router_x);
    }

    Backend& be_;
    MoeBenchShape s_;
    int64_t capacity_, R_;
    MoeBenchTensors t_;
    bool balanced_;
    std::vector<int64_t> first_, count_;  // each expert's rows of the permuted buffer
};

// Prints a pass's parts and returns its total (ms).
double print_pass(const char* name, const std::array<double, part_count>& ms, double expert_flops) {
    double total = 0;
    for (const double m : ms) total += m;
    std::printf("%s:\n", name);
    for (int p = 0; p < part_count; ++p) {
        std::printf("    %-9s %10.3f ms %6.1f%%", kPartNames[p], ms[p], total > 0 ? 100.0 * ms[p] / total : 0.0);
        if (p == experts) std::printf("   %9.3f TFLOP/s", ms[p] > 0 ? expert_flops / (ms[p] * 1e9) : 0.0);
        std::printf("\n");
    }
    std::printf("    %-9s %10.3f ms %6.1f%%\n", "total", total, 100.0);
    return total;
}

int run_bench_moe(const BenchMoeArgs& args) {
    std::unique_ptr<Backend> be;
    if (args.device == "cuda") be = make_cuda_backend(0, AttentionImpl::native);
    else if (args.device == "cpu") be = make_cpu_backend(0);
    else fail(ErrorKind::config, "--device \"", args.device, "\" (allowed: cuda, cpu)");
    const MoeBenchShape s = shape_of(args, be->device());
    MoeConfig config;
    config.n_experts = s.n_experts, config.top_k = s.top_k, config.d_ff_expert = s.d_ff_expert, config.capacity_factor = args.capacity_factor;
    MoeLayerRun layer(*be, s, config, args.balanced);

    std::array<double, part_count> fwd_s{}, bwd_s{};
    bool timing = false;
    const auto time = [&](Part part, bool backward, auto&& run) {
        if (!timing) return run();
        be->synchronize();
        const auto start = std::chrono::steady_clock::now();
        run();
        be->synchronize();
        (backward ? bwd_s : fwd_s)[part] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    for (int i = 0; i < args.warmup; ++i) layer.step(time);
    timing = true;
    for (int i = 0; i < args.iterations; ++i) layer.step(time);

    std::printf("bench moe: %s; %lld tokens, d_model %lld, %lld experts, top %lld, d_ff_expert %lld, ", be->name().c_str(),
                static_cast<long long>(s.tokens), static_cast<long long>(s.d_model), static_cast<long long>(s.n_experts),
                static_cast<long long>(s.top_k), static_cast<long long>(s.d_ff_expert));
    if (layer.capacity() > 0) std::printf("capacity factor %g (%lld rows an expert)\n", args.capacity_factor, static_cast<long long>(layer.capacity()));
    else std::printf("dropless\n");
    const MoeLayerRun::Load load = layer.load();
    std::printf("routing: %s, load max/mean %.2f, %lld assignments dropped; %d timed iterations after %d warm-up, wall clock, the device "
                "synchronized around each part\n",
                args.balanced ? "balanced (round-robin experts)" : "random router weights", load.max_over_mean, static_cast<long long>(load.dropped),
                args.iterations, args.warmup);
    std::printf("expert FLOPs: 2*3*d_model*d_ff_expert*tokens*top_k forward (active rows), twice that backward\n");
    const double flops = 2.0 * 3.0 * static_cast<double>(s.d_model) * static_cast<double>(s.d_ff_expert) * static_cast<double>(s.tokens) *
                         static_cast<double>(s.top_k);
    std::array<double, part_count> fwd_ms{}, bwd_ms{};
    for (int p = 0; p < part_count; ++p) fwd_ms[p] = fwd_s[p] * 1e3 / args.iterations, bwd_ms[p] = bwd_s[p] * 1e3 / args.iterations;
    const double forward_ms = print_pass("forward", fwd_ms, flops);
    const double backward_ms = print_pass("backward", bwd_ms, 2 * flops);
    const double experts_ms = fwd_ms[experts] + bwd_ms[experts];
    std::printf("forward + backward: %.3f ms, experts %.3f TFLOP/s\n", forward_ms + backward_ms, experts_ms > 0 ? 3 * flops / (experts_ms * 1e9) : 0.0);
    std::fflush(stdout);
    return 0;
}

}  // namespace

void register_bench_moe(CLI::App& bench, CommandAction& action) {
    auto args = std::make_shared<BenchMoeArgs>();
    CLI::App* moe = bench.add_subcommand("moe", "A mixture-of-experts layer's forward and backward by part (router, dispatch, experts, combine): time, share, experts' TFLOP/s");
    moe->add_option("--device", args->device, "cuda (bf16; default shape Qwen3-30B-A3B's layer at 4,096 tokens) or cpu (f32; a small layer)")->capture_default_str();
    moe->add_option("--tokens", args->tokens, "tokens through the layer (default: 4096 on cuda, 512 on cpu)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
    moe->add_option("--d-model", args->d_model, "the layer's width (default: 2048 on cuda, 256 on cpu)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    moe->add_option("--experts", args->n_experts, "experts (default: 128 on cuda, 16 on cpu)")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
    moe->add_option("--top-k", args->top_k, "experts per token (default: 8 on cuda, 2 on cpu)")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
    moe->add_option("--d-ff-expert", args->d_ff_expert, "each expert's SwiGLU width (default: 768 on cuda, 256 on cpu)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    moe->add_option("--capacity-factor", args->capacity_factor, "0: dropless (the counts read on the host); else rows an expert = ceil(factor * tokens * top_k / experts)")
        ->capture_default_str()->check(CLI::Range(0.0, 1000.0));
    moe->add_flag("--balanced", args->balanced, "send assignment (t, j) to expert (t top_k + j) mod experts instead of the router's choice");
    moe->add_option("--iters", args->iterations, "timed forward + backward passes")->capture_default_str()->check(CLI::Range(1, 100000));
    moe->add_option("--warmup", args->warmup, "untimed passes first")->capture_default_str()->check(CLI::Range(0, 1000));
    moe->callback([args, &action] { action = [args] { return run_bench_moe(*args); }; });
}

}  // namespace llmtrain
