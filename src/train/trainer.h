// The Trainer wires the layers for one process: data windows -> model forward/backward
// over micro-batches -> global gradient norm and clipping -> AdamW with the LR schedule ->
// non-finite guard -> log line and JSONL record; evaluation on the held-out split.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace llmtrain {

struct StepRecord {
    int64_t step = 0;        // 1-based: the number of optimizer steps taken after it
    double loss = 0;         // mean over the step's micro-batches
    double lr = 0;
    double grad_norm = 0;    // before clipping
    double step_seconds = 0;
    double tokens_per_second = 0;
    bool skipped = false;    // update skipped by the non-finite policy
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
    double gemm_fraction = 0;       // share of step time spent in GEMMs
    OpProfile step_profile;         // op times over the steps
    std::string sample;             // generated text (or token ids) after training
};

struct TrainerOptions {
    std::string run_dir;            // where log.jsonl goes; empty: no files
    DType dtype = DType::f32;       // f64 for reference runs in tests
    bool quiet = false;             // no log lines (tests)
};

class Trainer {
public:
    Trainer(const Config& config, TrainerOptions options);
    TrainResult run();
    Transformer& model() { return *model_; }

private:
    void log_startup() const;
    StepRecord train_step(int64_t step);
    double evaluate();
    std::string sample_text();
    void record(const StepRecord& s);
    void record_eval(int64_t step, double val_loss);
    void write_json_line(const std::string& line);

    Config config_;
    TrainerOptions options_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<BatchSource> data_;
    std::unique_ptr<Transformer> model_;
    std::unique_ptr<AdamW> optimizer_;
    std::ofstream jsonl_;
    TrainResult result_;
};

}  // namespace llmtrain
