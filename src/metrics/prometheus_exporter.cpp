#include "metrics/prometheus_exporter.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"

// Stacks for the HTTP server's threads. glibc carves a thread's static TLS out of the stack it
// is given, and a CUDA build loads cuBLASLt (about 94 KB of static TLS) and OpenBLAS (60 KB) at
// start-up. The HTTP server asks for 100 KB stacks (a constant of its build), which then cannot
// even hold the TLS: pthread_create refuses (EINVAL) and the exporter does not start. So every
// caller in this process gets the stack it asked for plus the static TLS glibc will take from it.
namespace {
size_t static_tls_bytes() {
    size_t total = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* sum) {
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& h = info->dlpi_phdr[i];
                if (h.p_type == PT_TLS) *static_cast<size_t*>(sum) += h.p_memsz + h.p_align;
            }
            return 0;
        },
        &total);
    return total;
}
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_bytes) noexcept {
    using SetStackSize = int (*)(pthread_attr_t*, size_t);
    static const auto glibc = reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
    static const size_t tls = static_tls_bytes();
    return glibc(attr, stack_bytes + tls);
}

namespace llmtrain {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// The node exporter's process_* series, with the run's labels: CPU seconds (user + system,
// every thread) and the resident set, read when scraped.
double process_cpu_seconds() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double resident_memory_bytes() {
    long pages = 0, resident = 0;
    std::FILE* statm = std::fopen("/proc/self/statm", "r");
    if (!statm) return 0;
    const int read = std::fscanf(statm, "%ld %ld", &pages, &resident);
    std::fclose(statm);
    return read == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : 0;
}

// "0.0.0.0:9480", "[::]:9480": the listening_ports option of the HTTP server.
std::string listening_spec(const std::string& listen, int port) {
    return listen.find(':') != std::string::npos ? cat("[", listen, "]:", port) : cat(listen, ":", port);
}

// Why listen:port cannot be served: the system's words for a port that cannot be bound (the HTTP
// server does not say), else what the server said.
std::string bind_problem(const std::string& listen, int port, const std::string& server_error) {
    sockaddr_storage address{};
    socklen_t length = 0;
    int family = AF_INET;
    if (listen.find(':') != std::string::npos) {
        auto* a6 = reinterpret_cast<sockaddr_in6*>(&address);
        a6->sin6_family = family = AF_INET6;
        a6->sin6_port = htons(static_cast<uint16_t>(port));
        if (inet_pton(AF_INET6, listen.c_str(), &a6->sin6_addr) != 1) return "not an IPv6 address";
        length = sizeof(sockaddr_in6);
    } else {
        auto* a4 = reinterpret_cast<sockaddr_in*>(&address);
        a4->sin_family = AF_INET;
        a4->sin_port = htons(static_cast<uint16_t>(port));
        if (inet_pton(AF_INET, listen.c_str(), &a4->sin_addr) != 1) return "not an IPv4 address";
        length = sizeof(sockaddr_in);
    }
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::strerror(errno);
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0;
    const std::string why = bound ? cat("the HTTP server could not start on it (", server_error, ")") : std::string(std::strerror(errno));
    ::close(fd);
    return why;
}

double unix_time_seconds() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

class ProcessCollector : public prometheus::Collectable {
public:
    explicit ProcessCollector(std::vector<std::pair<std::string, std::string>> labels) {
        for (auto& [name, value] : labels) labels_.push_back({name, value});
    }
    std::vector<MetricFamily> Collect() const override {
        return {family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter, process_cpu_seconds()),
                family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge, resident_memory_bytes())};
    }

private:
    MetricFamily family(const std::string& name, const std::string& help, MetricType type, double value) const {
        ClientMetric metric;
        metric.label = labels_;
        if (type == MetricType::Counter) metric.counter.value = value;
        else metric.gauge.value = value;
        return MetricFamily{name, help, type, {metric}};
    }
    std::vector<ClientMetric::Label> labels_;
};

std::vector<std::pair<std::string, std::string>> MetricsLabels::as_pairs() const {
    std::vector<std::pair<std::string, std::string>> pairs = {{"job", job},
                                                              {"host", host},
                                                              {"rank", std::to_string(rank)},
                                                              {"tp", std::to_string(tp)},
                                                              {"dp", std::to_string(dp)},
                                                              {"pp", std::to_string(pp)}};
    if (gpu) pairs.emplace_back("gpu", std::to_string(*gpu));
    return pairs;
}

std::vector<double> step_duration_buckets() {
    std::vector<double> buckets;
    for (double decade = 0.01; decade < 150; decade *= 10)
        for (double m : {1.0, 2.5, 5.0}) buckets.push_back(decade * m);
    while (buckets.back() > 100) buckets.pop_back();
    return buckets;
}

