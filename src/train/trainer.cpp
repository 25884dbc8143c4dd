#include "train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/timer.h"
#include "data/batch_windows.h"
#include "model/generate.h"
#include "optim/lr_schedule.h"

namespace llmtrain {

namespace {
std::string megabytes(double bytes) { return cat(std::round(bytes / 1e5) / 10, " MB"); }

std::string fixed(double value, int decimals) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
    return buffer;
}

std::string scientific(double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.2e", value);
    return buffer;
}

// total += after - before, op by op: the op time of the training steps alone, not evaluation.
void add_profile_difference(OpProfile& total, const OpProfile& before, const OpProfile& after) {
    for (size_t i = 0; i < static_cast<size_t>(op_count); ++i) {
        total.seconds[i] += after.seconds[i] - before.seconds[i];
        total.calls[i] += after.calls[i] - before.calls[i];
    }
}

}  // namespace

Trainer::Trainer(const Config& config, TrainerOptions options) : config_(config), options_(std::move(options)) {
    backend_ = make_cpu_backend(static_cast<int>(config_.train.threads));
    data_ = make_batch_source(config_);
    model_ = std::make_unique<Transformer>(config_.model, *backend_, options_.dtype, config_.train.batch_size, config_.train.seq_len);
    model_->initialize(config_.train.seed);
    optimizer_ = std::make_unique<AdamW>(config_.optimizer, model_->parameters());
    if (!options_.run_dir.empty() && config_.metrics.jsonl) {
        const std::string path = (std::filesystem::path(options_.run_dir) / "log.jsonl").string();
        jsonl_.open(path, std::ios::out | std::ios::trunc);
        if (!jsonl_) fail(ErrorKind::io, "cannot write '", path, "'");
    }
}

void Trainer::log_startup() const {
    if (options_.quiet) return;
    const ModelConfig& m = config_.model;
    const TrainConfig& t = config_.train;
    const Parameters& p = model_->parameters();
    log_info("model ", family_name(m.family), ": ", m.n_layers, " layers, d_model ", m.d_model, ", ", m.n_heads, " heads (", m.n_kv_heads,
             " kv), d_ff ", m.d_ff, ", vocab ", m.vocab_size, " | ", fixed(static_cast<double>(p.total_numel()) / 1e6, 3), "M parameters");
    log_info("memory: parameters ", megabytes(static_cast<double>(p.all_values().bytes())), ", gradients ", megabytes(static_cast<double>(p.all_grads().bytes())),
             ", optimizer ", megabytes(static_cast<double>(optimizer_->state_bytes())), ", activations ", megabytes(static_cast<double>(model_->activation_bytes())),
             " (planned) | backend ", backend_->name(), " ", dtype_name(options_.dtype));
    log_info("data: ", data_->describe(), " | batch ", t.batch_size, " x ", t.seq_len, " x ",
             t.grad_accum, " micro-batches = ", t.batch_size * t.seq_len * t.grad_accum, " tokens per step");
}

TrainResult Trainer::run() {
    log_startup();
    record_eval(0, evaluate());
    const int64_t steps = config_.train.steps;
    for (int64_t step = 0; step < steps; ++step) {
        const OpProfile before = backend_->profile();
        const StepRecord s = train_step(step);
        add_profile_difference(result_.step_profile, before, backend_->profile());
        result_.train_seconds += s.step_seconds;
        record(s);
        const bool last = step + 1 == steps;
        if (last || (config_.train.eval_every > 0 && (step + 1) % config_.train.eval_every == 0)) record_eval(step + 1, evaluate());
    }
    result_.gemm_fraction = result_.train_seconds > 0 ? result_.step_profile.gemm_seconds() / result_.train_seconds : 0;
    double timed_seconds = 0;
    for (size_t i = steps > 1 ? 1 : 0; i < result_.steps.size(); ++i) timed_seconds += result_.steps[i].step_seconds;
    const int64_t timed_steps = steps > 1 ? steps - 1 : steps;
    const double tokens_per_step = static_cast<double>(config_.train.batch_size * config_.train.seq_len * config_.train.grad_accum);
    result_.tokens_per_second = tokens_per_step * static_cast<double>(timed_steps) / timed_seconds;
    result_.sample = sample_text();
    return result_;
}

