// What the plan needs to know of a mixture-of-experts model (model.moe, model/moe_mlp.h):
// which layers of a pipeline stage route their tokens to experts, how many parameters a token
// uses (the active ones, for MFU), and what expert parallelism (parallel.ep) changes in a
// rank's state and traffic.
//
// Expert parallelism as planned (Megatron-Core's parallel folding with etp = 1; the groups are
// parallel/mesh.h's): the tp * cp * dp ranks of a stage are ep x edp for the expert layers;
// each ep rank holds n_experts / ep experts of every MoE layer, whose gradients are reduced
// (and, under ZeRO, sharded) over its edp ranks: the experts' optimizer state is spread over
// all tp * cp * dp ranks of the stage whatever ep. Tokens reach their experts and come back by
// an all-to-all over the ep group, twice per MoE layer in forward and twice in backward. This
// build trains ep = 1 only (every expert on every rank); an ep > 1 plan is the design's.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "model/transformer.h"

namespace llmtrain {

// The MoE layers among a part's layers (every chunk of an interleaved stage).
int64_t moe_layers_in(const ModelConfig& model, const ModelPartition& part);
// One MoE layer's experts: n_experts x (gate, up and down: 3 x d_ff_expert x d_model).
double expert_parameters_per_layer(const ModelConfig& model);
// The parameters one token goes through (the experts' top_k of n_experts, the router and
// everything else): N of MFU's 6 N for a mixture of experts, as Megatron-Core reports it.
// `parameters` is model_parameter_count(model); a dense model's are all active.
double active_parameter_count(const ModelConfig& model, double parameters);

// The rows of a MoE layer's permuted buffer on one rank for `tokens` tokens of its own: what
// moe_mlp allocates (tokens x top_k dropless, n_experts x the capacity with one). With
// ep > 1 a rank runs its experts on the rows the others send it: planned at the same count,
// the balanced load dropless (a router that sends more to one rank needs more there) and
// exactly so with a capacity (each rank caps its own tokens' rows per expert).
int64_t planned_routed_rows(const MoeConfig& moe, int64_t tokens);

// The parameters a part registers on tp rank 0 of tp (TransformerLayout's count). A MoE
// layer registers a router row and n_experts experts alike, so the count is that of the
// part with one expert per layer plus the other experts' elements: exact, and without
// registering the n_experts x 3 tensors per layer that make a layout slow to plan.
int64_t stage_parameter_count(const Config& config, const ModelPartition& part, int tp);

// "planned, not trainable in this build: ..." for a layout this build refuses to train
// (parallel.ep > 1); "" for one it trains.
std::string untrainable_layout_note(const Config& config);

}  // namespace llmtrain
