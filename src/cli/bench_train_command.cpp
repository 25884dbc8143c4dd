// `llmtrain bench CONFIG`: training throughput of a config on synthetic tokens, on the
// configured device, without its data files. Warm-up steps first (plans, workspaces), then
// timed steps with the per-op events off, then one profiled step for where the time goes.
//
// MFU follows PaLM (ops/step_model.h, model_flops_per_token, the plan's formula too): model
// FLOPs per token 6 N + 12 L H Q T, times tokens per second, over the chip's dense bf16 peak.
//
// --calibration-out FILE (with --cluster) turns the measurement into the plan's calibration:
// the step's time split by the profiled step's shares (GEMMs, attention, the rest) over the
// work the plan's model counts for this rank (ops/step_model.h) gives the GEMM efficiency of
// the step's main shape class, the attention efficiency and the memory-bound efficiency.
// Measure on one rank, so that no communication hides in the step time.
//
// --json prints one object instead of the tables: the figures above, and where the step's
// time went besides computing, as scripts/scaling-test.sh compares them across sizes: each
// group's exposed communication (the time ranks were blocked in its collectives, summed over
// the ranks, over their summed step time: parallel/timed_comm.h), the data wait and the
// pipeline schedule's bubble.
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "backend/backend.h"
#include "cli/commands.h"
#include "config/config.h"
#include "core/log.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/timed_comm.h"
#include "plan/cluster.h"
#include "plan/memory_plan.h"
#include "plan/step_model.h"
#include "train/model_flops.h"
#include "train/trainer.h"

