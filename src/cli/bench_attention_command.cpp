// `llmtrain bench attention`: causal attention on one GPU, cuDNN's fused flash attention
// against the native kernels, over the shapes the bundled configs train (GPT-2 124M's and
// Llama 1B's micro-batches) and head dims 64 and 128 with and without grouped-query heads,
// in bf16 and fp16. For each: whether cuDNN planned it (its engines, their notes, the
// workspace, or cuDNN's own error), forward and backward time and TFLOP/s of both, and how
// far cuDNN's out, log-sum-exps and gradients are from the native kernels' (on the same
// random inputs; each relative to the native result's largest magnitude).
//
// FLOPs (FlashAttention's convention): forward 4 B H T^2 D / 2 (two matmuls of 2 FLOPs per
// multiply-add over the causal half of the score square), backward 2.5 x forward (five).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "backend/backend.h"
#include "cli/bench_support.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/attention_head_dims.h"
#include "core/log.h"

namespace llmtrain {

namespace {

struct BenchAttentionArgs {
    std::vector<std::string> shapes;  // "B,T,H,Hkv,D"; empty: the built-in list
    std::string dtype = "both";
    int iterations = 20;
    int warmup = 3;
};

struct NamedShape {
    std::string name;
    AttentionShape shape;
};

const std::vector<NamedShape> kShapes = {
    {"gpt2-124m micro-batch", {32, 1024, 12, 12, 64}},
    {"llama-1b micro-batch (GQA 4:1)", {8, 2048, 32, 8, 64}},
    {"head dim 128, MHA", {8, 2048, 16, 16, 128}},
    {"head dim 128, GQA 4:1", {8, 2048, 32, 8, 128}},
    {"head dim 64, MQA", {16, 1024, 16, 1, 64}},
    {"partial tiles (T = 1000)", {4, 1000, 12, 12, 64}},
};

AttentionShape parse_shape(const std::string& text) {
    const std::vector<int64_t> v = parse_int_list(text);
    if (v.size() != 5 || std::any_of(v.begin(), v.end(), [](int64_t x) { return x < 1; }) || v[2] % v[3] != 0)
        fail(ErrorKind::config, "--shape '", text, "': expected B,T,H,Hkv,D (positive, Hkv dividing H), e.g. 8,2048,32,8,64");
    return {v[0], v[1], v[2], v[3], v[4]};
}

double forward_flops(const AttentionShape& s) {
    return 4.0 * static_cast<double>(s.batch * s.n_heads) * static_cast<double>(s.seq_len) * static_cast<double>(s.seq_len) *
           static_cast<double>(s.head_dim) / 2.0;
}

// 16-bit device tensors of uniform values in [-2, 2).
std::vector<uint16_t> random_bits(DType dtype, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (uint16_t& b : bits) b = dtype == DType::bf16 ? float_to_bf16(uniform(rng)) : float_to_f16(uniform(rng));
    return bits;
}

struct Buffers {
    OwnedTensor qkv, dout, out, saved, dqkv;
};

Buffers buffers(Backend& be, const AttentionShape& s, DType dtype) {
    const auto make = [&be](DType t, Shape shape) { return OwnedTensor(t, shape, be.device(), [&be](size_t bytes) { return be.allocate(bytes); }); };
    Buffers b{make(dtype, {s.rows(), s.qkv_width()}), make(dtype, {s.rows(), s.out_width()}), make(dtype, {s.rows(), s.out_width()}),
              make(DType::f32, be.attention_saved_shape(s)), make(dtype, {s.rows(), s.qkv_width()})};
    return b;
}

struct Timing {
    double forward_ms = 0, backward_ms = 0;
};

// GPU time per call from the backend's per-op events, after `warmup` untimed calls.
Timing time_attention(Backend& be, Buffers& b, const AttentionShape& s, int warmup, int iterations) {
    for (int i = 0; i < warmup; ++i) {
        be.attention_fwd({.out = b.out, .saved = b.saved, .qkv = b.qkv, .shape = s, .doc_starts = Tensor()});
        be.attention_bwd({.dqkv = b.dqkv, .dout = b.dout, .qkv = b.qkv, .out = b.out, .saved = b.saved, .shape = s, .doc_starts = Tensor()});
    }
    be.synchronize();
    be.set_profiling(true);
    be.profile().reset();
    for (int i = 0; i < iterations; ++i) be.attention_fwd({.out = b.out, .saved = b.saved, .qkv = b.qkv, .shape = s, .doc_starts = Tensor()});
    for (int i = 0; i < iterations; ++i)
        be.attention_bwd({.dqkv = b.dqkv, .dout = b.dout, .qkv = b.qkv, .out = b.out, .saved = b.saved, .shape = s, .doc_starts = Tensor()});
    be.synchronize();
    be.set_profiling(false);
    const OpProfile& p = be.profile();
    const auto per_call = [&p](Op op) {
        const auto i = static_cast<size_t>(op);
        return p.calls[i] > 0 ? p.seconds[i] * 1e3 / static_cast<double>(p.calls[i]) : 0.0;
    };
    return {per_call(Op::attention_fwd), per_call(Op::attention_bwd)};
}

void print_timing(const char* impl, const Timing& t, const AttentionShape& s) {
    const double f = forward_flops(s);
    std::printf("    %-7s forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s\n", impl, t.forward_ms, f / (t.forward_ms * 1e9), t.backward_ms,
                2.5 * f / (t.backward_ms * 1e9));
}

void bench_shape(Backend& native, Backend* cudnn, const NamedShape& named, DType dtype, const BenchAttentionArgs& args) {
    const AttentionShape& s = named.shape;
    std::printf("%s: B %lld T %lld H %lld Hkv %lld D %lld %s\n", named.name.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.seq_len),
                static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.head_dim), dtype_name(dtype));
    Buffers n = buffers(native, s, dtype);
    native.copy_from_host(n.qkv, random_bits(dtype, n.qkv.view().numel(), 1).data());
    native.copy_from_host(n.dout, random_bits(dtype, n.dout.view().numel(), 2).data());
    const bool native_runs = native_attention_takes(s.head_dim);
    std::vector<float> ref_out, ref_lse, ref_dqkv;
    if (native_runs) {
        native.attention_fwd({.out = n.out, .saved = n.saved, .qkv = n.qkv, .shape = s, .doc_starts = Tensor()});
        native.attention_bwd({.dqkv = n.dqkv, .dout = n.dout, .qkv = n.qkv, .out = n.out, .saved = n.saved, .shape = s, .doc_starts = Tensor()});
        ref_out = device_values(native, n.out), ref_lse = device_values(native, n.saved), ref_dqkv = device_values(native, n.dqkv);
    }
    if (cudnn) {
        std::string how;
        try {
            how = cudnn->describe_attention(s, dtype);
        } catch (const Error& e) {
            how = e.what();
        }
        std::printf("    cudnn:  %s\n", how.c_str());
    }
    if (native_runs) print_timing("native", time_attention(native, n, s, args.warmup, args.iterations), s);
    else std::printf("    native  head dim %lld: not instantiated (%s)\n", static_cast<long long>(s.head_dim), native_attention_head_dims_text().c_str());
    if (!cudnn || cudnn->describe_attention(s, dtype).rfind("cuDNN", 0) != 0) return;
    Buffers c = buffers(*cudnn, s, dtype);
    native.synchronize();  // the inputs were written on the other backend's stream
    cudnn->copy(c.qkv, n.qkv);
    cudnn->copy(c.dout, n.dout);
    try {
        cudnn->attention_fwd({.out = c.out, .saved = c.saved, .qkv = c.qkv, .shape = s, .doc_starts = Tensor()});
        cudnn->attention_bwd({.dqkv = c.dqkv, .dout = c.dout, .qkv = c.qkv, .out = c.out, .saved = c.saved, .shape = s, .doc_starts = Tensor()});
        if (native_runs)
            std::printf("    cudnn against native: max |diff| / max |native|: out %.2e, lse %.2e, dqkv %.2e\n", relative_error(device_values(*cudnn, c.out), ref_out),
                        relative_error(device_values(*cudnn, c.saved), ref_lse), relative_error(device_values(*cudnn, c.dqkv), ref_dqkv));
        print_timing("cudnn", time_attention(*cudnn, c, s, args.warmup, args.iterations), s);
    } catch (const Error& e) {
        std::printf("    cudnn FAILED: %s\n", e.what());
    }
    std::fflush(stdout);
}

