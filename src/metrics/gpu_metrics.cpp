#include "metrics/gpu_metrics.h"

#include <array>
#include <condition_variable>
#include <mutex>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/nvml.h"
#include "metrics/prometheus_exporter.h"

namespace llmtrain {

namespace {

// nvmlClocksThrottleReason* bits, in order.
constexpr std::array<const char*, 9> kThrottleReasons = {"gpu_idle",       "applications_clocks_setting", "sw_power_cap",
                                                         "hw_slowdown",    "sync_boost",                  "sw_thermal_slowdown",
                                                         "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"};

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
    NvmlSampler(std::unique_ptr<Nvml> nvml, nvmlDevice_t device, MetricsExporter& exporter, double interval_seconds)
        : library_(std::move(nvml)), nvml_(library_->api()), device_(device), interval_(interval_seconds) {
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
                             nvml_.temperature && nvml_.temperature(device_, kNvmlTemperatureGpu, &value) == NVML_SUCCESS);
        sm_clock_ = gauge(r, "llmtrain_gpu_sm_clock_hertz", "SM clock.", nvml_.clock && nvml_.clock(device_, kNvmlClockSm, &value) == NVML_SUCCESS);
        const prometheus::Labels base = labels();
        if (nvml_.energy && nvml_.energy(device_, &big) == NVML_SUCCESS)
            energy_.counter = &prometheus::BuildCounter().Name("llmtrain_gpu_energy_joules_total").Help("Energy used by the GPU since the driver loaded.")
                                   .Labels(base).Register(r).Add({});
        if (nvml_.throttle && nvml_.throttle(device_, &big) == NVML_SUCCESS) {
            auto& family = prometheus::BuildGauge().Name("llmtrain_gpu_throttle_active").Help("1 while NVML reports this reason for lowered clocks.").Labels(base).Register(r);
            for (size_t i = 0; i < kThrottleReasons.size(); ++i) throttle_[i] = &family.Add({{"reason", kThrottleReasons[i]}});
        }
        if (nvml_.ecc && nvml_.ecc(device_, 0, kNvmlVolatileEcc, &big) == NVML_SUCCESS) {
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
            if (nvml_.register_events(device_, kNvmlXidCriticalError, events_) == NVML_SUCCESS) {
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
        if (temperature_ && nvml_.temperature(device_, kNvmlTemperatureGpu, &value) == NVML_SUCCESS) temperature_->Set(value);
        if (sm_clock_ && nvml_.clock(device_, kNvmlClockSm, &value) == NVML_SUCCESS) sm_clock_->Set(value * 1e6);  // MHz
        if (energy_.counter && nvml_.energy(device_, &big) == NVML_SUCCESS) energy_.follow(static_cast<double>(big) / 1e3);  // mJ
        if (throttle_[0] && nvml_.throttle(device_, &big) == NVML_SUCCESS)
            for (size_t i = 0; i < kThrottleReasons.size(); ++i) throttle_[i]->Set((big >> i) & 1);
        for (int type = 0; type < 2; ++type)
            if (ecc_[type].counter && nvml_.ecc(device_, type, kNvmlVolatileEcc, &big) == NVML_SUCCESS) ecc_[type].follow(static_cast<double>(big));
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

    std::unique_ptr<Nvml> library_;
    const NvmlApi& nvml_;
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
    std::unique_ptr<Nvml> nvml = Nvml::load(why_not);
    if (!nvml) return nullptr;
    const std::optional<nvmlDevice_t> device = nvml->device_of_local_rank(local_rank, why_not);
    if (!device) return nullptr;
    return std::make_unique<NvmlSampler>(std::move(nvml), *device, exporter, interval_seconds);
}

}  // namespace llmtrain