namespace llmtrain {

namespace {

struct BenchTrainArgs {
    std::string config_path;
    std::vector<std::string> overrides;
    int warmup = 3;
    int steps = 10;
    double peak_tflops = 0;  // 0: the device's known peak
    int top_ops = 12;
    std::string cluster_path;      // for --calibration-out: the peak and bandwidth efficiencies are shares of;
                                   // for MFU, the peak of the device it describes
    std::string calibration_path;  // written (merged) here
    bool json = false;
};

GemmClass dominant_class(const StageWork& work) {
    GemmClass best = GemmClass::medium;
    double most = -1;
    for (const auto& [c, flops] : work.gemm_flops)
        if (flops > most) best = c, most = flops;
    return best;
}

// The measured step against the plan's count of this rank's work (stage 0's).
ComputeCalibration calibrate(const Config& config, const Mesh& mesh, const Cluster& cluster, const OpProfile& profile, double step_seconds) {
    const StageWork work = stage_work(config, mesh, 0);
    const double m = static_cast<double>(micro_batches_per_step(config, mesh.dp()));
    const DeviceShare share = device_share(config, mesh, cluster);
    const double peak = cluster.peak_tflops * 1e12 * share.pipeline, bandwidth = cluster.memory_bandwidth_gbps * 1e9;
    // FP8 linears (train.precision = "fp8"): their GEMMs apart from the compute dtype's, their
    // casts with the other memory-bound ops.
    const double fp8 = profile.seconds[static_cast<size_t>(Op::matmul_fp8)];
    const double total = profile.total_seconds(), gemm = profile.gemm_seconds() - fp8;
    const double attention = profile.seconds[static_cast<size_t>(Op::attention_fwd)] + profile.seconds[static_cast<size_t>(Op::attention_bwd)];
    const double update = profile.seconds[static_cast<size_t>(Op::adamw)];
    // The passes over every gradient: zeroing them and the norm's sum of squares.
    const double passes = profile.seconds[static_cast<size_t>(Op::fill_zero)] + profile.seconds[static_cast<size_t>(Op::sum_squares)] +
                          profile.seconds[static_cast<size_t>(Op::accumulate_sum_squares)];
    const double rest = total - gemm - fp8 - attention - update - passes;
    if (total <= 0 || gemm <= 0 || attention <= 0 || update <= 0 || passes <= 0 || rest <= 0)
        fail(ErrorKind::runtime, "bench: the profiled step timed no GEMM, attention, AdamW, gradient pass or other op; cannot calibrate");
    ComputeCalibration c;
    c.gemm_class = dominant_class(work);
    c.gemm_efficiency = m * work.total_gemm_flops() / (step_seconds * gemm / total * peak);
    c.attention_efficiency = m * work.attention_flops / (step_seconds * attention / total * peak);
    // The micro-batches' memory-bound ops run at the pipeline's share of the core; AdamW's
    // update and the passes over every gradient (zeroing, the norm) at the step end's, each
    // measured on its own.
    c.memory_efficiency = (m * (work.memory_bytes + work.fp8_cast_bytes) + work.fp8_weight_cast_bytes) / share.pipeline / (step_seconds * rest / total * bandwidth);
    if (fp8 > 0 && cluster.fp8_peak_tflops > 0)
        c.fp8_gemm_efficiency = m * work.total_fp8_gemm_flops() / (step_seconds * fp8 / total * cluster.fp8_peak_tflops * 1e12 * share.pipeline);
    c.optimizer_efficiency = work.update_bytes / share.step_end / (step_seconds * update / total * bandwidth);
    c.gradient_pass_efficiency = work.gradient_pass_bytes / share.step_end / (step_seconds * passes / total * bandwidth);
    // A share of peak above one says the cluster file's peak is below what this device just
    // did: writing it would only make `plan` refuse the calibration later.
    if (c.fp8_gemm_efficiency > 1)
        fail(ErrorKind::config, cluster.source_path, ": device.fp8_peak_tflops: ", cluster.fp8_peak_tflops, " TFLOP/s is below what the FP8 GEMMs reached here (",
             c.fp8_gemm_efficiency, " times it); give the device's true FP8 peak; no calibration written");
    for (const auto& [what, share_of_peak] : {std::pair{"the GEMMs", c.gemm_efficiency}, std::pair{"attention", c.attention_efficiency}})
        if (share_of_peak > 1)
            fail(ErrorKind::config, cluster.source_path, ": device.peak_tflops: ", cluster.peak_tflops, " TFLOP/s is below what ", what, " reached here (",
                 share_of_peak, " times it); give the device's true peak",
                 cluster.kind == ClusterKind::cpu ? " or \"auto\" (measured on this machine)" : "", "; no calibration written");
    return c;
}

// The peak the MFU divides by: --peak-tflops, else metrics.peak_tflops, else the peak of the
// --cluster's device when it is of the kind this run computes on, else the GPU's data-sheet
// figure (0: unknown).
double peak_tflops(const BenchTrainArgs& args, const Config& config, Backend& backend) {
    if (args.peak_tflops > 0) return args.peak_tflops;
    if (config.metrics.peak_tflops > 0) return config.metrics.peak_tflops;
    if (!args.cluster_path.empty()) {
        const Cluster cluster = load_cluster(args.cluster_path);
        const bool same_kind = (cluster.kind == ClusterKind::cpu) == (config.train.device == ComputeDevice::cpu);
        if (same_kind && cluster.peak_tflops > 0) return cluster.peak_tflops;
    }
    return backend.peak_bf16_tflops();
}

std::string fixed_percent(double share) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", 100 * share);
    return text;
}

// The groups whose blocked time a step reports (parallel/context.cpp names them), in the
// order every rank sums them in.
const std::vector<std::string>& timed_groups() {
    static const std::vector<std::string> groups{"tp", "cp", "dp", "pp", "embedding", "world"};
    return groups;
}

// Where the timed steps' time went besides computing, summed over them on this rank.
struct RankWaits {
    double step_seconds = 0;
    double data_wait_seconds = 0;
    std::vector<double> comm_seconds = std::vector<double>(timed_groups().size(), 0.0);

