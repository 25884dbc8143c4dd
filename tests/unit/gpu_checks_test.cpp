// doctor's GPU and network judgements on known readings: the figures a healthy node gives
// pass, and each fault (old driver, missing or mixed GPUs, ECC errors, failed row remapping,
// a link down, an XID, slow bandwidths) gives the WARN or FAIL it should, with a hint.
#include <gtest/gtest.h>

#include "doctor/gpu_checks.h"

using namespace llmtrain;

namespace {

GpuHealth healthy_gpu(unsigned index) {
    GpuHealth g;
    g.index = index;
    g.ecc_volatile_uncorrected = 0;
    g.ecc_aggregate_uncorrected = 0;
    g.ecc_volatile_corrected = 5;
    g.remapping = RowRemapping{};
    g.nvlinks = {{0, true}, {1, true}};
    g.throttle_reasons = 0x1;  // idle: not a hardware slowdown
    return g;
}

}  // namespace

TEST(GpuDriverCheck, DriverOlderThanTheRuntimeFailsNamingBothVersions) {
    const CheckResult r = judge_gpu_driver(12040, 12020, "535.104.05");
    EXPECT_EQ(r.status, CheckStatus::fail);
    EXPECT_NE(r.hint.find("supports CUDA 12.2 but this llmtrain was built with CUDA 12.4"), std::string::npos) << r.hint;
}

TEST(GpuDriverCheck, DriverAtTheRuntimePassesAndNamesTheToolkitsMinimum) {
    const CheckResult r = judge_gpu_driver(12040, 12040, "550.54.15");
    EXPECT_EQ(r.status, CheckStatus::pass);
    EXPECT_NE(r.detail.find("the toolkit needs driver 525.60.13 or newer"), std::string::npos) << r.detail;
}

TEST(GpuDriverCheck, ReleaseBelowTheToolkitsMinimumFails) {
    EXPECT_EQ(judge_gpu_driver(12000, 12000, "520.61.05").status, CheckStatus::fail);
    EXPECT_EQ(minimum_driver_for_runtime(11080), "450.80.02");
}

TEST(GpuDriverCheck, NoCudaBuildOrNoDriverSkips) {
    EXPECT_EQ(judge_gpu_driver(0, 0, "").status, CheckStatus::skip);
    EXPECT_EQ(judge_gpu_driver(12040, 0, "").status, CheckStatus::skip);
    EXPECT_EQ(judge_gpu_driver(12040, 0, "550.54.15").status, CheckStatus::skip);
}

TEST(NodeGpusCheck, OneLinePerNodeWithCountAndModel) {
    const NodeGpus a{"node-a", 8, std::vector<std::string>(8, "NVIDIA H100 80GB HBM3"), ""};
    const NodeGpus round_trip = node_gpus_from_text(node_gpus_to_text(a));
    EXPECT_EQ(round_trip.models, a.models);
    const std::vector<CheckResult> checks = judge_node_gpus({a, {"node-b", 8, std::vector<std::string>(7, "NVIDIA H100 80GB HBM3"), ""}, {"node-c", 8, {}, ""}});
    ASSERT_EQ(checks.size(), 3u);
    EXPECT_EQ(checks[0].name, "gpu.node.node-a");
    EXPECT_EQ(checks[0].status, CheckStatus::pass);
    EXPECT_EQ(checks[0].detail, "8 x NVIDIA H100 80GB HBM3; 8 rank(s) here");
    EXPECT_EQ(checks[1].status, CheckStatus::warn);  // 7 GPUs for 8 ranks
    EXPECT_EQ(checks[2].status, CheckStatus::fail);  // the driver sees none
}

TEST(NodeGpusCheck, ModelsOtherThanTheFirstNodesWarn) {
    const std::vector<CheckResult> checks = judge_node_gpus({{"a", 1, {"NVIDIA H100 80GB HBM3"}, ""}, {"b", 1, {"NVIDIA A100-SXM4-80GB"}, ""}});
    EXPECT_EQ(checks[1].status, CheckStatus::warn);
    EXPECT_NE(checks[1].hint.find("first node's"), std::string::npos);
}

TEST(EccCheck, HealthyPassesPastErrorsWarnCurrentErrorsFail) {
    std::vector<GpuHealth> gpus{healthy_gpu(0), healthy_gpu(1)};
    EXPECT_EQ(judge_ecc(gpus).status, CheckStatus::pass);
    gpus[1].ecc_aggregate_uncorrected = 4;
    EXPECT_EQ(judge_ecc(gpus).status, CheckStatus::warn);
    gpus[1].ecc_volatile_uncorrected = 2;
    const CheckResult r = judge_ecc(gpus);
    EXPECT_EQ(r.status, CheckStatus::fail);
    EXPECT_NE(r.detail.find("(GPU 1)"), std::string::npos) << r.detail;
    EXPECT_NE(r.hint.find("drain the node"), std::string::npos);
    gpus = {GpuHealth{}};
    EXPECT_EQ(judge_ecc(gpus).status, CheckStatus::skip);
}

