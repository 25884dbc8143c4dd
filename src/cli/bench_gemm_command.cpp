// `llmtrain bench gemm`: a linear layer's forward GEMM, out[M, N] = x[M, K] w[N, K]^T, in
// bf16 and in FP8 (e4m3 x e4m3 with per-tensor scales, fast accumulation as the forward uses),
// over the projection shapes of the Llama models we plan (8,192 tokens a micro-batch) or the
// given ones. For each: time and TFLOP/s of the bf16 GEMM, of the FP8 GEMM alone, and of the
// FP8 GEMM with the cast of its input (an activation is cast every micro-batch; a weight once
// per optimizer step, so its cast is not counted), the FP8 speed-up, and how far the FP8
// result is from the bf16 one (max |diff| / max |bf16|; e4m3 keeps 3 mantissa bits).
//
// FLOPs: 2 M N K (a multiply-add is two). On the CPU the FP8 GEMM is the reference's
// emulation (decode, then an f32 GEMM): its figures describe the emulation, not FP8 hardware.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "backend/backend.h"
#include "cli/bench_support.h"
#include "cli/commands.h"
#include "core/error.h"

namespace llmtrain {

namespace {

struct BenchGemmArgs {
    std::vector<std::string> shapes;  // "M,N,K"; empty: the built-in list
    std::string device = "cuda";
    int iterations = 20;
    int warmup = 3;
};

struct GemmShape {
    std::string name;
    int64_t m, n, k;
};

// Llama 3 8B (d 4096, GQA 32:8 heads of 128, d_ff 14336) and 70B (d 8192, 64:8 heads, d_ff
// 28672): fused QKV, attention out, fused gate + up and down, 8,192 tokens.
const std::vector<GemmShape> kShapes = {
    {"llama-8b qkv", 8192, 6144, 4096},      {"llama-8b attn out", 8192, 4096, 4096}, {"llama-8b gate+up", 8192, 28672, 4096},
    {"llama-8b down", 8192, 4096, 14336},    {"llama-70b qkv", 8192, 10240, 8192},    {"llama-70b gate+up", 8192, 57344, 8192},
    {"llama-70b down", 8192, 8192, 28672},
};

GemmShape parse_shape(const std::string& text) {
    const std::vector<int64_t> v = parse_int_list(text);
    if (v.size() != 3 || std::any_of(v.begin(), v.end(), [](int64_t x) { return x < 1; }) || v[2] % 16 != 0)
        fail(ErrorKind::config, "--shape '", text, "': expected M,N,K (tokens, output and input features; positive, K a multiple of 16 as FP8 GEMMs need), e.g. 8192,4096,4096");
    return {"--shape " + text, v[0], v[1], v[2]};
}

OwnedTensor make(Backend& be, DType dtype, Shape shape) {
    return OwnedTensor(dtype, shape, be.device(), [&be](size_t bytes) { return be.allocate(bytes); });
}

// Uniform values in [-1, 1) (weights scaled by 1 / sqrt(K), as an initialization would) in
// the compute dtype: bf16 on the GPU, f32 on the CPU.
OwnedTensor random_matrix(Backend& be, DType dtype, int64_t rows, int64_t cols, double scale, uint64_t seed) {
    OwnedTensor t = make(be, dtype, {rows, cols});
    fill_uniform(be, t, scale, seed);
    return t;
}

// One FP8 operand: its bytes, scale, inverse scale and amax, all on the device.
struct Fp8Operand {
    OwnedTensor bytes, scale, scale_inv, amax;
};

Fp8Operand fp8_operand(Backend& be, int64_t rows, int64_t cols) {
    Fp8Operand o{make(be, DType::e4m3, {rows, cols}), make(be, DType::f32, {1}), make(be, DType::f32, {1}), make(be, DType::f32, {1})};
    const float one = 1.0f;
    be.copy_from_host(o.scale, &one);
    return o;
}

// Current scaling: this tensor's amax gives its scale, then the cast.
void cast(Backend& be, const Tensor& x, Fp8Operand& o) {
    be.fp8_amax({.amax = o.amax, .x = x});
    be.fp8_update_scale({.scale = o.scale, .scale_inv = o.scale_inv, .amax = o.amax, .format = DType::e4m3});
    be.fp8_cast({.out = o.bytes, .x = x, .scale = o.scale});
}

// Milliseconds per call of each op the calls ran, from the backend's per-op timing.
template <class Calls>
OpProfile timed(Backend& be, int warmup, int iterations, Calls&& calls) {
    for (int i = 0; i < warmup; ++i) calls();
    be.synchronize();
    be.set_profiling(true);
    be.profile().reset();
    for (int i = 0; i < iterations; ++i) calls();
    be.synchronize();
    be.set_profiling(false);
    return be.profile();
}

double ms_per_call(const OpProfile& p, Op op) {
    const auto i = static_cast<size_t>(op);
    return p.calls[i] > 0 ? p.seconds[i] * 1e3 / static_cast<double>(p.calls[i]) : 0.0;
}

void bench_shape(Backend& be, DType compute, const GemmShape& s, const BenchGemmArgs& args) {
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const auto tflops = [flops](double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; };
    std::printf("%s: M %lld N %lld K %lld\n", s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k));
    const OwnedTensor x = random_matrix(be, compute, s.m, s.k, 1.0, 1), w = random_matrix(be, compute, s.n, s.k, 1.0 / std::sqrt(static_cast<double>(s.k)), 2);
    const OwnedTensor out = make(be, compute, {s.m, s.n}), out_fp8 = make(be, compute, {s.m, s.n});
    Fp8Operand xq = fp8_operand(be, s.m, s.k), wq = fp8_operand(be, s.n, s.k);
    cast(be, w, wq);  // once per optimizer step: outside the timing

