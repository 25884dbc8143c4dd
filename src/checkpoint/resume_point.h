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
// read; nullopt for auto with nothing to resume. Checkpoints passed over are warned about
// when report is set. Under MPI every rank calls it with a problem_of that checks its share
// of the files and agrees with the others, so that all choose the same checkpoint.
std::optional<ResumePoint> find_resume_point(const std::string& mode, const Config& config, bool report = true, const ProblemOf& problem_of = {});
// The checkpoint's config against this run's: the model's shape must match (else a config
// error naming the key); a changed layout is reported and other changes listed in a warning
// (when report is set: rank 0).
void check_resume_config(const ResumePoint& resume, const Config& config, bool report);
// Whether the checkpoint has every step of the run already: a restart of a finished run
// (the same command line for every restart) then has nothing to do, and says so if report.
bool trained_already(const std::optional<ResumePoint>& resume, const Config& config, bool report);

}  // namespace llmtrain