TEST(RetiredMemoryCheck, PendingWarnsFailedRemappingFails) {
    std::vector<GpuHealth> gpus{healthy_gpu(0)};
    EXPECT_EQ(judge_retired_memory(gpus).status, CheckStatus::pass);
    gpus[0].remapping->pending = true;
    EXPECT_EQ(judge_retired_memory(gpus).status, CheckStatus::warn);
    gpus[0].remapping->failed = true;
    EXPECT_EQ(judge_retired_memory(gpus).status, CheckStatus::fail);
    GpuHealth older;
    older.retired = RetiredPages{2, 1, true};
    EXPECT_EQ(judge_retired_memory({older}).status, CheckStatus::warn);
}

TEST(NvlinkCheck, ALinkDownWarnsNamingGpuAndLink) {
    std::vector<GpuHealth> gpus{healthy_gpu(0), healthy_gpu(1)};
    EXPECT_EQ(judge_nvlink(gpus).status, CheckStatus::pass);
    gpus[1].nvlinks[1].second = false;
    const CheckResult r = judge_nvlink(gpus);
    EXPECT_EQ(r.status, CheckStatus::warn);
    EXPECT_NE(r.detail.find("GPU 1 link 1"), std::string::npos) << r.detail;
    EXPECT_EQ(judge_nvlink({GpuHealth{}}).status, CheckStatus::skip);  // PCIe
}

TEST(GpuHealthCheck, XidFailsHardwareSlowdownWarns) {
    std::vector<GpuHealth> gpus{healthy_gpu(0)};
    EXPECT_EQ(judge_gpu_health(gpus, {}).status, CheckStatus::pass);
    const CheckResult xid = judge_gpu_health(gpus, {{0, 79}});
    EXPECT_EQ(xid.status, CheckStatus::fail);
    EXPECT_NE(xid.detail.find("XID 79 on GPU 0 (GPU has fallen off the bus)"), std::string::npos) << xid.detail;
    gpus[0].throttle_reasons = 0x40;
    EXPECT_EQ(judge_gpu_health(gpus, {}).status, CheckStatus::warn);
}

TEST(AllReduceCheck, EightH100sAreHeldTo80PercentOf450) {
    const std::string h100 = "NVIDIA H100 80GB HBM3";
    EXPECT_EQ(judge_allreduce(470, size_t{1} << 30, 8, 1, h100).status, CheckStatus::pass);
    EXPECT_EQ(judge_allreduce(361, size_t{1} << 30, 8, 1, h100).status, CheckStatus::pass);
    EXPECT_EQ(judge_allreduce(300, size_t{1} << 30, 8, 1, h100).status, CheckStatus::warn);
    // Fewer GPUs, several nodes, unknown models: reported, and the detail says why not judged.
    EXPECT_NE(judge_allreduce(100, size_t{1} << 30, 4, 1, h100).detail.find("is for 8 GPUs: not judged with 4"), std::string::npos);
    EXPECT_EQ(judge_allreduce(100, size_t{1} << 30, 16, 2, h100).status, CheckStatus::pass);
    EXPECT_NE(judge_allreduce(20, size_t{1} << 30, 8, 1, "NVIDIA L4").detail.find("no reference"), std::string::npos);
    EXPECT_EQ(reference_allreduce_busbw_gbps("NVIDIA A100-SXM4-80GB"), 230);
    EXPECT_FALSE(reference_allreduce_busbw_gbps("NVIDIA H100 PCIe"));
}

TEST(PeerCopyCheck, SlowestNvlinkPairBelow800Warns) {
    const std::string h100 = "NVIDIA H100 80GB HBM3";
    std::vector<PeerCopyResult> pairs{{0, 1, true, 900}, {0, 2, true, 850}};
    EXPECT_EQ(judge_peer_copies(pairs, h100, true).status, CheckStatus::pass);
    pairs[1].bidirectional_gbps = 500;
    const CheckResult r = judge_peer_copies(pairs, h100, true);
    EXPECT_EQ(r.status, CheckStatus::warn);
    EXPECT_NE(r.detail.find("GPU 0 <-> GPU 2 500.0 GB/s"), std::string::npos) << r.detail;
    EXPECT_EQ(judge_peer_copies(pairs, h100, false).status, CheckStatus::pass);  // no NVLink: no bar
    EXPECT_EQ(judge_peer_copies({}, h100, true).status, CheckStatus::skip);
}

TEST(InternodeCheck, Below80PercentOfTheNetworkWarns) {
    // 400 Gbit/s: 45 GB/s is 360 Gbit/s (90%), 30 GB/s is 240 Gbit/s (60%).
    EXPECT_EQ(judge_internode({{"a -> b", 45}, {"a -> c", 46}}, 400).status, CheckStatus::pass);
    const CheckResult slow = judge_internode({{"a -> b", 45}, {"a -> c", 30}}, 400);
    EXPECT_EQ(slow.status, CheckStatus::warn);
    EXPECT_NE(slow.detail.find("a -> c"), std::string::npos) << slow.detail;
    EXPECT_NE(judge_internode({{"a -> b", 30}}, 0).detail.find("give --net-gbps"), std::string::npos);
}
