// What one training step and one evaluation produced, and the seam through which the rest
// of the program sees them: the trainer hands every record to its StepObservers (console
// line, log.jsonl, later Prometheus and checkpoint scheduling) instead of printing or
// writing anything itself. Every figure is already reduced over the whole job, so every
// rank sees the same record, except StepRecord::rank: this rank's own timings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmtrain {

// Time this rank's step loop spent blocked in one operation of one group of ranks.
struct CommTime {
    std::string group;  // "world", "tp", "cp", "dp", "pp", "embedding"
    std::string op;     // "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send", "recv", "broadcast", "barrier"
    double seconds = 0;
};

// Where this rank's step time went, besides computing. Differs between ranks.
struct RankStepTimes {
    double data_wait_seconds = 0;     // waiting for batches from the loader
    int64_t host_syncs = 0;           // times the host waited for the device (the backend's count)
    double comm_seconds = 0;          // the sum of comm
    std::vector<CommTime> comm;       // the operations that took time this step
    // step_seconds less the waits: the time a straggler spends longer than its peers.
    double compute_seconds(double step_seconds) const { return step_seconds > data_wait_seconds + comm_seconds ? step_seconds - data_wait_seconds - comm_seconds : 0; }
};

// A mixture-of-experts layer's routing in a step, over the whole job (train/moe_load.h).
struct MoeLayerRecord {
    int64_t layer = 0;                // global index
    double load_max_over_mean = 0;    // the most loaded expert's assignments over the mean's
    double dropped_fraction = 0;      // of the assignments, dropped by a capacity
    double top_expert_token_share = 0;  // of the layer's tokens, those its busiest expert took (1: every token)
};

struct StepRecord {
    int64_t step = 0;        // 1-based: the number of optimizer steps taken after it
    double loss = 0;         // mean over the step's micro-batches (all dp ranks)
    double lr = 0;
    double grad_norm = 0;    // before clipping, over every parameter of every rank
    double step_seconds = 0;
    double tokens_per_second = 0;
    bool skipped = false;    // update skipped by the non-finite policy or a loss-scale overflow
    double loss_scale = 1;   // fp16: the dynamic loss scale this step ran with
    bool dynamic_loss_scale = false;  // loss_scale changes during the run (fp16)
    int64_t tokens = 0;      // trained on in this step, over the whole job
    int64_t sequences = 0;   // samples of the step, over the whole job
    // Gradient (or 1-bit Adam's compressed momentum) bytes each dp rank sent over its dp
    // group this step (ring all-reduce: 2 (dp - 1) / dp of the buffer); the same on every dp rank.
    int64_t dp_bytes_sent = 0;
    // Samples of the step replaced because their window met a corrupt block of the training
    // data (data.on_corrupt_block = "skip"), over the whole job.
    int64_t samples_replaced = 0;
    std::vector<MoeLayerRecord> moe;  // each MoE layer's; empty for a dense model
    double balance_loss = 0;  // MoE: the aux and z losses with their coefficients (not in loss)
    // train.precision = "fp8": the elements the FP8 casts saturated at their format's largest
    // value and flushed to zero this step, summed over every rank's casts (a tensor each tp
    // rank casts whole, as a column-parallel layer's input, counts once per tp rank).
    bool fp8 = false;
    double fp8_saturated = 0, fp8_flushed = 0;
    RankStepTimes rank;      // this rank's
    // Every world rank's straggler score (the fastest rank's median compute time over its
    // own, 1 for the fastest), on the steps where it was measured; empty on the others.
    std::vector<double> straggler_scores;
};

struct EvalRecord {
    int64_t step = 0;
    double val_loss = 0;
};

// Something a health check saw in a step, and what the run did about it. Every rank sees
// the same record (the statistic is reduced over the job before it is judged).
struct AnomalyRecord {
    int64_t step = 0;
    std::string kind;    // "nonfinite", "loss_spike", "grad_spike", "divergence", "transient_fault", ...
    std::string action;  // "skip", "rollback", "lower_lr", "abort", "exclude_node", "none"
    double statistic = 0;  // what was measured (a z-score, a loss ratio, ...)
    double threshold = 0;  // the limit it crossed
    std::string detail;    // words for a person: what was seen, what was skipped
    // The training data whose update was not applied: global samples [samples_begin,
    // samples_end) (none when equal), and where they come from (files, documents).
    int64_t samples_begin = 0, samples_end = 0;
    std::string samples_origin;
    int64_t rollback_to = -1;  // rollback: the step of the checkpoint restored
};

// A corrupt block of the training data, met for the first time by this process at `step`
// (data.on_corrupt_block = "skip"): the samples that meet it are replaced, its tokens are not
// trained on. Every rank sees the same record.
struct CorruptBlockRecord {
    int64_t step = 0;
    std::string shard;         // the shard file
    int64_t block = 0;         // in the shard
    int64_t first_token = 0;   // the block's tokens within the shard: [first_token, first_token + tokens)
    int64_t tokens = 0;        // lost: not trained on
    int64_t samples_replaced = 0;  // of this step, that met it first
};

class StepObserver {
public:
    virtual ~StepObserver() = default;
    virtual void after_step(const StepRecord&) {}
    virtual void after_eval(const EvalRecord&) {}
    virtual void after_anomaly(const AnomalyRecord&) {}
    virtual void after_corrupt_block(const CorruptBlockRecord&) {}
};

}  // namespace llmtrain
