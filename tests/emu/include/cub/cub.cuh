// CUB's DeviceRadixSort::SortPairs for the CUDA emulation: a stable sort on the key bits
// [begin_bit, end_bit) done on the host when called, with CUB's contract for the arguments:
// a null temporary storage is a size query, a smaller one than asked is an error, the buffers
// must be device memory, and with DoubleBuffers the result is in the buffers that Current()
// names afterwards (the selector flips) while the other pair is left poisoned, as CUB may
// alter both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_runtime_api.h"

namespace emu {
// The temporary storage the stand-in asks for (at least one byte, so that it is checked).
inline size_t radix_sort_temp_bytes(int num_items) { return 256 + 4 * static_cast<size_t>(std::max(num_items, 0)); }
}  // namespace emu

namespace cub {

template <class T>
struct DoubleBuffer {
    T* d_buffers[2] = {nullptr, nullptr};
    int selector = 0;
    DoubleBuffer() = default;
    DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
    T* Current() { return d_buffers[selector]; }
    T* Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
    template <class K, class V>
    static cudaError_t SortPairs(void* temp, size_t& temp_bytes, DoubleBuffer<K>& keys, DoubleBuffer<V>& values, int num_items, int begin_bit = 0,
                                 int end_bit = sizeof(K) * 8, cudaStream_t = nullptr, bool = false) {
        if (!temp) {
            temp_bytes = emu::radix_sort_temp_bytes(num_items);
            return cudaSuccess;
        }
        if (cudaError_t status = check(temp, temp_bytes, num_items, begin_bit, end_bit); status != cudaSuccess) return status;
        const size_t n = static_cast<size_t>(num_items);
        emu::check_access(keys.Current(), n * sizeof(K), "SortPairs keys");
        emu::check_access(keys.Alternate(), n * sizeof(K), "SortPairs keys (alternate)");
        emu::check_access(values.Current(), n * sizeof(V), "SortPairs values");
        emu::check_access(values.Alternate(), n * sizeof(V), "SortPairs values (alternate)");
        sort(keys.Current(), keys.Alternate(), values.Current(), values.Alternate(), n, begin_bit, end_bit);
        std::memset(static_cast<void*>(keys.Current()), 0xff, n * sizeof(K));
        std::memset(static_cast<void*>(values.Current()), 0xff, n * sizeof(V));
        keys.selector ^= 1;
        values.selector ^= 1;
        return cudaSuccess;
    }

    template <class K, class V>
    static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in, V* values_out, int num_items,
                                 int begin_bit = 0, int end_bit = sizeof(K) * 8, cudaStream_t = nullptr, bool = false) {
        if (!temp) {
            temp_bytes = emu::radix_sort_temp_bytes(num_items);
            return cudaSuccess;
        }
        if (cudaError_t status = check(temp, temp_bytes, num_items, begin_bit, end_bit); status != cudaSuccess) return status;
        const size_t n = static_cast<size_t>(num_items);
        emu::check_access(keys_in, n * sizeof(K), "SortPairs keys_in");
        emu::check_access(keys_out, n * sizeof(K), "SortPairs keys_out");
        emu::check_access(values_in, n * sizeof(V), "SortPairs values_in");
        emu::check_access(values_out, n * sizeof(V), "SortPairs values_out");
        sort(keys_in, keys_out, values_in, values_out, n, begin_bit, end_bit);
        return cudaSuccess;
    }

private:
    static cudaError_t check(void* temp, size_t temp_bytes, int num_items, int begin_bit, int end_bit) {
        if (num_items < 0 || begin_bit < 0 || end_bit < begin_bit || temp_bytes < emu::radix_sort_temp_bytes(num_items)) return cudaErrorInvalidValue;
        emu::check_access(temp, temp_bytes, "SortPairs temporary storage");
        return cudaSuccess;
    }

    template <class K, class V>
    static void sort(const K* keys_in, K* keys_out, const V* values_in, V* values_out, size_t n, int begin_bit, int end_bit) {
        using U = std::make_unsigned_t<K>;
        const int bits = end_bit - begin_bit;
        const U mask = bits >= static_cast<int>(sizeof(U) * 8) ? static_cast<U>(~U{0}) : static_cast<U>((U{1} << bits) - 1);
        const auto digit = [&](size_t i) { return static_cast<U>(static_cast<U>(keys_in[i]) >> begin_bit) & mask; };
        std::vector<size_t> order(n);
        std::iota(order.begin(), order.end(), size_t{0});
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return digit(a) < digit(b); });
        std::vector<K> k(n);
        std::vector<V> v(n);
        for (size_t i = 0; i < n; ++i) {
            k[i] = keys_in[order[i]];
            v[i] = values_in[order[i]];
        }
        std::copy(k.begin(), k.end(), keys_out);
        std::copy(v.begin(), v.end(), values_out);
    }
};

}  // namespace cub
