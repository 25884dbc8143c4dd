// The metrics layer: what /metrics says after given steps, the straggler score, the
// progress line, communication timing, and the metrics keys of the config.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <sys/socket.h>
#include <netinet/in.h>
#include <thread>
#include <unistd.h>

#include "checkpoint/manifest.h"
#include "config/config.h"
#include "core/error.h"
#include "metrics/progress.h"
#include "metrics/prometheus_exporter.h"
#include "metrics/straggler.h"
#include "parallel/timed_comm.h"

using namespace llmtrain;

namespace {

MetricsLabels labels() { return {"run-a", "node7", 3, 1, 1, 0, std::nullopt}; }

StepRecord step(int64_t n, double loss, double seconds) {
    StepRecord s;
    s.step = n, s.loss = loss, s.step_seconds = seconds, s.tokens = 4096, s.sequences = 8, s.lr = 1e-3, s.grad_norm = 0.5;
    s.tokens_per_second = 4096 / seconds;
    return s;
}

// The value of the one sample of `name` with these extra labels, as the exposition prints it.
std::string sample(const std::string& text, const std::string& name, const std::string& extra_labels = "") {
    const std::regex line("\n" + name + "\\{([^}]*)\\} ([^\n]+)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it)
        if (extra_labels.empty() || (*it)[1].str().find(extra_labels) != std::string::npos) return (*it)[2].str();
    return "absent";
}

}  // namespace

TEST(MetricsExporter, StepHistogramTokensAndLossFollowTheSteps) {
    MetricsExporter exporter(labels(), {});
    exporter.after_step(step(1, 5.5, 0.02));
    exporter.after_step(step(2, 5.25, 0.3));
    exporter.after_step(step(3, 4.75, 7.0));
    const std::string text = exporter.exposition();
    EXPECT_EQ(sample(text, "llmtrain_step_duration_seconds_count"), "3");
    EXPECT_EQ(sample(text, "llmtrain_step_duration_seconds_bucket", "le=\"0.025\""), "1");
    EXPECT_EQ(sample(text, "llmtrain_step_duration_seconds_bucket", "le=\"0.5\""), "2");
    EXPECT_EQ(sample(text, "llmtrain_tokens_total"), "12288");
    EXPECT_EQ(sample(text, "llmtrain_samples_total"), "24");
    EXPECT_EQ(sample(text, "llmtrain_loss"), "4.75");
    EXPECT_EQ(sample(text, "llmtrain_step"), "3");
    // Every series carries the run's labels.
    EXPECT_NE(text.find("llmtrain_loss{dp=\"1\",host=\"node7\",job=\"run-a\",pp=\"0\",rank=\"3\",tp=\"1\"}"), std::string::npos) << text;
    EXPECT_EQ(sample(text, "llmtrain_mfu_ratio"), "absent");  // no peak known
}

TEST(MetricsExporter, CommunicationAnomaliesAndCheckpointsAreCounted) {
    MetricsExporter exporter(labels(), {});
    StepRecord s = step(1, 5, 0.1);
    s.rank.comm = {{"dp", "reduce_scatter", 0.25}, {"tp", "all_reduce", 0.5}};
    s.rank.data_wait_seconds = 0.125;
    exporter.after_step(s);
    exporter.after_step(s);
    exporter.after_anomaly({2, "loss_spike", "skip", 7.5, 6, ""});
    exporter.checkpoint_saved(0.5, 2.0, 1000);
    const std::string text = exporter.exposition();
    EXPECT_EQ(sample(text, "llmtrain_communication_seconds_total", "group=\"dp\",op=\"reduce_scatter\""), "0.5");
    EXPECT_EQ(sample(text, "llmtrain_communication_seconds_total", "group=\"tp\",op=\"all_reduce\""), "1");
    EXPECT_EQ(sample(text, "llmtrain_data_wait_seconds_total"), "0.25");
    EXPECT_EQ(sample(text, "llmtrain_anomalies_total", "action=\"skip\",kind=\"loss_spike\""), "1");
    EXPECT_EQ(sample(text, "llmtrain_checkpoint_blocked_seconds_total"), "0.5");
    EXPECT_EQ(sample(text, "llmtrain_checkpoint_background_seconds_total"), "2");
    EXPECT_EQ(sample(text, "llmtrain_checkpoint_written_bytes_total"), "1000");
}

TEST(MetricsExporter, LocalSnapshotsAndTheNewestRestorableStateAreExported) {
    MetricsExporter exporter(labels(), {});
    EXPECT_EQ(sample(exporter.exposition(), "llmtrain_restorable_step"), "-1");
    exporter.local_snapshot(true, 0.25, 1000, 3000);
    exporter.restorable_state(10);
    exporter.local_snapshot(false, 0.5, 0, 0);
    exporter.restorable_state(6);  // a persistent save of an older step committing later changes nothing
    const std::string text = exporter.exposition();
    EXPECT_EQ(sample(text, "llmtrain_local_snapshots_total"), "1");
    EXPECT_EQ(sample(text, "llmtrain_local_snapshot_failures_total"), "1");
    EXPECT_EQ(sample(text, "llmtrain_local_snapshot_blocked_seconds_total"), "0.75");
    EXPECT_EQ(sample(text, "llmtrain_local_snapshot_written_bytes_total"), "1000");
    EXPECT_EQ(sample(text, "llmtrain_local_snapshot_replica_bytes_total"), "3000");
    EXPECT_EQ(sample(text, "llmtrain_restorable_step"), "10");
    EXPECT_GT(std::stod(sample(text, "llmtrain_restorable_timestamp_seconds")), 1.7e9);
}

TEST(MetricsExporter, RestartPhasesAndLostStepsAreExportedOnce) {
    MetricsExporter exporter(labels(), {});
    EXPECT_EQ(sample(exporter.exposition(), "llmtrain_restart_steps_lost"), "absent");
    exporter.restart(2, {{"launch", 1.5}, {"communicators", 0.25}, {"load", 3}, {"first_step", 0.5}});
    const std::string text = exporter.exposition();
    EXPECT_EQ(sample(text, "llmtrain_restart_steps_lost"), "2");
    EXPECT_EQ(sample(text, "llmtrain_restart_phase_seconds", "phase=\"launch\""), "1.5");
    EXPECT_EQ(sample(text, "llmtrain_restart_phase_seconds", "phase=\"load\""), "3");
    MetricsExporter other_rank(labels(), {});
    other_rank.restart(-1, {{"launch", 1}});  // only rank 0 knows the lost steps
    EXPECT_EQ(sample(other_rank.exposition(), "llmtrain_restart_steps_lost"), "absent");
}

TEST(MetricsExporter, MfuIsPalmFlopsPerDeviceOverPeak) {
    MetricsRunFacts facts;
    facts.flops_per_token = 1e9, facts.peak_tflops = 100, facts.world_size = 4, facts.restarts = 2;
    MetricsExporter exporter(labels(), facts);
    StepRecord s = step(1, 5, 0.1);
    s.tokens_per_second = 200000;  // 2e14 FLOP/s over 4 devices = 5e13 each, half of 1e14
    s.straggler_scores = {1, 1, 1, 0.5};
    exporter.after_step(s);
    const std::string text = exporter.exposition();
    EXPECT_EQ(sample(text, "llmtrain_mfu_ratio"), "0.5");
    EXPECT_EQ(sample(text, "llmtrain_restarts_total"), "2");
    EXPECT_EQ(sample(text, "llmtrain_straggler_score"), "0.5");  // rank 3's
}

TEST(MetricsExporter, PortInUseIsAConfigErrorNamingThePort) {
    const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ASSERT_EQ(::listen(taken, 1), 0);
    socklen_t length = sizeof address;
    ::getsockname(taken, reinterpret_cast<sockaddr*>(&address), &length);
    const int port = ntohs(address.sin_port);
    MetricsExporter exporter(labels(), {});
    try {
        exporter.serve("127.0.0.1", port);
        FAIL() << "served on a port in use";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("metrics.port: cannot serve /metrics on 127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
    }
    ::close(taken);
    MetricsExporter free_port(labels(), {});
    free_port.serve("127.0.0.1", 0);
    EXPECT_GT(free_port.port(), 0);
}

TEST(StepDurationBuckets, Span10MillisecondsTo100Seconds) {
    const std::vector<double> b = step_duration_buckets();
    EXPECT_DOUBLE_EQ(b.front(), 0.01);
    EXPECT_DOUBLE_EQ(b.back(), 100);
    EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

TEST(Straggler, MedianOfTheWindowAndScoreAgainstTheFastest) {
    ComputeTimeWindow window(4);
    for (double t : {9.0, 1.0, 2.0, 3.0, 100.0}) window.add(t);  // 9 falls out; 100 is one slow step
    EXPECT_DOUBLE_EQ(window.median(), 2.5);
    const std::vector<double> scores = straggler_scores({2.0, 4.0, 0.0, 2.5});
    EXPECT_DOUBLE_EQ(scores[0], 1.0);
    EXPECT_DOUBLE_EQ(scores[1], 0.5);
    EXPECT_DOUBLE_EQ(scores[2], 1.0);  // no time yet
    EXPECT_DOUBLE_EQ(scores[3], 0.8);
}

TEST(ProgressLine, SaysStepTokensLossSpeedAndEta) {
    EXPECT_EQ(short_count(812), "812");
    EXPECT_EQ(short_count(25300), "25.3K");
    EXPECT_EQ(short_count(1.97e6), "1.97M");
    EXPECT_EQ(short_duration(151), "2m31s");
    EXPECT_EQ(short_duration(3840), "1h04m");
    ProgressLine progress(0, 500);
    StepRecord s = step(120, 3.21014, 0.5);
    s.tokens_per_second = 25300;
    EXPECT_EQ(progress.text(s, 0.4), "step 120/500 | 0 tokens | loss 3.2101 | 25.3K tok/s | ETA 2m32s");
}

namespace {
// A group whose operations take a known time: 20 ms to start, 30 ms more to wait for.
class SlowComm : public Comm {
public:
    int rank() const override { return 0; }
    int size() const override { return 2; }
    int world_rank(int r) const override { return r; }
    const std::string& name() const override { return name_; }
    CommHandle all_reduce_async(const Tensor&, ReduceOp) override {
        nap(20);
        return CommHandle(std::make_unique<SlowRequest>());
    }
    CommHandle reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return {}; }
    CommHandle all_gather_async(const Tensor&) override { return {}; }
    CommHandle all_to_all_async(const Tensor&, const Tensor&) override { return {}; }
    CommHandle send_async(const Tensor&, int) override { return {}; }
    void recv(const Tensor&, int) override { nap(10); }
    void broadcast(const Tensor&, int) override {}
    void barrier() override {}

private:
    struct SlowRequest : CommRequest {
        void wait() override { nap(30); }
    };
    static void nap(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
    std::string name_ = "dp";
};
}  // namespace

TEST(TimedComm, AddsCallAndWaitTimePerGroupAndOp) {
    CommTimes times;
    std::unique_ptr<Comm> comm = make_timed_comm(std::make_unique<SlowComm>(), times);
    double x = 0;
    comm->all_reduce(Tensor(&x, DType::f64, {1}), ReduceOp::sum);
    comm->recv(Tensor(&x, DType::f64, {1}), 1);
    ASSERT_EQ(times.groups().size(), 1u);
    EXPECT_EQ(times.groups()[0].name, "dp");
    const double all_reduce = times.groups()[0].seconds[static_cast<size_t>(CommOp::all_reduce)];
    const double recv = times.groups()[0].seconds[static_cast<size_t>(CommOp::recv)];
    EXPECT_GE(all_reduce, 0.050);
    EXPECT_LT(all_reduce, 0.5);
    EXPECT_GE(recv, 0.010);
    EXPECT_DOUBLE_EQ(times.total_seconds(), all_reduce + recv);
}

TEST(MetricsConfig, ListenMustBeAnAddressAndEnabledAChoice) {
    const std::string base = "[model]\nfamily = \"gpt2\"\nn_layers = 1\nd_model = 32\nn_heads = 2\nvocab_size = 257\nmax_seq_len = 16\n"
                             "[data]\ntrain_path = \"x.txt\"\n[train]\nsteps = 1\nbatch_size = 1\nseq_len = 16\n[optimizer]\nlr = 1e-3\n";
    const Config ok = parse_config(base, "t.toml", {"metrics.listen=\"::1\"", "metrics.enabled=\"on\"", "metrics.port=0"}, DataFiles::unchecked);
    EXPECT_EQ(ok.metrics.enabled, MetricsServe::on);
    EXPECT_EQ(ok.metrics.port, 0);
    EXPECT_EQ(parse_config(base, "t.toml", {}, DataFiles::unchecked).metrics.enabled, MetricsServe::automatic);
    try {
        parse_config(base, "t.toml", {"metrics.listen=\"my-host\""}, DataFiles::unchecked);
        FAIL() << "a host name was taken for an address";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("metrics.listen: \"my-host\" is not an IPv4 or IPv6 address"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parse_config(base, "t.toml", {"metrics.enabled=true"}, DataFiles::unchecked), Error);
}

TEST(Manifest, ResumesRoundTripAndDefaultToZero) {
    Manifest m;
    m.resumes = 4;
    m.files = {{"rank_00000.h5", 1, 2}};
    const std::string json = manifest_to_json(m);
    EXPECT_EQ(manifest_from_json(json, "m.json").resumes, 4);
    // A manifest of an earlier version: format 1, without the count (nor a checksum of its own).
    std::string older = std::regex_replace(json, std::regex("\\s*\"resumes\": 4,"), "");
    older = std::regex_replace(older, std::regex(",\\s*\"manifest_xxh64\": \"[0-9a-f]+\""), "");
    older = std::regex_replace(older, std::regex("\"version\": 3"), "\"version\": 1");
    ASSERT_EQ(older.find("resumes"), std::string::npos);
    EXPECT_EQ(manifest_from_json(older, "m.json").resumes, 0);
}

// The exporter's cost in the step loop: after_step with four communication entries, and a
// scrape's serialization (on the exporter's thread, not the step loop's).
TEST(MetricsExporter, AfterStepCostsMicrosecondsNotMilliseconds) {
    MetricsExporter exporter(labels(), {});
    StepRecord s = step(1, 5, 0.1);
    s.rank.comm = {{"dp", "reduce_scatter", 0.1}, {"dp", "all_gather", 0.1}, {"tp", "all_reduce", 0.1}, {"world", "all_reduce", 0.1}};
    constexpr int steps = 20000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) exporter.after_step(s);
    const double per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
    const auto scrape_start = std::chrono::steady_clock::now();
    const size_t bytes = exporter.exposition().size();
    const double scrape = std::chrono::duration<double>(std::chrono::steady_clock::now() - scrape_start).count();
    std::printf("after_step: %.2f us per step; one scrape: %.0f us, %zu bytes\n", per_step * 1e6, scrape * 1e6, bytes);
    EXPECT_LT(per_step, 50e-6);
}

// A TOML boolean where the choices are strings means the one it names: true is "on", false
// "off" (the key stays a string for "auto"); another type is still refused.
TEST(MetricsConfig, EnabledTrueOrFalse_MeansOnOrOff) {
    const std::string base = "[model]\nfamily = \"gpt2\"\nn_layers = 1\nd_model = 32\nn_heads = 2\nvocab_size = 257\nmax_seq_len = 16\n"
                             "[data]\ntrain_path = \"x.txt\"\n[train]\nsteps = 1\nbatch_size = 1\nseq_len = 16\n[optimizer]\nlr = 1e-3\n";
    const auto enabled = [&](const std::string& value) { return parse_config(base + "[metrics]\nenabled = " + value + "\n", "t.toml", {}, DataFiles::unchecked).metrics.enabled; };
    EXPECT_EQ(enabled("true"), MetricsServe::on);
    EXPECT_EQ(enabled("false"), MetricsServe::off);
    EXPECT_EQ(enabled("\"auto\""), MetricsServe::automatic);
    try {
        enabled("1");
        FAIL() << "metrics.enabled = 1 was taken";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("metrics.enabled"), std::string::npos) << e.what();
    }
}
