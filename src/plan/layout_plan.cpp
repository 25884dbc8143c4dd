#include "plan/layout_plan.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/transformer.h"
#include "parallel/context.h"
#include "plan/moe_plan.h"

namespace llmtrain {

namespace {

// The checkpoint writer copies what a resume needs to host memory at the step boundary:
// the master weights this rank holds and the AdamW moments it owns; a node-local snapshot
// holds the same bytes, taken the same way.
double checkpoint_staging_bytes(const Config& config, const MemoryPlan& plan) {
    if (config.checkpoint.every_steps <= 0 && config.checkpoint.local.every_steps <= 0) return 0;
    const DType compute = compute_dtype(config.train), master = master_dtype(compute);
    const double master_share = compute == master ? 1.0 : static_cast<double>(dtype_size(master)) / static_cast<double>(dtype_size(master) + dtype_size(compute));
    return static_cast<double>(plan.memory.parameter_bytes) * master_share + static_cast<double>(plan.memory.optimizer_bytes);
}

// A GPU is one rank's; on a CPU node the ranks share the node's memory.
double capacity_bytes(const Cluster& cluster, const Mesh& mesh) {
    if (cluster.kind == ClusterKind::gpu) return cluster.memory_gb * 1e9;
    const int ranks_on_node = std::max(1, (mesh.world_size() + cluster.nodes - 1) / cluster.nodes);
    return cluster.memory_gb * 1e9 * cluster.devices_per_node / ranks_on_node;
}

double token_budget(const Config& config, const PlanOptions& options, double tokens_per_step) {
    return options.tokens > 0 ? options.tokens : static_cast<double>(config.train.steps) * tokens_per_step;
}

std::vector<int> divisors(int n) {
    std::vector<int> out;
    for (int i = 1; i <= n; ++i)
        if (n % i == 0) out.push_back(i);
    return out;
}

// The global batch in sequences: fixed across the layouts searched, so that each is the same run.
int64_t global_batch(const Config& config, int devices) {
    if (config.train.global_batch_size > 0) return config.train.global_batch_size;
    const Mesh mesh = make_mesh(config.parallel, devices);
    return config.train.batch_size * micro_batches_per_step(config, mesh.dp()) * mesh.dp();
}

bool tp_splits_model(const ModelConfig& m, int tp) { return m.n_heads % tp == 0 && m.n_kv_heads % tp == 0 && m.d_ff % tp == 0; }

// The ep a stage of `stage_ranks` tp x cp x dp ranks can fold its experts over: divisors of
// both it and n_experts (1 alone for a dense model).
std::vector<int> expert_parallel_sizes(const ModelConfig& m, int stage_ranks) {
    std::vector<int> sizes;
    for (int ep : divisors(stage_ranks))
        if (ep == 1 || (m.moe.enabled() && m.moe.n_experts % ep == 0)) sizes.push_back(ep);
    return sizes;
}

}  // namespace

namespace {

// A lower bound of the model state on the rank that holds the most, without a layout: the
// rank's share of the parameters (the dense ones over tp x pp, the experts over ep x pp), its
// owned share under ZeRO (the dense ones over the data group, the experts over it or, with
// ep > 1, over edp), and what each keeps of them. Vocabulary padding, tensors every tp rank
// holds whole, an uneven last stage and the activations only add to it.
double state_lower_bound_bytes(const Config& config, const Mesh& mesh, double parameters) {
    const double experts = static_cast<double>(moe_layers_in(config.model, ModelPartition{})) * (config.model.moe.enabled() ? expert_parameters_per_layer(config.model) : 0);
    const double dense = parameters - experts, tp = mesh.tp(), pp = mesh.pp(), ep = mesh.ep(), data = mesh.data_size();
    const int zero = data > 1 ? static_cast<int>(config.parallel.zero_stage) : 0;
    const double held = dense / (tp * pp) + experts / (ep * pp);
    const double owned = zero >= 1 ? dense / (tp * pp * data) + experts / ((ep > 1 ? tp : 1) * pp * data) : held;
    const DType compute = compute_dtype(config.train), master = master_dtype(compute);
    const double m = static_cast<double>(dtype_size(master)), c = compute != master ? static_cast<double>(dtype_size(compute)) : 0;
    return (zero >= 3 ? owned * m : held * (m + c)) + (zero >= 2 ? owned : held) * m + 2 * m * owned;
}

LayoutPlan plan_layout_memory(const Config& config, const Cluster& cluster, int devices, const PlanOptions& options, double parameters, bool memory) {
    if (cluster.kind == ClusterKind::gpu && devices > cluster.devices())
        fail(ErrorKind::config, "the layout needs ", devices, " devices; the cluster '", cluster.source_path, "' has ", cluster.devices(), " (", cluster.nodes,
             " nodes x ", cluster.devices_per_node, ")");
    LayoutPlan plan;
    plan.config = config;
    const Mesh mesh = make_mesh(config.parallel, devices);
    plan.tp = mesh.tp();
    plan.pp = mesh.pp();
    plan.dp = mesh.dp();
    plan.cp = mesh.cp();
    plan.ep = mesh.ep();
    plan.not_trainable = untrainable_layout_note(config);
    plan.config.parallel.dp = mesh.dp();
    plan.micro_batches = micro_batches_per_step(config, mesh.dp());
    plan.runtime_bytes = cluster.reserved_gb * 1e9;
    plan.capacity_bytes = capacity_bytes(cluster, mesh);
    if (!memory && state_lower_bound_bytes(config, mesh, parameters) + plan.runtime_bytes > plan.capacity_bytes) {
        plan.memory_planned = false;
        plan.total_bytes = state_lower_bound_bytes(config, mesh, parameters) + plan.runtime_bytes;
    } else {
        plan.largest = largest_rank_plan(config, mesh);
        plan.checkpoint_staging_bytes = checkpoint_staging_bytes(config, plan.largest);
        // On the CPU the staging copy takes the same memory as the run; on a GPU, host memory.
        plan.total_bytes = static_cast<double>(plan.largest.total()) + plan.runtime_bytes + (cluster.kind == ClusterKind::cpu ? plan.checkpoint_staging_bytes : 0);
    }
    plan.fits = plan.memory_planned && plan.total_bytes <= plan.capacity_bytes;
    plan.time = predict_step_time(config, mesh, cluster, parameters);
    if (cluster.storage) plan.checkpoint = predict_checkpoint_time(config, mesh, cluster, parameters);
    if (plan.checkpoint && cluster.node_mtbf_hours > 0) plan.goodput = plan_goodput(config, mesh, cluster, *plan.checkpoint, plan.time.step_seconds);
    if (config.checkpoint.local.every_steps > 0) plan.node_local = plan_node_local_snapshots(config, mesh, cluster, parameters);
    plan.tokens = token_budget(config, options, plan.time.tokens_per_step);
    const double seconds = plan.tokens / (plan.time.tokens_per_second_per_device * devices);
    plan.days = seconds / 86400;
    plan.cost_usd = options.gpu_hour_usd * devices * seconds / 3600;
    return plan;
}

}  // namespace

LayoutPlan plan_layout(const Config& config, const Cluster& cluster, int devices, const PlanOptions& options, double parameters) {
    return plan_layout_memory(config, cluster, devices, options, parameters, true);
}

namespace {

// One layout the search weighs: the config's model and global batch on a tp x cp x pp x dp mesh.
struct Candidate {
    int tp, cp, pp, dp, ep;
    int64_t micro_batch;
    Recompute recompute;
    bool sequence_parallel;
    int64_t virtual_stages;
};

// Sequence parallelism needs tp > 1; interleaving needs pp > 1 and n_layers a multiple of
// pp x v (and micro-batches in groups of pp: stage_partition refuses the rest); context
// parallelism's ring runs on the native attention kernels, not cuDNN's.
bool can_exist(const Candidate& k, const ModelConfig& model) {
    if (k.sequence_parallel && k.tp == 1) return false;
    if (k.cp > 1 && model.attention == AttentionImpl::cudnn) return false;
    return k.virtual_stages == 1 || (k.pp > 1 && model.n_layers % (k.pp * k.virtual_stages) == 0);
}

Config config_of(const Config& base, const Candidate& k, int64_t global_batch) {
    Config c = base;
    c.parallel.tp = k.tp;
    c.parallel.cp = k.cp;
    c.parallel.pp = k.pp;
    c.parallel.dp = k.dp;
    c.parallel.ep = k.ep;
    c.parallel.stage_layers.clear();
    c.parallel.virtual_stages = k.virtual_stages;
    c.parallel.sequence_parallel = k.sequence_parallel;
    // The config's overlap of sequence parallelism's collectives, where the candidate has them.
    c.parallel.tp_overlap = base.parallel.tp_overlap && k.sequence_parallel;
    c.train.batch_size = k.micro_batch;
    c.train.global_batch_size = global_batch;
    c.train.grad_accum = 0;
    c.train.recompute = k.recompute;
    return c;
}

}  // namespace

LayoutSearch search_layouts(const Config& config, const Cluster& cluster, int devices, const PlanOptions& options, double parameters) {
    LayoutSearch search;
    require_fp8_tensor_cores(config, cluster);  // else every layout would be counted as one the model cannot take
    const int64_t batch = global_batch(config, devices);
    search.global_batch = static_cast<double>(batch);
    std::vector<LayoutPlan> unfit;
    const int max_tp = cluster.kind == ClusterKind::gpu ? cluster.devices_per_node : devices;
    std::vector<int64_t> micro_batches = {1, 2, 4, 8, 16};
    if (std::find(micro_batches.begin(), micro_batches.end(), config.train.batch_size) == micro_batches.end()) micro_batches.push_back(config.train.batch_size);
    std::vector<Candidate> candidates;
    for (int tp : divisors(devices)) {
        if (tp > max_tp || !tp_splits_model(config.model, tp)) continue;
        for (int cp : divisors(devices / tp)) {
            if (config.train.seq_len % (2 * cp) != 0 && cp > 1) continue;  // 2 cp equal chunks per sequence
            for (int pp : divisors(devices / (tp * cp))) {
                if (pp > config.model.n_layers) continue;
                const int dp = devices / (tp * cp * pp);
                for (int64_t b : micro_batches) {
                    if (batch % (b * dp) != 0) continue;
                    for (int ep : expert_parallel_sizes(config.model, tp * cp * dp))
                        for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full})
                            for (bool sp : {false, true})
                                for (int64_t v : {1, 2, 4}) candidates.push_back({tp, cp, pp, dp, ep, b, recompute, sp, v});
                }
            }
        }
    }
    for (const Candidate& k : candidates) {
        if (!can_exist(k, config.model)) continue;
        ++search.considered;
        try {
            const Config layout = config_of(config, k, batch);
            require_possible_combination(layout);  // what the config would refuse is no layout to run
            // A layout whose model state alone exceeds the device is not planned further
            // (a mixture of experts registers thousands of tensors per layout).
            LayoutPlan plan = plan_layout_memory(layout, cluster, devices, options, parameters, false);
            (plan.fits ? search.ranked : unfit).push_back(std::move(plan));
        } catch (const Error&) {
            ++search.invalid;  // a layout the model or the batch cannot take
        }
    }
    const auto faster = [](const LayoutPlan& a, const LayoutPlan& b) { return a.time.tokens_per_second_per_device > b.time.tokens_per_second_per_device; };
    std::sort(search.ranked.begin(), search.ranked.end(), faster);
    std::sort(unfit.begin(), unfit.end(), faster);
    const double best = search.ranked.empty() ? 0 : search.ranked.front().time.tokens_per_second_per_device;
    // The layouts named in the report get their whole memory plan (the others may hold a lower bound).
    const auto planned = [&](const LayoutPlan& plan) { return plan.memory_planned ? plan : plan_layout(plan.config, cluster, devices, options, parameters); };
    if (!unfit.empty())
        search.smallest_unfit = planned(*std::min_element(unfit.begin(), unfit.end(), [](const LayoutPlan& a, const LayoutPlan& b) { return a.total_bytes < b.total_bytes; }));
    for (LayoutPlan& plan : unfit)
        if (plan.time.tokens_per_second_per_device > best) search.faster_unfit.push_back(std::move(plan));
    if (!search.faster_unfit.empty()) search.faster_unfit.front() = planned(search.faster_unfit.front());
    return search;
}