StepRecord Trainer::train_step(int64_t step) {
    const TrainConfig& t = config_.train;
    Stopwatch clock;
    Parameters& params = model_->parameters();
    backend_->fill_zero(params.all_grads());
    BatchBuffers batch(t.batch_size, t.seq_len);
    double loss_sum = 0;
    for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
        data_->fill_train(batch, step, micro, /*dp_rank=*/0, /*dp_size=*/1);
        loss_sum += model_->forward(batch.inputs, batch.targets, t.batch_size, t.seq_len);
        // Each micro-batch contributes 1/grad_accum of the step's mean loss.
        model_->backward(1.0 / static_cast<double>(t.grad_accum));
    }
    StepRecord s;
    s.step = step + 1;
    s.loss = loss_sum / static_cast<double>(t.grad_accum);
    s.grad_norm = global_grad_norm(*backend_, params);
    s.lr = learning_rate_at(config_.optimizer, step, t.steps);
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
        if (config_.monitor.on_nonfinite == NonFinitePolicy::abort)
            fail(ErrorKind::runtime, "step ", s.step, ": non-finite ", std::isfinite(s.loss) ? "gradient norm" : "loss", " (loss ", s.loss, ", grad norm ",
                 s.grad_norm, "); aborting as monitor.on_nonfinite = \"abort\" (\"skip\" skips such updates)");
        s.skipped = true;
    } else {
        optimizer_->step(*backend_, s.lr, clip_scale(s.grad_norm, config_.optimizer.grad_clip));
    }
    s.step_seconds = clock.seconds();
    s.tokens_per_second = static_cast<double>(t.batch_size * t.seq_len * t.grad_accum) / s.step_seconds;
    return s;
}

double Trainer::evaluate() {
    const TrainConfig& t = config_.train;
    BatchBuffers batch(t.batch_size, t.seq_len);
    double total = 0;
    for (int64_t i = 0; i < t.eval_batches; ++i) {
        data_->fill_eval(batch, i);
        total += model_->forward(batch.inputs, batch.targets, t.batch_size, t.seq_len);
    }
    return total / static_cast<double>(t.eval_batches);
}

std::string Trainer::sample_text() {
    const TrainConfig& t = config_.train;
    if (t.sample_tokens == 0) return "";
    const std::vector<int32_t> context = data_->prompt_tokens(t.sample_prompt);
    const std::vector<int32_t> generated = generate_tokens(*model_, context, t.sample_tokens, t.sample_temperature, t.seed);
    const std::string text = data_->printable(generated);
    if (!options_.quiet) log_info("sample (", t.sample_tokens, " tokens, temperature ", t.sample_temperature, "):\n", t.sample_prompt, text);
    return t.sample_prompt + text;
}

void Trainer::record(const StepRecord& s) {
    result_.steps.push_back(s);
    if (s.skipped) log_warn("step ", s.step, ": non-finite loss or gradient; update skipped (monitor.on_nonfinite = \"skip\")");
    if (!options_.quiet && (s.step % config_.train.log_every == 0 || s.step == config_.train.steps))
        log_info("step ", s.step, "/", config_.train.steps, " | loss ", fixed(s.loss, 4), " | lr ", scientific(s.lr), " | grad norm ", fixed(s.grad_norm, 4), " | ",
                 std::lround(s.tokens_per_second), " tok/s | ", fixed(s.step_seconds * 1e3, 1), " ms");
    nlohmann::json line = {{"event", "step"},     {"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
                           {"step_ms", s.step_seconds * 1e3}, {"tokens_per_second", s.tokens_per_second}, {"skipped", s.skipped}};
    write_json_line(line.dump());
}

void Trainer::record_eval(int64_t step, double val_loss) {
    result_.evals.push_back({step, val_loss});
    if (!options_.quiet) log_info("eval at step ", step, ": val loss ", fixed(val_loss, 4), " (perplexity ", fixed(std::exp(val_loss), 2), ")");
    write_json_line(nlohmann::json{{"event", "eval"}, {"step", step}, {"val_loss", val_loss}}.dump());
}

void Trainer::write_json_line(const std::string& line) {
    if (!jsonl_.is_open()) return;
    jsonl_ << line << '\n';
    jsonl_.flush();
    if (!jsonl_) fail(ErrorKind::io, "cannot write log.jsonl in '", options_.run_dir, "'");
}

}  // namespace llmtrain
