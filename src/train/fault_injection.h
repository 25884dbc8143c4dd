// Fault drills for tests and recovery exercises. A plan holds one fault or several, written
// as in LLMTRAIN_INJECT_FAULT, separated by commas. KIND:RANK:STEP makes world rank RANK, at
// step STEP (1-based):
//   exit      exit at once without any clean-up (a process that vanished)
//   hang      stop making progress forever
//   stop      stop the process (SIGSTOP to itself), as a debugger or a frozen node would: its
//             memory stays as it was, and only SIGCONT or SIGKILL moves it again
//   abort     std::abort(): a crash by a fatal signal (SIGABRT)
//   hardware  throw the error a device reports for an uncorrectable hardware fault
//   nan       (nonfinite_gradients) a NaN in this rank's gradients
//   bitflip   (bit_flip) one bit of one of this rank's gradients flipped, once: a re-run of
//             the step computes correctly (silent data corruption)
//   localfull the local snapshot of step STEP fails on this rank as a full node-local file
//             system fails it (ENOSPC), in its background thread
// and on every rank:
//   spike:STEP:FACTOR  the loss and gradients of the step that reads step STEP's data (the
//                      batch a run without skipped data reads at step STEP) multiplied by
//                      FACTOR: a bad batch, which a re-run meets again and a rollback skips
//   lr:STEP:FACTOR     the learning rate multiplied by FACTOR from step STEP on
// and on rank 0, in the commit of the checkpoint of step STEP (its background thread):
//   commitfail:STEP:error       an Error(io) before the manifest is written
//   commitfail:STEP:filesystem  a std::filesystem::filesystem_error before the rename
//   slowcommit:STEP:SECONDS     a sleep before the commit's first step (slow shared storage)
// The command reads the variable once (fault_plan_from_environment) and hands the plan to the
// trainer in its options; the step loop asks the plan, never the environment.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain {

class FaultPlan {
public:
    FaultPlan() = default;  // no fault
    // A malformed item is a config error naming `source` (the variable) and the expected forms.
    static FaultPlan parse(const std::string& spec, const std::string& source);

    bool empty() const { return faults_.empty(); }
    // Carries out an exit, abort, hardware, hang or stop fault of this rank at this step, if any.
    void strike_if_due(int world_rank, int64_t step) const;
    bool nonfinite_gradients(int world_rank, int64_t step) const;
    // True once per plan and step: a re-run of the step computes correctly.
    bool bit_flip(int world_rank, int64_t step);
    // data_step: 1-based, the step whose data is read (the step itself unless data was skipped).
    double spike_factor(int64_t data_step) const;
    double lr_factor(int64_t step) const;
    // Carries out a commitfail or slowcommit fault of the checkpoint of `step` before its
    // commit's filesystem step `commit_step` (checkpoint_store.h: CommitProbe).
    void strike_commit(int64_t step, std::string_view commit_step) const;
    // Carries out a localfull fault of this rank's local snapshot of `step` (an Error(io)).
    void strike_local_snapshot(int world_rank, int64_t step) const;

private:
    struct Fault {
        std::string kind;
        int rank = -1;  // the rank kinds: exit, hang, stop, abort, hardware, nan, bitflip, localfull
        int64_t step = -1;
        double factor = 1;  // spike, lr; slowcommit: seconds
        std::string how;    // commitfail: error or filesystem
    };
    bool requested(const std::string& kind, int world_rank, int64_t step) const;

    std::vector<Fault> faults_;
    std::set<int64_t> flipped_;  // the steps whose bit flip happened
};

// The plan LLMTRAIN_INJECT_FAULT asks for; empty when it is unset or empty.
FaultPlan fault_plan_from_environment();

}  // namespace llmtrain
