// The Trainer wires the layers for one rank: data windows -> this rank's part of the model
// (pipeline stage, tensor-parallel slice) over micro-batches in 1F1B order -> gradient
// reduction over the dp group in buckets, overlapped with backward (ZeRO-1: reduce-scatter;
// ZeRO-2: each micro-batch's gradients reduce-scattered group by group into this rank's shard)
// -> the true global gradient norm and clipping -> AdamW on this rank's part -> parameter
// all-gather (ZeRO-1) -> update guards (fp16 overflow, training health: health/health_monitor.h)
// -> the step record to the observers (console line, log.jsonl); evaluation on the held-out
// split; a stop signal ends the run at a step boundary. A guard's rollback restores the newest
// checkpoint and moves the data past the offending step; it is carried out here.
//
// Every layout computes the same run: the global batch of a step is dp * grad_accum
// micro-batches of batch_size sequences (train.global_batch_size, when set, fixes the
// product and grad_accum follows from dp), numbered the same way whatever the layout, and
// the loss is the mean over all of them. Evaluation covers the same train.eval_sequences
// validation sequences whatever the micro-batch size and the layout.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_snapshot.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "metrics/step_record.h"
#include "metrics/straggler.h"
#include "model/transformer.h"
#include "health/health_monitor.h"
#include "health/update_guard.h"
#include "train/moe_load.h"
#include "optim/adamw.h"
#include "optim/onebit_adam.h"
#include "optim/loss_scale.h"
#include "checkpoint/state_load.h"
#include "parallel/context.h"
#include "parallel/fully_sharded.h"
#include "parallel/gradient_sync.h"
#include "parallel/parameter_store.h"
#include "parallel/placement.h"
#include "plan/memory_plan.h"
#include "parallel/timed_comm.h"
#include "train/fault_injection.h"
#include "train/pipeline_runner.h"
#include "train/training_comms.h"

namespace llmtrain {

// What a run leaves behind. Observers see every step as it is taken (log.jsonl, metrics);
// the result keeps only the newest kStepRecordsKept records, so a month-long run's memory
// does not grow with its steps (a record is ~0.3 KB, ~1 KB with the comm rows of a multi-rank
// step and a world-sized straggler vector).
struct TrainResult {
    static constexpr size_t kStepRecordsKept = 1024;
    std::deque<StepRecord> steps;   // the newest kStepRecordsKept steps of this run, oldest first
    int64_t steps_taken = 0;        // steps of this run (after its start step), all of them
    int64_t last_step = 0;          // the step the state is at: the last one taken, after any rollback
    std::vector<EvalRecord> evals;
    double tokens_per_second = 0;   // over all steps but the first (warm-up)
    double train_seconds = 0;       // wall time of the steps
    double gemm_fraction = 0;       // share of step time spent in GEMMs (this rank)
    OpProfile step_profile;         // op times over the steps (this rank)
    std::string sample;             // generated text (or token ids) after training
    int stop_signal = 0;            // the signal that stopped the run before its last step; 0: it ran to the end
};

struct TrainerOptions {
    std::optional<DType> dtype{};   // the config's compute dtype unless set (f64: reference runs in tests)
    bool quiet = false;             // no log lines (tests)
    bool synthetic_data = false;    // uniform random tokens instead of the configured data (bench)
    // The backend for the local rank in place of the configured device's (tests run the CUDA
    // path's host logic on a CPU stand-in); empty: train.device decides.
    std::function<std::unique_ptr<Backend>(int local_rank)> make_backend{};
    // Told of every step and evaluation, in order (console line, log.jsonl, tests).
    std::vector<StepObserver*> observers{};
    // Polled at every step boundary: a signal number (any rank's) ends the run there; empty: never.
    std::function<int()> stop_signal{};
    // The streams and collectives of parallel.comm = "nccl" in place of CUDA's and NCCL's
    // (tests run the event-ordered path on a CPU stand-in); empty: CUDA and NCCL.
    DeviceCommFactory device_comms{};
    // The table the context's groups add their time to (parallel/timed_comm.h); each step's
    // record gets what its step spent in each operation. Null: no communication times.
    const CommTimes* comm_times = nullptr;
    // Called before a rollback: waits for a save in flight and commits it, so that the newest
    // checkpoint is on disk; empty: nothing is saved behind the trainer's back.
    std::function<void()> settle_checkpoints{};
    // The run this process starts or continues (checkpoint/manifest.h): its checkpoints carry
    // it, and a rollback restores only its own. Empty: the chain of a format-1 checkpoint.
    std::string run_id{};
    // Fault drills (train/fault_injection.h), read once by the command; empty: none.
    FaultPlan faults{};
};

class Trainer {
public:
    // A single process.
    Trainer(const Config& config, TrainerOptions options);
    // One rank of a parallel run; ctx outlives the trainer.
    Trainer(const Config& config, TrainerOptions options, ParallelContext& ctx);
    ~Trainer();
    TrainResult run();
    // Adds an observer of every step and evaluation to come; it must outlive run().
    void observe(StepObserver& observer) { options_.observers.push_back(&observer); }
    // Called before a rollback (TrainerOptions::settle_checkpoints).
    void settle_checkpoints_with(std::function<void()> settle) { options_.settle_checkpoints = std::move(settle); }
    // Adds a guard judged after the built-in ones (fp16 overflow, non-finite); it must outlive run().
    void guard(UpdateGuard& guard) { guards_.push_back(&guard); }
    // One optimizer step (0-based), timed to the end of the device's work: what run() repeats.
    StepRecord train_step(int64_t step);
    Transformer& model() { return *model_; }
    Backend& backend() { return *backend_; }
    const ParallelContext& context() const { return *ctx_; }
    // What this rank holds (what plan_memory predicts), for the start-up report and the tests.
    RankMemory memory() const;
    // Bytes this rank sent in ZeRO-3's parameter all-gathers since the start (0 otherwise).
    int64_t parameter_gather_bytes_sent() const { return store_->bytes_sent(); }
    DType compute_dtype() const { return dtype_; }
    // The config this run computes with: the user's, with train.grad_accum as this mesh
    // resolves it (never 0).
    const Config& config() const { return config_; }
    // The config as the user gave it (what a checkpoint records).
    const Config& given_config() const { return given_config_; }

