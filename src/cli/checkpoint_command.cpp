// `llmtrain checkpoint list|verify|inspect|export`: what is under a checkpoint.dir, whether
// each checkpoint would load (every checksum), what one holds (state, mesh, files, every
// tensor's placement: which rank files hold which boxes of it), and its weights as Hugging
// Face model.safetensors + config.json.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_assembly.h"
#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "core/staged_directory.h"
#include "core/timer.h"
#include "data/batch_source.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

struct CheckpointArgs {
    std::string path;
    std::string out_dir;
    std::string format = "safetensors";
    std::string tokenizer;
    bool config = false;
    bool pieces = false;
    bool force = false;
};

std::string megabytes(uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", static_cast<double>(bytes) / 1e6);
    return text;
}

// The bytes and the number of files directly in a checkpoint directory.
std::pair<uint64_t, int> directory_size(const std::string& path) {
    uint64_t bytes = 0;
    int files = 0;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
        if (!entry.is_regular_file()) continue;
        bytes += entry.file_size(ec);
        ++files;
    }
    return {bytes, files};
}

bool has_manifest(const std::string& path) { return fs::exists(fs::path(path) / "manifest.json"); }

// The checkpoint a path names, verified before anything reads it: a checkpoint directory as
// given, the one a checkpoint.dir's `latest` names, or a run directory's own newest.
std::string resolve_checkpoint(const std::string& path) {
    if (!fs::is_directory(path)) fail(ErrorKind::data, "'", path, "' is not a directory");
    if (has_manifest(path)) {
        verify_checkpoint(path);
        return path;
    }
    if (const std::optional<std::string> latest = latest_checkpoint_for_reader(path)) return *latest;
    if (fs::exists(fs::path(path) / "log.jsonl") || fs::exists(fs::path(path) / "config.toml")) return find_checkpoint(path);
    fail(ErrorKind::data, "'", path, "' has no manifest.json (an incomplete save, or not a checkpoint), no 'latest', and is not a run directory");
}

// Every tensor of a rank file that fails to read (chunk checksum, damaged metadata): the
// file's XXH64 says only that the file is damaged, this says where.
std::vector<std::string> damaged_tensors(const std::string& file) {
    std::vector<std::string> damaged;
    try {
        const RankFileReader reader(file);
        for (const SavedTensor& t : reader.tensors()) {
            try {
                reader.read(t);
            } catch (const Error& e) {
                damaged.push_back(e.what());
            }
        }
    } catch (const Error& e) {
        damaged.push_back(e.what());
    }
    return damaged;
}

// Ranks as "0-3, 6": which rank files hold a tensor's parts, short for large worlds.
std::string rank_ranges(const std::set<int>& ranks) {
    std::string text;
    for (auto it = ranks.begin(); it != ranks.end();) {
        const int first = *it;
        int last = first;
        while (++it != ranks.end() && *it == last + 1) ++last;
        text += cat(text.empty() ? "" : ", ", first, last > first ? cat(last == first + 1 ? ", " : "-", last) : "");
    }
    return text;
}

// How a tensor is stored: "whole" (one piece holds it), else its pieces and whose files.
std::string placement_description(const std::vector<const StoredPiece*>& pieces) {
    if (pieces.size() == 1 && pieces.front()->tensor.boxes.size() == 1 && pieces.front()->tensor.boxes.front().box == whole_box(pieces.front()->tensor.global_shape))
        return "whole";
    size_t boxes = 0;
    for (const StoredPiece* p : pieces) boxes += p->tensor.boxes.size();
    return cat(boxes, boxes == 1 ? " box" : " boxes");
}

std::set<int> ranks_holding(const std::vector<const StoredPiece*>& pieces) {
    std::set<int> ranks;
    for (const StoredPiece* p : pieces) ranks.insert(p->file);
    return ranks;
}

// ---- list ----

std::string list_status(const CheckpointEntry& entry) {
    if (!entry.committed) return "incomplete (no manifest)";
    const std::optional<std::string> problem = checkpoint_problem(entry.path);
    return problem ? *problem : "ok";
}

