#include "plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "optim/adamw.h"
#include "parallel/context.h"
#include "parallel/fully_sharded.h"
#include "parallel/grad_buckets.h"
#include "parallel/sharded_gradients.h"
#include "parallel/pipeline_schedule.h"
#include "plan/moe_plan.h"

namespace llmtrain {

namespace {
std::string gigabytes(size_t bytes) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.2f GB", static_cast<double>(bytes) / 1e9);
    return buffer;
}

size_t bytes_of(int64_t numel, DType dtype) { return static_cast<size_t>(numel) * dtype_size(dtype); }
}  // namespace

// Interleaved (virtual_stages = V > 1): the model is cut into pp * V chunks of
// n_layers / (pp * V) layers; stage s holds chunks s, s + pp, ..., and each keeps the
// activation sets its schedule has in flight at most.
ModelPartition stage_partition(const Config& config, const Mesh& mesh, int world_rank) {
    const int64_t pp = mesh.pp(), stage = mesh.coord(world_rank)[mesh_dim::pp], chunks = config.parallel.virtual_stages;
    const int64_t micro_batches = micro_batches_per_step(config, mesh.dp());
    ModelPartition part;
    if (chunks > 1) {
        require_interleavable_micro_batches(config, mesh.dp());
        const int64_t per_chunk = config.model.n_layers / (pp * chunks);
        part.first_layer = stage * per_chunk;
        part.last_layer = part.first_layer + per_chunk;
        part.chunks = chunks;
        part.chunk_stride = pp * per_chunk;
    } else {
        const std::vector<int64_t> layers = parse_stage_layers(config.parallel.stage_layers, pp, config.model.n_layers);
        for (int64_t s = 0; s < stage; ++s) part.first_layer += layers[static_cast<size_t>(s)];
        part.last_layer = part.first_layer + layers[static_cast<size_t>(stage)];
    }
    part.has_embedding = stage == 0;
    part.has_head = stage == pp - 1;
    const std::vector<PipeAction> schedule = interleaved_schedule(pp, stage, micro_batches, chunks);
    part.activation_sets.clear();
    for (int64_t c = 0; c < chunks; ++c) part.activation_sets.push_back(chunk_in_flight(schedule, c));
    part.param_pad_multiple = mesh.data_size();
    part.grad_storage = shards_gradients(config.parallel, mesh.data_size()) ? GradStorage::bound : GradStorage::flat;
    part.value_storage = shards_parameters(config.parallel, mesh.data_size()) ? ValueStorage::bound : ValueStorage::flat;
    part.cp_size = mesh.cp();
    part.cp_rank = mesh.coord(world_rank)[mesh_dim::cp];
    part.sequence_parallel = config.parallel.sequence_parallel;
    part.tp_overlap = config.parallel.tp_overlap;
    part.recompute = config.train.recompute;
    part.document_mask = config.data.attention_mask == AttentionMask::document;
    part.reset_position_ids = config.data.reset_position_ids;
    if (config.train.precision == Precision::fp8) part.fp8 = config.fp8;
    return part;
}

bool shards_gradients(const ParallelConfig& parallel, int dp) { return parallel.zero_stage >= 2 && dp > 1; }
bool shards_parameters(const ParallelConfig& parallel, int dp) { return parallel.zero_stage >= 3 && dp > 1; }

std::vector<GradGroup> zero2_gradient_groups(const TransformerLayout& model) {
    const std::optional<size_t> embedding = model.embedding_param();
    std::vector<GradGroup> groups;
    for (const TransformerLayout::ParamGroup& g : model.gradient_groups()) {
        const bool holds_tied = model.config().tied_embeddings && embedding && *embedding >= g.begin && *embedding < g.end;
        groups.push_back({g.begin, g.end, holds_tied});
    }
    return groups;
}

int64_t gradient_bucket_bytes(const ParallelConfig& parallel) { return static_cast<int64_t>(parallel.bucket_mb * 1e6); }

Device compute_device(const TrainConfig& train) { return train.device == ComputeDevice::cuda ? Device::cuda : Device::cpu; }

