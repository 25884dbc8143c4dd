// `llmtrain generate CKPT_OR_RUN_DIR`: text from a checkpoint, streamed token by token, with
// the KV cache (one position's forward per token) unless --no-kv-cache. The prompt follows the
// end-of-text token (a new document, as training's documents start) unless --no-document-start.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "model/generate.h"

namespace llmtrain {

namespace {

struct GenerateArgs {
    std::string path, prompt, tokenizer, device;
    std::vector<std::string> overrides;
    int64_t max_tokens = 256, threads = 0;
    SamplingOptions sampling;
    bool no_kv_cache = false;
    bool no_document_start = false;
};

void print_status(const std::string& line) { std::fprintf(stderr, "llmtrain: %s\n", line.c_str()); }

int run_generate(const GenerateArgs& args) {
    ModelOptions options;
    options.overrides = args.overrides;
    options.device = args.device;
    options.threads = args.threads;
    CheckpointModel m = load_checkpoint_model(args.path, options);
    const TextCodec codec(m.config, args.tokenizer);
    const std::vector<int32_t> context = codec.encode_prompt(args.prompt, !args.no_document_start);
    const std::optional<std::string> document_start = args.no_document_start ? std::nullopt : codec.document_start_token();
    SamplingOptions sampling = args.sampling;
    sampling.kv_cache = !args.no_kv_cache;
    // Status lines go to stderr: stdout is the text alone, to pipe or compare.
    print_status(cat("generate: checkpoint '", m.path, "' (step ", m.manifest.step, ") | ", codec.describe(), " | ", args.max_tokens, " tokens, temperature ",
             sampling.temperature, ", top-k ", sampling.top_k, ", top-p ", sampling.top_p, ", seed ", sampling.seed, " | KV cache ",
             sampling.kv_cache ? "on" : "off", " | prompt: ", context.size(), context.size() == 1 ? " token" : " tokens",
             document_start ? cat(", after ", *document_start, " (a new document; --no-document-start continues it mid-document)") : std::string()));
    std::fputs(args.prompt.c_str(), stdout);
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    generate_tokens(*m.model, context, args.max_tokens, sampling, [&](int32_t token) {
        const std::string text = codec.token_text(token);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fputs("\n", stdout);
    print_status(cat("generated ", args.max_tokens, " tokens in ", seconds, " s: ", static_cast<double>(args.max_tokens) / seconds, " tokens/s (KV cache ",
                     sampling.kv_cache ? "on" : "off", ")"));
    return exit_ok;
}

}  // namespace

void register_generate_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<GenerateArgs>();
    CLI::App* cmd = app.add_subcommand("generate", "Sample text from a checkpoint (any layout), streaming tokens as they are drawn");
    cmd->add_option("checkpoint", args->path, "A checkpoint, a checkpoint.dir (its newest valid one) or a run directory")->required();
    cmd->add_option("--prompt", args->prompt, "Text to continue (token ids when the run has no tokenizer), put after the end-of-text token: the model starts a new document with it "
                    "unless --no-document-start");
    cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    cmd->add_option("--temperature", args->sampling.temperature, "Logits / temperature; 0: always the most likely token")->check(CLI::Range(0.0, 100.0));
    cmd->add_option("--top-k", args->sampling.top_k, "Draw among the k most likely tokens; 0: all")->check(CLI::NonNegativeNumber);
    cmd->add_option("--top-p", args->sampling.top_p, "Draw among the most likely tokens holding this much probability")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--seed", args->sampling.seed, "Seed of the draws");
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json to encode and print with (default: the run's)");
    cmd->add_option("--device", args->device, "cpu or cuda (default: the run's train.device)")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--threads", args->threads, "CPU threads (0: every core)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--set", args->overrides, "Override a key of the saved config (repeatable)")->type_name("KEY=VALUE");
    cmd->add_flag("--no-kv-cache", args->no_kv_cache, "Recompute the whole context for every token (the reference; slower)");
    cmd->add_flag("--no-document-start", args->no_document_start,
                  "Continue the prompt as it stands, without the end-of-text token put before it by default (so it starts a new document, "
                  "as in training); a Hugging Face pipeline on the exported model prompts this way");
    cmd->callback([args, &action] { action = [args] { return run_generate(*args); }; });
}

}  // namespace llmtrain