int run_list(const CheckpointArgs& args) {
    if (!fs::is_directory(args.path)) fail(ErrorKind::data, "'", args.path, "' is not a directory (expected a checkpoint.dir)");
    const std::vector<CheckpointEntry> entries = list_checkpoints(args.path);
    if (entries.empty()) {
        std::printf("no checkpoints under '%s'\n", args.path.c_str());
        return exit_ok;
    }
    std::optional<std::string> latest;
    try {
        latest = latest_checkpoint(args.path);
    } catch (const Error&) {
        // A damaged `latest` marks nothing; resuming with --resume auto does not read it.
    }
    // files: everything in the directory, the rank files and manifest.json.
    std::printf("%-10s %10s %6s  %s\n", "step", "size MB", "files", "status (files: rank files + manifest.json)");
    for (const CheckpointEntry& e : entries) {
        const auto [bytes, files] = directory_size(e.path);
        const bool is_latest = latest && fs::equivalent(*latest, e.path);
        std::printf("%-10lld %10s %6d  %s%s\n", static_cast<long long>(e.step), megabytes(bytes).c_str(), files, list_status(e).c_str(),
                    is_latest ? "  <- latest" : "");
    }
    return exit_ok;
}

// ---- verify ----

// Verifies one checkpoint fully; prints its verdict. Returns its problem, if any.
std::optional<std::string> verify_one(const std::string& path) {
    if (!has_manifest(path)) {
        const std::string problem = cat("'", path, "' is incomplete (no manifest.json: a save that did not finish)");
        std::printf("%s: INCOMPLETE (no manifest.json)\n", path.c_str());
        return problem;
    }
    const Stopwatch clock;
    const std::optional<std::string> problem = checkpoint_problem(path, Verification::full);
    if (!problem) {
        const double seconds = clock.seconds();
        const Manifest m = read_checkpoint_manifest(path);
        const auto [bytes, files] = directory_size(path);
        // The rate is that of a save's host passes too (each rank's writer checksums its file
        // the same two ways): scripts/bench-checkpoint.sh reads it for plan's storage.checksum_gbps.
        std::printf("%s: ok (step %lld, %zu rank file(s) and manifest.json: %d files, %s MB; the manifest's own checksum, sizes, XXH64 and every tensor "
                    "chunk's Fletcher32 verified in %.3f s, %.2f GB/s on one thread)\n",
                    path.c_str(), static_cast<long long>(m.step), m.files.size(), files, megabytes(bytes).c_str(), seconds,
                    seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0);
        return std::nullopt;
    }
    std::printf("%s: FAILED: %s\n", path.c_str(), problem->c_str());
    std::string first_damage;
    try {
        for (const CheckpointFile& f : read_checkpoint_manifest(path).files) {
            const std::string file = (fs::path(path) / f.name).string();
            if (!fs::exists(file)) continue;
            for (const std::string& damage : damaged_tensors(file)) {
                std::printf("  %s\n", damage.c_str());
                if (first_damage.empty()) first_damage = damage;
            }
        }
    } catch (const Error&) {
        // The manifest itself is the problem, already printed.
    }
    return first_damage.empty() ? *problem : cat(*problem, "; ", first_damage);
}

int run_verify(const CheckpointArgs& args) {
    if (!fs::is_directory(args.path)) fail(ErrorKind::data, "'", args.path, "' is not a directory");
    std::vector<std::string> paths;
    const std::vector<CheckpointEntry> entries = list_checkpoints(args.path);
    const bool single = has_manifest(args.path) || entries.empty();
    if (single) paths.push_back(args.path);
    else for (const CheckpointEntry& e : entries) paths.push_back(e.path);
    std::vector<std::string> problems;
    for (const std::string& path : paths)
        if (const std::optional<std::string> problem = verify_one(path)) problems.push_back(*problem);
    if (!problems.empty())
        fail(ErrorKind::data, problems.size(), " of ", paths.size(), " checkpoint(s) failed verification; the first: ", problems.front());
    return exit_ok;
}

// ---- inspect ----

