// The plan's step-time model on a CPU node with more ranks than cores: the ranks share the
// node's cores and its shared memory, and how many of them want a core at once differs
// between the micro-batches (stages idle in the 1F1B bubble) and the step's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <unistd.h>

#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "plan/layout_plan.h"
#include "plan/step_model.h"
#include "parallel/context.h"

using namespace llmtrain;

namespace {

// One node of two cores (configs/clusters/this-cpu.toml), calibrated figures written in.
Cluster two_core_node() {
    Cluster c = load_cluster("configs/clusters/this-cpu.toml");
    c.intra_node.measured_busbw_gbps = {{Collective::all_reduce, 0.7}, {Collective::reduce_scatter, 0.5}, {Collective::all_gather, 3.3}};
    return c;
}

Config fifty_million(std::vector<std::string> layout) {
    std::vector<std::string> overrides = {"model.n_layers=16", "model.d_model=512", "model.n_heads=8", "model.max_seq_len=64",
                                          "train.seq_len=64",  "train.batch_size=2", "train.threads=1"};
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
}

StepTime predict(const Config& config, const Cluster& cluster, int ranks) {
    return predict_step_time(config, make_mesh(config.parallel, ranks), cluster, model_parameter_count(config.model));
}

}  // namespace

// Four ranks on a node of two cores: their data-parallel reduce-scatter goes over the node's
// shared memory, whatever the inter-node network is.
TEST(StepModel, RanksBeyondTheCoresOfOneNode_UseTheIntraNodeLink) {
    const Config config = fifty_million({"train.batch_size=1"});
    Cluster slow_network = two_core_node(), fast_network = two_core_node();
    slow_network.inter_node.gbps = 0.001;
    fast_network.inter_node.gbps = 1000;
    const StepTime slow = predict(config, slow_network, 4), fast = predict(config, fast_network, 4);
    EXPECT_GT(slow.dp_exposed_seconds, 0);
    EXPECT_DOUBLE_EQ(slow.dp_exposed_seconds, fast.dp_exposed_seconds);
    // The dp group of 4 reduce-scatters 3/4 of the gradients at the calibrated bus bandwidth,
    // at half a core each (4 ranks, 2 cores), then all-gathers the parameters.
    const StageWork w = stage_work(config, make_mesh(config.parallel, 4), 0);
    const double latency = 3 * 2e-6;  // n - 1 ring steps of the file's intra-node latency
    const double expected = 0.75 * w.dp_gradient_bytes / (0.5 * 0.5e9) + latency + 0.75 * w.dp_parameter_bytes / (0.5 * 3.3e9) + latency;
    EXPECT_NEAR(slow.dp_exposed_seconds, expected, 1e-9 * expected);
}

// parallel.grad_reduce_dtype = "bf16": the reduce-scatter carries 2 bytes per gradient
// instead of 4, so its bandwidth term halves; the latency and the parameter all-gather (f32
// master weights) stay. Under ZeRO-0 the all-reduce halves the same way.
TEST(StepModel, Bf16GradientReduction_HalvesTheDataParallelReduceBandwidthTerm) {
    const Cluster cluster = two_core_node();
    const Config f32 = fifty_million({"train.batch_size=1"}), bf16 = fifty_million({"train.batch_size=1", "parallel.grad_reduce_dtype=\"bf16\""});
    const StageWork w = stage_work(f32, make_mesh(f32.parallel, 4), 0), w16 = stage_work(bf16, make_mesh(bf16.parallel, 4), 0);
    EXPECT_DOUBLE_EQ(w16.dp_reduce_bytes, w.dp_reduce_bytes / 2);
    EXPECT_DOUBLE_EQ(w16.dp_gradient_bytes, w.dp_gradient_bytes);  // the buckets are cut from the f32 buffer alike
    const double reduce_term = 0.75 * w.dp_gradient_bytes / (0.5 * 0.5e9);  // as in the test above: 3/4 of the bytes at half of 0.5 GB/s
    EXPECT_NEAR(predict(f32, cluster, 4).dp_exposed_seconds - predict(bf16, cluster, 4).dp_exposed_seconds, reduce_term / 2, 1e-9 * reduce_term);
    const Config f32_zero0 = fifty_million({"train.batch_size=1", "parallel.zero_stage=0"});
    const Config bf16_zero0 = fifty_million({"train.batch_size=1", "parallel.zero_stage=0", "parallel.grad_reduce_dtype=\"bf16\""});
    // A ring all-reduce moves 2 (n - 1) / n of the bytes, at the calibrated 0.7 GB/s, half a core each.
    const double all_reduce_term = 2 * 0.75 * w.dp_gradient_bytes / (0.5 * 0.7e9);
    EXPECT_NEAR(predict(f32_zero0, cluster, 4).dp_exposed_seconds - predict(bf16_zero0, cluster, 4).dp_exposed_seconds, all_reduce_term / 2,
                1e-9 * all_reduce_term);
    // The rounding into the copy and back is a memory pass over the gradients.
    EXPECT_GT(w16.gradient_pass_bytes, w.gradient_pass_bytes);
}

