// GEMMs through cuBLASLt with cached plans. Row-major C = A B^T style products are issued
// as column-major cuBLASLt calls (a row-major [r, c] matrix is a column-major [c, r] one).
// Each distinct (shape, transposes, dtypes, epilogue, alignments) builds its descriptors and
// asks the heuristic for an algorithm once; later calls reuse the plan.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/dtype.h"

namespace llmtrain {

// D[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * D (+ bias[m] per row), column-major.
struct GemmCall {
    int64_t m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false;
    const void* a = nullptr;
    const void* b = nullptr;
    void* d = nullptr;
    int64_t lda = 0, ldb = 0, ldd = 0;
    DType ab_dtype = DType::bf16;  // A and B
    DType d_dtype = DType::bf16;   // C = D
    const void* bias = nullptr;    // dtype d_dtype, length m; null: none
    bool accumulate = false;       // beta = 1
};

class CublasLtMatmul {
public:
    CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes);
    ~CublasLtMatmul();
    CublasLtMatmul(const CublasLtMatmul&) = delete;
    CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;
    // op names the Backend op in errors.
    void run(const GemmCall& call, const char* op);

private:
    using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, DType, DType, bool, int, int, int, int>;
    struct Plan {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    Plan& plan_for(const GemmCall& call, const char* op);
    Plan build(const GemmCall& call, const Key& key, const char* op);

    cublasLtHandle_t handle_ = nullptr;
    cudaStream_t stream_;
    void* workspace_;
    size_t workspace_bytes_;
    std::map<Key, Plan> plans_;
};

}  // namespace llmtrain
