#include "cli/run_metrics.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "cli/version.h"
#include "core/durable_file.h"
#include "core/log.h"
#include "parallel/mpi_comm.h"
#include "train/model_flops.h"

namespace llmtrain {

namespace {

constexpr int kHostChars = 64;

std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) return "unknown";
    return name;
}

bool serves_metrics(const MetricsConfig& metrics, int world_size) {
    return metrics.enabled == MetricsServe::on || (metrics.enabled == MetricsServe::automatic && world_size > 1);
}

// metrics.port + local rank, or a free port. Left at "auto", metrics must not stop a run:
// where that port is taken (a second job on the node, another service), the rank serves on a
// free one, says so, and the run directory's metrics_targets.json names it. `on` asked for
// exactly that port: a port in use is an error naming it.
void serve_metrics(MetricsExporter& exporter, const MetricsConfig& metrics, int local_rank) {
    const int port = metrics.port == 0 ? 0 : static_cast<int>(metrics.port) + local_rank;
    try {
        exporter.serve(metrics.listen, port);
    } catch (const Error& e) {
        if (metrics.enabled != MetricsServe::automatic || port == 0) throw;
        exporter.serve(metrics.listen, 0);
        log_warn(e.what(), "; metrics.enabled = \"auto\": serving on the free port ", exporter.port(), " instead");
    }
}

// "host:port" of every world rank, on every rank: one all-reduce of a table in which each
// rank fills its own row (the port, then the host name's bytes).
std::vector<std::string> gather_endpoints(Comm& world, int rank, const std::string& host, int port) {
    const int rows = world.size(), width = 1 + kHostChars;
    std::vector<int32_t> table(static_cast<size_t>(rows * width), 0);
    int32_t* mine = table.data() + static_cast<ptrdiff_t>(rank) * width;
    mine[0] = port;
    for (size_t i = 0; i < host.size() && i < kHostChars; ++i) mine[1 + i] = static_cast<unsigned char>(host[i]);
    world.all_reduce(Tensor(table.data(), DType::i32, {rows * width}), ReduceOp::sum);
    std::vector<std::string> endpoints;
    for (int r = 0; r < rows; ++r) {
        const int32_t* row = table.data() + static_cast<ptrdiff_t>(r) * width;
        std::string name;
        for (int i = 1; i < width && row[i] != 0; ++i) name += static_cast<char>(row[i]);
        endpoints.push_back(cat(name, ":", row[0]));
    }
    return endpoints;
}

}  // namespace

// Counts each committed checkpoint save of this rank once, after the step that committed it,
// and each failed save.
class RunMetrics::SaveCounter : public StepObserver {
public:
    SaveCounter(const Checkpointer& checkpointer, MetricsExporter& exporter) : checkpointer_(checkpointer), exporter_(exporter) {}
    void after_step(const StepRecord&) override { count_new_save(); }
    void count_new_save() {
        for (; counted_failures_ < checkpointer_.failed_saves(); ++counted_failures_) exporter_.checkpoint_failed();
        const std::optional<SaveReport>& save = checkpointer_.last_save();
        if (!save || save->step == counted_step_) return;
        counted_step_ = save->step;
        exporter_.checkpoint_saved(save->blocked_seconds, save->background_seconds, save->bytes);
        exporter_.restorable_state(save->step);
    }

private:
    const Checkpointer& checkpointer_;
    MetricsExporter& exporter_;
    int64_t counted_step_ = -1;
    int64_t counted_failures_ = 0;
};

RunMetrics::RunMetrics(Trainer& trainer, const Config& config, const std::string& job, const Checkpointer* checkpointer, LocalSnapshotter* snapshots)
    : config_(config), trainer_(trainer) {
    const ParallelContext& ctx = trainer.context();
    // Under a launcher a rank's stdout is the launcher's pseudo-terminal (Open MPI forwards
    // output through one whatever its own stdout is): no live line there.
    if (ctx.world_rank == 0 && stdout_is_terminal() && !launched_by_mpi()) {
        progress_.emplace(trainer.start_step(), config.train.steps);
        trainer.observe(*progress_);
    }
    if (!serves_metrics(config.metrics, ctx.mesh.world_size())) return;
    const MeshCoord at = ctx.coord();
    MetricsLabels labels{job, host_name(), ctx.world_rank, at[mesh_dim::tp], at[mesh_dim::dp], at[mesh_dim::pp], std::nullopt};
    if (config.train.device == ComputeDevice::cuda) labels.gpu = ctx.local_rank;
    MetricsRunFacts facts;
    facts.version = LLMTRAIN_VERSION;
    facts.commit = build_commit();
    facts.flops_per_token = model_flops_per_token(trainer.config(), total_parameters(trainer));
    facts.peak_tflops = config.metrics.peak_tflops > 0 ? config.metrics.peak_tflops : trainer.backend().peak_bf16_tflops();
    facts.world_size = ctx.mesh.world_size();
    facts.restarts = trainer.restarts();
    exporter_ = std::make_unique<MetricsExporter>(labels, facts);
    serve_metrics(*exporter_, config.metrics, ctx.local_rank);
    trainer.observe(*exporter_);
    if (checkpointer) {
        saves_ = std::make_unique<SaveCounter>(*checkpointer, *exporter_);
        trainer.observe(*saves_);
    }
    if (snapshots)
        snapshots->on_outcome([&exporter = *exporter_](const LocalSnapshotOutcome& o) {
            exporter.local_snapshot(o.complete, o.blocked_seconds, o.own_bytes, o.replica_bytes);
            if (o.complete) exporter.restorable_state(o.step);
        });
    std::string why_not;
    gpu_ = GpuSampler::start(*exporter_, ctx.local_rank, config.metrics.gpu_interval_seconds, why_not);
    if (!gpu_ && ctx.world_rank == 0) log_info("metrics: no GPU series: ", why_not);
}

RunMetrics::~RunMetrics() = default;

void RunMetrics::publish_endpoints(const std::string& run_dir) {
    if (!exporter_) return;
    const ParallelContext& ctx = trainer_.context();
    const std::vector<std::string> endpoints = gather_endpoints(*ctx.world, ctx.world_rank, host_name(), exporter_->port());
    if (run_dir.empty()) return;
    const nlohmann::json targets = nlohmann::json::array({{{"targets", endpoints}}});
    const std::string path = (std::filesystem::path(run_dir) / "metrics_targets.json").string();
    write_file_atomically(path, targets.dump(2) + "\n");
    std::string shown;
    for (size_t i = 0; i < endpoints.size() && i < 4; ++i) shown += cat(i ? ", " : "", endpoints[i]);
    if (endpoints.size() > 4) shown += cat(", ... (", endpoints.size(), " ranks)");
    log_info("metrics: /metrics on ", shown, " | Prometheus targets in ", path);
}

void RunMetrics::restart(int64_t steps_lost, const std::vector<std::pair<std::string, double>>& phases) {
    if (exporter_) exporter_->restart(steps_lost, phases);
}

void RunMetrics::finish() {
    if (!exporter_) return;
    if (saves_) saves_->count_new_save();
    if (config_.metrics.linger_seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(config_.metrics.linger_seconds));
}

}  // namespace llmtrain