std::string layout_name(const LayoutPlan& plan) {
    const TrainConfig& t = plan.config.train;
    return cat("tp ", plan.tp, plan.cp > 1 ? cat(" x cp ", plan.cp) : "", " x pp ", plan.pp, " x dp ", plan.dp, plan.ep > 1 ? cat(", ep ", plan.ep) : "", ", micro-batch ",
               t.batch_size, " x ", plan.micro_batches, ", recompute ",
               recompute_name(t.recompute), plan.config.parallel.sequence_parallel && plan.tp > 1 ? ", sequence parallel" : "",
               plan.config.parallel.virtual_stages > 1 ? cat(", ", plan.config.parallel.virtual_stages, " virtual stages") : "");
}

std::vector<std::string> layout_overrides(const Config& config, const LayoutPlan& plan) {
    return overrides_between(config, plan.config,
                             {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp", "parallel.ep", "parallel.virtual_stages", "parallel.sequence_parallel",
                              "parallel.zero_stage", "train.batch_size", "train.global_batch_size", "train.grad_accum", "train.recompute"});
}

namespace {

struct Part {
    const char* name;
    double seconds;
};

std::vector<Part> parts_of(const StepTime& t) {
    return {{"compute", t.compute_seconds},         {"tensor-parallel collectives", t.tp_comm_seconds},
            {"context-parallel ring sends", t.cp_comm_seconds},
            {"expert-parallel all-to-alls", t.ep_comm_seconds},     {"MoE host synchronizations", t.host_sync_seconds},
            {"pipeline sends", t.pp_comm_seconds},  {"pipeline bubble", t.bubble_seconds},
            {"exposed data-parallel traffic", t.dp_exposed_seconds}, {"optimizer", t.optimizer_seconds}};
}

std::string percent(double x) { return cat(std::lround(x * 1000) / 10.0, "%"); }

}  // namespace

