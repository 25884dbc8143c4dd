// The CUDA backend's ops: host-side checks (shape, dtype, device memory), then the launch
// of the kernel (kernels/*.cu) or the cuBLASLt GEMM on the backend's stream.
#include <cmath>
#include <exception>
#include <initializer_list>
#include <set>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "core/fp8.h"
#include "backend/cuda_host_rules.h"
#include "backend/cudnn/cudnn_attention.h"
#include "backend/op_checks.h"
#include "core/attention_head_dims.h"
#include "kernels/kernels.h"
#include "core/log.h"
#include "kernels/launch_check.h"

namespace llmtrain {

// Brackets one op with a pair of CUDA events (when profiling) for its GPU time and, under
// LLMTRAIN_CUDA_CHECK=sync, ends it with a synchronize and an error check naming the op.
class CudaOpScope {
public:
    CudaOpScope(CudaBackend& backend, Op op) : backend_(backend), op_(op), exceptions_at_start_(std::uncaught_exceptions()) {
        if (!backend_.profiling_) return;
        start_ = backend_.take_event();
        if (cudaEventRecord(start_, backend_.stream_) != cudaSuccess) {
            backend_.free_events_.push_back(start_);
            start_ = nullptr;
        }
    }
    // The timing part must not throw (it also runs while an op's error unwinds): a failure
    // to get or record the stop event drops this op's timing instead. The sync check throws
    // only when the op itself completed without an error.
    ~CudaOpScope() noexcept(false) {
        record_stop();
        if (backend_.sync_check_ && std::uncaught_exceptions() == exceptions_at_start_) check_completed();
    }
    CudaOpScope(const CudaOpScope&) = delete;
    CudaOpScope& operator=(const CudaOpScope&) = delete;
    const char* name() const { return op_name(op_); }

private:
    void check_completed() const {
        const cudaError_t launch = cudaGetLastError();
        const cudaError_t sync = cudaStreamSynchronize(backend_.stream_);
        const cudaError_t status = launch != cudaSuccess ? launch : sync;
        if (status != cudaSuccess)
            fail(kernels::cuda_error_kind(status), op_name(op_), ": CUDA error in this op (LLMTRAIN_CUDA_CHECK=sync): ", cudaGetErrorString(status));
    }
    void record_stop() {
        if (!start_) return;
        try {
            cudaEvent_t stop = backend_.take_event();
            if (cudaEventRecord(stop, backend_.stream_) != cudaSuccess) {
                backend_.free_events_.push_back(stop);
                backend_.free_events_.push_back(start_);
                return;
            }
            backend_.pending_.push_back({op_, start_, stop});
        } catch (...) {
        }
    }

    CudaBackend& backend_;
    Op op_;
    int exceptions_at_start_;
    cudaEvent_t start_ = nullptr;
};

namespace {
// The document starts of `rows` tokens on the device (backend.h), or null when absent.
const int32_t* document_starts(const char* op, const Tensor& doc_starts, int64_t rows) {
    if (doc_starts.empty()) return nullptr;
    expect_tensor(op, "doc_starts", doc_starts, {rows}, DType::i32, Device::cuda);
    return static_cast<const int32_t*>(doc_starts.raw());
}

// Explicit positions of `rows` tokens on the device (backend.h), or null when absent; they
// replace doc_starts, so both together are refused. Their range is the caller's (it builds
// them from the sequence layout): reading them here would synchronize the stream, so the
// kernels only keep an out-of-table position from touching memory.
const int32_t* explicit_positions(const char* op, const Tensor& positions, const Tensor& doc_starts, int64_t rows) {
    if (positions.empty()) return nullptr;
    if (!doc_starts.empty()) fail(ErrorKind::shape, op, ": doc_starts and explicit positions given together (positions already hold the restarts)");
    expect_tensor(op, "positions", positions, {rows}, DType::i32, Device::cuda);
    return static_cast<const int32_t*>(positions.raw());
}


using kernels::Half;

bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

Half half_of(const char* op, const char* name, const Tensor& t) {
    if (!is_half(t.dtype()))
        fail(ErrorKind::unsupported, op, ": ", name, " has dtype ", dtype_name(t.dtype()), "; the CUDA backend computes in bf16 or f16");
    return t.dtype() == DType::bf16 ? Half::bf16 : Half::f16;
}

void expect_device(const char* op, const char* name, const Tensor& t) { llmtrain::expect_device(op, name, t, Device::cuda); }

void expect(const char* op, const char* name, const Tensor& t, const Shape& shape, DType dtype) { expect_tensor(op, name, t, shape, dtype, Device::cuda); }

template <class T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.raw()); }
void* ptr_or_null(const Tensor& t) { return t.empty() ? nullptr : t.raw(); }

VocabRows expect_vocab(const char* op, VocabShard shard, int64_t rows) {
    const VocabRows local(shard, rows);
    expect_vocab_rows(op, local);
    return local;
}

}  // namespace


void CudaBackend::embedding_fwd(const EmbeddingFwd& a) {
    const Tensor &out = a.out, &tokens = a.tokens, &wte = a.wte, &wpe = a.wpe;
    const int64_t seq_len = a.seq_len;
    const VocabShard shard = a.vocab;
    CudaOpScope scope(*this, Op::embedding_fwd);
    const char* op = scope.name();
    expect_rank(op, "wte", wte, 2);
    const Half t = half_of(op, "wte", wte);
    const int64_t N = tokens.numel(), V = wte.dim(0), C = wte.dim(1);
    expect(op, "tokens", tokens, {N}, DType::i32);
    expect(op, "out", out, {N, C}, wte.dtype());
    expect_device(op, "wte", wte);
    if (!wpe.empty()) {
        expect_rank(op, "wpe", wpe, 2);
        expect(op, "wpe", wpe, {wpe.dim(0), C}, wte.dtype());
    }
    expect_positions(op, "wpe", wpe, seq_len);
    expect_vocab(op, shard, V);
    const int32_t* starts = document_starts(op, a.doc_starts, N);
    const int32_t* positions = explicit_positions(op, a.positions, a.doc_starts, N);
    kernels::launch_embedding_fwd(t, out.raw(), ptr<int32_t>(tokens), wte.raw(), ptr_or_null(wpe), N, C, seq_len, shard.begin, V, starts, positions,
                                  wpe.empty() ? 0 : wpe.dim(0), stream_);
}

void CudaBackend::embedding_bwd(const EmbeddingBwd& a) {
    const Tensor &dwte = a.dwte, &dwpe = a.dwpe, &dout = a.dout, &tokens = a.tokens;
    const int64_t seq_len = a.seq_len;
    const VocabShard shard = a.vocab;
    CudaOpScope scope(*this, Op::embedding_bwd);
    const char* op = scope.name();
    expect_rank(op, "dout", dout, 2);
    const Half t = half_of(op, "dout", dout);
    const int64_t N = tokens.numel(), C = dout.dim(1);
    expect(op, "tokens", tokens, {N}, DType::i32);
    expect(op, "dout", dout, {N, C}, dout.dtype());
    int64_t V = 0;
    if (!dwte.empty()) {
        expect_rank(op, "dwte", dwte, 2);
        V = dwte.dim(0);
        expect(op, "dwte", dwte, {V, C}, DType::f32);
        expect_vocab(op, shard, V);
    }
    if (!dwpe.empty()) {
        expect_rank(op, "dwpe", dwpe, 2);
        expect(op, "dwpe", dwpe, {dwpe.dim(0), C}, DType::f32);
    }
    // dwpe rows [0, min(seq_len, N)) are written (with explicit positions, the rows they name):
    // seq_len must not pass its positions.
    expect_positions(op, "dwpe", dwpe, seq_len);
    const int32_t* starts = document_starts(op, a.doc_starts, N);
    const int32_t* positions = explicit_positions(op, a.positions, a.doc_starts, N);
    const size_t scratch_bytes = kernels::embedding_bwd_scratch_bytes(N);
    void* scratch = workspace(scratch_bytes);
    kernels::launch_embedding_bwd(t, static_cast<float*>(ptr_or_null(dwte)), static_cast<float*>(ptr_or_null(dwpe)), dout.raw(), ptr<int32_t>(tokens), N, C,
                                  seq_len, shard.begin, V, starts, positions, dwpe.empty() ? 0 : dwpe.dim(0), scratch, scratch_bytes, stream_);
}

