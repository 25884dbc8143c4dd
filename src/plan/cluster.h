// A cluster description for the plan: what one device computes and holds, how many there
// are per node and in all, and the links between them; optionally calibrated by
// measurement (`llmtrain bench --calibration-out`, `bench comm --calibration-out`).
//
// A TOML file (configs/clusters/*.toml):
//   name = "..."
//   kind = "gpu" | "cpu"           cpu: a device is one core; ranks beyond the cores share them
//   [node]    devices, count; optionally mtbf_hours (mean time between failures of one node,
//             for the goodput; missing: none), launch_seconds (a restart's relaunch of
//             every rank and its communicators' set-up, before the load; missing: 60,
//             assumed), host_memory_gb (host RAM per node, which node-local snapshots use)
//   [device]  name, peak_tflops (dense, in the compute dtype: bf16 on GPUs, f32 on the CPU;
//             on a cpu cluster "auto": one core of the machine reading the file, measured),
//             memory_gb, memory_bandwidth_gbps, reserved_gb (runtime context and
//             communication buffers, outside what the run allocates); fp8_peak_tflops
//             (optional, GPUs only: the dense FP8 tensor-core peak; missing: the device has
//             none, and the plan refuses train.precision = "fp8" on it as the run does)
//   [network] intra_node_gbps, intra_node_latency_us, inter_node_gbps, inter_node_latency_us
//             (bandwidth per device and direction, as nccl-tests' bus bandwidth)
//   [efficiency] gemm, attention, memory: the shares of peak (memory: of the bandwidth)
//             assumed where nothing was measured; ring_attention (optional, default
//             attention): context parallelism's attention blocks; fp8_gemm (with
//             device.fp8_peak_tflops, required by it): the FP8 GEMMs' share of the FP8 peak
//   [storage] optional, the shared file system checkpoints go to: write_gbps, read_gbps
//             (aggregate over the cluster), node_write_gbps, node_read_gbps (one node's
//             link to it), host_copy_gbps (per device: the copy of its state into host
//             memory at a step boundary); without it the plan gives no checkpoint times
//   calibration = "FILE.toml"      optional, relative to this file: measured figures that
//                                  replace the assumed ones (the same tables as below)
// A calibration file holds [compute] (gemm_efficiency.<shape class>, attention_efficiency,
// memory_efficiency, fp8_gemm_efficiency where FP8 GEMMs were measured) and [collectives.intra_node] / [collectives.inter_node]
// (all_reduce_busbw_gbps, reduce_scatter_busbw_gbps, all_gather_busbw_gbps, latency_us, and
// the ranks that measured them: the fewest measured), with every measurement also under
// its number of ranks ([collectives.intra_node.ranks_4]).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace llmtrain {

enum class ClusterKind { gpu, cpu };

// The collectives the plan times, as `bench comm` names them.
enum class Collective { all_reduce, reduce_scatter, all_gather };

// What `bench comm` measured over one group of ranks.
// Bus bandwidth by message size: (bytes, GB/s), ascending bytes. A CPU's collectives slow
// down past its caches (measured on 4 ranks of 2 cores: reduce-scatter at 1.3 GB/s up to 8 MB,
// 0.45 from 16 MB): a message is costed at its own size's figure.
using BusbwCurve = std::vector<std::pair<double, double>>;

struct LinkMeasurement {
    std::map<Collective, double> busbw_gbps;
    double latency_us = 0;
    std::map<Collective, BusbwCurve> busbw_by_size;
};

struct Link {
    double gbps = 0;        // bus bandwidth per device, GB/s
    double latency_us = 0;  // per step of a ring
    // Measured bus bandwidth per collective (0: not measured; gbps applies).
    std::map<Collective, double> measured_busbw_gbps;
    // Measured by message size (bench comm), where it was: supersedes the figure above.
    std::map<Collective, BusbwCurve> measured_busbw_by_size;
    // Every measurement by the number of ranks that ran it (on a CPU node they include those
    // ranks' crowding of the cores; on GPUs, the bandwidth of that group size).
    std::map<int, LinkMeasurement> measured_by_ranks;
    double busbw_gbps(Collective op) const;
    // At a message of `bytes` (the whole buffer, as nccl-tests' size): interpolated in log
    // size between the measured sizes, the end figures beyond them; without a curve, the above.
    double busbw_gbps(Collective op, double bytes) const;
    // This link with the measurement of `ranks` ranks in place of the general one, if any.
    std::optional<Link> as_measured_by(int ranks) const;
};

