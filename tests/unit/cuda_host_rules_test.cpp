// The CUDA backend's host-side decisions (backend/cuda_host_rules.h), on any machine: the GEMM
// engine, the driver check's message, LLMTRAIN_CUDA_CHECK, the alignment checks and whether
// GPU tests may skip.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda_host_rules.h"
#include "core/error.h"

using namespace llmtrain;

namespace {

GemmFacts facts(int64_t m, int64_t n, int64_t k, GemmEpilogue e = GemmEpilogue::none, int64_t aux_ld = 0, int aux_alignment = 256) {
    GemmFacts f;
    f.m = m, f.n = n, f.k = k;
    f.epilogue = e;
    f.aux_ld = aux_ld;
    f.aux_alignment_bytes = aux_alignment;
    return f;
}

template <class Fn>
std::string error_of(Fn&& fn, ErrorKind expected_kind) {
    try {
        fn();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), expected_kind) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error thrown";
    return "";
}

}  // namespace

TEST(GemmEngine, OrdinaryShapeWithAnAlgorithm_RunsCublasLt) {
    EXPECT_EQ(choose_gemm_engine(facts(768, 4096, 3072), 1), GemmEngine::cublaslt);
    EXPECT_EQ(gemm_fallback_reason(facts(768, 4096, 3072)), "");
}

TEST(GemmEngine, NoAlgorithmFromTheHeuristic_RunsTheFallbackKernel) {
    EXPECT_EQ(choose_gemm_engine(facts(768, 4096, 3072), 0), GemmEngine::fallback_kernel);
}

TEST(GemmEngine, ADimensionOfOne_RunsTheFallbackKernelWhateverTheHeuristic) {
    for (const GemmFacts& f : {facts(1, 64, 64), facts(64, 1, 64), facts(64, 64, 1)}) {
        EXPECT_EQ(choose_gemm_engine(f, 1), GemmEngine::fallback_kernel) << f.m << " " << f.n << " " << f.k;
        EXPECT_NE(gemm_fallback_reason(f).find("a dimension of 1"), std::string::npos);
    }
}

TEST(GemmEngine, GeluAuxMatrixCublasLtRefuses_RunsTheFallbackKernel) {
    // cuBLASLt's GELU epilogues need the aux leading dimension a multiple of 8, its address 16-byte aligned.
    EXPECT_EQ(choose_gemm_engine(facts(36, 8, 16, GemmEpilogue::gelu_aux_bias, 36), 1), GemmEngine::fallback_kernel);
    EXPECT_EQ(choose_gemm_engine(facts(40, 8, 16, GemmEpilogue::dgelu_bgrad, 40, 8), 1), GemmEngine::fallback_kernel);
    EXPECT_EQ(choose_gemm_engine(facts(40, 8, 16, GemmEpilogue::dgelu_bgrad, 40, 16), 1), GemmEngine::cublaslt);
    // Without a GELU epilogue the aux facts do not matter.
    EXPECT_EQ(choose_gemm_engine(facts(36, 8, 16, GemmEpilogue::bias, 36, 2), 1), GemmEngine::cublaslt);
}

// A forward linear layer in FP8: weights [64, 128] and inputs [32, 128], row-major.
GemmFacts fp8_forward() {
    GemmFacts f;
    f.m = 64, f.n = 32, f.k = 128;
    f.a_dtype = DType::e4m3, f.b_dtype = DType::e4m3, f.d_dtype = DType::bf16;
    f.transpose_a = true, f.transpose_b = false;
    f.lda = 128, f.ldb = 128;
    return f;
}

TEST(Fp8GemmRules, TnWithAlignedOperands_IsServed_SixteenBitGemmsAreNotConcerned) {
    EXPECT_EQ(fp8_gemm_problem(fp8_forward()), "");
    GemmFacts gradients = fp8_forward();
    gradients.b_dtype = DType::e5m2;
    EXPECT_EQ(fp8_gemm_problem(gradients), "");
    GemmFacts bf16;
    bf16.m = 3, bf16.n = 5, bf16.k = 7;  // not TN, odd sizes: not an FP8 question
    EXPECT_EQ(fp8_gemm_problem(bf16), "");
}

