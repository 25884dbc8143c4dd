#include "backend/cuda/gemm_cublaslt.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "kernels/kernels.h"

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
        case DType::e4m3: return CUDA_R_8F_E4M3;
        case DType::e5m2: return CUDA_R_8F_E5M2;
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

// The cuBLASLt epilogue of a call: GELU_AUX and DGELU are the GELU epilogues without the bias
// or its gradient.
cublasLtEpilogue_t lt_epilogue(const GemmCall& c) {
    switch (c.epilogue) {
        case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
        case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
        case GemmEpilogue::gelu_aux_bias: return c.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        case GemmEpilogue::dgelu_bgrad: return c.bias_grad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_aux(GemmEpilogue e) { return e == GemmEpilogue::gelu_aux_bias || e == GemmEpilogue::dgelu_bgrad; }

GemmFacts facts_of(const GemmCall& c) {
    GemmFacts f;
    f.m = c.m, f.n = c.n, f.k = c.k;
    f.epilogue = c.epilogue;
    f.aux_ld = c.ldaux;
    f.aux_alignment_bytes = uses_aux(c.epilogue) ? alignment_of(c.aux) : 256;
    f.a_dtype = c.a_dtype, f.b_dtype = c.b_dtype, f.d_dtype = c.d_dtype;
    f.transpose_a = c.transpose_a, f.transpose_b = c.transpose_b;
    f.lda = c.lda, f.ldb = c.ldb;
    f.a_alignment_bytes = alignment_of(c.a), f.b_alignment_bytes = alignment_of(c.b);
    return f;
}

// "m 64 x n 32 x k 128 (e4m3 x e4m3 -> bf16, epilogue none)"
std::string describe(const GemmCall& c) {
    const std::string ab = c.a_dtype == c.b_dtype ? dtype_name(c.a_dtype) : cat(dtype_name(c.a_dtype), " x ", dtype_name(c.b_dtype));
    return cat("m ", c.m, " x n ", c.n, " x k ", c.k, " (", ab, " -> ", dtype_name(c.d_dtype), ", epilogue ", gemm_epilogue_name(c.epilogue), ")");
}

kernels::Half half_type(DType dtype, const char* op) {
    if (dtype == DType::bf16) return kernels::Half::bf16;
    if (dtype == DType::f16) return kernels::Half::f16;
    fail(ErrorKind::unsupported, op, ": the GEMM inputs have dtype ", dtype_name(dtype), "; expected bf16 or f16");
}

}  // namespace

CublasLtMatmul::CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes, GemmTuningHooks hooks)
    : stream_(stream), hooks_(std::move(hooks)), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    check_lt(cublasLtCreate(&handle_), "matmul", "handle creation");
}

CublasLtMatmul::~CublasLtMatmul() {
    for (auto& [key, plan] : plans_) {
        if (plan.engine == GemmEngine::fallback_kernel && !plan.desc) continue;
        cublasLtMatrixLayoutDestroy(plan.a);
        cublasLtMatrixLayoutDestroy(plan.b);
        cublasLtMatrixLayoutDestroy(plan.d);
        cublasLtMatmulDescDestroy(plan.desc);
    }
    if (handle_) cublasLtDestroy(handle_);
}

CublasLtMatmul::Plan& CublasLtMatmul::plan_for(const GemmCall& c, const char* op) {
    const Key key{c.m, c.n, c.k, c.transpose_a, c.transpose_b, c.lda, c.ldb, c.ldd, c.a_dtype, c.d_dtype, c.bias != nullptr,
                  alignment_of(c.a), alignment_of(c.b), alignment_of(c.d), c.bias ? alignment_of(c.bias) : 0,
                  c.epilogue, c.bias_grad != nullptr, c.ldaux, uses_aux(c.epilogue) ? alignment_of(c.aux) : 0,
                  c.b_dtype, c.d_amax != nullptr, c.fast_accumulate};
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    return plans_.emplace(key, build(c, key, op)).first->second;
}

