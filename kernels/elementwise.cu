// Elementwise kernels: GELU, SwiGLU, add and the fp32 <-> 16-bit casts.
//   GELU (tanh form): y = x/2 (1 + tanh u), u = k (x + 0.044715 x^3), k = sqrt(2/pi);
//     dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) k (1 + 3 * 0.044715 x^2).
//   SwiGLU: x [N, 2F] holds (gate g, up u) per row; y [N, F] = silu(g) u, silu(g) = g sigmoid(g);
//     dy/dg = u sigmoid(g) (1 + g (1 - sigmoid(g))),  dy/du = silu(g).
//   add: out = a + b.   casts: round to nearest even on the way to 16 bits.
// The math is the CPU reference's (src/backend/cpu/cpu_elementwise.cpp), in fp32, each value
// rounded to the element type once, on store. Every output element depends on its own inputs
// only, and each thread loads all of an element's inputs before it stores, so GELU and add
// may run in place (out aliasing an input): no pointer here is __restrict__.
// Memory-bound: each thread moves 16-byte packs (8 elements) in a grid-stride loop when every
// pointer is 16-byte aligned, then the last n % 8 elements one at a time; otherwise all of
// them one at a time.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int block_threads = 256;
constexpr int64_t max_blocks = 16384;  // grid-stride loops cover the rest
constexpr int pack_elems = 8;          // 8 x 16 bits = 16 bytes

// W consecutive elements, aligned as one load of at most 16 bytes.
template <class T, int W>
struct alignas(sizeof(T) * W > 16 ? 16 : sizeof(T) * W) Vec {
    T v[W];
};

// to_float / convert also for fp32, the casts' other side.
using kernels::to_float;
__device__ __forceinline__ float to_float(float v) { return v; }

template <class T>
__device__ __forceinline__ T convert(float v) {
    if constexpr (std::is_same_v<T, float>) {
        return v;
    } else {
        return from_float<T>(v);
    }
}

int grid_for(int64_t work) { return static_cast<int>(std::clamp<int64_t>(ceil_div(work, int64_t{block_threads}), 1, max_blocks)); }

constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float gelu_c = 0.044715f;

struct GeluFwd {
    __device__ float operator()(float x) const { return 0.5f * x * (1.f + tanhf(gelu_k * (x + gelu_c * x * x * x))); }
};

struct GeluBwd {
    __device__ float operator()(float dout, float x) const {
        const float th = tanhf(gelu_k * (x + gelu_c * x * x * x));
        const float dudx = gelu_k * (1.f + 3.f * gelu_c * x * x);
        return dout * (0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * dudx);
    }
};

struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

struct Identity {
    __device__ float operator()(float x) const { return x; }
};

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <int W, class T>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p) {
    return *reinterpret_cast<const Vec<T, W>*>(p);
}

template <int W, class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, W>& v) {
    *reinterpret_cast<Vec<T, W>*>(p) = v;
}

// Applies op to one pack of each input and stores one pack of out. The inputs are loaded
// (as arguments) before the store, so out may alias any of them.
template <class Out, class Op, class... In>
__device__ __forceinline__ void map_pack(Out* out, Op op, Vec<In, pack_elems>... x) {
    Vec<Out, pack_elems> r;
#pragma unroll
    for (int k = 0; k < pack_elems; ++k) r.v[k] = convert<Out>(op(to_float(x.v[k])...));
    store_vec(out, r);
}

// out[i] = op(in[i]...): packs [0, packs) of 8 elements (pointers 16-byte aligned), then
// elements [8 packs, n) one at a time.
template <class Out, class Op, class... In>
__global__ void __launch_bounds__(block_threads) map_kernel(Out* out, int64_t n, int64_t packs, Op op, const In*... in) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    for (int64_t p = first; p < packs; p += stride) {
        const int64_t base = p * pack_elems;
        map_pack(out + base, op, load_vec<pack_elems>(in + base)...);
    }
    for (int64_t i = packs * pack_elems + first; i < n; i += stride) out[i] = convert<Out>(op(to_float(in[i])...));
}

// Calls fn(n, f, gate, up) for this thread's items (grid-stride) of W consecutive features of
// one row: row n = item / (F / W), feature f = W (item % (F / W)); gate and up are the W values
// at x[n, f] and x[n, F + f]. W = 8 needs F % 8 == 0 and 16-byte aligned pointers; W = 1 takes any F.
template <int W, class T, class Fn>
__device__ __forceinline__ void for_each_swiglu_item(const T* x, int64_t N, int64_t F, Fn&& fn) {
    const int64_t per_row = F / W, items = N * per_row;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < items; i += stride) {
        const int64_t n = i / per_row, f = (i - n * per_row) * W;
        const Vec<T, W> g = load_vec<W>(x + n * 2 * F + f);
        const Vec<T, W> u = load_vec<W>(x + n * 2 * F + F + f);
        fn(n, f, g, u);
    }
}

template <class T, int W>
__global__ void __launch_bounds__(block_threads) swiglu_fwd_kernel(T* out, const T* x, int64_t N, int64_t F) {
    for_each_swiglu_item<W>(x, N, F, [&](int64_t n, int64_t f, const Vec<T, W>& g, const Vec<T, W>& u) {
        Vec<T, W> y;
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float gv = to_float(g.v[k]);
            y.v[k] = from_float<T>(gv * sigmoid(gv) * to_float(u.v[k]));
        }
        store_vec(out + n * F + f, y);
    });
}

