#include "backend/cuda/gemm_cublaslt.h"

#include "core/error.h"

namespace llmtrain {

namespace {

void check_lt(cublasStatus_t status, const char* op, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS) fail(ErrorKind::runtime, op, ": cuBLASLt ", what, " failed (status ", static_cast<int>(status), ")");
}

cudaDataType_t cuda_type(DType dtype) {
    switch (dtype) {
        case DType::bf16: return CUDA_R_16BF;
        case DType::f16: return CUDA_R_16F;
        case DType::f32: return CUDA_R_32F;
        default: fail(ErrorKind::unsupported, "cuBLASLt GEMM: dtype ", dtype_name(dtype));
    }
}

// The largest power of two (up to 256) dividing the address: what the heuristic may assume.
int alignment_of(const void* p) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    int alignment = 256;
    while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
    return alignment;
}

}  // namespace

CublasLtMatmul::CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    check_lt(cublasLtCreate(&handle_), "matmul", "handle creation");
}

CublasLtMatmul::~CublasLtMatmul() {
    for (auto& [key, plan] : plans_) {
        cublasLtMatrixLayoutDestroy(plan.a);
        cublasLtMatrixLayoutDestroy(plan.b);
        cublasLtMatrixLayoutDestroy(plan.d);
        cublasLtMatmulDescDestroy(plan.desc);
    }
    if (handle_) cublasLtDestroy(handle_);
}

CublasLtMatmul::Plan& CublasLtMatmul::plan_for(const GemmCall& c, const char* op) {
    const Key key{c.m, c.n, c.k, c.transpose_a, c.transpose_b, c.lda, c.ldb, c.ldd, c.ab_dtype, c.d_dtype, c.bias != nullptr,
                  alignment_of(c.a), alignment_of(c.b), alignment_of(c.d), c.bias ? alignment_of(c.bias) : 0};
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    return plans_.emplace(key, build(c, key, op)).first->second;
}

CublasLtMatmul::Plan CublasLtMatmul::build(const GemmCall& c, const Key& key, const char* op) {
    Plan p;
    check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "descriptor");
    const cublasOperation_t ta = c.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), op, "transpose A");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), op, "transpose B");
    if (c.bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), op, "bias epilogue");
    }
    // Stored (column-major) shapes: A is m x k, or k x m when transposed; likewise B.
    const auto rows_a = static_cast<uint64_t>(c.transpose_a ? c.k : c.m), cols_a = static_cast<uint64_t>(c.transpose_a ? c.m : c.k);
    const auto rows_b = static_cast<uint64_t>(c.transpose_b ? c.n : c.k), cols_b = static_cast<uint64_t>(c.transpose_b ? c.k : c.n);
    check_lt(cublasLtMatrixLayoutCreate(&p.a, cuda_type(c.ab_dtype), rows_a, cols_a, c.lda), op, "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&p.b, cuda_type(c.ab_dtype), rows_b, cols_b, c.ldb), op, "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&p.d, cuda_type(c.d_dtype), static_cast<uint64_t>(c.m), static_cast<uint64_t>(c.n), c.ldd), op, "layout D");

    cublasLtMatmulPreference_t preference = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&preference), op, "preference");
    check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_), op,
             "workspace preference");
    const uint32_t align_a = static_cast<uint32_t>(std::get<11>(key)), align_b = static_cast<uint32_t>(std::get<12>(key));
    const uint32_t align_d = static_cast<uint32_t>(std::get<13>(key));
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
        fail(ErrorKind::unsupported, op, ": cuBLASLt has no algorithm for m ", c.m, " x n ", c.n, " x k ", c.k, " (", dtype_name(c.ab_dtype), " -> ",
             dtype_name(c.d_dtype), c.bias ? ", bias" : "", ")");
    p.algo = result.algo;
    return p;
}

void CublasLtMatmul::run(const GemmCall& c, const char* op) {
    if (c.m == 0 || c.n == 0) return;
    // k = 0 with beta = 1 (dw += dout^T x over no rows) leaves D as it is; cuBLASLt may reject
    // an empty inner dimension, so skip it.
    if (c.k == 0 && c.accumulate && !c.bias) return;
    Plan& p = plan_for(c, op);
    if (c.bias) check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias), op, "bias pointer");
    const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
    check_lt(cublasLtMatmul(handle_, p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d, p.d, c.d, p.d, &p.algo, workspace_, workspace_bytes_, stream_), op,
             "matmul");
}

}  // namespace llmtrain