    // Where this rank's state lives in the job (parallel/placement.h).
    const Placement& placement() const { return *placement_; }
    // Checkpoints. What this rank writes (its share of the state, as it is: no collective),
    // and the manifest's fields, after step `step`.
    SnapshotSource snapshot_source();
    Manifest manifest_at(int64_t step) const;
    // Continues from the checkpoint at path (its manifest read already): weights, moments,
    // loss scale, data position; run() then starts at manifest.step. Each rank reads its
    // share (checkpoint/state_load.h); the seconds and bytes read are logged.
    void restore(const std::string& path, const Manifest& manifest);
    int64_t start_step() const { return start_step_; }
    // Resumes from a checkpoint before this process (0 for a fresh run).
    int64_t restarts() const { return resumes_; }
    // Steps whose updates the weights hold now: where run() is (after an abort: the state a
    // checkpoint may save).
    int64_t current_step() const { return current_step_; }
    // Whether every master weight is finite (the whole job agrees): an aborted run saves only then.
    bool weights_finite();
    const HealthMonitor& health() const { return *health_; }
    // Starts from Hugging Face weights or an llmtrain checkpoint's (train.init_from,
    // checkpoint/initial_weights.h) in place of the random initialization: this rank's part of
    // every parameter; step 0 and a fresh optimizer all the same.
    void load_initial_weights(const std::string& path);

private:
    Trainer(const Config& config, TrainerOptions options, ParallelContext* shared_ctx);
    void log_startup() const;
    void log_schedule_notes() const;
    void close_fp8_step();  // after the optimizer step (model/fp8_linear.h)
    // Applies the update of a step whose loss and gradient norm are known, or skips it, or
    // rolls back (as the guards decide).
    void update(StepRecord& s);
    // The step's loss and gradient norm from the current weights, with the faults a drill
    // injects (a re-run meets them again, but for a bit flip, which happens once).
    void compute_step(int64_t step, StepRecord& s);
    // monitor.rerun_on_anomaly: computes step `first.step` again and compares, rank by rank.
    RerunResult rerun_step(const StepRecord& first);
    // Restores the newest checkpoint and moves the data past the offending step plus
    // monitor.skip_batches, recording the skip in that checkpoint's manifest.
    void roll_back(int64_t offending_step, AnomalyRecord& event);
    std::string agreed_rollback_checkpoint(int64_t offending_step, const std::string& kind);
    // Completes an event (the data skipped), logs it and hands it to the observers.
    void report(AnomalyRecord& event, int64_t step);
    // The 1-based step whose data step `step` (0-based) reads: itself unless data was skipped.
    int64_t data_step(int64_t step) const;
    uint64_t global_batch() const;
    // The learning rate's factor at 1-based step `step`: the guards' (lower_lr) and a drill's.
    double lr_scale(int64_t step) const;
    // "host h, gpu 3" of world rank `rank`, the same text on every rank.
    std::string place_of(int rank);
    void restore_rank_local_state(const std::string& path, const Manifest& manifest);
    // The step's forwards and backwards: its mean losses summed on the device (the model's
    // loss_sum()), its gradients reduced over dp.
    void forward_backward(int64_t step);
    // The step's closing scalars: this rank's loss sum and gradient sums of squares summed on
    // the device (one fused reduction over the counted parameters, another over the rest),
    // read in one host synchronization, then agreed with every rank's stop signal in one
    // small reduction. Sets s.loss, s.grad_norm (still times the loss scale) and
    // agreed_stop_signal_.
    void close_step(StepRecord& s);
    // The training samples every rank replaced this step (they met a corrupt block) into
    // s.samples_replaced; a corrupt block not reported before, logged and told to the observers.
    void report_replaced_samples(StepRecord& s, const std::vector<ReplacedSample>& mine);
    // Every rank's replaced samples, by global sample (a collective over the world).
    std::map<uint64_t, ReplacedSample> gather_replaced_samples(const std::vector<ReplacedSample>& mine);
    void scale_gradients(double factor);
    void flip_gradient_bit();
    void sync_tied_embedding();
    void poison_gradients();
    double evaluate();
    std::string sample_text();
    void record(const StepRecord& s);
    void record_eval(int64_t step, double val_loss);
    // Every straggler_interval_steps: every rank's score into s (one collective), logged below the threshold.
    void measure_stragglers(StepRecord& s);
    // The stop signal of any rank, the same on every rank (the closing reduction's sum told
    // that one was raised; this agrees which); 0: go on.
    int agreed_stop_signal(int local_signal);
    // The signal that ends the run after the step just recorded; 0: go on.
    int stop_signal_after_step();
    bool counts_in_norm(size_t param) const;
    std::unique_ptr<GradientSync> make_gradient_sync();
    std::unique_ptr<ParameterStore> make_parameter_store();
    Fp8ParamGather fp8_param_gather();
    // This rank's state and the groups it shares it with, for a load.
    RankState rank_state(bool with_optimizer);
    // Loads the checkpoint at path into this rank's state (weights, moments, rank-local
    // state), logging the bytes read and the seconds ("resume" or "rollback").
    void load_checkpoint(const std::string& path, const Manifest& manifest, const char* why);
    bool is_logger() const { return ctx_->world_rank == 0; }

