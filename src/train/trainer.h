// The Trainer wires the layers for one rank: data windows -> this rank's part of the model
// (pipeline stage, tensor-parallel slice) over micro-batches in 1F1B order -> gradient
// reduction over the dp group in buckets, overlapped with backward (ZeRO-1: reduce-scatter)
// -> the true global gradient norm and clipping -> AdamW on this rank's part -> parameter
// all-gather (ZeRO-1) -> non-finite guard -> log line and JSONL record (rank 0);
// evaluation on the held-out split.
//
// Every layout computes the same run: the global batch of a step is dp * grad_accum
// micro-batches of batch_size sequences, numbered the same way whatever the layout, and the
// loss is the mean over all of them.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "parallel/context.h"
#include "parallel/grad_buckets.h"
#include "train/memory_plan.h"
#include "train/pipeline_runner.h"

namespace llmtrain {

struct StepRecord {
    int64_t step = 0;        // 1-based: the number of optimizer steps taken after it
    double loss = 0;         // mean over the step's micro-batches (all dp ranks)
    double lr = 0;
    double grad_norm = 0;    // before clipping, over every parameter of every rank
    double step_seconds = 0;
    double tokens_per_second = 0;
    bool skipped = false;    // update skipped by the non-finite policy or a loss-scale overflow
    double loss_scale = 1;   // fp16: the dynamic loss scale this step ran with
};

struct EvalRecord {
    int64_t step = 0;
    double val_loss = 0;
};

struct TrainResult {
    std::vector<StepRecord> steps;
    std::vector<EvalRecord> evals;
    double tokens_per_second = 0;   // over all steps but the first (warm-up)
    double train_seconds = 0;       // wall time of the steps
    double gemm_fraction = 0;       // share of step time spent in GEMMs (this rank)
    OpProfile step_profile;         // op times over the steps (this rank)
    std::string sample;             // generated text (or token ids) after training
};

struct TrainerOptions {
    std::string run_dir;            // where log.jsonl goes; empty: no files
    std::optional<DType> dtype;     // the config's compute dtype unless set (f64: reference runs in tests)
    bool quiet = false;             // no log lines (tests)
    bool synthetic_data = false;    // uniform random tokens instead of the configured data (bench)
    // The backend for the local rank in place of the configured device's (tests run the CUDA
    // path's host logic on a CPU stand-in); empty: train.device decides.
    std::function<std::unique_ptr<Backend>(int local_rank)> make_backend{};
};

class Trainer {
public:
    // A single process.
    Trainer(const Config& config, TrainerOptions options);
    // One rank of a parallel run; ctx outlives the trainer.
    Trainer(const Config& config, TrainerOptions options, ParallelContext& ctx);
    ~Trainer();
    TrainResult run();
    // One optimizer step (0-based), timed to the end of the device's work: what run() repeats.
    StepRecord train_step(int64_t step);
    Transformer& model() { return *model_; }
    Backend& backend() { return *backend_; }
    const ParallelContext& context() const { return *ctx_; }
    // What this rank holds (what plan_memory predicts), for the start-up report and the tests.
    RankMemory memory() const;
    DType compute_dtype() const { return dtype_; }

private:
    Trainer(const Config& config, TrainerOptions options, ParallelContext* shared_ctx);
    // Throws a config error when the largest rank's plan does not fit in the memory free on
    // its node; every rank reaches the same verdict.
    void check_memory() const;
    void log_startup() const;
    // Applies the update of a step whose loss and gradient norm are known, or skips it.
    void update(StepRecord& s);
    // Sum of the step's micro-batch losses over the whole job, and its gradients reduced.
    double forward_backward(int64_t step);
    void sync_tied_embedding();
    double global_grad_norm();
    double evaluate();
    std::string sample_text();
    void record(const StepRecord& s);
    void record_eval(int64_t step, double val_loss);
    void write_json_line(const std::string& line);
    bool counts_in_norm(size_t param) const;
    bool is_logger() const { return ctx_->world_rank == 0; }

    Config config_;
    TrainerOptions options_;
    std::unique_ptr<ParallelContext> own_ctx_;  // a single process's context
    ParallelContext* ctx_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<BatchSource> data_;
    std::unique_ptr<Transformer> model_;
    std::unique_ptr<GradBuckets> buckets_;
    std::unique_ptr<AdamW> optimizer_;
    std::unique_ptr<PipelineRunner> pipeline_;
    BatchBuffers batch_;
    DType dtype_;
    DynamicLossScale loss_scale_;    // dynamic under fp16; 1 otherwise
    std::ofstream jsonl_;
    TrainResult result_;
};

}  // namespace llmtrain
