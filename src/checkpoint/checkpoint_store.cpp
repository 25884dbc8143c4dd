#include "checkpoint/checkpoint_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <xxhash.h>

#include "checkpoint/hdf5_file.h"
#include "core/checksum_policy.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/log.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {
constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, "cannot read '", path, "'");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

uint64_t file_xxh64(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, "cannot read '", path, "'");
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    std::vector<char> buffer(1 << 20);
    while (in) {
        in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
        XXH64_update(state, buffer.data(), static_cast<size_t>(in.gcount()));
    }
    const uint64_t hash = XXH64_digest(state);
    XXH64_freeState(state);
    return hash;
}

// The step of "step_00000500" or "step_00000500.tmp"; nullopt for other names.
std::optional<int64_t> step_of(const std::string& name, bool& pending) {
    if (name.rfind("step_", 0) != 0) return std::nullopt;
    std::string digits = name.substr(5);
    pending = digits.size() > 4 && digits.ends_with(".tmp");
    if (pending) digits.resize(digits.size() - 4);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::stoll(digits);
}

void remove_all(const std::string& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) fail(ErrorKind::io, "cannot delete '", path, "': ", ec.message());
}

// The run whose manifest is at path/manifest.json; nullopt when it cannot be read.
std::optional<std::string> run_of(const std::string& path) {
    try {
        return manifest_from_json(read_file((fs::path(path) / kManifest).string()), (fs::path(path) / kManifest).string()).run_id;
    } catch (const Error&) {
        return std::nullopt;
    }
}

// A save replaces a checkpoint of its own step only when its own run wrote it: the start-up
// check keeps other runs out of checkpoint.dir, this keeps a race between two starts from
// costing a checkpoint.
void refuse_to_replace_another_runs(const std::string& final_path, const std::string& run_id) {
    if (!fs::exists(fs::path(final_path) / kManifest)) return;
    const std::optional<std::string> owner = run_of(final_path);
    if (owner && *owner != run_id)
        fail(ErrorKind::io, "'", final_path, "' holds a checkpoint of ", describe_run(*owner), "; ", describe_run(run_id), " does not replace it");
}
}  // namespace

void create_checkpoint_root(const std::string& root) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) fail(ErrorKind::config, "checkpoint.dir: cannot create '", root, "': ", ec.message());
}

std::string checkpoint_name(int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
    return name;
}

std::string rank_file_name(int world_rank) {
    char name[32];
    std::snprintf(name, sizeof name, "rank_%05d.h5", world_rank);
    return name;
}

std::string rank_record_name(int world_rank) {
    char name[32];
    std::snprintf(name, sizeof name, "rank_%05d.json", world_rank);
    return name;
}

std::string pending_dir(const std::string& root, int64_t step) { return (fs::path(root) / (checkpoint_name(step) + ".tmp")).string(); }

void write_rank_record(const std::string& dir, int world_rank, const std::string& file_path) {
    std::error_code ec;
    const uint64_t bytes = fs::file_size(file_path, ec);
    if (ec) fail(ErrorKind::io, "cannot stat '", file_path, "': ", ec.message());
    const nlohmann::json record = {{"name", fs::path(file_path).filename().string()}, {"bytes", bytes}, {"xxh64", file_xxh64(file_path)}};
    write_file_atomically((fs::path(dir) / rank_record_name(world_rank)).string(), record.dump() + "\n");
}