namespace {
// A norm's tensors: x 16-bit, statistics and parameter gradients fp32 (op_checks.h).
std::pair<int64_t, int64_t> expect_norm(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const NormTensors& others) {
    half_of(op, "x", x);
    return expect_norm_tensors(op, Device::cuda, DType::f32, x, w, b, others);
}
float* f32_or_null(const Tensor& t) { return static_cast<float*>(ptr_or_null(t)); }
}  // namespace

void CudaBackend::layernorm_fwd(const LayerNormFwd& a) {
    const Tensor &out = a.out, &mean = a.mean, &rstd = a.rstd, &x = a.x, &w = a.w, &b = a.b;
    const double eps = a.eps;
    CudaOpScope scope(*this, Op::layernorm_fwd);
    const auto [N, C] = expect_norm(scope.name(), x, w, b, {{{"out", &out}}, {{"mean", &mean}, {"rstd", &rstd}}, {}});
    const Half t = half_of(scope.name(), "x", x);
    kernels::launch_layernorm_fwd(t, out.raw(), ptr<float>(mean), ptr<float>(rstd), x.raw(), w.raw(), ptr_or_null(b), N, C, static_cast<float>(eps), stream_);
}

void CudaBackend::layernorm_bwd(const LayerNormBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &db = a.db, &dout = a.dout, &x = a.x, &w = a.w, &mean = a.mean, &rstd = a.rstd;
    const bool accumulate_dx = a.accumulate_dx;
    CudaOpScope scope(*this, Op::layernorm_bwd);
    const auto [N, C] = expect_norm(scope.name(), x, w, Tensor(), {{{"dx", &dx}, {"dout", &dout}}, {{"mean", &mean}, {"rstd", &rstd}}, {{"dw", &dw}, {"db", &db}}});
    const Half t = half_of(scope.name(), "x", x);
    void* scratch = workspace(kernels::norm_bwd_scratch_bytes(N, C));
    kernels::launch_layernorm_bwd(t, dx.raw(), f32_or_null(dw), f32_or_null(db), dout.raw(), x.raw(), w.raw(), ptr<float>(mean),
                                  ptr<float>(rstd), N, C, accumulate_dx, scratch, stream_);
}

void CudaBackend::add_norm_fwd(const AddNormFwd& a) {
    CudaOpScope scope(*this, Op::add_norm_fwd);
    const char* op = scope.name();
    const auto [N, C] = a.rms ? expect_norm(op, a.sum, a.w, Tensor(), {{{"out", &a.out}, {"a", &a.a}, {"b", &a.b}}, {{"rstd", &a.rstd}}, {}})
                              : expect_norm(op, a.sum, a.w, a.bias, {{{"out", &a.out}, {"a", &a.a}, {"b", &a.b}}, {{"mean", &a.mean}, {"rstd", &a.rstd}}, {}});
    kernels::launch_add_norm_fwd(half_of(op, "sum", a.sum), a.rms, a.sum.raw(), a.out.raw(), a.rms ? nullptr : ptr<float>(a.mean), ptr<float>(a.rstd),
                                 a.a.raw(), a.b.raw(), a.w.raw(), a.rms ? nullptr : ptr_or_null(a.bias), N, C, static_cast<float>(a.eps), stream_);
}

void CudaBackend::rmsnorm_fwd(const RmsNormFwd& a) {
    const Tensor &out = a.out, &rstd = a.rstd, &x = a.x, &w = a.w;
    const double eps = a.eps;
    CudaOpScope scope(*this, Op::rmsnorm_fwd);
    const auto [N, C] = expect_norm(scope.name(), x, w, Tensor(), {{{"out", &out}}, {{"rstd", &rstd}}, {}});
    const Half t = half_of(scope.name(), "x", x);
    kernels::launch_rmsnorm_fwd(t, out.raw(), ptr<float>(rstd), x.raw(), w.raw(), N, C, static_cast<float>(eps), stream_);
}

void CudaBackend::rmsnorm_bwd(const RmsNormBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &dout = a.dout, &x = a.x, &w = a.w, &rstd = a.rstd;
    const bool accumulate_dx = a.accumulate_dx;
    CudaOpScope scope(*this, Op::rmsnorm_bwd);
    const auto [N, C] = expect_norm(scope.name(), x, w, Tensor(), {{{"dx", &dx}, {"dout", &dout}}, {{"rstd", &rstd}}, {{"dw", &dw}}});
    const Half t = half_of(scope.name(), "x", x);
    void* scratch = workspace(kernels::norm_bwd_scratch_bytes(N, C));
    kernels::launch_rmsnorm_bwd(t, dx.raw(), f32_or_null(dw), dout.raw(), x.raw(), w.raw(), ptr<float>(rstd), N, C, accumulate_dx, scratch, stream_);
}

namespace {
// The GEMMs of a linear layer out[N, OC] = x[N, IC] w[OC, IC]^T (matmul_fwd, matmul_bwd below).
GemmCall linear_fwd_gemm(const Tensor& out, const Tensor& x, const Tensor& w) {
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    GemmCall c;
    c.m = OC, c.n = N, c.k = IC;
    c.transpose_a = true;
    c.a = w.raw(), c.lda = IC;
    c.b = x.raw(), c.ldb = IC;
    c.d = out.raw(), c.ldd = OC;
    c.a_dtype = c.b_dtype = x.dtype();
    c.d_dtype = out.dtype();
    return c;
}

GemmCall linear_dx_gemm(const Tensor& dx, const Tensor& dout, const Tensor& w) {
    const int64_t N = dout.dim(0), IC = w.dim(1), OC = w.dim(0);
    GemmCall c;
    c.m = IC, c.n = N, c.k = OC;
    c.a = w.raw(), c.lda = IC;
    c.b = dout.raw(), c.ldb = OC;
    c.d = dx.raw(), c.ldd = IC;
    c.a_dtype = c.b_dtype = c.d_dtype = w.dtype();
    return c;
}

GemmCall linear_dw_gemm(const Tensor& dw, const Tensor& dout, const Tensor& x) {
    const int64_t N = x.dim(0), IC = x.dim(1), OC = dw.dim(0);
    GemmCall c;
    c.m = IC, c.n = OC, c.k = N;
    c.transpose_b = true;
    c.a = x.raw(), c.lda = IC;
    c.b = dout.raw(), c.ldb = OC;
    c.d = dw.raw(), c.ldd = IC;
    c.a_dtype = c.b_dtype = x.dtype();
    c.d_dtype = DType::f32;
    c.accumulate = true;
    return c;
}

// x [N, IC], w [OC, IC] 16-bit on the device, dout/out [N, OC] in x's dtype; returns N, IC, OC.
struct LinearDims {
    int64_t N, IC, OC;
};
LinearDims expect_linear(const char* op, const Tensor& x, const Tensor& w, const char* out_name, const Tensor& out) {
    expect_rank(op, "x", x, 2);
    expect_rank(op, "w", w, 2);
    half_of(op, "x", x);
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    expect(op, "x", x, {N, IC}, x.dtype());
    expect(op, "w", w, {OC, IC}, x.dtype());
    expect(op, out_name, out, {N, OC}, x.dtype());
    return {N, IC, OC};
}
}  // namespace

// out[N, OC] = x[N, IC] w[OC, IC]^T + bias. A row-major [r, c] matrix is a column-major
// [c, r] one, so cuBLASLt computes D = out^T [OC, N] = op(A) B with A = w (stored [IC, OC],
// transposed: m = OC, k = IC) and B = x (stored [IC, N]: n = N); the bias is per row of D.
void CudaBackend::matmul_fwd(const MatmulFwd& a) {
    const Tensor &out = a.out, &x = a.x, &w = a.w, &bias = a.bias;
    CudaOpScope scope(*this, Op::matmul_fwd);
    const char* op = scope.name();
    expect_rank(op, "x", x, 2);
    expect_rank(op, "w", w, 2);
    half_of(op, "x", x);
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    expect(op, "x", x, {N, IC}, x.dtype());
    expect(op, "w", w, {OC, IC}, x.dtype());
    // An f32 output (the fp32 accumulator written as it is: a MoE router's logits) takes no bias.
    const bool f32_out = out.dtype() == DType::f32 && bias.empty();
    expect(op, "out", out, {N, OC}, f32_out ? DType::f32 : x.dtype());
    if (!bias.empty()) expect(op, "bias", bias, {OC}, x.dtype());
    GemmCall c = linear_fwd_gemm(out, x, w);
    c.bias = ptr_or_null(bias);
    if (c.bias) c.epilogue = GemmEpilogue::bias;
    gemm_->run(c, op);
}