CublasLtMatmul::Plan CublasLtMatmul::build(const GemmCall& c, const Key& key, const char* op) {
    Plan p;
    const GemmFacts facts = facts_of(c);
    const bool fp8 = is_fp8(c.a_dtype) || is_fp8(c.b_dtype);
    if (const std::string reason = fp8_gemm_problem(facts); !reason.empty()) fail(ErrorKind::unsupported, op, ": FP8 GEMM ", describe(c), ": ", reason);
    if (const std::string reason = gemm_fallback_reason(facts); !fp8 && !reason.empty()) {
        log_debug(op, ": GEMM m ", c.m, " x n ", c.n, " x k ", c.k, " (", gemm_epilogue_name(c.epilogue), ") runs the fallback kernel: ", reason);
        p.engine = GemmEngine::fallback_kernel;
        return p;
    }
    check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "descriptor");
    const cublasOperation_t ta = c.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), op, "transpose A");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), op, "transpose B");
    const cublasLtEpilogue_t epilogue = lt_epilogue(c);
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), op, "epilogue");
    if (uses_aux(c.epilogue)) {
        const int64_t ldaux = c.ldaux;
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux), op, "aux leading dimension");
    }
    if (fp8) {
        const int8_t fast = c.fast_accumulate ? 1 : 0;
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), op, "FP8 fast accumulation");
    }
    if (epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        // The bias gradient in fp32 (by default it would take D's 16-bit type).
        const cudaDataType_t bias_type = CUDA_R_32F;
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type), op, "bias gradient type");
    }
    // Stored (column-major) shapes: A is m x k, or k x m when transposed; likewise B.
    const auto rows_a = static_cast<uint64_t>(c.transpose_a ? c.k : c.m), cols_a = static_cast<uint64_t>(c.transpose_a ? c.m : c.k);
    const auto rows_b = static_cast<uint64_t>(c.transpose_b ? c.n : c.k), cols_b = static_cast<uint64_t>(c.transpose_b ? c.k : c.n);
    check_lt(cublasLtMatrixLayoutCreate(&p.a, cuda_type(c.a_dtype), rows_a, cols_a, c.lda), op, "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&p.b, cuda_type(c.b_dtype), rows_b, cols_b, c.ldb), op, "layout B");
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
    cublasLtMatmulHeuristicResult_t results[max_candidates] = {};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, preference, max_candidates, results, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS) found = 0;
    p.engine = choose_gemm_engine(facts, found);
    if (fp8 && p.engine != GemmEngine::cublaslt)
        fail(ErrorKind::unsupported, op, ": FP8 GEMM ", describe(c), ": cuBLASLt has no algorithm for it (status ", static_cast<int>(status),
             ") and no other kernel computes FP8");
    // Hopper's cuBLASLt has no DGELU_BGRAD with an fp32 bias gradient: expected, and the
    // caller reduces the bias itself; any other gap is worth a warning.
    const bool expected_gap = c.epilogue == GemmEpilogue::dgelu_bgrad && c.bias_grad;
    if (p.engine == GemmEngine::fallback_kernel && !expected_gap)
        log_warn(op, ": cuBLASLt has no algorithm for ", describe(c), "; ",
                 uses_aux(c.epilogue) ? "the op runs unfused (the plain GEMM, then the GELU kernel)" : "this GEMM runs the slower fallback kernel");
    for (int i = 0; i < found; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
    if (!p.candidates.empty()) p.algo = p.candidates.front();
    p.tuned = p.candidates.size() < 2;
    return p;
}

void CublasLtMatmul::launch(Plan& p, const GemmCall& c, const cublasLtMatmulAlgo_t& algo, const Outputs& out, const char* op) {
    if (c.bias) check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias), op, "bias pointer");
    if (c.bias_grad)
        check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &out.bias_grad_scratch, sizeof out.bias_grad_scratch), op,
                 "bias gradient pointer");
    if (uses_aux(c.epilogue)) check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &out.aux, sizeof out.aux), op, "aux pointer");
    if (is_fp8(c.a_dtype)) set_fp8_pointers(p, c, op);
    const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
    // C is the call's own D (beta = 1 accumulates into it); the result goes to out.d.
    check_lt(cublasLtMatmul(handle_, p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d, p.d, out.d, p.d, &algo, workspace_, workspace_bytes_, stream_), op,
             "matmul");
}

// The scales and the amax are pointers into device memory that may change from call to call
// (a plan is shared by every GEMM of its shape): set at each launch, as the bias is.
void CublasLtMatmul::set_fp8_pointers(Plan& p, const GemmCall& c, const char* op) {
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.a_scale_inv, sizeof c.a_scale_inv), op, "A scale pointer");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.b_scale_inv, sizeof c.b_scale_inv), op, "B scale pointer");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &c.d_amax, sizeof c.d_amax), op, "D amax pointer");
}

namespace {
// Elapsed milliseconds of what `work` enqueues, the host waiting for it.
template <class Work>
float timed_ms(cudaStream_t stream, Work&& work) {
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, stream);
    work();
    cudaEventRecord(stop, stream);
    float ms = 0;
    const bool ok = cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ok ? ms : std::numeric_limits<float>::infinity();
}
}  // namespace