namespace {
prometheus::Labels to_labels(const std::vector<std::pair<std::string, std::string>>& pairs) {
    prometheus::Labels labels;
    for (const auto& [name, value] : pairs) labels[name] = value;
    return labels;
}
}  // namespace

MetricsExporter::MetricsExporter(const MetricsLabels& labels, const MetricsRunFacts& facts)
    : labels_(labels.as_pairs()), rank_(labels.rank), facts_(facts), registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>(labels_)) {
    prometheus::Registry& r = *registry_;
    const prometheus::Labels constant = to_labels(labels_);
    const auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
        return prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(r).Add({});
    };
    const auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
        return prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(r).Add({});
    };
    prometheus::BuildGauge().Name("llmtrain_build_info").Help("Always 1; the version and commit of the llmtrain binary.").Labels(constant).Register(r)
        .Add({{"version", facts.version}, {"commit", facts.commit}}).Set(1);
    step_ = &gauge("llmtrain_step", "Optimizer steps completed (the step of the last record).");
    tokens_ = &counter("llmtrain_tokens_total", "Tokens trained on by the whole job since this process started.");
    samples_ = &counter("llmtrain_samples_total", "Sequences trained on by the whole job since this process started.");
    loss_ = &gauge("llmtrain_loss", "Training loss of the last step (nats per token, mean over the global batch).");
    val_loss_ = &gauge("llmtrain_validation_loss", "Validation loss of the last evaluation (nats per token).");
    grad_norm_ = &gauge("llmtrain_grad_norm", "Global gradient norm of the last step, before clipping.");
    lr_ = &gauge("llmtrain_learning_rate", "Learning rate of the last step.");
    loss_scale_ = &gauge("llmtrain_loss_scale", "Loss scale of the last step (1 unless fp16 dynamic loss scaling).");
    step_duration_ = &prometheus::BuildHistogram().Name("llmtrain_step_duration_seconds").Help("Wall time of optimizer steps.")
                          .Labels(constant).Register(r).Add({}, step_duration_buckets());
    tokens_per_second_ = &gauge("llmtrain_tokens_per_second", "Tokens per second of the whole job over the last step.");
    if (facts.peak_tflops > 0 && facts.flops_per_token > 0)
        mfu_ = &gauge("llmtrain_mfu_ratio", "Model FLOPs utilization of the last step per device (PaLM formula 6N + 12*L*H*Q*T over the peak).");
    moe_load_ = &prometheus::BuildGauge().Name("llmtrain_moe_load_max_over_mean")
                     .Help("Mixture of experts: the last step's most loaded expert's assignments over the mean expert's, by layer (1: balanced).")
                     .Labels(constant).Register(r);
    moe_dropped_ = &prometheus::BuildGauge().Name("llmtrain_moe_dropped_fraction")
                        .Help("Mixture of experts: the share of the last step's assignments a capacity dropped, by layer.").Labels(constant).Register(r);
    moe_balance_loss_ = &prometheus::BuildGauge().Name("llmtrain_moe_balance_loss")
                             .Help("Mixture of experts: the last step's load-balancing and z losses with their coefficients.").Labels(constant).Register(r);
    fp8_saturated_ = &prometheus::BuildCounter().Name("llmtrain_fp8_saturated_total")
                          .Help("FP8 training: elements the casts saturated at their format's largest value, over every rank's casts.").Labels(constant).Register(r);
    fp8_flushed_ = &prometheus::BuildCounter().Name("llmtrain_fp8_flushed_total")
                        .Help("FP8 training: nonzero elements the casts flushed to zero, over every rank's casts.").Labels(constant).Register(r);
    comm_family_ = &prometheus::BuildCounter().Name("llmtrain_communication_seconds_total")
                        .Help("Seconds this rank's step loop was blocked in communication, by group and op.").Labels(constant).Register(r);
    dp_bytes_ = &counter("llmtrain_dp_gradient_sent_bytes_total",
                         "Gradient bytes (1-bit Adam: compressed momentum bytes) this rank sent over its dp group.");
    data_wait_ = &counter("llmtrain_data_wait_seconds_total", "Seconds this rank's step loop waited for training batches.");
    ckpt_blocked_ = &counter("llmtrain_checkpoint_blocked_seconds_total", "Seconds the step loop was blocked by checkpoint saves (copy to host, synchronous writes).");
    ckpt_background_ = &counter("llmtrain_checkpoint_background_seconds_total", "Seconds the checkpoint writer thread spent writing this rank's files.");
    ckpt_bytes_ = &counter("llmtrain_checkpoint_written_bytes_total", "Bytes of checkpoint files written by this rank.");
    ckpt_saves_ = &counter("llmtrain_checkpoint_saves_total", "Checkpoints saved and committed.");
    ckpt_failures_ = &counter("llmtrain_checkpoint_failures_total", "Checkpoint saves that failed (written or committed on no rank: the newest checkpoint is older than hoped).");
    anomalies_ = &prometheus::BuildCounter().Name("llmtrain_anomalies_total").Help("Training anomalies seen by the health checks, by kind and the action taken.")
                      .Labels(constant).Register(r);
    corrupt_blocks_ = &counter("llmtrain_data_corrupt_blocks_total",
                               "Corrupt blocks of the training data skipped by the whole job since this process started (data.on_corrupt_block = \"skip\").");
    corrupt_tokens_ = &counter("llmtrain_data_corrupt_tokens_total", "Tokens of those blocks: training data not trained on.");
    replaced_samples_ = &counter("llmtrain_data_replaced_samples_total",
                                 "Training samples replaced by the whole job because they met a corrupt block (each replacement counted).");
    skipped_ = &counter("llmtrain_skipped_steps_total", "Optimizer steps whose update was skipped (non-finite values, fp16 overflow, health policy).");
    counter("llmtrain_restarts_total", "Times this run was resumed from a checkpoint.").Increment(static_cast<double>(facts.restarts));
    last_step_time_ = &gauge("llmtrain_last_step_timestamp_seconds", "Unix time at which the last step completed.");
    straggler_ = &gauge("llmtrain_straggler_score", "The fastest rank's median step compute time over this rank's (1: as fast as the fastest).");
    straggler_->Set(1);
    local_snapshots_ = &counter("llmtrain_local_snapshots_total", "Node-local snapshots completed (every rank's piece and its copies on other nodes stored).");
    local_failures_ = &counter("llmtrain_local_snapshot_failures_total", "Node-local snapshots that failed (training went on; the persistent checkpoints are untouched).");
    local_blocked_ = &counter("llmtrain_local_snapshot_blocked_seconds_total", "Seconds the step loop was blocked by local snapshots (the copy to host).");
    local_bytes_ = &counter("llmtrain_local_snapshot_written_bytes_total", "Bytes of this rank's own local snapshot files written to node-local storage.");
    local_replica_bytes_ = &counter("llmtrain_local_snapshot_replica_bytes_total", "Bytes of other nodes' ranks' snapshot copies this rank received and stored.");
    restorable_step_ = &gauge("llmtrain_restorable_step", "Step of the newest state a restart can resume from (committed checkpoint or complete local snapshot); -1: none yet.");
    restorable_step_->Set(-1);
    restorable_time_ = &gauge("llmtrain_restorable_timestamp_seconds",
                              "Unix time at which the newest restorable state became restorable (time() minus it: the age of what a failure now falls back to).");
    restorable_time_->SetToCurrentTime();
}

