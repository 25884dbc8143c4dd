// The plan under train.precision = "fp8": the blocks' linears at the FP8 peak x its
// efficiency, their casts' memory traffic, MFU still against the bf16 peak, and the cluster
// files' FP8 keys (a device without FP8 tensor cores refused).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "plan/memory_plan.h"
#include "plan/step_model.h"
#include "parallel/context.h"
#include "support/error_text.h"

using namespace llmtrain;

namespace {

const std::string kQwen72b = "configs/qwen2.5-72b.toml";

Config qwen72b(std::vector<std::string> overrides) { return load_config(kQwen72b, overrides, DataFiles::unchecked); }

StepTime predict(const Config& config, const Cluster& cluster, int ranks) {
    return predict_step_time(config, make_mesh(config.parallel, ranks), cluster, model_parameter_count(config.model));
}

// `file` with `edit` applied to its text, written where the test may write.
std::string edited_cluster(const std::string& file, const std::string& name, const std::function<void(std::string&)>& edit) {
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    edit(text);
    const std::string path = testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
}

void replace_line(std::string& text, const std::string& starting, const std::string& with) {
    const size_t at = text.find("\n" + starting);
    ASSERT_NE(at, std::string::npos) << starting;
    text.replace(at + 1, text.find('\n', at + 1) - at - 1, with);
}

}  // namespace

// Qwen2.5-72B on 128 H100s in its shipped layout (tp 8 x pp 2 x dp 8): the FP8 step is
// faster; its FP8 GEMMs take their FLOPs at 1,979 TFLOP/s x 0.60; MFU divides by the bf16
// peak (989) whatever the precision, so FP8's MFU rises only by its speed-up.
TEST(Fp8StepModel, LargeModelOnH100_Fp8StepIsFasterAndMfuStaysOfTheBf16Peak) {
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const Config bf16 = qwen72b({}), fp8 = qwen72b({"train.precision=\"fp8\""});
    const StepTime b = predict(bf16, h100, 128), f = predict(fp8, h100, 128);
    EXPECT_FALSE(b.fp8);
    EXPECT_TRUE(f.fp8);
    EXPECT_LT(f.step_seconds, 0.9 * b.step_seconds);
    EXPECT_GT(f.fp8_cast_seconds, 0);
    EXPECT_GT(f.fp8_weight_cast_seconds, 0);
    const Mesh mesh = make_mesh(fp8.parallel, 128);
    const double m = static_cast<double>(micro_batches_per_step(fp8, mesh.dp()));
    const StageWork w = stage_work(fp8, mesh, f.slowest_stage);
    EXPECT_NEAR(f.fp8_gemm_seconds, m * w.total_fp8_gemm_flops() / (1979e12 * 0.60), 1e-9 * f.fp8_gemm_seconds);
    EXPECT_NEAR(f.mfu, f.tokens_per_second_per_device * f.model_flops_per_token / 989e12, 1e-12);
    EXPECT_NEAR(f.mfu / b.mfu, b.step_seconds / f.step_seconds, 1e-9);
}

// Where FP8 GEMMs are no faster than bf16 ones (FP8 peak x efficiency = the bf16 peak x GEMM
// efficiency), the FP8 step is the bf16 step plus its casts' traffic, nothing else: one H100
// (no dp, tp or pp traffic) and the 72B model's shapes.
TEST(Fp8StepModel, WhereFp8IsNoFaster_Fp8StepIsTheBf16StepPlusItsCasts) {
    Cluster slow_fp8 = load_cluster("configs/clusters/h100-sxm.toml");
    slow_fp8.fp8_peak_tflops = slow_fp8.peak_tflops;
    slow_fp8.efficiency.fp8_gemm = slow_fp8.efficiency.gemm_default;
    const std::vector<std::string> one_gpu = {"parallel.tp=1", "parallel.pp=1", "train.global_batch_size=4"};
    std::vector<std::string> fp8_one_gpu = one_gpu;
    fp8_one_gpu.push_back("train.precision=\"fp8\"");
    const StepTime b = predict(qwen72b(one_gpu), slow_fp8, 1), f = predict(qwen72b(fp8_one_gpu), slow_fp8, 1);
    EXPECT_GT(f.fp8_cast_seconds, 0);
    const double expected = b.step_seconds + f.fp8_cast_seconds + f.fp8_weight_cast_seconds;
    EXPECT_NEAR(f.step_seconds, expected, 1e-12 * expected);
}