namespace {
// manifest.files from the ranks' records in the pending directory.
std::vector<CheckpointFile> read_rank_records(const std::string& pending, int world_size) {
    std::vector<CheckpointFile> files;
    for (int r = 0; r < world_size; ++r) {
        const std::string record_path = (fs::path(pending) / rank_record_name(r)).string();
        const nlohmann::json record = nlohmann::json::parse(read_file(record_path), nullptr, false);
        if (record.is_discarded() || !record.contains("bytes") || !record.contains("xxh64"))
            fail(ErrorKind::io, "rank ", r, "'s record '", record_path, "' is unreadable");
        files.push_back({rank_file_name(r), record.at("bytes").get<uint64_t>(), record.at("xxh64").get<uint64_t>()});
    }
    return files;
}

// Files of an older, larger world (or an older save's manifest) in a reused pending directory
// are not part of this save.
void remove_unlisted_files(const std::string& pending, const std::vector<CheckpointFile>& files) {
    std::error_code ec;
    std::vector<fs::path> stray;
    for (fs::directory_iterator it(pending, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (std::none_of(files.begin(), files.end(), [&](const CheckpointFile& f) { return f.name == name; })) stray.push_back(it->path());
    }
    if (ec) fail(ErrorKind::io, "cannot list '", pending, "': ", ec.message());
    for (const fs::path& path : stray) remove_all(path.string());
}

void rename_or_fail(const std::string& from, const std::string& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) fail(ErrorKind::io, "cannot rename '", from, "' to '", to, "': ", ec.message());
}

// pending (committed: it holds its manifest) takes the place of final_path, an older save of
// the same step. With an atomic exchange (renameat2 RENAME_EXCHANGE: Linux on ext4, XFS,
// btrfs, tmpfs) final_path names a whole checkpoint at every instant, the old one and then the
// new one, and pending holds the old one afterwards. Where the file system has no exchange
// (EINVAL), `latest` names pending itself while the two renames run, so that it names a
// loadable checkpoint at every instant there too. Either way the replaced save is deleted.
void replace_checkpoint(const std::string& root, const std::string& pending, const std::string& final_path, const std::function<void(std::string_view)>& at) {
    at("exchange");
    // A test hook: LLMTRAIN_CHECKPOINT_NO_RENAME_EXCHANGE takes the path of a file system
    // without the exchange, so that its crash safety is tested on any machine.
    const bool exchange_refused = std::getenv("LLMTRAIN_CHECKPOINT_NO_RENAME_EXCHANGE") != nullptr;
    if (!exchange_refused && ::renameat2(AT_FDCWD, pending.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
        at("remove replaced");
        remove_all(pending);
        return;
    }
    const int reason = exchange_refused ? EINVAL : errno;
    if (reason != EINVAL && reason != ENOSYS && reason != ENOTSUP)
        fail(ErrorKind::io, "cannot exchange '", pending, "' with '", final_path, "': ", std::strerror(reason));
    at("point latest at pending");
    write_file_atomically((fs::path(root) / kLatest).string(), fs::path(pending).filename().string() + "\n");
    const std::string replaced = final_path + ".replaced";
    at("move old aside");
    remove_all(replaced);
    rename_or_fail(final_path, replaced);
    at("rename");
    rename_or_fail(pending, final_path);
    at("remove replaced");
    remove_all(replaced);
}
}  // namespace

Manifest commit_checkpoint(const std::string& root, Manifest manifest, const CommitProbe& probe) {
    const std::function<void(std::string_view)> at = [&](std::string_view point) {
        if (probe) probe(manifest.step, point);
    };
    const std::string pending = pending_dir(root, manifest.step);
    at("read rank records");
    manifest.files = read_rank_records(pending, manifest.world_size);
    at("remove stray files");
    remove_unlisted_files(pending, manifest.files);
    const std::vector<ChainLink> chain = read_checkpoint_chains(root).chain(manifest.run_id);
    manifest.sequence = chain.empty() ? 1 : chain.back().sequence + 1;
    manifest.created = utc_timestamp();
    const std::string final_path = (fs::path(root) / checkpoint_name(manifest.step)).string();
    refuse_to_replace_another_runs(final_path, manifest.run_id);
    at("write manifest");
    write_file_atomically((fs::path(pending) / kManifest).string(), manifest_to_json(manifest));
    std::error_code ec;
    if (fs::exists(final_path, ec)) {
        // The same step saved again (a run resumed from it and saved it anew): the new one wins.
        replace_checkpoint(root, pending, final_path, at);
    } else {
        at("rename");
        rename_or_fail(pending, final_path);
    }
    at("fsync root");
    fsync_directory(root);
    at("write latest");
    write_file_atomically((fs::path(root) / kLatest).string(), checkpoint_name(manifest.step) + "\n");
    at("committed");
    return manifest;
}

void rewrite_checkpoint_manifest(const std::string& path, const Manifest& manifest) {
    write_file_atomically((fs::path(path) / kManifest).string(), manifest_to_json(manifest));
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
    std::vector<CheckpointEntry> entries;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
        bool pending = false;
        const std::optional<int64_t> step = step_of(entry.path().filename().string(), pending);
        if (!step || !entry.is_directory()) continue;
        entries.push_back({entry.path().string(), *step, !pending && fs::exists(entry.path() / kManifest)});
    }
    std::sort(entries.begin(), entries.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
        return a.step != b.step ? a.step < b.step : a.path < b.path;
    });
    return entries;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
    const fs::path pointer = fs::path(root) / kLatest;
    if (!fs::exists(pointer)) return std::nullopt;
    std::string name = read_file(pointer.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos) fail(ErrorKind::data, "'", pointer.string(), "' does not name a checkpoint");
    // A re-save on a file system without an atomic exchange points `latest` at its pending
    // directory while that is renamed to the step's name (replace_checkpoint): once renamed,
    // the name without ".tmp" is the one it meant.
    std::error_code ec;
    if (name.ends_with(".tmp") && !fs::exists(fs::path(root) / name, ec)) name.resize(name.size() - 4);
    return (fs::path(root) / name).string();
}