MetricsExporter::~MetricsExporter() = default;

namespace {
// The HTTP server's own words for why it did not start (it logs them, then fails).
thread_local std::string server_start_log;
int keep_server_message(const mg_connection*, const char* message) {
    if (!server_start_log.empty()) server_start_log += "; ";
    server_start_log += message;
    return 1;  // handled: nothing printed
}
}  // namespace

void MetricsExporter::serve(const std::string& listen, int port) {
    server_start_log.clear();
    try {
        // Few threads, a bounded request and a request timeout: a slow or malformed client
        // holds a thread for at most 10 s and is refused anything larger than 16 KB.
        static CivetCallbacks callbacks = [] {
            CivetCallbacks c;
            c.log_message = keep_server_message;
            return c;
        }();
        exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{"listening_ports", listening_spec(listen, port), "num_threads", "4",
                                                                                  "request_timeout_ms", "10000", "max_request_size", "16384"},
                                                         &callbacks);
    } catch (const std::exception& e) {
        fail(ErrorKind::config, "metrics.port: cannot serve /metrics on ", listening_spec(listen, port), " (metrics.listen = \"", listen,
             "\", metrics.port + local rank): ", bind_problem(listen, port, server_start_log.empty() ? e.what() : server_start_log),
             port ? "; choose another metrics.port, or 0 for a free one" : "");
    }
    exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(process_);
    const std::vector<int> ports = exposer_->GetListeningPorts();
    port_ = ports.empty() ? port : ports.front();
}

prometheus::Counter& MetricsExporter::comm_counter(const CommTime& t) {
    const auto key = std::make_pair(t.group, t.op);
    const auto found = comm_.find(key);
    if (found != comm_.end()) return *found->second;
    prometheus::Counter& counter = comm_family_->Add({{"group", t.group}, {"op", t.op}});
    comm_.emplace(key, &counter);
    return counter;
}

