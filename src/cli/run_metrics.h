// What a training run shows while it runs, besides its log lines: this rank's Prometheus
// exporter (metrics.enabled) with its GPU sampler and the checkpoint saves it counts, and on
// rank 0's terminal the progress line. Every rank makes one, in the same order (the exporter's
// set-up holds two small collectives).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/local_snapshots.h"
#include "config/config.h"
#include "metrics/gpu_metrics.h"
#include "metrics/progress.h"
#include "metrics/prometheus_exporter.h"
#include "train/trainer.h"

namespace llmtrain {

class RunMetrics {
public:
    // Starts serving (a port that cannot be bound is Error(config)) and registers the
    // observers with the trainer. job: the run's name; checkpointer: null without checkpoints.
    // snapshots: null without local snapshots.
    RunMetrics(Trainer& trainer, const Config& config, const std::string& job, const Checkpointer* checkpointer, LocalSnapshotter* snapshots = nullptr);
    ~RunMetrics();
    // Rank 0, once the run directory exists: every rank's endpoint, logged and written to
    // <run_dir>/metrics_targets.json (Prometheus file_sd). A collective: every rank calls it.
    void publish_endpoints(const std::string& run_dir);
    // The run is over: the last checkpoint save is counted, and /metrics is served
    // metrics.linger_seconds longer for a last scrape.
    void finish();
    // This process resumed a run: the steps lost (rank 0; -1 elsewhere: not exported) and the
    // restart's phases in seconds.
    void restart(int64_t steps_lost, const std::vector<std::pair<std::string, double>>& phases);

private:
    class SaveCounter;
    const Config& config_;
    Trainer& trainer_;
    std::unique_ptr<MetricsExporter> exporter_;
    std::unique_ptr<GpuSampler> gpu_;
    std::unique_ptr<SaveCounter> saves_;
    std::optional<ProgressLine> progress_;
};

}  // namespace llmtrain