// Two nodes of two cores: a dp group of four spans both, and pays the inter-node link.
TEST(StepModel, GroupsSpanningNodes_UseTheInterNodeLink) {
    const Config config = fifty_million({"train.batch_size=1"});
    Cluster slow_network = two_core_node(), fast_network = two_core_node();
    slow_network.nodes = fast_network.nodes = 2;
    slow_network.inter_node.gbps = 0.001;
    fast_network.inter_node.gbps = 1000;
    EXPECT_GT(predict(config, slow_network, 4).dp_exposed_seconds, 100 * predict(config, fast_network, 4).dp_exposed_seconds);
}

// tp 2 x pp 2, 2 micro-batches, 4 ranks on 2 cores: during the micro-batches a third of the
// stage-time is bubble, so on average 4 x 2/3 ranks want the 2 cores (a share of 3/4); the
// optimizer runs on every rank at once, at half a core.
TEST(StepModel, OptimizerRunsAtTheStepEndShare_MicroBatchesAtThePipelineShare) {
    const Config config = fifty_million({"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"});
    const Cluster cluster = two_core_node();
    const Mesh mesh = make_mesh(config.parallel, 4);
    const DeviceShare share = device_share(config, mesh, cluster);
    EXPECT_DOUBLE_EQ(share.pipeline, 0.75);
    EXPECT_DOUBLE_EQ(share.step_end, 0.5);
    const StepTime t = predict(config, cluster, 4);
    double most_optimizer_bytes = 0;
    for (int stage = 0; stage < 2; ++stage) most_optimizer_bytes = std::max(most_optimizer_bytes, stage_work(config, mesh, stage).optimizer_bytes());
    const double bandwidth = cluster.memory_bandwidth_gbps * 1e9 * cluster.efficiency.memory;
    EXPECT_DOUBLE_EQ(t.optimizer_seconds, most_optimizer_bytes / (0.5 * bandwidth));
}

// AdamW's update and the plain passes over every gradient (zeroing, the norm) have their own
// calibrated efficiencies (the update's square root and division make it slower per byte, the
// passes run nearer the bandwidth than the micro-batches' memory-bound ops): under
// ZeRO-1 on dp 2 each rank updates half the elements but zeroes and reads every gradient.
TEST(StepModel, AdamwUpdateAndGradientPassesAtTheirOwnEfficiencies) {
    const Config config = fifty_million({"parallel.zero_stage=1"});
    Cluster cluster = two_core_node();
    cluster.efficiency.optimizer = cluster.efficiency.memory / 4;
    cluster.efficiency.gradient_pass = cluster.efficiency.memory * 3;
    const Mesh mesh = make_mesh(config.parallel, 2);
    const StageWork w = stage_work(config, mesh, 0);
    EXPECT_GT(w.update_bytes, 0);
    EXPECT_GT(w.gradient_pass_bytes, 0);
    const double bandwidth = cluster.memory_bandwidth_gbps * 1e9;  // one rank per core: a whole one at the step end
    const StepTime t = predict(config, cluster, 2);
    EXPECT_DOUBLE_EQ(t.optimizer_seconds, w.update_bytes / (bandwidth * cluster.efficiency.optimizer) +
                                              w.gradient_pass_bytes / (bandwidth * cluster.efficiency.gradient_pass));
    cluster.efficiency.optimizer = cluster.efficiency.gradient_pass = 0;  // not calibrated: the memory-bound efficiency
    EXPECT_DOUBLE_EQ(predict(config, cluster, 2).optimizer_seconds, w.optimizer_bytes() / (bandwidth * cluster.efficiency.memory));
}

// As many ranks as cores: every phase has a whole core (train.threads = 1).
TEST(StepModel, OneRankPerCore_HasAWholeCoreInEveryPhase) {
    const Config config = fifty_million({"parallel.pp=2", "train.grad_accum=2"});
    const DeviceShare share = device_share(config, make_mesh(config.parallel, 2), two_core_node());
    EXPECT_DOUBLE_EQ(share.pipeline, 1.0);
    EXPECT_DOUBLE_EQ(share.step_end, 1.0);
}

// A collective measurement taken with four ranks on the two cores already includes their
// crowding: a four-rank layout uses it as measured, not the two-rank one halved.
TEST(StepModel, MeasurementWithAsManyRanksAsTheNodeRuns_AppliesUnscaled) {
    const Config config = fifty_million({"train.batch_size=1"});
    Cluster crowded = two_core_node();
    crowded.intra_node.measured_by_ranks[4] = {{{Collective::reduce_scatter, 0.4}, {Collective::all_gather, 2.0}}, 5.0};
    const StageWork w = stage_work(config, make_mesh(config.parallel, 4), 0);
    const double latency = 3 * 5e-6;  // n - 1 ring steps at the four-rank measurement's latency
    const double expected = 0.75 * w.dp_gradient_bytes / 0.4e9 + latency + 0.75 * w.dp_parameter_bytes / 2.0e9 + latency;
    const StepTime four = predict(config, crowded, 4);
    EXPECT_NEAR(four.dp_exposed_seconds, expected, 1e-9 * expected);
    // Two ranks (one per core) have no four-rank crowding: the general figures, unscaled.
    EXPECT_DOUBLE_EQ(predict(fifty_million({"train.batch_size=2"}), crowded, 2).dp_exposed_seconds,
                     predict(fifty_million({"train.batch_size=2"}), two_core_node(), 2).dp_exposed_seconds);
}