// ---- FP8 (kernels/fp8.cu and cuBLASLt's FP8 GEMMs) ----
namespace {
kernels::Fp8Source fp8_source(const char* op, const Tensor& x) {
    switch (x.dtype()) {
        case DType::bf16: return kernels::Fp8Source::bf16;
        case DType::f16: return kernels::Fp8Source::f16;
        case DType::f32: return kernels::Fp8Source::f32;
        default: fail(ErrorKind::unsupported, op, ": x has dtype ", dtype_name(x.dtype()), "; expected bf16, f16 or f32");
    }
}
}  // namespace

void CudaBackend::fp8_amax(const Fp8Amax& a) {
    CudaOpScope scope(*this, Op::fp8_amax);
    const char* op = scope.name();
    expect_fp8_scalar(op, "amax", a.amax, Device::cuda);
    expect_device(op, "x", a.x, Device::cuda);
    kernels::launch_fp8_amax(ptr<float>(a.amax), a.x.raw(), fp8_source(op, a.x), a.x.numel(), stream_);
}

void CudaBackend::fp8_update_scale(const Fp8UpdateScale& a) {
    CudaOpScope scope(*this, Op::fp8_update_scale);
    const char* op = scope.name();
    for (const auto& [name, t] : {std::pair{"scale", &a.scale}, {"scale_inv", &a.scale_inv}, {"amax", &a.amax}}) expect_fp8_scalar(op, name, *t, Device::cuda);
    kernels::launch_fp8_update_scale(ptr<float>(a.scale), ptr<float>(a.scale_inv), ptr<float>(a.amax), fp8_max(fp8_format_of(a.format)), a.margin, stream_);
}

void CudaBackend::fp8_cast(const Fp8Cast& a) {
    CudaOpScope scope(*this, Op::fp8_cast);
    const char* op = scope.name();
    const auto [rows, cols] = expect_fp8_cast(op, a, Device::cuda);
    if (is_fp8(a.x.dtype())) {
        kernels::launch_fp8_relayout(ptr<uint8_t>(a.out), static_cast<uint8_t*>(ptr_or_null(a.out_t)), static_cast<const uint8_t*>(a.x.raw()), rows, cols, stream_);
        return;
    }
    kernels::Fp8CastArgs k;
    k.out = ptr<uint8_t>(a.out);
    k.out_t = static_cast<uint8_t*>(ptr_or_null(a.out_t));
    k.amax = f32_or_null(a.amax);
    k.counts = static_cast<double*>(ptr_or_null(a.counts));
    k.x = a.x.raw();
    k.source = fp8_source(op, a.x);
    k.scale = ptr<float>(a.scale);
    k.rows = rows, k.cols = cols;
    k.e4m3 = a.out.dtype() == DType::e4m3;
    kernels::launch_fp8_cast(k, stream_);
}

// out[M, N] (row-major) is the column-major D [N, M] = op(A) B with A = b stored [K, N]
// (transposed) and B = a stored [K, M]: the "TN" form Hopper's FP8 GEMMs take.
void CudaBackend::matmul_fp8(const MatmulFp8& a) {
    CudaOpScope scope(*this, Op::matmul_fp8);
    const char* op = scope.name();
    const Fp8GemmDims d = expect_matmul_fp8(op, a, Device::cuda);
    if (a.out.dtype() != DType::bf16 && a.out.dtype() != DType::f16 && a.out.dtype() != DType::f32)
        fail(ErrorKind::shape, op, ": out has dtype ", dtype_name(a.out.dtype()), ", expected bf16, f16 or f32");
    GemmCall c;
    c.m = d.n, c.n = d.m, c.k = d.k;
    c.transpose_a = true, c.transpose_b = false;
    c.a = a.b.raw(), c.b = a.a.raw(), c.d = a.out.raw();
    c.lda = d.k, c.ldb = d.k, c.ldd = d.n;
    c.a_dtype = a.b.dtype(), c.b_dtype = a.a.dtype(), c.d_dtype = a.out.dtype();
    c.a_scale_inv = ptr<float>(a.b_scale_inv), c.b_scale_inv = ptr<float>(a.a_scale_inv);
    c.accumulate = a.accumulate;
    c.fast_accumulate = a.fast_accumulate;
    c.bias = ptr_or_null(a.bias);
    if (c.bias) c.epilogue = GemmEpilogue::bias;
    gemm_->run(c, op);
}

// dx[N, IC] = dout[N, OC] w[OC, IC]: D (m = IC, n = N) = A B with A = w stored [IC, OC],
// B = dout stored [OC, N]. dw[OC, IC] += dout^T x: D (m = IC, n = OC) = A op(B) with
// A = x stored [IC, N], B = dout stored [OC, N] (transposed); fp32 D, beta = 1.
void CudaBackend::matmul_bwd(const MatmulBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &dbias = a.dbias, &dout = a.dout, &x = a.x, &w = a.w;
    CudaOpScope scope(*this, Op::matmul_bwd);
    const char* op = scope.name();
    expect_rank(op, "x", x, 2);
    expect_rank(op, "w", w, 2);
    const Half t = half_of(op, "x", x);
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    expect(op, "x", x, {N, IC}, x.dtype());
    expect(op, "w", w, {OC, IC}, x.dtype());
    expect(op, "dout", dout, {N, OC}, x.dtype());
    if (!dx.empty()) {
        expect(op, "dx", dx, {N, IC}, x.dtype());
        gemm_->run(linear_dx_gemm(dx, dout, w), op);
    }
    if (!dw.empty()) {
        expect(op, "dw", dw, {OC, IC}, DType::f32);
        gemm_->run(linear_dw_gemm(dw, dout, x), op);
    }
    if (!dbias.empty()) {
        expect(op, "dbias", dbias, {OC}, DType::f32);
        void* scratch = workspace(kernels::bias_grad_scratch_bytes(N, OC));
        kernels::launch_bias_grad(t, ptr<float>(dbias), dout.raw(), N, OC, scratch, stream_);
    }
}

// matmul_fwd with cuBLASLt's GELU_AUX_BIAS epilogue: D = act^T = gelu(aux), aux = pre^T
// [OC, N] (leading dimension OC) = w x^T + bias.
// Where cuBLASLt has no fused kernel for the shape (or a dimension is 1), the op runs as the
// Backend's composition of matmul_fwd and gelu_fwd, each timed as itself.
void CudaBackend::matmul_gelu_fwd(const MatmulGeluFwd& a) {
    const char* op = op_name(Op::matmul_gelu_fwd);
    const auto [N, IC, OC] = expect_linear(op, a.x, a.w, "act", a.act);
    expect(op, "pre", a.pre, {N, OC}, a.x.dtype());
    if (!a.bias.empty()) expect(op, "bias", a.bias, {OC}, a.x.dtype());
    GemmCall c = linear_fwd_gemm(a.act, a.x, a.w);
    c.epilogue = GemmEpilogue::gelu_aux_bias;
    c.bias = ptr_or_null(a.bias);
    c.aux = a.pre.raw(), c.ldaux = OC;
    if (!gemm_->served_by_cublaslt(c, op)) return Backend::matmul_gelu_fwd(a);
    CudaOpScope scope(*this, Op::matmul_gelu_fwd);
    gemm_->run(c, op);
}