Placement state_placement(const Config& config, const Mesh& mesh, int world_rank, const TransformerLayout& model, DType master) {
    const MeshCoord coord = mesh.coord(world_rank);
    const Parameters& params = model.parameters();
    PlacementSpec spec;
    spec.tensors = tensor_places(params);
    // The data group (dp x cp ranks, Mesh::data_group) holds the same weights and shards.
    const int data_size = mesh.data_size(), data_index = mesh.data_index(coord);
    spec.padded_numel = Parameters::padded_length(params.total_numel(), data_size);
    spec.zero_stage = data_size > 1 ? static_cast<int>(config.parallel.zero_stage) : 0;
    if (spec.zero_stage >= 2) {
        // Sharded within blocks of shard_size dp ranks (with their cp ranks), the blocks replicas of each other.
        const int shard = shard_size_of(config.parallel, mesh.dp()) * mesh.cp();
        spec.shard_size = shard;
        spec.shard_rank = data_index % shard;
        spec.replicas = data_size / shard;
        spec.replica_rank = data_index / shard;
        std::vector<FlatRange> ranges;
        for (const TensorPlace& t : spec.tensors) ranges.push_back(t.flat);
        spec.cuts = group_cuts(ranges, zero2_gradient_groups(model), shard);
    } else {
        spec.shard_size = data_size;
        spec.shard_rank = data_index;
        spec.cuts = bucket_cuts(spec.padded_numel, dtype_size(master), data_size, gradient_bucket_bytes(config.parallel));
    }
    // A token embedding tied to the head across stages is held by the first and the last.
    const std::optional<size_t> embedding = model.embedding_param();
    if (config.model.tied_embeddings && mesh.pp() > 1 && embedding) {
        spec.tied = *embedding;
        spec.tied_end = coord[mesh_dim::pp] == 0 ? 0 : 1;
    }
    return Placement(std::move(spec));
}