    void add(const StepRecord& s) {
        step_seconds += s.step_seconds;
        data_wait_seconds += s.rank.data_wait_seconds;
        for (const CommTime& c : s.rank.comm) {
            const auto group = std::find(timed_groups().begin(), timed_groups().end(), c.group);
            if (group != timed_groups().end()) comm_seconds[static_cast<size_t>(group - timed_groups().begin())] += c.seconds;
        }
    }
};

// The job's view of the waits: each share is the ranks' summed wait over their summed step
// time, so a rank that waited longer than its peers weighs as much as it cost. Also counts the
// nodes (the ranks that are their node's first). One small all-reduce over the world.
struct JobWaits {
    double data_wait_share = 0;
    std::vector<double> comm_shares;
    std::vector<double> comm_seconds_per_step;  // mean over the ranks
    int nodes = 1;
};

JobWaits agree_on_waits(const RankWaits& mine, const ParallelContext& ctx, int steps) {
    std::vector<double> sums{mine.step_seconds, mine.data_wait_seconds, ctx.local_rank == 0 ? 1.0 : 0.0};
    sums.insert(sums.end(), mine.comm_seconds.begin(), mine.comm_seconds.end());
    if (ctx.mesh.world_size() > 1) ctx.world->all_reduce(Tensor(sums.data(), DType::f64, {static_cast<int64_t>(sums.size())}), ReduceOp::sum);
    JobWaits job;
    const double step_total = sums[0] > 0 ? sums[0] : 1;
    job.data_wait_share = sums[1] / step_total;
    job.nodes = static_cast<int>(std::lround(sums[2]));
    for (size_t g = 0; g < timed_groups().size(); ++g) {
        job.comm_shares.push_back(sums[3 + g] / step_total);
        job.comm_seconds_per_step.push_back(sums[3 + g] / ctx.mesh.world_size() / steps);
    }
    return job;
}

// A group with more than one rank in this mesh (the others never communicate). Rank 0, on the
// first stage, holds the embedding group wherever there is one (a tied embedding and pp > 1).
bool group_spans_ranks(const std::string& group, const ParallelContext& ctx) {
    const Mesh& mesh = ctx.mesh;
    if (group == "tp") return mesh.tp() > 1;
    if (group == "cp") return mesh.cp() > 1;
    if (group == "dp") return mesh.data_size() > 1;  // the data group holds the cp ranks too
    if (group == "pp") return mesh.pp() > 1;
    if (group == "embedding") return ctx.embedding != nullptr;
    return mesh.world_size() > 1;
}

double peak_host_rss_bytes() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

void print_top_ops(const OpProfile& profile, int top) {
    std::vector<int> order;
    for (int i = 0; i < op_count; ++i)
        if (profile.calls[static_cast<size_t>(i)] > 0) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return profile.seconds[static_cast<size_t>(a)] > profile.seconds[static_cast<size_t>(b)]; });
    const double total = profile.total_seconds();
    std::printf("where the time goes (one profiled step, time per op family, GEMMs %.1f%%):\n", total > 0 ? 100 * profile.gemm_seconds() / total : 0.0);
    std::printf("  %-16s %10s %8s %8s\n", "op", "ms", "calls", "share");
    for (size_t i = 0; i < order.size() && static_cast<int>(i) < top; ++i) {
        const auto op = static_cast<size_t>(order[i]);
        std::printf("  %-16s %10.3f %8lld %7.1f%%\n", op_name(static_cast<Op>(order[i])), profile.seconds[op] * 1e3,
                    static_cast<long long>(profile.calls[op]), total > 0 ? 100 * profile.seconds[op] / total : 0.0);
    }
}