// The best against the fastest layout of another tp x cp x pp: the step-time parts (per
// token, since the steps hold the same tokens) where they differ most say why.
std::string why_best(const LayoutSearch& search) {
    if (search.ranked.empty()) return "no layout fits";
    const LayoutPlan& best = search.ranked.front();
    const LayoutPlan* other = nullptr;
    for (const LayoutPlan& plan : search.ranked)
        if (plan.tp != best.tp || plan.cp != best.cp || plan.pp != best.pp || plan.ep != best.ep) {
            other = &plan;
            break;
        }
    std::string text = cat(layout_name(best), " is fastest: ", std::lround(best.time.tokens_per_second_per_device), " tokens/s per device, MFU ",
                           percent(best.time.mfu), ", ", std::lround(best.total_bytes / 1e8) / 10.0, " of ", std::lround(best.capacity_bytes / 1e8) / 10.0, " GB per device",
                           best.not_trainable.empty() ? "." : " (ep > 1: planned, not trainable in this build).");
    if (!other) return text;
    const std::vector<Part> a = parts_of(best.time), b = parts_of(other->time);
    size_t most = 0;
    double gain = 0;
    for (size_t i = 0; i < a.size(); ++i)
        if (b[i].seconds - a[i].seconds > gain) gain = b[i].seconds - a[i].seconds, most = i;
    text += cat(" The next other tp x ", best.cp > 1 || other->cp > 1 ? "cp x " : "", "pp", best.ep > 1 || other->ep > 1 ? " x ep" : "", ", ", layout_name(*other), ", reaches ", std::lround(other->time.tokens_per_second_per_device), " tokens/s per device (",
                percent(1 - other->time.tokens_per_second_per_device / best.time.tokens_per_second_per_device), " slower)");
    if (gain > 0)
        text += cat(": its step spends ", std::lround(b[most].seconds * 1e4) / 10.0, " ms in ", a[most].name, " against ", std::lround(a[most].seconds * 1e4) / 10.0,
                    " ms");
    text += cat(" (per step of ", std::lround(best.time.tokens_per_step), " tokens).");
    if (!search.faster_unfit.empty()) {
        const LayoutPlan& f = search.faster_unfit.front();
        text += cat(" ", search.faster_unfit.size(), " faster layouts do not fit; the fastest, ", layout_name(f), ", would need ",
                    std::lround(f.total_bytes / 1e8) / 10.0, " GB per device (has ", std::lround(f.capacity_bytes / 1e8) / 10.0, ").");
    }
    return text;
}

}  // namespace llmtrain