// On GPUs the measurement of the group's own size applies (NCCL's bus bandwidth depends on
// it); a group size nobody measured takes the general figures.
TEST(StepModel, GpuGroups_TakeTheMeasurementOfTheirSize) {
    const Config config = load_config("configs/tiny.toml", {"train.device=\"cuda\"", "model.n_heads=2"}, DataFiles::unchecked);
    Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const Mesh dp8 = make_mesh(config.parallel, 8);
    const double general = predict_step_time(config, dp8, h100, model_parameter_count(config.model)).dp_exposed_seconds;
    EXPECT_GT(general, 0);  // the parameters' all-gather is never hidden
    h100.intra_node.measured_by_ranks[2] = {{{Collective::reduce_scatter, 1.0}, {Collective::all_gather, 1.0}}, 0};
    EXPECT_DOUBLE_EQ(predict_step_time(config, dp8, h100, model_parameter_count(config.model)).dp_exposed_seconds, general);
    h100.intra_node.measured_by_ranks[8] = {{{Collective::reduce_scatter, 1.0}, {Collective::all_gather, 1.0}}, 0};
    EXPECT_GT(predict_step_time(config, dp8, h100, model_parameter_count(config.model)).dp_exposed_seconds, 10 * general);
}

// bench comm writes each measurement under its number of ranks; the general figures stay
// those of the fewest ranks, whatever order the measurements come in; plan reads both back.
TEST(Calibration, CollectivesByRanks_RoundTripAndTheFewestRanksAreTheGeneralFigures) {
    const std::string path = testing::TempDir() + "collectives_by_ranks.toml";
    std::remove(path.c_str());
    CollectiveCalibration four{false, 4, {{Collective::all_reduce, 1.05}}, 3.0};
    CollectiveCalibration two{false, 2, {{Collective::all_reduce, 0.9}}, 15.0};
    write_calibration(path, four);
    write_calibration(path, two);
    write_calibration(path, four);  // again: replaces its own table, not the general figures
    Cluster c = load_cluster("configs/clusters/this-cpu.toml");
    apply_calibration(c, path);
    EXPECT_DOUBLE_EQ(c.intra_node.busbw_gbps(Collective::all_reduce), 0.9);
    EXPECT_DOUBLE_EQ(c.intra_node.latency_us, 15.0);
    ASSERT_EQ(c.intra_node.measured_by_ranks.size(), 2u);
    EXPECT_DOUBLE_EQ(c.intra_node.measured_by_ranks.at(4).busbw_gbps.at(Collective::all_reduce), 1.05);
    EXPECT_DOUBLE_EQ(c.intra_node.as_measured_by(4)->latency_us, 3.0);
    EXPECT_FALSE(c.intra_node.as_measured_by(8).has_value());
    std::remove(path.c_str());
}

// bench comm also writes the bandwidth at every size it measured; plan reads it back and costs
// a message at its own size: interpolated in log size between measured sizes, the end
// figures beyond them, the single figure where no curve was measured.
TEST(Calibration, BandwidthBySize_RoundTripsAndIsInterpolatedInLogSize) {
    const std::string path = testing::TempDir() + "collectives_by_size.toml";
    std::remove(path.c_str());
    CollectiveCalibration four{false, 4, {{Collective::reduce_scatter, 0.45}}, 3.0,
                               {{Collective::reduce_scatter, {{1 << 20, 1.6}, {8 << 20, 1.3}, {16 << 20, 0.4}, {64 << 20, 0.45}}}}};
    write_calibration(path, four);
    Cluster c = load_cluster("configs/clusters/this-cpu.toml");
    apply_calibration(c, path);
    const Link link = *c.intra_node.as_measured_by(4);
    EXPECT_DOUBLE_EQ(link.busbw_gbps(Collective::reduce_scatter, 8 << 20), 1.3);
    EXPECT_DOUBLE_EQ(link.busbw_gbps(Collective::reduce_scatter, 1024), 1.6);          // below the smallest size
    EXPECT_DOUBLE_EQ(link.busbw_gbps(Collective::reduce_scatter, 1e12), 0.45);         // beyond the largest
    EXPECT_NEAR(link.busbw_gbps(Collective::reduce_scatter, 4 << 20), 1.4, 1e-12);     // 2/3 of the way from 1 MB to 8 MB in log size
    EXPECT_NEAR(link.busbw_gbps(Collective::reduce_scatter, 32 << 20), 0.425, 1e-12);  // halfway from 16 MB to 64 MB
    EXPECT_DOUBLE_EQ(link.busbw_gbps(Collective::all_gather, 4 << 20), link.busbw_gbps(Collective::all_gather));
    // The general figures are those of the fewest ranks: four here, with their curve.
    EXPECT_DOUBLE_EQ(c.intra_node.busbw_gbps(Collective::reduce_scatter, 8 << 20), 1.3);
    std::remove(path.c_str());
}

TEST(Calibration, BandwidthCurveNotAscending_IsRefusedNamingTheKey) {
    const std::string path = testing::TempDir() + "collectives_bad_curve.toml";
    {
        std::ofstream out(path, std::ios::trunc);
        out << "[collectives.intra_node]\nreduce_scatter_busbw_by_size = [[2048.0, 1.0], [1024.0, 1.0]]\n";
    }
    Cluster c = load_cluster("configs/clusters/this-cpu.toml");
    try {
        apply_calibration(c, path);
        FAIL() << "a curve whose sizes do not ascend was read";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("collectives.intra_node.reduce_scatter_busbw_by_size: sizes do not ascend"), std::string::npos) << e.what();
    }
    std::remove(path.c_str());
}