// The GEMMs of the profiled step as TFLOP/s, by the plan's count of this rank's GEMM FLOPs
// (stage 0's: step_model.h; 2 M N K each): those in the compute dtype and, under FP8, the FP8
// linears' (Op::matmul_fp8) apart, with their casts' time (amax, scale, cast).
void print_gemm_rates(const Config& config, const Mesh& mesh, const Backend& backend, DType dtype, const OpProfile& profile) {
    const StageWork work = stage_work(config, mesh, 0);
    const double m = static_cast<double>(micro_batches_per_step(config, mesh.dp()));
    const auto seconds = [&profile](Op op) { return profile.seconds[static_cast<size_t>(op)]; };
    const double fp8 = seconds(Op::matmul_fp8), compute = profile.gemm_seconds() - fp8;
    double compute_flops = work.total_gemm_flops();
    for (const auto& [cls, flops] : work.expert_gemm_flops) compute_flops += flops;
    const auto rate = [m](double flops, double s) { return s > 0 ? m * flops / s / 1e12 : 0.0; };
    std::printf("GEMMs: %s %.4g TFLOP/s", dtype_name(dtype), rate(compute_flops, compute));
    if (config.train.precision == Precision::fp8) {
        const double casts = seconds(Op::fp8_amax) + seconds(Op::fp8_update_scale) + seconds(Op::fp8_cast);
        std::printf(", FP8 %.4g TFLOP/s (%lld calls; casts %.3f ms, %.3g GB/s)", rate(work.total_fp8_gemm_flops(), fp8),
                    static_cast<long long>(profile.calls[static_cast<size_t>(Op::matmul_fp8)]), casts * 1e3,
                    casts > 0 ? (m * work.fp8_cast_bytes + work.fp8_weight_cast_bytes) / casts / 1e9 : 0.0);
    }
    std::printf(" (FLOPs: the plan's count, 2*M*N*K%s)\n", config.train.precision == Precision::fp8 && backend.device() == Device::cpu ? "; FP8 emulated on the CPU" : "");
}

// Attention's share of the profiled step as TFLOP/s (FlashAttention's convention: forward
// 4 B H T^2 D / 2, causal half of the score square; backward 2.5 x forward), and which
// kernels ran it.
void print_attention_rate(const Config& config, const Mesh& mesh, Backend& backend, DType dtype, const OpProfile& profile) {
    const int64_t tp = mesh.tp();
    const AttentionShape s{config.train.batch_size, config.train.seq_len, config.model.n_heads / tp, config.model.n_kv_heads / tp, config.model.head_dim()};
    const double forward = 4.0 * static_cast<double>(s.batch * s.n_heads) * static_cast<double>(s.seq_len * s.seq_len) * static_cast<double>(s.head_dim) / 2;
    const auto rate = [&profile](Op op, double flops_per_call) {
        const auto i = static_cast<size_t>(op);
        return profile.seconds[i] > 0 ? flops_per_call * static_cast<double>(profile.calls[i]) / profile.seconds[i] / 1e12 : 0.0;
    };
    std::printf("attention: forward %.1f TFLOP/s, backward %.1f TFLOP/s (FLOPs: forward 4*B*H*T^2*D/2, causal half; backward 2.5 x forward); %s\n",
                rate(Op::attention_fwd, forward), rate(Op::attention_bwd, 2.5 * forward), backend.describe_attention(s, dtype).c_str());
}

// What the timed steps measured, as rank 0 reports it.
struct BenchFigures {
    double step_seconds = 0, tokens_per_step = 0, tokens_per_second = 0;
    double parameters = 0, flops_per_token = 0, tflops_per_device = 0, peak_tflops = 0;
    double host_syncs_per_step = 0;
    double bubble_share = 0;  // the schedule's idle slots: (pp - 1) / (V m + pp - 1)
    JobWaits waits;
};

