#include "backend/cuda_host_rules.h"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace llmtrain {

const char* gemm_epilogue_name(GemmEpilogue epilogue) {
    switch (epilogue) {
        case GemmEpilogue::none: return "none";
        case GemmEpilogue::bias: return "bias";
        case GemmEpilogue::gelu_aux_bias: return "gelu_aux_bias";
        case GemmEpilogue::dgelu_bgrad: return "dgelu_bgrad";
    }
    return "?";
}

std::string gemm_fallback_reason(const GemmFacts& f) {
    if (f.m == 1 || f.n == 1 || f.k == 1) return cat("a dimension of 1 (m ", f.m, ", n ", f.n, ", k ", f.k, ")");
    const bool gelu = f.epilogue == GemmEpilogue::gelu_aux_bias || f.epilogue == GemmEpilogue::dgelu_bgrad;
    if (gelu && f.aux_ld % 8 != 0) return cat("the GELU aux matrix's leading dimension ", f.aux_ld, " is not a multiple of 8");
    if (gelu && f.aux_alignment_bytes < 16) return cat("the GELU aux matrix is ", f.aux_alignment_bytes, "-byte aligned, not 16");
    return "";
}

std::string fp8_gemm_problem(const GemmFacts& f) {
    if (!is_fp8(f.a_dtype) && !is_fp8(f.b_dtype)) return "";
    if (!is_fp8(f.a_dtype) || !is_fp8(f.b_dtype))
        return cat("A is ", dtype_name(f.a_dtype), " and B ", dtype_name(f.b_dtype), ": an FP8 GEMM takes both operands in FP8");
    if (f.a_dtype == DType::e5m2 && f.b_dtype == DType::e5m2) return "both operands are e5m2: one must be e4m3";
    if (!f.transpose_a || f.transpose_b)
        return cat("A is ", f.transpose_a ? "" : "not ", "transposed and B is ", f.transpose_b ? "" : "not ",
                   "transposed: FP8 takes only A transposed and B not (\"TN\")");
    if (f.k % 16 != 0) return cat("k = ", f.k, " is not a multiple of 16");
    if (f.lda % 16 != 0 || f.ldb % 16 != 0) return cat("the leading dimensions (A ", f.lda, ", B ", f.ldb, ") are not multiples of 16");
    if (f.a_alignment_bytes < 16 || f.b_alignment_bytes < 16)
        return cat("A is ", f.a_alignment_bytes, "-byte and B ", f.b_alignment_bytes, "-byte aligned, not 16");
    if (f.d_dtype != DType::bf16 && f.d_dtype != DType::f16 && f.d_dtype != DType::f32)
        return cat("D is ", dtype_name(f.d_dtype), ": FP8 GEMMs write bf16, f16 or f32");
    if (f.epilogue != GemmEpilogue::none && f.epilogue != GemmEpilogue::bias)
        return cat("the ", gemm_epilogue_name(f.epilogue), " epilogue: FP8 GEMMs take none but the bias");
    return "";
}

GemmEngine choose_gemm_engine(const GemmFacts& facts, int heuristic_algorithms) {
    if (!gemm_fallback_reason(facts).empty() || heuristic_algorithms < 1) return GemmEngine::fallback_kernel;
    return GemmEngine::cublaslt;
}

std::string cuda_version_text(int version) { return cat(version / 1000, ".", version % 1000 / 10); }

std::string cuda_driver_problem(int driver_version, int runtime_version) {
    if (driver_version <= 0)
        return cat("train.device = \"cuda\": no usable GPU (no NVIDIA driver found; this llmtrain needs one supporting CUDA ", cuda_version_text(runtime_version),
                   " or newer); install it, or set train.device = \"cpu\"");
    if (driver_version < runtime_version)
        return cat("train.device = \"cuda\": the NVIDIA driver supports CUDA ", cuda_version_text(driver_version), " but this llmtrain was built with CUDA ",
                   cuda_version_text(runtime_version), "; update the driver (or use a build of llmtrain made with CUDA ", cuda_version_text(driver_version),
                   " or older), or set train.device = \"cpu\"");
    return "";
}

bool cuda_sync_check_requested(const char* value) {
    if (value == nullptr || *value == '\0' || std::strcmp(value, "off") == 0) return false;
    if (std::strcmp(value, "sync") == 0) return true;
    fail(ErrorKind::config, "environment variable LLMTRAIN_CUDA_CHECK = \"", value, "\": expected \"sync\" (check after every op) or \"off\"");
}

bool gpu_visible(bool cuda_built, bool device_node_present, int runtime_device_count) {
    return cuda_built && (device_node_present || runtime_device_count > 0);
}

bool nvidia_device_node_present() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() > 6 && name.starts_with("nvidia") && std::isdigit(static_cast<unsigned char>(name[6]))) return true;
    }
    return false;
}

void expect_aligned(const char* op, const char* name, const void* address, int64_t row_stride_bytes, int alignment_bytes) {
    const auto a = static_cast<uint64_t>(alignment_bytes);
    if (reinterpret_cast<uintptr_t>(address) % a != 0)
        fail(ErrorKind::unsupported, op, ": ", name, " starts at an address that is not ", alignment_bytes,
             "-byte aligned, which the kernel's vector loads assume (a view at an odd offset?)");
    if (static_cast<uint64_t>(row_stride_bytes) % a != 0)
        fail(ErrorKind::unsupported, op, ": ", name, " has rows of ", row_stride_bytes, " bytes, not a multiple of ", alignment_bytes,
             " bytes, which the kernel's vector loads assume");
}

}  // namespace llmtrain