// The trainer allocates, in this order: the model's flat parameter buffers (master, compute
// copy, gradients: padded to a multiple of dp; under ZeRO-2 no gradient buffer, under ZeRO-3
// no parameter buffers) and its activation arena; the gradient sync's shards and working
// buffers; ZeRO-3's parameter shards and gather buffers; AdamW's moments for what this rank owns.
namespace {

// The weights, gradients and AdamW moments of `model` (world_rank's part) as the trainer allocates them.
void add_model_state(RankMemory& m, const Config& config, const Mesh& mesh, int world_rank, const TransformerLayout& model, DType master, DType compute) {
    const Placement placement = state_placement(config, mesh, world_rank, model, master);
    const int64_t padded = placement.padded_numel();
    m.parameter_bytes = placement.shards_parameters()
                            ? fully_sharded_value_bytes(placement, static_cast<int>(config.parallel.prefetch_layers), master, compute,
                                                        model.partition().fp8 && model.partition().fp8->param_gather ? model.fp8_weight_ranges()
                                                                                                                     : std::vector<FlatRange>{})
                            : bytes_of(padded, master) + (compute != master ? bytes_of(padded, compute) : 0);
    const DType reduce = grad_reduce_dtype(config.parallel, master);
    m.gradient_bytes = placement.shards_gradients()
                           ? sharded_gradient_bytes(placement, master, reduce)
                           : bytes_of(padded, master) + (placement.shards_optimizer() ? bytes_of(placement.shard_numel(), master) : 0) +
                                 GradBuckets::staging_bytes(placement.cuts(), placement.shards_optimizer(), mesh.data_size(), master, reduce);
    m.optimizer_bytes = AdamW::state_bytes_for(placement.optimizer_numel(), master);
}

// parallel.ep > 1, planned but not built (moe_plan.h). The state is that of the part holding
// n_experts / ep experts per MoE layer (its flat buffer, ZeRO pieces and gather buffers as
// the trainer would allocate them), with two corrections: the router keeps all n_experts
// rows, held as the dense weights are; and the experts' owned shards are cut over the
// expert-data ranks (edp, in blocks of shard x edp / data ranks: Mesh::expert_shard_group)
// rather than the data group. The activations are the ep = 1 part's (the routed buffers at
// the rows moe_mlp plans for this rank's tokens: planned_routed_rows) and the all-to-all's
// staging of one MoE layer at a time: the rows a rank sends before the dispatch and the
// expert outputs it sends back before the combine. The ep = 1 part's activations grow with
// n_experts only through the router's [tokens, n_experts] slots: they are those of the part
// with n_experts / ep experts, plus the growth from there to twice as many, extrapolated
// (no layout of all the experts is registered: 44,000 tensors for a DeepSeek-V3 shape).
void plan_expert_parallel(RankMemory& m, const Config& config, const Mesh& mesh, int world_rank, const ModelPartition& part, DType master, DType compute) {
    const ModelConfig& model = config.model;
    const int64_t moe_layers = moe_layers_in(model, part), ep = mesh.ep();
    Config local = config;
    local.model.moe.n_experts = model.moe.n_experts / ep;
    local.parallel.ep = 1;
    ModelConfig twice = local.model;
    twice.moe.n_experts *= 2;
    const int tp_rank = mesh.coord(world_rank)[mesh_dim::tp];
    const Device device = compute_device(config.train);
    const TransformerLayout held(local.model, device, compute, config.train.batch_size, config.train.seq_len, part, tp_rank, mesh.tp());
    const TransformerLayout doubled(twice, device, compute, config.train.batch_size, config.train.seq_len, part, tp_rank, mesh.tp());
    RankMemory state;
    add_model_state(state, local, mesh, world_rank, held, master, compute);
    const int data = mesh.data_size(), zero = data > 1 ? static_cast<int>(config.parallel.zero_stage) : 0;
    const int64_t shard = zero >= 2 ? shard_size_of(config.parallel, mesh.dp()) * mesh.cp() : data, expert_shard = shard * mesh.edp() / data;
    const int64_t mb = static_cast<int64_t>(dtype_size(master)), cb = compute != master ? static_cast<int64_t>(dtype_size(compute)) : 0;
    // The router's other rows: held whole, sharded by ZeRO as the dense weights.
    const int64_t router = moe_layers * (model.moe.n_experts - local.model.moe.n_experts) * model.d_model;
    const int64_t router_owned = zero >= 1 ? router / shard : router;
    int64_t parameters = zero >= 3 ? router_owned * mb : router * (mb + cb);
    int64_t gradients = zero >= 2 ? router_owned * mb : router * mb + (zero == 1 ? router_owned * mb : 0);
    int64_t owned = router_owned;
    // The experts' owned shards: over expert_shard ranks instead of shard.
    if (zero >= 1) {
        const int64_t experts = static_cast<int64_t>(static_cast<double>(moe_layers) * expert_parameters_per_layer(local.model));
        const int64_t more = experts / expert_shard - experts / shard;
        owned += more;
        gradients += more * mb;
        if (zero >= 3) parameters += more * mb;
    }
    m.parameter_bytes = static_cast<size_t>(static_cast<int64_t>(state.parameter_bytes) + parameters);
    m.gradient_bytes = static_cast<size_t>(static_cast<int64_t>(state.gradient_bytes) + gradients);
    m.optimizer_bytes = static_cast<size_t>(static_cast<int64_t>(state.optimizer_bytes) + 2 * owned * mb);
    const int64_t tokens = config.train.batch_size * config.train.seq_len / mesh.cp() / (config.parallel.sequence_parallel ? mesh.tp() : 1);
    const double per_expert = (static_cast<double>(doubled.activation_bytes()) - static_cast<double>(held.activation_bytes())) /
                              static_cast<double>(local.model.moe.n_experts);
    const double all_experts = static_cast<double>(held.activation_bytes()) + per_expert * static_cast<double>(model.moe.n_experts - local.model.moe.n_experts);
    m.fp8_bytes = held.fp8_bytes();  // routed experts list no FP8 linears: the held part's are all of them
    m.activation_bytes = static_cast<size_t>(std::llround(all_experts)) +
                         2 * static_cast<size_t>(planned_routed_rows(model.moe, tokens) * model.d_model) * dtype_size(compute);
}

}  // namespace

