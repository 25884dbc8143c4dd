// The cuBLASLt stand-in of the CUDA emulation (see cublasLt.h for what it models).
//
// D = epilogue(alpha op(A) op(B) + beta C), column-major, with op(A) m x k and op(B) k x n:
//   DEFAULT        D = X                       (X = alpha op(A) op(B) + beta C)
//   BIAS           D = X + bias[i]
//   GELU           D = gelu(X)
//   GELU_AUX       aux = X,         D = gelu(X)
//   GELU_BIAS      D = gelu(X + bias[i])
//   GELU_AUX_BIAS  aux = X + bias,  D = gelu(aux)
//   DGELU          D = X gelu'(aux)
//   DGELU_BGRAD    D = X gelu'(aux), bias[i] = sum_j D[i, j]
//   BGRADA         D = X,            bias[i] = sum_l op(A)[i, l]
//   BGRADB         D = X,            bias[j] = sum_l op(B)[l, j]
// gelu is the tanh approximation, as in cuBLASLt. Products of 16-bit inputs are exact in fp32
// and summed in fp32; the bias and aux vectors are of the bias / aux data type attribute
// (D's type by default); aux is m x n with the aux leading dimension (a multiple of 8).
//
// FP8 (Hopper's rules as cuBLASLt documents them): A and B both e4m3 or e5m2 and not both
// e5m2, A transposed and B not ("TN"), leading dimensions of A and B multiples of 16 and the
// pointers 16-byte aligned, C = D in bf16, f16 or f32, epilogue DEFAULT or BIAS (a bias of D's
// type); anything else is refused. X = alpha scale_a scale_b op(A) op(B) + beta C, with
// scale_a and scale_b the fp32 values at A_SCALE_POINTER / B_SCALE_POINTER (1 when unset), and
// AMAX_D_POINTER receives max |D| over the outputs before their rounding to D's type. The
// FP8 values are decoded here from their bit fields (independently of the project's
// converter) and their products summed in fp32; FAST_ACCUM is accepted and computes the same
// (the stand-in does not model the device's lower-precision accumulation).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_internal.h"

struct cublasLtContext {
    int magic;
};
struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0;
    int bias_type = -1, aux_type = -1;  // -1: D's type
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    float* amax_d = nullptr;
    int8_t fast_accum = 0;
    bool unsupported_attribute = false;
};
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int order = CUBLASLT_ORDER_COL;
    int batch = 1;
};
struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_workspace = 0;
    uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D; cuBLASLt's default is 256 bytes
};

namespace {

cublasStatus_t refuse(cublasStatus_t status, const std::string& why) {
    std::fprintf(stderr, "emu cuBLASLt: %s\n", why.c_str());
    return status;
}

template <class T>
bool read_attribute(T& out, const void* buf, size_t size) {
    if (size != sizeof(T)) return false;
    std::memcpy(&out, buf, sizeof(T));
    return true;
}

bool is_fp8(int type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

size_t type_bytes(int type) { return type == CUDA_R_32F ? 4 : is_fp8(type) ? 1 : 2; }

// An FP8 value from its fields: e4m3 (bias 7, no infinity, S.1111.111 NaN), e5m2 (bias 15,
// IEEE-like).
float decode_fp8(int type, uint8_t bits) {
    const bool e4m3 = type == CUDA_R_8F_E4M3;
    const int mantissa_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, top = e4m3 ? 15 : 31;
    const int exponent = (bits & 0x7f) >> mantissa_bits, mantissa = bits & ((1 << mantissa_bits) - 1);
    const float sign = (bits & 0x80) ? -1.0f : 1.0f;
    if (e4m3 && exponent == top && mantissa == (1 << mantissa_bits) - 1) return NAN;
    if (!e4m3 && exponent == top) return mantissa == 0 ? sign * INFINITY : NAN;
    const float fraction = static_cast<float>(mantissa) / static_cast<float>(1 << mantissa_bits);
    return exponent == 0 ? sign * std::ldexp(fraction, 1 - bias) : sign * std::ldexp(1.0f + fraction, exponent - bias);
}

float load(int type, const void* p, size_t i) {
    switch (type) {
        case CUDA_R_32F: return static_cast<const float*>(p)[i];
        case CUDA_R_8F_E4M3:
        case CUDA_R_8F_E5M2: return decode_fp8(type, static_cast<const uint8_t*>(p)[i]);
        case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
        default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    }
}

void store(int type, void* p, size_t i, float v) {
    switch (type) {
        case CUDA_R_32F: static_cast<float*>(p)[i] = v; break;
        case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
        default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    }
}

bool is_16bit(int type) { return type == CUDA_R_16F || type == CUDA_R_16BF; }

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluK * (x + kGeluC * x * x * x))); }

