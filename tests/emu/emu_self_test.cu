// The CUDA emulation's own checks: each detector reports the fault it exists for (naming the
// kernel), and the builtins, WMMA, the cuBLASLt and CUB stand-ins compute what CUDA defines.
#include <gtest/gtest.h>

#include <cub/cub.cuh>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace wmma = nvcuda::wmma;

template <class T>
T* device_array(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    return static_cast<T*>(p);
}

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

template <class T>
T* to_device(const std::vector<T>& h) {
    T* d = device_array<T>(h.size());
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

// The message of the emu::Fault `launch` throws ("" if none).
std::string fault_of(const std::function<void()>& launch) {
    try {
        launch();
    } catch (const emu::Fault& e) {
        return e.what();
    }
    return "";
}

// ---- barriers and the race check ----

// out[t] = the value thread t + 1 wrote to shared memory: needs the barrier between.
__global__ void shift_through_shared(int* out, bool barrier) {
    __shared__ int values[64];
    const int t = threadIdx.x;
    values[t] = 10 * t;
    if (barrier) __syncthreads();
    out[t] = values[(t + 1) % 64];
}

TEST(EmuRaceCheck, ResultDependingOnThreadOrderIsReportedNamingTheKernel) {
    int* out = device_array<int>(64);
    shift_through_shared<<<1, 64>>>(out, true);
    const std::vector<int> h = to_host(out, 64);
    for (int t = 0; t < 64; ++t) EXPECT_EQ(h[static_cast<size_t>(t)], 10 * ((t + 1) % 64));
    const std::string fault = fault_of([&] { shift_through_shared<<<1, 64>>>(out, false); });
    EXPECT_NE(fault.find("kernel shift_through_shared: the result depends on the order of the threads"), std::string::npos) << fault;
    cudaFree(out);
}

// Each block reads what the previous block wrote: right only if blocks ran in order.
__global__ void read_previous_block(int* data) {
    if (threadIdx.x == 0) data[blockIdx.x + 1] = data[blockIdx.x] + 1;
}

TEST(EmuRaceCheck, BlockReadingAnotherBlocksOutputIsReported) {
    int* data = to_device(std::vector<int>(9, 0));
    const std::string fault = fault_of([&] { read_previous_block<<<8, 32>>>(data); });
    EXPECT_NE(fault.find("kernel read_previous_block: the result depends on the order"), std::string::npos) << fault;
    cudaFree(data);
}

__global__ void barrier_after_exit(int* out) {
    if (threadIdx.x < 16) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void divergent_barriers(int* out) {
    if (threadIdx.x % 2 == 0) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

TEST(EmuBarriers, BarrierAfterSomeThreadsExitedIsAnError) {
    int* out = device_array<int>(64);
    const std::string fault = fault_of([&] { barrier_after_exit<<<1, 64>>>(out); });
    EXPECT_NE(fault.find("kernel barrier_after_exit, block (0, 0, 0): __syncthreads at"), std::string::npos) << fault;
    EXPECT_NE(fault.find("16 threads of the block have exited"), std::string::npos) << fault;
    cudaFree(out);
}

TEST(EmuBarriers, ThreadsAtDifferentBarriersAreAnError) {
    int* out = device_array<int>(64);
    const std::string fault = fault_of([&] { divergent_barriers<<<1, 64>>>(out); });
    EXPECT_NE(fault.find("kernel divergent_barriers"), std::string::npos) << fault;
    EXPECT_NE(fault.find("divergent __syncthreads"), std::string::npos) << fault;
    cudaFree(out);
}

// ---- memory ----

__global__ void write_one_past(float* p, int n) {
    if (threadIdx.x == 0) p[n] = 1.0f;
}

TEST(EmuMemory, WriteOnePastAnAllocationIsReportedNamingKernelAndAllocation) {
    float* p = device_array<float>(10);
    const std::string fault = fault_of([&] { write_one_past<<<1, 32>>>(p, 10); });
    EXPECT_NE(fault.find("kernel write_one_past: device allocation #"), std::string::npos) << fault;
    EXPECT_NE(fault.find("(40 bytes): the guard after it was written 0 bytes past its end"), std::string::npos) << fault;
    EXPECT_EQ(cudaFree(p), cudaSuccess);  // the guard was repaired after the report
}

__global__ void copy_uninitialized_shared(float* out) {
    __shared__ float scratch[32];
    out[threadIdx.x] = scratch[threadIdx.x];
}

TEST(EmuMemory, FreshDeviceAndSharedMemoryReadAsNaN) {
    float* p = device_array<float>(32);
    for (float v : to_host(p, 32)) EXPECT_TRUE(std::isnan(v));
    float* out = to_device(std::vector<float>(32, 0.0f));
    copy_uninitialized_shared<<<1, 32>>>(out);
    for (float v : to_host(out, 32)) EXPECT_TRUE(std::isnan(v));
    cudaFree(p);
    cudaFree(out);
}

TEST(EmuMemory, CopyBeyondAnAllocationIsRefused) {
    float* p = device_array<float>(8);
    std::vector<float> host(9, 1.0f);
    EXPECT_EQ(cudaMemcpy(p, host.data(), 9 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemset(p + 1, 0, 8 * sizeof(float)), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    cudaFree(p);
}

// ---- launch configuration ----

__global__ void uses_dynamic_shared(int* out) {
    extern __shared__ __align__(16) unsigned char bytes[];
    bytes[threadIdx.x] = static_cast<unsigned char>(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = bytes[31 - threadIdx.x];
}

TEST(EmuLaunch, BadConfigurationsAreLaunchErrors) {
    int* out = device_array<int>(32);
    uses_dynamic_shared<<<1, 2048, 64>>>(out);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    uses_dynamic_shared<<<1, 32, 64 * 1024>>>(out);  // above 48 KiB without the attribute
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    ASSERT_EQ(cudaFuncSetAttribute(uses_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), cudaSuccess);
    uses_dynamic_shared<<<1, 32, 64 * 1024>>>(out);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> h = to_host(out, 32);
    for (int t = 0; t < 32; ++t) EXPECT_EQ(h[static_cast<size_t>(t)], 31 - t);
    cudaFree(out);
}

// ---- warp collectives ----

// out[k * 32 + lane]: the 6 collectives' results for each lane.
__global__ void collectives(int* out) {
    const int lane = threadIdx.x;
    const unsigned full = 0xffffffffu;
    out[0 * 32 + lane] = __shfl_xor_sync(full, 100 + lane, 5);
    out[1 * 32 + lane] = __shfl_down_sync(full, 100 + lane, 3);
    out[2 * 32 + lane] = __shfl_up_sync(full, 100 + lane, 3, 8);
    out[3 * 32 + lane] = __shfl_sync(full, 100 + lane, 7);
    out[4 * 32 + lane] = static_cast<int>(__ballot_sync(full, lane % 3 == 0));
    out[5 * 32 + lane] = __any_sync(full, lane == 17) + 2 * __all_sync(full, lane < 31);
}

TEST(EmuWarp, ShufflesAndVotesGiveEachLaneWhatCudaDefines) {
    int* out = device_array<int>(6 * 32);
    collectives<<<1, 32>>>(out);
    const std::vector<int> h = to_host(out, 6 * 32);
    unsigned ballot = 0;
    for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane) {
        SCOPED_TRACE(lane);
        const auto at = [&](int k) { return h[static_cast<size_t>(k * 32 + lane)]; };
        EXPECT_EQ(at(0), 100 + (lane ^ 5));
        EXPECT_EQ(at(1), 100 + (lane + 3 < 32 ? lane + 3 : lane));
        EXPECT_EQ(at(2), 100 + (lane % 8 >= 3 ? lane - 3 : lane));
        EXPECT_EQ(at(3), 107);
        EXPECT_EQ(static_cast<unsigned>(at(4)), ballot);
        EXPECT_EQ(at(5), 1);
    }
    cudaFree(out);
}

__global__ void shuffle_with_exited_lanes(int* out) {
    if (threadIdx.x < 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

TEST(EmuWarp, CollectiveSomeLanesNeverReachIsAnError) {
    int* out = device_array<int>(32);
    const std::string fault = fault_of([&] { shuffle_with_exited_lanes<<<1, 32>>>(out); });
    EXPECT_NE(fault.find("kernel shuffle_with_exited_lanes"), std::string::npos) << fault;
    EXPECT_NE(fault.find("for lanes that never reach it: 0 (exited)"), std::string::npos) << fault;
    cudaFree(out);
}

// ---- WMMA ----

// d = a b for 16 x 16 tiles in the given layouts (lda = ldb = ld elements), fp32 out row-major.
template <class T, class LA, class LB>
__global__ void wmma_product(float* d, const T* a, const T* b, int ld) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, ld);
    wmma::load_matrix_sync(fb, b, ld);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

template <class T, class LA, class LB>
void expect_wmma_product(T (*to_half)(float)) {
    const int ld = 24;  // padded rows: the leading dimension matters
    std::vector<T> a(16 * ld), b(16 * ld);
    std::vector<float> av(16 * 16), bv(16 * 16);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            av[static_cast<size_t>(r * 16 + c)] = static_cast<float>((r * 3 + c) % 7 - 3);
            bv[static_cast<size_t>(r * 16 + c)] = static_cast<float>((r + 2 * c) % 5 - 2);
        }
    const bool a_col = std::is_same_v<LA, wmma::col_major>, b_col = std::is_same_v<LB, wmma::col_major>;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            a[static_cast<size_t>(a_col ? c * ld + r : r * ld + c)] = to_half(av[static_cast<size_t>(r * 16 + c)]);
            b[static_cast<size_t>(b_col ? c * ld + r : r * ld + c)] = to_half(bv[static_cast<size_t>(r * 16 + c)]);
        }
    float* d = device_array<float>(256);
    T* da = to_device(a);
    T* db = to_device(b);
    wmma_product<T, LA, LB><<<1, 32>>>(d, da, db, ld);
    const std::vector<float> h = to_host(d, 256);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            float expected = 0;
            for (int k = 0; k < 16; ++k) expected += av[static_cast<size_t>(r * 16 + k)] * bv[static_cast<size_t>(k * 16 + c)];
            EXPECT_EQ(h[static_cast<size_t>(r * 16 + c)], expected) << r << ", " << c;
        }
    cudaFree(d);
    cudaFree(da);
    cudaFree(db);
}

TEST(EmuWmma, ProductMatchesTheReferenceForEveryLayoutAndType) {
    expect_wmma_product<__nv_bfloat16, wmma::row_major, wmma::col_major>(__float2bfloat16_rn);
    expect_wmma_product<__nv_bfloat16, wmma::col_major, wmma::row_major>(__float2bfloat16_rn);
    expect_wmma_product<__half, wmma::row_major, wmma::row_major>(__float2half_rn);
    expect_wmma_product<__half, wmma::col_major, wmma::col_major>(__float2half_rn);
}

// Writes x[i] = lane * 8 + i into an accumulator and stores it: only an identity lane
// mapping would give 0..255 in row-major order.
__global__ void assume_lane_mapping(float* d) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = static_cast<float>(threadIdx.x * 8 + i);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

TEST(EmuWmma, CodeAssumingALaneMappingGetsTheTileScrambled) {
    float* d = device_array<float>(256);
    assume_lane_mapping<<<1, 32>>>(d);
    const std::vector<float> h = to_host(d, 256);
    int in_place = 0;
    std::vector<bool> seen(256);
    for (int e = 0; e < 256; ++e) {
        in_place += h[static_cast<size_t>(e)] == static_cast<float>(e);
        seen[static_cast<size_t>(h[static_cast<size_t>(e)])] = true;
    }
    EXPECT_LT(in_place, 32) << "the lane mapping is (nearly) the identity";
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256) << "a permutation: every element stored once";
    cudaFree(d);
}

__global__ void wmma_load_at(float* out, const __half* a, int ld) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, ld);
    out[threadIdx.x] = __half2float(fa.x[0]);
}