std::vector<std::string> CheckpointChains::run_ids() const {
    std::vector<std::string> ids;
    for (const ChainLink& link : links)
        if (std::find(ids.begin(), ids.end(), link.run_id) == ids.end()) ids.push_back(link.run_id);
    return ids;
}

std::vector<ChainLink> CheckpointChains::chain(const std::string& run_id) const {
    std::vector<ChainLink> chain;
    for (const ChainLink& link : links)
        if (link.run_id == run_id) chain.push_back(link);
    return chain;
}

std::string CheckpointChains::describe(const std::string& run_id) const {
    const std::vector<ChainLink> links = chain(run_id);
    if (links.empty()) return describe_run(run_id) + ": no checkpoint";
    int64_t lowest = links.front().step, highest = links.front().step;
    for (const ChainLink& link : links) lowest = std::min(lowest, link.step), highest = std::max(highest, link.step);
    return cat(describe_run(run_id), ": ", lowest == highest ? cat("step ", lowest) : cat("steps ", lowest, " to ", highest), " (", links.size(),
               " checkpoint(s), the newest '", links.back().path, "')");
}

CheckpointChains read_checkpoint_chains(const std::string& root) {
    CheckpointChains chains;
    for (const CheckpointEntry& e : list_checkpoints(root)) {
        if (!e.committed) continue;
        const std::string manifest_path = (fs::path(e.path) / kManifest).string();
        try {
            const Manifest m = manifest_from_json(read_file(manifest_path), manifest_path);
            chains.links.push_back({e.path, e.step, m.run_id, m.sequence});
        } catch (const Error& error) {
            chains.unreadable.push_back(error.what());
        }
    }
    // Within a run, saves in the order they were committed; a format-1 chain (no sequence)
    // by step.
    std::stable_sort(chains.links.begin(), chains.links.end(), [](const ChainLink& a, const ChainLink& b) {
        return a.sequence != b.sequence ? a.sequence < b.sequence : a.step < b.step;
    });
    return chains;
}

void check_checkpoint_dir_is_free_for(const std::string& root, const std::string& run_id) {
    const CheckpointChains chains = read_checkpoint_chains(root);
    for (const std::string& other : chains.run_ids()) {
        if (other == run_id) continue;
        const std::vector<ChainLink> theirs = chains.chain(other);
        fail(ErrorKind::config, "checkpoint.dir '", root, "' holds the checkpoints of another run (", chains.describe(other), "); this ",
             describe_run(run_id), " would mix its saves with them and retention would count both. Continue that run with --resume auto "
             "(or --resume ", theirs.back().path, "), or give this one a directory of its own: --set checkpoint.dir=DIR");
    }
}

std::vector<std::string> apply_retention(const std::string& root, int64_t keep_last, int64_t keep_every, const std::string& run_id) {
    const std::vector<ChainLink> chain = read_checkpoint_chains(root).chain(run_id);
    std::vector<std::string> deleted;
    if (chain.empty()) return deleted;
    std::optional<std::string> latest;
    try {
        latest = latest_checkpoint(root);
    } catch (const Error&) {
        // A damaged pointer protects nothing; the chain's newest save is protected anyway.
    }
    const auto named_by_latest = [&](const std::string& path) {
        std::error_code ec;
        return latest && fs::equivalent(*latest, path, ec);
    };
    // chain: oldest save first; the newest keep_last stay, the newest save always.
    const size_t keep = std::max<size_t>(1, static_cast<size_t>(std::max<int64_t>(keep_last, 0)));
    for (size_t i = 0; i + keep < chain.size(); ++i) {
        const ChainLink& link = chain[i];
        if ((keep_every > 0 && link.step % keep_every == 0) || named_by_latest(link.path)) continue;
        remove_all(link.path);
        deleted.push_back(link.path);
    }
    const int64_t newest = chain.back().step;
    for (const CheckpointEntry& e : list_checkpoints(root)) {
        if (e.committed || e.step >= newest) continue;  // a higher step: possibly a save still in flight
        remove_all(e.path);
        deleted.push_back(e.path);
    }
    return deleted;
}