// The dx GEMM of matmul_bwd with cuBLASLt's DGELU_BGRAD epilogue: D = d_pre^T [IC, N] =
// (w^T dout^T) * gelu'(aux = pre^T), and the sums of D's rows (over the N tokens) are the
// bias gradient of the layer that made pre. dw and dbias as in matmul_bwd.
// cuBLASLt 13.0 has no DGELU_BGRAD with an fp32 bias gradient on Hopper: there the GEMM takes
// the DGELU epilogue alone and the bias gradient is the column sums of d_pre (one read of it,
// instead of a GELU backward pass that reads pre and rewrites d_pre). Unfused, as
// matmul_gelu_fwd, where cuBLASLt has neither.
void CudaBackend::gelu_matmul_bwd(const GeluMatmulBwd& a) {
    const char* op = op_name(Op::gelu_matmul_bwd);
    const auto [N, IC, OC] = expect_linear(op, a.act, a.w, "dout", a.dout);
    const Half t = half_of(op, "act", a.act);
    expect(op, "pre", a.pre, {N, IC}, a.act.dtype());
    expect(op, "d_pre", a.d_pre, {N, IC}, a.act.dtype());
    if (!a.d_pre_bias.empty()) expect(op, "d_pre_bias", a.d_pre_bias, {IC}, DType::f32);
    if (!a.dw.empty()) expect(op, "dw", a.dw, {OC, IC}, DType::f32);
    if (!a.dbias.empty()) expect(op, "dbias", a.dbias, {OC}, DType::f32);
    GemmCall c = linear_dx_gemm(a.d_pre, a.dout, a.w);
    c.epilogue = GemmEpilogue::dgelu_bgrad;
    c.aux = a.pre.raw(), c.ldaux = IC;
    if (!a.d_pre_bias.empty()) {
        c.bias_grad = ptr<float>(a.d_pre_bias);
        c.bias_grad_scratch = static_cast<float*>(workspace(static_cast<size_t>(IC) * sizeof(float)));
    }
    bool bias_apart = false;  // the bias gradient by a column-sum kernel after the GEMM
    if (c.bias_grad && !gemm_->served_by_cublaslt(c, op)) {
        c.bias_grad = c.bias_grad_scratch = nullptr;
        bias_apart = true;
    }
    if (!gemm_->served_by_cublaslt(c, op)) return Backend::gelu_matmul_bwd(a);
    CudaOpScope scope(*this, Op::gelu_matmul_bwd);
    gemm_->run(c, op);
    // The workspace is reused below only by ops enqueued after the GEMM's use of it.
    if (bias_apart) {
        void* scratch = workspace(kernels::bias_grad_scratch_bytes(N, IC));
        kernels::launch_bias_grad(t, ptr<float>(a.d_pre_bias), a.d_pre.raw(), N, IC, scratch, stream_);
    }
    if (!a.dw.empty()) gemm_->run(linear_dw_gemm(a.dw, a.dout, a.act), op);
    if (!a.dbias.empty()) {
        void* scratch = workspace(kernels::bias_grad_scratch_bytes(N, OC));
        kernels::launch_bias_grad(t, ptr<float>(a.dbias), a.dout.raw(), N, OC, scratch, stream_);
    }
}

// Flash attention keeps only the log-sum-exp of each query row: [B, H, T] fp32
// (attention_saved_shape in backend.cpp).

namespace {
// The flash kernels move 16-byte vectors (8 elements) of q, k, v, out and their gradients
// and load WMMA fragments from shared copies of them: every 16-bit tensor's start and row
// stride must be 16-byte aligned, and the fp32 lse 4-byte aligned.
constexpr int attention_vector_bytes = 16;
void expect_attention_aligned(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> halves, const Tensor& saved) {
    for (const auto& [name, t] : halves)
        expect_aligned(op, name, t->raw(), t->dim(1) * static_cast<int64_t>(dtype_size(t->dtype())), attention_vector_bytes);
    expect_aligned(op, "saved", saved.raw(), 0, static_cast<int>(sizeof(float)));
}

void expect_head_groups(const char* op, const AttentionShape& s) {
    if (s.n_heads < 1 || s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0)
        fail(ErrorKind::shape, op, ": ", s.n_heads, " query heads do not group evenly over ", s.n_kv_heads, " key/value heads");
}

void expect_native_head_dim(const char* op, const AttentionShape& s) {
    if (!native_attention_takes(s.head_dim))
        fail(ErrorKind::unsupported, op, ": head_dim ", s.head_dim, "; the flash-attention kernels take ", native_attention_head_dims_text(), " (model.d_model / model.n_heads)");
}
}  // namespace

// cuDNN where it plans the shape (and is wanted), else the native kernels; the same choice
// for forward and backward, whose saved tensor (the log-sum-exp rows) both share.
bool CudaBackend::cudnn_runs(const AttentionShape& s, DType dtype, const char* op) {
    if (!cudnn_) return false;
    const CudnnAttentionReport& report = cudnn_->plan(s, dtype);
    if (report.planned) return true;
    if (attention_impl_ == AttentionImpl::cudnn) fail(ErrorKind::unsupported, op, ": model.attention = \"cudnn\", but cuDNN cannot run ", report.failure);
    static std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> told;
    if (told.insert({s.batch, s.seq_len, s.n_heads, s.n_kv_heads, s.head_dim}).second)
        log_info("attention: cuDNN cannot run ", report.failure, "; the native kernels run this shape");
    return false;
}

std::string CudaBackend::describe_attention(const AttentionShape& s, DType dtype) {
    if (!cudnn_) return cat("native flash kernels (model.attention = \"", attention_impl_name(attention_impl_), "\")");
    const CudnnAttentionReport& r = cudnn_->plan(s, dtype);
    if (!r.planned) return cat("native flash kernels: cuDNN cannot run ", r.failure);
    return cat(cudnn_->describe(), ", graphs with ", r.mask_form, ": forward engine ", r.forward.global_index, " (", r.forward.notes_text(), ", from ",
               r.forward.found_by, "), backward engine ", r.backward.global_index, " (", r.backward.notes_text(), ", from ", r.backward.found_by,
               "), workspace ", fixed(static_cast<double>(r.workspace_bytes) / 1e6, 1), " MB");
}

void CudaBackend::attention_fwd(const AttentionFwd& a) {
    const Tensor &out = a.out, &saved = a.saved, &qkv = a.qkv;
    const AttentionShape& s = a.shape;
    CudaOpScope scope(*this, Op::attention_fwd);
    const char* op = scope.name();
    // cuDNN's graphs mask causally: a document mask runs on the native kernels.
    const int32_t* starts = document_starts(op, a.doc_starts, s.rows());
    expect_head_groups(op, s);
    const Half t = half_of(op, "qkv", qkv);
    expect(op, "qkv", qkv, {s.rows(), s.qkv_width()}, qkv.dtype());
    expect(op, "out", out, {s.rows(), s.out_width()}, qkv.dtype());
    expect(op, "saved", saved, attention_saved_shape(s), DType::f32);
    expect_attention_aligned(op, {{"qkv", &qkv}, {"out", &out}}, saved);
    if (!starts && cudnn_runs(s, qkv.dtype(), op)) {
        void* scratch = workspace(cudnn_->plan(s, qkv.dtype()).workspace_bytes);
        return cudnn_->forward(s, qkv.dtype(), out.raw(), ptr<float>(saved), qkv.raw(), scratch);
    }
    expect_native_head_dim(op, s);
    kernels::launch_attention_fwd(t, out.raw(), ptr<float>(saved), qkv.raw(), s.batch, s.seq_len, s.n_heads, s.n_kv_heads, s.head_dim, starts, stream_);
}

void CudaBackend::attention_bwd(const AttentionBwd& a) {
    const Tensor &dqkv = a.dqkv, &dout = a.dout, &qkv = a.qkv, &out = a.out, &saved = a.saved;
    const AttentionShape& s = a.shape;
    CudaOpScope scope(*this, Op::attention_bwd);
    const char* op = scope.name();
    const int32_t* starts = document_starts(op, a.doc_starts, s.rows());
    expect_head_groups(op, s);
    const Half t = half_of(op, "qkv", qkv);
    expect(op, "qkv", qkv, {s.rows(), s.qkv_width()}, qkv.dtype());
    expect(op, "dqkv", dqkv, {s.rows(), s.qkv_width()}, qkv.dtype());
    expect(op, "out", out, {s.rows(), s.out_width()}, qkv.dtype());
    expect(op, "dout", dout, {s.rows(), s.out_width()}, qkv.dtype());
    expect(op, "saved", saved, attention_saved_shape(s), DType::f32);
    expect_attention_aligned(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}}, saved);
    if (!starts && cudnn_runs(s, qkv.dtype(), op)) {
        void* scratch = workspace(cudnn_->plan(s, qkv.dtype()).workspace_bytes);
        return cudnn_->backward(s, qkv.dtype(), dqkv.raw(), dout.raw(), qkv.raw(), out.raw(), ptr<float>(saved), scratch);
    }
    expect_native_head_dim(op, s);
    void* scratch = workspace(kernels::attention_bwd_scratch_bytes(s.batch, s.seq_len, s.n_heads));
    kernels::launch_attention_bwd(t, dqkv.raw(), dout.raw(), qkv.raw(), out.raw(), ptr<float>(saved), s.batch, s.seq_len, s.n_heads, s.n_kv_heads,
                                  s.head_dim, starts, scratch, stream_);
}

namespace {
void expect_rope(const char* op, const Tensor& x, const Tensor& table, int64_t seq_len, int64_t n_heads, int64_t head_dim) {
    expect_rank(op, "x", x, 2);
    expect_rank(op, "table", table, 2);
    expect(op, "table", table, {table.dim(0), head_dim}, DType::f32);
    expect_device(op, "x", x);
    if (head_dim % 2 != 0 || n_heads * head_dim > x.dim(1) || seq_len > table.dim(0) || seq_len < 1)
        fail(ErrorKind::shape, op, ": ", n_heads, " heads of ", head_dim, " in rows of ", x.dim(1), ", seq_len ", seq_len, " of a ", table.dim(0),
             "-position table");
}
}  // namespace