// ZeRO-2 costs its reduce-scatter as messages of one layer group each, ZeRO-1 as buckets of
// parallel.bucket_mb: on a link that is faster for the smaller messages, ZeRO-2's exposed
// data-parallel time is the shorter (measured: 4 ranks of 2 cores, 50M model, 12.6 MB groups
// against 25 MB buckets).
TEST(StepModel, MessagesAreCostedAtTheirOwnSize_GroupsForZero2BucketsForZero1) {
    Cluster node = two_core_node();
    node.intra_node.measured_busbw_by_size[Collective::reduce_scatter] = {{8e6, 1.3}, {16e6, 0.4}};
    const StepTime zero1 = predict(fifty_million({"parallel.zero_stage=1"}), node, 4);
    const StepTime zero2 = predict(fifty_million({"parallel.zero_stage=2"}), node, 4);
    EXPECT_LT(zero2.dp_exposed_seconds, zero1.dp_exposed_seconds * 0.8);
    Cluster flat = two_core_node();
    const StepTime flat1 = predict(fifty_million({"parallel.zero_stage=1"}), flat, 4), flat2 = predict(fifty_million({"parallel.zero_stage=2"}), flat, 4);
    EXPECT_NEAR(flat2.dp_exposed_seconds, flat1.dp_exposed_seconds, 0.05 * flat1.dp_exposed_seconds);
}

// ZeRO-3 on a CPU node: every micro-batch all-gathers the parameters twice (before forward
// and before backward; nothing overlaps on a CPU), and the step's end gathers none, where
// ZeRO-2 gathers the updated parameters once.
TEST(StepModel, Zero3GathersTheParametersTwicePerMicroBatch_Zero2OncePerStep) {
    const Config zero2 = fifty_million({"train.batch_size=1", "train.grad_accum=2", "parallel.zero_stage=2"});
    const Config zero3 = fifty_million({"train.batch_size=1", "train.grad_accum=2", "parallel.zero_stage=3"});
    const Cluster node = two_core_node();
    const Mesh mesh = make_mesh(zero3.parallel, 4);
    const StageWork w = stage_work(zero3, mesh, 0);
    const DeviceShare share = device_share(zero3, mesh, node);
    Link at_share = node.intra_node;
    for (auto& [op, gbps] : at_share.measured_busbw_gbps) gbps *= share.step_end;  // 4 ranks, 2 cores: half a core in both phases
    ASSERT_DOUBLE_EQ(share.pipeline, share.step_end);
    const double per_micro_batch = collective_seconds({Collective::all_gather, w.compute_parameter_bytes, 2}, 4, at_share);
    const double step_end_gather = collective_seconds({Collective::all_gather, w.dp_parameter_bytes, 1}, 4, at_share);
    const StepTime two = predict(zero2, node, 4), three = predict(zero3, node, 4);
    EXPECT_GT(per_micro_batch, 0);
    EXPECT_NEAR(three.dp_exposed_seconds - two.dp_exposed_seconds, 2 * per_micro_batch - step_end_gather, 1e-9 * three.dp_exposed_seconds);
    EXPECT_NEAR(three.step_seconds - two.step_seconds, 2 * per_micro_batch - step_end_gather, 1e-9 * three.step_seconds);
}

// On GPUs a prefetched gather hides behind the previous group's compute; without prefetch
// (parallel.prefetch_layers = 0) it waits in front of every group.
TEST(StepModel, Zero3PrefetchHidesTheGathersOnGpus) {
    const auto config = [](const char* prefetch) {
        return load_config("configs/gpt2-124m.toml", {"parallel.zero_stage=3", prefetch}, DataFiles::unchecked);
    };
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const Config ahead = config("parallel.prefetch_layers=1"), none = config("parallel.prefetch_layers=0");
    const Mesh mesh = make_mesh(ahead.parallel, 8);
    const double params = model_parameter_count(ahead.model);
    EXPECT_LT(predict_step_time(ahead, mesh, h100, params).dp_exposed_seconds, predict_step_time(none, mesh, h100, params).dp_exposed_seconds);
}

// ZeRO-1/2's all-gather of the updated parameters behind the next forward: hidden on GPUs
// (all but the first cut's share, up to the forward's length), not on a CPU, whose cores
// move the bytes themselves.
TEST(StepModel, OverlappedParamGatherHidesOnGpusOnly) {
    for (const char* stage : {"parallel.zero_stage=1", "parallel.zero_stage=2"}) {
        const auto config = [stage](const char* overlap) { return load_config("configs/gpt2-124m.toml", {stage, overlap}, DataFiles::unchecked); };
        const Config overlapped = config("parallel.overlap_param_gather=true"), plain = config("parallel.overlap_param_gather=false");
        const Mesh mesh = make_mesh(plain.parallel, 8);
        const double params = model_parameter_count(plain.model);
        const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
        const StepTime gpu_plain = predict_step_time(plain, mesh, h100, params), gpu_overlapped = predict_step_time(overlapped, mesh, h100, params);
        EXPECT_LT(gpu_overlapped.dp_exposed_seconds, gpu_plain.dp_exposed_seconds) << stage;
        EXPECT_LT(gpu_overlapped.step_seconds, gpu_plain.step_seconds) << stage;
        EXPECT_GT(gpu_overlapped.dp_exposed_seconds, 0) << stage;
        const Cluster cpu = two_core_node();
        EXPECT_DOUBLE_EQ(predict_step_time(overlapped, mesh, cpu, params).step_seconds, predict_step_time(plain, mesh, cpu, params).step_seconds) << stage;
    }
}

