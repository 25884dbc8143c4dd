// Fault injection for tests and drills: LLMTRAIN_INJECT_FAULT holds one fault or several
// separated by commas. KIND:RANK:STEP makes world rank RANK, at step STEP (1-based):
//   exit      exit at once without any clean-up (a process that vanished)
//   hang      stop making progress forever
//   abort     std::abort(): a crash by a fatal signal (SIGABRT)
//   hardware  throw the error a device reports for an uncorrectable hardware fault
//   nan       (injected_nonfinite_gradients) a NaN in this rank's gradients
//   bitflip   (injected_bit_flip) one bit of one of this rank's gradients flipped, once: a
//             re-run of the step computes correctly (silent data corruption)
// and on every rank:
//   spike:STEP:FACTOR  the loss and gradients of the step that reads step STEP's data (the
//                      batch a run without skipped data reads at step STEP) multiplied by
//                      FACTOR: a bad batch, which a re-run meets again and a rollback skips
//   lr:STEP:FACTOR     the learning rate multiplied by FACTOR from step STEP on
// Unset, nothing happens; a malformed value is a config error naming the variable.
#pragma once

#include <cstdint>

namespace llmtrain {

void inject_fault_if_requested(int world_rank, int64_t step);
bool injected_nonfinite_gradients(int world_rank, int64_t step);
bool injected_bit_flip(int world_rank, int64_t step);
// data_step: 1-based, the step whose data is read (the step itself unless data was skipped).
double injected_spike_factor(int64_t data_step);
double injected_lr_factor(int64_t step);

}  // namespace llmtrain