void print_state(const std::string& path, const Manifest& m) {
    std::printf("checkpoint       %s\n", path.c_str());
    std::printf("step             %lld\n", static_cast<long long>(m.step));
    std::printf("tokens seen      %lld\n", static_cast<long long>(m.tokens_seen));
    std::printf("optimizer steps  %lld\n", static_cast<long long>(m.optimizer_steps));
    std::printf("loss scale       %g (%lld good steps)\n", m.loss_scale, static_cast<long long>(m.loss_scale_good_steps));
    if (m.data)
        std::printf("data position    step %llu, cursor %llu, order seed %llu\n", static_cast<unsigned long long>(m.data->step),
                    static_cast<unsigned long long>(m.data->cursor), static_cast<unsigned long long>(m.data->seed));
    else
        std::printf("data position    none (training windows are drawn from (seed, step))\n");
    std::printf("seed             %llu\n", static_cast<unsigned long long>(m.seed));
    std::printf("mesh             tp %d x %sdp %d x pp %d = %d rank(s), %s\n", m.tp, m.cp > 1 ? cat("cp ", m.cp, " x ").c_str() : "", m.dp, m.pp, m.world_size,
                m.zero_stage == 0 ? "ZeRO-1 off (stage 0)" : cat("ZeRO stage ", m.zero_stage).c_str());
    std::printf("created          %s\n", m.created.c_str());
    std::printf("files\n");
    for (const CheckpointFile& f : m.files)
        std::printf("  %-16s %10s MB  xxh64 %016llx\n", f.name.c_str(), megabytes(f.bytes).c_str(), static_cast<unsigned long long>(f.xxh64));
}

// One line per tensor: its global shape, how it is stored (whole, or in how many boxes) and
// which rank files hold its weights and its AdamW moments.
void print_tensors(const CheckpointTensors& checkpoint) {
    const std::vector<std::string> names = checkpoint.names(TensorRole::weights);
    size_t width = 6;
    for (const std::string& name : names) width = std::max(width, name.size());
    std::printf("tensors (%zu)\n  %-*s  %-14s  %-22s  %-12s  %s\n", names.size(), static_cast<int>(width), "name", "global shape", "placement", "weights in",
                "AdamW moments in");
    for (const std::string& name : names) {
        const std::vector<const StoredPiece*>& weights = checkpoint.pieces(TensorRole::weights, name);
        const std::set<int> moment_ranks = ranks_holding(checkpoint.pieces(TensorRole::exp_avg, name));
        std::printf("  %-*s  %-14s  %-22s  %-12s  %s\n", static_cast<int>(width), name.c_str(), weights.front()->tensor.global_shape.str().c_str(),
                    placement_description(weights).c_str(), cat("rank ", rank_ranges(ranks_holding(weights))).c_str(),
                    moment_ranks.empty() ? "none" : cat("rank ", rank_ranges(moment_ranks)).c_str());
    }
}

// --pieces: every stored box of every tensor, by role: the rank file, the dataset, the box as
// [start:end] per dimension of the global tensor (the dataset's HDF5 hyperslab).
void print_pieces(const CheckpointTensors& checkpoint) {
    std::printf("pieces\n");
    for (TensorRole role : kTensorRoles)
        for (const std::string& name : checkpoint.names(role))
            for (const StoredPiece* p : checkpoint.pieces(role, name))
                for (const StoredBox& b : p->tensor.boxes)
                    std::printf("  %-20s rank %-5d %-22s %s  %s\n", tensor_role_name(role), p->file, b.box.str().c_str(), p->tensor.dataset.c_str(),
                                p->tensor.boxes.size() > 1 ? cat("(from element ", b.offset, ")").c_str() : "");
}

int run_inspect(const CheckpointArgs& args) {
    const std::string path = resolve_checkpoint(args.path);  // verified: a damaged one is refused, `verify` says where
    const Manifest manifest = read_checkpoint_manifest(path);
    if (args.config) {
        std::printf("%s", manifest.config_toml.c_str());
        return exit_ok;
    }
    print_state(path, manifest);
    const CheckpointTensors checkpoint(path, manifest);
    print_tensors(checkpoint);
    if (args.pieces) print_pieces(checkpoint);
    return exit_ok;
}

// ---- export ----

// The tokenizer an export writes: --tokenizer, else the run's own (data.tokenizer, or a shards
// dataset's tokenizer.json, as the run found it); none for byte-level text and token files.
std::optional<Tokenizer> export_tokenizer(const CheckpointArgs& args, const Config& run) {
    if (!args.tokenizer.empty()) return Tokenizer::load(args.tokenizer);
    try {
        return run_tokenizer(run);
    } catch (const Error& e) {
        log_warn("no tokenizer.json is exported: the run's tokenizer cannot be read from here (", e.what(), "); give it with --tokenizer");
        return std::nullopt;
    }
}

