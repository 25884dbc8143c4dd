#include "core/nvml.h"

#include <cstdlib>
#include <dlfcn.h>
#include <vector>

#include "core/error.h"

namespace llmtrain {

namespace {

template <class F>
void bind(void* handle, F& fn, const char* name) { fn = reinterpret_cast<F>(dlsym(handle, name)); }

void bind_all(void* h, NvmlApi& a) {
    bind(h, a.init, "nvmlInit_v2");
    bind(h, a.shutdown, "nvmlShutdown");
    bind(h, a.error_string, "nvmlErrorString");
    bind(h, a.driver_version, "nvmlSystemGetDriverVersion");
    bind(h, a.count, "nvmlDeviceGetCount_v2");
    bind(h, a.by_index, "nvmlDeviceGetHandleByIndex_v2");
    bind(h, a.by_uuid, "nvmlDeviceGetHandleByUUID");
    bind(h, a.index_of, "nvmlDeviceGetIndex");
    bind(h, a.name, "nvmlDeviceGetName");
    bind(h, a.utilization, "nvmlDeviceGetUtilizationRates");
    bind(h, a.memory, "nvmlDeviceGetMemoryInfo");
    bind(h, a.power, "nvmlDeviceGetPowerUsage");
    bind(h, a.energy, "nvmlDeviceGetTotalEnergyConsumption");
    bind(h, a.temperature, "nvmlDeviceGetTemperature");
    bind(h, a.clock, "nvmlDeviceGetClockInfo");
    bind(h, a.throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
    bind(h, a.ecc, "nvmlDeviceGetTotalEccErrors");
    bind(h, a.retired_pages, "nvmlDeviceGetRetiredPages");
    bind(h, a.retired_pages_pending, "nvmlDeviceGetRetiredPagesPendingStatus");
    bind(h, a.remapped_rows, "nvmlDeviceGetRemappedRows");
    bind(h, a.nvlink, "nvmlDeviceGetNvLinkState");
    bind(h, a.event_set_create, "nvmlEventSetCreate");
    bind(h, a.register_events, "nvmlDeviceRegisterEvents");
    bind(h, a.event_wait, "nvmlEventSetWait_v2");
    bind(h, a.event_set_free, "nvmlEventSetFree");
}

// The local rank's entry of CUDA_VISIBLE_DEVICES ("2,3" or "GPU-<uuid>,..."), else the local
// rank itself: the GPU the CUDA backend opens as device local_rank.
std::string visible_device(int local_rank) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!visible || !*visible) return std::to_string(local_rank);
    std::vector<std::string> entries(1);
    for (const char* c = visible; *c; ++c) {
        if (*c == ',') entries.emplace_back();
        else entries.back() += *c;
    }
    return static_cast<size_t>(local_rank) < entries.size() ? entries[static_cast<size_t>(local_rank)] : "";
}

}  // namespace

std::unique_ptr<Nvml> Nvml::load(std::string& why_not) {
    void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* error = dlerror();
        why_not = cat("libnvidia-ml.so.1 (NVML, the NVIDIA driver's) cannot be loaded: ", error ? error : "not found");
        return nullptr;
    }
    std::unique_ptr<Nvml> n(new Nvml);
    bind_all(handle, n->api_);
    if (!n->api_.init || !n->api_.shutdown || !n->api_.by_index) {
        why_not = "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByIndex_v2";
        dlclose(handle);
        return nullptr;
    }
    if (const nvmlReturn_t r = n->api_.init(); r != NVML_SUCCESS) {
        why_not = cat("nvmlInit_v2 failed: ", n->error(r));
        dlclose(handle);
        return nullptr;
    }
    n->handle_ = handle;  // from here on the destructor shuts NVML down
    return n;
}

Nvml::~Nvml() {
    if (!handle_) return;
    api_.shutdown();
    dlclose(handle_);
}

std::string Nvml::error(nvmlReturn_t code) const { return api_.error_string ? api_.error_string(code) : cat("NVML error ", code); }

unsigned Nvml::device_count() const {
    unsigned count = 0;
    if (!api_.count || api_.count(&count) != NVML_SUCCESS) return 0;
    return count;
}

std::optional<nvmlDevice_t> Nvml::device(unsigned index) const {
    nvmlDevice_t device = nullptr;
    if (api_.by_index(index, &device) != NVML_SUCCESS) return std::nullopt;
    return device;
}

std::string Nvml::device_name(nvmlDevice_t device) const {
    char name[96] = {};
    if (!api_.name || api_.name(device, name, sizeof name) != NVML_SUCCESS) return "unknown";
    return name;
}

std::string Nvml::driver_version() const {
    char version[96] = {};
    if (!api_.driver_version || api_.driver_version(version, sizeof version) != NVML_SUCCESS) return "";
    return version;
}

std::optional<nvmlDevice_t> Nvml::device_of_local_rank(int local_rank, std::string& why_not) const {
    const std::string which = visible_device(local_rank);
    nvmlDevice_t device = nullptr;
    nvmlReturn_t r = -1;
    if (which.rfind("GPU-", 0) == 0 || which.rfind("MIG-", 0) == 0) {
        if (api_.by_uuid) r = api_.by_uuid(which.c_str(), &device);
    } else if (!which.empty() && which.find_first_not_of("0123456789") == std::string::npos) {
        r = api_.by_index(static_cast<unsigned>(std::stoul(which)), &device);
    }
    if (r == NVML_SUCCESS) return device;
    why_not = cat("NVML has no GPU '", which, "' for this rank", r >= 0 ? cat(": ", error(r)) : "");
    return std::nullopt;
}

}  // namespace llmtrain