float gelu_grad(float x) {
    const float t = std::tanh(kGeluK * (x + kGeluC * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

bool uses_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD ||
           e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool uses_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool modelled(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU: case CUBLASLT_EPILOGUE_GELU_AUX:
        case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: case CUBLASLT_EPILOGUE_DGELU: case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        case CUBLASLT_EPILOGUE_BGRADA: case CUBLASLT_EPILOGUE_BGRADB: return true;
        default: return false;
    }
}

// The problem a descriptor and four layouts describe, once they are checked to agree.
struct Problem {
    uint64_t m, n, k;
};

cublasStatus_t check_layout(const cublasLtMatrixLayoutOpaque_t* l, const char* name) {
    if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("no layout for ") + name);
    if (l->order != CUBLASLT_ORDER_COL) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(name) + ": only column-major order is modelled");
    if (l->batch != 1) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(name) + ": batched layouts are not modelled");
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(1, l->rows)))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(name) + ": leading dimension " + std::to_string(l->ld) + " < rows " + std::to_string(l->rows));
    return CUBLAS_STATUS_SUCCESS;
}

// Hopper's FP8 rules (see the top of this file).
cublasStatus_t check_fp8(const cublasLtMatmulDescOpaque_t* d, const cublasLtMatrixLayoutOpaque_t* a, const cublasLtMatrixLayoutOpaque_t* b,
                         const cublasLtMatrixLayoutOpaque_t* dd) {
    if (!is_fp8(a->type) || !is_fp8(b->type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: A and B must both be FP8");
    if (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: A and B both e5m2");
    if (d->trans_a != CUBLAS_OP_T || d->trans_b != CUBLAS_OP_N) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: only A transposed and B not (TN)");
    if (a->ld % 16 != 0 || b->ld % 16 != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: leading dimensions of A and B must be multiples of 16");
    if (dd->type != CUDA_R_16BF && dd->type != CUDA_R_16F && dd->type != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: D must be bf16, f16 or f32");
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: only the DEFAULT and BIAS epilogues are modelled");
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && d->bias_type >= 0 && d->bias_type != dd->type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: the bias must be of D's type");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_problem(const cublasLtMatmulDescOpaque_t* d, const cublasLtMatrixLayoutOpaque_t* a, const cublasLtMatrixLayoutOpaque_t* b,
                             const cublasLtMatrixLayoutOpaque_t* c, const cublasLtMatrixLayoutOpaque_t* dd, Problem& p) {
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "no matmul descriptor");
    if (d->unsupported_attribute) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the descriptor has an attribute the stand-in does not model");
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only CUBLAS_COMPUTE_32F with CUDA_R_32F scaling is modelled");
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only host alpha and beta are modelled");
    if (d->trans_a == CUBLAS_OP_C || d->trans_b == CUBLAS_OP_C) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "conjugate transposes are not modelled");
    if (!modelled(d->epilogue)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue " + std::to_string(d->epilogue) + " is not modelled");
    for (auto [l, name] : {std::pair{a, "A"}, std::pair{b, "B"}, std::pair{c, "C"}, std::pair{dd, "D"}})
        if (cublasStatus_t s = check_layout(l, name); s != CUBLAS_STATUS_SUCCESS) return s;
    if (is_fp8(a->type) || is_fp8(b->type)) {
        if (cublasStatus_t s = check_fp8(d, a, b, dd); s != CUBLAS_STATUS_SUCCESS) return s;
    } else if (!is_16bit(a->type) || b->type != a->type) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A and B must both be f16 or both bf16, or both FP8");
    }
    if (!is_fp8(a->type) && (d->a_scale || d->b_scale || d->amax_d))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "A/B scale or D amax pointers set for 16-bit operands");
    if ((!is_fp8(a->type) && dd->type != a->type && dd->type != CUDA_R_32F) || c->type != dd->type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D must be of one type: A's, or f32");
    const bool ta = d->trans_a == CUBLAS_OP_T, tb = d->trans_b == CUBLAS_OP_T;
    p.m = dd->rows;
    p.n = dd->cols;
    const uint64_t a_rows = ta ? a->cols : a->rows;  // op(A) is m x k
    p.k = ta ? a->rows : a->cols;
    const uint64_t b_rows = tb ? b->cols : b->rows, b_cols = tb ? b->rows : b->cols;  // op(B) is k x n
    if (a_rows != p.m || b_rows != p.k || b_cols != p.n || c->rows != p.m || c->cols != p.n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "dimensions disagree: op(A) " + std::to_string(a_rows) + " x " + std::to_string(p.k) + ", op(B) " +
                                                       std::to_string(b_rows) + " x " + std::to_string(b_cols) + ", C " + std::to_string(c->rows) + " x " +
                                                       std::to_string(c->cols) + ", D " + std::to_string(p.m) + " x " + std::to_string(p.n));
    const int bias_type = d->bias_type < 0 ? dd->type : d->bias_type, aux_type = d->aux_type < 0 ? dd->type : d->aux_type;
    if (uses_bias(d->epilogue) && bias_type != CUDA_R_32F && bias_type != dd->type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "bias data type must be D's or f32");
    if (uses_aux(d->epilogue) && !is_16bit(aux_type) && aux_type != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "aux data type");
    if (uses_aux(d->epilogue) && (d->aux_ld < static_cast<int64_t>(p.m) || d->aux_ld % 8 != 0))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "aux leading dimension " + std::to_string(d->aux_ld) + " must be >= m = " + std::to_string(p.m) +
                                                       " and a multiple of 8");
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment_of(const void* p) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
}

// The device bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t span_bytes(uint64_t rows, uint64_t cols, int64_t ld, int type) {
    if (rows == 0 || cols == 0) return 0;
    return ((cols - 1) * static_cast<uint64_t>(ld) + rows) * type_bytes(type);
}

bool in_device_memory(const void* p, size_t bytes, const char* what) {
    if (bytes == 0) return true;
    if (emu::find_allocation(p, bytes)) return true;
    std::fprintf(stderr, "emu cuBLASLt: %s [%p, +%zu bytes) is not inside one device allocation\n", what, p, bytes);
    return false;
}

// op(A) as m rows of k floats; op(B) as n rows of k floats (B transposed), so that each D
// entry is a dot product of two contiguous rows.
std::vector<float> rows_of_op(const void* p, const cublasLtMatrixLayoutOpaque_t& l, bool transposed, uint64_t rows, uint64_t k, bool rows_are_columns) {
    std::vector<float> out(rows * k);
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t j = 0; j < k; ++j) {
            // rows_are_columns (B): entry (r, j) of out is op(B)[j, r].
            const uint64_t i = rows_are_columns ? j : r, c = rows_are_columns ? r : j;  // op(X)[i, c]
            const uint64_t stored_row = transposed ? c : i, stored_col = transposed ? i : c;
            out[r * k + j] = load(l.type, p, stored_col * static_cast<uint64_t>(l.ld) + stored_row);
        }
    return out;
}