void verify_checkpoint(const std::string& path, Verification depth) {
    if (const std::optional<std::string> problem = checkpoint_problem(path, depth)) fail(ErrorKind::data, "checkpoint '", path, "' cannot be loaded: ", *problem);
}

namespace {
// A reader's refusal of a damaged newest checkpoint: Error(data) naming it, why, and the first
// of older_newest_first that loads (or saying none does).
[[noreturn]] void refuse_damaged_newest(const std::string& newest, const std::string& why, const std::vector<std::string>& older_newest_first) {
    std::optional<std::string> valid;
    for (const std::string& path : older_newest_first)
        if (!checkpoint_problem(path)) {
            valid = path;
            break;
        }
    fail(ErrorKind::data, "the newest checkpoint '", newest, "' cannot be loaded: ", why, "; ",
         valid ? cat("the newest one that can is '", *valid, "': pass it instead to use that older model") : std::string("no older checkpoint can be loaded either"));
}

// The run whose chain `--resume auto` continues: run_id when given, else the one run whose
// checkpoints root holds (none: nullopt).
std::optional<std::string> chain_to_resume(const std::string& root, const CheckpointChains& chains, const std::optional<std::string>& run_id) {
    if (run_id) return run_id;
    const std::vector<std::string> runs = chains.run_ids();
    if (runs.size() <= 1) return runs.empty() ? std::nullopt : std::optional<std::string>(runs.front());
    std::string listed;
    for (const std::string& run : runs) listed += cat(listed.empty() ? "" : "; ", chains.describe(run));
    fail(ErrorKind::config, "--resume auto: checkpoint.dir '", root, "' holds the checkpoints of ", runs.size(), " runs (", listed,
         "): name the one to continue with --resume PATH, or its run directory with --run-dir");
}
}  // namespace

std::optional<std::string> find_resume_checkpoint(const std::string& root, const std::string& mode,
                                                  const std::function<void(const std::string&)>& skipped, const ProblemOf& problem_of,
                                                  const std::optional<std::string>& run_id) {
    const auto problem = [&](const std::string& path) { return problem_of ? problem_of(path) : checkpoint_problem(path); };
    if (mode == "auto") {
        for (const CheckpointEntry& e : list_checkpoints(root))
            if (!e.committed) skipped(cat("'", e.path, "' is incomplete (no manifest: a save that did not finish); passed over"));
        const CheckpointChains chains = read_checkpoint_chains(root);
        for (const std::string& why : chains.unreadable) skipped(cat(why, "; passed over"));
        const std::optional<std::string> run = chain_to_resume(root, chains, run_id);
        if (!run) return std::nullopt;
        const std::vector<ChainLink> chain = chains.chain(*run);
        for (auto link = chain.rbegin(); link != chain.rend(); ++link) {
            if (const std::optional<std::string> why = problem(link->path)) {
                skipped(cat("'", link->path, "' cannot be loaded: ", *why, "; passed over"));
                continue;
            }
            return link->path;
        }
        return std::nullopt;
    }
    std::string path = mode;
    if (mode == "latest") {
        const std::optional<std::string> latest = latest_checkpoint(root);
        if (!latest) fail(ErrorKind::data, "--resume latest: '", (fs::path(root) / kLatest).string(), "' does not exist (no checkpoint was committed under checkpoint.dir)");
        path = *latest;
    }
    if (!fs::is_directory(path)) fail(ErrorKind::data, "--resume ", mode, ": '", path, "' is not a checkpoint directory");
    if (const std::optional<std::string> why = problem(path)) fail(ErrorKind::data, "--resume ", mode, ": ", *why);
    return path;
}

