// Where a resumed run starts: the checkpoint `--resume` names (auto, latest or a path) with
// its manifest, checked against the run's config before anything is allocated.
#pragma once

#include <optional>
#include <string>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "config/config.h"

namespace llmtrain {

struct ResumePoint {
    std::string path;
    Manifest manifest;
};

// The checkpoint --resume names (checkpoint_store.h: find_resume_checkpoint), its manifest
// read; nullopt for auto with nothing to resume. run_id: the run whose chain auto continues
// (a run directory's run), nullopt: the one run under checkpoint.dir. Checkpoints passed over
// are warned about when report is set. Under MPI every rank calls it with a problem_of that
// checks its share of the files and agrees with the others, so that all choose the same
// checkpoint.
std::optional<ResumePoint> find_resume_point(const std::string& mode, const Config& config, bool report = true, const ProblemOf& problem_of = {},
                                             const std::optional<std::string>& run_id = std::nullopt);
// The checkpoint's config against this run's: the model's shape must match (else a config
// error naming the key); a changed layout is reported and other changes listed in a warning
// (when report is set: rank 0).
void check_resume_config(const ResumePoint& resume, const Config& config, bool report);
// The global batch (sequences per optimizer step over the job) the checkpoint's run trained
// with: recorded in the manifest, or for a format-1 checkpoint derived from its config and
// mesh.
int64_t saved_global_batch(const ResumePoint& resume);
// Resume keeps what it saved: the saved global batch is kept whatever the layout unless this
// config states train.global_batch_size or train.grad_accum (in its file or a --set) with
// another value than the saved config; train.global_batch_size becomes the saved one and
// train.grad_accum follows from this dp and train.batch_size; a dp that cannot hold it is an
// Error(config) with the numbers. A restated global batch is applied, and warned about when it
// differs. Reports (when report is set) what it kept or changed.
void keep_saved_global_batch(const ResumePoint& resume, Config& config, int64_t dp, bool report);
// Whether the checkpoint has every step of the run already: a restart of a finished run
// (the same command line for every restart) then has nothing to do, and says so if report.
bool trained_already(const std::optional<ResumePoint>& resume, const Config& config, bool report);

}  // namespace llmtrain
