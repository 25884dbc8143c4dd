// The checkpoint directory (checkpoint.dir) and its crash-safe protocol:
//
//   step_00000500.tmp/   every rank writes rank_NNNNN.h5 and fsyncs it, then a small
//                        rank_NNNNN.json with its size and XXH64 checksum
//   (every rank reported success: rank 0 alone goes on, off the step loop)
//   manifest.json        written to a temporary name, fsynced, renamed: the commit point
//   step_00000500/       the directory renamed (a save of a step already committed: the two
//                        directories exchanged atomically), its parent fsynced
//   latest               "step_00000500", written to a temporary name and renamed
//   retention            only now are older checkpoints of the same run deleted
//
// A crash at any point leaves `latest` naming a loadable checkpoint (the previous one or the
// new one); a directory without a manifest, or whose files fail their size or checksum, is
// never loaded.
//
// A checkpoint chain belongs to its run: every manifest names the run that wrote it (a run id
// kept across restarts). A run saves only into a checkpoint.dir that holds no other run's
// checkpoints (check_checkpoint_dir_is_free_for), retention counts only the saving run's
// chain and never deletes its newest save or the one `latest` names, so `latest` always names
// a committed checkpoint that exists.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/manifest.h"
#include "parallel/comm.h"

namespace llmtrain {

// Creates checkpoint.dir if needed; a config error naming the key when it cannot be made.
void create_checkpoint_root(const std::string& root);

std::string checkpoint_name(int64_t step);          // "step_00000500"
std::string rank_file_name(int world_rank);         // "rank_00003.h5"
std::string rank_record_name(int world_rank);       // "rank_00003.json"
std::string pending_dir(const std::string& root, int64_t step);    // root/step_00000500.tmp

// The size and XXH64 of a written rank file, recorded next to it for rank 0's manifest.
void write_rank_record(const std::string& dir, int world_rank, const std::string& file_path);

// Sees the step of the checkpoint and the name of each filesystem step of its commit just
// before it runs ("write manifest", "rename", "exchange", "write latest", ...), and
// "committed" at the end: a test crashes the process there, fault injection slows or fails
// the commit.
using CommitProbe = std::function<void(int64_t checkpoint_step, std::string_view point)>;

// Rank 0, once every rank's file is durable in pending_dir(root, manifest.step): completes
// manifest.files from the ranks' records and manifest.sequence from the run's chain, and
// commits as above. A save of a step already committed replaces it by an atomic exchange of
// the two directories (see replace_checkpoint in the .cpp), so that `latest` names a loadable
// checkpoint at every instant. Returns the manifest written. Every failure, of the file
// system included, is an Error(io) naming the path; it refuses to replace a checkpoint of the
// same step that another run wrote.
Manifest commit_checkpoint(const std::string& root, Manifest manifest, const CommitProbe& probe = {});

// Replaces the manifest of the committed checkpoint at path (temporary name, fsync, rename):
// a rollback records there the data it skips, so that the skip survives a restart.
void rewrite_checkpoint_manifest(const std::string& path, const Manifest& manifest);

// Deletes the committed checkpoints of run_id's chain beyond its keep_last newest saves (by
// sequence), except every keep_every-th step (0: none kept forever), and never the chain's
// newest save nor the checkpoint `latest` names; other runs' checkpoints are not counted and
// not touched. Pending directories of steps below the chain's newest are deleted too.
// Returns the paths deleted.
std::vector<std::string> apply_retention(const std::string& root, int64_t keep_last, int64_t keep_every, const std::string& run_id);

struct CheckpointEntry {
    std::string path;
    int64_t step = 0;
    bool committed = false;  // has a manifest (a pending or abandoned save has none)
};
// Every step_* directory under root, oldest first.
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// A committed checkpoint's place: its run and its position in that run's chain.
struct ChainLink {
    std::string path;
    int64_t step = 0;
    std::string run_id;
    int64_t sequence = 0;
};
// Every committed checkpoint under root, grouped by the run that wrote it. A manifest that
// cannot be read (damaged, failing its own checksum) belongs to no run: it is listed apart.
struct CheckpointChains {
    std::vector<ChainLink> links;         // oldest save first within each run: by (sequence, step)
    std::vector<std::string> unreadable;  // "'PATH/manifest.json' ...": why
    // The runs, each once, in the order of their first link.
    std::vector<std::string> run_ids() const;
    // The links of one run, oldest save first.
    std::vector<ChainLink> chain(const std::string& run_id) const;
    // "run 3f9c...: steps 50 to 60 (3 checkpoints)"
    std::string describe(const std::string& run_id) const;
};
CheckpointChains read_checkpoint_chains(const std::string& root);

// Before a run writes anything: refuses (Error(config): exit 2) a run that would save into
// root while root holds committed checkpoints of another run than run_id (a fresh run has a
// new id, so any checkpoint there is another run's). The message names the directory, the
// other run and the flags that continue it or choose another directory.
void check_checkpoint_dir_is_free_for(const std::string& root, const std::string& run_id);
// The checkpoint `latest` names, if any.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Why the checkpoint at path cannot be loaded, or nothing: the manifest, every listed file's
// presence, size and XXH64 (full: also every tensor chunk's Fletcher32 checksum).
// share: check only files i with i % share.count == share.index (the ranks of a job split
// the reading between them).
enum class Verification { files, full };
struct FileShare {
    int index = 0, count = 1;
};
std::optional<std::string> checkpoint_problem(const std::string& path, Verification depth = Verification::files, FileShare share = {});
// The throwing form of checkpoint_problem, which every reader of a checkpoint calls before it
// reads (resume, rollback, eval, generate, inspect, export, init_from): Error(data) naming
// the checkpoint and what is wrong with it.
void verify_checkpoint(const std::string& path, Verification depth = Verification::files);
// Why a checkpoint cannot be loaded (nothing: it can), as a reader judges it.
using ProblemOf = std::function<std::optional<std::string>(const std::string& path)>;
// The check the ranks of a job split between them before they load: rank share.index checks
// the files checkpoint_problem gives it (size, XXH64), so the job reads the checkpoint once,
// and first_failing(found) (a collective: the lowest rank that found a problem, -1 if none)
// makes every rank reach the same verdict. The rank that found the problem names the file;
// the others name that rank (own: told of this rank's own problem, e.g. to log it).
ProblemOf shared_problem_check(FileShare share, std::function<int(bool found)> first_failing, std::function<void(const std::string&)> own = {});
// shared_problem_check over a group's ranks: each checks its share, one scalar all-reduce agrees.
ProblemOf shared_problem_check(Comm& group);
// The checkpoint a run resumes from (`--resume`): "auto", the newest save without a problem
// of one run's chain under root (each one passed over is told to `skipped`), or none;
// "latest", the one `latest` names; else a checkpoint directory. The chain of "auto" is
// run_id's when given, else the one run whose checkpoints root holds (root holding several
// runs' checkpoints is an Error(config) naming them). problem_of judges a checkpoint (default:
// checkpoint_problem of all its files). Throws Error(data) naming the checkpoint and its
// problem when "latest" or the path cannot be loaded.
std::optional<std::string> find_resume_checkpoint(const std::string& root, const std::string& mode,
                                                  const std::function<void(const std::string&)>& skipped, const ProblemOf& problem_of = {},
                                                  const std::optional<std::string>& run_id = std::nullopt);
// The newest committed checkpoint of a chain under root (run_id's, else the one run's), for a
// reader that must not fall back silently (eval, generate, export on a directory): nullopt
// when there is none; Error(data) when it cannot be loaded, naming it, why, and the newest
// one that can (or saying none can). `--resume auto` passes over such a one instead.
std::optional<std::string> newest_checkpoint_for_reader(const std::string& root, const std::optional<std::string>& run_id = std::nullopt);
// The same for the checkpoint `latest` names under root (`checkpoint inspect` and `export` on
// a checkpoint.dir): never an older one in its place, but named when it is damaged.
std::optional<std::string> latest_checkpoint_for_reader(const std::string& root);
// manifest.json of a checkpoint (its own checksum verified); throws Error(data) naming the file.
Manifest read_checkpoint_manifest(const std::string& path);

}  // namespace llmtrain