TEST(EmuWmma, BadLeadingDimensionsAndTilesOutsideMemoryAreErrors) {
    __half* a = device_array<__half>(16 * 16);
    float* out = device_array<float>(32);
    std::string fault = fault_of([&] { wmma_load_at<<<1, 32>>>(out, a, 12); });
    EXPECT_NE(fault.find("kernel wmma_load_at"), std::string::npos) << fault;
    EXPECT_NE(fault.find("leading dimension 12 is not a multiple of 16 bytes"), std::string::npos) << fault;
    fault = fault_of([&] { wmma_load_at<<<1, 32>>>(out, a, 24); });  // rows of 24: the tile runs past the 256 elements
    EXPECT_NE(fault.find("is outside device memory"), std::string::npos) << fault;
    cudaFree(a);
    cudaFree(out);
}

// ---- cuBLASLt ----

struct Epilogue {
    cublasLtEpilogue_t value;
    const char* name;
};

float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
float gelu_grad(float x) {
    const float t = std::tanh(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

// One GEMM through the stand-in (A and B bf16 in padded storage; C = D, bias and aux f32)
// against its definition in cublaslt.cpp, for one epilogue and transposes of A and B.
void expect_gemm(cublasLtEpilogue_t epilogue, bool ta, bool tb) {
    SCOPED_TRACE(testing::Message() << "epilogue " << epilogue << " transa " << ta << " transb " << tb);
    const int m = 5, n = 7, k = 9, lda = 16, ldb = 16, ldd = 8, ld_aux = 8;
    const float alpha = 0.5f, beta = epilogue == CUBLASLT_EPILOGUE_DEFAULT ? 0.25f : 0.0f;
    std::mt19937 rng(epilogue * 4 + ta * 2 + tb);
    std::uniform_real_distribution<float> u(-1, 1);
    const auto rounded = [&] { return __bfloat162float(__float2bfloat16_rn(u(rng))); };
    std::vector<float> A(static_cast<size_t>(m * k)), B(static_cast<size_t>(k * n)), C(static_cast<size_t>(ldd * n)), bias(16), aux(static_cast<size_t>(ld_aux * n));
    for (float& v : A) v = rounded();
    for (float& v : B) v = rounded();
    for (float& v : C) v = u(rng);
    for (float& v : bias) v = u(rng);
    for (float& v : aux) v = u(rng);
    // Stored A: op(A) = A (m x k) or A^T stored k x m; likewise B.
    std::vector<__nv_bfloat16> a_store(static_cast<size_t>(lda * 16), __float2bfloat16_rn(NAN)), b_store(static_cast<size_t>(ldb * 16), __float2bfloat16_rn(NAN));
    for (int i = 0; i < m; ++i)
        for (int l = 0; l < k; ++l) a_store[static_cast<size_t>(ta ? i * lda + l : l * lda + i)] = __float2bfloat16_rn(A[static_cast<size_t>(i * k + l)]);
    for (int l = 0; l < k; ++l)
        for (int j = 0; j < n; ++j) b_store[static_cast<size_t>(tb ? l * ldb + j : j * ldb + l)] = __float2bfloat16_rn(B[static_cast<size_t>(l * n + j)]);
    auto* da = to_device(a_store);
    auto* db = to_device(b_store);
    float* dd = to_device(C);
    float* dbias = to_device(bias);
    float* daux = to_device(aux);

    cublasLtHandle_t handle;
    ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc;
    ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t aux_ld = ld_aux;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux, sizeof daux);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd);
    ASSERT_EQ(cublasLtMatmul(handle, desc, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, nullptr, nullptr, 0, nullptr), CUBLAS_STATUS_SUCCESS);

    const std::vector<float> D = to_host(dd, C.size()), bias_out = to_host(dbias, bias.size()), aux_out = to_host(daux, aux.size());
    std::vector<double> bias_grad(16, 0.0);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            float x = 0;
            for (int l = 0; l < k; ++l) x += A[static_cast<size_t>(i * k + l)] * B[static_cast<size_t>(l * n + j)];
            x = alpha * x + beta * C[static_cast<size_t>(j * ldd + i)];
            const size_t ai = static_cast<size_t>(j * ld_aux + i);
            float expected_aux = aux[ai];
            switch (epilogue) {
                case CUBLASLT_EPILOGUE_BIAS: x += bias[static_cast<size_t>(i)]; break;
                case CUBLASLT_EPILOGUE_GELU: x = gelu(x); break;
                case CUBLASLT_EPILOGUE_GELU_AUX: expected_aux = x; x = gelu(x); break;
                case CUBLASLT_EPILOGUE_GELU_BIAS: x = gelu(x + bias[static_cast<size_t>(i)]); break;
                case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: expected_aux = x + bias[static_cast<size_t>(i)]; x = gelu(expected_aux); break;
                case CUBLASLT_EPILOGUE_DGELU: x *= gelu_grad(aux[ai]); break;
                case CUBLASLT_EPILOGUE_DGELU_BGRAD: x *= gelu_grad(aux[ai]); bias_grad[static_cast<size_t>(i)] += x; break;
                default: break;
            }
            EXPECT_NEAR(D[static_cast<size_t>(j * ldd + i)], x, 1e-5) << "D[" << i << ", " << j << "]";
            EXPECT_NEAR(aux_out[ai], expected_aux, 1e-5) << "aux[" << i << ", " << j << "]";
        }
    if (epilogue == CUBLASLT_EPILOGUE_BGRADA)
        for (int i = 0; i < m; ++i)
            for (int l = 0; l < k; ++l) bias_grad[static_cast<size_t>(i)] += A[static_cast<size_t>(i * k + l)];
    if (epilogue == CUBLASLT_EPILOGUE_BGRADB)
        for (int j = 0; j < n; ++j)
            for (int l = 0; l < k; ++l) bias_grad[static_cast<size_t>(j)] += B[static_cast<size_t>(l * n + j)];
    const bool writes_bias = epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || epilogue == CUBLASLT_EPILOGUE_BGRADA || epilogue == CUBLASLT_EPILOGUE_BGRADB;
    const int bias_length = epilogue == CUBLASLT_EPILOGUE_BGRADB ? n : m;
    for (int i = 0; i < 16; ++i)
        EXPECT_NEAR(bias_out[static_cast<size_t>(i)], writes_bias && i < bias_length ? bias_grad[static_cast<size_t>(i)] : bias[static_cast<size_t>(i)], 1e-5)
            << "bias[" << i << "]";
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dd), static_cast<void*>(dbias), static_cast<void*>(daux)}) cudaFree(p);
}