    const OpProfile dense = timed(be, args.warmup, args.iterations, [&] { be.matmul_fwd({.out = out, .x = x, .w = w, .bias = Tensor()}); });
    const double dense_ms = ms_per_call(dense, Op::matmul_fwd);
    const OpProfile fp8 = timed(be, args.warmup, args.iterations, [&] {
        cast(be, x, xq);
        be.matmul_fp8({.out = out_fp8, .a = xq.bytes, .a_scale_inv = xq.scale_inv, .b = wq.bytes, .b_scale_inv = wq.scale_inv, .fast_accumulate = true});
    });
    const double gemm_ms = ms_per_call(fp8, Op::matmul_fp8);
    const double cast_ms = ms_per_call(fp8, Op::fp8_amax) + ms_per_call(fp8, Op::fp8_update_scale) + ms_per_call(fp8, Op::fp8_cast);
    std::printf("    %-4s %-24s %9.3f ms %8.1f TFLOP/s\n", dtype_name(compute), "GEMM", dense_ms, tflops(dense_ms));
    std::printf("    e4m3 %-24s %9.3f ms %8.1f TFLOP/s   %.2fx\n", "GEMM", gemm_ms, tflops(gemm_ms), gemm_ms > 0 ? dense_ms / gemm_ms : 0.0);
    std::printf("    e4m3 %-24s %9.3f ms %8.1f TFLOP/s   %.2fx\n", "GEMM + input amax, cast", gemm_ms + cast_ms, tflops(gemm_ms + cast_ms),
                gemm_ms + cast_ms > 0 ? dense_ms / (gemm_ms + cast_ms) : 0.0);
    std::printf("    e4m3 against %s: max |diff| / max |%s| %.2e\n", dtype_name(compute), dtype_name(compute),
                relative_error(device_values(be, out_fp8), device_values(be, out)));
    std::fflush(stdout);
}

int run_bench_gemm(const BenchGemmArgs& args) {
    std::vector<GemmShape> shapes;
    for (const std::string& text : args.shapes) shapes.push_back(parse_shape(text));
    if (shapes.empty()) shapes = kShapes;
    std::unique_ptr<Backend> be;
    if (args.device == "cuda") be = make_cuda_backend(0, AttentionImpl::native);
    else if (args.device == "cpu") be = make_cpu_backend(0);
    else fail(ErrorKind::config, "--device \"", args.device, "\" (allowed: cuda, cpu)");
    const DType compute = be->device() == Device::cuda ? DType::bf16 : DType::f32;
    std::printf("bench gemm: %s; %d timed calls after %d warm-up, per-op timing\n", be->name().c_str(), args.iterations, args.warmup);
    std::printf("FLOPs: 2*M*N*K. out[M, N] = x[M, K] w[N, K]^T; FP8: e4m3 x e4m3, per-tensor current scaling, fast accumulation%s\n",
                be->device() == Device::cpu ? "; on the CPU FP8 is emulated (decode, then f32 BLAS), not measured hardware" : "");
    for (const GemmShape& s : shapes) bench_shape(*be, compute, s, args);
    return 0;
}

}  // namespace

void register_bench_gemm(CLI::App& bench, CommandAction& action) {
    auto args = std::make_shared<BenchGemmArgs>();
    CLI::App* gemm = bench.add_subcommand("gemm", "A linear layer's GEMM in bf16 and in FP8 (e4m3, per-tensor scales): time, TFLOP/s, speed-up, agreement");
    gemm->add_option("--shape", args->shapes, "M,N,K to measure (repeatable; default: Llama 3 8B's and 70B's projections at 8,192 tokens)");
    gemm->add_option("--device", args->device, "cuda (bf16 and the FP8 tensor cores) or cpu (f32 and the FP8 emulation)")->capture_default_str();
    gemm->add_option("--iters", args->iterations, "timed calls of each")->capture_default_str()->check(CLI::Range(1, 100000));
    gemm->add_option("--warmup", args->warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 1000));
    gemm->callback([args, &action] { action = [args] { return run_bench_gemm(*args); }; });
}

}  // namespace llmtrain