// GEMM shape classes, by the smallest of a GEMM's three dimensions: efficiency depends on
// it (a narrow GEMM cannot keep the units busy).
enum class GemmClass { small, medium, large };  // < 256, < 1024, >= 1024
GemmClass gemm_class(double m, double n, double k);
const char* gemm_class_name(GemmClass c);

struct ComputeEfficiency {
    std::map<GemmClass, double> gemm;  // measured per class; missing: the nearest measured, else gemm_default
    double gemm_default = 0;
    double attention = 0;
    // Context parallelism's attention blocks (attention_block_fwd / _bwd): on CUDA kernels of
    // their own on the fp32 cores, not the flash kernels' tensor cores. 0: as `attention`.
    double ring_attention = 0;
    double memory = 0;
    double fp8_gemm = 0;   // the FP8 GEMMs' share of Cluster::fp8_peak_tflops (0: no FP8 tensor cores)
    double optimizer = 0;  // AdamW's update, a share of the memory bandwidth; 0: as `memory`
    double gradient_pass = 0;  // zeroing the gradients and reading their norm (plain streams); 0: as `memory`
    double gemm_for(GemmClass c) const;
    double optimizer_or_memory() const { return optimizer > 0 ? optimizer : memory; }
    double ring_attention_or_attention() const { return ring_attention > 0 ? ring_attention : attention; }
    double gradient_pass_or_memory() const { return gradient_pass > 0 ? gradient_pass : memory; }
};

// The shared storage checkpoints are written to and resumed from.
struct Storage {
    double write_gbps = 0, read_gbps = 0;            // aggregate, GB/s
    double node_write_gbps = 0, node_read_gbps = 0;  // per node, GB/s
    double host_copy_gbps = 0;                       // per device into host memory, GB/s
    // One rank's writer thread over its file: Fletcher32 over each chunk as it is written, then
    // XXH64 over the file (checkpoint verify runs the same two passes and prints their rate).
    double checksum_gbps = kMeasuredChecksumGbps;
    // The rate scripts/bench-checkpoint.sh measured on one core of a 2-core x86 VM (0.54 GB/s): the
    // default where a cluster file does not give its own.
    static constexpr double kMeasuredChecksumGbps = 0.54;
};

struct Cluster {
    std::string name;
    std::string source_path;
    std::string calibration_path;  // empty: not calibrated
    ClusterKind kind = ClusterKind::gpu;
    int devices_per_node = 0;
    int nodes = 0;
    std::string device_name;
    double peak_tflops = 0;
    // Dense FP8 (e4m3 / e5m2 operands) per device; 0: no FP8 tensor cores (on a CPU cluster
    // always 0: the reference emulates FP8 by decoding into f32 GEMMs, no faster than f32).
    double fp8_peak_tflops = 0;
    double memory_gb = 0;
    double memory_bandwidth_gbps = 0;
    double reserved_gb = 0;
    Link intra_node, inter_node;
    ComputeEfficiency efficiency;
    std::optional<Storage> storage;  // none: no [storage] section
    double node_mtbf_hours = 0;      // 0: not known (node.mtbf_hours, or plan --mtbf-hours)
    double launch_seconds = 0;       // 0: not given (node.launch_seconds, or plan --launch-seconds)
    double host_memory_gb = 0;       // 0: not known (node.host_memory_gb)
    int devices() const { return devices_per_node * nodes; }
};

// Reads a cluster file and the calibration it names. Throws Error(config) naming the file
// and the key for a missing key, a wrong type or a value out of range.
Cluster load_cluster(const std::string& path);
// Replaces the cluster's assumed figures with those measured in a calibration file.
void apply_calibration(Cluster& cluster, const std::string& path);

// What `bench` measured on this machine, to be merged into a calibration file.
struct ComputeCalibration {
    GemmClass gemm_class = GemmClass::medium;
    double gemm_efficiency = 0, attention_efficiency = 0, memory_efficiency = 0, optimizer_efficiency = 0, gradient_pass_efficiency = 0;
    double fp8_gemm_efficiency = 0;  // of device.fp8_peak_tflops, where FP8 GEMMs ran (0: none)
};
struct CollectiveCalibration {
    bool inter_node = false;
    int ranks = 0;
    std::map<Collective, double> busbw_gbps;
    double latency_us = 0;
    std::map<Collective, BusbwCurve> busbw_by_size;
};
// Adds or replaces these figures in the calibration file at path (created when missing),
// keeping what else it holds.
void write_calibration(const std::string& path, const ComputeCalibration& compute);
void write_calibration(const std::string& path, const CollectiveCalibration& collectives);

const char* collective_key(Collective op);

}  // namespace llmtrain