// On a CPU cluster FP8 is emulated (decode, then f32 GEMMs): no faster, its casts on top.
TEST(Fp8StepModel, OnACpuCluster_Fp8IsEmulated_TheF32StepPlusItsCasts) {
    const Cluster cpu = load_cluster("configs/clusters/this-cpu.toml");
    const Config f32 = load_config("configs/tiny.toml", {"train.threads=1"}, DataFiles::unchecked);
    const Config fp8 = load_config("configs/tiny.toml", {"train.threads=1", "train.precision=\"fp8\""}, DataFiles::unchecked);
    const StepTime b = predict(f32, cpu, 1), f = predict(fp8, cpu, 1);
    EXPECT_GT(f.fp8_cast_seconds, 0);
    const double expected = b.step_seconds + f.fp8_cast_seconds + f.fp8_weight_cast_seconds;
    EXPECT_NEAR(f.step_seconds, expected, 1e-12 * expected);
}

// One linear's casts (model/fp8_linear.h), x [4, 8] and dout [4, 16] in bf16 (2 bytes),
// counted by hand. Current scaling, per micro-batch: forward x: amax read 32 x 2, cast read
// 32 x 2 + write 32 x 1 = 160; backward x: 64 + 64 + 2 x 32 (xq and its transpose) = 192;
// dout: 128 + 128 + 2 x 64 = 384. Delayed scaling drops the amax reads: 96 + 128 + 256. Per
// step the weight [16, 8]: amax read 256, cast read 256, write 2 x 128 = 768, both recipes.
// A full recomputation casts x forward twice.
TEST(Fp8StepModel, CastTraffic_IsItsFormulaForASmallShape) {
    const Fp8CastBytes current = fp8_cast_bytes_of(4, 8, 16, 2, true, 1);
    EXPECT_DOUBLE_EQ(current.per_micro_batch, 160 + 192 + 384);
    EXPECT_DOUBLE_EQ(current.per_step, 768);
    const Fp8CastBytes delayed = fp8_cast_bytes_of(4, 8, 16, 2, false, 1);
    EXPECT_DOUBLE_EQ(delayed.per_micro_batch, 96 + 128 + 256);
    EXPECT_DOUBLE_EQ(delayed.per_step, 768);
    EXPECT_DOUBLE_EQ(fp8_cast_bytes_of(4, 8, 16, 2, true, 2).per_micro_batch, 2 * 160 + 192 + 384);
}

// tiny.toml has 4 layers; with the default bf16 first and last layer, layers 1 and 2 run
// their linears (QKV, out, MLP up and down) in FP8 and the rest keeps its GEMMs: the FP8
// FLOPs are what the bf16 run loses, and the casts are the four linears' formula twice.
TEST(Fp8StepModel, OnlyTheLinearsBetweenTheBf16FirstAndLastLayers_RunInFp8) {
    const Config plain = load_config("configs/tiny.toml", {}, DataFiles::unchecked);
    const Config fp8 = load_config("configs/tiny.toml", {"train.precision=\"fp8\""}, DataFiles::unchecked);
    const Mesh mesh = make_mesh(plain.parallel, 1);
    const StageWork p = stage_work(plain, mesh, 0), f = stage_work(fp8, mesh, 0);
    const ModelConfig& m = plain.model;
    const double n = static_cast<double>(plain.train.batch_size * plain.train.seq_len), d = static_cast<double>(m.d_model);
    const double qkv = static_cast<double>((m.n_heads + 2 * m.n_kv_heads) * m.head_dim()), heads = static_cast<double>(m.n_heads * m.head_dim());
    const double up = static_cast<double>(m.family == ModelFamily::llama ? 2 * m.d_ff : m.d_ff), ff = static_cast<double>(m.d_ff);
    const double layer_flops = 3 * 2 * n * (d * qkv + heads * d + d * up + ff * d);
    EXPECT_DOUBLE_EQ(f.total_fp8_gemm_flops(), 2 * layer_flops);
    EXPECT_NEAR(f.total_gemm_flops(), p.total_gemm_flops() - 2 * layer_flops, 1e-9 * p.total_gemm_flops());
    const bool current = fp8.fp8.recipe == Fp8Recipe::current;
    double casts = 0, weights = 0;
    for (const auto& [k, out] : {std::pair{d, qkv}, std::pair{heads, d}, std::pair{d, up}, std::pair{ff, d}}) {
        const Fp8CastBytes b = fp8_cast_bytes_of(n, k, out, 4, current, 1);  // f32 compute on the CPU
        casts += 2 * b.per_micro_batch;
        weights += 2 * b.per_step;
    }
    EXPECT_DOUBLE_EQ(f.fp8_cast_bytes, casts);
    EXPECT_DOUBLE_EQ(f.fp8_weight_cast_bytes, weights);
    EXPECT_EQ(p.fp8_cast_bytes, 0);
    const Config all_bf16 = load_config("configs/tiny.toml", {"train.precision=\"fp8\"", "fp8.bf16_first_layers=2", "fp8.bf16_last_layers=2"}, DataFiles::unchecked);
    EXPECT_EQ(stage_work(all_bf16, mesh, 0).total_fp8_gemm_flops(), 0);
}

