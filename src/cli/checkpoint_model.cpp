#include "cli/checkpoint_model.h"

#include <filesystem>
#include <sstream>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/restore.h"
#include "cli/run_directory.h"
#include "core/error.h"
#include "core/log.h"
#include "data/batch_source.h"
#include "data/token_source.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {
// The newest valid checkpoint of the run recorded in run_dir: under the checkpoint.dir its
// records name (absolute), else its config.toml's (relative to where it ran).
std::string run_directory_checkpoint(const std::string& run_dir, const RunRecord& run) {
    const fs::path config_path = fs::path(run_dir) / "config.toml";
    std::optional<Config> config;
    if (fs::exists(config_path)) config = load_config(config_path.string(), {}, DataFiles::unchecked);
    const std::string root = !run.checkpoint_dir.empty() ? run.checkpoint_dir : config ? config->checkpoint.dir : "";
    const std::string who = cat("run directory '", run_dir, "' (", run.run_id ? describe_run(*run.run_id) : "a run of an earlier llmtrain", ")");
    if (config && config->checkpoint.every_steps == 0)
        fail(ErrorKind::data, who, " saved no checkpoint (checkpoint.every_steps = 0); give a checkpoint, or train with --set checkpoint.every_steps=N");
    if (root.empty() || !fs::is_directory(root)) fail(ErrorKind::data, who, ": its checkpoint.dir '", root, "' does not exist");
    if (!run.run_id) log_warn(who, " records no run id: using the newest valid checkpoint under '", root, "', which may be another run's");
    std::optional<std::string> found;
    try {
        found = newest_checkpoint_for_reader(root, run.run_id);
    } catch (const Error& e) {
        fail(e.kind(), who, ": ", e.what());
    }
    if (!found) fail(ErrorKind::data, who, " has no valid checkpoint of its own under '", root, "'");
    return *found;
}
}  // namespace

std::string find_checkpoint(const std::string& path) {
    if (fs::exists(fs::path(path) / "manifest.json")) {
        verify_checkpoint(path);
        return path;
    }
    const RunRecord run = read_run_record(path);
    if (run.holds_run || fs::exists(fs::path(path) / "config.toml")) return run_directory_checkpoint(path, run);
    if (!fs::is_directory(path)) fail(ErrorKind::data, "'", path, "' is not a checkpoint, a checkpoint directory or a run directory");
    const std::optional<std::string> found = newest_checkpoint_for_reader(path);
    if (!found) fail(ErrorKind::data, "'", path, "': no valid checkpoint under it (not a checkpoint, a checkpoint directory or a run directory)");
    return *found;
}

CheckpointModel load_checkpoint_model(const std::string& path, const ModelOptions& options) {
    CheckpointModel m;
    m.path = find_checkpoint(path);
    m.manifest = read_checkpoint_manifest(m.path);
    std::vector<std::string> overrides = options.overrides;
    if (!options.device.empty()) overrides.push_back("train.device=" + options.device);
    m.config = parse_config(m.manifest.config_toml, (fs::path(m.path) / "manifest.json").string() + " (config)", overrides, DataFiles::unchecked);
    const TrainConfig& t = m.config.train;
    m.backend = t.device == ComputeDevice::cuda ? make_cuda_backend(0, m.config.model.attention) : make_cpu_backend(static_cast<int>(options.threads));
    const int64_t batch = options.training_shape ? t.batch_size : 1, seq_len = options.training_shape ? t.seq_len : m.config.model.max_seq_len;
    // Evaluation sees the run's sequences as its training did: documents masked and positions
    // reset as configured. Generation decodes one prompt causally (a KV cache holds no
    // document starts).
    ModelPartition partition;
    if (options.training_shape && splits_documents(m.config.data)) {
        partition.document_mask = m.config.data.attention_mask == AttentionMask::document;
        partition.reset_position_ids = m.config.data.reset_position_ids;
        partition.document_end_token = document_end_token(m.config);
    }
    m.model = std::make_unique<Transformer>(m.config.model, *m.backend, compute_dtype(t), batch, seq_len, partition);
    load_checkpoint_weights(m.path, m.manifest, m.model->parameters(), *m.backend);
    return m;
}

TextCodec::TextCodec(const Config& config, const std::string& tokenizer_path) {
    if (!tokenizer_path.empty()) tokenizer_ = Tokenizer::load(tokenizer_path), source_ = tokenizer_path;
    else if ((tokenizer_ = run_tokenizer(config))) source_ = "the run's tokenizer";
    if (tokenizer_) kind_ = Kind::tokenizer;
    else kind_ = config.data.format == DataFormat::text ? Kind::bytes : Kind::ids;
}

std::vector<int32_t> TextCodec::encode_prompt(const std::string& prompt, bool document_start) const {
    std::vector<int32_t> ids;
    if (kind_ == Kind::tokenizer) {
        if (document_start && tokenizer_->end_of_text_id()) ids.push_back(*tokenizer_->end_of_text_id());
        tokenizer_->encode_append(prompt, ids);
    } else if (kind_ == Kind::bytes) {
        ids = bytes_to_tokens(prompt, "");
        if (document_start) ids.insert(ids.begin(), byte_eos_token);
    } else {
        std::istringstream in(prompt);
        for (std::string word; in >> word;) {
            try {
                ids.push_back(static_cast<int32_t>(std::stol(word)));
            } catch (const std::exception&) {
                fail(ErrorKind::config, "--prompt: '", word, "' is not a token id (this run has no tokenizer: give ids, or --tokenizer)");
            }
        }
    }
    if (ids.empty())
        fail(ErrorKind::config, "--prompt: no tokens to start from (", document_start ? "this run's tokenizer has no end-of-text token" : "--no-document-start",
             ": give a prompt)");
    return ids;
}

std::optional<std::string> TextCodec::document_start_token() const {
    if (kind_ == Kind::bytes) return "<|eos|>";
    if (kind_ != Kind::tokenizer || !tokenizer_->end_of_text_id()) return std::nullopt;
    return token_text(*tokenizer_->end_of_text_id());
}

std::string TextCodec::token_text(int32_t token) const {
    if (kind_ == Kind::bytes) return token == byte_eos_token ? "\n<|eos|>\n" : std::string(1, static_cast<char>(token));
    if (kind_ == Kind::ids) return cat(token, " ");
    if (token < tokenizer_->vocab_size() && !tokenizer_->spec().token_bytes[static_cast<size_t>(token)].empty()) return tokenizer_->decode(&token, 1);
    return cat("<|", token, "|>");
}

std::optional<int64_t> TextCodec::token_bytes(int32_t token) const {
    if (kind_ == Kind::ids) return std::nullopt;
    if (kind_ == Kind::bytes) return token == byte_eos_token ? 0 : 1;
    if (token >= tokenizer_->vocab_size()) return 0;
    return static_cast<int64_t>(tokenizer_->spec().token_bytes[static_cast<size_t>(token)].size());
}

std::string TextCodec::describe() const {
    if (kind_ == Kind::tokenizer) return "tokenizer " + source_;
    return kind_ == Kind::bytes ? "bytes (byte-level text)" : "token ids (the run has no tokenizer)";
}

}  // namespace llmtrain
