// `llmtrain plan`: a parallel layout of a config on a cluster, before renting it: memory per
// device by category from the memory plan the trainer allocates by (ops/memory_plan.h), the
// predicted step time (ops/step_model.h), tokens/s per device, MFU, days and cost; and a
// search over the layouts of a number of devices, ranked by predicted throughput among those
// that fit.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/cluster.h"
#include "plan/goodput.h"
#include "plan/memory_plan.h"
#include "plan/step_model.h"

namespace llmtrain {

struct PlanOptions {
    double tokens = 0;        // the token budget; 0: train.steps steps
    double gpu_hour_usd = 0;  // 0: no cost
};

struct LayoutPlan {
    Config config;             // with the layout's keys set (parallel.*, train.batch_size, recompute)
    int tp = 1, pp = 1, dp = 1, cp = 1;
    int ep = 1;                // expert-parallel ranks among tp x cp x dp (mixture of experts)
    std::string not_trainable; // "planned, not trainable in this build: ..." (moe_plan.h); "" when this build trains it
    int64_t micro_batches = 1;
    MemoryPlan largest;        // the rank that needs the most, as the trainer allocates
    double runtime_bytes = 0;  // the cluster's reserved memory (context, communication buffers)
    double checkpoint_staging_bytes = 0;  // host copy of the state an async checkpoint takes
    double total_bytes = 0;    // what the device must hold (a lower bound where !memory_planned)
    bool memory_planned = true;  // false: the search found its model state alone too large and planned no more of its memory
    double capacity_bytes = 0;
    bool fits = false;
    StepTime time;
    std::optional<CheckpointTime> checkpoint;  // when the cluster describes its storage
    std::optional<GoodputPlan> goodput;        // with the checkpoint times and a node MTBF
    std::optional<NodeLocalSnapshots> node_local;  // with checkpoint.local.every_steps > 0
    double tokens = 0, days = 0, cost_usd = 0;
};

// The layout of config (parallel.tp, parallel.cp, parallel.pp; dp from parallel.dp or devices / (tp cp pp))
// on `devices` of the cluster. Throws Error(config) for a layout that cannot exist.
LayoutPlan plan_layout(const Config& config, const Cluster& cluster, int devices, const PlanOptions& options, double parameters);

struct LayoutSearch {
    std::vector<LayoutPlan> ranked;        // every fitting layout, fastest first
    std::vector<LayoutPlan> faster_unfit;  // layouts faster than the best that do not fit, fastest first
    std::optional<LayoutPlan> smallest_unfit;  // the layout that needs the least memory, when none fits
    int considered = 0, invalid = 0;
    double global_batch = 0;               // sequences per step, the same for every layout
};

// tp (dividing the heads, the KV heads and d_ff, within a node) x cp (seq_len a multiple of
// 2 cp; not with cuDNN attention) x pp (at most the layers) x dp = devices / (tp cp pp), x
// micro-batch (1, 2, 4, 8, 16 and the config's, dividing the global batch over dp) x
// recompute (none, selective, full) x sequence parallel (tp > 1); for a mixture of experts x
// ep (dividing model.moe.n_experts and tp x cp x dp; ep > 1 is planned, not trained by this
// build: LayoutPlan::not_trainable says so).
// The global batch is the config's (train.global_batch_size, else its batch x grad_accum x
// dp on `devices`).
LayoutSearch search_layouts(const Config& config, const Cluster& cluster, int devices, const PlanOptions& options, double parameters);

// "tp 8 x pp 2 x dp 8, micro-batch 1, recompute selective, sequence parallel"; with cp > 1
// "tp 2 x cp 4 x pp 1 x dp 1, ..."; with ep > 1 "tp 1 x pp 4 x dp 16, ep 8, ..."
std::string layout_name(const LayoutPlan& plan);
// Why the best layout wins over the next one of another tp x cp x pp, in one sentence.
std::string why_best(const LayoutSearch& search);
// The --set texts that run `plan` from `config` (the config the search started from): every
// key a searched layout sets (tp, cp, pp, dp, virtual stages, sequence parallelism, ZeRO
// stage, micro-batch size, global batch, recompute) and any other key it changed.
std::vector<std::string> layout_overrides(const Config& config, const LayoutPlan& plan);

}  // namespace llmtrain
