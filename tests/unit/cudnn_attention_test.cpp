// The cuDNN attention graphs against a stand-in libcudnn that records what it is given
// (tests/support/fake_cudnn.c): the forward and backward graphs' operations, tensor shapes
// and strides (Q, K, V read in place from the packed QKV rows), the causal mask, the
// deterministic engine filter, the error paths when no engine finalizes, and the variant
// packs' bindings. What a real cuDNN computes with them is tests/gpu's (CudnnAttention*).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cudnn/cudnn_attention.h"

using namespace llmtrain;

namespace {

// One recorded line: its words after the first two ("op G ...", "tensor G ..."), as
// key-value pairs where they pair up.
struct Line {
    std::string kind;  // "pointwise", "matmul", ... for ops; "tensor", "plan", "execute"
    int graph = 0;
    std::map<std::string, std::string> fields;
    long long num(const std::string& key) const { return std::stoll(fields.at(key), nullptr, 0); }
    bool has(const std::string& key) const { return fields.count(key) > 0; }
};

class FakeCudnn {
public:
    FakeCudnn() {
        setenv("LLMTRAIN_CUDNN_LIBRARY", LLMTRAIN_FAKE_CUDNN, 1);
        setenv("FAKE_CUDNN_MODE", "", 1);
        handle_ = dlopen(LLMTRAIN_FAKE_CUDNN, RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error(dlerror());
        log_ = reinterpret_cast<const char* (*)()>(dlsym(handle_, "fake_cudnn_log"));
        reset_ = reinterpret_cast<void (*)()>(dlsym(handle_, "fake_cudnn_reset"));
        reset_();
    }
    ~FakeCudnn() {
        unsetenv("LLMTRAIN_CUDNN_LIBRARY");
        unsetenv("FAKE_CUDNN_MODE");
        dlclose(handle_);
    }
    void mode(const char* m) { setenv("FAKE_CUDNN_MODE", m, 1); }

    std::vector<Line> lines() const {
        std::vector<Line> out;
        std::istringstream in(log_());
        std::string text;
        while (std::getline(in, text)) {
            std::istringstream words(text);
            std::string head, word;
            Line l;
            words >> head >> l.graph;
            if (head == "op") words >> l.kind;
            else l.kind = head;
            std::string key;
            while (words >> word) {
                if (key.empty()) key = word;
                else l.fields[key] = word, key.clear();
            }
            out.push_back(l);
        }
        return out;
    }
    // The operations of graph g, in the order they were added.
    std::vector<Line> ops(int g) const {
        std::vector<Line> out;
        for (const Line& l : lines())
            if (l.graph == g && l.kind != "tensor" && l.kind != "plan" && l.kind != "execute" && l.kind != "graph") out.push_back(l);
        return out;
    }
    Line tensor(int g, long long uid) const {
        for (const Line& l : lines())
            if (l.graph == g && l.kind == "tensor" && l.num("uid") == uid) return l;
        throw std::runtime_error(cat("graph ", g, " has no tensor ", uid));
    }
    std::vector<Line> of_kind(const std::string& kind, int g) const {
        std::vector<Line> out;
        for (const Line& l : lines())
            if (l.kind == kind && l.graph == g) out.push_back(l);
        return out;
    }

private:
    void* handle_ = nullptr;
    const char* (*log_)() = nullptr;
    void (*reset_)() = nullptr;
};

std::unique_ptr<CudnnAttention> open_attention() {
    std::string why_not;
    std::unique_ptr<CudnnAttention> a = CudnnAttention::open(nullptr, why_not);
    if (!a) throw std::runtime_error(why_not);
    return a;
}

std::string dims(long long a, long long b, long long c, long long d) { return cat(a, ",", b, ",", c, ",", d); }

// cudnnDataType_t and the modes the graphs use (cudnn_api.h).
constexpr long long kFloat = 0, kBf16 = 9, kInt32 = 4, kBool = 11;
constexpr long long kMul = 1, kSub = 9, kExp = 13, kLog = 15, kAdd = 0, kDiv = 6, kCmpGe = 303, kGenIndex = 501, kSelect = 601;

const AttentionShape kMha{2, 64, 4, 4, 64};   // W = 12 * 64
const AttentionShape kGqa{2, 64, 8, 2, 64};   // W = 12 * 64

}  // namespace

TEST(CudnnAttentionGraph, Forward_ScalesMasksAndKeepsLogSumExpOverQkvReadInPlace) {
    FakeCudnn fake;
    auto attention = open_attention();
    const CudnnAttentionReport& r = attention->plan(kMha, DType::bf16);
    ASSERT_TRUE(r.planned) << r.failure;
    EXPECT_EQ(r.mask_form, "int32 indices");
    const std::vector<Line> ops = fake.ops(1);
    std::vector<std::string> kinds;
    for (const Line& op : ops) kinds.push_back(op.kind == "pointwise" ? cat("pw", op.num("mode")) : op.kind);
    const std::vector<std::string> expected{"matmul", cat("pw", kMul), cat("pw", kGenIndex), cat("pw", kGenIndex), cat("pw", kCmpGe), cat("pw", kSelect),
                                            "reduction", cat("pw", kSub), cat("pw", kExp), "reduction", cat("pw", kLog), cat("pw", kAdd), cat("pw", kDiv),
                                            "matmul"};
    EXPECT_EQ(kinds, expected);
    // S = Q K^T: Q [B, H, T, D] and K^T [B, Hkv, D, T] as views of the packed rows (W = 768).
    EXPECT_EQ(ops[0].num("a"), 1);
    EXPECT_EQ(ops[0].num("b"), 2);
    EXPECT_EQ(ops[0].num("comp"), kFloat);
    const long long W = 768, T = 64;
    EXPECT_EQ(fake.tensor(1, 1).fields.at("dims"), dims(2, 4, 64, 64));
    EXPECT_EQ(fake.tensor(1, 1).fields.at("strides"), dims(T * W, 64, W, 1));
    EXPECT_EQ(fake.tensor(1, 2).fields.at("dims"), dims(2, 4, 64, 64));
    EXPECT_EQ(fake.tensor(1, 2).fields.at("strides"), dims(T * W, 64, 1, W));
    EXPECT_EQ(fake.tensor(1, 3).fields.at("strides"), dims(T * W, 64, W, 1));
    EXPECT_EQ(fake.tensor(1, 1).num("dtype"), kBf16);
    EXPECT_EQ(fake.tensor(1, 1).num("align"), 16);
    // The scale is a by-value scalar; the causal mask keeps row >= column from generated indices.
    EXPECT_EQ(ops[1].num("b"), 6);
    EXPECT_EQ(fake.tensor(1, 6).num("by_value"), 1);
    EXPECT_EQ(ops[2].num("axis"), 2);
    EXPECT_EQ(ops[3].num("axis"), 3);
    EXPECT_EQ(ops[2].num("prec"), kInt32);
    EXPECT_EQ(ops[4].num("prec"), kBool);
    EXPECT_EQ(ops[4].num("x"), ops[2].num("y"));  // row index first: row >= column
    EXPECT_EQ(ops[4].num("b"), ops[3].num("y"));
    EXPECT_EQ(ops[5].num("t"), ops[4].num("y"));
    EXPECT_EQ(ops[5].num("b"), 7);
    EXPECT_EQ(fake.tensor(1, ops[4].num("y")).num("dtype"), kBool);
    // stats = max + log(sum exp): [B, H, T, 1] fp32, the native kernels' saved layout.
    EXPECT_EQ(ops[11].num("y"), 5);
    EXPECT_EQ(fake.tensor(1, 5).fields.at("dims"), dims(2, 4, 64, 1));
    EXPECT_EQ(fake.tensor(1, 5).fields.at("strides"), dims(4 * 64, 64, 1, 1));
    EXPECT_EQ(fake.tensor(1, 5).num("dtype"), kFloat);
    EXPECT_EQ(fake.tensor(1, 5).num("virtual"), 0);
    // P enters O = P V in bf16; O is [B*T, H*D] row-major.
    EXPECT_EQ(fake.tensor(1, ops[12].num("y")).num("dtype"), kBf16);
    EXPECT_EQ(fake.tensor(1, ops[12].num("y")).num("virtual"), 1);
    EXPECT_EQ(ops[13].num("b"), 3);
    EXPECT_EQ(ops[13].num("c"), 4);
    EXPECT_EQ(fake.tensor(1, 4).fields.at("strides"), dims(T * 256, 64, 256, 1));
}

TEST(CudnnAttentionGraph, Backward_WritesDqByItsMatmulWithoutAnFp32AccumulatorAndKeepsDeltaInTheWorkspace) {
    FakeCudnn fake;
    auto attention = open_attention();
    ASSERT_TRUE(attention->plan(kMha, DType::f16).planned);
    const std::vector<Line> ops = fake.ops(2);
    std::map<long long, Line> writer;  // output uid -> the op that writes it
    for (const Line& op : ops) writer[op.has("c") ? op.num("c") : op.num("y")] = op;
    ASSERT_TRUE(writer.count(9) && writer.count(10) && writer.count(11) && writer.count(12));
    // dQ = dS K, dK = dS^T Q, dV = P^T dO: each by its matmul, in the io type (no fp32 dQ
    // accumulator, whose atomics would make the result depend on the order blocks finish).
    EXPECT_EQ(writer[9].kind, "matmul");
    EXPECT_EQ(writer[10].kind, "matmul");
    EXPECT_EQ(writer[11].kind, "matmul");
    EXPECT_EQ(writer[10].num("b"), 1);  // Q
    EXPECT_EQ(writer[11].num("b"), 8);  // dO
    for (const long long uid : {9, 10, 11}) EXPECT_EQ(fake.tensor(2, uid).num("dtype"), 2) << uid;  // CUDNN_DATA_HALF
    for (const Line& t : fake.of_kind("tensor", 2))
        EXPECT_FALSE(t.num("virtual") == 0 && t.num("dtype") == kFloat && t.fields.at("dims") == dims(2, 4, 64, 64)) << "an fp32 accumulator tensor";
    // Delta = rowsum(dO * O), non-virtual in the workspace.
    EXPECT_EQ(fake.tensor(2, 12).num("virtual"), 0);
    EXPECT_EQ(fake.tensor(2, 12).fields.at("dims"), dims(2, 4, 64, 1));
    // dK and dV land in the packed dqkv rows.
    EXPECT_EQ(fake.tensor(2, 10).fields.at("strides"), dims(64 * 768, 64, 768, 1));
}

TEST(CudnnAttentionGraph, GroupedQueryBackward_SumsEachKvHeadsQueryHeadsByAReduction) {
    FakeCudnn fake;
    auto attention = open_attention();
    ASSERT_TRUE(attention->plan(kGqa, DType::bf16).planned);
    EXPECT_EQ(fake.tensor(1, 2).fields.at("dims"), dims(2, 2, 64, 64));  // K^T: Hkv heads
    EXPECT_EQ(fake.tensor(1, 1).fields.at("dims"), dims(2, 8, 64, 64));
    int reductions_into_dk_dv = 0;
    for (const Line& op : fake.ops(2)) {
        if (op.kind != "reduction" || (op.num("y") != 10 && op.num("y") != 11)) continue;
        ++reductions_into_dk_dv;
        EXPECT_EQ(op.num("op"), 0);  // add
        EXPECT_EQ(fake.tensor(2, op.num("x")).fields.at("dims"), dims(2, 8, 64, 64));
        EXPECT_EQ(fake.tensor(2, op.num("x")).num("virtual"), 1);
    }
    EXPECT_EQ(reductions_into_dk_dv, 2);
    EXPECT_EQ(fake.tensor(2, 11).fields.at("dims"), dims(2, 2, 64, 64));
}

TEST(CudnnAttentionPlan, TheNondeterministicEngineIsPassedOver) {
    FakeCudnn fake;
    auto attention = open_attention();
    const CudnnAttentionReport& r = attention->plan(kMha, DType::bf16);
    ASSERT_TRUE(r.planned);
    EXPECT_EQ(r.forward.global_index, 8);
    EXPECT_EQ(r.backward.global_index, 8);
    EXPECT_EQ(r.forward.found_by, "heuristics mode A");
    EXPECT_NE(r.forward.notes_text().find("runtime_compilation"), std::string::npos);
    EXPECT_EQ(r.forward.notes_text().find("nondeterministic"), std::string::npos);
    for (const Line& plan : fake.of_kind("plan", 1)) EXPECT_NE(plan.num("engine"), 7) << "a plan was made of the nondeterministic engine";
    // Planned once per shape: a second ask builds nothing.
    const size_t lines = fake.lines().size();
    attention->plan(kMha, DType::bf16);
    EXPECT_EQ(fake.lines().size(), lines);
    EXPECT_EQ(r.workspace_bytes, cudnn_attention_delta_bytes(kMha) + (1u << 20));
}

TEST(CudnnAttentionPlan, OnlyNondeterministicEngines_IsNotPlannedAndSaysWhy) {
    FakeCudnn fake;
    fake.mode("nondeterministic_only");
    auto attention = open_attention();
    const CudnnAttentionReport& r = attention->plan(kMha, DType::bf16);
    EXPECT_FALSE(r.planned);
    EXPECT_NE(r.failure.find("no deterministic cuDNN engine"), std::string::npos) << r.failure;
    EXPECT_NE(r.failure.find("passed over, nondeterministic"), std::string::npos) << r.failure;
    EXPECT_TRUE(fake.of_kind("plan", 1).empty());
}

TEST(CudnnAttentionPlan, NoEngineFinalizes_ReportsCudnnsOwnErrorForEachFormAndRefusesToRun) {
    FakeCudnn fake;
    fake.mode("no_engine");
    auto attention = open_attention();
    const CudnnAttentionReport& r = attention->plan(kMha, DType::bf16);
    EXPECT_FALSE(r.planned);
    EXPECT_NE(r.failure.find("fake cuDNN: no engine supports this graph"), std::string::npos) << r.failure;
    EXPECT_NE(r.failure.find("int32 indices"), std::string::npos) << r.failure;
    EXPECT_NE(r.failure.find("fp32 indices"), std::string::npos) << r.failure;
    EXPECT_NE(r.failure.find("batch 2, seq_len 64, 4 heads (4 kv) of 64, bf16"), std::string::npos) << r.failure;
    try {
        attention->forward(kMha, DType::bf16, nullptr, nullptr, nullptr, nullptr);
        FAIL() << "forward ran a shape cuDNN did not plan";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::unsupported);
        EXPECT_NE(std::string(e.what()).find("attention_fwd: cuDNN cannot run"), std::string::npos) << e.what();
    }
}

