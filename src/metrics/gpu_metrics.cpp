#include "metrics/gpu_metrics.h"

#include <array>
#include <condition_variable>
#include <cstdlib>
#include <dlfcn.h>
#include <mutex>
#include <optional>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <thread>
#include <vector>

#include "core/error.h"
#include "metrics/prometheus_exporter.h"

namespace llmtrain {

namespace {

// The few NVML declarations used (nvml.h is not needed to build): the types are the C ABI
// of libnvidia-ml.so.1, stable since NVML's _v2 entry points.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
struct nvmlUtilization_t { unsigned int gpu, memory; };
struct nvmlMemory_t { unsigned long long total, free, used; };
struct nvmlEventData_t {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
};
constexpr unsigned long long kXidCriticalError = 0x8;   // nvmlEventTypeXidCriticalError
constexpr int kTemperatureGpu = 0;                      // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;                             // NVML_CLOCK_SM
constexpr int kVolatileEcc = 0;                         // NVML_VOLATILE_ECC
constexpr unsigned kNvLinkMaxLinks = 18;                // NVML_NVLINK_MAX_LINKS
// nvmlClocksThrottleReason* bits, in order.
constexpr std::array<const char*, 9> kThrottleReasons = {"gpu_idle",       "applications_clocks_setting", "sw_power_cap",
                                                         "hw_slowdown",    "sync_boost",                  "sw_thermal_slowdown",
                                                         "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"};

struct Nvml {
    void* handle = nullptr;
    nvmlReturn_t (*init)() = nullptr;
    nvmlReturn_t (*shutdown)() = nullptr;
    const char* (*error_string)(nvmlReturn_t) = nullptr;
    nvmlReturn_t (*count)(unsigned*) = nullptr;
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*index_of)(nvmlDevice_t, unsigned*) = nullptr;
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
    nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;
    nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
    nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
    nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long*) = nullptr;
    nvmlReturn_t (*ecc)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
    nvmlReturn_t (*nvlink)(nvmlDevice_t, unsigned, int*) = nullptr;
    nvmlReturn_t (*event_set_create)(nvmlEventSet_t*) = nullptr;
    nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
    nvmlReturn_t (*event_wait)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
    nvmlReturn_t (*event_set_free)(nvmlEventSet_t) = nullptr;

    template <class F>
    void bind(F& fn, const char* name) { fn = reinterpret_cast<F>(dlsym(handle, name)); }
    std::string error(nvmlReturn_t code) const { return error_string ? error_string(code) : cat("NVML error ", code); }
};