TEST(EmuCublasLt, EveryEpilogueAndTransposeMatchesItsDefinition) {
    for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_AUX,
                                 CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                                 CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB})
        for (bool ta : {false, true})
            for (bool tb : {false, true}) expect_gemm(e, ta, tb);
}

TEST(EmuCublasLt, RefusesWhatItDoesNotModelAndDisagreeingShapes) {
    cublasLtHandle_t handle;
    cublasLtCreate(&handle);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatrixLayout_t a, b, d, wrong;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 8, 4, 8);  // m 8 x k 4
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 4, 6, 4);  // k 4 x n 6
    cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, 8, 6, 8);
    cublasLtMatrixLayoutCreate(&wrong, CUDA_R_32F, 6, 8, 6);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    const auto heuristic = [&](cublasComputeType_t compute, cublasLtEpilogue_t epilogue, cublasOperation_t transa, cublasLtMatrixLayout_t out) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa);
        const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, out, out, pref, 1, &result, &found);
        cublasLtMatmulDescDestroy(desc);
        return s;
    };
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_N, d), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(found, 1);
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F_FAST_TF32, CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_N, d), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_RELU, CUBLAS_OP_N, d), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_T, d), CUBLAS_STATUS_INVALID_VALUE);  // op(A) 4 x 8
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_N, wrong), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_GELU_AUX, CUBLAS_OP_N, d), CUBLAS_STATUS_INVALID_VALUE);  // no aux leading dimension
    const int order = CUBLASLT_ORDER_ROW;
    cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order);
    EXPECT_EQ(heuristic(CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_N, d), CUBLAS_STATUS_NOT_SUPPORTED);
    for (cublasLtMatrixLayout_t l : {a, b, d, wrong}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtDestroy(handle);
}

