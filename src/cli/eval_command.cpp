// `llmtrain eval CKPT_OR_RUN_DIR`: loss, perplexity and bits per byte of a checkpoint on
// validation sequences, computed as training's evaluation computes them (the same
// sequences, micro-batches of train.batch_size, the mean over every target token), so on the
// run's own validation data it reproduces the run's logged val_loss. More sequences than the
// validation data holds wrap around (as in training): warned, and the distinct count reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "data/batch_source.h"

namespace llmtrain {

namespace {

struct EvalArgs {
    std::string path, data, format, tokenizer, device;
    std::vector<std::string> overrides;
    int64_t sequences = 0, threads = 0;
    bool json = false;
};

struct EvalResult {
    double loss = 0;  // mean nats per target token
    int64_t tokens = 0;
    std::optional<int64_t> bytes;  // of the text the target tokens stand for
};

EvalResult evaluate(CheckpointModel& m, BatchSource& data, const TextCodec& codec, int64_t sequences) {
    const TrainConfig& t = m.config.train;
    BatchBuffers batch(t.batch_size, t.seq_len);
    EvalResult r;
    double total = 0;
    int64_t bytes = 0;
    bool has_bytes = true;
    for (int64_t first = 0; first < sequences; first += t.batch_size) {
        const int64_t rows = std::min(t.batch_size, sequences - first);
        data.fill_eval(batch, first, rows);
        const Tensor targets = batch.targets.view().slice_rows(0, rows * t.seq_len);
        total += static_cast<double>(rows) * m.model->forward(batch.inputs.view().slice_rows(0, rows * t.seq_len), targets, rows, t.seq_len);
        for (int64_t i = 0; i < targets.numel(); ++i) {
            const std::optional<int64_t> b = codec.token_bytes(targets.data<int32_t>()[i]);
            has_bytes = has_bytes && b.has_value();
            bytes += b.value_or(0);
        }
    }
    r.loss = total / static_cast<double>(sequences);
    r.tokens = sequences * t.seq_len;
    if (has_bytes) r.bytes = bytes;
    return r;
}

int run_eval(const EvalArgs& args) {
    ModelOptions options;
    options.overrides = args.overrides;
    if (!args.data.empty()) {
        // The data to evaluate stands in for the run's: read as its validation set.
        for (const char* key : {"data.train_path", "data.val_path"}) options.overrides.push_back(cat(key, "=", args.data));
        options.overrides.push_back("data.blend=");
    }
    if (!args.format.empty()) options.overrides.push_back("data.format=" + args.format);
    options.device = args.device;
    options.threads = args.threads;
    options.training_shape = true;  // micro-batches of the run's batch_size and seq_len, as its evaluations ran
    CheckpointModel m = load_checkpoint_model(args.path, options);
    const int64_t sequences = args.sequences > 0 ? args.sequences : m.config.train.eval_sequences;
    const std::unique_ptr<BatchSource> data = make_batch_source(m.config);
    // The run's own tokenizer gives the bytes per token whatever format --data comes in: the
    // saved config (with --set) before --data and --format stood in for its data.
    const Config run = parse_config(m.manifest.config_toml, m.path + "/manifest.json (config)", args.overrides, DataFiles::unchecked);
    const TextCodec codec(run, args.tokenizer);
    // A small validation set wraps around: said on stderr, so --json's stdout stays one object.
    const std::optional<int64_t> distinct = data->distinct_eval_sequences();
    if (const auto warning = repeated_eval_warning(*data, sequences, m.config.train.seq_len, "--sequences ")) log_warn("eval: ", *warning);
    const EvalResult r = evaluate(m, *data, codec, sequences);
    const double perplexity = std::exp(r.loss);
    const std::optional<double> bpb = r.bytes && *r.bytes > 0 ? std::optional<double>(r.loss * static_cast<double>(r.tokens) / (std::log(2.0) * static_cast<double>(*r.bytes))) : std::nullopt;
    if (args.json) {
        nlohmann::json j{{"checkpoint", m.path}, {"step", m.manifest.step}, {"data", data->describe()}, {"sequences", sequences},
                         {"distinct_sequences", distinct ? nlohmann::json(std::min(*distinct, sequences)) : nlohmann::json(sequences)}, {"tokens", r.tokens}, {"loss", r.loss}, {"perplexity", perplexity}};
        j["bytes"] = r.bytes ? nlohmann::json(*r.bytes) : nlohmann::json(nullptr);
        j["bits_per_byte"] = bpb ? nlohmann::json(*bpb) : nlohmann::json(nullptr);
        std::printf("%s\n", j.dump().c_str());
        return exit_ok;
    }
    const std::string repeats = distinct && *distinct < sequences ? cat(" (", *distinct, " distinct, repeated)") : "";
    std::printf("checkpoint %s (step %lld)\ndata: %s\n%lld sequences%s x %lld tokens | loss %.6f nats/token | perplexity %.4f | bits per byte %s\n",
                m.path.c_str(), static_cast<long long>(m.manifest.step), data->describe().c_str(), static_cast<long long>(sequences), repeats.c_str(),
                static_cast<long long>(m.config.train.seq_len), r.loss, perplexity, bpb ? cat(*bpb).c_str() : "n/a (no text: the run has no tokenizer)");
    return exit_ok;
}

}  // namespace

void register_eval_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<EvalArgs>();
    CLI::App* cmd = app.add_subcommand("eval", "Loss, perplexity and bits per byte of a checkpoint on validation data");
    cmd->add_option("checkpoint", args->path, "A checkpoint, a checkpoint.dir (its newest valid one) or a run directory")->required();
    cmd->add_option("--data", args->data, "Data to evaluate (default: the run's validation data), in the run's data.format or --format");
    cmd->add_option("--format", args->format, "Format of --data: text, tokens, shards, megatron, llmc, nanogpt");
    cmd->add_option("--sequences", args->sequences, "Sequences of train.seq_len tokens (default: the run's train.eval_sequences)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json that gives the bytes per token (default: the run's)");
    cmd->add_option("--device", args->device, "cpu or cuda (default: the run's train.device)")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--threads", args->threads, "CPU threads (0: every core)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--set", args->overrides, "Override a key of the saved config (repeatable)")->type_name("KEY=VALUE");
    cmd->add_flag("--json", args->json, "One JSON object instead of text");
    cmd->callback([args, &action] { action = [args] { return run_eval(*args); }; });
}

}  // namespace llmtrain