TEST(Fp8GemmRules, WhatHopperRefuses_IsNamed) {
    const auto problem = [](auto change) {
        GemmFacts f = fp8_forward();
        change(f);
        return fp8_gemm_problem(f);
    };
    EXPECT_NE(problem([](GemmFacts& f) { f.b_dtype = DType::bf16; }).find("both operands in FP8"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.a_dtype = f.b_dtype = DType::e5m2; }).find("both operands are e5m2"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.transpose_b = true; }).find("\"TN\""), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.k = 120, f.lda = f.ldb = 120; }).find("k = 120"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.ldb = 136 + 4; }).find("leading dimensions"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.b_alignment_bytes = 8; }).find("8-byte"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.d_dtype = DType::e4m3; }).find("D is e4m3"), std::string::npos);
    EXPECT_NE(problem([](GemmFacts& f) { f.epilogue = GemmEpilogue::dgelu_bgrad; }).find("dgelu_bgrad"), std::string::npos);
}

TEST(CudaDriverCheck, DriverAtLeastTheRuntime_IsAccepted) {
    EXPECT_EQ(cuda_driver_problem(12040, 12040), "");
    EXPECT_EQ(cuda_driver_problem(13000, 12040), "");
}

TEST(CudaDriverCheck, OlderDriver_NamesBothVersionsAndTheRemedy) {
    const std::string message = cuda_driver_problem(12020, 13000);
    EXPECT_NE(message.find("supports CUDA 12.2"), std::string::npos) << message;
    EXPECT_NE(message.find("built with CUDA 13.0"), std::string::npos) << message;
    EXPECT_NE(message.find("update the driver"), std::string::npos) << message;
    EXPECT_NE(message.find("train.device = \"cpu\""), std::string::npos) << message;
}

TEST(CudaDriverCheck, NoDriver_SaysSoAndNamesTheRuntimeNeeded) {
    const std::string message = cuda_driver_problem(0, 12080);
    EXPECT_NE(message.find("no NVIDIA driver"), std::string::npos) << message;
    EXPECT_NE(message.find("CUDA 12.8"), std::string::npos) << message;
}

TEST(CudaSyncCheck, UnsetEmptyOrOff_IsOffAndSync_IsOn) {
    EXPECT_FALSE(cuda_sync_check_requested(nullptr));
    EXPECT_FALSE(cuda_sync_check_requested(""));
    EXPECT_FALSE(cuda_sync_check_requested("off"));
    EXPECT_TRUE(cuda_sync_check_requested("sync"));
}

TEST(CudaSyncCheck, AnyOtherValue_IsAConfigErrorNamingTheVariable) {
    const std::string message = error_of([] { cuda_sync_check_requested("yes"); }, ErrorKind::config);
    EXPECT_NE(message.find("LLMTRAIN_CUDA_CHECK"), std::string::npos) << message;
    EXPECT_NE(message.find("\"sync\""), std::string::npos) << message;
}

TEST(AlignmentCheck, AlignedAddressAndStride_Pass) {
    alignas(16) static char buffer[64];
    EXPECT_NO_THROW(expect_aligned("attention_fwd", "qkv", buffer, 48, 16));
    EXPECT_NO_THROW(expect_aligned("attention_fwd", "saved", buffer + 4, 0, 4));
}

TEST(AlignmentCheck, MisalignedAddress_NamesOpTensorAndAlignment) {
    alignas(16) static char buffer[64];
    const std::string message = error_of([&] { expect_aligned("attention_bwd", "dout", buffer + 2, 48, 16); }, ErrorKind::unsupported);
    EXPECT_NE(message.find("attention_bwd: dout"), std::string::npos) << message;
    EXPECT_NE(message.find("16-byte aligned"), std::string::npos) << message;
}

TEST(AlignmentCheck, RowStrideNotAMultiple_NamesTheStride) {
    alignas(16) static char buffer[64];
    const std::string message = error_of([&] { expect_aligned("attention_fwd", "qkv", buffer, 40, 16); }, ErrorKind::unsupported);
    EXPECT_NE(message.find("rows of 40 bytes"), std::string::npos) << message;
}

TEST(GpuVisibility, SkipOnlyWithoutACudaBuildOrAnyGpu) {
    EXPECT_FALSE(gpu_visible(false, true, 8));  // a CPU-only build cannot use one
    EXPECT_FALSE(gpu_visible(true, false, 0));
    EXPECT_TRUE(gpu_visible(true, true, 0));    // a device node: the driver may be what is broken
    EXPECT_TRUE(gpu_visible(true, false, 1));
}
