// An emulation of the CUDA programming model on the CPU, so that kernels/*.cu and the CUDA
// backend (src/backend/cuda) compile with the host C++ compiler and run in the tests. Test
// support only: never linked into llmtrain. tests/emu/README.md says what it models and what
// it does not; in short:
//
//  - A launch runs its blocks one after another; the threads of a block are fibers that
//    switch only at __syncthreads() and at warp collectives (shuffles, votes, __syncwarp,
//    WMMA). Between two barriers the threads run in a different order in each phase
//    (forward, reverse, seeded random), a warp runs ahead as far as its collectives allow,
//    and every launch runs twice under two such schedules (the second with the blocks in
//    reverse order) from the same memory: a result that depends on the order of threads
//    between barriers (a missing __syncthreads) is an error naming the kernel.
//  - A barrier reached while other threads of the block have exited, threads waiting at
//    different barriers, or a warp collective that some lanes never reach, is an error.
//  - Shared memory (static and dynamic) is per block and poisoned (NaN) at each block start.
//  - cudaMalloc returns poisoned host memory between guard zones; the guards are checked
//    after every launch and at cudaFree. WMMA loads and stores are bounds-checked.
//  - WMMA fragments map their elements to lanes by a permutation drawn per run from the
//    seed (LLMTRAIN_EMU_SEED, printed), so only code that uses the API alone works.
// Errors are thrown as emu::Fault (a std::runtime_error) from the launch.
//
// Device code sees the builtins below; the source rewrite (tests/emu/rewrite_cuda_source.cmake)
// turns `kernel<<<grid, block, smem, stream>>>(args)` into emu::launch calls and
// `__shared__` declarations into per-block storage.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---- qualifiers ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
#define __managed__
#define __CUDACC_EMULATED__ 1

// ---- vector types ----------------------------------------------------------------------------
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit as in CUDA
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

// ---- the built-in variables (set by the scheduler before it resumes a thread) ----------------
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

typedef struct CUstream_st* cudaStream_t;