void print_waits(const BenchFigures& f, const ParallelContext& ctx) {
    std::string groups;
    for (size_t g = 0; g < timed_groups().size(); ++g)
        if (group_spans_ranks(timed_groups()[g], ctx))
            groups += cat(groups.empty() ? "" : ", ", timed_groups()[g], " ", fixed_percent(f.waits.comm_shares[g]));
    std::printf("%-26s %s (ranks blocked in each group's collectives, share of the step over all ranks)\n", "exposed communication",
                groups.empty() ? "none (one rank)" : groups.c_str());
    std::printf("%-26s %s of the step; pipeline bubble %s (the schedule's idle slots)\n", "data wait", fixed_percent(f.waits.data_wait_share).c_str(),
                fixed_percent(f.bubble_share).c_str());
}

void print_json(const BenchFigures& f, const Config& config, const TrainConfig& t, const ParallelContext& ctx, Backend& backend, DType dtype,
                const BenchTrainArgs& args) {
    nlohmann::json shares = nlohmann::json::object(), seconds = nlohmann::json::object();
    for (size_t g = 0; g < timed_groups().size(); ++g)
        if (group_spans_ranks(timed_groups()[g], ctx)) {
            shares[timed_groups()[g]] = f.waits.comm_shares[g];
            seconds[timed_groups()[g]] = f.waits.comm_seconds_per_step[g];
        }
    const bool peak_known = f.peak_tflops > 0;
    const nlohmann::json out{
        {"config", config.source_path},
        {"backend", backend.name()},
        {"device", config.train.device == ComputeDevice::cpu ? "cpu" : "cuda"},
        {"compute_dtype", dtype_name(dtype)},
        {"ranks", ctx.mesh.world_size()},
        {"nodes", f.waits.nodes},
        {"tp", ctx.mesh.tp()},
        {"cp", ctx.mesh.cp()},
        {"dp", ctx.mesh.dp()},
        {"pp", ctx.mesh.pp()},
        {"virtual_stages", config.parallel.virtual_stages},
        {"micro_batch", t.batch_size},
        {"micro_batches", t.grad_accum},
        {"seq_len", t.seq_len},
        {"global_batch_sequences", t.batch_size * t.grad_accum * ctx.mesh.dp()},
        {"tokens_per_step", f.tokens_per_step},
        {"warmup_steps", args.warmup},
        {"timed_steps", args.steps},
        {"step_seconds", f.step_seconds},
        {"tokens_per_second", f.tokens_per_second},
        {"tokens_per_second_per_device", f.tokens_per_second / ctx.mesh.world_size()},
        {"parameters", f.parameters},
        {"model_flops_per_token", f.flops_per_token},
        {"peak_tflops", peak_known ? nlohmann::json(f.peak_tflops) : nlohmann::json(nullptr)},
        {"mfu", peak_known ? nlohmann::json(f.tflops_per_device / f.peak_tflops) : nlohmann::json(nullptr)},
        {"exposed_comm_share", shares},
        {"exposed_comm_seconds_per_step", seconds},
        {"data_wait_share", f.waits.data_wait_share},
        {"bubble_share", f.bubble_share},
        {"host_syncs_per_step", f.host_syncs_per_step}};
    std::printf("%s\n", out.dump(2).c_str());
}

