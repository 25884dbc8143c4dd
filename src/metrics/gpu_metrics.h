// GPU series from NVML, the NVIDIA driver's management library, loaded with dlopen at run
// time: the binary has no link to it and runs where it is missing (CPU nodes). A background
// thread reads the GPU of this rank every metrics.gpu_interval_seconds and sets the series,
// named after what DCGM exporter's fields mean:
//   llmtrain_gpu_utilization_ratio, llmtrain_gpu_memory_utilization_ratio  (NVML's sampled busy shares)
//   llmtrain_gpu_memory_used_bytes, llmtrain_gpu_memory_total_bytes, llmtrain_gpu_power_watts,
//   llmtrain_gpu_energy_joules_total, llmtrain_gpu_temperature_celsius, llmtrain_gpu_sm_clock_hertz,
//   llmtrain_gpu_throttle_active{reason}, llmtrain_gpu_ecc_errors_total{type} (volatile counts),
//   llmtrain_gpu_xid_errors_total and llmtrain_gpu_last_xid (critical XID events),
//   llmtrain_gpu_nvlink_up{link}
// A series NVML does not offer on a device (no ECC, no NVLink) is left out.
#pragma once

#include <memory>
#include <string>

namespace llmtrain {

class MetricsExporter;

class GpuSampler {
public:
    // Loads NVML and starts sampling the GPU of this node-local rank (CUDA_VISIBLE_DEVICES
    // honoured: the local rank's entry of it, an index or a UUID). Null, with why_not set to
    // one line, where there is no NVML or no such GPU.
    static std::unique_ptr<GpuSampler> start(MetricsExporter& exporter, int local_rank, double interval_seconds, std::string& why_not);
    virtual ~GpuSampler() = default;
    // The NVML index of the GPU sampled (the `gpu` label).
    virtual unsigned index() const = 0;
};

}  // namespace llmtrain
