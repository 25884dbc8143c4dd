// The memory plan: the bytes per rank of a run, computed from the config and the mesh alone,
// before anything is allocated, so that a model or batch too large for the machine is a
// config error naming what it needs instead of a failed allocation half-way through set-up.
//
// The figures are those Trainer::memory() reports once the run has allocated, computed by
// the same code: the model's parameter registry and activation arena (TransformerLayout),
// the padded flat buffer (Parameters::padded_length), the rank's state placement (its ZeRO
// pieces and shards: parallel/placement.h), AdamW's moments (AdamW::state_bytes_for) and the
// workspace the backend reserves when it is made (reserved_workspace_bytes), and under FP8
// the buffers of the FP8 linears (fp8_buffers in model/fp8_linear.h). A mixture of
// experts with parallel.ep > 1, which this build does not train, is the design's estimate
// instead (moe_plan.h; memory_plan.cpp, plan_expert_parallel). Not planned: the scratch the
// CUDA ops add to that workspace during the first step (a few MB), the CUDA context, and
// host memory outside the backend (data loader, MPI buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/tensor.h"
#include "model/transformer.h"
#include "parallel/mesh.h"
#include "parallel/placement.h"

namespace llmtrain {

// What one rank holds, in the backend's memory.
struct RankMemory {
    size_t parameter_bytes = 0;   // master weights, and the compute copy under 16-bit compute
    size_t gradient_bytes = 0;    // the flat gradient buffer, and the ZeRO-1 reduced shards
    size_t optimizer_bytes = 0;   // AdamW's m and v for what this rank updates
    size_t activation_bytes = 0;  // the activation arena
    size_t workspace_bytes = 0;   // the backend's scratch
    size_t fp8_bytes = 0;         // train.precision = "fp8": the FP8 linears' weight copies, casts' scratch and scaling state (fp8_buffers)
    size_t total() const { return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + workspace_bytes + fp8_bytes; }
    bool operator==(const RankMemory&) const = default;
};

struct MemoryPlan {
    RankMemory memory;
    int world_rank = 0;  // the rank planned
    MeshCoord coord;
    Device device = Device::cpu;
    size_t total() const { return memory.total(); }
};

// The pipeline stage of world_rank: its layers, whether it embeds or holds the head, and
// how many micro-batches it keeps in flight (1F1B), per model chunk under interleaving
// (parallel.virtual_stages). Throws a config error for micro-batches interleaving cannot group.
// The document flags come from data.*; document_end_token is left for the caller that has
// the data's tokenizer (the plan needs only the flags).
ModelPartition stage_partition(const Config& config, const Mesh& mesh, int world_rank);
// Whether this run shards its gradients (ZeRO-2): asked for, and more than one dp rank.
bool shards_gradients(const ParallelConfig& parallel, int dp);
// Whether this run shards its parameters too (ZeRO-3): asked for, and more than one dp rank.
bool shards_parameters(const ParallelConfig& parallel, int dp);
// ZeRO-2's gradient groups of a model part: its backward groups, the one holding a tied
// embedding resident (written by the head and by the embedding, summed across stages).
std::vector<GradGroup> zero2_gradient_groups(const TransformerLayout& model);
// The size of a gradient bucket (parallel.bucket_mb).
int64_t gradient_bucket_bytes(const ParallelConfig& parallel);
// Where world_rank's state lives (parallel/placement.h): model is its part (a layout or the
// trainer's model), master the dtype of its master weights and gradients.
Placement state_placement(const Config& config, const Mesh& mesh, int world_rank, const TransformerLayout& model, DType master);
// The device the config trains on.
Device compute_device(const TrainConfig& train);

// The bytes world_rank of the mesh will hold. Throws the config errors the model would
// (a tp that does not divide the heads, ...).
MemoryPlan plan_memory(const Config& config, const Mesh& mesh, int world_rank);
// The plan of the rank that needs the most: pipeline stages differ (the embedding, the head,
// layers and micro-batches in flight); dp ranks hold the same.
MemoryPlan largest_rank_plan(const Config& config, const Mesh& mesh);
// Memory one rank may use before anything is allocated. CPU: the host's MemAvailable shared
// by the ranks_on_node ranks. CUDA: the free memory of the rank's GPU (local_rank modulo the
// GPUs seen) shared by the ranks that use that GPU. Either way at most train.memory_limit_gb
// when it is set.
size_t available_memory_per_rank(const Config& config, int local_rank, int ranks_on_node);
// train.memory_limit_gb in bytes; 0: none.
size_t memory_limit_bytes(const TrainConfig& train);

// "parameters 1.99 GB, gradients 1.99 GB, optimizer 3.98 GB, activations 12.10 GB,
// workspace 0.03 GB[, fp8 0.50 GB] (rank 3: tp 1, dp 1, pp 0)" (fp8 only under FP8)
std::string describe(const MemoryPlan& plan);
// Throws Error(ErrorKind::config) "... needs X GB per rank, has Y GB ..." with the breakdown
// and what to change when the plan does not fit in available_bytes.
void check_memory_fits(const MemoryPlan& plan, size_t available_bytes);
// This rank's check before anything is allocated: the largest rank's plan against the memory
// this rank has (local_rank of local_size ranks on its node). Each rank asks its own node.
void check_rank_memory(const Config& config, const Mesh& mesh, int local_rank, int local_size);

}  // namespace llmtrain