int run_bench_train(const BenchTrainArgs& args) {
    // MPI only under mpirun, as `train`: one process needs no MPI runtime.
    std::optional<MpiSession> mpi;
    if (launched_by_mpi()) mpi.emplace();
    Config config = load_config(args.config_path, args.overrides, DataFiles::unchecked);
    config.train.steps = std::max<int64_t>(config.train.steps, args.warmup + args.steps + 1);
    config.train.sample_tokens = 0;
    CommTimes comm_times;  // outlives the context's groups, which add to it
    ParallelContext ctx = launched_by_mpi() ? make_mpi_context(config.parallel) : make_single_process_context();
    time_communication(ctx, comm_times);
    TrainerOptions options;
    options.quiet = true;
    options.synthetic_data = true;
    options.comm_times = &comm_times;
    check_rank_memory(config, ctx.mesh, ctx.local_rank, ctx.local_size);
    Trainer trainer(config, options, ctx);
    Backend& backend = trainer.backend();
    const TrainConfig& t = trainer.config().train;  // grad_accum as this mesh resolves it
    BenchFigures f;
    f.tokens_per_step = static_cast<double>(t.batch_size * t.seq_len * t.grad_accum * ctx.mesh.dp());
    f.parameters = total_parameters(trainer);

    int64_t step = 0;
    for (int i = 0; i < args.warmup; ++i) trainer.train_step(step++);
    backend.set_profiling(false);
    RankWaits waits;
    int64_t host_syncs = 0;
    for (int i = 0; i < args.steps; ++i) {
        const StepRecord s = trainer.train_step(step++);
        waits.add(s);
        host_syncs += s.rank.host_syncs;
    }
    f.waits = agree_on_waits(waits, ctx, args.steps);
    backend.set_profiling(true);
    backend.profile().reset();
    trainer.train_step(step++);
    const OpProfile profile = backend.profile();

    if (ctx.world_rank != 0) return 0;
    f.step_seconds = waits.step_seconds / args.steps;
    f.tokens_per_second = f.tokens_per_step / f.step_seconds;
    f.flops_per_token = model_flops_per_token(config, f.parameters);
    f.tflops_per_device = f.flops_per_token * f.tokens_per_second / 1e12 / ctx.mesh.world_size();
    f.peak_tflops = peak_tflops(args, config, backend);
    f.host_syncs_per_step = static_cast<double>(host_syncs) / args.steps;
    f.bubble_share = pipeline_bubble_fraction(ctx.mesh.pp(), t.grad_accum, config.parallel.virtual_stages);
    if (args.json) {
        print_json(f, config, t, ctx, backend, trainer.compute_dtype(), args);
        std::fflush(stdout);
        return 0;
    }
    const double tflops = f.tflops_per_device * ctx.mesh.world_size(), per_device = f.tflops_per_device, peak = f.peak_tflops;
    const RankMemory memory = trainer.memory();
    std::printf("bench %s: %s, %s compute, %d rank(s) (%s), recompute %s\n", config.source_path.c_str(), backend.name().c_str(),
                dtype_name(trainer.compute_dtype()), ctx.mesh.world_size(), ctx.mesh.describe_sizes().c_str(), recompute_name(t.recompute));
    std::printf("model: %.1fM parameters, %lld layers, %lld heads x %lld; batch %lld x %lld tokens x %lld micro-batches = %.0f tokens per step\n",
                f.parameters / 1e6, static_cast<long long>(config.model.n_layers), static_cast<long long>(config.model.n_heads),
                static_cast<long long>(config.model.head_dim()), static_cast<long long>(t.batch_size), static_cast<long long>(t.seq_len),
                static_cast<long long>(t.grad_accum * ctx.mesh.dp()), f.tokens_per_step);
    std::printf("timed: %d steps after %d warm-up steps, synthetic tokens\n", args.steps, args.warmup);
    std::printf("%-26s %.2f\n", "ms/step", f.step_seconds * 1e3);
    std::printf("%-26s %.0f\n", "tokens/s", f.tokens_per_second);
    std::printf("%-26s %.1f (times the host waited for the device; rank 0)\n", "host syncs per step", f.host_syncs_per_step);
    std::printf("%-26s %.3g (%.3g per device)\n", "model TFLOP/s", tflops, per_device);
    std::printf("%-26s 6N + 12*L*H*Q*T = %.3g FLOPs per token (PaLM; N = all parameters)\n", "FLOPs formula", f.flops_per_token);
    if (peak > 0)
        std::printf("%-26s %.1f%% of %g TFLOP/s dense %s per device%s\n", "MFU", 100 * per_device / peak, peak, dtype_name(trainer.compute_dtype()),
                    config.train.precision == Precision::fp8 ? " (the compute dtype's peak, also under FP8)" : "");
    else std::printf("%-26s n/a (peak of this device unknown: pass --peak-tflops)\n", "MFU");
    print_waits(f, ctx);
    std::printf("%-26s %.1f MB planned on rank 0 (parameters %.1f, gradients %.1f, optimizer %.1f, activations %.1f, workspaces %.1f)\n",
                "memory", memory.total() / 1e6, memory.parameter_bytes / 1e6, memory.gradient_bytes / 1e6, memory.optimizer_bytes / 1e6,
                memory.activation_bytes / 1e6, memory.workspace_bytes / 1e6);
    const auto device_peak = static_cast<double>(backend.peak_memory_bytes());
    std::printf("%-26s %.1f MB (%s)\n", "peak memory", (device_peak > 0 ? device_peak : peak_host_rss_bytes()) / 1e6,
                device_peak > 0 ? "device, allocated by this run" : "host resident set");
    print_top_ops(profile, args.top_ops);
    print_gemm_rates(trainer.config(), ctx.mesh, backend, trainer.compute_dtype(), profile);
    print_attention_rate(trainer.config(), ctx.mesh, backend, trainer.compute_dtype(), profile);
    if (!args.calibration_path.empty()) {
        const ComputeCalibration c = calibrate(trainer.config(), ctx.mesh, load_cluster(args.cluster_path), profile, f.step_seconds);
        write_calibration(args.calibration_path, c);
        std::printf("calibration: GEMM %.3f (%s shapes), attention %.3f, memory-bound %.3f, AdamW %.3f, gradient passes %.3f of %s's peaks -> %s\n",
                    c.gemm_efficiency, gemm_class_name(c.gemm_class), c.attention_efficiency, c.memory_efficiency, c.optimizer_efficiency,
                    c.gradient_pass_efficiency, args.cluster_path.c_str(), args.calibration_path.c_str());
    }
    std::fflush(stdout);
    return 0;
}

