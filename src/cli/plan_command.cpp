// `llmtrain plan CONFIG --cluster CLUSTER.toml [--search]`: memory per device and predicted
// step time of a parallel layout on a described cluster, before renting it (ops/layout_plan.h);
// with --search, the layouts of --gpus devices ranked by predicted tokens/s among those that fit,
// and the `train` command (its --set flags) that runs the fastest.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "plan/layout_plan.h"
#include "plan/moe_plan.h"
#include "parallel/context.h"

namespace llmtrain {

namespace {

struct PlanArgs {
    std::string config_path;
    std::string cluster_path;
    std::string calibration_path;
    std::vector<std::string> overrides;
    int devices = 0;  // 0: every device of the cluster
    int nodes = 0;    // 0: the cluster file's node count
    bool search = false;
    int top = 10;
    bool json = false;
    double mtbf_hours = 0;      // 0: the cluster file's node.mtbf_hours, if any
    double launch_seconds = 0;  // 0: the cluster file's node.launch_seconds, else assumed
    PlanOptions options;
};

double gb(double bytes) { return bytes / 1e9; }

nlohmann::json memory_json(const LayoutPlan& p) {
    const RankMemory& m = p.largest.memory;
    return {{"rank", p.largest.world_rank},
            {"tp", p.largest.coord[mesh_dim::tp]},
            {"dp", p.largest.coord[mesh_dim::dp]},
            {"pp", p.largest.coord[mesh_dim::pp]},
            {"cp", p.largest.coord[mesh_dim::cp]},
            {"parameter_bytes", m.parameter_bytes},
            {"gradient_bytes", m.gradient_bytes},
            {"optimizer_bytes", m.optimizer_bytes},
            {"activation_bytes", m.activation_bytes},
            {"workspace_bytes", m.workspace_bytes},
            {"fp8_bytes", m.fp8_bytes},
            {"runtime_and_communication_bytes", p.runtime_bytes},
            {"checkpoint_staging_bytes", p.checkpoint_staging_bytes},
            {"total_bytes", p.total_bytes},
            {"capacity_bytes", p.capacity_bytes},
            {"fits", p.fits}};
}

nlohmann::json time_json(const StepTime& t) {
    return {{"step_seconds", t.step_seconds},
            {"compute_seconds", t.compute_seconds},
            {"tp_comm_seconds", t.tp_comm_seconds},
            {"cp_comm_seconds", t.cp_comm_seconds},
            {"cp_hidden_seconds", t.cp_hidden_seconds},
            {"pp_comm_seconds", t.pp_comm_seconds},
            {"ep_comm_seconds", t.ep_comm_seconds},
            {"ep_intra_node", t.ep_intra_node},
            {"host_sync_seconds", t.host_sync_seconds},
            {"host_syncs", t.host_syncs},
            {"bubble_seconds", t.bubble_seconds},
            {"dp_exposed_seconds", t.dp_exposed_seconds},
            {"optimizer_seconds", t.optimizer_seconds},
            {"tokens_per_step", t.tokens_per_step},
            {"tokens_per_second_per_device", t.tokens_per_second_per_device},
            {"model_flops_per_token", t.model_flops_per_token},
            {"active_parameters", t.active_parameters},
            {"mfu", t.mfu},
            {"fp8", t.fp8},
            {"fp8_gemm_seconds", t.fp8_gemm_seconds},
            {"fp8_cast_seconds", t.fp8_cast_seconds},
            {"fp8_weight_cast_seconds", t.fp8_weight_cast_seconds}};
}

nlohmann::json checkpoint_json(const LayoutPlan& p) {
    if (!p.checkpoint) return nullptr;
    const CheckpointTime& c = *p.checkpoint;
    return {{"bytes", c.bytes}, {"bytes_per_rank", c.bytes_per_rank}, {"blocked_seconds", c.blocked_seconds},
            {"background_seconds", c.background_seconds}, {"checksum_seconds", c.checksum_seconds}, {"resume_seconds", c.resume_seconds}};
}

nlohmann::json goodput_at_json(const std::optional<GoodputAt>& at) {
    if (!at) return nullptr;
    return {{"every_steps", at->every_steps}, {"cycle_seconds", at->cycle_seconds}, {"step_share", at->step_share},
            {"restorable_after_seconds", at->restorable_after_seconds}, {"restart_seconds", at->restart_seconds},
            {"lost_work_seconds", at->lost_work_seconds}, {"goodput", at->goodput}};
}

nlohmann::json goodput_json(const LayoutPlan& p) {
    if (!p.goodput) return nullptr;
    const GoodputPlan& g = *p.goodput;
    const FailureModel& f = g.failures;
    return {{"node_mtbf_hours", f.node_mtbf_hours}, {"nodes", f.nodes}, {"job_mtbf_hours", f.job_mtbf_seconds / 3600},
            {"detection_seconds", f.detection_seconds}, {"launch_seconds", f.launch_seconds}, {"launch_assumed", f.launch_assumed},
            {"persistent_only", goodput_at_json(g.persistent_only)}, {"persistent_best", goodput_at_json(g.persistent_best)},
            {"persistent_young_daly_seconds", g.persistent_young_daly_seconds},
            {"local_survives_node_loss", g.local_survives_node_loss}, {"with_local", goodput_at_json(g.with_local)},
            {"local_best", goodput_at_json(g.local_best)}, {"local_young_daly_seconds", g.local ? nlohmann::json(g.local_young_daly_seconds) : nullptr}};
}

nlohmann::json node_local_json(const LayoutPlan& p) {
    if (!p.node_local) return nullptr;
    const NodeLocalSnapshots& n = *p.node_local;
    return {{"ranks_per_node", n.ranks_per_node}, {"bytes_per_rank", n.bytes_per_rank}, {"replicas", n.replicas}, {"keep", n.keep},
            {"bytes_per_snapshot_per_node", n.bytes_per_snapshot}, {"bytes_kept_per_node", n.bytes_kept}, {"bytes_peak_per_node", n.bytes_peak},
            {"buffer_bytes_per_node", n.buffer_bytes},
            {"host_memory_bytes_per_node", n.host_memory_bytes > 0 ? nlohmann::json(n.host_memory_bytes) : nullptr},
            {"replica_bytes_per_node", n.replica_bytes_per_node}, {"replica_seconds", n.replica_seconds}};
}

nlohmann::json plan_json(const LayoutPlan& p) {
    const TrainConfig& t = p.config.train;
    return {{"layout",
             {{"tp", p.tp},
              {"cp", p.cp},
              {"pp", p.pp},
              {"dp", p.dp},
              {"micro_batch", t.batch_size},
              {"micro_batches", p.micro_batches},
              {"seq_len", t.seq_len},
              {"recompute", recompute_name(t.recompute)},
              {"ep", p.ep},
              {"trainable", p.not_trainable.empty()},
              {"sequence_parallel", p.config.parallel.sequence_parallel && p.tp > 1},
              {"zero_stage", p.config.parallel.zero_stage},
              {"shard_size", shard_size_of(p.config.parallel, static_cast<int>(p.dp))},
              {"grad_reduce_dtype", grad_reduce_dtype_name(p.config.parallel.grad_reduce_dtype)}}},
            {"memory", memory_json(p)},
            {"time", time_json(p.time)},
            {"checkpoint", checkpoint_json(p)},
            {"node_local_snapshots", node_local_json(p)},
            {"goodput", goodput_json(p)},
            {"tokens", p.tokens},
            {"days", p.days},
            {"cost_usd", p.cost_usd}};
}

// A count with the unit that keeps it readable: "1.33M", "72.71B".
std::string count_text(double count) {
    char text[32];
    if (count >= 1e9) std::snprintf(text, sizeof text, "%.2fB", count / 1e9);
    else if (count >= 1e6) std::snprintf(text, sizeof text, "%.2fM", count / 1e6);
    else std::snprintf(text, sizeof text, "%.1fK", count / 1e3);
    return text;
}

void print_header(const Config& config, const Cluster& cluster, int devices, double parameters) {
    const MoeConfig& moe = config.model.moe;
    const std::string experts = moe.enabled() ? cat(" (", count_text(active_parameter_count(config.model, parameters)), " active: top ", moe.top_k, " of ", moe.n_experts,
                                                    " experts)")
                                              : "";
    // %g: a CPU core's 0.1 TFLOP/s prints as itself, not as 0.
    std::printf("plan %s: %s, %s parameters%s, on %d of %s (%d nodes x %d %s, %g TFLOP/s, %g GB each)\n", config.source_path.c_str(),
                family_name(config.model.family), count_text(parameters).c_str(), experts.c_str(), devices, cluster.source_path.c_str(), cluster.nodes, cluster.devices_per_node,
                cluster.device_name.c_str(), cluster.peak_tflops, cluster.memory_gb);
    std::printf("calibration: %s\n", cluster.calibration_path.empty() ? "none (the cluster file's assumed efficiencies)" : cluster.calibration_path.c_str());
}

// As `train` says it: one rank in the data group (dp x cp) has nothing to shard.
void print_layout(const LayoutPlan& p, int devices) {
    const ParallelConfig& parallel = p.config.parallel;
    const int64_t tokens = p.config.train.batch_size * p.config.train.seq_len;
    const std::string per_rank = p.cp > 1 ? cat(" (", tokens / p.cp, " on each of the ", p.cp, " cp ranks)") : "";
    const std::string group = p.cp > 1 ? cat(" over the data group of dp x cp = ", p.dp * p.cp, " ranks") : "";
    const std::string zero = p.dp * p.cp > 1 ? cat("ZeRO stage ", parallel.zero_stage, ", gradients reduced in ", grad_reduce_dtype_name(parallel.grad_reduce_dtype), group)
                                             : "ZeRO off (dp 1: nothing to shard)";
    std::printf("layout: %d devices = %s, %lld tokens per micro-batch%s, %s\n", devices, layout_name(p).c_str(), static_cast<long long>(tokens), per_rank.c_str(),
                zero.c_str());
    const MoeConfig& moe = p.config.model.moe;
    if (!moe.enabled()) return;
    const int stage = p.tp * p.cp * p.dp;
    const std::string routing = moe.capacity_factor > 0 ? cat("capacity factor ", moe.capacity_factor) : "dropless";
    if (p.ep == 1) std::printf("experts: every expert on every rank (%lld per rank), %s\n", static_cast<long long>(moe.n_experts), routing.c_str());
    else
        std::printf("experts: ep %d x edp %d over each stage's %d ranks, %lld of %lld experts per rank, %s%s\n", p.ep, stage / p.ep, stage,
                    static_cast<long long>(moe.n_experts / p.ep), static_cast<long long>(moe.n_experts), routing.c_str(),
                    moe.capacity_factor > 0 ? "" : " (the rows each rank receives planned at the balanced load)");
    if (!p.not_trainable.empty()) std::printf("%s\n", p.not_trainable.c_str());
}

void print_memory(const LayoutPlan& p) {
    const RankMemory& m = p.largest.memory;
    std::printf("memory per device (largest: rank %d, tp %d%s dp %d pp %d; as the trainer allocates):\n", p.largest.world_rank, p.largest.coord[mesh_dim::tp],
                p.cp > 1 ? cat(" cp ", p.largest.coord[mesh_dim::cp]).c_str() : "", p.largest.coord[mesh_dim::dp], p.largest.coord[mesh_dim::pp]);
    std::printf("  %-44s %10.2f GB\n", "parameters (master, and 16-bit compute copy)", gb(static_cast<double>(m.parameter_bytes)));
    std::printf("  %-44s %10.2f GB\n", "gradients (and the ZeRO-1 reduced shard)", gb(static_cast<double>(m.gradient_bytes)));
    std::printf("  %-44s %10.2f GB\n", "optimizer state (AdamW moments owned)", gb(static_cast<double>(m.optimizer_bytes)));
    std::printf("  %-44s %10.2f GB\n", "activations (1F1B micro-batches in flight)", gb(static_cast<double>(m.activation_bytes)));
    std::printf("  %-44s %10.2f GB\n", "workspaces", gb(static_cast<double>(m.workspace_bytes)));
    if (m.fp8_bytes > 0) std::printf("  %-44s %10.2f GB\n", "FP8 weight copies, cast scratch and scales", gb(static_cast<double>(m.fp8_bytes)));
    std::printf("  %-44s %10.2f GB\n", "runtime and communication buffers", gb(p.runtime_bytes));
    std::printf("  %-44s %10.2f GB\n", "checkpoint staging (host copy)", gb(p.checkpoint_staging_bytes));
    if (p.fits) std::printf("  %-44s %10.2f GB of %.2f GB: fits (%.2f GB free)\n", "total", gb(p.total_bytes), gb(p.capacity_bytes), gb(p.capacity_bytes - p.total_bytes));
    else std::printf("  %-44s %10.2f GB of %.2f GB: does not fit by %.2f GB\n", "total", gb(p.total_bytes), gb(p.capacity_bytes), gb(p.total_bytes - p.capacity_bytes));
}

void print_time(const LayoutPlan& p, const PlanOptions& options) {
    const StepTime& t = p.time;
    const auto row = [&](const char* name, double seconds) { std::printf("  %-44s %10.2f ms %6.1f%%\n", name, seconds * 1e3, 100 * seconds / t.step_seconds); };
    std::printf("step time (slowest stage %d):\n", t.slowest_stage);
    row("compute (GEMM, attention, memory-bound ops)", t.compute_seconds);
    if (t.fp8) {
        row("  of which FP8 GEMMs (the blocks' linears)", t.fp8_gemm_seconds);
        row("  of which FP8 casts (activations, gradients)", t.fp8_cast_seconds);
        row("FP8 weight casts (once per step)", t.fp8_weight_cast_seconds);
    }
    row("tensor-parallel collectives", t.tp_comm_seconds);
    if (p.cp > 1) {
        row("context-parallel ring sends (exposed)", t.cp_comm_seconds);
        std::printf("  %-44s %10.2f ms (behind attention blocks, not in the step)\n", "context-parallel ring sends (hidden)", t.cp_hidden_seconds * 1e3);
    }
    row("pipeline sends", t.pp_comm_seconds);
    if (p.ep > 1) row(t.ep_intra_node ? "expert all-to-alls (exposed; ep in a node)" : "expert all-to-alls (exposed; ep across nodes)", t.ep_comm_seconds);
    if (p.config.model.moe.enabled()) row(cat("MoE host synchronizations (", std::lround(t.host_syncs), " per step)").c_str(), t.host_sync_seconds);
    row("pipeline bubble", t.bubble_seconds);
    row("data-parallel traffic not hidden", t.dp_exposed_seconds);
    row("optimizer", t.optimizer_seconds);
    row("step", t.step_seconds);
    std::printf("%-46s %.0f\n", "tokens per step", t.tokens_per_step);
    std::printf("%-46s %.0f\n", "tokens/s per device", t.tokens_per_second_per_device);
    const std::string n = p.config.model.moe.enabled() ? cat(", N = ", count_text(t.active_parameters), " active parameters") : "";
    const std::string of_peak = t.fp8 ? cat("of the ", dtype_name(compute_dtype(p.config.train)), " peak; ") : "";
    std::printf("%-46s %.1f%% (%sPaLM: 6N + 12*L*H*Q*T%s = %.3g FLOPs per token)\n", "MFU", 100 * t.mfu, of_peak.c_str(), n.c_str(), t.model_flops_per_token);
    std::printf("%-46s %.3g tokens: %.2f days", "budget", p.tokens, p.days);
    if (options.gpu_hour_usd > 0) std::printf(", $%.0f at $%.2f per device-hour", p.cost_usd, options.gpu_hour_usd);
    std::printf("\n");
}

void print_checkpoint(const LayoutPlan& p, const Cluster& cluster) {
    if (!p.checkpoint) {
        std::printf("checkpoint: no [storage] in %s (aggregate and per-node read/write GB/s, host copy GB/s) to time it\n", cluster.source_path.c_str());
        return;
    }
    const CheckpointTime& c = *p.checkpoint;
    const Storage& st = *cluster.storage;
    std::printf("checkpoint (fp32 master weights and AdamW moments, written by placement; storage %.0f GB/s write, %.0f GB/s read, %.0f / %.0f GB/s per node):\n",
                st.write_gbps, st.read_gbps, st.node_write_gbps, st.node_read_gbps);
    std::printf("  %-44s %10.1f GB (%.2f GB per rank)\n", "size", gb(c.bytes), gb(c.bytes_per_rank));
    std::printf("  %-44s %10.2f s\n", "save: step loop blocked (copy to host)", c.blocked_seconds);
    std::printf("  %-44s %10.1f s (of which checksums %.1f s at %.2f GB/s per rank)\n", "save: written in the background", c.background_seconds,
                c.checksum_seconds, st.checksum_gbps);
    std::printf("  %-44s %10.1f s\n", p.cp > 1 ? "resume: verify, load, all-gather over dp x cp" : "resume: verify, load, all-gather over dp", c.resume_seconds);
}

std::string plural(int64_t count, const char* noun) { return cat(count, " ", noun, count == 1 ? "" : "s"); }

// "374.9 s", "5.7 min", "2.38 h", "6.2 days": a duration at the unit that reads best.
std::string duration_text(double seconds) {
    char text[32];
    if (seconds < 120) std::snprintf(text, sizeof text, "%.1f s", seconds);
    else if (seconds < 7200) std::snprintf(text, sizeof text, "%.1f min", seconds / 60);
    else if (seconds < 3 * 86400) std::snprintf(text, sizeof text, "%.2f h", seconds / 3600);
    else std::snprintf(text, sizeof text, "%.1f days", seconds / 86400);
    return text;
}

void print_node_local(const LayoutPlan& p) {
    if (!p.node_local) return;
    const NodeLocalSnapshots& n = *p.node_local;
    const LocalSnapshotConfig& local = p.config.checkpoint.local;
    std::printf("node-local snapshots (checkpoint.local: every %s, %s, keep %lld) in host memory, per node of %s:\n", plural(local.every_steps, "step").c_str(),
                plural(n.replicas, "replica").c_str(), static_cast<long long>(n.keep), plural(n.ranks_per_node, "rank").c_str());
    std::printf("  %-44s %10.2f GB (%d x %.2f GB)\n", "one snapshot of the node's own ranks", gb(n.bytes_per_snapshot / static_cast<double>(1 + n.replicas)),
                n.ranks_per_node, gb(n.bytes_per_rank));
    std::printf("  %-44s %10.2f GB\n", cat("with ", plural(n.replicas, "replica"), " of other nodes' ranks").c_str(), gb(n.bytes_per_snapshot));
    std::printf("  %-44s %10.2f GB\n", cat("kept: ", n.keep, " snapshots").c_str(), gb(n.bytes_kept));
    std::printf("  %-44s %10.2f GB\n", cat("peak: ", n.keep + 1, " while the next is written").c_str(), gb(n.bytes_peak));
    std::printf("  %-44s %10.2f GB (host copy, the file kept for sending, %s received)\n", "the ranks' buffers", gb(n.buffer_bytes),
                plural(n.replicas, "replica").c_str());
    const double total = n.bytes_peak + n.buffer_bytes;
    std::printf("  %-44s %10.2f GB", "total at the peak", gb(total));
    if (n.host_memory_bytes > 0) std::printf(" of %.0f GB host memory (%.1f%%)\n", gb(n.host_memory_bytes), 100 * total / n.host_memory_bytes);
    else std::printf(" (host memory per node: not in the cluster file, node.host_memory_gb)\n");
    std::printf("  %-44s %10.2f GB out of each node (as much in), %.2f s per rank at the inter-node link\n", "replica traffic per snapshot",
                gb(n.replica_bytes_per_node), n.replica_seconds);
}

// "every 500 steps (2.38 h): 99.130% (stall 0.003%, restorable 17.2 s after; per failure: restart 6.2 min, lost work 71.8 min)"
void print_goodput_row(const char* label, const GoodputAt& at, double step_seconds, const std::string& after = "") {
    std::printf("  %-44s every %s (%s): %.3f%% (stall %.3f%%, restorable %s after; per failure: restart %s, lost work %s)%s\n", label,
                plural(at.every_steps, "step").c_str(), duration_text(static_cast<double>(at.every_steps) * step_seconds).c_str(), 100 * at.goodput,
                100 * (1 - at.step_share), duration_text(at.restorable_after_seconds).c_str(), duration_text(at.restart_seconds).c_str(),
                duration_text(at.lost_work_seconds).c_str(), after.c_str());
}

// "; Young/Daly sqrt(2 x 0.27 s x 150.0 h) = 9.0 min"
std::string young_daly_text(double stall_seconds, double job_mtbf_seconds, double interval_seconds) {
    char text[96];
    std::snprintf(text, sizeof text, "; Young/Daly sqrt(2 x %.3g s x %.1f h) = %s", stall_seconds, job_mtbf_seconds / 3600, duration_text(interval_seconds).c_str());
    return text;
}

void print_local_goodput(const GoodputPlan& g, const LocalSnapshotConfig& local) {
    if (!g.local) return;
    const std::string label = cat("with local snapshots (", plural(local.replicas, "replica"), ")");
    if (g.local_survives_node_loss) {
        print_goodput_row(label.c_str(), *g.with_local, g.step_seconds);
        print_goodput_row("  at the best snapshot interval", *g.local_best, g.step_seconds,
                          young_daly_text(g.local->stall_seconds, g.failures.job_mtbf_seconds, g.local_young_daly_seconds));
        return;
    }
    // Nothing of the lost node's snapshots survives it: the persistent checkpoint is restored.
    const char* why = g.failures.nodes > 1 ? "no replica: a lost node's snapshots go with it" : "one node: no other node holds a replica";
    std::printf("  %-44s every %s, %s; %s\n", label.c_str(), plural(local.every_steps, "step").c_str(), why,
                g.with_local ? "the persistent checkpoint is restored" : "and there is no persistent checkpoint (checkpoint.every_steps = 0)");
    if (g.with_local) print_goodput_row("  persistent checkpoints restored", *g.with_local, g.step_seconds);
}

void print_goodput(const LayoutPlan& p, const Cluster& cluster, bool mtbf_from_flag) {
    if (!p.checkpoint) return;
    if (!p.goodput) {
        std::printf("goodput: no node MTBF (--mtbf-hours H, or node.mtbf_hours in %s)\n", cluster.source_path.c_str());
        return;
    }
    const GoodputPlan& g = *p.goodput;
    const FailureModel& f = g.failures;
    std::printf("goodput (share of wall time in steps that count; exponential node failures, one at a time; formula in src/plan/goodput.h):\n");
    std::printf("  %-44s %.0f h (%s); %s: job MTBF %.1f h\n", "node MTBF", f.node_mtbf_hours, mtbf_from_flag ? "--mtbf-hours" : "node.mtbf_hours",
                plural(f.nodes, "node").c_str(), f.job_mtbf_seconds / 3600);
    std::printf("  %-44s %.0f s: %.0f s until a collective times out (parallel.timeout_seconds), %.0f s relaunch%s\n", "restart before the load",
                f.detection_seconds + f.launch_seconds, f.detection_seconds, f.launch_seconds, f.launch_assumed ? " (assumed; --launch-seconds)" : "");
    if (g.persistent_only) print_goodput_row("persistent checkpoints only", *g.persistent_only, g.step_seconds);
    else std::printf("  %-44s none (checkpoint.every_steps = 0): a failure loses the run so far\n", "persistent checkpoints only");
    print_goodput_row("  at the best checkpoint interval", g.persistent_best, g.step_seconds,
                      young_daly_text(g.persistent.stall_seconds, f.job_mtbf_seconds, g.persistent_young_daly_seconds));
    print_local_goodput(g, p.config.checkpoint.local);
}

// An argument as a POSIX shell reads it back: plain ones bare, others in single quotes.
std::string shell_word(const std::string& word) {
    const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_-./=,:+", c); });
    if (plain) return word;
    std::string quoted = "'";
    for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return quoted + "'";
}

// The overrides `train` takes to run a searched layout: the user's own --set (those the
// layout does not set again), then the layout's keys.
std::vector<std::string> run_overrides(const std::vector<std::string>& given, const Config& config, const LayoutPlan& plan) {
    const std::vector<std::string> layout = layout_overrides(config, plan);
    std::vector<std::string> all;
    for (const std::string& text : given) {
        const std::string key = text.substr(0, text.find('='));
        if (std::none_of(layout.begin(), layout.end(), [&](const std::string& l) { return l.starts_with(key + "="); })) all.push_back(text);
    }
    all.insert(all.end(), layout.begin(), layout.end());
    return all;
}

// "to run it (128 ranks): llmtrain train CONFIG --set parallel.tp=8 --set ...": what the
// prose says, as the command that runs it.
void print_run_command(const std::string& config_path, const std::vector<std::string>& overrides, const LayoutPlan& plan) {
    std::string command = cat("llmtrain train ", shell_word(config_path));
    for (const std::string& text : overrides) command += cat(" --set ", shell_word(text));
    std::printf("to run it (%d ranks): %s\n", plan.tp * plan.cp * plan.pp * plan.dp, command.c_str());
}

void print_search(const LayoutSearch& search, int top) {
    const bool untrainable = std::any_of(search.ranked.begin(), search.ranked.begin() + std::min<size_t>(search.ranked.size(), static_cast<size_t>(top)),
                                         [](const LayoutPlan& p) { return !p.not_trainable.empty(); });
    std::printf("search: %d layouts considered (%d cannot exist), %zu fit; global batch %.0f sequences\n", search.considered, search.invalid,
                search.ranked.size(), search.global_batch);
    std::printf("  %-4s %-72s %10s %7s %9s %10s\n", "#", "layout", "tokens/s", "MFU", "step ms", "memory GB");
    if (!search.ranked.empty() && search.ranked.front().time.fp8)
        std::printf("  (FP8: MFU of the %s peak)\n", dtype_name(compute_dtype(search.ranked.front().config.train)));
    for (size_t i = 0; i < search.ranked.size() && static_cast<int>(i) < top; ++i) {
        const LayoutPlan& p = search.ranked[i];
        std::printf("  %-4zu %-72s %10.0f %6.1f%% %9.1f %10.2f%s\n", i + 1, layout_name(p).c_str(), p.time.tokens_per_second_per_device, 100 * p.time.mfu,
                    p.time.step_seconds * 1e3, gb(p.total_bytes), p.not_trainable.empty() ? "" : " *");
    }
    if (untrainable) std::printf("  * ep > 1: planned, not trainable in this build (it trains ep = 1, every expert on every rank)\n");
    std::printf("why: %s\n", why_best(search).c_str());
}

int run_plan(const PlanArgs& args) {
    const Config config = load_config(args.config_path, args.overrides, DataFiles::unchecked);
    Cluster cluster = load_cluster(args.cluster_path);
    if (!args.calibration_path.empty()) apply_calibration(cluster, args.calibration_path);
    if (args.nodes > 0) cluster.nodes = args.nodes;
    if (args.mtbf_hours > 0) cluster.node_mtbf_hours = args.mtbf_hours;
    if (args.launch_seconds > 0) cluster.launch_seconds = args.launch_seconds;
    const int devices = args.devices > 0 ? args.devices : cluster.devices();
    const double parameters = model_parameter_count(config.model);
    if (args.search) {
        const LayoutSearch search = search_layouts(config, cluster, devices, args.options, parameters);
        if (args.json) {
            nlohmann::json ranked = nlohmann::json::array();
            for (size_t i = 0; i < search.ranked.size() && static_cast<int>(i) < args.top; ++i) {
                nlohmann::json layout = plan_json(search.ranked[i]);
                layout["set"] = run_overrides(args.overrides, config, search.ranked[i]);
                ranked.push_back(std::move(layout));
            }
            std::printf("%s\n", nlohmann::json{{"devices", devices}, {"considered", search.considered}, {"invalid", search.invalid},
                                               {"fitting", search.ranked.size()}, {"ranked", ranked}, {"why", why_best(search)}}.dump(2).c_str());
        } else {
            print_header(config, cluster, devices, parameters);
            print_search(search, args.top);
            // The command runs the fastest layout this build trains.
            const auto trainable = std::find_if(search.ranked.begin(), search.ranked.end(), [](const LayoutPlan& p) { return p.not_trainable.empty(); });
            if (trainable != search.ranked.end()) {
                if (trainable != search.ranked.begin())
                    std::printf("the fastest layout this build trains: %s (%.0f tokens/s per device)\n", layout_name(*trainable).c_str(),
                                trainable->time.tokens_per_second_per_device);
                print_run_command(args.config_path, run_overrides(args.overrides, config, *trainable), *trainable);
            }
        }
        if (search.ranked.empty()) {
            if (!search.smallest_unfit) fail(ErrorKind::config, "plan: no layout of ", devices, " devices can exist for this model (tp must divide the heads and d_ff, pp at most the layers, the global batch split over dp)");
            const LayoutPlan& s = *search.smallest_unfit;
            fail(ErrorKind::config, "plan: does not fit: no layout of ", devices, " devices fits; the smallest, ", layout_name(s), ", needs ",
                 std::lround(s.total_bytes / 1e7) / 100.0, " GB per device, has ", std::lround(s.capacity_bytes / 1e7) / 100.0, " GB");
        }
        return 0;
    }
    const LayoutPlan plan = plan_layout(config, cluster, devices, args.options, parameters);
    if (args.json) std::printf("%s\n", plan_json(plan).dump(2).c_str());
    else {
        print_header(config, cluster, devices, parameters);
        print_layout(plan, devices);
        print_memory(plan);
        print_node_local(plan);
        print_time(plan, args.options);
        print_checkpoint(plan, cluster);
        print_goodput(plan, cluster, args.mtbf_hours > 0);
    }
    if (!plan.fits)
        fail(ErrorKind::config, "plan: does not fit: needs ", std::lround(plan.total_bytes / 1e7) / 100.0, " GB per device, has ",
             std::lround(plan.capacity_bytes / 1e7) / 100.0, " GB (", describe(plan.largest), "); try --search");
    return 0;
}

// A figure that must be above zero: "--mtbf-hours: must be a positive number of hours, got '0'".
CLI::Validator positive(const char* unit) {
    return CLI::Validator(
        [unit](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (end != text.c_str() && *end == '\0' && value > 0 && std::isfinite(value)) return "";
            return cat("must be a positive number of ", unit, ", got '", text, "'");
        },
        cat(unit, " > 0"));
}

}  // namespace

void register_plan_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<PlanArgs>();
    CLI::App* cmd = app.add_subcommand("plan", "Memory per device and predicted step time of a parallel layout on a described cluster; --search ranks layouts");
    cmd->add_option("config", args->config_path, "TOML config (its data files are not read)")->required()->check(CLI::ExistingFile);
    cmd->add_option("--cluster", args->cluster_path, "cluster description (configs/clusters/*.toml)")->required()->check(CLI::ExistingFile);
    cmd->add_option("--calibration", args->calibration_path, "calibration file written by bench / bench comm (overrides the cluster's)")->check(CLI::ExistingFile);
    cmd->add_option("--set", args->overrides, "override a config key: section.key=value (repeatable)");
    cmd->add_option("--gpus", args->devices, "devices to plan for (default: all of the cluster)")->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--nodes", args->nodes, "nodes of the cluster's kind (default: the file's node.count)")->check(CLI::Range(1, 1 << 20));
    cmd->add_flag("--search", args->search, "rank the tp x pp x dp x micro-batch x recompute layouts of --gpus devices");
    cmd->add_option("--top", args->top, "layouts listed by --search")->capture_default_str()->check(CLI::Range(1, 1000));
    cmd->add_flag("--json", args->json, "print JSON instead of tables");
    cmd->add_option("--tokens", args->options.tokens, "token budget for days and cost (default: train.steps steps)")->check(CLI::PositiveNumber);
    cmd->add_option("--gpu-hour-usd", args->options.gpu_hour_usd, "price of one device-hour, for the cost")->check(CLI::PositiveNumber);
    cmd->add_option("--mtbf-hours", args->mtbf_hours, "mean time between failures of one node, hours, for the goodput (default: the cluster's node.mtbf_hours)")
        ->check(positive("hours"));
    cmd->add_option("--launch-seconds", args->launch_seconds,
                    "a restart's relaunch of every rank and communicator set-up, seconds (default: the cluster's node.launch_seconds, else 60, assumed)")
        ->check(positive("seconds"));
    cmd->callback([args, &action] { action = [args] { return run_plan(*args); }; });
}

}  // namespace llmtrain