namespace {
// The positions and the optional document starts of a block (AttentionBlockFwd), and its
// shape: heads grouping evenly, a head dim the kernels take, positive lengths.
template <class Args>
kernels::AttentionBlockDims expect_block(const char* op, const Args& a) {
    const AttentionShape& s = a.shape;
    expect_head_groups(op, s);
    expect_native_head_dim(op, s);
    if (s.batch < 1 || s.seq_len < 1 || a.kv_len < 1)
        fail(ErrorKind::shape, op, ": batch ", s.batch, ", query rows ", s.seq_len, " and key rows ", a.kv_len, " must be positive");
    expect(op, "q_positions", a.q_positions, {s.seq_len}, DType::i32);
    expect(op, "kv_positions", a.kv_positions, {a.kv_len}, DType::i32);
    if (!a.q_first.empty()) expect(op, "q_first", a.q_first, {s.rows()}, DType::i32);
    return {s.batch, s.seq_len, a.kv_len, s.n_heads, s.n_kv_heads, s.head_dim};
}
const int32_t* i32_or_null(const Tensor& t) { return t.empty() ? nullptr : ptr<int32_t>(t); }
}  // namespace

void CudaBackend::attention_block_fwd(const AttentionBlockFwd& a) {
    CudaOpScope scope(*this, Op::attention_block_fwd);
    const char* op = scope.name();
    const kernels::AttentionBlockDims dims = expect_block(op, a);
    const AttentionShape& s = a.shape;
    const Half t = half_of(op, "qkv", a.qkv);
    expect(op, "qkv", a.qkv, {s.rows(), s.qkv_width()}, a.qkv.dtype());
    expect(op, "kv", a.kv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, a.qkv.dtype());
    expect(op, "acc", a.acc, {s.rows(), s.out_width()}, DType::f32);
    expect(op, "lse", a.lse, {s.batch, s.n_heads, s.seq_len}, DType::f32);
    kernels::launch_attention_block_fwd(t, ptr<float>(a.acc), ptr<float>(a.lse), a.qkv.raw(), a.kv.raw(), dims, ptr<int32_t>(a.q_positions),
                                        ptr<int32_t>(a.kv_positions), i32_or_null(a.q_first), a.first, stream_);
}

void CudaBackend::attention_block_bwd(const AttentionBlockBwd& a) {
    CudaOpScope scope(*this, Op::attention_block_bwd);
    const char* op = scope.name();
    const kernels::AttentionBlockDims dims = expect_block(op, a);
    const AttentionShape& s = a.shape;
    const Half t = half_of(op, "qkv", a.qkv);
    expect(op, "qkv", a.qkv, {s.rows(), s.qkv_width()}, a.qkv.dtype());
    expect(op, "kv", a.kv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, a.qkv.dtype());
    expect(op, "dout", a.dout, {s.rows(), s.out_width()}, a.qkv.dtype());
    expect(op, "out", a.out, {s.rows(), s.out_width()}, a.qkv.dtype());
    expect(op, "lse", a.lse, {s.batch, s.n_heads, s.seq_len}, DType::f32);
    expect(op, "dq", a.dq, {s.rows(), s.out_width()}, DType::f32);
    expect(op, "dkv", a.dkv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, DType::f32);
    void* scratch = workspace(kernels::attention_block_bwd_scratch_bytes(dims));
    kernels::launch_attention_block_bwd(t, ptr<float>(a.dq), ptr<float>(a.dkv), a.dout.raw(), a.out.raw(), ptr<float>(a.lse), a.qkv.raw(), a.kv.raw(), dims,
                                        ptr<int32_t>(a.q_positions), ptr<int32_t>(a.kv_positions), i32_or_null(a.q_first), scratch, stream_);
}

namespace {
kernels::Element element_of(const char* op, const char* name, const Tensor& t) {
    switch (t.dtype()) {
        case DType::f32: return kernels::Element::f32;
        case DType::bf16: return kernels::Element::bf16;
        case DType::f16: return kernels::Element::f16;
        default: fail(ErrorKind::unsupported, op, ": ", name, " has dtype ", dtype_name(t.dtype()), "; the CUDA backend copies f32, bf16 or f16 columns");
    }
}
}  // namespace

void CudaBackend::copy_columns(const CopyColumns& a) {
    CudaOpScope scope(*this, Op::copy_columns);
    const char* op = scope.name();
    expect_rank(op, "dst", a.dst, 2);
    expect_rank(op, "src", a.src, 2);
    expect_device(op, "dst", a.dst);
    expect_device(op, "src", a.src);
    const kernels::Element dst_type = element_of(op, "dst", a.dst), src_type = element_of(op, "src", a.src);
    const int64_t N = a.dst.dim(0);
    if (a.src.dim(0) != N || a.cols < 0 || a.dst_col < 0 || a.src_col < 0 || a.dst_col + a.cols > a.dst.dim(1) || a.src_col + a.cols > a.src.dim(1))
        fail(ErrorKind::shape, op, ": columns [", a.src_col, ", ", a.src_col + a.cols, ") of src ", a.src.shape().str(), " into [", a.dst_col, ", ",
             a.dst_col + a.cols, ") of dst ", a.dst.shape().str(), " do not fit");
    auto* dst = static_cast<char*>(a.dst.raw()) + a.dst_col * static_cast<int64_t>(dtype_size(a.dst.dtype()));
    const auto* src = static_cast<const char*>(a.src.raw()) + a.src_col * static_cast<int64_t>(dtype_size(a.src.dtype()));
    kernels::launch_copy_columns(dst_type, dst, a.dst.dim(1), src_type, src, a.src.dim(1), N, a.cols, stream_);
}

void CudaBackend::rope_fwd(const Rope& a) {
    CudaOpScope scope(*this, Op::rope_fwd);
    expect_rope(scope.name(), a.x, a.table, a.seq_len, a.n_heads, a.head_dim);
    const int32_t* starts = document_starts(scope.name(), a.doc_starts, a.x.dim(0));
    const int32_t* explicit_pos = explicit_positions(scope.name(), a.positions, a.doc_starts, a.x.dim(0));
    kernels::launch_rope(half_of(scope.name(), "x", a.x), a.x.raw(), ptr<float>(a.table), a.x.dim(0), a.x.dim(1), a.seq_len, a.n_heads, a.head_dim, false,
                         starts, explicit_pos, a.table.dim(0), stream_);
}

void CudaBackend::rope_bwd(const Rope& a) {
    CudaOpScope scope(*this, Op::rope_bwd);
    expect_rope(scope.name(), a.x, a.table, a.seq_len, a.n_heads, a.head_dim);
    const int32_t* starts = document_starts(scope.name(), a.doc_starts, a.x.dim(0));
    const int32_t* explicit_pos = explicit_positions(scope.name(), a.positions, a.doc_starts, a.x.dim(0));
    kernels::launch_rope(half_of(scope.name(), "dx", a.x), a.x.raw(), ptr<float>(a.table), a.x.dim(0), a.x.dim(1), a.seq_len, a.n_heads, a.head_dim, true,
                         starts, explicit_pos, a.table.dim(0), stream_);
}

namespace {
// Elementwise ops: `first` 16-bit on the device, every other tensor of its shape and dtype.
Half expect_same_as(const char* op, const char* name, const Tensor& first, NamedTensors others) {
    const Half t = half_of(op, name, first);
    expect(op, name, first, first.shape(), first.dtype());
    for (const auto& [other_name, other] : others) expect(op, other_name, *other, first.shape(), first.dtype());
    return t;
}

// SwiGLU's x [N, 2F] (gate, then up); returns N and F.
std::pair<int64_t, int64_t> expect_swiglu_input(const char* op, const Tensor& x) {
    expect_rank(op, "x", x, 2);
    half_of(op, "x", x);
    expect_device(op, "x", x);
    if (x.dim(1) % 2 != 0) fail(ErrorKind::shape, op, ": x has shape ", x.shape().str(), ", expected [N, 2F]");
    return {x.dim(0), x.dim(1) / 2};
}
}  // namespace

void CudaBackend::gelu_fwd(const Tensor& out, const Tensor& x) {
    CudaOpScope scope(*this, Op::gelu_fwd);
    const Half t = expect_same_as(scope.name(), "x", x, {{"out", &out}});
    kernels::launch_gelu_fwd(t, out.raw(), x.raw(), x.numel(), stream_);
}

