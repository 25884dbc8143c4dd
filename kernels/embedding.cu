// Token and position embedding.
//   forward:  out[n] = wte[tokens[n] - vocab_begin] + wpe[pos(n)]
//   backward: dwte[tokens[n] - vocab_begin] += dout[n],  dwpe[pos(n)] += dout[n]
// pos(n) = n % T, less the start of n's document when positions restart (doc_starts), or
// explicit positions[n] (a position outside the table adds and receives nothing).
// With a vocabulary shard, wte holds rows [vocab_begin, vocab_begin + vocab_rows): other
// tokens give a zero row and no gradient.
// The backward scatters rows into shared gradient rows. Atomics would make the sums depend
// on timing, so rows are grouped by token with a stable radix sort (CUB) of (token, row)
// pairs and each group is summed by one block, in row order, into the fp32 gradient; dwpe
// sums each position's rows in sequence order (rows p, p + T, ... without documents; with
// doc_starts or explicit positions, grouped by a second stable sort of (position, row), as
// the tokens are: O(N log N), where checking every row for each position was O(T x N), 4 x
// 10^9 row checks for a 64k-token sequence). Each sum starts from the gradient's old
// value, so the additions happen in the same order as in the CPU reference.
#include <algorithm>
#include <bit>
#include <cstdint>

#include <cub/cub.cuh>

#include "core/error.h"
#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

// One thread per VEC columns of one row, grid-stride.
template <class T, int VEC>
__global__ void embedding_fwd_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t N, int64_t C, int64_t seq_len,
                                     int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions,
                                     int64_t wpe_rows) {
    const int64_t packs_per_row = C / VEC;
    const int64_t total = N * packs_per_row;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t n = idx / packs_per_row, c = (idx % packs_per_row) * VEC;
        const int64_t row = tokens[n] - vocab_begin;
        float acc[VEC] = {};
        if (row >= 0 && row < vocab_rows) add_halves(acc, wte + row * C + c);
        const int64_t p = positions ? positions[n] : n % seq_len - (doc_starts ? doc_starts[n] : 0);
        if (wpe && p >= 0 && p < wpe_rows) add_halves(acc, wpe + p * C + c);
        store_halves(out + n * C + c, acc);
    }
}

// Sort keys: the local row of the token, or vocab_rows (sorted last, skipped) outside the shard.
__global__ void sort_keys_kernel(uint32_t* keys, int32_t* rows, const int32_t* tokens, int64_t N, int64_t vocab_begin, int64_t vocab_rows) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < N; n += stride) {
        const int64_t row = tokens[n] - vocab_begin;
        keys[n] = static_cast<uint32_t>(row >= 0 && row < vocab_rows ? row : vocab_rows);
        rows[n] = static_cast<int32_t>(n);
    }
}

// One block per sorted position; the block at the start of a run of equal keys sums the run's
// dout rows (in row order: the sort is stable) into that token's dwte row, threads over columns.
template <class T, int VEC>
__global__ void dwte_runs_kernel(float* dwte, const T* dout, const uint32_t* keys, const int32_t* rows, int64_t N, int64_t C, uint32_t skip_key) {
    const int64_t s = blockIdx.x;
    const uint32_t key = keys[s];
    if (key == skip_key || (s > 0 && keys[s - 1] == key)) return;
    float* g = dwte + int64_t{key} * C;
    for (int64_t c = int64_t{threadIdx.x} * VEC; c < C; c += int64_t{blockDim.x} * VEC) {
        float acc[VEC];
        load_floats(acc, g + c);
        for (int64_t j = s; j < N && keys[j] == key; ++j) add_halves(acc, dout + int64_t{rows[j]} * C + c);
        store_floats(g + c, acc);
    }
}

// pos(n) under a document mask: n's offset in its document, in [0, min(seq_len, N)).
__global__ void document_positions_kernel(int32_t* positions, int64_t N, int64_t seq_len, const int32_t* doc_starts) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < N; n += stride) positions[n] = static_cast<int32_t>(n % seq_len - doc_starts[n]);
}

// One thread per VEC columns of one position p < min(seq_len, N): rows p, p + T, p + 2T, ...
template <class T, int VEC>
__global__ void dwpe_kernel(float* dwpe, const T* dout, int64_t N, int64_t C, int64_t positions, int64_t seq_len) {
    const int64_t packs_per_row = C / VEC;
    const int64_t total = positions * packs_per_row;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t p = idx / packs_per_row, c = (idx % packs_per_row) * VEC;
        float acc[VEC];
        load_floats(acc, dwpe + p * C + c);
        for (int64_t n = p; n < N; n += seq_len) add_halves(acc, dout + n * C + c);
        store_floats(dwpe + p * C + c, acc);
    }
}