// Sequence parallelism's collectives behind the matmuls (parallel.tp_overlap) on the 72B
// layout (tp 8): on GPUs the exposed tp time falls, but not below the gathers of the
// row-parallel output gradients (a third of the calls, never overlapped) nor to zero; on a
// CPU, whose cores move the bytes, nothing changes.
TEST(StepModel, TpOverlapHidesTensorParallelCollectivesOnGpusOnly) {
    const auto config = [](const char* overlap) { return load_config("configs/qwen2.5-72b.toml", {overlap}, DataFiles::unchecked); };
    const Config overlapped = config("parallel.tp_overlap=true"), plain = config("parallel.tp_overlap=false");
    ASSERT_TRUE(plain.parallel.sequence_parallel);
    const Mesh mesh = make_mesh(plain.parallel, 128);
    const double params = model_parameter_count(plain.model);
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const StepTime gpu_plain = predict_step_time(plain, mesh, h100, params), gpu_overlapped = predict_step_time(overlapped, mesh, h100, params);
    EXPECT_LT(gpu_overlapped.tp_comm_seconds, gpu_plain.tp_comm_seconds);
    EXPECT_LT(gpu_overlapped.step_seconds, gpu_plain.step_seconds);
    // 2 of the 6 gathers + 4 reduce-scatters per layer (no recomputation) stay whole.
    EXPECT_GT(gpu_overlapped.tp_comm_seconds, gpu_plain.tp_comm_seconds * 2.0 / 10.0 * 0.99);
    EXPECT_DOUBLE_EQ(gpu_plain.compute_seconds, gpu_overlapped.compute_seconds);
    const Cluster cpu = two_core_node();
    const Config small_plain = load_config("configs/tiny.toml", {"parallel.tp=2", "parallel.sequence_parallel=true"}, DataFiles::unchecked);
    const Config small_overlapped = load_config("configs/tiny.toml", {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_overlap=true"},
                                                DataFiles::unchecked);
    const Mesh two = make_mesh(small_plain.parallel, 2);
    const double small = model_parameter_count(small_plain.model);
    EXPECT_DOUBLE_EQ(predict_step_time(small_overlapped, two, cpu, small).step_seconds, predict_step_time(small_plain, two, cpu, small).step_seconds);
}

// A checkpoint of the 72B run on 128 H100s: 12 bytes per parameter, each rank's share copied
// to host memory while the step loop waits, the writes at the slower of the storage's
// aggregate bandwidth and the 16 nodes' links; a resume reads everything twice (checksums,
// then the load) and all-gathers the master weights over dp.
TEST(StepModel, CheckpointTimes_FollowTheStorageFigures) {
    const Config config = load_config("configs/qwen2.5-72b.toml", {}, DataFiles::unchecked);
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    ASSERT_TRUE(h100.storage.has_value());
    const Mesh mesh = make_mesh(config.parallel, 128);
    const double params = model_parameter_count(config.model);
    const CheckpointTime t = predict_checkpoint_time(config, mesh, h100, params);
    const Storage& st = *h100.storage;
    EXPECT_DOUBLE_EQ(t.bytes, 12 * params);
    EXPECT_DOUBLE_EQ(t.bytes_per_rank, t.bytes / 128);
    EXPECT_DOUBLE_EQ(t.blocked_seconds, t.bytes_per_rank / (st.host_copy_gbps * 1e9));
    // The transfer (the slower of the storage and the nodes' links), then each rank's checksum
    // passes over its own file, in series on its writer thread.
    EXPECT_DOUBLE_EQ(t.checksum_seconds, t.bytes_per_rank / (st.checksum_gbps * 1e9));
    EXPECT_DOUBLE_EQ(t.background_seconds, std::max(t.bytes / (st.write_gbps * 1e9), t.bytes / 16 / (st.node_write_gbps * 1e9)) + t.checksum_seconds);
    const double reads = 2 * std::max(t.bytes / (st.read_gbps * 1e9), t.bytes / 16 / (st.node_read_gbps * 1e9));
    EXPECT_GT(t.resume_seconds, reads);
    Config zero3 = config;
    zero3.parallel.zero_stage = 3;
    EXPECT_DOUBLE_EQ(predict_checkpoint_time(zero3, mesh, h100, params).resume_seconds, reads) << "ZeRO-3 loads its shards alone: no exchange";
}

TEST(StepModel, ChecksumRate_DefaultsToTheMeasuredOneAndFollowsTheClusterFile) {
    const Config config = load_config("configs/qwen2.5-72b.toml", {}, DataFiles::unchecked);
    Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    {
        // A cluster file without the key (written before it existed) plans at the measured rate.
        std::ifstream in("configs/clusters/h100-sxm.toml");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), kept, line;
        std::istringstream lines(text);
        while (std::getline(lines, line))
            if (!line.starts_with("checksum_gbps")) kept += line + "\n";
        const std::string path = (std::filesystem::temp_directory_path() / cat("llmtrain-cluster-", ::getpid(), ".toml")).string();
        std::ofstream(path) << kept;
        const Cluster older = load_cluster(path);
        std::filesystem::remove(path);
        EXPECT_DOUBLE_EQ(older.storage->checksum_gbps, Storage::kMeasuredChecksumGbps);
    }
    const Mesh mesh = make_mesh(config.parallel, 128);
    const double params = model_parameter_count(config.model);
    h100.storage->checksum_gbps = Storage::kMeasuredChecksumGbps;
    const CheckpointTime measured = predict_checkpoint_time(config, mesh, h100, params);
    h100.storage->checksum_gbps = 2 * Storage::kMeasuredChecksumGbps;
    const CheckpointTime twice = predict_checkpoint_time(config, mesh, h100, params);
    EXPECT_DOUBLE_EQ(twice.checksum_seconds, measured.checksum_seconds / 2);
    EXPECT_DOUBLE_EQ(measured.background_seconds - twice.background_seconds, measured.checksum_seconds / 2);
    EXPECT_DOUBLE_EQ(measured.blocked_seconds, twice.blocked_seconds) << "the host copy is not checksummed";
}