int run_bench_attention(const BenchAttentionArgs& args) {
    std::vector<DType> dtypes;
    if (args.dtype == "both") dtypes = {DType::bf16, DType::f16};
    else if (args.dtype == "bf16") dtypes = {DType::bf16};
    else if (args.dtype == "fp16") dtypes = {DType::f16};
    else fail(ErrorKind::config, "--dtype \"", args.dtype, "\" (allowed: both, bf16, fp16)");
    std::vector<NamedShape> shapes;
    for (const std::string& text : args.shapes) shapes.push_back({"--shape " + text, parse_shape(text)});
    if (shapes.empty()) shapes = kShapes;

    std::unique_ptr<Backend> native = make_cuda_backend(0, AttentionImpl::native), cudnn;
    try {
        cudnn = make_cuda_backend(0, AttentionImpl::cudnn);
    } catch (const Error& e) {
        std::printf("cuDNN: not available (%s); the native kernels alone are measured\n", e.what());
    }
    std::printf("bench attention: %s; %d timed calls after %d warm-up, per-op CUDA events\n", native->name().c_str(), args.iterations, args.warmup);
    std::printf("FLOPs: forward 4*B*H*T^2*D/2 (two matmuls, causal: half the score square), backward 2.5 x forward (five matmuls)\n");
    for (const NamedShape& shape : shapes)
        for (const DType dtype : dtypes) bench_shape(*native, cudnn.get(), shape, dtype, args);
    return 0;
}

}  // namespace

void register_bench_attention(CLI::App& bench, CommandAction& action) {
    auto args = std::make_shared<BenchAttentionArgs>();
    CLI::App* attention = bench.add_subcommand("attention", "Causal attention on the GPU: cuDNN's fused flash attention against the native kernels "
                                                             "(plans, engines, time, TFLOP/s, agreement)");
    attention->add_option("--shape", args->shapes, "B,T,H,Hkv,D to measure (repeatable; default: the bundled configs' shapes and head dim 128)");
    attention->add_option("--dtype", args->dtype, "both, bf16 or fp16")->capture_default_str();
    attention->add_option("--iters", args->iterations, "timed calls of each direction")->capture_default_str()->check(CLI::Range(1, 100000));
    attention->add_option("--warmup", args->warmup, "untimed forward and backward calls first")->capture_default_str()->check(CLI::Range(0, 1000));
    attention->callback([args, &action] { action = [args] { return run_bench_attention(*args); }; });
}

}  // namespace llmtrain