// --force replaces an earlier export (a directory holding model.safetensors or config.json),
// never a directory that holds something else.
void check_replaceable(const CheckpointArgs& args) {
    std::error_code ec;
    const fs::path out(args.out_dir);
    if (!args.force || !fs::is_directory(out, ec) || fs::is_empty(out, ec)) return;
    if (!fs::exists(out / "model.safetensors", ec) && !fs::exists(out / "config.json", ec))
        fail(ErrorKind::config, "output directory '", args.out_dir, "' holds no model.safetensors or config.json: it is not an export that --force may replace; "
             "empty or remove it yourself");
}

int run_export(const CheckpointArgs& args) {
    require_creatable(args.out_dir, OutputKind::directory, "out_dir");  // before the checkpoint is verified and read
    const std::string path = resolve_checkpoint(args.path);
    const Manifest manifest = read_checkpoint_manifest(path);
    const Config run = parse_config(manifest.config_toml, (fs::path(path) / "manifest.json").string() + " (config)", {}, DataFiles::unchecked);
    const std::optional<Tokenizer> tokenizer = export_tokenizer(args, run);
    check_replaceable(args);
    StagedDirectory output(args.out_dir);
    output.begin(args.force);
    ExportSummary summary;
    try {
        summary = export_checkpoint_to_hf(path, output.staging_path(), tokenizer);
        output.commit();
    } catch (...) {
        output.abandon();
        throw;
    }
    std::printf("exported '%s' (step %lld) as %s: %zu tensors, %s MB -> %s, %s%s\n", path.c_str(), static_cast<long long>(manifest.step),
                summary.architecture.c_str(), summary.tensors, megabytes(summary.bytes).c_str(), (fs::path(args.out_dir) / "model.safetensors").c_str(),
                (fs::path(args.out_dir) / "config.json").c_str(),
                tokenizer ? cat(", tokenizer.json, tokenizer_config.json (", tokenizer->vocab_size(), " tokens)").c_str()
                          : " (no tokenizer: the run has none; --tokenizer adds one)");
    return exit_ok;
}

}  // namespace

void register_checkpoint_command(CLI::App& app, CommandAction& action) {
    auto args = std::make_shared<CheckpointArgs>();
    CLI::App* cmd = app.add_subcommand("checkpoint", "List, verify and inspect checkpoints; export their weights for Hugging Face");
    cmd->require_subcommand(1);

    CLI::App* list = cmd->add_subcommand("list", "One line per checkpoint under a checkpoint.dir: step, size, files, validity, latest");
    list->add_option("dir", args->path, "A checkpoint.dir")->required();
    list->callback([args, &action] { action = [args] { return run_list(*args); }; });

    CLI::App* verify = cmd->add_subcommand("verify", "Check every file's size and XXH64 and every tensor chunk's Fletcher32; exit 2 if anything is wrong");
    verify->add_option("path", args->path, "A checkpoint directory, or a checkpoint.dir (every checkpoint in it)")->required();
    verify->callback([args, &action] { action = [args] { return run_verify(*args); }; });

    CLI::App* inspect = cmd->add_subcommand("inspect", "Step, tokens, optimizer state, data position, mesh, files, and every tensor's shape and placement");
    inspect->add_option("path", args->path, "A checkpoint directory (or a checkpoint.dir: the latest; or a run directory: its newest)")->required();
    inspect->add_flag("--config", args->config, "Print the saved config (TOML) instead");
    inspect->add_flag("--pieces", args->pieces, "Also list every stored piece: role, rank file, box of the global tensor, dataset");
    inspect->callback([args, &action] { action = [args] { return run_inspect(*args); }; });

    CLI::App* exporter = cmd->add_subcommand("export", "Write a Hugging Face directory: model.safetensors, config.json and the run's tokenizer");
    exporter->add_option("path", args->path, "A checkpoint directory (or a checkpoint.dir: the latest; or a run directory: its newest)")->required();
    exporter->add_option("--format", args->format, "Output format")->check(CLI::IsMember({"safetensors"}));
    exporter->add_option("--tokenizer", args->tokenizer, "tokenizer.json to write beside the weights (default: the run's own)");
    exporter->add_flag("--force", args->force, "Replace an earlier export in OUT_DIR");
    exporter->add_option("out_dir", args->out_dir, "Output directory (empty or new, or an earlier export with --force)")->required();
    exporter->callback([args, &action] { action = [args] { return run_export(*args); }; });
}

}  // namespace llmtrain