void CublasLtMatmul::tune(Plan& p, const GemmCall& c, const char* op) {
    p.tuned = true;
    const size_t element = dtype_size(c.d_dtype), d_bytes = static_cast<size_t>(c.ldd) * static_cast<size_t>(c.n) * element;
    const bool writes_aux = c.epilogue == GemmEpilogue::gelu_aux_bias;
    const size_t aux_bytes = writes_aux ? static_cast<size_t>(c.ldaux) * static_cast<size_t>(c.n) * element : 0;
    const size_t bias_bytes = c.bias_grad ? static_cast<size_t>(c.m) * sizeof(float) : 0;
    if (d_bytes > tune_max_bytes || d_bytes % 2 != 0 || !hooks_.allocate) return;
    // Scratch: the first choice's D, a candidate's D, aux, the bias gradient, the counter;
    // each at its call's alignment within 256 bytes, so the candidates see the same alignments.
    const auto offset = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 256; };
    const auto round = [](size_t n) { return (n + 511) / 256 * 256; };
    const std::shared_ptr<void> scratch = hooks_.allocate(2 * round(d_bytes) + round(aux_bytes) + round(bias_bytes) + 256);
    char* base = static_cast<char*>(scratch.get());
    char* first_d = base + offset(c.d);
    char* other_d = base + round(d_bytes) + offset(c.d);
    void* aux = writes_aux ? base + 2 * round(d_bytes) + offset(c.aux) : c.aux;
    auto* bias_grad = reinterpret_cast<float*>(base + 2 * round(d_bytes) + round(aux_bytes));
    auto* differences = reinterpret_cast<unsigned long long*>(base + 2 * round(d_bytes) + round(aux_bytes) + round(bias_bytes));

    const auto time_candidate = [&](const cublasLtMatmulAlgo_t& algo, void* d) {
        const Outputs out{d, aux, bias_grad};
        launch(p, c, algo, out, op);  // warm-up
        float best = std::numeric_limits<float>::infinity();
        for (int rep = 0; rep < 3; ++rep) {
            best = std::min(best, timed_ms(stream_, [&] { launch(p, c, algo, out, op); }));
            if (hooks_.host_waited) hooks_.host_waited();
        }
        return best;
    };
    const float first_ms = time_candidate(p.candidates.front(), first_d);
    float best_ms = first_ms;
    size_t best = 0, equal = 1;
    for (size_t i = 1; i < p.candidates.size(); ++i) {
        const float ms = time_candidate(p.candidates[i], other_d);
        unsigned long long count = 0;
        cudaMemsetAsync(differences, 0, sizeof count, stream_);
        kernels::launch_count_differences(differences, first_d, other_d, d_bytes, stream_);
        cudaMemcpyAsync(&count, differences, sizeof count, cudaMemcpyDeviceToHost, stream_);
        cudaStreamSynchronize(stream_);
        if (hooks_.host_waited) hooks_.host_waited();
        if (count != 0) continue;  // another reduction order: other bits
        ++equal;
        if (ms < best_ms) best_ms = ms, best = i;
    }
    p.algo = p.candidates[best];
    log_debug(op, ": GEMM m ", c.m, " x n ", c.n, " x k ", c.k, " (", gemm_epilogue_name(c.epilogue), "): candidate ", best, " of ", p.candidates.size(),
              " (", equal, " bitwise equal to the first), ", fixed(first_ms * 1e3, 1), " -> ", fixed(best_ms * 1e3, 1), " us");
}

void CublasLtMatmul::run(const GemmCall& c, const char* op) {
    if (c.m == 0 || c.n == 0) return;
    // k = 0 with beta = 1 (dw += dout^T x over no rows) leaves D as it is; cuBLASLt may reject
    // an empty inner dimension, so skip it.
    if (c.k == 0 && c.accumulate && !c.bias) return;
    if (uses_aux(c.epilogue) && !c.aux) fail(ErrorKind::runtime, op, ": the ", gemm_epilogue_name(c.epilogue), " epilogue needs an aux matrix");
    if (c.bias_grad && !c.bias_grad_scratch) fail(ErrorKind::runtime, op, ": a bias gradient needs its scratch vector");
    Plan& p = plan_for(c, op);
    if (p.engine == GemmEngine::fallback_kernel) return run_fallback(c);
    if (!p.tuned) tune(p, c, op);
    launch(p, c, p.algo, Outputs{c.d, c.aux, c.bias_grad_scratch}, op);
    // cuBLASLt writes the bias gradient; the Backend's parameter gradients accumulate.
    if (c.bias_grad) kernels::launch_accumulate(c.bias_grad, c.bias_grad_scratch, c.m, stream_);
}

void CublasLtMatmul::run_fallback(const GemmCall& c) {
    kernels::FallbackGemm g;
    g.m = c.m, g.n = c.n, g.k = c.k;
    g.transpose_a = c.transpose_a, g.transpose_b = c.transpose_b;
    g.a = c.a, g.b = c.b, g.d = c.d;
    g.lda = c.lda, g.ldb = c.ldb, g.ldd = c.ldd;
    g.ab_type = half_type(c.a_dtype, "matmul");
    g.d_f32 = c.d_dtype == DType::f32;
    g.accumulate = c.accumulate;
    g.bias = c.bias;
    g.gelu = c.epilogue == GemmEpilogue::gelu_aux_bias ? kernels::FallbackGemm::Gelu::forward_aux
             : c.epilogue == GemmEpilogue::dgelu_bgrad ? kernels::FallbackGemm::Gelu::backward
                                                      : kernels::FallbackGemm::Gelu::none;
    g.aux = c.aux, g.ld_aux = c.ldaux;
    g.bias_grad = c.bias_grad;
    kernels::launch_gemm_fallback(g, stream_);
}

}  // namespace llmtrain