// A dot product in fp32 with 8 running sums, added in a fixed order: deterministic.
float dot(const float* a, const float* b, uint64_t k) {
    float lanes[8] = {};
    uint64_t l = 0;
    for (; l + 8 <= k; l += 8)
        for (int j = 0; j < 8; ++j) lanes[j] += a[l + j] * b[l + j];
    for (; l < k; ++l) lanes[l % 8] += a[l] * b[l];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

size_t cublasLtGetVersion() { return 120400; }

const char* cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    *handle = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type, cudaDataType_t scale_type) {
    *desc = new cublasLtMatmulDescOpaque_t{compute_type, scale_type};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    bool ok = true;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ok = read_attribute(d->compute, buf, size); break;
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ok = read_attribute(d->scale, buf, size); break;
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: ok = read_attribute(d->pointer_mode, buf, size); break;
        case CUBLASLT_MATMUL_DESC_TRANSA: ok = read_attribute(d->trans_a, buf, size); break;
        case CUBLASLT_MATMUL_DESC_TRANSB: ok = read_attribute(d->trans_b, buf, size); break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = read_attribute(d->epilogue, buf, size); break;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = read_attribute(d->bias, buf, size); break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = read_attribute(d->aux, buf, size); break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = read_attribute(d->aux_ld, buf, size); break;
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = read_attribute(d->bias_type, buf, size); break;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: ok = read_attribute(d->aux_type, buf, size); break;
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: ok = read_attribute(d->a_scale, buf, size); break;
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: ok = read_attribute(d->b_scale, buf, size); break;
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: ok = read_attribute(d->amax_d, buf, size); break;
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: ok = read_attribute(d->fast_accum, buf, size); break;
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: break;  // a performance hint
        default:
            d->unsupported_attribute = true;
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute " + std::to_string(attr) + " is not modelled");
    }
    return ok ? CUBLAS_STATUS_SUCCESS : refuse(CUBLAS_STATUS_INVALID_VALUE, "attribute " + std::to_string(attr) + " of the wrong size");
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, void* buf, size_t size, size_t* written) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    const auto give = [&](const auto& value) {
        if (written) *written = sizeof value;
        if (!buf) return CUBLAS_STATUS_SUCCESS;
        if (size < sizeof value) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(buf, &value, sizeof value);
        return CUBLAS_STATUS_SUCCESS;
    };
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA: return give(d->trans_a);
        case CUBLASLT_MATMUL_DESC_TRANSB: return give(d->trans_b);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return give(d->epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return give(d->bias);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return give(d->aux);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return give(d->aux_ld);
        default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "reading matmul descriptor attribute " + std::to_string(attr) + " is not modelled");
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    if (type != CUDA_R_16F && type != CUDA_R_16BF && type != CUDA_R_32F && !is_fp8(type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matrix type " + std::to_string(type));
    *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t size) {
    if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    bool ok = true;
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = read_attribute(l->order, buf, size); break;
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = read_attribute(l->batch, buf, size); break;
        case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = read_attribute(l->rows, buf, size); break;
        case CUBLASLT_MATRIX_LAYOUT_COLS: ok = read_attribute(l->cols, buf, size); break;
        case CUBLASLT_MATRIX_LAYOUT_LD: ok = read_attribute(l->ld, buf, size); break;
        default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matrix layout attribute " + std::to_string(attr) + " is not modelled");
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    *pref = new cublasLtMatmulPreferenceOpaque_t{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_attribute(p->max_workspace, buf, size) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
            const int index = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
            return read_attribute(p->alignment[index], buf, size) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
        }
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
        case CUBLASLT_MATMUL_PREF_IMPL_MASK:
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return CUBLAS_STATUS_SUCCESS;  // hints
    }
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute " + std::to_string(attr) + " is not modelled");
}