unsigned grid_for(int64_t work) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(work, int64_t{kThreads}), kMaxBlocks))); }

// The scratch of the backward: two key and two value buffers (CUB's double buffer), then
// CUB's temporary storage; each part starts on a 256-byte boundary.
constexpr size_t kAlign = 256;
size_t align_up(size_t bytes) { return ceil_div(bytes, kAlign) * kAlign; }
size_t sort_buffer_bytes(int64_t N) { return 4 * align_up(static_cast<size_t>(N) * sizeof(uint32_t)); }
// Under a document mask, the rows' positions precede the sort's buffers.
size_t position_buffer_bytes(int64_t N) { return align_up(static_cast<size_t>(N) * sizeof(int32_t)); }

// CUB's temporary storage for N pairs sorted on bits [0, end_bit); a size query, no work.
size_t sort_temp_bytes(int64_t N, int end_bit) {
    cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> rows(nullptr, nullptr);
    size_t bytes = 0;
    const cudaError_t status = cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, rows, static_cast<int>(N), 0, end_bit);
    if (status != cudaSuccess) fail(ErrorKind::runtime, "embedding_bwd: CUB radix sort size query: ", cudaGetErrorString(status));
    return bytes;
}

template <class T, int VEC>
void launch_embedding_fwd_typed(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t N, int64_t C, int64_t seq_len,
                                int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions, int64_t wpe_rows,
                                cudaStream_t stream) {
    embedding_fwd_kernel<T, VEC><<<grid_for(N * (C / VEC)), kThreads, 0, stream>>>(static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                                                                                  static_cast<const T*>(wpe), N, C, seq_len, vocab_begin, vocab_rows,
                                                                                  doc_starts, positions, wpe_rows);
    check_launch("embedding_fwd");
}

// Sorts (key, row) pairs and sums each run of equal keys into dwte.
template <class T, int VEC>
void launch_dwte(float* dwte, const void* dout, const int32_t* tokens, int64_t N, int64_t C, int64_t vocab_begin, int64_t vocab_rows, void* scratch,
                 size_t scratch_bytes, cudaStream_t stream) {
    const size_t part = align_up(static_cast<size_t>(N) * sizeof(uint32_t));
    auto* base = static_cast<char*>(scratch);
    cub::DoubleBuffer<uint32_t> keys(reinterpret_cast<uint32_t*>(base), reinterpret_cast<uint32_t*>(base + part));
    cub::DoubleBuffer<int32_t> rows(reinterpret_cast<int32_t*>(base + 2 * part), reinterpret_cast<int32_t*>(base + 3 * part));
    void* temp = base + 4 * part;
    const size_t temp_available = scratch_bytes - 4 * part;

    sort_keys_kernel<<<grid_for(N), kThreads, 0, stream>>>(keys.Current(), rows.Current(), tokens, N, vocab_begin, vocab_rows);
    check_launch("embedding_bwd sort keys");

    // Keys lie in [0, vocab_rows]: sort only the bits they use (fewer radix passes), or all
    // 32 bits (what embedding_bwd_scratch_bytes sized) if that needs more temporary storage.
    int end_bit = std::bit_width(static_cast<uint64_t>(vocab_rows));
    size_t temp_bytes = sort_temp_bytes(N, end_bit);
    if (temp_bytes > temp_available) {
        end_bit = 32;
        temp_bytes = sort_temp_bytes(N, end_bit);
    }
    if (temp_bytes > temp_available)
        fail(ErrorKind::runtime, "embedding_bwd: scratch of ", scratch_bytes, " bytes is smaller than the ", 4 * part + temp_bytes, " the sort needs");
    const cudaError_t status = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, rows, static_cast<int>(N), 0, end_bit, stream);
    if (status != cudaSuccess) fail(ErrorKind::runtime, "embedding_bwd: CUB radix sort: ", cudaGetErrorString(status));
    check_launch("embedding_bwd radix sort");

    const int threads = static_cast<int>(std::clamp<int64_t>(ceil_div(ceil_div(C, int64_t{VEC}), int64_t{32}) * 32, 32, kThreads));
    dwte_runs_kernel<T, VEC><<<static_cast<unsigned>(N), threads, 0, stream>>>(dwte, static_cast<const T*>(dout), keys.Current(), rows.Current(), N, C,
                                                                               static_cast<uint32_t>(vocab_rows));
    check_launch("embedding_bwd dwte");
}