void MetricsExporter::after_step(const StepRecord& s) {
    step_->Set(static_cast<double>(s.step));
    tokens_->Increment(static_cast<double>(s.tokens));
    samples_->Increment(static_cast<double>(s.sequences));
    loss_->Set(s.loss);
    grad_norm_->Set(s.grad_norm);
    dp_bytes_->Increment(static_cast<double>(s.dp_bytes_sent));
    lr_->Set(s.lr);
    loss_scale_->Set(s.loss_scale);
    step_duration_->Observe(s.step_seconds);
    tokens_per_second_->Set(s.tokens_per_second);
    // MFU per device: the job's model FLOP/s shared by its devices, over one device's peak.
    if (mfu_) mfu_->Set(s.tokens_per_second * facts_.flops_per_token / facts_.world_size / (facts_.peak_tflops * 1e12));
    for (const CommTime& t : s.rank.comm) comm_counter(t).Increment(t.seconds);
    data_wait_->Increment(s.rank.data_wait_seconds);
    if (s.skipped) skipped_->Increment();
    replaced_samples_->Increment(static_cast<double>(s.samples_replaced));
    if (static_cast<size_t>(rank_) < s.straggler_scores.size()) straggler_->Set(s.straggler_scores[static_cast<size_t>(rank_)]);
    for (const MoeLayerRecord& l : s.moe) {
        moe_load_->Add({{"layer", std::to_string(l.layer)}}).Set(l.load_max_over_mean);
        moe_dropped_->Add({{"layer", std::to_string(l.layer)}}).Set(l.dropped_fraction);
    }
    if (!s.moe.empty()) moe_balance_loss_->Add({}).Set(s.balance_loss);
    if (s.fp8) {
        fp8_saturated_->Add({}).Increment(s.fp8_saturated);
        fp8_flushed_->Add({}).Increment(s.fp8_flushed);
    }
    last_step_time_->Set(unix_time_seconds());
}

void MetricsExporter::after_eval(const EvalRecord& e) { val_loss_->Set(e.val_loss); }

void MetricsExporter::after_anomaly(const AnomalyRecord& a) { anomalies_->Add({{"kind", a.kind}, {"action", a.action}}).Increment(); }

void MetricsExporter::after_corrupt_block(const CorruptBlockRecord& c) {
    corrupt_blocks_->Increment();
    corrupt_tokens_->Increment(static_cast<double>(c.tokens));
}

void MetricsExporter::checkpoint_saved(double blocked_seconds, double background_seconds, uint64_t bytes) {
    ckpt_blocked_->Increment(blocked_seconds);
    ckpt_background_->Increment(background_seconds);
    ckpt_bytes_->Increment(static_cast<double>(bytes));
    ckpt_saves_->Increment();
}

void MetricsExporter::checkpoint_failed() { ckpt_failures_->Increment(); }

void MetricsExporter::local_snapshot(bool complete, double blocked_seconds, uint64_t own_bytes, uint64_t replica_bytes) {
    local_blocked_->Increment(blocked_seconds);
    if (!complete) return local_failures_->Increment();
    local_snapshots_->Increment();
    local_bytes_->Increment(static_cast<double>(own_bytes));
    local_replica_bytes_->Increment(static_cast<double>(replica_bytes));
}

void MetricsExporter::restorable_state(int64_t step) {
    if (static_cast<double>(step) < restorable_step_->Value()) return;  // an older save completing late
    restorable_step_->Set(static_cast<double>(step));
    restorable_time_->SetToCurrentTime();
}

// Registered once, by the one restart a process makes.
void MetricsExporter::restart(int64_t steps_lost, const std::vector<std::pair<std::string, double>>& phases) {
    const prometheus::Labels constant = to_labels(labels_);
    if (steps_lost >= 0)
        prometheus::BuildGauge().Name("llmtrain_restart_steps_lost")
            .Help("Steps trained before the last failure that this process had to train again (the restart's lost work; rank 0, which reads the run's log).")
            .Labels(constant).Register(*registry_).Add({}).Set(static_cast<double>(steps_lost));
    auto& family = prometheus::BuildGauge().Name("llmtrain_restart_phase_seconds")
                       .Help("Seconds of this process's restart by phase: launch (process start to MPI ready), communicators, load, first_step.")
                       .Labels(constant).Register(*registry_);
    for (const auto& [phase, seconds] : phases) family.Add({{"phase", phase}}).Set(seconds);
}

std::string MetricsExporter::exposition() const {
    std::vector<MetricFamily> families = registry_->Collect();
    for (MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
    return prometheus::TextSerializer().Serialize(families);
}

}  // namespace llmtrain
