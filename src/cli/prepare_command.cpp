// `llmtrain prepare`: tokenize text / JSONL into a dataset directory. Under mpirun (or any
// launcher that sets the MPI environment) the ranks share the work units; alone it is one
// process. Either way the threads of a process share its units.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "core/durable_file.h"
#include "core/log.h"
#include "data/input_files.h"
#include "data/prepare.h"
#include "parallel/launch_env.h"
#include "parallel/mpi_comm.h"

namespace llmtrain {

namespace {

struct PrepareArgs {
    std::string tokenizer;
    std::vector<std::string> inputs;
    std::string output;
    bool force = false;
    std::string input_format = "auto";
    std::string separator;
    std::string json_key = "text";
    std::string text_column = "text";
    std::string on_bad_record = "abort";
    std::string output_format = "shards";
    double val_fraction = 0.0;
    uint64_t seed = 1234;
    int threads = 0;
    double unit_mb = 16;
    uint32_t block_tokens = kDefaultBlockTokens;
    int zstd_level = 3;
};

// "\n%\n" typed on a command line arrives as backslash-n; C escapes make separators typable.
std::string unescape(const std::string& text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\' || i + 1 == text.size()) { out += text[i]; continue; }
        const char c = text[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == '0' ? '\0' : c;
    }
    return out;
}

// Ranks on this node, so that the default thread count shares the cores among them.
int local_ranks() { return std::max(1, launch_environment().local_size); }

// MPI for the length of the command when a launcher started it; otherwise one rank.
class RankSession {
public:
    RankSession() {
        if (!launched_by_mpi()) return;
        mpi_.emplace();
        group_.rank = mpi_->world_rank();
        group_.size = mpi_->world_size();
        // Token and byte counts: 64-bit sums, which the Comm interface's float reductions do not carry.
        group_.sum_u64 = [](std::vector<uint64_t>& values) {
            MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        };
        if (group_.size > 1) set_log_rank(group_.rank);
    }
    const RankGroup& group() const { return group_; }
    bool active() const { return mpi_.has_value(); }

private:
    std::optional<MpiSession> mpi_;
    RankGroup group_;
};

PrepareOptions options_from(const PrepareArgs& args) {
    PrepareOptions o;
    o.inputs = expand_inputs(args.inputs);
    o.input_format = args.input_format == "jsonl" ? InputFormat::jsonl : args.input_format == "text" ? InputFormat::text
                   : args.input_format == "parquet" ? InputFormat::parquet : InputFormat::automatic;
    o.on_bad_record = args.on_bad_record == "skip" ? BadRecordPolicy::skip : BadRecordPolicy::abort;
    o.separator = unescape(args.separator);
    o.json_key = args.json_key;
    o.text_column = args.text_column;
    o.output_dir = args.output;
    o.replace = args.force;
    o.output_format = args.output_format == "megatron" ? OutputFormat::megatron
                      : args.output_format == "llmc"   ? OutputFormat::llmc
                      : args.output_format == "nanogpt" ? OutputFormat::nanogpt
                                                        : OutputFormat::shards;
    o.val_fraction = args.val_fraction;
    o.seed = args.seed;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.threads = args.threads > 0 ? args.threads : std::max(1, cores / (launched_by_mpi() ? local_ranks() : 1));
    o.unit_bytes = static_cast<uint64_t>(args.unit_mb * 1e6);
    o.block_tokens = args.block_tokens;
    o.zstd_level = args.zstd_level;
    o.progress = isatty(STDERR_FILENO) != 0;
    return o;
}

int run_prepare(const PrepareArgs& args) {
    RankSession session;
    const RankGroup& group = session.group();
    try {
        require_creatable(args.output, OutputKind::directory, "--output");
        const PrepareOptions options = options_from(args);
        const Tokenizer tokenizer = Tokenizer::load(args.tokenizer);
        const PrepareSummary s = prepare_dataset(tokenizer, tokenizer.to_hf_json(), options, group);
        if (group.rank == 0) {
            const double mb = static_cast<double>(s.input_bytes) / 1e6;
            const int cores = options.threads * group.size;
            log_info("prepare: ", s.documents, " documents, ", mb, " MB in ", s.units, " unit(s) -> ", s.train_tokens, " train + ", s.val_tokens, " val tokens in ",
                     args.output, " | ", s.seconds, " s, ", mb / s.seconds, " MB/s on ", cores, " thread(s): ", mb / s.seconds / cores, " MB/s per thread");
            if (s.skipped_records > 0)
                log_warn("prepare: ", s.skipped_records, " bad record(s) skipped; each is listed (file, line or row group and row, reason) in ", args.output, "/skipped-records.jsonl");
        }
        return 0;
    } catch (const Error& e) {
        if (!session.active() || group.size == 1) throw;
        // Another rank may wait in a collective: report here and end every rank.
        std::fprintf(stderr, "llmtrain: rank %d: %s: %s\n", group.rank, error_kind_name(e.kind()), e.what());
        std::fflush(stderr);
        MpiSession::abort_job(2);
    }
}

}  // namespace

void register_prepare_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<PrepareArgs>();
    CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text, JSONL or Parquet files into a dataset of compressed token shards");
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory with it or with GPT-2's encoder.json + vocab.bpe")->required();
    cmd->add_option("--input", args->inputs, "Input files, directories (their input files at any depth) or glob patterns, each sorted; gzip and zstd are read by their magic bytes")->required();
    cmd->add_option("--output", args->output, "Dataset directory to write (written beside it, then swapped in)")->required();
    cmd->add_flag("--force", args->force, "Replace the dataset already in --output");
    cmd->add_option("--input-format", args->input_format, "text, jsonl or parquet (auto: per file, parquet for .parquet/.pq, jsonl for .jsonl/.json, also under .gz/.zst)")
        ->check(CLI::IsMember({"auto", "text", "jsonl", "parquet"}))->capture_default_str();
    cmd->add_option("--on-bad-record", args->on_bad_record, "a JSONL line that is not an object with a string --json-key field, or a Parquet row whose text is null or not UTF-8, ends the run naming file:line or file, row group and row (abort) or is left out and listed in DIR/skipped-records.jsonl (skip)")
        ->check(CLI::IsMember({"abort", "skip"}))->capture_default_str();
    cmd->add_option("--separator", args->separator, "text: split files into documents at this string (C escapes: \\n); default one document per file");
    cmd->add_option("--json-key", args->json_key, "jsonl: the field holding the text")->capture_default_str();
    cmd->add_option("--text-column", args->text_column, "parquet: the (flat, string) column holding the text")->capture_default_str();
    cmd->add_option("--output-format", args->output_format, "shards (llmtrain), megatron (.bin/.idx), llmc, nanogpt")
        ->check(CLI::IsMember({"shards", "megatron", "llmc", "nanogpt"}))->capture_default_str();
    cmd->add_option("--val-fraction", args->val_fraction, "Share of documents held out for validation")->check(CLI::Range(0.0, 0.5))->capture_default_str();
    cmd->add_option("--seed", args->seed, "Seed of the train/validation split")->capture_default_str();
    cmd->add_option("--threads", args->threads, "Threads per process (0: the cores, shared among the ranks of a node)")->capture_default_str();
    cmd->add_option("--unit-mb", args->unit_mb, "Input MB per work unit and shard")->check(CLI::Range(0.001, 65536.0))->capture_default_str();
    cmd->add_option("--block-tokens", args->block_tokens, "Tokens per compressed block (random-access granularity)")->check(CLI::Range(256u, 16u << 20))->capture_default_str();
    cmd->add_option("--zstd-level", args->zstd_level, "zstd compression level")->check(CLI::Range(1, 19))->capture_default_str();
    cmd->callback([args, &action] { action = [args] { return run_prepare(*args); }; });
}

}  // namespace llmtrain
