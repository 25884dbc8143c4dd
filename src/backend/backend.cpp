// Backend-independent pieces of the op interface: op names from the X-macro table, which
// ops are GEMMs, profile totals, each device's memory layout, the host's free memory, and
// the rotary table shared by every backend.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace llmtrain {

const char* op_name(Op op) {
    switch (op) {
#define LLMTRAIN_OP_NAME(name) \
    case Op::name: return #name;
        LLMTRAIN_BACKEND_OPS(LLMTRAIN_OP_NAME)
#undef LLMTRAIN_OP_NAME
    }
    return "?";
}

bool op_is_gemm(Op op) {
    return op == Op::matmul_fwd || op == Op::matmul_bwd || op == Op::matmul_gelu_fwd || op == Op::gelu_matmul_bwd || op == Op::matmul_fp8;
}

void Backend::matmul_gelu_fwd(const MatmulGeluFwd& a) {
    matmul_fwd({.out = a.pre, .x = a.x, .w = a.w, .bias = a.bias, .row_block = a.row_block});
    gelu_fwd(a.act, a.pre);
}

void Backend::gelu_matmul_bwd(const GeluMatmulBwd& a) {
    matmul_bwd({.dx = a.d_pre, .dw = a.dw, .dbias = a.dbias, .dout = a.dout, .x = a.act, .w = a.w});
    gelu_bwd(a.d_pre, a.d_pre, a.pre);
    if (!a.d_pre_bias.empty()) add_column_sums(*this, a.d_pre_bias, a.d_pre);
}

// Through matmul_bwd with neither dx nor dw wanted: its x and w enter only through their
// shapes ([N, 0] and [C, 0] views), so no GEMM runs.
void add_column_sums(Backend& backend, const Tensor& sums, const Tensor& rows) {
    const int64_t N = rows.dim(0), C = rows.dim(1);
    const Tensor no_x(rows.raw(), rows.dtype(), {N, 0}, rows.device()), no_w(rows.raw(), rows.dtype(), {C, 0}, rows.device());
    backend.matmul_bwd({.dx = Tensor(), .dw = Tensor(), .dbias = sums, .dout = rows, .x = no_x, .w = no_w});
}

void Backend::xent_fwd_bwd(const XentFwdBwd& a) {
    xent_fwd({.losses = a.losses, .lse = a.lse, .logits = a.logits, .targets = a.targets, .vocab = a.vocab});
    xent_bwd({.dlogits = a.logits, .logits = a.logits, .targets = a.targets, .lse = a.lse, .vocab = a.vocab, .dloss = a.dloss});
}

void Backend::add_norm_fwd(const AddNormFwd& a) {
    add(a.sum, a.a, a.b);
    if (a.rms) rmsnorm_fwd({.out = a.out, .rstd = a.rstd, .x = a.sum, .w = a.w, .eps = a.eps});
    else layernorm_fwd({.out = a.out, .mean = a.mean, .rstd = a.rstd, .x = a.sum, .w = a.w, .b = a.bias, .eps = a.eps});
}

double OpProfile::total_seconds() const {
    double total = 0;
    for (double s : seconds) total += s;
    return total;
}

double OpProfile::gemm_seconds() const {
    double total = 0;
    for (int i = 0; i < op_count; ++i)
        if (op_is_gemm(static_cast<Op>(i))) total += seconds[static_cast<size_t>(i)];
    return total;
}

DType statistics_dtype(DType activation) { return activation == DType::f64 ? DType::f64 : DType::f32; }

Shape attention_saved_shape(Device device, const AttentionShape& s) {
    if (device == Device::cuda) return {s.batch, s.n_heads, s.seq_len};
    return {s.batch, s.n_heads, s.seq_len, s.seq_len};
}

size_t reserved_workspace_bytes(Device device) {
    constexpr size_t cublaslt_workspace_bytes = 32u << 20;  // what cuBLASLt asks for on Hopper
    return device == Device::cuda ? cublaslt_workspace_bytes : 0;
}

size_t attention_workspace_bytes(Device device, AttentionImpl impl, const AttentionShape& s) {
    if (device != Device::cuda) return 0;
    const auto rows = static_cast<size_t>(s.batch * s.n_heads * s.seq_len);
    const size_t native = rows * sizeof(float);
    if (impl == AttentionImpl::native) return native;
    const auto round_up = [](int64_t n, int64_t m) { return static_cast<size_t>((n + m - 1) / m * m); };
    const size_t dp_tiles = static_cast<size_t>(s.batch * s.n_heads) * round_up(s.seq_len, 64) * round_up(s.seq_len, 128) * 2;
    constexpr size_t plan_slack = 16u << 20;  // the plan's own scratch besides the dP tiles
    return std::max(native, rows * sizeof(float) + 512 + dp_tiles + plan_slack);
}

// MemAvailable is the kernel's estimate of what can be allocated without swapping (free
// memory plus reclaimable caches), which MemFree alone understates.
size_t host_available_memory_bytes() {
    const char* path = "/proc/meminfo";
    std::ifstream in(path);
    if (!in) fail(ErrorKind::io, "cannot read ", path, " to learn the memory available");
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string key, unit;
        size_t kib = 0;
        if (fields >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") return kib * 1024;
    }
    fail(ErrorKind::io, path, " has no MemAvailable line in kB");
}

namespace {
// angle(pos, i) = pos * theta^(-2i/D), i < D/2; row pos holds cos of the D/2 angles, then sin.
template <class T>
void fill_rope_rows(T* table, int64_t rows, int64_t head_dim, double theta) {
    const int64_t half = head_dim / 2;
    for (int64_t pos = 0; pos < rows; ++pos) {
        T* row = table + pos * head_dim;
        for (int64_t i = 0; i < half; ++i) {
            const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
            const double angle = static_cast<double>(pos) * inv_freq;
            row[i] = static_cast<T>(std::cos(angle));
            row[half + i] = static_cast<T>(std::sin(angle));
        }
    }
}
}  // namespace

namespace {
std::string fixed_megabytes(size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / 1e6);
    return text;
}
}  // namespace

void Backend::check_memory_limit(size_t held, size_t bytes) const {
    if (memory_limit_bytes_ == 0 || held + bytes <= memory_limit_bytes_) return;
    fail(ErrorKind::config, "memory: allocating ", fixed_megabytes(bytes), " MB more would make this rank hold ", fixed_megabytes(held + bytes),
         " MB, beyond train.memory_limit_gb = ", static_cast<double>(memory_limit_bytes_) / 1e9);
}

void fill_rope_table(const Tensor& table, double theta) {
    if (table.rank() != 2) fail(ErrorKind::shape, "fill_rope_table: table has shape ", table.shape().str(), ", expected [max_seq_len, head_dim]");
    if (table.dim(1) % 2 != 0) fail(ErrorKind::shape, "fill_rope_table: head_dim ", table.dim(1), " is odd; rotary pairs need an even head_dim");
    if (table.device() != Device::cpu) fail(ErrorKind::unsupported, "fill_rope_table: table is on ", device_name(table.device()), ", expected host memory");
    switch (table.dtype()) {
        case DType::f32: fill_rope_rows(table.data<float>(), table.dim(0), table.dim(1), theta); return;
        case DType::f64: fill_rope_rows(table.data<double>(), table.dim(0), table.dim(1), theta); return;
        default: fail(ErrorKind::unsupported, "fill_rope_table: table has dtype ", dtype_name(table.dtype()), ", expected f32 or f64");
    }
}

}  // namespace llmtrain