TEST(StepModel, CheckpointTimesWithoutStorage_NameTheClusterFileAndTheSection) {
    Cluster c = load_cluster("configs/clusters/this-cpu.toml");
    c.storage.reset();
    const Config config = fifty_million({});
    try {
        predict_checkpoint_time(config, make_mesh(config.parallel, 1), c, 5e7);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("this-cpu.toml: storage: missing"), std::string::npos) << e.what();
    }
}

// The start-up line's parameter count grows with tp (padded vocabulary rows) and pp (a tied
// embedding held by the first and the last stage); the line says by how much and why.
TEST(ParameterCount, HeldBeyondTheModel_NamesPaddingRowsAndTheTiedCopy) {
    const ModelConfig m = load_config("configs/tiny.toml", {}, DataFiles::unchecked).model;  // vocab 257, d_model 128, tied
    const double model = model_parameter_count(m);
    EXPECT_EQ(parameters_beyond_the_model(m, 1, 1, model), "");
    // tp 2: 257 rows padded to 258 (one row of 128), and 20,000 replicated on the second tp rank.
    EXPECT_EQ(parameters_beyond_the_model(m, 2, 1, model + 128 + 20000),
              cat(" (the model's ", fixed(model / 1e6, 3), "M + 0.020M of tensors each of the 2 tp ranks holds whole + 0.000M vocabulary padding rows for tp 2)"));
    const std::string pp2 = parameters_beyond_the_model(m, 1, 2, model + 257 * 128);
    EXPECT_NE(pp2.find("+ 0.033M the tied embedding's copy on the last pipeline stage"), std::string::npos) << pp2;
    EXPECT_EQ(pp2.find("padding"), std::string::npos) << pp2;
}

namespace {

// The long-context config (Llama-1B shape, 64k tokens) with parallel.cp = cp, one micro-batch
// of one sequence per step on each dp rank.
Config long_context(int cp, std::vector<std::string> extra = {}) {
    std::vector<std::string> overrides = {cat("parallel.cp=", cp), "train.global_batch_size=0", "train.grad_accum=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/llama-1b-64k.toml", overrides, DataFiles::unchecked);
}

double send_seconds(double bytes, const Link& link) { return link.latency_us * 1e-6 + bytes / (link.gbps * 1e9); }

}  // namespace

// Context parallelism gives each of the cp ranks b x s / cp tokens: its GEMMs and memory-bound
// bytes fall by cp, and so does its causal attention (chunks r and 2cp - 1 - r balance the
// work), all exactly (cp a power of two, the GEMMs large either way).
TEST(StepModel, ContextParallel_DividesTokenWorkAndCausalAttentionByCp) {
    const StageWork one = stage_work(long_context(1), make_mesh(long_context(1).parallel, 1), 0);
    EXPECT_TRUE(one.cp_sends.empty());
    for (int cp : {2, 4, 8}) {
        SCOPED_TRACE(cat("cp ", cp));
        const Config config = long_context(cp);
        const StageWork w = stage_work(config, make_mesh(config.parallel, cp), 0);
        EXPECT_DOUBLE_EQ(w.total_gemm_flops(), one.total_gemm_flops() / cp);
        EXPECT_DOUBLE_EQ(w.attention_flops, one.attention_flops / cp);
        EXPECT_DOUBLE_EQ(w.memory_bytes, one.memory_bytes / cp);
        EXPECT_DOUBLE_EQ(w.dp_gradient_bytes, one.dp_gradient_bytes);  // the same weights on every cp rank
    }
}

