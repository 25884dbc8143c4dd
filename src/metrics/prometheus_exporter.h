// Prometheus exposition of one rank: every rank serves GET /metrics (text format 0.0.4)
// through prometheus-cpp's exposer on its own threads; the step loop only updates atomic
// values after each step, so a slow or hostile client never holds training up.
//
// Every series carries the run's constant labels (job = run name, rank, tp, dp, pp, host,
// and gpu on CUDA runs) and nothing of higher cardinality: the only other labels are the
// communication group and op, the anomaly kind and action, and on GPU series the NVML
// throttle reason, NVLink link and ECC error type. Names follow Prometheus' conventions:
// base units, `_total` for counters, ratios in 0..1.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/step_record.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace llmtrain {

struct MetricsLabels {
    std::string job;            // the run's name
    std::string host;
    int rank = 0, tp = 0, dp = 0, pp = 0;  // world rank and mesh coordinates
    std::optional<int> gpu;     // the GPU this rank computes on (CUDA runs)
    std::vector<std::pair<std::string, std::string>> as_pairs() const;
};

struct MetricsRunFacts {
    std::string version, commit;
    double flops_per_token = 0;   // PaLM: 6N + 12*L*H*Q*T over the whole model
    double peak_tflops = 0;       // per device, in the compute dtype; 0: unknown, no MFU series
    int world_size = 1;           // devices the job's tokens/s is shared by
    int64_t restarts = 0;         // resumes from a checkpoint before this process
};

class ProcessCollector;

class MetricsExporter : public StepObserver {
public:
    MetricsExporter(const MetricsLabels& labels, const MetricsRunFacts& facts);
    ~MetricsExporter() override;
    MetricsExporter(const MetricsExporter&) = delete;
    MetricsExporter& operator=(const MetricsExporter&) = delete;

    // Starts serving http://listen:port/metrics (port 0: one the system picks). A port in use
    // or an address that cannot be bound is Error(config) naming metrics.listen / metrics.port.
    void serve(const std::string& listen, int port);
    // The port served (after serve()).
    int port() const { return port_; }

    void after_step(const StepRecord& s) override;
    void after_eval(const EvalRecord& e) override;
    void after_anomaly(const AnomalyRecord& a) override;
    void after_corrupt_block(const CorruptBlockRecord& c) override;
    // A save of this rank's checkpoint file completed.
    void checkpoint_saved(double blocked_seconds, double background_seconds, uint64_t bytes);
    // A save failed (the same verdict on every rank: each rank's series counts it).
    void checkpoint_failed();
    // A node-local snapshot completed (or failed: complete = false) on every rank.
    void local_snapshot(bool complete, double blocked_seconds, uint64_t own_bytes, uint64_t replica_bytes);
    // The newest state a restart could resume from is now the one after `step` (a committed
    // checkpoint or a complete local snapshot), as of now.
    void restorable_state(int64_t step);
    // This process's restart: the steps the failure cost, and its phases in seconds
    // ("launch", "communicators", "load", "first_step").
    void restart(int64_t steps_lost, const std::vector<std::pair<std::string, double>>& phases);

    // What GET /metrics returns now (tests, and the cost measurement).
    std::string exposition() const;
    // For collectors of other series (the GPU sampler); the labels to put on them.
    prometheus::Registry& registry() { return *registry_; }
    const std::vector<std::pair<std::string, std::string>>& constant_labels() const { return labels_; }

private:
    prometheus::Counter& comm_counter(const CommTime& t);

    std::vector<std::pair<std::string, std::string>> labels_;
    int rank_;
    MetricsRunFacts facts_;
    std::shared_ptr<prometheus::Registry> registry_;
    std::shared_ptr<ProcessCollector> process_;
    std::unique_ptr<prometheus::Exposer> exposer_;
    int port_ = 0;

    prometheus::Gauge *step_, *loss_, *val_loss_, *grad_norm_, *lr_, *loss_scale_, *tokens_per_second_, *mfu_ = nullptr;
    prometheus::Gauge *last_step_time_, *straggler_, *restorable_step_, *restorable_time_;
    prometheus::Counter *local_snapshots_, *local_failures_, *local_blocked_, *local_bytes_, *local_replica_bytes_;
    prometheus::Counter *corrupt_blocks_, *corrupt_tokens_, *replaced_samples_;
    prometheus::Counter *tokens_, *samples_, *skipped_, *dp_bytes_, *data_wait_, *ckpt_blocked_, *ckpt_background_, *ckpt_bytes_, *ckpt_saves_, *ckpt_failures_;
    prometheus::Histogram* step_duration_;
    prometheus::Family<prometheus::Counter>* comm_family_;
    prometheus::Family<prometheus::Counter>* anomalies_;
    prometheus::Family<prometheus::Gauge>* moe_load_;     // by layer
    prometheus::Family<prometheus::Gauge>* moe_dropped_;  // by layer
    prometheus::Family<prometheus::Gauge>* moe_balance_loss_;  // one child, made by the first MoE step
    prometheus::Family<prometheus::Counter>* fp8_saturated_;   // one child each, made by the first FP8 step
    prometheus::Family<prometheus::Counter>* fp8_flushed_;
    std::map<std::pair<std::string, std::string>, prometheus::Counter*> comm_;
};

// Step-duration buckets for steps of 10 ms to 100 s: 1, 2.5, 5 per decade.
std::vector<double> step_duration_buckets();

}  // namespace llmtrain
