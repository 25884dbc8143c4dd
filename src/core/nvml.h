// NVML, the NVIDIA driver's management library, loaded with dlopen at run time: the binary
// has no link to it and runs where it is missing (CPU nodes). The metrics layer samples
// through it and `doctor` checks the GPUs' health with it; this is their one loader.
// The few NVML declarations used are written out here (nvml.h is not needed to build): the
// types are the C ABI of libnvidia-ml.so.1, stable since NVML's _v2 entry points.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace llmtrain {

using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
struct nvmlUtilization_t { unsigned int gpu, memory; };
struct nvmlMemory_t { unsigned long long total, free, used; };
struct nvmlEventData_t {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
};
constexpr unsigned long long kNvmlXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError
constexpr int kNvmlTemperatureGpu = 0;                      // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;                             // NVML_CLOCK_SM
constexpr int kNvmlCorrectedEcc = 0, kNvmlUncorrectedEcc = 1;  // nvmlMemoryErrorType_t
constexpr int kNvmlVolatileEcc = 0, kNvmlAggregateEcc = 1;     // nvmlEccCounterType_t
constexpr int kNvmlRetiredMultipleSingleBit = 0, kNvmlRetiredDoubleBit = 1;  // nvmlPageRetirementCause_t
constexpr unsigned kNvLinkMaxLinks = 18;                    // NVML_NVLINK_MAX_LINKS

// The entry points; the optional ones stay null where this driver lacks them. Init, shutdown
// and a device by index are always there (load refuses a library without them).
struct NvmlApi {
    nvmlReturn_t (*init)() = nullptr;
    nvmlReturn_t (*shutdown)() = nullptr;
    const char* (*error_string)(nvmlReturn_t) = nullptr;
    nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
    nvmlReturn_t (*count)(unsigned*) = nullptr;
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*index_of)(nvmlDevice_t, unsigned*) = nullptr;
    nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
    nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;
    nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
    nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
    nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long*) = nullptr;
    nvmlReturn_t (*ecc)(nvmlDevice_t, int error_type, int counter_type, unsigned long long*) = nullptr;
    // (device, cause, in: capacity / out: count, addresses or null)
    nvmlReturn_t (*retired_pages)(nvmlDevice_t, int, unsigned*, unsigned long long*) = nullptr;
    nvmlReturn_t (*retired_pages_pending)(nvmlDevice_t, int*) = nullptr;
    // (device, corrected rows, uncorrected rows, remapping pending, remapping failed)
    nvmlReturn_t (*remapped_rows)(nvmlDevice_t, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
    nvmlReturn_t (*nvlink)(nvmlDevice_t, unsigned, int*) = nullptr;
    nvmlReturn_t (*event_set_create)(nvmlEventSet_t*) = nullptr;
    nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
    nvmlReturn_t (*event_wait)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
    nvmlReturn_t (*event_set_free)(nvmlEventSet_t) = nullptr;
};

// A loaded and initialized NVML; unloaded (nvmlShutdown, dlclose) when destroyed.
class Nvml {
public:
    // Null, with why_not set to one line, where libnvidia-ml.so.1 cannot be loaded or
    // initialized (no NVIDIA driver).
    static std::unique_ptr<Nvml> load(std::string& why_not);
    ~Nvml();
    Nvml(const Nvml&) = delete;
    Nvml& operator=(const Nvml&) = delete;

    const NvmlApi& api() const { return api_; }
    std::string error(nvmlReturn_t code) const;
    unsigned device_count() const;  // 0 where NVML cannot count them
    std::optional<nvmlDevice_t> device(unsigned index) const;
    std::string device_name(nvmlDevice_t device) const;  // "NVIDIA H100 80GB HBM3", or "unknown"
    std::string driver_version() const;                  // "550.54.15", or "" where not offered
    // The GPU the CUDA backend opens for this node-local rank (CUDA_VISIBLE_DEVICES honoured:
    // the local rank's entry of it, an index or a UUID), or nothing with why_not set.
    std::optional<nvmlDevice_t> device_of_local_rank(int local_rank, std::string& why_not) const;

private:
    Nvml() = default;
    void* handle_ = nullptr;
    NvmlApi api_;
};

}  // namespace llmtrain
