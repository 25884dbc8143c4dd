#include "backend/cpu/core_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMTRAIN_X86 1
#endif

namespace llmtrain {

namespace {

// Every chain runs acc = acc * a + b: it converges to b / (1 - a) = 10, so no value ever
// overflows or turns denormal (which would slow the core down and understate its peak).
constexpr float kMultiplier = 0.9999f, kAddend = 0.001f;
constexpr int kChains = 12;

// One timed kernel: returns the FLOPs it did; `sink` keeps the chains' results alive.
using FmaKernel = double (*)(int64_t iterations, float* sink);

// The twelve chains as named locals, so that they live in registers at any optimization
// level; V is the vector type, INIT(x) a V of x in every lane, FMA(x) one chain's step.
// Each chain starts from its own value, read at run time from *sink: chains the compiler
// could prove equal it would compute once.
#define LLMTRAIN_TWELVE_CHAINS(V, INIT, FMA)                                                   \
    const float s = *sink;                                                                   \
    V c0 = INIT(s + 1), c1 = INIT(s + 2), c2 = INIT(s + 3), c3 = INIT(s + 4), c4 = INIT(s + 5), \
      c5 = INIT(s + 6), c6 = INIT(s + 7), c7 = INIT(s + 8), c8 = INIT(s + 9), c9 = INIT(s + 10), \
      c10 = INIT(s + 11), c11 = INIT(s + 12);                                                \
    for (int64_t i = 0; i < iterations; ++i) {                                            \
        c0 = FMA(c0); c1 = FMA(c1); c2 = FMA(c2); c3 = FMA(c3); c4 = FMA(c4); c5 = FMA(c5); \
        c6 = FMA(c6); c7 = FMA(c7); c8 = FMA(c8); c9 = FMA(c9); c10 = FMA(c10); c11 = FMA(c11); \
    }

// The chains summed into *sink (scaled down: the next call starts from it), which keeps
// their work from being optimized away; ADD adds two V, STORE writes a V's LANES floats.
#define LLMTRAIN_SINK_CHAINS(ADD, STORE, LANES)                                                          \
    alignas(64) float lanes[LANES];                                                                  \
    STORE(lanes, ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(ADD(c4, c5), ADD(c6, c7)), ADD(ADD(c8, c9), ADD(c10, c11))))); \
    float total = 0;                                                                                 \
    for (float lane : lanes) total += lane;                                                          \
    *sink = total * 1e-6f;

#if LLMTRAIN_X86
__attribute__((target("avx512f"))) double fma_avx512(int64_t iterations, float* sink) {
    const __m512 a = _mm512_set1_ps(kMultiplier), b = _mm512_set1_ps(kAddend);
#define FMA512(x) _mm512_fmadd_ps(x, a, b)
    LLMTRAIN_TWELVE_CHAINS(__m512, _mm512_set1_ps, FMA512)
#undef FMA512
    LLMTRAIN_SINK_CHAINS(_mm512_add_ps, _mm512_store_ps, 16)
    return 2.0 * 16 * kChains * static_cast<double>(iterations);
}

__attribute__((target("avx2,fma"))) double fma_avx2(int64_t iterations, float* sink) {
    const __m256 a = _mm256_set1_ps(kMultiplier), b = _mm256_set1_ps(kAddend);
#define FMA256(x) _mm256_fmadd_ps(x, a, b)
    LLMTRAIN_TWELVE_CHAINS(__m256, _mm256_set1_ps, FMA256)
#undef FMA256
    LLMTRAIN_SINK_CHAINS(_mm256_add_ps, _mm256_store_ps, 8)
    return 2.0 * 8 * kChains * static_cast<double>(iterations);
}
#endif

// Cores without vector FMA: a multiply and an add per lane, 2 FLOPs, in whatever the
// compiler makes of scalar code.
double mul_add_scalar(int64_t iterations, float* sink) {
#define MULADD(x) ((x) * kMultiplier + kAddend)
    LLMTRAIN_TWELVE_CHAINS(float, static_cast<float>, MULADD)
#undef MULADD
#define PLUS(x, y) ((x) + (y))
#define STORE_ONE(out, x) (out)[0] = (x)
    LLMTRAIN_SINK_CHAINS(PLUS, STORE_ONE, 1)
#undef STORE_ONE
#undef PLUS
    return 2.0 * kChains * static_cast<double>(iterations);
}

#undef LLMTRAIN_SINK_CHAINS
#undef LLMTRAIN_TWELVE_CHAINS

FmaKernel widest_kernel() {
#if LLMTRAIN_X86
    __builtin_cpu_init();
    // __builtin_cpu_supports also asks whether the OS saves the wide registers (XGETBV).
    if (__builtin_cpu_supports("avx512f")) return fma_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return fma_avx2;
#endif
    return mul_add_scalar;
}

double flops_per_second(FmaKernel kernel, int64_t iterations, float* sink) {
    const auto start = std::chrono::steady_clock::now();
    const double flops = kernel(iterations, sink);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return flops / std::max(elapsed.count(), 1e-9);
}

double measure() {
    const FmaKernel kernel = widest_kernel();
    volatile float keep = 0;
    float sink = 0;
    // Grow the run until one takes at least 10 ms (clock granularity, turbo ramp-up), then
    // keep the best of five: anything else running on the core only lowers a run's rate.
    int64_t iterations = 1 << 12;
    for (;;) {
        const auto start = std::chrono::steady_clock::now();
        kernel(iterations, &sink);
        const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
        if (elapsed.count() >= 0.01 || iterations >= (int64_t{1} << 40)) break;
        iterations *= 2;
    }
    double best = 0;
    for (int run = 0; run < 5; ++run) best = std::max(best, flops_per_second(kernel, iterations, &sink));
    keep = sink;
    (void)keep;
    return best / 1e12;
}

}  // namespace

double measured_core_fp32_peak_tflops() {
    static const double peak = measure();
    return peak;
}

}  // namespace llmtrain