template <class T, int W>
__global__ void __launch_bounds__(block_threads) swiglu_bwd_kernel(T* dx, const T* dout, const T* x, int64_t N, int64_t F) {
    for_each_swiglu_item<W>(x, N, F, [&](int64_t n, int64_t f, const Vec<T, W>& g, const Vec<T, W>& u) {
        const Vec<T, W> d = load_vec<W>(dout + n * F + f);
        Vec<T, W> dg, du;
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float gv = to_float(g.v[k]), uv = to_float(u.v[k]), dv = to_float(d.v[k]), sg = sigmoid(gv);
            dg.v[k] = from_float<T>(dv * uv * sg * (1.f + gv * (1.f - sg)));
            du.v[k] = from_float<T>(dv * gv * sg);
        }
        store_vec(dx + n * 2 * F + f, dg);
        store_vec(dx + n * 2 * F + F + f, du);
    });
}

template <class Out, class Op, class... In>
void launch_map(const char* kernel, Out* out, int64_t n, cudaStream_t stream, Op op, const In*... in) {
    if (n <= 0) return;
    const bool vec = aligned16(out) && (aligned16(in) && ...);
    const int64_t packs = vec ? n / pack_elems : 0;
    const int64_t work = std::max(packs, n - packs * pack_elems);
    map_kernel<Out, Op, In...><<<grid_for(work), block_threads, 0, stream>>>(out, n, packs, op, in...);
    check_launch(kernel);
}

// Packs of 8 features when each row's gate, up and output start 16-byte aligned.
bool swiglu_vectorizes(int64_t F, std::initializer_list<const void*> ptrs) {
    return F % pack_elems == 0 && std::all_of(ptrs.begin(), ptrs.end(), aligned16);
}

}  // namespace

void launch_gelu_fwd(Half t, void* out, const void* x, int64_t n, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() { launch_map("gelu_fwd", static_cast<T*>(out), n, stream, GeluFwd{}, static_cast<const T*>(x)); });
}

void launch_gelu_bwd(Half t, void* dx, const void* dout, const void* x, int64_t n, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() {
        launch_map("gelu_bwd", static_cast<T*>(dx), n, stream, GeluBwd{}, static_cast<const T*>(dout), static_cast<const T*>(x));
    });
}

void launch_swiglu_fwd(Half t, void* out, const void* x, int64_t N, int64_t F, cudaStream_t stream) {
    if (N <= 0 || F <= 0) return;
    dispatch_half(t, [&]<class T>() {
        T* o = static_cast<T*>(out);
        const T* in = static_cast<const T*>(x);
        if (swiglu_vectorizes(F, {out, x})) {
            swiglu_fwd_kernel<T, pack_elems><<<grid_for(N * F / pack_elems), block_threads, 0, stream>>>(o, in, N, F);
        } else {
            swiglu_fwd_kernel<T, 1><<<grid_for(N * F), block_threads, 0, stream>>>(o, in, N, F);
        }
        check_launch("swiglu_fwd");
    });
}

void launch_swiglu_bwd(Half t, void* dx, const void* dout, const void* x, int64_t N, int64_t F, cudaStream_t stream) {
    if (N <= 0 || F <= 0) return;
    dispatch_half(t, [&]<class T>() {
        T* d = static_cast<T*>(dx);
        const T* dy = static_cast<const T*>(dout);
        const T* in = static_cast<const T*>(x);
        if (swiglu_vectorizes(F, {dx, dout, x})) {
            swiglu_bwd_kernel<T, pack_elems><<<grid_for(N * F / pack_elems), block_threads, 0, stream>>>(d, dy, in, N, F);
        } else {
            swiglu_bwd_kernel<T, 1><<<grid_for(N * F), block_threads, 0, stream>>>(d, dy, in, N, F);
        }
        check_launch("swiglu_bwd");
    });
}

void launch_add(Half t, void* out, const void* a, const void* b, int64_t n, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() {
        launch_map("add", static_cast<T*>(out), n, stream, Sum{}, static_cast<const T*>(a), static_cast<const T*>(b));
    });
}

void launch_add_f32(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) { launch_map("add_f32", out, n, stream, Sum{}, a, b); }

void launch_cast_from_f32(Half t, void* out, const float* in, int64_t n, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() { launch_map("cast_from_f32", static_cast<T*>(out), n, stream, Identity{}, in); });
}

// count += the 16-bit words where a and b differ (an integer atomic: the count, not its
// order, is the result).
__global__ void __launch_bounds__(block_threads) count_differences_kernel(unsigned long long* count, const uint16_t* a, const uint16_t* b, int64_t n) {
    unsigned long long mine = 0;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) mine += a[i] != b[i];
    if (mine) atomicAdd(count, mine);
}

void launch_count_differences(unsigned long long* count, const void* a, const void* b, size_t bytes, cudaStream_t stream) {
    const auto n = static_cast<int64_t>(bytes / 2);
    if (n == 0) return;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, int64_t{block_threads}), 4096));
    count_differences_kernel<<<blocks, block_threads, 0, stream>>>(count, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n);
    check_launch("count_differences");
}

void launch_cast_to_f32(Half t, float* out, const void* in, int64_t n, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() { launch_map("cast_to_f32", out, n, stream, Identity{}, static_cast<const T*>(in)); });
}

}  // namespace llmtrain::kernels
