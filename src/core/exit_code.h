// The process exit codes of llmtrain, one table for every subcommand (README: "Exit codes").
// A supervisor (Slurm, a restart loop) decides from the code alone whether to restart the
// job, fix its input first, or take a node out. Codes 4 and 5 are the restart supervisor's
// own (scripts/llmtrain-supervise: no progress, restarts spent) and never llmtrain's.
#pragma once

#include "core/error.h"

namespace llmtrain {

enum ExitCode : int {
    exit_ok = 0,
    exit_failure = 1,        // a runtime failure: I/O, a rank that died, a collective that timed out
    exit_bad_input = 2,      // usage, config or data error (or a layout that does not fit): fix the input
    exit_diverged = 3,       // training health stopped the run (non-finite loss or gradients)
    exit_storage = 74,       // checkpoints could not be saved (sysexits' EX_IOERR): fix the storage, then resume
    exit_resume = 75,        // stopped on SIGTERM / SIGUSR1 at a step boundary: run the same command again
    exit_exclude_node = 76,  // a hardware fault on this node: restart on other nodes
    exit_interrupted = 130,  // stopped on SIGINT (Ctrl-C) at a step boundary, as a shell reports it
};

// The exit code an error of this kind ends the process with.
ExitCode exit_code_for(ErrorKind kind);

}  // namespace llmtrain