    TrainerOptions options_;
    std::unique_ptr<ParallelContext> own_ctx_;  // a single process's context
    ParallelContext* ctx_;
    const Config given_config_;  // as the user gave it
    const Config config_;        // resolved on this run's mesh (resolve_on_mesh)
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<TrainingComms> comms_;  // the groups' Comms for device tensors
    std::unique_ptr<BatchSource> data_;
    std::unique_ptr<Transformer> model_;
    std::unique_ptr<Placement> placement_;
    std::unique_ptr<GradientSync> sync_;      // GradBuckets (ZeRO 0, 1) or ShardedGradients (ZeRO 2, 3)
    std::unique_ptr<ParameterStore> store_;   // ReplicatedParameters (ZeRO 0-2) or FullyShardedParameters (ZeRO 3)
    std::unique_ptr<AdamW> optimizer_;
    std::unique_ptr<PipelineRunner> pipeline_;
    BatchBuffers batch_;
    DType dtype_;
    DynamicLossScale loss_scale_;    // dynamic under fp16; 1 otherwise
    MoeBalance moe_balance_{config_};  // the MoE layers' step figures and expert biases
    int64_t start_step_ = 0;         // steps taken before this process (a resumed run)
    double first_step_seconds_ = 0;  // this run's first step: warm-up, left out of tokens/s
    int64_t tokens_seen_ = 0;        // over the whole job, since the run's first step
    int64_t resumes_ = 0;            // resumes from a checkpoint before this process
    double data_wait_seconds_ = 0;   // of the step under way
    ComputeTimeWindow compute_times_{0};
    std::vector<std::unique_ptr<UpdateGuard>> own_guards_;
    std::vector<UpdateGuard*> guards_;  // in the order they judge
    HealthMonitor* health_ = nullptr;   // one of own_guards_
    int64_t current_step_ = 0;          // 0-based step being run
    std::optional<int64_t> rollback_to_;  // set by a rollback: the loop continues from there
    // This rank's partial results of the last computed step, which a re-run compares: its
    // share of the loss sum and of the gradients' sum of squares.
    double local_loss_ = 0, local_grad_square_sum_ = 0;
    // On the device, f64: [the loss sum, the counted gradients' sum of squares, the others'].
    OwnedTensor step_scalars_;
    int agreed_stop_signal_ = 0;  // as of the last closed step
    using CorruptBlockKey = std::tuple<uint32_t, uint64_t, uint32_t>;  // (source, shard, block)
    std::set<CorruptBlockKey> reported_blocks_;  // corrupt blocks reported by this process
    bool gradients_reduced_ = true;  // this step's gradients were reduced over dp (not so under 1-bit Adam after its freeze)
    TrainResult result_;
};

}  // namespace llmtrain
