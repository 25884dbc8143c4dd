// Rotary position embedding (RoFormer, pairs (i, i + D/2) as in Hugging Face Llama), in place
// on heads [0, n_heads) of each row of x [N, width]; head h holds columns [h*D, (h+1)*D).
// For row n at position p = n % seq_len (less its document's start, doc_starts), or the
// explicit positions[n] (a row whose position lies outside the table is left unrotated), and i < D/2, with c = table[p, i] and
// s = sign * table[p, D/2 + i] (sign = -1 for the inverse rotation, which is the backward):
//   x_i' = x_i c - x_{i+D/2} s,   x_{i+D/2}' = x_{i+D/2} c + x_i s
// Each pair is read and written by one thread, so the update in place needs no barrier.
// A thread rotates VEC adjacent pairs (16-byte loads when D/2, width and the pointers allow
// it), in fp32, rounding once on the store.
#include <algorithm>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

// One thread per (row, head, group of VEC pairs), grid-stride.
template <class T, int VEC>
__global__ void rope_kernel(T* x, const float* table, int64_t N, int64_t width, int64_t seq_len, int64_t n_heads, int64_t head_dim, float sign,
                            const int32_t* doc_starts, const int32_t* positions, int64_t table_rows) {
    const int64_t half = head_dim / 2;
    const int64_t groups_per_head = half / VEC;
    const int64_t total = N * n_heads * groups_per_head;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t i = (idx % groups_per_head) * VEC;
        const int64_t head_row = idx / groups_per_head;
        const int64_t h = head_row % n_heads, n = head_row / n_heads;
        const int64_t position = positions ? positions[n] : n % seq_len - (doc_starts ? doc_starts[n] : 0);
        if (position < 0 || position >= table_rows) continue;
        T* x0 = x + n * width + h * head_dim + i;
        T* x1 = x0 + half;
        const float* cos_p = table + position * head_dim + i;
        float a[VEC], b[VEC], c[VEC], s[VEC];
        load_halves(a, x0);
        load_halves(b, x1);
        load_floats(c, cos_p);
        load_floats(s, cos_p + half);
        float out0[VEC], out1[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float sk = sign * s[k];
            out0[k] = a[k] * c[k] - b[k] * sk;
            out1[k] = b[k] * c[k] + a[k] * sk;
        }
        store_halves(x0, out0);
        store_halves(x1, out1);
    }
}

template <class T, int VEC>
void launch_rope_typed(void* x, const float* table, int64_t N, int64_t width, int64_t seq_len, int64_t n_heads, int64_t head_dim, float sign,
                       const int32_t* doc_starts, const int32_t* positions, int64_t table_rows, cudaStream_t stream) {
    const int64_t total = N * n_heads * (head_dim / 2 / VEC);
    const auto blocks = static_cast<unsigned>(std::min(ceil_div(total, int64_t{kThreads}), kMaxBlocks));
    rope_kernel<T, VEC><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(x), table, N, width, seq_len, n_heads, head_dim, sign, doc_starts,
                                                         positions, table_rows);
    check_launch("rope");
}

}  // namespace

void launch_rope(Half t, void* x, const float* table, int64_t N, int64_t width, int64_t seq_len, int64_t n_heads, int64_t head_dim, bool inverse,
                 const int32_t* doc_starts, const int32_t* positions, int64_t table_rows, cudaStream_t stream) {
    const int64_t half = head_dim / 2;
    if (N <= 0 || n_heads <= 0 || half <= 0) return;
    const float sign = inverse ? -1.0f : 1.0f;
    // 8 pairs per thread: 16-byte loads of x (8 halves) and of the table (2 x 4 floats);
    // head_dim % 16 keeps every head, pair and table offset on a 16-byte boundary.
    const bool vec = head_dim % 16 == 0 && width % 8 == 0 && aligned16(x) && aligned16(table);
    dispatch_half(t, [&]<class T>() {
        if (vec) launch_rope_typed<T, 8>(x, table, N, width, seq_len, n_heads, head_dim, sign, doc_starts, positions, table_rows, stream);
        else launch_rope_typed<T, 1>(x, table, N, width, seq_len, n_heads, head_dim, sign, doc_starts, positions, table_rows, stream);
    });
}

}  // namespace llmtrain::kernels
