// The CUDA backend's host-side decisions, kept free of CUDA headers so that they are built
// and unit-tested on every machine: which engine runs a GEMM, whether the driver can run
// this build's runtime, the alignment the vectorized and WMMA kernels assume, and the
// LLMTRAIN_CUDA_CHECK switch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace llmtrain {

// What a GEMM does after the product (cuBLASLt's epilogues of the same names):
//   bias:          D = A B + bias (bias per row of the column-major D)
//   gelu_aux_bias: aux = A B + bias (the pre-activation, kept for the backward), D = gelu(aux)
//   dgelu_bgrad:   D = (A B) * gelu'(aux), bias_grad = sums of D's rows (over n)
// The bias is optional in gelu_aux_bias and the bias gradient in dgelu_bgrad (cuBLASLt's
// GELU_AUX and DGELU).
enum class GemmEpilogue { none, bias, gelu_aux_bias, dgelu_bgrad };
const char* gemm_epilogue_name(GemmEpilogue epilogue);

// What the engine choice looks at: the dimensions and, for the GELU epilogues, the aux
// matrix's leading dimension (elements) and address alignment (bytes); for FP8 operands
// their dtypes, transposes, leading dimensions (elements) and alignments (bytes).
struct GemmFacts {
    int64_t m = 0, n = 0, k = 0;
    GemmEpilogue epilogue = GemmEpilogue::none;
    int64_t aux_ld = 0;
    int aux_alignment_bytes = 256;
    DType a_dtype = DType::bf16, b_dtype = DType::bf16, d_dtype = DType::bf16;
    bool transpose_a = false, transpose_b = false;
    int64_t lda = 0, ldb = 0;
    int a_alignment_bytes = 256, b_alignment_bytes = 256;
};

// Why cuBLASLt cannot run a GEMM with FP8 operands on Hopper ("" when it can, and for a GEMM
// without FP8 operands). There is no fallback kernel for FP8: such a GEMM is refused with
// this reason. cuBLASLt's FP8 rules: both A and B in FP8 and not both e5m2; "TN" (A
// transposed, B not: for row-major weights [out, in] and inputs [tokens, in], the forward's
// natural layout; the backward's GEMMs need transposed copies); 16-byte aligned operands
// with leading dimensions of a multiple of 16 bytes; D in bf16, f16 or f32. Also ours: k a
// multiple of 16 (as Transformer Engine requires of FP8 tensors' last dimension) and no
// epilogue but the bias.
std::string fp8_gemm_problem(const GemmFacts& facts);

// Why cuBLASLt is not even asked for an algorithm ("" when it is): a dimension of 1 (a
// one-token prompt while sampling gives n = 1; its heuristic may have nothing, or a kernel
// whose matrix-vector shape it handles badly), or an aux matrix cuBLASLt's GELU epilogues
// refuse (its leading dimension must be a multiple of 8 and its address 16-byte aligned).
std::string gemm_fallback_reason(const GemmFacts& facts);

enum class GemmEngine { cublaslt, fallback_kernel };
// cuBLASLt when it may be asked and its heuristic returned an algorithm; otherwise the
// simple CUDA kernel, which computes the same thing for every shape.
GemmEngine choose_gemm_engine(const GemmFacts& facts, int heuristic_algorithms);

// Versions as CUDA encodes them, 1000 * major + 10 * minor ("12.4").
std::string cuda_version_text(int version);
// An error message when the driver cannot run code built with `runtime_version`
// (CUDART_VERSION at build time): no driver (0), or one older than the runtime; "" when it
// can. The message names both versions and what to do.
std::string cuda_driver_problem(int driver_version, int runtime_version);

// LLMTRAIN_CUDA_CHECK: unset, "" or "off": no extra checks; "sync": the backend
// synchronizes and checks for a CUDA error after every op, so an asynchronous fault names
// the op that caused it. Any other value is a config error naming the variable.
bool cuda_sync_check_requested(const char* value);

// Whether a GPU is visible to this process: a CUDA build, and an NVIDIA device node or a
// device the runtime counts. The GPU tests skip only when none is; a visible GPU that the
// backend refuses (driver, compute capability) is a failure, not a skip.
bool gpu_visible(bool cuda_built, bool device_node_present, int runtime_device_count);
// Whether /dev holds an NVIDIA GPU node (/dev/nvidia0, /dev/nvidia1, ...).
bool nvidia_device_node_present();

// The alignment a kernel's vectorized loads or WMMA fragments assume: the address of
// `name` and its row stride (bytes; 0: one row) must be multiples of alignment_bytes. A
// violation is an unsupported error naming the op, the tensor and the alignment expected.
void expect_aligned(const char* op, const char* name, const void* address, int64_t row_stride_bytes, int alignment_bytes);

}  // namespace llmtrain
