// `llmtrain tokenizer train|encode|decode`: train a byte-level BPE on files, and look at how a
// tokenizer (tokenizer.json or GPT-2's encoder.json + vocab.bpe) cuts text.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "core/durable_file.h"
#include "core/log.h"
#include "data/bpe_trainer.h"
#include "data/input_files.h"
#include "data/parquet_input.h"
#include "data/prepare.h"
#include "data/prepare_plan.h"
#include "data/text_input.h"
#include "data/tokenizer.h"

namespace llmtrain {

namespace {

struct TokenizerArgs {
    int64_t vocab_size = 0;
    std::vector<std::string> inputs;
    std::string output;
    bool force = false;
    std::string pattern = "gpt2";
    std::string input_format = "auto";
    std::string json_key = "text";
    std::string text_column = "text";
    std::vector<std::string> special_tokens = {"<|endoftext|>"};
    int64_t min_frequency = 2;
    std::string tokenizer;
    std::string text;
    bool per_line = false;
    std::vector<int32_t> ids;
};

// A text file is trained on as it is; a JSONL file (by --input-format, or by its name: .jsonl,
// .json, also under .gz / .zst) on its --json-key documents and a Parquet file (.parquet, .pq)
// on its --text-column, bad records left out and counted.
void add_training_text(BpeTrainer& trainer, const std::string& file, const TokenizerArgs& args) {
    PrepareOptions o;
    const InputFormat option = args.input_format == "jsonl" ? InputFormat::jsonl : args.input_format == "text" ? InputFormat::text
                               : args.input_format == "parquet" ? InputFormat::parquet : InputFormat::automatic;
    o.input_format = resolve_input_format(option, file);
    if (o.input_format == InputFormat::text) return trainer.add_text(read_input_text(file));
    o.json_key = args.json_key;
    o.text_column = args.text_column;
    o.on_bad_record = BadRecordPolicy::skip;
    std::vector<SkippedRecord> skipped;
    if (o.input_format == InputFormat::parquet) {
        const ParquetTextOptions parquet = parquet_text_options(o);
        const ParquetLayout layout = scan_parquet_layout(file, parquet);
        for (const std::string& document : parquet_documents(file, layout.text_bytes, 0, layout.text_bytes, parquet, &skipped)) trainer.add_text(document);
        if (!skipped.empty()) log_warn("tokenizer: ", skipped.size(), " row(s) of '", file, "' left out (the first: row group ", skipped.front().row_group, ", row ", skipped.front().row, ": ", skipped.front().reason, ")");
        return;
    }
    for (const std::string& document : split_documents(read_input_text(file), o, file, 1, &skipped)) trainer.add_text(document);
    if (!skipped.empty()) log_warn("tokenizer: ", skipped.size(), " record(s) of '", file, "' without a string \"", args.json_key, "\" left out (the first: line ", skipped.front().line, ")");
}

int run_train(const TokenizerArgs& args) {
    BpeTrainOptions options;
    options.vocab_size = args.vocab_size;
    options.pattern = args.pattern == "cl100k" ? kCl100kPattern : args.pattern == "qwen2" ? kQwen2Pattern : kGpt2Pattern;
    options.special_tokens = args.special_tokens;
    options.min_frequency = args.min_frequency;
    // Refused before training, not after minutes of it.
    if (!args.force && std::filesystem::exists(args.output)) fail(ErrorKind::config, "'", args.output, "' exists; pass --force to replace it");
    require_creatable(args.output, OutputKind::file, "--output");
    BpeTrainer trainer(options);
    const std::vector<std::string> files = expand_inputs(args.inputs);
    for (const std::string& file : files) add_training_text(trainer, file, args);
    const Tokenizer tokenizer = trainer.train(args.output);
    std::error_code ec;
    if (const auto parent = std::filesystem::path(args.output).parent_path(); !parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) fail(ErrorKind::io, "cannot create the directory of --output '", args.output, "': ", ec.message());
    write_file_atomically(args.output, tokenizer.to_hf_json());
    if (tokenizer.vocab_size() < args.vocab_size)
        log_warn("tokenizer: no pair occurs ", args.min_frequency, " times any more; the vocabulary stops at ", tokenizer.vocab_size(), " of ", args.vocab_size, " tokens");
    log_info("tokenizer: ", tokenizer.vocab_size(), " tokens (", tokenizer.spec().merges.size(), " merges) from ", trainer.distinct_pieces(),
             " distinct pieces of ", files.size(), " file(s) -> ", args.output);
    return 0;
}

std::string ids_line(const std::vector<int32_t>& ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += cat(i ? " " : "", ids[i]);
    return line;
}

// Text from --text, else stdin; with --lines each line (without its newline) is one text.
int run_encode(const TokenizerArgs& args) {
    const Tokenizer tokenizer = Tokenizer::load(args.tokenizer);
    std::string input = args.text;
    if (input.empty()) input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    EncodeCache cache;
    if (!args.per_line) {
        std::printf("%s\n", ids_line(tokenizer.encode(input, &cache)).c_str());
        return 0;
    }
    std::istringstream lines(input);
    for (std::string line; std::getline(lines, line);) std::printf("%s\n", ids_line(tokenizer.encode(line, &cache)).c_str());
    return 0;
}

// Ids from the command line, else whitespace-separated from stdin; raw bytes to stdout.
int run_decode(const TokenizerArgs& args) {
    const Tokenizer tokenizer = Tokenizer::load(args.tokenizer);
    std::vector<int32_t> ids = args.ids;
    if (ids.empty())
        for (int64_t id; std::cin >> id;) ids.push_back(static_cast<int32_t>(id));
    const std::string bytes = tokenizer.decode(ids);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
}

}  // namespace

void register_tokenizer_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<TokenizerArgs>();
    CLI::App* cmd = app.add_subcommand("tokenizer", "Train a byte-level BPE tokenizer, or encode / decode with one");
    cmd->require_subcommand(1);
    CLI::App* train = cmd->add_subcommand("train", "Train a byte-level BPE on text files and write tokenizer.json");
    train->add_option("--vocab-size", args->vocab_size, "Tokens in all: 256 bytes + merges + special tokens")->required();
    train->add_option("--input", args->inputs, "Input files, directories (their input files at any depth) or glob patterns (gzip / zstd read by their magic bytes)")->required();
    train->add_option("--output", args->output, "tokenizer.json to write (through a temporary file and a rename)")->required();
    train->add_flag("--force", args->force, "Replace an existing --output file");
    train->add_option("--input-format", args->input_format, "text, jsonl or parquet (auto: per file, parquet for .parquet/.pq, jsonl for .jsonl/.json, also under .gz/.zst)")
        ->check(CLI::IsMember({"auto", "text", "jsonl", "parquet"}))->capture_default_str();
    train->add_option("--json-key", args->json_key, "jsonl: the field holding the text")->capture_default_str();
    train->add_option("--text-column", args->text_column, "parquet: the (flat, string) column holding the text")->capture_default_str();
    train->add_option("--pattern", args->pattern, "Pre-tokenizer split pattern: gpt2, cl100k (Llama 3's) or qwen2 (cl100k's with single digits)")->check(CLI::IsMember({"gpt2", "cl100k", "qwen2"}))->capture_default_str();
    train->add_option("--special", args->special_tokens, "Special tokens, given the last ids")->capture_default_str();
    train->add_option("--min-frequency", args->min_frequency, "Stop merging below this pair count")->capture_default_str();
    train->callback([args, &action] { action = [args] { return run_train(*args); }; });
    CLI::App* encode = cmd->add_subcommand("encode", "Print the token ids of --text (or of stdin)");
    encode->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory with it or with encoder.json + vocab.bpe")->required();
    encode->add_option("--text", args->text, "Text to encode (default: stdin)");
    encode->add_flag("--lines", args->per_line, "Encode each input line on its own; one line of ids per line");
    encode->callback([args, &action] { action = [args] { return run_encode(*args); }; });
    CLI::App* decode = cmd->add_subcommand("decode", "Write the bytes of token ids (arguments, or stdin) to stdout");
    decode->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory with it or with encoder.json + vocab.bpe")->required();
    decode->add_option("ids", args->ids, "Token ids");
    decode->callback([args, &action] { action = [args] { return run_decode(*args); }; });
}

}  // namespace llmtrain