// Two algorithms (the same arithmetic, as two tile shapes of one reduction order would be),
// each recording the alignments it was chosen for: cublasLtMatmul refuses pointers less
// aligned than that. Like cuBLASLt 13.0 on Hopper, none for DGELU_BGRAD with an fp32 bias
// gradient beside a 16-bit D (callers then take DGELU and reduce the bias themselves).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
    *returned = 0;
    if (!handle || !pref || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    Problem p{};
    if (cublasStatus_t s = check_problem(desc, a, b, c, d, p); s != CUBLAS_STATUS_SUCCESS) return s;
    if (desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD && desc->bias_type == CUDA_R_32F && is_16bit(d->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int offered = requested < 2 ? requested : 2;
    for (int r = 0; r < offered; ++r) {
        results[r] = cublasLtMatmulHeuristicResult_t{};
        results[r].algo.data[0] = 0x656d75;  // "emu"
        for (int i = 0; i < 4; ++i) results[r].algo.data[1 + i] = pref->alignment[i];
        results[r].algo.data[5] = static_cast<uint64_t>(r);
        results[r].state = CUBLAS_STATUS_SUCCESS;
        results[r].wavesCount = 1.0f;
    }
    *returned = offered;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* A, cublasLtMatrixLayout_t a_desc,
                              const void* B, cublasLtMatrixLayout_t b_desc, const void* beta_p, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t) {
    if (!handle || !alpha_p || !beta_p) return CUBLAS_STATUS_INVALID_VALUE;
    Problem p{};
    if (cublasStatus_t s = check_problem(desc, a_desc, b_desc, c_desc, d_desc, p); s != CUBLAS_STATUS_SUCCESS) return s;
    if (algo && algo->data[0] != 0x656d75) return refuse(CUBLAS_STATUS_INVALID_VALUE, "an algorithm not given by the heuristic");
    const void* pointers[4] = {A, B, C, D};
    for (int i = 0; algo && i < 4; ++i)
        if (alignment_of(pointers[i]) < algo->data[1 + i])
            return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("operand ") + "ABCD"[i] + " is " + std::to_string(alignment_of(pointers[i])) +
                                                           "-byte aligned; the algorithm was chosen for " + std::to_string(algo->data[1 + i]));
    (void)workspace;
    (void)workspace_bytes;
    const cublasLtMatmulDescOpaque_t& d = *desc;
    float alpha, beta;
    std::memcpy(&alpha, alpha_p, sizeof alpha);
    std::memcpy(&beta, beta_p, sizeof beta);
    const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
    const int d_type = d_desc->type, bias_type = d.bias_type < 0 ? d_type : d.bias_type, aux_type = d.aux_type < 0 ? d_type : d.aux_type;
    const cublasLtEpilogue_t e = d.epilogue;
    const uint64_t bias_length = e == CUBLASLT_EPILOGUE_BGRADB ? p.n : p.m;
    if (!in_device_memory(A, span_bytes(a_desc->rows, a_desc->cols, a_desc->ld, a_desc->type), "A") ||
        !in_device_memory(B, span_bytes(b_desc->rows, b_desc->cols, b_desc->ld, b_desc->type), "B") ||
        (beta != 0.0f && !in_device_memory(C, span_bytes(p.m, p.n, c_desc->ld, c_desc->type), "C")) ||
        !in_device_memory(D, span_bytes(p.m, p.n, d_desc->ld, d_type), "D") ||
        (uses_bias(e) && !in_device_memory(d.bias, bias_length * type_bytes(bias_type), "bias")) ||
        (uses_aux(e) && !in_device_memory(d.aux, span_bytes(p.m, p.n, d.aux_ld, aux_type), "aux")) ||
        (d.a_scale && !in_device_memory(d.a_scale, sizeof(float), "A scale")) || (d.b_scale && !in_device_memory(d.b_scale, sizeof(float), "B scale")) ||
        (d.amax_d && !in_device_memory(d.amax_d, sizeof(float), "D amax")))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (is_fp8(a_desc->type) && (alignment_of(A) < 16 || alignment_of(B) < 16)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "FP8: A and B must be 16-byte aligned");
    // The operands' scales fold into alpha: alpha (scale_a A)(scale_b B) = (alpha scale_a scale_b) A B.
    const float ab_scale = (d.a_scale ? *d.a_scale : 1.0f) * (d.b_scale ? *d.b_scale : 1.0f);
    float amax = 0.0f;

    const std::vector<float> a_rows = rows_of_op(A, *a_desc, ta, p.m, p.k, false);
    const std::vector<float> b_rows = rows_of_op(B, *b_desc, tb, p.n, p.k, true);
    // D may be C: every output is computed before any is stored.
    std::vector<float> out(p.m * p.n);
    std::vector<double> bias_grad(bias_length, 0.0);
    for (uint64_t j = 0; j < p.n; ++j)
        for (uint64_t i = 0; i < p.m; ++i) {
            float x = alpha * ab_scale * dot(&a_rows[i * p.k], &b_rows[j * p.k], p.k);
            if (beta != 0.0f) x += beta * load(c_desc->type, C, j * static_cast<uint64_t>(c_desc->ld) + i);  // C is not read when beta = 0
            const size_t aux_index = j * static_cast<uint64_t>(d.aux_ld) + i;
            switch (e) {
                case CUBLASLT_EPILOGUE_BIAS: x += load(bias_type, d.bias, i); break;
                case CUBLASLT_EPILOGUE_GELU: x = gelu(x); break;
                case CUBLASLT_EPILOGUE_GELU_AUX: store(aux_type, d.aux, aux_index, x); x = gelu(x); break;
                case CUBLASLT_EPILOGUE_GELU_BIAS: x = gelu(x + load(bias_type, d.bias, i)); break;
                case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
                    x += load(bias_type, d.bias, i);
                    store(aux_type, d.aux, aux_index, x);
                    x = gelu(x);
                    break;
                case CUBLASLT_EPILOGUE_DGELU: x *= gelu_grad(load(aux_type, d.aux, aux_index)); break;
                case CUBLASLT_EPILOGUE_DGELU_BGRAD:
                    x *= gelu_grad(load(aux_type, d.aux, aux_index));
                    bias_grad[i] += x;
                    break;
                default: break;
            }
            out[j * p.m + i] = x;
            amax = std::isnan(x) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(x));
        }
    if (d.amax_d) *d.amax_d = amax;
    if (e == CUBLASLT_EPILOGUE_BGRADA)
        for (uint64_t i = 0; i < p.m; ++i)
            for (uint64_t l = 0; l < p.k; ++l) bias_grad[i] += a_rows[i * p.k + l];
    if (e == CUBLASLT_EPILOGUE_BGRADB)
        for (uint64_t j = 0; j < p.n; ++j)
            for (uint64_t l = 0; l < p.k; ++l) bias_grad[j] += b_rows[j * p.k + l];
    for (uint64_t j = 0; j < p.n; ++j)
        for (uint64_t i = 0; i < p.m; ++i) store(d_type, D, j * static_cast<uint64_t>(d_desc->ld) + i, out[j * p.m + i]);
    if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB)
        for (uint64_t i = 0; i < bias_length; ++i) store(bias_type, const_cast<void*>(d.bias), i, static_cast<float>(bias_grad[i]));
    emu::check_guards("cublasLtMatmul");
    return CUBLAS_STATUS_SUCCESS;
}