void CudaBackend::gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
    CudaOpScope scope(*this, Op::gelu_bwd);
    const Half t = expect_same_as(scope.name(), "x", x, {{"dx", &dx}, {"dout", &dout}});
    kernels::launch_gelu_bwd(t, dx.raw(), dout.raw(), x.raw(), x.numel(), stream_);
}

void CudaBackend::swiglu_fwd(const Tensor& out, const Tensor& x) {
    CudaOpScope scope(*this, Op::swiglu_fwd);
    const auto [N, F] = expect_swiglu_input(scope.name(), x);
    expect(scope.name(), "out", out, {N, F}, x.dtype());
    const Half t = half_of(scope.name(), "x", x);
    kernels::launch_swiglu_fwd(t, out.raw(), x.raw(), N, F, stream_);
}

void CudaBackend::swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
    CudaOpScope scope(*this, Op::swiglu_bwd);
    const auto [N, F] = expect_swiglu_input(scope.name(), x);
    expect(scope.name(), "dx", dx, x.shape(), x.dtype());
    expect(scope.name(), "dout", dout, {N, F}, x.dtype());
    const Half t = half_of(scope.name(), "x", x);
    kernels::launch_swiglu_bwd(t, dx.raw(), dout.raw(), x.raw(), N, F, stream_);
}

// 16-bit activations (residual adds), or f32 (ZeRO-2 sums a gradient shard over micro-batches).
void CudaBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
    CudaOpScope scope(*this, Op::add);
    if (a.dtype() == DType::f32) {
        for (const auto& [name, t] : {std::pair{"a", &a}, {"b", &b}, {"out", &out}}) expect(scope.name(), name, *t, a.shape(), DType::f32);
        return kernels::launch_add_f32(static_cast<float*>(out.raw()), static_cast<const float*>(a.raw()), static_cast<const float*>(b.raw()), a.numel(),
                                       stream_);
    }
    const Half t = expect_same_as(scope.name(), "a", a, {{"b", &b}, {"out", &out}});
    kernels::launch_add(t, out.raw(), a.raw(), b.raw(), a.numel(), stream_);
}

namespace {
// logits [N, V >= 1] 16-bit.
void expect_logits(const char* op, const Tensor& logits) {
    expect_rank(op, "logits", logits, 2);
    half_of(op, "logits", logits);
    expect_device(op, "logits", logits);
    if (logits.dim(1) < 1) fail(ErrorKind::shape, op, ": logits has shape ", logits.shape().str(), ", expected at least one class");
}

// logits [N, V] with i32 targets [N] (required: the kernels read targets[n] for every row).
void expect_logits(const char* op, const Tensor& logits, const Tensor& targets) {
    expect_logits(op, logits);
    expect(op, "targets", targets, {logits.dim(0)}, DType::i32);
}
}  // namespace

void CudaBackend::xent_fwd(const XentFwd& a) {
    const Tensor &losses = a.losses, &lse = a.lse, &logits = a.logits, &targets = a.targets;
    const VocabShard vocab = a.vocab;
    CudaOpScope scope(*this, Op::xent_fwd);
    const char* op = scope.name();
    expect_logits(op, logits, targets);
    expect(op, "losses", losses, {logits.dim(0)}, DType::f32);
    if (!lse.empty()) expect(op, "lse", lse, {logits.dim(0)}, DType::f32);
    const VocabRows whole = expect_vocab(op, vocab, logits.dim(1));
    if (whole.count != whole.total) fail(ErrorKind::shape, op, ": logits must hold whole rows of the vocabulary (use xent_partial for a shard)");
    kernels::launch_xent_fwd(half_of(op, "logits", logits), ptr<float>(losses), static_cast<float*>(ptr_or_null(lse)), logits.raw(), ptr<int32_t>(targets), logits.dim(0), logits.dim(1),
                             whole.real_count(), stream_);
}

void CudaBackend::xent_bwd(const XentBwd& a) {
    const Tensor &dlogits = a.dlogits, &logits = a.logits, &targets = a.targets, &lse = a.lse;
    const VocabShard shard = a.vocab;
    const double dloss = a.dloss;
    CudaOpScope scope(*this, Op::xent_bwd);
    const char* op = scope.name();
    expect_logits(op, logits, targets);
    expect(op, "dlogits", dlogits, logits.shape(), logits.dtype());
    if (!lse.empty()) expect(op, "lse", lse, {logits.dim(0)}, DType::f32);
    else if (shard.begin != 0 || (shard.total != 0 && shard.total != logits.dim(1)))
        fail(ErrorKind::shape, op, ": a vocabulary shard needs the full rows' lse");
    const VocabRows local = expect_vocab(op, shard, logits.dim(1));
    kernels::launch_xent_bwd(half_of(op, "logits", logits), dlogits.raw(), logits.raw(), ptr<int32_t>(targets), static_cast<float*>(ptr_or_null(lse)),
                             logits.dim(0), logits.dim(1), local.real_count(), shard.begin, static_cast<float>(dloss), stream_);
}

void CudaBackend::xent_fwd_bwd(const XentFwdBwd& a) {
    const Tensor &losses = a.losses, &lse = a.lse, &logits = a.logits, &targets = a.targets;
    const VocabShard vocab = a.vocab;
    const double dloss = a.dloss;
    CudaOpScope scope(*this, Op::xent_fwd_bwd);
    const char* op = scope.name();
    expect_logits(op, logits, targets);
    expect(op, "losses", losses, {logits.dim(0)}, DType::f32);
    if (!lse.empty()) expect(op, "lse", lse, {logits.dim(0)}, DType::f32);
    const VocabRows whole = expect_vocab(op, vocab, logits.dim(1));
    if (whole.count != whole.total) fail(ErrorKind::shape, op, ": logits must hold whole rows of the vocabulary");
    kernels::launch_xent_fwd_bwd(half_of(op, "logits", logits), ptr<float>(losses), static_cast<float*>(ptr_or_null(lse)), logits.raw(), ptr<int32_t>(targets),
                                 logits.dim(0), logits.dim(1), whole.real_count(), static_cast<float>(dloss), stream_);
}

void CudaBackend::logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) {
    CudaOpScope scope(*this, Op::logits_row_max);
    const char* op = scope.name();
    expect_logits(op, logits);
    expect(op, "row_max", row_max, {logits.dim(0)}, DType::f32);
    const VocabRows local = expect_vocab(op, shard, logits.dim(1));
    kernels::launch_logits_row_max(half_of(op, "logits", logits), ptr<float>(row_max), logits.raw(), logits.dim(0), logits.dim(1), local.real_count(),
                                   stream_);
}

void CudaBackend::xent_partial(const XentPartial& a) {
    const Tensor &partial = a.partial, &logits = a.logits, &targets = a.targets, &row_max = a.row_max;
    const VocabShard shard = a.vocab;
    CudaOpScope scope(*this, Op::xent_partial);
    const char* op = scope.name();
    expect_logits(op, logits, targets);
    const int64_t N = logits.dim(0);
    expect(op, "partial", partial, {N, 2}, DType::f32);
    expect(op, "row_max", row_max, {N}, DType::f32);
    const VocabRows local = expect_vocab(op, shard, logits.dim(1));
    kernels::launch_xent_partial(half_of(op, "logits", logits), ptr<float>(partial), logits.raw(), ptr<int32_t>(targets), ptr<float>(row_max), N,
                                 logits.dim(1), local.real_count(), shard.begin, stream_);
}

void CudaBackend::xent_combine(const XentCombine& a) {
    const Tensor &losses = a.losses, &lse = a.lse, &partial = a.partial, &row_max = a.row_max;
    CudaOpScope scope(*this, Op::xent_combine);
    const char* op = scope.name();
    const int64_t N = losses.numel();
    expect(op, "losses", losses, {N}, DType::f32);
    expect(op, "lse", lse, {N}, DType::f32);
    expect(op, "partial", partial, {N, 2}, DType::f32);
    expect(op, "row_max", row_max, {N}, DType::f32);
    kernels::launch_xent_combine(ptr<float>(losses), ptr<float>(lse), ptr<float>(partial), ptr<float>(row_max), N, stream_);
}