TEST(CudnnAttentionPlan, Int32IndicesRefused_TheFp32IndexFormPlans) {
    FakeCudnn fake;
    fake.mode("reject_int32_mask");
    auto attention = open_attention();
    const CudnnAttentionReport& r = attention->plan(kMha, DType::bf16);
    ASSERT_TRUE(r.planned) << r.failure;
    EXPECT_EQ(r.mask_form, "fp32 indices");
    bool saw_float_index = false;
    for (const Line& op : fake.ops(1))
        if (op.kind == "pointwise" && op.num("mode") == kGenIndex) saw_float_index = op.num("prec") == kFloat;
    EXPECT_TRUE(saw_float_index);
}

TEST(CudnnAttentionRun, VariantPacksBindQkvViewsOfThePackedRowsAndTheScalarsByValue) {
    FakeCudnn fake;
    auto attention = open_attention();
    ASSERT_TRUE(attention->plan(kGqa, DType::bf16).planned);
    char* qkv = reinterpret_cast<char*>(0x10000000), *out = reinterpret_cast<char*>(0x20000000), *dqkv = reinterpret_cast<char*>(0x40000000);
    char* workspace = reinterpret_cast<char*>(0x50000000);
    auto* stats = reinterpret_cast<float*>(0x30000000);
    attention->forward(kGqa, DType::bf16, out, stats, qkv, workspace);
    attention->backward(kGqa, DType::bf16, dqkv, out, qkv, out, stats, workspace);
    std::map<std::pair<int, long long>, Line> bound;
    for (const Line& l : fake.lines())
        if (l.kind == "execute") bound[{l.graph, l.num("uid")}] = l;
    const auto ptr = [&](int g, long long uid) { return reinterpret_cast<char*>(static_cast<uintptr_t>(std::stoull(bound.at({g, uid}).fields.at("ptr"), nullptr, 16))); };
    const long long row_bytes_before_k = 8 * 64 * 2, before_v = (8 + 2) * 64 * 2;
    EXPECT_EQ(ptr(1, 1), qkv);
    EXPECT_EQ(ptr(1, 2), qkv + row_bytes_before_k);
    EXPECT_EQ(ptr(1, 3), qkv + before_v);
    EXPECT_EQ(ptr(1, 4), out);
    EXPECT_EQ(std::stod(bound.at({1, 6}).fields.at("value")), 0.125);  // 1 / sqrt(64)
    EXPECT_LT(std::stod(bound.at({1, 7}).fields.at("value")), -1e38);
    EXPECT_EQ(ptr(2, 9), dqkv);
    EXPECT_EQ(ptr(2, 10), dqkv + row_bytes_before_k);
    EXPECT_EQ(ptr(2, 11), dqkv + before_v);
    EXPECT_EQ(ptr(2, 12), workspace);  // Delta first, the plan's own workspace after it
    EXPECT_EQ(std::stod(bound.at({2, 13}).fields.at("value")), 1.0);
}

