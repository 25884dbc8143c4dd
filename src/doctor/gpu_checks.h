// `llmtrain doctor`'s GPU and network checks. The health readings come from NVML (core/nvml.h)
// for every GPU of the node, the bandwidths from measurements (NCCL all-reduce through
// parallel/comm_bench, GPU-to-GPU copies through parallel/peer_copy, MPI point-to-point
// here); each is judged by a pure function below against what the hardware should reach,
// so the judgement is tested without the hardware.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "doctor/doctor.h"
#include "parallel/comm.h"
#include "parallel/peer_copy.h"

namespace llmtrain {

class Nvml;

// --- driver and runtime -------------------------------------------------------------------

// The oldest Linux driver the CUDA toolkit of `runtime_version` runs on (its minor-version
// compatibility floor: "525.60.13" for 12.x), or "" for a toolkit not in the table.
std::string minimum_driver_for_runtime(int runtime_version);
// runtime 0: not a CUDA build (SKIP); driver 0: no CUDA driver, no GPU here (SKIP); a driver
// the CUDA backend would refuse (cuda_driver_problem): FAIL with its message.
CheckResult judge_gpu_driver(int runtime_version, int driver_cuda_version, const std::string& driver_release);

// --- GPUs of each node --------------------------------------------------------------------

struct NodeGpus {
    std::string host;
    int ranks = 0;                    // ranks of the job on this node
    std::vector<std::string> models;  // one per GPU NVML sees
    std::string why_not;              // non-empty: NVML could not be read
};
std::string node_gpus_to_text(const NodeGpus& node);
NodeGpus node_gpus_from_text(const std::string& text);
// One check per node ("gpu.node.<host>"): its GPU count and models. FAIL: no GPU; WARN: fewer
// GPUs than ranks, mixed models on the node, or models other than the first node's.
std::vector<CheckResult> judge_node_gpus(const std::vector<NodeGpus>& nodes);

// --- NVML health readings of one GPU ------------------------------------------------------

struct RowRemapping {
    unsigned corrected = 0, uncorrected = 0;
    bool pending = false, failed = false;
};
struct RetiredPages {
    unsigned single_bit = 0, double_bit = 0;
    bool pending = false;
};
struct GpuHealth {
    unsigned index = 0;
    std::optional<uint64_t> ecc_volatile_uncorrected, ecc_aggregate_uncorrected, ecc_volatile_corrected;
    std::optional<RowRemapping> remapping;  // A100 and later
    std::optional<RetiredPages> retired;    // earlier GPUs: dynamic page retirement
    std::vector<std::pair<unsigned, bool>> nvlinks;  // (link, active) for the links NVML reports
    std::optional<uint64_t> throttle_reasons;        // nvmlClocksThrottleReason bits
};
struct XidEvent {
    unsigned gpu = 0;
    uint64_t xid = 0;
};

// Every GPU of the node, read once.
std::vector<GpuHealth> read_gpu_health(const Nvml& nvml);

CheckResult judge_ecc(const std::vector<GpuHealth>& gpus);            // gpu.ecc
CheckResult judge_retired_memory(const std::vector<GpuHealth>& gpus); // gpu.retired_memory
CheckResult judge_nvlink(const std::vector<GpuHealth>& gpus);         // gpu.nvlink
// gpu.health: critical XID events while doctor ran, and hardware clock slowdowns.
CheckResult judge_gpu_health(const std::vector<GpuHealth>& gpus, const std::vector<XidEvent>& xids);

// Critical XID events of every GPU of the node, from construction until events(): NVML reports
// only events after registration (the kernel log holds earlier ones).
class XidWatch {
public:
    explicit XidWatch(const Nvml& nvml);
    ~XidWatch();
    XidWatch(const XidWatch&) = delete;
    XidWatch& operator=(const XidWatch&) = delete;
    bool watching() const { return set_ != nullptr; }
    std::vector<XidEvent> events();

private:
    const Nvml& nvml_;
    struct nvmlEventSet_st* set_ = nullptr;
};

// --- bandwidths ---------------------------------------------------------------------------

// What a healthy system of this GPU model reaches (GB/s), or nothing for a model not in the
// table: all-reduce bus bandwidth of 8 GPUs over NVLink (nccl-tests), and bidirectional
// copy bandwidth between two GPUs over NVLink (p2pBandwidthLatencyTest).
std::optional<double> reference_allreduce_busbw_gbps(const std::string& model);
std::optional<double> reference_peer_copy_gbps(const std::string& model);

// gpu.nccl_allreduce: the bus bandwidth of the largest size. One node of 8 GPUs is held to
// 80% of the model's reference (WARN below); fewer GPUs or several nodes are reported, and
// the detail says why they are not judged.
CheckResult judge_allreduce(double busbw_gbps, size_t bytes, int ranks, int nodes, const std::string& model);
// gpu.p2p_copy: the slowest pair against the model's bar (WARN below) where the pairs have
// peer access over NVLink; reported otherwise.
CheckResult judge_peer_copies(const std::vector<PeerCopyResult>& pairs, const std::string& model, bool nvlink);

// MPI point-to-point: `from` streams `iterations` messages of `bytes` host memory to `to`,
// which answers when all arrived; GB/s on both of them (0 on other ranks, which only wait).
// Every rank of `world` calls it.
double measure_p2p_gbps(Comm& world, int from, int to, size_t bytes, int iterations);
// mpi.internode_bandwidth: the slowest pair of nodes (names, GB/s) against net_gbps (Gbit/s
// of the path between two nodes; WARN below 80%); 0: not given, reported only.
CheckResult judge_internode(const std::vector<std::pair<std::string, double>>& pairs, double net_gbps);

}  // namespace llmtrain