void CudaBackend::adamw(const AdamWUpdate& update) {
    const Tensor &param = update.param, &grad = update.grad, &m = update.m, &v = update.v, &param_copy = update.param_copy;
    const AdamWStep& s = update.step;
    CudaOpScope scope(*this, Op::adamw);
    const char* op = scope.name();
    if (s.step < 1) fail(ErrorKind::runtime, op, ": step ", s.step, " must be at least 1 (bias correction divides by 1 - beta^t)");
    const Shape shape = param.shape();
    expect(op, "param", param, shape, DType::f32);
    expect(op, "grad", grad, shape, DType::f32);
    expect(op, "m", m, shape, DType::f32);
    expect(op, "v", v, shape, DType::f32);
    Half copy_type = Half::bf16;
    if (!param_copy.empty()) {
        copy_type = half_of(op, "param_copy", param_copy);
        expect(op, "param_copy", param_copy, shape, param_copy.dtype());
    }
    kernels::AdamWArgs a{};
    a.lr = static_cast<float>(s.lr);
    a.beta1 = static_cast<float>(s.beta1);
    a.beta2 = static_cast<float>(s.beta2);
    a.eps = static_cast<float>(s.eps);
    a.weight_decay = static_cast<float>(s.weight_decay);
    a.grad_scale = static_cast<float>(s.grad_scale);
    // Bias corrections in double: 1 - beta^t loses digits in fp32 for small t.
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(s.step)));
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(s.beta2, static_cast<double>(s.step)));
    kernels::launch_adamw(ptr<float>(param), ptr<float>(grad), ptr<float>(m), ptr<float>(v), ptr_or_null(param_copy), copy_type, param.numel(), a, stream_);
}

namespace {
// The ranges of f32 tensors in launches of at most max_pieces each.
std::vector<kernels::ReducePieces> reduce_pieces(const char* op, const std::vector<Tensor>& tensors) {
    std::vector<kernels::ReducePieces> launches;
    for (const Tensor& t : tensors) {
        expect(op, "piece", t, t.shape(), DType::f32);
        if (t.numel() == 0) continue;
        if (launches.empty() || launches.back().count == kernels::ReducePieces::max_pieces) launches.push_back(kernels::ReducePieces{});
        kernels::ReducePieces& p = launches.back();
        p.x[p.count] = ptr<float>(t);
        p.n[p.count] = t.numel();
        ++p.count;
    }
    return launches;
}
}  // namespace

void CudaBackend::accumulate_sum(const Tensor& total, const Tensor& x, double scale) {
    CudaOpScope scope(*this, Op::accumulate_sum);
    expect(scope.name(), "total", total, {1}, DType::f64);
    for (const kernels::ReducePieces& p : reduce_pieces(scope.name(), {x}))
        kernels::launch_reduce_into(ptr<double>(total), p, false, scale, workspace(kernels::reduce_into_scratch_bytes(p)), stream_);
}

void CudaBackend::accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) {
    CudaOpScope scope(*this, Op::accumulate_sum_squares);
    expect(scope.name(), "total", total, {1}, DType::f64);
    for (const kernels::ReducePieces& p : reduce_pieces(scope.name(), pieces))
        kernels::launch_reduce_into(ptr<double>(total), p, true, 1.0, workspace(kernels::reduce_into_scratch_bytes(p)), stream_);
}

double CudaBackend::sum_squares(const Tensor& x) {
    double result = 0;
    {
        CudaOpScope scope(*this, Op::sum_squares);
        const char* op = scope.name();
        expect(op, "x", x, x.shape(), DType::f32);
        void* scratch = workspace(kernels::sum_squares_scratch_bytes(x.numel()));
        kernels::launch_sum_squares(static_cast<double*>(sum_result_.get()), ptr<float>(x), x.numel(), scratch, stream_);
    }
    check_cuda(cudaMemcpyAsync(&result, sum_result_.get(), sizeof result, cudaMemcpyDeviceToHost, stream_), "sum_squares");
    wait_for_stream("sum_squares");
    return result;
}

void CudaBackend::fill_zero(const Tensor& x) {
    CudaOpScope scope(*this, Op::fill_zero);
    expect_device(scope.name(), "x", x);
    if (x.numel() > 0) check_cuda(cudaMemsetAsync(x.raw(), 0, x.bytes(), stream_), scope.name());
}

void CudaBackend::copy(const Tensor& out, const Tensor& in) {
    CudaOpScope scope(*this, Op::copy);
    const char* op = scope.name();
    expect_device(op, "in", in);
    expect_device(op, "out", out);
    if (out.numel() != in.numel())
        fail(ErrorKind::shape, op, ": out has ", out.numel(), " elements (", out.shape().str(), "), in ", in.numel(), " (", in.shape().str(), ")");
    if (in.numel() == 0) return;
    if (out.dtype() == in.dtype()) {
        check_cuda(cudaMemcpyAsync(out.raw(), in.raw(), in.bytes(), cudaMemcpyDeviceToDevice, stream_), op);
    } else if (in.dtype() == DType::f32 && is_half(out.dtype())) {
        kernels::launch_cast_from_f32(half_of(op, "out", out), out.raw(), ptr<float>(in), in.numel(), stream_);
    } else if (is_half(in.dtype()) && out.dtype() == DType::f32) {
        kernels::launch_cast_to_f32(half_of(op, "in", in), ptr<float>(out), in.raw(), in.numel(), stream_);
    } else {
        fail(ErrorKind::unsupported, op, ": from ", dtype_name(in.dtype()), " to ", dtype_name(out.dtype()));
    }
}

// ---- Mixture of Experts (kernels/moe.cu): router tensors f32, activations 16-bit ----

namespace {
constexpr DType f32 = DType::f32;
float* f32_ptr(const Tensor& t) { return static_cast<float*>(t.raw()); }
int32_t* i32_ptr(const Tensor& t) { return static_cast<int32_t*>(t.raw()); }
bool is_sigmoid(MoeScore score) { return score == MoeScore::sigmoid; }
// A 16-bit activation of the given shape and dtype; returns its type.
Half expect_activation(const char* op, const char* name, const Tensor& t, const Shape& shape, DType dtype) {
    expect(op, name, t, shape, dtype);
    return half_of(op, name, t);
}
}  // namespace

void CudaBackend::moe_route_fwd(const MoeRouteFwd& a) {
    CudaOpScope scope(*this, Op::moe_route_fwd);
    const char* op = scope.name();
    const MoeDims d = expect_moe_routing(op, Device::cuda, f32, "logits", a.logits, a.experts);
    expect(op, "gates", a.gates, {d.tokens, d.top_k}, f32);
    expect(op, "scores", a.scores, {d.tokens, d.experts}, f32);
    if (!a.expert_bias.empty()) expect(op, "expert_bias", a.expert_bias, {d.experts}, f32);
    kernels::launch_moe_route_fwd(i32_ptr(a.experts), f32_ptr(a.gates), f32_ptr(a.scores), f32_ptr(a.logits), static_cast<float*>(ptr_or_null(a.expert_bias)),
                                  d.tokens, d.experts, d.top_k, is_sigmoid(a.score), a.normalize_top_k, stream_);
}

void CudaBackend::moe_route_bwd(const MoeRouteBwd& a) {
    CudaOpScope scope(*this, Op::moe_route_bwd);
    const char* op = scope.name();
    const MoeDims d = expect_moe_routing(op, Device::cuda, f32, "scores", a.scores, a.experts);
    expect(op, "d_logits", a.d_logits, {d.tokens, d.experts}, f32);
    expect(op, "d_gates", a.d_gates, {d.tokens, d.top_k}, f32);
    expect(op, "gates", a.gates, {d.tokens, d.top_k}, f32);
    kernels::launch_moe_route_bwd(f32_ptr(a.d_logits), f32_ptr(a.d_gates), f32_ptr(a.gates), f32_ptr(a.scores), i32_ptr(a.experts), d.tokens, d.experts,
                                  d.top_k, is_sigmoid(a.score), a.normalize_top_k, a.accumulate, stream_);
}

void CudaBackend::moe_load_stats(const MoeLoadStats& a) {
    CudaOpScope scope(*this, Op::moe_load_stats);
    const char* op = scope.name();
    const MoeDims d = expect_moe_routing(op, Device::cuda, f32, "scores", a.scores, a.experts);
    const int64_t G = moe_groups(op, d.tokens, a.seq_len);
    expect_moe_counts(op, a.counts, G, d.experts, Device::cuda);
    expect(op, "score_sums", a.score_sums, {G, d.experts}, f32);
    kernels::launch_moe_load_stats(i32_ptr(a.counts), f32_ptr(a.score_sums), i32_ptr(a.experts), f32_ptr(a.scores), G, d.tokens / G, d.experts, d.top_k,
                                   stream_);
}