// The ring of one micro-batch, per layer: cp - 1 forward sends of this rank's keys and values
// (8192 tokens x 2 x 8 KV heads x 64 x 2 bytes), cp - 1 backward sends of them with their f32
// gradients, and the gradients' last hop home. On H100s the sends run over NVLink (the cp group
// of 8 fills one node) beside attention blocks long enough to hide them: only the last hops
// are exposed. Full recomputation runs the forward ring twice.
TEST(StepModel, ContextParallelRing_HiddenBehindAttentionBlocksOnGpus_LastGradientHopExposed) {
    const Config config = long_context(8);
    const Mesh mesh = make_mesh(config.parallel, 8);
    const StageWork w = stage_work(config, mesh, 0);
    const double kv = 8192.0 * 2 * 8 * 64 * 2, dkv = 2 * kv, layers = 16;
    ASSERT_EQ(w.cp_sends.size(), 3u);
    EXPECT_DOUBLE_EQ(w.cp_sends[0].bytes, kv);
    EXPECT_DOUBLE_EQ(w.cp_sends[0].count, layers * 7);
    EXPECT_DOUBLE_EQ(w.cp_sends[1].bytes, kv + dkv);
    EXPECT_DOUBLE_EQ(w.cp_sends[1].count, layers * 7);
    EXPECT_DOUBLE_EQ(w.cp_sends[2].bytes, dkv);
    EXPECT_DOUBLE_EQ(w.cp_sends[2].count, layers);
    EXPECT_DOUBLE_EQ(w.cp_sends[2].behind_flops, 0);
    // Each forward block is 1/cp of the rank's forward attention, a backward one twice that.
    EXPECT_DOUBLE_EQ(w.cp_sends[0].behind_flops * 3 * 8 * layers, w.attention_flops);
    EXPECT_DOUBLE_EQ(w.cp_sends[1].behind_flops, 2 * w.cp_sends[0].behind_flops);

    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const double block_seconds = w.cp_sends[0].behind_flops / (h100.peak_tflops * 1e12 * h100.efficiency.ring_attention_or_attention());
    ASSERT_GT(block_seconds, send_seconds(kv, h100.intra_node));  // long enough to hide the send
    const StepTime t = predict_step_time(config, mesh, h100, model_parameter_count(config.model));
    const double exposed = layers * send_seconds(dkv, h100.intra_node);
    const double hidden = layers * 7 * (send_seconds(kv, h100.intra_node) + send_seconds(kv + dkv, h100.intra_node));
    EXPECT_NEAR(t.cp_comm_seconds, exposed, 1e-12);
    EXPECT_NEAR(t.cp_hidden_seconds, hidden, 1e-12);
    EXPECT_NEAR(t.step_seconds, t.compute_seconds + t.cp_comm_seconds + t.dp_exposed_seconds + t.optimizer_seconds, 1e-12);

    const Config full = long_context(8, {"train.recompute=\"full\""});
    const StageWork again = stage_work(full, mesh, 0);
    EXPECT_DOUBLE_EQ(again.cp_sends[0].count, 2 * layers * 7);
    EXPECT_DOUBLE_EQ(again.cp_sends[1].count, layers * 7);
}

// Under cp every attention block runs on the ring's own kernels, at the cluster file's
// efficiency.ring_attention (the shipped GPU files assume the fp32-core kernels' share): the
// attention time is that share's, not the flash kernels'.
TEST(StepModel, ContextParallelAttention_RunsAtTheRingKernelsEfficiency) {
    const Config config = long_context(8);
    const Mesh mesh = make_mesh(config.parallel, 8);
    Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    ASSERT_GT(h100.efficiency.ring_attention, 0);
    ASSERT_LT(h100.efficiency.ring_attention, h100.efficiency.attention);
    const StageWork w = stage_work(config, mesh, 0);
    const double micro_batches = static_cast<double>(micro_batches_per_step(config, mesh.dp()));
    const StepTime ring = predict_step_time(config, mesh, h100, model_parameter_count(config.model));
    const double ring_efficiency = h100.efficiency.ring_attention;
    h100.efficiency.ring_attention = 0;  // as efficiency.attention
    const StepTime flash = predict_step_time(config, mesh, h100, model_parameter_count(config.model));
    const double peak = h100.peak_tflops * 1e12;
    const double expected = micro_batches * w.attention_flops / peak * (1 / ring_efficiency - 1 / h100.efficiency.attention);
    EXPECT_NEAR(ring.compute_seconds - flash.compute_seconds, expected, 1e-9 * expected);
    // Without cp attention runs on the flash kernels whatever the ring's efficiency.
    const Config whole = long_context(1, {"train.recompute=\"full\""});
    const Mesh one = make_mesh(whole.parallel, 8);
    Cluster slow_ring = load_cluster("configs/clusters/h100-sxm.toml");
    const StepTime a = predict_step_time(whole, one, slow_ring, model_parameter_count(whole.model));
    slow_ring.efficiency.ring_attention = 0;
    EXPECT_DOUBLE_EQ(predict_step_time(whole, one, slow_ring, model_parameter_count(whole.model)).compute_seconds, a.compute_seconds);
}

// Two nodes of 8 H100s, tp 8 x cp 2: the cp group's two ranks are 8 apart, in different nodes,
// so the ring runs over InfiniBand; with tp 4 x cp 2 it stays on NVLink.
TEST(StepModel, ContextParallelRing_CrossesNodesWhenTpTimesCpExceedsANode) {
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    // One micro-batch per step: the exposed time is the layers' last hops, the rest hidden.
    const auto expect_last_hops_over = [&](int tp, const Link& link) {
        SCOPED_TRACE(cat("tp ", tp));
        const Config config = long_context(2, {cat("parallel.tp=", tp)});
        const Mesh mesh = make_mesh(config.parallel, 2 * tp);
        const RingSend last = stage_work(config, mesh, 0).cp_sends.back();
        const StepTime t = predict_step_time(config, mesh, h100, model_parameter_count(config.model));
        EXPECT_NEAR(t.cp_comm_seconds, last.count * send_seconds(last.bytes, link), 1e-12);
    };
    expect_last_hops_over(4, h100.intra_node);
    expect_last_hops_over(8, h100.inter_node);
    ASSERT_LT(h100.inter_node.gbps, h100.intra_node.gbps);
}