// ---- CUB ----

TEST(EmuCub, RadixSortIsStableOnTheGivenBitsAndTheResultIsInCurrent) {
    const int n = 100;
    std::vector<uint32_t> keys(n);
    std::vector<int32_t> rows(n);
    for (int i = 0; i < n; ++i) {
        keys[static_cast<size_t>(i)] = static_cast<uint32_t>((i * 37) % 11) | 0x100u;  // bit 8 is outside the sorted bits
        rows[static_cast<size_t>(i)] = i;
    }
    uint32_t* k0 = to_device(keys);
    uint32_t* k1 = device_array<uint32_t>(n);
    int32_t* v0 = to_device(rows);
    int32_t* v1 = device_array<int32_t>(n);
    cub::DoubleBuffer<uint32_t> k(k0, k1);
    cub::DoubleBuffer<int32_t> v(v0, v1);
    size_t temp_bytes = 0;
    ASSERT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k, v, n, 0, 4), cudaSuccess);
    void* temp = device_array<unsigned char>(temp_bytes);
    size_t too_small = temp_bytes - 1;
    EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp, too_small, k, v, n, 0, 4), cudaErrorInvalidValue);
    ASSERT_EQ(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, n, 0, 4), cudaSuccess);
    const std::vector<uint32_t> sorted_keys = to_host(k.Current(), n);
    const std::vector<int32_t> sorted_rows = to_host(v.Current(), n);
    for (int i = 1; i < n; ++i) {
        const auto prev = static_cast<size_t>(i - 1), cur = static_cast<size_t>(i);
        ASSERT_LE(sorted_keys[prev] & 15u, sorted_keys[cur] & 15u);
        if ((sorted_keys[prev] & 15u) == (sorted_keys[cur] & 15u)) {
            EXPECT_LT(sorted_rows[prev], sorted_rows[cur]) << "stable";
        }
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(sorted_keys[static_cast<size_t>(i)], keys[static_cast<size_t>(sorted_rows[static_cast<size_t>(i)])]);
    for (void* p : {static_cast<void*>(k0), static_cast<void*>(k1), static_cast<void*>(v0), static_cast<void*>(v1), temp}) cudaFree(p);
}

}  // namespace
