// Device helpers shared by the kernel files: conversions between the 16-bit element types
// and fp32 (every sum is fp32; values are rounded to the element type once, on store), the
// host-side dispatch from the runtime `Half` tag to a template instantiation, and ceil_div.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace llmtrain::kernels {

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Round to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}

// Calls fn.template operator()<__nv_bfloat16>() or <__half>() for the runtime type tag.
template <class Fn>
inline void dispatch_half(Half t, Fn&& fn) {
    if (t == Half::bf16) {
        fn.template operator()<__nv_bfloat16>();
    } else {
        fn.template operator()<__half>();
    }
}

// ceil(a / b) for positive integers; the result has the common type of a and b.
template <class A, class B>
__host__ __device__ constexpr auto ceil_div(A a, B b) {
    return (a + b - 1) / b;
}

}  // namespace llmtrain::kernels