void CudaBackend::moe_aux_loss_fwd(const MoeAuxLossFwd& a) {
    CudaOpScope scope(*this, Op::moe_aux_loss_fwd);
    const char* op = scope.name();
    expect_rank(op, "score_sums", a.score_sums, 2);
    const int64_t G = a.score_sums.dim(0), E = a.score_sums.dim(1);
    expect(op, "score_sums", a.score_sums, {G, E}, f32);
    expect_moe_counts(op, a.counts, G, E, Device::cuda);
    expect(op, "loss", a.loss, {1}, f32);
    expect_moe_aux_loss(op, a.tokens_per_group, a.top_k, E);
    kernels::launch_moe_aux_loss_fwd(f32_ptr(a.loss), i32_ptr(a.counts), f32_ptr(a.score_sums), G, E, a.tokens_per_group, a.top_k, a.coeff, stream_);
}

void CudaBackend::moe_aux_loss_bwd(const MoeAuxLossBwd& a) {
    CudaOpScope scope(*this, Op::moe_aux_loss_bwd);
    const char* op = scope.name();
    expect_rank(op, "scores", a.scores, 2);
    const int64_t N = a.scores.dim(0), E = a.scores.dim(1), G = moe_groups(op, N, a.seq_len);
    expect(op, "scores", a.scores, {N, E}, f32);
    expect(op, "d_logits", a.d_logits, {N, E}, f32);
    expect_moe_counts(op, a.counts, G, E, Device::cuda);
    expect_moe_aux_loss(op, a.tokens_per_group, a.top_k, E);
    const double tokens = static_cast<double>(a.tokens_per_group);
    const double scale = a.dloss * a.coeff * static_cast<double>(E) / (tokens * static_cast<double>(a.top_k)) / (static_cast<double>(G) * tokens);
    kernels::launch_moe_aux_loss_bwd(f32_ptr(a.d_logits), f32_ptr(a.scores), i32_ptr(a.counts), N, E, G > 0 ? N / G : 1, static_cast<float>(scale),
                                     is_sigmoid(a.score), stream_);
}

namespace {
std::pair<int64_t, int64_t> expect_z_logits(const char* op, const Tensor& logits) {
    expect_rank(op, "logits", logits, 2);
    if (logits.dim(1) < 1) fail(ErrorKind::shape, op, ": logits has shape ", logits.shape().str(), ", expected at least one expert");
    expect(op, "logits", logits, logits.shape(), f32);
    return {logits.dim(0), logits.dim(1)};
}
}  // namespace

void CudaBackend::moe_z_loss_fwd(const MoeZLossFwd& a) {
    CudaOpScope scope(*this, Op::moe_z_loss_fwd);
    const auto [N, E] = expect_z_logits(scope.name(), a.logits);
    expect(scope.name(), "loss", a.loss, {1}, f32);
    kernels::launch_moe_z_loss_fwd(f32_ptr(a.loss), f32_ptr(a.logits), N, E, a.coeff, stream_);
}

void CudaBackend::moe_z_loss_bwd(const MoeZLossBwd& a) {
    CudaOpScope scope(*this, Op::moe_z_loss_bwd);
    const auto [N, E] = expect_z_logits(scope.name(), a.logits);
    expect(scope.name(), "d_logits", a.d_logits, {N, E}, f32);
    const double scale = N > 0 ? a.dloss * a.coeff * 2.0 / static_cast<double>(N) : 0.0;
    kernels::launch_moe_z_loss_bwd(f32_ptr(a.d_logits), f32_ptr(a.logits), N, E, static_cast<float>(scale), stream_);
}

void CudaBackend::moe_permute_plan(const MoePermutePlan& a) {
    CudaOpScope scope(*this, Op::moe_permute_plan);
    const char* op = scope.name();
    expect_rank(op, "counts", a.counts, 1);
    const MoeDims d = expect_moe_experts(op, a.experts, a.counts.dim(0), Device::cuda);
    const int64_t R = moe_permuted_rows(op, d, a.capacity);
    expect(op, "rows", a.rows, {d.tokens, d.top_k}, DType::i32);
    expect(op, "sources", a.sources, {R}, DType::i32);
    expect(op, "counts", a.counts, {d.experts}, DType::i32);
    if (!a.dropped.empty()) expect(op, "dropped", a.dropped, {d.experts}, DType::i32);
    void* scratch = workspace(kernels::moe_permute_plan_scratch_bytes(d.tokens * d.top_k, d.experts));
    kernels::launch_moe_permute_plan(i32_ptr(a.rows), i32_ptr(a.sources), i32_ptr(a.counts), static_cast<int32_t*>(ptr_or_null(a.dropped)),
                                     i32_ptr(a.experts), d.tokens, d.experts, d.top_k, a.capacity, R, scratch, stream_);
}

void CudaBackend::moe_permute_fwd(const MoePermuteFwd& a) {
    CudaOpScope scope(*this, Op::moe_permute_fwd);
    const char* op = scope.name();
    expect_rank(op, "x", a.x, 2);
    expect_rank(op, "sources", a.sources, 1);
    const int64_t N = a.x.dim(0), C = a.x.dim(1), R = a.sources.dim(0);
    if (a.top_k < 1) fail(ErrorKind::shape, op, ": top_k ", a.top_k, " must be at least 1");
    expect_activation(op, "x", a.x, {N, C}, a.x.dtype());
    expect_activation(op, "x_perm", a.x_perm, {R, C}, a.x.dtype());
    expect(op, "sources", a.sources, {R}, DType::i32);
    kernels::launch_moe_permute_fwd(a.x_perm.raw(), a.x.raw(), i32_ptr(a.sources), N, C, R, a.top_k, stream_);
}

void CudaBackend::moe_permute_bwd(const MoePermuteBwd& a) {
    CudaOpScope scope(*this, Op::moe_permute_bwd);
    const char* op = scope.name();
    const MoeSlots s = expect_moe_slots(op, Device::cuda, a.rows, "d_x_perm", a.d_x_perm);
    const int64_t N = s.tokens, k = s.top_k, R = s.rows, C = s.channels;
    const Half t = expect_activation(op, "d_x_perm", a.d_x_perm, {R, C}, a.d_x_perm.dtype());
    expect_activation(op, "dx", a.dx, {N, C}, a.d_x_perm.dtype());
    kernels::launch_moe_permute_bwd(t, a.dx.raw(), a.d_x_perm.raw(), i32_ptr(a.rows), N, C, R, k, stream_);
}

void CudaBackend::moe_combine_fwd(const MoeCombineFwd& a) {
    CudaOpScope scope(*this, Op::moe_combine_fwd);
    const char* op = scope.name();
    const MoeSlots s = expect_moe_slots(op, Device::cuda, a.rows, "y_perm", a.y_perm);
    const int64_t N = s.tokens, k = s.top_k, R = s.rows, C = s.channels;
    const Half t = expect_activation(op, "y_perm", a.y_perm, {R, C}, a.y_perm.dtype());
    expect_activation(op, "out", a.out, {N, C}, a.y_perm.dtype());
    expect(op, "gates", a.gates, {N, k}, f32);
    kernels::launch_moe_combine_fwd(t, a.out.raw(), a.y_perm.raw(), f32_ptr(a.gates), i32_ptr(a.rows), N, C, R, k, stream_);
}

void CudaBackend::moe_combine_bwd(const MoeCombineBwd& a) {
    CudaOpScope scope(*this, Op::moe_combine_bwd);
    const char* op = scope.name();
    const MoeSlots s = expect_moe_slots(op, Device::cuda, a.rows, "y_perm", a.y_perm);
    const int64_t N = s.tokens, k = s.top_k, R = s.rows, C = s.channels;
    const Half t = expect_activation(op, "y_perm", a.y_perm, {R, C}, a.y_perm.dtype());
    expect_activation(op, "d_y_perm", a.d_y_perm, {R, C}, a.y_perm.dtype());
    expect_activation(op, "d_out", a.d_out, {N, C}, a.y_perm.dtype());
    expect(op, "gates", a.gates, {N, k}, f32);
    expect(op, "d_gates", a.d_gates, {N, k}, f32);
    expect(op, "sources", a.sources, {R}, DType::i32);
    kernels::launch_moe_combine_bwd(t, a.d_y_perm.raw(), f32_ptr(a.d_gates), a.d_out.raw(), a.y_perm.raw(), f32_ptr(a.gates), i32_ptr(a.rows),
                                    i32_ptr(a.sources), N, C, R, k, stream_);
}

}  // namespace llmtrain
