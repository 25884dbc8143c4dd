// Fault injection for testing failure handling: LLMTRAIN_INJECT_FAULT=KIND:RANK:STEP makes
// world rank RANK, at the start of step STEP (1-based):
//   exit      exit at once without any clean-up (a process that vanished)
//   hang      stop making progress forever
//   abort     std::abort(): a crash by a fatal signal (SIGABRT)
//   hardware  throw the error a device reports for an uncorrectable hardware fault
//   nan       (injected_nonfinite_gradients) this rank's gradients turn non-finite
// Unset, nothing happens; a malformed value is a config error naming the variable.
#pragma once

#include <cstdint>

namespace llmtrain {

void inject_fault_if_requested(int world_rank, int64_t step);
// Whether LLMTRAIN_INJECT_FAULT asks for non-finite gradients on this rank at this step.
bool injected_nonfinite_gradients(int world_rank, int64_t step);

}  // namespace llmtrain
