// GEMMs through cuBLASLt with cached plans. Row-major C = A B^T style products are issued
// as column-major cuBLASLt calls (a row-major [r, c] matrix is a column-major [c, r] one).
// Each distinct (shape, transposes, dtypes, epilogue, alignments) builds its descriptors and
// asks the heuristic for up to max_candidates algorithms once; later calls reuse the plan. A
// plan that cuBLASLt cannot serve (choose_gemm_engine in cuda_host_rules.h) runs the
// fallback kernel (kernels/gemm_fallback.cu) instead, with the same semantics.
//
// Candidates timed once per plan, at its first run: each candidate computes the call into
// scratch (the real outputs untouched) a few times, and the fastest of those whose output is
// bitwise the heuristic's first choice's is kept. Only a candidate with the first's reduction
// order can match it bit for bit, so the choice never changes the numbers: runs stay bitwise
// reproducible whichever candidate the timing favours. Outputs over tune_max_bytes keep the
// first choice (their scratch would be large; such GEMMs are few).
//
// cuBLASLt attributes used: TRANSA, TRANSB, EPILOGUE (BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU,
// DGELU_BGRAD), BIAS_POINTER, BIAS_DATA_TYPE (CUDA_R_32F for the bias gradient),
// EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD, and for FP8 operands A_SCALE_POINTER,
// B_SCALE_POINTER, AMAX_D_POINTER and FAST_ACCUM; preferences MAX_WORKSPACE_BYTES and
// MIN_ALIGNMENT_{A,B,C,D}_BYTES.
//
// FP8 (e4m3 / e5m2 operands with their inverse scales): no fallback kernel computes it, so a
// call cuBLASLt cannot serve (fp8_gemm_problem in cuda_host_rules.h, or no algorithm from the
// heuristic) is refused with the reason, naming the op.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/cuda_host_rules.h"
#include "core/dtype.h"

namespace llmtrain {

// D[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * D, then the epilogue (cuda_host_rules.h),
// column-major.
struct GemmCall {
    int64_t m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false;
    const void* a = nullptr;
    const void* b = nullptr;
    void* d = nullptr;
    int64_t lda = 0, ldb = 0, ldd = 0;
    DType a_dtype = DType::bf16, b_dtype = DType::bf16;  // 16-bit both, or FP8 both (fp8_gemm_problem)
    DType d_dtype = DType::bf16;   // C = D
    bool accumulate = false;       // beta = 1
    GemmEpilogue epilogue = GemmEpilogue::none;
    const void* bias = nullptr;    // bias, gelu_aux_bias: dtype d_dtype, length m; null: none
    void* aux = nullptr;           // gelu_aux_bias (written), dgelu_bgrad (read): [m, n] of d_dtype
    int64_t ldaux = 0;
    float* bias_grad = nullptr;    // dgelu_bgrad: [m] fp32, accumulated (+=); null: none
    float* bias_grad_scratch = nullptr;  // [m] fp32 that cuBLASLt's epilogue overwrites first
    // FP8 operands: D = (a_scale_inv * b_scale_inv) op(A) op(B) (+ D), each scale_inv the
    // device fp32 that turns its operand's FP8 values back into the tensor's (1 / the scale
    // it was cast with; null: 1). d_amax, when set, receives max |D| (before D's rounding to
    // its dtype): the next cast's scale under current scaling of an output. fast_accumulate:
    // cuBLASLt's FAST_ACCUM (no periodic promotion of the tensor cores' partial sums; faster,
    // less accurate: Transformer Engine takes it in the forward GEMMs only).
    const float* a_scale_inv = nullptr;
    const float* b_scale_inv = nullptr;
    float* d_amax = nullptr;
    bool fast_accumulate = false;
};

// What the GEMMs need of the backend for tuning: temporary device memory and a count of the
// host waits (a synchronization per timed candidate, at the plan's first run only).
struct GemmTuningHooks {
    std::function<std::shared_ptr<void>(size_t bytes)> allocate;
    std::function<void()> host_waited;
};

class CublasLtMatmul {
public:
    static constexpr int max_candidates = 8;
    static constexpr size_t tune_max_bytes = size_t{256} << 20;
    CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes, GemmTuningHooks hooks);
    ~CublasLtMatmul();
    CublasLtMatmul(const CublasLtMatmul&) = delete;
    CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;
    // op names the Backend op in errors.
    void run(const GemmCall& call, const char* op);
    // Whether cuBLASLt itself serves this call (its plan is built and cached on the first
    // ask). A fused GELU call it does not serve is better run unfused (cuBLASLt's plain GEMM
    // and the GELU kernel) than on the fallback kernel: callers of those epilogues ask first.
    bool served_by_cublaslt(const GemmCall& call, const char* op) { return plan_for(call, op).engine == GemmEngine::cublaslt; }

private:
    using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, DType, DType, bool, int, int, int, int,
                           GemmEpilogue, bool, int64_t, int, DType, bool, bool>;
    struct Plan {
        GemmEngine engine = GemmEngine::cublaslt;
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulAlgo_t algo{};
        std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first
        bool tuned = false;
    };
    // Where a call's outputs go: the call's own, or scratch while tuning.
    struct Outputs {
        void* d;
        void* aux;
        float* bias_grad_scratch;
    };
    Plan& plan_for(const GemmCall& call, const char* op);
    Plan build(const GemmCall& call, const Key& key, const char* op);
    void launch(Plan& p, const GemmCall& c, const cublasLtMatmulAlgo_t& algo, const Outputs& out, const char* op);
    void set_fp8_pointers(Plan& p, const GemmCall& c, const char* op);
    void tune(Plan& p, const GemmCall& c, const char* op);
    void run_fallback(const GemmCall& call);

    cublasLtHandle_t handle_ = nullptr;
    cudaStream_t stream_;
    GemmTuningHooks hooks_;
    void* workspace_;
    size_t workspace_bytes_;
    std::map<Key, Plan> plans_;
};

}  // namespace llmtrain
