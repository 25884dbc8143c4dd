// nvcuda::wmma of the CUDA emulation, for the 16x16x16 shapes with 16-bit inputs (f16, bf16)
// and fp32 accumulators. A fragment holds 8 of the tile's 256 elements per lane; which ones
// is a permutation drawn per run from the seed, so code that only uses the API works and
// code that assumes a lane mapping does not. Loads, stores and mma_sync are warp collectives
// (every lane of the warp with the same pointer and leading dimension); the leading dimension
// must be a multiple of 16 bytes and the pointer 32-byte aligned, and the tile must lie in
// device or shared memory.
#pragma once

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu/emu.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation models the 16x16x16 WMMA shape only");
    static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float> && std::is_void_v<Layout>
                                                   : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) &&
                                                         (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                  "the emulation models f16/bf16 matrix_a/matrix_b fragments with a layout and fp32 accumulators");

public:
    static constexpr int num_elements = 8;
    T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace emu {

// Which element mapping a fragment uses: one permutation per use and layout.
enum class FragmentKind { a_row, a_col, b_row, b_col, accumulator };
enum class ElementType { f16, bf16, f32 };

template <class T>
constexpr ElementType element_type_of() {
    if constexpr (std::is_same_v<T, __half>) return ElementType::f16;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return ElementType::bf16;
    else return ElementType::f32;
}

template <class Use, class Layout>
constexpr FragmentKind fragment_kind_of() {
    if constexpr (std::is_same_v<Use, nvcuda::wmma::matrix_a>) return std::is_same_v<Layout, nvcuda::wmma::row_major> ? FragmentKind::a_row : FragmentKind::a_col;
    else if constexpr (std::is_same_v<Use, nvcuda::wmma::matrix_b>) return std::is_same_v<Layout, nvcuda::wmma::row_major> ? FragmentKind::b_row : FragmentKind::b_col;
    else return FragmentKind::accumulator;
}

// Warp collectives (scheduler.cpp). `elements` is this lane's fragment storage.
void wmma_load(Site site, FragmentKind kind, ElementType type, void* elements, const void* src, unsigned ldm, bool col_major);
void wmma_store(Site site, void* dst, const float* elements, unsigned ldm, bool col_major);
void wmma_mma(Site site, ElementType type, float* d, const void* a, bool a_col, const void* b, bool b_col, const float* c);

template <class T>
T element_from_float(float v) {
    if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
    else return v;
}

}  // namespace emu

namespace nvcuda::wmma {

template <class Use, class T, class Layout>
void load_matrix_sync_at(emu::Site site, fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    emu::wmma_load(site, emu::fragment_kind_of<Use, Layout>(), emu::element_type_of<T>(), f.x, p, ldm, std::is_same_v<Layout, col_major>);
}
inline void load_matrix_sync_at(emu::Site site, fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t layout) {
    emu::wmma_load(site, emu::FragmentKind::accumulator, emu::ElementType::f32, f.x, p, ldm, layout == mem_col_major);
}
inline void store_matrix_sync_at(emu::Site site, float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
    emu::wmma_store(site, p, f.x, ldm, layout == mem_col_major);
}
template <class Use, class T, class Layout, class V>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const V& value) {
    for (T& e : f.x) e = emu::element_from_float<T>(static_cast<float>(value));
}
template <class T, class LA, class LB>
void mma_sync_at(emu::Site site, fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                 const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    emu::wmma_mma(site, emu::element_type_of<T>(), d.x, a.x, std::is_same_v<LA, col_major>, b.x, std::is_same_v<LB, col_major>, c.x);
}

}  // namespace nvcuda::wmma

// The collectives carry their call site, so that lanes meeting at different ones are reported.
#define load_matrix_sync(...) load_matrix_sync_at(EMU_SITE, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync_at(EMU_SITE, __VA_ARGS__)
#define mma_sync(...) mma_sync_at(EMU_SITE, __VA_ARGS__)