// On a CPU the cores that would compute move the bytes (and MPI moves them only inside its
// calls): every ring send is exposed, none hidden.
TEST(StepModel, ContextParallelRing_AllExposedOnCpus) {
    const Config config = fifty_million({"parallel.cp=2"});
    const Cluster cpu = two_core_node();
    const Mesh mesh = make_mesh(config.parallel, 2);
    const StageWork w = stage_work(config, mesh, 0);
    ASSERT_EQ(w.cp_sends.size(), 3u);
    const StepTime t = predict(config, cpu, 2);
    double all = 0;
    for (const RingSend& send : w.cp_sends) all += send.count * send_seconds(send.bytes, cpu.intra_node);  // a whole core each
    const double m = static_cast<double>(micro_batches_per_step(config, mesh.dp()));
    EXPECT_GT(all, 0);
    EXPECT_NEAR(t.cp_comm_seconds, m * all, 1e-12 * m * all);
    EXPECT_DOUBLE_EQ(t.cp_hidden_seconds, 0);
}

// Gradients are reduced, and ZeRO-1 shards the optimizer, over the data group: the dp x cp
// ranks holding the same weights. cp 2 x dp 2, cp 4 and dp 4 all reduce over 4 ranks and pay
// the same; cp 2 alone (dp 1) still reduces over 2. The step's tokens are the dp ranks' (the cp
// ranks of one dp rank share its sequences).
TEST(StepModel, ContextParallel_DataGroupOfDpTimesCpDrivesTheGradientReduction) {
    const Cluster cpu = two_core_node();
    const Config dp4 = fifty_million({"train.batch_size=1"}), cp2_dp2 = fifty_million({"train.batch_size=1", "parallel.cp=2"});
    const Config cp4 = fifty_million({"train.batch_size=1", "parallel.cp=4"});
    const StepTime a = predict(dp4, cpu, 4), b = predict(cp2_dp2, cpu, 4), c = predict(cp4, cpu, 4);
    EXPECT_GT(a.dp_exposed_seconds, 0);
    EXPECT_DOUBLE_EQ(b.dp_exposed_seconds, a.dp_exposed_seconds);
    EXPECT_DOUBLE_EQ(c.dp_exposed_seconds, a.dp_exposed_seconds);
    const StageWork w4 = stage_work(dp4, make_mesh(dp4.parallel, 4), 0), w22 = stage_work(cp2_dp2, make_mesh(cp2_dp2.parallel, 4), 0);
    EXPECT_DOUBLE_EQ(w22.update_bytes, w4.update_bytes);  // each updates 1/4 of the elements
    const Config dp2 = fifty_million({"train.batch_size=1"}), cp2 = fifty_million({"train.batch_size=1", "parallel.cp=2"});
    EXPECT_DOUBLE_EQ(predict(cp2, cpu, 2).dp_exposed_seconds, predict(dp2, cpu, 2).dp_exposed_seconds);
    EXPECT_GT(predict(dp4, cpu, 4).dp_exposed_seconds, predict(dp2, cpu, 2).dp_exposed_seconds);
    const double sequence = 64, m = static_cast<double>(micro_batches_per_step(dp4, 4));
    EXPECT_DOUBLE_EQ(a.tokens_per_step, sequence * m * 4);
    EXPECT_DOUBLE_EQ(b.tokens_per_step, sequence * m * 2);
    EXPECT_DOUBLE_EQ(c.tokens_per_step, sequence * m * 1);
}

// A sequence no single GPU holds (256k tokens of the Llama-1B shape with one KV head, so tp
// cannot split it either): of the layouts of 8 H100s, only those with cp > 1 fit, and the
// search ranks them; with cuDNN attention, which the ring does not run on, it weighs no cp
// layout and nothing fits.
TEST(LayoutSearch, LongSequence_FindsAContextParallelLayoutWhereNoneFitsWithout) {
    const std::vector<std::string> longer = {"model.n_kv_heads=1", "train.seq_len=262144", "model.max_seq_len=262144", "train.global_batch_size=8"};
    const Config config = load_config("configs/llama-1b-64k.toml", longer, DataFiles::unchecked);
    const Cluster h100 = load_cluster("configs/clusters/h100-sxm.toml");
    const double params = model_parameter_count(config.model);
    const LayoutSearch search = search_layouts(config, h100, 8, {}, params);
    ASSERT_FALSE(search.ranked.empty());
    for (const LayoutPlan& plan : search.ranked) EXPECT_GT(plan.cp, 1) << layout_name(plan);
    EXPECT_EQ(search.ranked.front().tp * search.ranked.front().cp * search.ranked.front().pp * search.ranked.front().dp, 8);
    EXPECT_NE(layout_name(search.ranked.front()).find(cat(" x cp ", search.ranked.front().cp, " x ")), std::string::npos);
    // cp = 1 was weighed: the same config planned at cp 1 (dp 8) is a layout that does not fit.
    Config without = config;
    without.parallel.cp = 1;
    EXPECT_FALSE(plan_layout(without, h100, 8, {}, params).fits);

    Config cudnn = config;
    cudnn.model.attention = AttentionImpl::cudnn;
    const LayoutSearch none = search_layouts(cudnn, h100, 8, {}, params);
    EXPECT_TRUE(none.ranked.empty());
    ASSERT_TRUE(none.smallest_unfit.has_value());
    EXPECT_EQ(none.smallest_unfit->cp, 1);
}