std::optional<std::string> newest_checkpoint_for_reader(const std::string& root, const std::optional<std::string>& run_id) {
    const CheckpointChains chains = read_checkpoint_chains(root);
    const std::optional<std::string> run = chain_to_resume(root, chains, run_id);
    if (!run) return std::nullopt;
    const std::vector<ChainLink> chain = chains.chain(*run);
    if (chain.empty()) return std::nullopt;
    const std::optional<std::string> why = checkpoint_problem(chain.back().path);
    if (!why) return chain.back().path;
    std::vector<std::string> older;
    for (auto link = chain.rbegin() + 1; link != chain.rend(); ++link) older.push_back(link->path);
    refuse_damaged_newest(chain.back().path, *why, older);
}

std::optional<std::string> latest_checkpoint_for_reader(const std::string& root) {
    const std::optional<std::string> latest = latest_checkpoint(root);
    if (!latest) return std::nullopt;
    const std::optional<std::string> why = checkpoint_problem(*latest);
    if (!why) return latest;
    std::vector<std::string> older;
    const std::vector<CheckpointEntry> entries = list_checkpoints(root);
    for (auto e = entries.rbegin(); e != entries.rend(); ++e)
        if (std::error_code ec; e->committed && !fs::equivalent(e->path, *latest, ec)) older.push_back(e->path);
    refuse_damaged_newest(*latest, *why, older);
}

ProblemOf shared_problem_check(FileShare share, std::function<int(bool found)> first_failing, std::function<void(const std::string&)> own) {
    return [share, first_failing = std::move(first_failing), own = std::move(own)](const std::string& path) -> std::optional<std::string> {
        const std::optional<std::string> mine = checkpoint_problem(path, Verification::files, share);
        const int first = first_failing(mine.has_value());
        if (first < 0) return std::nullopt;
        if (mine && own) own(*mine);
        return mine ? *mine : cat("rank ", first, " found a file of it missing or damaged (its message names the file)");
    };
}

ProblemOf shared_problem_check(Comm& group) {
    return shared_problem_check({group.rank(), group.size()}, [&group](bool found) {
        // The lowest rank that found a problem: -max(-rank) over the ranks that did.
        const double lowest = -group.all_reduce_scalar(-static_cast<double>(found ? group.rank() : group.size()), ReduceOp::max);
        return lowest < group.size() ? static_cast<int>(lowest) : -1;
    });
}

Manifest read_checkpoint_manifest(const std::string& path) {
    const std::string manifest_path = (fs::path(path) / kManifest).string();
    if (!fs::exists(manifest_path)) fail(ErrorKind::data, "'", path, "' has no ", kManifest, " (an incomplete save, or not a checkpoint)");
    Manifest manifest = manifest_from_json(read_file(manifest_path), manifest_path);
    // Rank r's file is rank_file_name(r) in this directory, and nothing else: a listed name is
    // opened, so one that leaves the directory ("../x", "/etc/x") or repeats a rank is refused.
    for (size_t r = 0; r < manifest.files.size(); ++r)
        if (manifest.files[r].name != rank_file_name(static_cast<int>(r)))
            fail(ErrorKind::data, "'", manifest_path, "': files[", r, "].name is '", manifest.files[r].name, "', expected '",
                 rank_file_name(static_cast<int>(r)), "'");
    return manifest;
}

std::optional<std::string> checkpoint_problem(const std::string& path, Verification depth, FileShare share) {
    try {
        const Manifest m = read_checkpoint_manifest(path);
        for (size_t i = 0; i < m.files.size(); ++i) {
            if (static_cast<int>(i % static_cast<size_t>(share.count)) != share.index) continue;
            const CheckpointFile& f = m.files[i];
            const std::string file = (fs::path(path) / f.name).string();
            std::error_code ec;
            const uint64_t bytes = fs::file_size(file, ec);
            if (ec) return cat("'", file, "' is missing");
            if (bytes != f.bytes) return cat("'", file, "' has ", bytes, " bytes, the manifest says ", f.bytes, " (truncated?)");
            if (checksum_mismatch(f.xxh64, file_xxh64(file))) return cat("'", file, "' fails its XXH64 checksum (damaged since it was written)");
            if (depth == Verification::full) {
                const RankFileReader reader(file);
                for (const SavedTensor& t : reader.tensors()) reader.read(t);
            }
        }
        return std::nullopt;
    } catch (const Error& e) {
        return std::string(e.what());
    }
}

}  // namespace llmtrain