namespace emu {

// Every error the emulation detects in device code or in a runtime call.
class Fault : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Where a barrier or a collective is called from: threads of a warp or block must meet at
// the same one.
struct Site {
    const char* file;
    int line;
};

// ---- barriers and warp collectives (scheduler.cpp) ----
int block_barrier(Site site, int predicate, int reduce);  // reduce: 0 none, 1 count, 2 and, 3 or
void warp_sync(Site site, unsigned mask);
enum class Shuffle { index, up, down, xor_ };
uint64_t warp_shuffle(Site site, Shuffle kind, unsigned mask, uint64_t value, int arg, int width);
enum class Vote { all, any, ballot };
unsigned warp_vote(Site site, Vote kind, unsigned mask, int predicate);
unsigned active_mask();
// The dynamic shared memory of the running block; the storage of one static __shared__ declaration.
void* dynamic_shared();
void* register_static_shared(size_t bytes, size_t alignment);
// A fault in device code: ends the launch with `message`, naming the kernel, block and thread.
[[noreturn]] void device_fault(const std::string& message);
// Throws (host) or faults (device) unless [p, p + bytes) lies in device or shared memory.
void check_access(const void* p, size_t bytes, const char* what);

// ---- launches ----
struct LaunchConfig {
    const char* name;
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
};
inline LaunchConfig cfg(const char* name, dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
    return {name, grid, block, shared_bytes, stream};
}

// The bytes of one kernel parameter: the race check snapshots the allocations they point into.
struct ParamBytes {
    const void* data;
    size_t size;
};
// Runs a launch (every block, under each schedule) and checks it; invoke(context) runs the
// kernel body for the current thread. Launch configuration errors set cudaGetLastError().
void run_launch(const LaunchConfig& config, const void* kernel, void (*invoke)(void*), void* context, const std::vector<ParamBytes>& params);
// The limit set by cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ...).
void set_max_dynamic_shared(const void* kernel, int bytes);

template <class T>
void add_param_bytes(std::vector<ParamBytes>& out, const T& value) {
    if constexpr (std::is_trivially_copyable_v<T>) out.push_back({&value, sizeof(T)});
}

template <class Body, class... A>
struct LaunchState {
    Body body;
    std::tuple<A...> args;
    static void invoke(void* context) {
        auto* s = static_cast<LaunchState*>(context);
        std::tuple<A...> mine = s->args;  // each thread gets its own copies of the arguments
        std::apply(s->body, mine);
    }
};

// `kernel<<<grid, block, smem, stream>>>(args)` after the rewrite:
// `emu::launch(emu::cfg("kernel", grid, block, smem, stream), <address of kernel or null>,
// <a lambda calling kernel>, args)`. The lambda lets template arguments be deduced from the
// arguments as in the CUDA launch; the address (null where the name is not one function)
// finds the limits set by cudaFuncSetAttribute.
template <class Body, class... A>
void launch(const LaunchConfig& config, const void* kernel, Body body, A&&... args) {
    LaunchState<Body, std::decay_t<A>...> state{body, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
    std::vector<ParamBytes> params;
    std::apply([&](const auto&... v) { (add_param_bytes(params, v), ...); }, state.args);
    run_launch(config, kernel, &LaunchState<Body, std::decay_t<A>...>::invoke, &state, params);
}

// One static `__shared__ T name[...]` declaration (Tag: a lambda type unique to the site):
// storage registered once, poisoned at each block start.
template <class A, class Tag>
A& static_shared(Tag) {
    static A* storage = static_cast<A*>(register_static_shared(sizeof(A), alignof(A)));
    return *storage;
}

template <class T>
uint64_t to_bits64(const T& v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move values of at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <class T>
T from_bits64(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

template <class T>
T shfl(Site site, Shuffle kind, unsigned mask, T value, int arg, int width) {
    return from_bits64<T>(warp_shuffle(site, kind, mask, to_bits64(value), arg, width));
}

}  // namespace emu

// The address of a kernel for emu::launch, or null when `kernel` names a template whose
// arguments the launch deduces.
#define EMU_KERNEL_ADDRESS(...)                                                                 \
    ([]() -> const void* {                                                                      \
        if constexpr (requires { &__VA_ARGS__; }) return reinterpret_cast<const void*>(&__VA_ARGS__); \
        return static_cast<const void*>(nullptr); /* a template: the launch deduces it */      \
    }())

// ---- barriers, collectives, fences -----------------------------------------------------------
#define EMU_SITE (::emu::Site{__FILE__, __LINE__})
#define __syncthreads() ((void)::emu::block_barrier(EMU_SITE, 0, 0))
#define __syncthreads_count(p) ::emu::block_barrier(EMU_SITE, (p) ? 1 : 0, 1)
#define __syncthreads_and(p) ::emu::block_barrier(EMU_SITE, (p) ? 1 : 0, 2)
#define __syncthreads_or(p) ::emu::block_barrier(EMU_SITE, (p) ? 1 : 0, 3)
#define __syncwarp(...) ::emu::warp_sync(EMU_SITE, ::emu::detail_mask(__VA_ARGS__))
#define __shfl_sync(mask, v, lane, ...) ::emu::shfl(EMU_SITE, ::emu::Shuffle::index, mask, v, lane, ::emu::detail_width(__VA_ARGS__))
#define __shfl_up_sync(mask, v, d, ...) ::emu::shfl(EMU_SITE, ::emu::Shuffle::up, mask, v, d, ::emu::detail_width(__VA_ARGS__))
#define __shfl_down_sync(mask, v, d, ...) ::emu::shfl(EMU_SITE, ::emu::Shuffle::down, mask, v, d, ::emu::detail_width(__VA_ARGS__))
#define __shfl_xor_sync(mask, v, m, ...) ::emu::shfl(EMU_SITE, ::emu::Shuffle::xor_, mask, v, m, ::emu::detail_width(__VA_ARGS__))
#define __all_sync(mask, p) static_cast<int>(::emu::warp_vote(EMU_SITE, ::emu::Vote::all, mask, (p) ? 1 : 0))
#define __any_sync(mask, p) static_cast<int>(::emu::warp_vote(EMU_SITE, ::emu::Vote::any, mask, (p) ? 1 : 0))
#define __ballot_sync(mask, p) ::emu::warp_vote(EMU_SITE, ::emu::Vote::ballot, mask, (p) ? 1 : 0)
#define __activemask() ::emu::active_mask()

namespace emu {
inline unsigned detail_mask(unsigned mask = 0xffffffffu) { return mask; }
inline int detail_width(int width = 32) { return width; }
}  // namespace emu

// One thread runs at a time and every access is sequentially consistent: fences are no-ops.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

// ---- atomics: trivially atomic, one thread runs at a time ------------------------------------
#define EMU_ATOMIC_OPS(T)                                          \
    inline T atomicAdd(T* p, T v) {                                \
        const T old = *p;                                          \
        *p = old + v;                                              \
        return old;                                                \
    }                                                              \
    inline T atomicExch(T* p, T v) {                               \
        const T old = *p;                                          \
        *p = v;                                                    \
        return old;                                                \
    }
EMU_ATOMIC_OPS(int)
EMU_ATOMIC_OPS(unsigned)
EMU_ATOMIC_OPS(unsigned long long)
EMU_ATOMIC_OPS(float)
EMU_ATOMIC_OPS(double)
#undef EMU_ATOMIC_OPS
#define EMU_ATOMIC_INT_OPS(T)                                                 \
    inline T atomicSub(T* p, T v) {                                           \
        const T old = *p;                                                     \
        *p = old - v;                                                         \
        return old;                                                           \
    }                                                                         \
    inline T atomicMax(T* p, T v) {                                           \
        const T old = *p;                                                     \
        *p = old > v ? old : v;                                               \
        return old;                                                           \
    }                                                                         \
    inline T atomicMin(T* p, T v) {                                           \
        const T old = *p;                                                     \
        *p = old < v ? old : v;                                               \
        return old;                                                           \
    }                                                                         \
    inline T atomicCAS(T* p, T compare, T v) {                                \
        const T old = *p;                                                     \
        if (old == compare) *p = v;                                           \
        return old;                                                           \
    }                                                                         \
    inline T atomicAnd(T* p, T v) {                                           \
        const T old = *p;                                                     \
        *p = old & v;                                                         \
        return old;                                                           \
    }                                                                         \
    inline T atomicOr(T* p, T v) {                                            \
        const T old = *p;                                                     \
        *p = old | v;                                                         \
        return old;                                                           \
    }                                                                         \
    inline T atomicXor(T* p, T v) {                                           \
        const T old = *p;                                                     \
        *p = old ^ v;                                                         \
        return old;                                                           \
    }
EMU_ATOMIC_INT_OPS(int)
EMU_ATOMIC_INT_OPS(unsigned)
EMU_ATOMIC_INT_OPS(unsigned long long)
#undef EMU_ATOMIC_INT_OPS

// ---- loads and math intrinsics ---------------------------------------------------------------
template <class T>
inline T __ldg(const T* p) {
    return *p;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __int_as_float(int v) { return emu::from_bits64<float>(static_cast<uint32_t>(v)); }
inline int __float_as_int(float v) { return static_cast<int>(static_cast<uint32_t>(emu::to_bits64(v))); }
inline float __uint_as_float(unsigned v) { return emu::from_bits64<float>(v); }
inline unsigned __float_as_uint(float v) { return static_cast<unsigned>(emu::to_bits64(v)); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }

// CUDA's overloaded min and max of the device math library (global namespace).
#define EMU_MINMAX(T)                                \
    inline T min(T a, T b) { return b < a ? b : a; } \
    inline T max(T a, T b) { return a < b ? b : a; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
EMU_MINMAX(float)
EMU_MINMAX(double)
#undef EMU_MINMAX