template <class T, int VEC>
void launch_dwpe(float* dwpe, const void* dout, int64_t N, int64_t C, int64_t seq_len, cudaStream_t stream) {
    const int64_t positions = std::min(seq_len, N);
    dwpe_kernel<T, VEC><<<grid_for(positions * (C / VEC)), kThreads, 0, stream>>>(dwpe, static_cast<const T*>(dout), N, C, positions, seq_len);
    check_launch("embedding_bwd dwpe");
}

// dwpe[pos(n)] += dout[n] with positions restarting at documents: the positions are written
// to the scratch's head, then summed as explicit positions are (the rest of the scratch).
template <class T, int VEC>
void launch_document_dwpe(float* dwpe, const void* dout, int64_t N, int64_t C, int64_t seq_len, const int32_t* doc_starts, void* scratch,
                          size_t scratch_bytes, cudaStream_t stream) {
    auto* positions = static_cast<int32_t*>(scratch);
    document_positions_kernel<<<grid_for(N), kThreads, 0, stream>>>(positions, N, seq_len, doc_starts);
    check_launch("embedding_bwd document positions");
    const size_t head = position_buffer_bytes(N);
    launch_dwte<T, VEC>(dwpe, dout, positions, N, C, 0, std::min(seq_len, N), static_cast<char*>(scratch) + head, scratch_bytes - head, stream);
}

}  // namespace

void launch_embedding_fwd(Half t, void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t N, int64_t C, int64_t seq_len,
                          int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions, int64_t wpe_rows,
                          cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 8 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    dispatch_half(t, [&]<class T>() {
        if (vec) launch_embedding_fwd_typed<T, 8>(out, tokens, wte, wpe, N, C, seq_len, vocab_begin, vocab_rows, doc_starts, positions, wpe_rows, stream);
        else launch_embedding_fwd_typed<T, 1>(out, tokens, wte, wpe, N, C, seq_len, vocab_begin, vocab_rows, doc_starts, positions, wpe_rows, stream);
    });
}

size_t embedding_bwd_scratch_bytes(int64_t N) {
    if (N <= 0) return 0;
    return position_buffer_bytes(N) + sort_buffer_bytes(N) + sort_temp_bytes(N, 32);
}

void launch_embedding_bwd(Half t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int64_t N, int64_t C, int64_t seq_len,
                          int64_t vocab_begin, int64_t vocab_rows, const int32_t* doc_starts, const int32_t* positions, int64_t dwpe_rows, void* scratch,
                          size_t scratch_bytes, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    const bool sorts = (dwte && vocab_rows > 0) || (dwpe && positions && dwpe_rows > 0) || (dwpe && doc_starts);
    const size_t sort_bytes = sort_buffer_bytes(N) + (dwpe && doc_starts && !positions ? position_buffer_bytes(N) : 0);
    if (sorts && scratch_bytes < sort_bytes)
        fail(ErrorKind::runtime, "embedding_bwd: scratch of ", scratch_bytes, " bytes is smaller than the sort buffers' ", sort_bytes);
    // 8 columns per thread: 16-byte loads of dout, 2 x 16-byte accesses of the fp32 gradient.
    const bool vec = C % 8 == 0 && aligned16(dout) && aligned16(dwte) && aligned16(dwpe);
    dispatch_half(t, [&]<class T>() {
        if (dwte && vocab_rows > 0) {
            if (vec) launch_dwte<T, 8>(dwte, dout, tokens, N, C, vocab_begin, vocab_rows, scratch, scratch_bytes, stream);
            else launch_dwte<T, 1>(dwte, dout, tokens, N, C, vocab_begin, vocab_rows, scratch, scratch_bytes, stream);
        }
        if (dwpe && positions) {
            // dwpe[positions[n]] += dout[n]: the token path with positions for tokens (the
            // scratch is reused: the stream orders the two sorts).
            if (dwpe_rows <= 0) return;
            if (vec) launch_dwte<T, 8>(dwpe, dout, positions, N, C, 0, dwpe_rows, scratch, scratch_bytes, stream);
            else launch_dwte<T, 1>(dwpe, dout, positions, N, C, 0, dwpe_rows, scratch, scratch_bytes, stream);
        } else if (dwpe && doc_starts) {
            if (vec) launch_document_dwpe<T, 8>(dwpe, dout, N, C, seq_len, doc_starts, scratch, scratch_bytes, stream);
            else launch_document_dwpe<T, 1>(dwpe, dout, N, C, seq_len, doc_starts, scratch, scratch_bytes, stream);
        } else if (dwpe) {
            if (vec) launch_dwpe<T, 8>(dwpe, dout, N, C, seq_len, stream);
            else launch_dwpe<T, 1>(dwpe, dout, N, C, seq_len, stream);
        }
    });
}

}  // namespace llmtrain::kernels