// The shipped GPU files carry the data sheets' dense FP8 peaks and an assumed efficiency;
// the A100 has no FP8 tensor cores, and a plan of an FP8 run on it is refused naming the
// file and the key.
TEST(Fp8Cluster, ShippedFiles_CarryTheDenseFp8Peaks_AndTheA100NoneSoFp8IsRefusedThere) {
    for (const auto& [file, peak] : {std::pair{"h100-sxm", 1979.0}, std::pair{"h200", 1979.0}, std::pair{"b200", 4500.0}, std::pair{"b300", 4500.0}}) {
        const Cluster c = load_cluster(std::string("configs/clusters/") + file + ".toml");
        EXPECT_DOUBLE_EQ(c.fp8_peak_tflops, peak) << file;
        EXPECT_GT(c.efficiency.fp8_gemm, 0) << file;
        EXPECT_LE(c.efficiency.fp8_gemm, 1) << file;
    }
    const Cluster a100 = load_cluster("configs/clusters/a100-sxm.toml");
    EXPECT_EQ(a100.fp8_peak_tflops, 0);
    EXPECT_EQ(load_cluster("configs/clusters/this-cpu.toml").fp8_peak_tflops, 0);
    const std::string why = error_of([&] { predict(qwen72b({"train.precision=\"fp8\""}), a100, 128); });
    EXPECT_NE(why.find("a100-sxm.toml: device.fp8_peak_tflops: missing"), std::string::npos) << why;
    EXPECT_NE(why.find("FP8 tensor cores"), std::string::npos) << why;
    EXPECT_NO_THROW(predict(qwen72b({}), a100, 128));
}

TEST(Fp8Cluster, BadFp8Keys_AreRefusedNamingTheFileAndKey) {
    const std::string h100 = "configs/clusters/h100-sxm.toml";
    const std::string negative = edited_cluster(h100, "fp8_negative.toml", [](std::string& t) { replace_line(t, "fp8_peak_tflops =", "fp8_peak_tflops = -5"); });
    EXPECT_NE(error_of([&] { load_cluster(negative); }).find("fp8_negative.toml: device.fp8_peak_tflops: -5 is out of range"), std::string::npos)
        << error_of([&] { load_cluster(negative); });
    const std::string above_one = edited_cluster(h100, "fp8_efficiency.toml", [](std::string& t) { replace_line(t, "fp8_gemm =", "fp8_gemm = 1.5"); });
    EXPECT_NE(error_of([&] { load_cluster(above_one); }).find("fp8_efficiency.toml: efficiency.fp8_gemm: 1.5 is out of range"), std::string::npos);
    const std::string no_efficiency = edited_cluster(h100, "fp8_no_efficiency.toml", [](std::string& t) { replace_line(t, "fp8_gemm =", ""); });
    EXPECT_NE(error_of([&] { load_cluster(no_efficiency); }).find("fp8_no_efficiency.toml: efficiency.fp8_gemm: missing"), std::string::npos);
    const std::string no_peak = edited_cluster(h100, "fp8_no_peak.toml", [](std::string& t) { replace_line(t, "fp8_peak_tflops =", ""); });
    EXPECT_NE(error_of([&] { load_cluster(no_peak); }).find("fp8_no_peak.toml: device.fp8_peak_tflops: missing"), std::string::npos);
    const std::string text = edited_cluster(h100, "fp8_text.toml", [](std::string& t) { replace_line(t, "fp8_peak_tflops =", "fp8_peak_tflops = \"fast\""); });
    EXPECT_NE(error_of([&] { load_cluster(text); }).find("fp8_text.toml: device.fp8_peak_tflops: expected a number"), std::string::npos);
    const std::string cpu = edited_cluster("configs/clusters/this-cpu.toml", "fp8_cpu.toml", [](std::string& t) { replace_line(t, "memory = ", "memory = 0.5\nfp8_gemm = 0.5"); });
    const std::string on_cpu = error_of([&] { load_cluster(cpu); });
    EXPECT_NE(on_cpu.find("fp8_cpu.toml: efficiency.fp8_gemm: not on a kind = \"cpu\" cluster"), std::string::npos) << on_cpu;
}