// A layer's activations keep their addresses from step to step: its variant pack is built
// once and reused; other addresses get their own.
TEST(CudnnAttentionRun, VariantPacksAreBuiltOncePerBinding) {
    FakeCudnn fake;
    auto attention = open_attention();
    ASSERT_TRUE(attention->plan(kMha, DType::bf16).planned);
    char* qkv = reinterpret_cast<char*>(0x10000000), *out = reinterpret_cast<char*>(0x20000000), *workspace = reinterpret_cast<char*>(0x50000000);
    auto* stats = reinterpret_cast<float*>(0x30000000);
    const auto packs = [&] {
        int n = 0;
        for (const Line& l : fake.lines()) n += l.kind == "pack";
        return n;
    };
    attention->forward(kMha, DType::bf16, out, stats, qkv, workspace);
    attention->forward(kMha, DType::bf16, out, stats, qkv, workspace);
    EXPECT_EQ(packs(), 1);
    attention->forward(kMha, DType::bf16, out + 4096, stats, qkv, workspace);
    EXPECT_EQ(packs(), 2);
    int executions = 0;
    for (const Line& l : fake.lines()) executions += l.kind == "execute" && l.num("uid") == 1;
    EXPECT_EQ(executions, 3);
}

TEST(CudnnLibrary, Missing_IsReportedNamingItAndWhereToPointTheLoader) {
    setenv("LLMTRAIN_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
    std::string why_not;
    EXPECT_EQ(CudnnAttention::open(nullptr, why_not), nullptr);
    unsetenv("LLMTRAIN_CUDNN_LIBRARY");
    EXPECT_NE(why_not.find("/nonexistent/libcudnn.so.9 (cuDNN) cannot be loaded"), std::string::npos) << why_not;
    EXPECT_NE(why_not.find("LLMTRAIN_CUDNN_LIBRARY"), std::string::npos) << why_not;
}

TEST(CudnnAttentionWorkspace, MemoryPlanBound_CoversTheDpTilesAndDeltaRowsUnlessNative) {
    const AttentionShape gpt2{32, 1024, 12, 12, 64};
    const size_t native = attention_workspace_bytes(Device::cuda, AttentionImpl::native, gpt2);
    EXPECT_EQ(native, size_t{32} * 12 * 1024 * 4);
    EXPECT_GE(attention_workspace_bytes(Device::cuda, AttentionImpl::automatic, gpt2), size_t{32} * 12 * 1024 * 1024 * 2 + native);
    EXPECT_EQ(attention_workspace_bytes(Device::cpu, AttentionImpl::cudnn, gpt2), 0u);
}