MemoryPlan plan_memory(const Config& config, const Mesh& mesh, int world_rank) {
    MemoryPlan plan;
    plan.world_rank = world_rank;
    plan.coord = mesh.coord(world_rank);
    plan.device = compute_device(config.train);
    const DType compute = compute_dtype(config.train), master = master_dtype(compute);
    const ModelPartition part = stage_partition(config, mesh, world_rank);
    RankMemory& m = plan.memory;
    if (config.model.moe.enabled() && mesh.ep() > 1 && moe_layers_in(config.model, part) > 0) {
        plan_expert_parallel(m, config, mesh, world_rank, part, master, compute);
    } else {
        const TransformerLayout model(config.model, plan.device, compute, config.train.batch_size, config.train.seq_len, part, plan.coord[mesh_dim::tp], mesh.tp());
        add_model_state(m, config, mesh, world_rank, model, master, compute);
        m.activation_bytes = model.activation_bytes();
        m.fp8_bytes = model.fp8_bytes();
    }
    // Attention's scratch at the micro-batch's shape (this rank's heads), on top of the
    // backend's own: cuDNN's bound unless model.attention = "native".
    const int64_t tp = mesh.tp();
    const AttentionShape attention{config.train.batch_size, config.train.seq_len / mesh.cp(), config.model.n_heads / tp, config.model.n_kv_heads / tp,
                                   config.model.head_dim()};
    m.workspace_bytes = reserved_workspace_bytes(plan.device) + attention_workspace_bytes(plan.device, config.model.attention, attention);
    return plan;
}

// Ranks that differ only in their dp or cp coordinate hold the same (every data-group rank
// owns an equal piece of each bucket, and cp ranks equal chunks), and so do the tp ranks of a
// stage (the heads, d_ff and the padded vocabulary split evenly, the other tensors whole on
// each): one rank per pipeline stage is planned, which keeps `plan --search` quick.
MemoryPlan largest_rank_plan(const Config& config, const Mesh& mesh) {
    MemoryPlan largest;
    for (int pp = 0; pp < mesh.pp(); ++pp) {
        const MemoryPlan plan = plan_memory(config, mesh, mesh.world_rank({{mesh_dim::pp, pp}}));
        if (pp == 0 || plan.total() > largest.total()) largest = plan;
    }
    return largest;
}

namespace {
size_t device_memory_per_rank(const Config& config, int local_rank, int ranks_on_node) {
    const int ranks = std::max(1, ranks_on_node);
    if (compute_device(config.train) == Device::cpu) return host_available_memory_bytes() / static_cast<size_t>(ranks);
    // Rank r uses GPU r % gpus: the ranks sharing GPU g are g, g + gpus, ... below `ranks`.
    const int gpus = cuda_device_count(), gpu = local_rank % gpus;
    const int sharing = gpu < ranks ? (ranks - 1 - gpu) / gpus + 1 : 1;
    return cuda_free_memory_bytes(local_rank) / static_cast<size_t>(sharing);
}
}  // namespace

size_t memory_limit_bytes(const TrainConfig& train) { return static_cast<size_t>(train.memory_limit_gb * 1e9); }

size_t available_memory_per_rank(const Config& config, int local_rank, int ranks_on_node) {
    const size_t device = device_memory_per_rank(config, local_rank, ranks_on_node), limit = memory_limit_bytes(config.train);
    return limit > 0 ? std::min(device, limit) : device;
}

std::string describe(const MemoryPlan& plan) {
    const RankMemory& m = plan.memory;
    return cat("parameters ", gigabytes(m.parameter_bytes), ", gradients ", gigabytes(m.gradient_bytes), ", optimizer ", gigabytes(m.optimizer_bytes),
               ", activations ", gigabytes(m.activation_bytes), ", workspace ", gigabytes(m.workspace_bytes),
               m.fp8_bytes > 0 ? ", fp8 " + gigabytes(m.fp8_bytes) : std::string(), " (rank ", plan.world_rank, ": tp ",
               plan.coord[mesh_dim::tp], ", dp ", plan.coord[mesh_dim::dp], ", pp ", plan.coord[mesh_dim::pp], ")");
}

void check_memory_fits(const MemoryPlan& plan, size_t available_bytes) {
    if (plan.total() <= available_bytes) return;
    const char* where = plan.device == Device::cuda ? "free on the GPU" : "available on this node";
    fail(ErrorKind::config, "memory: this run needs ", gigabytes(plan.total()), " per rank, has ", gigabytes(available_bytes), " (", where,
         "): ", describe(plan), ". Lower train.batch_size or train.seq_len, set train.recompute = \"selective\" or \"full\", "
         "shrink the model, or spread it over more ranks (parallel.tp, parallel.pp; ZeRO-1 shards the optimizer over parallel.dp)");
}

void check_rank_memory(const Config& config, const Mesh& mesh, int local_rank, int local_size) {
    check_memory_fits(largest_rank_plan(config, mesh), available_memory_per_rank(config, local_rank, local_size));
}

}  // namespace llmtrain