// A calibration measured under FP8 (bench --calibration-out) replaces the assumed FP8 GEMM
// efficiency; on a cluster without an FP8 peak it has nothing to be a share of, and says so.
TEST(Fp8Cluster, MeasuredFp8GemmEfficiency_ReplacesTheAssumedOne_AndNeedsAnFp8Peak) {
    const std::string path = testing::TempDir() + "fp8_calibration.toml";
    std::ofstream(path) << "[compute]\nfp8_gemm_efficiency = 0.42\n";
    Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    apply_calibration(h100, path);
    EXPECT_DOUBLE_EQ(h100.efficiency.fp8_gemm, 0.42);
    Cluster a100 = load_cluster("configs/clusters/a100-sxm.toml");
    const std::string why = error_of([&] { apply_calibration(a100, path); });
    EXPECT_NE(why.find("fp8_calibration.toml: compute.fp8_gemm_efficiency: the cluster"), std::string::npos) << why;
    EXPECT_NE(why.find("has no device.fp8_peak_tflops"), std::string::npos) << why;
}

// fp8.param_gather: ZeRO-3 gathers the FP8 linears' weights in e4m3, one byte per element
// where the compute dtype takes c (4 in f32 on the CPU): the planned gather is c - 1 bytes
// lighter per element of the FP8 weights the trainer's layout lists on a tp rank.
TEST(Fp8StepModel, Zero3Fp8ParamGather_GathersTheFp8LinearsWeightsAtOneByteAnElement) {
    const std::vector<std::string> layout = {"parallel.tp=2", "parallel.zero_stage=3", "train.precision=\"fp8\"", "fp8.bf16_first_layers=1",
                                             "fp8.bf16_last_layers=0"};
    const auto with = [&](const std::string& gather) {
        std::vector<std::string> overrides = layout;
        overrides.push_back("fp8.param_gather=" + gather);
        return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
    };
    const Config plain = with("false"), gathered = with("true");
    const Mesh mesh = make_mesh(plain.parallel, 4);
    const TransformerLayout model(plain.model, Device::cpu, compute_dtype(plain.train), plain.train.batch_size, plain.train.seq_len,
                                  stage_partition(plain, mesh, 0), 0, mesh.tp());
    double elements = 0;
    for (const FlatRange& r : model.fp8_weight_ranges()) elements += static_cast<double>(r.size());
    ASSERT_GT(elements, 0);
    const double c = static_cast<double>(dtype_size(compute_dtype(plain.train)));
    const StageWork p = stage_work(plain, mesh, 0), g = stage_work(gathered, mesh, 0);
    EXPECT_DOUBLE_EQ(p.fp8_weight_elements, elements);
    EXPECT_DOUBLE_EQ(p.compute_parameter_bytes - g.compute_parameter_bytes, elements * (c - 1));
    Config f32 = plain;
    f32.train.precision = Precision::fp32;
    EXPECT_DOUBLE_EQ(stage_work(f32, mesh, 0).compute_parameter_bytes, p.compute_parameter_bytes) << "without param_gather the gather is the compute dtype's";
}