// dlopen and the entry points; the optional ones stay null where this driver lacks them.
std::optional<Nvml> load_nvml(std::string& why_not) {
    Nvml n;
    n.handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.handle) {
        const char* error = dlerror();
        why_not = cat("libnvidia-ml.so.1 (NVML, the NVIDIA driver's) cannot be loaded: ", error ? error : "not found");
        return std::nullopt;
    }
    n.bind(n.init, "nvmlInit_v2");
    n.bind(n.shutdown, "nvmlShutdown");
    n.bind(n.error_string, "nvmlErrorString");
    n.bind(n.count, "nvmlDeviceGetCount_v2");
    n.bind(n.by_index, "nvmlDeviceGetHandleByIndex_v2");
    n.bind(n.by_uuid, "nvmlDeviceGetHandleByUUID");
    n.bind(n.index_of, "nvmlDeviceGetIndex");
    n.bind(n.utilization, "nvmlDeviceGetUtilizationRates");
    n.bind(n.memory, "nvmlDeviceGetMemoryInfo");
    n.bind(n.power, "nvmlDeviceGetPowerUsage");
    n.bind(n.energy, "nvmlDeviceGetTotalEnergyConsumption");
    n.bind(n.temperature, "nvmlDeviceGetTemperature");
    n.bind(n.clock, "nvmlDeviceGetClockInfo");
    n.bind(n.throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
    n.bind(n.ecc, "nvmlDeviceGetTotalEccErrors");
    n.bind(n.nvlink, "nvmlDeviceGetNvLinkState");
    n.bind(n.event_set_create, "nvmlEventSetCreate");
    n.bind(n.register_events, "nvmlDeviceRegisterEvents");
    n.bind(n.event_wait, "nvmlEventSetWait_v2");
    n.bind(n.event_set_free, "nvmlEventSetFree");
    if (!n.init || !n.shutdown || !n.by_index) {
        why_not = "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByIndex_v2";
        dlclose(n.handle);
        return std::nullopt;
    }
    if (const nvmlReturn_t r = n.init(); r != NVML_SUCCESS) {
        why_not = cat("nvmlInit_v2 failed: ", n.error(r));
        dlclose(n.handle);
        return std::nullopt;
    }
    return n;
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

std::optional<nvmlDevice_t> find_device(const Nvml& n, const std::string& which, std::string& why_not) {
    nvmlDevice_t device = nullptr;
    nvmlReturn_t r = -1;
    if (which.rfind("GPU-", 0) == 0 || which.rfind("MIG-", 0) == 0) {
        if (n.by_uuid) r = n.by_uuid(which.c_str(), &device);
    } else if (!which.empty() && which.find_first_not_of("0123456789") == std::string::npos) {
        r = n.by_index(static_cast<unsigned>(std::stoul(which)), &device);
    }
    if (r == NVML_SUCCESS) return device;
    why_not = cat("NVML has no GPU '", which, "' for this rank", r >= 0 ? cat(": ", n.error(r)) : "");
    return std::nullopt;
}

// A counter that follows a cumulative reading: it adds what the reading grew by.
struct FollowingCounter {
    prometheus::Counter* counter = nullptr;
    double last = 0;
    void follow(double reading) {
        if (reading > last) counter->Increment(reading - last);
        last = reading;
    }
};

class NvmlSampler : public GpuSampler {
public:
    NvmlSampler(Nvml nvml, nvmlDevice_t device, MetricsExporter& exporter, double interval_seconds)
        : nvml_(nvml), device_(device), interval_(interval_seconds) {
        if (nvml_.index_of) nvml_.index_of(device_, &index_);
        labels_ = exporter.constant_labels();
        std::erase_if(labels_, [](const auto& label) { return label.first == "gpu"; });
        labels_.emplace_back("gpu", std::to_string(index_));
        create_series(exporter.registry());
        sample();
        thread_ = std::thread([this] { loop(); });
    }
    ~NvmlSampler() override {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        thread_.join();
        if (events_ && nvml_.event_set_free) nvml_.event_set_free(events_);
        nvml_.shutdown();
        dlclose(nvml_.handle);
    }
    unsigned index() const override { return index_; }

private:
    prometheus::Labels labels() const {
        prometheus::Labels l;
        for (const auto& [name, value] : labels_) l[name] = value;
        return l;
    }
    prometheus::Gauge* gauge(prometheus::Registry& r, const char* name, const char* help, bool offered) {
        if (!offered) return nullptr;
        return &prometheus::BuildGauge().Name(name).Help(help).Labels(labels()).Register(r).Add({});
    }

    // One series per reading that NVML answers on this device.
    void create_series(prometheus::Registry& r) {
        nvmlUtilization_t u{};
        nvmlMemory_t m{};
        unsigned value = 0;
        unsigned long long big = 0;
        const bool has_utilization = nvml_.utilization && nvml_.utilization(device_, &u) == NVML_SUCCESS;
        utilization_ = gauge(r, "llmtrain_gpu_utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU (NVML).", has_utilization);
        memory_utilization_ = gauge(r, "llmtrain_gpu_memory_utilization_ratio", "Share of the last sample period in which device memory was read or written (NVML).", has_utilization);
        const bool has_memory = nvml_.memory && nvml_.memory(device_, &m) == NVML_SUCCESS;
        memory_used_ = gauge(r, "llmtrain_gpu_memory_used_bytes", "Device memory in use (all processes).", has_memory);
        memory_total_ = gauge(r, "llmtrain_gpu_memory_total_bytes", "Device memory installed.", has_memory);
        power_ = gauge(r, "llmtrain_gpu_power_watts", "Power draw of the GPU board.", nvml_.power && nvml_.power(device_, &value) == NVML_SUCCESS);
        temperature_ = gauge(r, "llmtrain_gpu_temperature_celsius", "GPU die temperature.",
                             nvml_.temperature && nvml_.temperature(device_, kTemperatureGpu, &value) == NVML_SUCCESS);
        sm_clock_ = gauge(r, "llmtrain_gpu_sm_clock_hertz", "SM clock.", nvml_.clock && nvml_.clock(device_, kClockSm, &value) == NVML_SUCCESS);
        const prometheus::Labels base = labels();
        if (nvml_.energy && nvml_.energy(device_, &big) == NVML_SUCCESS)
            energy_.counter = &prometheus::BuildCounter().Name("llmtrain_gpu_energy_joules_total").Help("Energy used by the GPU since the driver loaded.")
                                   .Labels(base).Register(r).Add({});
        if (nvml_.throttle && nvml_.throttle(device_, &big) == NVML_SUCCESS) {
            auto& family = prometheus::BuildGauge().Name("llmtrain_gpu_throttle_active").Help("1 while NVML reports this reason for lowered clocks.").Labels(base).Register(r);
            for (size_t i = 0; i < kThrottleReasons.size(); ++i) throttle_[i] = &family.Add({{"reason", kThrottleReasons[i]}});
        }
        if (nvml_.ecc && nvml_.ecc(device_, 0, kVolatileEcc, &big) == NVML_SUCCESS) {
            auto& family = prometheus::BuildCounter().Name("llmtrain_gpu_ecc_errors_total").Help("ECC errors since the driver loaded, by type (volatile counts).")
                               .Labels(base).Register(r);
            ecc_[0].counter = &family.Add({{"type", "corrected"}});
            ecc_[1].counter = &family.Add({{"type", "uncorrected"}});
        }
        if (nvml_.nvlink) {
            prometheus::Family<prometheus::Gauge>* family = nullptr;
            for (unsigned link = 0; link < kNvLinkMaxLinks; ++link) {
                int active = 0;
                if (nvml_.nvlink(device_, link, &active) != NVML_SUCCESS) continue;
                if (!family) family = &prometheus::BuildGauge().Name("llmtrain_gpu_nvlink_up").Help("1 while the NVLink link is active.").Labels(base).Register(r);
                nvlinks_.emplace_back(link, &family->Add({{"link", std::to_string(link)}}));
            }
        }
        if (nvml_.event_set_create && nvml_.register_events && nvml_.event_wait && nvml_.event_set_create(&events_) == NVML_SUCCESS) {
            if (nvml_.register_events(device_, kXidCriticalError, events_) == NVML_SUCCESS) {
                xid_errors_ = &prometheus::BuildCounter().Name("llmtrain_gpu_xid_errors_total").Help("Critical XID errors the driver reported for the GPU.")
                                   .Labels(base).Register(r).Add({});
                last_xid_ = gauge(r, "llmtrain_gpu_last_xid", "The last critical XID error code (0: none).", true);
            } else if (nvml_.event_set_free) {
                nvml_.event_set_free(events_);
                events_ = nullptr;
            }
        }
    }

    void sample() {
        nvmlUtilization_t u{};
        nvmlMemory_t m{};
        unsigned value = 0;
        unsigned long long big = 0;
        if (utilization_ && nvml_.utilization(device_, &u) == NVML_SUCCESS) {
            utilization_->Set(u.gpu / 100.0);
            memory_utilization_->Set(u.memory / 100.0);
        }
        if (memory_used_ && nvml_.memory(device_, &m) == NVML_SUCCESS) {
            memory_used_->Set(static_cast<double>(m.used));
            memory_total_->Set(static_cast<double>(m.total));
        }
        if (power_ && nvml_.power(device_, &value) == NVML_SUCCESS) power_->Set(value / 1e3);  // mW
        if (temperature_ && nvml_.temperature(device_, kTemperatureGpu, &value) == NVML_SUCCESS) temperature_->Set(value);
        if (sm_clock_ && nvml_.clock(device_, kClockSm, &value) == NVML_SUCCESS) sm_clock_->Set(value * 1e6);  // MHz
        if (energy_.counter && nvml_.energy(device_, &big) == NVML_SUCCESS) energy_.follow(static_cast<double>(big) / 1e3);  // mJ
        if (throttle_[0] && nvml_.throttle(device_, &big) == NVML_SUCCESS)
            for (size_t i = 0; i < kThrottleReasons.size(); ++i) throttle_[i]->Set((big >> i) & 1);
        for (int type = 0; type < 2; ++type)
            if (ecc_[type].counter && nvml_.ecc(device_, type, kVolatileEcc, &big) == NVML_SUCCESS) ecc_[type].follow(static_cast<double>(big));
        for (auto& [link, up] : nvlinks_) {
            int active = 0;
            if (nvml_.nvlink(device_, link, &active) == NVML_SUCCESS) up->Set(active ? 1 : 0);
        }
        nvmlEventData_t event{};
        while (xid_errors_ && nvml_.event_wait(events_, &event, 0) == NVML_SUCCESS) {
            xid_errors_->Increment();
            last_xid_->Set(static_cast<double>(event.eventData));
        }
    }

    void loop() {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_for(lock, std::chrono::duration<double>(interval_), [this] { return stopping_; })) sample();
    }

    Nvml nvml_;
    nvmlDevice_t device_;
    double interval_;
    unsigned index_ = 0;
    std::vector<std::pair<std::string, std::string>> labels_;
    prometheus::Gauge *utilization_ = nullptr, *memory_utilization_ = nullptr, *memory_used_ = nullptr, *memory_total_ = nullptr;
    prometheus::Gauge *power_ = nullptr, *temperature_ = nullptr, *sm_clock_ = nullptr, *last_xid_ = nullptr;
    std::array<prometheus::Gauge*, kThrottleReasons.size()> throttle_{};
    std::vector<std::pair<unsigned, prometheus::Gauge*>> nvlinks_;
    FollowingCounter energy_;
    std::array<FollowingCounter, 2> ecc_{};
    prometheus::Counter* xid_errors_ = nullptr;
    nvmlEventSet_t events_ = nullptr;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace

std::unique_ptr<GpuSampler> GpuSampler::start(MetricsExporter& exporter, int local_rank, double interval_seconds, std::string& why_not) {
    std::optional<Nvml> nvml = load_nvml(why_not);
    if (!nvml) return nullptr;
    const std::optional<nvmlDevice_t> device = find_device(*nvml, visible_device(local_rank), why_not);
    if (!device) {
        nvml->shutdown();
        dlclose(nvml->handle);
        return nullptr;
    }
    return std::make_unique<NvmlSampler>(*nvml, *device, exporter, interval_seconds);
}

}  // namespace llmtrain