// A peak of zero or less would make MFU infinite or negative.
CLI::Validator positive_tflops() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (end != text.c_str() && *end == '\0' && value > 0 && std::isfinite(value)) return "";
            return "must be a positive number of TFLOP/s per device, got '" + text + "'";
        },
        "TFLOP/s > 0");
}

}  // namespace

void register_bench_train(CLI::App& bench, CommandAction& action) {
    auto args = std::make_shared<BenchTrainArgs>();
    bench.add_option("config", args->config_path, "TOML config to measure (its data files are not read)")->check(CLI::ExistingFile);
    bench.add_option("--set", args->overrides, "override a key: section.key=value (repeatable)");
    bench.add_option("--warmup", args->warmup, "untimed steps first")->capture_default_str()->check(CLI::Range(0, 10000));
    bench.add_option("--steps", args->steps, "timed steps")->capture_default_str()->check(CLI::Range(1, 100000));
    bench.add_option("--peak-tflops", args->peak_tflops, "dense peak per device in the compute dtype, for MFU (default: the GPU's data-sheet bf16 figure)")
        ->check(positive_tflops());
    bench.add_option("--top", args->top_ops, "ops listed in the time breakdown")->capture_default_str()->check(CLI::Range(1, 100));
    bench.add_option("--cluster", args->cluster_path, "cluster file whose peaks --calibration-out divides by (and whose device peak MFU divides by)")
        ->check(CLI::ExistingFile);
    bench.add_option("--calibration-out", args->calibration_path, "write the measured efficiencies into this calibration file (for `plan`)")
        ->needs(bench.get_option("--cluster"));
    bench.add_flag("--json", args->json, "print one JSON object (tokens/s, MFU, exposed communication per group, data wait, bubble) instead of tables");
    bench.callback([args, &action, &bench] {
        if (bench.get_subcommands().empty()) {
            if (args->config_path.empty()) throw CLI::RequiredError("bench needs a CONFIG or the `comm` subcommand");
            action = [args] { return run_bench_train(*args); };
        }
    });
}

}  // namespace llmtrain
